"""Fleet scale: `nvmon sim-fleet` of N nodes at 1 Hz through a local Mosquitto into the TUI
(`NvmonApp`, Textual headless at 160×48) running in another process. Issue 5's targets: the TUI
process ≤ 1 core, latency sample → screen p99 ≤ 1.5 s, fleet screen of 1,000 rows rendered in
≤ 50 ms.

Prints, per fleet size:

- samples applied per second (and how many of the N × seconds published were applied);
- CPU (% of one core) of the TUI process (everything in it: MQTT, applying, redraws, Textual),
  of the generator and of Mosquitto, with the 1-minute load average at the end of the window;
- where the TUI's time goes: µs per applied message, the 1 s redraw timer (`refresh_data`:
  header counts, alert log, the table's `sync`) and the table's painting per frame, p50 / max;
- latency sample → screen, p50 / p99 / max: from the sample's `ts` (the generator stamps it just
  before publishing; one clock, one host) to the moment the fleet table repainted that node's row
  with it (`FleetTable.paint_probe`). Only rows on screen are painted, and the visible rows'
  nodes all publish in the same few ms of each second, so the bench scrolls the table to a random
  place every `--scroll-s` seconds; the first paint of a row after a scroll (caused by the
  scroll, not by a new sample) is not counted. Also sample → applied (every sample), for comparison;
- time to render the fleet screen with N rows (`bench/tui_render.py`, no broker: first draw and
  a redraw after every node ticked), before the live runs.

    .venv/bin/python bench/fleet_scale.py [--nodes 1000 2000] [--seconds 30] [--warmup 5]
    .venv/bin/python bench/fleet_scale.py --no-tui   # the aggregator alone: FleetSubscriber + FleetState

With `--no-tui` the measured process is a FleetSubscriber + FleetState without a view, and the
latency is publish → applied: the TUI's figures minus the TUI's redraw and painting.

The processes share the machine: on a 2-vCPU VM the generator, Mosquitto and the TUI compete for
the same cores, so read the CPU columns together with `nproc` and the load average. Figures are
printed, never asserted: a slow machine gets slow figures, not a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
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


def load1() -> float:
    return os.getloadavg()[0]


async def wait_online(state, nodes: int, limit_s: float = 180.0) -> None:
    """Until every node is online, or `limit_s` (then measure what came: a slow machine is a figure)."""
    deadline = time.time() + limit_s
    while state.counts(time.time())["online"] < nodes and time.time() < deadline:
        await asyncio.sleep(0.2)


# --- the aggregator process ---------------------------------------------------------------------


def timed_state(measuring: list[bool], apply_s: list[float], on_sample):
    """A FleetState that, while `measuring[0]`, adds its apply time to `apply_s[0]` and calls
    `on_sample(sample ts, receive time)` for each sample it applied."""
    from nvmon.fleet.state import FleetState

    class TimedState(FleetState):
        def apply(self, topic, payload, now):
            t = time.perf_counter()
            ok = super().apply(topic, payload, now)
            if measuring[0]:
                apply_s[0] += time.perf_counter() - t
                if ok and topic.endswith("/sample"):
                    _, _, c, n, _ = topic.split("/")
                    on_sample(self.nodes[(c, n)].tick.ts, now)
            return ok

    return TimedState()


async def aggregate(url: str, cluster: str, nodes: int, warmup: float, seconds: float) -> dict:
    from nvmon.fleet.subscriber import subscribed
    from nvmon.wire.mqtt import MqttSettings

    latencies: list[float] = []
    apply_s = [0.0]
    measuring = [False]

    state = timed_state(measuring, apply_s,
                        lambda ts, now: latencies.append(time.time() - ts))  # applied, not received
    async with subscribed(MqttSettings(url=url), state, cluster=cluster) as sub:
        await wait_online(state, nodes)
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
            "load1": os.getloadavg()[0],
        }


# --- the TUI process ------------------------------------------------------------------------


async def tui(url: str, cluster: str, nodes: int, warmup: float, seconds: float, width: int, height: int,
              scroll_s: float) -> dict:
    """NvmonApp on the broker, headless; probes on the state, the redraw timer and the table."""
    from nvmon.tui.app import NvmonApp
    from nvmon.tui.widgets.fleet_table import FleetTable
    from nvmon.wire.mqtt import MqttSettings

    measuring = [False]
    applied_lat: list[float] = []  # sample ts → applied, every sample
    received_lat: list[float] = []  # sample ts → read off the socket, for the samples applied
    screen_lat: list[float] = []  # sample ts → its row repainted
    apply_s, redraw_s, paint_s = [0.0], [], []
    painted = [0]
    shown: dict = {}  # node key → ts of the tick its row last showed, since the last scroll

    def on_sample(ts: float, now: float) -> None:
        applied_lat.append(time.time() - ts)
        received_lat.append(now - ts)

    state = timed_state(measuring, apply_s, on_sample)
    app = NvmonApp(MqttSettings(url=url), cluster=cluster, source="bench", state=state)
    redraw = app.refresh_data  # the 1 s timer's callback, wrapped before on_mount binds it

    def timed_redraw() -> None:
        t = time.perf_counter()
        redraw()
        if measuring[0]:
            redraw_s.append(time.perf_counter() - t)

    app.refresh_data = timed_redraw

    def probe(key) -> None:
        view = state.nodes.get(key)
        tick = view.tick if view is not None else None
        if tick is None:
            return
        last = shown.get(key)
        shown[key] = tick.ts
        if last is None or last == tick.ts:  # scrolled into view, or painted again without news
            return
        if measuring[0]:
            painted[0] += 1
            screen_lat.append(time.time() - tick.ts)

    async with app.run_test(headless=True, size=(width, height)):
        await wait_online(state, nodes)
        table = app.screen.query_one(FleetTable)
        table.paint_probe = probe
        render_lines = table.render_lines

        def timed_render_lines(crop):
            t = time.perf_counter()
            lines = render_lines(crop)
            if measuring[0]:
                paint_s.append(time.perf_counter() - t)
            return lines

        table.render_lines = timed_render_lines
        os.write(1, b"ready\n")  # Textual captures sys.stdout while the app runs
        rng = random.Random(nodes)

        async def scroll() -> None:
            while True:
                await asyncio.sleep(scroll_s)
                shown.clear()
                table.scroll_to(y=rng.randrange(max(1, table.row_count - table.size.height)), animate=False)

        scroller = asyncio.create_task(scroll())
        await asyncio.sleep(warmup)
        ru0, st0, t0 = resource.getrusage(resource.RUSAGE_SELF), state.stats, time.time()
        status0 = app.subscriber.status
        measuring[0] = True
        await asyncio.sleep(seconds)
        measuring[0] = False
        ru1, st1, t1 = resource.getrusage(resource.RUSAGE_SELF), state.stats, time.time()
        status1 = app.subscriber.status
        scroller.cancel()
        online = state.counts(time.time())["online"]
        rows = table.row_count
    wall = t1 - t0
    applied = st1.applied - st0.applied
    return {
        "wall_s": wall, "applied": applied, "applied_per_s": applied / wall, "samples": len(applied_lat),
        "dropped": st1.dropped - st0.dropped, "coalesced": status1.coalesced - status0.coalesced,
        "received": status1.messages - status0.messages,
        "cpu_pct": 100 * ((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)) / wall,
        "apply_us": 1e6 * apply_s[0] / max(1, applied), "rss_mb": psutil.Process().memory_info().rss / 2**20,
        "lat_p50_ms": 1e3 * percentile(applied_lat, 0.50), "lat_p99_ms": 1e3 * percentile(applied_lat, 0.99),
        "lat_max_ms": 1e3 * max(applied_lat, default=float("nan")),
        "rx_p50_ms": 1e3 * percentile(received_lat, 0.50), "rx_p99_ms": 1e3 * percentile(received_lat, 0.99),
        "rx_max_ms": 1e3 * max(received_lat, default=float("nan")),
        "screen_n": len(screen_lat), "screen_p50_ms": 1e3 * percentile(screen_lat, 0.50),
        "screen_p99_ms": 1e3 * percentile(screen_lat, 0.99),
        "screen_max_ms": 1e3 * max(screen_lat, default=float("nan")),
        "redraws": len(redraw_s), "redraw_p50_ms": 1e3 * percentile(redraw_s, 0.5),
        "redraw_max_ms": 1e3 * max(redraw_s, default=float("nan")),
        "paints": len(paint_s), "paint_p50_ms": 1e3 * percentile(paint_s, 0.5),
        "paint_max_ms": 1e3 * max(paint_s, default=float("nan")), "rows_painted_per_s": painted[0] / wall,
        "screen_work_ms_per_s": 1e3 * (sum(redraw_s) + sum(paint_s)) / wall,
        "online": online, "rows": rows, "rate_per_s": status1.rate_per_s, "load1": load1(),
    }


# --- the driver -----------------------------------------------------------------------------


def run_one(nodes: int, seconds: float, warmup: float, child: list[str]) -> dict:
    """Broker, generator and the measured process (`child`: its mode and arguments after the
    broker URL, cluster, nodes, warm-up and seconds); the child prints "ready", then its JSON."""
    tmp = Path(tempfile.mkdtemp(prefix="nvmon-fleet-bench-"))
    port = free_port()
    url, cluster = f"mqtt://127.0.0.1:{port}", "bench"
    conf = tmp / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_connections -1\n"
                    "sys_interval 1\n" + ("user root\n" if os.geteuid() == 0 else ""))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    broker = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    gen = measured = None
    log = tmp / "measured.log"
    try:
        gen = subprocess.Popen(
            [sys.executable, "-c", "from nvmon.cli.simfleet import sim_fleet_command; sim_fleet_command()",
             "--nodes", str(nodes), "--broker", url, "--cluster", cluster, "--racks", str(max(1, nodes // 20)),
             "--interval", "1", "--fault", "3=nvlink_down=2.5,pcie_width=3:8", "--fault", "7=ib_rate=mlx5_1:100"],
            stdout=subprocess.DEVNULL, stderr=open(tmp / "gen.log", "wb"), env=env)
        measured = subprocess.Popen([sys.executable, __file__, child[0], url, cluster, str(nodes), str(warmup),
                                     str(seconds), *child[1:]], stdout=subprocess.PIPE, stderr=open(log, "wb"),
                                    env=env, text=True)
        ready = measured.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"measured process failed: {log.read_text()[-2000:]}")
        sys_topics = broker_counters(port)
        time.sleep(warmup)
        procs = {"gen": psutil.Process(gen.pid), "broker": psutil.Process(broker.pid)}
        c0, t0, in0 = {k: cpu_s(p) for k, p in procs.items()}, time.time(), dict(sys_topics.values)
        time.sleep(seconds)
        c1, t1, in1 = {k: cpu_s(p) for k, p in procs.items()}, time.time(), dict(sys_topics.values)
        sys_topics.stop()
        out, _ = measured.communicate(timeout=120)
        lines = out.strip().splitlines()
        if not lines:
            raise RuntimeError(f"measured process printed no result: {log.read_text()[-2000:]}")
        result = json.loads(lines[-1])
        result.update({f"{k}_cpu_pct": 100 * (c1[k] - c0[k]) / (t1 - t0) for k in procs})
        result["gen_rss_mb"] = procs["gen"].memory_info().rss / 2**20
        # what reached the broker in the window (its $SYS counter, updated every second)
        result["published_per_s"] = (in1.get("received", 0) - in0.get("received", 0)) / (t1 - t0)
        result["nodes"] = nodes
        # CPU per received message: less sensitive than wall times to other load on the machine.
        result["cpu_us_per_msg"] = 1e4 * result["cpu_pct"] * result["wall_s"] / max(1, result["received"])
        return result
    finally:
        for p in (measured, gen, broker):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)  # the generator says offline for every node, then removes its boards
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


class broker_counters:
    """Mosquitto's $SYS publish counters (`sys_interval 1`), read by a paho client thread."""

    def __init__(self, port: int):
        import paho.mqtt.client as mqtt

        self.values: dict[str, int] = {}
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="nvmon-bench-sys")
        self.client.on_message = lambda c, u, m: self.values.__setitem__(m.topic.rsplit("/", 1)[-1], int(m.payload))
        self.client.connect("127.0.0.1", port)
        self.client.subscribe("$SYS/broker/publish/messages/+")
        self.client.loop_start()

    def stop(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def ms3(r: dict, prefix: str) -> str:
    return f"{r[prefix + '_p50_ms']:.0f} / {r[prefix + '_p99_ms']:.0f} / {r[prefix + '_max_ms']:.0f}"


def met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def print_aggregator_row(n: int, r: dict) -> None:
    print(f"| {n} | {r['published_per_s']:.0f} | {r['applied_per_s']:.0f} "
          f"| {100 * r['samples'] / (n * r['wall_s']):.1f} % "
          f"| {r['cpu_pct']:.1f} | {r['apply_us']:.0f} | {r['rss_mb']:.0f} | {r['gen_cpu_pct']:.1f} "
          f"| {r['gen_rss_mb']:.0f} | {r['broker_cpu_pct']:.1f} "
          f"| {r['lat_p50_ms']:.1f} / {r['lat_p99_ms']:.1f} / {r['lat_max_ms']:.1f} | {r['coalesced']} "
          f"| {r['cpu_us_per_msg']:.0f} | {r['load1']:.1f} |", flush=True)


def print_tui_row(n: int, r: dict) -> None:
    print(f"| {n} | {r['published_per_s']:.0f} | {r['received'] / r['wall_s']:.0f} | {r['applied_per_s']:.0f} "
          f"| {100 * r['samples'] / (n * r['wall_s']):.1f} % | {r['cpu_pct']:.1f} "
          f"| {1e4 * r['cpu_pct'] * r['wall_s'] / max(1, r['applied']):.0f} "
          f"| {r['apply_us']:.0f} | {r['redraw_p50_ms']:.1f} / {r['redraw_max_ms']:.1f} "
          f"| {r['paint_p50_ms']:.1f} / {r['paint_max_ms']:.1f} | {r['screen_work_ms_per_s']:.0f} "
          f"| {r['rows_painted_per_s']:.0f} "
          f"| {ms3(r, 'screen')} ({r['screen_n']}) | {ms3(r, 'lat')} | {ms3(r, 'rx')} | {r['coalesced']} "
          f"| {r['rss_mb']:.0f} "
          f"| {r['gen_cpu_pct']:.1f} | {r['broker_cpu_pct']:.1f} | {r['load1']:.1f} |", flush=True)


def render_figures(nodes: list[int], rounds: int) -> dict[int, dict]:
    """bench/tui_render.py's measurement (no broker), per fleet size."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tui_render import measure

    print("\n## Fleet screen render, no broker (bench/tui_render.py)\n")
    print("| nodes | first draw ms (≤ 50) | of which table sync | update after every node ticked, median / worst ms "
          "(≤ 50) | changed rows | redraw with nothing changed ms | load 1 min |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    out = {}
    for n in nodes:
        r = out[n] = asyncio.run(measure(n, rounds))
        print(f"| {n} | {r['first_ms']:.1f} | {r['first_sync_ms']:.1f} | {r['update_median_ms']:.1f} / "
              f"{r['update_max_ms']:.1f} | {r['rows_redrawn']:.0f} | {r['idle_ms']:.2f} | {load1():.1f} |", flush=True)
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--aggregate":
        url, cluster, nodes, warmup, seconds = sys.argv[2:7]
        print(json.dumps(asyncio.run(aggregate(url, cluster, int(nodes), float(warmup), float(seconds)))))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--tui-child":
        url, cluster, nodes, warmup, seconds, width, height, scroll_s = sys.argv[2:10]
        r = asyncio.run(tui(url, cluster, int(nodes), float(warmup), float(seconds), int(width), int(height),
                            float(scroll_s)))
        print(json.dumps(r), flush=True)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1000, 2000])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--no-tui", action="store_true", help="measure the aggregator alone (FleetSubscriber + FleetState)")
    ap.add_argument("--size", default="160x48", help="the headless terminal, COLSxROWS (default 160x48)")
    ap.add_argument("--scroll-s", type=float, default=2.0, help="scroll the table to a random place this often")
    ap.add_argument("--render-rounds", type=int, default=10, help="bench/tui_render.py rounds; 0: skip it")
    args = ap.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))
    print(f"# {platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{subprocess.run([MOSQUITTO, '-h'], capture_output=True, text=True).stdout.splitlines()[0]}; "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; {args.seconds:g} s after {args.warmup:g} s")
    render = {}
    if not args.no_tui and args.render_rounds > 0:
        render = render_figures(args.nodes, args.render_rounds)
    if args.no_tui:
        print("\n## Aggregator alone (FleetSubscriber + FleetState, no view)\n")
        print("| nodes | published/s (at the broker) | applied/s | samples applied of N × s | aggregator CPU % "
              "| apply µs/msg | aggregator RSS MB "
              "| generator CPU % | generator RSS MB | mosquitto CPU % | latency p50 / p99 / max ms | coalesced "
              "| aggregator CPU µs / received msg | load 1 min |")
        print("|" + " --- |" * 14)
    else:
        print(f"\n## TUI headless at {width}×{height} (NvmonApp), live\n")
        print("| nodes | published/s (at the broker) | received/s | applied/s | samples applied of N × s "
              "| TUI CPU % (≤ 100) "
              "| TUI CPU µs / applied msg | apply µs/msg (wall) "
              "| redraw timer ms p50 / max | table paint ms p50 / max | both, ms per s | rows repainted/s "
              "| sample → screen p50 / p99 / max ms (≤ 1500) (n) | sample → applied p50 / p99 / max ms "
              "| of which sample → read off the socket | coalesced "
              "| TUI RSS MB | generator CPU % | mosquitto CPU % | load 1 min |")
        print("|" + " --- |" * 20)
    results = {}
    for n in args.nodes:
        child = ["--aggregate"] if args.no_tui else ["--tui-child", str(width), str(height), str(args.scroll_s)]
        try:
            r = results[n] = run_one(n, args.seconds, args.warmup, child)
        except Exception as e:  # report and go on: the bench must not fail on a slow or busy machine
            print(f"| {n} | failed: {' '.join(str(e).split())[:300]} |", flush=True)
            continue
        (print_aggregator_row if args.no_tui else print_tui_row)(n, r)
    if args.no_tui:
        return
    print()
    for n, r in results.items():
        notes = [f"TUI ≤ 1 core: {met(r['cpu_pct'] <= 100)} ({r['cpu_pct']:.0f} %)",
                 f"sample → screen p99 ≤ 1.5 s: {met(r['screen_p99_ms'] <= 1500)} ({r['screen_p99_ms']:.0f} ms)"]
        if n in render:
            worst = max(render[n]["first_ms"], render[n]["update_median_ms"])
            notes.append(f"render {n} rows ≤ 50 ms: {met(worst <= 50)} ({worst:.1f} ms)")
        if r["online"] < n:
            notes.append(f"only {r['online']} of {n} nodes online")
        print(f"{n} nodes: " + "; ".join(notes))


if __name__ == "__main__":
    main()
