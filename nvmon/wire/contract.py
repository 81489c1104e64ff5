"""The MQTT wire contract's fixed parts: topics, limits, errors and the typed messages readers return.

Pure data, no I/O. `payloads` builds JSON from `Sample`s, `parse` turns bytes back into the
dataclasses below; docs/wire.md is the human-readable form of both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from nvmon.codes import SEVERITIES

SCHEMA = 1
TOPIC_ROOT = "nvmon/v1"
MAX_PAYLOAD_BYTES = 64 * 1024  # writers refuse to build, readers refuse to parse anything bigger

KINDS = ("status", "inventory", "sample", "alerts")
# kind → (QoS, retained): state that a late subscriber needs is retained; ticks are fire-and-forget.
DELIVERY: dict[str, tuple[int, bool]] = {
    "status": (1, True),
    "inventory": (1, True),
    "sample": (0, False),
    "alerts": (1, True),
}

STATUS_STATES = ("online", "offline")
ALERT_SEVERITIES = tuple(s.value for s in SEVERITIES)  # most severe first
ALERT_STATES = ("pending", "firing", "resolved")

# Bounds a reader enforces; generous for real hardware, small enough that a hostile payload
# cannot make a view allocate or draw something absurd.
MAX_NAME = 64  # node, cluster
MAX_GPUS = 64
MAX_LINKS = 64  # NVML_NVLINK_MAX_LINKS is 36 today
MAX_IB_PORTS = 64
MAX_NVSWITCHES = 64
MAX_LABELS = 64
MAX_ALERTS = 1000
MAX_TEXT = 256  # model names, bus ids, label values, versions, error strings
MAX_SUMMARY = 512
MAX_INDEX = 1023  # a GPU index
LINK_PCT_MAX = 1000  # a link "at 1000 %" means a bogus speed, not traffic
MAX_FINDINGS = 256  # warning/critical findings in one `sample` (more are cut; the alerts still hold them)
MAX_XID_EVENTS = 16  # Xid events per GPU in one `sample` (more in one tick are cut, the alert still fires)
MAX_XID = 2**32 - 1  # NVML's eventData is 64-bit; Xid numbers are small (999 = unknown)

_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")


class WireError(ValueError):
    """A payload or topic that breaks the contract. The message is one line, safe to log."""

    def __init__(self, message: str):
        # Messages quote paths and excerpts of hostile input: escape what a terminal would act on.
        safe = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message))
        super().__init__(safe[:300])


class PayloadTooLarge(WireError):
    """A writer was asked to build a payload over `MAX_PAYLOAD_BYTES`."""


def valid_name(s: object) -> bool:
    """True if `s` may be a node or cluster name: 1–64 of `[A-Za-z0-9._-]`, not `.` or `..`.

    The restriction keeps names safe as single MQTT topic levels (no `/`, `+`, `#`), as file
    names, and on a terminal.
    """
    return isinstance(s, str) and _NAME_RE.fullmatch(s) is not None and s not in (".", "..")


def topic(cluster: str, node: str, kind: str) -> str:
    """`nvmon/v1/<cluster>/<node>/<kind>`; raises ValueError on a bad name or kind."""
    if not valid_name(cluster):
        raise ValueError(f"cluster name {cluster!r}: use 1-64 of A-Z a-z 0-9 . _ -")
    if not valid_name(node):
        raise ValueError(f"node name {node!r}: use 1-64 of A-Z a-z 0-9 . _ -")
    if kind not in KINDS:
        raise ValueError(f"topic kind {kind!r}: expected one of {', '.join(KINDS)}")
    return f"{TOPIC_ROOT}/{cluster}/{node}/{kind}"


def subscription(cluster: str | None = None, node: str | None = None, kind: str | None = None) -> str:
    """A subscription filter; `None` parts become `+` (one cluster, one node, or everything)."""
    parts = [cluster or "+", node or "+", kind or "+"]
    for p, what in zip(parts[:2], ("cluster", "node")):
        if p != "+" and not valid_name(p):
            raise ValueError(f"{what} name {p!r}: use 1-64 of A-Z a-z 0-9 . _ -")
    if parts[2] != "+" and parts[2] not in KINDS:
        raise ValueError(f"topic kind {parts[2]!r}: expected one of {', '.join(KINDS)}")
    return f"{TOPIC_ROOT}/{'/'.join(parts)}"


# Shared acks and silences (nvmon.wire.control): one retained topic per cluster, one level under
# the cluster. `@` is not allowed in a node name, so the level can never be a node's, and the
# topic has 4 levels where node topics have 5: `nvmon/v1/<cluster>/+/+` filters never match it,
# and an ACL granting a node `nvmon/v1/+/%u/+` cannot reach it.
CONTROL_LEVEL = "@controls"


def cluster_topic(cluster: str, level: str) -> str:
    """`nvmon/v1/<cluster>/<level>`: a cluster-level topic (`@controls`, `@summary`)."""
    if not valid_name(cluster):
        raise ValueError(f"cluster name {cluster!r}: use 1-64 of A-Z a-z 0-9 . _ -")
    return f"{TOPIC_ROOT}/{cluster}/{level}"


def cluster_subscription(level: str, cluster: str | None = None) -> str:
    """The `level` topic of one cluster, or of every cluster (`+`)."""
    return cluster_topic(cluster, level) if cluster is not None else f"{TOPIC_ROOT}/+/{level}"


def parse_cluster_topic(t: object, level: str) -> str:
    """`nvmon/v1/<cluster>/<level>` → cluster; raises WireError."""
    s = str(t)
    parts = s.split("/") if len(s) <= 200 else []
    if len(parts) != 4 or "/".join(parts[:2]) != TOPIC_ROOT or parts[3] != level:
        raise WireError(f"not an {TOPIC_ROOT}/<cluster>/{level} topic: {s[:80]!r}")
    if not valid_name(parts[2]):
        raise WireError(f"bad cluster name in topic {s[:80]!r}")
    return parts[2]


def control_topic(cluster: str) -> str:
    """`nvmon/v1/<cluster>/@controls`: the cluster's shared acks and silences (retained, QoS 1)."""
    return cluster_topic(cluster, CONTROL_LEVEL)


def control_subscription(cluster: str | None = None) -> str:
    return cluster_subscription(CONTROL_LEVEL, cluster)


def parse_control_topic(t: object) -> str:
    return parse_cluster_topic(t, CONTROL_LEVEL)


def parse_topic(t: object) -> tuple[str, str, str]:
    """`nvmon/v1/<cluster>/<node>/<kind>` → (cluster, node, kind); raises WireError."""
    s = str(t)
    if len(s) > 200:
        raise WireError("topic too long")
    parts = s.split("/")
    if len(parts) != 5 or "/".join(parts[:2]) != TOPIC_ROOT:
        raise WireError(f"not an {TOPIC_ROOT}/<cluster>/<node>/<kind> topic: {s[:80]!r}")
    cluster, node, kind = parts[2:]
    if not valid_name(cluster) or not valid_name(node):
        raise WireError(f"bad cluster or node name in topic {s[:80]!r}")
    if kind not in KINDS:
        raise WireError(f"unknown topic kind {kind[:20]!r}")
    return cluster, node, kind


# --- what readers return ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Status:
    """`status`: the node's daemon is `online` or `offline` (the MQTT will, or a clean stop)."""

    cluster: str
    node: str
    ts: float
    state: str  # "online" | "offline"
    version: str | None
    interval_s: float | None
    reason: str | None = None  # offline: "stopped" (clean shutdown) or "lost" (the will)


@dataclass(frozen=True, slots=True)
class LinkInfo:
    link: int
    version: int | None  # NVLink generation
    speed_mbps: int | None  # per direction, as NVML reports it
    remote_type: str | None  # "gpu" | "nvswitch" | "ibmnpu" | "unknown"
    remote_bus_id: str | None


@dataclass(frozen=True, slots=True)
class PcieInfo:
    gen: int | None = None
    width: int | None = None
    max_gen: int | None = None
    max_width: int | None = None
    device_max_gen: int | None = None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    model: str | None
    uuid: str | None
    serial: str | None
    bus_id: str | None
    power_default_limit_w: float | None
    power_max_limit_w: float | None
    pcie: PcieInfo
    link_count: int | None
    links: tuple[LinkInfo, ...]
    # The catalog's static per-GPU metrics the inventory carries (GPU_WIRE_FACTS: clock maxima,
    # framebuffer size), by metric name, in the metric's units; absent when not sent or not known.
    facts: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class IbInfo:
    device: str
    port: int
    link_layer: str | None
    rate_gbps: float | None
    rate_name: str | None
    bus_id: str | None
    pcie: PcieInfo


@dataclass(frozen=True, slots=True)
class SwitchInfo:
    bus_id: str
    kind: str
    pcie: PcieInfo


@dataclass(frozen=True, slots=True)
class Inventory:
    """`inventory`: the node's static facts. `layout` matches `Tick.layout` of samples it describes."""

    cluster: str
    node: str
    ts: float
    rack: str | None
    labels: dict[str, str]
    layout: str
    gpus: tuple[GpuInfo, ...]
    topology_class: str
    topology_matrix: tuple[tuple[str, ...], ...]
    nvswitch_links: tuple[int, ...]
    ib: tuple[IbInfo, ...]
    nvswitches: tuple[SwitchInfo, ...]
    spec: dict  # expected spec: plain JSON values, bounded in size by the payload limit
    hostname: str | None
    kernel: str | None
    driver_version: str | None
    nvml_version: str | None
    nvml_error: str | None
    # The node's NVLink domain as its GPUs' fabric reports it (None: no fabric reported). A cluster
    # UUID that is not all zeros names a multi-node (NVL72-class) domain: `cluster_uuid` then.
    fabric_cluster_uuid: str | None = None
    fabric_clique_id: int | None = None

    @property
    def cluster_uuid(self) -> str | None:
        """The multi-node NVLink domain this node belongs to, for grouping nodes; None outside one."""
        u = self.fabric_cluster_uuid
        return u if u is not None and u != ZERO_CLUSTER_UUID else None


ZERO_CLUSTER_UUID = "00000000-0000-0000-0000-000000000000"  # an HGX board's: no multi-node domain


@dataclass(frozen=True, slots=True)
class GpuTick:
    """One GPU in one `sample`. Rates in bytes/s; `None` = could not be read (or GPU lost)."""

    index: int
    lost: bool
    power_w: float | None
    power_limit_w: float | None
    temperature_c: float | None
    utilization_pct: float | None
    throttle_reasons: tuple[str, ...] | None  # None: unreadable
    pcie_gen: int | None
    pcie_width: int | None
    pcie_tx_bytes_per_s: int | None
    pcie_rx_bytes_per_s: int | None
    pcie_replay_delta: int  # rise of the replay counter this tick (0 if it did not rise)
    nvlink_tx_bytes_per_s: int | None  # exact sum over links
    nvlink_rx_bytes_per_s: int | None
    link_ref_mbps: int | None  # the 100 % of link_tx_pct / link_rx_pct, MB/s per direction
    link_tx_pct: tuple[int | None, ...]  # index = link number
    link_rx_pct: tuple[int | None, ...]
    links_down: tuple[int, ...]
    links_unknown: tuple[int, ...]  # link state could not be read
    link_speed_mbps: dict[int, int | None]  # up links whose speed differs from link_ref_mbps
    link_errors: dict[int, dict[str, int]]  # link → {kind: positive delta}
    xid_events: tuple[int, ...] = ()  # Xid numbers NVML delivered this tick (events, usually none)
    # The catalog's metrics read through it (nvmon.catalog GPU_WIRE_READ: clocks, framebuffer, memory
    # temperature, ...), by metric name; a key the node did not send is missing. Read-only.
    values: Mapping[str, int | float | None] = field(default_factory=dict)

    def link_active(self, link: int) -> bool | None:
        if link in self.links_down:
            return False
        return None if link in self.links_unknown else True

    def link_bytes_per_s(self, link: int) -> tuple[float | None, float | None]:
        """(tx, rx) of one link in bytes/s, from its percentages of `link_ref_mbps` (±0.5 % of it).

        Every link's percentage is of the GPU's reference speed, even a link trained slower
        (listed in `link_speed_mbps`), so that percentages compare across links.
        """
        ref = self.link_ref_mbps
        out: list[float | None] = []
        for arr in (self.link_tx_pct, self.link_rx_pct):
            v = arr[link] if 0 <= link < len(arr) else None
            out.append(None if v is None or ref is None else v * ref * 1e4)  # % × MB/s → B/s
        return out[0], out[1]


@dataclass(frozen=True, slots=True)
class IbTick:
    index: int  # position in Inventory.ib
    rate_gbps: float | None
    tx_bytes_per_s: int | None
    rx_bytes_per_s: int | None
    state: str | None  # "ACTIVE" unless the sample says otherwise
    phys_state: str | None
    errors_delta: dict[str, int]  # kind → positive delta


@dataclass(frozen=True, slots=True)
class TickFinding:
    """One warning or critical finding of the node's audit of this tick (`nvmon.audit.Finding`,
    without its message): what a view marks, as the node judged it."""

    code: str  # e.g. "pcie.width"
    severity: str  # ALERT_SEVERITIES
    gpu: int | None = None
    link: int | None = None
    device: str | None = None  # an IB device (its port, or its HCA when `port` is None)
    port: int | None = None


@dataclass(frozen=True, slots=True)
class Tick:
    """`sample`: one tick of one node."""

    cluster: str
    node: str
    ts: float
    interval_s: float
    layout: str
    gpus: tuple[GpuTick, ...]
    ib: tuple[IbTick, ...]
    cpu_pct: float | None
    mem_used_pct: float | None
    load1: float | None
    nvml_error: str | None
    findings: tuple[TickFinding, ...] = ()  # the node's audit of this tick (none from an older daemon)


@dataclass(frozen=True, slots=True)
class Alert:
    """One active alert as published on `alerts`. `fingerprint` is its stable identity."""

    fingerprint: str
    code: str  # rule / finding code, e.g. "nvlink.link_down"
    severity: str  # ALERT_SEVERITIES
    state: str  # ALERT_STATES
    summary: str
    since: float  # unix seconds the alert entered its state
    gpu: int | None = None
    link: int | None = None
    device: str | None = None
    port: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    starts_at: float | None = None  # unix s the episode began (acks name it); None from older nodes


@dataclass(frozen=True, slots=True)
class AlertSet:
    """`alerts`: the node's full active set; `omitted` alerts did not fit the size limit."""

    cluster: str
    node: str
    ts: float
    alerts: tuple[Alert, ...]
    omitted: int = 0


Message = Status | Inventory | Tick | AlertSet
