"""A fake libnvidia-ml under the real `pynvml` wrappers.

`load_sim_pynvml(board)` executes a private copy of the installed `pynvml.py` (its own globals, so
several simulated nodes and the real bindings coexist in one process) and sets its `nvmlLib` to a
`FakeNvmlLib`. Every public wrapper then runs unchanged: it resolves the C symbol through
`_nvmlGetFunctionPointer`, builds the real ctypes structures, calls our Python function with the
same arguments the C library would get (ctypes `byref` pointers, string buffers, Python ints), and
maps our return code through `_nvmlCheckReturn` to the real `NVMLError_*` classes.

Only the C symbols nvmon needs are implemented; any other symbol raises `NVMLError_FunctionNotFound`
just as an old driver would. `tests/test_sim_surface.py` proves each one is a symbol the installed
pynvml really calls, with the argument count its wrapper passes — or, for a symbol only newer
bindings call (`nvml_fields.ADDED`: e.g. nvmlDeviceGetTemperatureV), that the installed release is
older. Works with every nvidia-ml-py that pyproject.toml accepts (.ci/run tests the oldest too): an
older pynvml's wrappers simply call the older symbols, which are implemented as well.
"""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import sys
import types

import pynvml as _real_pynvml

from nvmon.sim import fabric
from nvmon.sim.board import SimBoard
from nvmon.sim.fakefields import FV, FieldValues
from nvmon.sim.values import FB_RESERVED_MIB, fill, value
from nvmon.collect.nvml_fields import NVLINK_GEN_TO_ENUM

# Return codes (values from nvml.h; identical in every pynvml).
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_GPU_IS_LOST = 15
EVENT_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId when an event is not per instance

_CLOCKS = {0: "sm", 1: "sm", 2: "mem"}  # nvmlClockType_t: GRAPHICS, SM, MEM (VIDEO is not modelled)
# (clock, current?) → the catalog metric whose simulated value (nvmon.sim.values) the clock getters answer
_CLOCK_METRICS = {("sm", True): "sm_clock_hz", ("mem", True): "mem_clock_hz", ("sm", False): "sm_clock_max_hz",
                  ("mem", False): "mem_clock_max_hz"}
_MEMORY_V2 = 0x02000028  # nvmlMemory_v2: sizeof(c_nvmlMemory_v2_t) | 2 << 24
_HANDLE_BASE = 0x5100_0000
_EVENT_SET_BASE = 0x5200_0000
_module_ids = itertools.count()


def _val(x) -> int:
    """C-level integer arguments arrive as Python ints or ctypes scalars, like a real CDLL call."""
    return x.value if hasattr(x, "value") else int(x)


def _out(ptr):
    """The ctypes object behind a `byref()` argument."""
    return ptr._obj


class FakeNvmlLib:
    """Stands in for `CDLL("libnvidia-ml.so.1")`: attributes are C symbols returning nvmlReturn_t."""

    def __init__(self, board: SimBoard):
        self.board = board
        self.initialized = 0
        # Event sets by address: the GPUs registered for Xid events and the events delivered.
        self.event_sets: dict[int, dict[str, set]] = {}
        self._next_set = 0
        # Test hook: a return code nvmlEventSetWait_v2 answers with instead of an event (0: off).
        self.event_wait_error = 0
        self._fields = FieldValues(board)

    # -- helpers -----------------------------------------------------------------------------

    def _t(self) -> float:
        return self.board.now()

    def _gpu(self, handle) -> int | None:
        addr = ctypes.cast(handle, ctypes.c_void_p).value
        if addr is None:
            return None
        i = addr - _HANDLE_BASE
        return i if 0 <= i < len(self.board.gpus) else None

    def _check(self, handle) -> tuple[int, int | None]:
        """(return code, gpu index) for a per-device call."""
        if not self.initialized:
            return ERROR_UNINITIALIZED, None
        g = self._gpu(handle)
        if g is None:
            return ERROR_INVALID_ARGUMENT, None
        if self.board.gpu_lost(g, self._t()):
            return ERROR_GPU_IS_LOST, None
        return SUCCESS, g

    def _uint_getter(self, handle, ptr, fn, notsup: str | None = None) -> int:
        rc, g = self._check(handle)
        if rc:
            return rc
        if notsup and self.board.notsup(notsup, g, self._t()):
            return ERROR_NOT_SUPPORTED
        _out(ptr).value = fn(g)
        return SUCCESS

    @staticmethod
    def _put_str(buf, size, text: str) -> int:
        data = text.encode()
        if len(data) + 1 > _val(size):
            return 7  # NVML_ERROR_INSUFFICIENT_SIZE
        buf.value = data
        return SUCCESS

    # -- library lifecycle ----------------------------------------------------------------------

    def nvmlInitWithFlags(self, flags) -> int:
        if not self.board.scenario.nvml:
            return ERROR_DRIVER_NOT_LOADED
        self.initialized += 1
        return SUCCESS

    def nvmlShutdown(self) -> int:
        if not self.initialized:
            return ERROR_UNINITIALIZED
        self.initialized -= 1
        return SUCCESS

    def nvmlSystemGetDriverVersion(self, buf, size) -> int:
        return self._put_str(buf, size, self.board.profile.driver)

    def nvmlSystemGetNVMLVersion(self, buf, size) -> int:
        return self._put_str(buf, size, self.board.profile.nvml_version)

    def nvmlDeviceGetCount_v2(self, ptr) -> int:
        if not self.initialized:
            return ERROR_UNINITIALIZED
        _out(ptr).value = len(self.board.gpus)
        return SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index, ptr) -> int:
        if not self.initialized:
            return ERROR_UNINITIALIZED
        i = _val(index)
        if not 0 <= i < len(self.board.gpus):
            return ERROR_INVALID_ARGUMENT
        if self.board.gpu_lost(i, self._t()):
            return ERROR_GPU_IS_LOST
        ctypes.c_void_p.from_buffer(_out(ptr)).value = _HANDLE_BASE + i
        return SUCCESS

    # -- identity -------------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle, buf, size) -> int:
        rc, g = self._check(handle)
        return rc or self._put_str(buf, size, self.board.profile.gpu_name)

    def nvmlDeviceGetUUID(self, handle, buf, size) -> int:
        rc, g = self._check(handle)
        return rc or self._put_str(buf, size, self.board.gpus[g].uuid)

    def nvmlDeviceGetSerial(self, handle, buf, size) -> int:
        rc, g = self._check(handle)
        return rc or self._put_str(buf, size, self.board.gpus[g].serial)

    def nvmlDeviceGetIndex(self, handle, ptr) -> int:
        return self._uint_getter(handle, ptr, lambda g: g)

    @staticmethod
    def _fill_pci(info, bus_id: str, device_id: int) -> None:
        dom, bus, rest = bus_id.split(":")
        info.busId = bus_id.encode()
        info.busIdLegacy = f"{int(dom, 16) & 0xFFFF:04X}:{bus}:{rest}".encode()
        info.domain = int(dom, 16)
        info.bus = int(bus, 16)
        info.device = int(rest.split(".")[0], 16)
        info.pciDeviceId = device_id

    def nvmlDeviceGetPciInfo_v3(self, handle, ptr) -> int:
        rc, g = self._check(handle)
        if rc:
            return rc
        self._fill_pci(_out(ptr), self.board.gpus[g].bus_id, self.board.profile.pci_device_id)
        return SUCCESS

    # -- power and thermal ------------------------------------------------------------------------

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle, ptr) -> int:
        return self._uint_getter(handle, ptr, lambda g: self.board.profile.power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementLimit(self, handle, ptr) -> int:
        return self._uint_getter(handle, ptr, lambda g: int(self.board.power_limit_w(g, self._t()) * 1000))

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle, pmin, pmax) -> int:
        rc, g = self._check(handle)
        if rc:
            return rc
        _out(pmin).value = self.board.profile.power_min_w * 1000
        _out(pmax).value = self.board.profile.power_max_w * 1000
        return SUCCESS

    def nvmlDeviceGetEnforcedPowerLimit(self, handle, ptr) -> int:
        return self._uint_getter(handle, ptr, lambda g: int(self.board.power_limit_w(g, self._t()) * 1000))

    def nvmlDeviceGetPowerUsage(self, handle, ptr) -> int:
        return self._uint_getter(handle, ptr, lambda g: self.board.power_mw(g, self._t()))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle, ptr) -> int:
        return self._uint_getter(handle, ptr, lambda g: self.board.energy_mj(g, self._t()), "energy")

    def nvmlDeviceGetTemperatureV(self, handle, ptr) -> int:
        rc, g = self._check(handle)
        if rc:
            return rc
        st = _out(ptr)
        # Only bindings with this wrapper (12.570+) call this symbol, and they define the version.
        if st.version != getattr(_real_pynvml, "nvmlTemperature_v1", None):
            return 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        if _val(st.sensorType) != 0 or self.board.notsup("temperature", g, self._t()):
            return ERROR_NOT_SUPPORTED
        st.temperature = self.board.temperature_c(g, self._t())
        return SUCCESS

    def nvmlDeviceGetTemperature(self, handle, sensor, ptr) -> int:
        rc, g = self._check(handle)
        if rc:
            return rc
        if _val(sensor) != 0 or self.board.notsup("temperature", g, self._t()):
            return ERROR_NOT_SUPPORTED
        _out(ptr).value = self.board.temperature_c(g, self._t())
        return SUCCESS

    def nvmlDeviceGetUtilizationRates(self, handle, ptr) -> int:
        rc, g = self._check(handle)
        if rc:
            return rc
        if self.board.notsup("utilization", g, self._t()):
            return ERROR_NOT_SUPPORTED
        u = _out(ptr)
        u.gpu = self.board.utilization(g, self._t())
        fill(u, "nvmlDeviceGetUtilizationRates", self.board, g, self._t())  # `memory`: the catalog's, if read
        return SUCCESS

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle, ptr) -> int:
        return self._uint_getter(handle, ptr, lambda g: self.board.clocks_event_reasons(g, self._t()), "throttle")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle, ptr) -> int:
        # The same bits under their name before 12.535, which older bindings call.
        return self.nvmlDeviceGetCurrentClocksEventReasons(handle, ptr)

    # -- clocks and memory ----------------------------------------------------------------------------

    def _clock(self, handle, clock_type, ptr, now: bool) -> int:
        rc, g = self._check(handle)
        if rc:
            return rc
        kind = _CLOCKS.get(_val(clock_type))  # graphics and SM share one clock on these GPUs
        if kind is None or self.board.notsup("clocks", g, self._t()):
            return ERROR_NOT_SUPPORTED
        _out(ptr).value = value(_CLOCK_METRICS[kind, now], self.board, g, self._t())
        return SUCCESS

    def nvmlDeviceGetClockInfo(self, handle, clock_type, ptr) -> int:
        return self._clock(handle, clock_type, ptr, True)

    def nvmlDeviceGetMaxClockInfo(self, handle, clock_type, ptr) -> int:
        return self._clock(handle, clock_type, ptr, False)

    def nvmlDeviceGetMemoryInfo_v2(self, handle, ptr) -> int:
        rc, g = self._check(handle)
        if rc:
            return rc
        m = _out(ptr)  # c_nvmlMemory_v2_t: version, then total, reserved, free, used in bytes
        if m.version != _MEMORY_V2:
            return 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        if self.board.notsup("memory", g, self._t()):
            return ERROR_NOT_SUPPORTED
        m.reserved = FB_RESERVED_MIB * 2**20
        fill(m, "nvmlDeviceGetMemoryInfo", self.board, g, self._t())  # total, free, used
        return SUCCESS

    # -- PCIe ---------------------------------------------------------------------------------------

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle, ptr) -> int:
        return self._uint_getter(handle, ptr, lambda g: self.board.pcie_gen(g, self._t()))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle, ptr) -> int:
        return self._uint_getter(handle, ptr, lambda g: self.board.profile.pcie_gen)

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle, ptr) -> int:
        return self._uint_getter(handle, ptr, lambda g: self.board.profile.gpu_pcie_gen)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle, ptr) -> int:
        return self._uint_getter(handle, ptr, lambda g: self.board.pcie_width(g, self._t()))

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle, ptr) -> int:
        return self._uint_getter(handle, ptr, lambda g: self.board.profile.pcie_width)

    def nvmlDeviceGetPcieReplayCounter(self, handle, ptr) -> int:
        return self._uint_getter(handle, ptr, lambda g: self.board.gpus[g].replay_base)

    # -- NVLink getters -----------------------------------------------------------------------------

    def _link(self, handle, link) -> tuple[int, int | None, int | None]:
        rc, g = self._check(handle)
        if rc:
            return rc, None, None
        lk = _val(link)
        if not 0 <= lk < self.board.profile.link_slots:
            # Past the real count: INVALID_ARGUMENT, as GB200 answers (NVML-FACTS §1.2).
            return ERROR_INVALID_ARGUMENT, None, None
        return SUCCESS, g, lk

    def nvmlDeviceGetNvLinkState(self, handle, link, ptr) -> int:
        rc, g, lk = self._link(handle, link)
        if rc:
            return rc
        _out(ptr).value = int(self.board.link_active(g, lk, self._t()))
        return SUCCESS

    def nvmlDeviceGetNvLinkVersion(self, handle, link, ptr) -> int:
        rc, g, lk = self._link(handle, link)
        if rc:
            return rc
        _out(ptr).value = NVLINK_GEN_TO_ENUM[self.board.profile.nvlink_gen]
        return SUCCESS

    def _remote(self, g: int, lk: int) -> tuple[str, int | None]:
        return self.board.link_peer(g, lk)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link, ptr) -> int:
        rc, g, lk = self._link(handle, link)
        if rc:
            return rc
        if lk >= self.board.profile.links_used:
            return ERROR_NOT_SUPPORTED
        kind, _ = self._remote(g, lk)
        _out(ptr).value = 0 if kind == "gpu" else 2  # NVML_NVLINK_DEVICE_TYPE_GPU / _SWITCH
        return SUCCESS

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle, link, ptr) -> int:
        rc, g, lk = self._link(handle, link)
        if rc:
            return rc
        if lk >= self.board.profile.links_used:
            return ERROR_NOT_SUPPORTED
        kind, peer = self._remote(g, lk)
        p = self.board.profile
        if kind == "gpu":
            bus_id, dev = self.board.gpus[peer].bus_id, p.pci_device_id
        elif p.switch_sentinel:
            bus_id, dev = "FFFFFFFF:FF:FF.0", 0xFFFFFFFF
        else:
            bus_id, dev = "0000" + p.switch_bdf(peer).upper(), 0x22A310DE
        self._fill_pci(_out(ptr), bus_id, dev)
        return SUCCESS

    def nvmlDeviceGetNvLinkErrorCounter(self, handle, link, counter, ptr) -> int:
        rc, g, lk = self._link(handle, link)
        if rc:
            return rc
        key = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data"}.get(_val(counter))
        if key is None:
            return ERROR_NOT_SUPPORTED
        _out(ptr).value = self.board.link_errors(g, lk, self._t())[key]
        return SUCCESS

    # -- events ---------------------------------------------------------------------------------------
    # Only Xid critical errors are modelled. A wait never sleeps, whatever its timeout: the board's
    # clock may be simulated, and the collector only ever asks with timeout 0.

    def _event_set(self, eventSet) -> dict[str, set] | None:
        return self.event_sets.get(ctypes.cast(eventSet, ctypes.c_void_p).value or 0)

    def nvmlEventSetCreate(self, ptr) -> int:
        if not self.initialized:
            return ERROR_UNINITIALIZED
        addr = _EVENT_SET_BASE + self._next_set
        self._next_set += 1
        self.event_sets[addr] = {"gpus": set(), "delivered": set()}
        ctypes.c_void_p.from_buffer(_out(ptr)).value = addr
        return SUCCESS

    def nvmlDeviceRegisterEvents(self, handle, eventTypes, eventSet) -> int:
        rc, g = self._check(handle)
        if rc:
            return rc
        es = self._event_set(eventSet)
        if es is None:
            return ERROR_INVALID_ARGUMENT
        if self.board.notsup("xid_events", g, self._t()):
            return ERROR_NOT_SUPPORTED
        if _val(eventTypes) & EVENT_XID_CRITICAL:
            es["gpus"].add(g)
        return SUCCESS

    def nvmlEventSetWait_v2(self, eventSet, ptr, timeoutms) -> int:
        if not self.initialized:
            return ERROR_UNINITIALIZED
        es = self._event_set(eventSet)
        if es is None:
            return ERROR_INVALID_ARGUMENT
        if self.event_wait_error:
            return self.event_wait_error
        for event_id, g, xid in self.board.xid_events(self._t()):
            if g in es["gpus"] and event_id not in es["delivered"]:
                es["delivered"].add(event_id)
                data = _out(ptr)
                ctypes.c_void_p.from_buffer(data, type(data).device.offset).value = _HANDLE_BASE + g
                data.eventType = EVENT_XID_CRITICAL
                data.eventData = xid
                data.gpuInstanceId = data.computeInstanceId = NO_INSTANCE
                return SUCCESS
        return ERROR_TIMEOUT

    def nvmlEventSetFree(self, eventSet) -> int:
        if not self.initialized:
            return ERROR_UNINITIALIZED
        addr = ctypes.cast(eventSet, ctypes.c_void_p).value or 0
        return SUCCESS if self.event_sets.pop(addr, None) is not None else ERROR_INVALID_ARGUMENT

    # -- GPU fabric (nvmon.sim.fabric writes nvml.h's layout into the caller's struct) -----------------

    def nvmlDeviceGetGpuFabricInfo(self, handle, ptr) -> int:
        rc, g = self._check(handle)
        return rc or fabric.write(self.board, g, self._t(), _out(ptr), versioned=False)

    def nvmlDeviceGetGpuFabricInfoV(self, handle, ptr) -> int:
        rc, g = self._check(handle)
        return rc or fabric.write(self.board, g, self._t(), _out(ptr), versioned=True)

    # -- field values ---------------------------------------------------------------------------------

    def nvmlDeviceGetFieldValues(self, handle, count, ptr) -> int:
        rc, g = self._check(handle)
        if rc:
            return rc
        # Work on the raw array memory, as the C library does (pynvml's structure hooks cost ~1 µs
        # per attribute, which would make the simulator, not the collector, dominate benchmarks).
        buf = memoryview(_out(ptr)).cast("B")
        n = min(_val(count), len(buf) // FV.size)
        t = self._t()
        ts_us = int(self.board.clock() * 1e6)
        self._fields.fill(g, t, ts_us, buf[: n * FV.size])
        return SUCCESS


def load_sim_pynvml(board: SimBoard) -> types.ModuleType:
    """A private copy of the installed `pynvml` whose C library is the simulator."""
    name = f"nvmon._sim_pynvml_{next(_module_ids)}"
    spec = importlib.util.spec_from_file_location(name, _real_pynvml.__file__)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pynvml looks itself up in sys.modules while importing
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    module.nvmlLib = FakeNvmlLib(board)
    return module
