"""A simulated GPU node: the physical truth behind the fake NVML library and the fake sysfs tree.

Every cumulative counter is a closed-form function of time since the board started (traffic is a
square wave: all-reduce bursts, or a constant level), so readings are deterministic for a seed and
a time, monotonic, and cost O(1) no matter how far the clock jumps (benchmarks fast-forward it).

A fault holds over [start, end) (`Fault.active`). Counters are piecewise over the fault's
breakpoints: error counters rise only while their fault holds, traffic stops while a link or port
is down (or its GPU lost) and resumes after, energy integrates the capped wave only while a cap
holds. Each piece before `t` is a fixed sum and only the last one grows, so counters stay monotonic
across every start and end.
"""

from __future__ import annotations

import random
import time
import uuid as _uuid
from collections.abc import Callable
from dataclasses import dataclass

from nvmon.sim.profiles import PROFILES, BoardProfile
from nvmon.sim.scenario import Fault, Scenario
from nvmon.sim.waves import (INF, Spans, _pieces, held_s, inside, integral_outside, merge_spans, square_integral,
                             square_level)

# Traffic shapes per load: (period s, duty, hi level, lo level) as a fraction of the link's bandwidth.
_NVLINK_SHAPE = {"idle": (1.0, 1.0, 0.0005, 0.0005), "allreduce": (2.0, 0.45, 0.80, 0.02), "busy": (1.0, 1.0, 0.55, 0.55)}
_IB_SHAPE = {"idle": (1.0, 1.0, 0.0002, 0.0002), "allreduce": (2.0, 0.45, 0.60, 0.01), "busy": (1.0, 1.0, 0.40, 0.40)}
# GPU power as a fraction of the power limit: compute phase (lo traffic) is the hungrier one.
_POWER_SHAPE = {"idle": (1.0, 1.0, 0.11, 0.11), "allreduce": (2.0, 0.45, 0.70, 0.82), "busy": (1.0, 1.0, 0.80, 0.80)}
_PCIE_BYTES_PER_S = {"idle": 4e6, "allreduce": 1.8e9, "busy": 2.5e9}
_UTIL = {"idle": 0, "allreduce": 97, "busy": 100}


# NVLink error growth per second on a faulty link, and IB error growth on a faulty port.
_NVLINK_ERR_RATE = {"crc_flit": 5.0, "crc_data": 2.0, "replay": 3.0, "recovery": 0.1}
_IB_ERR_RATE = {"symbol_error": 3.0, "port_rcv_errors": 1.0, "link_error_recovery": 0.05}
NVLINK_ERR_KEYS = tuple(_NVLINK_ERR_RATE)  # the order of a link's error counters in `nvlink_readings`
IB_ERR_WIDTH = {"symbol_error": 16, "link_downed": 8, "port_rcv_errors": 16, "link_error_recovery": 8,
                "port_xmit_discards": 16}


def _span(f: Fault) -> tuple[float, float]:
    return f.after_s, INF if f.until_s is None else f.until_s


@dataclass(frozen=True, slots=True)
class _LinkFacts:
    """What one link's readings depend on besides the time: fixed once the scenario is parsed."""

    used: bool  # wired by design (index < links_used)
    down: Spans  # when it is down (either end, on bridged pairs)
    idle: Spans  # when it carries no traffic: down, or its GPU lost
    err_spans: Spans  # when its error counters rise
    kib_base: tuple[int, int]
    factor: tuple[float, float]  # (tx, rx) share of the wave
    err_base: tuple[int, ...]  # in NVLINK_ERR_KEYS order


@dataclass(slots=True)
class SimGpu:
    index: int
    uuid: str
    serial: str
    bus_id: str  # NVML form
    link_factor: list[tuple[float, float]]  # per link (tx, rx) share of the wave
    kib_base: list[tuple[int, int]]
    err_base: list[dict[str, int]]
    energy_base_mj: int
    pcie_base: tuple[int, int]
    replay_base: int


class SimBoard:
    """One simulated node. `clock` returns unix seconds; tests and benchmarks may pass their own."""

    def __init__(self, scenario: Scenario, *, clock: Callable[[], float] = time.time, node: str = "sim-node"):
        self.scenario = scenario
        self.profile: BoardProfile = PROFILES[scenario.profile]
        self.clock = clock
        self.node = node
        self.t0 = clock()
        rng = random.Random(scenario.seed)
        self.phase = rng.uniform(0, 2.0)
        p = self.profile
        self.gpus: list[SimGpu] = []
        for i in range(p.gpus):
            self.gpus.append(
                SimGpu(
                    index=i,
                    uuid="GPU-" + str(_uuid.UUID(int=rng.getrandbits(128), version=4)),
                    serial=f"{1650000000000 + rng.randrange(10**9)}",
                    bus_id=p.gpu_bus_id(i),
                    link_factor=[(rng.uniform(0.9, 1.0), rng.uniform(0.9, 1.0)) for _ in range(p.link_slots)],
                    kib_base=[(rng.randrange(10**9, 10**11), rng.randrange(10**9, 10**11)) for _ in range(p.link_slots)],
                    # Old, settled error counts: absolute values must never be judged, only their rise.
                    err_base=[{k: (rng.randrange(0, 4) if rng.random() < 0.2 else 0) for k in _NVLINK_ERR_RATE}
                              for _ in range(p.link_slots)],
                    energy_base_mj=rng.randrange(10**9, 10**11),
                    pcie_base=(rng.randrange(10**12), rng.randrange(10**12)),
                    replay_base=rng.randrange(0, 3),
                )
            )
        # Each GPU runs a few degrees warmer or cooler than its neighbours (airflow, position in the
        # chassis): a fixed offset per node and GPU, from its own generator so that adding it left
        # every other simulated value as it was.
        self._temp_offset = [random.Random(f"{scenario.seed}:{node}:temperature:{i}").randrange(0, 7)
                             for i in range(p.gpus)]
        # When each fault holds, by (kind, gpu, link, IB port index): merged [start, end) spans,
        # looked up for every simulated value, so precomputed. Derived per-link / per-GPU / per-port
        # piecewise shapes are cached on first use (the scenario never changes).
        spans: dict[tuple, list[tuple[float, float]]] = {}
        for f in scenario.faults:
            key = (f.kind, f.gpu, f.link, None if f.port is None else self.ib_index(f.port))
            spans.setdefault(key, []).append(_span(f))
        self._spans: dict[tuple, Spans] = {k: merge_spans(v) for k, v in spans.items()}
        self._by_kind: dict[str, tuple[Fault, ...]] = {}
        self._by_port: dict[tuple[str, int], tuple[Fault, ...]] = {}  # IB faults by (kind, port index)
        for f in scenario.faults:
            self._by_kind[f.kind] = self._by_kind.get(f.kind, ()) + (f,)
            if f.port is not None:
                key = (f.kind, self.ib_index(f.port))
                self._by_port[key] = self._by_port.get(key, ()) + (f,)
        self._cache: dict[tuple, object] = {}
        self.ib_names = [f"mlx5_{i}" for i in range(p.ib_ports)]
        self.ib_word_base = [(rng.randrange(10**10, 10**12), rng.randrange(10**10, 10**12)) for _ in self.ib_names]
        self.ib_err_base = [{k: rng.randrange(0, 3) for k in IB_ERR_WIDTH} for _ in self.ib_names]

    # ---- time and faults -------------------------------------------------------------------

    def now(self) -> float:
        """Seconds since the board started."""
        return max(0.0, self.clock() - self.t0)

    def faults(self, kind: str, t: float) -> list[Fault]:
        """The faults of `kind` that hold at `t` (started, not yet ended), in spec order."""
        return [f for f in self._by_kind.get(kind, ()) if f.active(t)]

    def spans(self, kind: str, gpu: int | None = None, link: int | None = None, port: int | None = None) -> Spans:
        """When faults of `kind` on this GPU (link, IB port index) hold: merged [start, end) spans."""
        return self._spans.get((kind, gpu, link, port), ())

    def _breakpoints(self, kind: str, match: Callable[[Fault], bool]) -> list[float]:
        """0 and every start and end of the matching faults of `kind` (a value is constant between)."""
        pts = {0.0}
        for f in self.scenario.faults:
            if f.kind == kind and match(f):
                pts.add(f.after_s)
                if f.until_s is not None:
                    pts.add(f.until_s)
        return sorted(pts)

    def gpu_lost(self, gpu: int, t: float) -> bool:
        return any(f.gpu == gpu for f in self.faults("gpu_lost", t))

    def notsup(self, what: str, gpu: int, t: float) -> bool:
        return any(f.what == what and f.gpu in (None, gpu) for f in self.faults("notsup", t))

    def xid_events(self, t: float) -> list[tuple[int, int, int]]:
        """(event id, gpu, Xid) of every Xid event that has happened by `t`, oldest first; each is
        delivered once per event set by the fake library."""
        xids = [(f.after_s, n, f) for n, f in enumerate(self.scenario.faults) if f.kind == "xid" and t >= f.after_s]
        return [(n, f.gpu, int(f.value)) for _, n, f in sorted(xids, key=lambda x: (x[0], x[1]))]

    # ---- NVLink ----------------------------------------------------------------------------

    def link_peer(self, gpu: int, link: int) -> tuple[str, int | None]:
        """('gpu', peer index) for bridged pairs, ('nvswitch', switch index) behind switches."""
        p = self.profile
        if p.fabric == "pairs":
            return "gpu", gpu ^ 1
        return "nvswitch", link % max(1, p.switches)

    def _link_down_spans(self, gpu: int, link: int) -> Spans:
        key = ("link_down", gpu, link)
        if key not in self._cache:
            spans = list(self.spans("nvlink_down", gpu, link))
            if self.profile.fabric == "pairs":  # a dead bridge link is dead at both ends
                spans += self.spans("nvlink_down", gpu ^ 1, link)
            self._cache[key] = merge_spans(spans)
        return self._cache[key]  # type: ignore[return-value]

    def _link_idle_spans(self, gpu: int, link: int) -> Spans:
        """When the link carries no traffic: it is down, or its GPU is lost."""
        key = ("link_idle", gpu, link)
        if key not in self._cache:
            self._cache[key] = merge_spans(self._link_down_spans(gpu, link) + self.spans("gpu_lost", gpu))
        return self._cache[key]  # type: ignore[return-value]

    def _link_facts(self, gpu: int) -> list[_LinkFacts]:
        """Per link slot of `gpu` (link 0 first), cached like the spans it gathers."""
        key = ("link_facts", gpu)
        if key not in self._cache:
            g = self.gpus[gpu]
            self._cache[key] = [
                _LinkFacts(used=lk < self.profile.links_used, down=self._link_down_spans(gpu, lk),
                           idle=self._link_idle_spans(gpu, lk), err_spans=self.spans("nvlink_errors", gpu, lk),
                           kib_base=g.kib_base[lk], factor=g.link_factor[lk],
                           err_base=tuple(g.err_base[lk][k] for k in NVLINK_ERR_KEYS))
                for lk in range(self.profile.link_slots)
            ]
        return self._cache[key]  # type: ignore[return-value]

    def _nvlink_wave(self, t: float) -> float:
        """∫₀ᵗ of the NVLink traffic wave (a fraction of the link's bandwidth)."""
        return square_integral(t, _NVLINK_SHAPE[self.scenario.load], self.phase)

    @staticmethod
    def _active(f: _LinkFacts, t: float) -> bool:
        return f.used and (not f.down or not inside(f.down, t))

    def _kib(self, f: _LinkFacts, t: float, free_wave: float) -> tuple[int, int]:
        """`free_wave`: `_nvlink_wave(t)`, what a link that never idled has carried."""
        if not f.used:
            return f.kib_base
        w = integral_outside(f.idle, t, self._nvlink_wave) if f.idle else free_wave
        bw_kib = self.profile.link_mbps * 1e6 / 1024
        return f.kib_base[0] + int(bw_kib * w * f.factor[0]), f.kib_base[1] + int(bw_kib * w * f.factor[1])

    @staticmethod
    def _errors(f: _LinkFacts, t: float) -> tuple[int, ...]:
        spans = f.err_spans
        if not spans or t < spans[0][0]:
            return f.err_base
        held = held_s(spans, t)  # the errors rise only while the fault holds
        return tuple(b + int(rate * held) for b, rate in zip(f.err_base, _NVLINK_ERR_RATE.values()))

    def link_active(self, gpu: int, link: int, t: float) -> bool:
        if link >= self.profile.links_used:
            return False
        return self._active(self._link_facts(gpu)[link], t)

    def link_kib(self, gpu: int, link: int, t: float) -> tuple[int, int]:
        """Cumulative (tx, rx) KiB, as NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX count them."""
        return self._kib(self._link_facts(gpu)[link], t, self._nvlink_wave(t))

    def link_errors(self, gpu: int, link: int, t: float) -> dict[str, int]:
        return dict(zip(NVLINK_ERR_KEYS, self._errors(self._link_facts(gpu)[link], t)))

    def _link_columns(self, gpu: int) -> tuple[list[int], list[bool], list[tuple[int, float, int, float]],
                                               list[list[int]]]:
        """For `nvlink_readings`: the links a fault touches (or not wired), which are worked out one
        by one; the others' active column (True) and error counter columns (their bases), which
        never change; and (tx base, tx share, rx base, rx share) per link."""
        key = ("link_columns", gpu)
        if key not in self._cache:
            facts = self._link_facts(gpu)
            touched = [lk for lk, f in enumerate(facts) if not f.used or f.down or f.idle or f.err_spans]
            active = [lk not in touched for lk in range(len(facts))]
            terms = [(f.kib_base[0], f.factor[0], f.kib_base[1], f.factor[1]) for f in facts]
            self._cache[key] = touched, active, terms, [list(col) for col in zip(*(f.err_base for f in facts))]
        return self._cache[key]  # type: ignore[return-value]

    def nvlink_readings(self, gpu: int, t: float) -> tuple[list[bool], list[int], list[int], list[list[int]]]:
        """All the links of `gpu` at `t`, as columns (link 0 first): active, tx KiB, rx KiB, and a
        column per error counter in NVLINK_ERR_KEYS order. The values link_active, link_kib and
        link_errors give, for a fraction of their cost: the traffic wave is integrated once, and
        only the links a fault touches are worked out one by one."""
        facts = self._link_facts(gpu)
        if not facts:
            return [], [], [], [[] for _ in NVLINK_ERR_KEYS]
        touched, active, terms, errors = self._link_columns(gpu)
        active, errors = active.copy(), [col.copy() for col in errors]
        free_wave = self._nvlink_wave(t)
        kib = self.profile.link_mbps * 1e6 / 1024 * free_wave  # `_kib`'s product, but for the link's share
        tx = [tb + int(kib * tf) for tb, tf, _, _ in terms]
        rx = [rb + int(kib * rf) for _, _, rb, rf in terms]
        for lk in touched:
            f = facts[lk]
            active[lk] = self._active(f, t)
            tx[lk], rx[lk] = self._kib(f, t, free_wave)
            for col, value in zip(errors, self._errors(f, t)):
                col[lk] = value
        return active, tx, rx, errors

    # ---- power, thermal, PCIe ---------------------------------------------------------------

    def power_limit_w(self, gpu: int, t: float) -> float:
        caps = [f for f in self.faults("power_cap", t) if f.gpu == gpu]
        if caps:
            v = caps[-1].value
            return float(v) if v is not None else round(self.profile.power_limit_w * 0.6)
        return float(self.profile.power_limit_w)

    def _power_shape(self, gpu: int, t: float) -> tuple[float, float, float, float]:
        period, duty, hi, lo = _POWER_SHAPE[self.scenario.load]
        lim = self.profile.power_limit_w
        cap = self.power_limit_w(gpu, t)
        return period, duty, min(hi * lim, cap), min(lo * lim, cap)

    def _uncapped_power_shape(self) -> tuple[float, float, float, float]:
        period, duty, hi, lo = _POWER_SHAPE[self.scenario.load]
        lim = self.profile.power_limit_w
        return period, duty, hi * lim, lo * lim

    def _energy_pieces(self, gpu: int) -> list[tuple[float, float, tuple[float, float, float, float]]]:
        """(start, end, power wave) pieces of time: the wave changes only where a cap starts or ends."""
        key = ("energy", gpu)
        if key not in self._cache:
            pts = self._breakpoints("power_cap", lambda f: f.gpu == gpu)
            self._cache[key] = _pieces(pts, lambda a: self._power_shape(gpu, a))
        return self._cache[key]  # type: ignore[return-value]

    def energy_mj(self, gpu: int, t: float) -> int:
        """Cumulative energy (mJ): the power wave of each piece of time (uncapped, or capped while a
        cap holds) integrated over the part of it before `t`."""
        e = 0.0
        for a, b, shape in self._energy_pieces(gpu):
            if a >= t:
                break
            e += square_integral(min(b, t), shape, self.phase) - (square_integral(a, shape, self.phase) if a else 0.0)
        return self.gpus[gpu].energy_base_mj + int(e * 1000)

    def power_mw(self, gpu: int, t: float) -> int:
        return int(square_level(t, self._power_shape(gpu, t), self.phase) * 1000)

    def demand_over_cap(self, gpu: int, t: float) -> bool:
        period, duty, hi, lo = _POWER_SHAPE[self.scenario.load]
        demand = square_level(t, (period, duty, hi, lo), self.phase) * self.profile.power_limit_w
        return demand > self.power_limit_w(gpu, t)

    def hot(self, gpu: int, t: float) -> bool:
        return any(f.gpu == gpu for f in self.faults("thermal", t))

    def temperature_c(self, gpu: int, t: float) -> int:
        if self.hot(gpu, t):
            return 92
        base = {"idle": 31, "allreduce": 62, "busy": 66}[self.scenario.load]
        return base + self._temp_offset[gpu] + int(t) % 2

    def utilization(self, gpu: int, t: float) -> int:
        u = _UTIL[self.scenario.load]
        return u if u in (0, 100) else u + (int(t) + gpu) % 3

    def clocks_event_reasons(self, gpu: int, t: float) -> int:
        reasons = 0
        if self.scenario.load == "idle":
            reasons |= 0x1  # GpuIdle
        if self.demand_over_cap(gpu, t):
            reasons |= 0x4  # SwPowerCap
        if self.hot(gpu, t):
            reasons |= 0x20 | 0x40  # SwThermalSlowdown | HwThermalSlowdown
        if any(f.gpu == gpu for f in self.faults("power_brake", t)):
            # HwPowerBrakeSlowdown, and HwSlowdown: nvml.h names a power-brake assertion among its causes
            reasons |= 0x80 | 0x8
        return reasons

    def pcie_gen(self, gpu: int, t: float) -> int:
        if self.scenario.load == "idle":
            return 1  # idle downshift: power management, not a fault
        stuck = [f for f in self.faults("pcie_gen", t) if f.gpu == gpu]
        return int(stuck[-1].value) if stuck else self.profile.pcie_gen

    def pcie_width(self, gpu: int, t: float) -> int:
        narrow = [f for f in self.faults("pcie_width", t) if f.gpu == gpu]
        return int(narrow[-1].value) if narrow else self.profile.pcie_width

    def pcie_bytes(self, gpu: int, t: float) -> tuple[int, int]:
        rate = _PCIE_BYTES_PER_S[self.scenario.load]
        base = self.gpus[gpu].pcie_base
        return base[0] + int(rate * t * 0.4), base[1] + int(rate * t)

    # ---- InfiniBand ---------------------------------------------------------------------------

    def ib_index(self, port: str) -> int:
        return int(port) if port.isdigit() else int(port.split("_")[1])

    def _ib_faults(self, kind: str, i: int, t: float) -> list[Fault]:
        """The faults of `kind` on port i that hold at `t`, in spec order."""
        return [f for f in self._by_port.get((kind, i), ()) if f.active(t)]

    def ib_state(self, i: int, t: float) -> tuple[str, str, float, str]:
        """(state, phys_state, rate Gb/s, link layer) of port i."""
        if self._ib_faults("ib_down", i, t):
            return "DOWN", "Polling", 10.0, "InfiniBand"
        slow = self._ib_faults("ib_rate", i, t)
        rate = float(slow[-1].value) if slow else float(self.profile.ib_rate_gbps)
        layer = "Ethernet" if self._ib_faults("ib_eth", i, t) else "InfiniBand"
        return "ACTIVE", "LinkUp", rate, layer

    def hca_pcie_width(self, i: int, t: float) -> int:
        """The current PCIe width of port i's HCA (its maximum is x16)."""
        narrow = self._ib_faults("ib_pcie_width", i, t)
        return int(narrow[-1].value) if narrow else 16

    def _ib_pieces(self, i: int) -> list[tuple[float, float, float]]:
        """(start, end, Gb/s) pieces of time for port i: 0 while it is down, its (reduced) rate else."""
        key = ("ib", i)
        if key not in self._cache:
            pts = sorted(set(self._breakpoints("ib_down", lambda f: self.ib_index(f.port) == i))
                         | set(self._breakpoints("ib_rate", lambda f: self.ib_index(f.port) == i)))
            self._cache[key] = _pieces(
                pts, lambda a: 0.0 if self._ib_faults("ib_down", i, a) else self.ib_state(i, a)[2])
        return self._cache[key]  # type: ignore[return-value]

    def ib_words(self, i: int, t: float) -> tuple[int, int]:
        """Cumulative (xmit, rcv) data counters in 4-octet words, as the kernel exposes them: the
        traffic wave at the port's rate of each piece of time (none while it is down)."""
        shape, phase = _IB_SHAPE[self.scenario.load], self.phase + 0.3
        bytes_ = 0.0
        for a, b, rate in self._ib_pieces(i):
            if a >= t:
                break
            if rate:
                w = square_integral(min(b, t), shape, phase) - (square_integral(a, shape, phase) if a else 0.0)
                bytes_ += rate * 1e9 / 8 * w
        base = self.ib_word_base[i]
        return base[0] + int(bytes_ / 4), base[1] + int(bytes_ * 0.98 / 4)

    def ib_errors(self, i: int, t: float) -> dict[str, int]:
        """Cumulative PMA error counters; they saturate at their width, like the real ones."""
        errs = dict(self.ib_err_base[i])
        spans = self.spans("ib_errors", port=i)
        if spans and t >= spans[0][0]:
            held = held_s(spans, t)  # the errors rise only while the fault holds
            for k, rate in _IB_ERR_RATE.items():
                errs[k] = min(errs[k] + int(rate * held), (1 << IB_ERR_WIDTH[k]) - 1)
        return errs
