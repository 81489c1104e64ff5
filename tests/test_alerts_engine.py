"""The alert engine on hand-built and simulated samples with a fake clock: lifecycle, hysteresis,
start-up grace, counts, fingerprints, holds, acks/silences, restart from SQLite, and a healthy
noisy node that fires nothing over a long fast-forwarded run."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from samplefactory import healthy_sample, with_gpu, with_link, with_pcie

from nvmon.alerts.engine import AlertEngine, wire_alert
from nvmon.alerts.model import Silence, fingerprint
from nvmon.alerts.rules import NodeRules, rule_book
from nvmon.alerts.settings import AlertsSettings, RuleOverride
from nvmon.collect.node import NodeSampler
from nvmon.model import NvmlStatus
from nvmon.sim.node import SimNode
from nvmon.store import Store

T0 = 1_714_564_800.0
HEALTHY = healthy_sample()
LINK_DOWN = with_link(HEALTHY, 2, 5, active=False)


def engine(settings: AlertsSettings | None = None, *, started_at: float = T0, node: str = "n1") -> AlertEngine:
    settings = settings or AlertsSettings(for_s=10, startup_grace_s=0)
    rules = NodeRules(settings, cluster="c1", node=node, rack="r1", labels={"team": "gpu"})
    return AlertEngine(rules, started_at=started_at, startup_grace_s=settings.startup_grace_s)


def run(eng: AlertEngine, sample, start: float, ticks: int, step: float = 1.0):
    """Evaluate `sample` once per `step` from `start`; returns [(ts, before, status, code)]."""
    out = []
    for i in range(ticks):
        now = start + i * step
        for tr in eng.evaluate(replace(sample, ts=now), now):
            out.append((now, tr.before, tr.record.status, tr.record.code))
    return out


def errors_on(sample, gpu: int, link: int, n: int):
    deltas = {"crc_flit": n, "crc_data": 0, "replay": 0, "recovery": 0}
    return with_link(sample, gpu, link, errors_delta=deltas)


# -- lifecycle ------------------------------------------------------------------------------------


def test_pending_then_firing_after_for_s_then_resolved_after_clear_s():
    eng = engine()
    seen = run(eng, LINK_DOWN, T0, 20)
    assert seen == [(T0, None, "pending", "nvlink.link_down"), (T0 + 10, "pending", "firing", "nvlink.link_down")]
    [rec] = eng.active()
    assert (rec.gpu, rec.link, rec.node, rec.cluster, rec.rack, rec.severity) == (2, 5, "n1", "c1", "r1", "critical")
    assert rec.fired_at == T0 + 10 and rec.count == 20 and rec.labels == {"team": "gpu"}
    assert "reseat" in rec.runbook and rec.value == "down" and rec.threshold == "active"
    seen = run(eng, HEALTHY, T0 + 20, 15)
    # last seen at T0+19; clear_s defaults to max(for_s, 2 intervals) = 10 s
    assert seen == [(T0 + 29, "firing", "resolved", "nvlink.link_down")]
    assert eng.active() == []
    resolved = eng.take_dirty(T0 + 29)
    assert [(r.status, r.ends_at, r.fired_at, r.count) for r in resolved] == [("resolved", T0 + 29, T0 + 10, 20)]


def test_tick_jitter_does_not_cost_a_whole_tick():
    """Ticks 0.999 s apart: the tick at 9.99 s after the first sight fires a 10 s for-duration
    (slack of a quarter interval), the one at 8.99 s does not."""
    rules = NodeRules(AlertsSettings(for_s=10, startup_grace_s=0), cluster="c1", node="n1")
    eng = AlertEngine(rules, started_at=T0, tick_slack_s=0.25)
    seen = run(eng, LINK_DOWN, T0, 12, step=0.999)
    assert [(round(ts - T0, 3), status) for ts, _, status, _ in seen] == [(0.0, "pending"), (9.99, "firing")]
    strict = engine()  # no slack: the same ticks wait for the 11th
    seen = run(strict, LINK_DOWN, T0, 12, step=0.999)
    assert [(round(ts - T0, 3), status) for ts, _, status, _ in seen] == [(0.0, "pending"), (10.989, "firing")]


def test_a_blip_shorter_than_for_s_never_fires_and_leaves_no_history():
    eng = engine()
    seen = run(eng, LINK_DOWN, T0, 3) + run(eng, HEALTHY, T0 + 3, 30)
    assert [s[2] for s in seen] == ["pending", "resolved"]
    [gone] = [r for r in eng.take_dirty(T0 + 40, force=True) if r.status == "resolved"]
    assert gone.fired_at is None  # the store deletes such an episode (see test_alerts_store)
    assert eng.to_notify([], T0) == []


def test_for_s_zero_fires_on_first_sight():
    eng = engine(AlertsSettings(for_s=0, startup_grace_s=0))
    lost = with_gpu(HEALTHY, 6, lost=True)
    assert run(eng, lost, T0, 3) == [(T0, None, "firing", "gpu.lost")]


def test_hysteresis_keeps_one_alert_through_a_flapping_counter():
    """Errors in bursts with gaps shorter than clear_s: one episode, one firing, one resolved."""
    s = AlertsSettings(for_s=2, startup_grace_s=0, rules={"nvlink.errors": RuleOverride(window_s=3, min_count=5,
                                                                                         clear_s=8)})
    eng = engine(s)
    seen = []
    t = T0
    for cycle in range(20):  # 2 ticks of +4 errors, then 4 quiet ticks: the window sum flaps
        for i in range(6):
            sample = errors_on(HEALTHY, 1, 7, 4) if i < 2 else HEALTHY
            seen += [(tr.before, tr.record.status) for tr in eng.evaluate(replace(sample, ts=t), t)]
            t += 1
    assert seen == [(None, "pending"), ("pending", "firing")]
    [rec] = eng.active()
    assert rec.code == "nvlink.errors" and (rec.gpu, rec.link) == (1, 7)
    assert rec.count > 20 and "+8 in the last 3 s" in rec.summary and "crc_flit" in rec.summary
    seen = run(eng, HEALTHY, t, 15)
    assert [(b, a) for _, b, a, _ in seen] == [("firing", "resolved")]


def test_a_rare_corrected_error_never_pages():
    eng = engine(AlertsSettings(for_s=0, startup_grace_s=0))  # even with no for-duration
    seen = []
    for i in range(600):
        sample = errors_on(HEALTHY, 0, 0, 1) if i % 30 == 0 else HEALTHY  # one CRC error every 30 s
        seen += eng.evaluate(replace(sample, ts=T0 + i), T0 + i)
    assert seen == []


def test_startup_grace_holds_link_alerts_but_not_others():
    s = AlertsSettings(for_s=5, startup_grace_s=60)
    eng = engine(s)
    both = with_gpu(LINK_DOWN, 6, lost=True)
    seen = run(eng, both, T0, 70)
    fired = {code: ts for ts, _, status, code in seen if status == "firing"}
    assert fired == {"gpu.lost": T0 + 5, "nvlink.link_down": T0 + 60}


def test_a_link_that_trains_up_during_grace_never_pages():
    eng = engine(AlertsSettings(for_s=5, startup_grace_s=60))
    seen = run(eng, LINK_DOWN, T0, 40) + run(eng, HEALTHY, T0 + 40, 60)
    assert [s[2] for s in seen] == ["pending", "resolved"]
    assert eng.stats.fired == 0


def test_power_cap_every_tick_is_one_alert_with_a_count():
    capped = with_gpu(HEALTHY, 4, power_w=700.0, throttle_reasons=("sw_power_cap",))
    eng = engine()
    seen = run(eng, capped, T0, 300)
    assert [(s[2], s[3]) for s in seen] == [("pending", "power.cap"), ("firing", "power.cap")]
    [rec] = eng.active()
    assert rec.count == 300 and rec.gpu == 4


def test_power_threshold_comes_from_the_config():
    at_90 = with_gpu(HEALTHY, 3, power_w=630.0)  # 90 % of 700 W
    assert run(engine(), at_90, T0, 20) == []
    eng = engine(AlertsSettings(for_s=10, startup_grace_s=0, power_cap_pct=90))
    assert [s[3] for s in run(eng, at_90, T0, 20)] == ["power.cap", "power.cap"]


def test_fingerprints_are_stable_and_distinct():
    a, b = engine(), engine()
    run(a, LINK_DOWN, T0, 1)
    run(b, LINK_DOWN, T0 + 500, 1)
    assert [r.fingerprint for r in a.active()] == [r.fingerprint for r in b.active()]
    assert a.active()[0].fingerprint == fingerprint("nvlink.link_down", "c1", "n1", gpu=2, link=5, rack="r1")
    other = engine(node="n2")
    run(other, LINK_DOWN, T0, 1)
    run(a, with_link(HEALTHY, 2, 6, active=False), T0 + 1, 1)
    fps = {r.fingerprint for r in a.active()} | {r.fingerprint for r in other.active()}
    assert len(fps) == 3


# -- rules configuration -------------------------------------------------------------------------


def test_overrides_disable_and_change_severity_and_for_s():
    s = AlertsSettings(for_s=30, clear_s=None, rules={"pcie.width": RuleOverride(enabled=False),
                                                      "thermal": RuleOverride(severity="critical", for_s=5)})
    book = rule_book(s, interval_s=20)
    assert "pcie.width" not in book and "nvlink.board" not in book and "gpu.model" not in book
    assert (book["thermal"].severity, book["thermal"].for_s, book["thermal"].clear_s) == ("critical", 5, 40)
    assert book["nvlink.link_down"].for_s == 30 and book["nvlink.link_down"].grace
    assert book["nvlink.errors"].window_s == 60 and book["nvlink.errors"].min_count == 10
    assert book["thermal"].window_s is None


@pytest.mark.parametrize(("rules", "fragment"), [
    ({"pcie.widht": {}}, "unknown rule 'pcie.widht'"),
    ({"pcie.width": {"min_count": 3}}, "only to counter rules"),
    ({"pcie.width": {"for": 3}}, "Extra inputs"),
    ({"thermal": {"severity": "urgent"}}, "critical"),
])
def test_bad_rule_settings_are_refused(rules, fragment):
    with pytest.raises(ValueError, match=fragment):
        AlertsSettings.model_validate({"rules": rules})


# -- holds, acks, silences -----------------------------------------------------------------------


def test_nvml_going_away_holds_gpu_alerts_instead_of_resolving_them():
    eng = engine()
    run(eng, LINK_DOWN, T0, 12)
    no_nvml = replace(healthy_sample(nvml_available=False), nvml=NvmlStatus(False, error="driver gone"))
    seen = run(eng, no_nvml, T0 + 12, 60)
    assert ("firing", "resolved", "nvlink.link_down") not in [s[1:] for s in seen]
    assert any(r.code == "nvlink.link_down" and r.status == "firing" for r in eng.active())


def test_a_lost_gpu_keeps_its_other_alerts():
    eng = engine()
    narrow = with_pcie(HEALTHY, 3, width=8)
    run(eng, narrow, T0, 12)
    seen = run(eng, with_gpu(HEALTHY, 3, lost=True), T0 + 12, 40)
    assert [(s[2], s[3]) for s in seen if s[3] == "pcie.width"] == []


def test_silences_keep_alerts_from_the_notifier_and_acks_mark_them():
    eng = engine()
    trs = [tr for i in range(11) for tr in eng.evaluate(replace(LINK_DOWN, ts=T0 + i), T0 + i)]
    assert [r.status for r in eng.to_notify(trs, T0 + 10)] == ["firing"]
    fp = eng.active()[0].fingerprint
    eng.set_controls({(fp, round(T0 * 1000)): T0 + 11}, [Silence(1, {"node": "n1", "code": "nvlink.*"}, T0, T0 + 3600)])
    assert eng.active()[0].acked_at == T0 + 11
    assert eng.to_notify(trs, T0 + 10) == []
    assert eng.to_notify(trs, T0 + 3600) != []  # the silence has ended
    assert not Silence(2, {"gpu": "3"}, T0, T0 + 10).matches(eng.active()[0], T0 + 1)


def test_wire_alert_carries_state_since_and_place():
    eng = engine()
    run(eng, LINK_DOWN, T0, 11)
    a = wire_alert(eng.active()[0])
    assert (a.state, a.since, a.gpu, a.link, a.code, a.labels) == ("firing", T0 + 10, 2, 5, "nvlink.link_down",
                                                                   {"team": "gpu"})


# -- restart --------------------------------------------------------------------------------------


def test_restart_from_the_database_neither_repages_nor_forgets(tmp_path):
    store = Store(tmp_path / "nvmon.db")
    first = engine()
    run(first, LINK_DOWN, T0, 15)
    store.save_alerts(first.take_dirty(T0 + 15, force=True), T0 + 15)
    store.close()

    store = Store(tmp_path / "nvmon.db")
    second = engine(AlertsSettings(for_s=10, startup_grace_s=120), started_at=T0 + 100)
    assert second.restore(store.load_alerts(), T0 + 100) == 1
    seen = run(second, LINK_DOWN, T0 + 100, 30)
    assert seen == []  # still firing: no new transition, no second page (grace changes nothing)
    [rec] = second.active()
    assert (rec.status, rec.fired_at, rec.count) == ("firing", T0 + 10, 45)
    seen = run(second, HEALTHY, T0 + 130, 20)
    assert [s[1:] for s in seen] == [("firing", "resolved", "nvlink.link_down")]
    store.save_alerts(second.take_dirty(T0 + 150), T0 + 150)
    assert store.load_alerts() == []
    store.close()


# -- a long healthy run ---------------------------------------------------------------------------


def test_healthy_noisy_node_fires_nothing_over_eight_simulated_hours():
    """A simulated HGX H100 under all-reduce traffic (bursts, power swings), fast-forwarded through
    8 h at one sample per ~40 s (an odd step, so samples land on every phase of the traffic
    bursts), with real-world noise on top: a lone CRC error now and then, a one-tick power spike
    to the limit, an unreadable link state. Nothing may fire."""
    now = [T0]
    node = SimNode("hgx-h100,load=allreduce,seed=3", clock=lambda: now[0])
    sampler = NodeSampler(node.nvml, sysfs_root=node.sysfs_root, node="n1", before_tick=node.sync,
                          clock=lambda: now[0])
    rng = random.Random(7)
    eng = engine(AlertsSettings(startup_grace_s=120), started_at=T0)
    fired, pending = [], 0
    try:
        sampler.open()
        sampler.sample()
        while now[0] < T0 + 8 * 3600:
            now[0] += 41.7
            s = sampler.sample()
            r = rng.random()
            if r < 0.02:
                s = errors_on(s, rng.randrange(8), rng.randrange(18), 1)
            elif r < 0.03:
                g = s.gpus[rng.randrange(8)]
                s = with_gpu(s, g.index, power_w=g.power_limit_w)
            elif r < 0.04:
                s = with_link(s, rng.randrange(8), rng.randrange(18), active=None)
            for tr in eng.evaluate(s, now[0]):
                pending += tr.record.status == "pending"
                if tr.record.status == "firing":
                    fired.append(tr.record)
    finally:
        sampler.close()
        node.close()
    assert fired == [] and eng.active() == []
    assert pending > 0  # the spikes were seen, and let go
