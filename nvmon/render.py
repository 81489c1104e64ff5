"""Terminal views of a `Sample` and an `AuditReport`, built with Rich.

Layout target: an SRE over SSH on an 80×24 terminal. Each GPU, IB port and finding is one line at
80 columns; detail that does not fit a cell (which link is down, per-counter error rises) goes to a
short "Problems" list under the tables. Wider terminals get the same layout.

Two rules hold everywhere here:
- Meaning never rides on colour alone: every state also carries a symbol or a word (✓ fine, ✗ fault,
  ⚠ warning, ℹ info, ↑ rising: the TUI's symbols), so the output reads the same when piped or on a
  monochrome terminal.
- Strings that come from hardware or the network (GPU names, device names, notes, messages that
  quote them) are shown literally: control characters are stripped and they go into `Text`
  objects (never parsed as markup), or through `rich.markup.escape` where markup is built.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from nvmon.audit import AuditReport, Finding, audit, describe_board, fabric_domain
from nvmon.codes import SEVERITIES, Severity
from nvmon.model import GpuSample, IbPortSample, PcieLink, Sample, short_bus_id

OK, BAD, WARN, INFO, UP = "✓", "✗", "⚠", "ℹ", "↑"  # the TUI's (nvmon.tui.text.SYMBOL) too
SEVERITY_SYMBOL = {"critical": BAD, "warning": WARN, "info": INFO}  # a finding's or an alert's mark
DASH = "-"  # shown for None: "could not be read"
MAX_LIST_LINES = 10  # Problems / Notes: this many lines, then "… and N more"

# C0/C1 controls (ESC starts terminal sequences), zero-width and bidi overrides that can make
# a name render as something else.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


def plain(value: Any) -> str:
    """`value` as a string with control characters removed; None → "-"."""
    return DASH if value is None else _UNSAFE.sub("", str(value))


def literal(value: Any, style: str = "") -> Text:
    """A `Text` that shows `value` exactly (minus control characters), never as markup."""
    return Text(plain(value), style=style)


def markup_safe(value: Any) -> str:
    """`value` ready to be embedded in a Rich markup string."""
    return escape(plain(value))


def port_name(device: Any, port: Any) -> str:
    """An IB port as every nvmon view names it: 'mlx5_0:1' (device:port)."""
    return f"{plain(device)}:{port}"


def _one_line(text: Text) -> Text:
    """`text` that never wraps: cut with "…" when its column is squeezed."""
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


def _gbps(bytes_per_s: float | None) -> str:
    if bytes_per_s is None:
        return DASH
    g = bytes_per_s / 1e9
    return f"{g:.1f}" if g < 9.95 else f"{g:.0f}"  # 3 significant digits are plenty, and narrower


def _txrx(tx: float | None, rx: float | None) -> str:
    return DASH if tx is None and rx is None else f"{_gbps(tx)}/{_gbps(rx)}"


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return DASH if value is None else fmt.format(value)


def _table() -> Table:
    # Two spaces between columns (the box's blank divider and one pad), none at the edges, a rule
    # under the header: light and narrow.
    return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1))


def _col(table: Table, header: str, *, right: bool = False, squeeze: bool = False) -> None:
    """A column that never wraps. `squeeze`: may be narrowed (its cells then end in "…")."""
    # Rich narrows only wrappable columns; squeezable cells are `_one_line` Texts, so they still
    # never wrap (a Text's own no_wrap wins over its column's).
    table.add_column(header, justify="right" if right else "left", vertical="bottom",
                     no_wrap=not squeeze, overflow="ellipsis")


def _title(words: str) -> Text:
    return Text(words, style="bold")


# ---------------------------------------------------------------- cells
#
# Every mark in these cells (✗ ⚠ ✓) comes from the audit's findings: this module never holds a
# value against a spec or a threshold itself, so `nvmon sample` and `nvmon audit` always agree.


class _Findings:
    """A report's findings by the place they name: a GPU, or an IB device (port or HCA)."""

    def __init__(self, report: AuditReport) -> None:
        self.gpu: dict[int, list[Finding]] = {}
        self.device: dict[str, list[Finding]] = {}
        for f in report.findings:
            if f.severity == Severity.INFO:
                continue
            if f.gpu is not None:
                self.gpu.setdefault(f.gpu, []).append(f)
            elif f.device is not None:
                self.device.setdefault(f.device, []).append(f)

    def of_gpu(self, index: int, *codes: str) -> list[Finding]:
        return [f for f in self.gpu.get(index, ()) if not codes or f.code in codes]

    def of_port(self, device: str, port: int | None, *codes: str) -> list[Finding]:
        """The findings of one IB port (`port`), or of its HCA (`port` None: PCIe)."""
        return [f for f in self.device.get(device, ()) if f.code in codes and f.port == port]


_LOUD = {Severity.CRITICAL: "bold red"}  # else bold yellow: a cell or Problems line's mark


def _mark(severity: str) -> tuple[str, str]:
    """(symbol, style) of a warning or critical finding in the tables and the Problems list."""
    return _SEVERITY_STYLE.get(severity, ("?", ""))[0], _LOUD.get(severity, "bold yellow")


def _marked(text: str, findings: list[Finding], healthy: str = "") -> Text:
    """`text` behind the symbol of its worst finding (✗ critical, ⚠ warning), else as it is."""
    worst = Severity.worst(f.severity for f in findings)
    if worst is None:
        return Text(text, style=healthy)
    symbol, style = _mark(worst)
    return Text(f"{symbol} {text}", style=style)


def _expected_number(findings: list[Finding], code: str, prefix: str) -> int | None:
    """The number a finding expects, e.g. 16 from pcie.width's expected "x16"."""
    for f in findings:
        if f.code == code and isinstance(f.expected, str) and f.expected.startswith(prefix):
            digits = f.expected[len(prefix):]
            if digits.isdigit():
                return int(digits)
    return None


def pcie_cell(p: PcieLink, findings: list[Finding] = ()) -> Text:  # type: ignore[assignment]
    """'Gen5 x16' when healthy; with a pcie.width / pcie.gen finding, now/expected behind its
    severity, e.g. '⚠ Gen3/5 x8/16'. A lower gen without a finding (an idle GPU saving power)
    is shown as now/max, dim."""
    if p.gen is None and p.width is None:
        return Text(DASH)
    findings = [f for f in findings if f.code in ("pcie.width", "pcie.gen")]
    want_gen = _expected_number(findings, "pcie.gen", "Gen") or p.max_gen
    want_width = _expected_number(findings, "pcie.width", "x")
    gen = "Gen?" if p.gen is None else f"Gen{p.gen}"
    if p.gen is not None and want_gen is not None and p.gen != want_gen:
        gen += f"/{want_gen}"
    width = "x?" if p.width is None else f"x{p.width}"
    if p.width is not None and want_width is not None and p.width != want_width:
        width += f"/{want_width}"
    idle_downshift = not findings and p.gen is not None and p.max_gen is not None and p.gen != p.max_gen
    return _marked(f"{gen} {width}", findings, healthy="dim" if idle_downshift else "")


def _nvlink_cell(gpu: GpuSample, found: _Findings) -> Text:
    total = gpu.nvlink_count if gpu.nvlink_count is not None else len(gpu.nvlink)
    if not total:
        return Text(DASH)
    active = sum(1 for link in gpu.nvlink if link.active)
    return _marked(f"{active}/{total}", found.of_gpu(gpu.index, "nvlink.link_down", "nvlink.speed"))


# Throttle (clocks event) reasons → short flags. They are states: the audit decides whether one
# is a problem (power.cap, power.brake, thermal), and only then are they shown loud.
_THROTTLE_FLAGS = {
    "sw_power_cap": "pwrcap", "hw_power_brake": "brake", "sw_thermal": "thermal", "hw_thermal": "thermal",
    "hw_slowdown": "hwslow", "sync_boost": "sync", "applications_clocks": "appclk",
    "display_clocks": "display", "gpu_idle": "idle",
}
_POWER_FLAGS = {"pwrcap", "brake"}
_THERMAL_FLAGS = {"thermal", "hwslow"}
_BRAKE_FLAGS = {"brake", "hwslow"}  # power.brake: HW slowdown from the power brake, or with no cause named
_CELL_CODES = {"pcie.width", "pcie.gen", "nvlink.link_down", "nvlink.speed", "gpu.lost"}  # shown in their cells


def _errors_known(gpu: GpuSample) -> bool:
    return gpu.pcie.replay_errors_delta is not None or any(
        v is not None for link in gpu.nvlink for v in link.errors_delta.values())


def _flags_cell(gpu: GpuSample, found: _Findings) -> Text:
    """The GPU's findings that have no cell of their own ('err↑ L3', 'pwrcap', 'Xid79'), loud,
    then its other throttle reasons, dim; ✓ when the audit found nothing and errors were read."""
    findings = found.of_gpu(gpu.index)
    codes = {f.code for f in findings}
    flags: list[str] = []
    for reason in gpu.throttle_reasons or ():
        flag = _THROTTLE_FLAGS.get(reason, plain(reason))
        if flag not in flags:
            flags.append(flag)
    loud = [f for f in flags if (f in _POWER_FLAGS and "power.cap" in codes)
            or (f in _THERMAL_FLAGS and "thermal" in codes) or (f in _BRAKE_FLAGS and "power.brake" in codes)]
    quiet = [f for f in flags if f not in loud]
    if "power.cap" in codes and not _POWER_FLAGS & set(loud):
        loud.append("pwr@lim")
    if "thermal" in codes and not _THERMAL_FLAGS & set(loud):
        loud.append("hot")
    if "power.limit" in codes:
        loud.append("pwrlim")
    loud += [f"Xid{f.xid}" for f in findings if f.code == "gpu.xid"]
    erring = [f"L{f.link}" for f in findings if f.code == "nvlink.errors"]
    erring += ["PCIe"] if "pcie.replay" in codes else []
    if erring:
        shown = ",".join(erring[:3]) + (f"+{len(erring) - 3}" if len(erring) > 3 else "")
        loud.append(f"err{UP} {shown}")
    text = Text()
    if loud:
        text.append(" ".join(loud), style="bold yellow")
    if quiet:
        text.append((" " if loud else "") + " ".join(quiet), style="dim")
    if not findings and not flags:
        text = Text(OK, style="green") if _errors_known(gpu) else Text(DASH)
    elif not findings:
        text = Text(f"{OK} ", style="green") + text if _errors_known(gpu) else text
    return _one_line(text)


def _short_model(name: str | None) -> str:
    return plain(name).removeprefix("NVIDIA ")


def _models(sample: Sample) -> list[str]:
    """Distinct GPU model names, in board order."""
    return list(dict.fromkeys(g.name for g in sample.gpus if g.name))


# ---------------------------------------------------------------- tables


def _gpu_table(sample: Sample, found: _Findings) -> Table:
    per_row_name = len(_models(sample)) > 1
    table = _table()
    _col(table, "GPU", right=True)
    if per_row_name:
        _col(table, "Model", squeeze=True)
    for header in ("Power W", "°C", "Util%", "PCIe", "PCIe\nGB/s", "NVLink", "NVLink\nGB/s", "Flags"):
        _col(table, header, right=header not in ("PCIe", "Flags"), squeeze=header == "Flags")
    for gpu in sample.gpus:
        name = [_one_line(literal(_short_model(gpu.name)))] if per_row_name else []
        if gpu.lost:
            table.add_row(str(gpu.index), *name, *[DASH] * 7, Text(f"{BAD} LOST", style="bold red"))
            continue
        tx = sum(link.tx_bytes_per_s or 0 for link in gpu.nvlink) if gpu.nvlink else None
        rx = sum(link.rx_bytes_per_s or 0 for link in gpu.nvlink) if gpu.nvlink else None
        table.add_row(
            str(gpu.index), *name, f"{_num(gpu.power_w)}/{_num(gpu.power_limit_w)}", _num(gpu.temperature_c),
            _num(gpu.utilization_pct), pcie_cell(gpu.pcie, found.of_gpu(gpu.index)),
            _txrx(gpu.pcie.tx_bytes_per_s, gpu.pcie.rx_bytes_per_s), _nvlink_cell(gpu, found),
            _txrx(tx, rx), _flags_cell(gpu, found),
        )
    return table


def _topology_table(sample: Sample) -> Table:
    topo = sample.topology
    table = _table()
    _col(table, "")
    for j in range(len(topo.matrix)):
        _col(table, f"GPU{j}")
    _col(table, "NVSw", right=True)
    for i, row in enumerate(topo.matrix):
        cells = [literal(c, "bold green" if c.startswith("NV") else "dim" if c == "X" else "") for c in row]
        sw = topo.nvswitch_links[i] if i < len(topo.nvswitch_links) else None
        table.add_row(f"GPU{i}", *cells, _num(sw))
    return table


def _ib_state(port: IbPortSample, down: list[Finding]) -> Text:
    if port.state is None:
        return Text(DASH)
    if port.state.upper() == "ACTIVE" or not down:
        return Text(f"{OK} {plain(port.state)}", style="green") if not down else literal(port.state)
    return _marked(plain(port.state), down)


def _ib_phys(port: IbPortSample, down: list[Finding]) -> Text:
    if port.phys_state is None:
        return Text(DASH)
    if port.phys_state.lower() == "linkup" or not down:
        return literal(port.phys_state)
    return _marked(plain(port.phys_state), down)


_LAYERS = {"infiniband": "IB", "ethernet": "Eth"}


def _ib_table(sample: Sample, found: _Findings) -> Table:
    table = _table()
    for header in ("Port", "State", "Phys", "Gb/s", "Layer", "GB/s", "Err", "HCA PCIe"):
        _col(table, header, right=header == "GB/s", squeeze=header in ("Port", "Err"))
    for port in sample.ib:
        rate = DASH if port.rate_gbps is None else f"{port.rate_gbps:g}"
        if port.rate_name:
            rate += f" {plain(port.rate_name)}"
        layer = _LAYERS.get((port.link_layer or "").lower(), plain(port.link_layer))
        known = any(v is not None for v in port.errors_delta.values())
        if found.of_port(port.device, port.port, "ib.errors"):
            err = Text(f"err{UP}", style="bold yellow")
        else:
            err = Text(OK, style="green") if known else Text(DASH)
        down = found.of_port(port.device, port.port, "ib.port_down")
        table.add_row(
            _one_line(literal(port_name(port.device, port.port))), _ib_state(port, down), _ib_phys(port, down),
            _marked(plain(rate), found.of_port(port.device, port.port, "ib.rate")), _one_line(literal(layer)),
            _txrx(port.tx_bytes_per_s, port.rx_bytes_per_s), _one_line(err),
            pcie_cell(port.pcie, found.of_port(port.device, None, "pcie.width", "pcie.gen")),
        )
    return table


def _nvswitch_table(sample: Sample) -> Table:
    table = _table()
    _col(table, "NVSwitch", squeeze=True)
    _col(table, "PCIe")
    for sw in sample.nvswitches:
        table.add_row(_one_line(literal(short_bus_id(sw.pci_bus_id))), pcie_cell(sw.pcie))  # not judged
    return table


# ---------------------------------------------------------------- lists under the tables


_Item = tuple[Text, Text]  # (lead: symbol or place, body); the body wraps under itself


def _problems(report: AuditReport) -> list[_Item]:
    """What the tables only mark: the audit's warning and critical findings, most severe first
    (within a severity, the audit's own order: node, GPU by GPU, then IB)."""
    items = []
    for f in sorted(report.findings, key=lambda f: Severity.rank_of(f.severity)):
        if f.severity != Severity.INFO:
            symbol, style = _mark(f.severity)
            items.append((Text(symbol, style=style),
                          literal(f.message)))
    return items


def _notes(sample: Sample, report: AuditReport) -> list[_Item]:
    """The collector's notes, less those that repeat a problem above (its first clause, e.g.
    'NVML unavailable: …'): each thing is said once."""
    said = {f.message.split(";", 1)[0] for f in report.findings if f.severity != Severity.INFO}

    def item(where: str, note: str) -> _Item:
        return Text(f"{where}:", style="dim"), literal(note)

    notes = ([("node", n) for n in sample.notes]
             + [(f"GPU {g.index}", n) for g in sample.gpus for n in g.notes]
             + [(port_name(p.device, p.port), n) for p in sample.ib for n in p.notes])
    return [item(where, n) for where, n in notes if n.split(";", 1)[0] not in said]


def _capped_list(title: str, items: list[_Item], cap: int | None = MAX_LIST_LINES) -> RenderableType | None:
    """A titled list of at most `cap` items (None: all), then '… and N more'; bodies wrap under themselves."""
    if not items:
        return None
    grid = Table.grid(padding=(0, 0, 0, 1))
    grid.add_column(no_wrap=True)  # two-space indent, then the lead
    grid.add_column()
    for lead, body in items[:cap]:
        grid.add_row(Text("  ") + lead, body)
    if cap is not None and len(items) > cap:
        grid.add_row("", Text(f"… and {len(items) - cap} more", style="dim"))
    return Group(_title(title), grid)


# ---------------------------------------------------------------- the sample view


_BOARD_SHORT = {
    "nvswitch": "all-to-all NVSwitch", "mesh": "all-to-all direct NVLink", "pairs": "NVLink pairs",
    "partial": "partial NVLink", "none": "no NVLink", "unknown": "unknown",
}


def _header(sample: Sample, report: AuditReport) -> Text:
    when = datetime.fromtimestamp(sample.ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = Text()
    text.append(plain(sample.node), style="bold")
    text.append(f"  {when}  interval {sample.interval_s:.2f} s\n")
    if sample.nvml.available:
        models = _models(sample)
        n = len(sample.gpus)
        if len(models) == 1:
            text.append(f"{n} × ")
            text.append(plain(models[0]), style="bold")
        else:
            text.append(f"{n} GPU{'' if n == 1 else 's'}")
            if models:  # mixed: the per-row Model column is cut short at 80 columns, so spell them out here
                per_model = [sum(1 for g in sample.gpus if g.name == m) for m in models]
                text.append(" (" + ", ".join(f"{k} × {_short_model(m)}" for k, m in zip(per_model, models)) + ")")
        text.append(f", driver {plain(sample.nvml.driver_version)}")
        board = sample.topology.class_
        text.append(f", board: {_BOARD_SHORT.get(board, plain(board))}")
        domain = fabric_domain(sample)
        if domain.multi_node:  # NVL72-class: the domain's UUID and this node's clique in it
            text.append(f"\nNVLink domain: cluster {plain(domain.cluster_uuid)}, clique {domain.clique_id}")
        elif domain.cluster_uuid is not None:
            text.append(f"\nNVLink domain: this board (cluster UUID zero, clique {domain.clique_id})", style="dim")
    elif any(f.code == "nvml.unavailable" for f in report.findings):  # its reason: under Problems
        text.append(f"{BAD} no GPU data (see Problems); InfiniBand, PCIe and host still sampled", style="bold red")
    else:
        text.append(f"{BAD} NVML unavailable: {plain(sample.nvml.error)}", style="bold red")
    host = sample.host
    if host.kernel or host.cpu_pct is not None:
        nvml = f"  NVML {plain(sample.nvml.nvml_version)}" if sample.nvml.nvml_version else ""
        text.append(f"\nkernel {plain(host.kernel)}{nvml}  CPU {_num(host.cpu_pct)} %"
                    f"  mem {_num(host.mem_used_pct)} %  load {_num(host.load1, '{:.2f}')}", style="dim")
    return text


def render_sample(sample: Sample, report: AuditReport | None = None, *, full: bool = False) -> RenderableType:
    """One tick of one node: header, GPUs, NVLink matrix, IB ports, NVSwitch links, problems, notes.

    Faults are marked as `report` (the audit of this sample; by default with the default spec and
    thresholds) judged them. `full` (output piped, not on a terminal): Problems and Notes whole,
    not cut after MAX_LIST_LINES."""
    report = audit(sample) if report is None else report
    found = _Findings(report)
    parts: list[RenderableType] = [_header(sample, report)]
    if sample.gpus:
        parts += [Text(""), _title("GPUs  (GB/s: tx/rx)"), _gpu_table(sample, found)]
    if sample.topology.matrix:
        parts += [Text(""), _title(f"NVLink topology: {plain(describe_board(sample))}"), _topology_table(sample)]
    if sample.ib:
        parts += [Text(""), _title("InfiniBand / RDMA ports  (GB/s: tx/rx)"), _ib_table(sample, found)]
    if sample.nvswitches:
        parts += [Text(""), _title("NVSwitch PCIe links"), _nvswitch_table(sample)]
    cap = None if full else MAX_LIST_LINES
    for block in (_capped_list("Problems", _problems(report), cap), _capped_list("Notes", _notes(sample, report), cap)):
        if block is not None:
            parts += [Text(""), block]
    return Group(*parts)


# ---------------------------------------------------------------- the audit view


_VERDICT_STYLE = {
    "ok": (OK, "bold green"),
    "warning": (WARN, "bold yellow"),
    "critical": (BAD, "bold red"),
    "unknown": ("?", "bold magenta"),
}
_SEVERITY_STYLE = {"critical": (BAD, "bold red"), "warning": (WARN, "yellow"), "info": (INFO, "dim")}


def _where(f: Finding) -> str:
    if f.gpu is not None:
        return f"GPU {f.gpu}" + (f" link {f.link}" if f.link is not None else "")
    if f.device is not None:
        return plain(f.device) + (f" port {f.port}" if f.port is not None else " HCA")
    return "node"


def render_audit(report: AuditReport, *, full: bool = False) -> RenderableType:
    """'✗ CRITICAL — 1 critical, 2 warning — node', then one finding per line, most severe first.

    Each finding: severity symbol, code, where, message; only the message wraps. `full` (piped):
    code and where are never cut."""
    symbol, style = _VERDICT_STYLE.get(report.verdict, ("?", "bold"))
    counts = {s: sum(1 for f in report.findings if f.severity == s) for s in SEVERITIES}
    line = Text()
    line.append(f"{symbol} {plain(report.verdict).upper()}", style=style)
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no findings"
    line.append(f" — {summary} — ")
    line.append(plain(report.node), style="bold")
    if not report.findings:
        return line
    table = Table.grid(padding=(0, 0, 0, 2), pad_edge=False)
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True, overflow="ellipsis", max_width=None if full else 20)
    table.add_column(no_wrap=True, overflow="ellipsis", max_width=None if full else 16)
    table.add_column()  # the message: the only column that wraps
    # Stable sort: within a severity, the audit's own order (node, then GPU by GPU, then IB).
    for f in sorted(report.findings, key=lambda f: Severity.rank_of(f.severity)):
        sym, sstyle = _SEVERITY_STYLE.get(f.severity, ("?", ""))
        table.add_row(Text(sym, style=sstyle), literal(f.code, sstyle), literal(_where(f)), literal(f.message))
    return Group(line, table)
