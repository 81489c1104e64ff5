"""The fleet under hostile or broken input, with a real Mosquitto (issue 16, item 3 and its Done-when):

- a flood of 5,000 made-up node names spraying samples (bench/flood.py's publisher, ~8 s here; the
  60 s run is bench/flood.py itself, figures in docs/BENCHMARKS.md) pages nothing for the real
  nodes, its names are forgotten once it stops, and `nvmon fleet`'s CPU use returns to its
  pre-flood level (process CPU time over a window, compared with a generous margin: never a
  wall-time threshold a slow machine could miss);
- two real daemons claiming one node name no longer take each other's broker session (their
  client ids differ: nvmon.wire.mqtt.node_client_id), and nvmon fleet reports them once;
- a burst of control messages is coalesced off the sample path, and @controls of clusters that
  have no node wait instead of being applied.

The fake-clock cases are tests/test_fleet_guard.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
from mqtt_broker import Broker, Recorder, needs_mosquitto, wait_until
from test_fleet_service import Proc, cluster_name, fleet, fleet_config, pages

from nvmon.fleet.state import FleetState
from nvmon.fleet.subscriber import subscribed
from nvmon.wire.contract import control_topic, topic
from nvmon.wire.control import ControlSet, SharedSilence, controls_payload
from nvmon.wire.mqtt import MqttSettings, make_client
from nvmon.wire.payloads import status_payload

pytestmark = needs_mosquitto

ROOT = Path(__file__).resolve().parent.parent
FLOOD = ROOT / "bench" / "flood.py"


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


async def cpu_rate(p: psutil.Process, seconds: float) -> float:
    """Share of one core `p` used over the next `seconds`."""
    t0, c0 = time.monotonic(), cpu_s(p)
    await asyncio.sleep(seconds)
    return (cpu_s(p) - c0) / (time.monotonic() - t0)


def forgot(p: Proc) -> list[str]:
    """nvmon fleet's lines about nodes forgotten for sending no inventory."""
    return [ln for ln in p.text().splitlines() if "that sent no inventory" in ln]


async def test_a_flood_of_fake_nodes_pages_nothing_and_goes_away(tmp_path):
    cluster = cluster_name()
    cfg, out = fleet_config(tmp_path, "[fleet]\nforget_without_inventory_s = 3\nlog_drops_every_s = 2\n")
    with Broker(tmp_path) as broker:
        port = int(broker.url.rsplit(":", 1)[1])
        real = Proc(tmp_path, "sim", "sim-fleet", "--broker", broker.url, "--cluster", cluster, "--prefix", "real",
                    "--nodes", "3", "--interval", "1").start()
        f = fleet(tmp_path, broker.url, cluster, cfg, tmp_path / "fleet.db").start()
        try:
            await wait_until(lambda: "subscribed to" in f.text(), 20, "nvmon fleet subscribed")
            proc = psutil.Process(f.proc.pid)
            await asyncio.sleep(3)  # the real nodes' retained state and first samples are in
            before = await cpu_rate(proc, 4)
            flood = await asyncio.create_subprocess_exec(
                sys.executable, str(FLOOD), "publish", str(port), cluster, "5000", "8",
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            await asyncio.sleep(1)
            during = await cpu_rate(proc, 5)
            stdout, stderr = await asyncio.wait_for(flood.communicate(), 120)
            assert flood.returncode == 0, stderr[-2000:]
            figures = json.loads(stdout.decode().strip().splitlines()[-1])
            # Forgotten once silent for 3 s (at most 1,000 at a time: max_nodes_without_inventory; on a
            # slow machine some go quiet for 3 s during the flood already, are forgotten and come back).
            await wait_until(lambda: forgot(f)[-1:] and forgot(f)[-1].endswith(" 0 without an inventory left"), 20,
                             "every fake node forgotten")
            await asyncio.sleep(2)
            after = await cpu_rate(proc, 4)
        finally:
            real.stop()
            f.stop()
    text = f.text()
    print(f"flood: {figures}; nvmon fleet {100 * before:.1f} % of a core before, {100 * during:.1f} % during, "
          f"{100 * after:.1f} % after")
    assert figures["sent"] >= 5000  # every name at least once
    drops = [ln for ln in text.splitlines() if "messages dropped in the last" in ln]
    assert drops and "node_cap" in drops[0], drops  # the names past the cap, refused before parsing
    so_far = int(forgot(f)[-1].rsplit(";", 1)[1].split()[0])
    assert so_far >= 1000, forgot(f)  # the cap's worth at least was admitted, and all of them forgotten
    assert "Traceback" not in text
    sent = pages(out)
    assert not [p for p in sent if str(p["alert"].get("node") or "").startswith("real")], sent
    assert not [p for p in sent if str(p["alert"].get("node") or "").startswith("fake")], sent
    # Back to its pre-flood CPU use: a generous margin (a shared 2-core machine), never a wall-time bound.
    assert after <= 2 * before + 0.05, (before, after)


def daemon(tmp: Path, url: str, cluster: str, i: int) -> Proc:
    cfg = tmp / f"twin{i}.toml"
    cfg.write_text(f'[node]\nname = "twin"\ncluster = "{cluster}"\n[mqtt]\nbroker = "{url}"\nkeepalive_s = 2\n')
    return Proc(tmp, f"twin{i}", "daemon", "--config", str(cfg), "--db", str(tmp / f"twin{i}.db"), "--sim",
                "hgx-h100", "--interval", "0.5", "--log-level", "info")


async def test_two_daemons_claiming_one_name_keep_their_sessions_and_are_reported_once(tmp_path):
    cluster = cluster_name()
    cfg, out = fleet_config(tmp_path)
    with Broker(tmp_path) as broker:
        f = fleet(tmp_path, broker.url, cluster, cfg, tmp_path / "fleet.db").start()
        twins = []
        try:
            await wait_until(lambda: "subscribed to" in f.text(), 20, "nvmon fleet subscribed")
            async with Recorder(broker.url, f"nvmon/v1/{cluster}/twin/status") as rec:
                twins = [daemon(tmp_path, broker.url, cluster, i).start() for i in (1, 2)]
                await wait_until(lambda: "fleet.duplicate_node" in f.text(), 60, "the duplicate reported")
                await asyncio.sleep(3)  # more evidence keeps coming: still one line
            states = [json.loads(m.payload)["state"] for m in rec.messages if m.payload]
        finally:
            for t in twins:
                t.stop()
            f.stop()
    lines = [ln for ln in f.text().splitlines() if "fleet.duplicate_node" in ln]
    assert len(lines) == 1 and f"{cluster}/twin is claimed by two daemons" in lines[0], lines
    # No session ping-pong: each daemon connected once, under its own client id, and no will fired.
    ids = []
    for t in twins:
        connected = [ln for ln in t.text().splitlines() if "connected as" in ln]
        assert len(connected) == 1, t.text()[-3000:]
        ids.append(connected[0].split("connected as", 1)[1].split()[0])
    assert ids[0] != ids[1] and all(i.startswith(f"nvmon-{cluster}-twin-") for i in ids), ids
    assert "offline" not in states, states
    assert not [p for p in pages(out) if p["alert"]["status"] == "firing"]


async def test_control_messages_are_coalesced_and_wait_for_their_cluster(tmp_path):
    got: list[tuple[str, bytes]] = []
    now = time.time()

    def payload(cluster: str, n: int) -> bytes:
        sil = tuple(SharedSilence(id=f"s{i}", matchers={"node": f"gpu-{i:03d}"}, starts_at=now, ends_at=now + 600,
                                  created_by="ops", comment="x" * 100) for i in range(n))
        return controls_payload(ControlSet(cluster=cluster, ts=now, silences=sil))

    with Broker(tmp_path) as broker:
        settings = MqttSettings(url=broker.url)
        state = FleetState()
        async with subscribed(settings, state, controls=lambda t, p: got.append((t, p))) as sub:
            await wait_until(lambda: sub.status.connected, 10, "connected")
            async with make_client(settings, client_id="ops") as c:
                await c.publish(topic("real", "n1", "status"),
                                status_payload("online", version="1", interval_s=1, ts=now), qos=1)
                await wait_until(lambda: state.has_cluster("real"), 10, "a node of cluster real")
                for n in range(1, 61):  # a burst: 60 sets on one topic, the last with 60 silences
                    await c.publish(control_topic("real"), payload("real", n), qos=1)
                for k in range(20):  # @controls of clusters that have no node
                    await c.publish(control_topic(f"ghost{k}"), payload(f"ghost{k}", 100), qos=1)
                await wait_until(lambda: sub.status.controls + sub.status.controls_coalesced >= 60, 20,
                                 "the burst handed on")
                await asyncio.sleep(1.5)  # a sweep or two: the ghosts still have no node
                assert got[-1] == (control_topic("real"), payload("real", 60))  # the latest always arrives
                assert {t for t, _ in got} == {control_topic("real")}
                await c.publish(topic("ghost3", "n1", "status"),
                                status_payload("online", version="1", interval_s=1, ts=now), qos=1)
                await wait_until(lambda: control_topic("ghost3") in {t for t, _ in got}, 10,
                                 "ghost3's controls once it has a node")
    s = sub.status
    assert s.controls + s.controls_coalesced == 60 + 1 and s.controls_dropped == 0
    assert {t for t, _ in got} == {control_topic("real"), control_topic("ghost3")}


def test_a_daemons_client_id_is_stable_per_host_and_database(tmp_path):
    from nvmon.wire.mqtt import node_client_id

    mid = tmp_path / "machine-id"
    mid.write_text("0123456789abcdef0123456789abcdef\n")
    a = node_client_id("prod", "gpu-001", "/var/lib/nvmon/nvmon.db", machine_files=(str(mid),))
    assert a == node_client_id("prod", "gpu-001", "/var/lib/nvmon/nvmon.db", machine_files=(str(mid),))  # a restart
    assert a.startswith("nvmon-prod-gpu-001-") and len(a) == len("nvmon-prod-gpu-001-") + 8
    assert a != node_client_id("prod", "gpu-001", "/tmp/other.db", machine_files=(str(mid),))  # another database
    mid.write_text("fedcba9876543210fedcba9876543210\n")
    assert a != node_client_id("prod", "gpu-001", "/var/lib/nvmon/nvmon.db", machine_files=(str(mid),))  # another host
    assert "0123456789abcdef" not in a  # the machine id is hashed, never sent
