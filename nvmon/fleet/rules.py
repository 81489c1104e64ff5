"""Fleet alert rules: conditions judged over the whole `FleetState`, once a second, by `nvmon fleet`.

A node's own daemon judges its hardware (node rules, nvmon.alerts.rules); what no node can say
about itself is judged here:

- `node.offline`: the node's status is `offline`. By the MQTT will (reason `lost`: the daemon died,
  the host hung, the network went) at once; a clean stop (reason `stopped`: systemctl stop, a
  reboot) only once it has lasted `clean_stop_after_s` (a maintenance reboot does not page, a node
  left stopped does).
- `node.stale`: status `online` but no sample for `stale_after_intervals` of its interval (a hung
  daemon or a broken publish path while the TCP session lives on).
- `rack.power`: per (cluster, rack), the GPU power of its online nodes plus `node_overhead_w`
  for each of them, above the rack's budget (`[fleet.racks.NAME] budget_kw`, else
  `rack_budget_kw`; a rack without a budget is not judged).
- `fleet.same_fault`: `same_fault_nodes` or more nodes with the same alert code at once (their
  own firing alerts, plus node.offline / node.stale from above) for its for_s (30 s: a momentary
  coincidence does not page): one fleet alert per code, e.g. a switch or PDU taking several
  nodes down pages once, not once per node.
- `fleet.feed_stalled`: no message from anyone (`FleetState.last_rx`) for more than two
  intervals of the fastest live node, with `feed_stall_min_nodes` or more nodes live (online or
  stale), while the connection to the broker is up (a lost connection is a blind spell, see
  nvmon.fleet.alerting). Every node went quiet at once: that is the broker (stopped, swapping,
  wedged) or the path to it, not N nodes. While it lasts, and for a settle time after messages
  flow again, per-node judgement is held (`stalled`: no node.stale, no same_fault, active alerts
  neither start nor end) and this one warning is the only condition; it is logged once when it
  starts and once when it ends. After `feed_stall_max_s` per-node judgement resumes (the alert
  stays): a broker that still answers this client's pings is not stalled, the nodes are silent.

Nodes that never announced themselves (neither a status nor an inventory: a name that only sends
samples) are shown by the views but judged by no rule.

Pure and synchronous: `FleetRules.conditions(state, now)` returns the conditions holding now,
grouped by `Place` (the node, rack or fault they are about); nvmon.fleet.alerting feeds them to
one AlertEngine per place. The config model (`[fleet]`) lives here too (docs/alerts.md).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nvmon.alerts.model import FLEET_CODES, fingerprint
from nvmon.codes import FLEET_CODES as _FLEET
from nvmon.alerts.rules import Condition, RuleSpec
from nvmon.fleet.state import FleetState

log = logging.getLogger("nvmon.fleet")

WEEK_S = 7 * 86400.0
NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
MAX_FAULT_CODES = 1000  # distinct codes counted for same_fault: the codes come off the wire
NODES_IN_SUMMARY = 5

# code → (for_s, clear_s, runbook). node.offline needs no for-duration: the will itself comes only
# after 1.5 × keepalive of silence. node.stale waits 20 s more than its k intervals, so that a node
# whose host hung pages once, as offline (its will comes 15 s after its last packet at the daemon's
# default keepalive of 10 s), not first as stale and then as offline; the stale alert, still pending,
# then ends without a page. clear_s keeps a node in a crash loop (up for seconds, gone again) one
# episode, not a page per restart.
DEFAULTS: dict[str, tuple[float, float]] = {  # code → (for_s, clear_s); runbooks: nvmon.codes
    "node.offline": (0.0, 30.0),
    "node.stale": (20.0, 30.0),
    "rack.power": (60.0, 60.0),
    "fleet.same_fault": (30.0, 60.0),
    "fleet.feed_stalled": (10.0, 10.0),
    "cluster.unreachable": (0.0, 10.0),  # judged by nvmon.fleet.clusters: stale after k summary intervals
}
FEED_QUIET_INTERVALS = 2.0  # no message from anyone for this many intervals of the fastest live node
MIN_FEED_QUIET_S = 1.0
FEED_SETTLE_S = 2.0  # after a stall, messages flow this long (or two fast intervals) before judging nodes
assert set(DEFAULTS) == set(FLEET_CODES)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FleetRuleOverride(_Strict):
    """`[fleet.rules."CODE"]`: one fleet rule's own settings."""

    enabled: bool = True
    severity: Literal["critical", "warning", "info"] | None = None
    for_s: float | None = Field(None, ge=0, le=WEEK_S)
    clear_s: float | None = Field(None, ge=0, le=WEEK_S)


class RackSettings(_Strict):
    """`[fleet.racks.NAME]`: one rack's budget (and overhead, if its nodes differ)."""

    budget_kw: float | None = Field(None, gt=0, le=10_000)
    node_overhead_w: float | None = Field(None, ge=0, le=100_000)


class FleetSettings(_Strict):
    """The `[fleet]` table."""

    cluster: str | None = None  # the cluster to watch (--cluster); None: every cluster on the broker
    clusters: tuple[str, ...] = ()  # or several (--cluster a,b): one instance for a list of clusters
    db: Path = Path("/var/lib/nvmon/fleet.db")  # fleet alert state (--db)
    stale_after_intervals: float = Field(5.0, ge=1, le=1000)
    clean_stop_after_s: float = Field(900.0, ge=0, le=WEEK_S)
    rack_budget_kw: float | None = Field(None, gt=0, le=10_000)  # None: only racks with their own budget
    node_overhead_w: float = Field(0.0, ge=0, le=100_000)  # CPUs, fans, NICs, drives: not in GPU power
    same_fault_nodes: int = Field(3, ge=2, le=100_000)
    feed_stall_min_nodes: int = Field(3, ge=2, le=100_000)  # fewer live nodes: a silent feed is judged per node
    feed_stall_max_s: float = Field(60.0, ge=0, le=WEEK_S)  # hold per-node judgement this long at most; 0: never
    log_drops_every_s: float = Field(60.0, ge=1, le=86400)  # nvmon fleet logs refused messages this often
    # What a flood of made-up names can take (nvmon.fleet.state): new nodes and clusters past these
    # are dropped and counted; nodes without an inventory are forgotten after this long silent.
    max_nodes: int = Field(20_000, ge=1, le=1_000_000)
    max_clusters: int = Field(1000, ge=1, le=100_000)
    max_nodes_without_inventory: int = Field(1000, ge=1, le=1_000_000)
    forget_without_inventory_s: float = Field(30.0, ge=1, le=WEEK_S)
    # Cluster summaries (nvmon.fleet.clusters; docs/fleet.md, "Scaling out"): watching nodes, publish each
    # cluster's every summary_every_s (0: none); watching summaries (a central instance), judge cluster.unreachable.
    watch: Literal["nodes", "summaries"] = "nodes"
    summary_every_s: float = Field(10.0, ge=0, le=3600)
    summary_stale_intervals: float = Field(3.0, ge=2, le=1000)
    racks: dict[str, RackSettings] = Field(default_factory=dict)
    rules: dict[str, FleetRuleOverride] = Field(default_factory=dict)

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, v: str | None) -> str | None:
        if v is not None and not NAME_RE.match(v):
            raise ValueError("use 1-64 characters from A-Z a-z 0-9 . _ -")
        return v

    @field_validator("clusters")
    @classmethod
    def _clusters(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            if not NAME_RE.match(name):
                raise ValueError(f"cluster {name!r}: use 1-64 characters from A-Z a-z 0-9 . _ -")
        return tuple(dict.fromkeys(v))

    @model_validator(mode="after")
    def _one_way(self):
        if self.cluster is not None and self.clusters:
            raise ValueError("set cluster (one) or clusters (a list), not both")
        return self

    @property
    def watched(self) -> tuple[str, ...]:
        """The clusters to watch; () for every cluster on the broker."""
        return self.clusters or ((self.cluster,) if self.cluster else ())

    @field_validator("racks")
    @classmethod
    def _racks(cls, v: dict[str, RackSettings]) -> dict[str, RackSettings]:
        for name in v:
            if not NAME_RE.match(name):
                raise ValueError(f"rack {name!r}: use 1-64 characters from A-Z a-z 0-9 . _ -")
        return v

    @field_validator("rules")
    @classmethod
    def _rules(cls, v: dict[str, FleetRuleOverride]) -> dict[str, FleetRuleOverride]:
        for code in v:
            if code not in FLEET_CODES:
                raise ValueError(f"unknown fleet rule {code!r}; known: {', '.join(sorted(FLEET_CODES))}")
        return v


def fleet_book(settings: FleetSettings) -> dict[str, RuleSpec]:
    """The enabled fleet rules with every setting resolved (override, else built-in)."""
    book = {}
    for code, severity in FLEET_CODES.items():
        for_s, clear_s = DEFAULTS[code]
        o = settings.rules.get(code)
        if o is not None and not o.enabled:
            continue
        book[code] = RuleSpec(
            code=code, severity=(o.severity if o is not None and o.severity else severity),
            for_s=o.for_s if o is not None and o.for_s is not None else for_s,
            clear_s=o.clear_s if o is not None and o.clear_s is not None else clear_s,
            grace=False, runbook=_FLEET[code].runbook)
    return book


NEAR_BUDGET = 0.9  # a rack drawing this share of its budget or more is close to it


def rack_power_level(draw: float | None, budget: float | None) -> str | None:
    """A rack's draw against its budget (same unit): "over" (the rack.power rule fires), "near"
    (≥ 90 %: shown, not paged), "under", or None when either is unknown. The one definition the
    fleet rules and the TUI's rack headers share."""
    if draw is None or not budget or draw != draw:
        return None
    return "over" if draw > budget else "near" if draw >= NEAR_BUDGET * budget else "under"


class Place(NamedTuple):
    """What a fleet alert is about: ("node", cluster, node), ("rack", cluster, rack),
    ("fault", cluster, code) for fleet.same_fault or ("feed", cluster, "") for fleet.feed_stalled
    (cluster "*" when the state holds several). One AlertEngine per place."""

    kind: str
    cluster: str
    name: str


@dataclass(slots=True)
class Identity:
    """A place's labels, as the AlertEngine stamps them on its records."""

    cluster: str
    node: str | None = None
    rack: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


def place_of(cluster: str, node: str | None, rack: str | None, code: str, labels: Mapping[str, str]) -> Place:
    """The place an alert record belongs to (for records restored from the database)."""
    if code == "fleet.same_fault":
        return Place("fault", cluster, str(labels.get("fault", "")))
    if code == "fleet.feed_stalled":
        return Place("feed", cluster, "")
    if code == "cluster.unreachable":
        return Place("cluster", cluster, "")
    if node is not None:
        return Place("node", cluster, node)
    return Place("rack", cluster, rack or "")


def _age(seconds: float) -> str:
    s = int(max(0.0, seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s / 3600:.1f} h"


class FleetRules:
    """Turns the fleet's state into the conditions holding now; see the module docstring."""

    def __init__(self, settings: FleetSettings = FleetSettings()):
        self.settings = settings
        self.book = fleet_book(settings)
        self.identities: dict[Place, Identity] = {}  # of the places seen in the latest `conditions`
        self.max_interval_s = 1.0  # the slowest node's sample interval, seen in the latest `conditions`
        self.stalled = False  # the latest `conditions` found the feed stalled: hold per-node judgement
        self._stall_since: float | None = None  # the feed went quiet then (a stall episode is on)
        self._flowing_since: float | None = None  # messages came again then (settling)

    def budget_kw(self, rack: str) -> float | None:
        r = self.settings.racks.get(rack)
        return r.budget_kw if r is not None and r.budget_kw is not None else self.settings.rack_budget_kw

    def overhead_w(self, rack: str) -> float:
        r = self.settings.racks.get(rack)
        return r.node_overhead_w if r is not None and r.node_overhead_w is not None else self.settings.node_overhead_w

    def conditions(self, state: FleetState, now: float) -> dict[Place, list[Condition]]:
        s, book = self.settings, self.book
        out: dict[Place, list[Condition]] = {}
        ids: dict[Place, Identity] = {}
        racks: dict[tuple[str, str], list] = {}  # (cluster, rack) → [online nodes with power, GPU W, names]
        faults: dict[tuple[str, str], list[str]] = {}  # (cluster, code) → nodes
        max_interval = 1.0
        lives = {key: view.liveness(now) for key, view in state.nodes.items()}
        stall = self._feed_stall(state, lives, now)
        if stall is not None:
            place, ident, cond = stall
            if "fleet.feed_stalled" in book:
                out[place], ids[place] = [cond], ident
            if self.stalled:  # nothing else is judged: the nodes' silence is the broker's
                self.identities = ids
                return out
        for (cluster, node), view in state.nodes.items():
            if view.status is None and view.inventory is None:
                continue  # never announced itself (a daemon sends both when it connects): a name, not a node
            live = lives[(cluster, node)]
            max_interval = max(max_interval, view.stale_after_s / state.stale_factor)
            place = Place("node", cluster, node)
            conds: list[Condition] = []
            codes: set[str] = set()
            if live.state == "offline":
                reason = live.reason or "lost"
                if reason != "stopped" or live.age_s >= s.clean_stop_after_s:
                    codes.add("node.offline")
                    if "node.offline" in book:
                        how = ("stopped cleanly and not back" if reason == "stopped"
                               else "connection lost (the broker published its will)")
                        conds.append(Condition(
                            fingerprint("node.offline", cluster, node), "node.offline",
                            f"{node}: daemon offline for {'' if live.exact else 'up to '}{_age(live.age_s)}: "
                            f"{how}", book["node.offline"].runbook,
                            value=reason, threshold=None))
            elif live.state == "stale":
                codes.add("node.stale")
                if "node.stale" in book:
                    k = s.stale_after_intervals
                    conds.append(Condition(
                        fingerprint("node.stale", cluster, node), "node.stale",
                        f"{node}: no sample for {_age(live.age_s)} (stale after {k:g} intervals, "
                        f"{view.stale_after_s:g} s)", book["node.stale"].runbook,
                        value=round(live.age_s, 1), threshold=round(view.stale_after_s, 3)))
            else:
                if view.alerts is not None:
                    codes.update(a.code for a in view.alerts.alerts if a.state == "firing" and NAME_RE.match(a.code))
                sm, rack = view.summary, view.rack
                if rack is not None and sm is not None and sm.power_w is not None:
                    acc = racks.setdefault((cluster, rack), [0, 0.0])
                    acc[0] += 1
                    acc[1] += sm.power_w
            for code in codes:
                nodes = faults.get((cluster, code))
                if nodes is None:
                    if len(faults) >= MAX_FAULT_CODES:
                        continue
                    nodes = faults[(cluster, code)] = []
                nodes.append(node)
            if conds:
                out[place] = conds
                ids[place] = Identity(cluster, node, view.rack, dict(view.labels))
        self.max_interval_s = max_interval
        if "rack.power" in book:
            self._rack_conditions(racks, out, ids)
        if "fleet.same_fault" in book:
            self._fault_conditions(faults, out, ids)
        self.identities = ids
        return out

    def _feed_stall(self, state: FleetState, lives: dict, now: float) -> tuple[Place, Identity, Condition] | None:
        """Track the feed-stall episode (see the module docstring); sets `stalled`. Returns the
        fleet.feed_stalled (place, identity, condition) while an episode is on, else None."""
        s = self.settings
        live = [state.nodes[k] for k, lv in lives.items() if lv.state != "offline"]
        quiet = silent = 0.0
        if len(live) >= s.feed_stall_min_nodes and state.last_rx is not None and s.feed_stall_max_s > 0:
            fastest = min(v.stale_after_s for v in live) / state.stale_factor
            quiet = max(MIN_FEED_QUIET_S, FEED_QUIET_INTERVALS * fastest)
            silent = now - state.last_rx
        if quiet and silent > quiet:
            if self._stall_since is None:
                self._stall_since = state.last_rx
                log.warning("fleet: feed stalled: no message from any of %d live nodes for %.1f s while connected "
                            "to the broker; per-node judgement held until messages flow again", len(live), silent)
            self._flowing_since = None
        elif self._stall_since is not None:
            if self._flowing_since is None:
                self._flowing_since = now
            if now - self._flowing_since >= max(FEED_SETTLE_S, quiet):
                log.info("fleet: feed flowing again after a %.1f s stall; judging nodes again",
                         self._flowing_since - self._stall_since)
                self._stall_since = self._flowing_since = None
        if self._stall_since is None:
            self.stalled = False
            return None
        lasted = now - self._stall_since
        self.stalled = lasted <= s.feed_stall_max_s
        clusters = {v.cluster for v in live} or {k[0] for k in lives}
        cluster = next(iter(clusters)) if len(clusters) == 1 else "*"
        how = ("flowing again, settling" if self._flowing_since is not None
               else f"no message from any of {len(live)} live nodes for {_age(lasted)}")
        held = ("per-node judgement held" if self.stalled
                else f"judging nodes again after {_age(s.feed_stall_max_s)}: the broker answers, the nodes are silent")
        cond = Condition(fingerprint("fleet.feed_stalled", cluster, None), "fleet.feed_stalled",
                         f"feed stalled while connected to the broker: {how}; {held}",
                         self.book["fleet.feed_stalled"].runbook if "fleet.feed_stalled" in self.book else "",
                         value=round(lasted, 1), threshold=round(quiet, 3) if quiet else None)
        return Place("feed", cluster, ""), Identity(cluster, None, None), cond

    def _rack_conditions(self, racks: dict, out: dict, ids: dict) -> None:
        rule = self.book["rack.power"]
        for (cluster, rack), (nodes, gpu_w) in racks.items():
            budget = self.budget_kw(rack)
            if budget is None:
                continue
            overhead = self.overhead_w(rack)
            total_kw = (gpu_w + overhead * nodes) / 1000
            if rack_power_level(total_kw, budget) != "over":
                continue
            place = Place("rack", cluster, rack)
            extra = f" + {overhead:g} W overhead each" if overhead else ""
            out[place] = [Condition(
                fingerprint("rack.power", cluster, None, rack=rack), "rack.power",
                f"rack {rack}: {total_kw:.1f} kW over its {budget:g} kW budget ({nodes} nodes reporting: "
                f"{gpu_w / 1000:.1f} kW GPU{extra})", rule.runbook, value=round(total_kw, 2), threshold=budget)]
            ids[place] = Identity(cluster, None, rack)

    def _fault_conditions(self, faults: dict, out: dict, ids: dict) -> None:
        rule, n_min = self.book["fleet.same_fault"], self.settings.same_fault_nodes
        for (cluster, code), nodes in faults.items():
            if len(nodes) < n_min:
                continue
            nodes.sort()
            shown = ", ".join(nodes[:NODES_IN_SUMMARY]) + (", …" if len(nodes) > NODES_IN_SUMMARY else "")
            place = Place("fault", cluster, code)
            out[place] = [Condition(
                fingerprint("fleet.same_fault", cluster, None, device=code), "fleet.same_fault",
                f"{len(nodes)} nodes with {code} at once: {shown}", rule.runbook,
                value=len(nodes), threshold=n_min)]
            ids[place] = Identity(cluster, None, None, {"fault": code})
