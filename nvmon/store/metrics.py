"""The metrics `nvmon history` can show: one table, feeding the queries, `--help` and docs/store.md.

Each metric names where its value lives in the raw tables and in the 1-minute rollups. Rollup
columns are by statistic: "min", "avg", "max", or "sum" (counters summed over the minute); a
metric with no rollup column for a statistic simply lacks it there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("gpu", "link", "ib", "node")  # one output table each; rows keyed by time and...
KEYS = {"gpu": ("gpu",), "link": ("gpu", "link"), "ib": ("device", "port"), "node": ()}


@dataclass(frozen=True)
class Metric:
    name: str
    short: str  # header in the table view (units are added)
    kind: str  # one of KINDS
    unit: str  # "B/s", "W", "°C", "%", "count", "" ...
    description: str
    raw: str | None  # SQL expression over the raw table (link metrics: decoded in Python)
    rollup: dict[str, str] = field(default_factory=dict)  # statistic → SQL expression over the rollup table
    decode: str | None = None  # "throttle", "ib_state", "ib_phys", "links" (mask → link numbers)


def _mma(col: str) -> dict[str, str]:
    return {"min": f"{col}_min", "avg": f"{col}_avg", "max": f"{col}_max"}


METRICS: tuple[Metric, ...] = (
    Metric("power_w", "power", "gpu", "W", "board power draw (whole watts)", "power_w", _mma("power_w")),
    Metric("power_limit_w", "limit", "gpu", "W", "enforced power limit", "power_limit_w",
           {"min": "power_limit_w_min", "max": "power_limit_w_max"}),
    Metric("energy_j", "energy", "gpu", "J", "energy counter since driver load (raw ticks only)", "energy_j"),
    Metric("temperature_c", "temp", "gpu", "°C", "GPU temperature", "temperature_c", _mma("temperature_c")),
    Metric("utilization_pct", "util", "gpu", "%", "GPU utilization", "utilization_pct", _mma("utilization_pct")),
    Metric("throttle", "throttle", "gpu", "", "clock throttle reasons (rollups: any during the minute)",
           "throttle_mask",
           {"any": "throttle_mask"}, decode="throttle"),
    Metric("lost", "lost", "gpu", "", "GPU fell off the bus (rollups: ticks lost in the minute)", "lost",
           {"sum": "lost_samples"}),
    Metric("pcie_gen", "gen", "gpu", "", "current PCIe generation (drops at idle by design)", "pcie_gen",
           {"min": "pcie_gen_min", "max": "pcie_gen_max"}),
    Metric("pcie_width", "width", "gpu", "lanes", "current PCIe link width", "pcie_width",
           {"min": "pcie_width_min", "max": "pcie_width_max"}),
    Metric("pcie_tx_bytes_per_s", "pcie tx", "gpu", "B/s", "PCIe transmit rate", "pcie_tx_bytes_per_s",
           _mma("pcie_tx_bytes_per_s")),
    Metric("pcie_rx_bytes_per_s", "pcie rx", "gpu", "B/s", "PCIe receive rate", "pcie_rx_bytes_per_s",
           _mma("pcie_rx_bytes_per_s")),
    Metric("pcie_replay_delta", "replays", "gpu", "count", "PCIe replays in the interval", "pcie_replay_delta",
           {"sum": "pcie_replay_delta"}),
    Metric("nvlink_active", "links up", "gpu", "links", "active NVLinks", "nvlink_active",
           {"min": "nvlink_active_min", "max": "nvlink_active_max"}),
    Metric("nvlink_down", "down", "gpu", "links", "NVLinks known down (rollups: down at any time in the minute)",
           "nvlink_down_mask", {"any": "nvlink_down_mask"}, decode="links"),
    Metric("nvlink_tx_bytes_per_s", "nvl tx", "gpu", "B/s", "NVLink transmit, all links", "nvlink_tx_bytes_per_s",
           _mma("nvlink_tx_bytes_per_s")),
    Metric("nvlink_rx_bytes_per_s", "nvl rx", "gpu", "B/s", "NVLink receive, all links", "nvlink_rx_bytes_per_s",
           _mma("nvlink_rx_bytes_per_s")),
    Metric("nvlink_errors_delta", "nvl errs", "gpu", "count", "NVLink error counts in the interval (all kinds, links)",
           "nvlink_errors_delta", {"sum": "nvlink_errors_delta"}),
    Metric("link_tx_bytes_per_s", "tx", "link", "B/s", "one NVLink's transmit rate (1 MB/s steps)", None,
           {"avg": "nvlink_tx_mb_avg", "max": "nvlink_tx_mb_max"}),
    Metric("link_rx_bytes_per_s", "rx", "link", "B/s", "one NVLink's receive rate (1 MB/s steps)", None,
           {"avg": "nvlink_rx_mb_avg", "max": "nvlink_rx_mb_max"}),
    Metric("link_active", "active", "link", "", "link state: 1 active, 0 down (rollups: 0 if down at any time)", None,
           {"min": "nvlink_down_mask"}),
    Metric("ib_state", "state", "ib", "", "InfiniBand port state (ACTIVE, DOWN, ...)", "state", decode="ib_state"),
    Metric("ib_phys_state", "phys", "ib", "", "physical state (LinkUp, Polling, Disabled, ...)", "phys_state",
           decode="ib_phys"),
    Metric("ib_active", "active", "ib", "", "1 when ACTIVE (rollups: fraction of the minute)", "(state = 4)",
           {"avg": "round(1.0 * active_samples / samples, 3)"}),
    Metric("ib_rate_gbps", "rate", "ib", "Gb/s", "port rate (HDR 200, NDR 400)", "rate_gbps", _mma("rate_gbps")),
    Metric("ib_tx_bytes_per_s", "tx", "ib", "B/s", "port transmit rate", "tx_bytes_per_s", _mma("tx_bytes_per_s")),
    Metric("ib_rx_bytes_per_s", "rx", "ib", "B/s", "port receive rate", "rx_bytes_per_s", _mma("rx_bytes_per_s")),
    Metric("ib_errors_delta", "errs", "ib", "count", "port error counts in the interval (all kinds)", "errors_delta",
           {"sum": "errors_delta"}),
    Metric("node_power_w", "power", "node", "W", "sum of GPU power", "gpu_power_w", _mma("gpu_power_w")),
    Metric("gpus_lost", "lost", "node", "", "GPUs lost", "gpus_lost", {"max": "gpus_lost_max"}),
    Metric("cpu_pct", "cpu", "node", "%", "host CPU use", "cpu_pct", _mma("cpu_pct")),
    Metric("mem_used_pct", "mem", "node", "%", "host memory use", "mem_used_pct", _mma("mem_used_pct")),
    Metric("load1", "load1", "node", "", "host 1-minute load average", "load1", _mma("load1")),
)

BY_NAME = {m.name: m for m in METRICS}
DEFAULT_METRICS = ("power_w", "temperature_c", "utilization_pct", "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")

# Tables per kind: (raw, rollup). Link metrics read the GPU tables' blobs and masks.
TABLES = {
    "gpu": ("gpu_ticks", "gpu_minutes"),
    "link": ("gpu_ticks", "gpu_minutes"),
    "ib": ("ib_ticks", "ib_minutes"),
    "node": ("ticks", "node_minutes"),
}
