"""Xid critical-error events from NVML: one event set per node, drained without blocking each tick.

NVML calls (pynvml 13, checked against the installed `pynvml.py`; NVML-FACTS §4):

* `nvmlEventSetCreate()` → `c_nvmlEventSet_t`, once at open.
* `nvmlDeviceRegisterEvents(handle, nvmlEventTypeXidCriticalError, set)` → None, once per GPU handle.
  NOT_SUPPORTED on a GPU is recorded as that GPU's missing capability ("xid_events"); per nvml.h the
  set stays usable, with none of the requested types registered for that GPU.
* `nvmlEventSetWait_v2(set, 0)` → `c_nvmlEventData_t(device, eventType, eventData, gpuInstanceId,
  computeInstanceId)`; raises `NVMLError_Timeout` when no event is ready. With a 0 ms timeout it never
  sleeps, so the sampler drains the queue each tick: one call when nothing happened, one more per
  event, at most `MAX_EVENTS_PER_TICK` events a tick (the rest wait for the next tick). For an Xid
  event `eventData` is the Xid number (999: unknown Xid).
* `nvmlEventSetFree(set)` at close.

Cost: the wait is per node, not per GPU — 1 NVML call per tick (+1 per event). It is counted in
`calls` here, apart from the per-GPU calls of `NvmlCollector.calls`, so the "3 calls per GPU per
tick" budget stays a per-GPU figure.

The event's `device` is a device handle; it is mapped back to the GPU index by the handle's address
(NVML hands out the same handle for a device [inference: NVML handles are pointers into the
library's device table]) and, for an address not seen at open, by `nvmlDeviceGetIndex(device)`.
An error from the wait other than TIMEOUT is counted (`errors`) and ends that tick's drain; it never
raises into the sampler. Every call goes through the chokepoint (`nvml_api.Api`), so a function the
installed bindings lack is "unsupported", like one the driver lacks.
"""

from __future__ import annotations

import ctypes
from typing import Any

from nvmon.collect.nvml_api import Api, NoValue

MAX_EVENTS_PER_TICK = 64
CAPABILITY = "xid_events"  # the name under which an unsupported registration is reported


def _address(handle) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


class XidEvents:
    """The node's event set. `open(gpus)` after the GPUs' handles exist, `register(gpu)` for a GPU
    whose handle is (re)opened, `drain()` each tick → {gpu index: (xid, ...)}, `close()`."""

    def __init__(self, api: Api):
        self.api = api
        self.set: Any = None
        self.error: str | None = None  # why there is no event set (None: there is one, or not opened)
        self.calls = [0]  # NVML calls made for events (per node)
        self.errors = 0  # failed waits, counted, never raised
        self.last_error: str | None = None
        self.unattributed = 0  # events whose device could not be mapped to a GPU
        self.registered: set[int] = set()
        self._by_address: dict[int, int] = {}

    def open(self) -> bool:
        fn = self.api.fn["event_set_create"]
        self.calls[0] += fn is not None
        created = self.api.call(fn)
        if isinstance(created, NoValue):  # NotSupported / FunctionNotFound (e.g. not Linux), or a driver error
            self.set, self.error = None, f"nvmlEventSetCreate: {created}"
            return False
        self.set, self.error = created, None
        return True

    def register(self, g) -> None:
        """Register Xid events for one GPU (`_Gpu`: its `call` sorts NVML errors, and raises for a
        lost GPU). Without an event set the capability is reported missing."""
        if self.set is None:
            g.unsupported.add(CAPABILITY)
            return
        self.registered.discard(g.index)
        fn = self.api.fn[CAPABILITY]
        result = g.call(CAPABILITY, fn, g.handle, self.api.nv.nvmlEventTypeXidCriticalError, self.set)
        if fn is not None:  # counted here, as an event call, not in the per-GPU budget
            g.counter[0] -= 1
            self.calls[0] += 1
        if not isinstance(result, NoValue) and CAPABILITY not in g.unsupported:
            self.registered.add(g.index)
            addr = _address(g.handle)
            if addr is not None:
                self._by_address = {a: i for a, i in self._by_address.items() if i != g.index}
                self._by_address[addr] = g.index

    def forget(self, index: int) -> None:
        """A GPU's handle died (lost): its address must not be matched to it any more."""
        self.registered.discard(index)
        self._by_address = {a: i for a, i in self._by_address.items() if i != index}

    def drain(self) -> dict[int, tuple[int, ...]]:
        """Every Xid event ready now (up to MAX_EVENTS_PER_TICK), per GPU index. Never blocks."""
        if self.set is None or not self.registered:
            return {}
        api, nv = self.api, self.api.nv
        wait, timeout = api.fn["event_wait"], nv.NVML_ERROR_TIMEOUT
        out: dict[int, list[int]] = {}
        for _ in range(MAX_EVENTS_PER_TICK):
            self.calls[0] += wait is not None
            data = api.call(wait, self.set, 0)
            if isinstance(data, NoValue):
                if data.code != timeout:  # TIMEOUT: the queue is empty
                    self.errors += 1
                    self.last_error = f"nvmlEventSetWait_v2: {data}"
                break
            if data.eventType != nv.nvmlEventTypeXidCriticalError:
                continue
            index = self._index_of(data.device)
            if index is None:
                self.unattributed += 1
                continue
            out.setdefault(index, []).append(int(data.eventData))
        return {i: tuple(x) for i, x in out.items()}

    def _index_of(self, device) -> int | None:
        addr = _address(device)
        if addr is None:
            return None
        index = self._by_address.get(addr)
        if index is not None:
            return index
        fn = self.api.fn["device_index"]
        self.calls[0] += fn is not None
        index = self.api.call(fn, device)
        if isinstance(index, NoValue):
            return None
        index = int(index)
        return index if index in self.registered else None

    def close(self) -> None:
        if self.set is None:
            return
        fn = self.api.fn["event_set_free"]
        self.calls[0] += fn is not None
        self.api.call(fn, self.set)  # an error here changes nothing: the set is dropped anyway
        self.set = None
        self.registered.clear()
        self._by_address.clear()
