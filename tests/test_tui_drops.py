"""The TUI says why it dropped the last message it dropped (issue 16, drop visibility): the header
adds `last drop: <reason>` after its `dropped` count, and the help screen (`?`) gives it whole,
escaped like everything from the broker; a control message refused counts as the latest when it
came last. Pilot over the real app; the fleet state fed real (bad) wire messages."""

from __future__ import annotations

from textual.widgets import Static
from tuifleet import header, make_app, plain, showcase

from nvmon.alerts.shared import SharedControls
from nvmon.tui.screens.help import HelpScreen
from nvmon.wire.contract import control_topic, topic

SIZE = (160, 48)


async def test_the_last_drop_is_in_the_header_and_whole_in_the_help():
    sim = showcase()
    app = make_app(sim)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert "dropped 0" in header(app) and "last drop" not in header(app)
        hostile = "nvmon/v1/sim/\x1b[2J\u202e/sample"  # a terminal escape and an RLO in a forged topic
        assert not sim.state.apply(hostile, b"{}", sim.now)
        app.refresh_data()
        await pilot.pause()
        assert sim.state.stats.last_drop.startswith("topic: bad cluster or node name in topic ")
        text = header(app)
        assert "dropped 1" in text and "│ last drop: topic: bad cluster or node name" in text
        assert "\x1b" not in text and "\u202e" not in text  # shown escaped, never acted on
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        body = plain(app.screen.query_one("#help-body", Static))
        assert "DROPPED" in body and "1 messages" in body
        line = next(ln for ln in body.splitlines() if " last " in ln)
        assert "topic 'nvmon/v1/sim/\\x1b[2J\\u202e/sample'" in line and "\x1b" not in line


async def test_a_refused_control_message_is_the_last_drop_when_it_came_last():
    sim = showcase()
    app = make_app(sim)
    app.controls = SharedControls()  # what a connected app reads the control topics into
    async with app.run_test(size=SIZE) as pilot:
        assert not sim.state.apply(topic("sim", "sim-001", "sample"), b"not json", sim.now)
        app.refresh_data()
        await pilot.pause()
        assert "last drop: json: " in header(app)
        assert not app.controls.apply(control_topic("sim"), b'{"schema":1,"ts":1,"cluster":"other","silences":[]}')
        app.refresh_data()
        await pilot.pause()
        text = header(app)
        assert "dropped 2" in text and text.rstrip().endswith("last drop: controls: cluster disagrees with the topic")
        assert not sim.state.apply(topic("sim", "sim-002", "status"), b"[]", sim.now)
        app.refresh_data()
        await pilot.pause()
        assert "dropped 3" in header(app) and "last drop: json: sim/sim-002/status: status: expected a JSON object" in \
            header(app)
