"""A `FleetState` filled from simulated boards without a broker: deterministic, for views' tests,
snapshots and benchmarks.

The same board pool as `nvmon sim-fleet` (`boards.Board`) makes the payloads, and they go
through `FleetState.apply` exactly as messages off the wire would, at times set by the caller's
fixed clock. Same arguments, same state: the boards are seeded and the clock never reads the wall.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nvmon import __version__
from nvmon.fleet.state import FleetState
from nvmon.loadgen.boards import ALERT_HOLD, Board, NodeIdentity
from nvmon.loadgen.fleet import fault_spec, node_names
from nvmon.wire.contract import topic
from nvmon.wire.payloads import status_payload

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z

# A small fleet with one of each pitfall the design names (the same cast as `nvmon demo`).
SHOWCASE_FAULTS: dict[int, str] = {
    1: "pairs-a100",  # "fake 8-card NVLink": pairs-bridged PCIe cards, 2 × HDR
    2: "pcie_width=3:8",  # GPU 3 trained at x8
    3: "ib_rate=mlx5_1:100",  # one IB port at 100G
    4: "power_cap=4:350",  # GPU 4 limit lowered
    5: "nvlink_down=2.5,nvlink_errors=1.1",  # a link down and one erroring
    9: "thermal=6",
}


@dataclass(frozen=True, slots=True)
class SimState:
    state: FleetState
    now: float  # the clock after the last message: pass it to views as their `now`
    cluster: str
    names: list[str]


def simulated_state(nodes: int = 16, *, racks: int = 2, faults: Mapping[int, str] | None = None,
                    cluster: str = "sim", profile: str = "hgx-h100", ticks: int = ALERT_HOLD + 1,
                    offline: Sequence[int] = (), stale: Sequence[int] = (), labels: Mapping[str, str] | None = None,
                    t0: float = T0, healthy_boards: int = 2, state: FleetState | None = None) -> SimState:
    """`nodes` simulated nodes after `ticks` one-second ticks starting at `t0`.

    `faults`: node index → `--fault` spec (see `nvmon sim-fleet`). Nodes in `offline` end with
    their will (offline, reason `lost`) after the first tick; nodes in `stale` stop ticking after
    the first tick. Every node gets `labels` plus `sim: <its spec>`."""
    faults = {i: fault_spec(profile, s) for i, s in (faults or {}).items() if 0 <= i < nodes}
    names = node_names("sim", nodes)
    state = state if state is not None else FleetState()
    healthy = [f"{profile},seed={k + 1}" for k in range(healthy_boards)]
    boards: dict[str, Board] = {}
    members: list[tuple[NodeIdentity, Board]] = []
    rack_width = max(2, len(str(racks - 1)))
    try:
        for i, name in enumerate(names):
            spec = faults.get(i) or healthy[i % len(healthy)]
            if spec not in boards:
                boards[spec] = Board(spec, interval_s=1.0, clock_start=t0)
            who = NodeIdentity(cluster, name, f"rack-{i * racks // nodes:0{rack_width}d}",
                               {**(labels or {}), "sim": spec[:256]})
            members.append((who, boards[spec]))
        layouts: dict[str, str] = {}
        alerts_sent: dict[str, int] = {}
        now = t0
        for k in range(1, ticks + 1):
            for board in boards.values():
                board.tick(t0 + k)
            for i, (who, board) in enumerate(members):
                if k > 1 and (i in stale or i in offline):
                    continue
                now = t0 + k + 0.5 * i / nodes  # spread over the first half of each second
                if k == 1:
                    st = status_payload("online", version=__version__, interval_s=1.0, ts=now)
                    state.apply(topic(cluster, who.name, "status"), st, now)
                if who.name not in layouts:
                    inventory, layouts[who.name] = board.inventory_for(who)
                    state.apply(topic(cluster, who.name, "inventory"), inventory, now)
                state.apply(topic(cluster, who.name, "sample"), board.payload_for(layouts[who.name], now), now)
                if board.alerts is not None and alerts_sent.get(who.name) != board.alerts_gen:
                    alerts_sent[who.name] = board.alerts_gen
                    state.apply(topic(cluster, who.name, "alerts"), board.alerts, now)
                if k == 1 and i in offline:
                    will = status_payload("offline", version=__version__, interval_s=1.0, ts=t0, reason="lost")
                    state.apply(topic(cluster, who.name, "status"), will, now + 0.25)
        now = t0 + ticks + 0.75
        state.sweep(now)
        return SimState(state=state, now=now, cluster=cluster, names=names)
    finally:
        for board in boards.values():
            board.close()
