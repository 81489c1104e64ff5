"""What the Prometheus endpoint exports: a view of the metric catalog's families (`nvmon.catalog`).

The families (name, type, help, labels, page order) are declared in `nvmon.catalog.families`; this
module keeps the names the exporter, its docs test and the Grafana dashboard test use: `METRICS`
(the collector refuses a name that is not there), the label sets, and `exported_names()`.
"""

from __future__ import annotations

from nvmon.catalog import BY_FAMILY, GPU_LABELS, SCOPE_LABELS, Family
from nvmon.catalog.compat import Line, line

MetricDef = Family  # the exporter's older name for a family
METRICS: dict[str, Family] = BY_FAMILY
__all__ = ["GPU_LABELS", "METRICS", "NVMON_GPU_LABELS", "NVMON_LABEL_NAMES", "PROCESS_METRICS", "SCOPE_LABELS",
           "MetricDef", "exported_names", "labels_of"]

# nvmon's own per-GPU families (`nvmon_gpu_*`) carry the GPU label set with `modelName` spelled
# `model_name`, so that `promtool check metrics` passes on every `nvmon_*` family (its lint wants
# snake_case). `UUID` (and `Hostname` in the 4.8.2 line) stay as dcgm-exporter spells them: they are the keys that
# join nvmon_* with DCGM_* series, and promtool accepts them (no lower-case letter before a capital).
NVMON_LABEL_NAMES = {"modelName": "model_name"}
NVMON_GPU_LABELS = tuple(NVMON_LABEL_NAMES.get(n, n) for n in GPU_LABELS)


def labels_of(family: Family, compat: Line | None = None) -> tuple[str, ...]:
    """The label names a family's series carry under a dcgm-exporter line (default: the default
    line): its scope's set, the line's driver label on DCGM_* per-GPU series, then its own labels."""
    compat = compat or line()
    own_gpu = family.scope == "GPU" and family.name.startswith("nvmon_")
    scope = tuple(map(compat.label, NVMON_GPU_LABELS if own_gpu else SCOPE_LABELS[family.scope]))
    if family.scope == "GPU" and not own_gpu and compat.driver_label:
        scope += (compat.driver_label,)
    return (*scope, *family.labels)

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
