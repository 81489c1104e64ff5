"""Limits on shared silences (issue 16): anyone who can write `@controls` can write a silence, so
evaluators apply one for at most `[alerts] max_silence_h`, refuse one covering every node unless
its writer said `--all-nodes`, log each new one once with who set it and until when — and
`nvmon alerts --json` on a node's database says `silenced` as its daemon judged it, shared
silences included. Through a real Mosquitto and a real daemon where the broker is involved."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from mqtt_broker import Broker, Recorder, needs_mosquitto, wait_until
from test_alerts_daemon import ALERTS_TOML, active_set
from test_daemon import DaemonProc

from nvmon.alerts.shared import SharedControls, covers_every_node, shared_silence
from nvmon.wire.checks import MAX_TS
from nvmon.wire.contract import WireError, control_topic
from nvmon.wire.control import ControlSet, SharedSilence, controls_payload, empty, parse_controls
from nvmon.wire.mqtt import MqttSettings, make_client

T = 1_700_000_000.0
TOPIC = "nvmon/v1/c1/@controls"
YEAR_5138 = MAX_TS - 1
WEEK = 7 * 86400.0


def nvmon(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvmon", *args], capture_output=True, text=True, timeout=timeout)


def forged(*silences: SharedSilence, cluster: str = "c1") -> bytes:
    return controls_payload(ControlSet(cluster=cluster, ts=T, silences=silences))


# -- the wire marker ----------------------------------------------------------------------------


def test_all_nodes_is_an_extra_key_written_only_when_set_and_strictly_read():
    every = SharedSilence("a1", {"code": "gpu.*"}, T, T + 60, "alice", None, all_nodes=True)
    one = SharedSilence("b2", {"node": "gpu-07"}, T, T + 60, "bob", None)
    d = json.loads(forged(every, one))
    assert d["silences"][0]["all_nodes"] is True and "all_nodes" not in d["silences"][1]  # old readers: unchanged
    cs = parse_controls(TOPIC, forged(every, one))
    assert [s.all_nodes for s in cs.silences] == [True, False]
    d["silences"][0]["all_nodes"] = "yes"
    with pytest.raises(WireError, match=r"silences\[0\]\.all_nodes: expected true or false"):
        parse_controls(TOPIC, json.dumps(d).encode())


@pytest.mark.parametrize(("matchers", "every"), [
    ({"code": "x"}, True), ({"node": "*"}, True), ({"node": "**"}, True), ({"node": "*?*"}, True),
    ({"node": "?*"}, True), ({"node": "??*"}, True),  # misses one-letter names only: a whole real fleet
    ({"node": "???????"}, True), ({"node": "?"}, True),  # a length only: gpu-001 … gpu-999 are all 7
    ({"node": "[!/]*"}, True), ({"node": "*[!#]*"}, True), ({"node": "[!]*]*"}, True),  # classes no name char escapes
    ({"node": "[-.0-9A-Za-z_]*"}, True),
    ({"node": "*-*"}, False), ({"node": "gpu-*"}, False), ({"node": "gpu-07"}, False), ({"node": "[a-f]*"}, False),
    ({"node": "[!a]*"}, False), ({"node": "*[!.]*"}, False),  # '...' is a node name
    ({"node": "*[!]"}, False), ({"node": "[*]"}, False), ({"node": ""}, False),  # literal '[', '*'; nothing
    ({"fingerprint": "3f2a9c1d00aa11bb"}, False), ({"fingerprint": "3f2a*"}, True),
    ({"fingerprint": "3f2a*", "node": "gpu-*"}, False)])
def test_which_silences_cover_every_node(matchers, every):
    assert covers_every_node(matchers) is every


def test_a_node_wide_pattern_matches_by_length_only():
    """Cross-check with fnmatch itself over random globs: whenever covers_every_node says a pattern
    names no character, whether it matches a name depends on the name's length alone."""
    import fnmatch
    import random

    from nvmon.alerts.shared import NAME_CHARS
    from nvmon.wire.contract import valid_name

    rng = random.Random(16)
    pieces = ["*", "?", "[!/]", "[!]", "]", "[", "!", "a", "-", ".", "[a-z]", "[!a]", "[-.0-9A-Za-z_]", "[!#]"]
    names = [n for n in ("".join(rng.choice(NAME_CHARS) for _ in range(rng.randint(1, 9))) for _ in range(300))
             if valid_name(n)]
    wide = 0
    for _ in range(3000):
        pattern = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 5)))
        if covers_every_node({"node": pattern}):
            wide += 1
            for name in names:
                assert fnmatch.fnmatchcase(name, pattern) == fnmatch.fnmatchcase("x" * len(name), pattern), \
                    (pattern, name)
    assert wide > 100  # the check ran on many node-wide patterns


# -- what an evaluator applies ------------------------------------------------------------------


def test_a_forged_silence_for_every_node_until_5138_is_refused_counted_and_logged_once(caplog):
    caplog.set_level(logging.INFO, "nvmon.alerts")
    sc = SharedControls(max_silence_s=WEEK)
    bad = SharedSilence("f0rged", {"node": "*"}, T, YEAR_5138, "mallory", None)
    ok = SharedSilence("g00d", {"node": "gpu-07", "code": "nvlink.*"}, T, T + 3600, "alice", "bridge swap")
    assert sc.apply(TOPIC, forged(bad, ok))
    [s] = sc.controls(T + 1)[1]  # only the one naming a node
    assert s.id == "c1/g00d" and s.ends_at == T + 3600
    assert sc.refused_silences == 1
    refused = [r.getMessage() for r in caplog.records if "f0rged" in r.getMessage()]
    assert len(refused) == 1 and "by mallory" in refused[0] and "refused" in refused[0]
    assert "--all-nodes" in refused[0] and "5138" in refused[0]
    applied = [r.getMessage() for r in caplog.records if "g00d" in r.getMessage()]
    assert len(applied) == 1 and "by alice" in applied[0] and "applied" in applied[0]
    # the same set again (say, with a new ack): nothing new to log, nothing counted twice
    caplog.clear()
    assert sc.apply(TOPIC, forged(bad, ok))
    assert sc.refused_silences == 1 and not [r for r in caplog.records if "shared silence" in r.getMessage()]


def test_a_silence_longer_than_the_maximum_applies_only_up_to_it(caplog):
    caplog.set_level(logging.INFO, "nvmon.alerts")
    sc = SharedControls(max_silence_s=WEEK)
    long = SharedSilence("l0ng", {"node": "gpu-07"}, T, YEAR_5138, "mallory", None)
    every = SharedSilence("all1", {"code": "gpu.xid"}, T, T + 2 * WEEK, "alice", None, all_nodes=True)
    sc.apply(TOPIC, forged(long, every))
    got = {s.id: s.ends_at for s in sc.controls(T)[1]}
    assert got == {"c1/l0ng": T + WEEK, "c1/all1": T + WEEK}  # --all-nodes is honoured, and capped too
    assert sc.controls(T + WEEK + 1)[1] == []  # muted for a week at most, not until 5138
    assert sc.capped_silences == 2 and sc.refused_silences == 0
    [line] = [r.getMessage() for r in caplog.records if "l0ng" in r.getMessage()]
    assert "by mallory" in line and "applied only until 2023-11-21" in line and "168 h" in line


# -- the CLI ------------------------------------------------------------------------------------


def test_cli_refuses_a_silence_longer_than_the_maximum_in_one_line(tmp_path):
    r = nvmon("alerts", "silence", "--match", "node=n1", "--for", "8d", "--db", str(tmp_path / "x.db"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "longer than the maximum silence, 168 h" in r.stderr and "Traceback" not in r.stderr
    cfg = tmp_path / "n.toml"
    cfg.write_text('[node]\ncluster = "c1"\n[alerts]\nmax_silence_h = 1\n')
    r = nvmon("alerts", "silence", "--match", "node=n1", "--for", "2h", "--config", str(cfg), "--db",
              str(tmp_path / "x.db"))
    assert r.returncode == 2 and "maximum silence, 1 h" in r.stderr, r.stderr


@needs_mosquitto
async def test_cli_needs_all_nodes_for_a_shared_silence_of_every_node(tmp_path):
    with Broker(tmp_path) as broker:
        base = ("alerts", "silence", "--for", "1h", "--broker", broker.url, "--cluster", "c1")
        r = nvmon(*base, "--match", "node=*")
        assert r.returncode == 2 and "needs --all-nodes" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        r = nvmon(*base, "--match", "code=gpu.xid")
        assert r.returncode == 2 and "needs --all-nodes" in r.stderr
        async with Recorder(broker.url, control_topic("c1")) as rec:
            r = nvmon(*base, "--match", "code=gpu.xid", "--all-nodes", "--by", "alice")
            assert r.returncode == 0, r.stderr
            await wait_until(lambda: rec.messages, 15, "the shared set")
        [s] = json.loads(rec.messages[-1].payload)["silences"]
        assert s["all_nodes"] is True and s["created_by"] == "alice"
        sc = SharedControls()
        sc.apply(control_topic("c1"), rec.messages[-1].payload)
        assert len(sc.controls(s["starts_at"] + 1)[1]) == 1 and sc.refused_silences == 0  # applied


@needs_mosquitto
async def test_listing_shows_who_set_each_shared_silence_and_what_evaluators_make_of_it(tmp_path):
    import time

    now = time.time()
    with Broker(tmp_path) as broker:
        bad = SharedSilence("f0rged", {"node": "*"}, now, YEAR_5138, "mallory", None)
        long = SharedSilence("l0ng", {"node": "gpu-07"}, now, YEAR_5138, "mallory", None)
        fine = SharedSilence("f1ne", {"node": "gpu-08"}, now, now + 3600, "alice", "fan swap")
        async with make_client(MqttSettings(url=broker.url), client_id="mallory") as c:
            await c.publish(control_topic("c1"), forged(bad, long, fine), qos=1, retain=True)
        args = ("alerts", "silences", "--broker", broker.url, "--cluster", "c1", "--db", str(tmp_path / "none.db"))
        r = nvmon(*args)
        assert r.returncode == 0, r.stderr
        lines = {ln.split()[0]: ln for ln in r.stdout.splitlines()}
        assert "by mallory" in lines["c1/f0rged"] and "REFUSED by evaluators" in lines["c1/f0rged"]
        assert "by mallory" in lines["c1/l0ng"] and "applied only until" in lines["c1/l0ng"]
        assert lines["c1/f1ne"].endswith("by alice: fan swap")
        got = {d["id"]: d for d in json.loads(nvmon(*args, "--json").stdout)}
        assert got["c1/f0rged"]["applied_until"] is None and got["c1/f0rged"]["created_by"] == "mallory"
        assert got["c1/l0ng"]["applied_until"] < got["c1/l0ng"]["ends_at"]  # ISO strings, same format
        assert got["c1/f1ne"]["applied_until"] == got["c1/f1ne"]["ends_at"]


# -- a real daemon ------------------------------------------------------------------------------


def alerts_json(db) -> list[dict]:
    r = nvmon("alerts", "--json", "--db", str(db))
    assert r.returncode == 0, r.stderr
    return [a for a in json.loads(r.stdout) if a["code"] == "nvlink.link_down" and a["status"] == "firing"]


@needs_mosquitto
async def test_daemon_refuses_a_forged_silence_and_alerts_json_reports_shared_silences_truthfully(tmp_path):
    with Broker(tmp_path) as broker:
        settings = MqttSettings(url=broker.url)
        async with Recorder(broker.url, "nvmon/v1/t/#") as rec:
            d = DaemonProc(tmp_path, broker=broker.url, sim="hgx-h100,nvlink_down=2.5@1",
                           extra_toml=ALERTS_TOML).start()
            try:
                await rec.wait_for("status", timeout=30)
                # the attack: a silence of every node until 5138, published by anyone
                bad = SharedSilence("f0rged", {"node": "*"}, T, YEAR_5138, "mallory", None)
                async with make_client(settings, client_id="mallory") as c:
                    await c.publish(control_topic("t"), forged(bad, cluster="t"), qos=1, retain=True)
                await wait_until(lambda: "f0rged" in d.log_text(), 15, "the daemon to refuse the forged silence")
                await rec.wait_for("alerts", lambda m: [a["code"] for a in active_set(m)
                                                       if a["state"] == "firing"] == ["nvlink.link_down"], 15)
                await wait_until(lambda: alerts_json(d.db), 15, "the firing alert in the database")
                assert [a["silenced"] for a in alerts_json(d.db)] == [False]  # and it is not: it pages
                # a real shared silence of this node, from the CLI: applied, logged, and reported
                r = nvmon("alerts", "silence", "--match", "node=n1", "--for", "2h", "--broker", broker.url,
                          "--cluster", "t", "--by", "alice", "--db", str(tmp_path / "none.db"))
                assert r.returncode == 0, r.stderr
                await wait_until(lambda: [a["silenced"] for a in alerts_json(d.db)] == [True], 30,
                                 "nvmon alerts --json to report the shared silence")
                sid = r.stdout.split("shared silence ", 1)[1].split()[0]
                # and the node's own listing shows it, with who set it (no broker needed)
                listed = nvmon("alerts", "silences", "--db", str(d.db))
                assert f"t/{sid}" in listed.stdout and "by alice" in listed.stdout, listed.stdout
                r = nvmon("alerts", "unsilence", f"t/{sid}", "--broker", broker.url, "--db", str(tmp_path / "none.db"))
                assert r.returncode == 0, r.stderr
                await wait_until(lambda: [a["silenced"] for a in alerts_json(d.db)] == [False], 30,
                                 "the unsilence to show")
            finally:
                assert d.stop() == 0
    log = d.log_text()
    refused = [ln for ln in log.splitlines() if "f0rged" in ln]
    assert len(refused) == 1 and "by mallory" in refused[0] and "refused" in refused[0]
    applied = [ln for ln in log.splitlines() if f"shared silence {sid}" in ln]
    assert len(applied) == 1 and "by alice" in applied[0] and "until" in applied[0]
    assert "Traceback" not in log


def test_writer_helpers_keep_the_marker():
    """`shared_silence(..., all_nodes=True)` survives the writer's round trip (prune, payload)."""
    sid, change = shared_silence({"code": "x"}, T, T + 60, "alice", None, all_nodes=True)
    cs = change(empty("c1", T)).pruned(T)
    assert parse_controls(TOPIC, controls_payload(cs)).silence(sid).all_nodes is True


# -- nvmon fleet ----------------------------------------------------------------------------------


@needs_mosquitto
async def test_nvmon_fleet_refuses_caps_logs_and_keeps_what_it_applied(tmp_path):
    import sqlite3
    import time

    from test_fleet_service import cluster_name, fleet, fleet_config

    cluster = cluster_name()
    cfg, _ = fleet_config(tmp_path, "[alerts]\nmax_silence_h = 1")
    db = tmp_path / "fleet.db"
    now = time.time()
    with Broker(tmp_path) as broker:
        f = fleet(tmp_path, broker.url, cluster, cfg, db).start()
        try:
            await wait_until(lambda: "shared acks and silences on" in f.text(), 30, "nvmon fleet listening")
            every = SharedSilence("f0rged", {"node": "*"}, now, YEAR_5138, "mallory", None)
            long = SharedSilence("l0ng", {"node": "gpu-07"}, now, YEAR_5138, "mallory", None)
            async with make_client(MqttSettings(url=broker.url), client_id="mallory") as c:
                await c.publish(control_topic(cluster), forged(every, long, cluster=cluster), qos=1, retain=True)

            def kept() -> list[dict]:
                with sqlite3.connect(db) as conn:
                    row = conn.execute("SELECT value FROM state WHERE key = 'alerts.shared_silences'").fetchone()
                return json.loads(row[0]) if row else []

            await wait_until(lambda: kept(), 30, "the applied silences in the fleet database")
            [s] = kept()
            assert s["id"] == f"{cluster}/l0ng" and s["ends_at"] == pytest.approx(now + 3600, abs=0.01)
            assert s["matchers"] == {"node": "gpu-07", "cluster": cluster} and s["created_by"] == "mallory"
        finally:
            rc, _ = f.stop()
    log = f.text()
    assert rc == 0, log
    [refused] = [ln for ln in log.splitlines() if "f0rged" in ln]
    assert "by mallory" in refused and "refused" in refused
    [capped] = [ln for ln in log.splitlines() if "l0ng" in ln]
    assert "applied only until" in capped and "1 h" in capped and "Traceback" not in log
