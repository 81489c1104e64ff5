"""One GPU's per-tick `nvmlDeviceGetFieldValues` batch: built once, reused every tick, decoded fast.

An HGX H100 GPU asks for ~130 values a tick (per link: state, TX/RX KiB, three error counters).
pynvml's public wrapper rebuilds the ctypes array and sets fieldId/scopeId through
`_PrintableStructure.__setattr__` (~1 µs per attribute), and reading results through its
`__getattribute__` costs as much again: ~1 ms per GPU per tick. So, when the installed pynvml has
the layout and the private helpers checked below, the batch keeps one array per GPU, calls the C
symbol through pynvml's own `_nvmlGetFunctionPointer` with exactly the arguments the wrapper passes
(`handle, c_int32(n), byref(array)`), lets `_nvmlCheckReturn` map errors to pynvml's classes, and
decodes the array in one `struct` pass. Otherwise it falls back to the public wrapper.
"""

from __future__ import annotations

import ctypes
import struct
import sys

# c_nvmlFieldValue_t: fieldId u32, scopeId u32, timestamp i64 (µs), latencyUsec i64, valueType u32,
# nvmlReturn u32, value (8-byte union).
FV = struct.Struct("=IIqqIIQ")
_FV_FIELDS = (("fieldId", 0), ("scopeId", 4), ("timestamp", 8), ("latencyUsec", 16), ("valueType", 24),
              ("nvmlReturn", 28), ("value", 32))
_LITTLE = sys.byteorder == "little"


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


class FieldBatch:
    """`fetch(handle)` → [(nvmlReturn, timestamp s, value or None)] in request order.

    `request`: field ids or (field id, scope id) tuples, as `nvmlDeviceGetFieldValues` takes them.
    Raises pynvml's NVMLError subclasses when the whole call fails.
    """

    def __init__(self, nv, request: list, *, direct: bool | None = None):
        self.nv = nv
        self.request = list(request)
        self.n = len(self.request)
        fast = layout_matches(nv)
        if direct is None:
            direct = fast and all(hasattr(nv, a) for a in ("_nvmlGetFunctionPointer", "_nvmlCheckReturn"))
        self.direct = direct
        self.fast_decode = fast
        self._array = None
        if direct and self.n:
            self._array = (nv.c_nvmlFieldValue_t * self.n)()
            buf = memoryview(self._array).cast("B")
            for i, item in enumerate(self.request):
                fid, scope = item if isinstance(item, tuple) else (item, 0)
                FV.pack_into(buf, i * FV.size, fid, scope, 0, 0, 0, 0, 0)

    def fetch(self, handle) -> list[tuple[int, float, int | float | None]]:
        if not self.n:
            return []
        if self.direct:
            fn = self.nv._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
            self.nv._nvmlCheckReturn(fn(handle, ctypes.c_int32(self.n), ctypes.byref(self._array)))
            values = self._array
        else:
            values = self.nv.nvmlDeviceGetFieldValues(handle, self.request)
        return self._decode(values)

    def _decode(self, values) -> list[tuple[int, float, int | float | None]]:
        if self.fast_decode:
            # One pass, inlined for the common types (3: unsigned long long, 1: unsigned int).
            return [
                (ret, ts / 1e6, None if ret else q if vt == 3 else q & 0xFFFFFFFF if vt == 1 and _LITTLE
                 else decode_value(vt, q))
                for _, _, ts, _, vt, ret, q in FV.iter_unpack(memoryview(values).cast("B"))
            ]
        out = []
        for v in values:
            ret = v.nvmlReturn
            value = None
            if ret == 0:
                value = v.value.ullVal if v.valueType == 3 else v.value.uiVal
            out.append((ret, v.timestamp / 1e6, value))
        return out
