"""The metric table: every metric nvmon samples, declared once.

A `Metric` says what a value is (name, unit, kind, scope, one doc line), where it lives in the
`Sample` (`path`, an attribute path on the scope's object: `GpuSample`, `IbPortSample`, `Sample`;
or `IN_VALUES`: in `GpuSample.values` under its name, so that a new metric needs no model field),
how it is stored (`column`, `encode`, `rollup`), sent (`wire`), shown (`label`, `fmt`) and exported
(its own Prometheus family, `prom`, and the `Family`s of families.py whose `metric` names it). The
layers read this table instead of naming the metric again:

- the store builds its INSERTs, the per-tick row of every GPU's scalars and the rollup SQL from it,
  and adds a column a new entry declares to an existing database (`nvmon.store.schema`);
- `nvmon history --metric` takes its choices, help and SQL from it (`nvmon.store.metrics`);
- the exporter's families, their order, type, help and labels are `FAMILIES`; a family with a
  `metric` is filled from that metric's path without code of its own (`nvmon.export.collector`);
- the wire's per-GPU arrays with a `wire` key are written and read from it;
- the metric tables of docs/store.md, docs/prometheus.md and docs/sample-schema.md are generated
  from it (`nvmon.catalog_docs`; a test fails when they drift).

Values the collector derives from several readings (the NVLink sums and masks a GPU row carries,
node totals) are declared too, with `path=None`: the store's codec computes them, the catalog
still gives their column, rollup, history entry and docs.

This module imports only the standard library and `nvmon.model`: every layer may import it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from operator import attrgetter, itemgetter
from typing import Any

# `Metric.path` of a per-GPU metric kept in `GpuSample.values` under its name (not a field of its own).
IN_VALUES = "values"


class Kind(StrEnum):
    GAUGE = "gauge"  # a level read now: power, temperature, clock
    COUNTER = "counter"  # cumulative since some start; stored and sent as its rise per interval
    RATE = "rate"  # a counter's rise over the interval, per second (bytes/s)
    STATE = "state"  # one of a few named values (IB port state, link active)
    BITMASK = "bitmask"  # set of flags (throttle reasons, links down)


class Scope(StrEnum):
    NODE = "node"
    GPU = "gpu"
    NVLINK = "nvlink"
    IB_PORT = "ib_port"
    HCA = "hca"
    NVSWITCH = "nvswitch"


class Rollup(StrEnum):
    """How the 1-minute rollup keeps a column (docs/store.md, "in rollups")."""

    MIN_AVG_MAX = "min, avg, max"
    MIN_MAX = "min, max"
    MAX = "max"
    SUM = "sum"  # counters' rises, summed over the minute
    ANY = "any"  # bitmasks, ORed over the minute (nvmon.store.rollup, in Python)
    NONE = "raw only"
    CUSTOM = "custom"  # the store computes it its own way; `history_rollup` says where it is


class Encode(StrEnum):
    """How a value is coerced into its SQLite column (functions in nvmon.store.codec)."""

    REAL = "real"  # a finite float
    WHOLE = "whole"  # rounded to a whole number (watts, percentages: the sensor is no finer)
    RATE = "rate"  # bytes/s rounded to whole bytes
    INTEGER = "integer"
    FLAG = "flag"  # truthy → 1, else 0
    THROTTLE = "throttle"  # reason names → nvmlClocksEventReason bits
    TEXT = "text"


class Static(StrEnum):
    """Where a metric that changes only with the hardware is kept (not per tick)."""

    TICK = "tick"  # per tick (the default)
    FACT = "fact"  # once per change, in the store's `inventory` facts and the wire's inventory


@dataclass(frozen=True, slots=True)
class Prom:
    """A metric's own Prometheus family (nvmon.catalog.families places it on the page): one series
    per GPU, the metric's value divided by `divisor` (the unit dcgm-exporter uses: MHz, MiB)."""

    name: str
    help: str
    divisor: float | None = None
    type: str = "gauge"


@dataclass(frozen=True, slots=True)
class Nvml:
    """Where the NVML collector reads a per-GPU metric, with no code of its own
    (nvmon.collect.nvml_catalog; every name through the chokepoint, nvmon.collect.nvml_api).

    `field`: a field-id constant (pynvml name): the value joins the GPU's per-tick
    nvmlDeviceGetFieldValues batch, at no extra call. Otherwise a getter: `fn` (pynvml names, newest
    first; an older one that answers the same is used when the bindings lack the newer) called with
    the GPU's handle and `args` (pynvml constant names, or ints); `attr` picks a member of a
    structure it returns. Metrics naming the same `call` share one call. `scale` turns NVML's unit
    into the metric's (MHz → Hz: 10**6); 1 keeps NVML's value as it is.
    When: `once`, when the GPU is opened (maxima); a `call` the collector makes anyway (its own
    rotation, e.g. "utilization") carries the metric along at no extra call; otherwise the call gets
    `turns` turns in each cycle of the catalog's getter rotation (one getter per GPU per tick).
    `call` is also the capability name an "unsupported" answer is reported under. `since`: the
    nvidia-ml-py release that added a name newer than the oldest nvmon accepts (nvml_fields.ADDED).
    """

    call: str
    fn: tuple[str, ...] = ()
    args: tuple[str | int, ...] = ()
    attr: str | None = None
    field: str | None = None
    scale: int | float = 1
    turns: int = 1
    once: bool = False
    since: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Metric:
    name: str  # `nvmon history --metric` name; units in the name (`_w`, `_hz`, `_bytes_per_s`)
    unit: str  # for tables and docs: "W", "Hz", "B/s", "°C", "%", "count", "" ...
    kind: Kind
    scope: Scope
    doc: str  # one line, shown in --help and the docs
    path: str | None = None  # attribute path on the scope's Sample object; None: derived by the codec
    column: str | None = None  # SQLite column of the scope's raw table; None: not stored
    sql_type: str = "REAL"
    encode: Encode = Encode.REAL
    rollup: Rollup = Rollup.NONE
    rollup_column: str | None = None  # rollup column when not derived from `column` (SUM, MAX)
    avg_digits: int = 0  # the minute's average rounded to this many digits
    history_raw: str | None = None  # SQL over the raw table when not `column`
    history_rollup: tuple[tuple[str, str], ...] = ()  # (statistic, SQL) when not derived from `rollup`
    decode: str | None = None  # history's decoder: "throttle", "ib_state", "ib_phys", "links"
    label: str = ""  # short header (history's table, the TUI)
    fmt: str = ""  # how views print it: "mhz", "mib", "c", "" (plain)
    wire: str | None = None  # key of the per-GPU array in the wire `sample` (or `inventory` for FACT)
    wire_digits: int | None = None  # None: an integer on the wire; else rounded to this many digits
    # What the wire reader accepts (lo, hi); None: the reader reads the key by hand (nvmon.wire.parse).
    # Keys read through the catalog land in `GpuTick.values` under the metric's name.
    wire_range: tuple[float, float] | None = None
    wire_divisor: int | None = None  # sent in these units (the docs say which: `sc` is MHz), read back ×
    static: Static = Static.TICK
    history: bool = True  # offered by `nvmon history`
    prom: Prom | None = None  # its Prometheus family, when it has one of its own
    nvml: Nvml | None = None  # read by the collector from this NVML source (per-GPU metrics in `values`)

    @property
    def in_values(self) -> bool:
        """Kept in `GpuSample.values` under its name."""
        return self.path == IN_VALUES

    @property
    def sampled(self) -> bool:
        """Read from the Sample (a path, or `values`), not derived by the store's codec."""
        return self.path is not None

    @property
    def key(self) -> str | None:
        """Where the sample JSON has it: the path, or its name for a metric in `values`."""
        return self.name if self.in_values else self.path

    @property
    def get(self) -> Callable[[Any], Any]:
        """The getter of its value on the scope's Sample object (a metric without a path has none)."""
        if self.path is None:
            raise AttributeError(f"metric {self.name} is derived by the store, it has no Sample path")
        if self.in_values:
            return lambda obj, name=self.name: obj.values.get(name)
        return attrgetter(self.path)

    def rollup_stats(self) -> dict[str, str]:
        """Statistic → SQL over the rollup table, as `nvmon history` reads the minute rows."""
        if self.history_rollup:
            return dict(self.history_rollup)
        col = self.column
        r = self.rollup
        if col is None or r in (Rollup.NONE, Rollup.CUSTOM):
            return {}
        if r is Rollup.MIN_AVG_MAX:
            return {"min": f"{col}_min", "avg": f"{col}_avg", "max": f"{col}_max"}
        if r is Rollup.MIN_MAX:
            return {"min": f"{col}_min", "max": f"{col}_max"}
        if r is Rollup.MAX:
            return {"max": self.rollup_column or f"{col}_max"}
        if r is Rollup.SUM:
            return {"sum": self.rollup_column or col}
        return {"any": self.rollup_column or col}

    def rollup_sql(self) -> list[tuple[str, str]]:
        """(rollup column, aggregate over the raw column) for rollups done in SQL."""
        col, r = self.column, self.rollup
        if col is None:
            return []
        avg = f"round(avg({col}))" if not self.avg_digits else f"round(avg({col}), {self.avg_digits})"
        if r is Rollup.MIN_AVG_MAX:
            return [(f"{col}_min", f"min({col})"), (f"{col}_avg", avg), (f"{col}_max", f"max({col})")]
        if r is Rollup.MIN_MAX:
            return [(f"{col}_min", f"min({col})"), (f"{col}_max", f"max({col})")]
        if r is Rollup.MAX:
            return [(self.rollup_column or f"{col}_max", f"max({col})")]
        if r is Rollup.SUM:
            return [(self.rollup_column or col, f"sum({col})")]
        return []


G, L, IB, N = Scope.GPU, Scope.NVLINK, Scope.IB_PORT, Scope.NODE
V = IN_VALUES
MHZ = 10**6  # NVML's clocks are in MHz
# nvmlDeviceGetMemoryInfo with the v2 structure (total, reserved, free, used in bytes)
MEMORY_INFO = (("nvmlDeviceGetMemoryInfo",), ("nvmlMemory_v2",))
E = Encode
R = Rollup

METRICS: tuple[Metric, ...] = (
    # -- per GPU (the order of `nvmon history --help`) ------------------------------------------------------
    Metric("power_w", "W", Kind.GAUGE, G, "board power draw (whole watts)", "power_w", "power_w",
           encode=E.WHOLE, rollup=R.MIN_AVG_MAX, label="power", wire="p", wire_digits=1),
    Metric("power_limit_w", "W", Kind.GAUGE, G, "enforced power limit", "power_limit_w", "power_limit_w",
           rollup=R.MIN_MAX, label="limit", wire="pl", wire_digits=1),
    Metric("energy_j", "J", Kind.COUNTER, G, "energy counter since driver load (raw ticks only)", "energy_j",
           "energy_j", encode=E.RATE, label="energy"),
    Metric("temperature_c", "°C", Kind.GAUGE, G, "GPU temperature", "temperature_c", "temperature_c",
           rollup=R.MIN_AVG_MAX, label="temp", fmt="c", wire="t", wire_digits=0),
    Metric("utilization_pct", "%", Kind.GAUGE, G, "GPU utilization", "utilization_pct", "utilization_pct",
           rollup=R.MIN_AVG_MAX, label="util", wire="u", wire_digits=0),
    Metric("throttle", "", Kind.BITMASK, G, "clock throttle reasons (rollups: any during the minute)",
           "throttle_reasons", "throttle_mask", "INTEGER", E.THROTTLE, R.ANY, decode="throttle", label="throttle"),
    Metric("lost", "", Kind.STATE, G, "GPU fell off the bus (rollups: ticks lost in the minute)",
           "lost", "lost", "INTEGER NOT NULL", E.FLAG, R.SUM, "lost_samples", label="lost"),
    Metric("pcie_gen", "", Kind.GAUGE, G, "current PCIe generation (drops at idle by design)", "pcie.gen",
           "pcie_gen", "INTEGER", E.INTEGER, R.MIN_MAX, label="gen", wire="pg"),
    Metric("pcie_width", "lanes", Kind.GAUGE, G, "current PCIe link width", "pcie.width", "pcie_width",
           "INTEGER", E.INTEGER, R.MIN_MAX, label="width", wire="pw"),
    Metric("pcie_tx_bytes_per_s", "B/s", Kind.RATE, G, "PCIe transmit rate", "pcie.tx_bytes_per_s",
           "pcie_tx_bytes_per_s", encode=E.RATE, rollup=R.MIN_AVG_MAX, label="pcie tx", wire="pt"),
    Metric("pcie_rx_bytes_per_s", "B/s", Kind.RATE, G, "PCIe receive rate", "pcie.rx_bytes_per_s",
           "pcie_rx_bytes_per_s", encode=E.RATE, rollup=R.MIN_AVG_MAX, label="pcie rx", wire="pr"),
    Metric("pcie_replay_delta", "count", Kind.COUNTER, G, "PCIe replays in the interval",
           "pcie.replay_errors_delta", "pcie_replay_delta", "INTEGER", E.INTEGER, R.SUM, label="replays"),
    # Clocks and framebuffer memory: nvmlDeviceGetClockInfo / GetMaxClockInfo (MHz, stored in Hz),
    # nvmlDeviceGetMemoryInfo_v2 (bytes), NVML_FI_DEV_MEMORY_TEMP (°C, in the field-value batch). They
    # live in `GpuSample.values` (the sample JSON lists them in this order), each with its family and
    # its NVML source: the SM clock and memory every 2-3 ticks, the memory clock (HBM keeps it
    # fixed) every 5, in the catalog's getter rotation; the maxima once.
    # The wire carries SM clock, framebuffer used and memory temperature in its units (MHz, MiB, °C:
    # ~135 bytes a tick for 8 GPUs; the sample stays under 2 KB), the rest stays on the node.
    Metric("sm_clock_hz", "Hz", Kind.GAUGE, G, "SM clock", V, "sm_clock_hz", "INTEGER", E.INTEGER,
           R.MIN_AVG_MAX, label="sm clk", fmt="mhz", wire="sc", wire_range=(0, 10**5), wire_divisor=10**6,
           prom=Prom("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", 1e6),
           nvml=Nvml("sm_clock", ("nvmlDeviceGetClockInfo",), ("NVML_CLOCK_SM",), scale=MHZ, turns=2)),
    Metric("sm_clock_max_hz", "Hz", Kind.GAUGE, G, "highest SM clock the GPU runs at", V,
           "sm_clock_max_hz", "INTEGER", E.INTEGER, static=Static.FACT, history=False, label="sm max",
           fmt="mhz", wire="sm_clock_max_hz",
           prom=Prom("nvmon_gpu_sm_clock_max_hertz", "Highest SM clock of the GPU (nvmlDeviceGetMaxClockInfo)."),
           nvml=Nvml("sm_clock_max", ("nvmlDeviceGetMaxClockInfo",), ("NVML_CLOCK_SM",), scale=MHZ, once=True)),
    Metric("mem_clock_hz", "Hz", Kind.GAUGE, G, "memory clock", V, "mem_clock_hz", "INTEGER",
           E.INTEGER, R.MIN_MAX, label="mem clk", fmt="mhz", wire="mc", wire_range=(0, 10**5), wire_divisor=10**6,
           prom=Prom("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", 1e6),
           nvml=Nvml("mem_clock", ("nvmlDeviceGetClockInfo",), ("NVML_CLOCK_MEM",), scale=MHZ, turns=1)),
    Metric("mem_clock_max_hz", "Hz", Kind.GAUGE, G, "highest memory clock", V,
           "mem_clock_max_hz", "INTEGER", E.INTEGER, static=Static.FACT, history=False, label="mem max",
           fmt="mhz", wire="mem_clock_max_hz",
           prom=Prom("nvmon_gpu_mem_clock_max_hertz", "Highest memory clock of the GPU."),
           nvml=Nvml("mem_clock_max", ("nvmlDeviceGetMaxClockInfo",), ("NVML_CLOCK_MEM",), scale=MHZ, once=True)),
    Metric("fb_used_bytes", "B", Kind.GAUGE, G, "framebuffer memory in use (beside the driver's reservation)",
           V, "fb_used_bytes", "INTEGER", E.INTEGER, R.MIN_AVG_MAX, label="fb used", fmt="mib",
           wire="fb", wire_range=(0, 2**30), wire_divisor=2**20,
           prom=Prom("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", 2**20),
           nvml=Nvml("memory", *MEMORY_INFO, attr="used", turns=2)),
    Metric("fb_free_bytes", "B", Kind.GAUGE, G, "framebuffer memory free", V, "fb_free_bytes",
           "INTEGER", E.INTEGER, R.MIN_MAX, label="fb free", fmt="mib",
           prom=Prom("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", 2**20),
           nvml=Nvml("memory", *MEMORY_INFO, attr="free", turns=2)),
    Metric("fb_total_bytes", "B", Kind.GAUGE, G, "framebuffer memory size", V, "fb_total_bytes",
           "INTEGER", E.INTEGER, static=Static.FACT, history=False, label="fb total", fmt="mib",
           wire="fb_total_bytes",
           prom=Prom("nvmon_gpu_fb_total_bytes", "Framebuffer memory size (nvmlDeviceGetMemoryInfo total)."),
           nvml=Nvml("memory", *MEMORY_INFO, attr="total", turns=2)),
    Metric("memory_temperature_c", "°C", Kind.GAUGE, G, "memory (HBM) temperature", V,
           "memory_temperature_c", rollup=R.MIN_AVG_MAX, label="mem temp", fmt="c", wire="mt", wire_digits=0,
           wire_range=(-100, 300), prom=Prom("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C)."),
           nvml=Nvml("memory_temp", field="NVML_FI_DEV_MEMORY_TEMP")),
    # nvmlDeviceGetUtilizationRates' `memory` member: the share of the last sample period in which
    # device memory was read or written. It rides on the collector's utilization call (no extra one).
    Metric("mem_copy_util_pct", "%", Kind.GAUGE, G, "memory copy utilization (device memory read or written)", V,
           "mem_copy_util_pct", encode=E.WHOLE, rollup=R.MIN_AVG_MAX, label="mem util",
           wire="mu", wire_digits=0, wire_range=(0, 100),
           prom=Prom("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)."),
           nvml=Nvml("utilization", ("nvmlDeviceGetUtilizationRates",), attr="memory")),
    Metric("pcie_replay_errors", "count", Kind.COUNTER, G, "PCIe replays since driver load",
           "pcie.replay_errors", history=False),
    # The NVSwitch fabric (nvmlDeviceGetGpuFabricInfoV, read every 5 ticks; None: no fabric): state,
    # status and health as NVML codes (model.FABRIC_STATES, FABRIC_HEALTH_FIELDS, FABRIC_SUMMARIES).
    Metric("fabric_state", "", Kind.STATE, G, "GPU fabric state: 1 not started, 2 in progress, 3 completed",
           "fabric.state", "fabric_state", "INTEGER", E.INTEGER, R.MIN_MAX, label="fabric",
           prom=Prom("nvmon_gpu_fabric_state", "GPU fabric state (NVSwitch boards): 1 not started, 2 in progress, "
                     "3 completed; absent without a fabric. Below 3 NVLink peer-to-peer does not work (Fabric "
                     "Manager down): `nvmon audit` fabric.not_ready.")),
    Metric("fabric_status", "", Kind.STATE, G, "GPU fabric status once completed (an NVML return code, 0 success)",
           "fabric.status", "fabric_status", "INTEGER", E.INTEGER, R.MAX, label="fab status",
           prom=Prom("nvmon_gpu_fabric_status", "GPU fabric status once completed: an NVML return code, "
                     "0 = success (23 = insufficient resources).")),
    Metric("fabric_health_mask", "", Kind.BITMASK, G, "GPU fabric health mask (nvmlGpuFabricInfo_v2 healthMask)",
           "fabric.health_mask", "fabric_health_mask", "INTEGER", E.INTEGER, label="fab health"),
    Metric("fabric_health_summary", "", Kind.STATE, G,
           "GPU fabric health summary: 1 healthy, 2 unhealthy, 3 limited capacity (0: not reported)",
           "fabric.health_summary", "fabric_health_summary", "INTEGER", E.INTEGER, R.MAX, label="fab summary"),
    # Static facts: the store keeps them in `inventory` (a row when they change), not per tick.
    Metric("power_default_limit_w", "W", Kind.GAUGE, G, "default power limit", "power_default_limit_w",
           "power_default_limit_w", static=Static.FACT, history=False),
    Metric("power_max_limit_w", "W", Kind.GAUGE, G, "highest power limit that can be set", "power_max_limit_w",
           "power_max_limit_w", static=Static.FACT, history=False),
    Metric("pcie_max_gen", "", Kind.GAUGE, G, "highest PCIe generation GPU and slot allow", "pcie.max_gen",
           "pcie_max_gen", "INTEGER", E.INTEGER, static=Static.FACT, history=False),
    Metric("pcie_max_width", "lanes", Kind.GAUGE, G, "widest PCIe link GPU and slot allow", "pcie.max_width",
           "pcie_max_width", "INTEGER", E.INTEGER, static=Static.FACT, history=False),
    Metric("pcie_device_max_gen", "", Kind.GAUGE, G, "highest PCIe generation the GPU itself supports",
           "pcie.device_max_gen", "pcie_device_max_gen", "INTEGER", E.INTEGER, static=Static.FACT, history=False),
    Metric("nvlink_count", "links", Kind.GAUGE, G, "NVLinks present (NVML_FI_DEV_NVLINK_LINK_COUNT)",
           "nvlink_count", "nvlink_count", "INTEGER", E.INTEGER, static=Static.FACT, history=False),
    # They name a multi-node NVLink domain (NVL72-class: one cluster UUID, cliques within it); an HGX
    # board reports clique 0 and a zero UUID.
    Metric("fabric_clique_id", "", Kind.GAUGE, G, "GPU fabric clique id", "fabric.clique_id", "fabric_clique_id",
           "INTEGER", E.INTEGER, static=Static.FACT, history=False, wire="fabric_clique_id",
           prom=Prom("nvmon_gpu_fabric_clique_id", "GPU fabric clique id (0 outside multi-node NVLink domains).")),
    Metric("fabric_cluster_uuid", "", Kind.STATE, G, "GPU fabric cluster UUID", "fabric.cluster_uuid",
           "fabric_cluster_uuid", "TEXT", E.TEXT, static=Static.FACT, history=False),
    # Derived by the codec from the GPU's links (nvmon.store.codec.LINK_COLUMNS).
    Metric("nvlink_active", "links", Kind.GAUGE, G, "active NVLinks", None, "nvlink_active", "INTEGER",
           rollup=R.MIN_MAX, label="links up"),
    Metric("nvlink_up_mask", "", Kind.BITMASK, G, "bit n: link n active", None, "nvlink_up_mask", "INTEGER",
           history=False),
    Metric("nvlink_down", "links", Kind.BITMASK, G, "NVLinks known down (rollups: down at any time in the minute)",
           None, "nvlink_down_mask", "INTEGER", rollup=R.ANY, decode="links", label="down"),
    Metric("nvlink_tx_bytes_per_s", "B/s", Kind.RATE, G, "NVLink transmit, all links", None,
           "nvlink_tx_bytes_per_s", rollup=R.MIN_AVG_MAX, label="nvl tx"),
    Metric("nvlink_rx_bytes_per_s", "B/s", Kind.RATE, G, "NVLink receive, all links", None,
           "nvlink_rx_bytes_per_s", rollup=R.MIN_AVG_MAX, label="nvl rx"),
    Metric("nvlink_errors_delta", "count", Kind.COUNTER, G, "NVLink error counts in the interval (all kinds, links)",
           None, "nvlink_errors_delta", "INTEGER", rollup=R.SUM, label="nvl errs"),
    # -- per NVLink: stored per GPU row as uint16 blobs and masks (docs/store.md) ----------------
    Metric("link_tx_bytes_per_s", "B/s", Kind.RATE, L, "one NVLink's transmit rate (1 MB/s steps)",
           None, "nvlink_tx_mb", "BLOB", rollup=R.CUSTOM,
           history_rollup=(("avg", "nvlink_tx_mb_avg"), ("max", "nvlink_tx_mb_max")), label="tx"),
    Metric("link_rx_bytes_per_s", "B/s", Kind.RATE, L, "one NVLink's receive rate (1 MB/s steps)",
           None, "nvlink_rx_mb", "BLOB", rollup=R.CUSTOM,
           history_rollup=(("avg", "nvlink_rx_mb_avg"), ("max", "nvlink_rx_mb_max")), label="rx"),
    Metric("link_active", "", Kind.STATE, L, "link state: 1 active, 0 down (rollups: 0 if down at any time)",
           None, None, rollup=R.CUSTOM, history_rollup=(("min", "nvlink_down_mask"),), label="active"),
    # -- per InfiniBand port (ib_ticks) --------------------------------------------------------
    Metric("ib_state", "", Kind.STATE, IB, "InfiniBand port state (ACTIVE, DOWN, ...)", "state", "state",
           "INTEGER", decode="ib_state", label="state"),
    Metric("ib_phys_state", "", Kind.STATE, IB, "physical state (LinkUp, Polling, Disabled, ...)", "phys_state",
           "phys_state", "INTEGER", decode="ib_phys", label="phys"),
    Metric("ib_active", "", Kind.STATE, IB, "1 when ACTIVE (rollups: fraction of the minute)", None, None,
           rollup=R.CUSTOM, history_raw="(state = 4)",
           history_rollup=(("avg", "round(1.0 * active_samples / samples, 3)"),), label="active"),
    Metric("ib_rate_gbps", "Gb/s", Kind.GAUGE, IB, "port rate (HDR 200, NDR 400)", "rate_gbps", "rate_gbps",
           rollup=R.MIN_AVG_MAX, label="rate"),
    Metric("ib_tx_bytes_per_s", "B/s", Kind.RATE, IB, "port transmit rate", "tx_bytes_per_s", "tx_bytes_per_s",
           encode=E.RATE, rollup=R.MIN_AVG_MAX, label="tx"),
    Metric("ib_rx_bytes_per_s", "B/s", Kind.RATE, IB, "port receive rate", "rx_bytes_per_s", "rx_bytes_per_s",
           encode=E.RATE, rollup=R.MIN_AVG_MAX, label="rx"),
    Metric("ib_errors_delta", "count", Kind.COUNTER, IB, "port error counts in the interval (all kinds)", None,
           "errors_delta", "INTEGER", rollup=R.SUM, label="errs"),
    # -- per node (ticks) ----------------------------------------------------------------------
    Metric("node_power_w", "W", Kind.GAUGE, N, "sum of GPU power", None, "gpu_power_w", rollup=R.MIN_AVG_MAX,
           label="power"),
    Metric("gpus_lost", "", Kind.GAUGE, N, "GPUs lost", None, "gpus_lost", "INTEGER NOT NULL", rollup=R.MAX,
           label="lost"),
    Metric("cpu_pct", "%", Kind.GAUGE, N, "host CPU use", "host.cpu_pct", "cpu_pct", encode=E.WHOLE,
           rollup=R.MIN_AVG_MAX, label="cpu"),
    Metric("mem_used_pct", "%", Kind.GAUGE, N, "host memory use", "host.mem_used_pct", "mem_used_pct",
           encode=E.WHOLE, rollup=R.MIN_AVG_MAX, label="mem"),
    Metric("load1", "", Kind.GAUGE, N, "host 1-minute load average", "host.load1", "load1",
           rollup=R.MIN_AVG_MAX, avg_digits=2, label="load1"),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}


def of_scope(scope: Scope) -> tuple[Metric, ...]:
    return tuple(m for m in METRICS if m.scope is scope)


def getter(metrics: Sequence[Metric]) -> Callable[[Any], tuple]:
    """obj → the metrics' values as one tuple, in order. This runs for every GPU every tick (store,
    exporter), so the attribute paths are read by one C-level attrgetter and the `values` ones by
    one map over the dict, and one itemgetter puts them back in order."""
    attrs = [m.path for m in metrics if not m.in_values]
    keys = [m.name for m in metrics if m.in_values]
    if not metrics:
        return lambda obj: ()
    get_attrs = attrgetter(*attrs) if attrs else (lambda obj: ())
    if len(attrs) == 1:
        one = get_attrs
        get_attrs = lambda obj: (one(obj),)  # noqa: E731 - attrgetter of one path gives a bare value
    if not keys:
        return get_attrs
    # Position of each metric in (attribute values..., values' values...).
    at_attr, at_key = iter(range(len(attrs))), iter(range(len(attrs), len(metrics)))
    order = [next(at_key) if m.in_values else next(at_attr) for m in metrics]
    pick = itemgetter(*order) if len(order) > 1 else (lambda t, i=order[0]: (t[i],))
    get_keys = itemgetter(*keys) if len(keys) > 1 else (lambda d, k=keys[0]: (d[k],))

    def get(obj) -> tuple:
        values = obj.values
        try:
            found = get_keys(values)
        except KeyError:  # a GpuSample built without some of them (the collector's has every key)
            found = tuple(map(values.get, keys))
        return pick(get_attrs(obj) + found)
    return get


# How views print a value of a unit (`Metric.unit`): (unit shown, divisor, decimals). Values stay in
# SI units everywhere else (Sample, store, wire, JSON, CSV); other units print as they are.
DISPLAY_UNITS: dict[str, tuple[str, float, int]] = {
    "Hz": ("MHz", 1e6, 0), "B": ("GiB", 2**30, 1), "B/s": ("GB/s", 1e9, 1)}


def display_unit(unit: str) -> tuple[str, float, int | None]:
    """(unit shown, divisor, decimals; None: as the value is) for values of `unit`."""
    return DISPLAY_UNITS.get(unit, (unit, 1.0, None))


def show(unit: str, value: float | int) -> str:
    """A value of `unit` as a view prints it: 1980000000 Hz → "1980 MHz", 49.0 % → "49 %"."""
    shown, divisor, digits = display_unit(unit)
    v = value / divisor
    if digits is not None:
        text = f"{v:.{digits}f}"
    else:
        text = str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)
    return f"{text} {shown}" if shown else text


# The GPU metrics the store reads straight from a GpuSample, one column each, in catalog order.
GPU_TICK_SCALARS: tuple[Metric, ...] = tuple(
    m for m in of_scope(G) if m.sampled and m.column is not None and m.static is Static.TICK)
# GPU metrics kept as facts (inventory), not per tick.
GPU_FACTS: tuple[Metric, ...] = tuple(m for m in of_scope(G) if m.sampled and m.static is Static.FACT)
# GPU metrics kept in GpuSample.values, in catalog order (the sample JSON's order), and those of them
# the NVML collector reads from their `nvml` source.
GPU_VALUES: tuple[Metric, ...] = tuple(m for m in of_scope(G) if m.in_values)
GPU_NVML: tuple[Metric, ...] = tuple(m for m in GPU_VALUES if m.nvml is not None)
# Per-GPU arrays of the wire `sample` payload filled from a metric's path, and the per-GPU keys of
# the wire `inventory` filled from the static ones.
GPU_WIRE: tuple[Metric, ...] = tuple(m for m in of_scope(G) if m.wire and m.sampled and m.static is Static.TICK)
GPU_WIRE_FACTS: tuple[Metric, ...] = tuple(m for m in GPU_FACTS if m.wire)
# The per-GPU wire arrays the reader takes through the catalog (into GpuTick.values).
GPU_WIRE_READ: tuple[Metric, ...] = tuple(m for m in GPU_WIRE if m.wire_range is not None)
