"""What the fleet state does not take on trust: a node's clock, its name, and who it says it is.

- **Freshness by the sample's own timestamp.** A sample proves its node alive when it was taken
  (`Tick.ts`), not when it arrived: a sample delivered late (a backlog at the broker, a replay)
  does not make its node look fresh. Node clocks are not the aggregator's, so each node's clock
  offset is learned as the least (arrival − ts) of its recent samples (`NodeClock`, a windowed
  minimum: network delay only ever adds to it). An offset beyond `SKEW_BOUND_S` either way is a
  skewed clock: the node is flagged (`NodeView.clock_skew_s`, counted in `FleetStats.clock_skewed`,
  logged once) and its timestamps are not trusted, its samples dated by arrival instead. A clock
  that steps (NTP, a resumed VM) shows as the same lateness in `STEADY_SAMPLES` samples in a row at
  the node's own cadence: the offset is re-based then, so a node whose clock stepped back is not
  stale for the minute the window would take.
  When every node's samples arrive late together, the lateness is the feed's (the aggregator or the
  broker behind), not each node's: `FeedLag` measures it (the least lateness of any sample in the
  last second, from at least 3 samples) and it is taken off, so a slow aggregator does not page
  its own lag as stale nodes (nvmon.fleet.rules' feed-stall rule handles a feed that stops).
- **One name, two daemons.** Two daemons publishing as one node (a cloned config, a reinstalled
  host next to its old self) interleave their samples and, if they share a client id, take the
  broker session from each other about once a second (each take-over publishes the other's will).
  `Claims` notices either: more samples than one daemon's interval allows (≥ 1.8 × for two
  windows running), inventories alternating between two hosts, or online / offline flips of the
  status (≥ 6 in 15 s: faster than a crash loop that systemd restarts every 5 s). It is reported
  once per node: one WARNING line `fleet.duplicate_node: <cluster>/<node> ...` with the evidence,
  and `NodeView.duplicate`.
  The daemon's client id is unique per host and database (nvmon.wire.mqtt.node_client_id), so
  the sessions stop taking each other over; the detection is for what remains visible.

Pure and synchronous, owned by `FleetState` (one event loop, no locks).
"""

from __future__ import annotations

import logging
import math
from collections import deque

log = logging.getLogger("nvmon.fleet")

SKEW_BOUND_S = 5.0  # a node clock further off than this either way is flagged and its timestamps unused
OFFSET_WINDOW_S = 30.0  # the clock offset is the least (arrival − ts) over the last one or two windows
LAG_MIN_SAMPLES = 3  # the feed's lag is judged from at least this many samples in a second
STEADY_SAMPLES = 3  # this many samples in a row equally late (a clock step, not a backlog): re-base
STEP_MIN_S = 1.0  # lateness below this is left to the window
DUP_RATE = 1.8  # samples per window over this many times what the interval allows: two publishers
DUP_WINDOW_INTERVALS = 10  # a rate window is this many of the node's intervals (at least DUP_WINDOW_MIN_S)
DUP_WINDOW_MIN_S = 5.0
DUP_FLIPS = 6  # status online/offline changes within DUP_FLIP_WINDOW_S: two sessions taking turns
DUP_FLIP_WINDOW_S = 15.0  # a crash loop under systemd (RestartSec=5) flips slower than this
DUP_HOST_SWAPS = 3  # inventories that alternate back to a host already seen


class NodeClock:
    """A node's clock offset (aggregator clock − node clock, network delay included), the least
    (arrival − ts) over the current and the previous OFFSET_WINDOW_S."""

    __slots__ = ("cur", "prev", "since", "last_late", "steady")

    def __init__(self, now: float):
        self.cur = self.prev = math.inf
        self.since = now
        self.last_late, self.steady = 0.0, 0

    def stepped(self, late: float, rx: float, ts: float, interval_s: float) -> bool:
        """Whether `late` (this sample's lateness) is the STEADY_SAMPLES-th in a row of one size:
        the node's clock stepped back (a backlog drains with lateness falling by an interval a
        sample). Then the offset is re-based on this sample."""
        tol = min(0.5, 0.5 * interval_s) if interval_s > 0 else 0.5
        self.steady = self.steady + 1 if late >= STEP_MIN_S and abs(late - self.last_late) < tol else 0
        self.last_late = late
        if self.steady + 1 < STEADY_SAMPLES:
            return False
        self.cur = self.prev = rx - ts
        self.since, self.steady = rx, 0
        return True

    def offset(self, rx: float, ts: float) -> float:
        """Fold in one sample (arrival `rx`, own timestamp `ts`); the offset estimate now."""
        if rx - self.since >= OFFSET_WINDOW_S:
            self.prev = self.cur if rx - self.since < 2 * OFFSET_WINDOW_S else math.inf
            self.cur, self.since = math.inf, rx
        self.cur = min(self.cur, rx - ts)
        return min(self.cur, self.prev)


class FeedLag:
    """How late the whole feed is: the least lateness of any sample in the last whole second."""

    __slots__ = ("lag_s", "_least", "_n", "_until")

    def __init__(self):
        self.lag_s = 0.0
        self._least, self._n, self._until = math.inf, 0, 0.0

    def add(self, late_s: float, now: float) -> float:
        """One sample `late_s` behind its node's usual delay; the feed's lag to take off it."""
        if now >= self._until:
            self.lag_s = self._least if self._n >= LAG_MIN_SAMPLES and self._least != math.inf else 0.0
            self._least, self._n, self._until = math.inf, 0, now + 1.0
        self._least = min(self._least, late_s)
        self._n += 1
        return self.lag_s


def sample_time(clock: NodeClock, rx: float, ts: float, lag: FeedLag,
                interval_s: float = 1.0) -> tuple[float, float | None]:
    """When a sample shows its node alive, on the aggregator's clock, and the node's clock skew
    (seconds ahead, negative behind) when beyond SKEW_BOUND_S (then the sample is dated `rx`)."""
    if not math.isfinite(ts):
        return rx, None
    offset = clock.offset(rx, ts)
    late = max(0.0, (rx - ts) - offset)
    if clock.stepped(late, rx, ts, interval_s):
        offset, late = rx - ts, 0.0
    if abs(offset) > SKEW_BOUND_S:
        return rx, -offset
    return rx - max(0.0, late - lag.add(late, rx)), None


class Claim:
    """The evidence that one node name is claimed by two daemons, gathered per node."""

    __slots__ = ("win_start", "win_ticks", "hot_windows", "flips", "last_state", "hosts", "swaps", "reported")

    def __init__(self, now: float):
        self.win_start, self.win_ticks, self.hot_windows = now, 0, 0
        self.flips: deque[float] = deque(maxlen=DUP_FLIPS)
        self.last_state: str | None = None
        self.hosts: list[str] = []  # the last two distinct hostnames of its inventories
        self.swaps = 0
        self.reported = False


class Claims:
    """Per-node duplicate-name evidence; `tick`, `status` and `inventory` return the evidence line
    the first time a node's evidence is conclusive (then never again for that node), else None."""

    def __init__(self):
        self._claims: dict[tuple[str, str], Claim] = {}
        self.found = 0  # nodes reported

    def _get(self, key: tuple[str, str], now: float) -> Claim:
        c = self._claims.get(key)
        if c is None:
            c = self._claims[key] = Claim(now)
        return c

    def forget(self, key: tuple[str, str]) -> None:
        self._claims.pop(key, None)

    def replaced(self, key: tuple[str, str]) -> None:
        """A tick of a node already under watch that a newer one replaced before it was applied (the
        aggregator was behind): still a sample received, so two publishers stay twice the rate."""
        c = self._claims.get(key)
        if c is not None:
            c.win_ticks += 1

    def tick(self, key: tuple[str, str], interval_s: float, now: float) -> str | None:
        c = self._get(key, now)
        window = max(DUP_WINDOW_MIN_S, DUP_WINDOW_INTERVALS * interval_s)
        if now - c.win_start >= window:
            allowed = (now - c.win_start) / interval_s
            hot = c.win_ticks >= DUP_RATE * allowed
            c.hot_windows = c.hot_windows + 1 if hot else 0
            ticks, span = c.win_ticks, now - c.win_start
            c.win_start, c.win_ticks = now, 0
            if c.hot_windows >= 2:
                return self._report(key, c, f"{ticks} samples in {span:.0f} s where its interval of {interval_s:g} s "
                                            f"allows {allowed:.0f}: two publishers")
        c.win_ticks += 1
        return None

    def status(self, key: tuple[str, str], state: str, now: float) -> str | None:
        c = self._get(key, now)
        if c.last_state is not None and state != c.last_state:
            c.flips.append(now)
            if len(c.flips) == DUP_FLIPS and now - c.flips[0] <= DUP_FLIP_WINDOW_S:
                c.last_state = state
                return self._report(key, c, f"its status flipped online/offline {DUP_FLIPS} times in "
                                            f"{now - c.flips[0]:.0f} s: two sessions taking turns")
        c.last_state = state
        return None

    def inventory(self, key: tuple[str, str], hostname: str | None, now: float) -> str | None:
        if not hostname:
            return None
        c = self._get(key, now)
        if not c.hosts or c.hosts[-1] == hostname:
            c.hosts[:] = [hostname]
            return None
        if hostname in c.hosts:
            c.swaps += 1
        c.hosts[:] = [c.hosts[-1], hostname]
        if c.swaps >= DUP_HOST_SWAPS:
            return self._report(key, c, f"its inventory alternates between hosts {c.hosts[0]!r} and {c.hosts[1]!r}")
        return None

    def _report(self, key: tuple[str, str], c: Claim, evidence: str) -> str | None:
        if c.reported:
            return None
        c.reported = True
        self.found += 1
        log.warning("fleet.duplicate_node: %s/%s is claimed by two daemons: %s (give each its own node name)",
                    key[0], key[1], evidence)
        return evidence
