"""Average `sample` payload size on simulated 8-GPU boards (target <= 2048 B per node-tick).

Prints (never asserts), for each board: the average over N ticks of the payload as sent, and the
same with the PCIe columns `pt`/`pr` counted as arrays (the simulator's GPUs move the same PCIe
traffic, so they go as one number there; a real board's would not: docs/wire.md, "Uniform columns").

    .venv/bin/python bench/wire_size.py [--ticks 120]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics

from simcost import simulated_node

from nvmon.wire import payloads

BOARDS = ("hgx-h100", "hgx-h200", "hgx-b200", "hgx-h100,load=idle",
          "hgx-h100,nvlink_down=2.5,pcie_width=3:8,ib_rate=mlx5_1:100,power_cap=4:350")


def ticks(spec: str, n: int) -> list:
    """`n` consecutive samples of a simulated board, after a warm-up tick (rates need two)."""
    node, sampler, now = simulated_node(spec)
    try:
        sampler.open()
        sampler.sample()
        out = []
        for _ in range(n):
            now[0] += 1.0
            out.append(sampler.sample())
        return out
    finally:
        node.close()


def average(samples: list, *, pcie_as_arrays: bool) -> float:
    sizes = []
    for s in samples:
        payload = payloads.sample_payload(s)
        if pcie_as_arrays:
            d = json.loads(payload)
            n = len(d["p"])
            for k in ("pt", "pr"):
                if not isinstance(d[k], list):
                    d[k] = [d[k]] * n
            payload = payloads.encode(d)
        sizes.append(len(payload))
    return statistics.mean(sizes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=120)
    args = ap.parse_args()
    print(f"# {platform.node()} python {platform.python_version()}, {args.ticks} ticks each")
    for spec in BOARDS:
        samples = ticks(spec, args.ticks)
        print(f"{spec:72s} sent {average(samples, pcie_as_arrays=False):6.0f} B   "
              f"pt/pr as arrays {average(samples, pcie_as_arrays=True):6.0f} B")


if __name__ == "__main__":
    main()
