"""The fleet table's columns: how a `NodeView` becomes a row, a sort key, and a filter match (pure).

Each column has a cell function returning segments `((text, style), ...)` — cheap tuples that the
table compares with what it shows before building any `Text` — and a sort key. Sort keys put
unknown values last; "worse" (or bigger) sorts last in the natural order, and a column is first
sorted descending (`Column.descending`), so the first press of a problem column brings the worst
to the top. A judged column ranks first by the worst severity of the findings it shows.

Cells are compact so that the problem columns (Node to Hottest) fit 80 columns: a healthy cell says
little (`✓ 8/8`), a marked one names what the node's findings are about (`✗ pairs`, `✗ fabric`,
`⚠ x8 GPU4`, `⚠ 100G`, `⚠cap1`), and the numbers behind them are on the node screen. A cell
that would not fit its column (several faults at once, a long age, big numbers) is abbreviated,
step by step (`_fit`: the mark glued on, shorter words, the least telling detail dropped), rather
than cut with `…` in the middle of what it names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len

from nvmon.codes import Severity
from nvmon.fleet.state import Liveness, NodeView
from nvmon.tui.text import BAD, DIM, OK, SEVERITY_STYLE, SYMBOL, WARN, Segment, age, clean, gbs, known, kw, \
    short_model

NONE: tuple[Segment, ...] = (("–", DIM),)
_LAST = float("inf")


def _fit(column: str, forms) -> tuple[Segment, ...]:
    """The first of `forms` (cells, fullest first; an iterable, built lazily) that fits the column
    (WIDTH, below); the last (shortest) when none does (the table then cuts it with `…`)."""
    width, form = WIDTH[column], ()
    for form in forms:
        if sum(cell_len(t) for t, _ in form) <= width:
            return form
    return form


def _count(n: float) -> str:
    """12, 980, 1.2k, 45k, 3.1M: a rate or count in at most 4 characters."""
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.1f}{unit}" if n < div * 10 else f"{n / div:.0f}{unit}"
    return f"{n:.0f}"


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    label: str
    width: int
    cell: Callable[[NodeView, Liveness], tuple[Segment, ...]]
    sort: Callable[[NodeView, Liveness], Any]
    help: str
    descending: bool = True  # the first sort by this column puts the largest / worst first


def _mark(style: str, text: str) -> tuple[Segment, ...]:
    return ((f"{SYMBOL[style]} {text}", style),)


def _codes(v: NodeView) -> frozenset[str]:
    """The codes of the node's findings this tick (what the cells name; views never judge)."""
    t = v.tick
    return frozenset(f.code for f in t.findings) if t is not None and t.findings else frozenset()


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
        if v.inventory_stale:
            return _mark(WARN, "layout?")
        if v.duplicate is not None:  # the fleet found two daemons publishing as this node (nvmon.fleet.guard)
            return _fit("status", (_mark(WARN, "2 daemons"), ((f"{SYMBOL[WARN]}2 daemons", WARN),), _mark(WARN, "dup")))
        if v.clock_skew_s is not None:  # the fleet found its clock off beyond the bound: samples dated by arrival
            off = f"{'+' if v.clock_skew_s > 0 else '-'}{age(abs(v.clock_skew_s))}"
            return _fit("status", (_mark(WARN, f"clock {off}"), ((f"{SYMBOL[WARN]}clock {off}", WARN),),
                                   _mark(WARN, f"skew {off}"), ((f"{SYMBOL[WARN]}skew {off}", WARN),)))
        return _mark(OK, "online")
    if live.state == "stale":
        style, word, bound = WARN, "stale", ""
    else:
        style, word = BAD, "lost" if live.reason == "lost" else "off"
        bound = "" if live.exact else "≤"  # a will found retained: silent for up to this long
    a = age(live.age_s)
    return _fit("status", (_mark(style, f"{word} {bound}{a}"), ((f"{SYMBOL[style]}{word} {bound}{a}", style),),
                           ((f"{SYMBOL[style]}{word} {a}", style),)))


def c_rack(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    return ((clean(v.rack, 24), ""),) if v.rack else NONE


def c_gpus(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    s = v.summary
    if s is None:
        return NONE
    words = short_model(s.gpu_model).split(" ")
    models = [" ".join(words[:n]) for n in range(len(words), 0, -1)]  # 'H200 141GB HBM3e', 'H200 141GB', 'H200'
    if s.gpus_lost:
        return _fit("gpus", (_mark(BAD, f"{s.gpu_count - s.gpus_lost}/{s.gpu_count}×{m}") for m in models))
    style = _judged(v, "gpus", "")
    return _fit("gpus", (_mark(style, f"{s.gpu_count}×{m}") if style else ((f"{s.gpu_count}×{m}", ""),)
                         for m in models))


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
    words = []
    if topo in SPLIT_TOPOLOGIES:  # every link up, yet not all-to-all: named, whatever the audit says
        style = WARN if style == OK else style
        words.append(topo)
    if any(c.startswith("fabric.") for c in _codes(v)):
        words.append("fabric")  # links Active, yet the GPU fabric is not usable: the node screen says why
    if s.links_down or not words and not err:
        words.append(f"{s.links_active}/{want}")  # all up beside a named problem: healthy detail, left out
    if err > 0 and not words:  # every link up: the rising counters are the news
        style = style if style != OK else WARN
        return _fit("links", (_mark(style, f"err {_count(err)}/s"), ((f"{SYMBOL[style]}err {_count(err)}/s", style),),
                              ((f"{SYMBOL[style]}{_count(err)}/s", style),)))
    return _fit("links", _link_forms(style, words, err))


SPLIT_TOPOLOGIES = ("pairs", "partial")
_SHORT_WORDS = {"fabric": "fab", "partial": "part"}


def _link_forms(style: str, words: list[str], err: float):
    """`✗ pairs ⚠3/s` and its shorter forms: the mark glued on, the rate without its `/s` (then glued,
    then a bare `⚠`: counters rising, the node screen says how fast), shorter words; then the rate
    left out; then only the first word."""
    short = [_SHORT_WORDS.get(w, w) for w in words]
    sym = SYMBOL[style]
    rates = (f" ⚠{_count(err)}/s", f" ⚠{_count(err)}", f"⚠{_count(err)}", "⚠") if err > 0 else ()
    for ws in (words, short):
        for rate in rates:
            for gap in (" ", ""):
                yield ((f"{sym}{gap}{' '.join(ws)}", style), (rate, WARN))
    for ws in (words, short):
        for gap in (" ", ""):
            yield ((f"{sym}{gap}{' '.join(ws)}", style),)
    yield ((f"{sym}{short[0]}", style),)


def c_pcie(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    s = v.summary
    if s is None or s.pcie_worst is None:
        return NONE
    style = _judged(v, "pcie")
    if s.pcie_degraded:  # "Gen5 x8 on GPU 4": name what the findings are about (x8, Gen4, or both)
        gen, width, _, _, gpu = (s.pcie_worst.split(" ") + [""] * 5)[:5]
        codes = _codes(v)
        what = [w for w, c in ((gen, "pcie.gen"), (width, "pcie.width")) if c in codes] or [gen, width]
        return _fit("pcie", _pcie_forms(style, what, gpu))
    return _fit("pcie", (_mark(style, s.pcie_worst), ((f"{SYMBOL[style]}{s.pcie_worst}", style),)))


def _pcie_forms(style: str, what: list[str], gpu: str):
    """`⚠ Gen4 x8 GPU4` and shorter: the mark glued, `G4` for the GPU, Gen and width joined, then
    the width alone (the node's worse fault; the node screen has both)."""
    sym = SYMBOL[style]
    yield _mark(style, " ".join(what) + f" GPU{gpu}")
    yield ((f"{sym}{' '.join(what)} GPU{gpu}", style),)
    yield ((f"{sym}{' '.join(what)} G{gpu}", style),)
    yield ((f"{sym}{''.join(what)} G{gpu}", style),)
    narrow = [w for w in what if w.startswith("x")] or what[:1]
    yield ((f"{sym}{' '.join(narrow)} GPU{gpu}", style),)
    yield ((f"{sym}{' '.join(narrow)} G{gpu}", style),)


def c_ib(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    s = v.summary
    if s is None or (s.ib_expected in (None, 0) and s.ib_up == 0):
        return (("no IB", DIM),)
    want = "?" if s.ib_expected is None else str(s.ib_expected)
    style = _judged(v, "ib")
    words = [] if s.ib_up == s.ib_expected and style != OK else [f"{s.ib_up}/{want}"]
    if style != OK and known(s.ib_min_rate_gbps) and "ib.rate" in _codes(v):
        words.append(f"{s.ib_min_rate_gbps:.0f}G")  # the slowest port, named when a rate is the finding
    if not words:
        words.append(f"{s.ib_up}/{want}")
    eth_style = DIM if style == OK else style
    eths = (f" +{s.ib_ethernet}eth", f"+{s.ib_ethernet}eth", f"+{s.ib_ethernet}e") if s.ib_ethernet else ("",)
    sym = SYMBOL[style]
    # the Ethernet count shortened, then left out (the count of IB ports up says some are not), then the count
    forms = [(f"{sym}{'' if glued else ' '}{' '.join(ws)}", eth) for ws in (words, words[1:] or words)
             for eth in (*eths, "") for glued in (False, True)]
    return _fit("ib", (((text, style), (eth, eth_style)) if eth else ((text, style),) for text, eth in forms))


def c_power(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    s = v.summary
    if s is None or not known(s.power_w):
        return NONE
    style = _judged(v, "power", "")
    if style:  # the capped GPUs first, then the draw (the limits are on the node screen); mark glued on
        head = f"{SYMBOL[style]}cap{s.power_capped}" if s.power_capped else SYMBOL[style]
        draws = (kw(s.power_w), f"{s.power_w / 1000:.0f}", "")  # 12.3, then 12, then only the cap
        return _fit("power", (((f"{head} {d}".rstrip(), style),) for d in draws))
    whole = f"{s.power_w / 1000:.0f}/{s.power_limit_w / 1000:.0f}" if known(s.power_limit_w) else kw(s.power_w)
    return _fit("power", (((f"{kw(s.power_w)}/{kw(s.power_limit_w)}", ""),), ((whole, ""),), ((kw(s.power_w), ""),)))


def c_temp(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    s = v.summary
    if s is None or not known(s.hottest_c):
        return NONE
    style = _judged(v, "temp", "")
    texts = (f"{s.hottest_c:.0f}°C G{s.hottest_gpu}", f"{s.hottest_c:.0f}° G{s.hottest_gpu}",
             f"{s.hottest_c:.0f}°G{s.hottest_gpu}", f"{s.hottest_c:.0f}°C")
    return _fit("temp", (((f"{SYMBOL[style]}{t}", style),) if style else ((t, ""),) for t in texts))  # mark glued on


def c_alerts(v: NodeView, live: Liveness) -> tuple[Segment, ...]:
    counts = v.alert_counts()
    if not counts:
        return ((SYMBOL[OK], OK),) if v.alerts is not None else NONE
    shown = [(SEVERITY_STYLE[sev], counts[sev]) for sev in ("critical", "warning", "info") if counts.get(sev)]

    def form(marks, gap: str) -> tuple[Segment, ...]:
        return tuple((f"{gap if i else ''}{SYMBOL[st]}{_count(n)}", st) for i, (st, n) in enumerate(marks))

    # all of them, spaced then glued; then the less severe dropped (the alerts screen lists them all)
    return _fit("alerts", (form(shown[:k], gap) for k in range(len(shown), 0, -1) for gap in (" ", "")))


# --- sort keys ---------------------------------------------------------------------------------

_LIVE_RANK = {"online": 0, "stale": 1, "offline": 2}


def _num(x) -> float:
    return x if known(x) else _LAST


def _badness(v: NodeView, column: str) -> int:
    """0 no finding, 1 info, 2 warning, 3 critical: the worst of the node's findings in `column`."""
    sev = v.summary.marks.get(column) if v.summary is not None else None
    return 0 if sev is None else max(0, 3 - Severity.rank_of(sev))


def s_status(v, live):
    return (_LIVE_RANK[live.state], v.inventory_stale, v.duplicate is not None, v.clock_skew_s is not None,
            live.age_s if live.state != "online" else 0)


def s_gpus(v, live):
    s = v.summary
    if s is None:
        return None
    return (_badness(v, "gpus"), s.gpus_lost, s.gpu_model or "", s.gpu_count)


def s_links(v, live):
    s = v.summary
    if s is None:
        return None
    split = v.inventory is not None and v.inventory.topology_class in SPLIT_TOPOLOGIES
    return (max(_badness(v, "links"), 2 if split else 0), s.links_down, nvlink_error_rate(v))


def s_pcie(v, live):
    s = v.summary
    return None if s is None else (_badness(v, "pcie"), s.pcie_degraded)


def s_ib(v, live):
    s = v.summary
    if s is None or s.ib_expected is None:
        return None
    return (_badness(v, "ib"), s.ib_expected - s.ib_up, -_num(s.ib_min_rate_gbps) if known(s.ib_min_rate_gbps) else 0)


def s_alerts(v, live):
    c = v.alert_counts()
    return (c.get("critical", 0), c.get("warning", 0), c.get("info", 0))


def _judged_num(column: str, name: str):
    """Marked rows first (by severity), then by the number."""
    def key(v, live):
        s = v.summary
        return None if s is None or not known(getattr(s, name)) else (_badness(v, column), getattr(s, name))
    return key


def _summary_num(name: str):
    def key(v, live):
        return getattr(v.summary, name) if v.summary is not None and known(getattr(v.summary, name)) else None
    return key


COLUMNS: tuple[Column, ...] = (
    Column("node", "Node", 6, c_node, lambda v, live: v.node, "node name", descending=False),
    Column("status", "Status", 11, c_status, s_status,
           "✓ online, ⚠ stale (no tick for 3 intervals), ✗ lost/off, with age; ⚠ 2 daemons: two publish as "
           "this node, ⚠ clock +5m: its clock is off (+ ahead, - behind)"),
    Column("alerts", "Alerts", 7, c_alerts, s_alerts, "active alerts: ✗ critical, ⚠ warning, ℹ info"),
    Column("links", "Links", 10, c_links, s_links,
           "NVLink links up / expected; ✗ pairs / partial: not all-to-all, ✗ fabric: the GPU fabric is not "
           "usable, ⚠ err N/s: error counters rising"),
    Column("pcie", "PCIe", 10, c_pcie, s_pcie,
           "the GPU PCIe link the node's audit found short (⚠ x8 GPU4), else the lowest"),
    Column("ib", "IB", 9, c_ib, s_ib, "IB ports up / expected; ⚠ 100G: the slowest port, when a rate is a finding; "
           "+Neth: ports in Ethernet mode"),
    Column("power", "GPU kW", 9, c_power, _judged_num("power", "power_w"),
           "GPU draw / sum of limits in kW; ⚠capN: N GPUs with a power.cap or power.limit finding"),
    Column("temp", "Hottest", 8, c_temp, _judged_num("temp", "hottest_c"), "hottest GPU; ⚠ a thermal finding"),
    Column("nvlink", "NVLink GB/s", 11, c_nvlink, _summary_num("nvlink_bytes_per_s"),
           "NVLink TX+RX over all GPUs and links, and % of the model's spec"),
    Column("gpus", "GPUs", 16, c_gpus, s_gpus, "GPU count × model (✗ when GPUs fell off the bus)"),
    Column("rack", "Rack", 8, c_rack, lambda v, live: (v.rack is None, clean(v.rack or "")), "rack from the inventory",
           descending=False),
)
COLUMN_KEYS = tuple(c.key for c in COLUMNS)
WIDTH = {c.key: c.width for c in COLUMNS}  # cells; the node column's narrowest (it grows with the longest name)
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
    if v.duplicate is not None or v.clock_skew_s is not None:  # the fleet's findings about the node itself
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

