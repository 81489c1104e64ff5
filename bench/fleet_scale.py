"""Fleet scale: `nvmon sim-fleet` of N nodes at 1 Hz through a local Mosquitto into a
FleetSubscriber + FleetState in another process.

Prints, per fleet size: samples applied per second (and how many of the N × seconds published
arrived), CPU (% of one core) of the aggregator, the generator and Mosquitto, the aggregator's
time per applied message and its RSS, and the end-to-end latency publish → applied, p50/p99/max,
measured as the aggregator's receive time minus the sample's `ts` (the generator stamps `ts` just
before publishing; one clock, one host).

    .venv/bin/python bench/fleet_scale.py [--nodes 1000 2000] [--seconds 30] [--warmup 5]

The three processes share the machine: on a 2-vCPU VM they compete for the same cores, so read
the CPU columns together with `nproc`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


# --- the aggregator process ---------------------------------------------------------------------


async def aggregate(url: str, cluster: str, nodes: int, warmup: float, seconds: float) -> dict:
    from nvmon.fleet.state import FleetState
    from nvmon.fleet.subscriber import subscribed
    from nvmon.wire.mqtt import MqttSettings

    latencies: list[float] = []
    apply_s = [0.0]
    measuring = [False]

    class TimedState(FleetState):
        """Records publish → applied latency of samples while measuring."""

        def apply(self, topic, payload, now):
            t = time.perf_counter()
            ok = super().apply(topic, payload, now)
            if measuring[0]:
                apply_s[0] += time.perf_counter() - t
                if ok and topic.endswith("/sample"):
                    _, _, c, n, _ = topic.split("/")
                    latencies.append(time.time() - self.nodes[(c, n)].tick.ts)  # applied, not received
            return ok

    state = TimedState()
    async with subscribed(MqttSettings(url=url), state, cluster=cluster) as sub:
        deadline = time.time() + 180
        while state.counts(time.time())["online"] < nodes:
            if time.time() > deadline:
                raise SystemExit(f"only {state.counts(time.time())} of {nodes} nodes after 180 s")
            await asyncio.sleep(0.2)
        print("ready", flush=True)
        await asyncio.sleep(warmup)
        ru0, st0, t0 = resource.getrusage(resource.RUSAGE_SELF), state.stats, time.time()
        co0, m0 = sub.status.coalesced, sub.status.messages
        measuring[0] = True
        await asyncio.sleep(seconds)
        measuring[0] = False
        ru1, st1, t1 = resource.getrusage(resource.RUSAGE_SELF), state.stats, time.time()
        wall = t1 - t0
        applied = st1.applied - st0.applied
        return {
            "wall_s": wall, "applied": applied, "applied_per_s": applied / wall, "samples": len(latencies),
            "dropped": st1.dropped - st0.dropped, "coalesced": sub.status.coalesced - co0,
            "received": sub.status.messages - m0,
            "cpu_pct": 100 * ((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)) / wall,
            "apply_us": 1e6 * apply_s[0] / max(1, applied),
            "rss_mb": psutil.Process().memory_info().rss / 2**20,
            "lat_p50_ms": 1e3 * percentile(latencies, 0.50), "lat_p99_ms": 1e3 * percentile(latencies, 0.99),
            "lat_max_ms": 1e3 * max(latencies, default=float("nan")),
            "online": state.counts(time.time())["online"], "rate_per_s": sub.status.rate_per_s,
        }


# --- the driver -----------------------------------------------------------------------------


def run_one(nodes: int, seconds: float, warmup: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="nvmon-fleet-bench-"))
    port = free_port()
    url, cluster = f"mqtt://127.0.0.1:{port}", "bench"
    conf = tmp / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_connections -1\n"
                    + ("user root\n" if os.geteuid() == 0 else ""))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    broker = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    gen = agg = None
    try:
        gen = subprocess.Popen(
            [sys.executable, "-c", "from nvmon.fleet.cli import sim_fleet_command; sim_fleet_command()",
             "--nodes", str(nodes), "--broker", url, "--cluster", cluster, "--racks", str(max(1, nodes // 20)),
             "--interval", "1", "--fault", "3=nvlink_down=2.5,pcie_width=3:8", "--fault", "7=ib_rate=mlx5_1:100"],
            stdout=subprocess.DEVNULL, stderr=open(tmp / "gen.log", "wb"), env=env)
        agg = subprocess.Popen([sys.executable, __file__, "--aggregate", url, cluster, str(nodes), str(warmup),
                                str(seconds)], stdout=subprocess.PIPE, stderr=open(tmp / "agg.log", "wb"), env=env,
                               text=True)
        ready = agg.stdout.readline().strip()
        if ready != "ready":
            raise SystemExit(f"aggregator failed: {(tmp / 'agg.log').read_text()[-2000:]}")
        time.sleep(warmup)
        procs = {"gen": psutil.Process(gen.pid), "broker": psutil.Process(broker.pid)}
        c0, t0 = {k: cpu_s(p) for k, p in procs.items()}, time.time()
        time.sleep(seconds)
        c1, t1 = {k: cpu_s(p) for k, p in procs.items()}, time.time()
        out, _ = agg.communicate(timeout=60)
        result = json.loads(out.strip().splitlines()[-1])
        result.update({f"{k}_cpu_pct": 100 * (c1[k] - c0[k]) / (t1 - t0) for k in procs})
        result["gen_rss_mb"] = procs["gen"].memory_info().rss / 2**20
        result["nodes"] = nodes
        # CPU per received message: less sensitive than wall times to other load on the machine.
        result["cpu_us_per_msg"] = 1e4 * result["cpu_pct"] * result["wall_s"] / max(1, result["received"])
        return result
    finally:
        for p in (agg, gen, broker):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)  # the generator says offline for every node, then removes its boards
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--aggregate":
        url, cluster, nodes, warmup, seconds = sys.argv[2:7]
        print(json.dumps(asyncio.run(aggregate(url, cluster, int(nodes), float(warmup), float(seconds)))))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1000, 2000])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    args = ap.parse_args()
    print(f"# {platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{subprocess.run([MOSQUITTO, '-h'], capture_output=True, text=True).stdout.splitlines()[0]}")
    print("| nodes | applied/s | samples applied of N × s | aggregator CPU % | apply µs/msg | aggregator RSS MB "
          "| generator CPU % | generator RSS MB | mosquitto CPU % | latency p50 / p99 / max ms | coalesced "
          "| aggregator CPU µs / received msg |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in args.nodes:
        r = run_one(n, args.seconds, args.warmup)
        print(f"| {n} | {r['applied_per_s']:.0f} | {100 * r['samples'] / (n * r['wall_s']):.1f} % "
              f"| {r['cpu_pct']:.1f} | {r['apply_us']:.0f} | {r['rss_mb']:.0f} | {r['gen_cpu_pct']:.1f} "
              f"| {r['gen_rss_mb']:.0f} | {r['broker_cpu_pct']:.1f} "
              f"| {r['lat_p50_ms']:.1f} / {r['lat_p99_ms']:.1f} / {r['lat_max_ms']:.1f} | {r['coalesced']} "
              f"| {r['cpu_us_per_msg']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
