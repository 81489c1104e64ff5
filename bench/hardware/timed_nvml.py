"""A pynvml module that times every NVML call made through it: what each call costs on a real node.

nvmon's NVML code takes the pynvml module as a parameter (DESIGN.md), so the kit passes it this
stand-in instead of the module itself. Attribute reads are forwarded to the real module (or to a
simulated copy: the kit's --sim mode times the fake library the same way); two kinds are wrapped:

* public `nvml*` functions (`nvmlDeviceGetClockInfo`, `nvmlEventSetWait`, ...): the cost nvmon
  pays for the call, pynvml's ctypes wrapper included;
* `_nvmlGetFunctionPointer`, which the per-tick field-value batch uses to call the C symbol itself
  (nvmon/collect/nvml_batch.py): the function pointer it returns is timed under "C:<symbol>".

The public wrappers reach the C library through their own module's globals, not through this
stand-in, so no call is counted twice. `phase` (default "tick") files calls apart: the kit sets
"open" while the sampler opens, so one-time reads (names, link maps) stay out of the per-tick figures.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable


def _percentile(sorted_ns: list[int], q: float) -> int:
    if not sorted_ns:
        return 0
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))]


class TimedNvml(types.ModuleType):
    """`TimedNvml(pynvml)` behaves as `pynvml`; `stats()` gives each call's count and latency."""

    def __init__(self, nv: types.ModuleType):
        super().__init__(getattr(nv, "__name__", "pynvml"), getattr(nv, "__doc__", None))
        object.__setattr__(self, "_nv", nv)
        object.__setattr__(self, "phase", "tick")
        object.__setattr__(self, "_ns", {})  # (phase, name) -> [duration ns, ...]
        object.__setattr__(self, "_errors", {})  # (phase, name) -> {exception class name: count}
        object.__setattr__(self, "_pointers", {})  # symbol -> (C function, its timed wrapper)

    def __getattr__(self, name: str):
        value = getattr(self._nv, name)
        if name == "_nvmlGetFunctionPointer" and callable(value):
            wrapped = self._pointer_getter(value)
        elif name.startswith("nvml") and isinstance(value, types.FunctionType):
            wrapped = self._timed(name, value)
        else:
            return value  # constants, structures, exception classes: the module's own objects
        object.__setattr__(self, name, wrapped)  # later reads skip __getattr__
        return wrapped

    def __setattr__(self, name: str, value) -> None:
        if name == "phase":
            object.__setattr__(self, name, value)
        else:
            setattr(self._nv, name, value)

    def _record(self, name: str, ns: int, error: BaseException | None) -> None:
        key = (self.phase, name)
        self._ns.setdefault(key, []).append(ns)  # list.append is atomic: the sampler thread calls
        if error is not None:
            errs = self._errors.setdefault(key, {})
            errs[type(error).__name__] = errs.get(type(error).__name__, 0) + 1

    def _timed(self, name: str, fn: Callable) -> Callable:
        clock, record = time.perf_counter_ns, self._record

        def timed(*args, **kwargs):
            t0 = clock()
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:
                record(name, clock() - t0, e)
                raise
            record(name, clock() - t0, None)
            return result

        timed.__name__ = timed.__qualname__ = name
        timed.__wrapped__ = fn
        return timed

    def _pointer_getter(self, getter: Callable) -> Callable:
        def get_pointer(symbol):
            fn = getter(symbol)
            cached = self._pointers.get(symbol)
            if cached is None or cached[0] is not fn:
                cached = (fn, self._timed(f"C:{symbol}", fn))
                self._pointers[symbol] = cached
            return cached[1]

        return get_pointer

    def stats(self, ticks: int | None = None) -> dict[str, dict[str, dict]]:
        """{phase: {name: count, errors, total_ms, mean/p50/p90/p99/max in µs, and per_tick in the
        "tick" phase}}, each phase's names slowest total first."""
        out: dict[str, dict[str, dict]] = {}
        for (phase, name), durations in self._ns.items():
            d = sorted(durations)
            row = {
                "count": len(d),
                "total_ms": round(sum(d) / 1e6, 3),
                "mean_us": round(sum(d) / len(d) / 1e3, 1),
                "p50_us": round(_percentile(d, 0.50) / 1e3, 1),
                "p90_us": round(_percentile(d, 0.90) / 1e3, 1),
                "p99_us": round(_percentile(d, 0.99) / 1e3, 1),
                "max_us": round(d[-1] / 1e3, 1),
            }
            if ticks and phase == "tick":
                row["per_tick"] = round(len(d) / ticks, 2)
            if (phase, name) in self._errors:
                row["errors"] = dict(self._errors[(phase, name)])
            out.setdefault(phase, {})[name] = row
        return {phase: dict(sorted(rows.items(), key=lambda kv: -kv[1]["total_ms"])) for phase, rows in out.items()}
