"""Reading history, read-only: the queries behind `nvmon history`.

The connection is opened with `mode=ro`, so a reader can never write (nor create) the file and can
run while the daemon writes: WAL lets readers see the last committed tick without blocking it.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvmon.model import IB_PHYS_STATES, IB_STATES
from nvmon.store.codec import MB, U16_UNKNOWN, throttle_names, unmask, unpack_mb, unpack_u16
from nvmon.store.errors import StoreError, describe
from nvmon.store.metrics import BY_NAME, KEYS, KINDS, TABLES, Metric
from nvmon.store.schema import SchemaError, check_version


def open_readonly(path: str | Path) -> sqlite3.Connection:
    """Open an nvmon database read-only. Raises StoreError (one line) when it is missing, not a
    database, not nvmon's, or from a newer nvmon."""
    path = Path(path)
    if not path.exists():
        raise StoreError(f"database {path}: not found")
    if path.is_dir():
        raise StoreError(f"database {path}: is a directory")
    uri = "file:" + urllib.parse.quote(str(path.resolve()))
    # With no -wal file no writer is connected: read the file as immutable, which creates no
    # -wal/-shm files (a `sudo nvmon history` would otherwise leave root-owned ones that block a
    # daemon running as another user). A writer that starts meanwhile writes to its new WAL, not
    # to this file, until its first checkpoint minutes later.
    immutable = not Path(f"{path}-wal").exists()
    try:
        conn = _connect_checked(uri + ("?mode=ro&immutable=1" if immutable else "?mode=ro"))
    except (sqlite3.Error, SchemaError) as exc:
        raise _error(path, exc) from None
    return conn


def _connect_checked(uri: str) -> sqlite3.Connection:
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    try:
        conn.execute("PRAGMA query_only = 1")
        if check_version(conn) == 0:
            raise SchemaError("empty, not an nvmon database yet (has nvmon-daemon written to it?)")
    except BaseException:
        conn.close()
        raise
    return conn


def _error(path: Path, exc: BaseException) -> StoreError:
    if isinstance(exc, SchemaError):
        return StoreError(f"database {path}: {exc}")
    return describe(path, exc)


def raw_window(conn: sqlite3.Connection) -> tuple[int | None, int | None]:
    """(oldest, newest) raw tick in ms, or (None, None) when there is none."""
    return conn.execute("SELECT min(ts_ms), max(ts_ms) FROM ticks").fetchone()


@dataclass
class Table:
    """One kind's rows: `columns` start with ts_ms and the kind's key columns (KEYS)."""

    kind: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)


@dataclass
class History:
    source: str  # "raw" (one row per tick) or "rollup" (one row per minute)
    since_ms: int
    until_ms: int
    raw_since_ms: int | None  # oldest raw tick kept
    tables: list[Table]
    notes: list[str] = field(default_factory=list)

    @property
    def resolution_s(self) -> int:
        return 1 if self.source == "raw" else 60


def choose_source(conn: sqlite3.Connection, since_ms: int, source: str = "auto") -> tuple[str, int | None]:
    """Raw ticks when the range starts inside the raw window (at or after the pruning horizon:
    raw ticks there are all still kept), else 1-minute rollups. Returns (source, oldest raw tick)."""
    oldest, _ = raw_window(conn)
    if source == "auto":
        row = conn.execute("SELECT value FROM state WHERE key = 'raw_pruned_ms'").fetchone()
        horizon = row[0] if row and row[0] is not None else 0
        source = "raw" if since_ms >= horizon else "rollup"
    return source, oldest


def history(conn: sqlite3.Connection, metrics: Sequence[str], since_ms: int, until_ms: int, *,
            gpus: Sequence[int] = (), links: Sequence[int] = (), source: str = "auto") -> History:
    """Rows of the named metrics for [since_ms, until_ms), one table per kind (gpu, link, ib, node).

    `source`: "raw", "rollup" or "auto". Raises KeyError for an unknown metric name and
    sqlite3.Error when the database cannot be read.
    """
    chosen = [BY_NAME[name] for name in metrics]
    src, oldest = choose_source(conn, since_ms, source)
    out = History(src, since_ms, until_ms, oldest, [])
    for kind in KINDS:
        wanted = [m for m in chosen if m.kind == kind]
        if not wanted:
            continue
        if src == "rollup":
            missing = [m.name for m in wanted if not m.rollup]
            if missing:
                out.notes.append(f"{', '.join(missing)}: kept in raw ticks only, not in rollups "
                                 "(ask for a range inside the raw window)")
            wanted = [m for m in wanted if m.rollup]
            if not wanted:
                continue
        reader = _read_links if kind == "link" else _read_table
        out.tables.append(reader(conn, kind, wanted, src, since_ms, until_ms, gpus, links))
    return out


def _columns(m: Metric, src: str) -> list[tuple[str, str]]:
    """(output column, SQL expression) pairs of a metric for the source."""
    if src == "raw":
        return [(m.name, m.raw)]
    return [(m.name if stat in ("sum", "any") else f"{m.name}_{stat}", expr) for stat, expr in m.rollup.items()]


def _read_table(conn, kind: str, wanted: list[Metric], src: str, since_ms: int, until_ms: int,
                gpus: Sequence[int], links: Sequence[int]) -> Table:
    table = TABLES[kind][0 if src == "raw" else 1]
    cols = [(name, expr, m) for m in wanted for name, expr in _columns(m, src)]
    select = ", ".join(f"{expr}" for _, expr, _ in cols)
    where, params = "t.ts_ms >= ? AND t.ts_ms < ?", [since_ms, until_ms]
    if kind == "gpu" and gpus:
        where += f" AND t.gpu IN ({','.join('?' * len(gpus))})"
        params += list(gpus)
    keys = {"gpu": "t.gpu", "ib": "p.device, p.port", "node": ""}[kind]
    join = " JOIN ib_ports p ON p.id = t.port_id" if kind == "ib" else ""
    sql = (f"SELECT t.ts_ms{', ' + keys if keys else ''}, {select} FROM {table} t{join} "
           f"WHERE {where} ORDER BY t.ts_ms{', ' + keys if keys else ''}")
    out = Table(kind, ["ts_ms", *KEYS[kind], *(name for name, _, _ in cols)])
    nkeys = 1 + len(KEYS[kind])
    decoders = [(nkeys + i, m.decode) for i, (_, _, m) in enumerate(cols) if m.decode]
    for row in conn.execute(sql, params):
        row = list(row)
        for i, how in decoders:
            row[i] = _decode(how, row[i])
        out.rows.append(row)
    return out


def _decode(how: str, value: Any) -> Any:
    if value is None:
        return None
    if how == "throttle":
        return list(throttle_names(value))
    if how == "links":
        return [n for n in range(64) if value >> n & 1]
    if how == "ib_state":
        return IB_STATES.get(value, str(value))
    if how == "ib_phys":
        return IB_PHYS_STATES.get(value, str(value))
    return value


def _read_links(conn, kind: str, wanted: list[Metric], src: str, since_ms: int, until_ms: int,
                gpus: Sequence[int], links: Sequence[int]) -> Table:
    """Per-link rows, decoded from the GPU rows' uint16 blobs and bit masks."""
    raw = src == "raw"
    table = TABLES[kind][0 if raw else 1]
    blobs = ("nvlink_up_mask, nvlink_down_mask, nvlink_tx_mb, nvlink_rx_mb" if raw else
             "nvlink_down_mask, nvlink_tx_mb_avg, nvlink_tx_mb_max, nvlink_rx_mb_avg, nvlink_rx_mb_max")
    where, params = "ts_ms >= ? AND ts_ms < ?", [since_ms, until_ms]
    if gpus:
        where += f" AND gpu IN ({','.join('?' * len(gpus))})"
        params += list(gpus)
    cols = [name for m in wanted for name, _ in _columns(m, src)]
    out = Table(kind, ["ts_ms", "gpu", "link", *cols])
    for ts, gpu, *vals in conn.execute(
            f"SELECT ts_ms, gpu, {blobs} FROM {table} WHERE {where} ORDER BY ts_ms, gpu", params):
        if raw:
            up, down, tx, rx = vals
            series = {"link_tx_bytes_per_s": unpack_u16(tx), "link_rx_bytes_per_s": unpack_u16(rx)}
        else:
            down, tx_avg, tx_max, rx_avg, rx_max = vals
            series = {"link_tx_bytes_per_s_avg": unpack_u16(tx_avg), "link_tx_bytes_per_s_max": unpack_u16(tx_max),
                      "link_rx_bytes_per_s_avg": unpack_u16(rx_avg), "link_rx_bytes_per_s_max": unpack_u16(rx_max)}
        count = max((len(v) for v in series.values()), default=0)
        for n in range(count):
            if links and n not in links:
                continue
            row: list[Any] = [ts, gpu, n]
            for c in cols:
                if c.startswith("link_active"):
                    bit_up = raw and (up or 0) >> n & 1
                    bit_down = (down or 0) >> n & 1
                    row.append(0 if bit_down else 1 if bit_up or not raw else None)
                else:
                    v = series[c]
                    row.append(None if n >= len(v) or v[n] == U16_UNKNOWN else float(v[n] * MB))
            out.rows.append(row)
    return out


def read_tick(conn: sqlite3.Connection, ts_ms: int) -> dict[str, Any] | None:
    """One stored tick decoded back into plain values: the tick's columns, `gpus` (each with its
    `nvlink` list: link, active, tx/rx bytes/s, non-zero error deltas) and `ib` ports by name.
    None when no tick has that timestamp."""
    conn_rows = conn.execute("SELECT * FROM ticks WHERE ts_ms = ?", (ts_ms,))
    names = [d[0] for d in conn_rows.description]
    row = conn_rows.fetchone()
    if row is None:
        return None
    tick: dict[str, Any] = dict(zip(names, row))
    tick["notes"] = json.loads(tick["notes"]) if tick["notes"] else []
    cur = conn.execute("SELECT * FROM gpu_ticks WHERE ts_ms = ? ORDER BY gpu", (ts_ms,))
    names = [d[0] for d in cur.description]
    tick["gpus"] = []
    for r in cur:
        g = dict(zip(names, r))
        tx, rx = unpack_mb(g.pop("nvlink_tx_mb")), unpack_mb(g.pop("nvlink_rx_mb"))
        errors = json.loads(g.pop("nvlink_errors") or "{}")
        states = unmask(g["nvlink_up_mask"], g["nvlink_down_mask"], len(tx))
        g["throttle"] = throttle_names(g["throttle_mask"])
        g["notes"] = json.loads(g["notes"]) if g["notes"] else []
        g["nvlink"] = [{"link": n, "active": states[n], "tx_bytes_per_s": tx[n], "rx_bytes_per_s": rx[n],
                        "errors_delta": errors.get(str(n), {})} for n in range(len(tx))]
        tick["gpus"].append(g)
    cur = conn.execute("SELECT p.device, p.port, t.* FROM ib_ticks t JOIN ib_ports p ON p.id = t.port_id "
                       "WHERE t.ts_ms = ? ORDER BY p.device, p.port", (ts_ms,))
    names = [d[0] for d in cur.description]
    tick["ib"] = []
    for r in cur:
        p = dict(zip(names, r))
        p["state"] = IB_STATES.get(p["state"]) if p["state"] is not None else None
        p["phys_state"] = IB_PHYS_STATES.get(p["phys_state"]) if p["phys_state"] is not None else None
        p["errors"] = json.loads(p["errors"] or "{}")
        tick["ib"].append(p)
    return tick


def facts_at(conn: sqlite3.Connection, kind: str, key: str, ts_ms: int) -> dict[str, Any] | None:
    """The static facts (inventory) of a node ('node', ''), GPU ('gpu', '3') or IB port
    ('ib', 'mlx5_0:1') as they were at `ts_ms`."""
    row = conn.execute("SELECT facts FROM inventory WHERE kind = ? AND key = ? AND since_ms <= ? "
                       "ORDER BY since_ms DESC LIMIT 1", (kind, key, ts_ms)).fetchone()
    return json.loads(row[0]) if row else None
