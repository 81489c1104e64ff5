"""Xid critical errors end to end, short of the daemon: the `--sim` fault, the audit finding (with
the Xid's number, meaning and severity), the alert rule (an event held for a quiet window: fires
once, resolves after it; one alert per GPU and Xid) and the wire `sample` round trip."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from samplefactory import healthy_sample, with_gpu

from nvmon import xid as xids
from nvmon.alerts.engine import AlertEngine
from nvmon.alerts.model import fingerprint
from nvmon.alerts.rules import NodeRules, rule_book
from nvmon.alerts.settings import AlertsSettings, RuleOverride
from nvmon.audit import RULES, audit, finding_to_dict
from nvmon.model import sample_to_dict
from nvmon.sim.scenario import SimSpecError, parse_scenario
from nvmon.wire.contract import MAX_XID_EVENTS, WireError, topic
from nvmon.wire.payloads import parse_message, sample_payload

T0 = 1_714_564_800.0
HEALTHY = healthy_sample()
SAMPLE_TOPIC = topic("c1", "n1", "sample")


def xid_sample(gpu: int, *events: int):
    return with_gpu(HEALTHY, gpu, xid_events=tuple(events))


# -- simulator spec -----------------------------------------------------------------------------


def test_xid_fault_syntax():
    [f] = parse_scenario("hgx-h100,xid=3:79@10").faults
    assert (f.kind, f.gpu, f.value, f.after_s) == ("xid", 3, 79.0, 10.0)
    for bad, why in (("xid=3", "GPU:XID"), ("xid=3:x", "must be a number"), ("xid=9:79", "GPU 9 does not exist")):
        with pytest.raises(SimSpecError, match=why):
            parse_scenario(f"hgx-h100,{bad}")


# -- audit ----------------------------------------------------------------------------------------


def test_audit_reports_each_xid_with_its_number_meaning_and_severity():
    report = audit(xid_sample(3, 79, 13, 79))
    found = {f.xid: f for f in report.findings if f.code == "gpu.xid"}
    assert set(found) == {79, 13} and report.verdict == "critical"
    f79, f13 = found[79], found[13]
    assert (f79.severity, f79.gpu, f79.observed) == ("critical", 3, {"xid": 79, "events": 2})
    assert "Xid 79" in f79.message and "fallen off the bus" in f79.message
    assert (f13.severity, f13.observed) == ("warning", {"xid": 13, "events": 1})
    # The audit JSON contract is unchanged: the Xid number rides in `observed`.
    assert list(finding_to_dict(f79)) == ["code", "severity", "gpu", "link", "device", "port", "observed",
                                          "expected", "message"]
    assert RULES["gpu.xid"] == "critical"
    assert not [f for f in audit(HEALTHY).findings if f.code == "gpu.xid"]


def test_xid_on_a_lost_gpu_is_still_reported():
    s = with_gpu(HEALTHY, 4, lost=True, xid_events=(79,), nvlink=())
    codes = {(f.code, f.gpu) for f in audit(s).findings}
    assert {("gpu.lost", 4), ("gpu.xid", 4)} <= codes


def test_catalog_severities():
    assert {48, 61, 62, 64, 74, 79, 95, 119, 120} <= xids.CRITICAL
    assert xids.severity(63) == xids.severity(94) == xids.severity(13) == "warning"
    assert xids.severity(12345) == "warning" and "catalog" in xids.meaning(12345)
    assert all(":" not in m for m, _, _ in xids.XIDS.values())  # the alert summary splits on ':'


# -- alert rule -----------------------------------------------------------------------------------


def engine(settings: AlertsSettings | None = None) -> AlertEngine:
    settings = settings or AlertsSettings(for_s=30, startup_grace_s=120)
    return AlertEngine(NodeRules(settings, cluster="c1", node="n1"), started_at=T0,
                       startup_grace_s=settings.startup_grace_s)


def test_an_xid_fires_at_once_holds_for_the_quiet_window_and_resolves_after_it():
    eng = engine()
    transitions = []
    for i in range(720):
        s = xid_sample(3, 79) if i in (0, 100) else HEALTHY  # a second Xid 79 100 s later
        for tr in eng.evaluate(replace(s, ts=T0 + i), T0 + i):
            transitions.append((i, tr.before, tr.record.status))
            rec = tr.record
    # No for_s, no start-up grace: fires on the tick it arrives; the repeat extends the episode;
    # resolves once 600 s have passed without one (+ clear_s: 2 intervals).
    # Last seen at 699 (the window still holds the event of 100), gone at 700, resolved 2 s later.
    assert transitions == [(0, None, "firing"), (701, "firing", "resolved")]
    assert rec.code == "gpu.xid" and rec.gpu == 3
    # value: the events in the window when last seen (the first one aged out at 600 s)
    assert rec.severity == "critical" and rec.value == {"xid": 79, "events": 1}
    assert "Xid 79" in rec.summary and "fallen off the bus" in rec.summary
    assert rec.runbook.startswith("GPU fell off the bus") and "RMA if it repeats" in rec.runbook
    assert rec.fingerprint == fingerprint("gpu.xid", "c1", "n1", gpu=3, xid=79)


def test_one_alert_per_gpu_and_xid_each_with_its_own_severity():
    eng = engine()
    s = with_gpu(xid_sample(3, 79, 13), 5, xid_events=(79,))
    eng.evaluate(replace(s, ts=T0), T0)
    got = sorted((r.gpu, r.value["xid"], r.severity, r.status) for r in eng.active())
    assert got == [(3, 13, "warning", "firing"), (3, 79, "critical", "firing"), (5, 79, "critical", "firing")]
    assert len({r.fingerprint for r in eng.active()}) == 3
    eng.evaluate(replace(s, ts=T0 + 1), T0 + 1)  # seen again: no new alert, no second page
    assert len(eng.active()) == 3


def test_a_storm_of_one_xid_is_one_alert_with_a_count_and_one_page():
    """500 identical Xids in a minute (issue 12): one alert, one notification, the count in its
    summary and value; the repeats extend the episode, they never page again."""
    eng = engine()
    pages, transitions = [], []
    for i in range(60):
        per_tick = 9 if i < 20 else 8  # 20 × 9 + 40 × 8 = 500
        trs = eng.evaluate(replace(xid_sample(2, *([48] * per_tick)), ts=T0 + i), T0 + i)
        transitions += trs
        pages += eng.to_notify(trs, T0 + i)
    assert [(p.status, p.gpu) for p in pages] == [("firing", 2)] and len(transitions) == 1
    [rec] = eng.active()
    eng.evaluate(replace(HEALTHY, ts=T0 + 60), T0 + 60)
    [rec] = eng.active()
    assert rec.value == {"xid": 48, "events": 500}
    assert "+500 in the last 600 s" in rec.summary


def test_xid_rule_settings_and_overrides():
    book = rule_book(AlertsSettings(), 1.0)
    r = book["gpu.xid"]
    assert (r.for_s, r.window_s, r.min_count, r.finding_severity) == (0.0, 600.0, 1, True)
    o = AlertsSettings(rules={"gpu.xid": RuleOverride(window_s=60, severity="warning", for_s=5)})
    r = rule_book(o, 1.0)["gpu.xid"]
    assert (r.for_s, r.window_s, r.severity, r.finding_severity) == (5, 60, "warning", False)
    eng = engine(o)
    for i in range(6):
        eng.evaluate(replace(xid_sample(1, 79) if i == 0 else HEALTHY, ts=T0 + i), T0 + i)
    [rec] = eng.active()
    assert rec.status == "firing" and rec.severity == "warning"  # the override wins over the Xid's


# -- model and wire ---------------------------------------------------------------------------------


def test_sample_dict_and_wire_round_trip():
    s = with_gpu(xid_sample(3, 79, 79), 6, xid_events=tuple(range(40)))
    assert sample_to_dict(s)["gpus"][3]["xid_events"] == [79, 79]
    tick = parse_message(SAMPLE_TOPIC, sample_payload(replace(s, node="n1")))
    g = {w.index: w for w in tick.gpus}
    assert g[3].xid_events == (79, 79) and g[0].xid_events == ()
    assert g[6].xid_events == tuple(range(MAX_XID_EVENTS))  # bounded per GPU
    d = json.loads(sample_payload(replace(HEALTHY, node="n1")))
    assert "xe" not in d  # sparse: absent on a quiet tick


@pytest.mark.parametrize(("xe", "why"), [({"9": [79]}, "not a GPU index"), ({"3": [-1]}, "xe.3"),
                                          ({"3": "79"}, "xe.3"), ({"3": list(range(17))}, "xe.3")])
def test_wire_reader_refuses_bad_xid_maps(xe, why):
    d = json.loads(sample_payload(replace(HEALTHY, node="n1")))
    d["xe"] = xe
    with pytest.raises(WireError, match=why):
        parse_message(SAMPLE_TOPIC, json.dumps(d).encode())
