"""One GPU's per-tick `nvmlDeviceGetFieldValues` batch: built once, reused every tick, decoded fast.

An HGX H100 GPU asks for ~130 values a tick (per link: state, TX/RX KiB, three error counters).
pynvml's public wrapper rebuilds the ctypes array and sets fieldId/scopeId through
`_PrintableStructure.__setattr__` (~1 µs per attribute), and reading results through its
`__getattribute__` costs as much again: ~1 ms per GPU per tick. So, when the installed pynvml has
the layout and the private helpers checked below, the batch keeps one array per GPU, calls the C
symbol through pynvml's own `_nvmlGetFunctionPointer` with exactly the arguments the wrapper passes
(`handle, c_int32(n), byref(array)`), lets `_nvmlCheckReturn` map errors to pynvml's classes, and
decodes the array into columns with memoryview slices. Otherwise it falls back to the public wrapper.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from operator import itemgetter
from typing import NamedTuple

# c_nvmlFieldValue_t: fieldId u32, scopeId u32, timestamp i64 (µs), latencyUsec i64, valueType u32,
# nvmlReturn u32, value (8-byte union).
FV = struct.Struct("=IIqqIIQ")
_FV_FIELDS = (("fieldId", 0), ("scopeId", 4), ("timestamp", 8), ("latencyUsec", 16), ("valueType", 24),
              ("nvmlReturn", 28), ("value", 32))


def layout_matches(nv) -> bool:
    """True when the module's c_nvmlFieldValue_t is byte-for-byte the layout FV decodes."""
    t = getattr(nv, "c_nvmlFieldValue_t", None)
    try:
        return ctypes.sizeof(t) == FV.size and all(getattr(t, n).offset == o for n, o in _FV_FIELDS)
    except (TypeError, AttributeError):
        return False


def decode_value(value_type: int, q: int) -> int | float:
    """The union's value by valueType: 0 double, 1 uint, 2 ulong, 3 ull, 4 sll, 5 sint, 6 ushort."""
    if value_type in (2, 3):
        return q
    raw = q.to_bytes(8, sys.byteorder)
    if value_type == 0:
        return struct.unpack("=d", raw)[0]
    if value_type == 4:
        return struct.unpack("=q", raw)[0]
    if value_type == 5:
        return struct.unpack("=i", raw[:4])[0]
    if value_type == 6:
        return struct.unpack("=H", raw[:2])[0]
    return struct.unpack("=I", raw[:4])[0]  # 1: unsigned int


class Readings(NamedTuple):
    """One batch's answers as columns, in request order (entry i of each list is request entry i)."""

    rets: list[int]  # nvmlReturn per entry (0: success)
    ts_us: list[int]  # timestamp per entry, µs
    values: list[int | float | None]  # None where the entry failed


class FieldBatch:
    """`fetch(handle)` → `Readings` (columns: return codes, timestamps, values) in request order.

    `request`: field ids or (field id, scope id) tuples, as `nvmlDeviceGetFieldValues` takes them.
    Raises pynvml's NVMLError subclasses when the whole call fails.
    """

    def __init__(self, nv, request, *, direct: bool | None = None):
        self.nv = nv
        self.request = list(request)
        self.n = len(self.request)
        fast = layout_matches(nv)
        if direct is None:
            direct = fast and all(hasattr(nv, a) for a in ("_nvmlGetFunctionPointer", "_nvmlCheckReturn"))
        self.direct = direct
        self.fast_decode = fast
        self._array = None
        self._types: list[int] | None = None  # valueTypes of the last answer, and the picker for them
        self._pick: itemgetter | None = None
        if direct and self.n:
            self._array = (nv.c_nvmlFieldValue_t * self.n)()
            buf = memoryview(self._array).cast("B")
            for i, item in enumerate(self.request):
                fid, scope = item if isinstance(item, tuple) else (item, 0)
                FV.pack_into(buf, i * FV.size, fid, scope, 0, 0, 0, 0, 0)

    def fetch(self, handle) -> Readings:
        if not self.n:
            return Readings([], [], [])
        if self.direct:
            fn = self.nv._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
            self.nv._nvmlCheckReturn(fn(handle, ctypes.c_int32(self.n), ctypes.byref(self._array)))
            values = self._array
        else:
            values = self.nv.nvmlDeviceGetFieldValues(handle, self.request)
        return self._decode(values)

    def _decode(self, values) -> Readings:
        if self.fast_decode:
            # Columns straight out of the array's memory at C speed: the 40-byte entry is ten u32
            # words (valueType at 6, nvmlReturn at 7, the union's first 4 bytes at 8) or five
            # 64-bit words (timestamp at 1, the union at 4). Only the per-type pick is Python.
            raw = memoryview(values).cast("B")
            u32 = raw.cast("I")
            rets, types = u32[7::10].tolist(), u32[6::10].tolist()
            ts_us = raw.cast("q")[1::5].tolist()
            q = raw.cast("Q")[4::5].tolist()
            lo = u32[8::10].tolist()  # a 4-byte member of the union sits in its first 4 bytes
            if types != self._types:  # the answer's types, as a rule the same every tick
                self._types = types
                # Only unsigned ints (1: 4-byte, 2/3: 8-byte): one itemgetter over q + lo picks each
                # entry's value at C speed.
                self._pick = itemgetter(*(i if t != 1 else len(q) + i for i, t in enumerate(types))) \
                    if len(types) > 1 and all(t in (1, 2, 3) for t in types) else None
            if self._pick is not None:
                vals = list(self._pick(q + lo))
            else:
                vals = [v if t == 3 else w if t == 1 else decode_value(t, v) for t, v, w in zip(types, q, lo)]
            if any(rets):
                vals = [None if r else v for r, v in zip(rets, vals)]
            return Readings(rets, ts_us, vals)
        rets, ts_us, vals = [], [], []
        for v in values:
            ret = v.nvmlReturn
            rets.append(ret)
            ts_us.append(v.timestamp)
            vals.append(None if ret else decode_value(v.valueType, v.value.ullVal))
        return Readings(rets, ts_us, vals)
