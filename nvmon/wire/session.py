"""One reconnecting MQTT connection, the one every nvmon MQTT client runs on: the daemon's
`Publisher`, the fleet's `FleetSubscriber`, and each node of the load generator.

`await MqttSession(settings, client_id=..., log=...).run(on_connect)` connects, awaits
`on_connect(client)` (the client's own work, which ends when the connection drops: aiomqtt raises
then) and connects again, forever, until its task is cancelled. What every client needs the same
way lives here, once:

- the connection: `make_client` (TLS, user and password file, will, keepalive; the files are read
  again at each attempt, so rotated credentials need no restart);
- the retry: `Backoff` with jitter, back to the first step after a connection that came up; a
  refusal (bad login, denied client, TLS failure: `nvmon.wire.mqtt.refused`) on the slow schedule
  (to a minute), network trouble on the quick one;
- the log: a failed attempt is logged once (ERROR), its repeats at DEBUG, a lost connection as a
  WARNING, the way back as "connected again"; anything but broker trouble (a bug) once with its
  traceback, then like any repeat. With `quiet` all of it goes to DEBUG (the load generator runs a
  thousand sessions and reports their sum);
- the warning: a broker that let this client in with no username (and no client certificate) is
  open to anyone, and a password over plain mqtt:// is readable on the wire; either is said once
  per process and broker (one WARNING line, not one per reconnect or per session: `exposure`);
- the counts: `stats` (connected, since, connects, errors, last error and when);
- cancel safety: a cancel that aiomqtt swallowed (Python 3.11, see `nvmon.aio.raise_if_cancelled`)
  still stops it; cancelled while connected, it publishes the `goodbye` message (≤ 0.8 s) and
  disconnects within DISCONNECT_S.

The client is aiomqtt's, made by the adapter (`nvmon.wire.mqtt`); this module uses only the
calls every client uses (publish) and the adapter's error helpers, not aiomqtt itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from nvmon.aio import raise_if_cancelled
from nvmon.wire.mqtt import BROKER_ERRORS, Backoff, MqttSettings, describe_error, disconnect, make_client, refused

GOODBYE_S = 0.8  # a clean stop's last message must not hold the stop up (a lost node gets the will)
DISCONNECT_S = 0.5  # the DISCONNECT handshake when dropping a connection
SECURING = 'docs/install.md, "Securing nvmon"'

_warned: set[tuple[str, str | None]] = set()  # (url, username) already warned about in this process

Message = tuple[str, bytes]  # (topic, payload), published retained at QoS 1
Work = Callable[[Any], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class SessionStats:
    connected: bool
    since: float | None  # when the connection came up or went away (clock); None until the first came up
    connects: int  # connections that came up, the first one included
    errors: int  # failed attempts and lost connections
    last_error: str | None  # one line, safe to display
    last_error_at: float | None


class MqttSession:
    """A connection to the broker of `settings` as `client_id` (a configured `settings.client_id`
    wins), reconnecting with `backoff` until cancelled.

    `will()` and `goodbye()` give (topic, payload) at each attempt / at the stop: the message the
    broker publishes if the connection dies without a DISCONNECT, and the one published before a
    clean disconnect; both retained at QoS 1. `what` names the client in log lines ("MQTT",
    "fleet: MQTT"), which go to `log`. `gate`: a semaphore held while connecting, so that many
    sessions do not stampede a broker with handshakes.
    """

    def __init__(self, settings: MqttSettings, *, client_id: str, log: logging.Logger, what: str = "MQTT",
                 will: Callable[[], Message] | None = None, goodbye: Callable[[], Message] | None = None,
                 backoff: Backoff = Backoff(), clock: Callable[[], float] = time.time, quiet: bool = False,
                 gate: asyncio.Semaphore | None = None):
        self.settings, self.client_id, self.log, self.what = settings, client_id, log, what
        self.will, self.goodbye, self.backoff, self.clock = will, goodbye, backoff, clock
        self.quiet, self.gate = quiet, gate
        self.client: Any = None  # the connected client while `on_connect` runs, else None
        self._since: float | None = None
        self._connects = self._errors = 0
        self._trouble = False  # an error since the last connection came up: log "connected again"
        self._failed = 0  # failed attempts since then
        self._last_error: str | None = None
        self._last_error_at: float | None = None
        self._last_logged: str | None = None  # the failure logged last (its repeats go to debug)
        self._bugs: set[str] = set()  # unexpected errors already logged with their traceback

    @property
    def connected(self) -> bool:
        return self.client is not None

    @property
    def stats(self) -> SessionStats:
        return SessionStats(connected=self.client is not None, since=self._since, connects=self._connects,
                            errors=self._errors, last_error=self._last_error, last_error_at=self._last_error_at)

    async def run(self, on_connect: Work, *, setup: Work | None = None) -> NoReturn:
        """Connect and await `on_connect(client)`, again and again, until cancelled.

        `setup(client)` (subscriptions), if given, runs first: the connection counts as up (in
        `connected`, `connects`, the log) only once it returned, so a failure there is a failed
        attempt and `connected` means subscribed. `on_connect` returning is no error: the session
        disconnects and connects again. Its broker errors end the connection; anything else it
        raises is logged as a bug, and the session reconnects all the same.
        """
        attempt = 0
        if self.settings.password_file is not None:  # the password is about to travel: say so first
            self._warn_exposed()
        while True:
            before, no = self._connects, False
            try:
                await self._connection(on_connect, setup)
            except BROKER_ERRORS as e:
                no = self._connects == before and refused(e)
                self._note_error(e, lost=self._connects != before, bug=False, refused=no)
            except Exception as e:  # a bug or a library surprise: keep the owner's other work alive
                self._note_error(e, lost=self._connects != before, bug=True)
            raise_if_cancelled()  # a cancel aiomqtt swallowed while connecting or disconnecting
            if self._connects != before:
                attempt = 0  # it worked for a while: retry quickly before backing off again
            # A refusal (login, authorization, TLS) backs off to a minute; network trouble retries quickly.
            await asyncio.sleep(self.backoff.delay(attempt, refused=no))
            attempt += 1

    # --- internals ------------------------------------------------------------------------

    async def _connection(self, on_connect: Work, setup: Work | None) -> None:
        client = make_client(self.settings, client_id=self.client_id,
                             will=self.will() if self.will is not None else None)
        if self.gate is None:
            await client.__aenter__()  # explicit enter/exit: the exit must be bounded when stopping
        else:
            async with self.gate:
                await client.__aenter__()
        try:
            raise_if_cancelled()  # a cancel swallowed by the connect: say goodbye and stop
            if setup is not None:
                await setup(client)
                raise_if_cancelled()  # ... or by a subscribe
            self.client, self._since = client, self.clock()
            self._connects += 1
            self._log_connected()
            self._warn_exposed()  # after the first connection: the broker did let an anonymous client in
            await on_connect(client)
            self._log(logging.DEBUG, "%s %s: session ended; connecting again", self.what, self.settings.url)
        except asyncio.CancelledError:
            if self.goodbye is not None:  # connected (if not yet up): a clean stop says so
                await self._say_goodbye(client)
            raise
        finally:
            if self.client is not None:
                self.client, self._since = None, self.clock()
            await disconnect(client, DISCONNECT_S)

    def _log(self, level: int, msg: str, *args, exc_info: BaseException | None = None) -> None:
        self.log.log(logging.DEBUG if self.quiet else level, msg, *args, exc_info=exc_info)

    def _warn_exposed(self) -> None:
        why = self.settings.exposure()
        key = (self.settings.url, self.settings.username)
        if why is None or self.quiet or key in _warned:
            return
        _warned.add(key)
        if self.settings.username is None:
            hint = "anyone who reaches it may publish as any node or silence alerts; give each client an account"
        else:
            hint = "use an mqtts:// broker"
        self.log.warning("%s %s: %s; %s (%s)", self.what, self.settings.url, why, hint, SECURING)

    def _log_connected(self) -> None:
        who = self.settings.client_id or self.client_id
        if self._trouble:
            n = self._failed
            after = f" after {n} failed attempt{'s' * (n != 1)}" if n else ""
            self._log(logging.INFO, "%s %s: connected again as %s%s", self.what, self.settings.url, who, after)
        else:
            self._log(logging.INFO, "%s %s: connected as %s", self.what, self.settings.url, who)
        self._trouble, self._failed, self._last_logged = False, 0, None

    def _note_error(self, exc: BaseException, *, lost: bool, bug: bool, refused: bool = False) -> None:
        msg = describe_error(exc)
        self._errors += 1
        self._trouble = True
        self._failed += not lost
        self._last_error, self._last_error_at = msg, self.clock()
        url = self.settings.url
        if bug and msg not in self._bugs and len(self._bugs) < 32:  # a traceback once per bug, however often
            self._bugs.add(msg)
            self._log(logging.ERROR, "%s %s: unexpected error: %s; reconnecting", self.what, url, msg, exc_info=exc)
        elif lost:
            self._log(logging.WARNING, "%s %s: connection lost: %s; reconnecting", self.what, url, msg)
        elif msg == self._last_logged:  # the same failure every few seconds is logged once
            self._log(logging.DEBUG, "%s %s: still cannot connect: %s", self.what, url, msg)
        else:
            cap = self.backoff.refused_max_s if refused else self.backoff.max_s
            self._log(logging.ERROR, "%s %s: cannot connect: %s; retrying with backoff (up to %g s)", self.what,
                      url, msg, cap)
        self._last_logged = msg

    async def _say_goodbye(self, client) -> None:
        """Best effort and bounded: a clean stop is announced as such."""
        topic, payload = self.goodbye()
        try:
            async with asyncio.timeout(GOODBYE_S):
                await client.publish(topic, payload, qos=1, retain=True)
        except (TimeoutError, *BROKER_ERRORS) as e:
            self._log(logging.WARNING, "%s %s: %s not published: %s", self.what, self.settings.url, topic,
                      describe_error(e))
