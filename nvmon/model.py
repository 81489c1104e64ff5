"""The immutable `Sample` of one node at one tick, and its JSON form.

Data flows one way: collectors build these objects (hardware units are converted and cumulative
counters turned into rates there, once); store, wire, audit and views only read them.

Conventions: SI base units unless the field name says otherwise (`*_bytes_per_s`, `power_w`,
`temperature_c`, `rate_gbps`); `None` means "could not be read" (the reason is in `notes`);
cumulative counters keep their raw value, and `*_delta` holds their rise over the interval
(`None` when unknown: first tick, counter reset, saturated 32-bit counter).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, is_dataclass
from enum import IntEnum, IntFlag
from typing import Any

SCHEMA = 1

NVLINK_ERROR_KINDS = ("crc_flit", "crc_data", "replay", "recovery")
IB_ERROR_KINDS = (
    "symbol_error",
    "link_downed",
    "port_rcv_errors",
    "link_error_recovery",
    "port_xmit_discards",
)

# The names of `GpuSample.throttle_reasons` and `IbPortSample.state`/`phys_state`, here rather than
# in the collectors because the store and the exporter encode and decode them too. Each is declared
# once as a typed enum; the tables after each are derived from it for the code that maps numbers to
# the names the Sample, the wire and the docs carry.


class Throttle(IntFlag):
    """nvmlClocksEventReason* bits (pynvml P:2190-2226); `reported` is the name nvmon reports."""

    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL = 0x20
    HW_THERMAL = 0x40
    HW_POWER_BRAKE = 0x80
    DISPLAY_CLOCKS = 0x100

    @property
    def reported(self) -> str:
        return (self.name or "").lower()


THROTTLE_BITS = tuple((int(m), m.reported) for m in Throttle)  # (bit, name), in bit order


class IbState(IntEnum):
    """An InfiniBand port's logical state, as sysfs `state` writes it ("4: ACTIVE")."""

    NOP = 0
    DOWN = 1
    INIT = 2
    ARMED = 3
    ACTIVE = 4
    ACTIVE_DEFER = 5


class IbPhysState(IntEnum):
    """An InfiniBand port's physical state, as sysfs `phys_state` writes it ("5: LinkUp"); `text`
    is the kernel's spelling (one has a space)."""

    def __new__(cls, value: int, text: str) -> IbPhysState:
        member = int.__new__(cls, value)
        member._value_ = value
        member.text = text
        return member

    SLEEP = 1, "Sleep"
    POLLING = 2, "Polling"
    DISABLED = 3, "Disabled"
    PORT_CONFIGURATION_TRAINING = 4, "PortConfigurationTraining"
    LINK_UP = 5, "LinkUp"
    LINK_ERROR_RECOVERY = 6, "LinkErrorRecovery"
    PHY_TEST = 7, "Phy Test"


IB_STATES = {int(m): m.name for m in IbState}  # sysfs number -> name
IB_PHYS_STATES = {int(m): m.text for m in IbPhysState}


@dataclass(frozen=True, slots=True)
class PcieLink:
    """A PCIe link as the device sees it. `gen`/`width` are current, `max_*` what device+slot allow."""

    gen: int | None = None
    max_gen: int | None = None
    width: int | None = None
    max_width: int | None = None
    device_max_gen: int | None = None  # what the device itself supports (GPU: nvmlDeviceGetGpuMaxPcieLinkGeneration)
    tx_bytes_per_s: float | None = None
    rx_bytes_per_s: float | None = None
    replay_errors: int | None = None  # cumulative
    replay_errors_delta: int | None = None


# GPU fabric (NVSwitch boards, configured by Fabric Manager): nvmlGpuFabricState_t and the fields of
# nvmlGpuFabricInfo's healthMask, (name, shift, width) as nvml.h defines them (NVML-FACTS §8).
class FabricState(IntEnum):
    """nvmlGpuFabricState_t: NVML_GPU_FABRIC_STATE_NOT_STARTED .. _COMPLETED."""

    NOT_STARTED = 1
    IN_PROGRESS = 2
    COMPLETED = 3


FABRIC_STATES = {int(m): m.name.lower() for m in FabricState}
FABRIC_HEALTH_FIELDS = (
    ("degraded_bandwidth", 0, 0x3),  # 0 n/a, 1 true, 2 false (so are the next three)
    ("route_recovery", 2, 0x3),
    ("route_unhealthy", 4, 0x3),
    ("access_timeout_recovery", 6, 0x3),
    ("incorrect_configuration", 8, 0xF),  # 0 n/a, 1 none, 2.. the kind of misconfiguration
    ("partition_assigned", 12, 0x3),
    ("gfm_state", 14, 0x3),  # 1 connected, 2 disconnected
)
FABRIC_INCORRECT_CONFIGURATION = {2: "incorrect system GUID", 3: "incorrect chassis serial number",
                                  4: "no partition", 5: "insufficient NVLinks", 6: "incompatible GPU firmware",
                                  7: "invalid location", 8: "GPU state invalid"}
FABRIC_SUMMARIES = {1: "healthy", 2: "unhealthy", 3: "limited_capacity"}  # 0: not supported (v3 only)


# A PCI address as NVML writes it ("00000000:18:00.0": 8-digit domain, upper case) or sysfs / lspci
# ("0000:18:00.0"). The data keeps each source's form (the JSON, the wire, dcgm-exporter's labels);
# views show every bus id through `short_bus_id`, so two forms never sit side by side.
_BUS_ID = re.compile(r"^([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$")


def short_bus_id(bus_id: str | None) -> str | None:
    """'00000000:18:00.0' → '0000:18:00.0' (the short domain, lower case, as lspci and sysfs show);
    a domain past 0xffff keeps its digits; text that is no bus id is returned as it is."""
    m = _BUS_ID.match(bus_id) if bus_id else None
    if m is None:
        return bus_id
    domain, bus, dev, fn = m.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


def fabric_health(mask: int | None) -> dict[str, int]:
    """The healthMask's fields that the driver reports (value 0, "not supported", left out)."""
    if mask is None:
        return {}
    out = {}
    for name, shift, width in FABRIC_HEALTH_FIELDS:
        v = (mask >> shift) & width
        if v:
            out[name] = v
    return out


# Each reported fabric health field as a flag, True = what NVML calls trouble (the mask's "true",
# an incorrect configuration, the global fabric manager disconnected, the summary's two bad values).
FABRIC_FLAGS = ("degraded_bandwidth", "route_recovery", "route_unhealthy", "access_timeout_recovery",
                "incorrect_configuration", "gfm_disconnected", "unhealthy", "limited_capacity")


def fabric_flags(mask: int | None, summary: int | None) -> dict[str, bool]:
    """FABRIC_FLAGS the driver reports (a field it reports n/a is left out), True when set."""
    fields = fabric_health(mask)
    out = {name: fields[name] == 1 for name in FABRIC_FLAGS[:4] if name in fields}
    if "incorrect_configuration" in fields:
        out["incorrect_configuration"] = fields["incorrect_configuration"] >= 2
    if "gfm_state" in fields:
        out["gfm_disconnected"] = fields["gfm_state"] == 2
    if summary in (1, 2, 3):
        out["unhealthy"], out["limited_capacity"] = summary == 2, summary == 3
    return out


@dataclass(frozen=True, slots=True)
class NvLinkSample:
    link: int
    active: bool | None
    version: int | None = None  # NVLink generation: 1..6 (decoded from NVML's enum)
    speed_mbps: int | None = None  # per direction, as NVML reports it (H100: 26562)
    remote_type: str | None = None  # "gpu" | "nvswitch" | "ibmnpu" | "unknown" | None
    remote_pci_bus_id: str | None = None  # NVML form "00000000:18:00.0"; None for switch sentinel
    tx_bytes_per_s: float | None = None
    rx_bytes_per_s: float | None = None
    errors: dict[str, int | None] = field(default_factory=dict)  # cumulative, keys NVLINK_ERROR_KINDS
    errors_delta: dict[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GpuFabric:
    """A GPU's NVSwitch fabric as NVML reports it (nvmlDeviceGetGpuFabricInfo[V]). All None: no
    fabric (NotSupported: PCIe cards, NVLink bridges, A100 HGX), or not read yet."""

    state: int | None = None  # FABRIC_STATES: 1 not started, 2 in progress, 3 completed
    status: int | None = None  # an nvmlReturn_t (0 success), meaningful once completed
    clique_id: int | None = None
    cluster_uuid: str | None = None  # "00000000-0000-0000-0000-000000000000" outside NVL72-class domains
    health_mask: int | None = None  # None: the driver's call has no mask (unversioned)
    health_summary: int | None = None  # FABRIC_SUMMARIES; None or 0: not reported (v3 only)


NO_FABRIC = GpuFabric()

@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    name: str | None = None
    uuid: str | None = None
    serial: str | None = None
    pci_bus_id: str | None = None
    lost: bool = False
    power_w: float | None = None
    power_limit_w: float | None = None  # enforced limit, after all limiters
    power_default_limit_w: float | None = None
    power_max_limit_w: float | None = None
    energy_j: float | None = None  # cumulative since driver load
    temperature_c: float | None = None
    utilization_pct: float | None = None
    throttle_reasons: tuple[str, ...] | None = ()  # None: could not be read
    pcie: PcieLink = field(default_factory=PcieLink)
    nvlink: tuple[NvLinkSample, ...] = ()
    nvlink_count: int | None = None  # links present (NVML_FI_DEV_NVLINK_LINK_COUNT)
    notes: tuple[str, ...] = ()
    # Xid numbers of the NVML Xid-critical-error events delivered this tick, in arrival order
    # (999 = an Xid NVML could not identify). Events, not state: empty on most ticks.
    xid_events: tuple[int, ...] = ()
    # The catalog's metrics that have no field of their own (nvmon/catalog/metrics.py, `IN_VALUES`:
    # clocks, framebuffer memory, memory temperature, ...), by metric name, in catalog order; None:
    # could not be read. The sample JSON writes them as keys of the GPU's object (`inline`).
    values: dict[str, int | float | None] = field(default_factory=dict, metadata={"inline": True})
    fabric: GpuFabric = NO_FABRIC  # read every few seconds (nvmon/collect/fabric.py)


@dataclass(frozen=True, slots=True)
class IbPortSample:
    device: str
    port: int
    state: str | None = None  # "ACTIVE", "DOWN", ...
    phys_state: str | None = None  # "LinkUp", "Polling", "Disabled", ...
    rate_gbps: float | None = None
    rate_name: str | None = None  # "HDR", "NDR", "EDR", ...
    link_layer: str | None = None  # "InfiniBand" | "Ethernet"
    tx_bytes_per_s: float | None = None
    rx_bytes_per_s: float | None = None
    errors: dict[str, int | None] = field(default_factory=dict)
    errors_delta: dict[str, int | None] = field(default_factory=dict)
    pcie: PcieLink = field(default_factory=PcieLink)
    pci_bus_id: str | None = None  # sysfs form "0000:18:00.0"
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PciDeviceLink:
    """A PCIe link read from sysfs for a device NVML does not cover (an NVSwitch)."""

    pci_bus_id: str
    kind: str  # "nvswitch"
    pcie: PcieLink = field(default_factory=PcieLink)


@dataclass(frozen=True, slots=True)
class Topology:
    """GPU×GPU connectivity as `nvidia-smi topo -m` shows it, plus a board class.

    class_: "nvswitch" (all-to-all through NVSwitch), "mesh" (all-to-all, direct links),
    "pairs" (GPUs bridged two by two), "partial", "none" (no active NVLink), "unknown".
    matrix[i][j]: "X" on the diagonal, "NV<n>" for n bonded NVLinks, else "NODE"/"SYS"
    (same / other NUMA node) or "PCI" when the NUMA node is unknown.
    """

    class_: str
    matrix: tuple[tuple[str, ...], ...] = ()
    nvswitch_links: tuple[int, ...] = ()  # per GPU: active links whose remote is an NVSwitch


@dataclass(frozen=True, slots=True)
class HostSample:
    hostname: str | None = None
    kernel: str | None = None
    cpu_pct: float | None = None
    mem_used_pct: float | None = None
    load1: float | None = None
    uptime_s: float | None = None


@dataclass(frozen=True, slots=True)
class NvmlStatus:
    available: bool
    error: str | None = None  # why not, e.g. "NVML Shared Library Not Found"
    driver_version: str | None = None
    nvml_version: str | None = None
    capabilities: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Sample:
    node: str
    ts: float  # unix seconds, UTC
    interval_s: float
    gpus: tuple[GpuSample, ...]
    topology: Topology
    ib: tuple[IbPortSample, ...]
    host: HostSample
    nvml: NvmlStatus
    nvswitches: tuple[PciDeviceLink, ...] = ()
    notes: tuple[str, ...] = ()
    schema: int = SCHEMA


def to_jsonable(obj: Any) -> Any:
    """Dataclasses → plain dicts/lists for JSON. `class_` is written as `class`; a field marked
    `inline` (a mapping: `GpuSample.values`) is written as keys of its object."""
    if is_dataclass(obj):
        out = {}
        for f in fields(obj):
            if f.metadata.get("inline"):  # a mapping whose keys are the object's own
                out.update(to_jsonable(getattr(obj, f.name)))
                continue
            key = "class" if f.name == "class_" else f.name
            out[key] = to_jsonable(getattr(obj, f.name))
        return out
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, float):
        return round(obj, 3)
    return obj


def sample_to_dict(sample: Sample) -> dict[str, Any]:
    d = to_jsonable(sample)
    # Contract order: schema first.
    return {"schema": d.pop("schema"), **d}
