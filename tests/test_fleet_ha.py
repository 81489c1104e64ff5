"""`nvmon fleet` partitioned and doubled (issue 14, item 3), with real processes: one Mosquitto,
`nvmon sim-fleet` nodes that really die (SIGKILL: the broker publishes their wills), `nvmon fleet`
instances, and a real Alertmanager (Debian's prometheus-alertmanager).

- one instance for a list of clusters (`--cluster a,b`): a dead node of each watched cluster pages,
  labelled with its own cluster; a dead node of a cluster not in the list does not;
- two instances of the same cluster (HA) with the Alertmanager hook on one Alertmanager: the dead
  node is ONE alert there, and both instances name it by the same fingerprint; SIGKILL one
  instance: the alert stays (the survivor re-sends it, past Alertmanager's resolve_timeout) and
  the survivor resolves it when the node comes back.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

from mqtt_broker import Broker, needs_mosquitto
from realstack import Alertmanager, wait_for
from test_fleet_service import Proc, fleet_config, pages
from test_hooks import receiver  # noqa: F401 (a fixture)

from nvmon.alerts.model import fingerprint

pytestmark = needs_mosquitto

FAST = ('[fleet.rules."node.offline"]\nclear_s = 1\n'
        '[fleet.rules."fleet.same_fault"]\nenabled = false\n')  # 1 s from the node's return to the resolve


def sim(tmp: Path, broker: str, cluster: str, prefix: str, nodes: int = 1, name: str | None = None) -> Proc:
    """`nvmon sim-fleet` of `nodes` nodes named PREFIX-000...; SIGKILL it and the broker publishes their wills."""
    return Proc(tmp, name or f"sim-{cluster}-{prefix}", "sim-fleet", "--broker", broker, "--cluster", cluster,
                "--prefix", prefix, "--nodes", str(nodes), "--interval", "0.5").start()


def watching(p: Proc, n_listeners: int) -> bool:
    """Subscribed, to the shared controls of `n_listeners` clusters (one for every cluster) too."""
    line = next((ln for ln in p.text().splitlines() if "fleet: subscribed to" in ln), "")
    return line.partition("shared acks and silences on")[2].count("@controls") >= n_listeners


def firing_lines(p: Proc, code: str) -> list[str]:
    return [ln for ln in p.text().splitlines() if f"fleet alert firing: critical {code}" in ln]


def stop_all(*procs: Proc | None) -> None:
    for p in procs:
        if p is not None and p.proc is not None and p.proc.poll() is None:
            p.stop(signal.SIGTERM)


def test_one_instance_watches_a_list_of_clusters(tmp_path):
    cfg, out = fleet_config(tmp_path, "[fleet]\nfeed_stall_min_nodes = 100\n" + FAST)
    with Broker(tmp_path) as broker:
        sims = {c: sim(tmp_path, broker.url, c, f"{c}n") for c in ("ca", "cb", "cc")}
        f = None
        try:
            # --cluster given twice, the second a comma list (with a repeat): watches ca and cb only
            f = Proc(tmp_path, "fleet", "fleet", "--broker", broker.url, "--cluster", "ca", "--cluster", "cb,ca",
                     "--config", str(cfg), "--db", str(tmp_path / "fleet.db")).start()
            wait_for(lambda: watching(f, 2), 20, "nvmon fleet to subscribe")
            text = f.text()
            assert "watching clusters ca, cb on" in text
            assert "subscribed to nvmon/v1/ca/+/+, nvmon/v1/cb/+/+ on" in text
            assert "shared acks and silences on nvmon/v1/ca/@controls, nvmon/v1/cb/@controls" in text
            time.sleep(3)  # the settle time, and a sample from each node
            for p in sims.values():
                p.kill()  # SIGKILL: the wills
            wait_for(lambda: len(pages(out)) >= 2, 15, "two node.offline pages")
            time.sleep(2)  # room for a wrong third page (cc's node) to arrive
            alerts = sorted((p["alert"] for p in pages(out)), key=lambda a: a["cluster"])
            assert [(a["code"], a["cluster"], a["node"], a["status"]) for a in alerts] == [
                ("node.offline", "ca", "can-000", "firing"), ("node.offline", "cb", "cbn-000", "firing")], alerts
            for a in alerts:
                assert a["fingerprint"] == fingerprint("node.offline", a["cluster"], a["node"])
            assert "Traceback" not in f.text()
        finally:
            stop_all(f, *sims.values())
        assert f.proc.returncode == 0


def test_two_instances_are_one_alert_in_alertmanager_and_either_one_resolves_it(tmp_path, receiver):
    cluster, victim = "ha", "victim-000"
    # resolve_timeout 4 s: only re-sends (repeat_interval_s 1) keep a firing alert in Alertmanager,
    # so after the kill it is the surviving instance that holds it there
    with Broker(tmp_path) as broker, Alertmanager(tmp_path, receiver.url("/am"), resolve_timeout="4s") as am:
        cfg = tmp_path / "fleet.toml"
        cfg.write_text(f'[fleet]\ncluster = "{cluster}"\n{FAST}\n'
                       f'[[hooks]]\ntype = "alertmanager"\nurls = ["{am.url}"]\nrepeat_interval_s = 1\n')
        healthy = sim(tmp_path, broker.url, cluster, "sim", nodes=3)
        dying = sim(tmp_path, broker.url, cluster, "victim", name="victim-1")
        back = f1 = f2 = None
        try:
            f1, f2 = (Proc(tmp_path, f"fleet{i}", "fleet", "--broker", broker.url, "--config", str(cfg), "--db",
                           str(tmp_path / f"fleet{i}.db")).start() for i in (1, 2))
            for f in (f1, f2):
                wait_for(lambda f=f: watching(f, 1), 20, "both instances to subscribe")
            time.sleep(3)  # the settle time, and samples from every node
            dying.kill()  # SIGKILL: the broker publishes victim-000's will

            fp = fingerprint("node.offline", cluster, victim)
            for f in (f1, f2):  # both instances judged it, under one identity
                [line] = wait_for(lambda f=f: firing_lines(f, "node.offline"), 30, "node.offline in each instance")
                assert f"on {cluster}/{victim} ({fp})" in line, line
            for f in (f1, f2):
                wait_for(lambda f=f: re.search(r"hook alertmanager: 1 firing alert\(s\) delivered", f.text()), 30,
                         "each instance's delivery")
            [a] = am.alerts(alertname="node.offline")  # one alert, not two
            sim_label = a["labels"].pop("sim")  # the inventory's labels: the simulated board's spec
            assert sim_label.startswith("hgx-h100")
            assert a["labels"] == {"alertname": "node.offline", "severity": "critical", "cluster": cluster,
                                   "node": victim, "rack": "rack-00"}, a["labels"]
            assert a["annotations"]["fingerprint"] == fp and a["status"]["state"] == "active"
            assert len(am.alerts()) == 1  # nothing else fired: the healthy nodes are quiet
            # Alertmanager's own receiver: one alert per notification, that one
            note = wait_for(lambda: [b for b in receiver.bodies("/am") if b["status"] == "firing"], 30,
                            "Alertmanager's firing notification")[0]
            assert [x["labels"]["node"] for x in note["alerts"]] == [victim]

            f1.kill()  # one instance dies without a word
            time.sleep(6)  # past resolve_timeout (4 s) since f1's last send
            [a] = am.alerts(alertname="node.offline")
            assert a["status"]["state"] == "active" and a["annotations"]["fingerprint"] == fp

            back = sim(tmp_path, broker.url, cluster, "victim", name="victim-2")  # the node returns
            wait_for(lambda: "fleet alert resolved: critical node.offline" in f2.text(), 20, "f2 to resolve it")
            wait_for(lambda: am.alerts(alertname="node.offline") == [], 10, "the alert to leave Alertmanager")
            assert re.search(r"hook alertmanager: 1 resolved alert\(s\) delivered", f2.text())
            wait_for(lambda: [b for b in receiver.bodies("/am") if b["status"] == "resolved"], 30,
                     "Alertmanager's resolved notification")
            assert "Traceback" not in f1.text() + f2.text()
        finally:
            stop_all(f2, healthy, back, dying)
            if f1 is not None and f1.proc.poll() is None:
                f1.kill()
        assert f2.proc.returncode == 0


def test_a_shared_ack_of_one_twins_episode_acks_the_others():
    """Twins judge one fault on their own clocks (starts 0.7 s apart here); an ack shared on the
    broker for one's episode (keyed by fingerprint and start) acks the other's too, through the
    same SharedControls path nvmon fleet listens with. An ack of an older episode does not."""
    from test_fleet_rules import C, T0, node_up, offline, setup

    from nvmon.alerts.shared import shared_ack
    from nvmon.wire.contract import control_topic
    from nvmon.wire.control import controls_payload, empty

    twins = [setup(), setup()]
    for i, (state, alerts, _) in enumerate(twins):
        node_up(state, "n1", T0)
        offline(state, "n1", T0 + 3)
        alerts.evaluate(state, T0 + 3.2 + 0.7 * i)
    (a,), (b,) = (t[1].active() for t in twins)
    assert a.fingerprint == b.fingerprint and a.labels == b.labels and round(b.starts_at - a.starts_at, 3) == 0.7
    assert [r.fingerprint for t in twins for r in t[2].sent] == [a.fingerprint] * 2  # same dedup key

    def share(starts_at: float) -> None:
        payload = controls_payload(shared_ack(a.fingerprint, starts_at, T0 + 10, "sre")(empty(C, T0 + 10)))
        for _, alerts, _ in twins:
            assert alerts.shared.apply(control_topic(C), payload)
            alerts.clock = lambda: T0 + 11
            alerts.apply_controls()

    share(a.starts_at - 60)  # another episode of the same alert, long over: not this one's
    assert [t[1].active()[0].acked_at for t in twins] == [None, None]
    share(a.starts_at)  # acked through twin a's view of it
    assert [t[1].active()[0].acked_at for t in twins] == [T0 + 10, T0 + 10]


def test_cluster_lists_bad_input_is_one_line(tmp_path):
    from click.testing import CliRunner

    from nvmon.cli.root import cli

    run = CliRunner().invoke
    for bad, says in (("a,b/c", "'b/c': use 1-64 characters"), ("a,,b", "an empty name in 'a,,b'")):
        r = run(cli, ["fleet", "--cluster", bad, "--db", str(tmp_path / "f.db")])
        assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output
    cfg = tmp_path / "fleet.toml"
    cfg.write_text('[fleet]\ncluster = "a"\nclusters = ["b"]\n')
    r = run(cli, ["fleet", "--config", str(cfg), "--db", str(tmp_path / "f.db")])
    assert r.exit_code == 1 and "set cluster (one) or clusters (a list), not both" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    cfg.write_text('[fleet]\nclusters = ["b", "x y"]\n')
    r = run(cli, ["fleet", "--config", str(cfg), "--db", str(tmp_path / "f.db")])
    assert r.exit_code == 1 and "cluster 'x y'" in r.output and len(r.output.strip().splitlines()) == 1, r.output
