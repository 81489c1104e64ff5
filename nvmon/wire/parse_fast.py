"""The compiled fast path of the `sample` reader: one msgspec schema, decoded and checked in C.

Samples are almost all of what a fleet view reads (a thousand a second from 1,000 nodes), and the
hand-written reader (`nvmon.wire.parse`) checks their columns value by value in Python. Here
msgspec decodes a sample of the usual shape straight into a typed struct that carries the
hand-written reader's bounds (types, ranges, list lengths, the catalog's columns; the numbers are
the same constants), and the few checks that span keys (each column as long as `p`, a GPU's tx
and rx link arrays of one length, `th` keys naming this sample's GPUs, the findings' rows) follow
in Python before the `Tick` is built.

It is a shortcut, not a second contract: `sample_tick` returns None for whatever it does not take
(a payload that is not bytes, a key outside its schema: the rarer sparse maps `gi`, `lost`, `lv`,
`le`, `is`, `ie`, or a key from a newer writer; any value out of bounds) and the hand-written reader decides then, so what is accepted, what is refused and each
refusal's message stay the hand-written reader's. What it accepts, it builds into the same `Tick`
(tests/test_wire_fast.py compares the two readers, value and type, on valid and mutated samples).
"""

from __future__ import annotations

import re
from typing import Annotated, Optional, Union

import msgspec
from msgspec import Meta

from nvmon.catalog import GPU_WIRE_READ
from nvmon.wire.checks import MAX_RATE, MAX_TS
from nvmon.wire.contract import (
    ALERT_SEVERITIES,
    LINK_PCT_MAX,
    MAX_FINDINGS,
    MAX_GPUS,
    MAX_IB_PORTS,
    MAX_INDEX,
    MAX_LINKS,
    MAX_PAYLOAD_BYTES,
    MAX_TEXT,
    MAX_XID,
    MAX_XID_EVENTS,
    SCHEMA,
    GpuTick,
    IbTick,
    Tick,
    TickFinding,
)

_G = re.compile(r"\d{1,4}", re.ASCII)  # as nvmon.wire.parse's: a sparse-map key naming a GPU
_LAYOUT = re.compile(r"[0-9a-f]{1,16}")
_CODE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)*")
_RATE = int(MAX_RATE)


def _num(lo: float, hi: float):
    return Annotated[float, Meta(ge=lo, le=hi)]  # an int is taken and made a float, as checks.nums does


def _int(lo: int, hi: int):
    return Annotated[int, Meta(ge=lo, le=hi)]  # never a bool or a float, as checks.ints


def _list(item, limit: int):
    return Annotated[list[item], Meta(max_length=limit)]


def _column(item, limit: int = MAX_GPUS):
    """A per-device column: a list (nulls allowed), or one number standing for every device."""
    return Union[item, _list(Optional[item], limit)]  # noqa: UP007 (msgspec reads typing's forms)


def _sparse(value):
    """A map keyed by GPU index ("3"), sent only when some GPU has something to say."""
    return Optional[Annotated[dict[str, value], Meta(max_length=MAX_GPUS * MAX_LINKS)]]


_TEXT32 = Annotated[str, Meta(max_length=32)]
_LINK_ROWS = _list(_list(Optional[_int(0, LINK_PCT_MAX)], MAX_LINKS), MAX_GPUS)
_CATALOG = tuple((m.wire, m.name, m.wire_divisor,
                  _column(_int(int(m.wire_range[0]), int(m.wire_range[1])) if m.wire_digits is None
                          else _num(*m.wire_range))) for m in GPU_WIRE_READ)

# The bounds of nvmon.wire.parse._tick and parse_message, key by key.
_Sample = msgspec.defstruct("_Sample", [
    ("schema", int),
    ("ts", _num(0, MAX_TS)),
    ("dt", _num(0, 86400)),
    ("lay", Annotated[str, Meta(max_length=16)]),
    ("p", _list(Optional[_num(0, 1e5)], MAX_GPUS)),
    ("pl", _column(_num(0, 1e5))),
    ("t", _column(_num(-100, 300))),
    ("u", _column(_num(0, 1000))),
    ("pg", _column(_int(0, 64))),
    ("pw", _column(_int(0, 64))),
    ("pt", _column(_int(0, _RATE))),
    ("pr", _column(_int(0, _RATE))),
    ("nt", _column(_int(0, _RATE))),
    ("nr", _column(_int(0, _RATE))),
    ("ls", _column(_int(0, 10**7))),
    ("lt", _LINK_ROWS),
    ("lr", _LINK_ROWS),
    ("ig", _list(Optional[_num(0, 1e5)], MAX_IB_PORTS), []),
    ("it", _column(_int(0, _RATE), MAX_IB_PORTS), []),
    ("ir", _column(_int(0, _RATE), MAX_IB_PORTS), []),
    ("h", tuple[Optional[_num(0, 1e4)], Optional[_num(0, 1e3)], Optional[_num(0, 1e6)]], (None, None, None)),
    ("nv", Optional[Annotated[str, Meta(max_length=MAX_TEXT)]], None),
    ("th", _sparse(Optional[_list(_TEXT32, 16)]), None),
    ("ld", _sparse(_list(_int(0, MAX_LINKS - 1), MAX_LINKS)), None),
    ("lq", _sparse(_list(_int(0, MAX_LINKS - 1), MAX_LINKS)), None),
    ("pe", _sparse(_int(0, 2**63 - 1)), None),  # msgspec bounds are int64: up to MAX_COUNTER, the slow way
    ("xe", _sparse(_list(_int(0, MAX_XID), MAX_XID_EVENTS)), None),
    ("f", Optional[_list(Annotated[list[Union[str, int, None]], Meta(min_length=2, max_length=6)], MAX_FINDINGS)],
     None),
    *((wire, Optional[kind], None) for wire, _, _, kind in _CATALOG),
], kw_only=True, forbid_unknown_fields=True)

_decode = msgspec.json.Decoder(_Sample).decode
_FAILED = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError)  # msgspec 0.18 raises the last on bad UTF-8
_NO_VALUES: dict = {}  # shared by the GPUs of a tick that carries no catalog keys: read only


def sample_tick(payload: object, cluster: str, node: str) -> Tick | None:
    """The `sample` payload's Tick, or None: then nvmon.wire.parse reads it (and refuses it, if it must)."""
    if type(payload) is not bytes or len(payload) > MAX_PAYLOAD_BYTES:
        return None
    try:
        s = _decode(payload)
    except _FAILED:
        return None
    if s.schema != SCHEMA or not _LAYOUT.fullmatch(s.lay):
        return None
    n = len(s.p)
    cols = [s.p]
    for v in (s.pl, s.t, s.u, s.pg, s.pw, s.pt, s.pr, s.nt, s.nr, s.ls):
        if type(v) is not list:
            v = [v] * n
        elif len(v) != n:
            return None
        cols.append(v)
    lt, lr = s.lt, s.lr
    if len(lt) != n or len(lr) != n or list(map(len, lt)) != list(map(len, lr)):
        return None
    values = _catalog_values(s, n)
    findings = _findings(s.f) if s.f else ()
    if values is None or findings is None:
        return None
    empty = [()] * n
    throttle, down, unknown, replay, xids = empty, empty, empty, [0] * n, empty
    if s.th or s.ld or s.lq or s.pe or s.xe:  # a GPU with something to say: rarer, checked here
        if (sparse := _sparse_maps(s, n, lt)) is None:
            return None
        throttle, down, unknown, replay, xids = sparse
    p, pl, t, u, pg, pw, pt, pr, nt, nr, ls = cols
    gpus = tuple(map(
        GpuTick, range(n), [False] * n, p, pl, t, u, throttle, pg, pw, pt, pr, replay, nt, nr, ls, map(tuple, lt),
        map(tuple, lr), down, unknown, [{} for _ in range(n)], [{} for _ in range(n)], xids, values))
    rates = s.ig
    m = len(rates)
    tx, rx = s.it, s.ir
    tx = [tx] * m if type(tx) is not list else tx
    rx = [rx] * m if type(rx) is not list else rx
    if len(tx) != m or len(rx) != m:
        return None
    ib = tuple(map(IbTick, range(m), rates, tx, rx, ["ACTIVE"] * m, ["LinkUp"] * m, [{} for _ in range(m)]))
    h = s.h
    return Tick(cluster, node, s.ts, s.dt, s.lay, gpus, ib, h[0], h[1], h[2], s.nv, findings)


def _catalog_values(s, n: int) -> list | None:
    columns = []
    for wire, name, divisor, _ in _CATALOG:
        v = getattr(s, wire)
        if v is None:
            continue
        if type(v) is not list:
            v = [v] * n
        elif len(v) != n:
            return None
        if divisor is not None:  # sent in the key's units: back to the metric's
            v = [None if x is None else x * divisor for x in v]
        columns.append((name, v))
    if not columns:
        return [_NO_VALUES] * n
    return [{name: col[i] for name, col in columns} for i in range(n)]


def _sparse_maps(s, n: int, lt: list) -> tuple[list, ...] | None:
    """Per GPU: throttle reasons, links down, links unknown, replay delta, Xid events; None if a key
    names no GPU of this sample or a link beyond the GPU's link arrays."""
    out = []
    for m, default in ((s.th, ()), (s.ld, ()), (s.lq, ()), (s.pe, 0), (s.xe, ())):
        if not m:  # absent, null or empty: the hand-written reader skips it too
            out.append([default] * n)
            continue
        by_gpu = {}
        for k, v in m.items():
            if not _G.fullmatch(k) or (g := int(k)) >= n:
                return None
            by_gpu[g] = v
        if m is s.ld or m is s.lq:
            if any(v and max(v) >= len(lt[g]) for g, v in by_gpu.items()):
                return None
        if m is not s.pe:
            by_gpu = {g: None if v is None else tuple(v) for g, v in by_gpu.items()}
        out.append([by_gpu.get(g, default) for g in range(n)])
    return tuple(out)


def _findings(rows: list) -> tuple[TickFinding, ...] | None:
    """`f` rows as nvmon.wire.parse._tick_findings takes them; None for any it would refuse."""
    out = []
    for row in rows:
        code, severity, *rest = row
        rest += [None] * (4 - len(rest))
        gpu, link, device, port = rest
        if (type(code) is not str or len(code) > 64 or not _CODE.fullmatch(code) or severity not in ALERT_SEVERITIES
                or not _opt_int(gpu, MAX_INDEX) or not _opt_int(link, MAX_LINKS) or not _opt_int(port, MAX_INDEX)
                or not (device is None or (type(device) is str and len(device) <= 64))):
            return None
        out.append(TickFinding(code, severity, gpu, link, device, port))
    return tuple(out)


def _opt_int(v: object, hi: int) -> bool:
    return v is None or (type(v) is int and 0 <= v <= hi)
