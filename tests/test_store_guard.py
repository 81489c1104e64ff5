"""The daemon's database must not lose data silently (issue 16), each fault reproduced for real:

- the file deleted (`rm nvmon.db`, with or without its -wal/-shm) or replaced while open: noticed
  before the next write, logged once, counted, and a new file started: no tick after that is lost;
- garbage written into the middle of a real file, or over its header: the file is moved aside as
  `<name>.corrupt-<time>` (with its -wal/-shm), a fresh one started, logged once, counted, the call
  that met the corruption done on the fresh file; never more than MAX_SET_ASIDES times;
- two real daemon processes on one file: the second refuses, in one line naming the file;
- the WAL is checkpointed at ~1 MiB instead of SQLite's 8 MB.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from samplefactory import healthy_sample

from nvmon.store import Store, StoreError
from nvmon.store import store as store_mod

BASE = healthy_sample()


def tick(i: int):
    return replace(BASE, ts=BASE.ts - 3600 + i)


def ticks(path: Path) -> list[int]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [r[0] for r in conn.execute("SELECT ts_ms FROM ticks ORDER BY ts_ms")]
    finally:
        conn.close()


def ms(i: int) -> int:
    return int(round(tick(i).ts * 1000))


def integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    except sqlite3.DatabaseError as e:
        return str(e)
    finally:
        conn.close()


def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("sidecars", [False, True], ids=["rm db", "rm db*"])
def test_a_deleted_database_is_recreated_before_the_next_write(tmp_path, caplog, sidecars):
    path = tmp_path / "nvmon.db"
    st = Store(path, owner=True)
    st.open()
    st.write_many([tick(i) for i in range(10)])
    os.unlink(path)
    if sidecars:
        for suffix in ("-wal", "-shm"):
            os.unlink(f"{path}{suffix}")
    with caplog.at_level(logging.ERROR, logger="nvmon.store"):
        for i in range(10, 20):
            st.write(tick(i))
    assert ticks(path) == [ms(i) for i in range(10, 20)]  # every tick since: in the new file
    assert st.resets == 1 and integrity(path) == "ok"
    (msg,) = errors(caplog)
    assert f"database {path} was deleted while in use" in msg and "\n" not in msg
    st.close()


def test_a_replaced_database_is_followed(tmp_path, caplog):
    path, backup = tmp_path / "nvmon.db", tmp_path / "backup.db"
    st = Store(path, owner=True)
    st.write_many([tick(i) for i in range(5)])
    src = sqlite3.connect(path)
    with sqlite3.connect(backup) as dst:
        src.backup(dst)  # what a restore from backup puts there: ticks 0-4
    src.close()
    st.write_many([tick(i) for i in range(5, 10)])
    os.replace(backup, path)
    with caplog.at_level(logging.ERROR, logger="nvmon.store"):
        st.write(tick(10))
    assert ticks(path) == [ms(i) for i in (0, 1, 2, 3, 4, 10)] and st.resets == 1
    assert "was replaced by another file" in errors(caplog)[0]
    st.close()


def test_a_tool_beside_the_daemon_does_not_guard(tmp_path):
    """`nvmon alerts ack` and friends write beside the daemon: no lock, no recreation."""
    path = tmp_path / "nvmon.db"
    daemon = Store(path, owner=True)
    daemon.lock()
    tool = Store(path)
    tool.write(tick(0))  # not refused by the daemon's lock
    with pytest.raises(StoreError) as e:
        Store(path, owner=True).lock()
    assert e.value.code == "LOCKED" and f"database {path} is in use by another nvmon process (pid {os.getpid()}" in \
        str(e.value)
    tool.close()
    daemon.close()
    Store(path, owner=True).lock()  # released by close()


def fill(path: Path, n: int = 600) -> None:
    """n ticks a second apart (10 minutes: one rollup pass reads all of them), checkpointed into
    the file, connection closed."""
    st = Store(path)
    for i in range(0, n, 60):
        st.write_many([tick(j) for j in range(i, min(i + 60, n))])
    st.close()
    assert not os.path.exists(f"{path}-wal")


def scribble(path: Path, offset: int, size: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(os.urandom(size))


def test_garbage_in_the_middle_is_set_aside_and_a_fresh_database_started(tmp_path, caplog):
    path = tmp_path / "nvmon.db"
    fill(path)
    scribble(path, os.path.getsize(path) // 2 // 8192 * 8192, 16384)  # 16 KiB, two pages, mid-file
    assert integrity(path) != "ok"  # the file really is damaged
    st = Store(path, owner=True, raw_retention_s=3 * 3600)
    with caplog.at_level(logging.ERROR, logger="nvmon.store"):
        st.write(tick(600))
        st.maintain(tick(700).ts)  # rolls up minutes 0-9: reads every page of them, meets the garbage
        st.write(tick(701))
    aside = sorted(tmp_path.glob("nvmon.db.corrupt-*"))
    assert [p.name for p in aside] == [aside[0].name] and re.fullmatch(r"nvmon\.db\.corrupt-\d{8}T\d{6}Z", aside[0].name)
    assert st.resets == 1 and integrity(path) == "ok" and ms(701) in ticks(path)
    (msg,) = errors(caplog)
    assert "is corrupt (SQLITE_CORRUPT" in msg and aside[0].name in msg
    st.close()


def test_a_garbage_header_is_set_aside_at_open(tmp_path, caplog):
    path = tmp_path / "nvmon.db"
    fill(path, 60)
    scribble(path, 0, 100)
    damaged = path.read_bytes()
    with pytest.raises(StoreError, match="SQLITE_NOTADB"):  # a tool: told, nothing moved
        Store(path).open()
    assert not list(tmp_path.glob("*.corrupt-*"))
    st = Store(path, owner=True)
    with caplog.at_level(logging.ERROR, logger="nvmon.store"):
        st.write(tick(60))
    (aside,) = tmp_path.glob("nvmon.db.corrupt-*")
    assert ticks(path) == [ms(60)] and st.resets == 1 and len(errors(caplog)) == 1
    assert aside.read_bytes() == damaged  # kept as it was, for `.recover`
    st.close()


def test_corruption_that_keeps_coming_back_is_set_aside_three_times_then_reported(tmp_path, caplog, monkeypatch):
    """A disk that corrupts every new file: bounded, not a loop of renames."""
    path = tmp_path / "nvmon.db"
    st = Store(path, owner=True)
    st.open()

    def corrupt(conn, samples):
        exc = sqlite3.DatabaseError("database disk image is malformed")
        exc.sqlite_errorname = "SQLITE_CORRUPT"
        raise exc

    monkeypatch.setattr(st, "_write_committed", corrupt)
    with caplog.at_level(logging.ERROR, logger="nvmon.store"):
        for i in range(6):
            with pytest.raises(StoreError, match="SQLITE_CORRUPT"):
                st.write(tick(i))
    assert len(list(tmp_path.glob("nvmon.db.corrupt-*"))) == store_mod.MAX_SET_ASIDES == st.resets
    assert len(errors(caplog)) == store_mod.MAX_SET_ASIDES + 1  # the moves, then "the disk is suspect" once
    assert "the disk or file system is suspect" in errors(caplog)[-1]


def test_the_wal_is_checkpointed_at_about_one_mib(tmp_path):
    path = tmp_path / "nvmon.db"
    st = Store(path, owner=True)
    biggest = 0
    for i in range(0, 1200, 1):
        st.write(tick(i))
        biggest = max(biggest, os.path.getsize(f"{path}-wal"))
    assert biggest <= 1.25 * 2**20, biggest  # SQLite's default let it reach 8 MB
    st.close()


# ---------------------------------------------------------------- real daemons


def daemon(tmp_path: Path, db: Path, name: str, *extra: str) -> subprocess.Popen:
    (tmp_path / "none.toml").write_text("")
    return subprocess.Popen([sys.executable, "-m", "nvmon", "daemon", "--config", str(tmp_path / "none.toml"),
                             "--sim", "hgx-h100", "--broker", "", "--db", str(db), "--node", name, "--interval",
                             "0.25", "--log-level", "info", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def count_ticks(db: Path) -> int:
    try:
        return len(ticks(db))
    except sqlite3.Error:
        return 0


def stop(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=15)
    return proc.returncode, err


def test_a_second_daemon_on_the_same_database_refuses_in_one_line(tmp_path):
    db = tmp_path / "nvmon.db"
    first = daemon(tmp_path, db, "h100-a")
    try:
        wait_for(lambda: count_ticks(db) >= 2, what="the first daemon's ticks")
        second = daemon(tmp_path, db, "a100-b")
        _, err = second.communicate(timeout=30)
        assert second.returncode == 1 and err.count("\n") == 1, err
        assert err == f"nvmon: database {db} is in use by another nvmon process (pid {first.pid}, lock " \
                      f"nvmon.db.lock); give each daemon or fleet its own --db\n"
        assert first.poll() is None  # the first one never noticed
    finally:
        first.kill()  # kill -9: the lock goes with the process
        first.wait(10)
    third = daemon(tmp_path, db, "h100-a")
    n = count_ticks(db)
    wait_for(lambda: count_ticks(db) > n + 2, what="a restarted daemon's ticks")
    rc, err = stop(third)
    assert rc == 0 and "in use" not in err


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def store_errors(port: int) -> float:
    m = re.search(r"^nvmon_daemon_store_errors_total\{[^}]*\} (\S+)$", scrape(port), re.M)
    return float(m.group(1))


def test_a_running_daemon_recreates_its_deleted_database_and_counts_it(tmp_path):
    from test_prometheus import free_port

    db, port = tmp_path / "nvmon.db", free_port()
    proc = daemon(tmp_path, db, "rm-1", "--prometheus", f"127.0.0.1:{port}")
    try:
        wait_for(lambda: count_ticks(db) >= 4, what="ticks")
        assert store_errors(port) == 0
        os.unlink(db)  # rm /var/lib/nvmon/nvmon.db
        t0 = time.time()
        wait_for(lambda: count_ticks(db) >= 8, what="ticks in a new file")
        first = ticks(db)[0] / 1000
        assert first - t0 < 0.6  # the first tick after the rm (4 a second) is in the new file
        assert store_errors(port) == 1
    finally:
        rc, err = stop(proc)
    assert rc == 0
    lines = [ln for ln in err.splitlines() if " ERROR" in ln or "Traceback" in ln]
    assert len(lines) == 1 and f"database {db} was deleted while in use" in lines[0], err


def test_a_daemon_started_on_a_corrupt_file_sets_it_aside_and_stores(tmp_path):
    db = tmp_path / "nvmon.db"
    fill(db, 60)
    scribble(db, 0, 4096)  # the header and the first page: SQLITE_NOTADB
    proc = daemon(tmp_path, db, "bad-1")
    try:
        wait_for(lambda: count_ticks(db) >= 4, what="ticks in a fresh file")
    finally:
        rc, err = stop(proc)
    assert rc == 0 and len(list(tmp_path.glob("nvmon.db.corrupt-*"))) == 1
    lines = [ln for ln in err.splitlines() if " ERROR" in ln or "Traceback" in ln]
    assert len(lines) == 1 and "is corrupt (SQLITE_NOTADB): moved aside to nvmon.db.corrupt-" in lines[0], err
