"""Shared by the TUI tests: a deterministic simulated fleet (fixed clock) and small helpers."""

from __future__ import annotations

import functools

from textual.coordinate import Coordinate

from nvmon.loadgen.state import SHOWCASE_FAULTS, SimState, simulated_state
from nvmon.tui.app import NvmonApp

OFFLINE, STALE = 7, 8  # node indices of the showcase fleet that end lost / silent


@functools.cache
def _showcase() -> SimState:
    return simulated_state(12, racks=2, faults=SHOWCASE_FAULTS, offline=[OFFLINE], stale=[STALE])


def showcase() -> SimState:
    """A fresh copy each time (apps may not mutate it, but tests that apply messages do)."""
    return simulated_state(12, racks=2, faults=SHOWCASE_FAULTS, offline=[OFFLINE], stale=[STALE])


def shared_showcase() -> SimState:
    """The same state for read-only tests (building one takes a few seconds)."""
    return _showcase()


def make_app(sim: SimState, **kw) -> NvmonApp:
    return NvmonApp(None, state=sim.state, clock=lambda: sim.now, source="simulated fleet (fixed clock)",
                    cluster=sim.cluster, **kw)


def cell_text(table, row: int, column: str) -> str:
    if hasattr(table, "row_cells"):  # the fleet table
        return table.row_cells(row)[column]
    keys = [c.key.value for c in table.ordered_columns]
    if column not in keys:  # a column the screen leaves out while empty (alerts: Ack / silence without marks)
        return ""
    return table.get_cell_at(Coordinate(row, keys.index(column))).plain


def column_plain(table, column: str) -> list[str]:
    return [cell_text(table, i, column) for i in range(table.row_count)]


def plain(widget) -> str:
    """What a Static shows, as plain text (its content printed by a colourless Rich console)."""
    import io

    from rich.console import Console

    console = Console(width=400, file=io.StringIO(), color_system=None, record=True, legacy_windows=False)
    console.print(widget.content)
    return console.export_text()


def header(app) -> str:
    """The screen's header line (`#info`), as plain text."""
    from textual.widgets import Static

    return plain(app.screen.query_one("#info", Static))
