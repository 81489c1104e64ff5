"""How long `nvmon daemon` and `nvmon fleet` take from SIGTERM to exit, the figure docs promise
("exits 0 within 2 s"; systemd's TimeoutStopSec is 5 s). The tests only tell a stop that waited
for something (a hung receiver: 30 s) from one that did not; the number lives here.

Three cases, each run --runs times (a fresh process each), on a private Mosquitto on a free
loopback port:
  daemon         `nvmon daemon --sim hgx-h100` at 1 Hz, connected, after --warm seconds
  daemon+hang    the same with a firing alert whose webhook receiver never answers (the stop
                 must not wait for it: the notification stays in the outbox)
  fleet          `nvmon fleet` watching that daemon's cluster

    .venv/bin/python bench/stop_time.py [--runs 5] [--warm 4]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hang(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        time.sleep(60)

    def log_message(self, *args) -> None:
        pass


def stop_s(args: list[str], log: Path, warm_s: float, ready: str) -> tuple[float, int]:
    """Start `nvmon ARGS`, wait until `ready` is in its log and `warm_s` more, SIGTERM it: (seconds
    to exit, exit status)."""
    with open(log, "wb") as out:
        p = subprocess.Popen([sys.executable, "-m", "nvmon", *args], stdout=out, stderr=out)
    deadline = time.monotonic() + 60
    while ready not in log.read_text(errors="replace"):
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            raise SystemExit(f"nvmon {args[0]} did not get ready:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    time.sleep(warm_s)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    rc = p.wait(30)
    return time.monotonic() - t0, rc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warm", type=float, default=4.0, help="seconds of running before the SIGTERM")
    args = ap.parse_args()
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not os.access(mosquitto, os.X_OK):
        raise SystemExit("stop_time: needs mosquitto (apt-get install -y mosquitto)")
    tmp = Path(tempfile.mkdtemp(prefix="nvmon-stop-"))
    port = free_port()
    (tmp / "mosquitto.conf").write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n")
    broker = subprocess.Popen([mosquitto, "-c", str(tmp / "mosquitto.conf")], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    hang = ThreadingHTTPServer(("127.0.0.1", 0), Hang)
    hang.daemon_threads = True
    threading.Thread(target=hang.serve_forever, daemon=True).start()
    url = f"mqtt://127.0.0.1:{port}"
    (tmp / "hang.toml").write_text(
        '[node]\ncluster = "stop"\n[alerts]\nfor_s = 0\nstartup_grace_s = 0\n'
        f'[[hooks]]\ntype = "webhook"\nname = "hang"\nurl = "http://127.0.0.1:{hang.server_address[1]}/"\n'
        'timeout_s = 30\n')
    (tmp / "fleet.toml").write_text("")
    results: dict[str, list[tuple[float, int]]] = {"daemon": [], "daemon+hang": [], "fleet": []}
    try:
        time.sleep(0.3)
        for i in range(args.runs):
            db = tmp / f"d{i}.db"
            results["daemon"].append(stop_s(
                ["daemon", "--sim", "hgx-h100", "--db", str(db), "--broker", url, "--cluster", "stop",
                 "--node", f"n{i}", "--log-level", "info"], tmp / "daemon.log", args.warm, "connected as"))
            results["daemon+hang"].append(stop_s(
                ["daemon", "--config", str(tmp / "hang.toml"), "--sim", "hgx-h100,pcie_width=3:8",
                 "--db", str(tmp / f"h{i}.db"), "--broker", url, "--node", f"h{i}", "--log-level", "info"],
                tmp / "hang.log", args.warm, "alert firing"))
            results["fleet"].append(stop_s(
                ["fleet", "--broker", url, "--cluster", "stop", "--config", str(tmp / "fleet.toml"),
                 "--db", str(tmp / f"f{i}.db")], tmp / "fleet.log", args.warm, "subscribed to"))
    finally:
        hang.shutdown()
        broker.terminate()
        broker.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"machine      {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"runs         {args.runs} per case, SIGTERM after ready + {args.warm:g} s")
    for name, rs in results.items():
        took = [t for t, _ in rs]
        codes = sorted({rc for _, rc in rs})
        print(f"{name:<12} stop min {min(took):.2f} s, median {statistics.median(took):.2f} s, "
              f"max {max(took):.2f} s; exit status {codes}")


if __name__ == "__main__":
    main()
