"""CPU cost of encoding one node sample: the MQTT `sample` payload and the history store's write.

Both run every tick in the daemon (8 GPUs × 18 NVLinks + 8 IB ports on an HGX H100), on a budget of
1 % of one core for the whole daemon. Prints the median and p95 CPU milliseconds (process_time) of
`sample_payload(sample)` and of `Store.write(sample)`, timed separately, over the same samples.

The clock is fast-forwarded one second per tick; collecting the sample is not timed.
The machine's speed varies between runs: compare figures from the same run (or interleaved runs).
For scale, on a 2-core VM with both versions interleaved in one process, the column-at-a-time
rewrite took `sample_payload` from 1.08 to 0.59 ms and `Store.write` from 1.48 to 0.96 ms; about
0.3 ms of the write is SQLite's own (BEGIN IMMEDIATE, three INSERTs, COMMIT appending to the WAL).

    .venv/bin/python bench/encode_cost.py [--ticks 300] [--sim hgx-h100]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

from simcost import simulated_node

from nvmon.store import Store
from nvmon.wire.payloads import sample_payload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument("--sim", default="hgx-h100")
    args = ap.parse_args()

    node, sampler, now = simulated_node(args.sim)
    sampler.open()
    tmp = tempfile.mkdtemp(dir="/var/tmp", prefix="nvmon-bench-")
    path = os.path.join(tmp, "history.db")
    store = Store(path)
    store.open()
    payload_ms, write_ms = [], []
    pt = time.process_time
    for tick in range(args.ticks + 3):
        now[0] += 1.0
        x = sampler.sample()  # as in the daemon: one live sample at a time, sampling not timed
        t0 = pt()
        sample_payload(x)
        t1 = pt()
        store.write(x)
        t2 = pt()
        if tick >= 3:  # warm-up: first inventory rows, ib_ports, statement cache
            payload_ms.append((t1 - t0) * 1e3)
            write_ms.append((t2 - t1) * 1e3)
    store.close()
    sampler.close()
    node.close()
    for suffix in ("", "-wal", "-shm"):
        try:
            os.unlink(path + suffix)
        except FileNotFoundError:
            pass
    os.rmdir(tmp)

    links = sum(len(g.nvlink) for g in x.gpus)
    print(f"board            {args.sim}: {len(x.gpus)} GPUs, {links} NVLinks, {len(x.ib)} IB ports")
    print(f"machine          {platform.node()} {platform.machine()} Python {platform.python_version()}")
    print(f"ticks            {args.ticks}")
    for name, ms in (("sample_payload", payload_ms), ("Store.write", write_ms)):
        print(f"{name:<16} CPU median {statistics.median(ms):.3f} ms, p95 {statistics.quantiles(ms, n=20)[-1]:.3f} ms")
    both = statistics.median(payload_ms) + statistics.median(write_ms)
    print(f"both             {both:.3f} ms a tick = {both / 10:.3f} % of one core at 1 s ticks")


if __name__ == "__main__":
    main()
