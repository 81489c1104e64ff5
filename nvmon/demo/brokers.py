"""The demo's MQTT broker: Mosquitto when it is installed (a child process on a loopback port, no
persistence, gone with the demo), else the embedded pure-Python amqtt broker.

Both carry the demo's largest fleet (100 nodes, nvmon.demo.scenario.MAX_NODES); Mosquitto brings
them online sooner (~10 s rather than ~15 s here) and takes the broker's work out of the demo's
process, whose one core the nodes' daemons already fill (200 nodes never all came up on either).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import shutil
import socket
import subprocess
import time
from pathlib import Path

log = logging.getLogger("nvmon.demo")

HOST = "127.0.0.1"
KINDS = ("auto", "mosquitto", "embedded")
_QUIET_LOGGERS = ("amqtt", "transitions")  # the broker and its state-machine library chat at INFO
_SBIN = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")


class DemoError(Exception):
    """The demo cannot run; the message is one line for the user."""


def mosquitto_path() -> str | None:
    """The mosquitto binary, on PATH or where Debian puts it (/usr/sbin, often not on a user's PATH)."""
    return shutil.which("mosquitto") or next((p for p in _SBIN if os.access(p, os.X_OK)), None)


def choose(kind: str) -> str:
    """`auto` → "mosquitto" if installed, else "embedded"; a kind that cannot work is a DemoError."""
    if kind not in KINDS:
        raise DemoError(f"unknown broker {kind!r}; choose one of {', '.join(KINDS)}")
    if kind == "auto":
        kind = "mosquitto" if mosquitto_path() else "embedded"
    if kind == "mosquitto" and not mosquitto_path():
        raise DemoError("mosquitto is not installed (apt-get install mosquitto), or use --broker embedded")
    return kind


def free_port(host: str = HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port(host: str, port: int) -> None:
    """A one-line error for a taken port now, rather than the broker's traceback-shaped one later."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the broker binds
        try:
            s.bind((host, port))
        except PermissionError:
            raise DemoError(f"port {port} on {host}: permission denied (ports below 1024 need root)") from None
        except OSError as e:
            raise DemoError(f"port {port} on {host} is in use ({e.strerror}); "
                            "choose another with --port, or leave --port out for a free one") from None


class EmbeddedBroker:
    """amqtt on host:port, anonymous, MQTT 3.1.1."""

    name = "embedded broker"

    def __init__(self) -> None:
        self._broker = None

    async def start(self, host: str, port: int, workdir: Path) -> None:
        from amqtt.broker import Broker
        from amqtt.errors import BrokerError

        for name in _QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        check_port(host, port)
        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
            # Only authentication: amqtt's default plugins add $SYS publishing and per-packet logging.
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }
        broker = Broker(config)
        try:
            await broker.start()
        except BrokerError as e:
            raise DemoError(f"cannot start the embedded MQTT broker on {host}:{port}: "
                            f"{' '.join(str(e.__cause__ or e).split())}") from None
        self._broker = broker

    async def drain(self, timeout_s: float) -> None:
        """Wait (bounded) until the broker has fanned out what it received: amqtt's shutdown drops
        messages still in flight, and the nodes' `offline` goodbyes should reach the views first.
        (amqtt internals, pinned by pyproject; if they change this degrades to a short pause.)"""
        queue = getattr(self._broker, "_broadcast_queue", None)
        tasks = getattr(self._broker, "_tasks_queue", ())
        deadline = time.monotonic() + timeout_s
        await asyncio.sleep(0.05)
        while time.monotonic() < deadline and ((queue is not None and not queue.empty())
                                               or any(not t.done() for t in tasks)):
            await asyncio.sleep(0.02)

    async def stop(self, timeout_s: float) -> None:
        if self._broker is None:
            return
        try:
            await asyncio.wait_for(self._broker.shutdown(), timeout_s)
        except Exception as e:  # noqa: BLE001 - stopping anyway: report, never hang
            log.error("embedded broker shutdown: %s", e)
        self._broker = None


# Mosquitto under a small sh that lives as long as the demo does: the demo holds the write end of
# the sh's stdin, so when the demo ends in any way (kill -9 included) the kernel closes it, `read`
# sees end of file and the broker is stopped — no orphan broker. The sh exits with the broker's
# status, so a broker that fails at start is seen at once. Its own session keeps a terminal's Ctrl-C
# from stopping the broker before the nodes' goodbyes are out.
# (fd 3: a background list's own stdin is /dev/null in a non-interactive sh.)
_GUARD = 'exec 3<&0; "$1" -c "$2" <&- & pid=$!; (read _ <&3; kill "$pid" 2>/dev/null) & wait "$pid"'


class MosquittoBroker:
    """Mosquitto as a child process on host:port: anonymous, no persistence, its log in `workdir`;
    it goes when the demo goes, however the demo ends (see _GUARD)."""

    name = "mosquitto"

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._log: Path | None = None

    async def start(self, host: str, port: int, workdir: Path) -> None:
        check_port(host, port)
        conf, self._log = workdir / "mosquitto.conf", workdir / "mosquitto.log"
        conf.write_text(f"listener {port} {host}\nallow_anonymous true\npersistence false\n"
                        f"log_dest file {self._log}\nlog_type error\nlog_type warning\n"
                        "max_queued_messages 10000\n")
        binary = mosquitto_path()
        try:
            self._proc = subprocess.Popen(["/bin/sh", "-c", _GUARD, "sh", binary, str(conf)], stdin=subprocess.PIPE,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True)
        except OSError as e:
            raise DemoError(f"cannot start {binary}: {e.strerror or e}") from None
        deadline = time.monotonic() + 5.0
        while True:
            if self._proc.poll() is not None:
                raise DemoError(f"mosquitto exited at start ({self._proc.returncode}): {self._last_log_line()}")
            try:
                with socket.create_connection((host, port), timeout=0.2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    await self.stop(1.0)
                    raise DemoError(f"mosquitto did not listen on {host}:{port} within 5 s") from None
                await asyncio.sleep(0.05)

    def _last_log_line(self) -> str:
        try:
            lines = self._log.read_text(errors="replace").strip().splitlines() if self._log else []
        except OSError:
            lines = []
        return lines[-1] if lines else "no log"

    async def drain(self, timeout_s: float) -> None:
        await asyncio.sleep(min(0.2, timeout_s))  # Mosquitto fans out at once; let the last goodbyes go

    async def stop(self, timeout_s: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # end of file for the guard: it stops the broker, the sh exits
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the sh leads its own group: the broker is in it
            proc.wait(2)


def make(kind: str) -> EmbeddedBroker | MosquittoBroker:
    return MosquittoBroker() if kind == "mosquitto" else EmbeddedBroker()
