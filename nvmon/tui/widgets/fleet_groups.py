"""Group headers of the fleet table: by rack (liveness and power against the rack budget) or by
NVLink domain (the multi-node NVLink domain, NVL72-class, the node's GPUs report: its cluster UUID).

Each header is one line across the table's columns, keyed like a row (`GROUP_PREFIX + name`).
The fleet rules judge rack power (`rack_power_level`); a header only shows what they say.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from nvmon.fleet.rules import rack_power_level
from nvmon.fleet.state import FleetState, NodeView
from nvmon.tui.text import DIM, LEVEL_STYLE, OK, SYMBOL, WARN, Segment as Cell, clean, kw

GROUP_PREFIX = "\x00group:"  # row keys of group headers; node row keys are "cluster/node"
NO_RACK = "(no rack)"
NO_DOMAIN = "(no NVLink domain)"
MODES = ("rack", "domain")
TITLES = {"rack": "rack", "domain": "NVLink domain"}


def group_of(view: NodeView, mode: str) -> str:
    """The group a node's row goes under in `mode`."""
    if mode == "domain":
        uuid = view.cluster_uuid
        return f"NVLink domain {clean(uuid, 40)}" if uuid else NO_DOMAIN
    return clean(view.rack, 64) if view.rack else NO_RACK


def sort_key(name: str) -> tuple[bool, str]:
    """Groups by name, the nodes without one last."""
    return name in (NO_RACK, NO_DOMAIN), name


def _header(name: str, down: int, nodes: int, shown: int, extra: Iterable[Cell] = ()) -> tuple[Cell, ...]:
    line: list[Cell] = [("▾ " + name, "bold reverse"), ("  ", "")]
    line.append((f"{SYMBOL[WARN]} {down} down", WARN) if down else (f"{SYMBOL[OK]} all up", OK))
    line += [(f"  {nodes} nodes", "bold"), *extra]
    if shown != nodes:
        line.append((f"  {shown} shown", DIM))
    return tuple(line)


def rack_headers(state: FleetState, now: float, budget_w: float | None, shown: Mapping[str, int]
                 ) -> dict[str, tuple[Cell, ...]]:
    """Per rack: its name, nodes down, nodes, and power against the rack budget (or the sum of
    its GPUs' limits without one)."""
    out = {}
    for rack, power in state.racks(now).items():
        name = clean(rack, 64) if rack is not None else NO_RACK
        style = LEVEL_STYLE.get(rack_power_level(power.power_w, budget_w), DIM) if budget_w else DIM
        power_cell = (f"{SYMBOL[style]} {kw(power.power_w)}/{kw(budget_w)}kW", style) if budget_w else \
            (f"{kw(power.power_w)}/{kw(power.power_limit_w)}kW", "bold")
        extra = [("  ", ""), power_cell, (" rack budget" if budget_w else " Σ GPU limits", DIM)]
        out[GROUP_PREFIX + name] = _header(name, power.nodes - power.reporting, power.nodes,
                                           shown.get(name, 0), extra)
    return out


def domain_headers(state: FleetState, now: float, shown: Mapping[str, int]) -> dict[str, tuple[Cell, ...]]:
    """Per NVLink domain: its cluster UUID, nodes down (not online) and nodes."""
    nodes: Counter[str] = Counter()
    down: Counter[str] = Counter()
    for view in state.nodes.values():
        name = group_of(view, "domain")
        nodes[name] += 1
        down[name] += view.liveness(now).state != "online"
    return {GROUP_PREFIX + name: _header(name, down[name], n, shown.get(name, 0)) for name, n in nodes.items()}
