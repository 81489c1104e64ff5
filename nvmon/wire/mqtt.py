"""MQTT for nvmon: broker settings, the aiomqtt adapter, and the node's `Publisher`.

This is the only module that imports aiomqtt. It is pinned to 2.x (aiomqtt 3 changes the API);
everything aiomqtt-specific — client construction, TLS, the will, error classification — stays
here so that an upgrade touches one file.

Protocol: plain MQTT 3.1.1 (no broker extensions, see DESIGN.md "Scaling out"), clean session,
client id `nvmon-<cluster>-<node>` unless configured: a restarted daemon takes its old session
over at once instead of waiting for the broker's keepalive to expire it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NoReturn
from urllib.parse import urlsplit

import aiomqtt
from aiomqtt.exceptions import MqttConnectError  # not re-exported by aiomqtt 2.x; a negative CONNACK

from nvmon.aio import raise_if_cancelled
from nvmon.audit import Finding
from nvmon.model import Sample
from nvmon.wire.contract import DELIVERY, Alert, WireError, topic, valid_name
from nvmon.wire.payloads import alerts_payload, layout_id, sample_payload, status_payload

log = logging.getLogger("nvmon.wire")

SCHEMES = {"mqtt": (False, 1883), "mqtts": (True, 8883)}


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    tls: bool
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'mqtts' if self.tls else 'mqtt'}://{host}:{self.port}"


def parse_broker_url(url: str) -> BrokerAddress:
    """`mqtt://host[:1883]` or `mqtts://host[:8883]` → BrokerAddress; ValueError with a one-line reason.

    Credentials in the URL are refused: they would show in `ps` and shell history
    (the password comes from `password_file`).
    """
    try:
        u = urlsplit(url.strip())
        port = u.port
    except (ValueError, AttributeError) as e:
        raise ValueError(f"broker URL {url!r}: {e}") from None
    if u.scheme not in SCHEMES:
        raise ValueError(f"broker URL {url!r}: expected mqtt://HOST:PORT or mqtts://HOST:PORT")
    if u.username is not None or u.password is not None:
        raise ValueError(f"broker URL {url!r}: no credentials in the URL; use username and password_file")
    if not u.hostname:
        raise ValueError(f"broker URL {url!r}: no host")
    if u.path not in ("", "/") or u.query or u.fragment:
        raise ValueError(f"broker URL {url!r}: unexpected path or query")
    tls, default_port = SCHEMES[u.scheme]
    return BrokerAddress(tls=tls, host=u.hostname, port=port or default_port)


@dataclass(frozen=True, slots=True)
class MqttSettings:
    """How to reach the broker. Files are read at each connection attempt, so rotated
    passwords and certificates are picked up without a restart."""

    url: str = "mqtt://127.0.0.1:1883"
    username: str | None = None
    password_file: str | None = None
    ca_file: str | None = None  # mqtts without it: the system's trusted CAs
    cert_file: str | None = None  # client certificate (mutual TLS)
    key_file: str | None = None
    tls_insecure: bool = False  # skip the host name check (the chain is still verified)
    keepalive_s: int = 10  # the broker declares the node dead (will → offline) after 1.5 × this
    client_id: str | None = None
    timeout_s: float = 5.0  # connect / acknowledgement timeout

    def __post_init__(self) -> None:
        addr = self.address
        if not addr.tls and (self.ca_file or self.cert_file or self.key_file or self.tls_insecure):
            raise ValueError(f"broker URL {self.url!r}: TLS options need an mqtts:// URL")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("TLS client authentication needs both cert_file and key_file")
        if self.password_file is not None and not self.username:
            raise ValueError("password_file needs a username")
        if not 1 <= self.keepalive_s <= 3600:
            raise ValueError(f"keepalive {self.keepalive_s}: expected 1..3600 seconds")
        if not 0 < self.timeout_s <= 300:
            raise ValueError(f"timeout {self.timeout_s}: expected 0..300 seconds")

    @property
    def address(self) -> BrokerAddress:
        return parse_broker_url(self.url)

    def read_password(self) -> str | None:
        """The password file's content without its final newline; OSError if unreadable."""
        if self.password_file is None:
            return None
        with open(self.password_file, encoding="utf-8") as f:
            text = f.read()
        return text[:-1] if text.endswith("\n") else text

    def tls_context(self) -> ssl.SSLContext | None:
        """A verifying client context for mqtts (None for mqtt); OSError/ssl.SSLError on bad files."""
        if not self.address.tls:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.tls_insecure:
            ctx.check_hostname = False  # paho reads this too and skips its own host check
        return ctx


def make_client(settings: MqttSettings, *, client_id: str, will: tuple[str, bytes] | None = None) -> aiomqtt.Client:
    """An aiomqtt client for `settings` (not yet connected: `async with` connects).

    `will`: (topic, payload) published retained at QoS 1 by the broker if the connection dies
    without a DISCONNECT. Raises OSError/ssl.SSLError if the password or TLS files are bad.
    """
    addr = settings.address
    return aiomqtt.Client(
        addr.host, addr.port, username=settings.username, password=settings.read_password(),
        identifier=settings.client_id or client_id, protocol=aiomqtt.ProtocolVersion.V311, clean_session=True,
        keepalive=settings.keepalive_s, timeout=settings.timeout_s, tls_context=settings.tls_context(),
        will=None if will is None else aiomqtt.Will(topic=will[0], payload=will[1], qos=1, retain=True),
    )


def write_at_once(client: aiomqtt.Client) -> None:
    """Make a connected client send each packet as it is queued, instead of on a later loop turn.

    aiomqtt 2.x has paho ask the event loop for a writer callback for every packet: a
    call_soon_threadsafe (a self-pipe write and a wake-up), an epoll registration, a callback and an
    unregistration per message, about 0.35 ms of CPU for each 1 Hz sample on a VM, a third of
    what publishing costs. Once connected, aiomqtt calls into paho only from the loop thread, so
    the packet can be written straight away, as paho does itself when it owns the loop (and, as
    it does, not while one of paho's callbacks runs). What the socket does not take at once (a
    full send buffer, TLS wanting to read) is left to aiomqtt's writer callback, as before; so
    are errors, which that callback reports.
    """
    paho = client._client  # aiomqtt 2.x keeps its paho client here (pinned; see the module doc)
    register = paho.on_socket_register_write
    loop_thread = threading.get_ident()
    in_callback = paho._in_callback_mutex

    def register_write(c, userdata, sock) -> None:
        if threading.get_ident() == loop_thread and in_callback.acquire(False):
            in_callback.release()
            with contextlib.suppress(Exception):  # left to aiomqtt's callback, which reports it
                c.loop_write()  # paho unregisters the socket when everything went out
            if not c.want_write():
                return
        register(c, userdata, sock)

    paho.on_socket_register_write = register_write


_AUTH_HINT = " (check username and password_file)"


def describe_error(exc: BaseException) -> str:
    """One line for a log or a status page, saying what went wrong with the broker connection."""
    if isinstance(exc, MqttConnectError):
        rc = exc.rc
        text = str(rc) if rc is not None and not isinstance(rc, int) else str(exc)
        auth = any(w in text.lower() for w in ("authori", "password", "bad user"))
        msg = f"broker refused the connection: {text}{_AUTH_HINT if auth else ''}"
    elif isinstance(exc, aiomqtt.MqttError):
        text = str(exc)
        tls = "ssl" in text.lower() or "certificate" in text.lower()
        msg = f"TLS handshake failed: {text}" if tls else text
    elif isinstance(exc, ssl.SSLError):
        msg = f"TLS setup failed: {exc}"
    elif isinstance(exc, OSError):
        msg = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    else:
        msg = f"{type(exc).__name__}: {exc}"
    return " ".join(msg.split())  # one line, whatever the library put in it


def quiet_aiomqtt_noise(loop, context) -> None:
    """When the broker goes away, aiomqtt 2.x leaves each client's disconnect error unretrieved and
    may register a writer on a socket that just closed: harmless, but one traceback per node (a
    thousand on a broker restart). Those go to debug; anything else is reported as usual.
    An event loop exception handler: `loop.set_exception_handler(quiet_aiomqtt_noise)`."""
    exc, msg = context.get("exception"), context.get("message", "")
    noise = ((msg.startswith("Future exception was never retrieved") and type(exc).__module__.startswith("aiomqtt"))
             or (msg.startswith("Exception in callback") and ("add_writer" in msg or "add_reader" in msg)))
    if noise:
        log.debug("aiomqtt: %s: %s", msg, exc)
    else:
        loop.default_exception_handler(context)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential reconnect delay with jitter: a fleet whose broker restarts must not
    reconnect in lock-step."""

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5  # the delay is drawn from [(1 - jitter) × d, d]

    def delay(self, attempt: int) -> float:
        d = min(self.max_s, self.initial_s * self.factor ** min(attempt, 64))
        return d * random.uniform(1.0 - self.jitter, 1.0)


@dataclass(frozen=True, slots=True)
class PublisherStats:
    connected: bool
    connects: int  # successful connections, first one included
    published: int  # sample messages handed to the broker
    dropped: int  # samples never published (disconnected, or replaced by a newer one)
    errors: int  # failed connection attempts and lost connections
    last_error: str | None


InventoryProvider = Callable[[], bytes | None]
AlertsProvider = Callable[[], Iterable[Alert]]


class Publisher:
    """Publishes one node's status, inventory, samples and alerts; reconnects forever.

    Stop it by cancelling the task running `run()` (the daemon's TaskGroup does): it then
    publishes `status` offline (retained) and disconnects, within about a second, and re-raises
    the cancellation. There is no separate close().
    """

    def __init__(self, settings: MqttSettings, *, cluster: str, node: str, version: str, interval_s: float,
                 backoff: Backoff = Backoff(), clock: Callable[[], float] = time.time):
        for what, name in (("cluster", cluster), ("node", node)):
            if not valid_name(name):
                raise ValueError(f"{what} name {name!r}: use 1-64 of A-Z a-z 0-9 . _ -")
        self.settings, self.cluster, self.node = settings, cluster, node
        self.version, self.interval_s, self.backoff, self.clock = version, interval_s, backoff, clock
        self.topics = {kind: topic(cluster, node, kind) for kind in DELIVERY}
        self.client_id = f"nvmon-{cluster}-{node}"
        self._client: aiomqtt.Client | None = None
        self._latest: Sample | tuple | None = None  # the one sample (and its findings) waiting for the wire
        self._wake = asyncio.Event()
        self._inventory_provider: InventoryProvider = lambda: None
        self._alerts_provider: AlertsProvider | None = None
        self._alerts: bytes | None = None  # last set given to publish_alerts()
        self._announced_layout: str | None = None
        self._inventory_checked = 0.0
        self._checked_layout: str | None = None
        self._connects = self._published = self._dropped = self._errors = 0
        self._last_error: str | None = None
        self._last_logged: str | None = None
        self._listeners: dict[str, Callable[[str, bytes], None]] = {}

    def listen(self, topic_filter: str, callback: Callable[[str, bytes], None]) -> None:
        """Subscribe (QoS 1) to `topic_filter` on every connection and call `callback(topic,
        payload)` on the loop for each message, retained ones included (the daemon's shared acks
        and silences). The callback must be quick and never raise; a failure is logged. Call
        before `run()`."""
        self._listeners[topic_filter] = callback

    @property
    def stats(self) -> PublisherStats:
        return PublisherStats(connected=self._client is not None, connects=self._connects,
                              published=self._published, dropped=self._dropped, errors=self._errors,
                              last_error=self._last_error)

    async def run(self, samples: asyncio.Queue[Sample | tuple[Sample, Sequence[Finding]]],
                  inventory_provider: InventoryProvider,
                  alerts_provider: AlertsProvider | None = None) -> NoReturn:
        """Publish until cancelled. `samples` (a `Sample`, or a `(sample, findings)` pair to carry
        the tick's audit findings) is drained continuously, connected or not: only the
        newest waits for the wire, older ones are counted in `dropped`, so memory stays bounded
        while the broker is away.

        `inventory_provider()` returns the current `inventory_payload(...)` bytes (None until one
        is known); it is called on each connect and when a sample's layout stops matching the
        announced inventory, so it should return a cached value. `alerts_provider()` returns the
        active alert set, published on each connect.
        """
        self._inventory_provider = inventory_provider
        self._alerts_provider = alerts_provider
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._pump(samples), name="nvmon.wire.pump")
            await self._connection_loop()

    async def publish_alerts(self, alerts: Iterable[Alert]) -> None:
        """Publish the node's full active alert set now if connected; it is re-sent on every
        reconnect either way. Never raises for broker trouble."""
        self._alerts = alerts_payload(alerts, self.clock())
        client = self._client
        if client is not None:
            try:
                await self._publish(client, "alerts", self._alerts)
            except aiomqtt.MqttError as e:
                log.warning("MQTT %s: alerts not published now (%s); re-sent on reconnect",
                            self.settings.url, describe_error(e))

    # --- internals ------------------------------------------------------------------------

    async def _pump(self, samples: asyncio.Queue) -> NoReturn:
        while True:
            sample = await samples.get()
            samples.task_done()
            if self._latest is not None:
                self._dropped += 1
            self._latest = sample
            self._wake.set()

    async def _connection_loop(self) -> NoReturn:
        attempt = 0
        while True:
            was_connected = self._connects
            try:
                await self._session()
            except (aiomqtt.MqttError, OSError) as e:
                self._note_error(e, lost=self._connects != was_connected)
            except Exception as e:  # a bug or a library surprise: keep the daemon's other work alive
                log.exception("MQTT %s: unexpected error; reconnecting", self.settings.url)
                self._errors += 1
                self._last_error = describe_error(e)
            raise_if_cancelled()  # a cancel aiomqtt swallowed while connecting must still stop us
            if self._connects != was_connected:
                attempt = 0  # it worked for a while: retry quickly before backing off again
            await asyncio.sleep(self.backoff.delay(attempt))
            attempt += 1

    def _note_error(self, exc: BaseException, *, lost: bool) -> None:
        msg = describe_error(exc)
        self._errors += 1
        self._last_error = msg
        if lost:
            log.warning("MQTT %s: connection lost: %s; reconnecting", self.settings.url, msg)
        elif msg != self._last_logged:  # the same failure every few seconds is logged once
            log.error("MQTT %s: cannot connect: %s; retrying with backoff", self.settings.url, msg)
        else:
            log.debug("MQTT %s: still cannot connect: %s", self.settings.url, msg)
        self._last_logged = msg

    async def _session(self) -> None:
        """One connection: connect, announce, publish samples until the connection fails."""
        will = status_payload("offline", version=self.version, interval_s=self.interval_s, ts=self.clock(),
                              reason="lost")
        client = make_client(self.settings, client_id=self.client_id, will=(self.topics["status"], will))
        reader: asyncio.Task | None = None
        await client.__aenter__()  # explicit enter/exit: the exit must be bounded when stopping
        try:
            raise_if_cancelled()  # a cancel swallowed by the connect: say goodbye and stop
            write_at_once(client)
            self._client = client
            self._connects += 1
            self._last_logged = None
            log.info("MQTT %s: connected as %s", self.settings.url, self.settings.client_id or self.client_id)
            if self._listeners:
                for f in self._listeners:
                    await client.subscribe(f, qos=1)
                reader = asyncio.create_task(self._read(client), name="nvmon.wire.listen")
            await self._announce(client)
            while True:
                raise_if_cancelled()  # aiomqtt on 3.11 can swallow a cancel in publish
                await self._wake.wait()
                self._wake.clear()
                sample, self._latest = self._latest, None
                if sample is not None:
                    await self._publish_sample(client, sample)
        except asyncio.CancelledError:
            await self._say_goodbye(client)
            raise
        finally:
            self._client = None
            if reader is not None:
                reader.cancel()
            client.timeout = 0.5  # bounds the DISCONNECT handshake below
            with contextlib.suppress(Exception):  # the connection is being dropped either way
                await client.__aexit__(None, None, None)

    async def _read(self, client: aiomqtt.Client) -> None:
        """Hand subscribed messages to their listener. Ends with the connection (the sample path
        notices the loss and reconnects, which subscribes again)."""
        with contextlib.suppress(aiomqtt.MqttError):
            async for m in client.messages:
                t = str(m.topic)
                for f, callback in self._listeners.items():
                    if m.topic.matches(f):
                        try:
                            callback(t, bytes(m.payload))
                        except Exception:  # the daemon's bug must not stop samples
                            log.exception("MQTT: listener for %s failed", f)

    async def _publish(self, client: aiomqtt.Client, kind: str, payload: bytes) -> None:
        qos, retain = DELIVERY[kind]
        await client.publish(self.topics[kind], payload, qos=qos, retain=retain)
        raise_if_cancelled()  # aiomqtt on 3.11 can swallow a cancel here: callers loop on (alerts)

    async def _announce(self, client: aiomqtt.Client) -> None:
        status = status_payload("online", version=self.version, interval_s=self.interval_s, ts=self.clock())
        await self._publish(client, "status", status)
        self._announced_layout = self._checked_layout = None
        await self._publish_inventory(client)
        if self._alerts_provider is not None:
            try:
                self._alerts = alerts_payload(self._alerts_provider(), self.clock())
            except Exception:  # as for inventory: the daemon's bug must not stop samples
                log.exception("MQTT: alerts provider failed; re-sending the last alert set")
        if self._alerts is not None:
            await self._publish(client, "alerts", self._alerts)

    async def _publish_inventory(self, client: aiomqtt.Client) -> None:
        self._inventory_checked = time.monotonic()
        try:
            payload = self._inventory_provider()
        except Exception:  # the provider is the daemon's code; its bug must not stop samples
            log.exception("MQTT: inventory provider failed")
            return
        if payload is None:
            return
        await self._publish(client, "inventory", payload)
        try:
            self._announced_layout = json.loads(payload)["layout"]
        except (ValueError, KeyError, TypeError):
            self._announced_layout = None

    async def _publish_sample(self, client: aiomqtt.Client, item: Sample | tuple) -> None:
        sample, findings = item if isinstance(item, tuple) else (item, ())
        # A sample whose GPUs/ports no longer match the announced inventory (or no inventory
        # yet): ask for the inventory again — at once for a new layout or while none is out,
        # then every 10 s while the provider still lags behind.
        lay = layout_id(sample)
        if lay != self._announced_layout and (self._announced_layout is None or lay != self._checked_layout
                                               or time.monotonic() - self._inventory_checked >= 10):
            self._checked_layout = lay
            await self._publish_inventory(client)
        try:
            payload = sample_payload(sample, findings)
        except WireError as e:
            self._dropped += 1
            log.error("MQTT: sample not published: %s", e)
            return
        await self._publish(client, "sample", payload)
        self._published += 1

    async def _say_goodbye(self, client: aiomqtt.Client) -> None:
        """Best effort, ≤ 1 s: a clean stop is announced as such (a lost node gets the will)."""
        payload = status_payload("offline", version=self.version, interval_s=self.interval_s, ts=self.clock(),
                                 reason="stopped")
        try:
            async with asyncio.timeout(0.8):
                await self._publish(client, "status", payload)
        except (TimeoutError, aiomqtt.MqttError) as e:
            log.warning("MQTT %s: offline status not published: %s", self.settings.url, describe_error(e))
