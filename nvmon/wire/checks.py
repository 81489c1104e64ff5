"""Checks for untrusted JSON: each returns the value or raises WireError naming the path.

Used by `parse`; generic (no knowledge of the message kinds). Every check bounds what it accepts,
so that no payload can make a reader allocate, loop or print something absurd.
"""

from __future__ import annotations

import json
import math
from functools import partial
from itertools import chain
from operator import is_not
from typing import Any

from nvmon.wire.contract import MAX_GPUS, MAX_LABELS, MAX_NAME, MAX_PAYLOAD_BYTES, MAX_TEXT, SCHEMA, WireError

MAX_RATE = 1e15  # bytes/s: a petabyte per second is not a measurement
MAX_TS = 1e11  # unix seconds, year ~5138
MAX_COUNTER = 2**64


def _reject_constant(name: str) -> Any:
    raise WireError(f"non-finite number {name} in JSON")


def loads(payload: object) -> Any:
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise WireError(f"payload is {type(payload).__name__}, expected bytes")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise WireError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    try:
        decoded = bytes(payload).decode("utf-8")
        return json.loads(decoded, parse_constant=_reject_constant)
    except WireError:  # from _reject_constant; WireError is a ValueError, keep its message
        raise
    except UnicodeDecodeError:
        raise WireError("payload is not UTF-8") from None
    except RecursionError:
        raise WireError("JSON nested too deeply") from None
    except json.JSONDecodeError as e:
        raise WireError(f"invalid JSON: {e.msg} at byte {e.pos}") from None
    except ValueError:  # int() refuses literals past 4300 digits; every range check is far below
        raise WireError("invalid JSON: number literal too long") from None


def envelope(payload: object, what: str, cluster: str | None = None) -> dict:
    """The JSON object every topic's payload is, with this reader's schema (and, for a cluster's
    own topics, the cluster its topic names); raises WireError naming `what` otherwise."""
    d = loads(payload)
    if not isinstance(d, dict):
        raise WireError(f"{what}: expected a JSON object, got {type(d).__name__}")
    schema = d.get("schema")
    if type(schema) is not int or schema != SCHEMA:
        raise WireError(f"{what}: unknown schema {str(schema)[:12]!r} (this reader knows {SCHEMA})")
    if cluster is not None and d.get("cluster") != cluster:
        raise WireError(f"{what}: cluster disagrees with the topic")
    return d


def fail(path: str, want: str, got: object) -> WireError:
    return WireError(f"{path}: expected {want}, got {type(got).__name__}")


def text(v: object, path: str, limit: int = MAX_TEXT, *, null: bool = True) -> str | None:
    if v is None and null:
        return None
    if not isinstance(v, str):
        raise fail(path, "text", v)
    if len(v) > limit:
        raise WireError(f"{path}: text longer than {limit}")
    try:
        v.encode("utf-8")  # lone surrogates (from \ud800 escapes) would break every later encode
    except UnicodeEncodeError:
        raise WireError(f"{path}: text is not valid Unicode") from None
    return v


def integer(v: object, path: str, lo: int = 0, hi: int = MAX_COUNTER, *, null: bool = True) -> int | None:
    if v is None and null:
        return None
    if not isinstance(v, int) or isinstance(v, bool):  # bool is an int in Python; not on the wire
        raise fail(path, "integer", v)
    if not lo <= v <= hi:
        raise WireError(f"{path}: {v} outside {lo}..{hi}")
    return v


def number(v: object, path: str, lo: float = 0.0, hi: float = MAX_RATE, *, null: bool = True) -> float | None:
    if v is None and null:
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise fail(path, "number", v)
    if not (math.isfinite(v) and lo <= v <= hi):  # json.loads turns 1e999 into inf
        raise WireError(f"{path}: {v!r:.24} outside {lo:g}..{hi:g}")
    return float(v)


def array(v: object, path: str, limit: int, *, length: int | None = None) -> list:
    if not isinstance(v, list):
        raise fail(path, "list", v)
    if len(v) > limit or (length is not None and len(v) != length):
        raise WireError(f"{path}: {len(v)} items, expected {length if length is not None else f'at most {limit}'}")
    return v


_INT = frozenset((int,))
_INT_NULL = frozenset((int, type(None)))
_NUM = frozenset((int, float))
_NUM_NULL = frozenset((int, float, type(None)))
_LIST = frozenset((list,))
_SCALAR = frozenset((int, float))  # not bool: type(True) is bool; checked like any item after
_not_null = partial(is_not, None)


def all_ints(v: list, lo: int, hi: int) -> bool:
    """True if every item of the list `v` is a plain int (not a bool) in lo..hi, checked in builtins."""
    return set(map(type, v)) <= _INT and (not v or (lo <= min(v) and max(v) <= hi))


def _column(v: object, path: str, limit: int, length: int | None) -> list:
    """`v` as a list: a per-GPU column (`length` given) may be sent as one number, the value of
    every GPU (docs/wire.md, "uniform columns")."""
    if length is not None and type(v) in _SCALAR:
        return [v] * length
    return array(v, path, limit, length=length)


def ints(v: object, path: str, lo: int, hi: int, limit: int, *, length: int | None = None,
         null: bool = True) -> tuple:
    """A list of integers (or nulls, unless `null` is false) in lo..hi. The common all-int case is
    checked in C-speed builtins: the aggregator reads thousands of these arrays a second. With
    `length`, one number stands for a column of `length` equal values."""
    v = _column(v, path, limit, length)
    types = set(map(type, v))
    if types <= _INT:
        if not v or (lo <= min(v) and max(v) <= hi):
            return tuple(v)
    elif null and types <= _INT_NULL:  # a lost GPU's nulls: range-check the rest
        known = list(filter(_not_null, v))
        if not known or (lo <= min(known) and max(known) <= hi):
            return tuple(v)
    return tuple(integer(x, f"{path}[{i}]", lo, hi, null=null) for i, x in enumerate(v))


def int_rows(v: object, path: str, lo: int, hi: int, rows: int, limit: int) -> tuple[tuple, ...]:
    """`rows` lists of at most `limit` integers (or nulls) in lo..hi, e.g. per-GPU link arrays.
    All rows are checked at once in builtins when they are all plain ints (the common case)."""
    v = array(v, path, rows, length=rows)
    if not v:
        return ()
    if set(map(type, v)) <= _LIST and max(map(len, v)) <= limit and all_ints(list(chain.from_iterable(v)), lo, hi):
        return tuple(map(tuple, v))
    return tuple(ints(r, f"{path}[{i}]", lo, hi, limit) for i, r in enumerate(v))


def nums(v: object, path: str, lo: float, hi: float, limit: int, *, length: int | None = None) -> tuple:
    """Like `ints` for numbers; values come back as float (None stays None)."""
    v = _column(v, path, limit, length)
    types = set(map(type, v))
    if types <= _NUM:
        if not v or (lo <= min(v) and max(v) <= hi):  # min/max also catch ±inf (1e999); NaN cannot be parsed
            return tuple(map(float, v))
    elif types <= _NUM_NULL:  # a lost GPU's nulls: range-check the rest
        known = list(filter(_not_null, v))
        if not known or (lo <= min(known) and max(known) <= hi):
            return tuple(None if x is None else float(x) for x in v)
    return tuple(number(x, f"{path}[{i}]", lo, hi) for i, x in enumerate(v))


def obj(v: object, path: str, limit: int = 256) -> dict:
    if not isinstance(v, dict):
        raise fail(path, "object", v)
    if len(v) > limit:
        raise WireError(f"{path}: {len(v)} keys, at most {limit}")
    return v


def labels(v: object, path: str) -> dict[str, str]:
    d = obj({} if v is None else v, path, MAX_LABELS)
    return {text(k, f"{path} key", MAX_NAME, null=False): text(x, f"{path}[{str(k)[:20]!r}]", null=False)
            for k, x in d.items()}


def plain(v: object, path: str, depth: int = 0) -> Any:
    """Any JSON value of bounded depth/length (the expected-spec block)."""
    if depth > 4:
        raise WireError(f"{path}: nested too deeply")
    if isinstance(v, dict):
        return {text(k, f"{path} key", 64, null=False): plain(x, f"{path}.{k}", depth + 1)
                for k, x in obj(v, path, 64).items()}
    if isinstance(v, list):
        return [plain(x, f"{path}[{i}]", depth + 1) for i, x in enumerate(array(v, path, MAX_GPUS))]
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):  # stays an int: counts in the spec (ib_ports = 8) are compared as such
        if not -10**15 <= v <= 10**15:
            raise WireError(f"{path}: {v!r:.24} outside -1e+15..1e+15")
        return v
    if isinstance(v, float):
        return number(v, path, -1e15, 1e15)
    return text(v, path)
