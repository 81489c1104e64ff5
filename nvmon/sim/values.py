"""What the simulated GPU answers for each catalog metric the collector reads from NVML
(`Metric.nvml`): one table, `VALUES`, by metric name, each value in NVML's own units (MHz, bytes,
°C, %) at board time `t`. The per-model constants behind them are the board profile's
(nvmon.sim.profiles).

The fake library answers from it with no code per metric: a field id (`Nvml.field`) is answered by
`nvmlDeviceGetFieldValues` (fakefields), a structure member a getter returns (`Nvml.attr`) is
filled by `fill` from the getter's fake symbol, and a scalar getter's symbol looks its metric up by
name (fakenvml: the clocks). So a metric whose symbol the fake already implements needs only its
entry here; a new C symbol also needs its function in fakenvml (arguments, checks, return code).
tests/test_catalog.py checks that every catalog NVML metric has an entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nvmon.catalog import GPU_NVML
from nvmon.sim.board import SimBoard

FB_RESERVED_MIB = 531  # what the driver keeps for itself ("Reserved" in nvidia-smi -q)


@dataclass(frozen=True, slots=True)
class SimValue:
    at: Callable[[SimBoard, int, float], int]  # (board, gpu, t) → the value in NVML's units
    # For a field id: the scenario's `notsup=` name that makes it answer NOT_SUPPORTED, and its
    # nvmlValueType_t (1 unsigned int, 3 unsigned long long).
    notsup: str | None = None
    value_type: int = 1


def memory_temperature_c(b: SimBoard, gpu: int, t: float) -> int:
    """HBM runs a few degrees above the GPU core and, with more mass, without its second-to-second
    flicker (NVML_FI_DEV_MEMORY_TEMP)."""
    return b.temperature_c(gpu, t) - int(t) % 2 + 4 if not b.hot(gpu, t) else 95


def clock_mhz(b: SimBoard, gpu: int, clock: str, t: float) -> int:
    """Current "sm" or "mem" clock: the SM clock boosts under load and drops while power-capped
    or hot; HBM runs at its one clock."""
    p = b.profile
    if clock == "mem":
        return p.mem_clock_max_mhz
    if b.scenario.load == "idle":
        return 345
    if b.demand_over_cap(gpu, t) or b.hot(gpu, t):
        return p.sm_clock_max_mhz * 7 // 10 // 15 * 15
    return p.sm_clock_max_mhz - 15 * ((int(t) + gpu) % 3)


def fb_used_mib(b: SimBoard, gpu: int, t: float) -> int:
    """Framebuffer in use (beside the driver's reservation): a resident model under load."""
    total = b.profile.fb_total_mib
    return 4 if b.scenario.load == "idle" else total * 87 // 100 + 64 * gpu


MIB = 2**20

VALUES: dict[str, SimValue] = {
    "sm_clock_hz": SimValue(lambda b, g, t: clock_mhz(b, g, "sm", t)),
    "sm_clock_max_hz": SimValue(lambda b, g, t: b.profile.sm_clock_max_mhz),
    "mem_clock_hz": SimValue(lambda b, g, t: clock_mhz(b, g, "mem", t)),
    "mem_clock_max_hz": SimValue(lambda b, g, t: b.profile.mem_clock_max_mhz),
    "fb_used_bytes": SimValue(lambda b, g, t: fb_used_mib(b, g, t) * MIB),
    "fb_free_bytes": SimValue(lambda b, g, t: (b.profile.fb_total_mib - FB_RESERVED_MIB - fb_used_mib(b, g, t)) * MIB),
    "fb_total_bytes": SimValue(lambda b, g, t: b.profile.fb_total_mib * MIB),
    "memory_temperature_c": SimValue(memory_temperature_c, notsup="memory_temperature"),
    # half the GPU's utilization: the memory controller is busy in all-reduce bursts, less in compute
    "mem_copy_util_pct": SimValue(lambda b, g, t: b.utilization(g, t) // 2),
}

# getter name → (structure member, metric name) of the catalog metrics read from its result
MEMBERS: dict[str, tuple[tuple[str, str], ...]] = {}
for _m in GPU_NVML:
    if _m.nvml.attr:
        for _fn in _m.nvml.fn:
            MEMBERS[_fn] = MEMBERS.get(_fn, ()) + ((_m.nvml.attr, _m.name),)


def value(name: str, b: SimBoard, gpu: int, t: float) -> int:
    return VALUES[name].at(b, gpu, t)


def fill(struct, fn: str, b: SimBoard, gpu: int, t: float) -> None:
    """Set the members of `struct`, the result of pynvml's `fn`, that catalog metrics read."""
    for attr, name in MEMBERS.get(fn, ()):
        setattr(struct, attr, VALUES[name].at(b, gpu, t))
