"""A broker-wide stall is one "feed stalled" condition, never a page per node (issue 16, item 3).

First the fleet rules on a FleetState fed with real payloads and a fake clock (every case of the
judgement), then the whole chain for real: Mosquitto frozen with SIGSTOP for 8 s under a sim
fleet and `nvmon fleet` with an exec hook, whose node.stale and same_fault rules are set to fire
within a second or two, so that only the stall detection stands between the freeze and the pages.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from mqtt_broker import Broker, Recorder, needs_mosquitto, wait_until
from test_fleet_rules import C, T0, node_up, offline, run, setup
from test_fleet_service import Proc, cluster_name, fleet, fleet_config, pages

from nvmon.fleet.rules import FleetSettings, Place
from nvmon.wire.contract import topic

NODES = ("n1", "n2", "n3", "n4")
FAST = {"node.stale": {"for_s": 0}, "fleet.same_fault": {"for_s": 0}, "fleet.feed_stalled": {"for_s": 0}}


def fleet_up(**settings):
    state, alerts, pager = setup(rules=dict(FAST), **settings)
    for n in NODES:
        node_up(state, n, T0)
    run(state, alerts, T0, T0 + 10, ticking=NODES)
    assert pager.sent == []
    return state, alerts, pager


def test_a_stall_is_one_feed_alert_and_no_node_page(caplog):
    caplog.set_level(logging.INFO, logger="nvmon.fleet")
    state, alerts, pager = fleet_up()
    run(state, alerts, T0 + 11, T0 + 18)  # nobody's message arrives for 8 s: stale after 5 s each
    assert alerts.rules.stalled
    assert [(r.code, r.status) for r in pager.sent] == [("fleet.feed_stalled", "firing")]
    [feed] = pager.sent
    assert (feed.severity, feed.cluster, feed.node, feed.value) == ("warning", C, None, 3.0)
    assert "no message from any of 4 live nodes" in feed.summary and "per-node judgement held" in feed.summary
    run(state, alerts, T0 + 19, T0 + 60, ticking=NODES)  # flowing again
    assert not alerts.rules.stalled
    assert [(r.code, r.status) for r in pager.sent] == [("fleet.feed_stalled", "firing"),
                                                        ("fleet.feed_stalled", "resolved")]
    assert alerts.active() == []
    said = [r.getMessage() for r in caplog.records if r.name == "nvmon.fleet" and r.getMessage().startswith("fleet: feed")]
    assert len(said) == 2 and said[0].startswith("fleet: feed stalled: no message from any of 4 live nodes")
    assert said[1].startswith("fleet: feed flowing again after a 9.0 s stall")


def test_a_stall_holds_what_was_already_wrong():
    """n4 was silent before the stall (stale, firing): held through it, not resolved, not paged again."""
    state, alerts, pager = fleet_up()
    run(state, alerts, T0 + 11, T0 + 30, ticking=NODES[:3])
    assert [(r.code, r.node) for r in pager.sent] == [("node.stale", "n4")]
    run(state, alerts, T0 + 31, T0 + 38)  # the stall
    run(state, alerts, T0 + 39, T0 + 60, ticking=NODES[:3])
    assert [(r.code, r.node, r.status) for r in pager.sent] == [
        ("node.stale", "n4", "firing"), ("fleet.feed_stalled", None, "firing"), ("fleet.feed_stalled", None, "resolved")]
    assert [(r.code, r.node, r.status) for r in alerts.active()] == [("node.stale", "n4", "firing")]


def test_one_silent_node_is_no_stall():
    state, alerts, pager = fleet_up()
    run(state, alerts, T0 + 11, T0 + 20, ticking=NODES[1:])
    assert not alerts.rules.stalled and [(r.code, r.node) for r in pager.sent] == [("node.stale", "n1")]


def test_too_few_nodes_are_judged_one_by_one():
    state, alerts, pager = setup(rules=dict(FAST))
    for n in NODES[:2]:
        node_up(state, n, T0)
    run(state, alerts, T0, T0 + 10, ticking=NODES[:2])
    run(state, alerts, T0 + 11, T0 + 20)  # two nodes silent at once: a stall or two hung daemons
    assert sorted((r.code, r.node) for r in pager.sent) == [("node.stale", "n1"), ("node.stale", "n2")]
    assert len(pager.of("fleet.feed_stalled")) == 0


def test_wills_still_page_a_fleet_that_died_at_once():
    """The broker publishes the wills of nodes that are really gone: offline nodes are not live, and
    with none live there is no stall to hold judgement for."""
    state, alerts, pager = fleet_up()
    run(state, alerts, T0 + 11, T0 + 14)  # silent: a stall so far
    for n in NODES:
        offline(state, n, T0 + 15)
    run(state, alerts, T0 + 15, T0 + 20)
    assert sorted(r.node for r in pager.of("node.offline")) == list(NODES)
    assert len(pager.of("fleet.same_fault")) == 1


def test_a_silence_past_feed_stall_max_s_is_judged_per_node():
    """Connected, the broker answering this client's pings, and still nothing: the nodes are silent."""
    state, alerts, pager = fleet_up(feed_stall_max_s=30)
    run(state, alerts, T0 + 11, T0 + 40)
    assert pager.of("node.stale") == [] and alerts.rules.stalled
    run(state, alerts, T0 + 41, T0 + 45)
    assert not alerts.rules.stalled and len(pager.of("node.stale")) == 4
    assert len(pager.of("fleet.feed_stalled")) == 1  # still on: the feed is still silent
    assert "judging nodes again after 30 s" in alerts.rules.conditions(state, T0 + 46)[Place("feed", C, "")][0].summary


def test_feed_stall_settings():
    assert FleetSettings().feed_stall_min_nodes == 3 and FleetSettings().feed_stall_max_s == 60
    state, alerts, pager = fleet_up(feed_stall_max_s=0)  # 0: never held
    run(state, alerts, T0 + 11, T0 + 18)
    assert len(pager.of("node.stale")) == 4 and pager.of("fleet.feed_stalled") == []


def test_a_flood_of_garbage_is_no_stall():
    """Messages still arrive (even refused ones): the broker is not stalled."""
    state, alerts, pager = fleet_up()
    for t in range(11, 19):
        state.apply(topic(C, "n1", "sample"), b"{not json", T0 + t)
        run(state, alerts, T0 + t, T0 + t)
    assert not alerts.rules.stalled and len(pager.of("node.stale")) == 4


# --- the real thing ---------------------------------------------------------------------------

# [mqtt] keepalive_s = 30 (nvmon fleet's own client): at the default 10 s, a keepalive ping sent just
# before the 8 s freeze must be answered within 10 s, a margin of 2 s that a loaded machine (a late
# wake-up, the backlog read before the PINGRESP) can miss: the client then drops the connection,
# and the test would see an outage instead of the stall it is about.
HOOK_RULES = """\
[mqtt]
keepalive_s = 30
[fleet]
stale_after_intervals = 3
[fleet.rules."node.stale"]
for_s = 0
[fleet.rules."fleet.same_fault"]
for_s = 0
[fleet.rules."fleet.feed_stalled"]
for_s = 0
"""


@needs_mosquitto
async def test_mosquitto_frozen_8_s_pages_no_node(tmp_path):
    cluster = cluster_name()
    cfg, out = fleet_config(tmp_path, HOOK_RULES)
    with Broker(tmp_path) as broker:
        # The sim nodes' keepalive 30 s too, as the fleet's (above): their pings would have the same 2 s
        # of margin, and a node whose client gave up would send its will, a page the test forbids.
        sim = Proc(tmp_path, "sim", "sim-fleet", "--broker", broker.url, "--cluster", cluster, "--nodes", "4",
                   "--interval", "0.5", "--keepalive", "30").start()
        f = fleet(tmp_path, broker.url, cluster, cfg, tmp_path / "fleet.db").start()
        frozen = False
        try:
            async with Recorder(broker.url, f"nvmon/v1/{cluster}/+/sample") as rec:
                await wait_until(lambda: len({m.topic for m in rec.messages}) == 4, 20, "samples from 4 nodes")
            await wait_until(lambda: "subscribed to" in f.text(), 30, "nvmon fleet subscribed")
            await asyncio.sleep(3)  # past the fleet's settle time: it judges the nodes
            assert [p for p in pages(out) if p["alert"]["code"] != "fleet.feed_stalled"] == [], pages(out)
            before, n_before = len(f.text()), len(pages(out))  # a starved test machine may have stalled already
            broker.proc.send_signal(signal.SIGSTOP)
            frozen, t0 = True, time.monotonic()
            await asyncio.sleep(8)
            broker.proc.send_signal(signal.SIGCONT)
            frozen = False
            print(f"broker frozen for {time.monotonic() - t0:.1f} s")
            await wait_until(lambda: "feed flowing again" in f.text()[before:], 15, "the end of the stall logged")
            await asyncio.sleep(3)  # node.stale / same_fault would fire at once if judged now
            got = [(p["alert"]["code"], p["alert"]["status"]) for p in pages(out)[n_before:]]
            print("hook got:", got)
            assert [c for c, _ in got if c != "fleet.feed_stalled"] == [], got
            assert got in ([], [("fleet.feed_stalled", "firing")],
                           [("fleet.feed_stalled", "firing"), ("fleet.feed_stalled", "resolved")]), got
            text = f.text()
            assert text[before:].count("fleet: feed stalled: no message from any of 4 live nodes") == 1, text
            assert all(p["alert"]["code"] == "fleet.feed_stalled" for p in pages(out)), pages(out)
            fired = [ln for ln in text.splitlines() if "fleet alert firing" in ln]
            assert all("fleet.feed_stalled" in ln for ln in fired), fired
            assert "connection lost" not in text  # the subscriber stayed connected: a stall, not an outage
            rc, took = f.stop()
            assert rc == 0, f.text()
        finally:
            if frozen:
                broker.proc.send_signal(signal.SIGCONT)
            for p in (f, sim):
                if p.proc.poll() is None:
                    p.stop()
