"""The catalog's per-GPU NVML metrics (`Metric.nvml`, nvmon.catalog.metrics.Nvml), read with no code
of their own: a metric declared there reaches `GpuSample.values` without a line here.

- A field id joins the GPU's per-tick nvmlDeviceGetFieldValues batch (`FIELDS`: the collector adds
  them to its request, and `take_fields` copies their answers, scaled).
- A getter is one *call* (metrics naming the same `call` share it: used, free and total memory).
  `once` calls are made when the GPU is opened; a call the collector makes itself (`nvml.ROTATION`,
  `SLOW`) carries its catalog metrics along (`CatalogReader.take`, at no extra call); the others
  take turns in the catalog's own rotation (`ROTATION`), one call per GPU per tick.

Every function and constant is resolved through the chokepoint (`nvml_api.Api`: `FUNCTIONS` holds
the catalog's getters by call), so a name the installed bindings lack makes its metric
unsupported, reported under the call's name, and is never called.
"""

from __future__ import annotations

from nvmon.catalog import GPU_NVML, GPU_VALUES, Metric
from nvmon.collect.nvml_api import Api, NoValue
from nvmon.collect.nvml_gpu import _Gpu

FIELDS: tuple[Metric, ...] = tuple(m for m in GPU_NVML if m.nvml.field)
# getter call → its metrics, in catalog order
CALLS: dict[str, tuple[Metric, ...]] = {
    call: tuple(m for m in GPU_NVML if m.nvml.call == call)
    for call in dict.fromkeys(m.nvml.call for m in GPU_NVML if not m.nvml.field)}
ONCE = tuple(call for call, ms in CALLS.items() if ms[0].nvml.once)
VALUE_NAMES = tuple(m.name for m in GPU_VALUES)  # GpuSample.values' keys, in catalog order
# What the hot path needs of each metric, looked up once: (name, structure member, scale) per call,
# and (name, batch key, scale) per field id.
_TAKE = {call: tuple((m.name, m.nvml.attr, m.nvml.scale) for m in ms) for call, ms in CALLS.items()}
_FIELD_TAKE = tuple((m.name, m.nvml.call, m.nvml.scale) for m in FIELDS)


def rotation(calls: dict[str, tuple[Metric, ...]], own: tuple[str, ...]) -> tuple[str, ...]:
    """One cycle of the catalog's getter rotation: each call (not `once`, not one of the collector's
    `own`) gets `turns` turns — the most its metrics ask — spread as rounds, the calls with the most
    turns first and those with fewer joining the last rounds: SM clock 2, memory 2, memory clock 1
    give (sm_clock, memory, sm_clock, memory, mem_clock)."""
    turns = {call: max(m.nvml.turns for m in ms) for call, ms in calls.items()
             if call not in own and not ms[0].nvml.once}
    order = sorted(turns, key=lambda c: -turns[c])  # stable: catalog order among equals
    most = max(turns.values(), default=0)
    return tuple(c for r in range(most) for c in order if turns[c] >= most - r)


class CatalogReader:
    """The catalog's getter calls for one collector (one pynvml module): their arguments resolved
    once through its `Api`, and what each call's answer puts in a GPU's `last` values."""

    def __init__(self, api: Api, own: tuple[str, ...]):
        self.api = api
        self.rotation = rotation(CALLS, own)
        self.rides = frozenset(c for c in CALLS if c in own)  # carried by the collector's own calls
        self._args: dict[str, tuple | None] = {}

    def args(self, call: str) -> tuple | None:
        """The call's arguments after the handle; None when the bindings lack a constant it names."""
        try:
            return self._args[call]
        except KeyError:
            pass
        out: list | None = []
        for a in CALLS[call][0].nvml.args:
            v = self.api.const(a, call) if isinstance(a, str) else a
            if v is None:
                out = None
                break
            out.append(v)
        self._args[call] = args = None if out is None else tuple(out)
        return args

    def read(self, g: _Gpu, call: str) -> None:
        """Make `call` for GPU `g` (raises _Lost) and keep its metrics' values."""
        if call in g.unsupported:
            return
        args = self.args(call)
        if args is None:
            g.unsupported.add(call)
            return
        self.take(g, call, g.ask(call, g.handle, *args))

    def read_once(self, g: _Gpu) -> None:
        for call in ONCE:
            self.read(g, call)

    @staticmethod
    def take(g: _Gpu, call: str, value) -> None:
        """Keep in `g.last` what `value`, the answer to `call`, says of each of its metrics."""
        last = g.last
        if isinstance(value, NoValue):
            for name, _, _ in _TAKE[call]:
                last[name] = None
            return
        for name, attr, scale in _TAKE[call]:
            v = getattr(value, attr) if attr else value
            last[name] = v if scale == 1 else v * scale

    @staticmethod
    def take_fields(g: _Gpu, value) -> None:
        """Keep the field-id metrics' answers of this tick's batch; `value(key)`: an entry's value."""
        last = g.last
        for name, key, scale in _FIELD_TAKE:
            v = value(key)
            last[name] = v if v is None or scale == 1 else v * scale

    @staticmethod
    def values(g: _Gpu) -> dict:
        """The GPU's `GpuSample.values`, every key in catalog order (None: not read)."""
        return dict(zip(VALUE_NAMES, map(g.last.get, VALUE_NAMES)))
