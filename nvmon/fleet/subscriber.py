"""Feed a `FleetState` from MQTT: subscribe to one cluster's topic tree, a list of clusters'
(`clusters=`, nvmon fleet --cluster a,b), or every cluster's; apply every message, reconnect forever.

The TUI header and its "broker lost" banner read `status` (connected, messages/s, dropped, last
error); `nvmon fleet` reads the same. Run `await FleetSubscriber(...).run()` as a task and cancel
it to stop.

With `controls=callback`, the same connection also subscribes to the cluster's (or every
cluster's) shared acks and silences, `nvmon/v1/<cluster>/@controls` (nvmon.wire.control), and
hands each such message to `callback(topic, payload)` instead of the state: the TUI shows them,
`nvmon fleet` applies them. Off the sample path: the reader only keeps the latest message per
control topic (a burst of big control messages costs a dict entry each), and a separate task
hands them on one per loop turn. When every cluster is watched, a control topic whose cluster has
no node in the state waits (at most MAX_WAITING_CONTROLS, the oldest dropped and counted) until
one appears: a writer of @controls for made-up clusters costs nothing.

The broker connection is the shared `nvmon.wire.session.MqttSession` (connect, backoff, the log
lines, the error counts, cancel safety); this module only uses the client's `subscribe` and
`messages`, so that it does not depend on aiomqtt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

from nvmon.aio import Latest, running
from nvmon.fleet.state import FleetState
from nvmon.wire.contract import CONTROL_LEVEL, control_subscription, subscription
from nvmon.wire.mqtt import Backoff, MqttSettings, read_ahead
from nvmon.wire.session import MqttSession

log = logging.getLogger("nvmon.fleet")

RATE_WINDOW_S = 5  # messages/s is averaged over this many whole seconds
MAX_PENDING = 50_000  # samples waiting to be applied (one per topic): flush at this many
FLUSH_CHUNK = 64  # samples applied between two looks at the socket
SLICE_S = 0.1  # behind: apply for at most this long, then read for as long as that took
BUSY_SHARE = 0.5  # applying more than this share of the time: behind, start coalescing samples
MAX_WAITING_CONTROLS = 100  # control topics of clusters not (yet) in the state, kept (latest each)


@dataclass(frozen=True, slots=True)
class SubscriberStatus:
    url: str
    filter: str
    connected: bool
    since: float | None  # when the connection came up or went away (unix s); None until the first came up
    connects: int  # successful connections, the first one included
    errors: int  # failed attempts and lost connections
    last_error: str | None  # one line, safe to display
    last_error_at: float | None
    messages: int  # received since start
    coalesced: int  # samples replaced by a newer one of the same node before being applied (we were behind)
    rate_per_s: float  # over the last RATE_WINDOW_S seconds
    dropped: int  # messages the state refused (all reasons; `state.stats` has them by reason)
    controls: int = 0  # control messages handed to the callback
    controls_coalesced: int = 0  # control messages replaced by a newer one of their topic before being handed on
    controls_dropped: int = 0  # control topics of unknown clusters dropped past MAX_WAITING_CONTROLS


class _Rate:
    """Messages per second over a sliding window of whole-second buckets (O(1) per message)."""

    def __init__(self, window: int = RATE_WINDOW_S):
        self.window = window
        self.buckets = [0] * (window + 1)
        self.second = 0

    def add(self, now: float) -> None:
        self._advance(int(now))
        self.buckets[self.second % len(self.buckets)] += 1

    def _advance(self, second: int) -> None:
        if second <= self.second:
            return
        for s in range(max(self.second + 1, second - len(self.buckets) + 1), second + 1):
            self.buckets[s % len(self.buckets)] = 0
        self.second = second

    def per_s(self, now: float) -> float:
        self._advance(int(now))
        current = self.second % len(self.buckets)
        # Whole seconds only: the current second is still filling up.
        return sum(c for i, c in enumerate(self.buckets) if i != current) / self.window


class _Load:
    """The share of wall time spent applying, judged once a second: over BUSY_SHARE is behind."""

    def __init__(self):
        self.start, self.spent, self.behind = time.perf_counter(), 0.0, False

    def add(self, seconds: float) -> None:
        self.spent += seconds
        now = time.perf_counter()
        if now - self.start >= 1.0:
            self.behind = self.spent / (now - self.start) > BUSY_SHARE
            self.start, self.spent = now, 0.0


class FleetSubscriber:
    """Subscribes `state` to `cluster`, or to each of `clusters`, on the broker of `settings` (neither:
    every cluster);
    `controls(topic, payload)`, if given, gets the cluster's control messages (it must not raise;
    `nvmon.alerts.shared.SharedControls.apply` does not)."""

    def __init__(self, settings: MqttSettings, state: FleetState, *, cluster: str | None = None,
                 clusters: Sequence[str] | None = None, backoff: Backoff = Backoff(),
                 clock: Callable[[], float] = time.time, sweep_every_s: float = 1.0, max_delay_s: float = 0.25,
                 controls: Callable[[str, bytes], object] | None = None):
        self.settings, self.state, self.backoff, self.clock = settings, state, backoff, clock
        # Several clusters (nvmon fleet --cluster a,b): one filter each on the one connection.
        watched = tuple(dict.fromkeys(clusters)) if clusters else (cluster,)
        self.filters = tuple(subscription(c) for c in watched)  # ValueError on a bad cluster name
        self.filter = ", ".join(self.filters)  # for status lines and the log
        self.controls = controls
        self.controls_filters = tuple(control_subscription(c) for c in watched) if controls is not None else ()
        # Unique per process: two views on one desk must not take each other's session over.
        self.client_id = f"nvmon-fleet-{os.getpid()}-{id(self) & 0xFFFF:04x}"
        self.sweep_every_s, self.max_delay_s = sweep_every_s, max_delay_s
        self.session = MqttSession(settings, client_id=self.client_id, log=log, what="fleet: MQTT", backoff=backoff,
                                   clock=clock)
        self._messages = self._coalesced = 0
        self._rate = _Rate()
        self._watch_all = not clusters and cluster is None
        self._controls_in: Latest[bytes] = Latest()  # topic → latest payload, not yet handed on
        self._controls_waiting: OrderedDict[str, bytes] = OrderedDict()  # of clusters not in the state yet
        self._controls_done = self._controls_coalesced = self._controls_dropped = 0

    @property
    def status(self) -> SubscriberStatus:
        s = self.session.stats
        return SubscriberStatus(
            url=self.settings.url, filter=self.filter, connected=s.connected, since=s.since,
            connects=s.connects, errors=s.errors, last_error=s.last_error,
            last_error_at=s.last_error_at, messages=self._messages, coalesced=self._coalesced,
            rate_per_s=self._rate.per_s(self.clock()), dropped=self.state.stats.dropped,
            controls=self._controls_done, controls_coalesced=self._controls_coalesced,
            controls_dropped=self._controls_dropped)

    async def run(self) -> NoReturn:
        """Subscribe and apply until cancelled; reconnects with backoff, sweeps liveness every second."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._sweeper(), name="nvmon.fleet.sweep")
            if self.controls is not None:
                tg.create_task(self._hand_controls(), name="nvmon.fleet.controls")
            await self.session.run(self._connected, setup=self._subscribe)

    async def _sweeper(self) -> NoReturn:
        # Silence is news too: a node that stops ticking turns stale without any message arriving.
        while True:
            await asyncio.sleep(self.sweep_every_s)
            self.state.sweep(self.clock())
            if self._controls_waiting:  # their clusters may have appeared meanwhile
                self._controls_in.wake()

    def _control_in(self, topic: str, payload: bytes) -> None:
        """The reader's whole share of a control message: keep it as its topic's latest."""
        older_waiting = self._controls_waiting.pop(topic, None) is not None
        if self._controls_in.put(topic, payload) or older_waiting:
            self._controls_coalesced += 1

    async def _hand_controls(self) -> NoReturn:
        """Hand each control topic's latest message to the callback, one per loop turn."""
        controls, waiting = self.controls, self._controls_waiting
        while True:
            await self._controls_in.wait()
            for t in [t for t in waiting if self.state.has_cluster(t.split("/")[2])]:
                self._controls_in.put(t, waiting.pop(t))
            while self._controls_in:
                topic, payload = self._controls_in.pop()
                if self._watch_all and not self.state.has_cluster(topic.split("/")[2]):
                    waiting[topic] = payload
                    while len(waiting) > MAX_WAITING_CONTROLS:
                        dropped, _ = waiting.popitem(last=False)
                        self._controls_dropped += 1
                        log.warning("fleet: control message of %s dropped: more than %d clusters without a node "
                                    "sent one (%d dropped so far)", dropped[:120], MAX_WAITING_CONTROLS,
                                    self._controls_dropped)
                    continue
                try:
                    controls(topic, payload)
                except Exception:  # the owner's callback: never let it end the task
                    log.exception("fleet: controls callback failed on %s", topic[:120])
                self._controls_done += 1
                await asyncio.sleep(0)  # the sample reader goes on between two control messages

    async def _subscribe(self, client) -> None:
        # QoS 1: retained status/inventory/alerts arrive at least once; samples stay QoS 0.
        for f in self.filters + self.controls_filters:
            await client.subscribe(f, qos=1)

    async def _connected(self, client) -> None:
        read_ahead(client)  # every packet the socket holds in one loop turn, not one per turn
        log.info("fleet: subscribed to %s on %s%s", self.filter, self.settings.url,
                 f"; shared acks and silences on {', '.join(self.controls_filters)}" if self.controls_filters else "")
        await self._consume(client)

    async def _consume(self, client) -> None:
        """Apply messages as they come; when behind, a node's newer sample replaces its older one.

        While the subscriber keeps up, every sample is applied as soon as aiomqtt's queue is
        empty. When applying takes more than BUSY_SHARE of the time (a starved or too small CPU),
        samples wait in `pending`, one per topic, so each node's latest tick is applied once
        instead of every stale one in turn (toolong's replaceable messages). Reading and applying
        then take turns in short slices: a slice (≤ SLICE_S) applies the nodes that have waited
        longest, each with its newest sample (a newer one replaces the payload but keeps the
        node's place in line), then reading goes on for as long as the slice took. So while
        reading keeps up, an applied sample is at most about one publish interval old however far
        behind applying is: behind in how often a node is applied, not in how old what it shows
        is. Memory stays bounded (one sample per node). Retained kinds are applied
        at once, after the node's pending sample: order within a node is kept, so a will that
        follows a tick still wins.
        """
        apply, note_seen, rate, clock = self.state.apply, self.state.note_seen, self._rate, self.clock
        note_replaced = self.state.note_replaced
        controls, control_suffix, control_in = self.controls, "/" + CONTROL_LEVEL, self._control_in
        queue, load = client.messages, _Load()
        pending: OrderedDict[str, tuple[object, float]] = OrderedDict()  # sample topic → (payload, receive time)
        oldest = next_slice = 0.0
        async for message in queue:
            now = clock()
            self._messages += 1
            rate.add(now)
            topic = str(message.topic)
            if controls is not None and topic.endswith(control_suffix):  # 4 levels: never a node's topic
                control_in(topic, bytes(message.payload))
            elif topic.endswith("/sample"):
                if topic in pending:
                    self._coalesced += 1
                    note_replaced(topic)
                elif not pending:
                    oldest = now
                pending[topic] = (message.payload, now)  # a replaced sample keeps its place in line
                if load.behind:  # proof of life now, though applied only when its turn comes
                    note_seen(topic, now)
            else:
                t0 = time.perf_counter()
                sample_topic = topic.rsplit("/", 1)[0] + "/sample"
                if (queued := pending.pop(sample_topic, None)) is not None:
                    apply(sample_topic, *queued)
                apply(topic, message.payload, now)
                load.add(time.perf_counter() - t0)
            if not pending:
                continue
            if load.behind:
                # Time-shared, not "when the queue is empty": aiomqtt's queue is often empty while
                # the socket is full (paho reads a packet per loop turn), and reading must keep up
                # for what is applied to be fresh.
                if now < next_slice and len(pending) < MAX_PENDING:
                    continue
                t0 = time.perf_counter()
                n = 0
                while pending and time.perf_counter() - t0 < SLICE_S:
                    t, (payload, rx) = pending.popitem(last=False)
                    apply(t, payload, rx)
                    n += 1
                    if n % FLUSH_CHUNK == 0:  # let the socket be read and the screen painted meanwhile
                        await asyncio.sleep(0)
                took = time.perf_counter() - t0
                load.add(took)
                next_slice = clock() + took
                if pending:  # should it catch up, the not-behind rule below judges from the front
                    oldest = pending[next(iter(pending))][1]
            elif len(queue) == 0 or now - oldest >= self.max_delay_s or len(pending) >= MAX_PENDING:
                t0 = time.perf_counter()
                items = list(pending.items())
                pending.clear()
                for i, (t, (payload, rx)) in enumerate(items, 1):
                    apply(t, payload, rx)
                    if i % FLUSH_CHUNK == 0:  # let the socket be read meanwhile
                        await asyncio.sleep(0)
                load.add(time.perf_counter() - t0)


@contextlib.asynccontextmanager
async def subscribed(settings: MqttSettings, state: FleetState, **kw):
    """`async with subscribed(settings, state) as sub:` runs a FleetSubscriber for the block."""
    sub = FleetSubscriber(settings, state, **kw)
    async with running(sub.run(), name="nvmon.fleet.subscriber"):
        yield sub
