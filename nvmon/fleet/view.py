"""One node as the fleet sees it (`NodeView`, its `Liveness`) and the fleet's counters
(`FleetStats`, `RackPower`): the frozen values `FleetState` hands to views and rules.

Times: `*_rx` are receive times on the aggregator's clock; `alive_rx` is when the node's latest
sample was taken, by the sample's own timestamp put on the aggregator's clock (nvmon.fleet.guard),
so a late or replayed sample does not make a node look fresh.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from nvmon.fleet.summary import Facts, Summary
from nvmon.wire.contract import AlertSet, Inventory, Status, Tick

NodeKey = tuple[str, str]  # (cluster, node)


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
    clock_skew_s: float | None = None  # the node's clock is this far ahead (negative: behind) of the receiver's,
    # beyond the bound its timestamps are trusted to (its latest status's or samples': nvmon.fleet.guard)
    inventory: Inventory | None = None
    facts: Facts | None = None  # what the inventory implies for summaries (specs, expected counts)
    inventory_stale: bool = False  # ticks now come with another layout; waiting for the new inventory
    tick: Tick | None = None
    tick_rx: float | None = None
    alive_rx: float | None = None  # when the latest tick was taken, by its own timestamp on this clock
    # (nvmon.fleet.guard.sample_time), counting ticks not applied (layout mismatch, or replaced
    # by a newer one while the subscriber was behind: see `note_seen`)
    alerts: AlertSet | None = None
    summary: Summary | None = None
    dropped: int = 0  # this node's messages that broke the contract
    duplicate: str | None = None  # evidence that two daemons publish as this node (nvmon.fleet.guard)

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
    clock_skewed: int = 0  # nodes whose clocks are off beyond the bound (status_time, guard.sample_time)
    expired: int = 0  # nodes without an inventory forgotten after a silence (FleetState.sweep)
    duplicates: int = 0  # node names found claimed by two daemons (fleet.duplicate_node)
    kept_alive: int = 0  # empty retained statuses ignored because the node's samples still arrive
