"""A simulated board sampled on a fake clock, for tests of the collector: the clock, and a sampler
over bindings with chosen names taken away (as an older nvidia-ml-py would lack them)."""

from __future__ import annotations

import contextlib
from dataclasses import replace

from nvmon.collect.node import NodeSampler
from nvmon.sim.node import SimNode


class Clock:
    def __init__(self, t: float = 1_700_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@contextlib.contextmanager
def sampled(spec: str, *remove: str):
    """(node, sampler, clock) over bindings without the names in `remove`; opened, not yet sampled."""
    clock = Clock()
    node = SimNode(spec, clock=clock)
    try:
        for name in remove:
            vars(node.nvml).pop(name, None)
        sampler = NodeSampler(node.nvml, sysfs_root=node.sysfs_root, node="n", before_tick=node.sync, clock=clock)
        assert sampler.open().available
        yield node, sampler, clock
        sampler.close()
    finally:
        node.close()


def first_sample(spec: str, node: str = "n"):
    """The first sample of a simulated board (no rates yet: a static look, as `nvmon audit` takes)."""
    with sampled(spec) as (_, sampler, _clock):
        s = sampler.sample()
    return s if node == "n" else replace(s, node=node)
