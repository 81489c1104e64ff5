"""The simulated GPU fabric (NVSwitch boards): what `nvmlDeviceGetGpuFabricInfo[V]` answers, and the
C side of those calls, writing nvml.h's layouts into the caller's memory as libnvidia-ml does
(whatever structure the Python side declared: see nvmon.collect.fabric for the bindings' mismatches).

Which boards have one: Hopper and Blackwell HGX boards with NVSwitch (hgx-h100, hgx-h200,
hgx-h800, hgx-b200). A100/A800 HGX answer NotSupported: their fabric is set up by Fabric Manager
too, but NVML reports the GPU fabric state from Hopper on (NVML-FACTS §8), so on A100 a stopped
Fabric Manager shows only as CUDA failing to start; NVLink-bridged pairs and PCIe cards answer
NotSupported as well.

Healthy values are those of the real captures (/work/shared/hardware, driver 580): state Completed,
status Success, clique 0, cluster UUID all zeros; H100/H200/H800 report no health field (mask 0)
and no summary, B200 access-timeout recovery False and summary Healthy. The v3 struct (health
summary) needs a 570+ driver: older ones answer ARGUMENT_VERSION_MISMATCH, as NVML does for a
struct version it does not know.

Faults (nvmon.sim.scenario): `fabric=not_started|in_progress` (Fabric Manager down or still
configuring: every GPU), `fabric_status=CODE[:G]` (completed with that NVML return code),
`fabric_health=BIT[:G]` (a health-mask field set, or the summary: see HEALTH_BITS).
"""

from __future__ import annotations

import ctypes
import struct

SUCCESS, ERROR_INVALID_ARGUMENT, ERROR_NOT_SUPPORTED, ERROR_VERSION_MISMATCH = 0, 2, 3, 25
STATES = {"not_started": 1, "in_progress": 2}
COMPLETED = 3
V2, V3 = 0x02000024, 0x03000028  # nvmlGpuFabricInfo_v2 / _v3: sizeof | version << 24
# nvml.h layouts, little endian: [version] uuid[16], status, cliqueId, state (one byte, 3 padding),
# [healthMask], [healthSummary (one byte, 3 padding)].
_V1 = struct.Struct("<16sIIB")  # 25 bytes of a 28-byte struct
_V2 = struct.Struct("<I16sIIB3xI")  # 36
_V3 = struct.Struct("<I16sIIB3xIB")  # 37 of 40
# Health-mask fields: (shift, value when the fault sets it), and the summary that goes with it.
HEALTH_BITS = {
    "degraded_bandwidth": ((0, 1), 3),  # true → limited capacity
    "route_recovery": ((2, 1), 3),
    "route_unhealthy": ((4, 1), 2),  # true → unhealthy
    "access_timeout_recovery": ((6, 1), 3),
    "incorrect_configuration": ((8, 5), 2),  # 5: insufficient NVLinks
    "unhealthy": (None, 2),  # the summary alone
    "limited_capacity": (None, 3),
}
_RANK = {0: 0, 1: 1, 3: 2, 2: 3}  # summaries from best to worst: n/a, healthy, limited capacity, unhealthy
_WIDTH = {0: 0x3, 2: 0x3, 4: 0x3, 6: 0x3, 8: 0xF}
_ACCESS_TIMEOUT_FALSE = 2 << 6


def has_fabric(profile) -> bool:
    return profile.fabric == "nvswitch" and (profile.nvlink_gen or 0) >= 4


def _driver_major(profile) -> int:
    try:
        return int(profile.driver.split(".")[0])
    except ValueError:
        return 0


def fabric_info(board, gpu: int, t: float) -> tuple[int, int, int, bytes, int, int] | None:
    """(state, status, clique id, cluster UUID bytes, health mask, health summary) of `gpu` at `t`,
    or None: no fabric (NotSupported)."""
    p = board.profile
    if not has_fabric(p):
        return None
    blackwell = (p.nvlink_gen or 0) >= 5
    state, status, clique, uuid = COMPLETED, SUCCESS, 0, bytes(16)
    if board.scenario.fabric_cluster is not None:  # a multi-node NVLink domain
        text, clique = board.scenario.fabric_cluster
        uuid = bytes.fromhex(text.replace("-", ""))
    mask, summary = (_ACCESS_TIMEOUT_FALSE, 1) if blackwell else (0, 0)
    for f in board.faults("fabric", t):
        state = STATES[f.what]
    if state == COMPLETED:
        for f in board.faults("fabric_status", t):
            if f.gpu in (None, gpu):
                status = int(f.value)
        for f in board.faults("fabric_health", t):
            if f.gpu not in (None, gpu):
                continue
            field, worse = HEALTH_BITS[f.what]
            if field is not None:
                shift, value = field
                mask = (mask & ~(_WIDTH[shift] << shift)) | value << shift
            if summary or field is None:  # Hopper reports no summary unless the fault is the summary
                summary = max(summary, worse, key=_RANK.__getitem__)
    return state, status, clique, uuid, mask, summary


def write(board, gpu: int, t: float, obj, versioned: bool) -> int:
    """The C side of nvmlDeviceGetGpuFabricInfo (versioned: ...InfoV) into ctypes object `obj`."""
    info = fabric_info(board, gpu, t)
    if info is None:
        return ERROR_NOT_SUPPORTED
    state, status, clique, uuid, mask, summary = info
    size = ctypes.sizeof(obj)
    if not versioned:
        packed = _V1.pack(uuid, status, clique, state)
    else:
        if size < 4:
            return ERROR_INVALID_ARGUMENT
        version = ctypes.c_uint.from_buffer(obj).value
        if version == V3 and _driver_major(board.profile) >= 570:
            packed = _V3.pack(version, uuid, status, clique, state, mask, summary)
        elif version == V2:
            packed = _V2.pack(version, uuid, status, clique, state, mask)
        else:
            return ERROR_VERSION_MISMATCH
    if size < len(packed):  # the C library would write past the caller's buffer
        return ERROR_INVALID_ARGUMENT
    ctypes.memmove(ctypes.addressof(obj), packed, len(packed))
    return SUCCESS
