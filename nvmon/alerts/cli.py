"""`nvmon alerts`: the node's active and recent alerts from its SQLite file; ack and silence them.

    nvmon alerts [--db PATH] [--json] [--all]
    nvmon alerts ack FINGERPRINT            (a unique prefix will do)
    nvmon alerts silence --match node=gpu-07 --match code='nvlink.*' --for 2h [--comment TEXT]
    nvmon alerts silences                   (active silences)   ·   nvmon alerts unsilence ID

Acks and silences are written to the same database; the daemon reads them within a few seconds
and honours them: an acked alert is marked as such (no repeat pages), a silenced one is never
handed to the hooks. They are local to this node for now (sharing them over MQTT is to come).
"""

from __future__ import annotations

import getpass
import json
import os
import re
import sqlite3
import time
from pathlib import Path

import click

from nvmon.alerts.engine import MATCH_FIELDS, Silence
from nvmon.alerts.model import AlertRecord, iso
from nvmon.store.errors import StoreError, describe

DEFAULT_DB = "/var/lib/nvmon/nvmon.db"
RECENT_S = 86400.0  # resolved alerts shown without --all
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)\s*$", re.IGNORECASE)
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}
_LABEL_KEY = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class AlertsError(click.ClickException):
    """A one-line error, shown as `nvmon: <message>`, exit status 1, no traceback."""

    def show(self, file=None) -> None:
        click.echo(f"nvmon: {self.format_message()}", err=True)


def parse_duration(text: str) -> float:
    """'90s', '30m', '2h', '1d', '1w' → seconds; ValueError otherwise."""
    m = _DURATION.match(text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError("use a duration such as 30m, 2h or 1d")
    return float(m.group(1)) * _UNIT_S[m.group(2).lower()]


def parse_matchers(items: tuple[str, ...]) -> dict[str, str]:
    """('node=gpu-07', 'code=nvlink.*') → {'node': 'gpu-07', 'code': 'nvlink.*'}; ValueError otherwise."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not value:
            raise ValueError(f"{item!r}: expected KEY=VALUE, e.g. node=gpu-07")
        if key not in MATCH_FIELDS and not _LABEL_KEY.match(key):
            raise ValueError(f"{key!r}: match on {', '.join(MATCH_FIELDS)} or a label name")
        if len(value) > 256 or not value.isprintable():
            raise ValueError(f"{key}: value must be printable, up to 256 characters")
        out[key] = value
    if not out:
        raise ValueError("give at least one --match KEY=VALUE")
    return out


def _who() -> str:
    return os.environ.get("SUDO_USER") or getpass.getuser()


def _read(db_path: str, fn):
    from nvmon.store.query import open_readonly

    try:
        conn = open_readonly(db_path)
    except StoreError as exc:
        raise AlertsError(str(exc)) from None
    try:
        return fn(conn)
    except sqlite3.Error as exc:
        raise AlertsError(str(describe(db_path, exc))) from None
    finally:
        conn.close()


def _write(db_path: str, fn):
    from nvmon.store import Store

    path = Path(db_path)
    if not path.exists():  # never create a database here: a typo would make an empty one
        raise AlertsError(f"database {path}: not found")
    store = Store(path)
    try:
        return store.transact(fn)
    except StoreError as exc:
        raise AlertsError(str(exc)) from None
    finally:
        store.close()


def _db_option(f):
    return click.option("--db", "db_path", default=None, metavar="PATH",
                        help=f"The node's database (default {DEFAULT_DB}).")(f)


def _db(ctx: click.Context, db_path: str | None) -> str:
    return db_path or (ctx.parent.params.get("db_path") if ctx.parent else None) or DEFAULT_DB


@click.group("alerts", invoke_without_command=True)
@_db_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of alert objects (docs/alerts.md).")
@click.option("--all", "show_all", is_flag=True, help="Every kept episode (7 days), not only the last 24 h.")
@click.pass_context
def alerts_command(ctx: click.Context, db_path: str | None, as_json: bool, show_all: bool) -> None:
    """This node's active and recently resolved alerts (docs/alerts.md)."""
    if ctx.invoked_subcommand is not None:
        return
    from nvmon.store import alerts as db

    now = time.time()
    db_path = db_path or DEFAULT_DB
    records, silences = _read(db_path, lambda conn: (db.load(conn, since=None if show_all else now - RECENT_S),
                                                     db.silences(conn, now)))
    silenced = {r.fingerprint for r in records if any(s.matches(r, now) for s in silences)}
    if as_json:
        out = [{**r.to_dict(), "acked_at": iso(r.acked_at), "silenced": r.fingerprint in silenced} for r in records]
        click.echo(json.dumps(out, indent=2))
        return
    from rich.console import Console

    Console(highlight=False).print(render_alerts(records, silenced, now), soft_wrap=False)


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def _where(r: AlertRecord) -> str:
    if r.gpu is not None:
        return f"GPU {r.gpu}" + (f" link {r.link}" if r.link is not None else "")
    if r.device is not None:
        return f"{r.device}" + (f":{r.port}" if r.port is not None else "")
    return "node"


_STATE = {"firing": ("✗ firing", "bold red"), "pending": ("… pending", "yellow"), "resolved": ("✓ resolved", "green")}
_SEV = {"critical": "crit", "warning": "warn", "info": "info"}


def render_alerts(records: list[AlertRecord], silenced: set[str], now: float):
    """Two lines per alert at 80 columns: the facts, then its summary (cut with "…")."""
    from rich.console import Group
    from rich.text import Text

    from nvmon.render import plain

    if not records:
        return Text("No alerts.")
    order = {"firing": 0, "pending": 1, "resolved": 2}
    records = sorted(records, key=lambda r: (order.get(r.status, 3), -(r.ends_at or r.starts_at)))
    lines = [Text(f"{'STATE':<10} {'SEV':<4} {'CODE':<16} {'WHERE':<13} {'SINCE':>6} {'COUNT':>5} FINGERPRINT",
                  style="bold")]
    for r in records:
        label, style = _STATE.get(r.status, (r.status, ""))
        since = r.ends_at if r.status == "resolved" and r.ends_at else (r.fired_at or r.starts_at)
        line = Text(f"{plain(label)[:10]:<10}", style=style)
        line.append(f" {_SEV.get(r.severity, '?'):<4} {plain(r.code)[:16]:<16} {plain(_where(r))[:13]:<13} "
                    f"{_age(now - since):>6} {min(r.count, 99999):>5} {plain(r.fingerprint)[:16]}")
        flags = [f for f, on in (("acked", r.acked_at is not None), ("silenced", r.fingerprint in silenced)) if on]
        text = ("[" + ", ".join(flags) + "] " if flags else "") + plain(r.summary)
        lines += [line, Text("    " + (text if len(text) <= 76 else text[:75] + "…"), style="dim" if flags else "")]
    return Group(*lines)


@alerts_command.command("ack")
@click.argument("fingerprint")
@_db_option
@click.option("--by", default=None, help="Who acks (default: the user running this).")
@click.pass_context
def ack_command(ctx: click.Context, fingerprint: str, db_path: str | None, by: str | None) -> None:
    """Acknowledge an active alert: it stays active but is not paged again."""
    from nvmon.store import alerts as db

    if not re.fullmatch(r"[0-9a-fA-F]{4,64}", fingerprint):
        raise AlertsError(f"fingerprint {fingerprint[:80]!r}: give its hex digits (at least 4), see `nvmon alerts`")
    now, who = time.time(), by or _who()

    def do(conn):
        found = db.find_active(conn, fingerprint.lower())
        if len(found) == 1:
            db.ack(conn, found[0], now, who)
        return found

    found = _write(_db(ctx, db_path), do)
    if not found:
        raise AlertsError(f"no active alert with fingerprint {fingerprint}")
    if len(found) > 1:
        raise AlertsError(f"{len(found)} active alerts start with {fingerprint}; give more digits")
    r = found[0]
    click.echo(f"acked {r.fingerprint}: {r.code} on {r.node or r.rack or '?'} {_where(r)}")


@alerts_command.command("silence")
@click.option("--match", "matches", multiple=True, metavar="KEY=GLOB",
              help="Alert label to match, e.g. node=gpu-07, code='nvlink.*', gpu=3 (repeatable; all must match).")
@click.option("--for", "duration", required=True, metavar="DURATION", help="How long, e.g. 30m, 2h, 1d.")
@click.option("--comment", default=None, help="Why (shown in `nvmon alerts silences`).")
@_db_option
@click.option("--by", default=None, help="Who silences (default: the user running this).")
@click.pass_context
def silence_command(ctx: click.Context, matches: tuple[str, ...], duration: str, comment: str | None,
                    db_path: str | None, by: str | None) -> None:
    """Stop paging alerts that match, for a while (they still show, and are still published)."""
    from nvmon.store import alerts as db

    try:
        seconds = parse_duration(duration)
        matchers = parse_matchers(matches)
    except ValueError as e:
        raise AlertsError(str(e)) from None
    if comment is not None and (len(comment) > 512 or not comment.isprintable()):
        raise AlertsError("--comment: printable text, up to 512 characters")
    now = time.time()
    sid = _write(_db(ctx, db_path), lambda conn: db.add_silence(conn, matchers, now, now + seconds, by or _who(),
                                                               comment))
    what = " ".join(f"{k}={v}" for k, v in matchers.items())
    click.echo(f"silence {sid} until {iso(now + seconds)}: {what}")


@alerts_command.command("silences")
@_db_option
@click.pass_context
def silences_command(ctx: click.Context, db_path: str | None) -> None:
    """List the silences in force."""
    from nvmon.render import plain
    from nvmon.store import alerts as db

    now = time.time()
    found: list[Silence] = _read(_db(ctx, db_path), lambda conn: db.silences(conn, now))
    if not found:
        click.echo("No silences.")
    for s in found:
        what = " ".join(f"{k}={v}" for k, v in s.matchers.items())
        click.echo(plain(f"{s.id:>4}  until {iso(s.ends_at)}  {what}  by {s.created_by or '?'}"
                         + (f": {s.comment}" if s.comment else "")))


@alerts_command.command("unsilence")
@click.argument("silence_id", type=click.IntRange(1))
@_db_option
@click.pass_context
def unsilence_command(ctx: click.Context, silence_id: int, db_path: str | None) -> None:
    """End a silence now."""
    from nvmon.store import alerts as db

    now = time.time()
    if not _write(_db(ctx, db_path), lambda conn: db.end_silence(conn, silence_id, now)):
        raise AlertsError(f"no silence {silence_id} in force")
    click.echo(f"silence {silence_id} ended")
