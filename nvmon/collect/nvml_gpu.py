"""One GPU as the NVML collector (`nvmon.collect.nvml`) keeps it: its handle, static facts, the
last values of rotated getters, what it cannot answer, its field-value batch and the deltas'
previous readings; and `_Gpu.call`, the per-GPU side of the NVML chokepoint (`nvml_api.Api`), which
sorts each outcome into a value, a capability recorded as unsupported, a note, or `_Lost`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nvmon.collect.nvml_api import Api, Lost, NoValue, Unsupported
from nvmon.collect.nvml_batch import FieldBatch


class _Lost(Exception):
    """Raised out of a GPU's reading when NVML says the GPU is lost."""


@dataclass(slots=True)
class _Link:
    link: int
    version: int | None = None
    remote_type: str | None = None
    remote_bus_id: str | None = None


@dataclass(slots=True)
class _Gpu:
    """Per-GPU state: handle, static facts, the last hot values, what is unsupported."""

    api: Api
    index: int
    counter: list[int]  # shared call counter [n]
    handle: Any = None
    lost: bool = False
    name: str | None = None
    uuid: str | None = None
    serial: str | None = None
    bus_id: str | None = None
    default_limit_w: float | None = None
    max_limit_w: float | None = None
    max_gen: int | None = None
    device_max_gen: int | None = None
    max_width: int | None = None
    link_count: int = 0
    links: list[_Link] = field(default_factory=list)
    # The links' static facts as columns (number, version, remote type, remote bus id), for _assemble.
    link_cols: tuple[tuple, tuple, tuple, tuple] = ((), (), (), ())
    unsupported: set[str] = field(default_factory=set)
    last: dict[str, Any] = field(default_factory=dict)  # rotated getter values (the catalog's by metric), carried over
    notes: dict[str, str] = field(default_factory=dict)
    batch: FieldBatch | None = None  # the per-tick field-value request
    layout: list[tuple[str, int | None]] = field(default_factory=list)  # what each batch entry is
    slot: dict[tuple[str, int | None], int] = field(default_factory=dict)  # (key, link) → entry
    prev_values: list = field(default_factory=list)  # last tick's value per entry, for deltas
    prev_ts_us: list = field(default_factory=list)  # and its timestamp
    prev_complete: bool = False  # every entry of the last tick answered
    error_maps: dict[tuple, dict] = field(default_factory=dict)  # link error counts → shared dict
    # Over all links at once, in link order: (state, speed) pairs, (tx, rx) pairs, error counts
    # (NVLINK_ERROR_KINDS each); None when the GPU has no links.
    link_get: tuple[Callable, Callable, Callable] | None = None
    rotation: Any = None
    lost_ticks: int = 0

    def call(self, what: str, fn, *args):
        """One NVML call through the chokepoint: its value, or a NoValue (Unsupported recorded as a
        capability, Failed as a note); raises _Lost for a lost GPU. `fn` None: the bindings lack it."""
        if fn is not None:
            self.counter[0] += 1
        value = self.api.call(fn, *args)
        if isinstance(value, NoValue):
            if isinstance(value, Unsupported):
                self.unsupported.add(what)
            elif isinstance(value, Lost):
                raise _Lost()
            else:
                self.notes[what] = f"{what}: {value}"
            return value
        self.notes.pop(what, None)
        return value

    def ask(self, what: str, *args):
        """`call` with the function resolved for `what` (nvml_fields.FUNCTIONS)."""
        return self.call(what, self.api.fn[what], *args)


def _text(v) -> str | None:
    if v is None or isinstance(v, NoValue):
        return None
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _num(v, scale: float | None = None) -> float | int | None:
    """A getter's value (scaled when asked), or None for 'unsupported' / 'unreadable'."""
    if v is None or isinstance(v, NoValue):
        return None
    return v if scale is None else v * scale
