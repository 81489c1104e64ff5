"""The TUI at 80×24 (issue 15): the problem columns fit without scrolling, sideways scrolling moves by
whole columns, the cursor stays on screen after a re-filter, and the sort puts the worst first.
Driven with Pilot on the deterministic simulated fleet; what is checked is the text on screen."""

from __future__ import annotations

import io
import time

from mqtt_broker import Broker, needs_mosquitto, wait_until
from rich.console import Console
from textual.widgets import DataTable
from textual.widgets._toast import Toast
from tuifleet import OFFLINE, STALE, column_plain, make_app, shared_showcase

from nvmon.loadgen.state import SHOWCASE_FAULTS, simulated_state
from nvmon.tui.app import NvmonApp
from nvmon.tui.screens.fleet import FleetScreen
from nvmon.tui.screens.node import NodeScreen
from nvmon.tui.widgets.fleet_table import FleetTable
from nvmon.wire.mqtt import MqttSettings

SMALL = (80, 24)


def screen_text(app) -> list[str]:
    """The terminal's lines as plain text (what a user sees, scrolled as it is)."""
    width = app.size.width
    console = Console(width=width, file=io.StringIO(), color_system=None, record=True, legacy_windows=False)
    console.print(app.screen._compositor.render_update(full=True))
    return [line.rstrip() for line in console.export_text().splitlines()][: app.size.height]


def row_of(lines: list[str], node: str) -> str:
    return next(line for line in lines if line.startswith(f" {node} "))


async def test_problem_columns_fit_80_columns():
    sim = shared_showcase()
    app = make_app(sim)
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        lines = screen_text(app)
        assert all(len(line) <= 80 for line in lines)
        assert lines[2].split() == ["Node", "▲", "Status", "Alerts", "Links", "PCIe", "IB", "GPU", "kW", "Hottest"]
        # Every planted fault of the showcase fleet is named on its row, no scrolling.
        marks = {1: "⚠ pairs", 2: "⚠ x8 GPU3", 3: "⚠ 100G", 4: "⚠cap1", 5: "✗ 143/144", OFFLINE: "✗ lost",
                 STALE: "⚠ stale", 9: "⚠92°C G6"}
        for i, mark in marks.items():
            assert mark in row_of(lines, sim.names[i]), (mark, row_of(lines, sim.names[i]))
        healthy = row_of(lines, sim.names[0])
        assert "✓ online" in healthy and "✓ 144/144" in healthy and "✓ 8/8" in healthy and "68°C G3" in healthy
        assert "cols 2-8/11 →" in lines[-2]  # the status line says more columns are to the right
        footer = lines[-1]
        assert "q Quit" in footer and "? Help" in footer and "p Problems" in footer


async def test_sideways_scroll_moves_by_columns():
    app = make_app(shared_showcase())
    async with app.run_test(size=SMALL) as pilot:
        t = app.screen.query_one(FleetTable)
        await pilot.press("right")
        assert screen_text(app)[2].split()[:4] == ["Node", "▲", "Alerts", "Links"]  # Status went, whole
        await pilot.press("right", "right")
        assert screen_text(app)[2].split()[:3] == ["Node", "▲", "PCIe"]
        await pilot.press("shift+end")
        lines = screen_text(app)
        assert lines[2].split()[-1] == "Rack" and "8×H100 80GB HBM3 rack-00" in lines[3]
        assert lines[3].startswith(" sim-000 ")  # the node column stays
        assert "cols 6-11/11 ←" in lines[-2]
        x = t.scroll_offset.x
        await pilot.press("right")  # nothing further
        assert t.scroll_offset.x == x
        await pilot.press("left")
        assert screen_text(app)[2].split()[:3] == ["Node", "▲", "PCIe"]
        await pilot.press("shift+home")
        assert t.scroll_offset.x == 0 and screen_text(app)[2].split()[2] == "Status"


async def test_cursor_stays_in_view_after_refilter_and_end():
    """201 nodes: `p`, then `p` and End at once. The cursor's row must be on screen and Enter opens it."""
    sim = simulated_state(201, racks=10, faults=SHOWCASE_FAULTS)
    app = make_app(sim)
    async with app.run_test(size=SMALL) as pilot:
        t = app.screen.query_one(FleetTable)
        await pilot.press("p")
        assert t.row_count < 201
        # `p` and End in one go: End lands before the table's new height reaches the layout
        app.screen.action_problems()
        t.action_cursor(10**9)
        assert t.cursor_row == 200
        await pilot.pause()
        lines = screen_text(app)
        assert any(line.startswith(f" {sim.names[200]} ") for line in lines), "\n".join(lines)
        assert t.scroll_offset.y <= 200 < t.scroll_offset.y + t.scrollable_content_region.height - 1
        await pilot.press("home")
        assert t.cursor_row == 0 and t.scroll_offset.y == 0
        # a wheel scroll away from the cursor stays put when the rows are re-sorted (a tick)
        t.scroll_to(y=100, animate=False, immediate=True)
        await pilot.pause()
        t.resort(app.now())
        await pilot.pause()
        assert t.cursor_row == 0 and t.scroll_offset.y == 100
        await pilot.press("p")
        app.screen.action_problems()
        t.action_cursor(10**9)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen) and app.screen.key[1] == sim.names[200]


async def test_first_sort_puts_the_worst_first():
    sim = shared_showcase()
    app = make_app(sim)
    async with app.run_test(size=(160, 48)) as pilot:
        t = app.screen.query_one(FleetTable)
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        for key, first in (("links", {5}), ("alerts", {5}), ("pcie", {2}), ("ib", {3}), ("power", {4}),
                           ("temp", {9})):
            t.sort_column, t.reverse = "node", False
            while t.sort_column != key:
                await pilot.press("s")
            assert t.reverse, key  # ▼: worst first
            nodes = column_plain(t, "node")
            assert {sim.names.index(nodes[0])} == first, (key, nodes)
            if key == "links":  # a pairs box (a warning) ranks before every healthy node
                assert nodes[1] == sim.names[1], nodes
        status = screen.query_one("#fleet-status").render()
        assert "worst first" in str(status)


async def test_node_screen_gpu_table_and_findings_fit_80_columns():
    """The GPU table keeps links and events at 80 columns; a GPU fabric finding is explained on the
    node screen (its code, and what to do), though every NVLink reads Active."""
    sim = simulated_state(2, faults={1: "fabric=in_progress"})
    app = make_app(sim)
    async with app.run_test(size=(80, 60)) as pilot:
        t = app.screen.query_one(FleetTable)
        assert column_plain(t, "links")[1] == "✗ fabric"
        t.move_cursor(1)
        await pilot.press("enter")
        await pilot.pause()
        lines = screen_text(app)
        text = "\n".join(lines)
        assert all(len(line) <= 80 for line in lines)
        head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["GPU", "util"])
        assert lines[head].split()[-2:] == ["links", "events"], lines[head]
        assert "✓ 18/18" in lines[head + 2]  # a GPU row, its links cell on screen
        found = next(i for i, line in enumerate(lines) if line.strip() == "Findings this tick")
        assert lines[found + 1].startswith(" ✗ fabric.not_ready GPU fabric not configured: NVLink"), lines[found + 1]
        assert lines[found + 2].startswith(" " * 19)  # the runbook wraps under its column


async def test_alerts_screen_at_80_columns_summary_hanging_hint():
    app = make_app(shared_showcase())
    async with app.run_test(size=SMALL) as pilot:
        await pilot.press("a")
        await pilot.pause()
        lines = screen_text(app)
        assert all(len(line) <= 80 for line in lines)
        assert lines[2].split() == ["Sev", "Node", "Code", "Where", "State", "Summary"]  # no empty Ack column
        assert lines[3].endswith("…") and "GPU 2 NVLink 5" in lines[3]  # cut, and says so
        # the line under the table wraps with a hanging indent: continuation lines start under the text
        hint = next(i for i, line in enumerate(lines) if line.startswith(" runbook:"))
        assert lines[hint + 1].startswith(" " * 10) and lines[hint + 1].strip()
        await pilot.press("x")
        await pilot.pause()
        lines = screen_text(app)
        assert "firing 2s muted" in lines[3]  # the word the docs use, whole
        assert lines[2].split()[-1] == "Summary"  # Ack / silence comes after it, off to the right


async def test_help_fits_160x48_and_lists_the_sideways_keys():
    app = make_app(shared_showcase(), notes=("planted: gpu-04 pairs",))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        box = app.screen.query_one("#help-box")
        assert box.max_scroll_y == 0  # everything on screen
        text = "\n".join(screen_text(app))
        for needle in ("← →", "shift+Home / shift+End", "THIS FLEET", "planted: gpu-04 pairs", "Rack"):
            assert needle in text, needle


async def test_notice_line_under_the_fleet_table():
    app = make_app(shared_showcase(), notice="planted: 04 pairs, 07 x8")
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        lines = screen_text(app)
        assert lines[-2] == "planted: 04 pairs, 07 x8" and "shown" in lines[-3]


@needs_mosquitto
async def test_silence_toast_is_whole_at_80x24(tmp_path):
    """`x` through a real broker: the notification (the longest the TUI gives) reads whole at 80×24."""
    from test_tui_controls import publish_alerts

    now = time.time()
    with Broker(tmp_path) as broker:
        await publish_alerts(broker.url, "t", "n1", now)
        app = NvmonApp(MqttSettings(url=broker.url), cluster="t", source="toast test", refresh_s=0.1)
        async with app.run_test(size=SMALL, notifications=True) as pilot:
            await wait_until(lambda: app.subscriber.status.connected, 30, "the subscriber")
            await pilot.press("a")
            await wait_until(lambda: app.screen.query_one(DataTable).row_count == 2, 30, "the node's alerts")
            await pilot.press("k")
            await wait_until(lambda: len(app._notifications) == 1, 30, "the ack's notification")
            await pilot.press("x")
            await wait_until(lambda: len(list(app.screen.query(Toast))) == 2, 30, "both toasts")
            await pilot.pause(0.3)
            notes = {n.message for n in app._notifications}
            assert any(m.startswith("silenced nvlink.link_down on n1 for 2 h") and len(m) > 80 for m in notes), notes
            for toast in app.screen.query(Toast):  # both on screen, each whole
                region = toast.region
                assert region.right <= 80 and region.y >= 0 and region.bottom <= 24, region
                shown = " ".join(" ".join("".join(seg.text for seg in line).strip(" ▌").split())
                                 for line in toast.render_lines(region.reset_offset))
                assert any(" ".join(m.split()) in shown for m in notes), shown


async def test_scrollbar_thumbs_are_whole_cells():
    """No eighth-cell thumb ends (▂ ▇ ▏): they read as stray glyphs beside the content in tmux."""
    app = make_app(shared_showcase())
    async with app.run_test(size=SMALL) as pilot:
        app.screen.query_one(FleetTable).move_cursor(5)
        await pilot.press("enter")
        await pilot.pause()
        body = app.screen.query_one("#node-body")
        for _ in range(3):
            bar = body.vertical_scrollbar
            assert body.show_vertical_scrollbar and bar.size.width == 1
            options = app.console.options.update(width=1, height=bar.size.height)
            text = "".join(seg.text for seg in app.console.render(bar.render(), options))
            assert text.strip() == "" and len(text) >= bar.size.height, repr(text)
            await pilot.press("pagedown")


async def test_alerts_ack_silence_column_on_screen_when_wide():
    app = make_app(shared_showcase())
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("a", "x")
        await pilot.pause()
        lines = screen_text(app)
        assert lines[2].split()[-3:] == ["Ack", "/", "silence"] and lines[3].endswith("muted (local)")
