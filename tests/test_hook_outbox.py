"""Hook notifications survive a stop or a crash (the outbox), each has its own retry schedule, and
a stop takes under 2 s whatever the hooks do. Real parts: a real daemon (`nvmon daemon --sim` in a
subprocess, killed with SIGKILL or stopped with SIGTERM) and a real HTTP receiver on 127.0.0.1
that can be down (500), hanging, or up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from nvmon.alerts.hook_dispatch import HookDispatcher
from nvmon.alerts.hook_outbox import Outbox, outbox_path
from nvmon.alerts.hooks import HookConfig
from nvmon.wire.mqtt import Backoff
from test_hooks import alert, running, stats, until


class Switchable:
    """A receiver whose mode can change: "up" (200), "down" (500, echoing the request in the
    body, as some servers do), "hang" (never answers in time). Records every request and the
    status it got."""

    def __init__(self) -> None:
        self.mode = "up"
        self.fail_fingerprint: str | None = None  # in "up": 500 for this alert's notifications only
        self.requests: list[tuple[str, dict, int, float]] = []  # (path, body, status, monotonic)
        self.lock = threading.Lock()
        recv = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw) if raw else {}
                mode = recv.mode
                if mode == "hang":
                    time.sleep(30)
                    return
                status = 200 if mode == "up" else 500
                if mode == "up" and recv.fail_fingerprint and recv.fail_fingerprint in raw.decode():
                    status = 500
                with recv.lock:
                    recv.requests.append((self.path, body, status, time.monotonic()))
                echo = f"{self.command} {self.path}\n{self.headers}".encode() if status == 500 else b"ok"
                with contextlib.suppress(OSError):
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(echo)))
                    self.end_headers()
                    self.wfile.write(echo)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def delivered(self, path: str, status: str | None = None) -> list[dict]:
        """Bodies that got a 200."""
        with self.lock:
            return [b for p, b, code, _ in self.requests
                    if p == path and code == 200 and (status is None or b.get("status") == status)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Switchable()
    yield r
    r.close()


# -- a real daemon -------------------------------------------------------------------------------

ALERTS = '[alerts]\nfor_s = 0.2\nclear_s = 0.6\nstartup_grace_s = 0\n'


class Daemon:
    def __init__(self, tmp: Path, hooks_toml: str, sim: str = "hgx-h100,thermal=5@0.5"):
        self.db = tmp / "n1.db"
        self.cfg = tmp / "nvmon.toml"
        self.cfg.write_text(f'[node]\ncluster = "t"\nrack = "r1"\n{ALERTS}{hooks_toml}')
        self.log = tmp / "daemon.log"
        self.args = [sys.executable, "-m", "nvmon", "daemon", "--config", str(self.cfg), "--db", str(self.db),
                     "--node", "n1", "--sim", sim, "--interval", "0.2", "--log-level", "info"]
        self.proc: subprocess.Popen | None = None

    def start(self) -> Daemon:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=out)
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def outbox_rows(self) -> list[tuple[str, str]]:
        path = outbox_path(self.db)
        if not path.exists():
            return []
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return con.execute("SELECT hook, status FROM outbox ORDER BY id").fetchall()
        except sqlite3.OperationalError:  # the daemon is creating it right now
            return []
        finally:
            con.close()


def wait(cond, timeout: float, what: str, d: Daemon) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen in {timeout} s\n{d.text()[-3000:]}")
        time.sleep(0.05)


def webhook(receiver: Switchable, **kw) -> str:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in kw.items())
    return f'[[hooks]]\ntype = "webhook"\nname = "wh"\nurl = "{receiver.url("/wh")}"\n{extra}'


@pytest.fixture
def daemons():
    made: list[Daemon] = []
    yield made
    for d in made:
        if d.proc is not None and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(10)


def test_kill_9_during_an_outage_delivers_after_restart(tmp_path, receiver, daemons):
    receiver.mode = "down"
    d = Daemon(tmp_path, webhook(receiver, retries=10))
    daemons.append(d.start())
    # The alert fired and its notification failed at least once: it waits in the outbox.
    wait(lambda: any(code == 500 for *_, code, _ in receiver.requests), 30, "a failed delivery", d)
    wait(lambda: d.outbox_rows() == [("wh", "firing")], 15, "the notification in the outbox", d)
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    assert receiver.delivered("/wh") == []
    receiver.mode = "up"
    daemons.append(d.start())
    wait(lambda: receiver.delivered("/wh", "firing"), 30, "the firing delivered after the restart", d)
    wait(lambda: d.outbox_rows() == [], 15, "an empty outbox", d)
    time.sleep(1.0)  # nothing else comes: the restored alert is not paged a second time
    [got] = receiver.delivered("/wh", "firing")
    assert got["code"] == "thermal" and got["node"] == "n1"
    assert "1 notification(s) left undelivered by the last run" in d.text()
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(10) == 0


def test_stop_with_a_hanging_receiver_is_quick_and_keeps_the_notification(tmp_path, receiver, daemons):
    receiver.mode = "hang"
    d = Daemon(tmp_path, webhook(receiver, timeout_s=30))
    daemons.append(d.start())
    wait(lambda: d.outbox_rows() == [("wh", "firing")], 30, "the notification in the outbox", d)
    time.sleep(0.3)  # its attempt is in flight, hanging
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(10) == 0
    took = time.monotonic() - t0
    # The receiver hangs for 30 s: a stop that waited for it would take that long. The bound
    # only tells "did not wait" from "waited", with room for a slow machine (about 1 s here).
    assert took < 15.0, f"stop took {took:.1f} s\n{d.text()[-2000:]}"
    assert "stopping with 1 notification(s) not delivered; kept in the outbox" in d.text()
    assert d.outbox_rows() == [("wh", "firing")]
    receiver.mode = "up"
    daemons.append(d.start())
    wait(lambda: receiver.delivered("/wh", "firing"), 30, "the firing delivered after the restart", d)
    wait(lambda: d.outbox_rows() == [], 15, "an empty outbox", d)
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(10) == 0


# -- schedules (the dispatcher with real receivers) -----------------------------------------------

SLOW = Backoff(initial_s=1.0, max_s=4.0, jitter=0.0)


async def test_a_hook_that_is_down_does_not_delay_a_working_one(receiver):
    down = Switchable()
    down.mode = "down"
    try:
        d = HookDispatcher([HookConfig(type="webhook", name="down", url=down.url("/d"), retries=5),
                            HookConfig(type="webhook", name="up", url=receiver.url("/u"), retries=5)], backoff=SLOW)
        async with running(d):
            t0 = time.monotonic()
            for i in range(20):
                d.submit([alert(gpu=i % 8, link=i)])
            await until(lambda: stats(d, "up").sent == 20, timeout=10)
            assert time.monotonic() - t0 < 10.0  # "down"'s retries alone take 15 s (1+2+4+4+4)
            assert stats(d, "down").sent == 0 and stats(d, "down").queued == 20
            # All 20 were tried at once (each on its own schedule), not one after another's retries.
            # (one after another's retries, the second would come 15 s after the first)
            await until(lambda: len(down.requests) >= 20, timeout=10)
    finally:
        down.close()


async def test_a_resolve_does_not_wait_behind_another_alerts_failing_firing(receiver):
    a, b = alert(gpu=1, link=1), alert(gpu=2, link=2)
    receiver.fail_fingerprint = a.fingerprint  # A's notifications fail (500), B's go through
    d = HookDispatcher([HookConfig(type="webhook", name="wh", url=receiver.url("/wh"), retries=6)], backoff=SLOW)
    async with running(d):
        d.submit([a])
        await until(lambda: len(receiver.requests) == 1)  # A failed once, waits 1 s for its retry
        d.submit([b])
        d.submit([b.with_status("resolved", b.starts_at + 60)])
        await until(lambda: len(receiver.delivered("/wh")) == 2, timeout=15)
        assert [x["status"] for x in receiver.delivered("/wh")] == ["firing", "resolved"]
        # B went out before A's first retry (order of arrival, not a clock: a slow machine only
        # delays both), and A still waits for that retry. The receiver records a request before
        # the dispatcher has read its answer, so the queue count is awaited, not read at once.
        with receiver.lock:
            order = [body["fingerprint"] for _, body, _, _ in receiver.requests]
        assert order[:3] == [a.fingerprint, b.fingerprint, b.fingerprint]
        await until(lambda: stats(d, "wh").queued == 1, timeout=15)
        # A resolves while its firing waits: the firing is not sent after the resolve.
        receiver.fail_fingerprint = None
        d.submit([a.with_status("resolved", a.starts_at + 60)])
        await until(lambda: len(receiver.delivered("/wh")) == 3, timeout=15)
        # Nothing of A's left to send (a firing kept after its resolve would be sent at its retry,
        # up to 4 s later, and show below): awaited as a state, not as a window of time.
        await until(lambda: stats(d, "wh").queued == 0, timeout=15)
    got = [(x["fingerprint"], x["status"]) for x in receiver.delivered("/wh")]
    assert got[2] == (a.fingerprint, "resolved") and len(got) == 3


async def test_stop_leaves_undelivered_notifications_in_the_outbox(tmp_path, receiver):
    receiver.mode = "down"
    path = tmp_path / "n.db.outbox"
    cfg = HookConfig(type="webhook", name="wh", url=receiver.url("/wh"), retries=3)
    d = HookDispatcher([cfg], backoff=SLOW, outbox=Outbox(path))
    async with running(d):
        d.submit([alert(gpu=1), alert(gpu=2)])
        await until(lambda: len(receiver.requests) == 2)
        t0 = time.monotonic()
        assert await d.drain(0.3) is False
        assert time.monotonic() - t0 < 4.0  # the retries it gave up on would take 7 s (1+2+4)
    receiver.mode = "up"
    d2 = HookDispatcher([cfg], backoff=SLOW, outbox=Outbox(path))
    async with running(d2):
        await until(lambda: stats(d2, "wh").sent == 2)
    assert sorted(b["gpu"] for b in receiver.delivered("/wh")) == [1, 2]
    assert Outbox(path).load({"wh"}) == []


async def test_outbox_rows_of_a_hook_no_longer_configured_are_dropped_and_logged(tmp_path, receiver, caplog):
    path = tmp_path / "n.db.outbox"
    receiver.mode = "down"
    d = HookDispatcher([HookConfig(type="webhook", name="old", url=receiver.url("/wh"), retries=3)], backoff=SLOW,
                       outbox=Outbox(path))
    async with running(d):
        d.submit([alert()])
        await until(lambda: len(receiver.requests) == 1)
    receiver.mode = "up"
    d2 = HookDispatcher([HookConfig(type="webhook", name="new", url=receiver.url("/wh"))], outbox=Outbox(path))
    async with running(d2):
        # awaited (on a loaded machine the outbox may be read later than a fixed 0.3 s), then a
        # moment in which a notification wrongly kept would have gone out
        await until(lambda: "dropped 1 notification(s) left from the last run (unknown hook)" in caplog.text)
        await asyncio.sleep(0.3)
    assert receiver.delivered("/wh") == []


async def test_an_unwritable_outbox_is_said_once_and_hooks_carry_on(tmp_path, receiver, caplog):
    d = HookDispatcher([HookConfig(type="webhook", name="wh", url=receiver.url("/wh"))],
                       outbox=Outbox(tmp_path / "no-such-dir" / "n.db.outbox"))
    async with running(d):
        d.submit([alert()])
        await until(lambda: stats(d, "wh").sent == 1)
    assert caplog.text.count("will not survive a restart") == 1


async def test_repeats_while_a_receiver_is_down_do_not_pile_up(receiver):
    receiver.mode = "down"
    d = HookDispatcher([HookConfig(type="webhook", name="wh", url=receiver.url("/wh"), retries=10,
                                   repeat_interval_s=0.2)], backoff=SLOW)
    async with running(d):
        d.submit([alert()])
        await asyncio.sleep(2.5)  # ~12 repeats fell due meanwhile
        assert stats(d, "wh").queued <= 2  # the newest repeat replaces the one waiting for a retry
        receiver.mode = "up"
        await until(lambda: receiver.delivered("/wh"), timeout=15)


async def test_a_corrupt_outbox_is_set_aside_and_a_new_one_started(tmp_path, receiver, caplog):
    path = tmp_path / "n.db.outbox"
    path.write_bytes(b"this is not a database\n" * 400)
    d = HookDispatcher([HookConfig(type="webhook", name="wh", url=receiver.url("/wh"))], outbox=Outbox(path))
    assert d.outbox.persistent
    async with running(d):
        d.submit([alert()])
        await until(lambda: stats(d, "wh").sent == 1)
    [aside] = tmp_path.glob("n.db.outbox.corrupt-*")
    assert aside.read_bytes().startswith(b"this is not a database")
    assert "moved to n.db.outbox.corrupt-" in caplog.text
