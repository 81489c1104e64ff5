"""A whole simulated node: board + fake NVML module + fake sysfs tree kept in step with the board."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

from nvmon import xid as xids
from nvmon.sim import sysfs_tree as tree
from nvmon.sim.board import SimBoard
from nvmon.sim.fakenvml import load_sim_pynvml
from nvmon.sim.scenario import Scenario, parse_scenario


def _remove_orphans(base: Path) -> None:
    """Trees left by simulated nodes whose process died without close() (kill -9): the owner's pid
    is in the directory name, so a tree whose process is gone can be removed."""
    for d in base.glob("nvmon-sim-*-*"):
        pid = d.name.split("-")[2]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(d, ignore_errors=True)


BOOTED_S = 3600.0  # the simulated kernel booted this long before the board's start (its log's clock)


class SimNode:
    """`nvml` is a pynvml module backed by the board; `sysfs_root` a fake /sys; call `sync()` before
    each sysfs read so files show the board's state at that moment. `kmsg_path` is a fake
    `/dev/kmsg` (its records' times on the clock `kernel_uptime()` reads): the driver's NVRM Xid
    line for each `xid=` fault is in it once the fault's time has come."""

    def __init__(
        self,
        spec: str | Scenario,
        *,
        root: Path | None = None,
        clock: Callable[[], float] = time.time,
        node: str = "sim-node",
    ):
        scenario = parse_scenario(spec) if isinstance(spec, str) else spec
        self.board = SimBoard(scenario, clock=clock, node=node)
        self.nvml: types.ModuleType = load_sim_pynvml(self.board)
        self._own_root = root is None
        if root is None:
            # tmpfs when there is one: the tree is rewritten every tick, and disk file systems
            # make that cost ~1 ms a tick (measured on ext4), tmpfs ~0.1 ms.
            shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
            _remove_orphans(Path(shm or tempfile.gettempdir()))
            root = Path(tempfile.mkdtemp(prefix=f"nvmon-sim-{os.getpid()}-", dir=shm))
        self.sysfs_root = Path(root)
        self._last_state: dict[int, tuple] = {}
        self._last_counters: dict[int, dict[str, int]] = {}  # per IB port: the values in its files
        self._hca_width: dict[int, int] = {}  # per IB port: its HCA's current PCIe width in sysfs
        self._counter_files = tree.OpenFiles()  # rewritten every tick: kept open
        self.kmsg_path = self.sysfs_root / "kmsg"  # beside the fake /sys's class/ and bus/, read by nothing there
        self._kmsg_seq = 0
        self._xids_logged: set[int] = set()
        self._xid_faults = sum(1 for f in scenario.faults if f.kind == "xid")
        self._write_tree()
        self._write_kmsg()

    def _write_tree(self) -> None:
        b, p, root = self.board, self.board.profile, self.sysfs_root
        half = max(1, p.gpus // 2)
        for g in b.gpus:
            bdf = g.bus_id[4:].lower()
            tree.write_pci_device(root, bdf, vendor=tree.NVIDIA_VENDOR, device=p.pci_device_id >> 16,
                                  class_code=tree.CLASS_3D, cur_gen=p.pcie_gen, max_gen=p.pcie_gen,
                                  cur_width=p.pcie_width, max_width=p.pcie_width, numa_node=g.index // half)
        for s in range(p.switches):
            tree.write_pci_device(root, p.switch_bdf(s), vendor=tree.NVIDIA_VENDOR, device=0x22A3,
                                  class_code=tree.CLASS_NVSWITCH, cur_gen=4, max_gen=4, cur_width=2,
                                  max_width=2, numa_node=s * 2 // max(1, p.switches))
        t = b.now()
        for i, dev in enumerate(b.ib_names):
            bdf = p.hca_bdf(i)
            hca_gen = 5 if p.ib_rate_gbps >= 400 else 4
            self._hca_width[i] = b.hca_pcie_width(i, t)
            tree.write_pci_device(root, bdf, cur_gen=hca_gen, max_gen=hca_gen, cur_width=self._hca_width[i],
                                  max_width=16, numa_node=i * 2 // max(1, p.ib_ports))
            state, phys, rate, layer = b.ib_state(i, t)
            counters = self._counters(i, t)
            tree.write_ib_port(root, dev, 1, state=state, phys_state=phys, rate_gbps=rate, link_layer=layer,
                               counters=counters, bdf=bdf)
            self._last_state[i] = (state, phys, rate, layer)
            self._last_counters[i] = counters

    def kernel_uptime(self) -> float:
        """Seconds since the simulated kernel booted: the clock of `kmsg_path`'s records."""
        return BOOTED_S + self.board.now()

    def _write_kmsg(self) -> None:
        """Append the kernel log records due by now: at start the driver's load line, then the
        NVRM Xid line of each xid fault whose time has come (the real driver's format)."""
        t = self.board.now()
        lines = []
        if self._kmsg_seq == 0:
            lines.append((BOOTED_S - 60.0, 6, "nvidia-nvlink: Nvlink Core is being initialized, major device "
                                               "number 511"))
            lines.append((BOOTED_S - 59.0, 6, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  "
                                               f"{self.board.profile.driver}"))
        for n, f in enumerate(self.board.scenario.faults):
            if f.kind == "xid" and f.after_s <= t and n not in self._xids_logged and f.gpu is not None:
                self._xids_logged.add(n)
                bus = self.board.gpus[f.gpu].bus_id[4:14].lower()  # "00000000:18:00.0" → "0000:18:00"
                x = int(f.value or 0)
                lines.append((BOOTED_S + f.after_s, 4, f"NVRM: Xid (PCI:{bus}): {x}, pid=2{f.gpu}31, name=python3, "
                                                      f"{xids.meaning(x)}."))
        if not lines:
            return
        with open(self.kmsg_path, "a", encoding="utf-8") as out:
            for ts, level, text in lines:
                self._kmsg_seq += 1
                out.write(f"{level},{self._kmsg_seq},{int(ts * 1e6)},-;{text}\n")

    def _counters(self, i: int, t: float) -> dict[str, int]:
        tx, rx = self.board.ib_words(i, t)
        return {"port_xmit_data": tx, "port_rcv_data": rx, **self.board.ib_errors(i, t)}

    def sync(self) -> None:
        """Bring the fake sysfs files up to the board's present moment. Only files whose value
        changed are rewritten (the tree is this node's alone: nothing else writes to it)."""
        b = self.board
        t = b.now()
        if len(self._xids_logged) < self._xid_faults:  # an Xid still to come: log it once due
            self._write_kmsg()
        for i, dev in enumerate(b.ib_names):
            state, phys, rate, layer = b.ib_state(i, t)
            last = self._last_state.get(i)
            if last != (state, phys, rate, layer):
                tree.update_ib_state(self.sysfs_root, dev, 1, state=state, phys_state=phys, rate_gbps=rate,
                                     link_layer=layer if last is None or last[3] != layer else None)
                self._last_state[i] = (state, phys, rate, layer)
            width = b.hca_pcie_width(i, t)
            if width != self._hca_width[i]:
                tree.update_pci_link(self.sysfs_root, b.profile.hca_bdf(i), cur_width=width)
                self._hca_width[i] = width
            written = self._last_counters[i]
            changed = {k: v for k, v in self._counters(i, t).items() if written[k] != v}
            if changed:
                tree.update_ib_counters(self.sysfs_root, dev, 1, changed, files=self._counter_files)
                written.update(changed)

    def close(self) -> None:
        self._counter_files.close()
        if self._own_root:
            shutil.rmtree(self.sysfs_root, ignore_errors=True)
