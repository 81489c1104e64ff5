"""The node screen's parts as Rich renderables, from one `NodeView` (pure).

Every cell is a `Text` (Rich tables parse plain strings as markup); wire strings go through
`clean`. Values the wire leaves unknown show as `–`.
"""

from __future__ import annotations

from functools import partial

from rich import box
from rich.cells import cell_len
from rich.console import Group
from rich.table import Table
from rich.text import Text

from nvmon.catalog import GPU_WIRE_FACTS, GPU_WIRE_READ, show
from nvmon.codes import Severity, runbook
from nvmon.fleet.state import NodeView
from nvmon.model import short_bus_id
from nvmon.tui.rows import c_status
from nvmon.tui.text import BAD, DIM, OK, SEVERITY_STYLE, SYMBOL, WARN, age, clean, gbs, known, \
    literal, pct_style, short_model

BOARD_WORDS = {
    "nvswitch": (OK, "all-to-all through NVSwitch: every GPU pair is NVLink-connected"),
    "mesh": (OK, "direct NVLink mesh between GPUs (no NVSwitch)"),
    "pairs": (WARN, "NVLink bridges in pairs only: NOT all-to-all (GPUs talk across pairs over PCIe)"),
    "partial": (BAD, "partial NVLink: some GPU pairs are not connected"),
    "none": (DIM, "no NVLink: GPUs talk over PCIe only"),
}


def T(text: object = "", style: str = "", limit: int = 256) -> Text:  # noqa: N802 - a cell constructor
    return literal(text, style, limit)


def _table(*headers: str, title: str, wrap_last: bool = False) -> Table:
    """Columns one space apart (the GPU table fits 80 columns); a header may take two lines."""
    t = Table(box=box.SIMPLE_HEAD, title=Text(title, style="bold"), title_justify="left", pad_edge=False,
              padding=0, show_edge=False, expand=False)  # the box's divider: one space
    for i, h in enumerate(headers):
        t.add_column(Text(h, style="bold"), no_wrap=not (wrap_last and i == len(headers) - 1))
    return t


def _fit(table: Table) -> Table:
    """Columns never narrower than their content: a narrow terminal scrolls sideways instead of
    Rich squeezing every cell to an ellipsis."""
    for col in table.columns:
        if not col.no_wrap:  # the last column (events) wraps instead
            continue
        cells = [c for c in col.cells if isinstance(c, Text)]
        header = max((cell_len(line) for line in col.header.plain.split("\n")), default=0) \
            if isinstance(col.header, Text) else 0
        col.min_width = max([header, *(c.cell_len for c in cells)])
    return table


def info(view: NodeView, now: float) -> Text:
    live = view.liveness(now)
    out = Text(end="")
    out.append(view.node, "bold")
    out.append(f"  cluster {view.cluster}", DIM)
    if view.rack:
        out.append("  rack ", DIM)
        out.append(clean(view.rack, 64))
    out.append("  ")
    for text, style in c_status(view, live):
        out.append(text, style)
    inv = view.inventory
    if inv is not None:
        if inv.hostname:
            out.append("  host ", DIM)
            out.append(clean(inv.hostname, 64))
        if inv.driver_version:
            out.append("  driver ", DIM)
            out.append(clean(inv.driver_version, 32))
        if inv.nvml_error:
            out.append(f"  {SYMBOL[BAD]} NVML: ", BAD)
            out.append(clean(inv.nvml_error, 120), BAD)
    if view.inventory_stale:
        out.append(f"  {SYMBOL[WARN]} layout changed, waiting for the new inventory", WARN)
    if view.dropped:
        out.append(f"  {SYMBOL[WARN]} {view.dropped} bad messages dropped", WARN)
    if view.duplicate is not None:  # the fleet's finding (nvmon.fleet.guard), its evidence as it said it
        out.append(f"\n{SYMBOL[WARN]} two daemons publish as this node: ", WARN)
        out.append(clean(view.duplicate, 200))
        out.append(" (give each its own node name)", DIM)
    if view.clock_skew_s is not None:
        skew = view.clock_skew_s
        out.append(f"\n{SYMBOL[WARN]} its clock is {age(abs(skew))} {'ahead of' if skew > 0 else 'behind'} this "
                   "viewer's: its timestamps are not trusted, its messages dated by arrival", WARN)
    if view.labels:
        out.append("\nlabels ", DIM)
        for i, (k, v) in enumerate(sorted(view.labels.items())):
            out.append(("  " if i else "") + clean(k, 64), "bold")
            out.append("=" + clean(v, 128))
    return out


def _want_links(view: NodeView, index: int) -> int | None:
    f = view.facts
    if f is None:
        return None
    spec = (f.gpus.get(index) or f.fallback).spec
    return spec.nvlink_links if spec is not None else None


def _judged(findings, healthy: str, **where) -> str:
    """The style of the worst of `findings` (the node's own audit of this tick) at `where`
    (e.g. gpu=3, or device="mlx5_0", port=None for an HCA), else `healthy`."""
    worst = Severity.worst(f.severity for f in findings if all(getattr(f, k) == v for k, v in where.items()))
    return SEVERITY_STYLE.get(worst, healthy) if worst is not None else healthy


def _of(findings, *codes: str) -> list:
    return [f for f in findings if f.code in codes]


def gpu_table(view: NodeView) -> Table | Text:
    """One row per GPU, within 80 columns: the model goes in the title (a column only for a mixed
    board); a power, PCIe or link finding marks its cell, and `events` names the GPU's findings that
    no cell shows, with the counters that rose."""
    t = view.tick
    if t is None:
        return Text("no sample yet", style=DIM)
    models = {g.index: g for g in view.inventory.gpus} if view.inventory is not None else {}
    names = {short_model(m.model) for m in models.values()}
    mixed = len(names) > 1
    title = "GPUs" + (f": {names.pop()}" if len(names) == 1 else "") + " (GB/s: tx/rx)"
    headers = ["GPU", *(["model"] if mixed else []), "util", "temp", "power\nW", "PCIe", "PCIe\nGB/s",
               "NVLink\nGB/s", "links", "events"]
    table = _table(*headers, title=title, wrap_last=True)
    temps, powers = _of(t.findings, "thermal"), _of(t.findings, "power.cap", "power.limit")
    pcies, downs = _of(t.findings, "pcie.width", "pcie.gen"), _of(t.findings, "nvlink.link_down", "nvlink.speed")
    for g in t.gpus:
        info_ = models.get(g.index)
        model = [T(short_model(info_.model if info_ else None))] if mixed else []
        if g.lost:
            table.add_row(T(str(g.index), "bold"), *model, T(f"{SYMBOL[BAD]} lost: fell off the bus", BAD))
            continue
        util = T("–" if g.utilization_pct is None else f"{g.utilization_pct:.0f}%", pct_style(g.utilization_pct))
        temp = T("–", DIM)
        if known(g.temperature_c):
            st = _judged(temps, "", gpu=g.index)
            temp = T((f"{SYMBOL[st]} " if st else "") + f"{g.temperature_c:.0f}°C", st)
        power = T(f"{g.power_w or 0:.0f}/{g.power_limit_w or 0:.0f}" if known(g.power_w) else "–")
        if st := _judged(powers, "", gpu=g.index):
            power = T(f"{SYMBOL[st]} {g.power_w or 0:.0f}/{g.power_limit_w or 0:.0f}", st)
        pcie = T("–", DIM)
        if g.pcie_gen is not None and g.pcie_width is not None:
            st = _judged(pcies, OK, gpu=g.index)
            pcie = T(f"{SYMBOL[st]} Gen{g.pcie_gen} x{g.pcie_width}", st)
        up = len(g.link_tx_pct) - len(g.links_down) - len(g.links_unknown)
        want = _want_links(view, g.index)
        st = _judged(downs, OK, gpu=g.index)
        links = T(f"{SYMBOL[st]} {up}/{want if want is not None else len(g.link_tx_pct)}",
                  st) if g.link_tx_pct else T("–", DIM)
        events = Text(end="")
        for code, sev in sorted({(f.code, f.severity) for f in t.findings if f.gpu == g.index
                                 and f.code not in _CELL_CODES}):
            st = SEVERITY_STYLE.get(sev, WARN)
            events.append(f"{SYMBOL[st]} {code}  ", st)
        nerr = sum(d for kinds in g.link_errors.values() for d in kinds.values())
        if nerr:
            events.append(f"{SYMBOL[WARN]} NVLink err +{nerr}  ", WARN)
        if g.pcie_replay_delta:
            events.append(f"{SYMBOL[WARN]} replay +{g.pcie_replay_delta}  ", WARN)
        if g.throttle_reasons:
            events.append("throttle " + ",".join(clean(r, 24) for r in g.throttle_reasons[:3]), DIM)
        events.rstrip()
        table.add_row(T(str(g.index), "bold"), *model, util, temp, power, pcie,
                      T(f"{gbs(g.pcie_tx_bytes_per_s)}/{gbs(g.pcie_rx_bytes_per_s)}"),
                      T(f"{gbs(g.nvlink_tx_bytes_per_s)}/{gbs(g.nvlink_rx_bytes_per_s)}"), links,
                      events if events.plain else T("–", DIM))
    return _fit(table)


# Codes a GPU table cell (or a counter in `events`) shows itself; any other finding of a GPU is named in
# its `events`.
_CELL_CODES = frozenset(("thermal", "pcie.width", "pcie.gen", "nvlink.link_down", "nvlink.speed", "gpu.lost",
                         "power.cap", "power.limit", "nvlink.errors", "pcie.replay"))


# How a catalog metric is shown, by its `fmt` (nvmon.catalog): values arrive in the metric's units;
# a metric without one is shown in its unit's display form (catalog.show: "49 %").
_FORMATS = {"mhz": lambda v: f"{v / 1e6:.0f} MHz", "mib": lambda v: f"{v / 2**30:.1f} GiB",
            "c": lambda v: f"{v:.0f}°C"}


def metrics_table(view: NodeView) -> Table | Text:
    """The per-GPU values the wire carries through the catalog (clocks, framebuffer, memory
    temperature, and any metric added there later), one column each, labelled by the catalog; then
    the static ones the inventory carries (clock maxima, framebuffer size), dimmed."""
    t = view.tick
    shown = [m for m in GPU_WIRE_READ if t is not None and any(m.name in g.values for g in t.gpus)]
    if not shown:
        return Text("")
    facts = {g.index: g.facts for g in view.inventory.gpus} if view.inventory is not None else {}
    static = [m for m in GPU_WIRE_FACTS if any(m.name in f for f in facts.values())]
    table = _table("GPU", *(m.label for m in shown + static), title="Clocks and memory")
    for g in t.gpus:
        cells = [_metric_cell(m, g.values.get(m.name)) for m in shown]
        cells += [_metric_cell(m, facts.get(g.index, {}).get(m.name), DIM) for m in static]
        table.add_row(T(str(g.index), "bold"), *cells)
    return _fit(table)


def _metric_cell(m, v, style: str = "") -> Text:
    if not known(v):
        return T("–", DIM)
    return T((_FORMATS[m.fmt] if m.fmt in _FORMATS else partial(show, m.unit))(v), style)


def _block(pct: float | None) -> str:
    if pct is None:
        return "?"
    return "░" if pct < 5 else "▒" if pct < 40 else "▓" if pct < 75 else "█"


def link_grid(view: NodeView) -> Text:
    """GPU × link: utilization blocks; ✗ down, ! errors rising, ~ slower speed, ? unknown, · unused slot."""
    t = view.tick
    out = Text(end="")
    out.append("NVLink per link", "bold")
    out.append("  ░<5% ▒<40% ▓<75% █≥75% of link speed · ", DIM)
    out.append("✗ down", BAD)
    out.append(" ", DIM)
    out.append("! errors", WARN)
    out.append(" ~ slow  ? unknown  · unused\n", DIM)
    if t is None or not any(g.link_tx_pct for g in t.gpus):
        out.append("no NVLink links reported", DIM)
        return out
    width = max(len(g.link_tx_pct) for g in t.gpus)
    out.append("      " + "".join(f"{n % 100:>2}"[-2:] + " " for n in range(width)) + "\n", DIM)
    downs = _of(t.findings, "nvlink.link_down")
    for g in t.gpus:
        out.append(f"GPU{g.index:<3}", "bold")
        # The links the node's audit found down (a shortfall without link numbers: all inactive ones).
        judged = {f.link for f in downs if f.gpu == g.index}
        for n in range(width):
            if g.lost:
                out.append(" ✗ ", BAD)
                continue
            if n >= len(g.link_tx_pct):
                out.append("   ")
                continue
            tx, rx = g.link_tx_pct[n], g.link_rx_pct[n] if n < len(g.link_rx_pct) else None
            pct = max((v for v in (tx, rx) if v is not None), default=None)
            if n in g.links_down:
                cell, style = (" ✗ ", BAD) if n in judged or None in judged else (" · ", DIM)
            elif n in g.links_unknown:
                cell, style = " ? ", WARN
            elif n in g.link_errors:
                cell, style = f" !{_block(pct)}"[:3], "bold yellow"
            elif n in g.link_speed_mbps:
                cell, style = f" ~{_block(pct)}"[:3], WARN
            else:
                cell, style = f" {_block(pct)}{_block(pct)}", pct_style(pct)
            out.append(cell, style)
        out.append("\n")
    out.rstrip()
    return out


def topology(view: NodeView) -> Text:
    inv = view.inventory
    out = Text(end="")
    out.append("Topology  ", "bold")
    if inv is None:
        out.append("no inventory yet", DIM)
        return out
    cls = clean(inv.topology_class, 32)
    style, words = BOARD_WORDS.get(inv.topology_class, (DIM, "unknown board class"))
    node_spec = inv.spec.get("node") if isinstance(inv.spec, dict) else None
    want = node_spec.get("topology") if isinstance(node_spec, dict) else None
    if want is None and view.facts is not None and view.facts.fallback.spec is not None:
        want = view.facts.fallback.spec.board  # shown beside the class; the verdict is the node's audit
    judged = _judged(_of(view.tick.findings, "nvlink.topology"), "") if view.tick is not None else ""
    if judged:
        style = judged
    elif style == BAD:
        style = WARN  # a board that is not all-to-all is worth a look; only the audit calls it a fault
    out.append(f"{SYMBOL.get(style, ' ')} {words} ", style)
    out.append(f"[class {cls}" + (f", spec {clean(want, 16)}]" if want else "]"), DIM)
    if inv.nvswitches:
        out.append(f"  {len(inv.nvswitches)} NVSwitch chips", DIM)
    m = inv.topology_matrix
    if not m:
        return out
    n = len(m)
    out.append("\n      " + "".join(f"{'GPU' + str(j):>6}" for j in range(n)) + "\n", "bold")
    for i, row in enumerate(m):
        out.append(f"{'GPU' + str(i):<6}", "bold")
        for cell in row[:n]:
            c = clean(cell, 5)
            st = DIM if c == "X" else "green" if c.startswith("NV") else "yellow" if c in ("PIX", "PXB") else \
                "red" if c == "SYS" else ""
            out.append(f"{c:>6}", st)
        out.append("\n")
    out.rstrip()
    return out


def ib_table(view: NodeView) -> Table | Text:
    inv, t = view.inventory, view.tick
    if inv is None or not inv.ib:
        return Text("InfiniBand: no ports in the inventory", style=DIM)
    ticks = {p.index: p for p in t.ib} if t is not None else {}
    findings = t.findings if t is not None else ()
    downs, rates = _of(findings, "ib.port_down"), _of(findings, "ib.rate")
    table = _table("#", "port", "layer", "state", "rate", "tx/rx GB/s", "errors rising", title="InfiniBand")
    for i, p in enumerate(inv.ib):
        tk = ticks.get(i)
        state = (tk.state or "?") if tk else "?"
        phys = (tk.phys_state or "") if tk else ""
        up = state.upper() == "ACTIVE" and (not phys or phys.lower() == "linkup")
        rate = tk.rate_gbps if tk is not None and tk.rate_gbps is not None else p.rate_gbps
        slow = _judged(rates, "", device=p.device, port=p.port)  # below rate, or Ethernet where IB is expected
        st = _judged(downs, slow or OK, device=p.device, port=p.port)
        errs = ", ".join(f"{clean(k, 24)} +{v}" for k, v in tk.errors_delta.items()) if tk else ""
        table.add_row(T(str(i)), T(f"{p.device}:{p.port}"), T(p.link_layer or "?", slow),
                      T(f"{SYMBOL[st]} {state}" + (f"/{phys}" if phys and not up else ""), st),
                      T(f"{rate:.0f}G" if rate else "–", slow),
                      T(f"{gbs(tk.tx_bytes_per_s)}/{gbs(tk.rx_bytes_per_s)}" if tk else "–"),
                      T(errs or "–", WARN if errs else DIM))
    return _fit(table)


def _pcie_cell(gen, width, max_gen, max_width, st: str) -> Text:
    """'✓ Gen5 x16 of Gen5 x16', marked `st` (the style of the node's findings for that link)."""
    if gen is None or width is None:
        return T(f"– (max Gen{max_gen or '?'} x{max_width or '?'})", DIM)
    return T((f"{SYMBOL[st]} " if st else "") + f"Gen{gen} x{width} of Gen{max_gen or '?'} x{max_width or '?'}", st)


def pcie_table(view: NodeView) -> Table | Text:
    inv, t = view.inventory, view.tick
    if inv is None:
        return Text("PCIe: no inventory yet", style=DIM)
    ticks = {g.index: g for g in t.gpus} if t is not None else {}
    table = _table("device", "bus id", "link now / max", "tx/rx GB/s", "replays", title="PCIe")
    pcies = _of(t.findings, "pcie.width", "pcie.gen") if t is not None else []
    for g in inv.gpus:
        tk = ticks.get(g.index)
        table.add_row(T(f"GPU{g.index}", "bold"), T(short_bus_id(g.bus_id) or "?"),
                      _pcie_cell(tk.pcie_gen if tk else None, tk.pcie_width if tk else None, g.pcie.max_gen,
                                 g.pcie.max_width, _judged(pcies, OK, gpu=g.index)),
                      T(f"{gbs(tk.pcie_tx_bytes_per_s)}/{gbs(tk.pcie_rx_bytes_per_s)}" if tk else "–"),
                      T(f"+{tk.pcie_replay_delta}" if tk and tk.pcie_replay_delta else "–",
                        WARN if tk and tk.pcie_replay_delta else DIM))
    for p in inv.ib:
        table.add_row(T(f"HCA {p.device}:{p.port}", "bold"), T(short_bus_id(p.bus_id) or "?"),
                      _pcie_cell(p.pcie.gen, p.pcie.width, p.pcie.max_gen, p.pcie.max_width,
                                 _judged(pcies, OK, gpu=None, device=p.device, port=None)),
                      T("–", DIM), T("–", DIM))
    for s in inv.nvswitches:
        table.add_row(T(f"NVSwitch ({clean(s.kind, 16)})", "bold"), T(short_bus_id(s.bus_id)),
                      _pcie_cell(s.pcie.gen, s.pcie.width, s.pcie.max_gen, s.pcie.max_width, ""),  # not judged
                      T("–", DIM),
                      T("–", DIM))
    return _fit(table)


def _hanging() -> Table:
    """Mark, code, text: a wrapped text stays in its column (a hanging indent)."""
    grid = Table.grid(padding=(0, 1, 0, 0))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1)
    return grid


def alerts_block(view: NodeView, now: float) -> Text | Group:
    head = Text("Alerts  ", style="bold")
    if view.alerts is None or not view.alerts.alerts:
        head.append(f"{SYMBOL[OK]} none active" if view.alerts is not None else "none published", OK if view.alerts
                    else DIM)
        head.end = ""
        return head
    grid = _hanging()
    for a in sorted(view.alerts.alerts, key=lambda a: (Severity.rank_of(a.severity), a.since)):
        st = SEVERITY_STYLE.get(a.severity, DIM)
        text = Text(clean(a.summary, 200), end="")
        text.append(f"  ({age(now - a.since)})", DIM)
        grid.add_row(Text(f"{SYMBOL.get(st, '?')} {clean(a.severity, 8):<8}", st, end=""),
                     Text(clean(a.code, 40), "bold", end=""), text)
    parts: list = [head, grid]
    if view.alerts.omitted:
        parts.append(Text(f"… {view.alerts.omitted} more not published (size limit)", DIM))
    return Group(*parts)


def _where(findings) -> str:
    """'GPU 0-7', 'GPU 2 link 5', 'mlx5_1:1', '' (the node)."""
    gpus = sorted({f.gpu for f in findings if f.gpu is not None})
    devices = sorted({f"{f.device}:{f.port}" if f.port is not None else f.device for f in findings
                      if f.device is not None})
    links = sorted({(f.gpu, f.link) for f in findings if f.link is not None})
    parts = []
    if len(links) == 1:
        parts.append(f"GPU {links[0][0]} link {links[0][1]}")
    elif gpus:
        run = gpus == list(range(gpus[0], gpus[-1] + 1)) and len(gpus) > 2
        parts.append("GPU " + (f"{gpus[0]}-{gpus[-1]}" if run else ",".join(map(str, gpus))))
    parts += [clean(d, 32) for d in devices[:4]] + (["…"] if len(devices) > 4 else [])
    return " ".join(parts)


def findings_block(view: NodeView) -> Text | Group:
    """What the node's audit found this tick, one line per code with where and what to do (the code's
    runbook): e.g. a GPU fabric finding, whose NVLinks read Active, explained."""
    t = view.tick
    head = Text("Findings this tick  ", style="bold")
    head.end = ""
    if t is None:
        head.append("no sample yet", DIM)
        return head
    if not t.findings:
        head.append(f"{SYMBOL[OK]} none", OK)
        return head
    head.end = "\n"
    by_code: dict[str, list] = {}
    for f in t.findings:
        by_code.setdefault(f.code, []).append(f)
    grid = _hanging()
    for code, fs in sorted(by_code.items(), key=lambda kv: (Severity.rank_of(Severity.worst(
            f.severity for f in kv[1])), kv[0])):
        sev = Severity.worst(f.severity for f in fs)
        st = SEVERITY_STYLE.get(sev, DIM)
        what = Text(_where(fs), "bold", end="")
        book = runbook(code)
        what.append((" — " if what.plain else "") + (book or "(a code this view does not know)"),
                    "" if book else DIM)
        grid.add_row(Text(SYMBOL.get(st, "?"), st, end=""), Text(clean(code, 40), "bold", end=""), what)
    return Group(head, grid)


def sections(view: NodeView, now: float) -> Group:
    gap = Text(" ")
    return Group(gpu_table(view), gap, metrics_table(view), gap, link_grid(view), gap, topology(view), gap,
                 ib_table(view), gap, pcie_table(view))
