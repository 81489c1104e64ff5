"""What `nvmon alerts` lists: the filters, the order and the two-line view of each alert, for a
node's database and for the fleet's (`nvmon fleet`'s fleet.db) alike.

Order (what an SRE reads first): active before resolved; active ones by severity (critical,
warning, info), firing before pending, then the newest start first; resolved ones by when they
ended, newest first.

A summary is written when its alert is saved, so an age in it ('daemon offline for 0 s') is the
age then. For the codes in AGE_CODES the listing shows the age now: the saved age plus the time
since the row was saved (the store's updated_ms).
"""

from __future__ import annotations

import fnmatch
import re

from nvmon.alerts.model import AlertRecord
from nvmon.codes import Severity
from nvmon.render import SEVERITY_SYMBOL, plain, port_name

SEVERITY_CHOICES = ("critical", "warning", "info")
AGE_CODES = frozenset({"node.offline", "node.stale"})  # summaries that say how long, as of their save
_AGE = re.compile(r"\b(for (?:up to )?)(\d+(?:\.\d+)?) (s|min|h)\b")
_AGE_S = {"s": 1, "min": 60, "h": 3600}
_STATUS_RANK = {"firing": 0, "pending": 1, "resolved": 2}
_SEV = {"critical": "crit", "warning": "warn", "info": "info"}


def select(records: list[AlertRecord], *, node: str | None = None, code: str | None = None,
           severity: str | None = None) -> list[AlertRecord]:
    """The records that pass the filters: `node` and `code` shell-style globs (a fleet alert
    without a node passes a node filter only through its rack: `--node r1`), `severity` this
    severity or worse."""
    out = []
    for r in records:
        if node is not None and not fnmatch.fnmatchcase(r.node or r.rack or "", node):
            continue
        if code is not None and not fnmatch.fnmatchcase(r.code, code):
            continue
        if severity is not None and Severity.rank_of(r.severity) > Severity.rank_of(severity):
            continue
        out.append(r)
    return out


def ordered(records: list[AlertRecord]) -> list[AlertRecord]:
    """The module docstring's order."""
    def key(r: AlertRecord):
        if r.status == "resolved":
            return (1, 0, 0, -(r.ends_at or r.starts_at), r.fingerprint)
        return (0, Severity.rank_of(r.severity), _STATUS_RANK.get(r.status, 3), -r.starts_at, r.fingerprint)

    return sorted(records, key=key)


def where(r: AlertRecord) -> str:
    """The place, named: 'gpu-07 GPU 3 link 2', 'gpu-07 mlx5_1:1', 'gpu-07', 'rack r1', 'fleet'."""
    place = r.node or (f"rack {r.rack}" if r.rack else "fleet")
    if r.gpu is not None:
        return f"{place} GPU {r.gpu}" + (f" link {r.link}" if r.link is not None else "")
    if r.device is not None and r.node is not None:  # fleet.same_fault keeps its code in `device`
        return f"{place} " + (port_name(r.device, r.port) if r.port is not None else f"{r.device}")
    return place


def age_text(seconds: float) -> str:
    """As the fleet rules write an age: '45 s', '12 min', '3.5 h'."""
    s = int(max(0.0, seconds))
    return f"{s} s" if s < 120 else f"{s // 60} min" if s < 7200 else f"{s / 3600:.1f} h"


def current_summary(r: AlertRecord, saved_at: float | None, now: float) -> str:
    """`r.summary` with its age brought up to `now` (AGE_CODES, active alerts, saved at `saved_at`)."""
    if r.code not in AGE_CODES or r.status == "resolved" or saved_at is None:
        return r.summary
    later = max(0.0, now - saved_at)

    def bump(m: re.Match) -> str:
        return m.group(1) + age_text(float(m.group(2)) * _AGE_S[m.group(3)] + later)

    return _AGE.sub(bump, r.summary, count=1)


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def _state(r: AlertRecord) -> tuple[str, str]:
    """The STATE cell: an active alert marked by its severity, as the TUI marks it."""
    if r.status == "resolved":
        return "✓ resolved", "green"
    if r.status == "pending":
        return "… pending", "yellow"
    style = {"critical": "bold red", "warning": "bold yellow"}.get(r.severity, "")
    return f"{SEVERITY_SYMBOL.get(r.severity, '?')} {plain(r.status)}", style


def render_alerts(records: list[AlertRecord], silenced: set[str], now: float, *, saved: dict | None = None,
                  full: bool = False, counts: bool = True, with_cluster: bool = False):
    """Two lines per alert: the facts, then its summary; ordered by `ordered`. On a terminal
    (`full` False) WHERE and the summary are cut to fit 80 columns ("…"); piped, nothing is cut.
    `saved`: (fingerprint, starts_at) → when the row was saved (for `current_summary`).
    `counts` False: COUNT is '-' (alerts read off the wire carry none); `with_cluster`: WHERE
    starts with the cluster ('prod/gpu-07 GPU 3', 'prod rack r1')."""
    from rich.console import Group
    from rich.text import Text

    if not records:
        return Text("No alerts.")
    records = ordered(records)
    places = [plain(f"{r.cluster}{'/' if r.node else ' '}{where(r)}" if with_cluster else where(r)) for r in records]
    width = max(5, *(len(p) for p in places))
    width = width if full else min(width, 17)  # 63 columns besides: 80 in all
    lines = [Text(f"{'STATE':<10} {'SEV':<4} {'CODE':<16} {'WHERE':<{width}} {'SINCE':>6} {'COUNT':>5} FINGERPRINT",
                  style="bold")]
    for r, place in zip(records, places):
        label, style = _state(r)
        since = r.ends_at if r.status == "resolved" and r.ends_at else (r.fired_at or r.starts_at)
        place = place if len(place) <= width else place[:width - 1] + "…"
        line = Text(f"{label:<10}", style=style)
        line.append(f" {_SEV.get(r.severity, '?'):<4} {plain(r.code)[:16]:<16} {place:<{width}} "
                    f"{_age(now - since):>6} {min(r.count, 99999) if counts else '-':>5} {plain(r.fingerprint)[:16]}")
        flags = [f for f, on in (("acked", r.acked_at is not None), ("silenced", r.fingerprint in silenced)) if on]
        summary = current_summary(r, (saved or {}).get((r.fingerprint, r.starts_at)), now)
        text = ("[" + ", ".join(flags) + "] " if flags else "") + plain(summary)
        if not full and len(text) > 76:
            text = text[:75] + "…"
        lines += [line, Text("    " + text, style="dim" if flags else "")]
    return Group(*lines)
