"""Every Prometheus family the daemon's `/metrics` exports: name, type, help, labels, in page order.

`DCGM_*` names are dcgm-exporter's, with its Prometheus type and help text (from its
`etc/default-counters.csv` / `etc/dcp-metrics-included.csv` and DCGM's `dcgm_fields.h`), so
dashboards and alert rules written for dcgm-exporter work unchanged. Where dcgm-exporter's type
disagrees with what the value is (its NVLink "bandwidth total" is typed counter but carries a
rate), its type is kept and the value follows its semantics: docs/prometheus.md explains each.
Everything else is nvmon's own, under `nvmon_`, in base units, counters ending in `_total`.

Each family has the label set of its scope (`SCOPE_LABELS`) plus its own `labels`. A family that
names a catalog `metric` is filled from that metric's Sample value, per GPU, by the exporter's one
generic loop; the others are computed in `nvmon.export.collector`. A metric may declare its family
itself (`Metric.prom`, nvmon.catalog.metrics): it joins `DECLARED`, and no entry is needed here.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvmon.catalog.metrics import METRICS

# The host label as the default compat line spells it; another line respells it (nvmon.catalog.compat).
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname")  # dcgm-exporter's, its order
SCOPE_LABELS = {
    "GPU": GPU_LABELS,
    "LINK": ("gpu", "UUID", "hostname", "link"),  # shorter: 144 series per node; join on UUID for the rest
    "IB": ("hostname", "device", "port"),  # device: "mlx5_0" (node_exporter's InfiniBand labels)
    "PCI": ("hostname", "kind", "device", "pci_bus_id"),  # kind: "hca" | "nvswitch"
    "NODE": ("hostname",),
}


@dataclass(frozen=True, slots=True)
class Family:
    name: str  # the family name as it appears on `# TYPE` (counters: with `_total` for nvmon_)
    type: str  # "gauge" | "counter" | "summary"
    help: str
    labels: tuple[str, ...]  # label names beyond the label set's, e.g. ("link",)
    scope: str  # a key of SCOPE_LABELS
    # The catalog metric whose Sample value fills this family, one series per GPU, divided by
    # `divisor` (units as dcgm-exporter has them); None: the exporter computes it.
    metric: str | None = None
    divisor: float | None = None


def _m(name: str, type_: str, scope: str, help_: str, *labels: str, metric: str | None = None,
       divisor: float | None = None) -> Family:
    return Family(name, type_, help_, labels, scope, metric, divisor)


# dcgm-exporter compatible, per GPU.
DCGM = (
    _m("DCGM_FI_DEV_POWER_USAGE", "gauge", "GPU", "Power draw (in W).", metric="power_w"),
    _m("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "gauge", "GPU",
       "Effective power limit that the driver enforces after taking into account all limiters (in W).",
       metric="power_limit_w"),
    _m("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF", "gauge", "GPU", "Default power management limit for the device (in W).",
       metric="power_default_limit_w"),
    _m("DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", "gauge", "GPU", "Maximum power management limit for the device (in W).",
       metric="power_max_limit_w"),
    _m("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "GPU",
       "Total energy consumption since boot (in mJ)."),
    _m("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU", "GPU temperature (in C).", metric="temperature_c"),
    _m("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU", "GPU utilization (in %).", metric="utilization_pct"),
    _m("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "GPU",
       "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*)."),
    _m("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "GPU",
       "Current clock throttle reasons (bitmask of DCGM_CLOCKS_THROTTLE_REASON_*); the pre-DCGM-3.3 name."),
    _m("DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "GPU", "PCIe Current Link Generation.", metric="pcie_gen"),
    _m("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "GPU", "PCIe Current Link Width.", metric="pcie_width"),
    _m("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "gauge", "GPU", "PCIe Max Link Generation.", metric="pcie_max_gen"),
    _m("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "gauge", "GPU", "PCIe Max Link Width.", metric="pcie_max_width"),
    _m("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "GPU", "Total number of PCIe retries.",
       metric="pcie_replay_errors"),
    _m("DCGM_FI_DEV_XID_ERRORS", "gauge", "GPU", "Value of the last XID error encountered.", "err_code", "err_msg"),
    _m("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "counter", "GPU",
       "Total number of bytes transmitted through PCIe TX (in KB) via NVML.",
       metric="pcie_tx_bytes_per_s", divisor=1024),
    _m("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "counter", "GPU",
       "Total number of bytes received through PCIe RX (in KB) via NVML.", metric="pcie_rx_bytes_per_s", divisor=1024),
    _m("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "GPU",
       "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - "
       "in bytes per second.", metric="pcie_tx_bytes_per_s"),
    _m("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "GPU",
       "The rate of data received over the PCIe bus - including both protocol headers and data payloads - "
       "in bytes per second.", metric="pcie_rx_bytes_per_s"),
    _m("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "GPU",
       "The rate of data not including protocol headers transmitted over NVLink (in B/s)."),
    _m("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "GPU",
       "The rate of data not including protocol headers received over NVLink (in B/s)."),
    _m("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "GPU",
       "Total number of NVLink bandwidth counters for all lanes."),
    _m("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "GPU",
       "Total number of NVLink flow-control CRC errors."),
    _m("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "GPU", "Total number of NVLink data CRC errors."),
    _m("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "GPU", "Total number of NVLink retries."),
    _m("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "GPU", "Total number of NVLink recovery errors."),
)

# The families catalog metrics declare on themselves (`Metric.prom`), per GPU, after dcgm-exporter's
# group: in catalog order, except that the first eight keep the places nvmon 2's page gave them (so
# pages stay byte-identical; Prometheus itself does not care).
_KEPT_ORDER = ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_FB_FREE",
               "DCGM_FI_DEV_FB_USED", "nvmon_gpu_sm_clock_max_hertz", "nvmon_gpu_mem_clock_max_hertz",
               "nvmon_gpu_fb_total_bytes")


def _declared() -> tuple[Family, ...]:
    fams = [Family(m.prom.name, m.prom.type, m.prom.help, (), "GPU", m.name, m.prom.divisor)
            for m in METRICS if m.prom is not None]
    kept = {name: i for i, name in enumerate(_KEPT_ORDER)}
    return tuple(sorted(fams, key=lambda f: kept.get(f.name, len(kept))))  # stable: catalog order after


DECLARED = _declared()

NVMON = (
    # node
    _m("nvmon_node_info", "gauge", "NODE", "Always 1; the node's nvmon version, cluster, rack and driver as labels.",
       "cluster", "rack", "version", "driver_version", "nvml_version"),
    _m("nvmon_nvml_up", "gauge", "NODE", "1 when NVML (the GPU driver) could be opened, else 0."),
    _m("nvmon_sample_timestamp_seconds", "gauge", "NODE",
       "Unix time of the sample this scrape was rendered from (staleness: time() minus this)."),
    # GPU
    _m("nvmon_gpu_lost", "gauge", "GPU", "1 when the GPU has fallen off the bus (NVML: GPU is lost)."),
    _m("nvmon_gpu_clocks_event_reason", "gauge", "GPU",
       "1 while this clock event (throttle) reason is active; absent when inactive or unreadable.", "reason"),
    _m("nvmon_gpu_pcie_device_max_link_gen", "gauge", "GPU",
       "Highest PCIe generation the GPU itself supports (DCGM_FI_DEV_PCIE_MAX_LINK_GEN is what GPU and slot allow).",
       metric="pcie_device_max_gen"),
    _m("nvmon_gpu_fabric_health", "gauge", "GPU",
       "1 while this GPU fabric health field reports trouble, 0 while it reports none; absent when the driver "
       "does not report it (field: degraded_bandwidth, route_recovery, route_unhealthy, access_timeout_recovery, "
       "incorrect_configuration, gfm_disconnected, unhealthy, limited_capacity).", "field"),
    _m("nvmon_gpu_nvlink_links", "gauge", "GPU", "NVLink links present on the GPU (NVML_FI_DEV_NVLINK_LINK_COUNT)."),
    _m("nvmon_gpu_nvlink_active_links", "gauge", "GPU", "NVLink links of the GPU that are active."),
    _m("nvmon_gpu_nvlink_min_speed_bytes_per_second", "gauge", "GPU",
       "Slowest active NVLink of the GPU, per direction as NVML reports it (H100: 26562 MB/s); "
       "`nvmon audit` names the link (nvlink.speed)."),
    # per NVLink link
    _m("nvmon_nvlink_up", "gauge", "LINK", "1 when the NVLink link is active, 0 when inactive; absent when unknown."),
    _m("nvmon_nvlink_tx_bytes_total", "counter", "LINK",
       "NVLink payload transmitted since the daemon started (the per-tick rates integrated)."),
    _m("nvmon_nvlink_rx_bytes_total", "counter", "LINK",
       "NVLink payload received since the daemon started (the per-tick rates integrated)."),
    _m("nvmon_nvlink_errors_total", "counter", "LINK",
       "NVLink errors of the link as the driver counts them, all kinds together (CRC flit, CRC data, replay, "
       "recovery; DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL split them by kind per GPU)."),
    # InfiniBand
    _m("nvmon_ib_port_up", "gauge", "IB", "1 when the port is ACTIVE and LinkUp, else 0."),
    _m("nvmon_ib_port_state", "gauge", "IB",
       "Always 1; the port's logical and physical state and link layer as labels.",
       "state", "phys_state", "link_layer"),
    _m("nvmon_ib_port_rate_bytes_per_second", "gauge", "IB", "Port link rate (HDR 200 Gb/s = 25e9 bytes/s)."),
    _m("nvmon_ib_port_tx_bytes_total", "counter", "IB",
       "Bytes transmitted since the daemon started (the per-tick rates integrated)."),
    _m("nvmon_ib_port_rx_bytes_total", "counter", "IB",
       "Bytes received since the daemon started (the per-tick rates integrated)."),
    _m("nvmon_ib_port_errors_total", "counter", "IB",
       "Port error counter from sysfs (kind: symbol_error, link_downed, port_rcv_errors, link_error_recovery, "
       "port_xmit_discards).", "kind"),
    # PCIe links of HCAs and NVSwitches (GPUs: the DCGM_FI_DEV_PCIE_* metrics)
    _m("nvmon_pcie_link_gen", "gauge", "PCI", "Current PCIe generation of an HCA or NVSwitch."),
    _m("nvmon_pcie_link_width", "gauge", "PCI", "Current PCIe width (lanes) of an HCA or NVSwitch."),
    _m("nvmon_pcie_max_link_gen", "gauge", "PCI", "Highest PCIe generation device and slot allow."),
    _m("nvmon_pcie_max_link_width", "gauge", "PCI", "Widest PCIe link device and slot allow."),
    # topology
    _m("nvmon_topology_class", "gauge", "NODE",
       "1 for the board's NVLink topology class (nvswitch, mesh, pairs, partial, none, unknown), 0 for the others.",
       "class"),
    _m("nvmon_topology_nvlink_pairs", "gauge", "NODE", "GPU pairs joined by at least one active NVLink."),
    _m("nvmon_topology_pair_nvlinks", "gauge", "NODE",
       "Bonded NVLinks between two GPUs (gpu < peer_gpu) as nvidia-smi topo -m shows them (NV18 = 18), 0 when none.",
       "gpu", "peer_gpu"),
    _m("nvmon_topology_nvswitch_links", "gauge", "GPU", "Active NVLinks of the GPU whose far end is an NVSwitch."),
    # alerts and audit
    _m("nvmon_alerts_active", "gauge", "NODE",
       "The node's active alerts by rule code, severity and state (pending, firing); 0 for every enabled rule "
       "without one.", "code", "severity", "state"),
    _m("nvmon_hook_notifications_total", "counter", "NODE",
       "Alert notifications per on-call hook: sent, failed (after retries), dropped (queue full).",
       "hook", "type", "result"),
    _m("nvmon_audit_findings", "gauge", "NODE",
       "Current `nvmon audit` findings of this code (0 when none); severity is the code's fixed severity.",
       "code", "severity"),
    _m("nvmon_audit_verdict", "gauge", "NODE", "1 for the current audit verdict (ok, warning, critical, unknown).",
       "verdict"),
    # the daemon itself
    _m("nvmon_daemon_ticks_total", "counter", "NODE", "Samples taken."),
    _m("nvmon_daemon_missed_ticks_total", "counter", "NODE", "Tick slots skipped because sampling ran late."),
    _m("nvmon_daemon_sample_errors_total", "counter", "NODE", "Ticks lost to a collector error."),
    _m("nvmon_daemon_sample_duration_seconds", "summary", "NODE", "Time spent taking samples (NVML, sysfs, host)."),
    _m("nvmon_daemon_last_sample_duration_seconds", "gauge", "NODE", "Time the latest sample took."),
    _m("nvmon_daemon_stored_ticks_total", "counter", "NODE", "Samples written to the SQLite history."),
    _m("nvmon_daemon_store_errors_total", "counter", "NODE", "Failed writes to the SQLite history (retried)."),
    _m("nvmon_daemon_store_dropped_total", "counter", "NODE", "Samples never stored (backlog full while failing)."),
    _m("nvmon_daemon_store_resets_total", "counter", "NODE",
       "Times the SQLite history was found deleted, replaced or corrupt and a new one started.", "reason"),
    _m("nvmon_daemon_wire_dropped_total", "counter", "NODE", "Samples replaced in the MQTT queue by newer ones."),
    _m("nvmon_daemon_mqtt_connected", "gauge", "NODE", "1 while connected to the MQTT broker (absent: no broker)."),
    _m("nvmon_daemon_mqtt_published_total", "counter", "NODE", "Sample messages handed to the MQTT broker."),
    _m("nvmon_daemon_mqtt_errors_total", "counter", "NODE", "Failed MQTT connection attempts and lost connections."),
    _m("nvmon_daemon_mqtt_dropped_total", "counter", "NODE", "Samples never published (away, or superseded)."),
    _m("nvmon_exporter_render_seconds", "gauge", "NODE", "Time the previous rendering of this page took."),
    _m("nvmon_exporter_renders_total", "counter", "NODE", "Renderings of this page (at most one per sample)."),
    _m("nvmon_exporter_render_cpu_seconds_total", "counter", "NODE",
       "CPU time spent rendering and compressing this page (the exporter's cost to the daemon)."),
)

FAMILIES: tuple[Family, ...] = DCGM + DECLARED + NVMON
BY_FAMILY: dict[str, Family] = {f.name: f for f in FAMILIES}
