"""FleetState on payloads built by the real builders from simulated boards: fleet-row summaries of
healthy and faulty boards, liveness over time, versions, rack power, and hostile input (which is
counted and dropped, never raised, and whose strings stay literal data)."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nvmon.fleet.state as state_mod
from nvmon.audit import audit
from nvmon.collect.node import NodeSampler
from nvmon.fleet.history import History
from nvmon.fleet.state import FleetState
from nvmon.sim.node import SimNode
from nvmon.wire.contract import KINDS, MAX_PAYLOAD_BYTES, Alert, topic
from nvmon.wire.payloads import alerts_payload, inventory_payload, sample_payload, status_payload

C = "c1"
T0 = 1_700_000_000.0


@functools.cache
def board(spec: str, n: int = 2) -> tuple:
    """`n` consecutive samples of a simulated board (cached: a board costs ~50 ms to build)."""
    clock = [T0]
    sim = SimNode(spec, clock=lambda: clock[0])
    try:
        sampler = NodeSampler(sim.nvml, sysfs_root=sim.sysfs_root, node="n", before_tick=sim.sync,
                              clock=lambda: clock[0])
        sampler.open()
        sampler.sample()
        out = []
        for _ in range(n):
            clock[0] += 1
            out.append(sampler.sample())
        return tuple(out)
    finally:
        sim.close()


def feed(state: FleetState, node: str, spec: str = "hgx-h100", *, now: float = T0, rack: str | None = "r1",
         labels=None, interval: float = 1.0, status: bool = True):
    """Status, inventory and one sample of `spec` for `node`; returns the node's view."""
    s = dataclasses.replace(board(spec)[-1], node=node, ts=now)  # taken now: fresh by its own time
    if status:
        assert state.apply(topic(C, node, "status"), status_payload("online", version="1", interval_s=interval,
                                                                    ts=now), now)
    assert state.apply(topic(C, node, "inventory"), inventory_payload(s, cluster=C, rack=rack, labels=labels), now)
    assert state.apply(topic(C, node, "sample"), sample_payload(s, audit(s).findings), now)  # as a daemon sends it
    return state.nodes[(C, node)]


def tick(state: FleetState, node: str, now: float, spec: str = "hgx-h100") -> bool:
    return state.apply(topic(C, node, "sample"), sample_payload(dataclasses.replace(board(spec)[-1], ts=now)), now)


# --- summaries --------------------------------------------------------------------------------


def test_healthy_hgx_h100_row():
    st_ = FleetState()
    s = feed(st_, "n1").summary
    assert s.gpu_model == "NVIDIA H100 80GB HBM3" and s.gpu_count == 8 and s.gpus_lost == 0
    assert (s.links_active, s.links_expected, s.links_down) == (144, 144, 0)
    assert s.pcie_worst == "Gen5 x16" and not s.pcie_degraded
    assert (s.ib_up, s.ib_expected, s.ib_ethernet, s.ib_min_rate_gbps) == (8, 8, 0, 400.0)
    assert s.power_capped == 0 and 0 < s.power_w < s.power_limit_w == 8 * 700
    assert 0 < s.nvlink_pct < 100 and s.nvlink_bytes_per_s > 1e11
    # % of spec: 8 GPUs × 18 links × 26562 MB/s × 2 directions
    assert s.nvlink_pct == pytest.approx(100 * s.nvlink_bytes_per_s / (8 * 18 * 26562e6 * 2))
    assert s.hottest_c is not None and 0 <= s.hottest_gpu < 8 and s.errors_rising == 0


FAULTY = "hgx-h100,nvlink_down=2.5,pcie_width=3:8,ib_rate=mlx5_1:100,power_cap=4:350,nvlink_errors=1.1"


def test_faulty_board_row_shows_each_fault():
    s = feed(FleetState(), "bad", FAULTY).summary
    assert (s.links_active, s.links_expected, s.links_down) == (143, 144, 1)
    assert s.pcie_worst == "Gen5 x8 on GPU 3" and s.pcie_degraded
    assert s.ib_min_rate_gbps == 100.0 and s.ib_up == 8
    assert s.power_capped == 1 and s.power_limit_w == 7 * 700 + 350
    assert s.errors_rising >= 2  # CRC/replay counters on GPU 1 link 1 rise every tick


@pytest.mark.parametrize("spec,check", [
    ("hgx-h100,gpu_lost=6", lambda s: s.gpus_lost == 1 and s.links_down == 18 and s.links_expected == 144),
    ("hgx-h100,ib_down=0", lambda s: (s.ib_up, s.ib_expected) == (7, 8)),
    ("hgx-h100,ib_eth=2", lambda s: (s.ib_up, s.ib_ethernet) == (7, 1)),
    ("hgx-h100,load=busy,pcie_gen=1:3", lambda s: s.pcie_worst == "Gen3 x16 on GPU 1" and s.pcie_degraded),
    ("hgx-h100,load=idle", lambda s: s.pcie_worst == "Gen1 x16" and not s.pcie_degraded),  # idle downshift
    ("hgx-h100,thermal=5", lambda s: (s.hottest_gpu, s.hottest_c) == (5, 92.0)),
    ("pairs-a100", lambda s: (s.links_active, s.links_expected, s.ib_expected) == (96, 96, 2)),
    ("pcie-l40s", lambda s: s.nvlink_pct is None and s.links_expected == 0 and s.gpu_model == "NVIDIA L40S"),
    ("hgx-h100,nvml=off", lambda s: s.gpu_count == 0 and s.links_expected is None and s.power_w is None),
    ("hgx-h100,ib_errors=3", lambda s: s.errors_rising >= 1),
])
def test_fault_rows(spec, check):
    s = feed(FleetState(), "n", spec).summary
    assert check(s), s


def test_row_marks_are_the_nodes_findings_not_a_judgement_of_its_own():
    """The node judged with its own thresholds: its row says what its audit (and its alerts) said."""
    from nvmon.audit import Thresholds

    s = dataclasses.replace(board("hgx-h100,pcie_width=3:8")[-1], node="n")
    hot = audit(s, thresholds=Thresholds(temperature_c=40.0)).findings  # every GPU "hot" for this node
    st_ = FleetState()
    st_.apply(topic(C, "n", "inventory"), inventory_payload(s, cluster=C), T0)
    st_.apply(topic(C, "n", "sample"), sample_payload(s, hot), T0)
    row = st_.nodes[(C, "n")].summary
    assert row.marks == {"pcie": "warning", "temp": "warning"} and row.pcie_degraded
    st_.apply(topic(C, "n", "sample"), sample_payload(s), T0 + 1)  # an older daemon: no findings sent
    row = st_.nodes[(C, "n")].summary
    assert row.marks == {} and not row.pcie_degraded and row.pcie_worst == "Gen5 x8"  # shown, not judged


def test_tick_without_inventory_still_summarised():
    st_ = FleetState()
    assert tick(st_, "n1", T0)
    s = st_.nodes[(C, "n1")].summary
    assert s.gpu_model is None and s.links_expected is None and s.gpu_count == 8 and s.power_w > 0


# --- liveness, versions, racks ----------------------------------------------------------------


def test_liveness_online_stale_offline_online():
    st_ = FleetState()
    key = (C, "n1")
    feed(st_, "n1", now=T0, interval=2.0)
    assert st_.nodes[key].stale_after_s == 6.0  # 3 × the status interval
    live = st_.nodes[key].liveness(T0 + 1)
    assert (live.state, live.age_s) == ("online", 1.0)
    assert st_.sweep(T0 + 5) == set()
    v = st_.version
    assert st_.sweep(T0 + 7) == {key} and st_.version > v  # silence became a change
    assert st_.nodes[key].liveness(T0 + 7).state == "stale"
    assert tick(st_, "n1", T0 + 8) and st_.nodes[key].liveness(T0 + 8).state == "online"
    # The will: offline/lost, dated by when it arrived.
    will = status_payload("offline", version="1", interval_s=2, ts=T0 - 100, reason="lost")
    assert st_.apply(topic(C, "n1", "status"), will, T0 + 20)
    live = st_.nodes[key].liveness(T0 + 25)
    assert (live.state, live.reason, live.age_s) == ("offline", "lost", 5.0)
    assert st_.counts(T0 + 25) == {"online": 0, "stale": 0, "offline": 1}
    # Back: the restarted daemon's first tick beats its online status to the aggregator.
    assert tick(st_, "n1", T0 + 30)
    assert st_.nodes[key].liveness(T0 + 30).state == "online"
    feed(st_, "n1", now=T0 + 31)
    assert st_.nodes[key].liveness(T0 + 31).state == "online" and st_.nodes[key].status.state == "online"


def test_retained_offline_status_is_dated_by_its_own_timestamp():
    """A viewer started long after the stop or the death: the age is the status's, not the arrival's."""
    st_ = FleetState()
    stop = status_payload("offline", version="1", interval_s=1, ts=T0 - 360, reason="stopped")
    assert st_.apply(topic(C, "s", "status"), stop, T0)
    live = st_.nodes[(C, "s")].liveness(T0 + 2)
    assert (live.state, live.reason, live.age_s, live.exact) == ("offline", "stopped", 362.0, True)
    # The will is stamped at the daemon's connect: the node's latest own timestamp (its alerts,
    # republished at 360 s before now) bounds the silence, and the age says it is a bound.
    will = status_payload("offline", version="1", interval_s=1, ts=T0 - 86400, reason="lost")
    assert st_.apply(topic(C, "w", "status"), will, T0)
    assert st_.nodes[(C, "w")].liveness(T0).age_s == 86400.0
    assert st_.apply(topic(C, "w", "alerts"), alerts_payload([], T0 - 360), T0)
    live = st_.nodes[(C, "w")].liveness(T0 + 2)
    assert (live.state, live.reason, live.age_s, live.exact) == ("offline", "lost", 362.0, False)
    assert st_.stats.clock_skewed == 0


def test_status_timestamps_are_clamped_and_skew_noted():
    st_ = FleetState()
    future = status_payload("offline", version="1", interval_s=1, ts=T0 + 3600, reason="stopped")
    assert st_.apply(topic(C, "f", "status"), future, T0)
    assert st_.nodes[(C, "f")].liveness(T0 + 1).age_s == 1.0  # dated by arrival, not negative
    assert st_.nodes[(C, "f")].clock_skew_s == 3600.0 and st_.stats.clock_skewed == 1
    ancient = status_payload("offline", version="1", interval_s=1, ts=1.0, reason="stopped")
    assert st_.apply(topic(C, "a", "status"), ancient, T0)
    assert st_.nodes[(C, "a")].liveness(T0 + 1).age_s == 1.0  # absurdly old: unknown, dated by arrival
    slight = status_payload("offline", version="1", interval_s=1, ts=T0 + 2, reason="stopped")
    assert st_.apply(topic(C, "s", "status"), slight, T0)  # within the tolerance: not skew, not ahead
    assert st_.nodes[(C, "s")].liveness(T0).age_s == 0.0 and st_.nodes[(C, "s")].clock_skew_s is None


def test_ticks_seen_but_not_yet_applied_keep_a_node_alive():
    st_ = FleetState()
    feed(st_, "n1", now=T0)
    st_.note_seen(topic(C, "n1", "sample"), T0 + 5)  # the subscriber is behind: applied later
    st_.note_seen(topic(C, "ghost", "sample"), T0 + 5)  # unknown nodes are not created
    st_.note_seen("junk", T0 + 5)
    assert st_.sweep(T0 + 6) == set()
    assert st_.nodes[(C, "n1")].liveness(T0 + 6).state == "online" and (C, "ghost") not in st_.nodes


def test_redelivered_retained_status_is_not_a_sign_of_life():
    st_ = FleetState()
    payload = status_payload("online", version="1", interval_s=1, ts=T0)
    st_.apply(topic(C, "n1", "status"), payload, T0)
    v = st_.version
    assert st_.apply(topic(C, "n1", "status"), payload, T0 + 10)  # a resubscribe gets it again
    assert st_.version == v
    assert st_.nodes[(C, "n1")].liveness(T0 + 10).state == "stale"  # online, but no tick for 10 s


def test_changed_since_names_changed_rows_and_drops_bump_version():
    st_ = FleetState()
    feed(st_, "a")
    feed(st_, "b")
    v = st_.version
    tick(st_, "a", T0 + 1)
    assert st_.changed_since(v) == {(C, "a")}
    assert st_.changed_since(st_.version) == set()
    v = st_.version
    assert not st_.apply(topic(C, "zz", "sample"), b"{", T0)
    assert st_.version > v and st_.changed_since(v) == set() and (C, "zz") not in st_.nodes
    st_.forget((C, "a"))
    assert (C, "a") in st_.changed_since(v) and (C, "a") not in st_.nodes


def test_changed_since_far_behind_returns_everything():
    st_ = FleetState(max_nodes=2)
    feed(st_, "a")
    feed(st_, "b")
    for i in range(3):
        st_.forget((C, "a"))
        feed(st_, "a", now=T0 + i)
    assert st_.changed_since(0) >= {(C, "a"), (C, "b")}


def test_rack_power_counts_online_nodes_only():
    st_ = FleetState()
    a = feed(st_, "a", rack="r1").summary.power_w
    b = feed(st_, "b", rack="r1").summary.power_w
    feed(st_, "c", rack="r2", now=T0 - 100)  # long silent: stale
    feed(st_, "d", rack=None)
    racks = st_.racks(T0 + 1)
    assert racks["r1"].power_w == pytest.approx(a + b) and racks["r1"].reporting == 2
    assert racks["r1"].power_limit_w == 2 * 8 * 700
    assert (racks["r2"].nodes, racks["r2"].reporting, racks["r2"].power_w) == (1, 0, 0.0)
    assert racks[None].nodes == 1


def test_history_ring_is_bounded_and_ordered():
    h = History(3)
    for i in range(5):
        h.append(float(i), {"power_w": i * 10.0})
    p = h.points()
    assert p.times == (2.0, 3.0, 4.0) and p.values["power_w"] == (20.0, 30.0, 40.0)
    assert h.points(since=3.5).times == (4.0,)
    st_ = FleetState(history_points=4)
    for i in range(6):
        tick(st_, "n", T0 + i)
    p = st_.history((C, "n"))
    assert len(p.times) == 4 and p.times[-1] == T0 + 5 and p.values["power_w"][-1] > 0


def test_layout_mismatch_is_dropped_but_proves_life():
    st_ = FleetState()
    feed(st_, "n")
    other = sample_payload(dataclasses.replace(board("hgx-a100")[-1], ts=T0 + 50))  # other GPUs: another layout
    assert not st_.apply(topic(C, "n", "sample"), other, T0 + 50)
    view = st_.nodes[(C, "n")]
    assert view.inventory_stale and view.liveness(T0 + 50).state == "online"
    assert view.tick.layout == view.inventory.layout  # the shown data stays the matching one
    assert st_.stats.dropped_by_reason == {"layout": 1}
    a100 = board("hgx-a100")[-1]
    assert st_.apply(topic(C, "n", "inventory"), inventory_payload(dataclasses.replace(a100, node="n"), cluster=C), T0)
    assert st_.apply(topic(C, "n", "sample"), other, T0 + 50.5)
    assert not st_.nodes[(C, "n")].inventory_stale
    assert st_.nodes[(C, "n")].summary.gpu_model == "NVIDIA A100-SXM4-80GB"


def test_cleared_retained_topics():
    st_ = FleetState()
    feed(st_, "n")
    alert = Alert(fingerprint="f1", code="nvlink.link_down", severity="critical", state="firing",
                  summary="GPU 2 NVLink 5 down", since=T0)
    assert st_.apply(topic(C, "n", "alerts"), alerts_payload([alert], T0), T0)
    assert st_.nodes[(C, "n")].alert_counts() == {"critical": 1}
    assert st_.apply(topic(C, "n", "alerts"), b"", T0) and st_.nodes[(C, "n")].alerts is None
    assert st_.apply(topic(C, "n", "inventory"), b"", T0) and st_.nodes[(C, "n")].inventory is None
    # Decommissioned (nvmon nodes forget), once its samples stopped: a node still ticking is kept
    # (tests/test_fleet_guard.py), so a forger's empty status cannot end a live node's alerts.
    assert st_.apply(topic(C, "n", "status"), b"", T0 + 10) and (C, "n") not in st_.nodes
    assert st_.stats.cleared == 3 and st_.stats.dropped == 0
    assert not st_.apply(topic(C, "n", "sample"), b"", T0)  # a sample is never retained


def test_node_cap():
    st_ = FleetState(max_nodes=2)
    feed(st_, "a")
    feed(st_, "b")
    assert not tick(st_, "c", T0)
    assert tick(st_, "a", T0)  # known nodes still update
    assert len(st_.nodes) == 2 and st_.stats.dropped_by_reason == {"node_cap": 1}


def test_inventories_share_identical_parts():
    st_ = FleetState()
    a, b = feed(st_, "a"), feed(st_, "b")
    assert a.inventory.gpus[0].links is b.inventory.gpus[0].links
    assert a.inventory.topology_matrix is b.inventory.topology_matrix and a.inventory.spec is b.inventory.spec


# --- hostile input ----------------------------------------------------------------------------

GOOD_TICK = json.loads(sample_payload(board("hgx-h100")[-1]))


def tick_with(**changes) -> bytes:
    return json.dumps({**GOOD_TICK, **changes}).encode()


HOSTILE = [
    ("foo/bar", b"{}", "topic"),
    ("nvmon/v1/c1/n\x1b[31m/sample", tick_with(), "topic"),
    ("nvmon/v1/c1/[b]n[/b]/sample", tick_with(), "topic"),
    ("nvmon/v2/c1/n/sample", tick_with(), "topic"),
    ("nvmon/v1/c1/n/bogus", tick_with(), "topic"),
    ("nvmon/v1/c1/n/sample/extra", tick_with(), "topic"),
    ("", b"", "topic"),
    ("nvmon/v1/c1/n/sample", b"{", "json"),
    ("nvmon/v1/c1/n/sample", b"\xff\xfe\x00", "json"),
    ("nvmon/v1/c1/n/sample", b"[1, 2]", "json"),
    ("nvmon/v1/c1/n/sample", b'{"schema":1,"ts":NaN}', "json"),
    ("nvmon/v1/c1/n/sample", b"[" * 100_00 + b"]" * 100_00, "json"),
    ("nvmon/v1/c1/n/sample", "a str, not bytes", "json"),
    ("nvmon/v1/c1/n/sample", None, "json"),
    ("nvmon/v1/c1/n/status", b'{"schema":2,"ts":1,"state":"online"}', "schema"),
    ("nvmon/v1/c1/n/status", b'{"schema":"1","ts":1,"state":"online"}', "schema"),
    ("nvmon/v1/c1/n/status", b'{"ts":1,"state":"online"}', "schema"),
    ("nvmon/v1/c1/n/sample", b" " * (MAX_PAYLOAD_BYTES + 1), "oversize"),
    ("nvmon/v1/c1/n/status", b'{"schema":1,"ts":1,"state":5}', "content"),
    ("nvmon/v1/c1/n/status", b'{"schema":1,"ts":"now","state":"online"}', "content"),
    ("nvmon/v1/c1/n/status", b'{"schema":1,"ts":true,"state":"online"}', "content"),
    ("nvmon/v1/c1/n/sample", tick_with(p="x"), "content"),
    ("nvmon/v1/c1/n/sample", tick_with(p=[1] * 65, pl=[1] * 65), "content"),  # 65 GPUs
    ("nvmon/v1/c1/n/sample", tick_with(p=[1] * 9), "content"),  # arrays disagree
    ("nvmon/v1/c1/n/sample", tick_with(ld={"99": [1]}), "content"),  # a GPU it doesn't have
    ("nvmon/v1/c1/n/sample", tick_with(t=[1e300] * 8), "content"),
    ("nvmon/v1/c1/n/alerts", b'{"schema":1,"ts":1,"alerts":[{"severity":"doom"}]}', "content"),
    ("nvmon/v1/c1/n/inventory", b'{"schema":1,"ts":1,"node":"other","cluster":"c1","layout":"0"}', "mismatch"),
    ("nvmon/v1/c1/n/inventory", json.dumps({"schema": 1, "ts": 1, "node": "n", "cluster": "c1", "layout": "0",
                                            "gpus": [{"index": i} for i in range(65)]}).encode(), "content"),
]


@pytest.mark.parametrize("topic_,payload,reason", HOSTILE, ids=[f"{i}-{r}" for i, (_, _, r) in enumerate(HOSTILE)])
def test_hostile_message_is_counted_and_dropped(topic_, payload, reason):
    st_ = FleetState()
    assert st_.apply(topic_, payload, T0) is False
    stats = st_.stats
    assert stats.dropped_by_reason == {reason: 1} and stats.applied == 0
    assert stats.last_drop.startswith(reason + ": ") and stats.last_drop.isprintable()
    assert not st_.nodes  # bad messages never create nodes


def test_bad_message_from_a_known_node_is_counted_on_it():
    st_ = FleetState()
    feed(st_, "n")
    assert not st_.apply(topic(C, "n", "sample"), b"{", T0)
    assert st_.nodes[(C, "n")].dropped == 1 and st_.nodes[(C, "n")].summary is not None


def test_hostile_strings_stay_literal_data():
    nasty = {"owner": "[bold red]root[/bold red]", "esc": "\x1b[2J\x1b]0;pwned\x07", "link": "[link=http://x]y[/link]"}
    model = "NVIDIA H100 \x1b[31m[blink]fake[/blink]"
    s = board("hgx-h100")[-1]
    s = dataclasses.replace(s, node="n", gpus=tuple(dataclasses.replace(g, name=model) for g in s.gpus))
    st_ = FleetState()
    assert st_.apply(topic(C, "n", "inventory"),
                     inventory_payload(s, cluster=C, rack="[i]r1[/i]\x1b[0m", labels=nasty), T0)
    assert st_.apply(topic(C, "n", "sample"), sample_payload(s), T0)
    alert = Alert(fingerprint="f", code="x", severity="warning", state="firing", summary="\x1b[31m[b]boom[/b]",
                  since=T0)
    assert st_.apply(topic(C, "n", "alerts"), alerts_payload([alert], T0), T0)
    view = st_.nodes[(C, "n")]
    assert dict(view.labels) == nasty and view.rack == "[i]r1[/i]\x1b[0m"
    assert view.summary.gpu_model == model and view.alerts.alerts[0].summary == "\x1b[31m[b]boom[/b]"


def test_a_reader_bug_is_counted_not_raised(monkeypatch):
    def broken(topic, payload):
        raise RuntimeError("bug \x1b[31m")

    monkeypatch.setattr(state_mod, "parse_message", broken)
    st_ = FleetState()
    assert st_.apply(topic(C, "n", "sample"), b"{}", T0) is False
    assert st_.stats.dropped_by_reason == {"reader_bug": 1} and st_.stats.last_drop.isprintable()


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@functools.cache
def known_node(spec: str) -> tuple:
    """The messages that make node "n" known with a `spec` board (built once, applied per example)."""
    s = dataclasses.replace(board(spec)[-1], node="n")
    return ((topic(C, "n", "status"), status_payload("online", version="1", interval_s=1, ts=T0)),
            (topic(C, "n", "inventory"), inventory_payload(s, cluster=C)), (topic(C, "n", "sample"), sample_payload(s)))


def state_with_node(spec: str = "hgx-h100") -> FleetState:
    st_ = FleetState()
    for t, p in known_node(spec):
        assert st_.apply(t, p, T0)
    return st_


topics = st.one_of(st.text(max_size=80), st.sampled_from([topic(C, "n", k) for k in KINDS]),
                   st.builds(lambda k, n: f"nvmon/v1/{C}/{n}/{k}", st.sampled_from(KINDS), st.text(max_size=8)))
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner,
                                                                                        max_size=5), max_leaves=30)


@FUZZ
@given(topics, st.binary(max_size=300))
def test_apply_never_raises_on_arbitrary_bytes(topic_, payload):
    st_ = FleetState()
    st_.apply(topic_, payload, T0)
    assert st_.stats.received == 1 and st_.stats.applied + st_.stats.dropped + st_.stats.cleared == 1


@settings(FUZZ, max_examples=120)  # recursive JSON is slow to generate; the byte fuzzers run more
@given(st.sampled_from(KINDS), st.dictionaries(st.sampled_from(sorted(GOOD_TICK) + ["state", "gpus", "alerts"]),
                                                 json_values, max_size=12))
def test_apply_never_raises_on_arbitrary_json(kind, doc):
    st_ = state_with_node()
    st_.apply(topic(C, "n", kind), json.dumps({"schema": 1, "ts": T0, **doc}).encode(), T0)
    assert "reader_bug" not in st_.stats.dropped_by_reason


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), min_size=1, max_size=8))
def test_apply_never_raises_on_mutated_real_payloads(flips):
    payload = bytearray(sample_payload(board(FAULTY)[-1]))
    for pos, byte in flips:
        payload[pos % len(payload)] = byte
    st_ = state_with_node(FAULTY)
    st_.apply(topic(C, "n", "sample"), bytes(payload), T0)
    assert "reader_bug" not in st_.stats.dropped_by_reason
