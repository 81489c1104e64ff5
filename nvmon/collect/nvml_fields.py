"""NVML names nvmon relies on — functions by purpose, field ids, enums — with meaning and source.

Values are those of nvml.h / pynvml 13 (NVML-FACTS §1.3, §3). The collector looks every name up in
the `pynvml` module it is given, through the chokepoint (`nvml_api.Api`): a name that module lacks
makes its metric unsupported. `ADDED` says which names are newer than the oldest nvidia-ml-py
nvmon accepts; tests/test_sim_surface.py checks, against the installed bindings, that every other
name exists and that these exist exactly from that release on — so a renamed name fails in tests.
"""

from __future__ import annotations

from nvmon.catalog import GPU_NVML
from nvmon.model import THROTTLE_BITS  # the reported names belong to the model layer

# Per-GPU fields (scopeId 0).
FI_TOTAL_ENERGY = "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # mJ since driver load, Volta+
FI_LINK_COUNT = "NVML_FI_DEV_NVLINK_LINK_COUNT"  # links present; read before probing indices
FI_PCIE_REPLAY = "NVML_FI_DEV_PCIE_REPLAY_COUNTER"
FI_PCIE_TX_BYTES = "NVML_FI_DEV_PCIE_COUNT_TX_BYTES"  # bytes, cumulative ("can be wrapped")
FI_PCIE_RX_BYTES = "NVML_FI_DEV_PCIE_COUNT_RX_BYTES"
# "Limit currently enforced in milliwatts (This includes other limits set elsewhere. E.g.
# Out-of-band)" (nvml.h); read every tick in the batch, so a cap's end is seen at once (the
# enforced-limit getter is the fallback, on the slow rotation).
FI_POWER_CURRENT_LIMIT = "NVML_FI_DEV_POWER_CURRENT_LIMIT"

# Per-link fields: "Link ID needs to be specified in the scopeId field" (nvml.h, THROUGHPUT group).
FI_LINK_STATE = "NVML_FI_DEV_NVLINK_GET_STATE"  # INACTIVE=0 ACTIVE=1 SLEEP=2 ACTIVE_TRAFFIC_DISABLED=3
FI_LINK_SPEED = "NVML_FI_DEV_NVLINK_GET_SPEED"  # MB/s
FI_LINK_TX_KIB = "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"  # cumulative KiB of payload
FI_LINK_RX_KIB = "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"
FI_LINK_REPLAY = "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY"  # unsupported on Blackwell+ (nvml.h)
FI_LINK_RECOVERY = "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY"
FI_LINK_CRC = "NVML_FI_DEV_NVLINK_ERROR_DL_CRC"  # data-link CRC (flit) errors
# Data-CRC errors exist only as one field id per link for links 0..11 (scopeId 0).
FI_LINK_CRC_DATA = tuple(f"NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L{i}" for i in range(12))

# Every pynvml function the collector calls, by purpose (the key is also the capability name under
# which "unsupported" is reported). Newest name first, then older names that answer the same
# question with the same arguments: the first one the installed bindings have is used.
FUNCTIONS = {
    # lifecycle and the node (not per GPU)
    "init": ("nvmlInit",),
    "shutdown": ("nvmlShutdown",),
    "driver_version": ("nvmlSystemGetDriverVersion",),
    "nvml_version": ("nvmlSystemGetNVMLVersion",),
    "count": ("nvmlDeviceGetCount",),
    # static facts, read once per GPU
    "handle": ("nvmlDeviceGetHandleByIndex",),
    "name": ("nvmlDeviceGetName",),
    "uuid": ("nvmlDeviceGetUUID",),
    "serial": ("nvmlDeviceGetSerial",),
    "pci": ("nvmlDeviceGetPciInfo",),
    "power_default_limit": ("nvmlDeviceGetPowerManagementDefaultLimit",),
    "power_constraints": ("nvmlDeviceGetPowerManagementLimitConstraints",),
    "pcie_max_gen": ("nvmlDeviceGetMaxPcieLinkGeneration",),
    "pcie_gpu_max_gen": ("nvmlDeviceGetGpuMaxPcieLinkGeneration",),
    "pcie_max_width": ("nvmlDeviceGetMaxPcieLinkWidth",),
    "nvlink_version": ("nvmlDeviceGetNvLinkVersion",),
    "nvlink_remote_type": ("nvmlDeviceGetNvLinkRemoteDeviceType",),
    "nvlink_remote_pci": ("nvmlDeviceGetNvLinkRemotePciInfo",),
    # per tick: the field-value batch (nvml_batch calls the C symbol itself when it can) and the
    # rotated getters
    "field_values": ("nvmlDeviceGetFieldValues",),
    # "ClocksThrottleReasons" was renamed "ClocksEventReasons" (same bits) in 12.535
    "throttle": ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
    "utilization": ("nvmlDeviceGetUtilizationRates",),
    # the versioned getter (12.570) and the one it deprecates: (handle, sensor) → °C, both
    "temperature": ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"),
    "pcie_gen": ("nvmlDeviceGetCurrPcieLinkGeneration",),
    "pcie_width": ("nvmlDeviceGetCurrPcieLinkWidth",),
    "power_limit": ("nvmlDeviceGetEnforcedPowerLimit",),
    "power": ("nvmlDeviceGetPowerUsage",),  # fallback when the energy counter is unsupported
    "nvlink_state_getter": ("nvmlDeviceGetNvLinkState",),  # fallback when the state field is unsupported
    # Xid events (nvml_events)
    "xid_events": ("nvmlDeviceRegisterEvents",),
    "event_set_create": ("nvmlEventSetCreate",),
    "event_wait": ("nvmlEventSetWait_v2",),
    "event_set_free": ("nvmlEventSetFree",),
    "device_index": ("nvmlDeviceGetIndex",),
    # GPU fabric (nvmon.collect.fabric): the versioned call (v3/v2 struct: health mask and summary),
    # and the unversioned one it deprecates (no health), tried in that order
    "fabric_health": ("nvmlDeviceGetGpuFabricInfoV",),
    "fabric": ("nvmlDeviceGetGpuFabricInfo",),
}

# The getters of the catalog's NVML metrics (`Metric.nvml`: clocks, framebuffer memory, ...), by their
# call; a call the collector makes itself must name the same functions.
def _add_catalog_functions() -> None:
    for m in GPU_NVML:
        if m.nvml.fn and FUNCTIONS.setdefault(m.nvml.call, m.nvml.fn) != m.nvml.fn:
            raise ValueError(f"catalog metric {m.name}: call {m.nvml.call!r} is {FUNCTIONS[m.nvml.call]}, not {m.nvml.fn}")


_add_catalog_functions()
# The constants the catalog names (field ids, getter arguments), resolved through the chokepoint too.
CATALOG_CONSTANTS = tuple(dict.fromkeys(
    [m.nvml.field for m in GPU_NVML if m.nvml.field] + [a for m in GPU_NVML for a in m.nvml.args if isinstance(a, str)]))

# Names above newer than the oldest nvidia-ml-py nvmon accepts (pyproject.toml): the release that
# added each, checked against the pynvml.py of each release on PyPI. Every other name is in all.
ADDED = {
    "nvmlDeviceGetCurrentClocksEventReasons": (12, 535),
    "NVML_FI_DEV_POWER_CURRENT_LIMIT": (12, 535),
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": (12, 555),
    "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": (12, 555),
    "nvmlDeviceGetTemperatureV": (12, 570),
    "nvmlDeviceGetGpuFabricInfoV": (12, 550),
    # and those the catalog says are newer (`Nvml.since`: its field id, or its getter's newest name)
    **{m.nvml.field or m.nvml.fn[0]: m.nvml.since for m in GPU_NVML if m.nvml.since},
}

PER_LINK_FIELDS = {
    "state": FI_LINK_STATE,
    "speed": FI_LINK_SPEED,
    "tx": FI_LINK_TX_KIB,
    "rx": FI_LINK_RX_KIB,
    "replay": FI_LINK_REPLAY,
    "recovery": FI_LINK_RECOVERY,
    "crc_flit": FI_LINK_CRC,
}


def decode_throttle(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in THROTTLE_BITS if mask & bit)


# nvmlNvlinkVersion_t: 1=1.0, 2=2.0, 3=2.2, 4=3.0, 5=3.1, 6=4.0, 7=5.0, 8=6.0 (P:299-307) → generation.
# A100 reports 5 ("3.1", hwloc#658).
NVLINK_ENUM_TO_GEN = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
NVLINK_GEN_TO_ENUM = {3: 5, 4: 6, 5: 7, 6: 8}

# nvmlNvLinkDeviceType: GPU=0, IBMNPU=1, SWITCH=2, UNKNOWN=0xFF.
REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "nvswitch"}
# Remote PCI id reported for NVSwitch endpoints on some systems (k8s-test-infra mock, GB200).
SENTINEL_BUS_IDS = {"FFFFFFFF:FF:FF.0", "FFFF:FF:FF.0", ""}
