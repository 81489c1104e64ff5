"""A flood of fake nodes against `nvmon fleet` and the TUI (issue 16: "a 60 s flood of 5,000 fake
nodes produces no page for the real nodes and the TUI/fleet return to their pre-flood CPU within a
minute after it ends").

Starts a local Mosquitto (no persistence) on a free port, `nvmon sim-fleet` with the real nodes,
`nvmon fleet` for their cluster with an exec hook that records every notification, and (with
--tui) `nvmon tui` in a detached tmux session. After a warm-up it measures each process's CPU
time before the flood, during it (FAKES made-up node names, each publishing a valid sample of a
simulated HGX H100 every second, no status and no inventory: what a hostile or broken client can
spray on an open broker), and in 10 s windows after it; then prints the pages for real nodes,
the fleet's log lines about the flood (drops, forgotten nodes) and a table. Prints, never
asserts; docs/BENCHMARKS.md quotes it, tests/test_fleet_flood.py runs a short version.

    .venv/bin/python bench/flood.py [--fakes 5000] [--seconds 60] [--real 3] [--after 60] [--tui]
                                    [--forget-after 30]
    .venv/bin/python bench/flood.py publish PORT CLUSTER FAKES SECONDS   # only the flood (the test uses it)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import psutil

from fleet_scale import MOSQUITTO, cpu_s, free_port  # one copy of the bench's broker helpers

ROOT = Path(__file__).resolve().parent.parent
HOOK = """\
import json, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(json.load(sys.stdin)) + "\\n")
"""


def sample_template() -> tuple[bytes, bytes]:
    """A simulated HGX H100's sample payload split around its timestamp: (before, after)."""
    from simcost import simulated_node

    from nvmon.wire.payloads import sample_payload

    node, sampler, now = simulated_node("hgx-h100")
    try:
        sampler.open()
        sampler.sample()
        now[0] += 1
        s = sampler.sample()
    finally:
        node.close()
    marker = 1234567890.125
    payload = sample_payload(replace(s, ts=marker))
    before, found, after = payload.partition(b"1234567890.125")
    assert found, "the template's timestamp is not in its payload"
    return before, after


def publish(port: int, cluster: str, fakes: int, seconds: float) -> dict:
    """Publish a sample for each of `fakes` names every second for `seconds`; returns the figures."""
    import paho.mqtt.client as mqtt

    before, after = sample_template()
    topics = [f"nvmon/v1/{cluster}/fake-{i:05d}/sample" for i in range(fakes)]
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"flood-{os.getpid()}")
    c.connect("127.0.0.1", port)
    c.loop_start()
    sent, t0 = 0, time.time()
    second = 0
    try:
        while time.time() - t0 < seconds:
            start = t0 + second
            for i, t in enumerate(topics):
                c.publish(t, before + b"%.3f" % time.time() + after, qos=0)
                sent += 1
                if i % 500 == 499 and time.time() - t0 >= seconds:
                    break
            second += 1
            pause = t0 + second - time.time()
            if pause > 0:
                time.sleep(pause)
            elif time.time() - start > 2:  # far behind: skip a second rather than pile up
                second = int(time.time() - t0)
    finally:
        took = time.time() - t0
        time.sleep(0.5)  # let the network thread write what is queued
        c.loop_stop()
        c.disconnect()
    return {"sent": sent, "seconds": round(took, 1), "rate_per_s": round(sent / took), "fakes": fakes,
            "payload_bytes": len(before) + len(after) + 14}


def _spawn(log: Path, *args: str) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "nvmon", *args], stdout=out, stderr=out)


def _window(procs: dict[str, psutil.Process], seconds: float) -> dict[str, float]:
    """% of one core each process used over the next `seconds`, and the 1-minute load at its end."""
    t0, c0 = time.monotonic(), {k: cpu_s(p) for k, p in procs.items()}
    time.sleep(seconds)
    dt = time.monotonic() - t0
    return {**{k: round(100 * (cpu_s(p) - c0[k]) / dt, 1) for k, p in procs.items()}, "load": os.getloadavg()[0]}


def _tui_pid(session: str) -> int | None:
    """The TUI's process: the pane's shell execs it, so the pane pid is nvmon's (or its parent)."""
    out = subprocess.run(["tmux", "list-panes", "-t", session, "-F", "#{pane_pid}"], capture_output=True, text=True)
    return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout.strip() else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fakes", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--real", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=15)
    ap.add_argument("--before", type=float, default=20, help="pre-flood CPU window, s")
    ap.add_argument("--after", type=float, default=60, help="watch this long after the flood, in 10 s windows")
    ap.add_argument("--forget-after", type=float, default=30, help="[fleet] forget_without_inventory_s")
    ap.add_argument("--tui", action="store_true", help="also run nvmon tui in a detached tmux session")
    a = ap.parse_args()
    cluster = "flood"
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        port = free_port()
        conf = tmp / "mosquitto.conf"
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        broker = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"mqtt://127.0.0.1:{port}"
        (tmp / "hook.py").write_text(HOOK)
        cfg = tmp / "fleet.toml"
        hook = json.dumps([sys.executable, str(tmp / "hook.py"), str(tmp / "pages.jsonl")])
        cfg.write_text(f"[fleet]\nforget_without_inventory_s = {a.forget_after:g}\n"
                       f"[[hooks]]\ntype = \"exec\"\ncommand = {hook}\n")
        procs: dict[str, psutil.Process] = {}
        children = []
        session = f"nvmon-flood-{os.getpid()}"
        try:
            time.sleep(0.5)
            children.append(_spawn(tmp / "sim.log", "sim-fleet", "--broker", url, "--cluster", cluster,
                                   "--prefix", "real", "--nodes", str(a.real), "--interval", "1"))
            fleet = _spawn(tmp / "fleet.log", "fleet", "--broker", url, "--cluster", cluster, "--config", str(cfg),
                           "--db", str(tmp / "fleet.db"))
            children.append(fleet)
            procs["nvmon fleet"] = psutil.Process(fleet.pid)
            if a.tui and shutil.which("tmux"):
                # the fleet's config: the TUI forgets the fakes after --forget-after too
                cmd = f"exec {sys.executable} -m nvmon tui --broker {url} --cluster {cluster} --config {cfg}"
                subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "48", cmd], check=True)
                time.sleep(1)
                pid = _tui_pid(session)
                if pid is not None:
                    procs["nvmon tui"] = psutil.Process(pid)
            procs["mosquitto"] = psutil.Process(broker.pid)
            time.sleep(a.warmup)
            rows = [("before", _window(procs, a.before))]
            t0 = time.monotonic()
            flood = subprocess.Popen([sys.executable, __file__, "publish", str(port), cluster, str(a.fakes),
                                      str(a.seconds)], stdout=subprocess.PIPE, text=True)
            rows.append(("flood", _window(procs, a.seconds)))
            out, _ = flood.communicate(timeout=a.seconds + 60)
            figures = json.loads(out.strip().splitlines()[-1])
            ended = t0 + figures["seconds"]
            k = 0
            while time.monotonic() - ended < a.after - 1:
                w = _window(procs, 10)
                k += 1
                rows.append((f"+{10 * (k - 1)}-{10 * k} s", w))
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
            for p in children:
                p.terminate()
            for p in children:
                p.wait(15)
            broker.terminate()
            broker.wait(5)
        pages = [json.loads(x) for x in (tmp / "pages.jsonl").read_text().splitlines()] \
            if (tmp / "pages.jsonl").exists() else []
        real_pages = [p for p in pages if str(p.get("node", "")).startswith("real")]
        log = (tmp / "fleet.log").read_text(errors="replace").splitlines()
        print(f"# {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        print(f"flood: {figures['sent']} samples from {figures['fakes']} fake names in {figures['seconds']} s "
              f"({figures['rate_per_s']}/s, {figures['payload_bytes']} B each); {a.real} real nodes at 1 Hz")
        print(f"pages: {len(pages)} in all, {len(real_pages)} for real nodes "
              f"{[(p.get('code'), p.get('node'), p.get('status')) for p in pages][:10]}")
        for line in log:
            if any(w in line for w in ("dropped in the last", "forgot", "duplicate_node", "stalled", "firing")):
                print("fleet log:", line[:220])
        names = list(procs)
        print("\n| window | " + " | ".join(f"{n} % core" for n in names) + " | load 1 min |")
        print("|---" * (len(names) + 2) + "|")
        for label, w in rows:
            print(f"| {label} | " + " | ".join(f"{w.get(n, float('nan')):.1f}" for n in names + ["load"]) + " |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "publish":
        port, cluster, fakes, seconds = sys.argv[2:6]
        print(json.dumps(publish(int(port), cluster, int(fakes), float(seconds))), flush=True)
    else:
        main()
