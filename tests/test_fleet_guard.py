"""What FleetState does not take on trust (issue 16, item 3), on payloads from the real builders
and a fake clock: freshness by a sample's own timestamp with a skew bound, the caps on nodes and
clusters and the expiry of nodes that never sent an inventory, an empty retained status that does
not forget a node still ticking, and two daemons claiming one node name, reported once.
The same through Mosquitto: tests/test_fleet_flood.py."""

from __future__ import annotations

import dataclasses
import logging

from samplefactory import healthy_sample

from nvmon.fleet.alerting import FleetAlerts
from nvmon.fleet.guard import DUP_FLIPS, SKEW_BOUND_S
from nvmon.fleet.rules import FleetRules, FleetSettings
from nvmon.fleet.state import FleetState
from nvmon.wire.contract import topic
from nvmon.wire.payloads import inventory_payload, sample_payload, status_payload

C = "c1"
T0 = 1_700_000_000.0
SAMPLE = healthy_sample()


def sample(node: str, ts: float, cluster: str = C) -> tuple[str, bytes]:
    return topic(cluster, node, "sample"), sample_payload(dataclasses.replace(SAMPLE, node=node, ts=ts))


def announce(state: FleetState, node: str, now: float, *, host: str = "h1", cluster: str = C) -> None:
    s = dataclasses.replace(SAMPLE, node=node, ts=now, host=dataclasses.replace(SAMPLE.host, hostname=host))
    assert state.apply(topic(cluster, node, "status"), status_payload("online", version="1", interval_s=1.0, ts=now),
                       now)
    assert state.apply(topic(cluster, node, "inventory"), inventory_payload(s, cluster=cluster), now)


class Pager:
    def __init__(self):
        self.sent = []

    def submit(self, records):
        self.sent.extend(records)


# --- freshness by the sample's own time -------------------------------------------------------------


def test_a_late_sample_does_not_make_its_node_fresh():
    st = FleetState(stale_factor=5)
    announce(st, "n", T0)
    for i in range(5):  # on time: learns the node's clock offset (0.05 s of network)
        assert st.apply(*sample("n", T0 + i), T0 + i + 0.05)
    assert st.nodes[(C, "n")].liveness(T0 + 4.1).state == "online"
    # Silent 20 s, then a sample taken at T0+5 arrives (a backlog, a replay): it was taken 20 s ago.
    assert st.apply(*sample("n", T0 + 5), T0 + 25)
    live = st.nodes[(C, "n")].liveness(T0 + 25)
    assert live.state == "stale" and 19.9 < live.age_s < 20.1
    assert st.nodes[(C, "n")].clock_skew_s is None  # lateness is not skew
    assert st.apply(*sample("n", T0 + 26), T0 + 26.05)  # a fresh one is fresh
    assert st.nodes[(C, "n")].liveness(T0 + 26.1).state == "online"


def test_a_clock_off_within_the_bound_is_learned():
    st = FleetState(stale_factor=3)
    announce(st, "n", T0)
    off = SKEW_BOUND_S - 1  # the node's clock is 4 s behind ours
    for i in range(10):
        assert st.apply(*sample("n", T0 + i - off), T0 + i)
    v = st.nodes[(C, "n")]
    assert v.clock_skew_s is None and v.liveness(T0 + 9.5).state == "online" and v.alive_rx == T0 + 9
    assert st.stats.clock_skewed == 0


def test_a_clock_skewed_beyond_the_bound_is_flagged_and_not_trusted(caplog):
    st = FleetState(stale_factor=3)
    announce(st, "ahead", T0)
    announce(st, "behind", T0)
    with caplog.at_level(logging.WARNING, "nvmon.fleet"):
        for i in range(3):
            assert st.apply(*sample("ahead", T0 + i + 3600), T0 + i)
            assert st.apply(*sample("behind", T0 + i - 600), T0 + i)
    a, b = st.nodes[(C, "ahead")], st.nodes[(C, "behind")]
    assert a.clock_skew_s == 3600 and b.clock_skew_s == -600 and st.stats.clock_skewed == 2
    # Its timestamps unused: dated by arrival, so neither looks fresh from the future nor stale.
    assert a.alive_rx == b.alive_rx == T0 + 2 and a.liveness(T0 + 2).state == b.liveness(T0 + 2).state == "online"
    lines = [r.getMessage() for r in caplog.records if "clock skew" in r.getMessage()]
    assert len(lines) == 1 and "3600 s ahead of this clock" in lines[0]  # one WARNING, further nodes at DEBUG


def test_a_feed_late_as_a_whole_is_not_each_nodes_lateness():
    """The aggregator (or broker) 30 s behind: every sample arrives 30 s late. That lag is the
    feed's; the nodes still tick, so none is judged stale for it."""
    st = FleetState(stale_factor=3)
    nodes = [f"n{i}" for i in range(5)]
    for n in nodes:
        announce(st, n, T0)
    for i in range(5):
        for n in nodes:
            assert st.apply(*sample(n, T0 + i), T0 + i + 0.01)
    for i in range(5, 40):  # from here on 30 s behind, growing by a second per second
        for n in nodes:
            assert st.apply(*sample(n, T0 + i / 4), T0 + i)
        st.sweep(T0 + i)
    assert st.feed_lag_s > 20
    assert all(v.liveness(T0 + 39).state == "online" for v in st.nodes.values())
    assert st.stats.clock_skewed == 0


# --- caps and expiry ------------------------------------------------------------------------------


def test_caps_on_clusters_and_on_nodes_without_an_inventory():
    st = FleetState(max_clusters=2, max_without_inventory=3)
    announce(st, "real", T0)
    for i in range(6):
        st.apply(*sample(f"fake{i}", T0), T0)  # names that only spray samples
    assert len(st.nodes) == 4 and st.stats.dropped_by_reason == {"node_cap": 3}
    assert "nodes without an inventory" in st.stats.last_drop
    announce(st, "real2", T0)  # a daemon announces itself (status, inventory): never held back by them
    assert (C, "real2") in st.nodes
    announce(st, "x", T0, cluster="c2")
    assert not st.apply(topic("c3", "y", "inventory"),
                        inventory_payload(dataclasses.replace(SAMPLE, node="y"), cluster="c3"), T0)
    assert st.stats.dropped_by_reason["cluster_cap"] == 1 and not st.has_cluster("c3")
    assert st.has_cluster("c2")


def test_nodes_without_an_inventory_are_forgotten_after_a_silence_and_never_paged(caplog):
    st = FleetState(stale_factor=5, forget_without_inventory_s=30)
    alerts, pager = None, Pager()
    alerts = FleetAlerts(FleetRules(FleetSettings()), notifier=pager, clock=lambda: T0)
    announce(st, "real", T0)
    announce(st, "dead", T0)
    st.apply(topic(C, "dead", "status"), status_payload("offline", version="1", interval_s=1.0, ts=T0,
                                                         reason="lost"), T0 + 1)
    for i in range(10):
        st.apply(*sample("real", T0 + i), T0 + i)
        for k in range(50):
            st.apply(*sample(f"fake{k}", T0 + i), T0 + i)
    assert len(st.nodes) == 52
    with caplog.at_level(logging.WARNING, "nvmon.fleet"):
        for t in range(10, 80):
            st.apply(*sample("real", T0 + t), T0 + t)
            st.sweep(T0 + t)
            alerts.evaluate(st, T0 + t)
    assert set(st.nodes) == {(C, "real"), (C, "dead")} and st.stats.expired == 50
    assert [r.code for r in pager.sent if r.status == "firing"] == ["node.offline"]  # the dead one only
    lines = [r.getMessage() for r in caplog.records if "that sent no inventory" in r.getMessage()]
    assert len(lines) == 1 and "forgot 50 nodes" in lines[0]
    assert lines[0].endswith("50 so far, 0 without an inventory left")


# --- forgetting -----------------------------------------------------------------------------------


def test_an_empty_status_does_not_forget_a_node_whose_samples_still_arrive(caplog):
    st = FleetState(stale_factor=3)
    announce(st, "n", T0)
    st.apply(*sample("n", T0), T0)
    with caplog.at_level(logging.WARNING, "nvmon.fleet"):
        assert st.apply(topic(C, "n", "status"), b"", T0 + 1)  # a forger, or an operator too early
    assert (C, "n") in st.nodes and st.nodes[(C, "n")].status is not None and st.stats.kept_alive == 1
    assert any("still arrive" in r.getMessage() for r in caplog.records)
    assert st.apply(topic(C, "n", "status"), b"", T0 + 10)  # silent since: decommissioned
    assert (C, "n") not in st.nodes


# --- one name, two daemons --------------------------------------------------------------------------


def test_two_publishers_of_one_name_are_reported_once(caplog):
    st = FleetState(stale_factor=3)
    announce(st, "twin", T0)
    announce(st, "solo", T0)
    with caplog.at_level(logging.WARNING, "nvmon.fleet"):
        for i in range(60):  # two daemons at 1 Hz, half a second apart
            st.apply(*sample("twin", T0 + i), T0 + i)
            st.apply(*sample("twin", T0 + i + 0.5), T0 + i + 0.5)
            st.apply(*sample("solo", T0 + i), T0 + i)
    assert st.nodes[(C, "solo")].duplicate is None
    evidence = st.nodes[(C, "twin")].duplicate
    assert evidence and "two publishers" in evidence and st.stats.duplicates == 1
    lines = [r.getMessage() for r in caplog.records if "fleet.duplicate_node" in r.getMessage()]
    assert lines == [f"fleet.duplicate_node: {C}/twin is claimed by two daemons: {evidence} "
                     "(give each its own node name)"]


def test_two_publishers_are_still_twice_the_rate_when_a_busy_aggregator_coalesces(caplog):
    """Behind, the subscriber keeps each node's newest tick and drops the older (note_replaced):
    the twin's every other sample is never applied, yet the evidence must not vanish with it."""
    st = FleetState(stale_factor=3)
    announce(st, "twin", T0)
    announce(st, "solo", T0)
    for i in range(60):
        st.note_replaced(sample("twin", T0 + i)[0])  # one daemon's tick, replaced in the queue
        st.apply(*sample("twin", T0 + i + 0.5), T0 + i + 0.5)  # the other's, applied
        st.apply(*sample("solo", T0 + i), T0 + i)
    st.note_replaced(topic(C, "never-seen", "sample"))  # a name under no watch: nothing kept for it
    assert st.nodes[(C, "solo")].duplicate is None
    assert "two publishers" in (st.nodes[(C, "twin")].duplicate or "") and st.stats.duplicates == 1


def test_sessions_taking_turns_and_alternating_hosts_are_reported():
    st = FleetState()
    announce(st, "flip", T0)
    for i in range(DUP_FLIPS):  # each take-over publishes the other's will, then its own online
        st.apply(topic(C, "flip", "status"), status_payload("offline" if i % 2 == 0 else "online", version="1",
                                                            interval_s=1.0, ts=T0 + i, reason="lost"), T0 + i)
    assert "flipped online/offline" in st.nodes[(C, "flip")].duplicate
    for i, host in enumerate(["a", "b", "a", "b", "a"]):
        announce(st, "hosts", T0 + i, host=host)
    assert "alternates between hosts 'b' and 'a'" in st.nodes[(C, "hosts")].duplicate
    announce(st, "moved", T0, host="old")
    announce(st, "moved", T0 + 1, host="new")  # reinstalled under a new host name: once is no evidence
    assert st.nodes[(C, "moved")].duplicate is None and st.stats.duplicates == 2


def test_a_clock_that_steps_back_is_rebased_within_a_few_samples():
    """NTP or a resumed VM sets a node's clock 4 s back (it was ahead): its samples look 4 s late,
    more than it takes to be stale, at their usual cadence. Three such in a row are a step, not
    a backlog: the offset is re-based and the node is online again without waiting for the window."""
    st = FleetState(stale_factor=3)
    announce(st, "n", T0)
    for i in range(10):
        st.apply(*sample("n", T0 + i + 4), T0 + i)  # 4 s ahead: within the bound, learned
    assert st.nodes[(C, "n")].liveness(T0 + 9).state == "online"
    for i in (10, 11):  # stepped: now right, so 4 s "late": alive as of T0+7 by their own times
        st.apply(*sample("n", T0 + i), T0 + i)
    assert st.nodes[(C, "n")].alive_rx == T0 + 9  # still the last on-time sample's
    st.apply(*sample("n", T0 + 12), T0 + 12)  # the third: a step, re-based
    v = st.nodes[(C, "n")]
    assert v.alive_rx == T0 + 12 and v.liveness(T0 + 12.5).state == "online" and v.clock_skew_s is None
    for i in range(13, 16):  # stepped again, 10 s back: re-based, and beyond the bound, flagged
        st.apply(*sample("n", T0 + i - 10), T0 + i)
    v = st.nodes[(C, "n")]
    assert v.clock_skew_s == -10 and v.liveness(T0 + 15).state == "online"
