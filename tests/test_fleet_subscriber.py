"""FleetSubscriber's consumer without a broker: a fake client whose queue is already full shows
that a node's newer sample replaces its older one, and that order within a node is kept."""

from __future__ import annotations

from dataclasses import dataclass

from nvmon.fleet.state import FleetState
from nvmon.fleet.subscriber import FleetSubscriber, _Rate
from nvmon.wire.contract import topic
from nvmon.wire.mqtt import MqttSettings
from nvmon.wire.payloads import sample_payload, status_payload
from test_fleet_state import T0, board


@dataclass
class Msg:
    topic: str
    payload: bytes


class FakeMessages:
    """What the subscriber uses of aiomqtt's `client.messages`: async iteration and len()."""

    def __init__(self, messages):
        self.items = list(messages)

    def __len__(self) -> int:
        return len(self.items)

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)


class FakeClient:
    def __init__(self, messages):
        self.messages = FakeMessages(messages)


class Clock:
    def __init__(self):
        self.t, self.step = T0, 0.001

    def __call__(self) -> float:
        self.t += self.step
        return self.t


async def test_backlog_coalesces_samples_and_keeps_order_within_a_node():
    tick = sample_payload(board("hgx-h100")[-1])
    will = status_payload("offline", version="1", interval_s=1, ts=T0, reason="lost")
    backlog = [Msg(topic("c", "a", "sample"), tick), Msg(topic("c", "a", "sample"), tick),
               Msg(topic("c", "b", "sample"), b"{"), Msg(topic("c", "a", "status"), will),
               Msg(topic("c", "b", "sample"), tick), Msg(topic("c", "zz", "sample"), b"{")]
    state = FleetState()
    sub = FleetSubscriber(MqttSettings(), state, clock=Clock())
    await sub._consume(FakeClient(backlog))
    s = sub.status
    assert s.messages == 6 and s.coalesced == 2  # a's first tick; b's broken one, replaced unread
    assert state.stats.applied == 3 and state.stats.dropped_by_reason == {"json": 1}  # zz's
    now = sub.clock()
    # a: its tick was applied before its will, so the will wins; b ticks on.
    assert state.nodes[("c", "a")].liveness(now).state == "offline"
    assert state.nodes[("c", "b")].liveness(now).state == "online"


def test_rate_counts_whole_seconds():
    r = _Rate(window=2)
    for t in (100.1, 100.5, 101.2, 101.3, 101.9):
        r.add(t)
    assert r.per_s(101.95) == 1.0  # second 100 only: 2 messages over a 2 s window
    assert r.per_s(102.5) == 2.5  # seconds 100 and 101
    assert r.per_s(110.0) == 0.0


async def test_behind_applies_every_node_with_its_newest_sample(monkeypatch):
    """A starved subscriber (forced behind) applies in slices from the front of `pending`; each
    node ends on its newest tick, and every sample is either applied or replaced by a newer one."""
    import nvmon.fleet.subscriber as subscriber

    class Behind(subscriber._Load):
        def __init__(self):
            super().__init__()
            self.behind = True

        def add(self, seconds: float) -> None:
            self.spent += seconds

    monkeypatch.setattr(subscriber, "_Load", Behind)
    ticks = board("hgx-h100", 3)
    backlog = [Msg(topic("c", node, "sample"), sample_payload(t)) for t in ticks for node in ("a", "b", "c")]
    state = FleetState()
    clock = Clock()
    clock.step = 1.0  # every message may start a slice, however long applying takes here
    sub = FleetSubscriber(MqttSettings(), state, clock=clock)
    await sub._consume(FakeClient(backlog))
    s = sub.status
    assert s.messages == 9 and state.stats.applied + s.coalesced == 9 and state.stats.dropped == 0
    assert all(state.nodes[("c", node)].tick.ts == ticks[-1].ts for node in ("a", "b", "c"))
