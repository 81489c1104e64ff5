"""A fleet load generator: N simulated nodes publishing the wire contract to one broker.

Each node behaves like a daemon on the wire: its own MQTT connection and client id
(`nvmon-<cluster>-<node>`), a will (`status` offline, reason `lost`), `status` online,
`inventory` and `alerts` retained on every (re)connect, then one `sample` per interval. Nodes
are spread evenly over the interval, so 1,000 nodes at 1 Hz is a steady 1,000 samples/s rather
than bursts.

It stays cheap by running only a small pool of real simulated boards (see `boards`): a few
healthy seeds shared round-robin, plus one board per distinct fault spec. Killing the process
fires every node's will at once; cancelling it publishes `offline`/`stopped` for each.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NoReturn

from nvmon import __version__
from nvmon.aio import raise_if_cancelled
from nvmon.loadgen.boards import Board, NodeIdentity
from nvmon.sim.profiles import PROFILES
from nvmon.sim.scenario import SimSpecError, parse_scenario
from nvmon.wire.contract import DELIVERY, topic, valid_name
from nvmon.wire.mqtt import Backoff, MqttSettings, write_at_once
from nvmon.wire.payloads import status_payload
from nvmon.wire.session import MqttSession

log = logging.getLogger("nvmon.loadgen")

CONNECT_CONCURRENCY = 64  # handshakes in flight at once: a big fleet must not stampede the broker
PUBLISH_SLOTS = 100  # nodes publish in this many slots of the interval, those of a slot in one loop wake-up


def node_names(prefix: str, nodes: int) -> list[str]:
    width = max(3, len(str(nodes - 1)))
    return [f"{prefix}-{i:0{width}d}" for i in range(nodes)]


def fault_spec(profile: str, spec: str) -> str:
    """A `--fault` value as a full `--sim` spec: `nvlink_down=2.5` is added to the fleet's profile,
    `pairs-a100,…` stands alone. Raises SimSpecError (one line) when it does not parse."""
    first = spec.split(",", 1)[0].strip().lower()
    full = spec if first in PROFILES else f"{profile},{spec}"
    parse_scenario(full)
    return full


@dataclass(frozen=True, slots=True)
class SimFleetStats:
    nodes: int
    boards: int
    connected: int  # nodes connected right now
    connects: int
    published: int  # samples handed to the broker
    errors: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class _Plan:
    names: list[str]
    racks: int
    faults: dict[int, str]  # node index → full --sim spec
    profile: str
    healthy_boards: int
    labels: dict[str, str]


@dataclass
class _Node:
    who: NodeIdentity
    board: Board
    offset_s: float  # its publish slot within the interval
    topics: dict[str, str] = field(default_factory=dict)
    layout: str = ""
    layout_gen: int = -1
    alerts_gen: int = -1
    session: MqttSession | None = None  # its connection, once running


class SimFleet:
    """`await run()` publishes until cancelled; `stats` for progress. Raises ValueError (one
    line) for a bad cluster, profile, fault spec or fault index."""

    def __init__(self, settings: MqttSettings, nodes: int, *, cluster: str = "sim", racks: int = 1,
                 faults: Mapping[int, str] | None = None, interval_s: float = 1.0, profile: str = "hgx-h100",
                 prefix: str = "sim", healthy_boards: int = 4, labels: Mapping[str, str] | None = None,
                 backoff: Backoff = Backoff(), workdir: Path | None = None):
        if not valid_name(cluster):
            raise ValueError(f"cluster name {cluster!r}: use 1-64 of A-Z a-z 0-9 . _ -")
        if nodes < 1 or racks < 1 or interval_s <= 0 or healthy_boards < 1:
            raise ValueError("nodes, racks, interval and healthy boards must be positive")
        if profile not in PROFILES:
            raise ValueError(f"unknown board profile {profile!r}; known: {', '.join(PROFILES)}")
        faults = dict(faults or {})
        for i, spec in faults.items():
            if not 0 <= i < nodes:
                raise ValueError(f"--fault {i}={spec}: node index must be 0..{nodes - 1}")
            try:
                faults[i] = fault_spec(profile, spec)
            except SimSpecError as e:
                raise ValueError(f"--fault {i}: {e}") from None
        names = node_names(prefix, nodes)
        if not valid_name(names[-1]):
            raise ValueError(f"node prefix {prefix!r}: names must be 1-64 of A-Z a-z 0-9 . _ -")
        # The broker must see one client per node: a shared client id would make nodes evict
        # each other, so a configured id is ignored here.
        self.settings = replace(settings, client_id=None)
        self.cluster, self.interval_s, self.backoff = cluster, interval_s, backoff
        self.workdir = workdir  # where the boards' fake /sys trees go (default: SimNode's tmpfs dirs)
        self._plan = _Plan(names, racks, faults, profile, healthy_boards, dict(labels or {}))
        self.boards: dict[str, Board] = {}
        self.nodes: list[_Node] = []
        self._published = 0

    @property
    def stats(self) -> SimFleetStats:
        """The sum over the nodes' sessions (each one quiet: a thousand would flood the log)."""
        sessions = [n.session.stats for n in self.nodes if n.session is not None]
        last = max((s for s in sessions if s.last_error_at is not None), key=lambda s: s.last_error_at, default=None)
        return SimFleetStats(nodes=len(self._plan.names), boards=len(self.boards),
                             connected=sum(s.connected for s in sessions), connects=sum(s.connects for s in sessions),
                             published=self._published, errors=sum(s.errors for s in sessions),
                             last_error=last.last_error if last is not None else None)

    def _build(self, now: float) -> None:
        plan = self._plan
        n = len(plan.names)
        healthy_specs = [f"{plan.profile},seed={k + 1}"
                         for k in range(min(plan.healthy_boards, n - len(plan.faults)) or 1)]
        rack_width = max(2, len(str(plan.racks - 1)))
        for i, name in enumerate(plan.names):
            spec = plan.faults.get(i) or healthy_specs[i % len(healthy_specs)]
            if spec not in self.boards:
                self.boards[spec] = Board(spec, interval_s=self.interval_s, clock_start=now, workdir=self.workdir)
            node_labels = {**plan.labels, "sim": spec[:256]}
            who = NodeIdentity(self.cluster, name, f"rack-{i * plan.racks // n:0{rack_width}d}", node_labels)
            node = _Node(who, self.boards[spec], offset_s=self.interval_s * (i * PUBLISH_SLOTS // n) / PUBLISH_SLOTS)
            node.topics = {kind: topic(self.cluster, name, kind) for kind in DELIVERY}
            self.nodes.append(node)

    async def run(self) -> NoReturn:
        """Publish until cancelled. Building the board pool blocks ~50 ms a board, once."""
        t0 = time.time()
        try:
            self._build(t0)
            gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._sample_boards(t0), name="nvmon.simfleet.boards")
                for node in self.nodes:
                    tg.create_task(self._run_node(node, gate, t0), name=f"nvmon.simfleet.{node.who.name}")
        finally:
            for board in self.boards.values():
                board.close()
        raise AssertionError("unreachable: the tasks above run until cancelled")

    async def _sample_boards(self, t0: float) -> NoReturn:
        k = 0
        while True:
            k += 1
            await asyncio.sleep(max(0.0, t0 + k * self.interval_s - time.time()))
            for board in self.boards.values():
                try:  # the sampler blocks ~12 ms: keep the publishers running meanwhile
                    await asyncio.to_thread(board.tick, time.time())
                except Exception:  # a simulator bug: keep publishing the last good tick
                    log.exception("sim-fleet: board %s failed to sample", board.spec)

    async def _run_node(self, node: _Node, gate: asyncio.Semaphore, t0: float) -> NoReturn:
        """One node's connection, as a daemon's: its will, a goodbye on a clean stop, reconnects."""
        status = node.topics["status"]
        node.session = MqttSession(
            self.settings, client_id=f"nvmon-{self.cluster}-{node.who.name}", log=log,
            what=f"sim-fleet {node.who.name}: MQTT", backoff=self.backoff, quiet=True, gate=gate,
            will=lambda: (status, self._status("offline", "lost")),
            goodbye=lambda: (status, self._status("offline", "stopped")))
        await node.session.run(lambda client: self._serve(client, node, t0))

    def _status(self, state: str, reason: str | None = None) -> bytes:
        return status_payload(state, version=__version__, interval_s=self.interval_s, ts=time.time(), reason=reason)

    async def _serve(self, client, node: _Node, t0: float) -> None:
        """One connection: announce, then a sample in the node's slot of every interval."""
        write_at_once(client)  # no loop turn and writer callback per packet: a third of its CPU
        await self._publish(client, node, "status", self._status("online"))
        node.layout_gen = node.alerts_gen = -1  # a fresh connection re-announces everything
        while True:
            board = node.board
            if node.layout_gen != board.layout_gen:
                inventory, node.layout = board.inventory_for(node.who)
                node.layout_gen = board.layout_gen
                await self._publish(client, node, "inventory", inventory)
            if node.alerts_gen != board.alerts_gen and board.alerts is not None:
                node.alerts_gen = board.alerts_gen
                await self._publish(client, node, "alerts", board.alerts)
            now = time.time()
            await self._publish(client, node, "sample", board.payload_for(node.layout, now))
            self._published += 1
            base = t0 + node.offset_s
            await asyncio.sleep(base + (math.floor((now - base) / self.interval_s) + 1) * self.interval_s - now)

    async def _publish(self, client, node: _Node, kind: str, payload: bytes) -> None:
        qos, retain = DELIVERY[kind]
        await client.publish(node.topics[kind], payload, qos=qos, retain=retain)
        raise_if_cancelled()  # aiomqtt on 3.11 can swallow a cancel here; stopping must not hang


async def simulate_fleet(settings: MqttSettings, nodes: int, *, cluster: str = "sim", racks: int = 1,
                         faults: Mapping[int, str] | None = None, interval_s: float = 1.0, **kw) -> NoReturn:
    """Publish `nodes` simulated nodes until cancelled (see `SimFleet` for the options)."""
    await SimFleet(settings, nodes, cluster=cluster, racks=racks, faults=faults, interval_s=interval_s, **kw).run()


def describe(fleet: SimFleet) -> str:
    """One line for the CLI's start banner."""
    p = fleet._plan
    n, racks = len(p.names), p.racks
    return (f"sim-fleet: {n} node{'s' * (n != 1)} ({p.names[0]}..{p.names[-1]}, {racks} rack{'s' * (racks != 1)}, "
            f"{len(p.faults)} faulty) "
            f"of {p.profile} on {fleet.settings.url}, cluster {fleet.cluster}, every {fleet.interval_s:g} s")

