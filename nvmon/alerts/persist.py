"""Plumbing shared by the daemon's and the fleet's alert persist loops (DaemonAlerts, FleetAlerts).

- `UnsavedAlerts`: records not yet in the store, the newest state per episode (fingerprint,
  starts_at), bounded: while the database is unwritable the oldest are dropped past `limit`. A
  write that fails (StoreError, raised to the caller) leaves everything in place for the next try.
- `Outage`: logs a failing database at most once a minute, and its return once.
- `woken`: the loop's wait for work, with a timeout so that acks and silences are read regularly.
- `SharedSilencesSaver`: the shared silences the loop applies (MQTT `@controls`, as capped and
  vetted by nvmon.alerts.shared), kept in the database's `state` table whenever they change, so
  that `nvmon alerts` reports `silenced` as the daemon (or `nvmon fleet`) judged it;
  `applied_shared_silences(conn, now)` reads them back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import Iterable

from nvmon.alerts.model import AlertRecord, Silence

MAX_UNSAVED = 10_000  # episodes kept in memory while the database is unwritable
REPORT_EVERY_S = 60.0  # a database still failing is logged again after this
SHARED_SILENCES_KEY = "alerts.shared_silences"  # the `state` row holding the applied shared silences


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


def _silence_dict(s: Silence) -> dict:
    return {"id": str(s.id), "matchers": dict(s.matchers), "starts_at": s.starts_at, "ends_at": s.ends_at,
            "created_by": s.created_by, "comment": s.comment}


class SharedSilencesSaver:
    """Writes the applied shared silences to the store's `state` table when they differ from what
    it last wrote (a changed set, one expired). Raises StoreError like the store."""

    def __init__(self) -> None:
        self._saved: str | None = None

    async def save(self, store, silences: Iterable[Silence]) -> None:
        text = json.dumps(sorted((_silence_dict(s) for s in silences), key=lambda d: d["id"]), sort_keys=True)
        if text == self._saved:
            return

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT OR REPLACE INTO state VALUES (?, ?)", (SHARED_SILENCES_KEY, text))

        await asyncio.to_thread(store.transact, write)
        self._saved = text


def applied_shared_silences(conn: sqlite3.Connection, now: float) -> list[Silence]:
    """The shared silences the database's writer last applied and not over by `now`; [] when
    there are none or the row is unreadable (it is only ever written by nvmon)."""
    try:
        row = conn.execute("SELECT value FROM state WHERE key = ?", (SHARED_SILENCES_KEY,)).fetchone()
        items = json.loads(row[0]) if row and isinstance(row[0], str) else []
        out = [Silence(id=str(d["id"]), matchers={str(k): str(v) for k, v in d["matchers"].items()},
                       starts_at=float(d["starts_at"]), ends_at=float(d["ends_at"]), created_by=d.get("created_by"),
                       comment=d.get("comment")) for d in items]
    except (sqlite3.Error, ValueError, TypeError, KeyError, AttributeError):
        return []
    return [s for s in out if s.ends_at > now]
