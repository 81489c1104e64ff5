"""A real Mosquitto for tests: start / stop / restart on a free loopback port, with an optional
password file and TLS (a CA, server and client certificates, and a second unrelated CA, made with
the openssl CLI), plus a recording subscriber and a condition waiter.

Usage in a test module::

    from mqtt_broker import Broker, Recorder, needs_mosquitto, wait_until

    pytestmark = needs_mosquitto

    def test_x(tmp_path):
        with Broker(tmp_path) as broker:
            ...  # broker.url, broker.stop(), broker.start(), broker.restart()
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

MOSQUITTO = shutil.which("mosquitto") or next(
    (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)), None)
OPENSSL = shutil.which("openssl")

needs_mosquitto = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto binary not installed (apt-get install mosquitto)")
needs_openssl = pytest.mark.skipif(OPENSSL is None, reason="openssl CLI not installed (needed to make test certificates)")


def free_port() -> int:
    """A loopback port nobody listens on right now (the broker binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def password_line(user: str, password: str, iterations: int = 101) -> str:
    """A mosquitto 2.x password-file line (`$7$` = PBKDF2-SHA512), as mosquitto_passwd writes it."""
    salt = os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return f"{user}:$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: trusting it must fail


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_tls(directory: Path) -> TlsFiles:
    """CA + server cert (SAN 127.0.0.1, localhost) + client cert, EC P-256 (fast to make)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
                 "-subj", f"/CN=nvmon test {ca}", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    leaf = {"server": ("subjectAltName=IP:127.0.0.1,DNS:localhost", "extendedKeyUsage=serverAuth"),
            "client": ("subjectAltName=DNS:nvmon-test-client", "extendedKeyUsage=clientAuth")}
    for name, (san, eku) in leaf.items():
        (d / f"{name}.ext").write_text(f"{san}\n{eku}\nbasicConstraints=CA:FALSE\n")
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=nvmon test {name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return TlsFiles(ca=d / "ca.pem", server_cert=d / "server.pem", server_key=d / "server.key",
                    client_cert=d / "client.pem", client_key=d / "client.key", other_ca=d / "other-ca.pem")


class Broker:
    """One mosquitto process on 127.0.0.1:`port` (a free one unless given); restartable on the
    same port. Retained messages live in memory only, so a restart forgets them — which is how
    a test tells a re-announcement from a leftover."""

    def __init__(self, workdir: Path, *, users: dict[str, str] | None = None, tls: TlsFiles | None = None,
                 require_certificate: bool = False, port: int | None = None, acl: str | None = None,
                 config: str | None = None):
        """`config`: a broker's own settings (listener on `port`, authentication, ACL, TLS: e.g. the
        shipped systemd/mosquitto/nvmon.conf with its paths moved), used instead of those built from
        `users`, `acl` and `tls`; `tls` then only tells `url` that the listener is mqtts."""
        if MOSQUITTO is None:
            pytest.skip("mosquitto binary not installed")
        self.dir = Path(workdir) / f"mosquitto-{id(self):x}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.tls = tls
        self.log = self.dir / "mosquitto.log"
        lines = ["persistence false", "log_dest file " + str(self.log),
                 "log_type error", "log_type warning", "log_type notice", "log_type information"]
        if os.geteuid() == 0:
            lines.append("user root")  # else mosquitto drops to its own user and cannot read our 0700 tmp dirs
        if config is not None:
            self.conf = self.dir / "mosquitto.conf"
            self.conf.write_text("\n".join(lines) + "\n" + config)
            self.proc = None
            return
        lines.insert(0, f"listener {self.port} 127.0.0.1")
        if users is not None:
            pw = self.dir / "passwd"
            pw.write_text("".join(password_line(u, p) + "\n" for u, p in users.items()))
            lines += ["allow_anonymous false", f"password_file {pw}"]
        else:
            lines.append("allow_anonymous true")
        if acl is not None:  # the text of an acl_file
            (self.dir / "acl").write_text(acl)
            lines.append(f"acl_file {self.dir / 'acl'}")
        if tls is not None:
            lines += [f"cafile {tls.ca}", f"certfile {tls.server_cert}", f"keyfile {tls.server_key}"]
            if require_certificate:
                lines += ["require_certificate true"]
        self.conf = self.dir / "mosquitto.conf"
        self.conf.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        assert self.proc is None, "already running"
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                self.proc = None
                raise RuntimeError(f"mosquitto exited at start: {err.strip()[-500:]} {self.log_text()[-500:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"mosquitto did not listen on {self.port} within {timeout} s")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        if self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: no DISCONNECT for anyone, the clients find out from a dead socket."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(5)
        self.stop()

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> Broker:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


async def wait_until(cond, timeout: float = 15.0, what: str = "condition", interval: float = 0.02):
    """Poll `cond()` until it returns something truthy; fail the test after `timeout` seconds.
    A deadline costs time only when the test fails anyway: make it generous (a loaded 2-core CI
    machine), unless the deadline itself is the check (then say what it tells apart)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


@dataclass
class Received:
    topic: str
    payload: bytes
    retain: bool


@dataclass
class Recorder:
    """An aiomqtt subscriber that records every message on `filter` (use as `async with`)."""

    url: str
    filter: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    username: str | None = None
    password: str | None = None
    messages: list[Received] = field(default_factory=list)

    async def __aenter__(self) -> Recorder:
        import ssl

        import aiomqtt

        tls = self.url.startswith("mqtts://")
        host, port = self.url.split("://", 1)[1].rsplit(":", 1)
        ctx = None
        if tls:
            ctx = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file:
                ctx.load_cert_chain(self.cert_file, self.key_file)
        self._client = aiomqtt.Client(host, int(port), tls_context=ctx, username=self.username,
                                      password=self.password, timeout=10)
        await self._client.__aenter__()
        await self._client.subscribe(self.filter, qos=1)
        self._task = asyncio.create_task(self._collect())
        return self

    async def _collect(self) -> None:
        async for m in self._client.messages:
            self.messages.append(Received(str(m.topic), bytes(m.payload), bool(m.retain)))

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()
        try:
            await self._task
        except BaseException:  # noqa: BLE001 - cancelled, or the broker went away under us
            pass
        try:
            await self._client.__aexit__(None, None, None)
        except Exception:  # noqa: BLE001 - already disconnected
            pass

    def on(self, kind: str) -> list[Received]:
        return [m for m in self.messages if m.topic.endswith("/" + kind)]

    async def wait_for(self, kind: str, pred=lambda m: True, timeout: float = 15.0) -> Received:
        return await wait_until(lambda: next((m for m in self.on(kind) if pred(m)), None), timeout, f"a {kind} message")


SHIPPED = Path(__file__).resolve().parent.parent / "systemd" / "mosquitto"


def shipped_broker(workdir: Path, *, passwd: Path, tls: TlsFiles, acl: Path | None = None,
                   conf: Path = SHIPPED / "nvmon.conf") -> Broker:
    """A Broker running the shipped systemd/mosquitto/nvmon.conf as written, but for where things
    are: its listener on a free loopback port, its password file `passwd`, its ACL `acl` (default:
    the shipped nvmon.acl) and the test's TLS files in place of /etc/mosquitto/…. Each of those
    lines must be in the file, so a test cannot pass on a config that drifted from what it checks."""
    port = free_port()
    moves = {"listener 8883": f"listener {port} 127.0.0.1",
             "password_file /etc/mosquitto/nvmon.passwd": f"password_file {passwd}",
             "acl_file /etc/mosquitto/nvmon.acl": f"acl_file {acl or SHIPPED / 'nvmon.acl'}",
             "cafile /etc/mosquitto/certs/ca.pem": f"cafile {tls.ca}",
             "certfile /etc/mosquitto/certs/server.pem": f"certfile {tls.server_cert}",
             "keyfile /etc/mosquitto/certs/server.key": f"keyfile {tls.server_key}"}
    lines = Path(conf).read_text().splitlines()
    for old, new in moves.items():
        assert old in lines, f"systemd/mosquitto/nvmon.conf has no line {old!r}"
        lines[lines.index(old)] = new
    return Broker(workdir, port=port, tls=tls, config="\n".join(lines) + "\n")
