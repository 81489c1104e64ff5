"""Shared by the bench scripts: a simulated node with its sampler, and the simulator's own cost.

The simulated libnvidia-ml and the fake /sys rewrites run inside whatever process samples a
simulated board. On a real node the driver's own cost replaces them, so the benches report them
apart from nvmon's own code.
"""

from __future__ import annotations

import statistics
import time

from nvmon.collect.node import NodeSampler
from nvmon.sim.node import SimNode


def time_simulated_driver(lib) -> list[float]:
    """Wrap the fake libnvidia-ml's C symbols to add up the CPU seconds spent inside them."""
    spent = [0.0]
    for name in [n for n in dir(type(lib)) if n.startswith("nvml")]:
        fn = getattr(lib, name)

        def timed(*args, _fn=fn):
            t = time.process_time()
            try:
                return _fn(*args)
            finally:
                spent[0] += time.process_time() - t

        setattr(lib, name, timed)
    return spent


def simulated_node(sim: str, *, sync_in_sample: bool = True):
    """(node, sampler, clock list): a SimNode on a fake clock that the caller advances (now[0] += 1)."""
    now = [1_700_000_000.0]
    clock = lambda: now[0]  # noqa: E731
    node = SimNode(sim, clock=clock)
    sampler = NodeSampler(node.nvml, sysfs_root=node.sysfs_root, node="bench", clock=clock,
                          before_tick=node.sync if sync_in_sample else None)
    return node, sampler, now


def simulator_ms_per_tick(sim: str, ticks: int = 120) -> tuple[float, float]:
    """Median CPU ms per tick of the simulated driver's calls and of the fake /sys rewrite."""
    node, sampler, now = simulated_node(sim, sync_in_sample=False)
    driver = time_simulated_driver(node.nvml.nvmlLib)
    sampler.open()
    driver_ms, sync_ms = [], []
    try:
        for tick in range(ticks + 3):
            now[0] += 1.0
            t0 = time.process_time()
            node.sync()
            t1 = time.process_time()
            driver[0] = 0.0
            sampler.sample()
            if tick >= 3:  # the first ticks read static facts
                sync_ms.append((t1 - t0) * 1e3)
                driver_ms.append(driver[0] * 1e3)
    finally:
        sampler.close()
        node.close()
    return statistics.median(driver_ms), statistics.median(sync_ms)
