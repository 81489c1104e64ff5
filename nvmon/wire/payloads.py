"""Build the JSON payloads of the MQTT contract from `Sample`s (pure, no I/O).

Four kinds under `nvmon/v1/<cluster>/<node>/` (docs/wire.md has every key):

- `status`    retained, QoS 1: online/offline, version, interval.
- `inventory` retained, QoS 1: static facts, long readable keys (sent once per connect/change).
- `sample`    QoS 0, every tick: short keys and column arrays (one value per GPU, one per link),
              sparse maps for what is usually absent (down links, error rises, throttling), so an
              8-GPU × 18-link × 8-port node stays under ~2 KB a tick.
- `alerts`    retained, QoS 1: the full active alert set.

Builders return the encoded bytes (compact JSON, UTF-8) and raise `PayloadTooLarge` rather than
emit something readers would reject. `parse_message` (the reader) is re-exported here.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nvmon.audit import Finding, fabric_domain
from nvmon.catalog import GPU_WIRE, GPU_WIRE_FACTS
from nvmon.codes import Severity
from nvmon.model import Sample
from nvmon.specs import NodeSpec, gpu_spec_for
from nvmon.wire.contract import (
    ALERT_SEVERITIES,
    ALERT_STATES,
    KINDS,
    LINK_PCT_MAX,
    MAX_FINDINGS,
    MAX_LABELS,
    MAX_LINKS,
    MAX_NAME,
    MAX_PAYLOAD_BYTES,
    MAX_SUMMARY,
    MAX_TEXT,
    MAX_XID_EVENTS,
    SCHEMA,
    STATUS_STATES,
    Alert,
    PayloadTooLarge,
    WireError,
    parse_topic,
    subscription,
    topic,
    valid_name,
)
from nvmon.wire.parse import parse_message

__all__ = [
    "KINDS", "MAX_PAYLOAD_BYTES", "SCHEMA", "Alert", "PayloadTooLarge", "WireError", "alerts_payload",
    "encode", "inventory_payload", "layout_id", "parse_message", "parse_topic", "sample_payload",
    "status_payload", "subscription", "topic", "valid_name",
]

IB_UP = ("ACTIVE", "LinkUp")  # the usual (state, phys_state): only ports that differ are listed


# One encoder for every payload: json.dumps with non-default options builds a new JSONEncoder on
# each call, and the sample payload is encoded every tick. encode() keeps no state between calls.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode(obj: Mapping[str, Any]) -> bytes:
    """Compact JSON bytes; raises PayloadTooLarge over MAX_PAYLOAD_BYTES."""
    data = _ENCODER.encode(obj).encode()
    if len(data) > MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(f"payload of {len(data)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    return data


# Integers that survive float(x) unchanged: for these `_num` and `_int` are the identity (or 0).
_EXACT = 2**53


def _num(x: float | None, digits: int = 1) -> float | int | None:
    """Round for the wire; integral values lose their `.0`; NaN/inf (a sensor bug) → None."""
    # Fast paths for the usual values, ~60 a tick; the same results as the generic code below.
    # round(x, digits) goes through decimal conversion, costly: an integral float is already round.
    if type(x) is float:
        if x.is_integer():
            return int(x)
        if x - x == 0.0:  # finite (inf - inf and NaN - NaN are NaN)
            r = round(x, digits)
            return int(r) if r.is_integer() else r
        return None
    if type(x) is int and -_EXACT <= x <= _EXACT:
        return x
    if x is None or isinstance(x, bool) or not math.isfinite(x):
        return None
    r = round(float(x), digits)
    return int(r) if r.is_integer() else r


def _int(x: float | None) -> int | None:
    """Non-negative integer (rates, counts); None for missing or non-finite."""
    if type(x) is float:  # fast paths, as in `_num`
        if x - x == 0.0:
            r = round(x)
            return r if r > 0 else 0
        return None
    if type(x) is int and -_EXACT <= x <= _EXACT:
        return x if x > 0 else 0
    if x is None or isinstance(x, bool) or not math.isfinite(x):
        return None
    return max(0, int(round(x)))


def _text(s: object, limit: int = MAX_TEXT) -> str | None:
    return None if s is None else str(s)[:limit]


def _layout_id(sample: Sample) -> str:
    key = json.dumps([[[g.index, g.uuid] for g in sample.gpus], [[p.device, p.port] for p in sample.ib]])
    return hashlib.blake2s(key.encode(), digest_size=4).hexdigest()


# layout_id() runs twice a tick (the publisher's check, then the payload) on what is nearly always
# the same layout: keep the last few. The key holds the raw values; it is only used when they are
# plain ints and strs, whose equality means equal JSON (1 == 1.0 == True would not).
_LAYOUTS: dict[tuple, str] = {}
_INT = {int}
_STR = {str}
_STR_OR_NONE = {str, type(None)}


def layout_id(sample: Sample) -> str:
    """8 hex digits naming what the sample's arrays are indexed by (GPUs by UUID, IB ports).

    A `sample` carries it as `lay` and the `inventory` as `layout`: a reader whose inventory has
    another layout knows its inventory is stale rather than mislabel a port or GPU.
    """
    index = [g.index for g in sample.gpus]
    uuid = [g.uuid for g in sample.gpus]
    device = [p.device for p in sample.ib]
    port = [p.port for p in sample.ib]
    if not (set(map(type, index + port)) <= _INT and set(map(type, uuid)) <= _STR_OR_NONE
            and set(map(type, device)) <= _STR):
        return _layout_id(sample)
    key = (tuple(index), tuple(uuid), tuple(device), tuple(port))
    lay = _LAYOUTS.get(key)
    if lay is None:
        if len(_LAYOUTS) >= 8:
            _LAYOUTS.clear()
        lay = _LAYOUTS[key] = _layout_id(sample)
    return lay


def status_payload(state: str, *, version: str, interval_s: float, ts: float, reason: str | None = None) -> bytes:
    """`status`: `online` or `offline`; `reason` says why offline ("stopped" clean, "lost" the will)."""
    if state not in STATUS_STATES:
        raise ValueError(f"status state {state!r}: expected online or offline")
    out: dict[str, Any] = {"schema": SCHEMA, "ts": _num(ts, 3), "state": state,
                           "version": _text(version), "interval_s": _num(interval_s, 3)}
    if reason is not None:
        out["reason"] = _text(reason, 32)
    return encode(out)


_RANGES = [list(range(n)) for n in range(MAX_LINKS + 1)]


def _links_by_number(g) -> tuple[Sequence, bool]:
    """The GPU's links placed at their link number (arrays on the wire are indexed by link), and
    whether every slot holds one (no gaps in the numbering)."""
    nv = g.nvlink
    nums = [lk.link for lk in nv]
    # Usually the links come numbered 0..n-1 in order: they are already in place.
    if 0 < len(nums) <= MAX_LINKS and nums == _RANGES[len(nums)] and set(map(type, nums)) == _INT:
        return nv, True
    links = [lk for lk in nv if 0 <= lk.link < MAX_LINKS]
    slots: list = [None] * (max((lk.link for lk in links), default=-1) + 1)
    for lk in links:
        slots[lk.link] = lk
    return slots, not any(lk is None for lk in slots)


def _ref_mbps(g, links) -> int | None:
    """The link speed that counts as 100 %: the fastest up link's, else the model's spec speed."""
    speeds = [lk.speed_mbps for lk in links if lk is not None and lk.active and lk.speed_mbps]
    if speeds:
        return int(max(speeds))
    spec = gpu_spec_for(g.name)
    return spec.nvlink_link_mbps if spec is not None else None


def _pct(rate: float | None, ref_mbps: int | None) -> int | None:
    if rate is None or ref_mbps is None or not math.isfinite(rate):
        return None
    return min(LINK_PCT_MAX, max(0, round(rate / (ref_mbps * 1e4))))  # B/s ÷ (MB/s × 1e6 / 100)


def _pcts(rates: list, ref: int | None) -> list:
    """`_pct` of each rate, all of them finite numbers (the usual case): the checks `_pct` makes
    per rate can be skipped, and the clamp tested once for the whole list."""
    if ref is None:
        return [None] * len(rates)
    d = ref * 1e4
    pcts = [round(r / d) for r in rates]
    if pcts and (min(pcts) < 0 or max(pcts) > LINK_PCT_MAX):
        pcts = [min(LINK_PCT_MAX, max(0, q)) for q in pcts]
    return pcts


def _rises(deltas: Mapping[str, int | None]) -> dict[str, int]:
    """Only counters that rose: a quiet link costs no bytes."""
    return {_text(k, 32): int(v) for k, v in deltas.items() if v is not None and v > 0}


def _sum(values: Iterable[float | None]) -> int | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return _int(sum(vals)) if vals else None


def _sum_or_nan(values: list) -> float:
    try:
        return sum(values)
    except TypeError:
        return math.nan


def _may_rise(deltas: list) -> bool:
    """False when no link of a GPU can have an error counter rise (no delta is non-zero).

    Usually every link's deltas are equal (dict == dict runs in C) and all zero; else any() over
    the values, still without a Python call per link. True wrongly only costs the exact search.
    """
    first = deltas[0]
    if deltas.count(first) == len(deltas):
        return any(first.values())
    return any(map(any, map(_values, deltas)))


_values = operator.methodcaller("values")  # as `.values()`: any mapping, AttributeError on None


def _findings(findings: Iterable[Finding]) -> list[list]:
    """The warning and critical findings as `[code, severity, gpu, link, device, port]`, trailing
    nulls left out (info findings describe the board: the inventory has that)."""
    out: list[list] = []
    for f in findings:
        if f.severity == Severity.INFO:
            continue
        row = [_text(f.code, 64), str(f.severity), f.gpu, f.link, _text(f.device, 64), f.port]
        while row[-1] is None:
            row.pop()
        out.append(row)
        if len(out) == MAX_FINDINGS:
            break
    return out


# (key, getter, digits, divisor) of every per-GPU array the catalog gives a wire key (digits None: an
# integer), in catalog order; and (key, getter) of the static metrics the inventory carries.
_GPU_ARRAYS = tuple((m.wire, m.get, m.wire_digits, m.wire_divisor) for m in GPU_WIRE)
_GPU_FACTS = tuple((m.wire, m.get) for m in GPU_WIRE_FACTS)
# The per-GPU columns a sample may send as one number when every GPU has that value (a board's
# limits, PCIe gen and width, link speed and clocks usually agree): all but `p`, whose length is
# the sample's GPU count.
_UNIFORM = tuple(key for key, *_ in _GPU_ARRAYS if key != "p") + ("nt", "nr", "ls")


def sample_payload(sample: Sample, findings: Iterable[Finding] = ()) -> bytes:
    """`sample`: one tick, compact. Keys in docs/wire.md ("sample"); arrays are per GPU / per port.
    `findings`: the node's audit of this sample (`nvmon.audit`), carried as `f`.

    This runs every tick over every link (144 on an HGX H100), so the per-link work is done a column
    at a time with list comprehensions, and the sparse maps (down links, odd speeds, error rises)
    are only searched link by link when a whole-column test says a GPU has an entry.
    """
    gpus = sorted(sample.gpus, key=lambda g: g.index)
    nt: list = []
    nr: list = []
    ls: list = []
    lt: list = []
    lr: list = []
    ld: dict = {}
    lq: dict = {}
    lv: dict = {}
    le: dict = {}
    for g in gpus:
        links, full = _links_by_number(g)
        if not links:  # a lost GPU reports none
            nt.append(None), nr.append(None), ls.append(None), lt.append([]), lr.append([])
            continue
        gi = str(g.index)
        present = links if full else [lk for lk in links if lk is not None]
        tx = [lk.tx_bytes_per_s for lk in present]
        rx = [lk.rx_bytes_per_s for lk in present]
        acts = [lk.active for lk in present]
        speeds = [lk.speed_mbps for lk in present]
        n_links, s0 = len(speeds), speeds[0]
        # The usual GPU: every link up (`== True`: truthy, and neither False nor None) at one
        # whole speed. Then that speed is the reference and no link is down, unknown or odd.
        uniform = acts.count(True) == n_links and speeds.count(s0) == n_links and s0 and s0 == int(s0)
        if uniform:
            ref = int(s0)
        else:
            up_speeds = [s for a, s in zip(acts, speeds) if a and s]
            ref = int(max(up_speeds)) if up_speeds else _ref_mbps(g, links)
        # A sum is finite only when every term is: then no rate needs its own check (an unknown
        # rate, None, makes sum() raise: the first tick has no rates).
        tx_sum, rx_sum = _sum_or_nan(tx), _sum_or_nan(rx)
        tx_ok, rx_ok = tx_sum - tx_sum == 0.0, rx_sum - rx_sum == 0.0
        nt.append(_int(tx_sum) if tx_ok else _sum(tx))
        nr.append(_int(rx_sum) if rx_ok else _sum(rx))
        ls.append(ref)
        if full and tx_ok and rx_ok and ref is not None:
            # Both directions in one list: one comprehension and one clamp test per GPU.
            pcts = _pcts(tx + rx, ref)
            lt.append(pcts[:n_links])
            lr.append(pcts[n_links:])
        elif full:
            lt.append(_pcts(tx, ref) if tx_ok else [_pct(r, ref) for r in tx])
            lr.append(_pcts(rx, ref) if rx_ok else [_pct(r, ref) for r in rx])
        else:
            lt.append([None if lk is None else _pct(lk.tx_bytes_per_s, ref) for lk in links])
            lr.append([None if lk is None else _pct(lk.rx_bytes_per_s, ref) for lk in links])
        # `x in list` and count() compare with ==, so these tests may let a GPU through that has
        # no entry (an active of 0), never hold one back; the link-by-link search below is exact.
        if not uniform and (None in acts or False in acts):
            if down := [n for n, lk in enumerate(links) if lk is not None and lk.active is False]:
                ld[gi] = down
            if unknown := [n for n, lk in enumerate(links) if lk is not None and lk.active is None]:
                lq[gi] = unknown
        if not uniform and speeds.count(ref) != n_links:
            for n, lk in enumerate(links):
                if lk is not None and lk.active and lk.speed_mbps and lk.speed_mbps != ref:
                    lv[f"{gi}.{n}"] = int(lk.speed_mbps)
        if _may_rise([lk.errors_delta for lk in present]):
            for n, lk in enumerate(links):
                if lk is not None and (rose := _rises(lk.errors_delta)):
                    le[f"{gi}.{n}"] = rose

    out: dict[str, Any] = {"schema": SCHEMA, "ts": _num(sample.ts, 3), "dt": _num(sample.interval_s, 3),
                           "lay": layout_id(sample)}
    if [g.index for g in gpus] != list(range(len(gpus))):
        out["gi"] = [g.index for g in gpus]
    for key, get, digits, per in _GPU_ARRAYS:  # the catalog's per-GPU values: p, pl, t, u, pg, pw, pt, pr, ...
        values = [get(g) for g in gpus]
        if per is not None:  # in the units docs/wire.md gives (sc: MHz, fb: MiB)
            values = [None if v is None else v / per for v in values]
        out[key] = [_int(v) for v in values] if digits is None else [_num(v, digits) for v in values]
    out["nt"], out["nr"], out["ls"], out["lt"], out["lr"] = nt, nr, ls, lt, lr
    if len(gpus) > 1:  # uniform columns as one number (docs/wire.md); `p` stays a list: it gives the count
        for key in _UNIFORM:
            col = out[key]
            if col.count(col[0]) == len(col) and col[0] is not None:
                out[key] = col[0]
    if lost := [g.index for g in gpus if g.lost]:
        out["lost"] = lost
    pe = {str(g.index): int(g.pcie.replay_errors_delta) for g in gpus if g.pcie.replay_errors_delta}
    th = {str(g.index): None if g.throttle_reasons is None else [_text(r, 32) for r in g.throttle_reasons]
          for g in gpus if g.throttle_reasons is None or g.throttle_reasons}
    xe = {str(g.index): [int(x) for x in g.xid_events[:MAX_XID_EVENTS]] for g in gpus if g.xid_events}
    for k, v in (("ld", ld), ("lq", lq), ("lv", lv), ("le", le), ("pe", pe), ("th", th), ("xe", xe)):
        if v:
            out[k] = v

    ib = sample.ib
    ib_state: dict[str, list] = {}
    ib_err: dict[str, dict] = {}
    for n, p in enumerate(ib):
        if (p.state, p.phys_state) != IB_UP:
            ib_state[str(n)] = [_text(p.state, 32), _text(p.phys_state, 32)]
        if any(p.errors_delta.values()) and (rose := _rises(p.errors_delta)):
            ib_err[str(n)] = rose
    out["ig"] = [_num(p.rate_gbps) for p in ib]
    out["it"] = [_int(p.tx_bytes_per_s) for p in ib]
    out["ir"] = [_int(p.rx_bytes_per_s) for p in ib]
    if ib_state:
        out["is"] = ib_state
    if ib_err:
        out["ie"] = ib_err
    h = sample.host
    out["h"] = [_num(h.cpu_pct), _num(h.mem_used_pct), _num(h.load1, 2)]
    if not sample.nvml.available:
        out["nv"] = _text(sample.nvml.error or "unavailable")
    if findings and (rows := _findings(findings)):
        out["f"] = rows
    return encode(out)


def _pcie(p, *, current: bool) -> dict[str, Any]:
    d = {"max_gen": p.max_gen, "max_width": p.max_width}
    if current:  # static devices (HCAs, switches): the trained link is a fact of the box
        d = {"gen": p.gen, "width": p.width, **d}
    if p.device_max_gen is not None:
        d["device_max_gen"] = p.device_max_gen
    return d


def _spec_dict(sample: Sample, spec: NodeSpec | None) -> dict[str, Any]:
    models = []
    for name in dict.fromkeys(g.name for g in sample.gpus if g.name):
        s = gpu_spec_for(name)
        models.append({"model": _text(name), "key": None} if s is None else {
            "model": _text(name), "key": s.key, "nvlink_links": s.nvlink_links,
            "nvlink_version": s.nvlink_version, "nvlink_link_mbps": s.nvlink_link_mbps,
            "power_limit_w": s.power_limit_w, "pcie_gen": s.pcie_gen, "pcie_width": s.pcie_width,
            "board": s.board})
    node = None if spec is None else {"gpus": spec.gpus, "ib_ports": spec.ib_ports,
                                      "ib_rate_gbps": spec.ib_rate_gbps, "topology": spec.topology}
    return {"node": node, "models": models}


def _check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    labels = dict(labels or {})
    if len(labels) > MAX_LABELS:
        raise ValueError(f"{len(labels)} labels: at most {MAX_LABELS}")
    for k, v in labels.items():
        if not isinstance(k, str) or not isinstance(v, str) or not 0 < len(k) <= MAX_NAME or len(v) > MAX_TEXT:
            raise ValueError(f"label {str(k)[:40]!r}: keys 1-{MAX_NAME} chars, values up to {MAX_TEXT}, both text")
    return labels


def inventory_payload(sample: Sample, *, cluster: str, rack: str | None = None,
                      labels: Mapping[str, str] | None = None, spec: NodeSpec | None = None,
                      ts: float | None = None) -> bytes:
    """`inventory`: the node's static facts, read from a `Sample` (any tick will do).

    `rack` and `labels` come from configuration; `spec` is the expected node spec (the per-GPU
    spec comes from each model). Raises ValueError on a bad cluster/node name or labels.
    """
    if not valid_name(cluster) or not valid_name(sample.node):
        raise ValueError(f"cluster {cluster!r} / node {sample.node!r}: use 1-64 of A-Z a-z 0-9 . _ -")
    if rack is not None and (not isinstance(rack, str) or len(rack) > MAX_NAME):
        raise ValueError(f"rack {str(rack)[:40]!r}: text up to {MAX_NAME} characters")
    gpus = []
    for g in sorted(sample.gpus, key=lambda g: g.index):
        gpus.append({
            "index": g.index, "model": _text(g.name), "uuid": _text(g.uuid), "serial": _text(g.serial),
            "bus_id": _text(g.pci_bus_id), "power_default_limit_w": _num(g.power_default_limit_w),
            "power_max_limit_w": _num(g.power_max_limit_w), "pcie": _pcie(g.pcie, current=False),
            "link_count": g.nvlink_count,
            **{key: _int(get(g)) for key, get in _GPU_FACTS},  # the catalog's static metrics
            "links": [{"link": lk.link, "version": lk.version, "speed_mbps": lk.speed_mbps,
                       "remote_type": _text(lk.remote_type, 32), "remote_bus_id": _text(lk.remote_pci_bus_id)}
                      for lk in g.nvlink if 0 <= lk.link < MAX_LINKS],
        })
    topo = sample.topology
    out = {
        "schema": SCHEMA, "ts": _num(sample.ts if ts is None else ts, 3), "node": sample.node,
        "cluster": cluster, "rack": rack, "labels": _check_labels(labels), "layout": layout_id(sample),
        "gpus": gpus,
        "topology": {"class": _text(topo.class_, 32), "matrix": [[_text(c, 16) for c in row] for row in topo.matrix],
                     "nvswitch_links": list(topo.nvswitch_links)},
        "ib": [{"device": _text(p.device), "port": p.port, "link_layer": _text(p.link_layer, 32),
                "rate_gbps": _num(p.rate_gbps), "rate_name": _text(p.rate_name, 32), "bus_id": _text(p.pci_bus_id),
                "pcie": _pcie(p.pcie, current=True)} for p in sample.ib],
        "nvswitches": [{"bus_id": _text(s.pci_bus_id), "kind": _text(s.kind, 32), "pcie": _pcie(s.pcie, current=True)}
                       for s in sample.nvswitches],
        "spec": _spec_dict(sample, spec),
        "fabric": fabric_domain(sample).as_dict(),  # the node's NVLink domain (docs/wire.md)
        "host": {"hostname": _text(sample.host.hostname), "kernel": _text(sample.host.kernel)},
        "nvml": {"driver_version": _text(sample.nvml.driver_version), "nvml_version": _text(sample.nvml.nvml_version),
                 "error": None if sample.nvml.available else _text(sample.nvml.error or "unavailable")},
    }
    return encode(out)




def _alert_dict(a: Alert) -> dict[str, Any]:
    if a.severity not in ALERT_SEVERITIES or a.state not in ALERT_STATES:
        raise ValueError(f"alert {a.fingerprint!r}: severity {a.severity!r} / state {a.state!r} not in the contract")
    d: dict[str, Any] = {"fingerprint": _text(a.fingerprint, MAX_NAME), "code": _text(a.code, MAX_NAME),
                         "severity": a.severity, "state": a.state, "summary": _text(a.summary, MAX_SUMMARY),
                         "since": _num(a.since, 3)}
    if a.starts_at is not None:
        d["starts_at"] = _num(a.starts_at, 3)
    for k in ("gpu", "link", "device", "port"):
        if (v := getattr(a, k)) is not None:
            d[k] = _text(v) if k == "device" else v
    if a.labels:
        d["labels"] = _check_labels(a.labels)
    return d


def alerts_payload(alerts: Iterable[Alert], ts: float) -> bytes:
    """`alerts`: the full active set, most severe first. Past the size limit the least severe
    (then newest) alerts are left out and counted in `omitted`, so the set never fails to publish."""
    items = sorted(alerts, key=lambda a: (Severity.rank_of(a.severity), a.since, a.fingerprint))
    encoded = [encode(_alert_dict(a)) for a in items]
    ts_text = json.dumps(_num(ts, 3))
    # The envelope is at its largest when every alert is omitted (most digits in `omitted`).
    budget = MAX_PAYLOAD_BYTES - len(f'{{"schema":{SCHEMA},"ts":{ts_text},"omitted":{len(encoded)},"alerts":[]}}')
    keep = 0
    for e in encoded:
        budget -= len(e) + (1 if keep else 0)  # the comma between items
        if budget < 0:
            break
        keep += 1
    head = f'{{"schema":{SCHEMA},"ts":{ts_text},"omitted":{len(encoded) - keep},"alerts":['
    return head.encode() + b",".join(encoded[:keep]) + b"]}"
