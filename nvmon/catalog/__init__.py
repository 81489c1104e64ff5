"""The metric catalog: each metric declared once (`metrics`), the Prometheus families (`families`),
and the docs tables generated from both (`docs`). A leaf: imports only `nvmon.model` and the
standard library, so every layer may read it.
"""

from nvmon.catalog.families import BY_FAMILY, FAMILIES, GPU_LABELS, SCOPE_LABELS, Family
from nvmon.catalog.metrics import (
    BY_NAME,
    GPU_FACTS,
    GPU_TICK_SCALARS,
    GPU_WIRE,
    GPU_WIRE_FACTS,
    GPU_WIRE_READ,
    METRICS,
    Encode,
    Kind,
    Metric,
    Rollup,
    Scope,
    Static,
    of_scope,
)

__all__ = [
    "BY_FAMILY", "BY_NAME", "FAMILIES", "GPU_FACTS", "GPU_LABELS", "GPU_TICK_SCALARS", "GPU_WIRE", "GPU_WIRE_FACTS",
    "GPU_WIRE_READ", "METRICS", "SCOPE_LABELS", "Encode", "Family", "Kind", "Metric", "Rollup", "Scope", "Static",
    "of_scope",
]
