"""Read MQTT messages of the contract into typed, frozen dataclasses — or refuse them.

`parse_message(topic, payload)` validates everything a hostile or broken publisher could send:
size, encoding, JSON syntax, NaN/Infinity, absurd numbers and counts, wrong types, unknown
schema, a payload whose node or cluster disagrees with its topic. It raises only `WireError`
(one line, safe to log). Strings are kept as data — escape sequences and markup included —
bounded in length; displaying them literally is the view's job. Unknown keys are ignored so that
schema 1 can grow compatible fields.

Hand-written checks rather than a validation library: the rules are few, and the sample format
is columnar (parallel arrays, sparse maps keyed "G.L") which schema libraries describe poorly.
Samples of the usual shape are first offered to a compiled reader with the same bounds
(`nvmon.wire.parse_fast`, msgspec): it reads them in less than half the time and leaves everything
else, refusals included, to the checks here.
"""

from __future__ import annotations

import re
from itertools import chain

from nvmon.catalog import GPU_WIRE_FACTS, GPU_WIRE_READ
from nvmon.wire.checks import (
    MAX_RATE,
    MAX_TS,
    all_ints,
    array,
    envelope,
    int_rows,
    integer,
    ints,
    labels,
    number,
    nums,
    obj,
    plain,
    text,
)
from nvmon.wire.contract import (
    ALERT_SEVERITIES,
    ALERT_STATES,
    LINK_PCT_MAX,
    MAX_ALERTS,
    MAX_FINDINGS,
    MAX_GPUS,
    MAX_IB_PORTS,
    MAX_INDEX,
    MAX_LINKS,
    MAX_NAME,
    MAX_NVSWITCHES,
    MAX_SUMMARY,
    MAX_XID,
    MAX_XID_EVENTS,
    STATUS_STATES,
    Alert,
    AlertSet,
    GpuInfo,
    GpuTick,
    IbInfo,
    IbTick,
    Inventory,
    LinkInfo,
    Message,
    PcieInfo,
    TickFinding,
    Status,
    SwitchInfo,
    Tick,
    WireError,
    parse_topic,
)
from nvmon.wire.parse_fast import sample_tick

# Sparse-map keys of a sample: "G" (GPU index or port position) and "G.L" (GPU.link).
_G = re.compile(r"\d{1,4}", re.ASCII)
_GL = re.compile(r"(\d{1,4})\.(\d{1,3})", re.ASCII)
_LAYOUT = re.compile(r"[0-9a-f]{1,16}")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", re.ASCII)


def _pcie(v: object, path: str) -> PcieInfo:
    d = obj({} if v is None else v, path)
    return PcieInfo(**{k: integer(d.get(k), f"{path}.{k}", 0, 64)
                       for k in ("gen", "width", "max_gen", "max_width", "device_max_gen")})


# --- the four kinds ---------------------------------------------------------------------------


def _status(d: dict, cluster: str, node: str, ts: float) -> Status:
    state = d.get("state")
    if state not in STATUS_STATES:
        raise WireError(f"status.state: expected online or offline, got {str(state)[:20]!r}")
    return Status(cluster=cluster, node=node, ts=ts, state=state, version=text(d.get("version"), "version"),
                  interval_s=number(d.get("interval_s"), "interval_s", 0, 86400),
                  reason=text(d.get("reason"), "reason", 32))


def _link_info(v: object, path: str) -> LinkInfo:
    d = obj(v, path)
    return LinkInfo(link=integer(d.get("link"), f"{path}.link", 0, MAX_LINKS - 1, null=False),
                    version=integer(d.get("version"), f"{path}.version", 0, 64),
                    speed_mbps=integer(d.get("speed_mbps"), f"{path}.speed_mbps", 0, 10**7),
                    remote_type=text(d.get("remote_type"), f"{path}.remote_type", 32),
                    remote_bus_id=text(d.get("remote_bus_id"), f"{path}.remote_bus_id"))


def _gpu_info(v: object, path: str) -> GpuInfo:
    d = obj(v, path)
    return GpuInfo(
        index=integer(d.get("index"), f"{path}.index", 0, MAX_INDEX, null=False),
        model=text(d.get("model"), f"{path}.model"), uuid=text(d.get("uuid"), f"{path}.uuid"),
        serial=text(d.get("serial"), f"{path}.serial"), bus_id=text(d.get("bus_id"), f"{path}.bus_id"),
        power_default_limit_w=number(d.get("power_default_limit_w"), f"{path}.power_default_limit_w", 0, 1e5),
        power_max_limit_w=number(d.get("power_max_limit_w"), f"{path}.power_max_limit_w", 0, 1e5),
        pcie=_pcie(d.get("pcie"), f"{path}.pcie"),
        link_count=integer(d.get("link_count"), f"{path}.link_count", 0, MAX_LINKS),
        links=tuple(_link_info(x, f"{path}.links[{i}]")
                    for i, x in enumerate(array(d.get("links", []), f"{path}.links", MAX_LINKS))),
        facts=_gpu_facts(d, path),
    )


def _gpu_facts(d: dict, path: str) -> dict[str, float]:
    """The catalog's static metrics of one GPU (`sm_clock_max_hz`, `fb_total_bytes`, ...): numbers
    within MAX_RATE; a null or a missing key is left out."""
    out = {}
    for m in GPU_WIRE_FACTS:
        v = number(d.get(m.wire), f"{path}.{m.wire}")
        if v is not None:
            out[m.name] = v
    return out


def _inventory(d: dict, cluster: str, node: str, ts: float) -> Inventory:
    if d.get("node") != node or d.get("cluster") != cluster:
        raise WireError("inventory node/cluster disagree with the topic")
    layout = text(d.get("layout"), "layout", 16, null=False)
    if not _LAYOUT.fullmatch(layout):
        raise WireError("layout: expected hex digits")
    topo = obj(d.get("topology", {}), "topology")
    matrix = array(topo.get("matrix", []), "topology.matrix", MAX_GPUS)
    host = obj(d.get("host") or {}, "host")
    nvml = obj(d.get("nvml") or {}, "nvml")
    ib = []
    for i, x in enumerate(array(d.get("ib", []), "ib", MAX_IB_PORTS)):
        p, path = obj(x, f"ib[{i}]"), f"ib[{i}]"
        ib.append(IbInfo(device=text(p.get("device"), f"{path}.device", null=False),
                         port=integer(p.get("port"), f"{path}.port", 0, 255, null=False),
                         link_layer=text(p.get("link_layer"), f"{path}.link_layer", 32),
                         rate_gbps=number(p.get("rate_gbps"), f"{path}.rate_gbps", 0, 1e5),
                         rate_name=text(p.get("rate_name"), f"{path}.rate_name", 32),
                         bus_id=text(p.get("bus_id"), f"{path}.bus_id"), pcie=_pcie(p.get("pcie"), f"{path}.pcie")))
    switches = []
    for i, x in enumerate(array(d.get("nvswitches", []), "nvswitches", MAX_NVSWITCHES)):
        s = obj(x, f"nvswitches[{i}]")
        switches.append(SwitchInfo(bus_id=text(s.get("bus_id"), f"nvswitches[{i}].bus_id", null=False),
                                   kind=text(s.get("kind"), f"nvswitches[{i}].kind", 32, null=False),
                                   pcie=_pcie(s.get("pcie"), f"nvswitches[{i}].pcie")))
    fabric = {} if d.get("fabric") is None else obj(d["fabric"], "fabric")
    cluster_uuid = text(fabric.get("cluster_uuid"), "fabric.cluster_uuid", 36)
    if cluster_uuid is not None and not _UUID.fullmatch(cluster_uuid):
        raise WireError("fabric.cluster_uuid: expected a UUID (8-4-4-4-12 hex digits)")
    return Inventory(
        cluster=cluster, node=node, ts=ts, rack=text(d.get("rack"), "rack", MAX_NAME),
        labels=labels(d.get("labels"), "labels"), layout=layout,
        gpus=tuple(_gpu_info(x, f"gpus[{i}]") for i, x in enumerate(array(d.get("gpus", []), "gpus", MAX_GPUS))),
        topology_class=text(topo.get("class", "unknown"), "topology.class", 32, null=False),
        topology_matrix=tuple(tuple(text(c, f"topology.matrix[{i}]", 16, null=False)
                                    for c in array(row, f"topology.matrix[{i}]", MAX_GPUS))
                              for i, row in enumerate(matrix)),
        nvswitch_links=tuple(integer(x, "topology.nvswitch_links", 0, MAX_LINKS, null=False)
                             for x in array(topo.get("nvswitch_links", []), "topology.nvswitch_links", MAX_GPUS)),
        ib=tuple(ib), nvswitches=tuple(switches), spec=plain(d.get("spec") or {}, "spec"),
        hostname=text(host.get("hostname"), "host.hostname"), kernel=text(host.get("kernel"), "host.kernel"),
        driver_version=text(nvml.get("driver_version"), "nvml.driver_version"),
        nvml_version=text(nvml.get("nvml_version"), "nvml.nvml_version"),
        nvml_error=text(nvml.get("error"), "nvml.error"),
        fabric_cluster_uuid=cluster_uuid.lower() if cluster_uuid is not None else None,
        fabric_clique_id=integer(fabric.get("clique_id"), "fabric.clique_id", 0, 2**32 - 1),
    )


def _deltas(v: object, path: str) -> dict[str, int]:
    return {text(k, f"{path} key", 32, null=False): integer(x, f"{path}.{k}", null=False)
            for k, x in obj(v, path, 16).items()}


class _SampleReader:
    """Reads the columnar `sample` payload; sparse-map keys are checked against the GPU set."""

    def __init__(self, d: dict):
        self.d = d
        self.n = n = len(array(d.get("p"), "p", MAX_GPUS))
        gi = d.get("gi")
        if gi is None:
            self.index = list(range(n))
        else:
            self.index = ints(gi, "gi", 0, MAX_INDEX, MAX_GPUS, length=n, null=False)
            if len(set(self.index)) != n:
                raise WireError("gi: GPU indices repeat")
        self.pos = {g: i for i, g in enumerate(self.index)}

    def sparse(self, key: str) -> dict:
        return obj(self.d.get(key) or {}, key, MAX_GPUS * MAX_LINKS)

    def gpu_key(self, k: str, key: str) -> int:
        if not _G.fullmatch(k) or int(k) not in self.pos:
            raise WireError(f"{key}: key {k[:12]!r} is not a GPU index of this sample")
        return int(k)

    def link_key(self, k: str, key: str, lengths: dict[int, int]) -> tuple[int, int]:
        m = _GL.fullmatch(k)
        if not m or int(m.group(1)) not in self.pos or int(m.group(2)) >= lengths[int(m.group(1))]:
            raise WireError(f"{key}: key {k[:12]!r} is not GPU.LINK of this sample")
        return int(m.group(1)), int(m.group(2))

    def links(self, key: str, lengths: dict[int, int]) -> dict[int, tuple[int, ...]]:
        out: dict[int, tuple[int, ...]] = {}
        for k, v in self.sparse(key).items():
            g = self.gpu_key(k, key)
            out[g] = ints(v, f"{key}.{k}", 0, lengths[g] - 1, MAX_LINKS, null=False)
        return out


def _per_gpu(index: list, found: dict, default: object) -> list:
    """One value per GPU from a sparse map (most samples have none: skip the look-ups then)."""
    return [found.get(g, default) for g in index] if found else [default] * len(index)


def _fresh_dicts(index: list, found: dict) -> list:
    """Like `_per_gpu` with `{}` as default, a new dict for each GPU (ticks never share one)."""
    return [found[g] if g in found else {} for g in index] if found else [{} for _ in index]


_RATE = int(MAX_RATE)
_LIST = frozenset((list,))


def _tick(d: dict, cluster: str, node: str, ts: float) -> Tick:
    # The common case (no sparse keys, plain columns) is checked column by column in builtins
    # (see checks.ints/nums/int_rows); sparse maps are read only when present and non-empty.
    r = _SampleReader(d)
    n, index, get = r.n, r.index, d.get
    p = nums(get("p"), "p", 0, 1e5, MAX_GPUS, length=n)
    pl = nums(get("pl"), "pl", 0, 1e5, MAX_GPUS, length=n)
    t = nums(get("t"), "t", -100, 300, MAX_GPUS, length=n)
    u = nums(get("u"), "u", 0, 1000, MAX_GPUS, length=n)
    pg = ints(get("pg"), "pg", 0, 64, MAX_GPUS, length=n)
    pw = ints(get("pw"), "pw", 0, 64, MAX_GPUS, length=n)
    pt = ints(get("pt"), "pt", 0, _RATE, MAX_GPUS, length=n)
    pr = ints(get("pr"), "pr", 0, _RATE, MAX_GPUS, length=n)
    nt = ints(get("nt"), "nt", 0, _RATE, MAX_GPUS, length=n)
    nr = ints(get("nr"), "nr", 0, _RATE, MAX_GPUS, length=n)
    ls = ints(get("ls"), "ls", 0, 10**7, MAX_GPUS, length=n)
    lt, lr = get("lt"), get("lr")
    rows = lt + lr if type(lt) is list and type(lr) is list and len(lt) == n == len(lr) else None
    lt_lengths = list(map(len, lt)) if rows and set(map(type, rows)) <= _LIST else None
    # Both link arrays at once when they are plain ints of matching lengths; else one by one.
    if lt_lengths is None or lt_lengths != list(map(len, lr)) or max(lt_lengths) > MAX_LINKS or not all_ints(
            list(chain.from_iterable(rows)), 0, LINK_PCT_MAX):
        lt = int_rows(lt, "lt", 0, LINK_PCT_MAX, n, MAX_LINKS)
        lr = int_rows(lr, "lr", 0, LINK_PCT_MAX, n, MAX_LINKS)
        lt_lengths = list(map(len, lt))
        if lt_lengths != list(map(len, lr)):
            raise WireError("lt/lr: a GPU's tx and rx arrays differ in length")
    else:
        lt, lr = tuple(map(tuple, lt)), tuple(map(tuple, lr))
    lost: set[int] = set()
    if "lost" in d:
        lost = {r.gpu_key(str(x), "lost") for x in ints(d["lost"], "lost", 0, MAX_INDEX, MAX_GPUS, null=False)}
    down: dict[int, tuple[int, ...]] = {}
    unknown: dict[int, tuple[int, ...]] = {}
    speeds: dict[int, dict[int, int | None]] = {}
    errors: dict[int, dict[int, dict[str, int]]] = {}
    ld, lq, lv, le = get("ld"), get("lq"), get("lv"), get("le")
    if ld or lq or lv or le:
        lengths = dict(zip(index, lt_lengths))
        if ld:
            down = r.links("ld", lengths)
        if lq:
            unknown = r.links("lq", lengths)
        for k, v in r.sparse("lv").items():
            g, link = r.link_key(k, "lv", lengths)
            speeds.setdefault(g, {})[link] = integer(v, f"lv.{k}", 0, 10**7)
        for k, v in r.sparse("le").items():
            g, link = r.link_key(k, "le", lengths)
            errors.setdefault(g, {})[link] = _deltas(v, f"le.{k}")
    replay = ({r.gpu_key(k, "pe"): integer(v, f"pe.{k}", null=False) for k, v in r.sparse("pe").items()}
              if get("pe") else {})
    throttle: dict[int, tuple[str, ...] | None] = {}
    if get("th"):
        for k, v in r.sparse("th").items():
            throttle[r.gpu_key(k, "th")] = None if v is None else tuple(
                text(x, f"th.{k}", 32, null=False) for x in array(v, f"th.{k}", 16))
    xid_events = ({r.gpu_key(k, "xe"): ints(v, f"xe.{k}", 0, MAX_XID, MAX_XID_EVENTS, null=False)
                   for k, v in r.sparse("xe").items()} if get("xe") else {})
    gpus = tuple(map(
        GpuTick, index, [g in lost for g in index] if lost else [False] * n, p, pl, t, u,
        _per_gpu(index, throttle, ()), pg, pw, pt, pr, _per_gpu(index, replay, 0), nt, nr, ls, lt, lr,
        _per_gpu(index, down, ()), _per_gpu(index, unknown, ()), _fresh_dicts(index, speeds),
        _fresh_dicts(index, errors), _per_gpu(index, xid_events, ()), _catalog_values(get, n),
    ))
    rates = nums(get("ig", []), "ig", 0, 1e5, MAX_IB_PORTS)
    m = len(rates)
    tx = ints(get("it", []), "it", 0, _RATE, MAX_IB_PORTS, length=m)
    rx = ints(get("ir", []), "ir", 0, _RATE, MAX_IB_PORTS, length=m)
    states: dict[int, tuple[str | None, str | None]] = {}
    ib_err: dict[int, dict[str, int]] = {}
    if get("is"):
        for k, v in obj(d["is"], "is", MAX_IB_PORTS).items():
            st = array(v, f"is.{k}", 2, length=2)
            states[_port_key(k, m, "is")] = (text(st[0], f"is.{k}", 32), text(st[1], f"is.{k}", 32))
    if get("ie"):
        ib_err = {_port_key(k, m, "ie"): _deltas(v, f"ie.{k}") for k, v in obj(d["ie"], "ie", MAX_IB_PORTS).items()}
    ports = range(m)
    st = [states.get(i, _IB_UP) for i in ports] if states else [_IB_UP] * m
    ib = tuple(map(IbTick, ports, rates, tx, rx, [s[0] for s in st], [s[1] for s in st], _fresh_dicts(ports, ib_err)))
    h = array(get("h", _NO_HOST), "h", 3, length=3)
    return Tick(cluster, node, ts, number(get("dt"), "dt", 0, 86400, null=False), _layout(get("lay")), gpus, ib,
                number(h[0], "h[0]", hi=1e4), number(h[1], "h[1]", hi=1e3), number(h[2], "h[2]", hi=1e6),
                text(get("nv"), "nv"), _tick_findings(get("f")) if get("f") else ())


_CODE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)*")


def _tick_findings(v: object) -> tuple[TickFinding, ...]:
    """`f`: [[code, severity, gpu?, link?, device?, port?], ...] (trailing nulls may be left out)."""
    out = []
    for i, row in enumerate(array(v, "f", MAX_FINDINGS)):
        path = f"f[{i}]"
        if not isinstance(row, list) or not 2 <= len(row) <= 6:
            raise WireError(f"{path}: expected [code, severity, gpu, link, device, port]")
        code = text(row[0], path, 64, null=False)
        if not _CODE.fullmatch(code):
            raise WireError(f"{path}: bad finding code")
        if row[1] not in ALERT_SEVERITIES:
            raise WireError(f"{path}: unknown severity")
        row = row + [None] * (6 - len(row))
        out.append(TickFinding(code, row[1], integer(row[2], path, 0, MAX_INDEX), integer(row[3], path, 0, MAX_LINKS),
                               text(row[4], path, 64), integer(row[5], path, 0, MAX_INDEX)))
    return tuple(out)


_NO_VALUES: dict = {}  # shared by the GPUs of a tick that carries no catalog keys: read only


def _catalog_values(get, n: int) -> list:
    """Per GPU, the catalog metrics the tick carries (GPU_WIRE_READ), each checked against its
    `wire_range`: integers, or numbers where the catalog rounds them to digits."""
    columns = []
    for m in GPU_WIRE_READ:
        v = get(m.wire)
        if v is not None:
            lo, hi = m.wire_range
            col = ints(v, m.wire, int(lo), int(hi), MAX_GPUS, length=n) if m.wire_digits is None \
                else nums(v, m.wire, lo, hi, MAX_GPUS, length=n)
            if m.wire_divisor is not None:  # sent in the key's units: back to the metric's
                col = [None if x is None else x * m.wire_divisor for x in col]
            columns.append((m.name, col))
    if not columns:
        return [_NO_VALUES] * n
    return [{name: col[i] for name, col in columns} for i in range(n)]


_IB_UP = ("ACTIVE", "LinkUp")  # an IB port's (state, phys_state) unless the sample says otherwise
_NO_HOST = [None, None, None]  # only read: `array` wants a list
# The tick builders above pass fields by position: fail at import, not with shifted values, if the
# contract's field order ever changes.
if (tuple(GpuTick.__dataclass_fields__) != (
        "index", "lost", "power_w", "power_limit_w", "temperature_c", "utilization_pct", "throttle_reasons",
        "pcie_gen", "pcie_width", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "pcie_replay_delta",
        "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s", "link_ref_mbps", "link_tx_pct", "link_rx_pct",
        "links_down", "links_unknown", "link_speed_mbps", "link_errors", "xid_events", "values")
        or tuple(IbTick.__dataclass_fields__) != (
        "index", "rate_gbps", "tx_bytes_per_s", "rx_bytes_per_s", "state", "phys_state", "errors_delta")
        or tuple(Tick.__dataclass_fields__) != (
        "cluster", "node", "ts", "interval_s", "layout", "gpus", "ib", "cpu_pct", "mem_used_pct", "load1",
        "nvml_error", "findings")):
    raise ImportError("nvmon.wire.parse: GpuTick/IbTick/Tick fields changed; update _tick")


def _layout(v: object) -> str:
    s = text(v, "lay", 16, null=False)
    if not _LAYOUT.fullmatch(s):
        raise WireError("lay: expected hex digits")
    return s


def _port_key(k: str, m: int, key: str) -> int:
    if not _G.fullmatch(k) or int(k) >= m:
        raise WireError(f"{key}: key {k[:12]!r} is not a port position of this sample")
    return int(k)


def _alert(v: object, path: str) -> Alert:
    d = obj(v, path)
    sev, state = d.get("severity"), d.get("state")
    if sev not in ALERT_SEVERITIES or state not in ALERT_STATES:
        raise WireError(f"{path}: severity/state not in the contract")
    return Alert(fingerprint=text(d.get("fingerprint"), f"{path}.fingerprint", MAX_NAME, null=False),
                 code=text(d.get("code"), f"{path}.code", MAX_NAME, null=False), severity=sev, state=state,
                 summary=text(d.get("summary", ""), f"{path}.summary", MAX_SUMMARY, null=False),
                 since=number(d.get("since"), f"{path}.since", 0, MAX_TS, null=False),
                 gpu=integer(d.get("gpu"), f"{path}.gpu", 0, MAX_INDEX), link=integer(d.get("link"), f"{path}.link", 0, MAX_LINKS),
                 device=text(d.get("device"), f"{path}.device"), port=integer(d.get("port"), f"{path}.port", 0, 255),
                 labels=labels(d.get("labels"), f"{path}.labels"),
                 starts_at=number(d.get("starts_at"), f"{path}.starts_at", 0, MAX_TS))


def _alerts(d: dict, cluster: str, node: str, ts: float) -> AlertSet:
    items = array(d.get("alerts"), "alerts", MAX_ALERTS)
    return AlertSet(cluster=cluster, node=node, ts=ts,
                    alerts=tuple(_alert(x, f"alerts[{i}]") for i, x in enumerate(items)),
                    omitted=integer(d.get("omitted", 0), "omitted", 0, 10**9, null=False))


_READERS = {"status": _status, "inventory": _inventory, "sample": _tick, "alerts": _alerts}


def parse_message(topic: object, payload: object) -> Message:
    """Validate and decode one message; raises WireError (one line) for anything off-contract."""
    cluster, node, kind = parse_topic(topic)
    if kind == "sample" and (tick := sample_tick(payload, cluster, node)) is not None:
        return tick  # the compiled reader took it; anything else is read (or refused) below
    d = envelope(payload, kind)
    ts = number(d.get("ts"), "ts", 0, MAX_TS, null=False)
    return _READERS[kind](d, cluster, node, ts)
