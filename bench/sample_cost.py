"""Cost of one node sample on a simulated HGX H100 (8 GPUs × 18 NVLinks + 8 IB ports).

Prints NVML calls per GPU per steady-state tick (target ≤ 3: the field-value batch and one getter of
each of the two rotations, nvmon/collect/nvml.py) and CPU milliseconds per node sample
(target ≤ 5 ms, median of ≥ 200 samples). The clock is fast-forwarded one second per tick, so the
run takes seconds, not minutes.

CPU time includes the simulator's fake libnvidia-ml (Python code standing in for the C library:
an overestimate of the real library's user-space cost) and, separately reported, the simulator's
rewrite of the fake sysfs files (not part of a real node's cost).

    .venv/bin/python bench/sample_cost.py [--samples 300] [--sim hgx-h100]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from simcost import simulated_node, time_simulated_driver


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--sim", default="hgx-h100")
    args = ap.parse_args()

    node, sampler, now = simulated_node(args.sim, sync_in_sample=False)
    driver = time_simulated_driver(node.nvml.nvmlLib)
    sampler.open()
    gpus = len(node.board.gpus)
    for _ in range(3):  # probe tick and warm-up: static facts, capability probe
        node.sync()
        sampler.sample()
        now[0] += 1.0

    calls0, event_calls0 = sampler.nvml.calls[0], sampler.nvml.event_calls[0]
    sample_ms, sync_ms, driver_ms = [], [], []
    for _ in range(args.samples):
        now[0] += 1.0
        t0 = time.process_time()
        node.sync()
        t1 = time.process_time()
        driver[0] = 0.0
        s = sampler.sample()
        t2 = time.process_time()
        sync_ms.append((t1 - t0) * 1e3)
        sample_ms.append((t2 - t1) * 1e3)
        driver_ms.append(driver[0] * 1e3)
    own_ms = [a - b for a, b in zip(sample_ms, driver_ms)]
    calls = (sampler.nvml.calls[0] - calls0) / args.samples / gpus
    event_calls = (sampler.nvml.event_calls[0] - event_calls0) / args.samples
    assert len(s.gpus) == gpus
    links = sum(len(g.nvlink) for g in s.gpus)

    print(f"board            {args.sim}: {gpus} GPUs, {links} NVLinks, {len(s.ib)} IB ports")
    print(f"machine          {platform.node()} {platform.machine()} Python {platform.python_version()}")
    print(f"samples          {args.samples}")
    print(f"NVML calls       {calls:.2f} per GPU per steady-state tick (target <= 3)")
    print(f"                 + {event_calls:.2f} per node per tick for Xid events (one non-blocking "
          f"nvmlEventSetWait_v2, +1 per event)")
    print(f"CPU per sample   nvmon's own code: median {statistics.median(own_ms):.2f} ms, "
          f"p95 {statistics.quantiles(own_ms, n=20)[-1]:.2f} ms (target <= 5 ms)")
    print(f"                 + simulated libnvidia-ml: median {statistics.median(driver_ms):.2f} ms "
          f"(stands in for the real driver's cost)")
    print(f"                 = total: median {statistics.median(sample_ms):.2f} ms")
    print(f"sim sysfs sync   median {statistics.median(sync_ms):.2f} ms (simulator only, not counted)")
    sampler.close()
    node.close()


if __name__ == "__main__":
    main()
