"""The node's `Publisher`: one node's status, inventory, samples and alerts on the broker.

Protocol: plain MQTT 3.1.1 (no broker extensions, see DESIGN.md "Scaling out"), clean session,
client id `nvmon-<cluster>-<node>` unless configured: a restarted daemon takes its old session
over at once instead of waiting for the broker's keepalive to expire it. The connection, its
retries, its log lines and its counts are the shared `MqttSession`'s.

Per tick it costs one wake-up: the pump hands the newest sample over and sets an event, the
connection's loop wakes once, publishes it, and its packet is written at once (`write_at_once`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NoReturn

from nvmon.aio import Latest, raise_if_cancelled
from nvmon.audit import Finding
from nvmon.model import Sample
from nvmon.wire.contract import DELIVERY, Alert, WireError, topic, valid_name
from nvmon.wire.mqtt import BROKER_ERRORS, Backoff, MqttSettings, describe_error, write_at_once
from nvmon.wire.payloads import alerts_payload, layout_id, sample_payload, status_payload
from nvmon.wire.session import MqttSession

log = logging.getLogger("nvmon.wire")


@dataclass(frozen=True, slots=True)
class PublisherStats:
    connected: bool
    connects: int  # successful connections, first one included
    published: int  # sample messages handed to the broker
    dropped: int  # samples never published (disconnected, or replaced by a newer one)
    errors: int  # failed connection attempts and lost connections
    last_error: str | None


InventoryProvider = Callable[[], bytes | None]
AlertsProvider = Callable[[], Iterable[Alert]]


class Publisher:
    """Publishes one node's status, inventory, samples and alerts; reconnects forever.

    Stop it by cancelling the task running `run()` (the daemon's TaskGroup does): it then
    publishes `status` offline (retained) and disconnects, within about a second, and re-raises
    the cancellation. There is no separate close().
    """

    def __init__(self, settings: MqttSettings, *, cluster: str, node: str, version: str, interval_s: float,
                 backoff: Backoff = Backoff(), clock: Callable[[], float] = time.time):
        for what, name in (("cluster", cluster), ("node", node)):
            if not valid_name(name):
                raise ValueError(f"{what} name {name!r}: use 1-64 of A-Z a-z 0-9 . _ -")
        self.settings, self.cluster, self.node = settings, cluster, node
        self.version, self.interval_s, self.backoff, self.clock = version, interval_s, backoff, clock
        self.topics = {kind: topic(cluster, node, kind) for kind in DELIVERY}
        self.client_id = f"nvmon-{cluster}-{node}"
        self.session = MqttSession(settings, client_id=self.client_id, log=log, what="MQTT", backoff=backoff,
                                   clock=clock, will=lambda: (self.topics["status"], self._status("lost")),
                                   goodbye=lambda: (self.topics["status"], self._status("stopped")))
        self._latest: Sample | tuple | None = None  # the one sample (and its findings) waiting for the wire
        self._wake = asyncio.Event()
        self._inventory_provider: InventoryProvider = lambda: None
        self._alerts_provider: AlertsProvider | None = None
        self._alerts: bytes | None = None  # last set given to publish_alerts()
        self._announced_layout: str | None = None
        self._inventory_checked = 0.0
        self._checked_layout: str | None = None
        self._published = self._dropped = 0
        self._listeners: dict[str, Callable[[str, bytes], None]] = {}
        # Subscribed messages waiting for their listener: the latest per topic (a newer one replaces
        # an unhandled older one, counted in `coalesced`), handed on one per loop turn.
        self._incoming: Latest[tuple[Callable[[str, bytes], None], bytes]] = Latest()
        self.coalesced = 0

    def listen(self, topic_filter: str, callback: Callable[[str, bytes], None]) -> None:
        """Subscribe (QoS 1) to `topic_filter` on every connection and call `callback(topic,
        payload)` on the loop for its messages, retained ones included (the daemon's shared acks
        and silences): the latest of each topic, so a flood costs the reader, not a parse per
        message. The callback must be quick and never raise; a failure is logged. Call before
        `run()`."""
        self._listeners[topic_filter] = callback

    @property
    def stats(self) -> PublisherStats:
        s = self.session.stats
        return PublisherStats(connected=s.connected, connects=s.connects, published=self._published,
                              dropped=self._dropped, errors=s.errors, last_error=s.last_error)

    async def run(self, samples: asyncio.Queue[Sample | tuple[Sample, Sequence[Finding]]],
                  inventory_provider: InventoryProvider,
                  alerts_provider: AlertsProvider | None = None) -> NoReturn:
        """Publish until cancelled. `samples` (a `Sample`, or a `(sample, findings)` pair to carry
        the tick's audit findings) is drained continuously, connected or not: only the
        newest waits for the wire, older ones are counted in `dropped`, so memory stays bounded
        while the broker is away.

        `inventory_provider()` returns the current `inventory_payload(...)` bytes (None until one
        is known); it is called on each connect and when a sample's layout stops matching the
        announced inventory, so it should return a cached value. `alerts_provider()` returns the
        active alert set, published on each connect.
        """
        self._inventory_provider = inventory_provider
        self._alerts_provider = alerts_provider
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._pump(samples), name="nvmon.wire.pump")
            await self.session.run(self._connected)

    async def publish_alerts(self, alerts: Iterable[Alert]) -> None:
        """Publish the node's full active alert set now if connected; it is re-sent on every
        reconnect either way. Never raises for broker trouble."""
        self._alerts = alerts_payload(alerts, self.clock())
        client = self.session.client
        if client is not None:
            try:
                await self._publish(client, "alerts", self._alerts)
            except BROKER_ERRORS as e:
                log.warning("MQTT %s: alerts not published now (%s); re-sent on reconnect",
                            self.settings.url, describe_error(e))

    # --- internals ------------------------------------------------------------------------

    def _status(self, reason: str) -> bytes:
        return status_payload("offline", version=self.version, interval_s=self.interval_s, ts=self.clock(),
                              reason=reason)

    async def _pump(self, samples: asyncio.Queue) -> NoReturn:
        while True:
            sample = await samples.get()
            samples.task_done()
            if self._latest is not None:
                self._dropped += 1
            self._latest = sample
            self._wake.set()

    async def _connected(self, client) -> None:
        """One connection's work: announce, then publish samples until the connection fails."""
        write_at_once(client)
        reader = handler = None
        try:
            if self._listeners:
                for f in self._listeners:
                    await client.subscribe(f, qos=1)
                reader = asyncio.create_task(self._read(client), name="nvmon.wire.listen")
                handler = asyncio.create_task(self._hand_on(), name="nvmon.wire.listeners")
            await self._announce(client)
            while True:
                raise_if_cancelled()  # aiomqtt on 3.11 can swallow a cancel in publish
                await self._wake.wait()
                self._wake.clear()
                sample, self._latest = self._latest, None
                if sample is not None:
                    await self._publish_sample(client, sample)
        finally:
            for task in (reader, handler):
                if task is not None:
                    task.cancel()

    async def _read(self, client) -> None:
        """Keep each subscribed message as its topic's latest for its listener. Ends with the
        connection (the sample path notices the loss and reconnects, which subscribes again)."""
        with contextlib.suppress(*BROKER_ERRORS):
            async for m in client.messages:
                t = str(m.topic)
                for f, callback in self._listeners.items():
                    if m.topic.matches(f):
                        self.coalesced += self._incoming.put(t, (callback, bytes(m.payload)))
                        break

    async def _hand_on(self) -> NoReturn:
        """Hand each topic's latest message to its listener, one per loop turn."""
        while True:
            await self._incoming.wait()
            while self._incoming:
                t, (callback, payload) = self._incoming.pop()
                try:
                    callback(t, payload)
                except Exception:  # the daemon's bug must not stop samples
                    log.exception("MQTT: listener for %s failed", t[:120])
                await asyncio.sleep(0)  # the reader and the samples go on between two messages

    async def _publish(self, client, kind: str, payload: bytes) -> None:
        qos, retain = DELIVERY[kind]
        await client.publish(self.topics[kind], payload, qos=qos, retain=retain)
        raise_if_cancelled()  # aiomqtt on 3.11 can swallow a cancel here: callers loop on (alerts)

    async def _announce(self, client) -> None:
        status = status_payload("online", version=self.version, interval_s=self.interval_s, ts=self.clock())
        await self._publish(client, "status", status)
        self._announced_layout = self._checked_layout = None
        await self._publish_inventory(client)
        if self._alerts_provider is not None:
            try:
                self._alerts = alerts_payload(self._alerts_provider(), self.clock())
            except Exception:  # as for inventory: the daemon's bug must not stop samples
                log.exception("MQTT: alerts provider failed; re-sending the last alert set")
        if self._alerts is not None:
            await self._publish(client, "alerts", self._alerts)

    async def _publish_inventory(self, client) -> None:
        self._inventory_checked = time.monotonic()
        try:
            payload = self._inventory_provider()
        except Exception:  # the provider is the daemon's code; its bug must not stop samples
            log.exception("MQTT: inventory provider failed")
            return
        if payload is None:
            return
        await self._publish(client, "inventory", payload)
        try:
            self._announced_layout = json.loads(payload)["layout"]
        except (ValueError, KeyError, TypeError):
            self._announced_layout = None

    async def _publish_sample(self, client, item: Sample | tuple) -> None:
        sample, findings = item if isinstance(item, tuple) else (item, ())
        # A sample whose GPUs/ports no longer match the announced inventory (or no inventory
        # yet): ask for the inventory again — at once for a new layout or while none is out,
        # then every 10 s while the provider still lags behind.
        lay = layout_id(sample)
        if lay != self._announced_layout and (self._announced_layout is None or lay != self._checked_layout
                                               or time.monotonic() - self._inventory_checked >= 10):
            self._checked_layout = lay
            await self._publish_inventory(client)
        try:
            payload = sample_payload(sample, findings)
        except WireError as e:
            self._dropped += 1
            log.error("MQTT: sample not published: %s", e)
            return
        await self._publish(client, "sample", payload)
        self._published += 1
