"""1-minute rollups of raw ticks, and pruning. All functions run inside the caller's transaction.

Scalars are aggregated in SQL (min/avg/max over the minute, sums of error deltas); per-link rates
(uint16 blobs) and bit masks in Python, since SQLite has neither a bitwise-OR aggregate nor a way
to aggregate inside blobs. Per link, a minute keeps avg and max (not min: 72 bytes a GPU-minute,
and a link that stops is already in nvlink_down_mask).

Averages are rounded to whole units (bytes/s, W, °C, %): SQLite stores a whole REAL in 1-6 bytes
and a fractional one in 8, and 90 days of rollups are most of the file.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections import defaultdict

from nvmon.catalog import Scope, of_scope
from nvmon.store.codec import U16_UNKNOWN, json_or_null, pack_u16, unpack_u16

log = logging.getLogger("nvmon.store")

MINUTE_MS = 60_000
GRACE_MS = 5_000  # a minute is complete this long after it ends: ticks still queued can land first
CHUNK_MS = 3600_000  # at most this much raw history is rolled up or pruned per maintain() call


def next_range(conn: sqlite3.Connection, done: int | None, now_ms: int) -> tuple[int, int | None]:
    """The minutes [start, end) to roll up now: from the rollup point (or the first tick) to the
    last complete minute, at most CHUNK_MS; empty stretches (the daemon was down) are skipped."""
    complete = (now_ms - GRACE_MS) // MINUTE_MS * MINUTE_MS
    row = conn.execute("SELECT min(ts_ms) FROM ticks WHERE ts_ms >= ?", (done or 0,)).fetchone()
    first = row[0]
    if first is None or first >= complete:
        return complete, complete if done is not None and complete > done else None
    start = first // MINUTE_MS * MINUTE_MS
    return start, min(complete, start + CHUNK_MS)


def roll_up(conn: sqlite3.Connection, start: int, end: int) -> int:
    """(Re)build the rollup rows of minutes in [start, end); returns how many minutes had GPU rows."""
    window = (start, end)
    conn.execute(_NODE_MINUTES, window)
    conn.execute(_IB_MINUTES, window)
    scalars = {(r[0], r[1]): r for r in conn.execute(_GPU_SCALARS, window)}
    per_link = _link_aggregates(conn, window)
    rows = [(*r, *per_link.get(k, (None,) * len(_GPU_PY_COLUMNS))) for k, r in scalars.items()]
    conn.executemany(_GPU_INSERT, rows)
    return len({minute for minute, _ in scalars})


def _link_aggregates(conn: sqlite3.Connection, window: tuple[int, int]) -> dict:
    """Per (minute, GPU): OR of throttle masks and of down masks, per-link avg/max blobs."""
    groups: dict[tuple[int, int], list] = defaultdict(lambda: [None, 0, [], [], {}])
    for minute, gpu, throttle, down, tx, rx, errors in conn.execute(
        "SELECT ts_ms / 60000 * 60000, gpu, throttle_mask, nvlink_down_mask, nvlink_tx_mb, nvlink_rx_mb, "
        "nvlink_errors FROM gpu_ticks WHERE ts_ms >= ? AND ts_ms < ?", window,
    ):
        g = groups[(minute, gpu)]
        if errors:
            _add_errors(g[4], errors)
        if throttle is not None:  # NULL (unreadable) all minute stays NULL, not "no reasons"
            g[0] = (g[0] or 0) | throttle
        g[1] |= down or 0
        if tx:
            g[2].append(unpack_u16(tx))
        if rx:
            g[3].append(unpack_u16(rx))
    return {key: (json_or_null(errors), throttle, down, *_avg_max(txs), *_avg_max(rxs))
            for key, (throttle, down, txs, rxs, errors) in groups.items()}


def _add_errors(total: dict, text: str) -> None:
    """Add one tick's per-link error JSON into the minute's; a malformed value is skipped."""
    try:
        per_link = json.loads(text)
    except ValueError:
        return
    if not isinstance(per_link, dict):
        return
    for link, kinds in per_link.items():
        if isinstance(kinds, dict):
            acc = total.setdefault(link, {})
            for kind, n in kinds.items():
                if isinstance(n, int):
                    acc[kind] = acc.get(kind, 0) + n


def _avg_max(rows: list[list[int]]) -> tuple[bytes | None, bytes | None]:
    """Per-link avg/max over a minute's blobs, unknown values (65535) left out; a link never known
    in the minute stays unknown. Blobs of different lengths (link count changed) align on link."""
    if not rows:
        return None, None
    avg, hi = [], []
    for n in range(max(len(r) for r in rows)):
        vals = [r[n] for r in rows if n < len(r) and r[n] != U16_UNKNOWN]
        avg.append(int(sum(vals) / len(vals) + 0.5) if vals else U16_UNKNOWN)
        hi.append(max(vals) if vals else U16_UNKNOWN)
    return pack_u16(avg), pack_u16(hi)


def prune_raw(conn: sqlite3.Connection, cut: int) -> tuple[int, int]:
    """Delete raw ticks before `cut`, at most CHUNK_MS of them; returns (rows deleted, pruned-to)."""
    first = conn.execute("SELECT min(ts_ms) FROM ticks").fetchone()[0]
    if first is None or first >= cut:
        return 0, cut
    upto = min(cut, (first // MINUTE_MS * MINUTE_MS) + CHUNK_MS)
    deleted = 0
    for table in ("gpu_ticks", "ib_ticks", "ticks"):
        deleted += conn.execute(f"DELETE FROM {table} WHERE ts_ms < ?", (upto,)).rowcount
    return deleted, upto


def prune_rollups(conn: sqlite3.Connection, cut: int) -> int:
    """Delete rollups and superseded inventory rows older than `cut`; the newest facts of every
    GPU, port and node are kept whatever their age."""
    deleted = 0
    for table in ("gpu_minutes", "ib_minutes", "node_minutes"):
        deleted += conn.execute(f"DELETE FROM {table} WHERE ts_ms < ?", (cut,)).rowcount
    deleted += conn.execute(
        "DELETE FROM inventory WHERE since_ms < ? AND since_ms < "
        "(SELECT max(since_ms) FROM inventory j WHERE j.kind = inventory.kind AND j.key = inventory.key)",
        (cut,),
    ).rowcount
    return deleted


def reclaim_space(conn: sqlite3.Connection, keep_free: float = 0.25, step_pages: int = 2000) -> None:
    """Give free pages back to the file system when more than `keep_free` of the file is free (after
    a retention cut). A steady state reuses its free pages, so this rarely does anything."""
    try:
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        total = conn.execute("PRAGMA page_count").fetchone()[0]
        if total and free > keep_free * total and free > step_pages:
            conn.execute(f"PRAGMA incremental_vacuum({step_pages})").fetchall()
    except sqlite3.Error as exc:  # only space reclaiming: the data is fine
        log.warning("store: incremental vacuum failed: %s", exc)


def _aggregates(scope: Scope) -> list[tuple[str, str]]:
    """(rollup column, SQL aggregate) of every catalog metric of this scope rolled up in SQL."""
    return [pair for m in of_scope(scope) for pair in m.rollup_sql()]


def _minutes_sql(table: str, raw: str, keys: tuple[str, ...], fixed: tuple[tuple[str, str], ...],
                 scope: Scope) -> tuple[str, tuple[str, ...]]:
    """`INSERT OR REPLACE INTO table (...) SELECT ...` over one window of raw ticks, and its columns."""
    pairs = [("ts_ms", "ts_ms / 60000 * 60000"), *((k, k) for k in keys), *fixed, *_aggregates(scope)]
    columns = tuple(c for c, _ in pairs)
    group = ", ".join(str(i) for i in range(1, 2 + len(keys)))
    select = f"SELECT {', '.join(e for _, e in pairs)} FROM {raw} WHERE ts_ms >= ? AND ts_ms < ? GROUP BY {group}"
    return f"INSERT OR REPLACE INTO {table} ({', '.join(columns)})\n{select}", columns


# Rollup SQL from the catalog: each metric's rule (min/avg/max, sum, ...) gives its columns.
_NODE_MINUTES, _ = _minutes_sql("node_minutes", "ticks", (), (("samples", "count(*)"),), Scope.NODE)
_IB_MINUTES, _ = _minutes_sql("ib_minutes", "ib_ticks", ("port_id",), (
    ("samples", "count(*)"), ("active_samples", "count(CASE WHEN state = 4 THEN 1 END)")), Scope.IB_PORT)
_GPU_SCALARS_INSERT, _GPU_SQL_COLUMNS = _minutes_sql(
    "gpu_minutes", "gpu_ticks", ("gpu",), (("samples", "count(*)"),), Scope.GPU)
_GPU_SCALARS = _GPU_SCALARS_INSERT.split("\n", 1)[1]
# Then the columns `_link_aggregates` computes in Python, in its tuple's order.
_GPU_PY_COLUMNS = ("nvlink_errors", "throttle_mask", "nvlink_down_mask",
                   "nvlink_tx_mb_avg", "nvlink_tx_mb_max", "nvlink_rx_mb_avg", "nvlink_rx_mb_max")
_GPU_COLUMNS = ", ".join(_GPU_SQL_COLUMNS + _GPU_PY_COLUMNS)
_GPU_INSERT = (f"INSERT OR REPLACE INTO gpu_minutes ({_GPU_COLUMNS}) VALUES "
               f"({','.join('?' * len(_GPU_SQL_COLUMNS + _GPU_PY_COLUMNS))})")
