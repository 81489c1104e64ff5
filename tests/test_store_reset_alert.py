"""A database found deleted, replaced or corrupt is a real alert, not only a log line (issue 16 item 4):

- `PRAGMA quick_check` when the daemon's store first opens a file finds damage no call has read
  yet (16 KiB of garbage in the middle), and after a maintenance error SQLite did not call
  corruption; the file is set aside as `<db>.corrupt-<time>` and a fresh one started;
- each reset raises `store.reset` through the daemon's alert rules, so it reaches the hooks (and the
  retained alerts set, /metrics' nvmon_alerts_active) like any other alert, and counts in
  `nvmon_daemon_store_resets_total{reason}`;
- no tick is lost after the daemon notices: every tick it took is in the fresh file.

Real files, real daemon processes (`nvmon daemon --sim`), a real HTTP receiver for the webhook.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import time
from pathlib import Path

import pytest
from test_hook_outbox import Daemon, receiver, webhook  # noqa: F401 - receiver is a fixture
from test_prometheus import free_port
from test_store_guard import errors, fill, integrity, ms, scrape, scribble, tick, ticks, wait_for

from nvmon.store import Store, StoreError
from nvmon.store import rollup


def middle(path: Path) -> int:
    return os.path.getsize(path) // 2 // 8192 * 8192


# -- the store --------------------------------------------------------------------------------


def test_quick_check_at_open_finds_garbage_no_call_has_read(tmp_path, caplog):
    path = tmp_path / "nvmon.db"
    fill(path)
    scribble(path, middle(path), 16384)
    tool = Store(path)  # a tool (nvmon alerts ack) beside the daemon: no scan, nothing moved
    tool.open()
    tool.close()
    assert not list(tmp_path.glob("*.corrupt-*"))
    st = Store(path, owner=True)
    with caplog.at_level(logging.ERROR, logger="nvmon.store"):
        st.open()  # no write, no maintenance: the scan alone finds it
    (aside,) = tmp_path.glob("nvmon.db.corrupt-*[0-9]Z")
    assert st.resets == 1 and st.resets_by == {"deleted": 0, "replaced": 0, "corrupt": 1}
    assert st.last_reset.startswith(f"database {path}: corrupt (quick_check: ") and aside.name in st.last_reset
    (msg,) = errors(caplog)
    assert "is corrupt (SQLITE_CORRUPT): moved aside to " + aside.name in msg
    st.write(tick(700))
    assert ticks(path) == [ms(700)] and integrity(path) == "ok"
    st.close()


def test_a_healthy_file_is_scanned_once_and_kept(tmp_path, monkeypatch):
    path = tmp_path / "nvmon.db"
    fill(path)
    scans = []
    from nvmon.store import guard

    real = guard.quick_check
    monkeypatch.setattr(guard, "quick_check", lambda conn, p: scans.append(p) or real(conn, p))
    st = Store(path, owner=True)
    for i in range(600, 610):
        st.write(tick(i))
    st.maintain(tick(700).ts)
    assert scans == [path] and st.resets == 0 and len(ticks(path)) == 610
    st.close()


@pytest.mark.parametrize("damaged", [True, False], ids=["damaged", "healthy"])
def test_a_maintenance_error_sqlite_does_not_call_corruption_is_followed_by_a_scan(tmp_path, monkeypatch, damaged):
    """An index or record that is wrong in a way SQLite reports as some other error (a constraint,
    a malformed value): the maintenance error starts a quick_check, and a damaged file is set aside."""
    path = tmp_path / "nvmon.db"
    fill(path)
    st = Store(path, owner=True, raw_retention_s=3 * 3600)
    st.open()  # scanned: healthy then
    if damaged:
        scribble(path, middle(path), 16384)  # while open: nothing has read those pages since

    def broken(conn, start, end):
        exc = sqlite3.IntegrityError("UNIQUE constraint failed: rollup_1m.ts_ms")
        exc.sqlite_errorname = "SQLITE_CONSTRAINT_PRIMARYKEY"
        raise exc

    monkeypatch.setattr(rollup, "roll_up", broken)
    if damaged:  # set aside, and the maintenance done again on the fresh file (nothing to roll up there)
        st.maintain(tick(700).ts)
    else:  # a healthy file: the error is the error, the file stays
        with pytest.raises(StoreError, match="SQLITE_CONSTRAINT"):
            st.maintain(tick(700).ts)
    assert len(list(tmp_path.glob("nvmon.db.corrupt-*[0-9]Z"))) == st.resets == st.resets_by["corrupt"] == int(damaged)
    st.write(tick(701))
    assert ms(701) in ticks(path)
    assert len(ticks(path)) == (1 if damaged else 601)
    st.close()


def test_deleted_and_replaced_files_are_counted_by_reason(tmp_path):
    path = tmp_path / "nvmon.db"
    st = Store(path, owner=True)
    st.write(tick(0))
    os.unlink(path)
    st.write(tick(1))
    assert st.resets_by == {"deleted": 1, "replaced": 0, "corrupt": 0}
    assert st.last_reset == f"database {path} was deleted while in use (its history is gone); a new one was " \
                            f"started there"
    fill(tmp_path / "other.db", 60)
    os.replace(tmp_path / "other.db", path)
    st.write(tick(61))
    assert st.resets_by == {"deleted": 1, "replaced": 1, "corrupt": 0} and st.resets == 2
    assert "was replaced by another file while in use" in st.last_reset
    st.close()


# -- real daemons -----------------------------------------------------------------------------


def metric(port: int, name: str, **labels: str) -> float | None:
    for line in scrape(port).splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    return None


def resets(receiver, status: str = "firing") -> list[dict]:
    return [b for b in receiver.delivered("/wh", status) if b["code"] == "store.reset"]  # one alert a body


def stopped_ticks(log: str) -> tuple[int, int]:
    m = re.search(r"stopped after (\d+) ticks \((\d+) stored", log)
    assert m, log[-2000:]
    return int(m.group(1)), int(m.group(2))


def run_daemon(tmp_path: Path, receiver, port: int) -> Daemon:
    d = Daemon(tmp_path, webhook(receiver), sim="hgx-h100")
    d.args += ["--prometheus", f"127.0.0.1:{port}"]
    return d.start()


@pytest.mark.parametrize("damage", ["16 KiB mid-file", "header"])
def test_a_daemon_started_on_a_corrupt_file_alerts_counts_and_keeps_every_tick(tmp_path, receiver, damage):
    db, port = tmp_path / "n1.db", free_port()
    fill(db)
    scribble(db, *((middle(db), 16384) if damage != "header" else (0, 100)))
    d = run_daemon(tmp_path, receiver, port)
    try:
        wait_for(lambda: resets(receiver), 20, "store.reset at the hook")
        (alert,) = resets(receiver)
        assert alert["severity"] == "warning" and alert["node"] == "n1" and "moved aside to n1.db.corrupt-" in \
            alert["summary"] and "sqlite3 FILE .recover" in alert["runbook"]
        assert ("quick_check" in alert["summary"]) == (damage != "header")  # a bad header: SQLite says NOTADB
        assert metric(port, "nvmon_daemon_store_resets_total", reason="corrupt") == 1
        assert metric(port, "nvmon_daemon_store_resets_total", reason="deleted") == 0
        assert metric(port, "nvmon_alerts_active", code="store.reset", state="firing") == 1
        wait_for(lambda: len(ticks(d.db)) >= 8, 20, "ticks in the fresh file")
    finally:
        d.proc.terminate()
        d.proc.wait(15)
    taken, stored = stopped_ticks(d.text())
    assert taken == stored == len(ticks(d.db)) and taken >= 8  # every tick since the start: none lost
    assert len(list(tmp_path.glob("n1.db.corrupt-*[0-9]Z"))) == 1 and integrity(d.db) == "ok"


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_running_daemons_database_deleted_or_replaced_alerts_and_loses_no_tick(tmp_path, receiver, how):
    port = free_port()
    d = run_daemon(tmp_path, receiver, port)
    backup = tmp_path / "backup.db"
    fill(backup, 60)  # a restored backup: an hour-old minute of ticks
    try:
        wait_for(lambda: len(ticks(d.db)) >= 4 if d.db.exists() else False, 20, "ticks")
        assert metric(port, "nvmon_alerts_active", code="store.reset", state="firing") == 0
        if how == "deleted":
            os.unlink(d.db)  # rm /var/lib/nvmon/nvmon.db
        else:
            os.replace(backup, d.db)  # mv backup.db /var/lib/nvmon/nvmon.db
        t0 = time.time()
        wait_for(lambda: resets(receiver), 20, "store.reset at the hook")
        (alert,) = resets(receiver)
        assert alert["summary"] == (f"database {d.db} was deleted while in use (its history is gone); a new one "
                                    f"was started there" if how == "deleted" else
                                    f"database {d.db} was replaced by another file while in use; writing to that file")
        assert metric(port, "nvmon_daemon_store_resets_total", reason=how) == 1
        wait_for(lambda: len([t for t in ticks(d.db) if t / 1000 >= t0]) >= 8, 20, "ticks in the new file")
    finally:
        d.proc.terminate()
        d.proc.wait(15)
    new = [t for t in ticks(d.db) if t / 1000 >= t0 - 1]
    assert new[0] / 1000 - t0 < 0.5  # the first tick after the rm or mv (5 a second) is in the new file…
    assert max(b - a for a, b in zip(new, new[1:])) < 300  # …and every one after it (0.2 s apart)
    if how == "replaced":
        assert len(ticks(d.db)) == 60 + len(new)  # the backup's history kept, the daemon's added to it
