"""`DemoFleet`: an embedded MQTT broker and one real `Daemon` per simulated node, in this event loop.

    async with DemoFleet(plan_fleet(16, 2)) as fleet:
        fleet.url, fleet.settings, fleet.cluster      # where a view subscribes
        fleet.status()                                # per-node state, ticks, samples published

Each node is `nvmon.daemon.main.Daemon` (embedded: no signal handlers, no sd_notify) over the
simulator, with its SQLite store in the fleet's temporary directory and its publisher on the
broker: the same code a GPU node runs, so its samples, inventory, will and alerts are the real
ones. Node starts are spread over one interval so that their ticks (~10 ms of CPU each, in the
default thread pool) do not all land at once. A node planned to die is connected through a
`Relay`; at its time the relay is cut (the broker sees the connection reset and publishes its
will) and its daemon stopped; it comes back with a fresh daemon on the same database.

Leaving the context stops every daemon (each publishes `offline`/stopped and closes its simulated
/sys tree), stops the broker and removes the temporary directory, within a few seconds.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvmon.daemon.config import DaemonConfig
from nvmon.daemon.main import Daemon
from nvmon.demo.brokers import HOST, DemoError, choose, free_port, make
from nvmon.demo.relay import Relay
from nvmon.demo.scenario import FleetPlan, NodePlan, plan_fleet
from nvmon.wire.mqtt import MqttSettings

log = logging.getLogger("nvmon.demo")

STOP_TIMEOUT_S = 5.0  # per daemon; they stop in parallel, normally within ~0.1 s
BROKER_STOP_TIMEOUT_S = 5.0
DRAIN_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class NodeStatus:
    name: str
    rack: str
    state: str  # waiting | up | down (planned death) | stopped | failed
    ticks: int  # samples taken by its current daemon
    published: int  # samples its current daemon handed to the broker
    connected: bool
    error: str | None = None


@dataclass(frozen=True, slots=True)
class FleetStatus:
    elapsed_s: float
    nodes: tuple[NodeStatus, ...]

    @property
    def up(self) -> int:
        return sum(n.state == "up" and n.connected for n in self.nodes)

    @property
    def published(self) -> int:
        return sum(n.published for n in self.nodes)

    @property
    def down(self) -> list[str]:
        return [n.name for n in self.nodes if n.state in ("down", "failed")]


class _Node:
    """One simulated node: its daemon's life, and (if it is to die) the relay that kills it."""

    def __init__(self, plan: NodePlan, cfg: DaemonConfig, start_delay_s: float, relay: Relay | None):
        self.plan, self.cfg, self.start_delay_s, self.relay = plan, cfg, start_delay_s, relay
        self.daemon: Daemon | None = None
        self.task: asyncio.Task | None = None
        self.state = "waiting"
        self.error: str | None = None

    def start(self, delay_s: float = 0.0) -> None:
        self.daemon, self.error = None, None
        self.task = asyncio.create_task(self._life(delay_s), name=f"demo.node.{self.plan.name}")

    async def _life(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self.daemon = Daemon(self.cfg, embedded=True)
        self.state = "up"
        try:
            await self.daemon.run()
        except Exception as e:  # noqa: BLE001 - one node's failure must not end the demo
            self.state, self.error = "failed", f"{type(e).__name__}: {e}"
            log.error("%s: daemon failed: %s", self.plan.name, self.error)

    async def stop(self, state: str = "stopped") -> None:
        """Stop the daemon the way SIGTERM does (bounded); cancel it only if that hangs."""
        task, daemon = self.task, self.daemon
        if task is None:
            return
        if daemon is None:  # still waiting for its start slot
            task.cancel()
        else:
            daemon.request_stop()
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT_S)
        except TimeoutError:
            log.error("%s: daemon did not stop within %.0f s; cancelling it", self.plan.name, STOP_TIMEOUT_S)
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 2.0)
        except asyncio.CancelledError:
            if not task.cancelled():
                raise
        if self.state != "failed":
            self.state = state

    async def crash(self) -> None:
        """Die as a crashed daemon does on the wire: the connection resets, no DISCONNECT, the will fires."""
        if self.relay is not None:
            self.relay.cut()
        self.state = "down"  # from the cut on: the will is already on its way
        await self.stop("down")

    def restart(self) -> None:
        if self.relay is not None:
            self.relay.restore()
        self.start()

    def status(self) -> NodeStatus:
        d = self.daemon
        pub = d.publisher.stats if d is not None and d.publisher is not None else None
        return NodeStatus(name=self.plan.name, rack=self.plan.rack, state=self.state,
                          ticks=d.stats.ticks if d is not None else 0, published=pub.published if pub else 0,
                          connected=bool(pub and pub.connected), error=self.error)


class DemoFleet:
    """Broker + simulated nodes for the lifetime of an `async with` block (see the module docstring).

    `port`: the broker's port on 127.0.0.1 (None: a free one). `broker`: "auto" (Mosquitto when
    installed, else the embedded amqtt), "mosquitto" or "embedded" (nvmon.demo.brokers).
    `tmp_root`: where the temporary directory goes (default: the system's). `on_event(text)` hears
    of deaths and returns.
    """

    def __init__(self, plan: FleetPlan | None = None, *, port: int | None = None, tmp_root: Path | None = None,
                 on_event: Callable[[str], None] | None = None, stagger: bool = True, broker: str = "auto"):
        self.plan = plan or plan_fleet()
        self.broker_kind = choose(broker)  # DemoError before anything starts
        self._fallback = broker == "auto"  # a Mosquitto that will not start: the embedded one instead
        self.cluster = self.plan.cluster
        self.port = port
        self.tmp_root = tmp_root
        self.tmp_dir: Path | None = None
        self.on_event = on_event
        self.stagger = stagger
        self.events: collections.deque[str] = collections.deque(maxlen=50)
        self._broker = None
        self._nodes: list[_Node] = []
        self._relays: list[Relay] = []
        self._timelines: list[asyncio.Task] = []
        self._t0 = 0.0

    @property
    def broker_name(self) -> str:
        return "mosquitto" if self.broker_kind == "mosquitto" else "embedded broker"

    @property
    def url(self) -> str:
        return f"mqtt://{HOST}:{self.port}"

    @property
    def settings(self) -> MqttSettings:
        return MqttSettings(url=self.url)

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    async def __aenter__(self) -> DemoFleet:
        self._t0 = time.monotonic()
        try:
            self.tmp_dir = Path(tempfile.mkdtemp(prefix="nvmon-demo-", dir=self.tmp_root))
        except OSError as e:
            raise DemoError(f"cannot create a temporary directory in {self.tmp_root or tempfile.gettempdir()}: "
                            f"{e.strerror}") from None
        try:
            self.port = self.port or free_port()
            self._broker = make(self.broker_kind)
            try:
                await self._broker.start(HOST, self.port, self.tmp_dir)
            except DemoError as e:
                if not (self._fallback and self.broker_kind == "mosquitto"):
                    raise
                log.warning("%s; using the embedded broker", e)
                self.broker_kind, self._broker = "embedded", make("embedded")
                await self._broker.start(HOST, self.port, self.tmp_dir)
            await self._start_nodes()
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self._close()

    async def _start_nodes(self) -> None:
        n = len(self.plan.nodes)
        for i, p in enumerate(self.plan.nodes):
            relay = None
            if p.dies_at_s is not None:
                relay = await Relay(HOST, self.port).start()
                self._relays.append(relay)
            node = _Node(p, self._node_config(p, relay.port if relay else self.port),
                         i * self.plan.interval_s / n if self.stagger else 0.0, relay)
            node.start(node.start_delay_s)
            self._nodes.append(node)
            if p.dies_at_s is not None:
                self._timelines.append(asyncio.create_task(self._timeline(node), name=f"demo.timeline.{p.name}"))

    def _node_config(self, p: NodePlan, port: int) -> DaemonConfig:
        return DaemonConfig.model_validate({
            "node": {"name": p.name, "cluster": self.cluster, "rack": p.rack},
            "sampling": {"interval_s": self.plan.interval_s, "sim": p.sim},
            "store": {"path": str(self.tmp_dir / f"{p.name}.db"), "raw_retention_h": 1, "rollup_retention_d": 1},
            "mqtt": {"broker": f"mqtt://{HOST}:{port}", "keepalive_s": 10},
            "expect": {"gpus": 8, "ib": p.expect_ib, "topology": "nvswitch"},
            # The lifecycle in seconds rather than the production 30 s / 120 s: pending, then firing
            # while the newcomer is still watching.
            "alerts": {"for_s": 8, "startup_grace_s": 10},
        })

    def _event(self, text: str) -> None:
        line = f"t+{self.elapsed():.0f}s {text}"
        self.events.append(line)
        log.info("%s", line)
        if self.on_event is not None:
            self.on_event(line)

    async def _timeline(self, node: _Node) -> None:
        p = node.plan
        at = p.dies_at_s
        while True:
            await asyncio.sleep(max(0.0, at - self.elapsed()))
            await node.crash()
            self._event(f"{p.name} died: connection reset, no DISCONNECT; the broker publishes its will "
                        f"(back in {p.down_for_s:g} s)")
            await asyncio.sleep(max(0.0, at + p.down_for_s - self.elapsed()))
            node.restart()
            self._event(f"{p.name} restarted: a fresh daemon on the same database")
            at += p.period_s

    def status(self) -> FleetStatus:
        return FleetStatus(elapsed_s=self.elapsed(), nodes=tuple(n.status() for n in self._nodes))

    async def wait_published(self, timeout_s: float = 30.0) -> float:
        """Wait until every node that is up has published a sample; returns seconds since start."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.status()
            if all(n.published > 0 for n in st.nodes if n.state in ("waiting", "up")):
                return st.elapsed_s
            if time.monotonic() > deadline:
                raise TimeoutError(f"not every node published within {timeout_s:g} s")
            await asyncio.sleep(0.05)

    async def _close(self) -> None:
        """Stop everything started, in order: timelines, daemons (they say offline), relays, broker, files."""
        for t in self._timelines:
            t.cancel()
        await asyncio.gather(*self._timelines, return_exceptions=True)
        await asyncio.gather(*(n.stop() for n in self._nodes), return_exceptions=True)
        for r in self._relays:
            await r.close()
        if self._broker is not None:
            await self._broker.drain(DRAIN_TIMEOUT_S)
            await self._broker.stop(BROKER_STOP_TIMEOUT_S)
            self._broker = None
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
