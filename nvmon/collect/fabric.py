"""GPU fabric state (NVSwitch boards): `nvmlDeviceGetGpuFabricInfoV` / `nvmlDeviceGetGpuFabricInfo`,
read at start-up and then every `PERIOD_TICKS` (the state changes when Fabric Manager starts or stops,
not tick by tick). NVML-FACTS §8.

Calls, newest first: the versioned call with the v3 struct (health summary), then v2 (health mask),
then the unversioned call (no version, no mask). A driver that does not know a struct version
answers ARGUMENT_VERSION_MISMATCH, one without the versioned call FUNCTION_NOT_FOUND, bindings
without it (nvidia-ml-py < 12.550) have no wrapper: each moves on to the next. NotSupported means
the GPU has no fabric (PCIe cards, NVLink bridges, A100 HGX): recorded once as the `fabric`
capability, never asked again, no note.

Layouts. The C library writes nvml.h's layout whatever the Python side declares, and the bindings'
structs have not always matched it: `c_nvmlGpuFabricInfo_t` declares an 80-byte cluster UUID (nvml.h:
16 bytes) from 11.525 to 13.610, and `c_nvmlGpuFabricInfoV_t` did too in 12.550–12.575, so every
field after it would read as zero; 13.580 gives the degraded-bandwidth field a width of 0x11. The
bindings' struct is used when its layout is nvml.h's (checked field by field, once); otherwise
nvmon's own copy of the C layout below is passed to the same wrapper. Either way the call goes
through the chokepoint (`nvml_api.Api`), and the health mask is decoded with nvml.h's shifts and
widths (`nvmon.model.FABRIC_HEALTH_FIELDS`), not the bindings' constants.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterable
from typing import Any

from nvmon.collect.nvml_api import Api, Lost, NoValue, Unsupported, bindings_version
from nvmon.model import NO_FABRIC, GpuFabric

log = logging.getLogger("nvmon.collect")

PERIOD_TICKS = 5  # ticks between reads of a GPU's fabric info (5 s at the default 1 s interval)
VERSION_MISMATCH = 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
FUNCTION_NOT_FOUND = 13  # NVML_ERROR_FUNCTION_NOT_FOUND: a driver older than the call


# nvml.h: nvmlGpuFabricInfo_t, nvmlGpuFabricInfo_v2_t (= nvmlGpuFabricInfoV_t), nvmlGpuFabricInfo_v3_t.
# The state is an unsigned char there (the bindings declare a c_uint over it and its padding).
class CFabricInfoV1(ctypes.Structure):
    _fields_ = [("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint32),
                ("state", ctypes.c_uint8)]


class CFabricInfoV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint8), ("healthMask", ctypes.c_uint32)]


class CFabricInfoV3(ctypes.Structure):
    _fields_ = CFabricInfoV2._fields_ + [("healthSummary", ctypes.c_uint8)]


def struct_version(layout: type, n: int) -> int:
    """NVML_STRUCT_VERSION: the struct's size in the low bytes, its version in the top byte."""
    return ctypes.sizeof(layout) | n << 24


# (name, purpose, nvml.h layout, version number or None, the bindings' classes for it, newest name first)
VARIANTS = (
    ("v3", "fabric_health", CFabricInfoV3, 3, ("c_nvmlGpuFabricInfo_v3_t",)),
    ("v2", "fabric_health", CFabricInfoV2, 2, ("c_nvmlGpuFabricInfo_v2_t", "c_nvmlGpuFabricInfoV_t")),
    ("v1", "fabric", CFabricInfoV1, None, ("c_nvmlGpuFabricInfo_t",)),
)


def same_layout(cls: type, layout: type) -> bool:
    """Whether the bindings' structure `cls` puts every field of `layout` where nvml.h does, with
    its size (the state may be wider: its low byte is read), and has nvml.h's total size."""
    try:
        if ctypes.sizeof(cls) != ctypes.sizeof(layout):
            return False
        for name, _ in layout._fields_:
            mine, theirs = getattr(layout, name), getattr(cls, name, None)
            if theirs is None or theirs.offset != mine.offset or (theirs.size != mine.size and name != "state"):
                return False
        return True
    except (TypeError, AttributeError):
        return False


def uuid_text(raw: Iterable[int]) -> str:
    b = bytes(raw)
    h = b.hex()
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}" if len(b) == 16 else h


class _Variant:
    """One way of asking: the wrapper, the struct class to pass (the bindings' or nvmon's)."""

    __slots__ = ("name", "fn", "cls", "version")

    def __init__(self, api: Api, name: str, purpose: str, layout: type, n: int | None, classes: tuple[str, ...]):
        self.name, self.fn = name, api.fn[purpose]
        cls = next((c for c in map(api.struct, classes) if c is not None), None)
        if cls is not None and not same_layout(cls, layout):
            if self.fn is not None and classes[0] not in _warned:
                _warned.add(classes[0])
                log.info("nvidia-ml-py %s: %s does not match nvml.h's layout; fabric info is read with nvmon's "
                         "copy of it", bindings_version(), cls.__name__)
            cls = None
        self.cls = cls or layout
        self.version = None if n is None else struct_version(layout, n)

    def new(self) -> Any:
        st = self.cls()
        if self.version is not None:
            st.version = self.version  # the bindings' constructors set it too; nvmon's copy does not
        return st


_warned: set[str] = set()


class FabricReader:
    """Fabric info of every GPU of a node. `of(g)`, once per GPU per tick as its sample is built,
    reads it when due — on the GPU's first tick, then every PERIOD_TICKS — and gives the latest
    `GpuFabric` (NO_FABRIC when none). Its NVML calls are counted in `calls`, apart from the
    collector's per-tick budget: one call per GPU every PERIOD_TICKS."""

    def __init__(self, api: Api):
        self.api = api
        self.variants = [_Variant(api, *v) for v in VARIANTS]
        self.info: dict[int, GpuFabric] = {}
        self.calls = 0
        self._wait: dict[int, int] = {}  # GPU index → ticks until its next read
        self._chosen: dict[int, _Variant] = {}  # GPU index → the variant its driver answered

    def of(self, g: Any) -> GpuFabric:
        """The fabric of GPU `g` (an `nvml._Gpu` being sampled), read first when it is due."""
        i = g.index
        wait = self._wait.get(i, 0)
        if wait > 0:
            self._wait[i] = wait - 1
            return self.info.get(i, NO_FABRIC)
        self._wait[i] = PERIOD_TICKS - 1
        if "fabric" in g.unsupported or g.handle is None:
            return NO_FABRIC
        got = self.info[i] = self._read(g)
        return got

    def _read(self, g: Any) -> GpuFabric:
        chosen = self._chosen.get(g.index)
        for v in ([chosen] if chosen is not None else self.variants):
            if v.fn is None:
                continue  # the bindings lack this wrapper: the next one
            st = v.new()
            self.calls += 1
            got = self.api.call(v.fn, g.handle, ctypes.byref(st))
            if not isinstance(got, NoValue):
                self._chosen[g.index] = v
                g.notes.pop("fabric", None)
                if v.version is None:
                    g.unsupported.add("fabric_health")  # the unversioned call has no health mask
                return _decode(st, v.name)
            if isinstance(got, Lost):
                return self.info.get(g.index, NO_FABRIC)
            if chosen is None and (got.code in (VERSION_MISMATCH, FUNCTION_NOT_FOUND) or got.code is None):
                continue  # a driver older than this struct or call: try the next
            if isinstance(got, Unsupported):
                g.unsupported.update(("fabric", "fabric_health"))  # no fabric here: a capability, not an error
                return NO_FABRIC
            g.notes["fabric"] = f"fabric: {got}"
            return self.info.get(g.index, NO_FABRIC)
        g.unsupported.update(("fabric", "fabric_health"))  # no call the driver and the bindings share
        return NO_FABRIC


def _decode(st: Any, variant: str) -> GpuFabric:
    state = int(st.state) & 0xFF  # one byte in nvml.h
    if state == 0:  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, answered with SUCCESS
        return NO_FABRIC
    mask = int(st.healthMask) if variant != "v1" else None
    summary = int(st.healthSummary) if variant == "v3" else None
    return GpuFabric(state=state, status=int(st.status), clique_id=int(st.cliqueId),
                     cluster_uuid=uuid_text(st.clusterUuid), health_mask=mask, health_summary=summary)
