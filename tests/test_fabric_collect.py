"""GPU fabric info (nvmon/collect/fabric.py) read through the real pynvml wrappers and structs, the
simulator's C functions under them (nvmon/sim/fabric.py), on the installed bindings and on the
oldest nvidia-ml-py (.ci/run runs this file in .venv-floor too, where the versioned call is absent).
Healthy boards must read as the real captures in /work/shared/hardware (copied values below)."""

from __future__ import annotations

import ctypes
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from simboard import sampled

from nvmon.collect import fabric as reader
from nvmon.model import FABRIC_STATES, fabric_health
from nvmon.sim.board import SimBoard
from nvmon.sim.fakenvml import load_sim_pynvml
from nvmon.sim.scenario import SimSpecError, parse_scenario

CAPTURES = Path("/work/shared/hardware")
# What the captures' <fabric> sections say (qx-h100.xml, qx-b200.xml, driver 580.105.08), for a
# checkout without /work/shared: every GPU of each file alike.
CAPTURED = {
    "hgx-h100": {"state": "Completed", "status": "Success", "cliqueId": "0",
                 "clusterUuid": "00000000-0000-0000-0000-000000000000", "summary": "N/A",
                 "access_timeout_recovery": "N/A"},
    "hgx-b200": {"state": "Completed", "status": "Success", "cliqueId": "0",
                 "clusterUuid": "00000000-0000-0000-0000-000000000000", "summary": "Healthy",
                 "access_timeout_recovery": "False"},
}


def _captured(profile: str) -> dict[str, str]:
    path = CAPTURES / {"hgx-h100": "qx-h100.xml", "hgx-b200": "qx-b200.xml"}[profile]
    if not path.exists():
        return CAPTURED[profile]
    fab = ET.parse(path).getroot().find("gpu/fabric")
    got = {k: fab.findtext(k) for k in ("state", "status", "cliqueId", "clusterUuid")}
    got |= {k: fab.findtext(f"health/{k}") for k in ("summary", "access_timeout_recovery")}
    assert got == CAPTURED[profile]  # the copy above is the file's
    return got


# nvidia-smi's words for NVML's values (what the captures show)
_SUMMARY_WORDS = {None: "N/A", 0: "N/A", 1: "Healthy", 2: "Unhealthy", 3: "Limited Capacity"}
_FLAG_WORDS = {None: "N/A", 1: "True", 2: "False"}


@pytest.mark.parametrize("profile", ["hgx-h100", "hgx-b200"])
def test_a_healthy_board_reads_as_the_real_capture(profile):
    want = _captured(profile)
    with sampled(profile) as (node, sampler, clock):
        s = sampler.sample()
        for g in s.gpus:
            f = g.fabric
            assert FABRIC_STATES[f.state] == want["state"].lower() and f.status == 0 and not g.notes
            assert str(f.clique_id) == want["cliqueId"] and f.cluster_uuid == want["clusterUuid"]
            if sampler.nvml.api.fn["fabric_health"] is None:  # bindings < 12.550: no health to compare
                assert f.health_mask is None and f.health_summary is None
                continue
            assert _SUMMARY_WORDS[f.health_summary] == want["summary"]
            assert _FLAG_WORDS[fabric_health(f.health_mask).get("access_timeout_recovery")] \
                == want["access_timeout_recovery"]
        assert "fabric" not in s.nvml.capabilities["unsupported"]


@pytest.mark.parametrize("profile", ["hgx-a100", "pairs-a100", "pcie-l40s", "h200-single"])
def test_a_board_without_fabric_is_not_supported_once_and_quiet(profile):
    with sampled(profile) as (node, sampler, clock):
        for _ in range(12):
            s = sampler.sample()
            clock.t += 1
        n = len(s.gpus)  # 8; the H200 NVL card alone: 1
        assert all(g.fabric.state is None and not g.notes for g in s.gpus)
        assert s.nvml.capabilities["unsupported"]["fabric"] == list(range(n))
        assert sampler.nvml.fabric.calls <= n * 3  # asked once per GPU and variant, never again


def test_the_bindings_struct_is_used_where_it_is_nvml_h_and_nvmons_copy_elsewhere():
    """Each variant passes the bindings' class when its layout is nvml.h's; a wrong one (the 80-byte
    cluster UUID of c_nvmlGpuFabricInfo_t before 13.615) is replaced by nvmon's copy."""
    sim = load_sim_pynvml(SimBoard(parse_scenario("hgx-b200")))
    classes = {name: cls_names for name, _, _, _, cls_names in reader.VARIANTS}
    layouts = {name: layout for name, _, layout, _, _ in reader.VARIANTS}
    for v in reader.FabricReader(reader.Api(sim)).variants:
        theirs = next((getattr(sim, c) for c in classes[v.name] if hasattr(sim, c)), None)
        if theirs is not None and reader.same_layout(theirs, layouts[v.name]):
            assert v.cls is theirs
        else:
            assert v.cls is layouts[v.name]
    v1 = sim.c_nvmlGpuFabricInfo_t  # in every accepted release
    assert reader.same_layout(v1, reader.CFabricInfoV1) == (ctypes.sizeof(v1) == 28)  # else the 80-byte UUID
    v2 = getattr(sim, "c_nvmlGpuFabricInfo_v2_t", None)
    if v2 is not None:  # 13.580+: nvml.h's layout (the state a c_uint over its byte and padding)
        assert reader.same_layout(v2, reader.CFabricInfoV2)


def test_the_real_pynvml_structs_through_the_simulated_c_functions():
    """pynvml's own classes, filled by the fake C side, read by field name: what any pynvml user
    would see (only where the bindings' layout is nvml.h's)."""
    sim = load_sim_pynvml(SimBoard(parse_scenario("hgx-b200,fabric_health=route_unhealthy:1")))
    sim.nvmlInit()
    h0, h1 = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(1)
    v3 = getattr(sim, "c_nvmlGpuFabricInfo_v3_t", None)
    if v3 is not None and hasattr(sim, "nvmlDeviceGetGpuFabricInfoV"):
        for h, mask, summary in ((h0, 0x80, 1), (h1, 0x80 | 0x10, 2)):
            st = v3()
            sim.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(st))
            got = (st.state & 0xFF, st.status, st.cliqueId, st.healthMask, st.healthSummary)
            assert got == (3, 0, 0, mask, summary)
            assert bytes(st.clusterUuid) == bytes(16)
        bad = v3()
        bad.version = 0x05000028  # a version the driver does not know
        with pytest.raises(sim.NVMLError) as e:
            sim.nvmlDeviceGetGpuFabricInfoV(h0, ctypes.byref(bad))
        assert e.value.value == 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    # The unversioned call, into nvml.h's 28 bytes: the bindings' class where it has that layout
    st = reader.CFabricInfoV1()
    sim.nvmlDeviceGetGpuFabricInfo(h1, ctypes.byref(st))
    assert (st.state, st.status, st.cliqueId) == (3, 0, 0)
    l40s = load_sim_pynvml(SimBoard(parse_scenario("pcie-l40s")))
    l40s.nvmlInit()
    with pytest.raises(l40s.NVMLError_NotSupported):
        l40s.nvmlDeviceGetGpuFabricInfo(l40s.nvmlDeviceGetHandleByIndex(0), ctypes.byref(reader.CFabricInfoV1()))


def test_v3_on_a_driver_that_knows_it_else_v2():
    with sampled("hgx-b200") as (node, sampler, clock):  # driver 570: v3
        sampler.sample()
        assert {v.name for v in sampler.nvml.fabric._chosen.values()} == (
            {"v3"} if sampler.nvml.api.fn["fabric_health"] is not None else {"v1"})
    with sampled("hgx-h100") as (node, sampler, clock):  # driver 550: v3 is a version mismatch, v2 answers
        s = sampler.sample()
        assert {v.name for v in sampler.nvml.fabric._chosen.values()} == (
            {"v2"} if sampler.nvml.api.fn["fabric_health"] is not None else {"v1"})
        assert all(g.fabric.health_summary is None and not g.notes for g in s.gpus)


def test_bindings_without_the_versioned_call_read_the_unversioned_one():
    """As nvidia-ml-py < 12.550 (the floor) does: state, status, clique and UUID, no health; the
    missing name is listed, never an AttributeError."""
    with sampled("hgx-b200,fabric=in_progress", "nvmlDeviceGetGpuFabricInfoV") as (node, sampler, clock):
        s = sampler.sample()
        assert all((g.fabric.state, g.fabric.health_mask, g.fabric.health_summary) == (2, None, None) for g in s.gpus)
        assert all(g.fabric.cluster_uuid == "00000000-0000-0000-0000-000000000000" for g in s.gpus)
        caps = s.nvml.capabilities
        assert caps["bindings"]["absent"]["nvmlDeviceGetGpuFabricInfoV"] == "fabric_health"
        assert caps["unsupported"]["fabric_health"] == list(range(8)) and "fabric" not in caps["unsupported"]


def test_read_at_start_then_every_few_ticks_and_a_fault_that_ends():
    with sampled("hgx-h100,fabric=in_progress@0-7,fabric_status=insufficient_resources:4@20") as (node, sampler, clock):
        states, calls = [], []
        for _ in range(30):
            s = sampler.sample()
            states.append((s.gpus[0].fabric.state, s.gpus[4].fabric.status))
            calls.append(sampler.nvml.fabric.calls)
            clock.t += 1
        assert states[0] == (2, 0)  # at start-up: the first tick already has it
        ready = next(i for i, st in enumerate(states) if st[0] == 3)
        assert 7 <= ready < 7 + reader.PERIOD_TICKS
        failed = next(i for i, st in enumerate(states) if st[1] == 23)
        assert 20 <= failed < 20 + reader.PERIOD_TICKS
        assert all(st[0] == 3 for st in states[ready:])
        # one call per GPU per PERIOD_TICKS (plus the first tick's v3 → v2 fallback), apart from the budget
        fallback = 8 if sampler.nvml.api.fn["fabric_health"] is not None else 0  # v3 refused by driver 550
        assert calls[-1] == fallback + 8 * (30 // reader.PERIOD_TICKS)


@pytest.mark.parametrize("spec,error", [
    ("pcie-l40s,fabric=in_progress", "no GPU fabric"),
    ("hgx-a100,fabric_status=23", "no GPU fabric"),
    ("hgx-h100,fabric=broken", "fabric takes one of"),
    ("hgx-h100,fabric_status=0", "non-zero NVML return code"),
    ("hgx-h100,fabric_health=sparkles", "fabric_health takes one of"),
])
def test_fabric_faults_are_checked(spec, error):
    with pytest.raises(SimSpecError, match=error):
        parse_scenario(spec)
