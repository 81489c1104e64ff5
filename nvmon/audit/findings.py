"""The audit's vocabulary: findings, reports, thresholds, and the small helpers every check shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nvmon.codes import NODE_CODES, Severity
from nvmon.model import GpuSample
from nvmon.specs import IB_RATE_NAMES

AUDIT_SCHEMA = 1  # version of the `nvmon audit --json` contract
EXIT_CODES = {"ok": 0, "warning": 1, "critical": 2, "unknown": 3}  # Nagios plugin convention

# Throttle (clocks event) reason names as the collector spells them.
# Each reason belongs to one code: power.cap (software cap), power.brake (HW slowdown from the
# power-brake signal, or with no cause named), thermal (HW slowdown NVML says is thermal, and SW).
POWER_THROTTLES = ("sw_power_cap",)
BRAKE_THROTTLES = ("hw_power_brake", "hw_slowdown")
THERMAL_THROTTLES = ("sw_thermal", "hw_thermal")

RULES: dict[str, Severity] = {code: c.severity for code, c in NODE_CODES.items()}  # the stable set


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Tunable limits. Ratios are fractions of the spec (or enforced limit) value."""

    busy_util_pct: float = 10.0
    busy_pcie_bytes_per_s: float = 1e9  # PCIe tx+rx
    busy_nvlink_bytes_per_s: float = 1e9  # NVLink tx+rx summed over links
    temperature_c: float = 87.0
    power_limit_ratio: float = 0.95  # enforced limit below this share of spec → power.limit
    power_cap_ratio: float = 0.98  # draw at this share of the enforced limit → power.cap
    nvlink_speed_ratio: float = 0.98  # link speed below this share of spec → nvlink.speed


@dataclass(frozen=True, slots=True)
class Finding:
    """One judged condition. `observed`/`expected` are compact values for machines and people."""

    code: str
    severity: str  # "info" | "warning" | "critical"
    message: str
    gpu: int | None = None
    link: int | None = None
    device: str | None = None  # IB device, e.g. "mlx5_0"
    port: int | None = None
    observed: Any = None
    expected: Any = None
    xid: int | None = None  # gpu.xid: the Xid number (also in `observed`), part of the identity


@dataclass(frozen=True, slots=True)
class AuditReport:
    node: str
    spec: dict[str, Any]  # the profile used: per-model spec values, node expectations
    verdict: str  # "ok" | "warning" | "critical" | "unknown"
    findings: tuple[Finding, ...]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


def _finding(code: str, message: str, **where: Any) -> Finding:
    return Finding(code=code, severity=RULES[code], message=message, **where)


def _sum(*values: float | None) -> float:
    return sum(v for v in values if v is not None)


def nvlink_bytes_per_s(gpu: GpuSample) -> float:
    """NVLink tx+rx of a GPU summed over its links (unknown rates count as 0)."""
    return sum(_sum(link.tx_bytes_per_s, link.rx_bytes_per_s) for link in gpu.nvlink)


def is_busy(gpu: GpuSample, thresholds: Thresholds = Thresholds()) -> bool:
    """True when the GPU is doing work, so idle power-saving (PCIe gen downshift) is not an excuse."""
    return (
        (gpu.utilization_pct is not None and gpu.utilization_pct >= thresholds.busy_util_pct)
        or _sum(gpu.pcie.tx_bytes_per_s, gpu.pcie.rx_bytes_per_s) >= thresholds.busy_pcie_bytes_per_s
        or nvlink_bytes_per_s(gpu) >= thresholds.busy_nvlink_bytes_per_s
    )


def _rising(deltas: dict[str, int | None]) -> dict[str, int]:
    return {k: v for k, v in deltas.items() if v is not None and v > 0}


def _fmt_w(w: float | None) -> str:
    return "? W" if w is None else f"{w:.0f} W"


def _fmt_rate(gbps: float | None) -> str:
    if gbps is None:
        return "unknown rate"
    name = IB_RATE_NAMES.get(float(gbps))
    return f"{gbps:g} Gb/s" + (f" ({name})" if name else "")
