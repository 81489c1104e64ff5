"""One node's sampler: NVML + sysfs + host → `Sample`. The daemon and `nvmon sample` both use it."""

from __future__ import annotations

import socket
import time
import types
from collections.abc import Callable
from pathlib import Path

from nvmon.collect.host import HostCollector
from nvmon.collect.nvml import NvmlCollector
from nvmon.collect.sysfs import (
    IbCollector,
    collect_nvswitch_links,
    find_nvswitches,
    nvml_to_sysfs_bdf,
    pci_numa_node,
)
from nvmon.collect.topology import build_topology
from nvmon.model import NvmlStatus, Sample, Topology


SLOW_EVERY = 30  # ticks between reads of slow-changing sysfs facts


def load_real_pynvml() -> types.ModuleType | None:
    """The official bindings, or None if `nvidia-ml-py` is not installed at all."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class NodeSampler:
    """`open()`, then `sample()` once per tick, then `close()`.

    `nvml`: a pynvml module (real or simulated) or None when the bindings are missing.
    `before_tick`: called before each reading (the simulator refreshes its fake sysfs there).
    `clock`: unix seconds; the simulator's clock in tests and benchmarks.
    """

    def __init__(
        self,
        nvml: types.ModuleType | None,
        *,
        sysfs_root: Path | str = "/sys",
        node: str | None = None,
        before_tick: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.node = node or socket.gethostname().split(".")[0]
        self.sysfs_root = Path(sysfs_root)
        self.nvml = NvmlCollector(nvml) if nvml is not None else None
        self.ib = IbCollector(self.sysfs_root)
        self.host = HostCollector()
        self.before_tick = before_tick
        self.clock = clock
        self._last_ts: float | None = None
        self._numa: list[int | None] | None = None
        self._switches: list[str] = []
        self._switch_links: tuple = ()
        self._ticks = 0
        self._topology: tuple[tuple, Topology] | None = None  # (what it was built from, topology)
        self.status = NvmlStatus(available=False, error="nvidia-ml-py (pynvml) is not installed")

    def open(self) -> NvmlStatus:
        self._switches = find_nvswitches(self.sysfs_root)  # a PCI scan: once, not every tick
        if self.nvml is not None:
            self.status = self.nvml.open()
        return self.status

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()
        self.ib.close()

    def sample(self) -> Sample:
        if self.before_tick is not None:
            self.before_tick()
        ts = self.clock()
        gpus = self.nvml.collect(ts) if self.nvml is not None else ()
        if self._numa is None or len(self._numa) != len(gpus):
            self._numa = [pci_numa_node(self.sysfs_root, nvml_to_sysfs_bdf(g.pci_bus_id) or "")
                          if g.pci_bus_id else None for g in gpus]
        ib = self.ib.collect(ts)
        status = self.status
        if self.nvml is not None and status.available:
            status = NvmlStatus(available=True, driver_version=status.driver_version,
                                nvml_version=status.nvml_version, capabilities=self.nvml.capabilities())
        notes = []
        if not status.available:
            notes.append(f"NVML unavailable: {status.error}; GPU data missing, InfiniBand/PCIe/host still sampled")
        if not ib:
            notes.append(f"no InfiniBand devices under {self.sysfs_root}/class/infiniband")
        if self._ticks % SLOW_EVERY == 0:  # NVSwitch PCIe links only change when they retrain
            self._switch_links = collect_nvswitch_links(self.sysfs_root, self._switches)
        self._ticks += 1
        interval = 0.0 if self._last_ts is None else ts - self._last_ts
        self._last_ts = ts
        return Sample(
            node=self.node, ts=ts, interval_s=interval, gpus=gpus, topology=self._topology_of(gpus),
            ib=ib, host=self.host.collect(), nvml=status,
            nvswitches=self._switch_links, notes=tuple(notes),
        )

    def _topology_of(self, gpus) -> Topology:
        """The topology changes only when a link goes up or down, or a GPU is lost or back: build it
        again only then (it is the same pure function of the same inputs)."""
        key = (tuple(self._numa or ()),) + tuple(
            (g.pci_bus_id, g.lost, tuple((link.active, link.remote_type, link.remote_pci_bus_id) for link in g.nvlink))
            for g in gpus)
        if self._topology is None or self._topology[0] != key:
            self._topology = (key, build_topology(gpus, self._numa))
        return self._topology[1]
