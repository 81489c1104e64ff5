"""`nvmon daemon` at 1 Hz on a simulated HGX H100 for 60 s: CPU % of one core and RSS.

Starts a private Mosquitto on a free loopback port when one is installed (else runs without a
broker, and says so), runs the daemon as a subprocess with its database in a temp dir, and samples
its CPU time and RSS with psutil after a 10 s warm-up.

The simulated board's fake libnvidia-ml and fake /sys updates run inside the daemon process and are
counted: on a real node the driver's own cost replaces them. After the run, the bench measures
them here, in-process, on the same board (the simulated driver's calls and the /sys rewrite per
tick, as bench/sample_cost.py does), and prints nvmon's own share as the difference.

    .venv/bin/python bench/daemon_overhead.py [--seconds 60] [--sim hgx-h100]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from simcost import simulator_ms_per_tick


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--sim", default="hgx-h100")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="nvmon-bench-"))
    broker = None
    url = ""
    mosquitto = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if os.access("/usr/sbin/mosquitto", os.X_OK) else None)
    if mosquitto:
        port = free_port()
        conf = tmp / "mosquitto.conf"
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        broker = subprocess.Popen([mosquitto, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"mqtt://127.0.0.1:{port}"
        time.sleep(0.5)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "nvmon", "daemon", "--sim", args.sim, "--db", str(tmp / "nvmon.db"),
         "--broker", url, "--node", "bench", "--interval", "1", "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=open(tmp / "daemon.log", "wb"))
    try:
        p = psutil.Process(daemon.pid)
        time.sleep(args.warmup)
        c0 = p.cpu_times()
        t0 = time.monotonic()
        rss = []
        while time.monotonic() - t0 < args.seconds:
            time.sleep(1.0)
            rss.append(p.memory_info().rss)
        c1 = p.cpu_times()
        wall = time.monotonic() - t0
        cpu = (c1.user - c0.user + c1.system - c0.system) / wall * 100
        print(f"board        {args.sim}, 1 Hz, broker: {url or 'none (mosquitto not installed)'}")
        print(f"machine      {platform.node()} {platform.machine()} Python {platform.python_version()}, {os.cpu_count()} CPUs")
        print(f"duration     {wall:.0f} s after {args.warmup:.0f} s warm-up")
        driver_ms, sync_ms = simulator_ms_per_tick(args.sim)
        sim_pct = (driver_ms + sync_ms) / 1e3 * 100  # at 1 Hz: ms per tick / 1000 ms
        print(f"CPU          {cpu:.2f} % of one core, the simulator included")
        print(f"simulator    {sim_pct:.2f} % (simulated libnvidia-ml {driver_ms:.2f} ms + fake /sys rewrite "
              f"{sync_ms:.2f} ms per tick, measured in-process after the run)")
        print(f"nvmon's own  {cpu - sim_pct:.2f} % of one core (target <= 1 %)")
        print(f"RSS          max {max(rss) / 2**20:.1f} MB, last {rss[-1] / 2**20:.1f} MB (target <= 80 MB)")
        print(f"db size      {(tmp / 'nvmon.db').stat().st_size / 2**20:.2f} MB "
              f"(+ WAL {(tmp / 'nvmon.db-wal').stat().st_size / 2**20 if (tmp / 'nvmon.db-wal').exists() else 0:.2f} MB)")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(10)
        if broker:
            broker.terminate()
            broker.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
