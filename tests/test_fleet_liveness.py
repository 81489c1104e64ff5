"""Liveness a viewer can trust (issue 14), through a real Mosquitto: ages from the statuses' own
timestamps after a late start, the fleet rules on the TUI's alerts screen and in its header, the
headless node list, and forgetting a decommissioned node."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

from mqtt_broker import Broker, Recorder, needs_mosquitto, wait_until
from test_fleet_service import Proc, fleet, fleet_config, pages
from textual.widgets import DataTable, Static
from tuifleet import column_plain, plain

from nvmon.tui.app import NvmonApp
from nvmon.tui.screens.alerts import AlertsScreen
from nvmon.tui.widgets.fleet_table import FleetTable
from nvmon.wire.contract import topic
from nvmon.wire.mqtt import MqttSettings, make_client
from nvmon.wire.payloads import alerts_payload, status_payload

pytestmark = needs_mosquitto
C = "lv"


async def retain(url: str, messages) -> None:
    """Publish (topic, payload) retained, as daemons long gone left them."""
    async with make_client(MqttSettings(url=url), client_id="gone-daemons") as c:
        for t, payload in messages:
            await c.publish(t, payload, qos=1, retain=True)


def dead_fleet(now: float) -> list:
    """`stopped` cleanly 20 min ago (past clean_stop_after_s), `dead` lost its connection: the will
    is stamped at its connect a day ago, its alerts were last republished 6 min ago."""
    return [(topic(C, "stopped", "status"),
             status_payload("offline", version="1", interval_s=1, ts=now - 1200, reason="stopped")),
            (topic(C, "dead", "status"),
             status_payload("offline", version="1", interval_s=1, ts=now - 86400, reason="lost")),
            (topic(C, "dead", "alerts"), alerts_payload([], now - 360))]


def alert_rows(app) -> dict[tuple[str, str], str]:
    """(node, code) → summary on the alerts screen."""
    t = app.screen.query_one(DataTable)
    return dict(zip(zip(column_plain(t, "node"), column_plain(t, "code")), column_plain(t, "summary")))


async def test_tui_started_late_shows_true_ages_and_the_fleet_rules_alerts(tmp_path):
    with Broker(tmp_path) as broker:
        await retain(broker.url, dead_fleet(time.time()))
        app = NvmonApp(MqttSettings(url=broker.url), cluster=C, source="liveness test", refresh_s=0.1)
        async with app.run_test(size=(160, 48)) as pilot:
            def status():
                t = app.screen.query_one(FleetTable)
                return dict(zip(column_plain(t, "node"), column_plain(t, "status")))

            await wait_until(lambda: len(status()) == 2, 30, "both retained statuses in the table")
            status = status()
            assert status["stopped"].startswith("✗ off 20m") and status["dead"].startswith("✗ lost ≤6m"), status
            await pilot.press("a")
            assert isinstance(app.screen, AlertsScreen)
            # judged after the settle time (2 s after connecting), by the rules nvmon fleet runs
            await wait_until(lambda: len(alert_rows(app)) == 2, 30, "two node.offline alerts on screen")
            rows = alert_rows(app)
            assert "offline for 20 min: stopped cleanly" in rows[("stopped", "node.offline")]
            assert "offline for up to 6 min: connection lost" in rows[("dead", "node.offline")]
            header = plain(app.screen.query_one("#info", Static))
            assert "✗2" in header and "alerts 2" in header
            assert max(len(line) for line in header.splitlines()) <= 80  # fits an 80-column terminal

            # Forgotten (its retained status cleared): the row goes, with no "resolved" left behind.
            await retain(broker.url, [(topic(C, "dead", "status"), b"")])
            await wait_until(lambda: set(alert_rows(app)) == {("stopped", "node.offline")}, 30, "dead forgotten")
            assert ("lv", "dead") not in app.state.nodes and not app.alert_log.resolved
            assert "alerts 1" in plain(app.screen.query_one("#info", Static))


def nvmon(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvmon", *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, **kw)


async def test_nodes_lists_liveness_and_forget_clears_a_dead_node(tmp_path):
    node_cfg = tmp_path / "node.toml"
    node_cfg.write_text(f'[node]\ncluster = "{C}"\nrack = "r7"\n')
    with Broker(tmp_path) as broker:
        await retain(broker.url, dead_fleet(time.time()))
        daemon = Proc(tmp_path, "live", "daemon", "--config", str(node_cfg), "--broker", broker.url, "--db",
                      str(tmp_path / "live.db"), "--node", "live", "--sim", "hgx-h100", "--interval", "0.5").start()
        try:
            async with Recorder(broker.url, f"nvmon/v1/{C}/live/sample") as rec:
                await rec.wait_for("sample", timeout=20)
            r = nvmon("nodes", "--broker", broker.url, "--cluster", C, "--json", "--settle", "1.5")
            assert r.returncode == 0, r.stderr
            rows = {n["node"]: n for n in json.loads(r.stdout)}
            assert set(rows) == {"live", "stopped", "dead"}
            live, stopped, dead = rows["live"], rows["stopped"], rows["dead"]
            assert (live["liveness"], live["rack"], live["age_exact"]) == ("online", "r7", True)
            assert live["version"] and live["age_s"] < 2
            assert (stopped["liveness"], stopped["reason"], stopped["age_exact"]) == ("offline", "stopped", True)
            # dated 20 min / 6 min before the test began: that much and the test's own time since
            # (up to a minute on a slow machine; a wrong reading would be off by far more)
            assert 1200 <= stopped["age_s"] < 1260
            assert (dead["liveness"], dead["reason"], dead["age_exact"]) == ("offline", "lost", False)
            assert 360 <= dead["age_s"] < 420
            table = nvmon("nodes", "--broker", broker.url, "--cluster", C, "--settle", "1")
            assert table.returncode == 0, table.stderr
            lines = table.stdout.splitlines()
            assert lines[0].split() == ["NODE", "RACK", "BOARD", "DRIVER", "LIVENESS", "AGE", "VERSION", "ALERTS",
                                        "FLAGS"]
            assert len(lines) == 4
            assert any(ln.split()[:6] == ["dead", "-", "-", "-", "offline", "(lost)"] and "≤6m" in ln for ln in lines)

            # A live node is refused; without a terminal, --yes is needed; then the dead one goes.
            r = nvmon("forget", "live", "--broker", broker.url, "--cluster", C, "--yes", "--settle", "1")
            assert r.returncode == 1 and r.stderr.startswith("nvmon: live: still alive") and "\n" == r.stderr[-1:]
            assert len(r.stderr.splitlines()) == 1
            r = nvmon("forget", "dead", "--broker", broker.url, "--cluster", C, "--settle", "1")
            assert r.returncode == 1 and "add --yes" in r.stderr and len(r.stderr.splitlines()) == 1
            r = nvmon("forget", "dead", "--broker", broker.url, "--cluster", C, "--yes", "--settle", "1")
            assert r.returncode == 0, r.stderr
            assert f"forgot dead in cluster {C}" in r.stdout
            r = nvmon("nodes", "--broker", broker.url, "--cluster", C, "--json", "--settle", "1")
            assert {n["node"] for n in json.loads(r.stdout)} == {"live", "stopped"}
            async with Recorder(broker.url, f"nvmon/v1/{C}/dead/+") as rec:
                await asyncio.sleep(0.5)
                assert rec.messages == []  # nothing retained is left of it
        finally:
            daemon.kill()


def test_nodes_and_forget_bad_input_is_one_line(tmp_path):
    r = nvmon("nodes", "--broker", "mqtt://127.0.0.1:1", "--settle", "0.5")
    assert r.returncode == 1 and r.stderr.startswith("nvmon: broker mqtt://127.0.0.1:1") and \
        len(r.stderr.splitlines()) == 1, r.stderr
    r = nvmon("forget", "bad/name", "--cluster", "c", "--yes")
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and "bad/name" in r.stderr


async def test_nvmon_fleet_started_late_pages_true_ages_and_forget_ends_without_a_page(tmp_path):
    cfg, out = fleet_config(tmp_path)
    with Broker(tmp_path) as broker:
        await retain(broker.url, dead_fleet(time.time()))
        f = fleet(tmp_path, broker.url, C, cfg, tmp_path / "fleet.db").start()
        try:
            await wait_until(lambda: len(pages(out)) >= 2, 15, "two node.offline pages")
            got = {p["alert"]["node"]: p["alert"] for p in pages(out)}
            assert "offline for 20 min: stopped cleanly" in got["stopped"]["summary"]
            assert "offline for up to 6 min: connection lost" in got["dead"]["summary"]
            r = nvmon("forget", "dead", "--broker", broker.url, "--cluster", C, "--yes", "--settle", "1")
            assert r.returncode == 0, r.stderr
            await wait_until(lambda: "fleet alert forgotten" in f.text(), 30, "the forgotten alert logged")
            await asyncio.sleep(3)  # a resolved page would go out with the forget: room for its hook's start
            assert len(pages(out)) == 2  # no resolved page for the forgotten node
            rc, _ = f.stop()
            assert rc == 0, f.text()
        finally:
            if f.proc.poll() is None:
                f.kill()


async def test_a_node_dying_under_the_tui_is_on_its_alerts_screen_within_stale_after(tmp_path):
    """SIGSTOP (a hung host): node.stale once stale-after has passed; kill -9: node.offline at the will."""
    import signal

    node_cfg = tmp_path / "node.toml"
    # keepalive 10 s: the frozen node's will comes 15 s after its last packet, far behind node.stale
    # (2.5 s), so a slow machine cannot let the will (status offline: no stale judged) come first.
    node_cfg.write_text(f'[node]\ncluster = "{C}"\n[mqtt]\nkeepalive_s = 10\n')
    with Broker(tmp_path) as broker:
        daemon = Proc(tmp_path, "n1", "daemon", "--config", str(node_cfg), "--broker", broker.url, "--db",
                      str(tmp_path / "n1.db"), "--node", "n1", "--sim", "hgx-h100", "--interval", "0.5").start()
        try:
            app = NvmonApp(MqttSettings(url=broker.url), cluster=C, source="liveness test", refresh_s=0.1)
            async with app.run_test(size=(160, 48)) as pilot:
                await wait_until(lambda: app.state.counts(time.time())["online"] == 1, 20, "n1 online")
                await asyncio.sleep(2.5)  # past the settle time
                await pilot.press("a")
                assert alert_rows(app) == {}
                stale_after = app.state.nodes[(C, "n1")].stale_after_s
                daemon.proc.send_signal(signal.SIGSTOP)
                t0 = time.monotonic()
                await wait_until(lambda: ("n1", "node.stale") in alert_rows(app), stale_after + 10, "node.stale")
                took = time.monotonic() - t0
                print(f"node.stale on the alerts screen {took:.2f} s after SIGSTOP (stale after {stale_after:g} s)")
                # the last tick came up to an interval before the stop; the row appears on the next
                # 0.1 s redraw. The bound has room for a slow machine and still tells "when it went
                # stale" from a later event (its will at 15 s, node.stale's 20 s hold before a page).
                assert took <= stale_after + 3.0
                daemon.kill()  # the socket closes: the broker publishes the will at once
                await wait_until(lambda: ("n1", "node.offline") in alert_rows(app), 15, "node.offline")
                assert "connection lost" in alert_rows(app)[("n1", "node.offline")]
                # the pending node.stale stays until its clear_s (30 s), as in nvmon fleet, and never pages
                assert "alerts 2" in plain(app.screen.query_one("#info", Static))
        finally:
            if daemon.proc.poll() is None:
                daemon.kill()
