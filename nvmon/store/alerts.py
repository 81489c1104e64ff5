"""Alert lifecycle in the node's SQLite file: episodes, acks and silences (schema v2).

Functions on a connection, so the daemon's writer (`Store.alerts_*`, inside its lock and
transaction) and `nvmon alerts` (its own short connection) share one definition of the SQL.
Times are unix ms in the database, unix seconds in `AlertRecord`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any

from nvmon.alerts.model import AlertRecord, Silence

_COLUMNS = ("fingerprint", "starts_ms", "status", "code", "severity", "cluster", "rack", "node", "gpu", "link",
            "device", "port", "summary", "runbook", "value", "threshold", "fired_ms", "ends_ms", "count", "labels",
            "updated_ms")
_UPSERT = (f"INSERT INTO alerts ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))}) "
           "ON CONFLICT (fingerprint, starts_ms) DO UPDATE SET "
           + ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS[2:]))
_SELECT = (f"SELECT {', '.join('a.' + c for c in _COLUMNS)}, k.acked_ms FROM alerts a "
           "LEFT JOIN alert_acks k ON k.fingerprint = a.fingerprint AND k.starts_ms = a.starts_ms")


def ms(ts: float | None) -> int | None:
    return None if ts is None else round(ts * 1000)


def _json(v: Any) -> str | None:
    return None if v is None else json.dumps(v, sort_keys=True, default=str)


def _unjson(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _row(r: AlertRecord, now_ms: int) -> tuple:
    return (r.fingerprint, ms(r.starts_at), r.status, r.code, r.severity, r.cluster, r.rack, r.node, r.gpu, r.link,
            r.device, r.port, r.summary, r.runbook, _json(r.value), _json(r.threshold), ms(r.fired_at),
            ms(r.ends_at), int(r.count), _json(r.labels) if r.labels else None, now_ms)


def _record(row: tuple) -> AlertRecord:
    d = dict(zip((*_COLUMNS, "acked_ms"), row))
    labels = _unjson(d["labels"])

    def sec(v: int | None) -> float | None:
        return None if v is None else v / 1000

    return AlertRecord(
        fingerprint=d["fingerprint"], status=d["status"], code=d["code"], severity=d["severity"],
        cluster=d["cluster"], node=d["node"], summary=d["summary"], runbook=d["runbook"],
        starts_at=d["starts_ms"] / 1000, rack=d["rack"], gpu=d["gpu"], link=d["link"], device=d["device"],
        port=d["port"], value=_unjson(d["value"]), threshold=_unjson(d["threshold"]), ends_at=sec(d["ends_ms"]),
        count=d["count"], fired_at=sec(d["fired_ms"]), labels=labels if isinstance(labels, dict) else {},
        acked_at=sec(d["acked_ms"]))


def has_alert_tables(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'alerts'").fetchone() is not None


def save(conn: sqlite3.Connection, records: Iterable[AlertRecord], now: float) -> None:
    """Upsert each record's episode; a pending alert that resolved without firing is deleted
    (a blip is no history). Call inside a transaction."""
    now_ms = ms(now)
    for r in records:
        if r.status == "resolved" and r.fired_at is None:
            conn.execute("DELETE FROM alerts WHERE fingerprint = ? AND starts_ms = ?", (r.fingerprint, ms(r.starts_at)))
        else:
            conn.execute(_UPSERT, _row(r, now_ms))


def load(conn: sqlite3.Connection, *, active_only: bool = False, since: float | None = None) -> list[AlertRecord]:
    """Episodes, newest first: active ones, plus (unless `active_only`) resolved ones that ended
    at or after `since` (all kept ones when None)."""
    if not has_alert_tables(conn):
        return []
    where = "a.status != 'resolved'"
    params: list[Any] = []
    if not active_only:
        where += " OR a.ends_ms >= ?" if since is not None else " OR 1"
        params += [ms(since)] if since is not None else []
    rows = conn.execute(f"{_SELECT} WHERE {where} ORDER BY a.starts_ms DESC, a.fingerprint", params)
    return [_record(tuple(row)) for row in rows]


def controls(conn: sqlite3.Connection, now: float) -> tuple[dict[tuple[str, int], float], list[Silence]]:
    """Acks of active episodes ((fingerprint, starts_ms) → acked_at) and silences not yet over."""
    if not has_alert_tables(conn):
        return {}, []
    acks = {(fp, s): a / 1000 for fp, s, a in conn.execute(
        "SELECT k.fingerprint, k.starts_ms, k.acked_ms FROM alert_acks k JOIN alerts a "
        "ON a.fingerprint = k.fingerprint AND a.starts_ms = k.starts_ms WHERE a.status != 'resolved'")}
    return acks, silences(conn, now)


def silences(conn: sqlite3.Connection, now: float | None = None) -> list[Silence]:
    """Silences that have not ended by `now` (all when None), oldest first."""
    if not has_alert_tables(conn):
        return []
    rows = conn.execute("SELECT id, matchers, starts_ms, ends_ms, created_by, comment FROM silences "
                        "WHERE ends_ms > ? ORDER BY id", (ms(now) if now is not None else -1,))
    out = []
    for id_, matchers, s, e, by, comment in rows:
        m = _unjson(matchers)
        if isinstance(m, dict):
            out.append(Silence(id_, {str(k): str(v) for k, v in m.items()}, s / 1000, e / 1000, by, comment))
    return out


def find_active(conn: sqlite3.Connection, prefix: str) -> list[AlertRecord]:
    """Active episodes whose fingerprint starts with `prefix`."""
    if not has_alert_tables(conn):
        return []
    pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    rows = conn.execute(f"{_SELECT} WHERE a.status != 'resolved' AND a.fingerprint LIKE ? ESCAPE '\\'", (pattern,))
    return [_record(tuple(row)) for row in rows]


def ack(conn: sqlite3.Connection, r: AlertRecord, now: float, by: str | None) -> None:
    conn.execute("INSERT OR REPLACE INTO alert_acks VALUES (?, ?, ?, ?)", (r.fingerprint, ms(r.starts_at), ms(now), by))


def add_silence(conn: sqlite3.Connection, matchers: dict[str, str], starts_at: float, ends_at: float,
                by: str | None, comment: str | None) -> int:
    cur = conn.execute("INSERT INTO silences (matchers, starts_ms, ends_ms, created_by, comment) VALUES (?, ?, ?, ?, ?)",
                       (json.dumps(matchers, sort_keys=True), ms(starts_at), ms(ends_at), by, comment))
    return int(cur.lastrowid)


def end_silence(conn: sqlite3.Connection, silence_id: int, now: float) -> bool:
    """End a silence now; False if there is none in force with that id."""
    return conn.execute("UPDATE silences SET ends_ms = ? WHERE id = ? AND ends_ms > ?",
                        (ms(now), silence_id, ms(now))).rowcount > 0


def prune(conn: sqlite3.Connection, before: float) -> int:
    """Forget resolved episodes, their acks and silences that ended before `before`."""
    cut = ms(before)
    n = conn.execute("DELETE FROM alerts WHERE status = 'resolved' AND ends_ms < ?", (cut,)).rowcount
    conn.execute("DELETE FROM alert_acks WHERE NOT EXISTS (SELECT 1 FROM alerts a WHERE "
                 "a.fingerprint = alert_acks.fingerprint AND a.starts_ms = alert_acks.starts_ms)")
    conn.execute("DELETE FROM silences WHERE ends_ms < ?", (cut,))
    return n
