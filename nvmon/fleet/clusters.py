"""Clusters seen through their summaries: the board of the latest `@summary` per cluster, the one
judgement of a cluster's reach (`cluster.unreachable`), and the subscriber that feeds the board.

A view of many clusters (the TUI's overview, a central `nvmon fleet --watch summaries`) does not
receive the nodes' samples, only each cluster's retained summary (nvmon.wire.summary), published by
the cluster's own `nvmon fleet` every `interval_s` (the summary says its rate). A summary older than
`stale_intervals` × that rate (by its own timestamp, bounded by when it arrived: a retained one left
by a bridge that went down is judged by its age, not by its arrival) means the cluster is out of
reach: its bridge, its broker or its `nvmon fleet` is gone. That is ONE alert for the cluster,
`cluster.unreachable`, not a page per node: the nodes' own statuses never cross a lost bridge, and
the cluster's own `nvmon fleet` still pages its nodes' faults through its hooks.

`ClusterBoard` is pure and synchronous (`apply(topic, payload, now)`, never raises; a refused message
is counted and dropped, the cluster's previous summary stays). `ClusterRules` is `FleetRules` plus
the cluster rule, so `FleetAlerts` runs both in one engine set; `SummaryWatcher` subscribes the
board (and the clusters' shared acks and silences) on its own connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from nvmon.aio import running
from nvmon.alerts.model import FLEET_CODES, fingerprint
from nvmon.alerts.rules import Condition
from nvmon.fleet.rules import FleetRuleOverride, FleetRules, FleetSettings, Identity, Place, _age
from nvmon.fleet.state import FleetState
from nvmon.fleet.subscriber import SubscriberStatus, subscribed
from nvmon.fleet.view import status_time
from nvmon.wire.contract import CONTROL_LEVEL, WireError, control_subscription, valid_name
from nvmon.wire.mqtt import Backoff, MqttSettings, make_client
from nvmon.wire.session import MqttSession
from nvmon.wire.summary import ClusterSummary, parse_summary, parse_summary_topic, summary_subscription

log = logging.getLogger("nvmon.fleet")

CODE = "cluster.unreachable"
DEFAULT_STALE_INTERVALS = 3.0
MIN_GRACE_S = 2.0  # a summary is late only past its interval plus this (the publisher ticks twice a second)
UNHEARD_AFTER_S = 30.0  # a cluster named on the command line that never sent a summary: unreachable after this
PROBE_S, PROBE_QUIET_S = 1.0, 0.3  # summarized_clusters: at most this long, done this long after the last one


@dataclass(frozen=True, slots=True)
class Reach:
    """A cluster's reach now: "live", "unreachable" (its summary is older than `stale_after_s`), or
    "waiting" (named, no summary yet, not long enough to say). `age_s`: of its latest summary, by the
    summary's own timestamp (None: none yet)."""

    state: str
    age_s: float | None
    stale_after_s: float


@dataclass(frozen=True, slots=True)
class ClusterView:
    cluster: str
    summary: ClusterSummary | None = None
    rx: float | None = None  # when the latest summary arrived (this clock)
    heard: float | None = None  # when it says it was built, bounded by rx (nvmon.fleet.view.status_time)
    dropped: int = 0  # this cluster's summaries refused


class ClusterBoard:
    """The latest summary per cluster. `clusters`: the clusters named (shown, and judged, from the
    start); others appear with their first summary, up to `max_clusters`."""

    def __init__(self, clusters: Sequence[str] = (), *, stale_intervals: float = DEFAULT_STALE_INTERVALS,
                 max_clusters: int = 1000, started: float | None = None):
        self.named = tuple(dict.fromkeys(clusters))
        self.stale_intervals, self.max_clusters = stale_intervals, max_clusters
        self.started = time.time() if started is None else started
        self._views: dict[str, ClusterView] = {c: ClusterView(c) for c in self.named}
        self.clusters: Mapping[str, ClusterView] = MappingProxyType(self._views)
        self.version = 0
        self.received = self.dropped = 0
        self.last_drop: str | None = None

    def apply(self, topic: object, payload: object, now: float) -> bool:
        """Take one summary message; False when refused (counted). Never raises. An empty payload
        (the retained topic cleared) forgets a cluster that was not named."""
        self.received += 1
        try:
            cluster = parse_summary_topic(topic)
            if self.named and cluster not in self.named:
                raise WireError(f"summary of cluster {cluster} not watched here")
            view = self._views.get(cluster)
            if view is None and len(self._views) >= self.max_clusters:
                raise WireError(f"more than {self.max_clusters} clusters: {cluster} dropped")
            if isinstance(payload, (bytes, bytearray)) and not payload:
                if cluster not in self.named and self._views.pop(cluster, None) is not None:
                    self.version += 1
                return True
            summary = parse_summary(topic, payload)
        except WireError as e:
            self._drop(str(e), self._views.get(str(topic).split("/")[2]) if str(topic).count("/") == 3 else None)
            return False
        except Exception as e:  # a reader bug must not end the subscriber
            self._drop(f"reader bug: {type(e).__name__}", None)
            log.exception("fleet: unexpected error reading a summary on %.80r", str(topic))
            return False
        heard, _ = status_time(summary.ts, now)
        self._views[cluster] = ClusterView(cluster, summary, now, heard, view.dropped if view is not None else 0)
        self.version += 1
        return True

    def _drop(self, why: str, view: ClusterView | None) -> None:
        self.dropped += 1
        self.last_drop = f"summary: {why}"
        if view is not None:
            self._views[view.cluster] = ClusterView(view.cluster, view.summary, view.rx, view.heard, view.dropped + 1)
        if self.dropped <= 10 or self.dropped % 1000 == 0:
            log.warning("fleet: cluster summary refused (%d so far): %s", self.dropped, why)

    def reach(self, cluster: str, now: float) -> Reach:
        """The one judgement of whether a cluster is in reach (see the module docstring)."""
        v = self._views.get(cluster)
        if v is None or v.summary is None or v.heard is None:
            waited = now - self.started
            return Reach("unreachable" if waited > UNHEARD_AFTER_S else "waiting", None, UNHEARD_AFTER_S)
        interval = v.summary.interval_s
        after = max(self.stale_intervals * interval, interval + MIN_GRACE_S)
        age = max(0.0, now - v.heard)
        return Reach("unreachable" if age > after else "live", age, after)

    def conditions(self, now: float, book: Mapping) -> tuple[dict[Place, list[Condition]], dict[Place, Identity]]:
        """`cluster.unreachable` for each cluster out of reach (nothing when the rule is off)."""
        out: dict[Place, list[Condition]] = {}
        ids: dict[Place, Identity] = {}
        rule = book.get("cluster.unreachable")
        if rule is None:
            return out, ids
        for cluster, view in self._views.items():
            r = self.reach(cluster, now)
            if r.state != "unreachable":
                continue
            s = view.summary
            if s is None:
                what = f"no summary since watching began {_age(now - self.started)} ago"
                last = ""
            else:
                what = (f"no summary for {_age(r.age_s)} (one every {s.interval_s:g} s; unreachable after "
                        f"{r.stale_after_s:g} s)")
                last = f"; last known: {s.nodes.online}/{s.nodes.total} nodes online"
            place = Place("cluster", cluster, "")
            out[place] = [Condition(
                fingerprint("cluster.unreachable", cluster, None), "cluster.unreachable",
                f"cluster {cluster} unreachable: {what}: its bridge, broker or nvmon fleet is down{last}",
                rule.runbook, value=None if r.age_s is None else round(r.age_s, 1), threshold=r.stale_after_s)]
            ids[place] = Identity(cluster)
        return out, ids


class ClusterRules(FleetRules):
    """The fleet rules over `state` plus `cluster.unreachable` over `board`."""

    def __init__(self, settings: FleetSettings = FleetSettings(), board: ClusterBoard | None = None):
        super().__init__(settings)
        self.board = board if board is not None else ClusterBoard(stale_intervals=settings.summary_stale_intervals)

    def conditions(self, state: FleetState, now: float) -> dict[Place, list[Condition]]:
        out = super().conditions(state, now)
        more, ids = self.board.conditions(now, self.book)
        out.update(more)
        self.identities = {**self.identities, **ids}
        return out


class SummaryWatcher:
    """Subscribes `board` to the summaries of `clusters` (every cluster when none) on the broker of
    `settings`; `controls(topic, payload)`, if given, gets the clusters' shared acks and silences.
    `status` has the fields of `FleetSubscriber.status` that nvmon fleet's loop and the TUI read."""

    def __init__(self, settings: MqttSettings, board: ClusterBoard, *, clusters: Sequence[str] = (),
                 controls: Callable[[str, bytes], object] | None = None, clock: Callable[[], float] = time.time,
                 backoff: Backoff = Backoff()):
        for c in clusters:
            if not valid_name(c):
                raise ValueError(f"cluster name {c!r}: use 1-64 of A-Z a-z 0-9 . _ -")
        self.settings, self.board, self.controls, self.clock = settings, board, controls, clock
        self.filters = tuple(summary_subscription(c) for c in clusters) or (summary_subscription(),)
        if controls is not None:
            self.filters += tuple(control_subscription(c) for c in clusters) or (control_subscription(),)
        self.filter = ", ".join(self.filters)
        self.session = MqttSession(settings, client_id=f"nvmon-summaries-{os.getpid()}-{id(self) & 0xFFFF:04x}",
                                   log=log, what="fleet: summaries: MQTT", backoff=backoff, clock=clock)
        self.messages = 0

    @property
    def status(self) -> SubscriberStatus:
        s = self.session.stats
        return SubscriberStatus(url=self.settings.url, filter=self.filter, connected=s.connected, since=s.since,
                                connects=s.connects, errors=s.errors, last_error=s.last_error,
                                last_error_at=s.last_error_at, messages=self.messages, coalesced=0, rate_per_s=0.0,
                                dropped=self.board.dropped)

    async def run(self) -> None:
        await self.session.run(self._consume, setup=self._subscribe)

    async def _subscribe(self, client) -> None:
        for f in self.filters:
            await client.subscribe(f, qos=1)

    async def _consume(self, client) -> None:
        log.info("fleet: watching cluster summaries on %s (%s)", self.settings.url, self.filter)
        suffix = "/" + CONTROL_LEVEL
        async for message in client.messages:
            self.messages += 1
            topic = str(message.topic)
            if self.controls is not None and topic.endswith(suffix):
                try:
                    self.controls(topic, bytes(message.payload))
                except Exception:  # the owner's callback: never let it end the reader
                    log.exception("fleet: controls callback failed on %s", topic[:120])
            else:
                self.board.apply(topic, message.payload, self.clock())


# --- nvmon fleet's two ways of watching (nvmon.fleet.service) ---------------------------------


def fleet_rules(settings: FleetSettings, clusters: Sequence[str] = ()) -> FleetRules:
    """The rules `nvmon fleet` runs: the fleet rules over nodes, or (`watch = "summaries"`) the
    cluster rule over the summaries of `clusters` (every cluster's when none). Each book holds only
    the rules that can hold there (the log line at start lists them)."""
    summaries = settings.watch == "summaries"
    off = {code: FleetRuleOverride(enabled=False) for code in FLEET_CODES if (code == CODE) != summaries}
    only = settings.model_copy(update={"rules": {**settings.rules, **off}})
    if summaries:
        return ClusterRules(only, ClusterBoard(clusters, stale_intervals=settings.summary_stale_intervals,
                                               max_clusters=settings.max_clusters))
    return FleetRules(only)


@contextlib.asynccontextmanager
async def fleet_feed(settings: FleetSettings, mqtt: MqttSettings, state: FleetState, alerts, *,
                     clusters: Sequence[str] = (), clock: Callable[[], float] = time.time):
    """`async with fleet_feed(...) as sub:` feeds `nvmon fleet` for the block: its nodes (a
    FleetSubscriber) and, every `summary_every_s`, their clusters' summaries published (a
    SummaryPublisher); or, watching summaries, the summaries into its ClusterRules' board (a
    SummaryWatcher). Shared acks and silences go to `alerts.shared` either way."""
    from nvmon.fleet.digest import SummaryPublisher

    if settings.watch == "summaries":
        w = SummaryWatcher(mqtt, alerts.rules.board, clusters=clusters, controls=alerts.shared.apply, clock=clock)
        async with running(w.run(), name="nvmon.fleet.summaries"):
            yield w
        return
    async with subscribed(mqtt, state, clusters=clusters, controls=alerts.shared.apply) as sub:
        if settings.summary_every_s <= 0:
            yield sub
            return
        pub = SummaryPublisher(mqtt, state, clusters=clusters, every_s=settings.summary_every_s,
                               fleet_alerts=alerts.active, rules=alerts.rules, clock=clock)
        async with running(pub.run(), name="nvmon.fleet.summary"):
            yield sub


async def summarized_clusters(settings: MqttSettings, *, wait_s: float = PROBE_S,
                              quiet_s: float = PROBE_QUIET_S) -> set[str]:
    """The clusters whose summary is retained on the broker (what `nvmon tui` without --cluster looks
    at to choose its start screen). Retained messages come right after the subscription, so the look
    ends `quiet_s` after the last one, `wait_s` at most. An empty set when the broker cannot be
    reached in that time: the view's own connection then says why."""
    quick = dataclasses.replace(settings, timeout_s=min(settings.timeout_s, wait_s))
    seen: set[str] = set()
    try:
        async with asyncio.timeout(2 * wait_s):
            async with make_client(quick, client_id=f"nvmon-probe-{os.getpid()}") as client:
                await client.subscribe(summary_subscription(), qos=1)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + wait_s
                messages = aiter(client.messages)
                while (left := min(quiet_s, deadline - loop.time())) > 0:
                    try:
                        m = await asyncio.wait_for(anext(messages), left)
                    except TimeoutError:
                        break
                    with contextlib.suppress(WireError):
                        if m.payload:
                            seen.add(parse_summary_topic(m.topic))
    except Exception as e:  # unreachable, refused, slow: not this look's to report
        log.debug("fleet: no look at the clusters' summaries on %s: %s", settings.url, e)
        return set()
    return seen
