"""Prometheus endpoint cost: scrape latency and the daemon's added CPU, scraping once a second.

Runs `nvmon daemon --sim hgx-h100 --prometheus 0.0.0.0:<free port>` at 1 Hz without a broker
(8 GPUs × 18 NVLinks + 8 IB ports), then repeats rounds of three phases:

  idle    no scrapes
  local   a Prometheus-like scraper on 127.0.0.1: one keep-alive connection, Prometheus' Accept
          and `Accept-Encoding: gzip` headers, one GET a second (the daemon answers uncompressed:
          over loopback compression only costs CPU)
  remote  the same through this host's own non-loopback address, which the daemon treats as
          remote: answered gzipped, as a Prometheus on another host would be

and reports, per scraping phase, the latency (request sent → whole body received: p50, p99, max;
target p99 <= 10 ms) and the daemon's CPU (psutil, user+system, % of one core) against idle
(target <= 0.5 % of a core added). The first two scrapes of a phase come after a pause: the page
is rendered ahead of scrapes only once two scrapes have shown their cadence, so these two render it
themselves. They are reported apart ("after a pause"), since a Prometheus scraping every second
pauses only when the daemon restarts.

Alternating short phases (rather than one long phase of each) spreads the noise of a shared
machine over all three. The simulated driver's work runs inside the daemon, the same in all phases.

    .venv/bin/python bench/scrape_cost.py [--seconds 60] [--rounds 4] [--sim hgx-h100]
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.1",
    "Accept-Encoding": "gzip",
    "User-Agent": "Prometheus/2.53.0 (nvmon bench)",
    "X-Prometheus-Scrape-Timeout-Seconds": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def own_address() -> str | None:
    """This host's address on its default route (no packet is sent), or None when offline."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 9))
            addr = s.getsockname()[0]
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


def wait_ready(port: int, timeout: float = 30.0) -> bytes:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                return r.read()
        except OSError:
            time.sleep(0.2)
    raise SystemExit("daemon did not serve /metrics in time")


def cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


class Phase:
    def __init__(self, name: str):
        self.name, self.cpu, self.wall = name, 0.0, 0.0
        self.latencies: list[float] = []
        self.first: list[float] = []
        self.encodings: set[str] = set()


def scrape_for(host: str, port: int, seconds: float, phase: Phase) -> None:
    """One GET a second on one keep-alive connection, like a Prometheus with scrape_interval 1s."""
    conn = http.client.HTTPConnection(host, port, timeout=5)
    next_t = time.monotonic()
    end = next_t + seconds
    n = 0
    while next_t < end:
        t0 = time.perf_counter()
        conn.request("GET", "/metrics", headers=HEADERS)
        r = conn.getresponse()
        body = r.read()
        took = time.perf_counter() - t0
        if r.status != 200 or not body:
            raise SystemExit(f"scrape failed: {r.status}")
        phase.encodings.add(r.getheader("Content-Encoding") or "identity")
        (phase.first if n < 2 else phase.latencies).append(took)
        n += 1
        next_t += 1.0
        time.sleep(max(0.0, next_t - time.monotonic()))
    conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="time in each phase, all rounds together")
    ap.add_argument("--rounds", type=int, default=4, help="repetitions of idle, local, remote")
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--sim", default="hgx-h100")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="nvmon-bench-"))
    port = free_port()
    remote = own_address()
    daemon = subprocess.Popen(
        [sys.executable, "-m", "nvmon", "daemon", "--sim", args.sim, "--db", str(tmp / "nvmon.db"), "--broker", "",
         "--node", "bench", "--interval", "1", "--prometheus", f"0.0.0.0:{port}", "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=open(tmp / "daemon.log", "wb"))
    try:
        p = psutil.Process(daemon.pid)
        page = wait_ready(port)
        time.sleep(args.warmup)
        per_round = args.seconds / args.rounds
        idle, local, far = Phase("idle"), Phase("local"), Phase("remote")
        for _ in range(args.rounds):
            for phase, host in ((idle, None), (local, "127.0.0.1"), (far, remote)):
                if phase is far and remote is None:
                    continue
                c0, t0 = cpu_seconds(p), time.monotonic()
                if host is None:
                    time.sleep(per_round)
                else:
                    scrape_for(host, port, per_round, phase)
                phase.cpu += cpu_seconds(p) - c0
                phase.wall += time.monotonic() - t0
        if daemon.poll() is not None:
            raise SystemExit(f"the daemon died: {(tmp / 'daemon.log').read_text()}")
        base = idle.cpu / idle.wall * 100
        load = os.getloadavg()
        lines = page.count(b"\n")
        print(f"board        {args.sim}, sampling at 1 Hz, no broker; scrapes at 1 Hz on a keep-alive connection")
        print(f"machine      {platform.machine()} Python {platform.python_version()}, {os.cpu_count()} CPUs, "
              f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")
        print(f"page         {len(page) / 1024:.0f} KiB, {lines} lines; {len(gzip.compress(page, 1)) / 1024:.0f} KiB "
              f"gzipped")
        print(f"idle         daemon CPU {base:.2f} % of one core ({idle.wall:.0f} s)")
        for ph in (local, far):
            if not ph.wall:
                print(f"{ph.name:<12} skipped: no non-loopback address on this host")
                continue
            ms = sorted(x * 1000 for x in ph.latencies)
            p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
            cpu = ph.cpu / ph.wall * 100
            enc = "/".join(sorted(ph.encodings))
            print(f"{ph.name:<12} {len(ms)} scrapes ({enc}): latency p50 {statistics.median(ms):.2f} ms, "
                  f"p99 {p99:.2f} ms, max {ms[-1]:.2f} ms; daemon CPU {cpu:.2f} % = +{cpu - base:.2f} % "
                  f"over idle; after a pause (2 per phase) median {statistics.median(ph.first) * 1000:.1f} ms, "
                  f"max {max(ph.first) * 1000:.1f} ms")
        print("targets      p99 <= 10 ms, added CPU <= 0.5 % of one core")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
