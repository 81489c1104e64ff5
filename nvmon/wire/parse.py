"""Read MQTT messages of the contract into typed, frozen dataclasses — or refuse them.

`parse_message(topic, payload)` validates everything a hostile or broken publisher could send:
size, encoding, JSON syntax, NaN/Infinity, absurd numbers and counts, wrong types, unknown
schema, a payload whose node or cluster disagrees with its topic. It raises only `WireError`
(one line, safe to log). Strings are kept as data — escape sequences and markup included —
bounded in length; displaying them literally is the view's job. Unknown keys are ignored so that
schema 1 can grow compatible fields.

Hand-written checks rather than a validation library: the rules are few, and the sample format
is columnar (parallel arrays, sparse maps keyed "G.L") which schema libraries describe poorly.
"""

from __future__ import annotations

import re

from nvmon.wire.checks import (
    MAX_RATE,
    MAX_TS,
    array,
    int_rows,
    integer,
    ints,
    labels,
    loads,
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
    MAX_GPUS,
    MAX_IB_PORTS,
    MAX_INDEX,
    MAX_LINKS,
    MAX_NAME,
    MAX_NVSWITCHES,
    MAX_SUMMARY,
    MAX_XID,
    MAX_XID_EVENTS,
    SCHEMA,
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
    Status,
    SwitchInfo,
    Tick,
    WireError,
    parse_topic,
)

# Sparse-map keys of a sample: "G" (GPU index or port position) and "G.L" (GPU.link).
_G = re.compile(r"\d{1,4}", re.ASCII)
_GL = re.compile(r"(\d{1,4})\.(\d{1,3})", re.ASCII)
_LAYOUT = re.compile(r"[0-9a-f]{1,16}")


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
    )


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
    )


def _deltas(v: object, path: str) -> dict[str, int]:
    return {text(k, f"{path} key", 32, null=False): integer(x, f"{path}.{k}", null=False)
            for k, x in obj(v, path, 16).items()}


class _SampleReader:
    """Reads the columnar `sample` payload; sparse-map keys are checked against the GPU set."""

    def __init__(self, d: dict):
        self.d = d
        self.n = len(array(d.get("p"), "p", MAX_GPUS))
        gi = d.get("gi")
        self.index = (list(range(self.n)) if gi is None else
                      [integer(x, "gi", 0, MAX_INDEX, null=False) for x in array(gi, "gi", MAX_GPUS, length=self.n)])
        if len(set(self.index)) != self.n:
            raise WireError("gi: GPU indices repeat")
        self.pos = {g: i for i, g in enumerate(self.index)}

    def ints(self, key: str, hi: int) -> tuple:
        return ints(self.d.get(key), key, 0, hi, MAX_GPUS, length=self.n)

    def nums(self, key: str, lo: float, hi: float) -> tuple:
        return nums(self.d.get(key), key, lo, hi, MAX_GPUS, length=self.n)

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
            out[g] = tuple(integer(x, f"{key}.{k}", 0, lengths[g] - 1, null=False)
                           for x in array(v, f"{key}.{k}", MAX_LINKS))
        return out


def _tick(d: dict, cluster: str, node: str, ts: float) -> Tick:
    r = _SampleReader(d)
    col = {k: r.nums(k, 0, 1e5) for k in ("p", "pl")}
    col["t"] = r.nums("t", -100, 300)
    col["u"] = r.nums("u", 0, 1000)
    for k in ("pg", "pw"):
        col[k] = r.ints(k, 64)
    for k in ("pt", "pr", "nt", "nr"):
        col[k] = r.ints(k, int(MAX_RATE))
    col["ls"] = r.ints("ls", 10**7)
    for k in ("lt", "lr"):
        col[k] = int_rows(d.get(k), k, 0, LINK_PCT_MAX, r.n, MAX_LINKS)
    lengths = {g: len(col["lt"][i]) for g, i in r.pos.items()}
    if any(len(col["lr"][i]) != len(col["lt"][i]) for i in range(r.n)):
        raise WireError("lt/lr: a GPU's tx and rx arrays differ in length")
    lost = {r.gpu_key(str(integer(x, "lost", 0, MAX_INDEX, null=False)), "lost") for x in array(d.get("lost", []), "lost", MAX_GPUS)}
    down, unknown = r.links("ld", lengths), r.links("lq", lengths)
    speeds: dict[int, dict[int, int | None]] = {}
    for k, v in r.sparse("lv").items():
        g, link = r.link_key(k, "lv", lengths)
        speeds.setdefault(g, {})[link] = integer(v, f"lv.{k}", 0, 10**7)
    errors: dict[int, dict[int, dict[str, int]]] = {}
    for k, v in r.sparse("le").items():
        g, link = r.link_key(k, "le", lengths)
        errors.setdefault(g, {})[link] = _deltas(v, f"le.{k}")
    replay = {r.gpu_key(k, "pe"): integer(v, f"pe.{k}", null=False) for k, v in r.sparse("pe").items()}
    throttle: dict[int, tuple[str, ...] | None] = {}
    for k, v in r.sparse("th").items():
        throttle[r.gpu_key(k, "th")] = None if v is None else tuple(
            text(x, f"th.{k}", 32, null=False) for x in array(v, f"th.{k}", 16))
    xid_events = {r.gpu_key(k, "xe"): tuple(integer(x, f"xe.{k}", 0, MAX_XID, null=False)
                                             for x in array(v, f"xe.{k}", MAX_XID_EVENTS))
                  for k, v in r.sparse("xe").items()}
    gpus = []
    for i, g in enumerate(r.index):
        gpus.append(GpuTick(
            index=g, lost=g in lost, power_w=col["p"][i], power_limit_w=col["pl"][i], temperature_c=col["t"][i],
            utilization_pct=col["u"][i], throttle_reasons=throttle.get(g, ()), pcie_gen=col["pg"][i],
            pcie_width=col["pw"][i], pcie_tx_bytes_per_s=col["pt"][i], pcie_rx_bytes_per_s=col["pr"][i],
            pcie_replay_delta=replay.get(g, 0), nvlink_tx_bytes_per_s=col["nt"][i], nvlink_rx_bytes_per_s=col["nr"][i],
            link_ref_mbps=col["ls"][i], link_tx_pct=col["lt"][i], link_rx_pct=col["lr"][i],
            links_down=down.get(g, ()), links_unknown=unknown.get(g, ()), link_speed_mbps=speeds.get(g, {}),
            link_errors=errors.get(g, {}), xid_events=xid_events.get(g, ()),
        ))
    rates = nums(d.get("ig", []), "ig", 0, 1e5, MAX_IB_PORTS)
    m = len(rates)
    tx = ints(d.get("it", []), "it", 0, int(MAX_RATE), MAX_IB_PORTS, length=m)
    rx = ints(d.get("ir", []), "ir", 0, int(MAX_RATE), MAX_IB_PORTS, length=m)
    states: dict[int, tuple[str | None, str | None]] = {}
    for k, v in obj(d.get("is") or {}, "is", MAX_IB_PORTS).items():
        st = array(v, f"is.{k}", 2, length=2)
        states[_port_key(k, m, "is")] = (text(st[0], f"is.{k}", 32), text(st[1], f"is.{k}", 32))
    ib_err = {_port_key(k, m, "ie"): _deltas(v, f"ie.{k}") for k, v in obj(d.get("ie") or {}, "ie", MAX_IB_PORTS).items()}
    ib = tuple(IbTick(index=i, rate_gbps=rates[i], tx_bytes_per_s=tx[i], rx_bytes_per_s=rx[i],
                      state=states.get(i, ("ACTIVE", "LinkUp"))[0], phys_state=states.get(i, ("ACTIVE", "LinkUp"))[1],
                      errors_delta=ib_err.get(i, {})) for i in range(m))
    h = array(d.get("h", [None, None, None]), "h", 3, length=3)
    return Tick(cluster=cluster, node=node, ts=ts, interval_s=number(d.get("dt"), "dt", 0, 86400, null=False),
                layout=_layout(d.get("lay")), gpus=tuple(gpus), ib=ib,
                cpu_pct=number(h[0], "h[0]", hi=1e4), mem_used_pct=number(h[1], "h[1]", hi=1e3),
                load1=number(h[2], "h[2]", hi=1e6), nvml_error=text(d.get("nv"), "nv"))


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
    d = loads(payload)
    if not isinstance(d, dict):
        raise WireError(f"{kind}: expected a JSON object, got {type(d).__name__}")
    schema = d.get("schema")
    if type(schema) is not int or schema != SCHEMA:
        raise WireError(f"{kind}: unknown schema {str(schema)[:12]!r} (this reader knows {SCHEMA})")
    ts = number(d.get("ts"), "ts", 0, MAX_TS, null=False)
    return _READERS[kind](d, cluster, node, ts)
