"""MQTT for nvmon: broker settings and the aiomqtt adapter.

This is the only module that imports aiomqtt. It is pinned to 2.x (aiomqtt 3 changes the API);
everything aiomqtt-specific — client construction, TLS, the will, error classification, the
bounded disconnect — stays here so that an upgrade touches one file. The reconnecting connection
every client runs on is `nvmon.wire.session.MqttSession`; the node's publisher is
`nvmon.wire.publisher.Publisher`.

Protocol: plain MQTT 3.1.1 (no broker extensions, see DESIGN.md "Scaling out"), clean session.
A daemon's client id is `nvmon-<cluster>-<node>-<8 hex>` (`node_client_id`), the hex the same
for the same host and database: a restarted daemon takes its old session over at once instead of
waiting for the broker's keepalive to expire it (and the old session's will is not left to
arrive after the new "online"), while a second daemon claiming the same node name elsewhere gets
its own session instead of the two taking it from each other every second.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
import random
import re
import ssl
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiomqtt
from aiomqtt.exceptions import MqttConnectError  # not re-exported by aiomqtt 2.x; a negative CONNACK

from nvmon.secretfile import check_private

MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")

log = logging.getLogger("nvmon.wire")

SCHEMES = {"mqtt": (False, 1883), "mqtts": (True, 8883)}


def _late_ack(record: logging.LogRecord) -> bool:
    """aiomqtt logs a SUBACK/UNSUBACK that comes after its subscribe was cancelled (a stop or a
    reconnect during the subscribe) as an ERROR with a KeyError traceback. Nothing is wrong: it is
    said once at debug, and the record dropped."""
    if str(record.msg).startswith("Unexpected message ID"):
        mid = record.args[0] if isinstance(record.args, tuple) and record.args else record.args
        log.debug("mqtt: acknowledgement of a cancelled (un)subscribe came late (message id %s)", mid)
        return False
    return True


# aiomqtt's (and paho's) messages: under nvmon's name, at aiomqtt's own level (warnings and up).
CLIENT_LOG = logging.getLogger("nvmon.wire.aiomqtt")
CLIENT_LOG.setLevel(logging.WARNING)
CLIENT_LOG.addFilter(_late_ack)


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    tls: bool
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'mqtts' if self.tls else 'mqtt'}://{host}:{self.port}"


def redact_url(url: str) -> str:
    """`url` fit to echo in a message: what comes before its last `@` (`user:secret`, even with a
    `/` in the password) shown as ***."""
    return re.sub(r"//.*@", "//***@", str(url), flags=re.DOTALL)


def parse_broker_url(url: str) -> BrokerAddress:
    """`mqtt://host[:1883]` or `mqtts://host[:8883]` → BrokerAddress; ValueError with a one-line reason.

    Credentials in the URL are refused: they would show in `ps` and shell history
    (the password comes from `password_file`).
    """
    shown = redact_url(url)  # every message below echoes the URL: never with its password
    if "@" in str(url).partition("//")[2]:  # before urlsplit, whose errors may quote part of a password
        raise ValueError(f"broker URL {shown!r}: no credentials in the URL; use username and password_file")
    try:
        u = urlsplit(url.strip())
        port = u.port
    except (ValueError, AttributeError) as e:
        raise ValueError(f"broker URL {shown!r}: {e}") from None
    if u.scheme not in SCHEMES:
        raise ValueError(f"broker URL {shown!r}: expected mqtt://HOST:PORT or mqtts://HOST:PORT")
    if u.username is not None or u.password is not None:
        raise ValueError(f"broker URL {shown!r}: no credentials in the URL; use username and password_file")
    if not u.hostname:
        raise ValueError(f"broker URL {shown!r}: no host")
    if u.path not in ("", "/") or u.query or u.fragment:
        raise ValueError(f"broker URL {shown!r}: unexpected path or query")
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
            raise ValueError(f"broker URL {redact_url(self.url)!r}: TLS options need an mqtts:// URL")
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
        """The password file's content without its final newline; OSError if unreadable, and
        `LooseSecretFile` (a PermissionError) if others may read it (nvmon.secretfile)."""
        if self.password_file is None:
            return None
        check_private(self.password_file)
        with open(self.password_file, encoding="utf-8") as f:
            text = f.read()
        return text[:-1] if text.endswith("\n") else text

    def exposure(self) -> str | None:
        """Why these settings leave the broker open (one clause), or None: no username and no
        client certificate (the broker lets anyone in, so anyone may write as any node), or a
        password sent over plain mqtt:// (readable on the wire). The broker's own authentication
        and ACLs are the trust boundary (docs/install.md, "Securing nvmon")."""
        if self.username is None and self.cert_file is None:
            return "connected without a username or client certificate: the broker is unauthenticated"
        if self.password_file is not None and not self.address.tls:
            return f"the password of user {self.username!r} travels unencrypted (mqtt://, no TLS)"
        return None

    def tls_context(self) -> ssl.SSLContext | None:
        """A verifying client context for mqtts (None for mqtt); OSError/ssl.SSLError on bad files."""
        if not self.address.tls:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        if self.cert_file:
            check_private(self.key_file)  # the client's private key: as the password
            ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.tls_insecure:
            ctx.check_hostname = False  # paho reads this too and skips its own host check
        return ctx


def node_client_id(cluster: str, node: str, instance: str, *, machine_files=MACHINE_ID_FILES) -> str:
    """`nvmon-<cluster>-<node>-<8 hex>`: the hex a hash of this host's machine id, its host name and
    `instance` (the daemon's database path: two daemons on one host need two databases). Stable
    across restarts, different for a second daemon that claims the same node name. The machine id
    is hashed, never sent (machine-id(5) asks for that)."""
    machine = b""
    for f in machine_files:
        with contextlib.suppress(OSError), open(f, "rb") as fh:
            machine = fh.read(256).strip()
            break
    h = hashlib.sha256(b"nvmon-client-id\0" + machine + b"\0" + socket.gethostname().encode(errors="replace")
                       + b"\0" + instance.encode(errors="replace"))
    return f"nvmon-{cluster}-{node}-{h.hexdigest()[:8]}"


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
        logger=CLIENT_LOG,
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


READ_AHEAD = 64 * 1024  # bytes asked of the socket at once by a reader (read_ahead): ~35 samples


class _ReadAhead:
    """paho's socket with a read buffer: paho asks for 1 byte, 1-4 bytes, then the rest of each
    packet; this takes up to READ_AHEAD bytes per system call and hands them out as asked.
    `pending()` counts what is buffered (and, under TLS, what the SSL socket holds), which makes
    aiomqtt's reader callback go on reading packets until it is empty."""

    __slots__ = ("_sock", "_buf", "_pos")

    def __init__(self, sock):
        self._sock, self._buf, self._pos = sock, b"", 0

    def recv(self, n: int) -> bytes:
        buf, pos = self._buf, self._pos
        if pos >= len(buf):
            buf = self._sock.recv(max(n, READ_AHEAD))  # BlockingIOError, SSLWantReadError, b"" as paho expects
            if len(buf) <= n:
                self._buf, self._pos = b"", 0
                return buf
            pos = 0
        out = buf[pos:pos + n]
        self._buf, self._pos = buf, pos + len(out)
        return out

    def pending(self) -> int:
        ssl_pending = getattr(self._sock, "pending", None)
        return len(self._buf) - self._pos + (ssl_pending() if ssl_pending is not None else 0)

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


def read_ahead(client: aiomqtt.Client) -> None:
    """Make a connected subscriber read every packet the socket holds in one event-loop turn.

    aiomqtt's reader callback has paho read one packet per turn, in three system calls, then waits
    for epoll again; a fleet view receives a thousand samples a second. With the socket read
    READ_AHEAD bytes at a time, one callback reads every packet that has arrived and the consumer
    takes them from aiomqtt's queue in one go. The packets, their order and the errors are paho's.
    """
    paho = client._client  # aiomqtt 2.x keeps its paho client here (pinned; see the module doc)
    if paho._sock is not None and not isinstance(paho._sock, _ReadAhead):
        paho._sock = _ReadAhead(paho._sock)


async def retained_message(client: aiomqtt.Client, topic: str, *, grace_s: float) -> bytes | None:
    """Subscribe to `topic` (QoS 1) and return its retained message, or None when it has none.

    Absence is not judged by a clock alone: the topic is subscribed to twice, and the second
    SUBACK comes after the retained message the first subscription brought (the broker handles a
    client's packets in order, and so does the client), so a process starved for seconds still
    finds the message in its queue when the second SUBACK returns. Brokers that deliver retained
    messages apart from the SUBACK path get `grace_s` more. Only the first message on `topic` is
    returned (the second subscription brings a copy, which is not read)."""
    await client.subscribe(topic, qos=1)
    await client.subscribe(topic, qos=1)
    while len(client.messages):  # what came before the second SUBACK: read without a clock
        m = await anext(client.messages)
        if str(m.topic) == topic:
            return bytes(m.payload)
    try:
        async with asyncio.timeout(grace_s):
            async for m in client.messages:
                if str(m.topic) == topic:
                    return bytes(m.payload)
    except TimeoutError:
        pass
    return None


async def disconnect(client: aiomqtt.Client, timeout_s: float) -> None:
    """Leave the broker (DISCONNECT, waiting at most `timeout_s` for it); never raises: the
    connection is being dropped either way, and a stop must not wait for a broker that is gone."""
    client.timeout = timeout_s
    with contextlib.suppress(Exception):
        await client.__aexit__(None, None, None)


# What "broker trouble" is: the client's errors (refused, lost, timed out, TLS) and the OS's
# (unreachable, unreadable password or certificate files; ssl.SSLError is one). Anything else a
# client's work raises is a bug.
BROKER_ERRORS: tuple[type[BaseException], ...] = (aiomqtt.MqttError, OSError)

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


def refused(exc: BaseException) -> bool:
    """Whether a failed attempt was a "no" that retrying soon will not change: the broker refused
    the login or the client (a negative CONNACK other than "server unavailable" / "server busy"),
    the TLS handshake failed (a bad or unknown certificate), or this side's password or certificate
    files are unreadable. Network trouble (unreachable, reset, timed out, the broker restarting)
    is transient. A fleet-wide password or CA rotation must not have every node retry every few
    seconds: `Backoff.delay(..., refused=True)` backs off to a minute."""
    if isinstance(exc, MqttConnectError):
        rc = exc.rc
        if isinstance(rc, int):
            return rc not in _TRANSIENT_RC
        return str(rc) not in _TRANSIENT_REASONS
    if isinstance(exc, ssl.SSLError):  # our own TLS context: bad certificate or key files
        return True
    if isinstance(exc, aiomqtt.MqttError):  # aiomqtt keeps only the text of the socket's error
        text = str(exc).lower()
        return "ssl" in text or "certificate" in text
    return isinstance(exc, OSError) and exc.filename is not None  # an unreadable password_file etc.


_TRANSIENT_RC = (3,)  # MQTT 3.1.1 CONNACK: server unavailable
_TRANSIENT_REASONS = ("Server unavailable", "Server busy")  # paho's ReasonCode names (MQTT 5 and 3.1.1)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential reconnect delay with jitter: a fleet whose broker restarts must not
    reconnect in lock-step. Two schedules: a quick one for transient network errors (`initial_s`
    doubling to `max_s`), and a slow one for refusals (`refused`: a bad password, a denied client,
    a TLS failure; `refused_initial_s` doubling to `refused_max_s`), which only an operator fixes
    and which cost the broker a handshake each."""

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5  # the delay is drawn from [(1 - jitter) × d, d]
    refused_initial_s: float = 2.0
    refused_max_s: float = 60.0

    def delay(self, attempt: int, *, refused: bool = False) -> float:
        start, cap = (self.refused_initial_s, self.refused_max_s) if refused else (self.initial_s, self.max_s)
        d = min(cap, start * self.factor ** min(attempt, 64))
        return d * random.uniform(1.0 - self.jitter, 1.0)
