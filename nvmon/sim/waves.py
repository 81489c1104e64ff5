"""Time math of the simulated board (nvmon.sim.board): square waves, their integrals, and sorted
disjoint [start, end) spans of time (when a fault holds) — closed forms, so a counter read at any
time costs O(1) however far the clock jumps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

INF = float("inf")
Spans = tuple[tuple[float, float], ...]  # sorted, disjoint [start, end) of a fault


def square_integral(t: float, shape: tuple[float, float, float, float], phase: float) -> float:
    """∫₀ᵗ level(s) ds for a square wave that is `hi` for the first `duty` of each period, then `lo`."""
    period, duty, hi, lo = shape

    def cum(x: float) -> float:
        n, r = divmod(x, period)
        on = duty * period
        return n * period * (duty * hi + (1 - duty) * lo) + min(r, on) * hi + max(0.0, r - on) * lo

    return cum(t + phase) - cum(phase)


def merge_spans(spans) -> Spans:
    """Sorted, disjoint [start, end) intervals covering the union of `spans`."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


def held_s(spans: Spans, t: float) -> float:
    """Seconds in [0, t] covered by the disjoint `spans`."""
    return sum(min(b, t) - a for a, b in spans if a < t)


def inside(spans: Spans, t: float) -> bool:
    return any(a <= t < b for a, b in spans)


def integral_outside(spans: Spans, t: float, cum: Callable[[float], float]) -> float:
    """∫ over [0, t] minus the disjoint `spans` of a level whose integral from 0 is `cum` (cum(0) == 0):
    the fixed pieces before `t`, plus the growing one `t` is in (none while `t` is inside a span)."""
    total, cursor = 0.0, 0.0
    for a, b in spans:
        if a >= t:
            break
        if a > cursor:
            total += cum(a) - cum(cursor)
        cursor = b
        if cursor >= t:
            return total
    return total + (cum(t) - cum(cursor))


def square_level(t: float, shape: tuple[float, float, float, float], phase: float) -> float:
    period, duty, hi, lo = shape
    return hi if ((t + phase) % period) < duty * period else lo


def _pieces(points: list[float], value: Callable[[float], Any]) -> list[tuple[float, float, Any]]:
    """[(start, end, value)] spans between sorted breakpoints (the last ends at INF), the value taken
    at each span's start; neighbours with equal values are merged into one span."""
    pieces: list[tuple[float, float, Any]] = []
    for a, b in zip(points, points[1:] + [INF]):
        v = value(a)
        if pieces and pieces[-1][2] == v:
            pieces[-1] = (pieces[-1][0], b, v)
        else:
            pieces.append((a, b, v))
    return pieces
