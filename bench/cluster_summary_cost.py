"""What the cluster summary costs `nvmon fleet` (nvmon.fleet.digest, issue 14 item 2): a state of N
healthy nodes in racks of 40, one cluster; the best of 5 for building the summary once, for a
publisher tick that publishes nothing (the change check it makes every second), and the summary's
size. Usage: `.venv/bin/python bench/cluster_summary_cost.py [NODES...]` (default 1000 2000 4000)."""

import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from samplefactory import healthy_sample  # noqa: E402

from nvmon.fleet.digest import SummaryPublisher, build_summary  # noqa: E402
from nvmon.fleet.state import FleetState  # noqa: E402
from nvmon.wire.contract import topic  # noqa: E402
from nvmon.wire.mqtt import MqttSettings  # noqa: E402
from nvmon.wire.payloads import inventory_payload, sample_payload, status_payload  # noqa: E402
from nvmon.wire.summary import summary_payload  # noqa: E402


def state_of(n: int, t0: float) -> FleetState:
    s0, state = healthy_sample(), FleetState(stale_factor=5.0, max_nodes=max(20_000, n))
    for i in range(n):
        node = f"n{i:05d}"
        s = dataclasses.replace(s0, node=node, ts=t0)
        state.apply(topic("a", node, "status"), status_payload("online", version="1", interval_s=1.0, ts=t0), t0)
        state.apply(topic("a", node, "inventory"), inventory_payload(s, cluster="a", rack=f"r{i // 40:03d}"), t0)
        state.apply(topic("a", node, "sample"), sample_payload(s), t0)
    return state


def best(f, repeat: int = 5) -> float:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        out.append(time.perf_counter() - t)
    return min(out)


for n in map(int, sys.argv[1:] or ("1000", "2000", "4000")):
    t0 = time.time()
    state = state_of(n, t0)
    build = best(lambda: build_summary(state, "a", t0 + 1, interval_s=10.0))
    pub = SummaryPublisher(MqttSettings("mqtt://127.0.0.1:1"), state, every_s=10.0)
    pub.due(t0 + 1)
    tick = best(lambda: pub.due(t0 + 2))
    size = len(summary_payload(build_summary(state, "a", t0 + 1, interval_s=10.0)))
    print(f"{n} nodes: build {build * 1e3:.1f} ms, publisher tick (nothing due) {tick * 1e3:.1f} ms/s, "
          f"summary {size} B ({n // 40} racks)")
