"""The demo fleet as data: which node runs which board, what is planted where, and when things happen.

A 16-node fleet over 2 racks (gpu-01..08 in r1, gpu-09..16 in r2): HGX H100 mostly, A100 on
gpu-02 and gpu-10, H200 on gpu-06 and gpu-14, and one of each problem nvmon exists to catch
(DESIGN.md, "Who uses it"):

    node     what                                               how
    gpu-04   "fake 8-card NVLink": PCIe A100s bridged in pairs  profile pairs-a100 (held to HGX A100's spec)
    gpu-07   a GPU trained at PCIe x8                           pcie_width=G:8
    gpu-09   NVLink errors that start mid-run (t+40 s)          nvlink_errors=G.L@40
    gpu-11   an IB port at 100G instead of 400G NDR             ib_rate=P:100
    gpu-13   a node that dies at t+25 s, back 30 s later,       its broker connection is reset (the will
             and again every 3 minutes                          fires) and its daemon stopped
    gpu-15   a power-capped GPU (60 % of its limit)             power_cap=G
    gpu-16   Fabric Manager down: NVLinks Active, NV18, but     fabric=in_progress
             the GPU fabric stuck "In Progress"

With fewer nodes the same problems are folded onto fewer boxes (position × N / 16), so even a
2-node demo shows all of them (but the fabric fault, which needs a board whose fabric NVML reports:
it is left out where the folding puts it on the A100 or the pairs box). The seed picks the GPU, link and port of each fault and each
board's traffic phase; `speed` compresses the timeline (tests run it faster).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from nvmon.sim.fabric import has_fabric
from nvmon.sim.profiles import PROFILES

CLUSTER = "demo"
DEFAULT_NODES = 16
DEFAULT_RACKS = 2
MAX_NODES = 100  # what one process carries here: 100 real daemons online in ~15 s (docs/BENCHMARKS.md)
MAX_RACKS = 50

# Expected hardware per board, as a buyer would write it: the pairs box was sold as an HGX A100
# equivalent, so it is held to that spec (and fails it).
_EXPECT_IB = {"hgx-h100": "8x400", "hgx-h200": "8x400", "hgx-a100": "8x200", "pairs-a100": "8x200"}


@dataclass(frozen=True, slots=True)
class Planted:
    """One planted problem: `at` is its node's position in a 16-node fleet."""

    at: int
    what: str  # in words, with {gpu} {link} {port} {t} {back} filled in
    profile: str | None = None  # the board itself is the problem
    fault: str | None = None  # a `--sim` fault, same placeholders
    dies_at_s: float | None = None
    down_for_s: float = 30.0


PLANTED: tuple[Planted, ...] = (
    Planted(at=3, profile="pairs-a100", what="fake 8-card NVLink: PCIe A100s bridged in pairs, no NVSwitch"),
    Planted(at=6, fault="pcie_width={gpu}:8", what="GPU {gpu} on PCIe x8"),
    Planted(at=8, fault="nvlink_errors={gpu}.{link}@{t}", what="NVLink errors on GPU {gpu} link {link} from t+{t}s"),
    Planted(at=10, fault="ib_rate={port}:100", what="IB port mlx5_{port} at 100G"),
    Planted(at=12, dies_at_s=25.0, down_for_s=30.0, what="dies at t+{t}s (will fires), back at t+{back}s"),
    Planted(at=14, fault="power_cap={gpu}", what="GPU {gpu} power-capped to 60 %"),
    Planted(at=15, fault="fabric=in_progress", what="Fabric Manager down: GPU fabric stuck In Progress"),
)
NVLINK_ERRORS_AT_S = 40.0
DEATH_PERIOD_S = 180.0  # the dying node dies again every 3 minutes, so a long demo keeps showing it


@dataclass(frozen=True, slots=True)
class NodePlan:
    name: str
    rack: str
    sim: str  # the `--sim` spec its daemon runs
    expect_ib: str
    planted: tuple[str, ...] = ()  # what is wrong with it, in words
    dies_at_s: float | None = None  # first death, seconds after the fleet starts
    down_for_s: float = 30.0
    period_s: float = DEATH_PERIOD_S

    @property
    def profile(self) -> str:
        return self.sim.split(",", 1)[0]


@dataclass(frozen=True, slots=True)
class FleetPlan:
    cluster: str
    nodes: tuple[NodePlan, ...]
    interval_s: float = 1.0

    def describe(self) -> list[str]:
        """One line per node with something planted."""
        return [f"{n.name} ({n.rack}, {n.profile}): {'; '.join(n.planted)}" for n in self.nodes if n.planted]


class PlanError(ValueError):
    """Bad demo parameters; the message is one line for the user."""


def _base_profile(i: int) -> str:
    return {1: "hgx-a100", 5: "hgx-h200"}.get(i % 8, "hgx-h100")


def plan_fleet(nodes: int = DEFAULT_NODES, racks: int | None = None, *, seed: int = 1, speed: float = 1.0,
               cluster: str = CLUSTER) -> FleetPlan:
    """The demo fleet for these parameters (deterministic for a seed); `racks` None: 2, or 1 for 1 node."""
    if not 1 <= nodes <= MAX_NODES:
        raise PlanError(f"--nodes {nodes}: expected 1..{MAX_NODES}")
    racks = min(DEFAULT_RACKS, nodes) if racks is None else racks
    if not 1 <= racks <= min(nodes, MAX_RACKS):
        raise PlanError(f"--racks {racks}: expected 1..{min(nodes, MAX_RACKS)} (at most one rack per node)")
    if not 0.1 <= speed <= 100:
        raise PlanError(f"--speed {speed}: expected 0.1..100")
    rng = random.Random(seed)
    where = {i: [p for p in PLANTED if p.at * nodes // DEFAULT_NODES == i] for i in range(nodes)}
    width = len(str(nodes))
    out = []
    for i in range(nodes):
        here = where[i]
        profile = next((p.profile for p in here if p.profile), _base_profile(i))
        prof = PROFILES[profile]
        faults, words, dies, down = [], [], None, 30.0
        for p in here:
            gpu, link, port = rng.randrange(prof.gpus), rng.randrange(prof.link_slots), rng.randrange(prof.ib_ports)
            t = round(p.dies_at_s / speed if p.dies_at_s is not None else NVLINK_ERRORS_AT_S / speed, 1)
            back = round(t + p.down_for_s / speed, 1)
            fill = {"gpu": gpu, "link": link, "port": port, "t": f"{t:g}", "back": f"{back:g}"}
            if p.fault and p.fault.startswith("fabric") and not has_fabric(prof):
                continue  # an A100 or PCIe board answers Not Supported: nothing to plant
            if p.fault:
                faults.append(p.fault.format(**fill))
            if p.dies_at_s is not None:
                dies, down = t, p.down_for_s / speed
            words.append(p.what.format(**fill))
        sim = ",".join([profile, f"seed={seed * 1000 + i}", *faults])
        out.append(NodePlan(name=f"gpu-{i + 1:0{max(2, width)}d}", rack=f"r{i * racks // nodes + 1}", sim=sim,
                            expect_ib=_EXPECT_IB.get(profile, f"{prof.ib_ports}x{prof.ib_rate_gbps}"),
                            planted=tuple(words), dies_at_s=dies, down_for_s=down, period_s=DEATH_PERIOD_S / speed))
    return FleetPlan(cluster=cluster, nodes=tuple(out))
