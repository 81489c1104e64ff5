"""The fleet screen: one row per node, sortable, filterable, grouped by rack on demand."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from nvmon.tui.rows import BY_KEY, COLUMN_KEYS, Column
from nvmon.tui.text import DIM, clean
from nvmon.tui.widgets.fleet_table import FleetTable
from nvmon.tui.widgets.fleet_groups import TITLES
from nvmon.tui.widgets.header import StatusHeader


def order_words(col: Column, descending: bool) -> str:
    """What ▲ / ▼ mean for this column, in words."""
    if not col.descending:  # names
        return "Z→A" if descending else "A→Z"
    if col.key in ("nvlink",):
        return "highest first" if descending else "lowest first"
    return "worst first" if descending else "best first"


class FleetScreen(Screen):
    BINDINGS = [
        Binding("slash", "filter", "Filter"),
        Binding("s", "next_sort", "Sort"),
        Binding("r", "reverse", "Reverse"),
        Binding("g", "group", "Group"),
        Binding("p", "problems", "Problems"),
        Binding("a", "app.alerts", "Alerts"),
        Binding("question_mark", "app.help", "Help"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, rack_budget_w: float | None = None):
        super().__init__(name="fleet")
        self.rack_budget_w = rack_budget_w

    def compose(self) -> ComposeResult:
        yield StatusHeader("fleet")
        yield FleetTable(self.app.state, rack_budget_w=self.rack_budget_w, id="fleet-table")
        yield Static(id="fleet-status")
        if self.app.notice:  # e.g. what the demo planted where
            yield Static(Text(clean(self.app.notice, 400), style=DIM, no_wrap=True, overflow="ellipsis", end=""),
                         id="fleet-notice")
        yield Input(placeholder="filter: words in node/rack/model/labels; online stale offline problem",
                    id="fleet-filter")
        yield Footer(compact=True)

    @property
    def table(self) -> FleetTable:
        return self.query_one(FleetTable)

    def on_mount(self) -> None:
        self.query_one("#fleet-filter").display = False
        self.refresh_data(self.app.now())
        self.table.focus()

    def on_screen_resume(self) -> None:
        self.refresh_data(self.app.now())

    def refresh_data(self, now: float) -> None:
        if not self.query(FleetTable):  # the redraw timer came between mounting the screen and its widgets
            return
        self.table.sync(now)
        self._show_status()

    def on_fleet_table_scrolled(self, message) -> None:
        if self.query("#fleet-status"):
            self._show_status()

    def _show_status(self) -> None:
        t = self.table
        col = BY_KEY[t.sort_column]
        line = Text(no_wrap=True, overflow="ellipsis", end="")
        line.append(f" {len(t._visible)}/{len(t.state.nodes)} shown", "bold")
        line.append(f" · sort {col.label} {'▼' if t.reverse else '▲'} {order_words(col, t.reverse)}", DIM)
        first, last = t.columns_shown()
        if t.max_scroll_x:  # some columns are off screen: say which are shown, and how to reach the rest
            arrows = ("←" if t.scroll_offset.x else "") + ("→" if t.scroll_offset.x < t.max_scroll_x else "")
            line.append(f" · cols {first}-{last}/{len(COLUMN_KEYS)} {arrows}", DIM)
        if t.grouped:
            line.append(f" · by {TITLES[t.group_by]}", DIM)
        if t.problems_only:
            line.append(" · problems only", "yellow")
        if t.query_text.strip():
            line.append(" · filter ", DIM)
            line.append(clean(t.query_text, 60), "bold")
        self.query_one("#fleet-status", Static).update(line)

    # --- actions -------------------------------------------------------------------------------

    def action_open_node(self) -> None:
        key = self.table.selected
        if key is not None and key in self.app.state.nodes:
            self.app.open_node(key)

    def on_fleet_table_open_node(self, message: FleetTable.OpenNode) -> None:
        self.app.open_node(message.key)

    def on_fleet_table_header_clicked(self, event: FleetTable.HeaderClicked) -> None:
        key = event.column
        if key in BY_KEY:
            t = self.table
            if t.sort_column == key:
                t.reverse = not t.reverse
            else:
                t.sort_column, t.reverse = key, BY_KEY[key].descending
            t.resort(self.app.now())
            self._show_status()

    def action_next_sort(self) -> None:
        t = self.table
        t.sort_column = COLUMN_KEYS[(COLUMN_KEYS.index(t.sort_column) + 1) % len(COLUMN_KEYS)]
        t.reverse = BY_KEY[t.sort_column].descending  # worst (or largest) first
        t.resort(self.app.now())
        self._show_status()

    def action_reverse(self) -> None:
        self.table.reverse = not self.table.reverse
        self.table.resort(self.app.now())
        self._show_status()

    def action_group(self) -> None:
        """Off → by rack → by NVLink domain (only when some node reports one) → off."""
        t = self.table
        if not t.grouped:
            t.grouped, t.group_by = True, "rack"
        elif t.group_by == "rack" and any(v.cluster_uuid for v in t.state.nodes.values()):
            t.group_by = "domain"
        else:
            t.grouped = False
        t.regroup(self.app.now())
        self._show_status()

    def action_problems(self) -> None:
        self.table.problems_only = not self.table.problems_only
        self.table.refilter(self.app.now())
        self._show_status()

    def action_filter(self) -> None:
        box = self.query_one("#fleet-filter", Input)
        box.display = True
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#fleet-filter", Input)
        box.value = ""
        box.display = False
        self.table.query_text = ""
        self.table.refilter(self.app.now())
        self.table.focus()
        self._show_status()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.table.query_text = event.value
        self.table.refilter(self.app.now())
        self._show_status()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        box = self.query_one("#fleet-filter", Input)
        box.display = bool(box.value)
        self.table.focus()

    def on_key(self, event) -> None:
        if event.key == "escape" and self.focused is self.query_one("#fleet-filter", Input):
            event.stop()
            self.action_clear_filter()
