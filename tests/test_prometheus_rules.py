"""The Prometheus rules shipped in docs/prometheus/ (docs/prometheus.md, "Alerting from
Prometheus"): `promtool check rules` and `promtool test rules` pass; every alert carries an nvmon
code with that code's severity and runbook; and a real Prometheus scraping a running daemon on a
faulty simulated board (and a target that does not answer) evaluates them: each alert goes pending
on the component the fault is on, the recording rules have data, and the `nvmon_*` part of the
live page passes `promtool check metrics`."""

from __future__ import annotations

import re
import subprocess

import pytest
from realstack import RULE_TESTS, RULES, Prometheus, free_port, tool, wait_for
from test_prometheus import Daemon

from nvmon.codes import CODES, runbook

SIM = ("hgx-h100,nvlink_down=2.5,pcie_width=3:8,ib_rate=mlx5_1:100,power_cap=4,fabric=in_progress,nvlink_errors=1.3,"
       "power_brake=6")
OBSERVED = {"pcie.width": "link narrower than its maximum"}  # the one runbook with a placeholder


def test_promtool_checks_and_unit_tests_the_rules():
    promtool = tool("promtool", package="prometheus")
    for args in (["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]):
        r = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60, cwd=RULES.parent)
        assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rules")
    d = Daemon(tmp, SIM)
    d.scrape()
    dead = f"127.0.0.1:{free_port()}"  # a node whose daemon does not answer: up == 0
    try:
        with Prometheus(tmp, [f"127.0.0.1:{d.port}", dead], rule_files=(RULES,)) as prom:
            yield d, prom, dead
    finally:
        if d.proc.poll() is None:
            d.stop()


def test_every_alert_names_an_nvmon_code_with_its_severity_and_runbook(stack):
    _, prom, _ = stack
    groups = {g["name"]: g["rules"] for g in prom.rules()}
    assert [r["type"] for r in groups["nvmon-recording"]] == ["recording"] * 6
    alerts = groups["nvmon-alerts"]
    assert len(alerts) == 11
    for rule in alerts:
        code = rule["labels"]["code"]
        assert rule["labels"]["severity"] == CODES[code].severity, rule["name"]
        assert rule["annotations"]["runbook"] == runbook(code, OBSERVED.get(code)), rule["name"]
        assert rule["annotations"]["summary"] and rule["duration"] == 60, rule["name"]


def test_a_real_prometheus_evaluates_the_rules_on_a_faulty_board(stack):
    d, prom, dead = stack
    want = {  # alert → the labels it must carry (one alert each)
        "NvmonNVLinkDown": {"gpu": "2", "link": "5", "hostname": "prom-1"},
        "NvmonPCIeDowntrained": {"gpu": "3", "modelName": "NVIDIA H100 80GB HBM3"},
        "NvmonIBBelowRate": {"device": "mlx5_1", "port": "1"},
        "NvmonFabricNotReady": {"hostname": "prom-1"},
        "NvmonGPUPowerLimitLow": {"gpu": "4"},
        "NvmonGPUPowerBrake": {"gpu": "6", "code": "power.brake", "severity": "critical"},
        "NvmonNodeAgentDown": {"instance": dead},
    }

    def seen():
        got = {}
        for a in prom.alerts():
            got.setdefault(a["labels"]["alertname"], []).append(a)
        return got if set(want) <= set(got) else None

    got = wait_for(seen, 45, f"Prometheus to evaluate {sorted(want)}", every=0.5)
    for name, labels in want.items():
        [a] = got[name]
        assert a["state"] in ("pending", "firing") and labels.items() <= a["labels"].items(), (name, a)
        assert a["annotations"]["runbook"] == runbook(a["labels"]["code"], OBSERVED.get(a["labels"]["code"]))
    assert got["NvmonPCIeDowntrained"][0]["annotations"]["summary"] == "prom-1: GPU 3 PCIe x8, below its maximum width"
    assert "NvmonNotSampling" not in got and "NvmonPCIeGenLow" not in got
    # the recording rules have data
    for record in ("nvmon:nvlink_links_down:count", "nvmon:gpu_pcie_width:ratio", "nvmon:ib_port_rate:ratio_to_fastest",
                   "nvmon:audit_findings:sum", "nvmon:nvlink_bytes:rate1m", "nvmon:nvlink_errors:increase1m"):
        wait_for(lambda r=record: prom.result(r), 20, f"{record} to have data")
    [down] = prom.result("nvmon:nvlink_links_down:count")
    assert (down["metric"]["gpu"], down["value"][1]) == ("2", "1")
    [half] = prom.result('nvmon:gpu_pcie_width:ratio{gpu="3"}')
    assert half["value"][1] == "0.5"


def test_the_nvmon_part_of_a_live_page_passes_promtool(stack):
    promtool = tool("promtool", package="prometheus")
    d, _, _ = stack
    page = d.scrape()
    own = "".join(block for block in re.split(r"(?m)^(?=# HELP )", page) if not block.startswith("# HELP DCGM_"))
    assert own.count("# HELP nvmon_") > 40 and not re.search(r"(?m)^(# TYPE )?DCGM_", own)
    r = subprocess.run([promtool, "check", "metrics"], input=own, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
