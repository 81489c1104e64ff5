"""What the Prometheus endpoint exports: a view of the metric catalog's families (`nvmon.catalog`).

The families (name, type, help, labels, page order) are declared in `nvmon.catalog.families`; this
module keeps the names the exporter, its docs test and the Grafana dashboard test use: `METRICS`
(the collector refuses a name that is not there), the label sets, and `exported_names()`.
"""

from __future__ import annotations

from nvmon.catalog import BY_FAMILY, GPU_LABELS, SCOPE_LABELS, Family

MetricDef = Family  # the exporter's older name for a family
METRICS: dict[str, Family] = BY_FAMILY
__all__ = ["GPU_LABELS", "METRICS", "PROCESS_METRICS", "SCOPE_LABELS", "MetricDef", "exported_names"]

# prometheus_client's ProcessCollector (Linux /proc): the daemon's own CPU, memory and files.
PROCESS_METRICS = (
    "process_virtual_memory_bytes", "process_resident_memory_bytes", "process_start_time_seconds",
    "process_cpu_seconds_total", "process_open_fds", "process_max_fds",
)


def exported_names() -> set[str]:
    """Every metric name a query may use: family names plus summary `_sum`/`_count` series."""
    names = set(METRICS) | set(PROCESS_METRICS)
    for m in METRICS.values():
        if m.type == "summary":
            names |= {m.name + "_sum", m.name + "_count"}
    return names
