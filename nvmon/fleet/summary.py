"""One node's fleet-row summary, derived from its latest `Tick` and its `Inventory` (pure).

The fleet table shows one row per node: what model, how busy its NVLink is against the model's
spec, whether links, PCIe, IB or power fall short, how hot it runs and whether error counters
climb. It is computed once per received tick, so a view only formats; what depends on the
inventory alone (specs, expected counts, limits) is worked out once per inventory (`Facts`).

Units follow the wire: bytes/s and watts (views print GB/s and kW). Nothing here judges: what is
degraded, capped or hot is what the node's own audit found this tick (the sample's findings,
`Tick.findings`), so the fleet row, `nvmon audit` and the node's alerts always agree. `marks`
gives each column the worst severity of the findings it shows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from nvmon.codes import Severity
from nvmon.specs import GpuSpec, gpu_spec_for
from nvmon.wire.contract import Inventory, Tick, TickFinding

# The fleet-table column that shows a finding code (an HCA's PCIe link is shown with IB).
COLUMN_OF: dict[str, str] = {
    "nvlink.link_down": "links", "nvlink.topology": "links", "nvlink.speed": "links", "nvlink.errors": "links",
    "fabric.not_ready": "links", "fabric.status": "links", "fabric.health": "links",  # NVLink unusable / degraded
    "pcie.width": "pcie", "pcie.gen": "pcie", "pcie.replay": "pcie",
    "ib.port_down": "ib", "ib.rate": "ib", "ib.errors": "ib", "ib.count": "ib",
    "power.limit": "power", "power.cap": "power", "power.brake": "power", "thermal": "temp",
    "gpu.lost": "gpus", "gpu.count": "gpus", "gpu.xid": "gpus", "nvml.unavailable": "gpus",
}


@dataclass(frozen=True, slots=True)
class Summary:
    """A fleet row. `None`: not known (no inventory yet, unknown model, unreadable value)."""

    gpu_model: str | None  # the most common model name, as NVML reports it (wire text: display literally)
    gpu_count: int
    gpus_lost: int
    nvlink_bytes_per_s: float | None  # TX + RX summed over every GPU and link
    nvlink_pct: float | None  # of the models' spec: links × link speed × 2 directions × GPUs
    links_active: int
    links_expected: int | None  # per the model's spec (a bridged H100 PCIe expects 12 of 18)
    links_down: int  # shortfall against the spec; without one, the links reported inactive
    pcie_worst: str | None  # e.g. "Gen4 x8 on GPU 2" when degraded, else the lowest link, "Gen5 x16"
    pcie_degraded: bool  # the node's audit found a GPU's PCIe link short (pcie.width / pcie.gen)
    ib_up: int  # InfiniBand ports ACTIVE / LinkUp (Ethernet-mode ports are counted apart)
    ib_expected: int | None  # the node's expected spec, else the ports its inventory lists
    ib_ethernet: int
    ib_min_rate_gbps: float | None  # slowest port that is up
    power_w: float | None  # GPU power draw summed
    power_limit_w: float | None  # enforced limits summed
    power_capped: int  # GPUs with a power.limit, power.cap or power.brake finding
    hottest_c: float | None
    hottest_gpu: int | None
    errors_rising: int  # error counters (NVLink, PCIe replay, IB) that rose over this tick
    ib_bytes_per_s: float | None  # TX + RX over all ports
    marks: dict[str, str]  # column (COLUMN_OF) → the worst severity of its findings; absent: none


@lru_cache(maxsize=256)  # a handful of models in a fleet; bounded because names come off the wire
def _spec(model: str | None) -> GpuSpec | None:
    return gpu_spec_for(model)


@dataclass(frozen=True, slots=True)
class GpuFacts:
    spec: GpuSpec | None  # for the expected link count and the NVLink % of spec (display, not verdicts)


@dataclass(frozen=True, slots=True)
class Facts:
    """What an inventory says about every tick of its layout, worked out once."""

    model: str | None
    gpus: dict[int, GpuFacts]
    fallback: GpuFacts  # for a GPU the inventory does not list
    ethernet_ports: frozenset[int]
    ib_expected: int

    @staticmethod
    def of(inventory: Inventory) -> Facts:
        models = Counter(g.model for g in inventory.gpus if g.model).most_common(1)
        common = models[0][0] if models else None
        # A GPU without a model name (lost before the inventory was built) is held to the node's
        # most common model: its slot was built for one, so its links count as missing, not unknown.
        fallback_spec = _spec(common)
        gpus = {}
        for g in inventory.gpus:
            gpus[g.index] = GpuFacts(spec=_spec(g.model or common))
        fallback = GpuFacts(fallback_spec)
        node = inventory.spec.get("node") if isinstance(inventory.spec, dict) else None
        want = node.get("ib_ports") if isinstance(node, dict) else None
        return Facts(
            model=common, gpus=gpus, fallback=fallback,
            ethernet_ports=frozenset(i for i, p in enumerate(inventory.ib)
                                     if (p.link_layer or "").lower() == "ethernet"),
            ib_expected=want if isinstance(want, int) and not isinstance(want, bool) else len(inventory.ib))


NO_FACTS = GpuFacts(None)


def summarize(tick: Tick, facts: Facts | None) -> Summary:
    """The fleet row for `tick`. Pass the facts of an inventory only when its layout matches the
    tick's: with another layout, GPU indices and IB port positions may name different devices."""
    known = facts.gpus if facts is not None else {}
    fallback = facts.fallback if facts is not None else NO_FACTS
    active = down_raw = shortfall = lost = errors = 0
    expected: int | None = 0 if tick.gpus and facts is not None else None  # no GPUs: nothing to hold them to
    spec_bytes: float | None = 0.0 if facts is not None else None
    nvlink = power = limit = None
    hottest: tuple = (None, None)
    lowest: tuple | None = None  # PCIe: (width, gen, index) of the narrowest, then slowest link
    for g in tick.gpus:
        f = known.get(g.index, fallback)
        spec = f.spec
        up = 0 if g.lost else len(g.link_tx_pct) - len(g.links_down) - len(g.links_unknown)
        active += up
        down_raw += len(g.links_down)
        if spec is None:
            expected = spec_bytes = None  # one GPU without a spec makes the node's totals unknown
        else:
            if expected is not None:
                expected += spec.nvlink_links
                shortfall += max(0, spec.nvlink_links - up)
            if spec_bytes is not None and spec.nvlink_link_mbps:
                spec_bytes += spec.nvlink_links * spec.nvlink_link_mbps * 2e6  # both directions
        for v in (g.nvlink_tx_bytes_per_s, g.nvlink_rx_bytes_per_s):
            if v is not None:
                nvlink = v + (nvlink or 0.0)
        if g.power_w is not None:
            power = g.power_w + (power or 0.0)
        if g.power_limit_w is not None:
            limit = g.power_limit_w + (limit or 0.0)
        if g.temperature_c is not None and (hottest[0] is None or g.temperature_c > hottest[0]):
            hottest = (g.temperature_c, g.index)
        lost += g.lost
        errors += sum(len(kinds) for kinds in g.link_errors.values()) + (g.pcie_replay_delta > 0)
        if not g.lost and g.pcie_width is not None and g.pcie_gen is not None:
            key = (g.pcie_width, g.pcie_gen, g.index)
            if lowest is None or key < lowest:
                lowest = key

    ib_up = ib_eth = 0
    rate = ib_bytes = None
    eth = facts.ethernet_ports if facts is not None else frozenset()
    for p in tick.ib:
        errors += len(p.errors_delta)
        for v in (p.tx_bytes_per_s, p.rx_bytes_per_s):
            if v is not None:
                ib_bytes = v + (ib_bytes or 0.0)
        if (p.state or "").upper() != "ACTIVE" or (p.phys_state or "LinkUp").lower() != "linkup":
            continue
        if p.index in eth:
            ib_eth += 1
        else:
            ib_up += 1
            if p.rate_gbps is not None and (rate is None or p.rate_gbps < rate):
                rate = p.rate_gbps

    marks, capped_gpus, short_pcie = _marks(tick.findings)
    pcie = None if lowest is None else f"Gen{lowest[1]} x{lowest[0]}"
    degraded = bool(short_pcie)
    if degraded:  # the link the audit named (most severe first), as it is now
        g = next((g for g in tick.gpus if g.index == short_pcie[0]), None)
        if g is not None and g.pcie_gen is not None and g.pcie_width is not None:
            pcie = f"Gen{g.pcie_gen} x{g.pcie_width} on GPU {g.index}"
    return Summary(
        gpu_model=facts.model if facts is not None else None, gpu_count=len(tick.gpus), gpus_lost=lost,
        nvlink_bytes_per_s=nvlink, nvlink_pct=None if not spec_bytes or nvlink is None else 100.0 * nvlink / spec_bytes,
        links_active=active, links_expected=expected, links_down=shortfall if expected is not None else down_raw,
        pcie_worst=pcie,
        pcie_degraded=degraded, ib_up=ib_up, ib_expected=facts.ib_expected if facts is not None else None,
        ib_ethernet=ib_eth, ib_min_rate_gbps=rate, power_w=power, power_limit_w=limit, power_capped=capped_gpus,
        hottest_c=hottest[0], hottest_gpu=hottest[1], errors_rising=errors, ib_bytes_per_s=ib_bytes, marks=marks)


_NO_MARKS: dict[str, str] = {}


def _marks(findings: tuple[TickFinding, ...]) -> tuple[dict[str, str], int, list[int]]:
    """(column → worst severity, GPUs with a power finding, GPUs with a short PCIe link, most
    severe first)."""
    if not findings:
        return _NO_MARKS, 0, []
    marks: dict[str, str] = {}
    power: set[int] = set()
    pcie: list[tuple[int, int]] = []
    for f in findings:
        col = "ib" if f.code.startswith("pcie.") and f.gpu is None and f.device is not None else COLUMN_OF.get(f.code)
        if col is not None:
            marks[col] = Severity.worst((f.severity, marks.get(col, f.severity)))
        if f.code in ("power.limit", "power.cap", "power.brake") and f.gpu is not None:
            power.add(f.gpu)
        elif f.code in ("pcie.width", "pcie.gen") and f.gpu is not None:
            pcie.append((Severity.rank_of(f.severity), f.gpu))
    return marks, len(power), [g for _, g in sorted(pcie)]
