"""The typed names of the model layer (nvmon/model.py) against the real bindings and the kernel's
spelling: throttle reasons and fabric states are NVML's numbers, the IB states sysfs's, and the
name tables the Sample, store and wire use are derived from the enums unchanged."""

from __future__ import annotations

import pynvml
import pytest

from nvmon.model import (FABRIC_STATES, IB_PHYS_STATES, IB_STATES, THROTTLE_BITS, FabricState, IbPhysState, IbState,
                         Throttle)

# nvmon's member -> the suffix of pynvml's nvmlClocksThrottleReason* / nvmlClocksEventReason* constant
NVML_THROTTLE = {
    Throttle.GPU_IDLE: "GpuIdle", Throttle.APPLICATIONS_CLOCKS: "ApplicationsClocksSetting",
    Throttle.SW_POWER_CAP: "SwPowerCap", Throttle.HW_SLOWDOWN: "HwSlowdown", Throttle.SYNC_BOOST: "SyncBoost",
    Throttle.SW_THERMAL: "SwThermalSlowdown", Throttle.HW_THERMAL: "HwThermalSlowdown",
    Throttle.HW_POWER_BRAKE: "HwPowerBrakeSlowdown", Throttle.DISPLAY_CLOCKS: "DisplayClockSetting",
}


def test_every_throttle_bit_is_pynvmls():
    assert set(NVML_THROTTLE) == set(Throttle)
    for member, suffix in NVML_THROTTLE.items():
        assert int(member) == getattr(pynvml, "nvmlClocksThrottleReason" + suffix), member
        newer = getattr(pynvml, "nvmlClocksEventReason" + suffix, None)  # the renamed constants (12.535+)
        assert newer is None or newer == int(member), member


def test_a_mask_reads_as_its_reported_names():
    mask = pynvml.nvmlClocksThrottleReasonSwPowerCap | pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown
    assert [m.reported for m in Throttle(mask)] == ["sw_power_cap", "hw_power_brake"]
    assert [name for bit, name in THROTTLE_BITS if mask & bit] == ["sw_power_cap", "hw_power_brake"]


def test_fabric_states_are_nvmls():
    for member in FabricState:
        value = getattr(pynvml, f"NVML_GPU_FABRIC_STATE_{member.name}", None)
        if value is None:
            pytest.skip("these bindings predate the GPU fabric state")
        assert int(member) == value


def test_the_derived_tables_are_the_names_every_layer_already_carries():
    # stored rows, wire payloads and docs hold these names: deriving them from the enums changed none
    assert THROTTLE_BITS == ((0x1, "gpu_idle"), (0x2, "applications_clocks"), (0x4, "sw_power_cap"),
                             (0x8, "hw_slowdown"), (0x10, "sync_boost"), (0x20, "sw_thermal"), (0x40, "hw_thermal"),
                             (0x80, "hw_power_brake"), (0x100, "display_clocks"))
    assert IB_STATES == {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
    assert IB_PHYS_STATES == {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
                              6: "LinkErrorRecovery", 7: "Phy Test"}
    assert FABRIC_STATES == {1: "not_started", 2: "in_progress", 3: "completed"}
    assert IbState(4) is IbState.ACTIVE and IbPhysState(5).text == "LinkUp" and IbPhysState.PHY_TEST.text == "Phy Test"
