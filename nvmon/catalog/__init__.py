"""The metric catalog: each metric declared once (`metrics`), the Prometheus families (`families`),
and the docs tables generated from both (`docs`). A leaf: imports only `nvmon.model` and the
standard library, so every layer may read it.
"""

from nvmon.catalog.families import BY_FAMILY, FAMILIES, GPU_LABELS, SCOPE_LABELS, Family
from nvmon.catalog.metrics import (
    BY_NAME,
    DISPLAY_UNITS,
    GPU_FACTS,
    GPU_NVML,
    GPU_TICK_SCALARS,
    GPU_VALUES,
    GPU_WIRE,
    GPU_WIRE_FACTS,
    GPU_WIRE_READ,
    IN_VALUES,
    METRICS,
    Encode,
    Kind,
    Metric,
    Nvml,
    Prom,
    Rollup,
    Scope,
    Static,
    display_unit,
    getter,
    of_scope,
    show,
)

__all__ = [
    "BY_FAMILY", "BY_NAME", "DISPLAY_UNITS", "FAMILIES", "GPU_FACTS", "GPU_LABELS", "GPU_NVML", "GPU_TICK_SCALARS", "GPU_VALUES", "GPU_WIRE",
    "GPU_WIRE_FACTS", "GPU_WIRE_READ", "IN_VALUES", "METRICS", "SCOPE_LABELS", "Encode", "Family", "Kind", "Metric",
    "Nvml", "Prom", "Rollup", "Scope", "Static", "display_unit", "getter", "of_scope", "show",
]
