"""Node alerts inside `nvmon daemon`: for each simulator fault, a real daemon process with real
SQLite and a real Mosquitto pages exactly once per fingerprint with the right code and labels,
publishes it retained, and resolves it once the fault is cleared (the daemon restarted on a
healthy board, the same database: no second page), or in the same run when the fault has an end
time (`@START-END`). Plus the in-process guarantees: an engine bug or a failing notifier never
stops sampling, silences keep alerts from the notifier, and bad `[alerts]` config is one line."""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from mqtt_broker import Broker, Recorder, needs_mosquitto, wait_until
from samplefactory import healthy_sample, with_link
from test_daemon import DaemonProc, wait_ticks
from test_hooks import Receiver, calls, recorder

from nvmon.alerts.model import Silence
from nvmon.daemon.alerting import DaemonAlerts
from nvmon.daemon.config import ConfigError, DaemonConfig, load_config
from nvmon.specs import NodeSpec
from nvmon.store import Store

ALERTS_TOML = '[alerts]\nfor_s = 0.4\nclear_s = 0.6\nstartup_grace_s = 0\n[expect]\nib = "8x400"\n'

# fault (started 1 s into the run, `@1`) → the alerts it must raise: (code, where). The link layer
# is read once per port (it changes only with a reboot), so ib_eth is there from the start.
FAULTS = [
    ("nvlink_down=2.5", [("nvlink.link_down", {"gpu": 2, "link": 5})]),
    ("nvlink_errors=2.5", [("nvlink.errors", {"gpu": 2, "link": 5})]),
    ("pcie_width=3:8", [("pcie.width", {"gpu": 3})]),
    ("pcie_gen=3:3", [("pcie.gen", {"gpu": 3})]),
    ("ib_down=1", [("ib.port_down", {"device": "mlx5_1", "port": 1}), ("ib.count", {})]),
    ("ib_rate=mlx5_1:100", [("ib.rate", {"device": "mlx5_1", "port": 1})]),
    ("ib_eth=2@0", [("ib.rate", {"device": "mlx5_2", "port": 1})]),
    ("ib_errors=3", [("ib.errors", {"device": "mlx5_3", "port": 1})]),
    ("ib_pcie_width=mlx5_2", [("pcie.width", {"device": "mlx5_2"})]),  # the HCA's link: one alert, no port
    ("power_cap=4", [("power.limit", {"gpu": 4}), ("power.cap", {"gpu": 4})]),
    ("thermal=5", [("thermal", {"gpu": 5})]),
    ("gpu_lost=6", [("gpu.lost", {"gpu": 6})]),
    ("xid=3:79", [("gpu.xid", {"gpu": 3})]),  # an NVML event, held as an alert for a quiet window
    ("notsup=temperature", []),
    ("fabric=in_progress", [("fabric.not_ready", {})]),  # Fabric Manager down: one alert for the node
    ("fabric_health=route_unhealthy:2", [("fabric.health", {"gpu": 2})]),
]


def alert_rows(db: Path) -> list[dict]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM alerts ORDER BY code, fingerprint")]
    finally:
        con.close()


def logged(text: str, status: str) -> list[str]:
    """Fingerprints in the daemon's `alert <status>:` log lines, in order."""
    return re.findall(rf"alert {status}: .*? \(([0-9a-f]{{16}})\):", text)


def active_set(msg) -> list[dict]:
    return json.loads(msg.payload)["alerts"]


@needs_mosquitto
@pytest.mark.parametrize(("fault", "expected"), FAULTS, ids=[f for f, _ in FAULTS])
async def test_each_simulated_fault_pages_once_and_resolves_when_cleared(tmp_path, fault, expected):
    codes = sorted(c for c, _ in expected)
    receiver = Receiver()  # a real HTTP endpoint for a webhook and an Alertmanager hook
    argv, exec_out = recorder(tmp_path)  # an exec hook: a program that records its stdin
    hooks = (f'[[hooks]]\ntype = "exec"\ncommand = {json.dumps(argv)}\n'
             f'[[hooks]]\ntype = "webhook"\nurl = "{receiver.url("/webhook")}"\n'
             f'[[hooks]]\ntype = "alertmanager-webhook"\nurl = "{receiver.url("/am")}"\n')
    try:
        await _fault_pages_once(tmp_path, fault, codes, expected, ALERTS_TOML + hooks, receiver, exec_out)
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()


def hook_deliveries(receiver: Receiver, exec_out: Path, status: str) -> dict[str, list[str]]:
    """Fingerprints each hook was told about with `status`, per hook, in order."""
    exec_fps = [a["fingerprint"] for a in map(json.loads, (c["stdin"] for c in calls(exec_out)))
                if a["status"] == status]
    web = [b["fingerprint"] for b in receiver.bodies("/webhook") if b["status"] == status]
    # Alertmanager notifications carry the group's whole current state (receivers dedupe by
    # fingerprint), so an alert rides along again when another in its group fires: count it once.
    am = sorted({a["fingerprint"] for b in receiver.bodies("/am") for a in b["alerts"]
                 if b["status"] == status and a["status"] == status})
    return {"exec": exec_fps, "webhook": web, "alertmanager-webhook": am}


async def _fault_pages_once(tmp_path, fault, codes, expected, toml, receiver, exec_out):
    with Broker(tmp_path) as broker:
        async with Recorder(broker.url, "nvmon/v1/t/n1/alerts") as rec:
            d = DaemonProc(tmp_path, broker=broker.url, sim=f"hgx-h100,{fault}" + ("" if "@" in fault else "@1"),
                           extra_toml=toml).start()
            try:
                if codes:
                    await rec.wait_for("alerts", lambda m: sorted(a["code"] for a in active_set(m)
                                                                  if a["state"] == "firing") == codes, timeout=30)
                n = len(await wait_ticks(d.db, 1))
                await wait_ticks(d.db, n + 10)  # 2 s more: nothing else may fire, nothing may fire twice
            finally:
                assert d.stop() == 0
            first_log = d.log_text()
            fired = logged(first_log, "firing")
            rows = alert_rows(d.db)
            assert sorted(r["code"] for r in rows if r["status"] == "firing") == codes, first_log
            assert len(fired) == len(set(fired)) == len(codes) and set(fired) == {r["fingerprint"] for r in rows}
            for code, where in expected:
                [row] = [r for r in rows if r["code"] == code]
                assert (row["cluster"], row["rack"], row["node"]) == ("t", "r1", "n1")
                got = {k: row[k] for k in ("gpu", "link", "device", "port")}
                assert got == {"gpu": None, "link": None, "device": None, "port": None, **where}
            retained = [a for a in active_set(rec.on("alerts")[-1]) if a["state"] == "firing"]
            assert sorted(a["fingerprint"] for a in retained) == sorted(fired)
            # Every hook was paged exactly once per fingerprint, with the alert contract.
            for hook_name, fps in hook_deliveries(receiver, exec_out, "firing").items():
                assert sorted(fps) == sorted(fired), hook_name
            by_fp = {r["fingerprint"]: r for r in rows}
            for c in calls(exec_out):
                a = json.loads(c["stdin"])
                row = by_fp[a["fingerprint"]]
                assert (a["code"], a["node"], a["cluster"], a["gpu"], a["device"]) == \
                    (row["code"], "n1", "t", row["gpu"], row["device"])
                assert a["starts_at"].endswith("Z") and a["runbook"] and a["summary"]
            if not codes:
                assert receiver.bodies("/webhook") == [] and calls(exec_out) == []
                return

            # The fault is cleared (repaired, rebooted): same node, same database, healthy board.
            seen = len(rec.messages)
            d2 = DaemonProc(tmp_path, broker=broker.url, sim="hgx-h100", extra_toml=toml).start()
            try:
                await wait_until(lambda: any(active_set(m) == [] for m in rec.messages[seen:]), 30,
                                 "an empty active set after the restart")
            finally:
                assert d2.stop() == 0
            second_log = d2.log_text()[len(first_log):]
            assert logged(second_log, "firing") == [], second_log
            assert sorted(logged(second_log, "resolved")) == sorted(fired)
            after = alert_rows(d.db)
            assert len(after) == len(rows)  # the same episodes, now resolved
            for old, new in zip(rows, after):
                assert (new["fingerprint"], new["status"], new["fired_ms"]) == (old["fingerprint"], "resolved",
                                                                                old["fired_ms"])
                assert new["ends_ms"] >= old["fired_ms"] and new["count"] >= old["count"]
            # Each hook heard the resolve once per fingerprint, and no second firing.
            for hook_name, fps in hook_deliveries(receiver, exec_out, "resolved").items():
                assert sorted(fps) == sorted(fired), hook_name
            for hook_name, fps in hook_deliveries(receiver, exec_out, "firing").items():
                assert sorted(fps) == sorted(fired), hook_name
    assert "Traceback" not in d2.log_text()


@needs_mosquitto
async def test_a_fault_with_an_end_time_fires_and_resolves_in_the_same_run(tmp_path):
    """`@START-END`: the hardware heals while the daemon runs. PCIe width is in the collector's slow
    rotation (re-read every 20 ticks, 4 s at 0.2 s), so its fault lasts 5 s: at least one read lands
    in it, and one after it. The IB port is read every tick."""
    argv, exec_out = recorder(tmp_path)
    toml = ALERTS_TOML + f'[[hooks]]\ntype = "exec"\ncommand = {json.dumps(argv)}\n'
    codes = ["ib.count", "ib.port_down", "pcie.width"]
    with Broker(tmp_path) as broker:
        async with Recorder(broker.url, "nvmon/v1/t/n1/alerts") as rec:
            d = DaemonProc(tmp_path, broker=broker.url, sim="hgx-h100,pcie_width=3:8@1-6,ib_down=mlx5_1@1-6",
                           extra_toml=toml).start()
            try:
                await rec.wait_for("alerts", lambda m: sorted(a["code"] for a in active_set(m)
                                                              if a["state"] == "firing") == codes, timeout=15)
                fired_at = len(rec.messages)
                await wait_until(lambda: any(active_set(m) == [] for m in rec.messages[fired_at:]), 15,
                                 "an empty active set once the faults end")
                n = len(await wait_ticks(d.db, 1))
                await wait_ticks(d.db, n + 5)  # 1 s more: nothing fires again
            finally:
                assert d.stop() == 0
    log = d.log_text()
    fired, resolved = logged(log, "firing"), logged(log, "resolved")
    assert len(fired) == len(set(fired)) == len(codes) and sorted(resolved) == sorted(fired), log
    rows = alert_rows(d.db)
    assert [r["code"] for r in rows] == codes and {r["status"] for r in rows} == {"resolved"}
    assert {r["fingerprint"] for r in rows} == set(fired)
    by_code = {r["code"]: r for r in rows}
    assert (by_code["pcie.width"]["gpu"], by_code["ib.port_down"]["device"]) == (3, "mlx5_1")
    for r in rows:
        assert r["ends_ms"] >= r["fired_ms"]
    # The exec hook heard each fingerprint fire once and resolve once, in that order.
    heard = [(a["fingerprint"], a["status"]) for a in map(json.loads, (c["stdin"] for c in calls(exec_out)))]
    assert sorted(heard) == sorted([(fp, st) for fp in fired for st in ("firing", "resolved")])
    for fp in fired:
        assert heard.index((fp, "firing")) < heard.index((fp, "resolved"))
    assert "Traceback" not in log


@needs_mosquitto
async def test_fabric_not_ready_waits_out_the_grace_pages_once_and_resolves_when_it_completes(tmp_path):
    """Fabric Manager down from boot until 5 s in: the condition holds from the first tick, but
    `fabric.not_ready` is a start-up-grace rule (the fabric completes seconds after the driver
    loads), so it fires only once the 2 s grace is over: one critical alert for the node, resolved
    after the fabric completes (read every 5 ticks, 1 s at 0.2 s)."""
    argv, exec_out = recorder(tmp_path)
    toml = ALERTS_TOML.replace("startup_grace_s = 0", "startup_grace_s = 2") + \
        f'[[hooks]]\ntype = "exec"\ncommand = {json.dumps(argv)}\n'
    with Broker(tmp_path) as broker:
        async with Recorder(broker.url, "nvmon/v1/t/n1/alerts") as rec:
            d = DaemonProc(tmp_path, broker=broker.url, sim="hgx-h100,fabric=in_progress@0-5", extra_toml=toml).start()
            try:
                await rec.wait_for("alerts", lambda m: [(a["code"], a["state"]) for a in active_set(m)]
                                   == [("fabric.not_ready", "firing")], timeout=15)
                fired_at = len(rec.messages)
                await wait_until(lambda: any(active_set(m) == [] for m in rec.messages[fired_at:]), 15,
                                 "an empty active set once the fabric completes")
                n = len(await wait_ticks(d.db, 1))
                await wait_ticks(d.db, n + 5)  # 1 s more: nothing fires again
            finally:
                assert d.stop() == 0
    log = d.log_text()
    [row] = alert_rows(d.db)
    assert (row["code"], row["severity"], row["status"], row["gpu"]) == \
        ("fabric.not_ready", "critical", "resolved", None)
    assert "systemctl status nvidia-fabricmanager" in row["runbook"] and "GPUs 0-7" in row["summary"]
    first_tick = (await wait_ticks(d.db, 1))[0]
    assert row["fired_ms"] / 1000 >= first_tick + 2 - 0.3  # not during the grace (one tick of slack)
    assert row["ends_ms"] / 1000 >= first_tick + 5 - 0.3  # held while the fault did
    heard = [(a["code"], a["severity"], a["status"]) for a in map(json.loads, (c["stdin"] for c in calls(exec_out)))]
    assert heard == [("fabric.not_ready", "critical", "firing"), ("fabric.not_ready", "critical", "resolved")]
    assert "Traceback" not in log


# -- in process -----------------------------------------------------------------------------------


class Recording:
    def __init__(self, fail: bool = False):
        self.got: list = []
        self.fail = fail

    def submit(self, records):
        if self.fail:
            raise RuntimeError("hook bug")
        self.got.extend(records)


def daemon_alerts(tmp_path, notifier, **alerts) -> DaemonAlerts:
    cfg = DaemonConfig.model_validate({"node": {"name": "n1", "cluster": "c1"},
                                       "alerts": {"for_s": 2, "startup_grace_s": 0, **alerts}})
    return DaemonAlerts(cfg, node="n1", node_spec=NodeSpec(), store=Store(tmp_path / "nvmon.db"), notifier=notifier,
                        clock=lambda: 0.0)


async def test_notifier_gets_firing_and_resolved_once_and_silences_hold_them_back(tmp_path):
    note = Recording()
    da = daemon_alerts(tmp_path, note)
    down = with_link(healthy_sample(), 2, 5, active=False)
    t = 1000.0
    for i in range(10):
        da.tick(replace(down, ts=t + i))
    assert [(r.status, r.code) for r in note.got] == [("firing", "nvlink.link_down")]
    da.engine.set_controls({}, [Silence(1, {"node": "n1"}, t, t + 3600)])
    healthy = healthy_sample()
    for i in range(10, 20):
        da.tick(replace(healthy, ts=t + i))
    assert len(note.got) == 1  # the resolved one was silenced
    da.flush()
    assert [r["status"] for r in alert_rows(tmp_path / "nvmon.db")] == ["resolved"]


async def test_an_engine_bug_or_a_failing_notifier_costs_nothing_but_that_tick(tmp_path, caplog):
    da = daemon_alerts(tmp_path, Recording(fail=True), for_s=0)
    sample = with_link(healthy_sample(), 2, 5, active=False)
    assert da.tick(sample)  # fires; the notifier raises, the tick still returns
    real = da.rules.conditions
    da.rules.conditions = lambda s, now: 1 / 0
    for _ in range(3):
        assert da.tick(sample) == []
    assert da.errors == 3 and "alert evaluation failed" in caplog.text
    da.rules.conditions = real
    assert da.tick(sample) == [] and da.errors == 3  # back to work, the alert still firing
    assert da.engine.active()[0].status == "firing" and da.eval_seconds < 0.05


@pytest.mark.parametrize(("toml", "fragment"), [
    ('[alerts.rules."pcie.widht"]\nfor_s = 5\n', "alerts.rules: unknown rule 'pcie.widht'"),
    ("[alerts]\nfor_s = -1\n", "alerts.for_s: must be at least 0"),
    ("[alerts]\nforr_s = 1\n", "alerts.forr_s: unknown key"),
    ('[alerts.rules."thermal"]\nmin_count = 2\n', "apply only to counter rules"),
    ('[alerts.rules."thermal"]\nenabled = "maybe"\n', "alerts.rules.thermal.enabled"),
])
def test_bad_alerts_config_is_one_line(tmp_path, toml, fragment):
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert fragment in str(e.value) and "\n" not in str(e.value) and str(path) in str(e.value)
