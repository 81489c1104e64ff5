"""`nvmon fleet`'s cluster summaries: built from the fleet state and its alerts, published retained on
`nvmon/v1/<cluster>/@summary` (nvmon.wire.summary has the format; docs/fleet.md, "Scaling out").

    every second:  for each cluster judged here
        build_summary(state, cluster, now, alerts)  ─► publish when summary_every_s has passed,
                                                      or its counts changed and MIN_GAP_S has

A view of many clusters (the TUI's overview, a central `nvmon fleet --watch summaries`) reads these
instead of every node's samples, and judges a cluster whose summary stops coming unreachable
(nvmon.fleet.clusters).

The summary says what the fleet state and the rules already hold: counts by liveness, the nodes with
the most severe alerts (or none online), alerts by code and severity (the nodes' own active sets and
the fleet rules' alerts), rack power with the level `rack_power_level` gives. Nothing new is judged.

The publisher has its own connection (`MqttSession`): the subscriber's is busy reading samples, and
a summary must not wait behind them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from nvmon.alerts.model import AlertRecord
from nvmon.codes import SEVERITIES, Severity
from nvmon.fleet.rules import FleetRules, rack_power_level
from nvmon.fleet.state import FleetState, NodeView
from nvmon.wire.contract import PayloadTooLarge, WireError
from nvmon.wire.mqtt import Backoff, MqttSettings
from nvmon.wire.session import MqttSession
from nvmon.wire.summary import (WORST_NODES, AlertCount, ClusterSummary, NodeCounts, RackLine, WorstNode,
                                summary_payload, summary_topic)

log = logging.getLogger("nvmon.fleet")

MIN_GAP_S = 2.0  # a change of counts is published at most this often
MIN_EVERY_S = 0.5
TICK_S = 1.0
SETTLE_S = 2.0  # after (re)connecting, what the state holds is a few retained messages: wait this long
_LIVE_RANK = {"offline": 0, "stale": 1, "online": 2}
NO_ALERT = len(SEVERITIES)  # the rank of a node without alerts: after every severity


def build_summary(state: FleetState, cluster: str, now: float, *, interval_s: float,
                  fleet_alerts: Iterable[AlertRecord] = (), rules: FleetRules | None = None,
                  views: Iterable[NodeView] | None = None) -> ClusterSummary:
    """The summary of `cluster` as `state` and the fleet rules' active alerts (`fleet_alerts`, any
    cluster's: those of others are skipped) stand now. `views`: the cluster's nodes, when the caller
    has them at hand (else they are picked out of `state`)."""
    live = Counter()
    kinds: dict[tuple[str, str], list[int]] = {}  # (code, severity) → [count, firing]
    per_node: dict[str, list] = {}  # node → [worst severity rank, its code, alerts, firing first]
    racks: dict[str | None, list] = {}  # rack → [nodes, reporting, GPU W]
    power = None

    def note(node: str | None, code: str, severity: str, firing: bool) -> None:
        k = kinds.setdefault((code, severity), [0, 0])
        k[0] += 1
        k[1] += firing
        if node is None:
            return
        n = per_node.setdefault(node, [NO_ALERT, None, 0])
        n[2] += 1
        rank = Severity.rank_of(severity)
        if rank < n[0]:
            n[0], n[1] = rank, code

    lives = {}
    if views is None:
        views = [v for (c, _), v in state.nodes.items() if c == cluster]
    for view in views:
        node = view.node
        lv = view.liveness(now).state
        lives[node] = lv
        live[lv] += 1
        if view.alerts is not None:
            for a in view.alerts.alerts:
                if a.state in ("pending", "firing"):
                    note(node, a.code, a.severity, a.state == "firing")
        r = racks.setdefault(view.rack, [0, 0, 0.0])
        r[0] += 1
        s = view.summary
        if lv == "online" and s is not None and s.power_w is not None:
            r[1] += 1
            r[2] += s.power_w
            power = (power or 0.0) + s.power_w
    for rec in fleet_alerts:
        if rec.cluster == cluster and rec.status in ("pending", "firing"):
            note(rec.node if rec.node in lives else None, rec.code, rec.severity, rec.status == "firing")

    alerts = tuple(AlertCount(code, sev, n, f) for (code, sev), (n, f)
                   in sorted(kinds.items(), key=lambda kv: (Severity.rank_of(kv[0][1]), -kv[1][0], kv[0][0])))
    # Worst: the most severe alert first, then offline before stale before online, then most alerts.
    suspects = set(per_node) | {n for n, lv in lives.items() if lv != "online"}
    none = (NO_ALERT, None, 0)
    order = sorted(suspects, key=lambda n: (per_node.get(n, none)[0], _LIVE_RANK[lives[n]], -per_node.get(n, none)[2],
                                            n))
    worst = []
    for n in order[:WORST_NODES]:
        rank, code, count = per_node.get(n, none)
        worst.append(WorstNode(node=n, state=lives[n], severity=SEVERITIES[rank].value if rank < NO_ALERT else None,
                               code=code, alerts=count))
    lines = []
    for rack, (nodes, reporting, watts) in sorted(racks.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
        budget_kw = rules.budget_kw(rack) if rules is not None and rack is not None else None
        level = None
        if budget_kw is not None:
            over_w = rules.overhead_w(rack) * reporting
            level = rack_power_level((watts + over_w) / 1000, budget_kw)
        lines.append(RackLine(rack=rack, nodes=nodes, reporting=reporting, power_w=watts,
                              budget_w=budget_kw * 1000 if budget_kw is not None else None, level=level))
    return ClusterSummary(
        cluster=cluster, ts=now, interval_s=interval_s,
        nodes=NodeCounts(total=len(lives), online=live["online"], stale=live["stale"], offline=live["offline"]),
        power_w=power, alerts=alerts, worst=tuple(worst), racks=tuple(lines))


def _change_key(s: ClusterSummary) -> tuple:
    """What makes a summary news before its interval is up: counts, alert kinds, the worst nodes."""
    return (s.nodes, tuple((a.code, a.severity, a.count, a.firing) for a in s.alerts),
            tuple((w.node, w.state, w.severity) for w in s.worst))


class SummaryPublisher:
    """Publishes the summary of each cluster in `clusters` (() : every cluster in the state) every
    `every_s`, and within MIN_GAP_S of a change. `fleet_alerts()` gives the rules' active alerts."""

    def __init__(self, settings: MqttSettings, state: FleetState, *, clusters: Sequence[str] = (),
                 every_s: float = 10.0, fleet_alerts: Callable[[], Iterable[AlertRecord]] = tuple,
                 rules: FleetRules | None = None, clock: Callable[[], float] = time.time,
                 backoff: Backoff = Backoff()):
        self.state, self.clusters, self.clock, self.rules = state, tuple(clusters), clock, rules
        self.every_s = max(MIN_EVERY_S, every_s)
        self.fleet_alerts = fleet_alerts
        self.session = MqttSession(settings, client_id=f"nvmon-fleet-summary-{os.getpid()}-{id(self) & 0xFFFF:04x}",
                                   log=log, what="fleet: summaries: MQTT", backoff=backoff, clock=clock)
        self.published = self.errors = 0
        self._last: dict[str, tuple[float, tuple]] = {}  # cluster → (published at, change key)

    def due(self, now: float) -> list[ClusterSummary]:
        """The summaries to publish now (and marks them published). One pass over the state."""
        out = []
        by_cluster: dict[str, list[NodeView]] = {c: [] for c in self.clusters}
        for (c, _), view in self.state.nodes.items():
            if self.clusters:
                if c in by_cluster:
                    by_cluster[c].append(view)
            else:
                by_cluster.setdefault(c, []).append(view)
        active = list(self.fleet_alerts()) if by_cluster else []
        for cluster in sorted(by_cluster) if not self.clusters else self.clusters:
            s = build_summary(self.state, cluster, now, interval_s=self.every_s, fleet_alerts=active, rules=self.rules,
                              views=by_cluster[cluster])
            key = _change_key(s)
            last = self._last.get(cluster)
            if last is None or now - last[0] >= self.every_s or (key != last[1] and now - last[0] >= MIN_GAP_S):
                self._last[cluster] = (now, key)
                out.append(s)
        return out

    async def run(self) -> None:
        """Publish until cancelled, reconnecting with backoff."""
        await self.session.run(self._connected)

    async def _connected(self, client) -> None:
        self._last.clear()  # a new connection: everything is due (after the settle time)
        await asyncio.sleep(SETTLE_S)
        while True:
            for s in self.due(self.clock()):
                try:
                    body = summary_payload(s)
                except (PayloadTooLarge, WireError) as e:  # a bug: the builder makes only what the reader takes
                    self.errors += 1
                    log.error("fleet: summary of %s not published: %s", s.cluster, e)
                    continue
                # QoS 0: the next summary replaces a lost one, and a publish never waits on a broker
                # that stalls (its acknowledgement timing out would drop the connection).
                await client.publish(summary_topic(s.cluster), body, qos=0, retain=True)
                self.published += 1
            await asyncio.sleep(TICK_S)
