"""Cumulative hardware counters → rates and deltas, once, at the edge.

Hardware counters go backwards (driver reload, GPU reset, `perfquery -x -R`), wrap (NVML's PCIe
byte counters "can be wrapped"), or saturate (legacy 32-bit IB PMA counters stick at all-ones).
None of these may turn into a negative or absurd rate: such an interval yields `None`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable


@dataclass(slots=True)
class _Last:
    value: int
    ts: float


class CounterTracker:
    """Remembers the last reading of each counter (by key) and turns a new reading into a delta.

    `width_bits`: counter width when known. For `saturates=True` counters (IB PMA), a reading at
    the all-ones maximum means "stuck", so the delta is unknown. For wrapping counters, a
    backwards step is a wrap only if the width is known and the implied delta is plausible
    (less than half the range); otherwise it is a reset.
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[Hashable, _Last] = {}

    def delta(
        self,
        key: Hashable,
        value: int | None,
        ts: float,
        *,
        width_bits: int | None = None,
        saturates: bool = False,
    ) -> tuple[int | None, float]:
        """Return (delta, seconds since the previous reading). delta None: unknown this interval."""
        if value is None:
            self._last.pop(key, None)
            return None, 0.0
        prev = self._last.get(key)
        self._last[key] = _Last(value, ts)
        if prev is None:
            return None, 0.0
        dt = ts - prev.ts
        if dt <= 0:
            return None, 0.0
        if saturates and width_bits is not None and value >= (1 << width_bits) - 1:
            return None, dt
        d = value - prev.value
        if d >= 0:
            return d, dt
        if not saturates and width_bits is not None:
            wrapped = d + (1 << width_bits)
            if 0 <= wrapped < (1 << (width_bits - 1)):
                return wrapped, dt
        return None, dt  # reset: not a negative rate

    def rate(
        self,
        key: Hashable,
        value: int | None,
        ts: float,
        *,
        scale: float = 1.0,
        width_bits: int | None = None,
        saturates: bool = False,
    ) -> float | None:
        """Per-second rate of `value × scale` (e.g. scale=1024 for KiB counters, 4 for IB words)."""
        d, dt = self.delta(key, value, ts, width_bits=width_bits, saturates=saturates)
        if d is None or dt <= 0:
            return None
        return d * scale / dt

    def forget(self, key_prefix: tuple) -> None:
        """Drop every key that is a tuple starting with `key_prefix` (a GPU gone, a port removed)."""
        n = len(key_prefix)
        for k in [k for k in self._last if isinstance(k, tuple) and k[:n] == key_prefix]:
            del self._last[k]
