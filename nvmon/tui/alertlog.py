"""Active alerts across the fleet, and the ones this view saw resolve.

Nodes publish their full active set (`alerts`, retained). An alert that leaves a node's set was
resolved; `AlertLog` notices that by comparing each changed node's set with the one it saw before,
and keeps the most recent `keep` resolutions. What no node can say of itself (node.offline,
node.stale, rack.power, fleet.same_fault) comes from the app's FleetAlerts, the engine and rules
`nvmon fleet` runs, judged over the same state (`fleet_sync`).

Acks and silences: `shared_marks` judges each active alert against the clusters' shared sets
(`nvmon/v1/<cluster>/@controls`, kept by a `SharedControls`) with the engine's own rules: an ack
names the alert's episode (fingerprint + start), a silence matches through `Silence.matches`
with `cluster=<its cluster>` added to its matchers, as every evaluator does. The log also holds
the view's local marks (`acked` / `silenced`: key presses not shared, or not yet seen back from
the broker); a local mark is dropped once the shared set confirms it, so from then on the shared
set alone decides (an unsilence elsewhere shows).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from nvmon.codes import Severity
from nvmon.alerts.engine import wire_alert
from nvmon.alerts.model import AlertRecord, Silence
from nvmon.alerts.shared import SharedControls, ack_key, engine_controls
from nvmon.fleet.state import FleetState, NodeKey
from nvmon.wire.contract import Alert
from nvmon.wire.control import ControlSet, SharedAck


@dataclass(frozen=True, slots=True)
class Shared:
    """What the shared set says about one active alert."""

    ack: SharedAck | None = None
    silence: Silence | None = None  # the engine's form: id "<cluster>/<id>", matchers with cluster=


def alert_record(key: NodeKey, rack: str | None, a: Alert) -> AlertRecord:
    """A node's published alert as the engine's record, for `Silence.matches` (the fields and
    labels a silence can name; the rack comes from the node's inventory)."""
    return AlertRecord(fingerprint=a.fingerprint, status=a.state, code=a.code, severity=a.severity, cluster=key[0],
                       node=key[1], summary=a.summary, runbook="", starts_at=a.starts_at if a.starts_at is not None
                       else a.since, rack=rack, gpu=a.gpu, link=a.link, device=a.device, port=a.port,
                       labels=dict(a.labels))


def fleet_key(r: AlertRecord) -> NodeKey:
    """Where a fleet alert is listed: its node, else its rack, else the cluster as a whole."""
    return (r.cluster, r.node if r.node else f"rack {r.rack}" if r.rack else "fleet")


@dataclass(frozen=True, slots=True)
class Row:
    key: NodeKey  # a fleet alert about a rack or a fault: (cluster, "rack R" / "fleet")
    alert: Alert
    resolved_at: float | None = None  # None: active
    fleet: bool = False  # judged by the fleet rules (node.offline, node.stale, ...), not published by a node

    @property
    def ident(self) -> str:
        return f"{self.key[0]}/{self.key[1]}/{self.alert.fingerprint}"


class AlertLog:
    def __init__(self, keep: int = 200):
        self._version = -1
        self._seen: dict[NodeKey, tuple] = {}  # node → its alerts tuple as last seen (identity check)
        self.resolved: deque[Row] = deque(maxlen=keep)
        self.acked: set[str] = set()  # local marks (Row.ident)
        self.silenced: set[str] = set()
        self._index: dict[str, tuple[ControlSet, dict, list[Silence], float]] = {}  # per cluster, by set and now
        self.fleet: list[Row] = []  # the fleet rules' active alerts (fleet_sync)

    def shared_marks(self, rows: list[Row], controls: SharedControls | None, state: FleetState,
                     now: float) -> dict[str, Shared]:
        """Row.ident → what the shared sets say, for the active rows they ack or silence. Local
        marks the shared set confirms are dropped here."""
        if controls is None or not controls.sets:
            return {}
        out: dict[str, Shared] = {}
        for r in rows:
            if r.resolved_at is not None or (cs := controls.sets.get(r.key[0])) is None:
                continue
            acks, silences = self._cluster_index(cs, now)
            a = r.alert
            ack = acks.get(ack_key(a.fingerprint, a.starts_at)) if a.starts_at is not None else None
            silence = None
            if silences:
                view = state.nodes.get(r.key)
                rec = alert_record(r.key, view.rack if view is not None else None, a)
                silence = next((s for s in silences if s.matches(rec, now)), None)
            if ack is None and silence is None:
                continue
            out[r.ident] = Shared(ack, silence)
            if ack is not None:
                self.acked.discard(r.ident)
            if silence is not None:
                self.silenced.discard(r.ident)
        return out

    def _cluster_index(self, cs: ControlSet, now: float) -> tuple[dict, list[Silence]]:
        hit = self._index.get(cs.cluster)
        if hit is not None and hit[0] is cs and hit[3] == now:
            return hit[1], hit[2]
        acks = {ack_key(a.fingerprint, a.starts_at): a for a in cs.acks}
        silences = [s for s in engine_controls(cs, now)[1] if s.starts_at <= now]
        self._index[cs.cluster] = (cs, acks, silences, now)
        return acks, silences

    @staticmethod
    def silence_count(controls: SharedControls | None, now: float, cluster: str | None = None) -> int:
        """Shared silences in force now (of `cluster`, or of every cluster seen)."""
        if controls is None:
            return 0
        return sum(1 for c, cs in controls.sets.items() if cluster is None or c == cluster
                   for s in cs.silences if s.starts_at <= now < s.ends_at)

    def sync(self, state: FleetState, now: float) -> None:
        keys = state.nodes.keys() if self._version < 0 else state.changed_since(self._version)
        self._version = state.version
        for key in keys:
            view = state.nodes.get(key)
            new = view.alerts.alerts if view is not None and view.alerts is not None else ()
            old = self._seen.get(key, ())
            if new is old:
                continue
            if old:
                still = {a.fingerprint for a in new}
                for a in old:
                    if a.fingerprint not in still:
                        self.resolved.appendleft(Row(key, a, now))
            if new:
                self._seen[key] = new
            else:
                self._seen.pop(key, None)

    def fleet_sync(self, active: list[AlertRecord], transitions, now: float) -> None:
        """The fleet rules' alerts (the app's FleetAlerts: the engine `nvmon fleet` runs) as rows,
        and the ones that resolved after paging into the log of resolutions."""
        self.fleet = [Row(fleet_key(r), wire_alert(r), fleet=True) for r in active]
        for tr in transitions:
            r = tr.record
            if r.status == "resolved" and r.fired_at is not None:
                self.resolved.appendleft(Row(fleet_key(r), wire_alert(r), now, fleet=True))

    @staticmethod
    def active(state: FleetState, fleet: list[Row] = ()) -> list[Row]:
        """Every active alert (the nodes' own, then `fleet`'s), most severe first, then oldest, then by node."""
        rows = [Row(view.key, a) for view in state.nodes.values() if view.alerts is not None
                for a in view.alerts.alerts] + list(fleet)
        rows.sort(key=lambda r: (Severity.rank_of(r.alert.severity), r.alert.since, r.key, r.alert.fingerprint))
        return rows
