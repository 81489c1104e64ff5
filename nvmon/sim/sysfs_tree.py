"""Fake `/sys` trees in the kernel's exact formats, for tests and the hardware simulator.

Layout written under `root` (the stand-in for `/sys`), shaped like the real one:

    devices/pci<dddd>:<bb>/<bdf>/             a PCI function: vendor, device, class, numa_node,
                                              {current,max}_link_{speed,width}
    bus/pci/devices/<bdf> -> ../../../devices/pci<dddd>:<bb>/<bdf>
    class/infiniband/<dev>/device -> the PCI function's directory (relative link)
    class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer,counters/*,counters_ext/*}

Formats (NVML-FACTS.md §6): state `"4: ACTIVE"`, phys_state `"5: LinkUp"`, rate
`"200 Gb/sec (4X HDR)"`, speeds `"32.0 GT/s PCIe"`, widths and counters `"%u"`, ids `"0x%04x"`.

Writes never expose an empty or half-old file to a concurrent reader (see `_put`), so the
simulator may update the tree while a collector reads it. For speed keep the simulator's tree
on tmpfs (`/dev/shm`): ~10 µs a file there. Call `write_pci_device` before `write_ib_port`
for the HCA's bdf, or the `device` link dangles (the collector then notes it).
"""

from __future__ import annotations

import os
from pathlib import Path

from nvmon.collect.attrfiles import FdBudget

MELLANOX_VENDOR = 0x15B3
NVIDIA_VENDOR = 0x10DE
CLASS_INFINIBAND = 0x020700  # Network controller: Infiniband controller
CLASS_ETHERNET = 0x020000
CLASS_3D = 0x030200  # datacenter GPUs (no display) are "3D controller"
CLASS_NVSWITCH = 0x068000  # Bridge: other

IB_STATE_IDS = {"NOP": 0, "DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
IB_PHYS_STATE_IDS = {
    "Sleep": 1, "Polling": 2, "Disabled": 3, "PortConfigurationTraining": 4,
    "LinkUp": 5, "LinkErrorRecovery": 6, "Phy Test": 7,
}
# Gb/s per lane → name, as sysfs.c's rate_show derives it.
_LANE_NAMES = {2.5: "SDR", 5.0: "DDR", 10.0: "QDR", 14.0: "FDR", 25.0: "EDR",
               50.0: "HDR", 100.0: "NDR", 200.0: "XDR"}
PCI_SPEEDS = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe",
              5: "32.0 GT/s PCIe", 6: "64.0 GT/s PCIe"}


def _put(path: str, text: str) -> None:
    """Write `text` to `path` so that a concurrent reader sees the old or the new value.

    Fast path (a counter that grows, a same-length state): overwrite in place, since the new
    bytes cover all the old ones. A shorter value goes through a temp file and a rename, which
    is atomic but slow on ext4 (~0.5 ms: the rename forces the new file's blocks out).
    Truncating in place would be both slow on ext4 and briefly show an empty file.
    """
    data = text.encode("ascii")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        if os.lseek(fd, 0, os.SEEK_END) <= len(data):  # the file's size (cheaper than fstat)
            os.pwrite(fd, data, 0)
            return
    finally:
        os.close(fd)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def pci_speed_text(gen: int | None) -> str:
    """`pci_speed_string` of a generation: 4 → "16.0 GT/s PCIe"; None or unknown → "Unknown"."""
    return PCI_SPEEDS.get(gen, "Unknown") if gen is not None else "Unknown"


def ib_rate_text(rate_gbps: float, width: str = "4X", name: str | None = None) -> str:
    """sysfs.c rate_show: `"%d%s Gb/sec (%dX%s)"`, e.g. 200, "4X" → "200 Gb/sec (4X HDR)".

    `name` None derives it from Gb/s per lane; pass "" for old kernels' suffix-less SDR.
    """
    if name is None:
        lanes = int(width.rstrip("Xx") or 1)
        name = _LANE_NAMES.get(rate_gbps / lanes, "")
    suffix = f" {name}" if name else ""
    return f"{rate_gbps:g} Gb/sec ({width}{suffix})"


def pci_device_dir(root: Path | str, bdf: str) -> Path:
    """Where `write_pci_device` puts the function's real directory (under `devices/`)."""
    domain, bus = bdf.split(":")[:2]
    return Path(root) / "devices" / f"pci{domain}:{bus}" / bdf


def write_pci_device(
    root: Path | str,
    bdf: str,
    *,
    vendor: int = MELLANOX_VENDOR,
    device: int = 0x101B,  # ConnectX-6
    class_code: int = CLASS_INFINIBAND,
    cur_gen: int | None,
    max_gen: int | None,
    cur_width: int | None,
    max_width: int | None,
    numa_node: int = 0,
) -> Path:
    """Create a PCI function `bdf` ("0000:18:00.0") and its `bus/pci/devices` link; return its dir.

    A `None` gen is written as "Unknown"; a `None` width leaves the file out.
    """
    d = pci_device_dir(root, bdf)
    d.mkdir(parents=True, exist_ok=True)
    files = {
        "vendor": f"0x{vendor:04x}\n",
        "device": f"0x{device:04x}\n",
        "class": f"0x{class_code:06x}\n",
        "numa_node": f"{numa_node}\n",
    }
    files["current_link_speed"] = pci_speed_text(cur_gen) + "\n"
    files["max_link_speed"] = pci_speed_text(max_gen) + "\n"
    if cur_width is not None:
        files["current_link_width"] = f"{cur_width}\n"
    if max_width is not None:
        files["max_link_width"] = f"{max_width}\n"
    for name, text in files.items():
        _put(str(d / name), text)
    bus_dir = Path(root) / "bus" / "pci" / "devices"
    bus_dir.mkdir(parents=True, exist_ok=True)
    link = bus_dir / bdf
    if not os.path.lexists(link):
        link.symlink_to(os.path.relpath(d, bus_dir))
    return d


def update_pci_link(
    root: Path | str,
    bdf: str,
    *,
    cur_gen: int | None = None,
    cur_width: int | None = None,
    max_gen: int | None = None,
    max_width: int | None = None,
) -> None:
    """Rewrite the given link files of an existing PCI function (None: leave it; gen 0: "Unknown")."""
    d = str(pci_device_dir(root, bdf))
    for name, gen in (("current_link_speed", cur_gen), ("max_link_speed", max_gen)):
        if gen is not None:
            _put(f"{d}/{name}", pci_speed_text(gen) + "\n")
    for name, width in (("current_link_width", cur_width), ("max_link_width", max_width)):
        if width is not None:
            _put(f"{d}/{name}", f"{width}\n")


def _port_dir(root: Path | str, dev: str, port: int) -> str:
    return os.path.join(root, "class", "infiniband", dev, "ports", str(port))


def write_ib_port(
    root: Path | str,
    dev: str,
    port: int,
    *,
    state: str = "ACTIVE",
    phys_state: str = "LinkUp",
    rate_gbps: float = 200,
    width: str = "4X",
    rate_name: str | None = None,
    link_layer: str = "InfiniBand",
    counters: dict[str, int] | None = None,
    counters_ext: dict[str, int] | None = None,
    bdf: str | None = None,
) -> Path:
    """Create port `port` of IB device `dev` (e.g. "mlx5_0"); return the port directory.

    `counters` go to `counters/<name>` (e.g. {"port_xmit_data": 0, "symbol_error": 0}),
    `counters_ext` to the pre-4.5 `counters_ext/<name>` (e.g. {"port_xmit_data_64": 0}).
    `bdf`: the HCA's PCI function, linked as `class/infiniband/<dev>/device`.
    """
    dev_dir = os.path.join(root, "class", "infiniband", dev)
    pdir = _port_dir(root, dev, port)
    os.makedirs(pdir + "/counters", exist_ok=True)
    if not os.path.exists(dev_dir + "/fw_ver"):  # device-level files some tools require
        _put(dev_dir + "/fw_ver", "20.31.1014\n")
        _put(dev_dir + "/node_type", "1: CA\n")
        _put(dev_dir + "/hca_type", "MT4123\n")
    if bdf is not None and not os.path.lexists(dev_dir + "/device"):
        os.symlink(os.path.relpath(pci_device_dir(root, bdf), dev_dir), dev_dir + "/device")
    _put(pdir + "/link_layer", link_layer + "\n")
    update_ib_state(root, dev, port, state=state, phys_state=phys_state,
                    rate_gbps=rate_gbps, width=width, rate_name=rate_name)
    if counters:
        update_ib_counters(root, dev, port, counters)
    if counters_ext:
        os.makedirs(pdir + "/counters_ext", exist_ok=True)
        update_ib_counters(root, dev, port, counters_ext, ext=True)
    return Path(pdir)


def update_ib_counters(
    root: Path | str, dev: str, port: int, counters: dict[str, int], *, ext: bool = False,
    files: OpenFiles | None = None,
) -> None:
    """Rewrite counter files ("%u"), in `counters/` or, with `ext`, `counters_ext/`. `files`: keep
    them open between calls (a simulator rewriting them every tick)."""
    d = _port_dir(root, dev, port) + ("/counters_ext/" if ext else "/counters/")
    put = _put if files is None else files.put
    for name, value in counters.items():
        put(d + name, f"{value}\n")


_SIM_FD_BUDGET = FdBudget(share=16, cap=512)  # for every simulated node of a process together


class OpenFiles:
    """Files kept open for in-place rewrites, as `_put` does them: a value at least as long as the
    file's (a counter's text only grows) is one pwrite; a shorter one goes through `_put`'s
    rename, and the new file is opened again. For a tree with one writer (a SimNode's). Past the
    process's budget (`nvmon demo` runs up to 100 nodes), files are opened per write."""

    def __init__(self, budget: FdBudget = _SIM_FD_BUDGET):
        self.budget = budget
        self._open: dict[str, tuple[int, int]] = {}  # path → (fd, length of the text in it)

    def put(self, path: str, text: str) -> None:
        data = text.encode("ascii")
        kept = self._open.get(path)
        if kept is not None:
            fd, length = kept
            if len(data) >= length:
                os.pwrite(fd, data, 0)
                self._open[path] = (fd, len(data))
                return
            del self._open[path]
            os.close(fd)
            self.budget.give()
        _put(path, text)
        if self.budget.take():
            try:
                self._open[path] = (os.open(path, os.O_WRONLY | os.O_CLOEXEC), len(data))
            except OSError:
                self.budget.give()
                raise

    def close(self) -> None:
        for fd, _ in self._open.values():
            os.close(fd)
        self.budget.give(len(self._open))
        self._open.clear()


def update_ib_state(
    root: Path | str,
    dev: str,
    port: int,
    *,
    state: str | None = None,
    phys_state: str | None = None,
    rate_gbps: float | None = None,
    width: str = "4X",
    rate_name: str | None = None,
    link_layer: str | None = None,
) -> None:
    """Rewrite state / phys_state / rate / link_layer of a port; arguments left None are not touched."""
    pdir = _port_dir(root, dev, port)
    if link_layer is not None:
        _put(pdir + "/link_layer", link_layer + "\n")
    if state is not None:
        _put(pdir + "/state", f"{IB_STATE_IDS[state]}: {state}\n")
    if phys_state is not None:
        _put(pdir + "/phys_state", f"{IB_PHYS_STATE_IDS[phys_state]}: {phys_state}\n")
    if rate_gbps is not None:
        _put(pdir + "/rate", ib_rate_text(rate_gbps, width, rate_name) + "\n")
