"""GPU collector over NVML, through the official bindings passed in as a module (`pynvml`).

Cost model (bench/sample_cost.py measures it): static facts — names, UUIDs, limits, PCIe maxima,
clock maxima, the NVLink map — are read once. Each steady-state tick costs each GPU one
`nvmlDeviceGetFieldValues` (energy, the enforced power limit, PCIe bytes and replays, memory
temperature, and per link: state, speed, TX/RX payload KiB, replay/recovery/CRC counters) plus ONE
getter taken in turn from a rotation in which throttle reasons and utilization come every 2–3 ticks
and temperature and PCIe gen/width every 15 (they change slowly, and a value not re-read is carried
over; the enforced-limit getter joins them, every 20, only where the limit's field id is missing:
nvidia-ml-py < 12.535 or a driver without it), plus ONE from the catalog's getter rotation of the values NVML has no field id for
(`nvml_catalog`: SM clock and framebuffer memory every 2–3 ticks, memory clock every 5), 3 calls
per GPU per tick in all. The catalog's metrics (`Metric.nvml`) are read with no code here: a field
id joins the batch, a getter the rotation, or it rides on a call of the first rotation.
Power is the energy counter's slope over the interval, i.e. the true average.
Xid critical-error events come from one NVML event set per node (`nvml_events`), drained without
blocking once a tick: +1 NVML call per node per tick (+1 per event), counted apart in `event_calls`.

Bindings and errors: every NVML name and call goes through the chokepoint (`nvml_api.Api`), which
resolves functions by purpose against the installed nvidia-ml-py (falling back to an older name
where one answers the same question, e.g. `nvmlDeviceGetTemperatureV` → `nvmlDeviceGetTemperature`)
and types each outcome: a value, `Unsupported`, `Lost` or `Failed`. Per GPU, `_Gpu.call` turns
them into (a) "unsupported" — recorded once as a capability and the query dropped; a function or
field id the bindings lack is unsupported from the start and never requested —, (b) `_Lost`, which
marks that GPU lost, or (c) a note on the GPU for any other error. One GPU's or one field's failure
never loses the rest. (`_Gpu`, the per-GPU state, is in `nvml_gpu`.)
"""

from __future__ import annotations

import itertools
import types
from dataclasses import replace
from operator import itemgetter, sub
from typing import Any

from nvmon.collect import fabric, nvml_fields as F
from nvmon.collect.nvml_api import Api, NoValue, bindings_version
from nvmon.collect.nvml_batch import FieldBatch, Readings
from nvmon.collect.nvml_catalog import FIELDS as CATALOG_FIELDS, VALUE_NAMES, CatalogReader
from nvmon.collect.nvml_events import XidEvents
from nvmon.collect.nvml_gpu import _Gpu, _Link, _Lost, _num, _text
from nvmon.model import NVLINK_ERROR_KINDS, GpuSample, NvLinkSample, NvmlStatus, PcieLink

LINK_KEYS = ("state", "speed", "tx", "rx") + NVLINK_ERROR_KINDS
ROTATION = ("throttle", "utilization", "throttle", "utilization", "slow")
SLOW = ("temperature", "pcie_gen", "pcie_width", "power_limit")
LOST_RETRY_TICKS = 30
MAX_ERROR_MAPS = 512  # per GPU, cleared when full: ~150 KB at most, even with every link erroring


class NvmlCollector:
    """Reads every GPU of a node. `open()` once, then `collect(ts)` each tick; `close()` at the end."""

    def __init__(self, nvml: types.ModuleType):
        self.nvml = nvml
        self.api = Api(nvml)
        self.status = NvmlStatus(available=False, error="not opened")
        self.gpus: list[_Gpu] = []
        self.calls = [0]  # NVML calls made, for the cost benchmark
        self.direct_fields: bool | None = None  # None: FieldBatch decides (tests force both paths)
        self.events, self.fabric = XidEvents(self.api), fabric.FabricReader(self.api)  # fabric: every few s
        # The catalog's metrics: their getters' rotation beside the first one, and those that ride
        # on the first one's calls.
        self.catalog = CatalogReader(self.api, own=ROTATION + SLOW)
        self.event_calls = self.events.calls  # per-node NVML calls for Xid events, apart from `calls`
        self._opened = False

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> NvmlStatus:
        api, fn = self.api, self.api.fn
        try:
            init = api.call(fn["init"])
        except OSError as e:  # a broken libnvidia-ml on disk
            self.status = NvmlStatus(available=False, error=f"cannot load the NVIDIA library: {e}")
            return self.status
        if isinstance(init, NoValue):
            self.status = NvmlStatus(available=False, error=_explain_init_error(self.nvml, init))
            return self.status
        self._opened = True
        got = {}  # driver version, NVML version, GPU count: read in turn, up to the first failure
        for what in ("driver_version", "nvml_version", "count"):
            got[what] = value = api.call(fn[what])
            if isinstance(value, NoValue):
                driver = got["driver_version"] if what != "driver_version" else None
                self.status = NvmlStatus(available=False, error=f"NVML: {value}", driver_version=_text(driver))
                return self.status
        driver, nvml_version = _text(got["driver_version"]), _text(got["nvml_version"])
        self.gpus = [_Gpu(api, i, self.calls) for i in range(got["count"])]
        self.events.open()
        for g in self.gpus:
            self._open_gpu(g)
        self.status = NvmlStatus(available=True, driver_version=driver, nvml_version=nvml_version)
        return self.status

    def close(self) -> None:
        if self._opened:
            self.events.close()
            self.api.call(self.api.fn["shutdown"])  # an error here changes nothing
            self._opened = False

    def capabilities(self) -> dict[str, Any]:
        """What each GPU could not answer (probed on the first tick), for the sample's `nvml` block."""
        caps: dict[str, list[int]] = {}
        for g in self.gpus:
            for what in sorted(g.unsupported):
                caps.setdefault(what, []).append(g.index)
        out: dict[str, Any] = {"unsupported": caps}
        ev = self.events
        if ev.error or ev.errors or ev.unattributed:  # Xid events: only when something is wrong
            out["xid_events"] = {"error": ev.error, "wait_errors": ev.errors, "last_wait_error": ev.last_error,
                                 "unattributed": ev.unattributed}
        if self.api.absent:  # what the installed bindings lack (only when something is missing)
            out["bindings"] = {"nvidia_ml_py": bindings_version(), "absent": dict(sorted(self.api.absent.items()))}
        return out

    # -- static facts ----------------------------------------------------------------------

    def _open_gpu(self, g: _Gpu) -> None:
        try:
            handle = g.ask("handle", g.index)
            if isinstance(handle, NoValue):
                g.handle, g.lost = None, True
                return
            g.handle = handle
            g.name = _text(g.ask("name", handle))
            g.uuid = _text(g.ask("uuid", handle))
            g.serial = _text(g.ask("serial", handle))
            pci = g.ask("pci", handle)
            g.bus_id = None if isinstance(pci, NoValue) else _text(pci.busId)
            g.default_limit_w = _num(g.ask("power_default_limit", handle), 1e-3)
            cons = g.ask("power_constraints", handle)
            g.max_limit_w = cons[1] / 1000 if isinstance(cons, list) else None
            g.max_gen = _num(g.ask("pcie_max_gen", handle))
            g.device_max_gen = _num(g.ask("pcie_gpu_max_gen", handle))
            g.max_width = _num(g.ask("pcie_max_width", handle))
            self.catalog.read_once(g)  # the catalog's static values: clock maxima
            self._open_links(g)
            self.events.register(g)
        except _Lost:
            g.lost = True
            return
        g.lost = False
        g.rotation = itertools.cycle(ROTATION)
        g.last["slow"] = itertools.cycle(SLOW)
        g.last["catalog"] = itertools.cycle(self.catalog.rotation)
        self._build_request(g)
        # Probe tick: read every rotated value once so the first sample is complete.
        try:
            for what in ("throttle", "utilization") + SLOW:
                self._read_getter(g, what)
            for call in dict.fromkeys(self.catalog.rotation):
                self.catalog.read(g, call)
        except _Lost:
            g.lost = True

    def _open_links(self, g: _Gpu) -> None:
        nv, api = self.nvml, self.api
        fid = api.const(F.FI_LINK_COUNT, "nvlink_count")
        res = g.call("nvlink_count", api.fn["field_values"] if fid is not None else None, g.handle, [fid])
        count = 0
        if not isinstance(res, NoValue) and res[0].nvmlReturn == 0:
            count = int(res[0].value.uiVal)
        # Never probe past the real count: indices up to NVML_NVLINK_MAX_LINKS give errors or
        # misleading answers on some GPUs (NVML-FACTS §1.2).
        g.link_count = min(count, getattr(nv, "NVML_NVLINK_MAX_LINKS", 36))
        g.links = []
        for lk in range(g.link_count):
            link = _Link(lk)
            ver = g.ask("nvlink_version", g.handle, lk)
            link.version = F.NVLINK_ENUM_TO_GEN.get(ver) if isinstance(ver, int) else None
            rtype = g.ask("nvlink_remote_type", g.handle, lk)
            link.remote_type = F.REMOTE_TYPES.get(rtype, "unknown") if isinstance(rtype, int) else None
            rpci = g.ask("nvlink_remote_pci", g.handle, lk)
            if not isinstance(rpci, NoValue):
                bus = _text(rpci.busId) or ""
                link.remote_bus_id = None if bus.upper() in F.SENTINEL_BUS_IDS else bus.upper()
            g.links.append(link)
        g.link_cols = (tuple(lk.link for lk in g.links), tuple(lk.version for lk in g.links),
                       tuple(lk.remote_type for lk in g.links), tuple(lk.remote_bus_id for lk in g.links))
        # "not supported" on a link that is not wired is normal, not a missing capability
        g.unsupported.discard("nvlink_remote_type")
        g.unsupported.discard("nvlink_remote_pci")

    def _field_id(self, g: _Gpu, name: str, what: str) -> int | None:
        """A field id to request, or None: `what` is unsupported, or the bindings lack the id (then
        it becomes unsupported, and is never requested)."""
        if what in g.unsupported:
            return None
        fid = self.api.const(name, what)
        if fid is None:
            g.unsupported.add(what)
        return fid

    def _build_request(self, g: _Gpu) -> None:
        req, layout = [], []
        for key, name in (("energy", F.FI_TOTAL_ENERGY), ("pcie_replay", F.FI_PCIE_REPLAY),
                          ("pcie_tx", F.FI_PCIE_TX_BYTES), ("pcie_rx", F.FI_PCIE_RX_BYTES),
                          ("power_limit_fv", F.FI_POWER_CURRENT_LIMIT),
                          *((m.nvml.call, m.nvml.field) for m in CATALOG_FIELDS)):
            fid = self._field_id(g, name, key)
            if fid is not None:
                req.append(fid)
                layout.append((key, None))
        for lk in range(g.link_count):
            for key, name in F.PER_LINK_FIELDS.items():
                fid = self._field_id(g, name, f"nvlink_{key}")
                if fid is not None:
                    req.append((fid, lk))
                    layout.append((key, lk))
            fid = self._field_id(g, F.FI_LINK_CRC_DATA[lk], "nvlink_crc_data") if lk < len(F.FI_LINK_CRC_DATA) \
                else None
            if fid is not None:
                req.append(fid)
                layout.append(("crc_data", lk))
        g.batch = FieldBatch(self.nvml, req, direct=self.direct_fields)
        g.layout = layout
        g.slot = {k: i for i, k in enumerate(layout)}
        g.prev_values, g.prev_ts_us, g.prev_complete = [None] * len(layout), [0] * len(layout), False
        # A link's entries in LINK_KEYS order; a key not requested points one past the end, where
        # `_assemble` appends a None to each column.
        end = len(layout)
        at = [[g.slot.get((k, lk), end) for k in LINK_KEYS] for lk in range(g.link_count)]
        g.link_get = (itemgetter(*(i for a in at for i in a[0:2])), itemgetter(*(i for a in at for i in a[2:4])),
                      itemgetter(*(i for a in at for i in a[4:]))) if at else None

    # -- hot path ----------------------------------------------------------------------------

    def _read_getter(self, g: _Gpu, what: str) -> None:
        h = g.handle
        if what in g.unsupported:
            return
        ask = self._ask
        if what == "throttle":
            v = ask(g, what, h)
            g.last[what] = F.decode_throttle(v) if isinstance(v, int) else None
        elif what == "utilization":
            v = ask(g, what, h)
            g.last[what] = None if isinstance(v, NoValue) else float(v.gpu)
        elif what == "temperature":
            g.last[what] = _num(ask(g, what, h, self.nvml.NVML_TEMPERATURE_GPU))
        elif what == "pcie_gen" or what == "pcie_width":
            g.last[what] = _num(ask(g, what, h))
        elif what == "power_limit" or what == "power":  # power: when the energy counter is unsupported
            g.last[what] = _num(ask(g, what, h), 1e-3)
        elif what == "nvlink_state_getter":  # fallback when the state field is unsupported
            g.last[what] = [g.ask(what, h, lk) for lk in range(g.link_count)]

    def _ask(self, g: _Gpu, what: str, *args):
        """`g.ask`; the catalog metrics that ride on this call keep their part of its answer."""
        v = g.ask(what, *args)
        if what in self.catalog.rides:
            self.catalog.take(g, what, v)
        return v

    def collect(self, ts: float) -> tuple[GpuSample, ...]:
        """One tick: a GpuSample per GPU (lost ones marked lost). Never raises for one GPU's failure."""
        if not self.status.available:
            return ()
        xids = self.events.drain()  # first: an Xid 79 arrives as its GPU goes lost
        gpus = tuple(self._collect_gpu(g) for g in self.gpus)
        if xids:
            gpus = tuple(replace(s, xid_events=xids[s.index]) if s.index in xids else s for s in gpus)
        return gpus

    def _collect_gpu(self, g: _Gpu) -> GpuSample:
        if g.lost:
            g.lost_ticks += 1
            if g.handle is None and g.lost_ticks % LOST_RETRY_TICKS == 0:
                self._open_gpu(g)  # maybe it came back (GPU reset); a dead handle is never reused
            if g.lost:
                return self._lost_sample(g)
        try:
            return self._read_hot(g)
        except _Lost:
            g.lost, g.handle = True, None
            self.events.forget(g.index)
            return self._lost_sample(g)

    def _lost_sample(self, g: _Gpu) -> GpuSample:
        return GpuSample(index=g.index, name=g.name, uuid=g.uuid, serial=g.serial, pci_bus_id=g.bus_id,
                         lost=True, throttle_reasons=None, notes=("GPU is lost: fallen off the bus or otherwise inaccessible",),
                         values=dict.fromkeys(VALUE_NAMES))

    def _read_hot(self, g: _Gpu) -> GpuSample:
        nv = self.nvml
        first = "probed" not in g.last
        got = g.call("field_values", g.batch.fetch, g.handle) if g.batch.n else None
        what = next(g.rotation)
        if what == "slow":
            what = next(g.last["slow"])
        self._read_getter(g, what)
        if self.catalog.rotation:
            self.catalog.read(g, next(g.last["catalog"]))
        if got is None or isinstance(got, NoValue):
            n = len(g.layout)  # the whole call failed: every entry unread this tick
            got = Readings([nv.NVML_ERROR_UNKNOWN] * n, [0] * n, [None] * n)
        if any(got.rets) and nv.NVML_ERROR_GPU_IS_LOST in got.rets:
            raise _Lost()
        if first:
            # Capability probe: a field unsupported on the GPU (or on every link) is dropped from
            # later requests, and its fallback getter takes over.
            g.last["probed"] = True
            bad = (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT)
            answered = {key for (key, _), ret in zip(g.layout, got.rets) if ret == 0}
            for (key, lk), ret in zip(g.layout, got.rets):
                if ret in bad and key not in answered:
                    g.unsupported.add(key if lk is None else f"nvlink_{key}")
            old = dict(zip(g.layout, zip(*got)))
            self._build_request(g)
            if "power_limit_fv" not in g.unsupported:  # the batch reads it every tick: its getter's
                g.last["slow"] = itertools.cycle([w for w in SLOW if w != "power_limit"])  # turn goes to the rest
            gone = (nv.NVML_ERROR_NOT_SUPPORTED, 0, None)
            got = Readings(*(list(col) for col in zip(*(old.get(k, gone) for k in g.layout)))) \
                if g.layout else Readings([], [], [])
        # Fallbacks cost extra calls, so the per-link state getter rides with the slow group only.
        if "energy" in g.unsupported:
            self._read_getter(g, "power")
        if "nvlink_state" in g.unsupported and g.link_count and (first or what == SLOW[0]):
            self._read_getter(g, "nvlink_state_getter")
        return self._assemble(g, got)

    @staticmethod
    def _deltas(g: _Gpu, got: Readings) -> tuple[list, list]:
        """Per entry: the rise since the last tick, and the µs between the two readings. The rise is
        None when the counter was not read then or now, the clock did not advance, or it went
        backwards (a reset: driver reload, GPU reset) — never a negative rate."""
        values, ts, prev = got.values, got.ts_us, g.prev_values
        dts = list(map(sub, ts, g.prev_ts_us))
        rises = None
        if g.prev_complete and not any(got.rets):
            # Every entry answered, now and last tick (the rule): subtract at C speed, and take the
            # entry-by-entry path below only when some entry went backwards or kept its timestamp.
            rises = list(map(sub, values, prev))
            if rises and (min(rises) < 0 or min(dts) <= 0):
                rises = None
        if rises is None:
            rises = [v - p if v is not None and p is not None and v >= p and d > 0 else None
                     for v, p, d in zip(values, prev, dts)]
        g.prev_values, g.prev_ts_us, g.prev_complete = values, ts, not any(got.rets)
        return rises, dts

    def _assemble(self, g: _Gpu, got: Readings) -> GpuSample:
        rises, dts = self._deltas(g, got)
        values = got.values + [None]  # the None that unrequested link keys point at
        rises.append(None)
        dts.append(1)
        idx = g.slot

        def value(key):
            i = idx.get((key, None))
            return None if i is None else values[i]

        def delta(key):
            i = idx.get((key, None))
            return None if i is None else rises[i]

        def rate(key, scale=1.0):
            i = idx.get((key, None))
            d = None if i is None else rises[i]
            return None if d is None else d * scale * 1e6 / dts[i]

        power = rate("energy", 1e-3) if "energy" not in g.unsupported else g.last.get("power")
        limit_mw = value("power_limit_fv")  # every tick: a cap that ends is seen at once
        power_limit = limit_mw / 1000 if limit_mw is not None else g.last.get("power_limit")
        pcie = PcieLink(
            gen=g.last.get("pcie_gen"), max_gen=g.max_gen, width=g.last.get("pcie_width"), max_width=g.max_width,
            device_max_gen=g.device_max_gen, tx_bytes_per_s=rate("pcie_tx"), rx_bytes_per_s=rate("pcie_rx"),
            replay_errors=value("pcie_replay"), replay_errors_delta=delta("pcie_replay"),
        )
        getter_states = g.last.get("nvlink_state_getter")
        links: list[NvLinkSample] = []
        maps = g.error_maps
        if len(maps) > MAX_ERROR_MAPS:
            maps.clear()

        def error_map(counts: tuple) -> dict:
            """The {kind: count} dict for these counts. Counts repeat (zero rises, error counts that
            did not move), so each distinct one is built once and then shared, read-only like
            everything in a Sample."""
            m = maps.get(counts)
            if m is None:
                m = maps[counts] = dict(zip(NVLINK_ERROR_KINDS, counts))
            return m

        if g.link_get is not None and g.links:
            # A column at a time over all links (this runs for 144 links a tick on an HGX board):
            # C-level picks and comprehensions, and one positional constructor call per link.
            state_speed, tx_rx, errs = g.link_get
            n = len(g.links)
            ss = state_speed(values)
            states = ss[0::2]
            if getter_states is not None and None in states:
                states = [getter_states[lk.link] if st is None and isinstance(getter_states[lk.link], int) else st
                          for lk, st in zip(g.links, states)]
            kib_per_us = 1024.0 * 1e6  # KiB over µs → bytes/s
            rates = [None if d is None else d * kib_per_us / dt for d, dt in zip(tx_rx(rises), tx_rx(dts))]
            k = len(NVLINK_ERROR_KINDS)
            counts, rose = errs(values), errs(rises)
            errors = [error_map(counts[i:i + k]) for i in range(0, n * k, k)]
            if rose.count(0) == len(rose):  # the rule: nothing rose anywhere
                deltas = [error_map(rose[:k])] * n
            else:
                deltas = [error_map(rose[i:i + k]) for i in range(0, n * k, k)]
            nums, versions, remote_types, remote_ids = g.link_cols
            links = list(map(
                NvLinkSample, nums, [None if st is None else st in (1, 3) for st in states],
                versions, [sp or None for sp in ss[1::2]], remote_types, remote_ids,
                rates[0::2], rates[1::2], errors, deltas))
        energy = value("energy")
        self.catalog.take_fields(g, value)
        return GpuSample(
            index=g.index, name=g.name, uuid=g.uuid, serial=g.serial, pci_bus_id=g.bus_id, lost=False,
            power_w=power, power_limit_w=power_limit, power_default_limit_w=g.default_limit_w,
            power_max_limit_w=g.max_limit_w, energy_j=None if energy is None else energy / 1000,
            temperature_c=g.last.get("temperature"), utilization_pct=g.last.get("utilization"),
            throttle_reasons=g.last.get("throttle"), pcie=pcie, nvlink=tuple(links),
            nvlink_count=g.link_count, notes=tuple(g.notes.values()),
            values=self.catalog.values(g),
            fabric=self.fabric.of(g),
        )


def _explain_init_error(nv, failed: NoValue) -> str:
    e = failed.error
    if isinstance(e, nv.NVMLError_LibraryNotFound):
        return "NVIDIA driver library (libnvidia-ml.so.1) not found: no driver installed, GPU data unavailable"
    if isinstance(e, nv.NVMLError_DriverNotLoaded):
        return "NVIDIA driver not loaded (nvmlInit: Driver Not Loaded): GPU data unavailable"
    if isinstance(e, nv.NVMLError_NoPermission):
        return "no permission to open the NVIDIA devices (nvmlInit: Insufficient Permissions)"
    return f"nvmlInit failed: {failed}"
