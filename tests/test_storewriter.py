"""The daemon's store writer thread (nvmon/daemon/storewriter.py) against a scripted store:
bounded memory while the database fails or hangs, counted drops, retries, the flush on stop.
Writes to a real database on disk are covered by tests/test_daemon.py and test_store_faults.py."""

from __future__ import annotations

import threading
import time

from nvmon.daemon.storewriter import StoreWriter
from nvmon.store import StoreError


class ScriptedStore:
    def __init__(self):
        self.fail = False
        self.hang = threading.Event()
        self.hang.set()  # set: writes go through; cleared: they block until set again
        self.written: list[int] = []
        self.attempts = 0
        self.maintained = 0

    def open(self):
        pass

    def write_many(self, batch):
        self.attempts += 1
        self.hang.wait()
        if self.fail:
            raise StoreError("database x: disk full (ENOSPC)", "ENOSPC")
        self.written += batch

    def maintain(self, now):
        self.maintained += 1


def until(cond, timeout=15.0):  # generous: it costs time only when the test fails
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_writes_arrive_in_order_and_maintenance_runs():
    store = ScriptedStore()
    w = StoreWriter(store, backlog=10, maintain_every_s=0.05)
    w.start()
    for i in range(25):
        w.put(i)
        time.sleep(0.004)
    until(lambda: w.stored == 25)
    assert store.written == list(range(25)) and w.dropped == 0 and w.errors == 0
    until(lambda: store.maintained >= 1)
    assert w.stop(2.0)


def test_a_failing_database_keeps_a_bounded_backlog_retries_and_counts_drops(caplog):
    store = ScriptedStore()
    store.fail = True
    w = StoreWriter(store, backlog=5)
    w.start()
    for i in range(12):
        w.put(i)
        time.sleep(0.01)
    until(lambda: w.errors >= 1)
    assert "disk full" in caplog.text and "keeping up to 5 ticks" in caplog.text
    store.fail = False
    assert w.stop(2.0)  # the stop makes one last attempt at once, whatever the backoff says
    assert w.stored + w.dropped == 12
    assert store.written == list(range(12))[-w.stored:] and w.stored <= 5


def test_put_never_blocks_on_a_hung_disk_and_memory_stays_bounded():
    store = ScriptedStore()
    store.hang.clear()
    w = StoreWriter(store, backlog=4)
    w.start()
    w.put(0)
    until(lambda: store.attempts == 1)  # the thread is stuck inside the write of tick 0
    t0 = time.monotonic()
    for i in range(1, 100):
        w.put(i)
    # A put that waited for the hung write would not return at all (it hangs until store.hang is set
    # below): the counts prove it did not; the bound only catches a put that is slow, with room.
    assert time.monotonic() - t0 < 5.0
    assert len(w._incoming) == 4 and w.dropped == 95
    assert not w.stop(0.1)  # still stuck: stop() gives up instead of hanging the shutdown
    store.hang.set()
    until(lambda: not w._thread.is_alive())
    assert store.written == [0, 96, 97, 98, 99] and w.stored == 5


def test_a_bug_in_the_store_is_logged_and_retried_not_fatal(caplog):
    store = ScriptedStore()
    calls = []

    def broken(batch):
        calls.append(list(batch))
        if len(calls) == 1:
            raise ValueError("a bug")
        store.written += batch

    store.write_many = broken
    w = StoreWriter(store, backlog=10)
    w.start()
    w.put(1)
    until(lambda: w.errors == 1)
    w.put(2)
    assert w.stop(2.0)
    assert "unexpected error" in caplog.text and store.written == [1, 2]

