"""Audit rules: a healthy board is clean, each fault lands on its own GPU/link/port with its code."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from nvmon.audit import EXIT_CODES, RULES, AuditReport, Finding, Thresholds, audit, report_to_dict
from nvmon.model import Topology
from nvmon.specs import NodeSpec
from samplefactory import (
    H100_PCIE,
    H800,
    healthy_sample,
    pairs_matrix,
    with_gpu,
    with_ib,
    with_link,
    with_pcie,
)

EXPECT = NodeSpec(gpus=8, ib_ports=8, ib_rate_gbps=400.0)


def problems(report: AuditReport) -> list[Finding]:
    return [f for f in report.findings if f.severity != "info"]


def only(report: AuditReport, code: str) -> list[Finding]:
    """The findings with `code`, asserting nothing else above info was raised."""
    bad = problems(report)
    assert {f.code for f in bad} == {code}, [f.message for f in bad]
    return [f for f in bad if f.code == code]


@pytest.mark.parametrize("busy", [True, False])
def test_healthy_h100_board_is_ok(busy):
    report = audit(healthy_sample(busy=busy), EXPECT)
    assert problems(report) == []
    assert report.verdict == "ok"
    assert report.exit_code == 0
    board = [f for f in report.findings if f.code == "nvlink.board"]
    assert len(board) == 1 and "NVSwitch, NV18 between every GPU pair" in board[0].message


def test_bridged_h100_pcie_12_of_18_is_healthy_when_that_is_the_board_expected():
    s = healthy_sample(name=H100_PCIE, slots=18, active_links=12, board="pairs")
    report = audit(s, NodeSpec(gpus=8, topology="pairs"))
    assert problems(report) == [] and report.verdict == "ok"
    board = [f for f in report.findings if f.code == "nvlink.board"][0]
    assert "pairs 0-1, 2-3, 4-5, 6-7" in board.message


def test_an_8_gpu_pairs_box_is_a_warning_unless_expected():
    """The seed's 'fake 8-card NVLink': bridged pairs are within the cards' spec, so without an
    expectation it is a warning (exit 1); --expect-topology nvswitch makes it critical."""
    s = healthy_sample(name=H100_PCIE, slots=18, active_links=12, board="pairs")
    [f] = only(audit(s, NodeSpec(gpus=8)), "nvlink.topology")
    assert f.severity == "warning" and "tensor-parallel traffic between pairs goes over PCIe" in f.message
    assert "--expect-topology pairs" in f.message and audit(s, NodeSpec(gpus=8)).verdict == "warning"
    [f] = only(audit(s, NodeSpec(gpus=8, topology="nvswitch")), "nvlink.topology")
    assert f.severity == "critical"
    two = healthy_sample(name=H100_PCIE, n_gpus=2, slots=18, active_links=12, board="pairs")
    assert problems(audit(two)) == []  # two bridged cards: all there is to connect


def test_bridged_h100_pcie_shortfall_is_one_finding_per_gpu():
    s = healthy_sample(name=H100_PCIE, slots=18, active_links=12, board="pairs")
    s = with_link(with_link(s, 5, 3, active=False), 5, 7, active=False)
    [f] = only(audit(s, NodeSpec(topology="pairs")), "nvlink.link_down")
    assert (f.gpu, f.link, f.severity, f.observed) == (5, None, "critical", "10/12 active")


def test_h800_with_8_links_is_healthy():
    report = audit(healthy_sample(name=H800), EXPECT)
    assert problems(report) == [] and report.verdict == "ok"


def test_link_down_on_its_gpu_and_link():
    report = audit(with_link(healthy_sample(), 3, 11, active=False), EXPECT)
    [f] = only(report, "nvlink.link_down")
    assert (f.gpu, f.link, f.severity) == (3, 11, "critical")
    assert report.verdict == "critical" and report.exit_code == 2


def test_unreadable_link_is_not_down():
    assert problems(audit(with_link(healthy_sample(), 2, 4, active=None), EXPECT)) == []


def test_fake_nvlink_pairs_box_is_topology_critical():
    s = healthy_sample()
    s = replace(s, topology=Topology("pairs", pairs_matrix(8, 18)))
    [f] = only(audit(s, EXPECT), "nvlink.topology")
    assert (f.observed, f.expected, f.severity, f.gpu) == ("pairs", "nvswitch", "critical", None)
    assert "pairs 0-1, 2-3, 4-5, 6-7" in f.message


def test_node_spec_topology_overrides_gpu_board():
    s = healthy_sample()
    [f] = only(audit(s, NodeSpec(topology="pairs")), "nvlink.topology")
    assert (f.observed, f.expected) == ("nvswitch", "pairs")


def test_single_gpu_has_no_topology_findings():
    report = audit(healthy_sample(n_gpus=1, ib_ports=1))
    assert not [f for f in report.findings if f.code.startswith("nvlink.")]


@pytest.mark.parametrize("changes", [{"version": 3}, {"speed_mbps": 20000}])
def test_slow_nvlink(changes):
    [f] = only(audit(with_link(healthy_sample(), 6, 2, **changes), EXPECT), "nvlink.speed")
    assert (f.gpu, f.link, f.severity) == (6, 2, "warning")
    assert f.expected == {"version": 4, "speed_mbps": 26562}


def test_nvlink_errors_judge_the_rise_not_the_count():
    s = with_link(healthy_sample(), 1, 9, errors={"crc_flit": 10**9, "crc_data": 5, "replay": 0, "recovery": 0})
    assert problems(audit(s, EXPECT)) == []
    deltas = {"crc_flit": 7, "crc_data": 0, "replay": None, "recovery": 0}
    [f] = only(audit(with_link(s, 1, 9, errors_delta=deltas), EXPECT), "nvlink.errors")
    assert (f.gpu, f.link, f.observed) == (1, 9, deltas)


def test_pcie_width_downtrained():
    [f] = only(audit(with_pcie(healthy_sample(), 3, width=8), EXPECT), "pcie.width")
    assert (f.gpu, f.observed, f.expected) == (3, "x8", "x16")
    assert f.message.startswith("GPU 3 PCIe x8, expected x16: reseat the card or riser")


def test_pcie_slot_wired_x8():
    [f] = only(audit(with_pcie(healthy_sample(), 4, width=8, max_width=8), EXPECT), "pcie.width")
    assert (f.gpu, f.observed, f.expected) == (4, "x8", "x16")


def test_idle_gpu_at_gen1_is_fine():
    s = healthy_sample(busy=False)
    assert s.gpus[0].pcie.gen == 1
    assert problems(audit(s, EXPECT)) == []


def test_busy_gpu_at_gen3_of_5_is_flagged():
    [f] = only(audit(with_pcie(healthy_sample(), 2, gen=3), EXPECT), "pcie.gen")
    assert (f.gpu, f.observed, f.expected, f.severity) == (2, "Gen3", "Gen5", "warning")


def test_pcie_traffic_alone_counts_as_load():
    s = healthy_sample(busy=False)
    s = with_pcie(s, 0, gen=2, tx_bytes_per_s=2e9)
    [f] = only(audit(s, EXPECT), "pcie.gen")
    assert f.gpu == 0


def test_host_limited_gen_is_flagged_even_idle():
    s = with_pcie(healthy_sample(busy=False), 7, max_gen=4)
    [f] = only(audit(s, EXPECT), "pcie.gen")
    assert (f.gpu, f.observed, f.expected) == (7, "Gen4", "Gen5")


def test_pcie_replays_rising():
    [f] = only(audit(with_pcie(healthy_sample(), 5, replay_errors=900, replay_errors_delta=3), EXPECT), "pcie.replay")
    assert (f.gpu, f.observed) == (5, 3)


def test_power_limit_lowered():
    [f] = only(audit(with_gpu(healthy_sample(), 4, power_limit_w=300.0, power_w=200.0), EXPECT), "power.limit")
    assert f.gpu == 4 and f.message.startswith("GPU 4 power limit 300 W, spec 700 W")


def test_power_limit_unknown_model_uses_default_limit():
    s = healthy_sample(name="Acme X1", n_gpus=2, ib_ports=0)
    s = with_gpu(s, 1, power_limit_w=100.0, power_w=50.0)
    f = [f for f in problems(audit(s)) if f.code == "power.limit"]
    assert len(f) == 1 and f[0].gpu == 1 and f[0].expected == 300.0


def test_power_cap_throttle_while_busy():
    [f] = only(audit(with_gpu(healthy_sample(), 0, throttle_reasons=("sw_power_cap",)), EXPECT), "power.cap")
    assert f.gpu == 0


def test_power_cap_throttle_while_idle_is_not_flagged():
    s = with_gpu(healthy_sample(busy=False), 0, throttle_reasons=("gpu_idle", "sw_power_cap"))
    assert problems(audit(s, EXPECT)) == []


def test_power_at_limit():
    [f] = only(audit(with_gpu(healthy_sample(), 6, power_w=695.0), EXPECT), "power.cap")
    assert f.gpu == 6


# HW slowdown alone (no cause named) is power.brake's (tests/test_power_rules.py); with HW thermal, thermal's.
@pytest.mark.parametrize("changes", [{"temperature_c": 90.0}, {"throttle_reasons": ("hw_slowdown", "hw_thermal")}])
def test_thermal(changes):
    [f] = only(audit(with_gpu(healthy_sample(), 2, **changes), EXPECT), "thermal")
    assert (f.gpu, f.severity) == (2, "warning")


def test_thermal_threshold_is_tunable():
    s = with_gpu(healthy_sample(), 2, temperature_c=80.0)
    assert problems(audit(s, EXPECT)) == []
    assert only(audit(s, EXPECT, Thresholds(temperature_c=75.0)), "thermal")


def test_gpu_lost_and_count():
    s = with_gpu(healthy_sample(), 3, lost=True)
    [f] = only(audit(s, EXPECT), "gpu.lost")
    assert f.gpu == 3 and f.severity == "critical"
    s = replace(healthy_sample(), gpus=healthy_sample().gpus[:7])
    [f] = only(audit(s, EXPECT), "gpu.count")
    assert (f.observed, f.expected) == (7, 8)


def test_ib_port_down_on_its_port():
    report = audit(with_ib(healthy_sample(), 5, state="DOWN", phys_state="Polling"), EXPECT)
    codes = {f.code for f in problems(report)}
    assert codes == {"ib.port_down", "ib.count"}
    [f] = [f for f in problems(report) if f.code == "ib.port_down"]
    assert (f.device, f.port, f.gpu, f.severity) == ("mlx5_5", 1, None, "critical")
    assert report.verdict == "critical"


def test_ib_rate_against_expectation_and_peers():
    s = with_ib(healthy_sample(), 2, rate_gbps=100.0, rate_name="EDR")
    [f] = only(audit(s, EXPECT), "ib.rate")
    assert (f.device, f.port) == ("mlx5_2", 1) and "100 Gb/s (EDR)" in f.message
    [f] = only(audit(s), "ib.rate")  # no expectation: slower than the fastest peer
    assert f.device == "mlx5_2" and f.expected["rate_gbps"] == 400.0


def test_all_ports_at_200_when_400_expected():
    report = audit(healthy_sample(ib_rate=200.0), EXPECT)
    assert len(only(report, "ib.rate")) == 8
    assert problems(audit(healthy_sample(ib_rate=200.0))) == []  # consistent, no expectation


def test_ethernet_port_when_infiniband_expected():
    s = with_ib(healthy_sample(), 0, link_layer="Ethernet")
    [f] = only(audit(s, EXPECT), "ib.rate")
    assert f.device == "mlx5_0" and "Ethernet (RoCE), expected InfiniBand" in f.message
    assert problems(audit(s)) == []


def test_ethernet_port_down_is_still_judged():
    s = with_ib(healthy_sample(), 7, link_layer="Ethernet", state="DOWN", phys_state="Disabled")
    assert [f.device for f in problems(audit(s)) if f.code == "ib.port_down"] == ["mlx5_7"]


def test_ib_errors_rising():
    deltas = {"symbol_error": 0, "link_downed": 1, "port_rcv_errors": 0, "link_error_recovery": 0,
              "port_xmit_discards": None}
    [f] = only(audit(with_ib(healthy_sample(), 4, errors_delta=deltas), EXPECT), "ib.errors")
    assert (f.device, f.port, f.observed) == ("mlx5_4", 1, deltas)


def test_ib_count_missing_ports():
    [f] = only(audit(healthy_sample(ib_ports=6), EXPECT), "ib.count")
    assert f.observed == {"present": 6, "active": 6} and f.expected == 8


def test_unknown_model_is_verdict_unknown_but_generic_rules_apply():
    s = healthy_sample(name="Acme X1", n_gpus=2, ib_ports=0)
    report = audit(s)
    models = [f for f in report.findings if f.code == "gpu.model"]
    assert len(models) == 1 and models[0].severity == "info" and "Acme X1" in models[0].message
    assert problems(report) == [] and report.verdict == "unknown" and report.exit_code == 3
    assert report_to_dict(report)["spec"]["models"] == {"Acme X1": "unknown"}
    report = audit(with_pcie(s, 1, width=4))
    assert [(f.code, f.gpu) for f in problems(report)] == [("pcie.width", 1)]
    assert report.verdict == "warning"


def test_nvml_unavailable():
    report = audit(healthy_sample(nvml_available=False), EXPECT)
    [f] = only(report, "nvml.unavailable")
    assert f.severity == "warning" and "NVML Shared Library Not Found" in f.message
    assert report.verdict == "unknown"
    # IB is still judged, and a critical there wins.
    s = with_ib(healthy_sample(nvml_available=False), 1, state="DOWN", phys_state="Polling")
    report = audit(s, EXPECT)
    assert "ib.port_down" in {f.code for f in report.findings} and report.verdict == "critical"


def test_exit_codes_and_warning_verdict():
    assert EXIT_CODES == {"ok": 0, "warning": 1, "critical": 2, "unknown": 3}
    report = audit(with_pcie(healthy_sample(), 3, width=8), EXPECT)
    assert report.verdict == "warning" and report.exit_code == 1


def test_json_contract():
    s = with_link(with_pcie(healthy_sample(), 3, width=8), 1, 2, active=False)
    d = json.loads(json.dumps(report_to_dict(audit(s, EXPECT))))
    assert list(d) == ["schema", "node", "spec", "verdict", "findings"]
    assert d["schema"] == 1 and d["node"] == "gpu-node-01" and d["verdict"] == "critical"
    assert d["spec"]["models"]["NVIDIA H100 80GB HBM3"]["nvlink_links"] == 18
    assert d["spec"]["node"] == {"gpus": 8, "ib_ports": 8, "ib_rate_gbps": 400.0, "topology": None}
    for f in d["findings"]:
        assert list(f) == ["code", "severity", "gpu", "link", "device", "port", "observed", "expected", "message"]
        assert f["code"] in RULES and f["severity"] == RULES[f["code"]]
    down = [f for f in d["findings"] if f["code"] == "nvlink.link_down"]
    assert [(f["gpu"], f["link"], f["device"], f["port"]) for f in down] == [(1, 2, None, None)]


def test_findings_are_unique_per_code_and_place():
    s = healthy_sample(ib_rate=200.0)
    s = with_ib(s, 0, link_layer="Ethernet", rate_gbps=100.0)
    s = with_pcie(s, 2, gen=3, max_gen=4, width=8, max_width=8)
    report = audit(s, EXPECT)
    keys = [(f.code, f.gpu, f.link, f.device, f.port) for f in report.findings]
    assert len(keys) == len(set(keys))


def test_four_gpu_direct_mesh_satisfies_nvswitch_but_eight_do_not():
    mesh = replace(healthy_sample(n_gpus=4, ib_ports=4).topology, class_="mesh")
    assert problems(audit(replace(healthy_sample(n_gpus=4, ib_ports=4), topology=mesh))) == []
    mesh8 = replace(healthy_sample().topology, class_="mesh")
    [f] = only(audit(replace(healthy_sample(), topology=mesh8)), "nvlink.topology")
    assert (f.observed, f.expected) == ("mesh", "nvswitch")


def test_unknown_topology_class_is_not_judged():
    s = replace(healthy_sample(), topology=Topology("unknown"))
    report = audit(s, EXPECT)
    assert problems(report) == [] and report.verdict == "ok"


def test_unreadable_nvlink_is_not_a_shortfall():
    s = with_gpu(healthy_sample(), 0, nvlink=(), nvlink_count=None)
    assert problems(audit(s, EXPECT)) == []


def test_fewer_link_slots_than_spec_is_a_shortfall():
    gpu = healthy_sample().gpus[2]
    s = with_gpu(healthy_sample(), 2, nvlink=gpu.nvlink[:16], nvlink_count=16)
    [f] = only(audit(s, EXPECT), "nvlink.link_down")
    assert (f.gpu, f.link, f.observed) == (2, None, "16/18 active")


def test_spec_profile_records_thresholds_and_expected_topology():
    d = report_to_dict(audit(healthy_sample(), EXPECT, Thresholds(temperature_c=80.0)))
    assert d["spec"]["thresholds"]["temperature_c"] == 80.0
    assert d["spec"]["expected_topology"] == "nvswitch"
