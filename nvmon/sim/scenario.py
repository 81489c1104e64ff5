"""The `--sim` spec: a board profile, traffic, seed and planted faults, in one string.

Syntax: ``PROFILE[,KEY=VALUE]...`` — for example::

    hgx-h100
    hgx-h100,load=idle,seed=7
    hgx-h100,nvlink_down=2.5,pcie_width=3:8,ib_rate=mlx5_1:100,power_cap=4:350
    pairs-a100,gpu_lost=6@30          (GPU 6 falls off the bus 30 s into the run)
    hgx-h100,pcie_width=3:8@5-20      (GPU 3 at x8 from 5 s to 20 s, then x16 again)

GPUs are numbered from 0, `G.L` is GPU G link L, IB ports are named by device (`mlx5_3`) or by
index (`3`). Any fault value may end in ``@SECONDS``: the fault starts that long after the board
starts; or in ``@START-END`` (END > START): it holds from START until END, then the hardware is
healthy again. Error counters stop rising at END (they keep their count), traffic resumes on a
link or port back up, the power wave returns to uncapped. A lost GPU answers again after END.
xid takes only ``@SECONDS`` (an event, not a state). The collector re-reads some values slowly:
PCIe gen/width and temperature every 15 ticks (with nvidia-ml-py < 12.535 also the power limit,
every 20), a lost GPU every 30, a port's link layer only at startup, and a query once answered Not Supported never again; so keep such a fault
long enough to be seen, and know that ib_eth / notsup getters ending show in sysfs / NVML only.
Keys (repeatable unless noted):

    seed=N                 deterministic traffic (default 1)          [once]
    load=idle|allreduce|busy   traffic pattern (default allreduce)    [once]
    nvlink_down=G.L        link inactive (the peer's end too on bridged pairs)
    nvlink_errors=G.L      CRC/replay/recovery counters rising on that link
    pcie_width=G[:W]       GPU PCIe link trained at xW (default x8)
    pcie_gen=G[:N]         GPU PCIe stuck at GenN under load (default Gen3)
    ib_down=P              IB port down (state DOWN, phys Polling)
    ib_rate=P[:GBPS]       IB port up at a lower rate (default 100)
    ib_eth=P               port in Ethernet (RoCE) mode instead of InfiniBand
    ib_errors=P            IB symbol/receive errors rising
    ib_pcie_width=P[:W]    the port's HCA trained at PCIe xW of x16 (default x8)
    power_cap=G[:W]        enforced power limit lowered (default 60 % of spec); throttles under load
    thermal=G              GPU hot (92 °C) with thermal slowdown
    power_brake=G          the board asserts the HW power brake on GPU G: clock event reasons
                           HwPowerBrakeSlowdown and HwSlowdown (0x80 | 0x8), busy or idle
    gpu_lost=G             GPU has fallen off the bus (NVML: GPU is lost)
    xid=G:N                NVML delivers one Xid critical-error event N on GPU G (e.g. xid=3:79@10);
                           the event only: add gpu_lost=G for a GPU that also falls off the bus;
                           the driver's NVRM Xid line goes to the simulated kernel log then too
                           (an Xid before `nvmon audit` started is found there)
    fabric=STATE           GPU fabric not ready on every GPU: not_started (Fabric Manager not
                           running) or in_progress (stuck configuring); NVSwitch boards with a
                           fabric NVML reports (hgx-h100, hgx-h200, hgx-h800, hgx-b200) only:
                           A100/A800 HGX, NVLink pairs and PCIe cards answer Not Supported
    fabric_status=CODE[:G] fabric completed with an error: an NVML return code, a number or
                           insufficient_resources, in_use, no_data, timeout, unknown
    fabric_health=BIT[:G]  a fabric health field set (degraded_bandwidth, route_recovery,
                           route_unhealthy, access_timeout_recovery, incorrect_configuration)
                           or the health summary (unhealthy, limited_capacity); all GPUs unless :G
    fabric_cluster=UUID[:CLIQUE]  the GPUs' fabric reports this cluster UUID and clique id (default
                           clique 1), as in a multi-node NVLink domain (NVL72-class); fabric
                           boards only; without it, an HGX board's all-zero UUID and clique 0   [once]
    notsup=WHAT[:G]        an NVML query answers Not Supported (WHAT: temperature, utilization,
                           throttle, energy, nvlink_state_field, pcie_bytes, xid_events); all
                           GPUs unless :G (xid_events: registering for Xid events is refused)
    nvml=off               no NVIDIA driver loaded (nvmlInit fails)                 [once]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nvmon.sim.fabric import HEALTH_BITS, has_fabric
from nvmon.sim.profiles import PROFILES

LOADS = ("idle", "allreduce", "busy")
NOTSUP = ("temperature", "utilization", "throttle", "energy", "nvlink_state_field", "pcie_bytes", "xid_events")
FAULT_KEYS = (
    "nvlink_down", "nvlink_errors", "pcie_width", "pcie_gen", "ib_down", "ib_rate", "ib_eth",
    "ib_errors", "ib_pcie_width", "power_cap", "power_brake", "thermal", "gpu_lost", "notsup", "xid",
    "fabric", "fabric_status", "fabric_health",
)
FABRIC_STATES = ("not_started", "in_progress")
FABRIC_STATUS = {"insufficient_resources": 23, "in_use": 19, "no_data": 21, "timeout": 10, "unknown": 999}


class SimSpecError(ValueError):
    """A malformed `--sim` spec; the message is one line, meant for the user."""


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    gpu: int | None = None
    link: int | None = None
    port: str | None = None  # IB device name or index as text
    value: float | None = None  # width, gen, rate, watts, Xid number
    what: str | None = None  # notsup target
    after_s: float = 0.0
    until_s: float | None = None  # the fault ends (the hardware is healthy again); None: never

    def active(self, t: float) -> bool:
        """Whether the fault holds at `t` seconds after the board started: [after_s, until_s)."""
        return self.after_s <= t and (self.until_s is None or t < self.until_s)


@dataclass(frozen=True, slots=True)
class Scenario:
    profile: str
    seed: int = 1
    load: str = "allreduce"
    nvml: bool = True
    faults: tuple[Fault, ...] = field(default_factory=tuple)
    fabric_cluster: tuple[str, int] | None = None  # (cluster UUID, clique id) the fabric reports


def _int(text: str, what: str, spec: str) -> int:
    if not re.fullmatch(r"\d+", text):
        raise SimSpecError(f"--sim {spec!r}: {what} must be a number, got {text!r}")
    return int(text)


def _num(text: str, what: str, spec: str) -> float:
    if not re.fullmatch(r"\d+(\.\d+)?", text):
        raise SimSpecError(f"--sim {spec!r}: {what} must be a number, got {text!r}")
    return float(text)


def parse_scenario(spec: str) -> Scenario:
    """Parse a `--sim` spec; raises SimSpecError with a one-line message."""
    parts = [p.strip() for p in spec.split(",")]
    profile = parts[0].lower()
    if profile not in PROFILES:
        raise SimSpecError(f"--sim: unknown board profile {parts[0]!r}; known: {', '.join(PROFILES)}")
    seed, load, nvml = 1, "allreduce", True
    cluster: tuple[str, int] | None = None
    faults: list[Fault] = []
    for part in parts[1:]:
        if not part:
            continue
        if "=" not in part:
            raise SimSpecError(f"--sim {spec!r}: expected KEY=VALUE, got {part!r}")
        key, value = (s.strip() for s in part.split("=", 1))
        key = key.lower().replace("-", "_")
        if key == "seed":
            seed = _int(value, "seed", spec)
        elif key == "load":
            if value not in LOADS:
                raise SimSpecError(f"--sim {spec!r}: load must be one of {', '.join(LOADS)}")
            load = value
        elif key == "nvml":
            if value not in ("on", "off"):
                raise SimSpecError(f"--sim {spec!r}: nvml must be on or off")
            nvml = value == "on"
        elif key == "fabric_cluster":
            cluster = _parse_cluster(value, spec)
        elif key in FAULT_KEYS:
            faults.append(_parse_fault(key, value, spec))
        else:
            raise SimSpecError(
                f"--sim {spec!r}: unknown key {key!r}; known: seed, load, nvml, fabric_cluster, "
                f"{', '.join(FAULT_KEYS)}"
            )
    prof = PROFILES[profile]
    if cluster is not None and not has_fabric(prof):
        raise SimSpecError(f"--sim {spec!r}: fabric_cluster: {profile} has no GPU fabric NVML reports; use "
                           "hgx-h100, hgx-h200, hgx-h800 or hgx-b200")
    for f in faults:
        if f.kind.startswith("fabric") and not has_fabric(prof):
            raise SimSpecError(f"--sim {spec!r}: {f.kind}: {profile} has no GPU fabric NVML reports (it answers "
                               "Not Supported); use hgx-h100, hgx-h200, hgx-h800 or hgx-b200")
        if f.gpu is not None and f.gpu >= prof.gpus:
            raise SimSpecError(f"--sim {spec!r}: {f.kind}: GPU {f.gpu} does not exist on {profile} ({prof.gpus} GPUs)")
        if f.link is not None and f.link >= prof.link_slots:
            raise SimSpecError(
                f"--sim {spec!r}: {f.kind}: link {f.link} does not exist on {profile} ({prof.link_slots} links)"
            )
        if f.port is not None and f.port.isdigit() and int(f.port) >= prof.ib_ports:
            raise SimSpecError(f"--sim {spec!r}: {f.kind}: IB port {f.port} does not exist ({prof.ib_ports} ports)")
        if f.port is not None and not f.port.isdigit():
            m = re.fullmatch(r"mlx5_(\d+)", f.port)
            if not m or int(m.group(1)) >= prof.ib_ports:
                raise SimSpecError(f"--sim {spec!r}: {f.kind}: no IB device {f.port!r} (mlx5_0..mlx5_{prof.ib_ports - 1})")
    return Scenario(profile=profile, seed=seed, load=load, nvml=nvml, faults=tuple(faults), fabric_cluster=cluster)


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _parse_cluster(value: str, spec: str) -> tuple[str, int]:
    uuid, _, clique = value.partition(":")
    if not _UUID.fullmatch(uuid):
        raise SimSpecError(f"--sim {spec!r}: fabric_cluster takes a UUID (8-4-4-4-12 hex digits)[:CLIQUE]")
    n = _int(clique, "fabric_cluster clique id", spec) if clique else 1
    if n >= 2**32:
        raise SimSpecError(f"--sim {spec!r}: fabric_cluster clique id must be below 2^32")
    return uuid.lower(), n


def _parse_when(kind: str, at: str, spec: str) -> tuple[float, float | None]:
    """`SECONDS` or `START-END` after `@`: (start, end or None)."""
    start, sep, end = at.partition("-")
    after = _num(start, f"{kind} start time", spec)
    if not sep:
        return after, None
    if kind == "xid":
        raise SimSpecError(f"--sim {spec!r}: xid is one event at its start time: @SECONDS, not @START-END")
    until = _num(end, f"{kind} end time", spec)
    if until <= after:
        raise SimSpecError(f"--sim {spec!r}: {kind} end time {end} must be after its start time {start}")
    return after, until


def _parse_fault(kind: str, value: str, spec: str) -> Fault:
    after, until = 0.0, None
    if "@" in value:
        value, at = value.rsplit("@", 1)
        after, until = _parse_when(kind, at, spec)
    arg: str | None = None
    if ":" in value:
        value, arg = value.split(":", 1)
    if kind in ("nvlink_down", "nvlink_errors"):
        m = re.fullmatch(r"(\d+)\.(\d+)", value)
        if not m or arg is not None:
            raise SimSpecError(f"--sim {spec!r}: {kind} takes GPU.LINK, e.g. {kind}=2.5")
        return Fault(kind, gpu=int(m.group(1)), link=int(m.group(2)), after_s=after, until_s=until)
    if kind in ("ib_down", "ib_rate", "ib_eth", "ib_errors", "ib_pcie_width"):
        if not re.fullmatch(r"\d+|mlx5_\d+", value):
            raise SimSpecError(f"--sim {spec!r}: {kind} takes an IB port: mlx5_N or N")
        if arg is not None and kind not in ("ib_rate", "ib_pcie_width"):
            raise SimSpecError(f"--sim {spec!r}: {kind} takes no ':' argument")
        if kind == "ib_pcie_width":
            width = _num(arg, "HCA PCIe width", spec) if arg is not None else 8.0
            if width not in (1, 2, 4, 8, 16):
                raise SimSpecError(f"--sim {spec!r}: ib_pcie_width must be 1, 2, 4, 8 or 16")
            return Fault(kind, port=value, value=width, after_s=after, until_s=until)
        rate = _num(arg, "IB rate", spec) if arg is not None else (100.0 if kind == "ib_rate" else None)
        return Fault(kind, port=value, value=rate, after_s=after, until_s=until)
    if kind.startswith("fabric"):
        return _parse_fabric(kind, value, arg, spec, after, until)
    if kind == "notsup":
        if value not in NOTSUP:
            raise SimSpecError(f"--sim {spec!r}: notsup takes one of {', '.join(NOTSUP)}")
        gpu = _int(arg, "GPU", spec) if arg is not None else None
        return Fault(kind, gpu=gpu, what=value, after_s=after, until_s=until)
    gpu = _int(value, f"{kind} GPU", spec)
    if kind == "xid":
        if arg is None:
            raise SimSpecError(f"--sim {spec!r}: xid takes GPU:XID, e.g. xid=3:79")
        return Fault(kind, gpu=gpu, value=float(_int(arg, "Xid number", spec)), after_s=after, until_s=until)
    if kind in ("thermal", "gpu_lost", "power_brake"):
        if arg is not None:
            raise SimSpecError(f"--sim {spec!r}: {kind} takes only a GPU number")
        return Fault(kind, gpu=gpu, after_s=after, until_s=until)
    val = _num(arg, f"{kind} value", spec) if arg is not None else None
    if kind == "pcie_width":
        val = 8.0 if val is None else val
        if val not in (1, 2, 4, 8, 16):
            raise SimSpecError(f"--sim {spec!r}: pcie_width must be 1, 2, 4, 8 or 16")
    elif kind == "pcie_gen":
        val = 3.0 if val is None else val
        if not 1 <= val <= 6:
            raise SimSpecError(f"--sim {spec!r}: pcie_gen must be 1..6")
    return Fault(kind, gpu=gpu, value=val, after_s=after, until_s=until)


def _parse_fabric(kind: str, value: str, arg: str | None, spec: str, after: float, until: float | None) -> Fault:
    if kind == "fabric":
        if value not in FABRIC_STATES or arg is not None:
            raise SimSpecError(f"--sim {spec!r}: fabric takes one of {', '.join(FABRIC_STATES)}")
        return Fault(kind, what=value, after_s=after, until_s=until)
    gpu = _int(arg, "GPU", spec) if arg is not None else None
    if kind == "fabric_status":
        code = FABRIC_STATUS.get(value) if not value.isdigit() else int(value)
        if not code:
            raise SimSpecError(f"--sim {spec!r}: fabric_status takes a non-zero NVML return code or one of "
                               f"{', '.join(FABRIC_STATUS)}")
        return Fault(kind, gpu=gpu, value=float(code), after_s=after, until_s=until)
    if value not in HEALTH_BITS:
        raise SimSpecError(f"--sim {spec!r}: fabric_health takes one of {', '.join(HEALTH_BITS)}")
    return Fault(kind, gpu=gpu, what=value, after_s=after, until_s=until)
