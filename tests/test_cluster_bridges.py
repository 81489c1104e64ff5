"""Clusters of clusters on Mosquitto bridges (issue 14, item 2), all real: two per-cluster Mosquittos,
each running the shipped docs/mosquitto/bridge-cluster.conf into a central Mosquitto; per cluster
`nvmon sim-fleet` nodes and an `nvmon fleet` publishing the cluster's summary; on the central broker
a `nvmon fleet --watch summaries` with an exec hook, and the TUI (Pilot, headless).

- the TUI opens on the cluster overview and shows both clusters from their summaries, bridged;
- Enter on a cluster subscribes to its nodes and shows them live; Escape comes back;
- cluster cb's broker is killed (its bridge with it): the central fleet pages ONE cluster.unreachable
  for cb and nothing else, and the TUI shows cb unreachable and the one alert on its alerts screen.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

from mqtt_broker import Broker, free_port, needs_mosquitto, wait_until
from test_fleet_service import Proc, fleet_config, pages

from nvmon.alerts.model import fingerprint
from nvmon.fleet.clusters import ClusterBoard
from nvmon.tui.clusters_app import ClusterFleetScreen, ClustersApp
from nvmon.tui.screens.alerts import AlertsScreen
from nvmon.tui.screens.clusters import ClustersScreen
from nvmon.wire.mqtt import MqttSettings

pytestmark = needs_mosquitto

BRIDGE_CONF = Path(__file__).resolve().parent.parent / "docs" / "mosquitto" / "bridge-cluster.conf"
NODES = 3
STALE_INTERVALS = 5


def bridged_broker(tmp: Path, cluster: str, central: Broker) -> Broker:
    """A Mosquitto for `cluster` running the shipped bridge config as written, but for where things are:
    its own listener, the central broker on loopback, no TLS and no login (the test's brokers have none).
    Each changed line must be in the file, so the test cannot pass on a config that drifted."""
    port = free_port()
    text = BRIDGE_CONF.read_text()
    for old, new in (("address central.example.net:8883", f"address 127.0.0.1:{central.port}"),
                     ("bridge_cafile /etc/mosquitto/ca.crt", ""), ("remote_username @bridge-CLUSTER", ""),
                     ("remote_password CHANGE-ME", "")):
        assert re.search(rf"^{re.escape(old)}$", text, re.M), f"{BRIDGE_CONF.name} has no line {old!r}"
        text = re.sub(rf"^{re.escape(old)}$", new, text, flags=re.M)
    text = text.replace("CLUSTER", cluster)
    return Broker(tmp, port=port, config=f"listener {port} 127.0.0.1\nallow_anonymous true\n{text}")


def rows(app) -> dict[str, list[str]]:
    t = app.screen.table
    return {cells[0].plain: [c.plain for c in cells] for cells in (t.get_row_at(i) for i in range(t.row_count))}


async def test_two_bridged_clusters_overview_drill_in_and_one_alert_for_a_lost_bridge(tmp_path):
    summaries = tmp_path / "summaries.toml"
    summaries.write_text("[fleet]\nsummary_every_s = 1\n")  # fast for the test
    # Unreachable after 5 s without a summary: late enough that a starved test machine does not page a
    # live cluster, soon enough for a short test.
    central_cfg, out = fleet_config(tmp_path, f"[fleet]\nsummary_stale_intervals = {STALE_INTERVALS}\n")
    procs: list[Proc] = []
    with Broker(tmp_path) as central:
        brokers = {c: bridged_broker(tmp_path, c, central) for c in ("ca", "cb")}
        try:
            for c, b in brokers.items():
                b.start()
                procs.append(Proc(tmp_path, f"sim-{c}", "sim-fleet", "--broker", b.url, "--cluster", c, "--prefix",
                                  f"{c}n", "--nodes", str(NODES), "--interval", "0.5").start())
                procs.append(Proc(tmp_path, f"fleet-{c}", "fleet", "--broker", b.url, "--cluster", c, "--config",
                                  str(summaries), "--db", str(tmp_path / f"{c}.db")).start())
            watcher = Proc(tmp_path, "central", "fleet", "--broker", central.url, "--watch", "summaries", "--config",
                           str(central_cfg), "--db", str(tmp_path / "central.db")).start()
            procs.append(watcher)

            app = ClustersApp(MqttSettings(url=central.url), clusters=(),
                              board=ClusterBoard(stale_intervals=STALE_INTERVALS))
            async with app.run_test(size=(140, 30)) as pilot:
                # The overview: both clusters, from their bridged summaries, every node online.
                await wait_until(lambda: all(v.summary is not None and v.summary.nodes.online == NODES
                                             for v in app.board.clusters.values()) and len(app.board.clusters) == 2,
                                 30, "both clusters' summaries with every node online")
                assert isinstance(app.screen, ClustersScreen)
                await wait_until(lambda: set(rows(app)) == {"ca", "cb"} and all(
                    r[2].startswith(f"{NODES}/{NODES}") for r in rows(app).values()), 15, "the overview redrawn")
                shown = rows(app)
                assert set(shown) == {"ca", "cb"}
                for c in ("ca", "cb"):
                    assert shown[c][1].startswith("✓ live") and shown[c][2].startswith(f"{NODES}/{NODES}"), shown
                assert len(app.state.nodes) == 0  # no node topic received: summaries only

                # Drill into ca: its nodes, live; nothing of cb.
                await pilot.press("enter")
                await wait_until(lambda: isinstance(app.screen, ClusterFleetScreen), 15, "ca's fleet screen")
                assert app.drilled == "ca"
                await wait_until(lambda: app.state.counts(app.now())["online"] == NODES
                                 and all(v.tick is not None for v in app.state.nodes.values()), 30, "ca's nodes live")
                assert {k for k in app.state.nodes} == {("ca", f"can-{i:03d}") for i in range(NODES)}
                await wait_until(lambda: len(app.screen.table._visible) == NODES, 15, "ca's nodes on screen")
                await pilot.press("escape")
                await wait_until(lambda: isinstance(app.screen, ClustersScreen) and app.drilled is None, 15,
                                 "back on the overview")
                assert len(app.state.nodes) == 0

                # cb's broker dies, and its bridge with it: one alert for the cluster, not one per node.
                assert not pages(out) and not app.alert_log.fleet
                brokers["cb"].kill()
                await wait_until(lambda: pages(out), 30, "the central fleet's page")
                await wait_until(lambda: [r.alert.code for r in app.alert_log.fleet] == ["cluster.unreachable"], 15,
                                 "the TUI's cluster.unreachable")
                await pilot.pause(3)  # room for a wrong second page
                alerts = [p["alert"] for p in pages(out)]
                assert [(a["code"], a["cluster"], a["node"], a["status"]) for a in alerts] == [
                    ("cluster.unreachable", "cb", None, "firing")], alerts
                assert alerts[0]["fingerprint"] == fingerprint("cluster.unreachable", "cb", None)
                assert "3/3 nodes online" in alerts[0]["summary"]
                await wait_until(lambda: rows(app)["cb"][1].startswith("✗ unreachable"), 15, "cb unreachable on screen")
                shown = rows(app)
                assert shown["cb"][1].startswith("✗ unreachable") and shown["ca"][1].startswith("✓ live"), shown
                [row] = app.alert_log.fleet
                assert (row.key, row.alert.severity) == (("cb", "fleet"), "critical")
                await pilot.press("a")
                await wait_until(lambda: isinstance(app.screen, AlertsScreen), 15, "the alerts screen")
            for p in (watcher, *procs):
                assert "Traceback" not in p.text(), p.text()[-2000:]
            # Each instance's book holds what it can judge: the central one the cluster rule alone.
            assert "rules: cluster.unreachable; alert state in" in watcher.text()
            assert "node.offline" in procs[1].text() and "cluster.unreachable" not in procs[1].text()
        finally:
            for p in procs:
                if p.proc is not None and p.proc.poll() is None:
                    p.stop(signal.SIGTERM)
            for b in brokers.values():
                b.stop()
