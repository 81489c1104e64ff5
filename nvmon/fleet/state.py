"""The fleet as the aggregator sees it: every node's status, inventory, latest tick and alerts.

`FleetState` is pure and synchronous: `apply(topic, payload, now)` takes one MQTT message as it
came off the wire and never raises. A message that breaks the contract is counted (by reason)
and dropped; valid ones replace the node's `NodeView`, a frozen snapshot that a view may keep
and read without copying. The TUI (`nvmon tui`) and the headless `nvmon fleet` share this one
state, fed by `FleetSubscriber`; neither needs to know MQTT.

Views redraw by version: every change increments `version` and records which node changed, so
`changed_since(v)` names the rows to repaint. Liveness depends on time as well as messages, so the
owner calls `sweep(now)` about once a second (the subscriber does) to turn silence into changes.

Memory is bounded: at most `max_nodes` nodes in at most `max_clusters` clusters, of which at most
`max_without_inventory` created by samples or alerts before any inventory (new ones beyond each cap
are dropped before parsing and counted, `node_cap` / `cluster_cap`), a fixed ring of history per
node, and inventories share their identical parts (links, topology, ports) across nodes of the same
board, which cuts an HGX inventory from ~47 KB to a few KB per node. A node that never sent an
inventory (a daemon sends one as it connects) and has been silent for `forget_without_inventory_s`
is forgotten by `sweep` (counted, logged): a flood of made-up names goes away when it stops.

What the state does not take on trust (nvmon.fleet.guard): a sample makes its node fresh as of
when it was taken, by its own timestamp on this clock (skewed clocks flagged, not trusted); an
empty retained status forgets a node only once its samples have stopped; two daemons publishing
as one node are reported once (`fleet.duplicate_node`).

Strings from the wire (node names are safe; models, labels, racks, summaries are not) are kept as
they came. Showing them literally, e.g. `rich.text.Text(s)`, is the view's job.

Single-threaded: one event loop owns the state; no locks.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from nvmon.fleet.guard import Claims, FeedLag, NodeClock, sample_time
from nvmon.fleet.history import History, Points
from nvmon.fleet.summary import Facts, summarize
from nvmon.fleet.view import (  # noqa: F401  (NodeView and the rest are imported from here too)
    MAX_STATUS_AGE_S, SKEW_TOLERANCE_S, FleetStats, Liveness, NodeKey, NodeView, RackPower, status_time)
from nvmon.wire.contract import MAX_PAYLOAD_BYTES, AlertSet, Inventory, Status, Tick, WireError, parse_topic
from nvmon.wire.parse import parse_message

log = logging.getLogger("nvmon.fleet")

# Why a message was dropped. `classify` maps the reader's WireError onto the middle ones.
DROP_REASONS = ("topic", "oversize", "json", "schema", "content", "mismatch", "layout", "node_cap", "cluster_cap",
                "reader_bug")
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


class _Drop(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class FleetState:
    """See the module docstring. `nodes` is a read-only mapping NodeKey → NodeView."""

    def __init__(self, *, max_nodes: int = 20_000, stale_factor: float = 3.0, default_interval_s: float = 1.0,
                 history_points: int = 300, max_clusters: int = 1000, max_without_inventory: int = 1000,
                 forget_without_inventory_s: float = 30.0):
        if min(max_nodes, max_clusters, max_without_inventory) < 1 or stale_factor <= 0 or default_interval_s <= 0:
            raise ValueError("the caps, stale_factor and default_interval_s must be positive")
        self.max_nodes, self.stale_factor = max_nodes, stale_factor
        self.max_clusters, self.max_without_inventory = max_clusters, max_without_inventory
        self.forget_without_inventory_s = forget_without_inventory_s
        self._clusters: Counter[str] = Counter()  # nodes per cluster
        self._no_inventory: set[NodeKey] = set()  # nodes that have sent no inventory (yet)
        self._clocks: dict[NodeKey, NodeClock] = {}
        self._lag = FeedLag()
        self._claims = Claims()
        self._expired = self._kept_alive = 0
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
        if view is None:  # the caps, before parsing: a flood of made-up names costs little
            if len(self._nodes) >= self.max_nodes:
                raise _Drop("node_cap", f"more than {self.max_nodes} nodes: {cluster}/{node} ignored")
            if cluster not in self._clusters and len(self._clusters) >= self.max_clusters:
                raise _Drop("cluster_cap", f"more than {self.max_clusters} clusters: {cluster}/{node} ignored")
            if kind in ("sample", "alerts") and len(self._no_inventory) >= self.max_without_inventory:
                raise _Drop("node_cap", f"more than {self.max_without_inventory} nodes without an inventory: "
                            f"{cluster}/{node} ignored")
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
            self._put(key, new)
            self._live[key] = new.liveness(now).state
            self._bump(key)
        if drop is not None:
            raise _Drop(drop, f"{cluster}/{node}/{kind}: {self._drop_text[drop]}")
        return False

    _drop_text = {"layout": "sample layout differs from the inventory's (inventory not yet re-sent)"}

    def _put(self, key: NodeKey, view: NodeView) -> None:
        if key not in self._nodes:
            self._clusters[key[0]] += 1
        self._nodes[key] = view
        if view.inventory is None:
            self._no_inventory.add(key)
        else:
            self._no_inventory.discard(key)

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
            self._note_skew(v, skew, "status")
        dup = self._claims.status(v.key, st.state, now)
        return replace(v, status=st, status_rx=now, status_since=at, since_bound=bound, clock_skew_s=skew,
                       stale_after_s=self._stale_after(st, v.tick), duplicate=dup or v.duplicate), None

    def _note_skew(self, v: NodeView, skew: float, what: str) -> None:
        log.log(logging.DEBUG if self._skew_noted else logging.WARNING,
                "fleet: %s/%s's %s is dated %.0f s %s this clock (clock skew?); dated by arrival%s", v.cluster,
                v.node, what, abs(skew), "ahead of" if skew > 0 else "behind", "" if self._skew_noted
                else " (further nodes at DEBUG)")
        self._skew_noted = True

    def _on_inventory(self, v: NodeView, inv: Inventory, now: float) -> tuple[NodeView, None]:
        inv = self._intern_inventory(inv)
        if inv == v.inventory:
            return v, None
        facts = self._facts(inv)
        summary = v.summary
        if v.tick is not None:
            summary = summarize(v.tick, facts if inv.layout == v.tick.layout else None)
        dup = self._claims.inventory(v.key, inv.hostname, now)
        return replace(v, inventory=inv, facts=facts, inventory_stale=False, summary=summary,
                       duplicate=dup or v.duplicate), None

    def _on_tick(self, v: NodeView, t: Tick, now: float) -> tuple[NodeView, str | None]:
        stale_after = self._stale_after(v.status, t)
        clock = self._clocks.get(v.key)
        if clock is None:
            clock = self._clocks[v.key] = NodeClock(now)
        at, skew = sample_time(clock, now, t.ts, self._lag, t.interval_s)  # when taken: fresh by its own time
        if skew is not None and v.clock_skew_s is None:
            self._note_skew(v, skew, "sample")
        alive = at if v.alive_rx is None else max(at, v.alive_rx)
        dup = v.duplicate
        if v.inventory is not None or v.status is not None:  # sample-only names are not worth the evidence
            dup = self._claims.tick(v.key, t.interval_s, now) or dup
        if v.inventory is not None and v.inventory.layout != t.layout:
            # The node's GPUs or ports changed and the new inventory has not arrived (the daemon
            # re-sends it at once). The tick's arrays cannot be labelled: it proves the node is
            # alive, but its data is dropped rather than shown against the wrong devices.
            return replace(v, alive_rx=alive, inventory_stale=True, stale_after_s=stale_after, clock_skew_s=skew,
                           duplicate=dup), "layout"
        summary = summarize(t, v.facts)
        hist = self._history.get(v.key)
        if hist is None:
            hist = self._history[v.key] = History(self.history_points)
        hist.append(now, {"nvlink_bytes_per_s": summary.nvlink_bytes_per_s, "power_w": summary.power_w,
                          "hottest_c": summary.hottest_c, "ib_bytes_per_s": summary.ib_bytes_per_s,
                          "pcie_bytes_per_s": _pcie_bytes(t)})
        return replace(v, tick=t, tick_rx=now, alive_rx=alive, summary=summary, inventory_stale=False,
                       stale_after_s=stale_after, clock_skew_s=skew, duplicate=dup), None

    def _on_alerts(self, v: NodeView, alerts: AlertSet, now: float) -> tuple[NodeView, None]:
        return (v, None) if alerts == v.alerts else (replace(v, alerts=alerts), None)

    def _clear(self, key: NodeKey, kind: str, now: float) -> None:
        self._cleared += 1
        view = self._nodes.get(key)
        if view is None:
            return
        if kind == "status":  # the node was decommissioned: forget it entirely, unless it still ticks
            if view.alive_rx is not None and view.liveness(now).state == "online":
                self._kept_alive += 1
                log.warning("fleet: %s/%s's retained status was cleared but its samples still arrive (the latest "
                            "%.1f s ago): kept; stop its daemon before forgetting it", key[0], key[1],
                            now - view.alive_rx)
                return
            self.forget(key)
        elif kind == "inventory":
            self._put(key, replace(view, inventory=None, facts=None, inventory_stale=False,
                                   summary=summarize(view.tick, None) if view.tick else None))
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
        for d in (self._history, self._live, self._clocks, self._seen):
            d.pop(key, None)
        self._no_inventory.discard(key)
        self._claims.forget(key)
        self._clusters[key[0]] -= 1
        if self._clusters[key[0]] <= 0:
            del self._clusters[key[0]]
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

    def note_replaced(self, topic: str) -> None:
        """A tick replaced in the subscriber's queue by the same node's newer one, never applied:
        counted for the two-daemons rate (guard.Claims), which would otherwise miss it under load."""
        parts = topic.split("/")
        if len(parts) == 5:
            self._claims.replaced((parts[2], parts[3]))

    def sweep(self, now: float) -> set[NodeKey]:
        """Re-judge liveness at `now`; nodes that went stale (or back) count as changed."""
        for key, seen in self._seen.items():
            view = self._nodes.get(key)
            if view is not None and (view.alive_rx is None or seen > view.alive_rx):
                self._nodes[key] = replace(view, alive_rx=seen)
        self._seen.clear()
        self._expire(now)
        changed = set()
        for key, view in self._nodes.items():
            state = view.liveness(now).state
            if self._live.get(key) != state:
                self._live[key] = state
                changed.add(key)
        for key in changed:
            self._bump(key)
        return changed

    def _expire(self, now: float) -> None:
        """Forget nodes that never sent an inventory (a daemon sends one when it connects) and have
        been silent for forget_without_inventory_s: names that only sprayed samples go away. A
        node whose status says offline stays: that is a real node's will or clean stop."""
        gone = []
        for key in self._no_inventory:
            v = self._nodes.get(key)
            if v is None or (v.status is not None and v.status.state == "offline"):
                continue
            heard = max(x for x in (v.first_seen, v.alive_rx, v.status_rx, v.tick_rx) if x is not None)
            if now - heard > self.forget_without_inventory_s:
                gone.append(key)
        for key in gone:
            self.forget(key)
        if gone:
            self._expired += len(gone)
            log.warning("fleet: forgot %d node%s that sent no inventory and nothing for %g s (e.g. %s/%s); "
                        "%d so far, %d without an inventory left", len(gone), "" if len(gone) == 1 else "s",
                        self.forget_without_inventory_s, gone[0][0], gone[0][1], self._expired,
                        len(self._no_inventory))

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
                          clock_skewed=sum(v.clock_skew_s is not None for v in self._nodes.values()),
                          expired=self._expired, duplicates=self._claims.found, kept_alive=self._kept_alive)

    @property
    def feed_lag_s(self) -> float:
        """How late the whole feed's samples arrive now (the aggregator or broker behind), taken
        off each node's lateness when judging freshness (nvmon.fleet.guard)."""
        return self._lag.lag_s

    def has_cluster(self, cluster: str) -> bool:
        """Whether some node of `cluster` is in the state."""
        return cluster in self._clusters
