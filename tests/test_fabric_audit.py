"""The audit of the NVSwitch fabric (nvmon/audit/fabric.py) on simulated boards, and `nvmon audit`
on one with Fabric Manager down: the fault every other check misses (links Active, NV18)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from nvmon.audit import audit
from nvmon.cli.node import audit as audit_command
from nvmon.model import GpuFabric, Topology
from nvmon.sim.node import SimNode
from simboard import first_sample


def fabric_findings(spec: str):
    s = first_sample(spec)
    return s, [f for f in audit(s).findings if f.code.startswith("fabric.")]


@pytest.mark.parametrize("profile", ["hgx-h100", "hgx-h200", "hgx-h800", "hgx-b200"])
def test_a_healthy_fabric_is_no_finding(profile):
    s, found = fabric_findings(profile)
    assert all(g.fabric.state == 3 for g in s.gpus) and found == []


@pytest.mark.parametrize("profile", ["hgx-a100", "pairs-a100", "pcie-l40s", "h200-single"])
def test_a_board_without_a_fabric_nvml_reports_is_no_finding(profile):
    s, found = fabric_findings(profile)
    assert all(g.fabric.state is None for g in s.gpus) and found == []


@pytest.mark.parametrize("state,word", [("in_progress", "In Progress"), ("not_started", "Not Started")])
def test_fabric_manager_down_is_one_critical_finding_for_the_node(state, word):
    s, found = fabric_findings(f"hgx-h100,fabric={state}")
    [f] = found
    assert (f.code, f.severity, f.gpu) == ("fabric.not_ready", "critical", None)
    assert f"GPUs 0-7 (state {word})" in f.message and "systemctl status nvidia-fabricmanager" in f.message
    assert f.observed == {i: state for i in range(8)} and f.expected == "completed"
    assert audit(s).verdict == "critical"
    # the links still read Active through the NVSwitches: nothing else is found
    assert {x.code for x in audit(s).findings} == {"fabric.not_ready", "nvlink.board"}


def test_not_ready_without_nvswitch_links_is_not_judged():
    s = first_sample("hgx-h100,fabric=in_progress")
    bare = replace(s, topology=Topology("none"), gpus=tuple(replace(g, nvlink=()) for g in s.gpus))
    assert [f for f in audit(bare).findings if f.code.startswith("fabric.")] == []


def test_completed_with_an_error_status_is_critical():
    s, found = fabric_findings("hgx-h100,fabric_status=insufficient_resources:5")
    [f] = found
    assert (f.code, f.severity, f.gpu) == ("fabric.status", "critical", None)
    assert "GPU 5 completed with status Insufficient Resources (23)" in f.message
    assert f.observed == {5: "Insufficient Resources (23)"}


@pytest.mark.parametrize("bit,severity,words", [
    ("route_unhealthy", "critical", "route unhealthy"),
    ("incorrect_configuration", "critical", "incorrect configuration (insufficient NVLinks)"),
    ("degraded_bandwidth", "warning", "degraded bandwidth"),
    ("route_recovery", "warning", "route recovery in progress"),
    ("access_timeout_recovery", "warning", "access-timeout recovery"),
    ("unhealthy", "critical", "health summary Unhealthy"),
    ("limited_capacity", "warning", "health summary Limited Capacity"),
])
def test_a_health_field_is_named_with_its_severity(bit, severity, words):
    s, found = fabric_findings(f"hgx-b200,fabric_health={bit}:3")
    [f] = found
    assert (f.code, f.severity, f.gpu) == ("fabric.health", severity, 3)
    assert words in f.message and bit in f.observed


def test_hopper_reports_no_summary_but_the_mask_bit_is_judged():
    s, found = fabric_findings("hgx-h100,fabric_health=degraded_bandwidth:1")
    [f] = found
    assert s.gpus[1].fabric.health_summary in (None, 0)
    assert f.severity == "warning" and f.observed == ["degraded_bandwidth"]


def test_a_lost_gpu_or_an_unread_fabric_is_not_judged():
    s = first_sample("hgx-h100")
    gpus = list(s.gpus)
    gpus[0] = replace(gpus[0], lost=True, fabric=GpuFabric(state=2))
    gpus[1] = replace(gpus[1], fabric=GpuFabric())
    assert [f for f in audit(replace(s, gpus=tuple(gpus))).findings if f.code.startswith("fabric.")] == []


def test_nvmon_audit_exits_2_and_says_what_to_run():
    r = CliRunner().invoke(audit_command, ["--sim", "hgx-h100,fabric=in_progress", "--json"])
    assert r.exit_code == 2, r.output
    report = json.loads(r.output)
    [f] = [f for f in report["findings"] if f["code"] == "fabric.not_ready"]
    assert f["severity"] == "critical" and "nvidia-smi -q | grep -A8 Fabric" in f["message"]
    ok = CliRunner().invoke(audit_command, ["--sim", "hgx-h100", "--json"])
    assert ok.exit_code == 0 and not [f for f in json.loads(ok.output)["findings"] if f["code"].startswith("fabric")]


def test_metrics_show_the_fabric_state_its_health_fields_and_the_finding():
    from prometheus_client.parser import text_string_to_metric_families

    from nvmon.export.prometheus import PrometheusExporter

    def page(spec: str) -> dict[str, list]:
        ex = PrometheusExporter("127.0.0.1:0", health=lambda: None)
        ex.update(first_sample(spec))
        return {f.name: f.samples for f in text_string_to_metric_families(ex.page()[0].decode())}

    def values(fams, name, **labels):
        return [x.value for x in fams.get(name, []) if all(x.labels.get(k) == v for k, v in labels.items())]

    down = page("hgx-h100,fabric=in_progress")
    assert values(down, "nvmon_gpu_fabric_state") == [2] * 8
    assert values(down, "nvmon_audit_findings", code="fabric.not_ready", severity="critical") == [1]
    assert values(down, "nvmon_audit_verdict", verdict="critical") == [1]
    assert values(down, "nvmon_gpu_fabric_health") == []  # H100: the driver reports no health field
    sick = page("hgx-b200,fabric_health=route_unhealthy:3")
    assert values(sick, "nvmon_gpu_fabric_health", gpu="3", field="route_unhealthy") == [1]
    assert values(sick, "nvmon_gpu_fabric_health", gpu="3", field="access_timeout_recovery") == [0]
    assert values(sick, "nvmon_gpu_fabric_health", gpu="2", field="route_unhealthy") == []  # not reported there
    assert values(sick, "nvmon_gpu_fabric_health", gpu="2", field="unhealthy") == [0]
    assert values(sick, "nvmon_audit_findings", code="fabric.health") == [1]
    assert values(page("pcie-l40s"), "nvmon_gpu_fabric_state") == []  # no fabric: absent, never 0


def test_the_fleet_row_marks_the_links_column_from_the_findings_the_wire_carries():
    from nvmon.fleet.summary import summarize
    from nvmon.wire.parse import parse_message
    from nvmon.wire.payloads import sample_payload

    s = first_sample("hgx-h100,fabric=in_progress")
    tick = parse_message("nvmon/v1/c/n/sample", sample_payload(s, audit(s).findings))
    assert summarize(tick, None).marks == {"links": "critical"}
    ok = first_sample("hgx-h100")
    assert summarize(parse_message("nvmon/v1/c/n/sample", sample_payload(ok, audit(ok).findings)), None).marks == {}


def test_h200_single_answers_not_supported_through_the_real_pynvml_and_audits_ok():
    """A single H200 NVL PCIe card: Hopper, NVLink-capable, but no NVSwitch: the V call (and the
    unversioned one) answer Not Supported, which is "no fabric", not an error."""
    node = SimNode("h200-single")
    tried = 0
    try:
        nv = node.nvml  # the installed pynvml's wrappers over the simulator's C functions
        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(0)
        for call, struct in (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v2_t"),
                             ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")):
            if not hasattr(nv, call) or not hasattr(nv, struct):
                continue  # an older nvidia-ml-py
            tried += 1
            with pytest.raises(nv.NVMLError_NotSupported):
                getattr(nv, call)(h, nv.byref(getattr(nv, struct)()))
        nv.nvmlShutdown()
    finally:
        node.close()
    assert tried >= 1
    s = first_sample("h200-single")
    report = audit(s)
    assert [g.name for g in s.gpus] == ["NVIDIA H200 NVL"] and s.gpus[0].fabric.state is None
    assert s.gpus[0].notes == ()  # Not Supported is a capability, not a note
    assert report.verdict == "ok" and [f for f in report.findings if f.severity != "info"] == []
