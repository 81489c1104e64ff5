"""`nvmon demo`: embedded broker + simulated fleet running the real daemon code, headless (--no-tui).

Checked on the wire, with a subscriber on the demo's own broker: every node's status, inventory and
samples; each planted fault where the plan put it; the dying node's will and return. Then that
nothing is left: no process, no temporary directory, no simulated /sys tree, the port free.
The fault timeline runs faster here (hidden `--speed`), so each test stays under ~20 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mqtt_broker import Recorder, free_port, wait_until

from nvmon.demo.fleet import DemoFleet
from nvmon.demo.scenario import plan_fleet

NODES, SEED, SPEED = 4, 1, 6.0


def demo_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "nvmon", "demo", "--no-tui", *args]


def port_is_free(port: int) -> bool:
    """Nobody listens there and a new broker could bind it (closed connections may sit in TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def sim_trees(pid: int) -> list[Path]:
    return list(Path("/dev/shm").glob(f"nvmon-sim-{pid}-*")) if os.path.isdir("/dev/shm") else []


def fault(plan, kind: str) -> tuple[str, str]:
    """(node name, fault argument) of the one planted `kind=...` fault."""
    for n in plan.nodes:
        for part in n.sim.split(",")[1:]:
            k, _, v = part.partition("=")
            if k == kind:
                return n.name, v
    raise AssertionError(f"no {kind} planted")


async def connect_recorder(url: str, filt: str, timeout: float = 10.0) -> Recorder:
    deadline = time.monotonic() + timeout
    while True:
        rec = Recorder(url, filt)
        try:
            return await rec.__aenter__()
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def payloads(rec: Recorder, node: str, kind: str) -> list[dict]:
    return [json.loads(m.payload) for m in rec.on(kind) if m.topic.split("/")[3] == node]


def states(rec: Recorder, node: str) -> list[tuple[str, str | None]]:
    return [(p["state"], p.get("reason")) for p in payloads(rec, node, "status")]


async def test_demo_headless_publishes_the_planted_fleet_and_leaves_nothing(tmp_path):
    plan = plan_fleet(NODES, 2, seed=SEED, speed=SPEED)
    dying = next(n for n in plan.nodes if n.dies_at_s is not None)
    back_at = dying.dies_at_s + dying.down_for_s
    port, root = free_port(), tmp_path / "tmproot"
    root.mkdir()
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(demo_cmd("--nodes", str(NODES), "--seed", str(SEED), "--speed", str(SPEED),
                                         "--port", str(port), "--duration", f"{back_at + 3:g}"),
                                stdout=o, stderr=e, env={**os.environ, "TMPDIR": str(root)})
    try:
        rec = await connect_recorder(f"mqtt://127.0.0.1:{port}", "nvmon/v1/demo/#")
        try:
            names = [n.name for n in plan.nodes]
            await wait_until(lambda: all(payloads(rec, n, "sample") for n in names), 30, "a sample from every node")
            # all nodes in one process; the children are the broker and its guard where Mosquitto is installed
            children = [c.name() for c in psutil.Process(proc.pid).children(recursive=True)]
            assert children == [] or (set(children) <= {"sh", "mosquitto"} and children.count("mosquitto") == 1), children
            for n in names:
                assert ("online", None) in states(rec, n)
                assert payloads(rec, n, "inventory"), f"{n}: no inventory"
            # The dying node: its will (offline, reason lost), then online again.
            await wait_until(lambda: ("offline", "lost") in states(rec, dying.name), back_at, "the will")
            await wait_until(lambda: states(rec, dying.name)[-1] == ("online", None), 30, "the node's return")
            # NVLink errors that start mid-run.
            node, arg = fault(plan, "nvlink_errors")
            link = arg.split("@")[0]
            await wait_until(lambda: any(link in p.get("le", {}) for p in payloads(rec, node, "sample")), 30,
                             "NVLink errors")
            assert link not in payloads(rec, node, "sample")[0].get("le", {}), "errors before their start time"
            assert await asyncio.to_thread(proc.wait, 20) == 0, err.read_text()  # the loop keeps reading
        finally:
            await rec.__aexit__(None, None, None)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The planted faults, where the plan put them.
    node, arg = fault(plan, "pcie_width")
    gpu = int(arg.split(":")[0])
    widths = payloads(rec, node, "sample")[-1]["pw"]
    assert widths[gpu] == 8 and all(w == 16 for i, w in enumerate(widths) if i != gpu), widths
    pairs = next(n.name for n in plan.nodes if n.profile == "pairs-a100")
    assert payloads(rec, pairs, "inventory")[-1]["topology"]["class"] == "pairs"
    node, arg = fault(plan, "ib_rate")
    assert payloads(rec, node, "sample")[-1]["ig"][int(arg.split(":")[0])] == 100
    node, arg = fault(plan, "power_cap")
    limits = payloads(rec, node, "sample")[-1]["pl"]
    assert limits[int(arg)] < min(lim for i, lim in enumerate(limits) if i != int(arg)), limits
    # A clean stop: every node said goodbye; nothing left behind.
    for n in plan.nodes:
        assert states(rec, n.name)[-1] == ("offline", "stopped"), n.name
    assert list(root.iterdir()) == [], "temporary files left behind"
    assert sim_trees(proc.pid) == [], "simulated /sys trees left behind"
    assert port_is_free(port)
    text = out.read_text()
    assert f"mqtt://127.0.0.1:{port}" in text and "stopped" in text
    assert re.search(r"online \d+/4", text), text
    assert err.read_text() == ""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
async def test_demo_stops_cleanly_on_signals(tmp_path, sig):
    port, root = free_port(), tmp_path / "tmproot"
    root.mkdir()
    proc = subprocess.Popen(demo_cmd("--nodes", "2", "--port", str(port)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "TMPDIR": str(root)})
    try:
        rec = await connect_recorder(f"mqtt://127.0.0.1:{port}", "nvmon/v1/demo/+/sample")
        try:
            await wait_until(lambda: len({m.topic for m in rec.on("sample")}) == 2, 30, "samples from both nodes")
        finally:
            await rec.__aexit__(None, None, None)
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        # Each part's stop is bounded at 5 s (STOP_TIMEOUT_S, BROKER_STOP_TIMEOUT_S): a part that
        # had to be waited out makes the stop take longer than this, whatever the machine (a daemon
        # cancelled also says so on stderr, checked below); a clean stop takes ~0.5 s.
        assert time.monotonic() - t0 < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert b"Traceback" not in err and err == b"", err
    assert list(root.iterdir()) == [] and sim_trees(proc.pid) == [] and port_is_free(port)


def test_demo_bad_input_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        root = tmp_path / "tmproot"
        root.mkdir()
        r = subprocess.run(demo_cmd("--port", str(port), "--duration", "1"), capture_output=True, text=True,
                           timeout=30, env={**os.environ, "TMPDIR": str(root)})
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert f"port {port} on 127.0.0.1 is in use" in r.stderr
        assert list(root.iterdir()) == []
    for args, needle in ((["--nodes", "0"], "--nodes 0"), (["--racks", "9", "--nodes", "4"], "--racks 9"),
                         (["--duration", "-3"], "--duration"), (["--nodes", "x"], "--nodes")):
        r = subprocess.run(demo_cmd(*args), capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and needle in r.stderr, (args, r.stderr)


async def test_demo_fleet_in_process(tmp_path):
    plan = plan_fleet(2, 1, seed=3, speed=10)
    dying = next(n for n in plan.nodes if n.dies_at_s is not None)
    before = set(sim_trees(os.getpid()))
    events: list[str] = []
    async with DemoFleet(plan, tmp_root=tmp_path, on_event=events.append) as fleet:
        assert fleet.tmp_dir.parent == tmp_path and fleet.cluster == "demo"
        async with Recorder(fleet.url, "nvmon/v1/demo/+/status") as rec:
            assert await fleet.wait_published(10) < 10
            st = fleet.status()
            assert [n.state for n in st.nodes] == ["up", "up"] and st.up == 2
            assert len(set(sim_trees(os.getpid())) - before) == 2  # one simulated /sys per node
            await wait_until(lambda: ("offline", "lost") in states(rec, dying.name), 30, "the will")
            assert dying.name in fleet.status().down
            await wait_until(lambda: states(rec, dying.name)[-1] == ("online", None), 30, "the return")
            assert fleet.status().up == 2
        port = fleet.port
    assert len(events) == 2 and "died" in events[0] and "restarted" in events[1]
    assert not fleet.tmp_dir.exists()
    assert set(sim_trees(os.getpid())) == before
    assert port_is_free(port)
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


TMUX = shutil.which("tmux")


@pytest.mark.skipif(TMUX is None, reason="tmux not installed (apt-get install tmux)")
def test_demo_in_a_real_terminal_shows_the_fleet_and_alerts_and_q_leaves_nothing(tmp_path):
    port, root, rc_file = free_port(), tmp_path / "tmproot", tmp_path / "rc"
    root.mkdir()
    sock = f"nvmon-test-{os.getpid()}"
    tmux = [TMUX, "-L", sock]
    cmd = (f"TMPDIR={root} {sys.executable} -m nvmon demo --nodes 4 --port {port} --duration 60; "
           f"echo $? > {rc_file}; sleep 30")
    subprocess.run([*tmux, "new-session", "-d", "-s", "demo", "-x", "80", "-y", "24", cmd], check=True)
    try:
        def screen() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p", "-t", "demo"], capture_output=True, text=True).stdout

        deadline, text = time.monotonic() + 20, ""
        while time.monotonic() < deadline:
            text = screen()
            # every node online, and the pairs box's alerts (critical ✗ / warning ⚠ with a count) on its row
            if "4 nodes ✓4" in text and re.search(r"gpu-01 .*✓ online .*[✗⚠]\d", text):
                break
            time.sleep(0.3)
        else:
            raise AssertionError(f"fleet with an alert not on screen:\n{text}")
        assert f"mqtt://127.0.0.1:{port}" in text
        pid = next(p.pid for p in psutil.process_iter(["cmdline"])
                   if "demo" in (p.info["cmdline"] or []) and str(port) in (p.info["cmdline"] or []))
        subprocess.run([*tmux, "send-keys", "-t", "demo", "q"], check=True)
        deadline = time.monotonic() + 30
        while not rc_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rc_file.read_text().strip() == "0", screen()
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert list(root.iterdir()) == [] and sim_trees(pid) == [] and port_is_free(port)


@pytest.mark.skipif(TMUX is None, reason="tmux not installed (apt-get install tmux)")
def test_demo_at_80x24_shows_every_planted_fault_without_scrolling(tmp_path):
    """The default 16-node demo in an 80×24 tmux: each planted fault's marker on its node's row of the
    fleet screen as first drawn (no key pressed, no scrolling), and the notice saying what was planted.
    The timeline runs twice as fast (hidden --speed 2): the node dies at t+12.5 s and is back at
    t+27.5 s, the NVLink errors start at t+20 s."""
    speed = 2.0
    plan = plan_fleet(16, seed=1, speed=speed)
    dying = next(n for n in plan.nodes if n.dies_at_s is not None)
    want = {  # node → the marker its row must show
        next(n.name for n in plan.nodes if n.profile == "pairs-a100"): "✗ pairs",
        fault(plan, "pcie_width")[0]: f"⚠ x8 GPU{fault(plan, 'pcie_width')[1].split(':')[0]}",
        fault(plan, "ib_rate")[0]: "⚠ 100G",
        fault(plan, "power_cap")[0]: "⚠cap1",
        fault(plan, "fabric")[0]: "✗ fabric",
        fault(plan, "nvlink_errors")[0]: "⚠ err ",
        dying.name: "✗ lost",
    }
    assert len(want) == 7  # seven nodes, one fault each
    port, root, rc_file = free_port(), tmp_path / "tmproot", tmp_path / "rc"
    root.mkdir()
    sock = f"nvmon-test80-{os.getpid()}"
    tmux = [TMUX, "-L", sock]
    cmd = (f"TMPDIR={root} {sys.executable} -m nvmon demo --port {port} --speed {speed:g} --duration 90; "
           f"echo $? > {rc_file}; sleep 30")
    subprocess.run([*tmux, "new-session", "-d", "-s", "demo", "-x", "80", "-y", "24", cmd], check=True)
    seen: dict[str, str] = {}
    try:
        def screen() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p", "-t", "demo"], capture_output=True, text=True).stdout

        deadline, text = time.monotonic() + 60, ""
        while time.monotonic() < deadline and len(seen) < len(want):
            text = screen()
            lines = text.splitlines()
            assert all(len(line) <= 80 for line in lines)
            for line in lines:
                node = line.split()[0] if line.strip() else ""
                if node in want and want[node] in line:
                    seen.setdefault(node, line)
            time.sleep(0.3)
        missing = {n: m for n, m in want.items() if n not in seen}
        assert not missing, f"not on screen: {missing}\n{text}"
        assert "planted: 04 pairs, 07 x8, 09 err@20s, 11 100G, 13 dies@12.5s, 15 cap, 16 fabric" in text, text
        assert re.search(r"Node ▲ +Status +Alerts +Links +PCIe +IB +GPU kW +Hottest", text), text
        assert "q Quit" in text
        subprocess.run([*tmux, "send-keys", "-t", "demo", "q"], check=True)
        deadline = time.monotonic() + 30
        while not rc_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rc_file.read_text().strip() == "0", screen()
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    assert list(root.iterdir()) == [] and port_is_free(port)
