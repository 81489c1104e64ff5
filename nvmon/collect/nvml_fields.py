"""NVML constants nvmon relies on, with their meaning and source, in one place.

Values are those of nvml.h / pynvml 13 (NVML-FACTS §1.3, §3); the collector reads them from the
`pynvml` module it is given when the module has them, so a renamed constant fails loudly in tests.
"""

from __future__ import annotations

from nvmon.model import THROTTLE_BITS  # the reported names belong to the model layer

# Per-GPU fields (scopeId 0).
FI_TOTAL_ENERGY = "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # mJ since driver load, Volta+
FI_LINK_COUNT = "NVML_FI_DEV_NVLINK_LINK_COUNT"  # links present; read before probing indices
FI_PCIE_REPLAY = "NVML_FI_DEV_PCIE_REPLAY_COUNTER"
FI_PCIE_TX_BYTES = "NVML_FI_DEV_PCIE_COUNT_TX_BYTES"  # bytes, cumulative ("can be wrapped")
FI_PCIE_RX_BYTES = "NVML_FI_DEV_PCIE_COUNT_RX_BYTES"

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
