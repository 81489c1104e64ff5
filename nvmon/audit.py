"""Judge one `Sample` against the expected spec of its hardware: stable finding codes and a verdict.

This is the single definition of "what is wrong with this node": `nvmon audit` prints the findings
and the alert rules key on the same codes, so a condition is defined once. The rules (codes,
severities, what counts as healthy) are listed in `RULES`; each fault is reported on its own GPU,
link or port, and a finding is unique per (code, gpu, link, device, port, xid), so that tuple can
be an alert's identity.

Two hardware facts shape the rules:
- GPUs lower their PCIe generation when idle to save power, so a low gen is judged only under load;
  a low width, or a slot that cannot reach the spec's gen, is judged always.
- Counters are never judged by their absolute value (they accumulate since boot), only their rise
  over the interval (`*_delta`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields
from typing import Any

from nvmon import xid as xids
from nvmon.codes import NODE_CODES, Severity
from nvmon.model import GpuSample, IbPortSample, Sample, Topology, to_jsonable
from nvmon.specs import IB_RATE_NAMES, GpuSpec, NodeSpec, gpu_spec_for

AUDIT_SCHEMA = 1  # version of the `nvmon audit --json` contract
EXIT_CODES = {"ok": 0, "warning": 1, "critical": 2, "unknown": 3}  # Nagios plugin convention

# Throttle (clocks event) reason names as the collector spells them.
POWER_THROTTLES = ("sw_power_cap", "hw_power_brake")
THERMAL_THROTTLES = ("sw_thermal", "hw_thermal", "hw_slowdown")

RULES: dict[str, Severity] = {code: c.severity for code, c in NODE_CODES.items()}  # the stable set


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Tunable limits. Ratios are fractions of the spec (or enforced limit) value."""

    busy_util_pct: float = 10.0
    busy_pcie_bytes_per_s: float = 1e9  # PCIe tx+rx
    busy_nvlink_bytes_per_s: float = 1e9  # NVLink tx+rx summed over links
    temperature_c: float = 87.0
    power_limit_ratio: float = 0.95  # enforced limit below this share of spec → power.limit
    power_cap_ratio: float = 0.98  # draw at this share of the enforced limit → power.cap
    nvlink_speed_ratio: float = 0.98  # link speed below this share of spec → nvlink.speed


@dataclass(frozen=True, slots=True)
class Finding:
    """One judged condition. `observed`/`expected` are compact values for machines and people."""

    code: str
    severity: str  # "info" | "warning" | "critical"
    message: str
    gpu: int | None = None
    link: int | None = None
    device: str | None = None  # IB device, e.g. "mlx5_0"
    port: int | None = None
    observed: Any = None
    expected: Any = None
    xid: int | None = None  # gpu.xid: the Xid number (also in `observed`), part of the identity


@dataclass(frozen=True, slots=True)
class AuditReport:
    node: str
    spec: dict[str, Any]  # the profile used: per-model spec values, node expectations
    verdict: str  # "ok" | "warning" | "critical" | "unknown"
    findings: tuple[Finding, ...]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


def _finding(code: str, message: str, **where: Any) -> Finding:
    return Finding(code=code, severity=RULES[code], message=message, **where)


def _sum(*values: float | None) -> float:
    return sum(v for v in values if v is not None)


def nvlink_bytes_per_s(gpu: GpuSample) -> float:
    """NVLink tx+rx of a GPU summed over its links (unknown rates count as 0)."""
    return sum(_sum(link.tx_bytes_per_s, link.rx_bytes_per_s) for link in gpu.nvlink)


def is_busy(gpu: GpuSample, thresholds: Thresholds = Thresholds()) -> bool:
    """True when the GPU is doing work, so idle power-saving (PCIe gen downshift) is not an excuse."""
    return (
        (gpu.utilization_pct is not None and gpu.utilization_pct >= thresholds.busy_util_pct)
        or _sum(gpu.pcie.tx_bytes_per_s, gpu.pcie.rx_bytes_per_s) >= thresholds.busy_pcie_bytes_per_s
        or nvlink_bytes_per_s(gpu) >= thresholds.busy_nvlink_bytes_per_s
    )


def _rising(deltas: dict[str, int | None]) -> dict[str, int]:
    return {k: v for k, v in deltas.items() if v is not None and v > 0}


def _fmt_w(w: float | None) -> str:
    return "? W" if w is None else f"{w:.0f} W"


def _fmt_rate(gbps: float | None) -> str:
    if gbps is None:
        return "unknown rate"
    name = IB_RATE_NAMES.get(float(gbps))
    return f"{gbps:g} Gb/s" + (f" ({name})" if name else "")


# ---------------------------------------------------------------- GPUs


def _check_xid(gpu: GpuSample) -> list[Finding]:
    """One finding per Xid number delivered this tick (an event, not a state: the alert rule holds it)."""
    counts: dict[int, int] = {}
    for x in gpu.xid_events:
        counts[x] = counts.get(x, 0) + 1
    return [Finding(code="gpu.xid", severity=xids.severity(x),
                    message=f"GPU {gpu.index} Xid {x}, {xids.meaning(x)} (+{n}): {xids.action(x)}",
                    gpu=gpu.index, observed={"xid": x, "events": n}, xid=x)
            for x, n in counts.items()]


def _check_nvlink(gpu: GpuSample, spec: GpuSpec, t: Thresholds) -> list[Finding]:
    out: list[Finding] = []
    i = gpu.index
    if spec.nvlink_links and (gpu.nvlink or gpu.nvlink_count is not None):
        slots = gpu.nvlink_count if gpu.nvlink_count is not None else len(gpu.nvlink)
        if slots == spec.nvlink_links:
            for link in gpu.nvlink:
                if link.active is False:
                    out.append(_finding(
                        "nvlink.link_down",
                        f"GPU {i} NVLink {link.link} down: " + (
                            "reseat the NVLink bridge and both cards" if link.remote_type == "gpu" or spec.board == "pairs"
                            else "reseat the GPU/baseboard, check NVSwitch and fabric manager"),
                        gpu=i, link=link.link, observed="down", expected="active"))
        else:
            # More slots than the SKU uses (bridged PCIe cards: 12 of 18) or fewer than expected:
            # only the number of usable links can be judged, not which ones. Unreadable ones get
            # the benefit of the doubt.
            active = sum(1 for link in gpu.nvlink if link.active is True)
            unreadable = sum(1 for link in gpu.nvlink if link.active is None)
            if active + unreadable < spec.nvlink_links:
                out.append(_finding(
                    "nvlink.link_down",
                    f"GPU {i} NVLink {active}/{spec.nvlink_links} links active ({slots} slots): "
                    "check NVLink bridges or baseboard",
                    gpu=i, observed=f"{active}/{spec.nvlink_links} active",
                    expected=f"{spec.nvlink_links}/{spec.nvlink_links} active"))
    for link in gpu.nvlink:
        if link.active is True:
            slow_version = (spec.nvlink_version is not None and link.version is not None
                            and link.version < spec.nvlink_version)
            slow_speed = (spec.nvlink_link_mbps is not None and link.speed_mbps is not None
                          and link.speed_mbps < t.nvlink_speed_ratio * spec.nvlink_link_mbps)
            if slow_version or slow_speed:
                seen = f"NVLink{link.version if link.version is not None else '?'} {link.speed_mbps or '?'} MB/s"
                want = f"NVLink{spec.nvlink_version or '?'} {spec.nvlink_link_mbps or '?'} MB/s"
                out.append(_finding(
                    "nvlink.speed", f"GPU {i} NVLink {link.link} at {seen}, {spec.key} expects {want}",
                    gpu=i, link=link.link,
                    observed={"version": link.version, "speed_mbps": link.speed_mbps},
                    expected={"version": spec.nvlink_version, "speed_mbps": spec.nvlink_link_mbps}))
    return out


def _check_nvlink_errors(gpu: GpuSample) -> list[Finding]:
    out = []
    for link in gpu.nvlink:
        if not any(link.errors_delta.values()):  # the rule: nothing rose (values are None or ≥ 0)
            continue
        rising = _rising(link.errors_delta)
        if rising:
            what = ", ".join(f"{k} +{v}" for k, v in rising.items())
            out.append(_finding(
                "nvlink.errors", f"GPU {gpu.index} NVLink {link.link} errors rising: {what}",
                gpu=gpu.index, link=link.link, observed=dict(link.errors_delta), expected=0))
    return out


def _check_pcie(gpu: GpuSample, spec: GpuSpec | None, busy: bool) -> list[Finding]:
    out = []
    i, p = gpu.index, gpu.pcie
    spec_name = spec.key if spec is not None else "the spec"
    # Width: a live link narrower than the slot allows, or a slot narrower than the SKU needs.
    downtrained = p.width is not None and p.max_width is not None and p.width < p.max_width
    narrow_slot = spec is not None and p.max_width is not None and p.max_width < spec.pcie_width
    if downtrained or narrow_slot:
        want = max(p.max_width or 0, spec.pcie_width if spec else 0)
        have = p.width if p.width is not None else p.max_width
        hint = ("reseat the card or riser, check BIOS bifurcation" if downtrained
                else f"the slot allows only x{p.max_width}, check slot choice, riser and BIOS bifurcation")
        out.append(_finding("pcie.width", f"GPU {i} PCIe x{have}, expected x{want}: {hint}",
                            gpu=i, observed=f"x{have}", expected=f"x{want}"))
    # Gen: a low current gen only matters under load; a low max gen (host limits the GPU) always.
    slow_now = busy and p.gen is not None and p.max_gen is not None and p.gen < p.max_gen
    slow_slot = spec is not None and p.max_gen is not None and p.max_gen < spec.pcie_gen
    if slow_now or slow_slot:
        want = max(p.max_gen or 0, spec.pcie_gen if spec else 0)
        if slow_now:
            also = f" ({spec_name} expects Gen{want})" if slow_slot else ""
            msg = (f"GPU {i} PCIe Gen{p.gen} under load, link allows Gen{p.max_gen}{also}: "
                   "check riser/retimer signal integrity and BIOS PCIe speed")
            have = p.gen
        else:
            msg = (f"GPU {i} PCIe limited to Gen{p.max_gen}, {spec_name} expects Gen{want}: "
                   "host, slot or BIOS setting limits the link")
            have = p.max_gen
        out.append(_finding("pcie.gen", msg, gpu=i, observed=f"Gen{have}", expected=f"Gen{want}"))
    if p.replay_errors_delta is not None and p.replay_errors_delta > 0:
        out.append(_finding(
            "pcie.replay", f"GPU {i} PCIe replays rising (+{p.replay_errors_delta}): signal integrity, check riser/slot",
            gpu=i, observed=p.replay_errors_delta, expected=0))
    return out


def _check_power_thermal(gpu: GpuSample, spec: GpuSpec | None, busy: bool, t: Thresholds) -> list[Finding]:
    out = []
    i = gpu.index
    ref = spec.power_limit_w if spec is not None else gpu.power_default_limit_w
    if gpu.power_limit_w is not None and ref and gpu.power_limit_w < t.power_limit_ratio * ref:
        what = "spec" if spec is not None else "default"
        out.append(_finding(
            "power.limit",
            f"GPU {i} power limit {_fmt_w(gpu.power_limit_w)}, {what} {_fmt_w(ref)}: "
            "check nvidia-smi -pl settings and the PSU/rack power budget",
            gpu=i, observed=round(gpu.power_limit_w, 1), expected=round(ref, 1)))
    capped_by = [r for r in POWER_THROTTLES if r in (gpu.throttle_reasons or ())] if busy else []
    at_limit = (gpu.power_w is not None and gpu.power_limit_w
                and gpu.power_w >= t.power_cap_ratio * gpu.power_limit_w)
    if capped_by or at_limit:
        why = ", ".join(capped_by) if capped_by else "drawing at the limit"
        out.append(_finding(
            "power.cap",
            f"GPU {i} power-capped ({why}) at {_fmt_w(gpu.power_w)} of {_fmt_w(gpu.power_limit_w)}",
            gpu=i, observed={"power_w": gpu.power_w, "throttle": list(capped_by)},
            expected={"power_limit_w": gpu.power_limit_w}))
    hot_by = [r for r in THERMAL_THROTTLES if r in (gpu.throttle_reasons or ())]
    too_hot = gpu.temperature_c is not None and gpu.temperature_c >= t.temperature_c
    if hot_by or too_hot:
        temp = f"{gpu.temperature_c:.0f} °C" if gpu.temperature_c is not None else "? °C"
        what = f"slowing down ({', '.join(hot_by)}) at {temp}" if hot_by else f"at {temp}"
        out.append(_finding(
            "thermal",
            f"GPU {i} {what}, limit {t.temperature_c:.0f} °C: check airflow, fans and inlet temperature",
            gpu=i, observed={"temperature_c": gpu.temperature_c, "throttle": hot_by},
            expected={"temperature_c_below": t.temperature_c}))
    return out


# ---------------------------------------------------------------- topology

_NV = re.compile(r"NV(\d+)$")


def _nv_count(cell: str) -> int:
    m = _NV.match(cell)
    return int(m.group(1)) if m else 0


def describe_board(sample: Sample) -> str:
    """The board's NVLink topology class in words, e.g. for `nvlink.board`."""
    return _describe_topology(sample.topology)


@functools.lru_cache(maxsize=32)  # the alert rules ask every tick; a node's topology rarely changes
def _describe_topology(topo: Topology) -> str:
    cls = topo.class_
    pairs = [(i, j, _nv_count(row[j])) for i, row in enumerate(topo.matrix)
             for j in range(i + 1, len(row)) if _nv_count(row[j])]
    counts = sorted({n for _, _, n in pairs})
    nv = "/".join(f"NV{n}" for n in counts) or "NV?"
    if cls == "nvswitch":
        return f"all-to-all through NVSwitch, {nv} between every GPU pair"
    if cls == "mesh":
        return f"all-to-all over direct NVLinks, {nv} between every GPU pair"
    if cls == "pairs":
        listed = ", ".join(f"{i}-{j}" for i, j, _ in pairs)
        return f"GPUs bridged in pairs {listed} ({nv}); other pairs talk over PCIe"
    if cls == "partial":
        listed = ", ".join(f"{i}-{j}" for i, j, _ in pairs) or "none"
        return f"NVLink between some GPU pairs only ({listed}); the rest talk over PCIe"
    if cls == "none":
        return "no active NVLink between GPUs; all GPU-to-GPU traffic goes over PCIe"
    return f"NVLink topology could not be determined ({cls})"


def _expected_board(gpus: list[GpuSample], node_spec: NodeSpec) -> str | None:
    if node_spec.topology:
        return node_spec.topology
    boards = {spec.board for g in gpus if (spec := gpu_spec_for(g.name)) is not None}
    unknown = any(gpu_spec_for(g.name) is None for g in gpus)
    # Mixed or unknown models: no single expectation to hold the board to.
    return boards.pop() if len(boards) == 1 and not unknown else None


def _check_topology(sample: Sample, node_spec: NodeSpec) -> list[Finding]:
    if len(sample.gpus) < 2:
        return []
    observed = sample.topology.class_
    out = [_finding("nvlink.board", f"NVLink board: {describe_board(sample)}", observed=observed)]
    expected = _expected_board([g for g in sample.gpus if not g.lost], node_spec)
    if expected and observed != "unknown" and not _board_matches(observed, expected, len(sample.gpus)):
        out.append(_finding(
            "nvlink.topology",
            f"NVLink topology '{observed}' ({describe_board(sample)}), expected '{expected}' "
            f"({_BOARD_WORDS.get(expected, expected)}): the board is not what its spec says",
            observed=observed, expected=expected))
    elif observed in SPLIT_BOARDS and len(sample.gpus) >= SPLIT_MIN_GPUS and node_spec.topology != observed:
        # The seed's first pitfall, the "fake 8-card NVLink" box: pairs of bridged cards may be
        # what the model's spec allows, but nobody buys eight GPUs for that without saying so.
        out.append(Finding(
            code="nvlink.topology", severity=Severity.WARNING,
            message=f"{len(sample.gpus)} GPUs, {describe_board(sample)}: not all-to-all, tensor-parallel "
                    "traffic between pairs goes over PCIe; if this is the board you bought, say so with "
                    f"--expect-topology {observed} ([expect] topology)",
            observed=observed, expected="all-to-all"))
    return out


SPLIT_BOARDS = ("pairs", "partial")  # boards whose GPUs are not all NVLink-connected
SPLIT_MIN_GPUS = 4  # from here on, a split board is a finding of its own (2 bridged GPUs are a mesh)
_BOARD_WORDS = {"nvswitch": "all-to-all through NVSwitch", "mesh": "all-to-all over direct NVLinks",
                "pairs": "GPUs bridged in pairs", "none": "no NVLink"}


def _board_matches(observed: str, expected: str, n_gpus: int) -> bool:
    if observed == expected:
        return True
    # Small boards wire GPUs directly instead of through NVSwitch (HGX 4-GPU), and two bridged
    # GPUs are both a pair and a full mesh: all-to-all is what the expectation asks for there.
    return observed == "mesh" and (
        (expected == "nvswitch" and n_gpus <= 4) or (expected == "pairs" and n_gpus == 2))


# ---------------------------------------------------------------- InfiniBand


def _is_down(port: IbPortSample) -> bool:
    # Unreadable state (None) is not evidence of a down port.
    return ((port.state is not None and port.state.upper() != "ACTIVE")
            or (port.phys_state is not None and port.phys_state.lower() != "linkup"))


def _is_active(port: IbPortSample) -> bool:
    return port.state is not None and port.state.upper() == "ACTIVE" and not _is_down(port)


def _is_ethernet(port: IbPortSample) -> bool:
    return (port.link_layer or "").lower() == "ethernet"


def _check_ib(ports: tuple[IbPortSample, ...], node_spec: NodeSpec, t: Thresholds = Thresholds()) -> list[Finding]:
    out: list[Finding] = []
    active = [p for p in ports if _is_active(p)]
    # Without an expected rate, compare with the fastest active port of the same link layer:
    # a 100G Ethernet front-end NIC beside 400G IB compute ports is not a downgrade.
    fastest: dict[bool, float] = {}
    for p in active:
        if p.rate_gbps is not None:
            eth = _is_ethernet(p)
            fastest[eth] = max(fastest.get(eth, 0.0), p.rate_gbps)
    for p in ports:
        where = {"device": p.device, "port": p.port}
        name = f"{p.device} port {p.port}"
        if _is_down(p):
            out.append(_finding(
                "ib.port_down",
                f"{name} {p.state or '?'}/{p.phys_state or '?'}: check cable, transceiver and switch port",
                observed={"state": p.state, "phys_state": p.phys_state},
                expected={"state": "ACTIVE", "phys_state": "LinkUp"}, **where))
        problems = []
        want = node_spec.ib_rate_gbps if node_spec.ib_rate_gbps else fastest.get(_is_ethernet(p))
        if _is_active(p) and want and p.rate_gbps is not None and p.rate_gbps < want:
            problems.append(f"at {_fmt_rate(p.rate_gbps)}, expected {_fmt_rate(want)}")
        if node_spec.ib_ports and _is_ethernet(p):
            problems.append("Ethernet (RoCE), expected InfiniBand")
        if problems:
            out.append(_finding(
                "ib.rate", f"{name} " + "; ".join(problems),
                observed={"rate_gbps": p.rate_gbps, "link_layer": p.link_layer},
                expected={"rate_gbps": want, "link_layer": "InfiniBand" if node_spec.ib_ports else None},
                **where))
        rising = _rising(p.errors_delta)
        if rising:
            what = ", ".join(f"{k} +{v}" for k, v in rising.items())
            out.append(_finding("ib.errors", f"{name} errors rising: {what}",
                                observed=dict(p.errors_delta), expected=0, **where))
    out += _check_hca_pcie(ports, t)
    if node_spec.ib_ports and (len(ports) < node_spec.ib_ports or len(active) < node_spec.ib_ports):
        out.append(_finding(
            "ib.count",
            f"{len(ports)} IB ports present, {len(active)} active, expected {node_spec.ib_ports}",
            observed={"present": len(ports), "active": len(active)}, expected=node_spec.ib_ports))
    return out


def _check_hca_pcie(ports: tuple[IbPortSample, ...], t: Thresholds) -> list[Finding]:
    """One finding per HCA (a dual-port HCA has one PCIe link) whose link trained below its
    maximum: a narrower width always (HDR/NDR need the full x16 to reach line rate), a lower gen
    only while its ports carry traffic (PCIe power management may lower it at idle, as on a GPU)."""
    by_hca: dict[str, list[IbPortSample]] = {}
    for port in ports:
        by_hca.setdefault(port.device, []).append(port)
    out: list[Finding] = []
    for device, feeds in by_hca.items():
        p, bdf = feeds[0].pcie, feeds[0].pci_bus_id
        name = f"{device} HCA" + (f" ({bdf})" if bdf else "")
        fed = ", ".join(f"port {q.port}" for q in feeds)
        if p.width is not None and p.max_width is not None and p.width < p.max_width:
            out.append(_finding(
                "pcie.width", f"{name} PCIe x{p.width}, expected x{p.max_width}: {fed} cannot reach line rate; "
                "reseat the HCA or riser, check BIOS bifurcation",
                device=device, observed=f"x{p.width}", expected=f"x{p.max_width}"))
        busy = sum(_sum(q.tx_bytes_per_s, q.rx_bytes_per_s) for q in feeds) >= t.busy_pcie_bytes_per_s
        if busy and p.gen is not None and p.max_gen is not None and p.gen < p.max_gen:
            out.append(_finding(
                "pcie.gen", f"{name} PCIe Gen{p.gen} under load, link allows Gen{p.max_gen} ({fed}): "
                "check riser/retimer signal integrity and BIOS PCIe speed",
                device=device, observed=f"Gen{p.gen}", expected=f"Gen{p.max_gen}"))
    return out


# ---------------------------------------------------------------- the audit


def _spec_profile(sample: Sample, node_spec: NodeSpec, thresholds: Thresholds) -> dict[str, Any]:
    models: dict[str, Any] = {}
    for g in sample.gpus:
        if g.lost:
            continue
        spec = gpu_spec_for(g.name)
        models[g.name or "?"] = "unknown" if spec is None else {
            "key": spec.key, "nvlink_links": spec.nvlink_links, "nvlink_version": spec.nvlink_version,
            "nvlink_link_mbps": spec.nvlink_link_mbps, "power_limit_w": spec.power_limit_w,
            "pcie_gen": spec.pcie_gen, "pcie_width": spec.pcie_width, "board": spec.board,
            "source": spec.source,
        }
    return {
        "models": models,
        "node": {"gpus": node_spec.gpus, "ib_ports": node_spec.ib_ports,
                 "ib_rate_gbps": node_spec.ib_rate_gbps, "topology": node_spec.topology},
        "expected_topology": _expected_board([g for g in sample.gpus if not g.lost], node_spec),
        "thresholds": {f.name: getattr(thresholds, f.name) for f in fields(thresholds)},
    }


def audit(sample: Sample, node_spec: NodeSpec = NodeSpec(), thresholds: Thresholds = Thresholds()) -> AuditReport:
    """Judge `sample` against its GPUs' specs and `node_spec`; see `RULES` and the module docstring."""
    findings: list[Finding] = []
    judged = False  # did at least one GPU have a spec to be held to?
    if not sample.nvml.available:
        findings.append(_finding("nvml.unavailable",
                                 f"NVML unavailable: {sample.nvml.error or 'unknown error'}; GPUs not judged",
                                 observed=sample.nvml.error))
    else:
        if node_spec.gpus is not None and len(sample.gpus) < node_spec.gpus:
            findings.append(_finding(
                "gpu.count", f"{len(sample.gpus)} GPUs present, expected {node_spec.gpus}: "
                "check seating, power cables and dmesg for fallen-off-the-bus",
                observed=len(sample.gpus), expected=node_spec.gpus))
        unknown_names: dict[str, list[int]] = {}
        for gpu in sample.gpus:
            if gpu.xid_events:  # before the lost check: Xid 79 arrives as the GPU goes lost
                findings += _check_xid(gpu)
            if gpu.lost:
                findings.append(_finding(
                    "gpu.lost", f"GPU {gpu.index} lost (fell off the bus): check dmesg for Xid 79, reset or reboot",
                    gpu=gpu.index, observed="lost", expected="present"))
                continue
            spec = gpu_spec_for(gpu.name)
            busy = is_busy(gpu, thresholds)
            if spec is None:
                unknown_names.setdefault(gpu.name or "?", []).append(gpu.index)
            else:
                judged = True
                findings += _check_nvlink(gpu, spec, thresholds)
            findings += _check_nvlink_errors(gpu)
            findings += _check_pcie(gpu, spec, busy)
            findings += _check_power_thermal(gpu, spec, busy, thresholds)
        for name, idxs in unknown_names.items():
            findings.append(_finding(
                "gpu.model", f"GPU model {name!r} (GPU {', '.join(map(str, idxs))}) has no spec: "
                "NVLink, PCIe and power are judged only by generic rules",
                observed=name, expected="known model"))
        findings += _check_topology(sample, node_spec)
    findings += _check_ib(sample.ib, node_spec, thresholds)
    return AuditReport(sample.node, _spec_profile(sample, node_spec, thresholds), _verdict(findings, sample, judged),
                       tuple(findings))


class Judge:
    """The audit of one node (its spec, its thresholds), run once per sample.

    The daemon hands every tick to its alert rules, its Prometheus page and the wire's per-tick
    findings; all three ask the same `Judge`, which audits each sample once (it remembers the
    last one it saw, by identity: a `Sample` is immutable) and gives them the same report.
    """

    __slots__ = ("node_spec", "thresholds", "_last")

    def __init__(self, node_spec: NodeSpec = NodeSpec(), thresholds: Thresholds = Thresholds()) -> None:
        self.node_spec = node_spec
        self.thresholds = thresholds
        self._last: tuple[Sample, AuditReport] | None = None

    def __call__(self, sample: Sample) -> AuditReport:
        last = self._last  # one read: the exporter's HTTP thread may ask at the same time
        if last is not None and last[0] is sample:
            return last[1]
        report = audit(sample, self.node_spec, self.thresholds)
        self._last = (sample, report)
        return report


def _verdict(findings: list[Finding], sample: Sample, judged: bool) -> str:
    severities = {f.severity for f in findings}
    if "critical" in severities:
        return "critical"
    if not sample.nvml.available:
        return "unknown"
    if "warning" in severities:
        return "warning"
    return "ok" if judged else "unknown"


def finding_to_dict(f: Finding) -> dict[str, Any]:
    """A finding in the `nvmon audit --json` contract's key order."""
    return {"code": f.code, "severity": f.severity, "gpu": f.gpu, "link": f.link, "device": f.device,
            "port": f.port, "observed": to_jsonable(f.observed), "expected": to_jsonable(f.expected),
            "message": f.message}


def report_to_dict(report: AuditReport) -> dict[str, Any]:
    """The JSON contract of `nvmon audit --json` (schema 1)."""
    return {"schema": AUDIT_SCHEMA, "node": report.node, "spec": to_jsonable(report.spec),
            "verdict": report.verdict, "findings": [finding_to_dict(f) for f in report.findings]}
