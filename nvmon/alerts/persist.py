"""Plumbing shared by the daemon's and the fleet's alert persist loops (DaemonAlerts, FleetAlerts).

- `UnsavedAlerts`: records not yet in the store, the newest state per episode (fingerprint,
  starts_at), bounded: while the database is unwritable the oldest are dropped past `limit`. A
  write that fails (StoreError, raised to the caller) leaves everything in place for the next try.
- `Outage`: logs a failing database at most once a minute, and its return once.
- `woken`: the loop's wait for work, with a timeout so that acks and silences are read regularly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from nvmon.alerts.model import AlertRecord

MAX_UNSAVED = 10_000  # episodes kept in memory while the database is unwritable
REPORT_EVERY_S = 60.0  # a database still failing is logged again after this


class UnsavedAlerts:
    def __init__(self, limit: int = MAX_UNSAVED):
        self.limit = limit
        self._records: dict[tuple[str, float], AlertRecord] = {}

    def __len__(self) -> int:
        return len(self._records)

    def keep(self, records: Iterable[AlertRecord]) -> None:
        for r in records:
            self._records[(r.fingerprint, r.starts_at)] = r
        while len(self._records) > self.limit:
            self._records.pop(next(iter(self._records)))

    async def save(self, store, now: float) -> None:
        """Write what is unsaved (in a thread); states that changed meanwhile stay for next time."""
        batch = dict(self._records)
        if not batch:
            return
        await asyncio.to_thread(store.save_alerts, list(batch.values()), now)
        for key, rec in batch.items():
            if self._records.get(key) is rec:  # a newer state may have arrived meanwhile
                del self._records[key]

    def flush(self, store, now: float) -> None:
        """Write what is unsaved, here (at shutdown, in a thread)."""
        if self._records:
            store.save_alerts(list(self._records.values()), now)
            self._records.clear()


class Outage:
    """`failed(e)` after each failed round, `ok()` after each good one. `prefix` starts every line
    (`alerts`, `fleet`); `back` is the line logged when the database works again."""

    def __init__(self, log: logging.Logger, prefix: str, back: str):
        self.log, self.prefix, self.back = log, prefix, back
        self.failing = False
        self._last_report = 0.0

    def failed(self, e: Exception) -> float:
        """Log `e` (the first time, then once a minute at most); returns time.monotonic()."""
        now = time.monotonic()
        if not self.failing or now - self._last_report > REPORT_EVERY_S:
            self.log.error("%s: database: %s; keeping alert changes in memory and retrying", self.prefix, e)
            self._last_report = now
        self.failing = True
        return now

    def ok(self) -> None:
        if self.failing:
            self.log.warning(self.back)
            self.failing = False


async def woken(event: asyncio.Event, timeout_s: float) -> None:
    """Wait until `event` is set or `timeout_s` passed, then clear it."""
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        pass
    event.clear()
