"""A short, fixed-size ring of a node's recent key series, for sparklines.

Memory is the point: a fleet view may hold 20,000 nodes, so each node keeps a few float32
columns in preallocated `array`s (≈ 28 bytes a point, 8.4 KB a node at 300 points) rather than
Python objects (≈ 30× more). Times are float64 unix seconds (receive times, one clock for all nodes).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

SERIES = ("nvlink_bytes_per_s", "power_w", "hottest_c", "ib_bytes_per_s", "pcie_bytes_per_s")


@dataclass(frozen=True, slots=True)
class Points:
    """A copy of one node's history, oldest first: `times[i]` goes with `values[name][i]`.
    NaN marks a value that was unknown at that tick."""

    times: tuple[float, ...]
    values: dict[str, tuple[float, ...]]


class History:
    """Ring of the last `capacity` points of `SERIES`. Not thread-safe (one event loop owns it)."""

    __slots__ = ("capacity", "_times", "_cols", "_next", "_count")

    def __init__(self, capacity: int = 300):
        if capacity < 1:
            raise ValueError("history capacity must be at least 1")
        self.capacity = capacity
        self._times = array("d", bytes(8 * capacity))
        self._cols = {name: array("f", bytes(4 * capacity)) for name in SERIES}
        self._next = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, t: float, values: dict[str, float | None]) -> None:
        i = self._next
        self._times[i] = t
        for name, col in self._cols.items():
            v = values.get(name)
            col[i] = float("nan") if v is None else v
        self._next = (i + 1) % self.capacity
        self._count = min(self._count + 1, self.capacity)

    def points(self, since: float | None = None) -> Points:
        """Oldest first; only points at or after `since` (unix s) when given."""
        start = (self._next - self._count) % self.capacity
        order = [(start + k) % self.capacity for k in range(self._count)]
        if since is not None:
            order = [i for i in order if self._times[i] >= since]
        return Points(times=tuple(self._times[i] for i in order),
                      values={name: tuple(col[i] for i in order) for name, col in self._cols.items()})
