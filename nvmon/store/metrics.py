"""The metrics `nvmon history` can show, as its queries need them: built from the catalog
(`nvmon.catalog`, every metric with `history=True`), which also feeds `--help` and docs/store.md.

Each metric names where its value lives in the raw tables and in the 1-minute rollups. Rollup
columns are by statistic: "min", "avg", "max", or "sum" (counters summed over the minute); a
metric with no rollup column for a statistic simply lacks it there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nvmon import catalog
from nvmon.catalog import Scope

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


_KIND = {Scope.GPU: "gpu", Scope.NVLINK: "link", Scope.IB_PORT: "ib", Scope.NODE: "node"}


def _from_catalog(m: catalog.Metric) -> Metric:
    raw = m.history_raw or (m.column if m.scope is not Scope.NVLINK else None)
    return Metric(m.name, m.label, _KIND[m.scope], m.unit, m.doc, raw, m.rollup_stats(), decode=m.decode)


METRICS: tuple[Metric, ...] = tuple(_from_catalog(m) for m in catalog.METRICS if m.history)

BY_NAME = {m.name: m for m in METRICS}
DEFAULT_METRICS = ("power_w", "temperature_c", "utilization_pct", "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")

# Tables per kind: (raw, rollup). Link metrics read the GPU tables' blobs and masks.
TABLES = {
    "gpu": ("gpu_ticks", "gpu_minutes"),
    "link": ("gpu_ticks", "gpu_minutes"),
    "ib": ("ib_ticks", "ib_minutes"),
    "node": ("ticks", "node_minutes"),
}
