"""collect: hardware → one immutable `Sample` per tick (NVML, sysfs InfiniBand/PCIe, host)."""

from nvmon.collect.node import NodeSampler

__all__ = ["NodeSampler"]
