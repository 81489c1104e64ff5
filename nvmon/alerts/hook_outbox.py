"""The hooks' outbox: every notification a hook is to deliver is written here (a small SQLite
file next to the daemon's database) before its first attempt, and removed once delivered or
given up. A stop, a crash or kill -9 therefore loses none: the next start delivers what is left.

Delivery is at least once: a notification that reached its receiver just before the process died,
before its row was removed, goes out again after the restart.

The file is the daemon's own (`<db>.outbox`, next to the database, so the database's exclusive
lock covers it): a separate file keeps hook bookkeeping out of the sample store's transactions,
its maintenance and its corruption handling. If it cannot be opened or written (a full or
read-only disk), the hooks carry on from memory and say so once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nvmon.alerts.model import AlertRecord

log = logging.getLogger("nvmon.hooks")

MAX_ROWS = 100_000  # beyond this, new notifications are kept in memory only (counted in the log)

SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    hook TEXT NOT NULL,
    status TEXT NOT NULL,
    labels TEXT NOT NULL,
    records TEXT NOT NULL,
    grouped INTEGER NOT NULL,
    n INTEGER NOT NULL,
    created REAL NOT NULL
)
"""


@dataclass(slots=True)
class Pending:
    """One notification for one hook: `records` in one request (`n` of them counted in its stats)."""

    id: int | None  # outbox row; None where it is kept in memory only
    hook: str
    status: str
    labels: dict[str, str]
    records: list[AlertRecord]
    grouped: bool
    n: int
    created: float


def outbox_path(db: Path) -> Path:
    return db.with_name(db.name + ".outbox")


def _record(d: dict[str, Any]) -> AlertRecord:
    return AlertRecord(**d)


class Outbox:
    """Pending hook notifications in SQLite. Every method is quick and never raises: a database
    problem switches the outbox off (logged once) and the hooks deliver from memory."""

    def __init__(self, path: Path | None):
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._full_logged = False
        self._rows = 0
        if path is None:
            return
        try:
            try:
                self._db = self._open(path)
            except sqlite3.DatabaseError as e:  # not a database (any more): set it aside, start afresh
                if isinstance(e, sqlite3.OperationalError) or not path.exists():
                    raise
                aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
                path.rename(aside)
                log.warning("hooks: outbox %s: %s; moved to %s, starting a new one (its notifications are lost)",
                            path, e, aside.name)
                self._db = self._open(path)
        except (sqlite3.Error, OSError) as e:
            log.warning("hooks: outbox %s: %s; undelivered notifications will not survive a restart", path, e)

    def _open(self, path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=1.0)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # survives a process crash; a power cut may lose the last rows
            db.execute(SCHEMA)
            self._rows = db.execute("SELECT count(*) FROM outbox").fetchone()[0]
        except BaseException:
            db.close()
            raise
        return db

    @property
    def persistent(self) -> bool:
        return self._db is not None

    def _fail(self, what: str, e: Exception) -> None:
        log.warning("hooks: outbox %s: %s failed (%s); carrying on from memory", self.path, what, e)
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()

    def add(self, p: Pending) -> None:
        """Write `p` (sets `p.id`); on failure `p` stays in memory only."""
        if self._db is None:
            return
        try:
            if self._rows >= MAX_ROWS:
                if not self._full_logged:
                    self._full_logged = True
                    log.warning("hooks: outbox holds %d notifications; newer ones are kept in memory only", MAX_ROWS)
                return
            cur = self._db.execute(
                "INSERT INTO outbox (hook, status, labels, records, grouped, n, created) VALUES (?,?,?,?,?,?,?)",
                (p.hook, p.status, json.dumps(p.labels), json.dumps([asdict(r) for r in p.records]),
                 int(p.grouped), p.n, p.created))
            p.id = cur.lastrowid
            self._rows += 1
        except (sqlite3.Error, TypeError, ValueError) as e:
            self._fail("write", e)

    def update(self, p: Pending) -> None:
        """`p.records` changed (an alert in it resolved before it went out)."""
        if self._db is None or p.id is None:
            return
        try:
            self._db.execute("UPDATE outbox SET records = ?, n = ? WHERE id = ?",
                             (json.dumps([asdict(r) for r in p.records]), p.n, p.id))
        except (sqlite3.Error, TypeError, ValueError) as e:
            self._fail("update", e)

    def done(self, p: Pending) -> None:
        """Delivered or given up: forget it."""
        if self._db is None or p.id is None:
            return
        try:
            self._rows -= self._db.execute("DELETE FROM outbox WHERE id = ?", (p.id,)).rowcount
        except sqlite3.Error as e:
            self._fail("delete", e)

    def load(self, hooks: set[str]) -> list[Pending]:
        """What an earlier run left, oldest first. Rows for hooks no longer configured, or that
        cannot be read back, are dropped (counted in the log)."""
        if self._db is None:
            return []
        out: list[Pending] = []
        dropped = {"unknown hook": 0, "unreadable": 0}
        try:
            rows = self._db.execute(
                "SELECT id, hook, status, labels, records, grouped, n, created FROM outbox ORDER BY id").fetchall()
            for rid, hook, status, labels, records, grouped, n, created in rows:
                if hook not in hooks:
                    dropped["unknown hook"] += 1
                    self._db.execute("DELETE FROM outbox WHERE id = ?", (rid,))
                    continue
                try:
                    recs = [_record(d) for d in json.loads(records)]
                    lab = {str(k): str(v) for k, v in json.loads(labels).items()}
                except (TypeError, ValueError, AttributeError) as e:
                    log.debug("hooks: outbox row %d: %s", rid, e)
                    dropped["unreadable"] += 1
                    self._db.execute("DELETE FROM outbox WHERE id = ?", (rid,))
                    continue
                out.append(Pending(rid, hook, str(status), lab, recs, bool(grouped), int(n), float(created)))
            self._rows = self._db.execute("SELECT count(*) FROM outbox").fetchone()[0]
        except sqlite3.Error as e:
            self._fail("read", e)
        for why, count in dropped.items():
            if count:
                log.warning("hooks: outbox: dropped %d notification(s) left from the last run (%s)", count, why)
        if out:
            log.info("hooks: %d notification(s) left undelivered by the last run; delivering them now", len(out))
        return out

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()

