"""Liveness a viewer can trust (issue 14), through a real Mosquitto: ages from the statuses' own
timestamps after a late start, the fleet rules on the TUI's alerts screen and in its header, the
headless node list, and forgetting a decommissioned node."""

from __future__ import annotations

import time

from mqtt_broker import Broker, needs_mosquitto, wait_until
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

            await wait_until(lambda: len(status()) == 2, 10, "both retained statuses in the table")
            status = status()
            assert status["stopped"].startswith("✗ off 20m") and status["dead"].startswith("✗ lost ≤6m"), status
            await pilot.press("a")
            assert isinstance(app.screen, AlertsScreen)
            # judged after the settle time (2 s after connecting), by the rules nvmon fleet runs
            await wait_until(lambda: len(alert_rows(app)) == 2, 10, "two node.offline alerts on screen")
            rows = alert_rows(app)
            assert "offline for 20 min: stopped cleanly" in rows[("stopped", "node.offline")]
            assert "offline for up to 6 min: connection lost" in rows[("dead", "node.offline")]
            header = plain(app.screen.query_one("#info", Static))
            assert "✗2" in header and "alerts 2" in header
            assert max(len(line) for line in header.splitlines()) <= 80  # fits an 80-column terminal

            # Forgotten (its retained status cleared): the row goes, with no "resolved" left behind.
            await retain(broker.url, [(topic(C, "dead", "status"), b"")])
            await wait_until(lambda: set(alert_rows(app)) == {("stopped", "node.offline")}, 10, "dead forgotten")
            assert ("lv", "dead") not in app.state.nodes and not app.alert_log.resolved
            assert "alerts 1" in plain(app.screen.query_one("#info", Static))
