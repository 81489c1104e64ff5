"""`nvmon history`: print the node's local history from its SQLite file, read-only.

Registered by the main CLI (`cli.add_command(history_command)`); runnable alone for tests:
`python -c "from nvmon.cli.history import history_command; history_command()" --since 1h`.
"""

from __future__ import annotations

import csv
import json
import re
import sqlite3
import sys
import textwrap
import time
from datetime import datetime, timezone
from typing import Any

import click

from nvmon.catalog import display_unit
from nvmon.cli.common import (DEFAULT_DB, DURATION, UNIT_CASE_HINT, UNIT_S, NvmonError, NvmonUsageError,
                              resolve_db, stdout_console, unit_case_wrong)
from nvmon.store.errors import StoreError, describe
from nvmon.store.metrics import DEFAULT_METRICS, KINDS, METRICS
from nvmon.store.query import History, history, open_readonly

DEFAULT_TABLE_LIMIT = 200


def parse_time(text: str, now: float) -> float:
    """`10m`/`2h`/`3d`/`1w` ago, ISO 8601 (UTC unless it gives an offset), or unix seconds →
    unix seconds. Raises ValueError with a short reason."""
    m = DURATION.match(text)
    if m:
        return now - float(m.group(1)) * UNIT_S[m.group(2)]
    if unit_case_wrong(text):
        raise ValueError(UNIT_CASE_HINT)
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not 0 <= value < 1e11:
            raise ValueError("unix seconds out of range")
        return value
    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError("use a duration (10m, 2h, 3d), ISO 8601 (2024-05-01T12:00Z) or unix seconds") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def _time_option(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_time(value, ctx.meta.setdefault("nvmon_now", time.time()))
    except ValueError as exc:
        raise click.BadParameter(f"{value!r}: {exc}") from None


def _metrics_option(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    names = [n.strip() for v in value for n in v.split(",") if n.strip()]
    known = {m.name for m in METRICS}
    for n in names:
        if n not in known:
            raise click.BadParameter(f"unknown metric {n!r} (nvmon history --help lists them)")
    return tuple(dict.fromkeys(names)) or DEFAULT_METRICS


def _metric_help() -> str:
    """The epilog's metric table, verbatim (`\\b`): each description wrapped under its own column so
    that, with click's indent of 2, every line fits an 80-column terminal."""
    lines = ["\b", "Metrics (--metric), by table:"]
    for kind in KINDS:
        for m in METRICS:
            if m.kind == kind:
                unit = f" [{m.unit}]" if m.unit else ""
                head = f"  {kind:<5} {m.name:<22} "
                text = re.sub(r"(\d) (?=\w)", "\\1\xa0", f"{m.description}{unit}")  # "2 unhealthy" stays whole
                lines += [ln.replace("\xa0", " ") for ln in
                          textwrap.wrap(text, width=80 - 2, initial_indent=head, subsequent_indent=" " * len(head),
                                        break_long_words=False, break_on_hyphens=False)]
    return "\n".join(lines)


def iso(ts_ms: int | None) -> str | None:
    """Unix ms → ISO 8601 UTC, milliseconds shown only when there are some."""
    if ts_ms is None:
        return None
    dt = datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{ts_ms % 1000:03d}Z" if ts_ms % 1000 else f"{text}Z"


@click.command("history", epilog=_metric_help(),
               context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--db", "db_path", default=DEFAULT_DB, show_default=True, metavar="PATH",
              help="The daemon's history database (opened read-only).")
@click.option("--since", default="10m", show_default=True, callback=_time_option, metavar="WHEN",
              help="Start: a duration ago (90s, 10m, 2h, 3d, 1w), ISO 8601 (UTC unless an offset is "
                   "given) or unix seconds.")
@click.option("--until", default=None, callback=_time_option, metavar="WHEN", help="End (default: now); same forms.")
@click.option("--gpu", "gpus", type=click.IntRange(0, 63), multiple=True, metavar="N",
              help="Only this GPU (repeatable).")
@click.option("--link", "links", type=click.IntRange(0, 35), multiple=True, metavar="N",
              help="Only this NVLink, for link_* metrics (repeatable).")
@click.option("--metric", "-m", "metrics", multiple=True, callback=_metrics_option, metavar="NAME",
              help=f"Metric to show (repeatable, or comma-separated). Default: {', '.join(DEFAULT_METRICS)}.")
@click.option("--source", type=click.Choice(["auto", "raw", "rollup"]), default="auto", show_default=True,
              help="Raw 1-s ticks, 1-minute rollups (min/avg/max), or auto: raw when the range lies "
                   "inside the raw window, else rollups.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV (one header; a `kind` column per row).")
@click.option("--limit", type=click.IntRange(0), default=None, metavar="N",
              help=f"Newest N rows per table; 0 = all (default: {DEFAULT_TABLE_LIMIT} for the table view, "
                   "all for --json/--csv).")
def history_command(db_path: str, since: float, until: float | None, gpus: tuple[int, ...],
                    links: tuple[int, ...], metrics: tuple[str, ...], source: str, as_json: bool,
                    as_csv: bool, limit: int | None) -> None:
    """Show the node's recorded history: GPU power, temperatures, NVLink, PCIe and InfiniBand rates.

    Reads the local SQLite database that the node agent (`nvmon daemon`) writes, without writing
    to it, so it can run while the daemon records. Times are UTC.
    """
    if as_json and as_csv:
        raise click.UsageError("choose one of --json and --csv")
    until = until if until is not None else click.get_current_context().meta.get("nvmon_now", time.time())
    if since >= until:
        raise click.BadParameter("must be before --until", param_hint="--since")
    if links and not any(m.startswith("link_") for m in metrics):
        raise NvmonUsageError("--link selects NVLinks of the link_* metrics; add one, e.g. "
                              "-m link_tx_bytes_per_s (nvmon history --help lists them)")
    db_path = str(resolve_db(db_path, DEFAULT_DB, create=False))  # where the daemon writes outside systemd
    try:
        conn = open_readonly(db_path)
    except StoreError as exc:
        raise NvmonError(str(exc)) from None
    try:
        result = history(conn, metrics, int(since * 1000), int(until * 1000), gpus=gpus, links=links,
                         source=source)
    except sqlite3.Error as exc:
        raise NvmonError(str(describe(db_path, exc))) from None
    finally:
        conn.close()
    if limit is None:
        limit = 0 if as_json or as_csv else DEFAULT_TABLE_LIMIT
    cut = {t.kind: max(0, len(t.rows) - limit) if limit else 0 for t in result.tables}
    for t in result.tables:
        t.rows = t.rows[cut[t.kind]:]
    if as_json:
        _print_json(result, cut)
    elif as_csv:
        _print_csv(result)
    else:
        _print_tables(result, cut)


def _describe_source(h: History) -> str:
    if h.source == "raw":
        return "raw ticks (one row per sample)"
    return "1-minute rollups (min/avg/max per minute)"


def _records(h: History):
    for t in h.tables:
        for row in t.rows:
            rec = {"kind": t.kind, "ts": row[0] / 1000, "time": iso(row[0])}
            rec.update(zip(t.columns[1:], row[1:]))
            yield t, rec


def _print_json(h: History, cut: dict[str, int]) -> None:
    out: dict[str, Any] = {
        "schema": 1, "source": h.source, "resolution_s": h.resolution_s,
        "since": iso(h.since_ms), "until": iso(h.until_ms), "raw_since": iso(h.raw_since_ms),
        "notes": h.notes, "omitted_rows": {k: v for k, v in cut.items() if v},
    }
    for t in h.tables:
        out[t.kind] = []
    for t, rec in _records(h):
        del rec["kind"]
        out[t.kind].append(rec)
    json.dump(out, sys.stdout, separators=(",", ":"), allow_nan=False)
    sys.stdout.write("\n")


def _cell(value: Any) -> Any:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return value


def _print_csv(h: History) -> None:
    columns = ["source", "kind", "ts", "time"]
    for t in h.tables:
        columns += [c for c in t.columns[1:] if c not in columns]
    w = csv.DictWriter(sys.stdout, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for _, rec in _records(h):
        w.writerow({"source": h.source, **{k: _cell(v) for k, v in rec.items()}})


# (divisor, decimals) of a column in the table view; (1, None): the value as it is.
Scale = tuple[float, int | None]
AS_IS: Scale = (1.0, None)


def _fmt(value: Any, scale: Scale) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "none"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        divisor, digits = scale
        v = value / divisor
        if digits is not None:
            return f"{v:.{digits}f}"
        return f"{v:.3f}".rstrip("0").rstrip(".") if isinstance(v, float) else str(v)
    return str(value)


def _view_columns(t) -> list[tuple[str, list[int], Scale]]:
    """Table view: one column per metric; a rollup's avg/min/max share a cell (avg over min–max).
    Values are shown in the catalog's display unit (catalog.display_unit: MHz, GiB, GB/s)."""
    from nvmon.store.metrics import BY_NAME

    cols: dict[str, list[int]] = {}
    first = 1 + len([c for c in t.columns[1:] if c in ("gpu", "link", "device", "port")])
    for i, c in enumerate(t.columns[first:], start=first):
        base = re.sub(r"_(min|avg|max)$", "", c) if c not in BY_NAME else c
        cols.setdefault(base, []).append(i)
    out = []
    for base, idx in cols.items():
        m = BY_NAME.get(base)
        unit, divisor, digits = display_unit(m.unit if m else "")
        unit = "" if unit in ("count", "links", "lanes") else unit
        label = (m.short if m else base) + (f" {unit}" if unit else "")
        out.append((label, idx, (divisor, digits)))
    return out


def _rollup_cell(t, row: list[Any], idx: list[int], scale: Scale) -> str:
    by_stat = {t.columns[i].rsplit("_", 1)[-1]: row[i] for i in idx}
    if len(idx) == 1:
        return _fmt(row[idx[0]], scale)
    lo, avg, hi = by_stat.get("min"), by_stat.get("avg"), by_stat.get("max")
    if avg is not None and (lo is not None or hi is not None):
        rng = f"{_fmt(lo, scale)}–{_fmt(hi, scale)}" if lo is not None else f"≤{_fmt(hi, scale)}"
        return f"{_fmt(avg, scale)}\n{rng}"
    if lo is not None or hi is not None:
        return _fmt(lo, scale) if lo == hi else f"{_fmt(lo, scale)}–{_fmt(hi, scale)}"
    return _fmt(avg, scale)


def _print_tables(h: History, cut: dict[str, int]) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from nvmon.render import plain

    console = stdout_console()  # piped: not cut to 80 columns, nothing downstream needs it narrow
    console.print(Text(f"{_describe_source(h)}, {iso(h.since_ms)} → {iso(h.until_ms)} (UTC); "
                       f"raw ticks kept since {iso(h.raw_since_ms) or 'never'}"))
    if h.source == "rollup":
        console.print(Text("cells: the minute's average, under it min–max"))
    for note in h.notes:
        console.print(Text(f"note: {note}"))
    for t in h.tables:
        keys = [c for c in ("gpu", "link", "device", "port") if c in t.columns]
        view = _view_columns(t)
        table = Table(box=box.SIMPLE_HEAD, title=Text(f"{t.kind}: {len(t.rows)} rows"), title_justify="left",
                      pad_edge=False, collapse_padding=True, padding=(0, 1))
        table.add_column("time (UTC)", no_wrap=True)
        for k in keys:
            table.add_column(k, justify="left" if k == "device" else "right", no_wrap=True)
        for label, _, _ in view:
            table.add_column(label, justify="right")
        for row in t.rows:
            when = datetime.fromtimestamp(row[0] / 1000, tz=timezone.utc).strftime("%m-%d %H:%M:%S")
            cells = [when, *(_fmt(row[t.columns.index(k)], AS_IS) for k in keys)]
            cells += [_rollup_cell(t, row, idx, scale) for _, idx, scale in view]
            # plain() strips control characters (hostile names): apply it line by line.
            table.add_row(*(Text("\n".join(plain(line) for line in c.split("\n"))) for c in cells))
        console.print(table)
        if cut.get(t.kind):
            console.print(Text(f"({cut[t.kind]} older rows not shown: --limit 0 for all, or --json/--csv)"))
        if not t.rows:
            console.print(Text("(no rows in this range)"))
