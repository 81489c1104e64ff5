"""The node's local history: one SQLite file in WAL mode, written by the daemon.

Durability: WAL with `synchronous=NORMAL`. A commit is appended to the WAL with write() before it
returns, so a killed process (kill -9, OOM) loses nothing committed and at most the tick it was
writing; SQLite's WAL checksums make recovery ignore a half-written frame. Only a power cut or
kernel crash can drop the last commits since the last checkpoint's fsync - never corrupt the file.
FULL would fsync every tick: a second of history is not worth that wear on a node's boot disk.

Threading: the daemon calls the store through `asyncio.to_thread`, so calls come from changing
threads; the connection allows that and a lock keeps calls one at a time.

The daemon's store is the file's owner (`owner=True`, nvmon/store/guard.py): it holds `<db>.lock`, so
a second daemon on the same file refuses to start; before every call it checks that the file at the
path is still the one it has open (one stat), and starts a new database when it was deleted (or
follows the new file when it was replaced); a file SQLite calls corrupt (SQLITE_CORRUPT,
SQLITE_NOTADB) is moved aside as `<name>.corrupt-<time>` and a fresh one started, and the call
that met it is run again there. Damage no call has met yet is looked for with `PRAGMA quick_check`
on the first connection to each file (the daemon's start) and after a maintenance error SQLite did
not call corruption. Each reset is logged once, counted in `resets` (`resets_by` reason) and told
in `last_reset`, which the daemon turns into a `store.reset` alert.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import sqlite_utils

from nvmon.model import Sample
from nvmon.store import codec, guard, rollup
from nvmon.store.errors import RECONNECT_ON, StoreError, describe, error_name
from nvmon.store.schema import SchemaError, migrate

if TYPE_CHECKING:
    from nvmon.alerts.model import AlertRecord

log = logging.getLogger("nvmon.store")
T = TypeVar("T")

PAGE_SIZE = 8192  # 4, 8 and 16 KiB measured the same size; 8 KiB reads a time range in fewer pages
MIN_SQLITE = (3, 37)  # STRICT tables. JSON functions: built in from 3.38, compiled in by distros before
# The WAL: checkpointed into the database once it holds WAL_CHECKPOINT_PAGES (1 MiB; SQLite's
# default, 1000 pages, let it reach 8 MiB first) and truncated back to WAL_LIMIT_BYTES after a
# checkpoint that a bigger transaction (a maintenance backlog) or a long reader made it outgrow.
WAL_CHECKPOINT_PAGES = 128
WAL_LIMIT_BYTES = 2 * 2**20
MAX_SET_ASIDES = 3  # corrupt again after this many fresh databases: the disk, not the file; stop moving
CORRUPT = ("SQLITE_CORRUPT", "SQLITE_NOTADB")

# Column lists from the codec (the GPU row's from the catalog): a column is never counted by hand.
_INSERT_TICK = codec.insert_sql("ticks", codec.TICK_COLUMNS)
_INSERT_GPU = codec.insert_sql("gpu_ticks", codec.GPU_COLUMNS)
_INSERT_IB = codec.insert_sql("ib_ticks", codec.IB_COLUMNS)
_NONE_CHECKED = object()  # _write_samples: no tick of the batch had its facts checked


class Store:
    """`open()`, then `write()` / `write_many()` per tick and `maintain(now)` about once a minute.

    Every failure raises StoreError with a one-line message. After one, the object stays usable:
    the next call reconnects if the connection itself went bad (file made read-only, moved), so a
    daemon can keep a backlog and retry `write_many(backlog)` until it succeeds.
    """

    def __init__(self, path: str | Path, *, raw_retention_s: float = 48 * 3600,
                 rollup_retention_s: float = 90 * 86400, alert_retention_s: float = 7 * 86400,
                 owner: bool = False):
        """`owner`: the daemon's store, which locks the file and recovers it (module docstring);
        tools that write beside it (`nvmon alerts ack`) are not owners."""
        self.path = Path(path)
        self.owner = owner
        self.resets = 0  # owner: times the file was found deleted, replaced or corrupt and started anew
        self.resets_by = dict.fromkeys(guard.RESET_REASONS, 0)  # the same, by reason
        self.last_reset: str | None = None  # one line: what the latest reset found and did (set before `resets`)
        self._checked: tuple[int, int] | None = None  # identity of the last file quick_check passed
        self._file_lock = guard.FileLock(self.path) if owner else None
        self._ident: tuple[int, int] | None = None  # (device, inode) of the open file
        self._sidecars: tuple = (None, None)  # and of its -wal and -shm
        self._set_asides = 0
        self.raw_retention_s = float(raw_retention_s)
        self.rollup_retention_s = float(rollup_retention_s)
        self.alert_retention_s = float(alert_retention_s)  # resolved alerts, ended silences
        self.schema_version = 0
        self.skipped = 0  # samples not stored: unusable timestamp, unreadable object, before the raw window
        self._conn: sqlite3.Connection | None = None
        self._db: sqlite_utils.Database | None = None
        self._lock = threading.Lock()
        self._facts: dict[tuple[str, str], str] = {}  # latest inventory facts (JSON) per (kind, key)
        self._sigs: dict[tuple[str, str], tuple] = {}  # the raw values those facts were built from
        self._seen: list | None = None  # every signature of the last committed tick (see _note_facts)
        self._ports: dict[tuple[str, int], int] = {}  # (device, port) → ib_ports.id
        self._state: dict[str, Any] = {}
        # Did another connection (`nvmon alerts ack`, a second writer) commit since alert_controls()
        # last read? Noticed by write_many through PRAGMA data_version, which moves only on other
        # connections' commits: the daemon re-reads its acks and silences only when this is set.
        self.others_wrote = True
        self._data_version: int | None = None

    # -- connection ---------------------------------------------------------------------------

    def open(self) -> None:
        """Create or migrate the database and switch it to WAL. Raises StoreError (one line)."""
        self._call(lambda conn: None)

    def lock(self) -> None:
        """Owner: take `<db>.lock` now, so that a second daemon fails at its start. Raises
        StoreError (code guard.LOCKED when another process holds it)."""
        with self._lock:
            if self._file_lock is not None:
                self._file_lock.acquire()

    def close(self) -> None:
        """Close the connection (checkpointing the WAL) and release the lock; the store may be
        opened again."""
        with self._lock:
            self._disconnect()
            if self._file_lock is not None:
                self._file_lock.release()

    def __enter__(self) -> Store:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            if not self.owner or guard.identity(self.path) == self._ident:
                return self._conn
            self._file_gone()
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            raise StoreError(f"database {self.path}: SQLite {sqlite3.sqlite_version} is too old; nvmon needs "
                             f"{'.'.join(map(str, MIN_SQLITE))} or newer (STRICT tables, JSON functions)")
        guard.check_writable(self.path)
        if self._file_lock is not None:
            self._file_lock.acquire()  # again, if its file was deleted too
        conn = None
        try:
            # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE below), never implicit.
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=5.0)
            if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
                # Only a new, empty file takes these; they are fixed once the first table exists.
                conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # so maintain() can hand space back
            db = sqlite_utils.Database(conn, execute_plugins=False)
            db.enable_wal()
            if db.journal_mode != "wal":
                raise StoreError(f"database {self.path}: cannot switch to WAL mode (journal_mode={db.journal_mode})")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
            conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
            ident = guard.identity(self.path)
            if self.owner and ident != self._checked:
                guard.quick_check(conn, self.path)  # a file met for the first time: damage no call has read yet
                self._checked = ident
            self.schema_version = migrate(conn)
            # Take the write lock once, so that another writer holding it (a second daemon on the
            # same file) shows now, as SQLITE_BUSY after the timeout, rather than at the first tick.
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("COMMIT")
            self._load_caches(conn)
        except BaseException as exc:
            if conn is not None:
                _close_quietly(conn)
            if isinstance(exc, StoreError):
                raise
            if isinstance(exc, SchemaError):
                raise StoreError(f"database {self.path}: {exc}") from None
            if isinstance(exc, (sqlite3.Error, OSError)):
                raise describe(self.path, exc) from None
            raise
        self._conn, self._db = conn, db
        self._ident, self._sidecars = guard.identity(self.path), guard.sidecars(self.path)
        return conn

    def _recheck(self, err: StoreError) -> StoreError:
        """Owner, after `err` that SQLite did not call corruption: quick_check the file, and return
        the corruption it finds (so that the file is set aside), else `err` as it was."""
        if self.owner and not (err.code or "").startswith(CORRUPT + guard.NOT_THE_FILE):
            self._disconnect()  # a new connection: its page cache holds nothing read before the damage
            try:
                guard.quick_check(self._connect(), self.path)
            except StoreError as found:
                return found if (found.code or "").startswith(CORRUPT) else err
        return err

    def _reset(self, reason: str, what: str) -> None:
        self.resets_by[reason] += 1
        self.last_reset = what
        self.resets += 1

    def _file_gone(self) -> None:
        """Owner: the file at the path is not the one open (deleted, or another put there)."""
        now, ours = guard.identity(self.path), self._sidecars
        self._disconnect()
        guard.remove_sidecars(self.path, ours)
        if now is None:
            self._reset("deleted", f"database {self.path} was deleted while in use (its history is gone); "
                                   f"a new one was started there")
            log.error("database %s was deleted while in use: the history it held is gone; starting a new "
                      "database there now (no tick from here on is lost)", self.path)
        else:
            self._reset("replaced", f"database {self.path} was replaced by another file while in use; "
                                    f"writing to that file")
            log.error("database %s was replaced by another file while in use; writing to that file from now on",
                      self.path)

    def _set_aside(self, err: StoreError) -> bool:
        """Owner: move a corrupt file aside and start anew (True), at most MAX_SET_ASIDES times."""
        if not self.owner or not (err.code or "").startswith(CORRUPT):
            return False
        self._set_asides += 1
        if self._set_asides > MAX_SET_ASIDES:
            if self._set_asides == MAX_SET_ASIDES + 1:
                log.error("database %s: corrupt again after %d fresh starts: the disk or file system is suspect; "
                          "leaving it in place, writes keep failing (%s)", self.path, MAX_SET_ASIDES, err.code)
            return False
        self._disconnect()
        try:
            target = guard.set_aside(self.path)
        except OSError as e:
            log.error("database %s is corrupt (%s) and could not be moved aside: %s", self.path, err.code,
                      e.strerror or e)
            return False
        self._reset("corrupt", f"{err}: moved aside to {target.name}; a new database was started")
        log.error("database %s is corrupt (%s): moved aside to %s (with its -wal/-shm; `sqlite3 %s .recover` "
                  "may save some of its history); starting a new database", self.path, err.code, target.name,
                  target.name)
        return True

    def _call(self, fn: Callable[[sqlite3.Connection], T], *, check: bool = False) -> T:
        """`fn(conn)` with the store's lock, reconnecting and error handling; for an owner, once
        more on a fresh file after a corrupt one was set aside. `check`: after an error SQLite did
        not call corruption, quick_check the file (maintenance). Raises StoreError (one line)."""
        with self._lock:
            retried = False
            while True:
                try:
                    return fn(self._connect())
                except BaseException as exc:
                    err = self._fail(exc)
                    if err is None:
                        raise
                    if check and not retried:
                        err = self._recheck(err)
                    if not retried and self._set_aside(err):
                        retried = True
                        continue
                    raise err from None

    def _disconnect(self) -> None:
        if self._conn is not None:
            _close_quietly(self._conn)
        self._conn = self._db = self._ident = None
        self._data_version = None  # a new connection counts from its own start

    def _load_caches(self, conn: sqlite3.Connection) -> None:
        self._facts = {
            (kind, key): facts for kind, key, facts in conn.execute(
                "SELECT kind, key, facts FROM inventory i WHERE since_ms = "
                "(SELECT max(since_ms) FROM inventory j WHERE j.kind = i.kind AND j.key = i.key)")
        }
        self._sigs = {}
        self._seen = None
        self._ports = {(dev, port): pid for pid, dev, port in conn.execute("SELECT id, device, port FROM ib_ports")}
        self._state = dict(conn.execute("SELECT key, value FROM state"))

    def _fail(self, exc: BaseException) -> StoreError | None:
        """Roll back, decide whether the connection survives, and build the one-line error
        (None for KeyboardInterrupt and the like: those propagate as they are)."""
        conn = self._conn
        if conn is not None and conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # SQLite may already have rolled back (SQLITE_FULL does); nothing to keep
        name = error_name(exc) or ""
        if not isinstance(exc, sqlite3.Error) or name.startswith(RECONNECT_ON):
            self._disconnect()  # _connect() reloads every cache
        elif conn is not None:
            try:  # the rolled-back transaction may have moved the rollup point: read it again
                self._state = dict(conn.execute("SELECT key, value FROM state"))
            except sqlite3.Error:
                self._disconnect()
        if not isinstance(exc, Exception):
            return None
        return exc if isinstance(exc, StoreError) else describe(self.path, exc)

    # -- writing ------------------------------------------------------------------------------

    def write(self, sample: Sample) -> None:
        """Store one tick in one transaction. Raises StoreError; nothing of the tick is kept then."""
        self.write_many((sample,))

    def write_many(self, samples: Sequence[Sample]) -> None:
        """Store a backlog of ticks in one transaction: all of them or, on StoreError, none.

        A tick already stored (same timestamp) is left as it is, so retrying a backlog is safe.
        A sample that cannot be read as one is skipped and counted in `skipped`, not fatal: one
        bad sample must not cost the good ones around it.
        """
        if samples:
            self._call(lambda conn: self._write_committed(conn, samples))

    def _write_committed(self, conn: sqlite3.Connection, samples: Sequence[Sample]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        facts, ports, seen = self._write_samples(conn, samples)
        conn.execute("COMMIT")
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            self._data_version, self.others_wrote = version, True
        # Caches change only once the transaction holding their rows has committed.
        for key, (sig, text) in facts.items():
            self._sigs[key], self._facts[key] = sig, text
        self._ports.update(ports)
        if seen is not _NONE_CHECKED:
            self._seen = seen

    def _write_samples(self, conn: sqlite3.Connection, samples: Sequence[Sample]):
        pending_facts: dict[tuple[str, str], tuple[tuple, str]] = {}
        pending_ports: dict[tuple[str, int], int] = {}
        horizon = int(self._state.get("raw_pruned_ms") or 0)
        rolled = self._state.get("rollup_done_ms")
        earliest = None
        seen = _NONE_CHECKED
        for sample in samples:
            t = codec.ts_ms(getattr(sample, "ts", None))
            if t is None or t < horizon:
                self.skipped += 1  # no usable time, or older than what pruning already removed
                continue
            try:
                tick = codec.tick_row(t, sample)
                gpus = [row for g in sample.gpus if (row := codec.gpu_row(t, g))[1] is not None]
                ib = []
                for p in sample.ib:
                    key = (str(p.device)[:40], codec.integer(p.port) or 0)
                    pid = self._ports.get(key) or pending_ports.get(key)
                    if pid is None:
                        pid = conn.execute("INSERT INTO ib_ports (device, port) VALUES (?, ?)", key).lastrowid
                        pending_ports[key] = pid
                    ib.append((p, key, codec.ib_row(t, pid, p)))
            except (AttributeError, TypeError, ValueError) as exc:
                self.skipped += 1
                log.warning("store: skipped a malformed sample: %s", exc)
                continue
            if conn.execute(_INSERT_TICK, tick).rowcount == 0:
                continue  # this tick is stored already: keep what is there
            conn.executemany(_INSERT_GPU, gpus)
            conn.executemany(_INSERT_IB, [row for _, _, row in ib])
            seen = self._note_facts(conn, t, sample, ib, pending_facts)
            earliest = t if earliest is None else min(earliest, t)
        if earliest is not None and rolled is not None and earliest < rolled:
            # A late tick (a backlog written after an outage) lands in a minute already rolled up:
            # roll that minute up again at the next maintain().
            self._set_state(conn, "rollup_done_ms", earliest // 60000 * 60000)
        return pending_facts, pending_ports, seen

    def _note_facts(self, conn, t: int, sample: Sample, ib: list, pending: dict) -> list | None:
        """Write an inventory row for each GPU, port or node whose static facts changed.

        A cheap signature of the raw values is compared first; facts are only rebuilt and
        serialised when it changes (that JSON work per tick was a third of the write cost).

        Nearly every tick, no signature changed since the last committed tick: the whole list of
        them is compared at once with the one kept from that tick (`_seen`, whose entries the
        caches hold), instead of looking each one up. Returns the list to keep, or None when the
        facts were not all checked or a key repeats (then the next tick looks each one up).
        """
        try:
            seen = [("node", "", codec.node_signature(sample))]
            seen += [("gpu", str(g.index), codec.gpu_signature(g)) for g in sample.gpus]
            seen += [("ib", f"{dev}:{port}", codec.ib_signature(p)) for p, (dev, port), _ in ib]
        except (AttributeError, TypeError, ValueError):
            seen = None  # the item-by-item pass below meets the same error at the same place
        if seen is not None and not pending and seen == self._seen:
            return seen
        sigs, cached = self._sigs, self._facts

        def put(kind: str, key: str, sig: tuple, build) -> None:
            ck = (kind, key)
            prev_sig, old = pending[ck] if ck in pending else (sigs.get(ck), cached.get(ck))
            if sig == prev_sig and old is not None:
                return
            facts = json.dumps(build(json.loads(old) if old else None), sort_keys=True, default=str)
            if facts != old:
                conn.execute("INSERT OR REPLACE INTO inventory VALUES (?, ?, ?, ?)", (kind, key, t, facts))
            pending[ck] = (sig, facts)

        try:
            put("node", "", codec.node_signature(sample), lambda prev: codec.facts_node(sample, prev))
            for g in sample.gpus:
                put("gpu", str(g.index), codec.gpu_signature(g), lambda prev, g=g: codec.facts_gpu(g, prev))
            for p, (dev, port), _ in ib:
                put("ib", f"{dev}:{port}", codec.ib_signature(p), lambda prev, p=p: codec.facts_ib(p, prev))
        except (AttributeError, TypeError, ValueError) as exc:  # facts are best effort; the tick is kept
            log.warning("store: facts not recorded: %s", exc)
            return None
        if seen is None or len({(kind, key) for kind, key, _ in seen}) != len(seen):
            return None
        return seen

    def _set_state(self, conn: sqlite3.Connection, key: str, value: Any) -> None:
        conn.execute("INSERT OR REPLACE INTO state VALUES (?, ?)", (key, value))
        self._state[key] = value  # a failed transaction reloads state on reconnect (see _fail)

    # -- maintenance --------------------------------------------------------------------------

    def maintain(self, now: float) -> dict[str, int]:
        """Roll up completed minutes and prune past the retention windows, in one transaction.

        Bounded work per call (at most an hour of raw ticks rolled up or pruned), so calling it
        every ~60 s stays cheap and a long backlog is worked off over several calls. Pruning of raw
        ticks never passes the rollup point: no tick is deleted before its minute is rolled up.
        `now` is the caller's clock, not the newest sample's, so one bad timestamp cannot make the
        store prune real history. Returns counts of rows rolled up and pruned.
        """
        def run(conn: sqlite3.Connection) -> dict[str, int]:
            conn.execute("BEGIN IMMEDIATE")
            stats = self._maintain(conn, float(now))
            conn.execute("COMMIT")
            rollup.reclaim_space(conn)
            return stats

        return self._call(run, check=True)

    def _maintain(self, conn: sqlite3.Connection, now: float) -> dict[str, int]:
        now_ms = int(now * 1000)
        done = self._state.get("rollup_done_ms")
        start, end = rollup.next_range(conn, done, now_ms)
        stats = {"minutes": 0}
        if end is not None and end > (done or 0):
            stats["minutes"] = rollup.roll_up(conn, start, end)
            self._set_state(conn, "rollup_done_ms", end)
        done = self._state.get("rollup_done_ms") or 0
        # Minute-aligned, so that a late tick at or after the horizon never shares a minute
        # with pruned ones (its minute can then be rolled up again in full).
        raw_cut = min(now_ms - int(self.raw_retention_s * 1000), done) // 60000 * 60000
        stats["raw_pruned"], pruned_to = rollup.prune_raw(conn, raw_cut)
        if pruned_to > int(self._state.get("raw_pruned_ms") or 0):
            self._set_state(conn, "raw_pruned_ms", pruned_to)
        stats["rollups_pruned"] = rollup.prune_rollups(conn, now_ms - int(self.rollup_retention_s * 1000))
        from nvmon.store import alerts

        stats["alerts_pruned"] = alerts.prune(conn, now - self.alert_retention_s)
        return stats

    # -- alerts (nvmon.store.alerts holds the SQL) ----------------------------------------------

    def transact(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(conn)` in one write transaction, with the store's lock and error handling.
        Raises StoreError (one line)."""
        def run(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            out = fn(conn)
            conn.execute("COMMIT")
            return out

        return self._call(run)

    def save_alerts(self, records: Sequence[AlertRecord], now: float) -> None:
        """Persist alert episodes (engine transitions and counts) in one transaction."""
        from nvmon.store import alerts

        if records:
            self.transact(lambda conn: alerts.save(conn, records, now))

    def load_alerts(self) -> list[AlertRecord]:
        """The active (pending and firing) alerts, for an engine starting up."""
        from nvmon.store import alerts

        return self.transact(lambda conn: alerts.load(conn, active_only=True))

    def alert_controls(self, now: float):
        """(acks, silences) as `AlertEngine.set_controls` takes them. Clears `others_wrote`."""
        from nvmon.store import alerts

        self.others_wrote = False  # before reading: a commit after this is noticed again
        return self.transact(lambda conn: alerts.controls(conn, now))

    # -- reading (the writer's own view; `nvmon history` uses nvmon.store.query read-only) ------

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[dict[str, Any]]:
        """Rows of a read query as dicts (tests, tools). Raises StoreError."""
        return self._call(lambda conn: list(self._db.query(sql, params)))


def _close_quietly(conn: sqlite3.Connection) -> None:
    try:
        conn.close()
    except sqlite3.Error:
        pass
