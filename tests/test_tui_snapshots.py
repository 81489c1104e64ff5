"""SVG snapshots of the fleet, node, alerts and help screens at 80×24 and 160×48, on the deterministic
simulated fleet (fixed clock: no wall time anywhere on screen). Regenerate after an intended
change with `pytest tests/test_tui_snapshots.py --snapshot-update` and review the SVG diff."""

from __future__ import annotations

import pytest
from tuifleet import make_app, shared_showcase

SIZES = [(80, 24), (160, 48)]


async def _open_faulty_node(pilot) -> None:
    pilot.app.screen.query_one("FleetTable").move_cursor(row=5)  # sim-005: a link down, one erroring
    await pilot.press("enter")
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_fleet_screen(snap_compare, size):
    assert snap_compare(make_app(shared_showcase(), rack_budget_kw=30), terminal_size=size)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_fleet_screen_by_rack(snap_compare, size):
    assert snap_compare(make_app(shared_showcase(), rack_budget_kw=30), terminal_size=size, press=["g"])


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_node_screen(snap_compare, size):
    assert snap_compare(make_app(shared_showcase()), terminal_size=size, run_before=_open_faulty_node)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_alerts_screen(snap_compare, size):
    assert snap_compare(make_app(shared_showcase()), terminal_size=size, press=["a"])


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_help_screen(snap_compare, size):
    assert snap_compare(make_app(shared_showcase()), terminal_size=size, press=["question_mark"])
