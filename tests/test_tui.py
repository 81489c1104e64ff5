"""The TUI driven with Textual's Pilot on a deterministic simulated fleet: every screen and key,
incremental redraws, literal display of hostile strings, and the broker-lost banner."""

from __future__ import annotations

import json
import re

import pytest
from mqtt_broker import free_port, wait_until
from textual.widgets import DataTable, Input, Static
from tuifleet import OFFLINE, STALE, column_plain, header, make_app, plain, shared_showcase, showcase

from nvmon.loadgen.state import T0
from nvmon.tui.app import NvmonApp
from nvmon.tui.rows import COLUMN_KEYS, is_problem
from nvmon.tui.screens.alerts import AlertsScreen
from nvmon.tui.screens.fleet import FleetScreen
from nvmon.tui.screens.help import HelpScreen
from nvmon.tui.screens.node import NodeScreen
from nvmon.tui.text import clean
from nvmon.tui.widgets.fleet_table import FleetTable
from nvmon.wire.contract import topic
from nvmon.wire.mqtt import MqttSettings
from nvmon.wire.payloads import alerts_payload

SIZE = (160, 48)


def table(app) -> FleetTable:
    return app.screen.query_one(FleetTable)


async def test_fleet_screen_rows_status_and_problem_symbols():
    sim = shared_showcase()
    app = make_app(sim)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        t = table(app)
        assert t.row_count == 12
        assert column_plain(t, "node") == sim.names
        status = column_plain(t, "status")
        assert status[OFFLINE].startswith("✗ lost") and status[STALE].startswith("⚠ stale")
        assert status[0] == "✓ online"
        # Compact cells name what the findings are about (pcie.width is a warning: ⚠, as on the alerts screen)
        assert column_plain(t, "pcie")[2] == "⚠ x8 GPU3" and column_plain(t, "pcie")[0] == "✓ Gen5 x16"
        assert column_plain(t, "ib")[3] == "⚠ 100G" and column_plain(t, "ib")[0] == "✓ 8/8"
        assert column_plain(t, "links")[5] == "✗ 143/144⚠" and column_plain(t, "links")[1] == "⚠ pairs"
        assert column_plain(t, "power")[4].startswith("⚠cap1 ") and column_plain(t, "temp")[9].startswith("⚠92°C G6")
        assert column_plain(t, "alerts")[5] == "✗1 ⚠1" and column_plain(t, "alerts")[0] == "✓"
        assert column_plain(t, "gpus")[1] == "8×A100 80GB PCIe"
        head = header(app)
        assert "12 nodes ✓10 ⚠1 ✗1" in head and "dropped 0" in head and "fresh" in head
        assert "simulated fleet (fixed clock)" in head and "cluster sim" in head


async def test_sort_keys_and_header_click():
    app = make_app(shared_showcase())
    async with app.run_test(size=SIZE) as pilot:
        t = table(app)
        await pilot.press("s")  # node → status: the worst first
        assert t.sort_column == "status" and t.reverse
        assert column_plain(t, "status")[0].startswith("✗ lost")
        await pilot.press("r")
        assert not t.reverse and column_plain(t, "status")[-1].startswith("✗ lost")
        for _ in range(len(COLUMN_KEYS) - 1):
            await pilot.press("s")
        assert t.sort_column == "node" and t.row_count == 12
        # clicking a header sorts by it (the worst first); clicking it again reverses
        temp_x = sum(t.widths[: COLUMN_KEYS.index("temp")]) + 2
        await pilot.click("#fleet-table", offset=(temp_x, 0))
        await pilot.pause()
        assert t.sort_column == "temp" and t.reverse
        assert column_plain(t, "temp")[0].startswith("⚠92")
        await pilot.click("#fleet-table", offset=(temp_x, 0))
        await pilot.pause()
        assert not t.reverse and column_plain(t, "temp")[-1].startswith("⚠92")
        await pilot.click("#fleet-table", offset=(2, 0))  # the Node header
        await pilot.pause()
        assert t.sort_column == "node"
        # a click selects a row, a second click opens it
        await pilot.click("#fleet-table", offset=(2, 3))
        assert t.cursor_row == 2 and isinstance(app.screen, FleetScreen)
        await pilot.click("#fleet-table", offset=(2, 3))
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen) and app.screen.key == ("sim", "sim-002")


async def test_filter_problems_and_rack_groups():
    sim = shared_showcase()
    app = make_app(sim, rack_budget_kw=30)
    async with app.run_test(size=SIZE) as pilot:
        t = table(app)
        await pilot.press("slash")
        box = app.screen.query_one("#fleet-filter", Input)
        assert box.display and box.has_focus
        await pilot.press(*"pairs")
        assert column_plain(t, "node") == ["sim-001"]  # the `sim` label names the board
        await pilot.press("escape")
        assert t.row_count == 12 and not box.display
        await pilot.press("slash", *"stale", "enter")
        assert column_plain(t, "node") == [sim.names[STALE]]
        await pilot.press("slash", "escape")
        await pilot.press("p")
        want = [v.node for v in sim.state.nodes.values() if is_problem(v, v.liveness(sim.now))]
        assert column_plain(t, "node") == sorted(want) and "sim-000" not in want
        await pilot.press("p", "g")
        nodes = column_plain(t, "node")  # a rack header is one line, in the node column's text
        assert nodes[0].startswith("▾ rack-00  ") and any(n.startswith("▾ rack-01") for n in nodes)
        assert len(nodes) == 14
        assert re.search(r" [✓⚠✗] [\d.]+/30\.0kW rack budget", nodes[0]), nodes[0]
        # Enter on a rack header opens nothing
        t.move_cursor(row=0)
        await pilot.press("enter")
        assert isinstance(app.screen, FleetScreen)


async def test_enter_opens_node_screen_and_escape_returns():
    sim = shared_showcase()
    app = make_app(sim)
    async with app.run_test(size=SIZE) as pilot:
        t = table(app)
        t.move_cursor(row=5)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen) and app.screen.key == ("sim", "sim-005")
        sections = plain(app.screen.query_one("#node-sections", Static))
        assert "all-to-all through NVSwitch" in sections and "GPU2" in sections and "NV18" in sections
        assert "✗" in sections and "!" in sections  # link 2.5 down, link 1.1 erroring
        assert "mlx5_0:1" in sections and "0000:18:00.0" in sections and "00000000:" not in sections
        alerts = plain(app.screen.query_one("#node-alerts", Static))
        assert "nvlink.link_down" in alerts and "critical" in alerts
        spark = app.screen.query_one("#spark-nvlink_bytes_per_s")
        assert len(spark.data) == 4  # four ticks of history
        assert "GB/s" in plain(app.screen.query_one("#last-pcie_bytes_per_s", Static))
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)
        # the pairs board says so in words
        t = table(app)
        t.move_cursor(row=1)
        await pilot.press("enter")
        await pilot.pause()
        assert "pairs only" in plain(app.screen.query_one("#node-sections", Static))


async def test_alerts_screen_ack_silence_and_open():
    sim = showcase()
    app = make_app(sim)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("a")
        assert isinstance(app.screen, AlertsScreen)
        t = app.screen.query_one(DataTable)
        sev = column_plain(t, "sev")
        assert sev[:2] == ["✗ crit"] * 2 and all(s == "⚠ warn" for s in sev[2:])
        assert column_plain(t, "node")[0] == "sim-005" and column_plain(t, "code")[0] == "nvlink.link_down"
        # the lost node: the fleet rules' node.offline, judged by the engine nvmon fleet runs
        assert (column_plain(t, "node")[1], column_plain(t, "code")[1]) == (f"sim-{OFFLINE:03d}", "node.offline")
        hint = plain(app.screen.query_one("#alerts-hint", Static))
        assert "runbook:" in hint and "nvidia-smi nvlink" in hint
        await pilot.press("k")
        await pilot.pause()
        assert column_plain(t, "state")[0].endswith(" ack")
        assert any("marked in this view only" in n.message for n in app._notifications)
        await pilot.press("x")
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen) and app.screen.key == ("sim", "sim-005")
        await pilot.press("escape")
        # the node's alert set clears: its alerts show as resolved
        sim.state.apply(topic("sim", "sim-005", "alerts"), alerts_payload([], sim.now), sim.now)
        app.refresh_data()
        await pilot.pause()
        states = column_plain(t, "state")
        assert sum(s.startswith("✓ resolved") for s in states) == 2
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)


async def test_help_and_quit():
    app = make_app(shared_showcase())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        body = plain(app.screen.query_one("#help-body", Static))
        assert "problems only" in body and "✗" in body
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0 or app.return_code is None


async def test_incremental_redraw_touches_only_changed_rows():
    sim = showcase()
    app = make_app(sim, refresh_s=3600)  # no timer redraws between the test's own
    async with app.run_test(size=SIZE) as pilot:
        t = table(app)
        assert t.sync(sim.now) == 0  # nothing changed (the fixed clock: even the ages stand still)
        assert t.sync(sim.now + 60) == 2  # the lost and the stale node: their ages moved
        node = sim.state.nodes[("sim", "sim-003")]
        payload = json.loads(_sample_of(node))
        payload["ts"] = sim.now
        sim.state.apply(topic("sim", "sim-003", "sample"), json.dumps(payload).encode(), sim.now)
        t._strips["sim/sim-000"] = cached = t._strips.get("sim/sim-000")
        drawn = t.sync(sim.now + 60)
        assert drawn == 1 and "sim/sim-003" not in t._strips  # sim-003 only: its row is rebuilt
        assert t._strips.get("sim/sim-000") is cached  # others keep their rendered strip
        await pilot.pause()


async def test_paint_probe_names_the_rows_repainted():
    sim = showcase()
    app = make_app(sim, refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        t = table(app)
        seen: list = []
        t.paint_probe = seen.append
        node = sim.state.nodes[("sim", "sim-003")]
        payload = json.loads(_sample_of(node))
        payload["ts"] = sim.now
        sim.state.apply(topic("sim", "sim-003", "sample"), json.dumps(payload).encode(), sim.now)
        t.sync(sim.now)
        await pilot.pause()
        assert seen == [("sim", "sim-003")]  # repainted once, nothing else rebuilt
        t.sync(sim.now)
        await pilot.pause()
        assert seen == [("sim", "sim-003")]


def _sample_of(view) -> bytes:
    """A sample payload equivalent to the node's last tick (rebuilt from a simulated board)."""
    from nvmon.loadgen.boards import Board, NodeIdentity

    b = Board("hgx-h100,ib_rate=mlx5_1:100", interval_s=1.0, clock_start=T0)
    try:
        _, layout = b.inventory_for(NodeIdentity("sim", view.node, view.rack, dict(view.labels)))
        return b.payload_for(layout, T0)
    finally:
        b.close()


async def test_hostile_strings_are_shown_literally():
    sim = showcase()
    node = sim.state.nodes[("sim", "sim-000")]
    inv = _inventory_json(node)
    inv["rack"] = "[red]x[/red]\x1b[2J"
    inv["labels"] = {"owner": "[bold]boss[/bold]", "esc": "\x1b]0;pwned\x07\u202e"}
    inv["gpus"][0]["model"] = "[link=http://x]NVIDIA H100 80GB HBM3[/link]\x1b[31m"
    assert sim.state.apply(topic("sim", "sim-000", "inventory"), json.dumps(inv).encode(), sim.now)
    app = make_app(sim)
    async with app.run_test(size=SIZE) as pilot:
        t = table(app)
        row = column_plain(t, "node").index("sim-000")
        assert column_plain(t, "rack")[row] == clean("[red]x[/red]\x1b[2J", 24)
        assert column_plain(t, "rack")[row].startswith("[red]x[/red]\\x1b")
        t.move_cursor(row=row)
        await pilot.press("enter")
        await pilot.pause()
        info = plain(app.screen.query_one("#node-info", Static))
        assert "owner=[bold]boss[/bold]" in info and "\\x1b]0;pwned\\x07\\u202e" in info
        assert "\x1b" not in info and "\u202e" not in info
        sections = plain(app.screen.query_one("#node-sections", Static))
        assert "[link=http://x]" in sections and "\x1b" not in sections


def _inventory_json(view) -> dict:
    from nvmon.loadgen.boards import Board, NodeIdentity

    b = Board("hgx-h100,seed=1", interval_s=1.0, clock_start=T0)
    try:
        payload, _ = b.inventory_for(NodeIdentity("sim", view.node, "rack-00", {}))
        return json.loads(payload)
    finally:
        b.close()


async def test_broker_lost_banner_without_a_broker():
    port = free_port()  # nobody listens here
    app = NvmonApp(MqttSettings(url=f"mqtt://127.0.0.1:{port}", timeout_s=1), source="nowhere", refresh_s=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(lambda: app.header_info is not None and app.header_info.error, 30, "the connection error")
        await wait_until(lambda: app.screen.query_one("StatusHeader").has_class("-lost"), 30, "the banner")
        await pilot.pause(0.3)
        banner = app.screen.query_one("#banner", Static)
        assert "broker lost" in plain(banner) and "reconnecting" in plain(banner)


@pytest.mark.parametrize("key", ["q", "ctrl+c"])
async def test_quit_keys(key):
    app = make_app(shared_showcase())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(key)
        await pilot.pause()
        assert not app.is_running


def test_cli_errors_are_one_line(monkeypatch):
    from click.testing import CliRunner

    from nvmon.cli.tui import tui_command

    r = CliRunner().invoke(tui_command, ["--broker", "http://example"])
    assert r.exit_code == 2 and "expected mqtt://HOST:PORT" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(tui_command, ["--cluster", "bad/name"])
    assert r.exit_code == 2 and "1-64 characters" in r.output
    r = CliRunner().invoke(tui_command, ["--broker", "mqtt://h", "--ca-file", "x.pem"])
    assert r.exit_code == 2 and "TLS options need an mqtts:// URL" in r.output
    monkeypatch.setenv("NVMON_BROKER", "mqtt://broker.example:1884")
    seen = {}
    monkeypatch.setattr("nvmon.tui.app.NvmonApp.run", lambda self: seen.update(url=self.settings.url))
    r = CliRunner().invoke(tui_command, [])
    assert r.exit_code == 0 and seen == {"url": "mqtt://broker.example:1884"}


async def test_a_refresh_that_lands_while_a_screen_is_composing_waits_for_it():
    """The refresh timer can fire between a push and the new screen's compose: that screen is
    on top with no widgets yet (this failed CI once, as NoMatches from the node screen)."""
    sim = shared_showcase()
    app = make_app(sim)
    async with app.run_test(size=SIZE) as pilot:
        app.open_node(("sim", "sim-005"))
        app.refresh_data()  # before the node screen has composed
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen)
        assert "all-to-all through NVSwitch" in plain(app.screen.query_one("#node-sections", Static))
