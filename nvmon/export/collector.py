"""The metric families of one snapshot: a `prometheus_client` Collector over nvmon's `Sample`.

What is exported, and under which name, type and help text, is the catalog (`nvmon.catalog`); a
family that names a catalog metric is filled from its Sample value by one loop here; this module
fills the other families with values from a `Snapshot` (a sample plus byte counters integrated from
all samples so far) and from the daemon's `DaemonHealth`. Values nvmon could not read (None) are
left out, never reported as 0. The audit behind `nvmon_audit_findings` runs here, so once per
rendering, which `PrometheusExporter` keeps to once per sample.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample as PromSample

from nvmon.audit import RULES, Judge
from nvmon.audit import _is_active as ib_port_up  # one definition of a working port
from nvmon.catalog import BY_NAME, FAMILIES, getter
from nvmon.catalog.compat import Line, line
from nvmon.export.catalog import METRICS, NVMON_LABEL_NAMES
from nvmon.export.exposition import Labels
from nvmon.model import IB_ERROR_KINDS, NVLINK_ERROR_KINDS, GpuSample, Sample, fabric_flags
from nvmon.xid import XIDS

TOPOLOGY_CLASSES = ("nvswitch", "mesh", "pairs", "partial", "none", "unknown")
VERDICTS = ("ok", "warning", "critical", "unknown")
# DCGM's per-GPU NVLink error totals, by nvmon's error kind.
DCGM_NVLINK_ERRORS = {
    "crc_flit": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "crc_data": "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "replay": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "recovery": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
}
_NV = re.compile(r"NV(\d+)$")
# prometheus_client's Sample is a namedtuple: building it through tuple.__new__ skips a Python-level
# wrapper, and ~1200 of them are built per rendering. The defaults (timestamp, exemplar, ...) are
# read from the class, so a prometheus_client that adds a field keeps working.
_new_sample = tuple.__new__
_PAD = tuple(PromSample._field_defaults[f] for f in PromSample._fields[3:])


@dataclass(frozen=True, slots=True)
class DaemonHealth:
    """The daemon's own counters, as the exporter shows them (built by the daemon on demand)."""

    ticks: int = 0
    missed_ticks: int = 0
    sample_errors: int = 0
    sample_seconds: float = 0.0  # the latest sample's duration
    sample_seconds_total: float = 0.0  # over `ticks` samples
    stored: int = 0
    store_errors: int = 0
    store_dropped: int = 0
    store_resets: Mapping[str, int] | None = None  # reason (deleted, replaced, corrupt) → n; None: no store
    wire_dropped: int = 0
    mqtt_connected: bool | None = None  # None: no broker configured
    mqtt_published: int = 0
    mqtt_errors: int = 0
    mqtt_dropped: int = 0
    alerts: Mapping[tuple[str, str, str], int] | None = None  # (code, severity, state) → n; None: alerts off
    hooks: tuple[tuple[str, str, int, int, int], ...] = ()  # (hook, type, sent, failed, dropped)


@dataclass(frozen=True, slots=True)
class LinkBytes:
    """A GPU's NVLink byte counters, in the order of its links."""

    links: tuple[int, ...]  # link ids
    tx: list[float]
    rx: list[float]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One sample plus the byte counters integrated from every sample up to it."""

    sample: Sample
    nvlink_bytes: Mapping[int, LinkBytes]  # gpu index → its links' (tx, rx) bytes
    ib_bytes: Mapping[tuple[str, int], tuple[float, float]]  # (device, port) → (tx, rx) bytes
    last_xid: Mapping[int, int] = field(default_factory=dict)  # gpu index → the last Xid seen since start

    def link_bytes(self, gpu: int, link: int) -> tuple[float, float]:
        lb = self.nvlink_bytes[gpu]
        k = lb.links.index(link)
        return lb.tx[k], lb.rx[k]


def advance(prev: Snapshot | None, sample: Sample) -> Snapshot:
    """The next snapshot: byte counters grow by rate × the sample's interval (rates unknown on a
    tick — first tick, counter reset — add nothing, so the counters stay monotonic)."""
    dt = sample.interval_s if sample.interval_s > 0 else 0.0
    nv: dict[int, LinkBytes] = {}
    before = prev.nvlink_bytes if prev is not None else {}
    for g in sample.gpus:
        links = g.nvlink
        ids = tuple(map(_LINK_ID, links))
        old = before.get(g.index)
        if old is not None and old.links == ids:
            tx, rx = old.tx[:], old.rx[:]
        else:  # first sample, or the GPU's links changed: carry counts over by link id
            was = dict(zip(old.links, zip(old.tx, old.rx))) if old is not None else {}
            tx = [was.get(i, (0.0, 0.0))[0] for i in ids]
            rx = [was.get(i, (0.0, 0.0))[1] for i in ids]
        if dt:
            for k, link in enumerate(links):
                if link.tx_bytes_per_s:
                    tx[k] += link.tx_bytes_per_s * dt
                if link.rx_bytes_per_s:
                    rx[k] += link.rx_bytes_per_s * dt
        nv[g.index] = LinkBytes(ids, tx, rx)
    for index, old in before.items():  # a GPU missing from this sample keeps its counts for later
        nv.setdefault(index, old)
    ib = dict(prev.ib_bytes) if prev is not None else {}
    for p in sample.ib:
        key = (p.device, p.port)
        tx, rx = ib.get(key, (0.0, 0.0))
        if dt:
            tx += (p.tx_bytes_per_s or 0.0) * dt
            rx += (p.rx_bytes_per_s or 0.0) * dt
        ib[key] = (tx, rx)
    last_xid = prev.last_xid if prev is not None else {}
    if any(g.xid_events for g in sample.gpus):  # a new dict: snapshots are shared with the HTTP thread
        last_xid = {**last_xid, **{g.index: g.xid_events[-1] for g in sample.gpus if g.xid_events}}
    return Snapshot(sample, nv, ib, last_xid)


# (family, divisor) of every GPU family the catalog fills from a metric, and one getter of all
# their values (dcgm-exporter's units: NVML's PCIe throughput is in KB/s, KB = 1024 bytes).
_SIMPLE = tuple((fam.name, fam.divisor, fam.name.startswith("nvmon_")) for fam in FAMILIES
                if fam.metric is not None and fam.scope == "GPU")  # (family, divisor, nvmon's labels)
_SIMPLE_GET = getter([BY_NAME[fam.metric] for fam in FAMILIES if fam.metric is not None and fam.scope == "GPU"])
_LINK_ID = attrgetter("link")
_ACTIVE = attrgetter("active")
_SPEED = attrgetter("speed_mbps")
_ERRORS = attrgetter("errors")
_TX_RATE = attrgetter("tx_bytes_per_s")
_RX_RATE = attrgetter("rx_bytes_per_s")
_REPEAT_SAMPLE = repeat(PromSample)
_REPEAT_TX = repeat("nvmon_nvlink_tx_bytes_total")
_REPEAT_RX = repeat("nvmon_nvlink_rx_bytes_total")


def _pads() -> list:
    return [repeat(v) for v in _PAD]


def _known_sum(values: Iterable[float | None]) -> float | None:
    """Sum of the values that are known; None when none is."""
    got = [v for v in values if v is not None]
    return sum(got) if got else None


@dataclass(frozen=True, slots=True)
class _LinkState:
    """A GPU's rarely changing per-link facts, and the series built from them."""

    lls: tuple[Labels, ...]
    actives: list[bool | None]
    speeds: list[int | None]
    errors: list[dict[str, int | None]]
    ups: list[PromSample]
    errs: list[PromSample]
    active: int
    min_speed: float | None  # bytes/s
    kinds: dict[str, int | None]  # per-GPU error sums by kind; None when unknown on every link

    @classmethod
    def build(cls, lls, actives, speeds, errors) -> _LinkState:
        ups = [_new_sample(PromSample, ("nvmon_nvlink_up", ll, int(a)) + _PAD)
               for ll, a in zip(lls, actives) if a is not None]
        errs = []
        kinds: dict[str, int | None] = dict.fromkeys(NVLINK_ERROR_KINDS)
        for ll, errs_of_link in zip(lls, errors):
            link_sum = None  # one counter per link, all kinds together; DCGM's totals split by kind
            for kind, v in errs_of_link.items():
                if v is not None:
                    link_sum = (link_sum or 0) + v
                    kinds[kind] = (kinds.get(kind) or 0) + v
            if link_sum is not None:
                errs.append(_new_sample(PromSample, ("nvmon_nvlink_errors_total", ll, link_sum) + _PAD))
        active_speeds = [sp for a, sp in zip(actives, speeds) if a and sp is not None]
        return cls(lls, actives, speeds, errors, ups, errs, sum(1 for a in actives if a),
                   min(active_speeds) * 1_000_000 if active_speeds else None, kinds)


class _Families:
    """The catalogue's families for one rendering; `add` skips unknown (None) values."""

    def __init__(self) -> None:
        self.metrics: dict[str, tuple[list, str]] = {}
        self.families: list[Metric] = []
        for d in METRICS.values():
            name = d.name[:-6] if d.type == "counter" and d.name.endswith("_total") else d.name
            m = Metric(name, d.help, d.type)  # prometheus_client's convention: counter family without _total
            self.families.append(m)
            self.metrics[d.name] = (m.samples, d.name)

    def add(self, name: str, labels: Labels, value: float | int | None) -> None:
        if value is not None:
            samples, sample_name = self.metrics[name]
            samples.append(_new_sample(PromSample, (sample_name, labels, value) + _PAD))

    def samples(self, *names: str) -> list[list]:
        """The sample lists of these families, for hot loops that append directly."""
        return [self.metrics[n][0] for n in names]

    def add_summary(self, name: str, labels: Labels, count: int, total: float) -> None:
        samples, _ = self.metrics[name]
        samples.append(PromSample(name + "_count", labels, count))
        samples.append(PromSample(name + "_sum", labels, total))


class SampleCollector(Collector):
    """A `prometheus_client` collector over one snapshot (`snapshot`, set before each collect)."""

    def __init__(self, *, judge: Judge, node_info: Mapping[str, str], health: Callable[[], DaemonHealth | None],
                 compat: Line | None = None):
        from nvmon.model import THROTTLE_BITS

        self.compat = compat or line()  # the dcgm-exporter line the page copies ([prometheus] dcgm_compat)
        self._host = self.compat.host_label

        self.judge = judge  # the daemon's: its alerts and this page agree
        self.node_info = dict(node_info)
        self.health = health
        self.snapshot: Snapshot | None = None
        self.render_seconds: float | None = None  # wall time of the previous rendering
        self.renders = 0
        self.render_cpu_seconds = 0.0  # CPU time of all renderings so far
        self.compress_cpu_seconds = 0.0  # and of their compressions (set by the exporter)
        self._link_labels: dict[int, tuple] = {}  # per GPU: (its labels, link ids, per-link label sets)
        self._link_state: dict[int, _LinkState] = {}  # per GPU: link states and errors as last rendered
        self._bits = tuple((name, bit) for bit, name in THROTTLE_BITS)
        self._roots: dict[tuple, Labels] = {}  # label sets kept across renderings (see Labels)

    def _root(self, pairs: tuple[tuple[str, str], ...]) -> Labels:
        got = self._roots.get(pairs)
        if got is None:
            if len(self._roots) > 1024:
                self._roots.clear()
            got = self._roots[pairs] = Labels(dict(pairs))
        return got

    def collect(self) -> Iterable[Metric]:
        snap = self.snapshot
        if snap is None:
            return []
        f = _Families()
        s = snap.sample
        host = self._host
        node = self._root(((host, s.node),))
        self._node(f, s, node)
        gpu_labels = {}
        driver = ((self.compat.driver_label, s.nvml.driver_version or ""),) if self.compat.driver_label else ()
        for g in s.gpus:
            pairs = gpu_label_pairs(g, s.node, host)
            own = self._root(nvmon_label_pairs(pairs))  # nvmon_* labels
            lab = self._root(pairs + driver)  # DCGM_* labels: dcgm-exporter's driver label too
            gpu_labels[g.index] = own
            self._gpu(f, snap, g, lab, own)
        self._ib(f, snap, node)
        self._pci(f, s, node)
        self._topology(f, s, node, gpu_labels)
        self._audit(f, s, node)
        self._daemon(f, node)
        if not self.compat.dcgm:
            return [m for m in f.families if m.samples and not m.name.startswith("DCGM_")]
        return [m for m in f.families if m.samples]

    def _node(self, f: _Families, s: Sample, node: Labels) -> None:
        info = self._root((
            (self._host, s.node), *((k, self.node_info.get(k, "")) for k in ("cluster", "rack", "version")),
            ("driver_version", s.nvml.driver_version or ""), ("nvml_version", s.nvml.nvml_version or "")))
        f.add("nvmon_node_info", info, 1)
        f.add("nvmon_nvml_up", node, int(s.nvml.available))
        f.add("nvmon_sample_timestamp_seconds", node, s.ts)

    def _gpu(self, f: _Families, snap: Snapshot, g: GpuSample, lab: Labels, own: Labels) -> None:
        add = f.add
        add("nvmon_gpu_lost", own, int(g.lost))
        # Every family the catalog fills straight from a metric's value (None: left out).
        for (name, divisor, nvmon), value in zip(_SIMPLE, _SIMPLE_GET(g)):
            if value is not None:
                add(name, own if nvmon else lab, value if divisor is None else value / divisor)
        add("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", lab, None if g.energy_j is None else round(g.energy_j * 1000))
        if snap.sample.nvml.available:
            xid = snap.last_xid.get(g.index, 0)  # err_code / err_msg as dcgm-exporter labels the value
            add("DCGM_FI_DEV_XID_ERRORS", lab.with_("err_code", str(xid)).with_("err_msg", xid_text(xid)), xid)
        if g.throttle_reasons is not None and not g.lost:
            mask = 0
            active = set(g.throttle_reasons)
            for name, bit in self._bits:
                if name in active:  # active reasons only: 9 zeros per GPU would be noise
                    mask |= bit
                    add("nvmon_gpu_clocks_event_reason", own.with_("reason", name), 1)
            add("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", lab, mask)
            add("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", lab, mask)
        if g.lost:
            return
        f_ = g.fabric
        if f_.health_mask is not None or f_.health_summary:  # the fields the driver reports, 1 = trouble
            for name, on in fabric_flags(f_.health_mask, f_.health_summary).items():
                add("nvmon_gpu_fabric_health", own.with_("field", name), int(on))
        add("nvmon_gpu_nvlink_links", own, g.nvlink_count if g.nvlink_count is not None else len(g.nvlink) or None)
        if not g.nvlink:
            return
        self._nvlinks(f, snap, g, lab, own)

    def _nvlinks(self, f: _Families, snap: Snapshot, g: GpuSample, lab: Labels, own: Labels) -> None:
        """Per-link series and the per-GPU NVLink sums: the hot loop (8 GPUs × 18 links, half the
        page). Per link a shorter label set: join on UUID for the rest.

        Written for CPython's sake: the per-link work runs in `map`/`zip` (C) rather than in a
        Python loop, and link states, speeds and error counters, which rarely change, are compared
        with the previous rendering's as whole lists and their series reused when equal."""
        links = g.nvlink
        ids = tuple(map(_LINK_ID, links))
        known = self._link_labels.get(g.index)
        if known is not None and known[0] is lab and known[1] == ids:
            lls = known[2]
        else:
            host = self._host
            short = self._root((("gpu", lab["gpu"]), ("UUID", lab["UUID"]), (host, lab[host])))
            lls = tuple(short.with_("link", str(i)) for i in ids)
            self._link_labels[g.index] = (lab, ids, lls)
        actives, speeds, errors = list(map(_ACTIVE, links)), list(map(_SPEED, links)), list(map(_ERRORS, links))
        prev = self._link_state.get(g.index)
        if prev is None or prev.lls is not lls or prev.actives != actives or prev.speeds != speeds \
                or prev.errors != errors:
            prev = self._link_state[g.index] = _LinkState.build(lls, actives, speeds, errors)
        up_s, tx_s, rx_s, err_s = f.samples("nvmon_nvlink_up", "nvmon_nvlink_tx_bytes_total",
                                            "nvmon_nvlink_rx_bytes_total", "nvmon_nvlink_errors_total")
        up_s.extend(prev.ups)
        err_s.extend(prev.errs)
        totals = snap.nvlink_bytes.get(g.index)
        if totals is not None and totals.links == ids:  # whole bytes: exact, and ints render faster
            tx_s.extend(map(_new_sample, _REPEAT_SAMPLE, zip(_REPEAT_TX, lls, map(int, totals.tx), *_pads())))
            rx_s.extend(map(_new_sample, _REPEAT_SAMPLE, zip(_REPEAT_RX, lls, map(int, totals.rx), *_pads())))
        add = f.add
        add("nvmon_gpu_nvlink_active_links", own, prev.active)
        add("nvmon_gpu_nvlink_min_speed_bytes_per_second", own, prev.min_speed)
        tx, rx = _known_sum(map(_TX_RATE, links)), _known_sum(map(_RX_RATE, links))
        add("DCGM_FI_PROF_NVLINK_TX_BYTES", lab, tx)
        add("DCGM_FI_PROF_NVLINK_RX_BYTES", lab, rx)
        if tx is not None or rx is not None:  # DCGM: tx+rx in MiB/s, typed counter (docs/prometheus.md)
            add("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", lab, ((tx or 0.0) + (rx or 0.0)) / 1048576)
        for kind, name in DCGM_NVLINK_ERRORS.items():
            add(name, lab, prev.kinds.get(kind))

    def _ib(self, f: _Families, snap: Snapshot, node: Labels) -> None:
        for p in snap.sample.ib:
            lab = node.with_("device", p.device).with_("port", str(p.port))
            f.add("nvmon_ib_port_up", lab, int(ib_port_up(p)))
            f.add("nvmon_ib_port_state", lab.with_("state", p.state or "").with_("phys_state", p.phys_state or "")
                  .with_("link_layer", p.link_layer or ""), 1)
            f.add("nvmon_ib_port_rate_bytes_per_second", lab, None if p.rate_gbps is None else p.rate_gbps * 1e9 / 8)
            t = snap.ib_bytes.get((p.device, p.port))
            if t is not None:
                f.add("nvmon_ib_port_tx_bytes_total", lab, int(t[0]))
                f.add("nvmon_ib_port_rx_bytes_total", lab, int(t[1]))
            for kind in IB_ERROR_KINDS:
                f.add("nvmon_ib_port_errors_total", lab.with_("kind", kind), p.errors.get(kind))

    def _pci(self, f: _Families, s: Sample, node: Labels) -> None:
        links = {}  # one PCIe link per HCA, however many ports it has
        for p in s.ib:
            links.setdefault(p.device, ("hca", p.device, p.pci_bus_id or "", p.pcie))
        for sw in s.nvswitches:
            links[sw.pci_bus_id] = (sw.kind, "", sw.pci_bus_id, sw.pcie)
        for kind, device, bus, pcie in links.values():
            lab = node.with_("kind", kind).with_("device", device).with_("pci_bus_id", bus)
            f.add("nvmon_pcie_link_gen", lab, pcie.gen)
            f.add("nvmon_pcie_link_width", lab, pcie.width)
            f.add("nvmon_pcie_max_link_gen", lab, pcie.max_gen)
            f.add("nvmon_pcie_max_link_width", lab, pcie.max_width)

    def _topology(self, f: _Families, s: Sample, node: Labels, gpu_labels: dict[int, Labels]) -> None:
        topo = s.topology
        for cls in TOPOLOGY_CLASSES:
            f.add("nvmon_topology_class", node.with_("class", cls), int(topo.class_ == cls))
        pairs = 0
        for i, row in enumerate(topo.matrix):
            gl = node.with_("gpu", str(i))
            for j in range(i + 1, len(row)):  # each pair once, gpu < peer_gpu
                m = _NV.match(row[j])
                n = int(m.group(1)) if m else 0
                pairs += bool(n)
                f.add("nvmon_topology_pair_nvlinks", gl.with_("peer_gpu", str(j)), n)
        if topo.matrix:
            f.add("nvmon_topology_nvlink_pairs", node, pairs)
        for i, n in enumerate(topo.nvswitch_links):
            if i in gpu_labels:
                f.add("nvmon_topology_nvswitch_links", gpu_labels[i], n)

    def _audit(self, f: _Families, s: Sample, node: Labels) -> None:
        report = self.judge(s)
        counts = dict.fromkeys(RULES, 0)
        for finding in report.findings:
            counts[finding.code] = counts.get(finding.code, 0) + 1
        for code, n in counts.items():
            f.add("nvmon_audit_findings", node.with_("code", code).with_("severity", RULES.get(code, "")), n)
        for v in VERDICTS:
            f.add("nvmon_audit_verdict", node.with_("verdict", v), int(report.verdict == v))

    def _daemon(self, f: _Families, node: Labels) -> None:
        h = self.health()
        if h is not None:
            f.add("nvmon_daemon_ticks_total", node, h.ticks)
            f.add("nvmon_daemon_missed_ticks_total", node, h.missed_ticks)
            f.add("nvmon_daemon_sample_errors_total", node, h.sample_errors)
            f.add_summary("nvmon_daemon_sample_duration_seconds", node, h.ticks, h.sample_seconds_total)
            f.add("nvmon_daemon_last_sample_duration_seconds", node, h.sample_seconds)
            f.add("nvmon_daemon_stored_ticks_total", node, h.stored)
            f.add("nvmon_daemon_store_errors_total", node, h.store_errors)
            f.add("nvmon_daemon_store_dropped_total", node, h.store_dropped)
            for reason, n in (h.store_resets or {}).items():
                f.add("nvmon_daemon_store_resets_total", node.with_("reason", reason), n)
            f.add("nvmon_daemon_wire_dropped_total", node, h.wire_dropped)
            if h.mqtt_connected is not None:
                f.add("nvmon_daemon_mqtt_connected", node, int(h.mqtt_connected))
                f.add("nvmon_daemon_mqtt_published_total", node, h.mqtt_published)
                f.add("nvmon_daemon_mqtt_errors_total", node, h.mqtt_errors)
                f.add("nvmon_daemon_mqtt_dropped_total", node, h.mqtt_dropped)
            if h.alerts is not None:
                for (code, severity, state), n in h.alerts.items():
                    f.add("nvmon_alerts_active", node.with_("code", code).with_("severity", severity)
                          .with_("state", state), n)
            for name, type_, sent, failed, dropped in h.hooks:
                hook = node.with_("hook", name).with_("type", type_)
                for result, n in (("sent", sent), ("failed", failed), ("dropped", dropped)):
                    f.add("nvmon_hook_notifications_total", hook.with_("result", result), n)
        f.add("nvmon_exporter_render_seconds", node, self.render_seconds)
        f.add("nvmon_exporter_renders_total", node, self.renders)
        f.add("nvmon_exporter_render_cpu_seconds_total", node,
              self.render_cpu_seconds + self.compress_cpu_seconds)


def nvmon_label_pairs(pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The GPU labels of nvmon's own families: dcgm-exporter's with snake_case names (`model_name`)."""
    return tuple((NVMON_LABEL_NAMES.get(k, k), v) for k, v in pairs)


def gpu_label_pairs(g: GpuSample, hostname: str, host_label: str = "hostname") -> tuple[tuple[str, str], ...]:
    """dcgm-exporter's labels for a GPU, in its order (`device` is "nvidia" + the NVML index)."""
    i = str(g.index)
    return (("gpu", i), ("UUID", g.uuid or ""), ("pci_bus_id", g.pci_bus_id or ""), ("device", f"nvidia{i}"),
            ("modelName", g.name or ""), (host_label, hostname))


def xid_text(xid: int) -> str:
    """`err_msg` of DCGM_FI_DEV_XID_ERRORS: dcgm-exporter's "No Error" for 0, NVIDIA's name of the
    Xid where nvmon.xid has it, else dcgm-exporter's "Unknown Error"."""
    if xid == 0:
        return "No Error"
    return XIDS[xid][0] if xid in XIDS else "Unknown Error"
