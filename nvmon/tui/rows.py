"""The fleet table's columns: how a `NodeView` becomes a row, a sort key, and a filter match (pure).

Each column has a cell function returning segments `((text, style), ...)` — cheap tuples that the
table compares with what it shows before building any `Text` — and a sort key. Sort keys put
unknown values last; "worse" sorts last in the natural order, so reversing a column brings
problems to the top.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nvmon.fleet.state import Liveness, NodeView
from nvmon.tui.text import BAD, DIM, OK, SEVERITY_STYLE, SYMBOL, WARN, Segment, age, clean, gbs, known, kw, \
    short_model

NONE: tuple[Segment, ...] = (("–", DIM),)
_LAST = float("inf")


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    label: str
    width: int
    cell: Callable[[NodeView, Liveness], tuple[Segment, ...]]
    sort: Callable[[NodeView, Liveness], Any]
    help: str


def _mark(style: str, text: str) -> tuple[Segment, ...]:
    return ((f"{SYMBOL[style]} {text}", style),)


def _judged(v: NodeView, column: str, healthy: str = OK) -> str:
    """The style of a column: the worst severity of the node's findings it shows (the node's own
    audit, carried on each sample), else `healthy`. Views never judge values themselves."""
    sev = v.summary.marks.get(column) if v.summary is not None else None
    return SEVERITY_STYLE.get(sev, healthy) if sev is not None else healthy


# --- cells -------------------------------------------------------------------------------------

def c_node(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    return ((v.node, "bold" if live.state == "online" else ""),)  # names are [A-Za-z0-9._-] by contract


def c_status(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    if live.state == "online":
        return _mark(WARN, "layout?") if v.inventory_stale else _mark(OK, "online")
    if live.state == "stale":
        return _mark(WARN, f"stale {age(live.age_s)}")
    bound = "" if live.exact else "≤"  # a will found retained: silent for up to this long
    return _mark(BAD, f"{'lost' if live.reason == 'lost' else 'off'} {bound}{age(live.age_s)}")


def c_rack(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    return ((clean(v.rack, 24), ""),) if v.rack else NONE


def c_gpus(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    s = v.summary
    if s is None:
        return NONE
    model = short_model(s.gpu_model)
    if s.gpus_lost:
        return _mark(BAD, f"{s.gpu_count - s.gpus_lost}/{s.gpu_count}×{model}")
    style = _judged(v, "gpus", "")
    return _mark(style, f"{s.gpu_count}×{model}") if style else ((f"{s.gpu_count}×{model}", ""),)


def c_nvlink(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    s = v.summary
    if s is None or not known(s.nvlink_bytes_per_s):
        return NONE
    pct = f"{s.nvlink_pct:3.0f}%" if known(s.nvlink_pct) else "  ?%"
    return ((gbs(s.nvlink_bytes_per_s, 5), ""), (f" {pct}", DIM))


def nvlink_error_rate(v: NodeView) -> float:
    """NVLink error counters' rise over the last tick, per second (all GPUs, links and kinds)."""
    t = v.tick
    if t is None:
        return 0.0
    n = sum(d for g in t.gpus for kinds in g.link_errors.values() for d in kinds.values())
    return n / (t.interval_s or 1.0)


def c_links(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    s = v.summary
    if s is None:
        return NONE
    if s.links_expected is None and s.links_active == 0:
        return (("no NVLink", DIM),)
    want = "?" if s.links_expected is None else str(s.links_expected)
    err = nvlink_error_rate(v)
    topo = v.inventory.topology_class if v.inventory is not None else None
    style = _judged(v, "links")
    if topo in SPLIT_TOPOLOGIES:  # every link up, yet not all-to-all: named, whatever the audit says
        head = _mark(WARN if style == OK else style, f"{topo} {s.links_active}/{want}")
    else:
        head = _mark(style, f"{s.links_active}/{want}")
    return head + (((f" ⚠{err:.0f}/s", WARN),) if err > 0 else ())


SPLIT_TOPOLOGIES = ("pairs", "partial")


def c_pcie(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    s = v.summary
    if s is None or s.pcie_worst is None:
        return NONE
    return _mark(_judged(v, "pcie"), s.pcie_worst.replace(" on GPU ", " GPU"))


def c_ib(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    s = v.summary
    if s is None or (s.ib_expected in (None, 0) and s.ib_up == 0):
        return (("no IB", DIM),)
    want = "?" if s.ib_expected is None else str(s.ib_expected)
    rate = f" {s.ib_min_rate_gbps:.0f}G" if known(s.ib_min_rate_gbps) else ""
    style = _judged(v, "ib")
    return _mark(style, f"{s.ib_up}/{want}{rate}") + (
        ((f" +{s.ib_ethernet}eth", DIM if style == OK else style),) if s.ib_ethernet else ())


def c_power(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    s = v.summary
    if s is None or not known(s.power_w):
        return NONE
    text = f"{kw(s.power_w)}/{kw(s.power_limit_w)}kW"
    style = _judged(v, "power", "")
    if style:
        return _mark(style, text) + (((f" cap{s.power_capped}", style),) if s.power_capped else ())
    return ((text, ""),)


def c_temp(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    s = v.summary
    if s is None or not known(s.hottest_c):
        return NONE
    text = f"{s.hottest_c:.0f}°C G{s.hottest_gpu}"
    style = _judged(v, "temp", "")
    return _mark(style, text) if style else ((text, ""),)


def c_alerts(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    counts = v.alert_counts()
    if not counts:
        return ((SYMBOL[OK], OK),) if v.alerts is not None else NONE
    out: list[Segment] = []
    for sev in ("critical", "warning", "info"):
        if counts.get(sev):
            style = SEVERITY_STYLE[sev]
            out.append((f"{SYMBOL[style]}{counts[sev]} ", style))
    return tuple(out)


# --- sort keys ---------------------------------------------------------------------------------

_LIVE_RANK = {"online": 0, "stale": 1, "offline": 2}


def _num(x) -> float:
    return x if known(x) else _LAST


def s_status(v, live):
    return (_LIVE_RANK[live.state], v.inventory_stale, live.age_s if live.state != "online" else 0)


def s_gpus(v, live):
    s = v.summary
    return (-(s.gpus_lost if s else 0), s.gpu_model or "" if s else "~", s.gpu_count if s else 0)


def s_links(v, live):
    s = v.summary
    return (s.links_down if s else _LAST, nvlink_error_rate(v))


def s_pcie(v, live):
    s = v.summary
    return (s.pcie_degraded if s else True, s.pcie_worst or "" if s else "")


def s_ib(v, live):
    s = v.summary
    if s is None or s.ib_expected is None:
        return (_LAST, 0)
    return (s.ib_expected - s.ib_up, -_num(s.ib_min_rate_gbps) if known(s.ib_min_rate_gbps) else 0)


def s_alerts(v, live):
    c = v.alert_counts()
    return (c.get("critical", 0), c.get("warning", 0), c.get("info", 0))


def _summary_num(name: str):
    def key(v, live):
        return _num(getattr(v.summary, name)) if v.summary is not None else _LAST
    return key


COLUMNS: tuple[Column, ...] = (
    Column("node", "Node", 14, c_node, lambda v, live: v.node, "node name"),
    Column("status", "Status", 11, c_status, s_status, "✓ online, ⚠ stale (no tick for 3 intervals), ✗ lost/off, with age"),
    Column("alerts", "Alerts", 9, c_alerts, s_alerts, "active alerts: ✗ critical, ⚠ warning, ℹ info"),
    Column("links", "Links", 16, c_links, s_links, "NVLink links active / expected, ⚠ error counters rising per s"),
    Column("pcie", "PCIe worst", 14, c_pcie, s_pcie, "the GPU PCIe link the node's audit found short, else the lowest"),
    Column("ib", "IB up", 11, c_ib, s_ib, "IB ports up / expected and slowest rate; ⚠/✗ the node's IB and HCA findings"),
    Column("nvlink", "NVLink GB/s", 11, c_nvlink, _summary_num("nvlink_bytes_per_s"),
           "NVLink TX+RX over all GPUs and links, and % of the model's spec"),
    Column("power", "GPU power", 16, c_power, _summary_num("power_w"),
           "GPU draw / sum of limits, ⚠ capN: GPUs with a power.cap or power.limit finding"),
    Column("temp", "Hottest", 9, c_temp, _summary_num("hottest_c"), "hottest GPU; ⚠ a thermal finding on the node"),
    Column("gpus", "GPUs", 16, c_gpus, s_gpus, "GPU count × model (✗ when GPUs fell off the bus)"),
    Column("rack", "Rack", 8, c_rack, lambda v, live: (v.rack is None, clean(v.rack or "")), "rack from the inventory"),
)
COLUMN_KEYS = tuple(c.key for c in COLUMNS)
BY_KEY = {c.key: c for c in COLUMNS}


_KEEP_STYLE = frozenset(("node", "status", "rack"))


def row_segments(v: NodeView, live: Liveness) -> tuple[tuple[Segment, ...], ...]:
    """The row's cells. A node that is not online shows its last values dimmed: they are history."""
    if live.state == "online":
        return tuple(c.cell(v, live) for c in COLUMNS)
    return tuple(c.cell(v, live) if c.key in _KEEP_STYLE else tuple((t, DIM) for t, _ in c.cell(v, live))
                 for c in COLUMNS)


def is_problem(v: NodeView, live: Liveness) -> bool:
    """Anything a ⚠ or ✗ would mark in the row."""
    if live.state != "online" or v.inventory_stale or v.alert_counts():
        return True
    s = v.summary
    if s is None:
        return False
    if v.inventory is not None and v.inventory.topology_class in SPLIT_TOPOLOGIES:
        return True
    return bool(s.marks or s.gpus_lost)


def haystack(v: NodeView) -> str:
    """What `/` searches, lower case: node, cluster, rack, model, labels (keys and values)."""
    parts = [v.node, v.cluster, v.rack or "", v.summary.gpu_model or "" if v.summary else ""]
    parts += [f"{k}={val}" for k, val in v.labels.items()]
    return clean(" ".join(parts), 4096).lower()


def matches(v: NodeView, live: Liveness, query: str) -> bool:
    """Every word of `query` must match: `status:stale` style words match the liveness (or
    `problem`), other words are substrings of the node's haystack."""
    hay = None
    for word in query.lower().split():
        if word in ("online", "stale", "offline", "problem", "problems"):
            if word.startswith("problem"):
                if not is_problem(v, live):
                    return False
            elif live.state != word:
                return False
            continue
        hay = haystack(v) if hay is None else hay
        if word not in hay:
            return False
    return True

