"""What the wire says about the demo fleet, for `nvmon demo --no-tui`'s status line: each node's
`status` (online / offline and why) and its active `alerts`, read off the broker like any view.

Samples are not subscribed to: this stays cheap, and the status line counts them in-process.
"""

from __future__ import annotations

import collections
import logging

from nvmon.wire.contract import AlertSet, Status, WireError, subscription
from nvmon.wire.mqtt import Backoff, MqttSettings
from nvmon.wire.parse import parse_message
from nvmon.wire.session import MqttSession

log = logging.getLogger("nvmon.demo")


class WireWatch:
    """Run `run()` as a task, cancel it to stop; read `online`, `offline`, `alerts`."""

    def __init__(self, settings: MqttSettings, cluster: str):
        self.settings, self.cluster = settings, cluster
        self.status: dict[str, Status] = {}
        self.alerts: dict[str, AlertSet] = {}
        self.dropped = 0
        # The broker is ours and local: retry within a second, on the connection every client uses.
        self.session = MqttSession(settings, client_id=f"nvmon-demo-watch-{id(self) & 0xFFFF:04x}", log=log,
                                   what="demo status watcher: MQTT", backoff=Backoff(max_s=1.0))

    @property
    def online(self) -> int:
        return sum(s.state == "online" for s in self.status.values())

    @property
    def offline(self) -> list[str]:
        return sorted(n for n, s in self.status.items() if s.state != "online")

    def alert_counts(self) -> collections.Counter[str]:
        """Active alerts by severity, over all nodes."""
        return collections.Counter(a.severity for s in self.alerts.values() for a in s.alerts)

    def alert_nodes(self) -> int:
        return sum(bool(s.alerts) for s in self.alerts.values())

    async def run(self) -> None:
        await self.session.run(self._read, setup=self._subscribe)

    async def _subscribe(self, client) -> None:
        for kind in ("status", "alerts"):
            await client.subscribe(subscription(self.cluster, None, kind), qos=1)

    async def _read(self, client) -> None:
        async for m in client.messages:
            self._apply(str(m.topic), m.payload)

    def _apply(self, topic: str, payload: object) -> None:
        try:
            msg = parse_message(topic, payload)
        except WireError:
            self.dropped += 1
            return
        if isinstance(msg, Status):
            self.status[msg.node] = msg
        elif isinstance(msg, AlertSet):
            self.alerts[msg.node] = msg
