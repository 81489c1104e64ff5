"""Fleet commands for an SRE (issue 14, item 6), through the real CLI in a subprocess against a real
Mosquitto: `nvmon nodes` with its board and driver columns and its filters, and the cluster-wide
`nvmon alerts --broker` (every node's retained alert set plus the fleet rules' judgement of the
same read, marked by the shared acks and silences).

The fleet: `nvmon sim-fleet` nodes fc/sim-000..003 on two racks (sim-001 with an NVLink down,
sim-002 a paired A100 board), plus retained messages as daemons long gone left them: fc/dead lost
its connection (the will) with one alert still in its set, fc/stopped stopped cleanly 20 min ago
(no inventory, no alerts), and oc/far in another cluster, lost, with a critical alert."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time

import pytest
from mqtt_broker import Broker, needs_mosquitto

from nvmon.wire.contract import Alert, topic
from nvmon.wire.mqtt import MqttSettings, make_client
from nvmon.wire.payloads import alerts_payload, status_payload
from nvmon.wire.summary import AlertCount, ClusterSummary, NodeCounts, summary_payload, summary_topic

pytestmark = needs_mosquitto
C, OTHER = "fc", "oc"
H100 = "8×H100-SXM nvswitch"


def nvmon(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "NVMON_BROKER"}
    return subprocess.run([sys.executable, "-m", "nvmon", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env={**base, **(env or {})})


def alert(fp: str, code: str, severity: str, summary: str, starts: float, **kw) -> Alert:
    return Alert(fingerprint=fp, code=code, severity=severity, state="firing", summary=summary, since=starts,
                 starts_at=starts, **kw)


async def retain(url: str, now: float) -> None:
    msgs = [
        (topic(C, "dead", "status"), status_payload("offline", version="1", interval_s=1, ts=now - 600, reason="lost")),
        (topic(C, "dead", "alerts"), alerts_payload([alert("d00dfeed01", "pcie.width", "warning",
                                                           "GPU 3 PCIe x8 (expected x16)", now - 900, gpu=3)], now - 60)),
        (topic(C, "stopped", "status"),
         status_payload("offline", version="1", interval_s=1, ts=now - 1200, reason="stopped")),
        (topic(OTHER, "far", "status"), status_payload("offline", version="1", interval_s=1, ts=now - 300, reason="lost")),
        (topic(OTHER, "far", "alerts"), alerts_payload([alert("fa4fa4fa4f", "gpu.lost", "critical",
                                                              "GPU 5 fell off the bus", now - 400, gpu=5)], now - 30)),
        # what fc's nvmon fleet would publish: its own count of the cluster's alerts, 200 s ago
        (summary_topic(C), summary_payload(ClusterSummary(
            cluster=C, ts=now - 200, interval_s=10, nodes=NodeCounts(total=6, online=4, stale=0, offline=2),
            power_w=None, alerts=(AlertCount("node.offline", "critical", 2, 2),
                                  AlertCount("nvlink.link_down", "critical", 1, 1),
                                  AlertCount("nvlink.topology", "warning", 1, 0))))),
    ]
    async with make_client(MqttSettings(url=url), client_id="gone-daemons") as c:
        for t, payload in msgs:
            await c.publish(t, payload, qos=1, retain=True)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet-commands")
    with Broker(tmp) as broker:
        asyncio.run(retain(broker.url, time.time()))
        log = open(tmp / "sim.log", "ab")
        sim = subprocess.Popen([sys.executable, "-m", "nvmon", "sim-fleet", "--broker", broker.url, "--cluster", C,
                                "--nodes", "4", "--racks", "2", "--interval", "0.5", "--fault", "1=nvlink_down=2.5",
                                "--fault", "2=pairs-a100"], stdout=log, stderr=log)
        try:
            asyncio.run(_wait_nodes(broker.url, 4))
            yield broker
        finally:
            sim.kill()
            sim.wait(5)
            log.close()


async def _wait_nodes(url: str, n: int, timeout: float = 30) -> None:
    """Until n sim nodes have published an inventory and the two faulty ones their alert sets."""
    seen: set[str] = set()
    alerted: set[str] = set()
    async with make_client(MqttSettings(url=url), client_id="wait-sim") as c:
        await c.subscribe(f"nvmon/v1/{C}/+/+", qos=1)
        async with asyncio.timeout(timeout):
            async for m in c.messages:
                node, kind = str(m.topic).split("/")[3:5]
                if kind == "inventory" and node.startswith("sim-"):
                    seen.add(node)
                if kind == "alerts" and json.loads(m.payload or b"{}").get("alerts"):
                    alerted.add(node)
                if len(seen) >= n and {"sim-001", "sim-002"} <= alerted:
                    return


def rows_of(*args: str) -> dict[str, dict]:
    r = nvmon("nodes", *args, "--json", "--settle", "1.5")
    assert r.returncode == 0, r.stderr
    return {f"{n['cluster']}/{n['node']}": n for n in json.loads(r.stdout)}


# ---- nvmon nodes ------------------------------------------------------------------------------


def test_nodes_shows_board_and_driver_from_each_inventory(fleet):
    rows = rows_of("--broker", fleet.url)
    assert set(rows) == {f"{C}/sim-00{i}" for i in range(4)} | {f"{C}/dead", f"{C}/stopped", f"{OTHER}/far"}
    for name in ("sim-000", "sim-001", "sim-003"):
        r = rows[f"{C}/{name}"]
        assert (r["board"], r["gpus"], r["model"], r["topology"]) == (H100, 8, "NVIDIA H100 80GB HBM3", "nvswitch")
        assert r["driver"] == "550.54.15" and r["liveness"] == "online"
    assert (rows[f"{C}/sim-002"]["board"], rows[f"{C}/sim-002"]["topology"]) == ("8×A100-PCIe pairs", "pairs")
    for gone in (f"{C}/dead", f"{C}/stopped", f"{OTHER}/far"):  # no inventory: nothing to say what it is
        assert (rows[gone]["board"], rows[gone]["driver"], rows[gone]["gpus"]) == (None, None, None)

    table = nvmon("nodes", "--broker", fleet.url, "--cluster", C, "--settle", "1.5")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["NODE", "RACK", "BOARD", "DRIVER", "LIVENESS", "AGE", "VERSION", "ALERTS", "FLAGS"]
    by_node = {ln.split()[0]: ln for ln in lines[1:]}
    assert set(by_node) == {"sim-000", "sim-001", "sim-002", "sim-003", "dead", "stopped"}
    assert by_node["sim-002"].split()[:5] == ["sim-002", "rack-01", "8×A100-PCIe", "pairs", "550.54.15"]
    assert by_node["dead"].split()[:6] == ["dead", "-", "-", "-", "offline", "(lost)"]
    # the columns line up: BOARD starts at the same place on every line
    col = lines[0].index("BOARD")
    assert all(ln[col - 2:col] == "  " and ln[col] != " " for ln in lines[1:]), lines


def test_nodes_filters_by_name_rack_state_and_problems_in_table_and_json(fleet):
    url = ("--broker", fleet.url)
    assert set(rows_of(*url, "sim-00[01]", "dea*")) == {f"{C}/sim-000", f"{C}/sim-001", f"{C}/dead"}
    assert set(rows_of(*url, "--rack", "rack-01")) == {f"{C}/sim-002", f"{C}/sim-003"}  # 4 nodes on 2 racks, in order
    assert set(rows_of(*url, "--rack", "rack-0*", "--cluster", C)) == {f"{C}/sim-00{i}" for i in range(4)}
    assert set(rows_of(*url, "--state", "offline")) == {f"{C}/dead", f"{C}/stopped", f"{OTHER}/far"}
    assert set(rows_of(*url, "--state", "lost")) == {f"{C}/dead", f"{OTHER}/far"}
    assert set(rows_of(*url, "--state", "stopped", "--state", "online", "--cluster", C)) == \
        {f"{C}/stopped"} | {f"{C}/sim-00{i}" for i in range(4)}
    problems = rows_of(*url, "--problems")
    assert set(problems) == {f"{C}/sim-001", f"{C}/sim-002", f"{C}/dead", f"{C}/stopped", f"{OTHER}/far"}
    assert problems[f"{C}/sim-001"]["alerts"] == {"critical": 1} and problems[f"{C}/sim-002"]["alerts"] == {"warning": 1}
    assert set(rows_of(*url, "--problems", "--rack", "rack-00")) == {f"{C}/sim-001"}

    table = nvmon("nodes", *url, "--problems", "--state", "lost", "--settle", "1.5")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:2] == ["CLUSTER", "NODE"] and sorted(ln.split()[1] for ln in lines[1:]) == ["dead", "far"]

    none = nvmon("nodes", *url, "nope-*", "--settle", "1")
    assert none.returncode == 0 and none.stdout == ""
    assert none.stderr.splitlines() == [f"none of 7 nodes on {fleet.url} match"]
    assert nvmon("nodes", *url, "nope-*", "--json", "--settle", "1").stdout.strip() == "[]"


def test_nodes_bad_filters_are_one_line_usage_errors(fleet):
    for args, words in ((["--state", "dead"], "'--state'"), (["--rack", ""], "glob"), (["gpu\x1b[31m"], "glob")):
        r = nvmon("nodes", "--broker", fleet.url, *args, "--settle", "0.5")
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and words in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and r.stdout == ""


# ---- nvmon alerts --broker ------------------------------------------------------------------


def listed(*args: str) -> list[dict]:
    r = nvmon("alerts", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_alerts_broker_lists_every_node_and_the_fleet_rules(fleet):
    rows = listed("--broker", fleet.url, "--cluster", C)
    got = {(r["node"], r["code"]): r for r in rows}
    assert set(got) == {("sim-001", "nvlink.link_down"), ("sim-002", "nvlink.topology"), ("dead", "pcie.width"),
                        ("dead", "node.offline"), ("stopped", "node.offline")}
    down = got[("sim-001", "nvlink.link_down")]
    assert (down["source"], down["status"], down["severity"], down["cluster"], down["rack"], down["gpu"],
            down["link"]) == ("node", "firing", "critical", C, "rack-00", 2, 5)
    assert down["runbook"] and set(down) >= {"fingerprint", "summary", "starts_at", "labels", "acked_at", "silenced"}
    assert got[("dead", "pcie.width")]["source"] == "node"  # what the dead node said last, still in its set
    for node, why in (("dead", "connection lost"), ("stopped", "stopped cleanly")):  # the fleet rules' judgement
        r = got[(node, "node.offline")]
        assert (r["source"], r["status"], r["severity"]) == ("fleet", "firing", "critical") and why in r["summary"]
    # dated by the node's own timestamps, not by this read: stopped 20 min ago
    stopped_at = got[("stopped", "node.offline")]["starts_at"]
    assert abs(time.mktime(time.strptime(stopped_at[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
               - (time.time() - 1200)) < 60, stopped_at
    # Order: critical before warning.
    sev = [r["severity"] for r in rows]
    assert sev == sorted(sev, key=["critical", "warning", "info"].index)

    every = listed("--broker", fleet.url)  # without --cluster: every cluster, the other one's too
    assert {(r["cluster"], r["node"], r["code"]) for r in every} >= {(OTHER, "far", "gpu.lost"),
                                                                     (OTHER, "far", "node.offline")}


def test_alerts_broker_honours_the_filters(fleet):
    url = ("--broker", fleet.url)
    assert {(r["node"], r["code"]) for r in listed(*url, "--node", "dead")} == {("dead", "pcie.width"),
                                                                                 ("dead", "node.offline")}
    assert {(r["cluster"], r["node"]) for r in listed(*url, "--code", "node.*")} == \
        {(C, "dead"), (C, "stopped"), (OTHER, "far")}
    assert {r["severity"] for r in listed(*url, "--severity", "critical")} == {"critical"}
    assert {r["code"] for r in listed(*url, "--cluster", C, "--severity", "warning", "--node", "sim-00*")} == \
        {"nvlink.link_down", "nvlink.topology"}


def test_alerts_broker_table_names_cluster_and_node(fleet):
    r = nvmon("alerts", "--broker", fleet.url, "--code", "nvlink.*")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["STATE", "SEV", "CODE", "WHERE", "SINCE", "COUNT", "FINGERPRINT"]
    assert len(lines) == 6  # two alerts, two lines each, and fc's summary under them
    # fc's nvmon fleet's own count, of the codes --code keeps (oc publishes no summary)
    # 200 s old when the module's fleet was set up, older by the time this test runs (3m, 4m, ...)
    before, age, after = re.split(r"(\d+m) old", lines[5], maxsplit=1)
    assert int(age[:-1]) >= 3 and (before, after) == (
        f"summary of {C} (its nvmon fleet, ",
        "): 6 nodes (2 offline); alerts: 1 nvlink.link_down crit, 1 nvlink.topology warn (1 pending)"), lines[5]
    first = lines[1].split()
    # several clusters on the broker: WHERE starts with the cluster; no count travels on the wire
    assert first[:5] == ["✗", "firing", "crit", "nvlink.link_down", f"{C}/sim-001"] and first[-2] == "-", lines
    assert lines[2].startswith("    GPU 2 NVLink 5")
    one = nvmon("alerts", "--broker", fleet.url, "--cluster", C, "--code", "nvlink.link_down").stdout.splitlines()
    assert one[1].split()[4] == "sim-001"  # one cluster: the node alone
    crit = nvmon("alerts", "--broker", fleet.url, "--cluster", C, "--severity", "critical").stdout.splitlines()
    assert crit[-1].endswith("alerts: 2 node.offline crit, 1 nvlink.link_down crit"), crit
    node = nvmon("alerts", "--broker", fleet.url, "--cluster", C, "--node", "sim-001").stdout
    assert "summary of" not in node  # the summary counts the whole cluster, not a node


def test_alerts_broker_marks_shared_acks_and_silences(fleet, tmp_path):
    db = str(tmp_path / "none.db")  # an ops workstation: no local database, the shared set only
    r = nvmon("alerts", "ack", "d00dfeed", "--broker", fleet.url, "--cluster", C, "--db", db)
    assert r.returncode == 0, r.stderr
    # broker flags typed before the subcommand reach it
    r = nvmon("alerts", "--broker", fleet.url, "--cluster", C, "silence", "--match", "node=sim-002", "--for", "1h",
              "--db", db)
    assert r.returncode == 0 and "shared silence" in r.stdout, r.stderr
    got = {(r["node"], r["code"]): r for r in listed("--broker", fleet.url, "--cluster", C)}
    assert got[("dead", "pcie.width")]["acked_at"] is not None and not got[("dead", "pcie.width")]["silenced"]
    assert got[("sim-002", "nvlink.topology")]["silenced"] and got[("sim-002", "nvlink.topology")]["acked_at"] is None
    assert not got[("sim-001", "nvlink.link_down")]["silenced"]
    table = nvmon("alerts", "--broker", fleet.url, "--cluster", C, "--node", "dead", "--code", "pcie.*").stdout
    assert "[acked] GPU 3 PCIe x8" in table


def test_alerts_broker_takes_the_fleet_rules_of_a_config(fleet, tmp_path):
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(f'[mqtt]\nbroker = "{fleet.url}"\n[fleet]\ncluster = "{C}"\nclean_stop_after_s = 3600\n')
    rows = listed("--config", str(cfg), "--code", "node.offline")
    assert {(r["cluster"], r["node"]) for r in rows} == {(C, "dead")}  # stopped 20 min < 1 h: not judged offline yet


def test_alerts_broker_bad_input_and_unreachable_broker_are_one_line(fleet, tmp_path):
    r = nvmon("alerts", "--broker", "mqtt://127.0.0.1:1")
    assert r.returncode == 1 and r.stderr.startswith("nvmon: broker mqtt://127.0.0.1:1:"), r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stdout == ""
    for args, words in ((["--all"], "--all"), (["--db", str(tmp_path / "a.db")], "--db"),
                        (["--cluster", "a/b"], "--cluster"), (["--settle", "0"], "--settle")):
        r = nvmon("alerts", "--broker", fleet.url, *args)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and words in r.stderr, (args, r.stderr)
        assert r.stderr.startswith("nvmon alerts: ") and "Traceback" not in r.stderr


def test_alerts_takes_NVMON_BROKER_but_an_explicit_db_wins(fleet, tmp_path):
    env = {"NVMON_BROKER": fleet.url}
    r = nvmon("alerts", "--cluster", C, "--code", "nvlink.link_down", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert [(a["node"], a["source"]) for a in json.loads(r.stdout)] == [("sim-001", "node")]
    missing = tmp_path / "node.db"
    r = nvmon("alerts", "--db", str(missing), env=env)  # the database asked for, not the broker
    assert r.returncode == 1 and r.stderr.splitlines() == [f"nvmon: database {missing}: not found"]


async def _retained_payload(url: str, t: str) -> bytes:
    async with make_client(MqttSettings(url=url), client_id="read-one") as c:
        await c.subscribe(t, qos=1)
        async with asyncio.timeout(10):
            async for m in c.messages:
                return bytes(m.payload)


def test_nodes_shows_hostile_inventory_strings_as_data(fleet, tmp_path):
    """A model and a driver version carrying terminal escapes and markup: the table shows them
    defused (control characters as '?'), --json keeps them exactly, escaped by JSON."""
    inv = json.loads(asyncio.run(_retained_payload(fleet.url, topic(C, "sim-000", "inventory"))))
    inv["cluster"], inv["node"] = "ev", "evil"
    model, driver = "\x1b[31mEVIL [bold]x[/bold]", "\x1b]0;pwn\x07 550"
    for g in inv["gpus"]:
        g["model"] = model
    inv["nvml"]["driver_version"] = driver

    async def publish(url):
        async with make_client(MqttSettings(url=url), client_id="hostile") as c:
            await c.publish(topic("ev", "evil", "inventory"), json.dumps(inv).encode(), qos=1, retain=True)

    with Broker(tmp_path) as broker:
        asyncio.run(publish(broker.url))
        table = nvmon("nodes", "--broker", broker.url, "--settle", "1")
        assert table.returncode == 0, table.stderr
        assert "\x1b" not in table.stdout and "\x07" not in table.stdout
        row = table.stdout.splitlines()[1]
        assert "8×?[31mEVIL [bold]x[/bold] nvswitch" in row and "?]0;pwn? 550" in row, row
        (got,) = json.loads(nvmon("nodes", "--broker", broker.url, "--settle", "1", "--json").stdout)
        assert (got["model"], got["driver"], got["board"]) == (model, driver, f"8×{model} nvswitch")


def test_nodes_on_a_broker_of_summaries_only_says_where_the_nodes_are(tmp_path):
    """A central broker whose bridges forward only the clusters' `@summary` (docs/mosquitto/
    bridge-cluster.conf without the node lines) has no node to list: `nvmon nodes` says which
    clusters it summarises and where their nodes are, instead of a bare 'no nodes'."""
    now = time.time()

    async def publish(url):
        async with make_client(MqttSettings(url=url), client_id="summaries") as c:
            for cluster, online in (("prod-a", 120), ("prod-b", 79)):
                s = ClusterSummary(cluster=cluster, ts=now, interval_s=10,
                                   nodes=NodeCounts(total=80 if cluster == "prod-b" else 120, online=online,
                                                    stale=0, offline=1 if cluster == "prod-b" else 0), power_w=None)
                await c.publish(summary_topic(cluster), summary_payload(s), qos=1, retain=True)

    with Broker(tmp_path) as broker:
        asyncio.run(publish(broker.url))
        r = nvmon("nodes", "--broker", broker.url, "--settle", "1")
        assert r.returncode == 0 and r.stdout == "", r
        assert r.stderr == (f"no nodes on {broker.url}; it carries the summaries of 2 clusters (prod-a 120/120 "
                            "online, prod-b 79/80 online): list their nodes on each cluster's own broker, or "
                            "drill in with `nvmon tui --cluster '+'`\n")
        assert nvmon("nodes", "--broker", broker.url, "--settle", "1", "--json").stdout.strip() == "[]"
        empty = tmp_path / "e"
        empty.mkdir()
    with Broker(empty) as bare:
        r = nvmon("nodes", "--broker", bare.url, "--settle", "0.5")
        assert r.returncode == 0 and r.stderr == f"no nodes on {bare.url}\n", r
