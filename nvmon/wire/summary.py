"""A cluster's summary: the retained `nvmon/v1/<cluster>/@summary` message (docs/wire.md).

`nvmon fleet` publishes one per cluster it judges, at a low rate (every `interval_s`, and sooner
when its counts change): node counts by liveness, the worst few nodes, the active alerts by code
and severity, and the power by rack. A view of many clusters reads these instead of every node's
samples (10 × 2,000 nodes are ten small messages every ten seconds, not 20,000 a second), and a
summary that stops coming says that the cluster (its bridge, broker or `nvmon fleet`) is out of
reach (`cluster.unreachable`, judged in nvmon.fleet.clusters).

Like `@controls`, the topic has four levels and `@` is not allowed in a node name: it is never a
node's topic, `nvmon/v1/<cluster>/+/+` filters never receive it, and `parse_message` refuses it.

Pure data, no I/O. `summary_payload` builds (and checks the result with the reader's own rules);
`parse_summary` is as strict as `parse`: anything off-contract raises `WireError` (one line).
Strings from the wire (node, rack, code) are kept as they came: a view shows them literally.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from nvmon.wire.checks import MAX_TS, array, envelope, integer, number, obj, text
from nvmon.wire.contract import (ALERT_SEVERITIES, MAX_NAME, SCHEMA, PayloadTooLarge, WireError,
                                 cluster_subscription, cluster_topic, parse_cluster_topic, valid_name)
from nvmon.wire.payloads import encode

SUMMARY_LEVEL = "@summary"
LIVENESS = ("online", "stale", "offline")
RACK_LEVELS = ("over", "near", "under")  # a rack's draw against its budget (nvmon.fleet.rules.rack_power_level)
MAX_WORST = 16  # nodes listed as the worst (writers send WORST_NODES)
WORST_NODES = 5
MAX_ALERT_KINDS = 256  # (code, severity) pairs; a writer keeps the most severe, then the most frequent
MAX_RACKS = 512
MAX_COUNT = 10**7  # nodes, alerts: far past any cluster, small enough that sums cannot overflow a view
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.1, 86400.0
MAX_POWER_W = 1e12
_CODE = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True, slots=True)
class NodeCounts:
    total: int
    online: int
    stale: int
    offline: int


@dataclass(frozen=True, slots=True)
class WorstNode:
    """One of the cluster's worst nodes: its liveness, its most severe active alert (code and
    severity; None when it has none) and how many alerts it has."""

    node: str
    state: str  # online | stale | offline
    severity: str | None
    code: str | None
    alerts: int


@dataclass(frozen=True, slots=True)
class AlertCount:
    """Active alerts (pending or firing) of one code and severity in the cluster, and how many of
    them fire."""

    code: str
    severity: str
    count: int
    firing: int


@dataclass(frozen=True, slots=True)
class RackLine:
    """A rack's GPU power over its online nodes; `budget_w` and `level` where the fleet has a budget
    for it (`level`: over / near / under, as the rack.power rule judges it)."""

    rack: str | None  # None: the cluster's nodes without a rack
    nodes: int
    reporting: int  # online nodes with a power reading: the sum covers these
    power_w: float
    budget_w: float | None = None
    level: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterSummary:
    cluster: str
    ts: float  # when it was built (the publisher's clock)
    interval_s: float  # the publisher sends one at least this often: a reader judges staleness by it
    nodes: NodeCounts
    power_w: float | None  # GPU power of the online nodes, summed (None: none reports it)
    alerts: tuple[AlertCount, ...] = ()
    worst: tuple[WorstNode, ...] = ()
    racks: tuple[RackLine, ...] = ()
    racks_omitted: int = 0  # racks left out (the smallest draws) to keep within MAX_RACKS
    alert_kinds_omitted: int = 0  # (code, severity) pairs left out past MAX_ALERT_KINDS

    def alerts_by_severity(self, *, firing_only: bool = False) -> dict[str, int]:
        """Active (or firing) alerts per severity, every severity present (0 when none)."""
        out = dict.fromkeys(ALERT_SEVERITIES, 0)
        for a in self.alerts:
            out[a.severity] += a.firing if firing_only else a.count
        return out


# --- topics ----------------------------------------------------------------------------------


def summary_topic(cluster: str) -> str:
    """`nvmon/v1/<cluster>/@summary`: the cluster's summary (retained, QoS 0)."""
    return cluster_topic(cluster, SUMMARY_LEVEL)


def summary_subscription(cluster: str | None = None) -> str:
    return cluster_subscription(SUMMARY_LEVEL, cluster)


def parse_summary_topic(t: object) -> str:
    return parse_cluster_topic(t, SUMMARY_LEVEL)


# --- writing ---------------------------------------------------------------------------------


def _w(x: float | None) -> float | int | None:
    if x is None:
        return None
    r = round(x, 1)
    return int(r) if r == int(r) else r


def _dict(s: ClusterSummary) -> dict:
    return {
        "schema": SCHEMA, "ts": round(s.ts, 3), "cluster": s.cluster, "interval_s": _w(s.interval_s),
        "nodes": {"total": s.nodes.total, "online": s.nodes.online, "stale": s.nodes.stale,
                  "offline": s.nodes.offline},
        "power_w": _w(s.power_w),
        "alerts": [{"code": a.code, "severity": a.severity, "count": a.count, "firing": a.firing} for a in s.alerts],
        "worst": [{"node": n.node, "state": n.state, "severity": n.severity, "code": n.code, "alerts": n.alerts}
                  for n in s.worst],
        "racks": [{"rack": r.rack, "nodes": r.nodes, "reporting": r.reporting, "power_w": _w(r.power_w),
                   "budget_w": _w(r.budget_w), "level": r.level} for r in s.racks],
        **({"racks_omitted": s.racks_omitted} if s.racks_omitted else {}),
        **({"alert_kinds_omitted": s.alert_kinds_omitted} if s.alert_kinds_omitted else {}),
    }


def summary_payload(s: ClusterSummary) -> bytes:
    """The message for `s`, checked by the reader's own rules (a writer never publishes what readers
    would refuse). Over the caps or the size limit, the racks with the smallest draw and the least
    severe, least frequent alert kinds are left out (and counted); PayloadTooLarge if that cannot help."""
    if len(s.racks) > MAX_RACKS:
        keep = sorted(s.racks, key=lambda r: -r.power_w)[:MAX_RACKS]
        s = replace(s, racks=tuple(keep), racks_omitted=s.racks_omitted + len(s.racks) - MAX_RACKS)
    if len(s.alerts) > MAX_ALERT_KINDS:
        s = replace(s, alerts=s.alerts[:MAX_ALERT_KINDS],
                    alert_kinds_omitted=s.alert_kinds_omitted + len(s.alerts) - MAX_ALERT_KINDS)
    while True:
        try:
            body = encode(_dict(s))
            break
        except PayloadTooLarge:
            if not s.racks and not s.alerts:
                raise
        if s.racks:
            n = max(1, len(s.racks) // 4)
            keep = sorted(s.racks, key=lambda r: -r.power_w)[:-n]
            s = replace(s, racks=tuple(keep), racks_omitted=s.racks_omitted + n)
        else:
            n = max(1, len(s.alerts) // 4)
            s = replace(s, alerts=s.alerts[:-n], alert_kinds_omitted=s.alert_kinds_omitted + n)
    read_summary(s.cluster, body)  # raises WireError for anything a reader would refuse
    return body


# --- reading ---------------------------------------------------------------------------------


def _choice(v: object, path: str, allowed: tuple[str, ...], *, null: bool = False) -> str | None:
    if v is None and null:
        return None
    if v not in allowed or not isinstance(v, str):
        raise WireError(f"{path}: expected one of {', '.join(allowed)}")
    return v


def _code(v: object, path: str, *, null: bool = False) -> str | None:
    c = text(v, path, MAX_NAME, null=null)
    if c is not None and not _CODE.fullmatch(c):
        raise WireError(f"{path}: use 1-64 of A-Z a-z 0-9 . _ -")
    return c


def _count(v: object, path: str) -> int:
    return integer(v, path, 0, MAX_COUNT, null=False)


def _nodes(v: object) -> NodeCounts:
    d = obj(v, "nodes", 16)
    c = NodeCounts(*(_count(d.get(k), f"nodes.{k}") for k in ("total", "online", "stale", "offline")))
    if c.online + c.stale + c.offline > c.total:
        raise WireError("nodes: online + stale + offline exceeds total")
    return c


def _alert(v: object, path: str) -> AlertCount:
    d = obj(v, path, 16)
    a = AlertCount(code=_code(d.get("code"), f"{path}.code"),
                   severity=_choice(d.get("severity"), f"{path}.severity", ALERT_SEVERITIES),
                   count=_count(d.get("count"), f"{path}.count"), firing=_count(d.get("firing"), f"{path}.firing"))
    if a.firing > a.count:
        raise WireError(f"{path}: firing exceeds count")
    return a


def _worst(v: object, path: str) -> WorstNode:
    d = obj(v, path, 16)
    node = d.get("node")
    if not valid_name(node):
        raise WireError(f"{path}.node: not a node name")
    return WorstNode(node=node, state=_choice(d.get("state"), f"{path}.state", LIVENESS),
                     severity=_choice(d.get("severity"), f"{path}.severity", ALERT_SEVERITIES, null=True),
                     code=_code(d.get("code"), f"{path}.code", null=True),
                     alerts=_count(d.get("alerts"), f"{path}.alerts"))


def _rack(v: object, path: str) -> RackLine:
    d = obj(v, path, 16)
    r = RackLine(rack=text(d.get("rack"), f"{path}.rack", MAX_NAME), nodes=_count(d.get("nodes"), f"{path}.nodes"),
                 reporting=_count(d.get("reporting"), f"{path}.reporting"),
                 power_w=number(d.get("power_w"), f"{path}.power_w", 0, MAX_POWER_W, null=False),
                 budget_w=number(d.get("budget_w"), f"{path}.budget_w", 0, MAX_POWER_W),
                 level=_choice(d.get("level"), f"{path}.level", RACK_LEVELS, null=True))
    if r.reporting > r.nodes:
        raise WireError(f"{path}: reporting exceeds nodes")
    return r


def read_summary(cluster: str, payload: object) -> ClusterSummary:
    """Decode the summary of `cluster`. Raises WireError (one line) for anything off-contract,
    an empty payload (a cleared retained topic) included: the caller forgets the cluster."""
    d = envelope(payload, "summary", cluster)
    alerts = tuple(_alert(x, f"alerts[{i}]") for i, x in enumerate(array(d.get("alerts", []), "alerts",
                                                                          MAX_ALERT_KINDS)))
    if len({(a.code, a.severity) for a in alerts}) != len(alerts):
        raise WireError("alerts: a (code, severity) pair repeats")
    worst = tuple(_worst(x, f"worst[{i}]") for i, x in enumerate(array(d.get("worst", []), "worst", MAX_WORST)))
    racks = tuple(_rack(x, f"racks[{i}]") for i, x in enumerate(array(d.get("racks", []), "racks", MAX_RACKS)))
    return ClusterSummary(
        cluster=cluster, ts=number(d.get("ts"), "ts", 0, MAX_TS, null=False),
        interval_s=number(d.get("interval_s"), "interval_s", MIN_INTERVAL_S, MAX_INTERVAL_S, null=False),
        nodes=_nodes(d.get("nodes")), power_w=number(d.get("power_w"), "power_w", 0, MAX_POWER_W),
        alerts=alerts, worst=worst, racks=racks,
        racks_omitted=integer(d.get("racks_omitted", 0), "racks_omitted", 0, MAX_COUNT, null=False),
        alert_kinds_omitted=integer(d.get("alert_kinds_omitted", 0), "alert_kinds_omitted", 0, MAX_COUNT,
                                    null=False))


def parse_summary(topic: object, payload: object) -> ClusterSummary:
    """`parse_message` for the summary topic: validates topic and payload; raises WireError."""
    return read_summary(parse_summary_topic(topic), payload)
