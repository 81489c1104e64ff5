"""`nvmon daemon` as it runs on a node: a real process, a real Mosquitto, SQLite on disk — and the
failures around it (broker away, kill -9, unwritable database, GPUs failing mid-run, bad creds)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mqtt_broker import Broker, Recorder, needs_mosquitto, wait_until

pytestmark = needs_mosquitto

INTERVAL = 0.2


class DaemonProc:
    """`python -m nvmon daemon` in a subprocess, stderr captured to a file."""

    def __init__(self, tmp: Path, *, broker: str, node: str = "n1", sim: str = "hgx-h100", db: Path | None = None,
                 extra_toml: str = "", interval: float = INTERVAL):
        self.db = db or tmp / "nvmon.db"
        self.cfg = tmp / f"{node}.toml"
        self.cfg.write_text(f'[node]\ncluster = "t"\nrack = "r1"\n[mqtt]\nkeepalive_s = 2\n{extra_toml}\n')
        self.log = tmp / f"{node}.log"
        self.args = [sys.executable, "-m", "nvmon", "daemon", "--config", str(self.cfg), "--broker", broker,
                     "--db", str(self.db), "--node", node, "--sim", sim, "--interval", str(interval),
                     "--log-level", "info"]
        self.proc: subprocess.Popen | None = None

    def start(self) -> DaemonProc:
        self._log = open(self.log, "ab")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=self._log)
        return self

    def stop(self, sig=signal.SIGTERM, timeout: float = 10) -> int:
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self._log.close()
        return rc

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def tick_times(db: Path) -> list[float]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [r[0] / 1000 for r in con.execute("SELECT ts_ms FROM ticks ORDER BY ts_ms")]
    finally:
        con.close()


def integrity(db: Path) -> str:
    con = sqlite3.connect(db)
    try:
        return con.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        con.close()


async def wait_ticks(db: Path, n: int, timeout: float = 15.0) -> list[float]:
    def enough():
        try:
            t = tick_times(db)
        except sqlite3.Error:
            return None
        return t if len(t) >= n else None

    return await wait_until(enough, timeout, f"{n} stored ticks")


def status_of(msg) -> str:
    return json.loads(msg.payload)["state"]


async def test_publishes_stores_and_stops_cleanly(tmp_path):
    with Broker(tmp_path) as broker:
        async with Recorder(broker.url, "nvmon/v1/t/n1/#") as rec:
            d = DaemonProc(tmp_path, broker=broker.url).start()
            try:
                await rec.wait_for("status", lambda m: status_of(m) == "online", timeout=20)
                await rec.wait_for("inventory", timeout=30)
                async with Recorder(broker.url, "nvmon/v1/t/n1/#") as late:  # a late subscriber
                    inv = await late.wait_for("inventory", lambda m: m.retain, timeout=15)
                    assert len(json.loads(inv.payload)["gpus"]) == 8
                    st = await late.wait_for("status", lambda m: m.retain, timeout=15)
                    assert status_of(st) == "online"
                await wait_until(lambda: len(rec.on("sample")) >= 5, 30, "5 samples")
                assert all(len(m.payload) < 4096 for m in rec.on("sample"))
                await wait_ticks(d.db, 5)
            finally:
                t0 = time.monotonic()
                rc = d.stop(signal.SIGTERM)
                took = time.monotonic() - t0
            # The stop's steps are each bounded and say so when they give up (a flush still writing,
            # the sampler busy, the goodbye not published): none did. The clock only catches a
            # stop that systemd would kill (TimeoutStopSec=5), with room for a slow machine; the
            # product's figure (well under 2 s) is measured, not timed here.
            log = d.log_text()
            assert rc == 0 and took < 5.0, log
            assert not [w for w in ("on stop", "still busy", "/status not published") if w in log], log
            await rec.wait_for("status", lambda m: status_of(m) == "offline", timeout=15)
    assert integrity(d.db) == "ok"
    assert "Traceback" not in d.log_text()


async def test_broker_outage_leaves_no_gap_and_publishing_resumes(tmp_path):
    outage = 30.0
    with Broker(tmp_path) as broker:
        d = DaemonProc(tmp_path, broker=broker.url, interval=0.5).start()
        try:
            async with Recorder(broker.url, "nvmon/v1/t/n1/#") as rec:
                await rec.wait_for("status", lambda m: status_of(m) == "online", timeout=20)
                await rec.wait_for("sample", timeout=30)
            broker.stop()
            down_at = time.time()
            await asyncio.sleep(outage)
            broker.start()
            up_at = time.time()
            async with Recorder(broker.url, "nvmon/v1/t/n1/#") as rec:
                await rec.wait_for("status", lambda m: status_of(m) == "online", timeout=15)
                await rec.wait_for("sample", timeout=15)
                # Spec: publishing again within 5 s of the broker's return (the daemon's backoff is
                # capped at 4 s). 10 s is room for a slow machine and this subscriber's own connect;
                # an uncapped backoff would have its next attempt up to 16 s after the return.
                assert time.time() - up_at < 10
                await rec.wait_for("inventory", timeout=15)
            assert d.alive()
        finally:
            assert d.stop() == 0
    ts = tick_times(d.db)
    during = [t for t in ts if down_at <= t <= down_at + outage]
    assert len(during) >= outage / 0.5 * 0.9, "local history kept recording during the outage"
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    assert max(gaps) < 1.6, f"gap of {max(gaps):.1f} s in local history"


async def test_kill9_fires_the_will_and_restart_announces_online(tmp_path):
    with Broker(tmp_path) as broker:
        async with Recorder(broker.url, "nvmon/v1/t/n1/status") as rec:
            d = DaemonProc(tmp_path, broker=broker.url).start()
            await rec.wait_for("status", lambda m: status_of(m) == "online", timeout=20)
            d.proc.kill()
            d.proc.wait(5)
            d._log.close()
            # Will: the broker publishes `offline` after 1.5 × keepalive (2 s) without traffic.
            await rec.wait_for("status", lambda m: status_of(m) == "offline", timeout=30)
            n_online = len([m for m in rec.on("status") if status_of(m) == "online"])
            d2 = DaemonProc(tmp_path, broker=broker.url).start()
            try:
                await wait_until(lambda: len([m for m in rec.on("status") if status_of(m) == "online"]) > n_online,
                                 20, "online again")
            finally:
                assert d2.stop() == 0


async def test_repeated_kill9_during_writes_keeps_the_database_intact(tmp_path):
    db = tmp_path / "nvmon.db"
    runs = []
    for i in range(4):
        d = DaemonProc(tmp_path, broker="", db=db, interval=0.1).start()
        before = len(tick_times(db)) if db.exists() else 0
        await wait_ticks(db, before + 5 + i, timeout=20)  # different moments of the write cycle
        d.proc.kill()
        d.proc.wait(5)
        d._log.close()
        assert integrity(db) == "ok"
        ts = tick_times(db)
        runs.append(ts[before:])
        assert len(ts) > before  # the restart resumed
    for ts in runs:  # within each run ticks are contiguous: nothing but the last one may be lost
        gaps = [b - a for a, b in zip(ts, ts[1:])]
        assert max(gaps) < 0.35, gaps


async def test_gpu_lost_and_unsupported_fields_mid_run_keep_others_flowing(tmp_path):
    with Broker(tmp_path) as broker:
        async with Recorder(broker.url, "nvmon/v1/t/n1/sample") as rec:
            d = DaemonProc(tmp_path, broker=broker.url, sim="hgx-h100,gpu_lost=3@2,notsup=temperature:5@2").start()
            try:
                await rec.wait_for("sample", timeout=20)
                await asyncio.sleep(3.0)
                n = len(rec.messages)
                await wait_until(lambda: len(rec.messages) >= n + 5, 30, "samples after the faults")
                assert d.alive()
            finally:
                assert d.stop() == 0
    last = json.loads(rec.messages[-1].payload)
    text = json.dumps(last)
    assert last["schema"] == 1 and "Traceback" not in d.log_text()
    # the wire format is compact; the details are checked in the wire tests — here: still flowing
    assert len(rec.messages) >= n + 5 and text


async def test_wrong_credentials_log_one_clear_error_and_back_off(tmp_path):
    with Broker(tmp_path, users={"nvmon": "right"}) as broker:
        pw = tmp_path / "pw"
        pw.write_text("wrong\n")
        pw.chmod(0o600)  # a secret file: private to its reader, or refused (nvmon.secretfile)
        d = DaemonProc(tmp_path, broker=broker.url,
                       extra_toml=f'username = "nvmon"\npassword_file = "{pw}"\n').start()
        try:
            await wait_ticks(d.db, 10, timeout=20)  # storing locally regardless
            await asyncio.sleep(3)
            assert d.alive()
        finally:
            assert d.stop() == 0
    log = d.log_text()
    errors = [ln for ln in log.splitlines() if "nvmon.wire" in ln and ("ERROR" in ln or "WARNING" in ln)]
    assert errors, log
    assert any("not authori" in ln.lower() or "bad user name or password" in ln.lower() for ln in errors), errors
    assert "Traceback" not in log
    assert len(errors) < 20  # backoff, not a tight loop


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return r.returncode == 0


needs_mount = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")


@needs_mount
async def test_readonly_at_start_fails_then_full_filesystem_errors_and_recovers(tmp_path):
    """The database on a read-only file system at start is a path given wrongly: one line, exit 1,
    nothing written (issue 15). A disk that fills later is a runtime fault: the daemon keeps
    sampling and publishing, and stores again once there is space."""
    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, "4m"):
        pytest.skip("cannot mount tmpfs here")
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        with Broker(tmp_path) as broker:
            d = DaemonProc(tmp_path, broker=broker.url, db=mnt / "nvmon.db").start()
            assert d.proc.wait(timeout=20) == 1
            d._log.close()
            assert d.log_text().strip() == f"nvmon: database {mnt / 'nvmon.db'}: read-only file system"
            subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)
            assert list(mnt.iterdir()) == []
            async with Recorder(broker.url, "nvmon/v1/t/n1/sample") as rec:
                d = DaemonProc(tmp_path, broker=broker.url, db=mnt / "nvmon.db").start()
                try:
                    await wait_ticks(d.db, 10, timeout=60)
                    filler = mnt / "filler"
                    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
                    # The tick store's own error (the alerts' persistence may hit the full disk first).
                    await wait_until(lambda: any("store: " in ln and ("disk full" in ln or "SQLITE_FULL" in ln)
                                                 for ln in d.log_text().splitlines()), 15,
                                     "the store's disk-full error in the log")
                    n = len(rec.messages)
                    await wait_until(lambda: len(rec.messages) > n + 5, 30, "publishing while the disk is full")
                    stored = len(tick_times(d.db))
                    filler.unlink()
                    await wait_until(lambda: len(tick_times(d.db)) > stored + 5, 60, "storing again")
                    # Logged by the writer just after the commit that the tick count already shows.
                    await wait_until(lambda: "writable again" in d.log_text(), 15, "'writable again' in the log")
                    assert d.alive()
                finally:
                    assert d.stop() == 0
        assert integrity(d.db) == "ok" and "Traceback" not in d.log_text()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_bad_config_is_one_line(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[mqtt]\nbroker = "http://x"\n')
    r = subprocess.run([sys.executable, "-m", "nvmon", "daemon", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "mqtt.broker" in r.stderr and str(cfg) in r.stderr
    r = subprocess.run([sys.executable, "-m", "nvmon", "daemon", "--sim", "hgx-h9"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "unknown board profile" in r.stderr


async def test_a_driver_call_that_never_returns_does_not_hold_up_the_stop(tmp_path, caplog):
    """NVML hung inside the sampler thread: the store keeps what came before, the stop still
    finishes in about a second, and NVML is not shut down under the stuck call."""
    from nvmon.daemon.config import DaemonConfig
    from nvmon.daemon.main import Daemon

    cfg = DaemonConfig.model_validate({
        "node": {"name": "n1"}, "sampling": {"sim": "hgx-h100", "interval_s": 0.2},
        "store": {"path": str(tmp_path / "nvmon.db")}, "mqtt": {"broker": ""}})
    d = Daemon(cfg, embedded=True)
    run = asyncio.create_task(d.run())
    deadline = time.monotonic() + 20
    while d.writer is None or d.writer.stored < 3:
        assert time.monotonic() < deadline and not run.done(), "no ticks stored"
        await asyncio.sleep(0.05)
    hung, released = threading.Event(), threading.Event()
    real = d.sampler.sample

    def stuck():
        hung.set()
        released.wait(30)
        return real()

    d.sampler.sample = stuck
    await asyncio.to_thread(hung.wait, 5)
    stored = d.writer.stored
    t0 = time.monotonic()
    d.request_stop()
    assert await asyncio.wait_for(run, 15) == 0
    took = time.monotonic() - t0
    released.set()
    assert took < 10.0, took  # the sampler is held 30 s: a stop that waited for it would take that long
    assert "sampler still busy" in caplog.text
    rows = sqlite3.connect(tmp_path / "nvmon.db").execute("SELECT count(*) FROM ticks").fetchone()[0]
    assert rows == stored >= 3
