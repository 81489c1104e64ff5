"""The fleet side through a real Mosquitto: a simulated fleet reaches a FleetSubscriber with the
right rows, the subscriber survives a broker restart, and a killed generator's nodes go offline by
their wills. Each test has its own broker and cluster name; conditions are awaited, not slept on."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from mqtt_broker import Broker, free_port, needs_mosquitto, wait_until
from nvmon.loadgen.fleet import SimFleet
from nvmon.fleet.state import FleetState
from nvmon.fleet.subscriber import subscribed
from nvmon.wire.contract import topic
from nvmon.wire.mqtt import Backoff, MqttSettings, make_client
from nvmon.wire.payloads import status_payload

pytestmark = needs_mosquitto

FAST = Backoff(initial_s=0.05, max_s=0.3, refused_initial_s=0.05, refused_max_s=0.3)  # refusals too


def cluster_name() -> str:
    return "t" + uuid.uuid4().hex[:10]


def settings(url: str) -> MqttSettings:
    return MqttSettings(url=url, keepalive_s=2, timeout_s=2)


@contextlib.asynccontextmanager
async def sim_fleet(url: str, nodes: int, **kw):
    fleet = SimFleet(settings(url), nodes, interval_s=0.2, backoff=FAST, **kw)
    task = asyncio.create_task(fleet.run())
    try:
        yield fleet
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def online(state: FleetState, n: int) -> bool:
    return state.counts(time.time())["online"] == n and all(v.summary and v.inventory for v in state.nodes.values())


def alert_codes(state: FleetState, key) -> set[str]:
    view = state.nodes.get(key)
    return {a.code for a in view.alerts.alerts} if view is not None and view.alerts is not None else set()


FAULTS = {3: "nvlink_down=2.5,pcie_width=3:8", 7: "ib_rate=mlx5_1:100,power_cap=4:350"}


async def test_sim_fleet_reaches_subscriber_with_correct_rows(tmp_path):
    cluster = cluster_name()
    with Broker(tmp_path) as broker:
        state = FleetState()
        async with sim_fleet(broker.url, 20, cluster=cluster, racks=2, faults=FAULTS) as fleet, \
                subscribed(settings(broker.url), state, cluster=cluster, backoff=FAST) as sub:
            await wait_until(lambda: online(state, 20), timeout=15, what="20 nodes online")
            assert fleet.stats.boards == 6 and fleet.stats.connected == 20  # 4 healthy seeds + 2 fault specs
            bad = state.nodes[(cluster, "sim-003")].summary
            assert (bad.links_down, bad.links_active, bad.pcie_worst) == (1, 143, "Gen5 x8 on GPU 3")
            other = state.nodes[(cluster, "sim-007")].summary
            assert other.ib_min_rate_gbps == 100.0 and other.power_capped == 1
            good = state.nodes[(cluster, "sim-000")].summary
            assert (good.links_down, good.pcie_degraded, good.ib_min_rate_gbps, good.power_capped) == (0, False, 400, 0)
            assert good.gpu_model == "NVIDIA H100 80GB HBM3"
            # Per-node identities: each node's GPUs have their own UUIDs.
            uuids = {v.inventory.gpus[0].uuid for v in state.nodes.values()}
            assert len(uuids) == 20
            racks = state.racks(time.time())
            assert sorted(racks) == ["rack-00", "rack-01"] and racks["rack-00"].nodes == 10
            assert racks["rack-00"].power_w > 10 * 1000
            # Alerts: the board's persistent audit findings, retained per node.
            await wait_until(lambda: alert_codes(state, (cluster, "sim-003")) >= {"nvlink.link_down", "pcie.width"},
                             timeout=15, what="alerts of the faulty node")
            assert state.nodes[(cluster, "sim-000")].alert_counts() == {}
            await wait_until(lambda: sub.status.rate_per_s > 20, timeout=15, what="a message rate")
            s = sub.status
            assert s.connected and s.connects == 1 and s.dropped == 0 and s.last_error is None
            assert state.stats.dropped == 0 and state.stats.applied + s.coalesced <= s.messages


async def test_subscriber_sees_only_its_cluster(tmp_path):
    mine, other = cluster_name(), cluster_name()
    with Broker(tmp_path) as broker:
        state = FleetState()
        async with subscribed(settings(broker.url), state, cluster=mine, backoff=FAST) as sub:
            await wait_until(lambda: sub.status.connected, what="subscribed")
            async with make_client(settings(broker.url), client_id="t-pub") as client:
                for c in (mine, other):
                    await client.publish(topic(c, "n1", "status"), status_payload(
                        "online", version="1", interval_s=1, ts=time.time()), qos=1, retain=True)
            await wait_until(lambda: state.nodes, what="a node")
            await asyncio.sleep(0.2)
            assert list(state.nodes) == [(mine, "n1")]


async def test_broker_restart_subscriber_reconnects(tmp_path):
    cluster = cluster_name()
    with Broker(tmp_path) as broker:
        state = FleetState()
        async with sim_fleet(broker.url, 5, cluster=cluster), \
                subscribed(settings(broker.url), state, cluster=cluster, backoff=FAST, sweep_every_s=0.1) as sub:
            await wait_until(lambda: online(state, 5), timeout=30, what="5 nodes online")
            broker.stop()
            await wait_until(lambda: not sub.status.connected, what="the subscriber to notice")
            # Silence turns nodes stale; Mosquitto also publishes some wills as it shuts down.
            await wait_until(lambda: state.counts(time.time())["online"] == 0, what="no node online without a broker")
            assert sub.status.last_error
            broker.start()  # same port; retained state is gone: publishers must re-announce
            await wait_until(lambda: sub.status.connected and sub.status.connects == 2, timeout=30,
                             what="the subscriber to reconnect")
            await wait_until(lambda: online(state, 5), timeout=30, what="5 nodes online again")


async def test_unreachable_broker_is_reported(tmp_path):
    state = FleetState()
    url = f"mqtt://127.0.0.1:{free_port()}"
    async with subscribed(settings(url), state, backoff=FAST) as sub:
        await wait_until(lambda: sub.status.errors >= 2, what="failed attempts")
        s = sub.status
        assert not s.connected and s.connects == 0 and "refused" in s.last_error.lower()


def start_generator(url: str, cluster: str, nodes: int, workdir=None) -> subprocess.Popen:
    """`nvmon sim-fleet` in a process of its own; with `workdir`, a script running SimFleet whose
    fake /sys trees go there (a SIGKILL leaves them behind, and tmp_path is cleaned up)."""
    if workdir is None:
        code = "from nvmon.cli.simfleet import sim_fleet_command; sim_fleet_command(prog_name='nvmon sim-fleet')"
        args = ["--nodes", str(nodes), "--broker", url, "--cluster", cluster, "--interval", "0.2"]
    else:
        code = ("import asyncio, sys; from nvmon.loadgen.fleet import SimFleet; "
                "from nvmon.wire.mqtt import MqttSettings; asyncio.run(SimFleet(MqttSettings(url=sys.argv[1]), int(sys.argv[3]), cluster=sys.argv[2],"
                " interval_s=0.2, workdir=sys.argv[4]).run())")
        args = [url, cluster, str(nodes), str(workdir)]
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def states(state: FleetState) -> set:
    now = time.time()
    return {(v.liveness(now).state, v.liveness(now).reason) for v in state.nodes.values()}


async def test_killed_generator_goes_offline_by_will_and_comes_back(tmp_path):
    cluster = cluster_name()
    with Broker(tmp_path) as broker:
        state = FleetState()
        async with subscribed(settings(broker.url), state, cluster=cluster, backoff=FAST, sweep_every_s=0.1):
            proc = start_generator(broker.url, cluster, 3, workdir=tmp_path)
            try:
                await wait_until(lambda: online(state, 3), timeout=15, what="3 nodes online")
                proc.send_signal(signal.SIGKILL)  # no goodbye: the broker publishes each node's will
                proc.wait(5)
                await wait_until(lambda: states(state) == {("offline", "lost")}, what="offline by will")
                restarted = time.time()
                proc = start_generator(broker.url, cluster, 3)
                # Back online means a sample from the new process: the summaries and inventories above
                # are the first run's, so 'online' alone can come before the new one published a tick
                # (a SIGTERM then finds nothing published, which sim-fleet rightly calls a failure).
                await wait_until(lambda: online(state, 3) and all(v.tick_rx and v.tick_rx > restarted
                                                                  for v in state.nodes.values()),
                                 timeout=15, what="3 nodes back online with a new sample")
                proc.send_signal(signal.SIGTERM)  # a clean stop says so
                out = proc.communicate(timeout=10)[1].decode()
                assert proc.returncode == 0 and "stopped;" in out and "Traceback" not in out, out
                await wait_until(lambda: states(state) == {("offline", "stopped")}, what="offline, stopped")
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(5)


@pytest.mark.parametrize("args,message", [
    (["--fault", "3=nvlink_down=99.1"], "GPU 99 does not exist"),
    (["--fault", "30=ib_down=1"], "node index must be 0..19"),
    (["--broker", "http://x"], "expected mqtt://HOST:PORT"),
    (["--profile", "nope"], "unknown board profile"),
    (["--fault", "x"], "expected NODE_INDEX=SIMSPEC"),
    (["--cluster", "a/b"], "use 1-64 characters"),
])
def test_cli_errors_are_one_line(args, message):
    from click.testing import CliRunner

    from nvmon.cli.simfleet import sim_fleet_command

    result = CliRunner().invoke(sim_fleet_command, args)
    assert result.exit_code in (1, 2) and message in result.output and "Traceback" not in result.output
