"""What the broker costs per 1,000 nodes: Mosquitto's CPU, memory and traffic under `nvmon sim-fleet`.

Starts a local Mosquitto (no persistence) on a free port, `nvmon sim-fleet --nodes N` at 1 Hz, and
K plain subscribers (paho on `nvmon/v1/#`, QoS 0, counting messages and bytes and keeping nothing:
the broker's fan-out to K readers such as `nvmon fleet` instances or TUIs, without their parsing). After the warm-up
it samples each process's CPU time over the window and prints one table row per run. Prints,
never asserts; docs/fleet.md "Scaling out" and docs/BENCHMARKS.md quote it.

    .venv/bin/python bench/broker_load.py [--nodes 1000] [--subscribers 0 1 2] [--seconds 30] [--warmup 15]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from fleet_scale import MOSQUITTO, cpu_s, free_port  # one copy of the bench's broker helpers

SUBSCRIBER = """\
import sys, time
import paho.mqtt.client as mqtt
n = b = 0
def on_message(c, u, m):
    global n, b
    n += 1
    b += len(m.payload)
c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
c.on_message = on_message
c.on_connect = lambda c, u, f, rc, p: c.subscribe("nvmon/v1/#", qos=0)
c.connect("127.0.0.1", int(sys.argv[1]))
c.loop_start()
while True:
    time.sleep(0.5)
    print(n, b, flush=True)
"""


class Counter:
    """Reads a subscriber's stdout: its running totals of messages and payload bytes."""

    def __init__(self, proc: subprocess.Popen):
        self.messages = self.bytes = 0
        self.proc = proc
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.messages, self.bytes = map(int, line.split())


def run(nodes: int, subscribers: int, seconds: float, warmup: float, tmp: Path) -> dict:
    port = free_port()
    conf = tmp / f"mosquitto-{port}.conf"
    conf.write_text(f"listener {port} 127.0.0.1\npersistence false\nallow_anonymous true\nlog_type error\n"
                    "max_connections -1\n" + ("user root\n" if os.geteuid() == 0 else ""))
    broker = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs: list[subprocess.Popen] = [broker]
    try:
        time.sleep(0.5)
        subs = []
        for _ in range(subscribers):
            p = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, str(port)], stdout=subprocess.PIPE, text=True)
            procs.append(p)
            subs.append(Counter(p))
        gen = subprocess.Popen([sys.executable, "-m", "nvmon", "sim-fleet", "--nodes", str(nodes), "--broker",
                                f"mqtt://127.0.0.1:{port}", "--cluster", "bench", "--racks", str(max(1, nodes // 20))],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(gen)
        time.sleep(warmup)
        watched = {"mosquitto": psutil.Process(broker.pid), "generator": psutil.Process(gen.pid)}
        watched.update({f"sub{i}": psutil.Process(p.pid) for i, p in enumerate(procs[1:1 + subscribers])})
        before = {k: cpu_s(p) for k, p in watched.items()}
        counts = [(c.messages, c.bytes) for c in subs]
        load0, t0 = os.getloadavg()[0], time.monotonic()
        time.sleep(seconds)
        took = time.monotonic() - t0
        after = {k: cpu_s(p) for k, p in watched.items()}
        rss_mb = watched["mosquitto"].memory_info().rss / 2**20
        out = {k: 100 * (after[k] - before[k]) / took for k in watched}
        if subs:
            out["msgs_s"] = (subs[0].messages - counts[0][0]) / took
            out["bytes_msg"] = (subs[0].bytes - counts[0][1]) / max(1, subs[0].messages - counts[0][0])
        out.update(rss_mb=rss_mb, load=max(load0, os.getloadavg()[0]))
        return out
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1000])
    ap.add_argument("--subscribers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    a = ap.parse_args()
    mosq = subprocess.run([MOSQUITTO, "-h"], capture_output=True, text=True).stdout.splitlines()[:1]
    print(f"# {platform.node()} {os.cpu_count()} CPUs, python {platform.python_version()}, {' '.join(mosq)}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {a.seconds:g} s after {a.warmup:g} s warm-up")
    print("| nodes | subscribers | msgs/s to a subscriber | B/msg (payload) | Mosquitto CPU | Mosquitto RSS "
          "| generator CPU | a subscriber's CPU | load 1 min |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as d:
        for n in a.nodes:
            for k in a.subscribers:
                r = run(n, k, a.seconds, a.warmup, Path(d))
                rate = f"{r['msgs_s']:.0f}" if k else "—"
                size = f"{r['bytes_msg']:.0f}" if k else "—"
                sub = f"{r['sub0']:.1f} %" if k else "—"
                print(f"| {n} | {k} | {rate} | {size} | {r['mosquitto']:.1f} % | {r['rss_mb']:.0f} MiB "
                      f"| {r['generator']:.0f} % | {sub} | {r['load']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
