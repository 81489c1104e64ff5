"""nvidia-ml-py compatibility through the NVML chokepoint (nvmon/collect/nvml_api.py): a name an
older pynvml lacks makes that metric "unsupported", never an AttributeError; an older fallback name
keeps the metric; a lost GPU is still lost, not unsupported; every outcome of a call is typed.

The bindings here are the simulator's private pynvml copy with names removed, as an older release
lacks them (on an old install .ci/run uses, some are gone already: removing is then a no-op)."""

from __future__ import annotations

import logging

import pytest
from simboard import Clock, sampled

from nvmon.collect import nvml_api
from nvmon.collect.nvml_api import ABSENT, Api, Failed, Lost, NoValue, Unsupported
from nvmon.sim.node import SimNode

PCIE_TX, PCIE_RX = "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES"
TEMP_V, TEMP = "nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"


def ticks(sampler, clock, n: int):
    for _ in range(n):
        s = sampler.sample()
        clock.t += 1
    return s


def _requested_ids(gpu) -> set[int]:
    return {item if isinstance(item, int) else item[0] for item in gpu.batch.request}


def test_a_field_id_the_bindings_lack_is_unsupported_and_never_requested():
    with sampled("hgx-h100", PCIE_TX) as (node, sampler, clock):
        s = ticks(sampler, clock, 3)
        assert len(s.gpus) == 8 and not any(g.lost for g in s.gpus)
        assert all(g.pcie.tx_bytes_per_s is None for g in s.gpus)
        rx_known = PCIE_RX in vars(node.nvml)  # on an old install the RX id is missing too
        assert all((g.pcie.rx_bytes_per_s is not None) == rx_known for g in s.gpus)
        # the rest of the batch is untouched: NVLink rates, energy-based power, no error notes
        assert all(g.power_w is not None and g.nvlink[0].tx_bytes_per_s is not None and not g.notes for g in s.gpus)
        caps = s.nvml.capabilities
        assert caps["unsupported"]["pcie_tx"] == list(range(8))
        assert caps["bindings"]["absent"][PCIE_TX] == "pcie_tx"
        assert caps["bindings"]["nvidia_ml_py"] == nvml_api.bindings_version()
        tx_id = 197  # nvml.h: NVML_FI_DEV_PCIE_COUNT_TX_BYTES
        assert all(tx_id not in _requested_ids(g) for g in sampler.nvml.gpus)
        assert all(165 in _requested_ids(g) for g in sampler.nvml.gpus)  # ...but NVLink state (165) still is


def test_a_newer_getter_the_bindings_lack_falls_back_to_the_older_name():
    with sampled("hgx-h100,thermal=3", TEMP_V, "nvmlDeviceGetCurrentClocksEventReasons") as (node, sampler, clock):
        api = sampler.nvml.api
        assert api.fn["temperature"] is node.nvml.nvmlDeviceGetTemperature
        assert api.fn["throttle"] is node.nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        t_open = node.board.now()  # the probe at open read every rotated value
        s = ticks(sampler, clock, 2)
        assert [g.temperature_c for g in s.gpus] == [node.board.temperature_c(i, t_open) for i in range(8)]
        assert s.gpus[3].temperature_c == 92 and "sw_thermal" in s.gpus[3].throttle_reasons
        assert s.gpus[0].throttle_reasons == ()
        unsupported = s.nvml.capabilities["unsupported"]
        assert "temperature" not in unsupported and "throttle" not in unsupported
        assert TEMP_V not in api.absent and "nvmlDeviceGetCurrentClocksEventReasons" not in api.absent


def test_a_function_the_bindings_lack_with_no_fallback_is_unsupported_not_an_error():
    with sampled("hgx-h100", TEMP_V, TEMP) as (node, sampler, clock):
        before = sampler.nvml.calls[0]
        s = ticks(sampler, clock, 25)  # past a whole slow rotation, where temperature would be read
        assert all(g.temperature_c is None and not g.notes for g in s.gpus)
        assert s.nvml.capabilities["unsupported"]["temperature"] == list(range(8))
        assert s.nvml.capabilities["bindings"]["absent"][TEMP_V] == "temperature"
        assert all(g.power_w is not None and g.utilization_pct is not None for g in s.gpus)
        # an absent function costs no NVML call: at most the 3 per GPU per tick of the budget
        assert sampler.nvml.calls[0] - before <= 3 * 8 * 25


def test_event_functions_the_bindings_lack_mean_no_xid_events_not_a_crash():
    with sampled("hgx-h100,xid=2:79@1", "nvmlEventSetCreate") as (node, sampler, clock):
        s = ticks(sampler, clock, 3)
        ev = sampler.nvml.events
        assert ev.set is None and "nvmlEventSetCreate" in ev.error
        assert s.nvml.capabilities["unsupported"]["xid_events"] == list(range(8))
        assert all(not g.xid_events and not g.lost for g in s.gpus)


@pytest.mark.parametrize("spec", ["hgx-h100,gpu_lost=2@2", "hgx-h100,gpu_lost=2"])
def test_a_lost_gpu_is_still_lost_not_unsupported_with_names_missing(spec):
    with sampled(spec, TEMP_V, PCIE_TX) as (node, sampler, clock):
        s = ticks(sampler, clock, 4)
        assert s.gpus[2].lost and s.gpus[2].power_w is None
        assert any("GPU is lost" in n for n in s.gpus[2].notes)
        assert [g.index for g in s.gpus if g.lost] == [2]
        unsupported = s.nvml.capabilities["unsupported"]
        absent = set(sampler.nvml.api.absent.values())
        # GPU 2 is reported unsupported only for what the bindings lack, like every other GPU
        assert {what for what, gpus in unsupported.items() if 2 in gpus} <= absent
        assert all(g.temperature_c is not None for g in s.gpus if not g.lost)  # fallback still used


def test_the_chokepoint_types_every_outcome():
    node = SimNode("hgx-h100,gpu_lost=2,notsup=temperature:1", clock=Clock())
    try:
        nv = node.nvml
        api = Api(nv)
        assert api.call(api.fn["init"]) is None  # a value (nvmlInit returns None)
        assert api.call(api.fn["count"]) == 8
        h1 = api.call(api.fn["handle"], 1)
        assert not isinstance(h1, NoValue)
        temp = api.call(api.fn["temperature"], h1, nv.NVML_TEMPERATURE_GPU)
        assert isinstance(temp, Unsupported) and temp.code == nv.NVML_ERROR_NOT_SUPPORTED
        assert isinstance(api.call(nv.nvmlDeviceGetBoardId, h1), Unsupported)  # FunctionNotFound (not modelled)
        lost = api.call(api.fn["handle"], 2)
        assert isinstance(lost, Lost) and not isinstance(lost, Unsupported) and str(lost) == "GPU is lost"
        bad = api.call(api.fn["handle"], 99)
        assert isinstance(bad, Failed) and bad.code == nv.NVML_ERROR_INVALID_ARGUMENT
        assert api.call(None) is ABSENT and isinstance(ABSENT, Unsupported) and ABSENT.code is None
        with pytest.raises(TypeError):  # a bug is not an NVML outcome: never swallowed
            api.call(api.fn["handle"])
        api.call(api.fn["shutdown"])
    finally:
        node.close()


def test_an_absent_name_is_logged_once_per_process(caplog, monkeypatch):
    monkeypatch.setattr(nvml_api, "_logged", set())
    caplog.set_level(logging.INFO, logger="nvmon.collect")
    for _ in range(2):  # two simulated nodes: two pynvml copies, two Apis
        with sampled("hgx-h100", TEMP_V, PCIE_TX) as (node, sampler, clock):
            ticks(sampler, clock, 2)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum(PCIE_TX in m for m in warned) == 1
    assert not any(TEMP_V in m for m in warned)  # it has a fallback: no loss, only an INFO line
    assert sum(TEMP_V in r.getMessage() for r in caplog.records if r.levelno == logging.INFO) == 1


@pytest.mark.parametrize("name, call, metrics", [
    ("nvmlMemory_v2", "memory", ("fb_used_bytes", "fb_free_bytes", "fb_total_bytes")),  # a getter's argument
    ("NVML_FI_DEV_MEMORY_TEMP", "memory_temp", ("memory_temperature_c",)),  # a field id
    ("nvmlDeviceGetMaxClockInfo", "sm_clock_max", ("sm_clock_max_hz", "mem_clock_max_hz")),  # a static getter
])
def test_a_catalog_metrics_name_the_bindings_lack_makes_it_unsupported(name, call, metrics):
    """The catalog's NVML sources (Metric.nvml) go through the chokepoint like the collector's own."""
    with sampled("hgx-h100", name) as (node, sampler, clock):
        s = ticks(sampler, clock, 6)  # past a whole catalog rotation
        assert all(g.values[m] is None for g in s.gpus for m in metrics)
        assert s.nvml.capabilities["unsupported"][call] == list(range(8))
        assert name in s.nvml.capabilities["bindings"]["absent"]
        assert all(g.values["sm_clock_hz"] is not None and not g.notes for g in s.gpus)  # the rest is read
        if name.startswith("NVML_FI_"):
            assert all(82 not in _requested_ids(g) for g in sampler.nvml.gpus)  # never requested
