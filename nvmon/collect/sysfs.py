"""Linux sysfs readers: InfiniBand ports, PCIe links, NVSwitch discovery, NUMA nodes.

Every reader takes `root`, the directory standing in for `/sys`, so tests and the simulator use
trees written in the kernel's formats (see `nvmon.sim.sysfs_tree`). Formats and sources are in
NVML-FACTS.md §6 (kernel `drivers/infiniband/core/sysfs.c`, `drivers/pci/pci-sysfs.c`).

Nothing here raises for a missing, unreadable or garbled file: the value becomes `None` and, where
the result has `notes`, a short note says why. One bad port never hides the others.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from nvmon.collect.attrfiles import AttrFiles, read_path
from nvmon.collect.counters import CounterTracker
from nvmon.model import IB_PHYS_STATES, IB_STATES, IbPortSample, PciDeviceLink, PcieLink, short_bus_id

# PMA PortCounters widths, from sysfs.c PORT_PMA_ATTR(name, counter, width, offset).
# These counters saturate (stick at all-ones) rather than wrap.
IB_ERROR_WIDTHS: dict[str, int] = {
    "symbol_error": 16,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "link_error_recovery": 8,
    "port_xmit_discards": 16,
}  # same keys and order as model.IB_ERROR_KINDS (a test checks)

U32_MAX = 0xFFFFFFFF
T = TypeVar("T")

# Gb/s per lane → IB speed name (sysfs.c prints deci-Gb/s per lane × width).
# FDR10 is 10 Gb/s per lane like QDR; kernels always print its suffix, so a bare 10 means QDR.
_IB_LANE_NAMES = {2.5: "SDR", 5.0: "DDR", 10.0: "QDR", 14.0: "FDR", 25.0: "EDR",
                  50.0: "HDR", 100.0: "NDR", 200.0: "XDR"}
_PCI_GT_TO_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}

NVIDIA_VENDOR = 0x10DE
NVSWITCH_CLASS_PREFIX = 0x0680  # PCI class "bridge, other": NVSwitch presents itself so

# re.ASCII: `\d` must not accept other scripts' digits, which int() would then happily convert.
_STATE_RE = re.compile(r"^\s*(-?\d+)\s*(?::\s*(.*?))?\s*$", re.ASCII)
_RATE_RE = re.compile(
    r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec\s*(?:\(\s*(\d+)X\s*([A-Za-z0-9]*)\s*\))?\s*$", re.ASCII)
_SPEED_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s\b", re.ASCII)
_INT_RE = re.compile(r"^\s*(?:(-?\d+)|0[xX]([0-9a-fA-F]+))\s*$", re.ASCII)
_BDF_RE = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


# --- pure parsers -----------------------------------------------------------------------------


def _parse_id_name(text: str | None, names: dict[int, str]) -> tuple[int, str] | None:
    if text is None:
        return None
    m = _STATE_RE.match(text)
    if not m:
        return None
    num = int(m.group(1))
    name = m.group(2) or names.get(num)  # bare "%d" form: name from the kernel's table
    return (num, name) if name else None


def parse_ib_state(text: str | None) -> tuple[int, str] | None:
    """`"4: ACTIVE\\n"` → `(4, "ACTIVE")`; a bare `"4"` is named from the kernel's table."""
    return _parse_id_name(text, IB_STATES)


def parse_phys_state(text: str | None) -> tuple[int, str] | None:
    """`"5: LinkUp\\n"` → `(5, "LinkUp")`; accepts old kernels' signed `%d` and a bare number."""
    return _parse_id_name(text, IB_PHYS_STATES)


def parse_ib_rate(text: str | None) -> tuple[float, str | None] | None:
    """`"200 Gb/sec (4X HDR)\\n"` → `(200.0, "HDR")`.

    Without a name suffix (old kernels' SDR) the name is derived from Gb/s per lane, or None.
    HDR100 reads `"100 Gb/sec (2X HDR)"` → `(100.0, "HDR")`: the name is the lane speed.
    """
    if text is None:
        return None
    m = _RATE_RE.match(text)
    if not m:
        return None
    gbps = float(m.group(1))
    name = m.group(3) or None
    if name is None and m.group(2):
        lanes = int(m.group(2))
        name = _IB_LANE_NAMES.get(gbps / lanes) if lanes else None
    return gbps, name


def parse_pci_speed(text: str | None) -> int | None:
    """`"16.0 GT/s PCIe\\n"` (or old kernels' `"16 GT/s"`) → PCIe generation 4; "Unknown" → None."""
    if text is None:
        return None
    m = _SPEED_RE.match(text)
    return _PCI_GT_TO_GEN.get(float(m.group(1))) if m else None


def parse_int(text: str | None) -> int | None:
    """Decimal (`"16\\n"`, `"-1"`) or hex with `0x` (`"0x10de"`); anything else → None."""
    m = _INT_RE.match(text) if text is not None else None
    if not m:
        return None  # int() alone would also take "1_000", "+5" and non-ASCII digits
    return int(m.group(1)) if m.group(1) is not None else int(m.group(2), 16)


def nvml_to_sysfs_bdf(bus_id: str) -> str | None:
    """NVML `"00000000:18:00.0"` → sysfs `"0000:18:00.0"` (4-digit lower-case domain); bad → None.
    The form the views show too: nvmon.model.short_bus_id, the one conversion."""
    m = _BDF_RE.match(bus_id.strip())
    return short_bus_id(m.group(0)) if m else None


def sysfs_to_nvml_bdf(bdf: str) -> str | None:
    """sysfs `"0000:18:00.0"` → NVML `"00000000:18:00.0"` (8-digit upper-case); bad → None."""
    m = _BDF_RE.match(bdf.strip())
    if not m:
        return None
    dom, bus, dev, fn = m.groups()
    return f"{int(dom, 16):08X}:{bus.upper()}:{dev.upper()}.{fn}"


# --- file access ------------------------------------------------------------------------------


def _read(path: str) -> str:
    return read_path(path).decode("utf-8", "replace")


def _try_read(path: str) -> str | None:
    try:
        return _read(path)
    except OSError:
        return None


def _read_noted(path: str, label: str, notes: list[str]) -> str | None:
    try:
        return _read(path)
    except OSError as e:
        notes.append(_read_error(label, e))
        return None


def _read_error(label: str, e: OSError) -> str:
    if isinstance(e, FileNotFoundError):
        return f"{label} missing"
    return f"{label} unreadable ({e.strerror or type(e).__name__})"


def _read_counter(path: str, label: str, notes: list[str], read: Callable[[str], bytes] = read_path) -> int | None:
    """A "%u" counter attribute. A missing or unreadable file, old kernels' "N/A (no PMA)" or
    anything else that is not a number leaves a note and gives None."""
    try:
        raw = read(path)
    except OSError as e:
        notes.append(_read_error(label, e))
        return None
    s = raw.strip()
    if s.isdigit():  # bytes.isdigit: ASCII digits only
        return int(s)
    notes.append(f"{label} unparsable: {raw.decode('utf-8', 'replace').strip()[:24]!r}")
    return None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


# --- PCI --------------------------------------------------------------------------------------


def _pci_dir(root: Path | str, bdf: str) -> str:
    return os.path.join(root, "bus", "pci", "devices", bdf)


def _read_link_dir(d: str) -> PcieLink:
    return PcieLink(
        gen=parse_pci_speed(_try_read(d + "/current_link_speed")),
        max_gen=parse_pci_speed(_try_read(d + "/max_link_speed")),
        width=parse_int(_try_read(d + "/current_link_width")),
        max_width=parse_int(_try_read(d + "/max_link_width")),
    )


def read_pci_link(root: Path | str, bdf: str) -> PcieLink | None:
    """Current and max gen/width of `bus/pci/devices/<bdf>`; None when the device is absent."""
    d = _pci_dir(root, bdf)
    return _read_link_dir(d) if os.path.isdir(d) else None


def pci_numa_node(root: Path | str, bdf: str) -> int | None:
    """NUMA node of a PCI device; None when unknown (the kernel prints -1 without NUMA)."""
    n = parse_int(_try_read(_pci_dir(root, bdf) + "/numa_node"))
    return n if n is not None and n >= 0 else None


def find_nvswitches(root: Path | str) -> list[str]:
    """Sorted sysfs bdfs of NVSwitch chips: vendor 0x10de with PCI class 0x0680xx.

    Scans every PCI device (two reads each): call it once and pass the list to
    `collect_nvswitch_links` on each tick.
    """
    base = os.path.join(root, "bus", "pci", "devices")
    found = []
    for bdf in _listdir(base):
        d = os.path.join(base, bdf)
        if parse_int(_try_read(d + "/vendor")) != NVIDIA_VENDOR:
            continue
        cls = parse_int(_try_read(d + "/class"))
        if cls is not None and cls >> 8 == NVSWITCH_CLASS_PREFIX:
            found.append(bdf)
    return sorted(found)


def collect_nvswitch_links(
    root: Path | str, bdfs: list[str] | tuple[str, ...] | None = None
) -> tuple[PciDeviceLink, ...]:
    """PCIe link of each NVSwitch (`bdfs`, or discovered with `find_nvswitches` when None)."""
    if bdfs is None:
        bdfs = find_nvswitches(root)
    return tuple(
        PciDeviceLink(pci_bus_id=b, kind="nvswitch", pcie=read_pci_link(root, b) or PcieLink())
        for b in bdfs
    )


# --- InfiniBand -------------------------------------------------------------------------------


@dataclass(slots=True)
class _PortStatic:
    """What is read once per port: link layer, HCA PCI device, max link, counter file layout."""

    link_layer: str | None
    bdf: str | None
    pci_dir: str | None
    max_gen: int | None
    max_width: int | None
    tx_path: str  # 64-bit counters_ext/*_64 when present, else counters/port_xmit_data
    rx_path: str
    data_64bit: bool  # proven 64-bit: counters_ext, or a value above 2**32-1 seen
    port_dir: str
    errors: tuple[tuple[str, str, int], ...]  # (kind, counter file, width in bits), IB_ERROR_WIDTHS order
    watch: tuple[str, ...]  # the directories of the per-tick files (see nvmon/collect/attrfiles.py)
    notes: tuple[str, ...] = ()  # failures here make the next tick read the statics again


def _read_port_static(dev_dir: str, port_dir: str) -> _PortStatic:
    notes: list[str] = []
    ll = _read_noted(port_dir + "/link_layer", "link_layer", notes)
    link_layer = (ll.strip() or None) if ll is not None else None
    bdf = pci_dir = max_gen = max_width = None
    dev_link = dev_dir + "/device"
    if os.path.lexists(dev_link):
        # realpath ends in the PCI function's directory, named by its bdf (NCCL's ncclIbGetPciPath
        # does the same). A subfunction/auxiliary device sits below its PCI function: walk up.
        real = os.path.realpath(dev_link)
        for _ in range(3):
            if _BDF_RE.match(os.path.basename(real)):
                break
            real = os.path.dirname(real)
        name = os.path.basename(real)
        if _BDF_RE.match(name) and os.path.isdir(real):
            bdf, pci_dir = name.lower(), real
            max_gen = parse_pci_speed(_try_read(real + "/max_link_speed"))
            max_width = parse_int(_try_read(real + "/max_link_width"))
            if max_gen is None or max_width is None:
                notes.append("pcie max link unreadable")
        else:
            notes.append("device link is not a PCI device")
    else:
        notes.append("device link missing")
    # Kernels before 4.5 put the 64-bit data counters in counters_ext/*_64: prefer them.
    has_ext = os.path.exists(port_dir + "/counters_ext/port_xmit_data_64")
    data = port_dir + ("/counters_ext/port_{}_data_64" if has_ext else "/counters/port_{}_data")
    return _PortStatic(
        link_layer=link_layer, bdf=bdf, pci_dir=pci_dir, max_gen=max_gen, max_width=max_width,
        tx_path=data.format("xmit"), rx_path=data.format("rcv"), data_64bit=has_ext,
        port_dir=port_dir, notes=tuple(notes),
        errors=tuple((kind, f"{port_dir}/counters/{kind}", width) for kind, width in IB_ERROR_WIDTHS.items()),
        watch=(port_dir, port_dir + "/counters") + ((port_dir + "/counters_ext",) if has_ext else ()),
    )


LINK_REFRESH_TICKS = 30  # ticks between re-reads of the HCAs' current PCIe links and of the port list


class IbCollector:
    """Samples every port under `<root>/class/infiniband/<dev>/ports/<n>/` once per `collect`.

    Keeps per-port static facts and the previous counter readings, so rates need two ticks.
    The device directory is listed every tick (an HCA added or removed shows at once); each
    device's ports are listed again only when the devices change, every LINK_REFRESH_TICKS
    ticks, or after a port's file went missing. A port's per-tick files stay open and are re-read
    with pread (AttrFiles). Not thread-safe: one collector per sampling loop; `close()` at the end.
    """

    def __init__(self, root: Path | str) -> None:
        self._ib = os.path.join(root, "class", "infiniband")
        self._tracker = CounterTracker()
        self._static: dict[tuple[str, int], _PortStatic] = {}
        self._links: dict[str, tuple[int | None, int | None]] = {}
        self._devs: list[str] | None = None  # the device listing the port list was built from
        self._ports: list[tuple[str, str, int]] = []  # (device, device dir, port), sorted
        self._parsed: dict[tuple[str, bytes], Any] = {}  # state/phys_state/rate text → parsed
        self._files = AttrFiles()
        self._ticks = 0

    def close(self) -> None:
        """Close the attribute files kept open (the collector may be used again)."""
        self._files.close()

    def _scan(self, devs: list[str]) -> list[tuple[str, str, int]]:
        ports = []
        for dev in devs:
            dev_dir = f"{self._ib}/{dev}"
            nums = sorted(int(p) for p in _listdir(dev_dir + "/ports") if p.isascii() and p.isdigit())
            ports.extend((dev, dev_dir, n) for n in nums)
        seen = {(dev, n) for dev, _, n in ports}
        for key in [k for k in self._static if k not in seen]:  # port gone: forget its history
            del self._static[key]
            self._tracker.forget(key)
        self._files.keep_only(seen)
        return ports

    def collect(self, ts: float) -> tuple[IbPortSample, ...]:
        """One sample per port, sorted by (device, port). `ts`: unix seconds of this reading."""
        # The HCAs' current PCIe links change only when a link retrains: re-read every
        # LINK_REFRESH_TICKS ticks (and on the first), shared by the ports of one HCA.
        if self._ticks % LINK_REFRESH_TICKS == 0:
            self._links = {}
            self._devs = None
        self._ticks += 1
        devs = sorted(_listdir(self._ib))
        if devs != self._devs:
            self._ports, self._devs = self._scan(devs), devs
        links = self._links
        out = tuple(self._collect_port(dev, dev_dir, port, ts, links) for dev, dev_dir, port in self._ports)
        if any(n.endswith(" missing") for p in out for n in p.notes):
            self._devs = None  # a port may be gone: list the ports again next tick
        return out

    def _text(self, path: str, label: str, parse: Callable[[str], T | None], notes: list[str],
              read: Callable[[str], bytes]) -> T | None:
        """A state/phys_state/rate attribute, parsed; the few texts a port shows are parsed once."""
        try:
            raw = read(path)
        except OSError as e:
            notes.append(_read_error(label, e))
            return None
        key = (label, raw)
        value = self._parsed.get(key)
        if value is None:
            text = raw.decode("utf-8", "replace")
            value = parse(text)
            if value is None:
                notes.append(f"{label} unparsable: {text.strip()[:24]!r}")
                return None
            if len(self._parsed) < 256:  # bounded: a garbled, ever-changing file cannot grow it
                self._parsed[key] = value
        return value

    def _collect_port(
        self, dev: str, dev_dir: str, port: int, ts: float,
        links: dict[str, tuple[int | None, int | None]],
    ) -> IbPortSample:
        key = (dev, port)
        st = self._static.get(key)
        if st is None or st.notes:
            prev = st
            st = _read_port_static(dev_dir, f"{dev_dir}/ports/{port}")
            if prev is not None:  # keep what a counter already proved
                st.data_64bit = st.data_64bit or prev.data_64bit
            self._static[key] = st
        notes = list(st.notes)
        port_dir = st.port_dir
        files = self._files
        files.begin(key, st.watch)

        def read(path: str) -> bytes:
            return files.read(key, path)

        state = self._text(port_dir + "/state", "state", parse_ib_state, notes, read)
        phys = self._text(port_dir + "/phys_state", "phys_state", parse_phys_state, notes, read)
        rate = self._text(port_dir + "/rate", "rate", parse_ib_rate, notes, read)

        tx = self._data_rate(st, key, "port_xmit_data", st.tx_path, ts, notes, read)
        rx = self._data_rate(st, key, "port_rcv_data", st.rx_path, ts, notes, read)

        errors: dict[str, int | None] = {}
        deltas: dict[str, int | None] = {}
        delta = self._tracker.delta
        for kind, path, width in st.errors:
            v = _read_counter(path, kind, notes, read)
            errors[kind] = v
            deltas[kind] = delta((dev, port, kind), v, ts, width_bits=width, saturates=True)[0]
            if v is not None and v >= (1 << width) - 1:
                notes.append(f"{kind} saturated ({width}-bit)")

        pcie = PcieLink()
        if st.pci_dir is not None:
            cur = links.get(st.pci_dir)
            if cur is None:
                cur = links[st.pci_dir] = (
                    parse_pci_speed(_try_read(st.pci_dir + "/current_link_speed")),
                    parse_int(_try_read(st.pci_dir + "/current_link_width")),
                )
            if None in cur:
                notes.append("pcie current link unreadable")
            pcie = PcieLink(gen=cur[0], max_gen=st.max_gen, width=cur[1], max_width=st.max_width)

        return IbPortSample(
            device=dev, port=port, state=state and state[1], phys_state=phys and phys[1],
            rate_gbps=rate and rate[0], rate_name=rate and rate[1], link_layer=st.link_layer,
            tx_bytes_per_s=tx, rx_bytes_per_s=rx, errors=errors, errors_delta=deltas,
            pcie=pcie, pci_bus_id=st.bdf, notes=tuple(notes),
        )

    def _data_rate(
        self, st: _PortStatic, key: tuple[str, int], label: str, path: str, ts: float,
        notes: list[str], read: Callable[[str], bytes],
    ) -> float | None:
        """Bytes/s from a data counter in 4-octet words (ABI: "divided by 4 (lanes)")."""
        v = _read_counter(path, label, notes, read)
        if v is not None and v > U32_MAX:
            st.data_64bit = True  # a 32-bit counter can never exceed this
        if st.data_64bit:
            width = 64
        else:
            # counters/port_xmit_data is 32 or 64 bits depending on the HCA's PMA capability,
            # which the file does not say: all-ones is treated as a stuck 32-bit counter.
            width = 32
            if v == U32_MAX:
                notes.append(f"{label} saturated (32-bit)")
        return self._tracker.rate(key + (label,), v, ts, scale=4.0, width_bits=width,
                                  saturates=True)
