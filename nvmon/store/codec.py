"""`Sample` → table rows, and the compact per-link forms (uint16 blobs, bit masks) back to values.

Every value goes through a coercer that turns anything unstorable (NaN, ±inf, wrong types, numbers
past SQLite's 64-bit range) into NULL, so a bad sample can never fail the transaction that also
carries good ones. Static facts (names, UUIDs, link map) are not repeated per tick: they go to the
`inventory` table when they change (see `facts_*`).
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Iterable, Sequence
from itertools import chain
from math import trunc
from operator import attrgetter, call
from typing import Any

from nvmon.catalog import GPU_FACTS, GPU_TICK_SCALARS, Encode, Scope, getter, of_scope
from nvmon.model import IB_PHYS_STATES, IB_STATES, THROTTLE_BITS, GpuSample, IbPortSample, Sample

MB = 1_000_000  # per-link rates are stored in MB/s (10^6 bytes/s), one uint16 per link
U16_UNKNOWN = 0xFFFF
U16_MAX = 0xFFFE  # faster links saturate here (65.5 GB/s per direction: above NVLink 5's 53 GB/s)
MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS: masks fit in a 64-bit integer
_I64 = 2**63 - 1
THROTTLE_BIT = {name: bit for bit, name in THROTTLE_BITS}
_RANGES = [list(range(n)) for n in range(MAX_LINKS + 1)]
# Exact type sets for the fast paths' checks: a bool is an int to isinstance, not here.
_INT, _BOOL, _DICT, _FLOAT = {int}, {bool}, {dict}, {float}
_INT_OR_NONE = {int, type(None)}
# IB port states are stored as the kernel's own numbers (sysfs "4: ACTIVE"): 1 byte, not 6.
IB_STATE_CODES = {name: code for code, name in IB_STATES.items()}
IB_PHYS_CODES = {name: code for code, name in IB_PHYS_STATES.items()}


def real(v: Any) -> float | None:
    """A finite float, else None."""
    t = type(v)
    if t is float:  # the common case first: this runs ~500 times a tick
        return v if -1e300 < v < 1e300 else None  # also False for NaN
    if t is int:
        return float(v) if -1e300 < v < 1e300 else None
    if v is None or t is bool or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if -1e300 < f < 1e300 else None


def rate(v: Any) -> float | None:
    """Bytes/s rounded to whole bytes: SQLite then stores it as a compact integer (REAL column)."""
    f = real(v)
    return float(round(f)) if f is not None and abs(f) < 2**62 else None


def watts(v: Any) -> float | None:
    """Rounded to a whole number. For power: the board sensor is accurate to about ±5 W (nvidia-smi's
    documentation), and a fractional value costs 8 bytes where a whole one costs 2 (~5 MB a day).
    Host CPU and memory percentages get the same treatment."""
    f = real(v)
    return float(round(f)) if f is not None else None


def integer(v: Any) -> int | None:
    """An integer within SQLite's range, else None (bools count: they are 0/1 flags)."""
    if type(v) is int:
        return v if -_I64 <= v <= _I64 else None
    if v is None:
        return None
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return int(v) if -_I64 <= v <= _I64 else None
    f = real(v)
    return int(f) if f is not None and f.is_integer() and abs(f) <= _I64 else None


def text(v: Any, limit: int = 200) -> str | None:
    return None if v is None else str(v)[:limit]


def ts_ms(ts: Any) -> int | None:
    """Unix seconds → integer milliseconds; None for timestamps no clock can produce."""
    f = real(ts)
    return int(round(f * 1000)) if f is not None and 0 <= f < 1e11 else None


def json_or_null(v: Any) -> str | None:
    return json.dumps(v, separators=(",", ":"), sort_keys=True) if v else None


@functools.lru_cache(maxsize=None)
def _u16_struct(n: int) -> struct.Struct:
    """Compiled little-endian uint16 × n format (one per link count, not parsed every tick)."""
    return struct.Struct(f"<{n}H")


def pack_mb(values: Iterable[Any]) -> bytes:
    """Rates in bytes/s → little-endian uint16 MB/s (rounded, saturating; unknown → 65535)."""
    out = []
    for v in values:
        f = real(v)
        out.append(U16_UNKNOWN if f is None or f < 0 else min(U16_MAX, int(f / MB + 0.5)))
    return _u16_struct(len(out)).pack(*out)


def unpack_mb(blob: bytes | None) -> list[float | None]:
    """The inverse of `pack_mb`: bytes/s per link (None where unknown)."""
    if not blob:
        return []
    n = len(blob) // 2
    return [None if u == U16_UNKNOWN else float(u * MB) for u in struct.unpack(f"<{n}H", blob[: 2 * n])]


def unpack_u16(blob: bytes | None) -> list[int]:
    """Raw uint16 values of a blob (65535 = unknown); for rollups that aggregate without scaling."""
    if not blob:
        return []
    n = len(blob) // 2
    return list(struct.unpack(f"<{n}H", blob[: 2 * n]))


def pack_u16(values: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(values)}H", *values)


def masks(active: Sequence[bool | None]) -> tuple[int, int]:
    """Per-link states → (up_mask, down_mask); a link in neither is unknown."""
    up = down = 0
    for n, a in enumerate(active[:MAX_LINKS]):
        if a is True:
            up |= 1 << n
        elif a is False:
            down |= 1 << n
    return up, down


def unmask(up: int | None, down: int | None, count: int) -> list[bool | None]:
    up, down = up or 0, down or 0
    return [True if up >> n & 1 else False if down >> n & 1 else None for n in range(count)]


def _sum_known(values: Iterable[Any]) -> int | None:
    known = [i for i in map(integer, values) if i is not None]
    return sum(known) if known else None


def _nonzero_errors(errors: Any) -> dict[str, int]:
    if not isinstance(errors, dict) or not any(errors.values()):
        return {}
    return {str(k)[:40]: i for k, v in errors.items() if (i := integer(v))}


def throttle_mask(reasons: Any) -> int | None:
    """Reason names → NVML's bit mask (names it does not know are left out); None: unreadable."""
    if reasons is None or not isinstance(reasons, (tuple, list)):
        return None
    mask = 0
    for r in reasons:
        mask |= THROTTLE_BIT.get(r, 0) if isinstance(r, str) else 0
    return mask


def throttle_names(mask: int | None) -> tuple[str, ...] | None:
    return None if mask is None else tuple(name for bit, name in THROTTLE_BITS if mask & bit)


def ib_code(name: Any, table: dict[str, int]) -> int | None:
    return table.get(name) if isinstance(name, str) else None


def flag(v: Any) -> int:
    return 1 if v else 0


ENCODERS = {Encode.REAL: real, Encode.WHOLE: watts, Encode.RATE: rate, Encode.INTEGER: integer, Encode.FLAG: flag,
            Encode.THROTTLE: throttle_mask, Encode.TEXT: text}

# A GPU row: its key, the catalog's scalar metrics (read from the GpuSample by path, in catalog
# order), then the columns this module derives from the GPU's links, then its notes. The INSERT
# names these columns, so the table's own column order (migrations append) does not matter.
LINK_COLUMNS = ("nvlink_active", "nvlink_up_mask", "nvlink_down_mask", "nvlink_tx_bytes_per_s",
                "nvlink_rx_bytes_per_s", "nvlink_errors_delta", "nvlink_tx_mb", "nvlink_rx_mb", "nvlink_errors")
GPU_COLUMNS = ("ts_ms", "gpu", *(m.column for m in GPU_TICK_SCALARS), *LINK_COLUMNS, "notes")
# The catalog's getter returns their values as one tuple (C-level attrgetter and dict lookups), and
# map(call, ...) applies each column's coercer to its value (this runs for every GPU every tick).
_GPU_GET = getter(GPU_TICK_SCALARS)
_GPU_ENCODE = tuple(ENCODERS[m.encode] for m in GPU_TICK_SCALARS)
_FACTS_GET = getter(GPU_FACTS)
_FACTS = tuple((m.column, ENCODERS[m.encode]) for m in GPU_FACTS)
# The node's row: its own columns around the catalog's host metrics (the ones read by path).
_NODE_SCALARS = tuple(m for m in of_scope(Scope.NODE) if m.path is not None and m.column is not None)
_NODE_GET = attrgetter(*(m.path for m in _NODE_SCALARS))
_NODE_ENCODE = tuple(ENCODERS[m.encode] for m in _NODE_SCALARS)
TICK_COLUMNS = ("ts_ms", "interval_s", "nvml_available", "gpus", "gpus_lost", "gpu_power_w", "topology",
                *(m.column for m in _NODE_SCALARS), "notes")
IB_COLUMNS = ("ts_ms", "port_id", "state", "phys_state", "rate_gbps", "tx_bytes_per_s", "rx_bytes_per_s",
              "errors_delta", "errors")


def gpu_scalars(g: GpuSample) -> tuple:
    """The catalog's per-tick GPU values, coerced for their columns (GPU_COLUMNS[2:...])."""
    return tuple(map(call, _GPU_ENCODE, _GPU_GET(g)))


def insert_sql(table: str, columns: Sequence[str]) -> str:
    return f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) VALUES ({','.join('?' * len(columns))})"


def gpu_row(t: int, g: GpuSample) -> tuple:
    """One `gpu_ticks` row, in GPU_COLUMNS order. Blobs and masks are indexed by link
    number, not position, so a link missing from the sample stays a gap (unknown).

    This runs for every GPU every tick, so the usual GPU (links numbered 0..n-1, rates finite
    floats, every link's error deltas ints or None) takes a path that handles each per-link column
    as a whole; anything else goes to `_gpu_row_any`. Both give the same row.
    """
    nv = g.nvlink
    nums = [lk.link for lk in nv]
    n = len(nums)
    if not (0 < n <= MAX_LINKS and nums == _RANGES[n] and set(map(type, nums)) == _INT):
        return _gpu_row_any(t, g)
    tx = [lk.tx_bytes_per_s for lk in nv]
    rx = [lk.rx_bytes_per_s for lk in nv]
    if (packed := _pack_rates(tx, rx)) is None:
        return _gpu_row_any(t, g)
    tx_mb, rx_mb, tx_sum, rx_sum = packed
    acts = [lk.active for lk in nv]
    # Bools compare equal only to themselves, so count(True) is the `is True` test here.
    if acts.count(True) == n and set(map(type, acts)) == _BOOL:
        up, down = (1 << n) - 1, 0
    else:
        up, down = masks(acts)
    deltas = [lk.errors_delta for lk in nv]
    if set(map(type, deltas)) != _DICT:
        return _gpu_row_any(t, g)
    values = list(chain.from_iterable(map(dict.values, deltas)))
    kinds = set(map(type, values))
    errors: dict[str, dict[str, int]] = {}
    if not any(values) and kinds <= _INT_OR_NONE:
        # Nothing rose (the usual tick): the sum is 0, or None when no link read a counter.
        errors_delta = 0 if int in kinds else None
    else:
        if kinds <= _INT:
            errors_delta = _sum_ints(values) if values else None
        elif kinds <= _INT_OR_NONE:
            known = [v for v in values if v is not None]
            errors_delta = _sum_ints(known) if known else None
        else:
            errors_delta = _sum_known(values)
        for i, d in enumerate(deltas):
            if e := _nonzero_errors(d):
                errors[str(i)] = e
    return (
        t, integer(g.index), *gpu_scalars(g),
        up.bit_count(), up, down, tx_sum, rx_sum, errors_delta, tx_mb, rx_mb,
        json_or_null(errors), json_or_null([text(n) for n in g.notes]) if g.notes else None,
    )


def _pack_rates(tx: list[Any], rx: list[Any]) -> tuple[bytes, bytes, float | None, float | None] | None:
    """(`pack_mb(tx)`, `pack_mb(rx)`, `_sum_rates(tx)`, `_sum_rates(rx)`) when every rate is a
    finite float from 0 up to what a uint16 holds, else None: then the caller takes the general path.

    Dividing by MB, adding 0.5 and truncating never turn a larger rate into a smaller number, so
    when the largest rate fits, all do, and the per-value checks of `pack_mb` can be skipped.
    Both directions are checked and packed as one list: fewer calls per GPU.
    """
    both = tx + rx
    if set(map(type, both)) != _FLOAT:
        return None
    tx_total, rx_total = sum(tx), sum(rx)
    if not (-1e300 < tx_total < 1e300 and -1e300 < rx_total < 1e300):  # NaN or inf: so is the sum
        return None
    lo, hi = min(both), max(both)  # no NaN here: min and max are exact
    if lo < 0 or hi >= 1e300 or int(hi / MB + 0.5) > U16_MAX:
        return None
    # trunc() is int() for a float, called without int()'s type-call overhead; 1e6 is MB exactly.
    blob = _u16_struct(len(both)).pack(*[trunc(v / 1e6 + 0.5) for v in both])
    half = 2 * len(tx)
    return blob[:half], blob[half:], rate(tx_total), rate(rx_total)


def _sum_ints(values: list[int]) -> int | None:
    """`_sum_known` of plain ints (no None, no bools)."""
    if -_I64 <= min(values) and max(values) <= _I64:
        return sum(values)
    return _sum_known(values)


def _gpu_row_any(t: int, g: GpuSample) -> tuple:
    """`gpu_row` for any sample, however odd its links."""
    by_link = {}
    for lk in g.nvlink:
        n = integer(lk.link)
        if n is not None and 0 <= n < MAX_LINKS:
            by_link[n] = lk
    slots = max(by_link, default=-1) + 1
    tx: list[Any] = [None] * slots
    rx: list[Any] = [None] * slots
    up = down = 0
    errors: dict[str, dict[str, int]] = {}
    deltas: list[Any] = []
    for n, lk in by_link.items():
        tx[n], rx[n] = lk.tx_bytes_per_s, lk.rx_bytes_per_s
        if lk.active is True:
            up |= 1 << n
        elif lk.active is False:
            down |= 1 << n
        d = lk.errors_delta
        if isinstance(d, dict) and d:
            deltas.extend(d.values())
            if e := _nonzero_errors(d):
                errors[str(n)] = e
    has_links = slots > 0
    return (
        t, integer(g.index), *gpu_scalars(g),
        up.bit_count() if has_links else None, up if has_links else None, down if has_links else None,
        _sum_rates(tx), _sum_rates(rx),
        _sum_known(deltas),
        pack_mb(tx) if has_links else None, pack_mb(rx) if has_links else None,
        json_or_null(errors), json_or_null([text(n) for n in g.notes]) if g.notes else None,
    )


def _sum_rates(values: list[Any]) -> float | None:
    known = [f for f in map(real, values) if f is not None]
    return rate(sum(known)) if known else None


def ib_row(t: int, port_id: int, p: IbPortSample) -> tuple:
    """One `ib_ticks` row."""
    d = p.errors_delta
    values = list(d.values()) if type(d) is dict else None
    kinds = set(map(type, values)) if values is not None else None
    if values is not None and kinds <= _INT_OR_NONE and not any(values):
        # Nothing rose (the usual tick): as below, without converting each value.
        delta, errors = 0 if int in kinds else None, None
    else:
        delta = _sum_known((p.errors_delta or {}).values()) if isinstance(p.errors_delta, dict) else None
        errors = json_or_null(_nonzero_errors(p.errors_delta))
    return (
        t, port_id, ib_code(p.state, IB_STATE_CODES), ib_code(p.phys_state, IB_PHYS_CODES), real(p.rate_gbps),
        rate(p.tx_bytes_per_s), rate(p.rx_bytes_per_s), delta, errors,
    )


def tick_row(t: int, s: Sample) -> tuple:
    """One `ticks` row."""
    powers = [f for f in (watts(g.power_w) for g in s.gpus) if f is not None]
    return (
        t, real(s.interval_s), 1 if s.nvml.available else 0,
        len(s.gpus), sum(1 for g in s.gpus if g.lost), sum(powers) if powers else None,
        text(s.topology.class_, 40), *map(call, _NODE_ENCODE, _NODE_GET(s)),
        json_or_null([text(n) for n in s.notes]),
    )


def node_signature(s: Sample) -> tuple:
    """Raw values `facts_node` reads: equal signatures give equal facts."""
    return (s.node, s.host.hostname, s.host.kernel, s.nvml, s.nvswitches)


def gpu_signature(g: GpuSample) -> tuple:
    # Signatures are only compared (==), never hashed or stored: a list comprehension is quicker
    # than tuple() of a generator, and compares the same.
    return (g.name, g.uuid, g.serial, g.pci_bus_id, _FACTS_GET(g), g.lost,
            [(lk.link, lk.version, lk.speed_mbps, lk.remote_type, lk.remote_pci_bus_id) for lk in g.nvlink])


def ib_signature(p: IbPortSample) -> tuple:
    return (p.device, p.port, p.pci_bus_id, p.rate_name, p.link_layer, p.pcie.gen, p.pcie.width,
            p.pcie.max_gen, p.pcie.max_width)


def merge_facts(new: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """Fill what this tick could not read (None) from the last known facts, so that a port or GPU
    that blinks does not add an inventory row each time it does."""
    prev = previous or {}
    return {k: (v if v is not None else prev.get(k)) for k, v in new.items()}


def facts_node(s: Sample, previous: dict[str, Any] | None) -> dict[str, Any]:
    """Slow-changing node facts; a new `inventory` row is written when these change. The topology
    matrix is left out on purpose: it follows link states, which are stored per tick."""
    from nvmon.model import to_jsonable

    return merge_facts({
        "node": s.node, "hostname": s.host.hostname, "kernel": s.host.kernel, "nvml": to_jsonable(s.nvml),
        "nvswitches": to_jsonable(s.nvswitches) or None,
    }, previous)


def facts_gpu(g: GpuSample, previous: dict[str, Any] | None) -> dict[str, Any]:
    """Static GPU facts, including the link map (per link: version, speed, remote type and bus id)."""
    prev_links = {lk.get("link"): lk for lk in (previous or {}).get("nvlink") or []}
    links = [
        merge_facts({"link": lk.link, "version": lk.version, "speed_mbps": lk.speed_mbps,
                     "remote_type": lk.remote_type, "remote_pci_bus_id": lk.remote_pci_bus_id},
                    prev_links.get(lk.link))
        for lk in sorted(g.nvlink, key=lambda x: x.link if isinstance(x.link, int) else -1)
    ]
    return merge_facts({
        "name": g.name, "uuid": g.uuid, "serial": g.serial, "pci_bus_id": g.pci_bus_id,
        **{key: encode(v) for (key, encode), v in zip(_FACTS, _FACTS_GET(g))},  # the catalog's static metrics
        "nvlink": links or None,  # a lost GPU reports no links: keep the known map
    }, previous)


def facts_ib(p: IbPortSample, previous: dict[str, Any] | None) -> dict[str, Any]:
    """Static IB port facts (rate name and link layer change rarely: when they do, that is history)."""
    return merge_facts({
        "device": p.device, "port": p.port, "pci_bus_id": p.pci_bus_id, "rate_name": p.rate_name,
        "link_layer": p.link_layer, "pcie_gen": integer(p.pcie.gen), "pcie_width": integer(p.pcie.width),
        "pcie_max_gen": integer(p.pcie.max_gen), "pcie_max_width": integer(p.pcie.max_width),
    }, previous)
