"""nvmon.alerts.persist: the unsaved-records buffer and the outage log shared by the daemon's and
the fleet's alert persist loops."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from nvmon.alerts.model import AlertRecord
from nvmon.alerts.persist import Outage, UnsavedAlerts, woken
from nvmon.store import StoreError


def rec(fp: str, starts_at: float = 1.0, status: str = "firing") -> AlertRecord:
    return AlertRecord(fingerprint=fp, status=status, code="gpu.temp", severity="warning", cluster="c1",
                       node="n1", summary="hot", runbook="", starts_at=starts_at)


class FakeStore:
    def __init__(self, fail: bool = False):
        self.fail, self.saved = fail, []
        self.started, self.go = threading.Event(), threading.Event()
        self.go.set()

    def save_alerts(self, records, now):
        self.started.set()
        self.go.wait(5)
        if self.fail:
            raise StoreError("disk full")
        self.saved.append(([r.fingerprint for r in records], now))


def test_keep_holds_the_newest_state_per_episode_and_drops_the_oldest_past_the_limit():
    u = UnsavedAlerts(limit=2)
    u.keep([rec("a"), rec("a", status="resolved"), rec("b")])
    assert len(u) == 2
    u.keep([rec("c")])
    store = FakeStore()
    u.flush(store, 5.0)
    assert store.saved == [(["b", "c"], 5.0)] and len(u) == 0
    u.flush(store, 6.0)  # nothing left: no write
    assert len(store.saved) == 1


def test_a_failed_save_keeps_everything_and_a_state_that_changed_meanwhile_stays():
    async def main():
        u = UnsavedAlerts()
        u.keep([rec("a"), rec("b")])
        with pytest.raises(StoreError):
            await u.save(FakeStore(fail=True), 1.0)
        assert len(u) == 2
        store = FakeStore()
        store.go.clear()
        saving = asyncio.create_task(u.save(store, 2.0))
        await asyncio.to_thread(store.started.wait, 5)
        u.keep([rec("a", status="resolved")])  # arrives while the write is in flight
        store.go.set()
        await saving
        assert store.saved == [(["a", "b"], 2.0)] and len(u) == 1

    asyncio.run(main())


def test_outage_logs_the_first_failure_and_the_return_once(caplog):
    outage = Outage(logging.getLogger("nvmon.test"), "fleet", "fleet: database writable again")
    with caplog.at_level(logging.WARNING, "nvmon.test"):
        outage.ok()
        outage.failed(StoreError("disk full"))
        outage.failed(StoreError("disk full"))
        outage.ok()
        outage.ok()
    assert caplog.messages == ["fleet: database: disk full; keeping alert changes in memory and retrying",
                               "fleet: database writable again"]


def test_woken_returns_on_the_event_or_the_timeout_and_clears_it():
    async def main():
        ev = asyncio.Event()
        ev.set()
        await woken(ev, 5.0)
        assert not ev.is_set()
        await woken(ev, 0.01)

    asyncio.run(main())
