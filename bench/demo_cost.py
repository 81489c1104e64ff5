"""`nvmon demo --no-tui` with 16 nodes: startup to every node's first sample, then CPU % of one
core and RSS of the demo process over 30 s.

Runs the demo as a subprocess on a free loopback port, subscribes to its embedded broker with
aiomqtt, and times from the spawn to the first `sample` of every node on the wire (the newcomer's
wait, Python start-up included). After a 5 s warm-up it reads the process's CPU time and RSS with
psutil over the window. Everything counted is in that one process: the embedded broker (amqtt), 16
daemons (sampling through the simulated libnvidia-ml and /sys, SQLite, MQTT), the alert rules.

    .venv/bin/python bench/demo_cost.py [--nodes 16] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import socket
import subprocess
import sys
import time

import aiomqtt
import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def run(nodes: int, seconds: float, warmup: float) -> None:
    port = free_port()
    total = warmup + seconds + 30  # generous: the demo stops itself, the bench stops it sooner
    t_spawn = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "nvmon", "demo", "--no-tui", "--nodes", str(nodes),
                             "--port", str(port), "--duration", str(total)], stdout=subprocess.DEVNULL)
    ps = psutil.Process(proc.pid)
    first: dict[str, float] = {}
    count = 0
    try:
        while True:
            try:
                client = aiomqtt.Client("127.0.0.1", port, timeout=5)
                await client.__aenter__()
                break
            except aiomqtt.MqttError:
                await asyncio.sleep(0.05)
        t_broker = time.monotonic() - t_spawn
        await client.subscribe("nvmon/v1/demo/+/sample")

        async def consume():
            nonlocal count
            async for m in client.messages:
                count += 1
                first.setdefault(str(m.topic).split("/")[3], time.monotonic() - t_spawn)

        task = asyncio.create_task(consume())
        while len(first) < nodes:
            await asyncio.sleep(0.02)
        t_all = max(first.values())
        await asyncio.sleep(warmup)
        c0, n0, w0 = ps.cpu_times(), count, time.monotonic()
        rss = 0
        while time.monotonic() - w0 < seconds:
            await asyncio.sleep(1.0)
            rss = max(rss, ps.memory_info().rss)
        c1, n1, w1 = ps.cpu_times(), count, time.monotonic()
        threads = ps.num_threads()
        task.cancel()
        await client.__aexit__(None, None, None)
    finally:
        proc.terminate()
        rc = proc.wait(15)
    cpu = ((c1.user + c1.system) - (c0.user + c0.system)) / (w1 - w0) * 100
    print(f"machine: {platform.machine()}, {psutil.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"nodes {nodes}: broker accepting after {t_broker:.2f} s, every node's first sample after {t_all:.2f} s "
          f"(spawn → wire, Python start-up included)")
    print(f"over {w1 - w0:.0f} s: CPU {cpu:.1f} % of one core (user {c1.user - c0.user:.1f} s, "
          f"system {c1.system - c0.system:.1f} s), RSS max {rss / 2**20:.0f} MiB, {threads} threads, "
          f"{(n1 - n0) / (w1 - w0):.1f} samples/s on the wire; exit status {rc}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    a = ap.parse_args()
    asyncio.run(run(a.nodes, a.seconds, a.warmup))


if __name__ == "__main__":
    main()
