"""The fleet as the aggregator sees it: every node's status, inventory, latest tick and alerts.

`FleetState` is pure and synchronous: `apply(topic, payload, now)` takes one MQTT message as it
came off the wire and never raises. A message that breaks the contract is counted (by reason)
and dropped; valid ones replace the node's `NodeView`, a frozen snapshot that a view may keep
and read without copying. The TUI (`nvmon tui`) and the headless `nvmon fleet` share this one
state, fed by `FleetSubscriber`; neither needs to know MQTT.

Views redraw by version: every change increments `version` and records which node changed, so
`changed_since(v)` names the rows to repaint. Liveness depends on time as well as messages, so the
owner calls `sweep(now)` about once a second (the subscriber does) to turn silence into changes.

Memory is bounded: at most `max_nodes` nodes (new ones beyond are counted and dropped), a fixed
ring of history per node, and inventories share their identical parts (links, topology, ports)
across nodes of the same board, which cuts an HGX inventory from ~47 KB to a few KB per node.

Strings from the wire (node names are safe; models, labels, racks, summaries are not) are kept as
they came. Showing them literally, e.g. `rich.text.Text(s)`, is the view's job.

Single-threaded: one event loop owns the state; no locks.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from nvmon.fleet.history import History, Points
from nvmon.fleet.summary import Facts, Summary, summarize
from nvmon.wire.contract import MAX_PAYLOAD_BYTES, AlertSet, Inventory, Status, Tick, WireError, parse_topic
from nvmon.wire.parse import parse_message

log = logging.getLogger("nvmon.fleet")

NodeKey = tuple[str, str]  # (cluster, node)

# Why a message was dropped. `classify` maps the reader's WireError onto the middle ones.
DROP_REASONS = ("topic", "oversize", "json", "schema", "content", "mismatch", "layout", "node_cap", "reader_bug")
_CLASSES = (  # (fragment of a WireError message, reason); the test suite pins each one
    ("exceeds", "oversize"), ("payload is", "json"), ("not UTF-8", "json"), ("invalid JSON", "json"),
    ("nested too deeply", "json"), ("non-finite number", "json"), ("expected a JSON object", "json"),
    ("unknown schema", "schema"), ("disagree with the topic", "mismatch"),
)
_RETAINED = ("status", "inventory", "alerts")


def _pcie_bytes(t: Tick) -> float | None:
    """PCIe TX + RX over all GPUs (None when no GPU reported it), for the history's sparkline."""
    vals = [v for g in t.gpus for v in (g.pcie_tx_bytes_per_s, g.pcie_rx_bytes_per_s) if v is not None]
    return float(sum(vals)) if vals else None


def classify(error: WireError) -> str:
    """The drop reason for a reader's refusal: json, schema, mismatch, oversize, else content."""
    text = str(error)
    return next((reason for fragment, reason in _CLASSES if fragment in text), "content")


# A status's own `ts` dates it, bounded by the receiver's clock: one from the future (a skewed node
# clock) counts as received now, one older than this as unknown (received now too).
SKEW_TOLERANCE_S = 5.0
MAX_STATUS_AGE_S = 366 * 86400.0


def status_time(ts: float, rx: float) -> tuple[float, float | None]:
    """When a status says it happened, sanely bounded by `rx` (when it arrived), and the node's
    clock skew if it is visibly ahead (None otherwise: a retained message's lateness is no skew)."""
    if ts > rx + SKEW_TOLERANCE_S:
        return rx, ts - rx
    if not rx - MAX_STATUS_AGE_S <= ts:
        return rx, None
    return min(ts, rx), None


@dataclass(frozen=True, slots=True)
class Liveness:
    state: str  # "online" | "stale" (no tick for stale_after_s) | "offline" (status offline or the will)
    age_s: float  # since the last sign of life (online, stale) or since it went offline
    reason: str | None = None  # offline: "lost" (the will), "stopped" (clean), or None
    exact: bool = True  # False: an upper bound, "silent for up to age_s" (a will found retained: see NodeView)


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node, as of its latest messages; replaced (never mutated) on every change.
    `*_rx` are receive times (unix s, the aggregator's clock)."""

    cluster: str
    node: str
    first_seen: float
    stale_after_s: float
    status: Status | None = None
    status_rx: float | None = None
    status_since: float | None = None  # when the status last changed state, by its own `ts` (status_time)
    since_bound: bool = False  # status_since is the will found retained: dated at the daemon's connect,
    # not its death, so the node's latest own timestamp is the best date (an upper bound on the age)
    clock_skew_s: float | None = None  # the latest status's `ts` was this far ahead of the receiver's clock
    inventory: Inventory | None = None
    facts: Facts | None = None  # what the inventory implies for summaries (specs, expected counts)
    inventory_stale: bool = False  # ticks now come with another layout; waiting for the new inventory
    tick: Tick | None = None
    tick_rx: float | None = None
    alive_rx: float | None = None  # latest tick, counting ticks not applied (layout mismatch, or replaced
    # by a newer one while the subscriber was behind: see `note_seen`)
    alerts: AlertSet | None = None
    summary: Summary | None = None
    dropped: int = 0  # this node's messages that broke the contract

    @property
    def key(self) -> NodeKey:
        return (self.cluster, self.node)

    @property
    def rack(self) -> str | None:
        return self.inventory.rack if self.inventory is not None else None

    @property
    def labels(self) -> Mapping[str, str]:
        return self.inventory.labels if self.inventory is not None else {}

    @property
    def cluster_uuid(self) -> str | None:
        """The multi-node NVLink domain (NVL72-class) the node's GPUs report, from its inventory:
        what a view groups nodes by when present; None outside one (HGX: an all-zero UUID)."""
        return self.inventory.cluster_uuid if self.inventory is not None else None

    def alert_counts(self) -> dict[str, int]:
        """Active alerts by severity ("critical", "warning", "info")."""
        return dict(Counter(a.severity for a in self.alerts.alerts)) if self.alerts is not None else {}

    def liveness(self, now: float) -> Liveness:
        st, alive, status_rx = self.status, self.alive_rx, self.status_rx
        if st is not None and st.state == "offline" and (alive is None or status_rx is None or alive <= status_rx):
            # A tick after the offline status proves the node alive again (it restarted and its
            # online status is still on the way), so only silence keeps it offline.
            since = self.status_since or now
            if self.since_bound:  # the latest own timestamp of the node's retained messages
                for m in (self.inventory, self.alerts):
                    if m is not None and since < m.ts <= now:
                        since = m.ts
            return Liveness("offline", max(0.0, now - since), st.reason, exact=not self.since_bound)
        last = alive if alive is not None else self.first_seen
        if status_rx is not None and (alive is None or status_rx > alive):
            last = status_rx
        age = max(0.0, now - last)
        return Liveness("stale" if age > self.stale_after_s else "online", age)


@dataclass(frozen=True, slots=True)
class RackPower:
    rack: str | None
    nodes: int
    reporting: int  # online nodes with a power reading: the sums cover only these
    power_w: float
    power_limit_w: float


@dataclass(frozen=True, slots=True)
class FleetStats:
    received: int
    applied: int  # valid messages (duplicates of retained state included); received = applied + cleared + dropped
    cleared: int  # empty retained messages: an operator removed the node's topic
    dropped: int
    dropped_by_reason: dict[str, int]
    last_drop: str | None  # "reason: one-line message", safe to display
    clock_skewed: int = 0  # nodes whose latest status is dated ahead of this clock (status_time)


class _Drop(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class FleetState:
    """See the module docstring. `nodes` is a read-only mapping NodeKey → NodeView."""

    def __init__(self, *, max_nodes: int = 20_000, stale_factor: float = 3.0, default_interval_s: float = 1.0,
                 history_points: int = 300):
        if max_nodes < 1 or stale_factor <= 0 or default_interval_s <= 0:
            raise ValueError("max_nodes, stale_factor and default_interval_s must be positive")
        self.max_nodes, self.stale_factor = max_nodes, stale_factor
        self.default_interval_s, self.history_points = default_interval_s, history_points
        self._nodes: dict[NodeKey, NodeView] = {}
        self.nodes: Mapping[NodeKey, NodeView] = MappingProxyType(self._nodes)
        self._history: dict[NodeKey, History] = {}
        self._live: dict[NodeKey, str] = {}  # liveness at the last change or sweep
        self._seen: dict[NodeKey, float] = {}  # ticks received but not (yet) applied, folded in by sweep
        self.version = 0
        self._changed: OrderedDict[NodeKey, int] = OrderedDict()  # key → version of its last change
        self._horizon = 0  # changes at or before this version may have been forgotten
        self._pool: dict = {}  # interned inventory parts, shared across nodes
        self._received = self._applied = self._cleared = 0
        self._dropped: Counter[str] = Counter()
        self._last_drop: str | None = None
        self._skew_noted = False
        self.last_rx: float | None = None  # when the latest message of any kind arrived, dropped ones too:
        # a feed silent for everyone at once is the broker's stall, not every node's (nvmon.fleet.rules)

    # --- input --------------------------------------------------------------------------------

    def apply(self, topic: object, payload: object, now: float) -> bool:
        """Apply one message; False if it was dropped (and counted). Never raises."""
        self._received += 1
        if self.last_rx is None or now > self.last_rx:
            self.last_rx = now
        try:
            cleared = self._apply(str(topic), payload, now)
        except _Drop as d:
            self._note_drop(d.reason, str(d))
            return False
        except Exception as e:  # a reader bug must not take the TUI or fleet rules down with it
            msg = " ".join(f"{type(e).__name__}: {e}".split())[:200]
            if self._dropped["reader_bug"] == 0:
                log.exception("fleet: unexpected error applying a message on %.80r", str(topic))
            self._note_drop("reader_bug", WireError(msg).args[0])
            return False
        self._applied += not cleared
        return True

    def _apply(self, topic: str, payload: object, now: float) -> bool:
        """Apply or raise _Drop; True when the message was an empty (clearing) retained one."""
        try:
            cluster, node, kind = parse_topic(topic)
        except WireError as e:
            raise _Drop("topic", str(e)) from None
        key = (cluster, node)
        view = self._nodes.get(key)
        if view is None and len(self._nodes) >= self.max_nodes:  # before parsing: a flood costs little
            raise _Drop("node_cap", f"more than {self.max_nodes} nodes: {cluster}/{node} ignored")
        if isinstance(payload, (bytes, bytearray, memoryview)):
            if len(payload) == 0 and kind in _RETAINED:
                self._clear(key, kind, now)  # how MQTT deletes a retained message
                return True
            if len(payload) > MAX_PAYLOAD_BYTES:  # checked before parsing: cheap, and a clear reason
                self._count_bad(view)
                raise _Drop("oversize", f"{kind} of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
        try:
            msg = parse_message(topic, payload)
        except WireError as e:
            self._count_bad(view)
            raise _Drop(classify(e), f"{cluster}/{node}/{kind}: {e}") from None
        if view is None:
            view = NodeView(cluster=cluster, node=node, first_seen=now, stale_after_s=self._stale_after(None, None))
        handler = {"status": self._on_status, "inventory": self._on_inventory, "sample": self._on_tick,
                   "alerts": self._on_alerts}[kind]
        new, drop = handler(view, msg, now)
        if new is not view:
            self._nodes[key] = new
            self._live[key] = new.liveness(now).state
            self._bump(key)
        if drop is not None:
            raise _Drop(drop, f"{cluster}/{node}/{kind}: {self._drop_text[drop]}")
        return False

    _drop_text = {"layout": "sample layout differs from the inventory's (inventory not yet re-sent)"}

    def _on_status(self, v: NodeView, st: Status, now: float) -> tuple[NodeView, None]:
        if st == v.status:
            return v, None  # the retained copy again (a resubscribe): not a new sign of life
        same_state = v.status is not None and (v.status.state, v.status.reason) == (st.state, st.reason)
        at, skew = status_time(st.ts, now)
        # The will is stamped when the daemon connected, not when it died: seen live, its arrival
        # dates it (1.5 × keepalive after the death); found retained by a viewer just started, the
        # node's own latest timestamp bounds it (Liveness.exact False).
        seen_before = v.status is not None or v.alive_rx is not None
        bound = st.state == "offline" and st.reason != "stopped" and not seen_before
        if st.state == "offline" and st.reason != "stopped" and seen_before:
            at = now
        if same_state:
            at, bound = v.status_since, v.since_bound
        if skew is not None and v.clock_skew_s is None:
            log.log(logging.DEBUG if self._skew_noted else logging.WARNING,
                    "fleet: %s/%s's status is dated %.0f s ahead of this clock (clock skew?); dated by arrival%s",
                    v.cluster, v.node, skew, "" if self._skew_noted else " (further nodes at DEBUG)")
            self._skew_noted = True
        return replace(v, status=st, status_rx=now, status_since=at, since_bound=bound, clock_skew_s=skew,
                       stale_after_s=self._stale_after(st, v.tick)), None

    def _on_inventory(self, v: NodeView, inv: Inventory, now: float) -> tuple[NodeView, None]:
        inv = self._intern_inventory(inv)
        if inv == v.inventory:
            return v, None
        facts = self._facts(inv)
        summary = v.summary
        if v.tick is not None:
            summary = summarize(v.tick, facts if inv.layout == v.tick.layout else None)
        return replace(v, inventory=inv, facts=facts, inventory_stale=False, summary=summary), None

    def _on_tick(self, v: NodeView, t: Tick, now: float) -> tuple[NodeView, str | None]:
        stale_after = self._stale_after(v.status, t)
        if v.inventory is not None and v.inventory.layout != t.layout:
            # The node's GPUs or ports changed and the new inventory has not arrived (the daemon
            # re-sends it at once). The tick's arrays cannot be labelled: it proves the node is
            # alive, but its data is dropped rather than shown against the wrong devices.
            return replace(v, alive_rx=now, inventory_stale=True, stale_after_s=stale_after), "layout"
        summary = summarize(t, v.facts)
        hist = self._history.get(v.key)
        if hist is None:
            hist = self._history[v.key] = History(self.history_points)
        hist.append(now, {"nvlink_bytes_per_s": summary.nvlink_bytes_per_s, "power_w": summary.power_w,
                          "hottest_c": summary.hottest_c, "ib_bytes_per_s": summary.ib_bytes_per_s,
                          "pcie_bytes_per_s": _pcie_bytes(t)})
        return replace(v, tick=t, tick_rx=now, alive_rx=now, summary=summary, inventory_stale=False,
                       stale_after_s=stale_after), None

    def _on_alerts(self, v: NodeView, alerts: AlertSet, now: float) -> tuple[NodeView, None]:
        return (v, None) if alerts == v.alerts else (replace(v, alerts=alerts), None)

    def _clear(self, key: NodeKey, kind: str, now: float) -> None:
        self._cleared += 1
        view = self._nodes.get(key)
        if view is None:
            return
        if kind == "status":  # the node was decommissioned: forget it entirely
            self.forget(key)
        elif kind == "inventory":
            self._nodes[key] = replace(view, inventory=None, facts=None, inventory_stale=False,
                                       summary=summarize(view.tick, None) if view.tick else None)
            self._bump(key)
        else:
            self._nodes[key] = replace(view, alerts=None)
            self._bump(key)

    def _stale_after(self, status: Status | None, tick: Tick | None) -> float:
        interval = next((i for i in (status.interval_s if status else None, tick.interval_s if tick else None)
                         if i is not None and i > 0), self.default_interval_s)
        return self.stale_factor * interval

    def _count_bad(self, view: NodeView | None) -> None:
        if view is not None:  # unknown nodes are not created by bad messages
            self._nodes[view.key] = replace(view, dropped=view.dropped + 1)
            self._bump(view.key)

    def _note_drop(self, reason: str, message: str) -> None:
        self._dropped[reason] += 1
        self._last_drop = f"{reason}: {message}"
        self.version += 1  # the header's counters changed, though no row did

    def _bump(self, key: NodeKey) -> None:
        self.version += 1
        self._changed[key] = self.version
        self._changed.move_to_end(key)
        while len(self._changed) > 2 * self.max_nodes:  # removed nodes' entries age out
            _, ver = self._changed.popitem(last=False)
            self._horizon = ver

    def _intern(self, obj):
        if len(self._pool) > 200_000:  # hostile variety: start over rather than grow
            self._pool.clear()
        return self._pool.setdefault(obj, obj)

    def _intern_inventory(self, inv: Inventory) -> Inventory:
        """Share identical parts between nodes of the same board (links, topology, ports, spec)."""
        gpus = tuple(replace(g, links=self._intern(tuple(self._intern(lk) for lk in g.links)),
                             pcie=self._intern(g.pcie)) for g in inv.gpus)
        spec = self._pool.setdefault(("spec", json.dumps(inv.spec, sort_keys=True)), inv.spec)  # dicts don't hash
        return replace(inv, gpus=gpus, topology_matrix=self._intern(inv.topology_matrix), ib=self._intern(inv.ib),
                       nvswitches=self._intern(inv.nvswitches), nvswitch_links=self._intern(inv.nvswitch_links),
                       spec=spec)

    def _facts(self, inv: Inventory) -> Facts:
        """Facts.of(inv), shared by nodes whose inventories agree on everything it reads."""
        key = ("facts", tuple((g.index, g.model, g.pcie, g.power_default_limit_w) for g in inv.gpus),
               tuple(p.link_layer for p in inv.ib), json.dumps(inv.spec.get("node"), sort_keys=True))
        facts = self._pool.get(key)
        if facts is None or len(self._pool) > 200_000:
            facts = self._pool[key] = Facts.of(inv)
        return facts

    # --- output -------------------------------------------------------------------------------

    def forget(self, key: NodeKey) -> bool:
        """Drop a node (decommissioned); it comes back if it publishes again."""
        if self._nodes.pop(key, None) is None:
            return False
        self._history.pop(key, None)
        self._live.pop(key, None)
        self._bump(key)
        return True

    def note_seen(self, topic: str, now: float) -> None:
        """A known node's tick arrived but is not applied yet (the subscriber is behind and keeps
        only each node's newest). Cheap; `sweep` folds it into liveness, so a slow aggregator does
        not mistake its own lag for silent nodes."""
        if self.last_rx is None or now > self.last_rx:
            self.last_rx = now
        parts = topic.split("/")
        if len(parts) == 5 and (parts[2], parts[3]) in self._nodes:
            self._seen[(parts[2], parts[3])] = now

    def sweep(self, now: float) -> set[NodeKey]:
        """Re-judge liveness at `now`; nodes that went stale (or back) count as changed."""
        for key, seen in self._seen.items():
            view = self._nodes.get(key)
            if view is not None and (view.alive_rx is None or seen > view.alive_rx):
                self._nodes[key] = replace(view, alive_rx=seen)
        self._seen.clear()
        changed = set()
        for key, view in self._nodes.items():
            state = view.liveness(now).state
            if self._live.get(key) != state:
                self._live[key] = state
                changed.add(key)
        for key in changed:
            self._bump(key)
        return changed

    def changed_since(self, version: int) -> set[NodeKey]:
        """Keys changed after `version`. A key absent from `nodes` was removed. A caller that fell
        more than 2 × max_nodes changes behind gets every key (and should redraw everything)."""
        if version < self._horizon:
            return set(self._nodes) | set(self._changed)
        out = set()
        for key, ver in reversed(self._changed.items()):
            if ver <= version:
                break
            out.add(key)
        return out

    def liveness(self, now: float) -> dict[NodeKey, Liveness]:
        return {key: view.liveness(now) for key, view in self._nodes.items()}

    def counts(self, now: float) -> dict[str, int]:
        """Nodes by liveness: {"online": n, "stale": n, "offline": n}."""
        out = {"online": 0, "stale": 0, "offline": 0}
        for view in self._nodes.values():
            out[view.liveness(now).state] += 1
        return out

    def racks(self, now: float) -> dict[str | None, RackPower]:
        """GPU power per rack (None: nodes without a rack), summed over online nodes only:
        a stale node's last reading is not its present draw."""
        acc: dict[str | None, list] = {}
        for view in self._nodes.values():
            a = acc.setdefault(view.rack, [0, 0, 0.0, 0.0])
            a[0] += 1
            s = view.summary
            if s is not None and s.power_w is not None and view.liveness(now).state == "online":
                a[1] += 1
                a[2] += s.power_w
                a[3] += s.power_limit_w or 0.0
        return {rack: RackPower(rack, n, r, w, lim) for rack, (n, r, w, lim) in acc.items()}

    def history(self, key: NodeKey, since: float | None = None) -> Points | None:
        hist = self._history.get(key)
        return None if hist is None else hist.points(since)

    @property
    def stats(self) -> FleetStats:
        return FleetStats(received=self._received, applied=self._applied, cleared=self._cleared,
                          dropped=sum(self._dropped.values()), dropped_by_reason=dict(self._dropped),
                          last_drop=self._last_drop,
                          clock_skewed=sum(v.clock_skew_s is not None for v in self._nodes.values()))
