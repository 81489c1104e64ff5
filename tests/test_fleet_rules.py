"""Fleet rules on a FleetState fed with real payloads and a fake clock: node offline (will and clean
stop), stale, rack power against budgets, many nodes with one fault, blind spells, restart."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError
from samplefactory import healthy_sample

from nvmon.alerts.model import fingerprint
from nvmon.fleet.alerting import FleetAlerts
from nvmon.fleet.rules import FleetRules, FleetSettings, Place, fleet_book
from nvmon.fleet.state import FleetState
from nvmon.wire.contract import Alert, topic
from nvmon.wire.payloads import alerts_payload, inventory_payload, sample_payload, status_payload

C = "c1"
T0 = 1_700_000_000.0
SAMPLE = healthy_sample()  # 8 × H100 at 70 % of 700 W: 3.92 kW of GPU power per node


class Pager:
    def __init__(self):
        self.sent = []

    def submit(self, records):
        self.sent += records

    def of(self, code, status="firing"):
        return [r for r in self.sent if r.code == code and r.status == status]


def sample(node, now, power_w=None):
    s = dataclasses.replace(SAMPLE, node=node, ts=now)
    if power_w is not None:
        s = dataclasses.replace(s, gpus=tuple(dataclasses.replace(g, power_w=power_w) for g in s.gpus))
    return s


def node_up(state, node, now, *, rack="r1", labels=None, power_w=None):
    s = sample(node, now, power_w)
    assert state.apply(topic(C, node, "status"), status_payload("online", version="1", interval_s=1.0, ts=now), now)
    assert state.apply(topic(C, node, "inventory"), inventory_payload(s, cluster=C, rack=rack, labels=labels), now)
    assert state.apply(topic(C, node, "sample"), sample_payload(s), now)


def tick(state, node, now):
    node, power_w = node if isinstance(node, tuple) else (node, None)  # ("n1", 650.0): GPUs at 650 W
    assert state.apply(topic(C, node, "sample"), sample_payload(sample(node, now, power_w)), now)


def offline(state, node, now, reason="lost"):
    assert state.apply(topic(C, node, "status"),
                       status_payload("offline", version="1", interval_s=1.0, ts=now, reason=reason), now)


def node_alerts(state, node, now, *codes, st="firing"):
    alerts = [Alert(fingerprint=f"{node}-{c}", code=c, severity="critical", state=st, summary=c, since=now)
              for c in codes]
    assert state.apply(topic(C, node, "alerts"), alerts_payload(alerts, now), now)


def setup(**settings):
    state = FleetState(stale_factor=settings.get("stale_after_intervals", 5.0))
    pager = Pager()
    alerts = FleetAlerts(FleetRules(FleetSettings(**settings)), notifier=pager, clock=lambda: T0)
    return state, alerts, pager


def run(state, alerts, start, end, step=1.0, ticking=()):
    t = start
    while t <= end:
        for n in ticking:
            tick(state, n, t)
        state.sweep(t)
        alerts.evaluate(state, t)
        t += step


def test_will_pages_node_offline_at_once_and_resolves_when_back():
    state, alerts, pager = setup()
    node_up(state, "n1", T0, labels={"pool": "a"})
    run(state, alerts, T0, T0 + 3, ticking=["n1"])
    assert pager.sent == []
    offline(state, "n1", T0 + 3.5)
    alerts.evaluate(state, T0 + 3.5)
    [rec] = pager.of("node.offline")
    assert rec.fingerprint == fingerprint("node.offline", C, "n1")
    assert (rec.severity, rec.cluster, rec.node, rec.rack, rec.value) == ("critical", C, "n1", "r1", "lost")
    assert rec.labels == {"pool": "a"} and "will" in rec.summary
    run(state, alerts, T0 + 4, T0 + 20)  # still offline: no second page, no stale alert
    assert len(pager.sent) == 1
    node_up(state, "n1", T0 + 21)
    run(state, alerts, T0 + 21, T0 + 60, ticking=["n1"])
    assert [r.status for r in pager.sent] == ["firing", "resolved"]  # after clear_s (30 s), once
    assert pager.sent[1].ends_at == pytest.approx(T0 + 51)


def test_clean_stop_pages_only_after_clean_stop_after_s():
    state, alerts, pager = setup(clean_stop_after_s=120)
    node_up(state, "n1", T0)
    offline(state, "n1", T0 + 1, reason="stopped")
    run(state, alerts, T0 + 1, T0 + 120)
    assert pager.sent == []  # a maintenance reboot does not page
    run(state, alerts, T0 + 121, T0 + 122)
    [rec] = pager.of("node.offline")
    assert rec.value == "stopped" and "stopped cleanly" in rec.summary


def test_a_stop_found_retained_pages_with_its_true_age():
    """nvmon fleet started 20 min after a clean stop: past clean_stop_after_s by the status's own ts."""
    state, alerts, pager = setup(clean_stop_after_s=900)
    assert state.apply(topic(C, "n1", "status"), status_payload("offline", version="1", interval_s=1.0,
                                                                ts=T0 - 1200, reason="stopped"), T0)
    alerts.evaluate(state, T0 + 1)
    [rec] = pager.of("node.offline")
    assert "offline for 20 min" in rec.summary


def test_a_forgotten_node_ends_its_alerts_without_a_page():
    state, alerts, pager = setup()
    node_up(state, "n1", T0)
    offline(state, "n1", T0 + 1)
    alerts.evaluate(state, T0 + 1)
    assert len(pager.of("node.offline")) == 1 and len(alerts.active()) == 1
    assert state.apply(topic(C, "n1", "status"), b"", T0 + 2)  # nvmon forget: the retained status cleared
    assert (C, "n1") not in state.nodes
    run(state, alerts, T0 + 2, T0 + 60)
    assert len(pager.sent) == 1 and alerts.active() == [] and alerts.engines == {}
    [ended] = [r for r in alerts._unsaved._records.values() if r.status == "resolved"]
    assert ended.ends_at == T0 + 2 and "forgotten" in ended.summary  # in the database, not paged


def test_stale_after_k_intervals():
    state, alerts, pager = setup(stale_after_intervals=3, rules={"node.stale": {"for_s": 0}})
    node_up(state, "n1", T0)
    run(state, alerts, T0, T0 + 10, ticking=["n1"])
    run(state, alerts, T0 + 11, T0 + 13)  # last tick at T0+10: stale once silent for more than 3 s
    assert pager.of("node.stale") == []
    run(state, alerts, T0 + 14, T0 + 14)
    [rec] = pager.of("node.stale")
    assert rec.severity == "warning" and rec.threshold == 3.0 and rec.value > 3


def test_a_hung_node_pages_once_as_offline_not_first_as_stale():
    """By default node.stale waits 20 s: the will of a node that hung comes first (15 s after its
    last packet at the daemon's default keepalive), and the pending stale alert ends unpaged."""
    state, alerts, pager = setup()
    node_up(state, "n1", T0)
    run(state, alerts, T0, T0 + 10, ticking=["n1"])
    run(state, alerts, T0 + 11, T0 + 24)  # stale from T0+16 on (5 intervals), pending
    assert pager.sent == [] and [r.code for r in alerts.active()] == ["node.stale"]
    offline(state, "n1", T0 + 25)  # the will, 15 s after the last tick
    run(state, alerts, T0 + 25, T0 + 90)
    assert [(r.code, r.status) for r in pager.sent] == [("node.offline", "firing")]
    assert [r.code for r in alerts.active()] == ["node.offline"]


def test_rack_over_budget_pages_once_after_for_s():
    state, alerts, pager = setup(rack_budget_kw=12, node_overhead_w=500)  # 3 × (3.92 + 0.5) = 13.26 kW
    for n in ("n1", "n2", "n3"):
        node_up(state, n, T0)
    node_up(state, "x1", T0, rack="r2")  # 4.42 kW: under the same budget
    run(state, alerts, T0, T0 + 59, ticking=["n1", "n2", "n3", "x1"])
    assert pager.sent == []  # pending for 60 s
    assert [r.status for r in alerts.active()] == ["pending"]
    run(state, alerts, T0 + 60, T0 + 120, ticking=["n1", "n2", "n3", "x1"])
    [rec] = pager.sent
    assert (rec.code, rec.node, rec.rack, rec.value, rec.threshold) == ("rack.power", None, "r1", 13.26, 12)
    assert rec.fingerprint == fingerprint("rack.power", C, None, rack="r1")
    assert "13.3 kW over its 12 kW budget (3 nodes" in rec.summary


def test_rack_budget_overrides_and_unbudgeted_racks():
    settings = {"node_overhead_w": 500, "racks": {"r1": {"budget_kw": 20}, "r2": {"budget_kw": 4}}}
    state, alerts, _ = setup(**settings)
    for n, rack in (("n1", "r1"), ("n2", "r1"), ("x1", "r2"), ("y1", "r3"), ("z1", None)):
        node_up(state, n, T0, rack=rack)
    conds = alerts.rules.conditions(state, T0)
    assert list(conds) == [Place("rack", C, "r2")]  # r1 under 20 kW; r3 and no-rack nodes have no budget
    state.sweep(T0 + 10)  # every node stale: their last readings are not present draw
    assert Place("rack", C, "r2") not in alerts.rules.conditions(state, T0 + 10)


def test_many_nodes_with_one_fault_make_one_fleet_alert():
    state, alerts, pager = setup(same_fault_nodes=3)
    for n in ("n1", "n2", "n3", "n4"):
        node_up(state, n, T0)
    node_alerts(state, "n1", T0, "nvlink.link_down")
    node_alerts(state, "n2", T0, "nvlink.link_down", "pcie.width")
    node_alerts(state, "n3", T0, "pcie.width", "$(reboot)\x1b[2J")  # not a code: ignored
    node_alerts(state, "n4", T0, "nvlink.link_down", st="pending")  # pending does not count
    run(state, alerts, T0, T0 + 2, ticking=["n1", "n2", "n3", "n4"])
    assert pager.sent == []
    node_alerts(state, "n3", T0 + 3, "nvlink.link_down")
    run(state, alerts, T0 + 3, T0 + 32, ticking=["n1", "n2", "n3", "n4"])
    assert pager.sent == [] and [r.status for r in alerts.active()] == ["pending"]  # held 30 s (for_s)
    run(state, alerts, T0 + 33, T0 + 35, ticking=["n1", "n2", "n3", "n4"])
    [rec] = pager.sent
    assert (rec.code, rec.node, rec.labels, rec.value, rec.threshold) == ("fleet.same_fault", None,
                                                                          {"fault": "nvlink.link_down"}, 3, 3)
    assert rec.summary == "3 nodes with nvlink.link_down at once: n1, n2, n3"


def test_a_momentary_coincidence_does_not_page_same_fault():
    """Three nodes share a code for 20 s (under same_fault's 30 s hold), twice with a gap: no page.
    A configured for_s is honoured ([fleet.rules."fleet.same_fault"] for_s)."""
    for for_s, expected in ((None, 0), (10, 2)):  # 10 s: each 20 s episode pages
        state, alerts, pager = setup(**({"rules": {"fleet.same_fault": {"for_s": for_s}}} if for_s else {}))
        nodes = ("n1", "n2", "n3")
        for n in nodes:
            node_up(state, n, T0)
        for start in (T0, T0 + 100):
            for n in nodes:
                node_alerts(state, n, start, "ib.port_down")
            run(state, alerts, start, start + 20, ticking=nodes)
            for n in nodes:
                node_alerts(state, n, start + 21)
            run(state, alerts, start + 21, start + 99, ticking=nodes)
        assert len(pager.of("fleet.same_fault")) == expected, pager.sent
        assert alerts.active() == []


def test_nodes_lost_together_page_per_node_and_once_as_a_fleet():
    state, alerts, pager = setup(same_fault_nodes=3, rules={"fleet.same_fault": {"for_s": 0}})
    for n in ("n1", "n2", "n3"):
        node_up(state, n, T0)
        node_alerts(state, n, T0, "ib.port_down")  # retained: stays after the node dies
    run(state, alerts, T0, T0 + 1, ticking=["n1", "n2", "n3"])
    assert pager.of("fleet.same_fault")[0].labels == {"fault": "ib.port_down"}
    pager.sent.clear()
    for n in ("n1", "n2", "n3"):
        offline(state, n, T0 + 2)
    run(state, alerts, T0 + 2, T0 + 70)
    assert len(pager.of("node.offline")) == 3
    [fleet] = pager.of("fleet.same_fault")
    assert fleet.labels == {"fault": "node.offline"}
    # Dead nodes' retained alerts are not counted: ib.port_down resolves (after its clear_s, 60 s).
    [gone] = pager.of("fleet.same_fault", "resolved")
    assert gone.labels == {"fault": "ib.port_down"}


def test_blind_holds_everything_and_starts_nothing():
    state, alerts, pager = setup()
    node_up(state, "n1", T0)
    offline(state, "n1", T0 + 1)
    alerts.evaluate(state, T0 + 1)
    assert len(pager.sent) == 1
    node_up(state, "n2", T0 + 1)
    state.sweep(T0 + 100)  # everything silent: what a lost broker connection looks like
    alerts.evaluate(state, T0 + 100, blind=True)
    alerts.evaluate(state, T0 + 200, blind=True)
    assert len(pager.sent) == 1 and [r.status for r in alerts.active()] == ["firing"]


def test_restored_alerts_neither_page_again_nor_stick():
    state, alerts, pager = setup(rack_budget_kw=5)
    node_up(state, "n1", T0, power_w=650)  # 5.2 kW
    offline(state, "n2", T0)
    run(state, alerts, T0, T0 + 61, ticking=[("n1", 650.0)])
    assert {r.code for r in pager.sent} == {"node.offline", "rack.power"}
    saved = alerts.active()
    _, again, pager2 = setup(rack_budget_kw=5)
    assert again.restore(saved, T0 + 70) == 2
    run(state, again, T0 + 70, T0 + 80, ticking=[("n1", 650.0)])
    assert pager2.sent == []
    node_up(state, "n2", T0 + 81, rack="r2")
    node_up(state, "n1", T0 + 81, power_w=400)
    run(state, again, T0 + 81, T0 + 150, ticking=["n1", "n2"])
    assert sorted((r.code, r.status) for r in pager2.sent) == [("node.offline", "resolved"),
                                                                ("rack.power", "resolved")]
    assert again.engines == {}


def test_rule_overrides_and_bad_settings():
    book = fleet_book(FleetSettings(rules={"node.stale": {"enabled": False},
                                           "node.offline": {"severity": "warning", "for_s": 5}}))
    assert "node.stale" not in book and book["node.offline"].severity == "warning" and book["node.offline"].for_s == 5
    for bad in ({"rules": {"node.ofline": {}}}, {"racks": {"r 1": {"budget_kw": 3}}}, {"same_fault_nodes": 1},
                {"rack_budget_kw": 0}, {"stale_after_intervals": 0.5}, {"cluster": "a/b"}):
        with pytest.raises(ValidationError):
            FleetSettings(**bad)


def test_hostile_rack_and_labels_are_data():
    state, alerts, pager = setup(rack_budget_kw=1)
    node_up(state, "n1", T0, rack="r-1", labels={"team": "[bold]x[/]; rm -rf /"})
    offline(state, "n1", T0 + 1)
    alerts.evaluate(state, T0 + 1)
    [rec] = pager.sent
    assert rec.labels == {"team": "[bold]x[/]; rm -rf /"}


def test_a_failing_notifier_never_stops_evaluation():
    class Broken:
        def submit(self, records):
            raise RuntimeError("hook layer bug")

    state = FleetState()
    alerts = FleetAlerts(FleetRules(FleetSettings()), notifier=Broken())
    node_up(state, "n1", T0)
    offline(state, "n1", T0 + 1)
    assert [t.record.status for t in alerts.evaluate(state, T0 + 1)] == ["firing"]
    node_up(state, "n1", T0 + 2)
    offline(state, "n2", T0 + 2)
    assert [t.record.code for t in alerts.evaluate(state, T0 + 2)] == ["node.offline"]
    assert alerts.errors == 0 and {r.node for r in alerts.active()} == {"n1", "n2"}
