"""The help screen (`?`): keys, columns and symbols."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from nvmon.tui.rows import COLUMNS
from nvmon.tui.text import BAD, INFO, OK, SYMBOL, WARN

KEYS = (
    ("everywhere", (("?", "this help"), ("a", "alerts across the fleet"), ("Esc", "back"), ("q / Ctrl-C", "quit"))),
    ("fleet", (("↑ ↓ PgUp PgDn", "move"), ("Enter / click", "open the node"), ("/", "filter (Esc clears)"),
               ("s / click a header", "sort by the next column / that column"), ("r", "reverse the sort"),
               ("g", "group by rack, with rack power against the budget"), ("p", "problems only"))),
    ("node", (("Esc", "back to the fleet"), ("↑ ↓ PgUp PgDn", "scroll"))),
    ("alerts", (("Enter", "open the alert's node"), ("k", "acknowledge the episode (shared on the broker)"),
                ("x", "silence node + code for 2 h (shared on the broker)"))),
)
FILTER_HELP = ("Filter words must all match: text in node, cluster, rack, model or labels (key=value), "
               "or one of: online, stale, offline, problem.")


def help_renderable() -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for screen, keys in KEYS:
        grid.add_row(Text(screen.upper(), style="bold underline"), Text(""))
        for key, what in keys:
            grid.add_row(Text(key), Text(what))
    grid.add_row(Text(""), Text(""))
    grid.add_row(Text("SYMBOLS", style="bold underline"), Text(""))
    for style, what in ((OK, "healthy"), (WARN, "degraded / worth a look (yellow)"), (BAD, "fault (red)"),
                        (INFO, "information")):
        grid.add_row(Text(SYMBOL[style], style=style), Text(what))
    grid.add_row(Text(""), Text(""))
    grid.add_row(Text("COLUMNS", style="bold underline"), Text(""))
    for c in COLUMNS:
        grid.add_row(Text(c.label), Text(c.help))
    grid.add_row(Text(""), Text(""))
    grid.add_row(Text("FILTER", style="bold underline"), Text(FILTER_HELP))
    return grid


class HelpScreen(ModalScreen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Close"),
        Binding("question_mark", "app.pop_screen", "Close"),
        Binding("q", "app.pop_screen", "Close"),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(Text("nvmon tui — keys and symbols (Esc closes)", style="bold"), id="help-title")
            yield Static(help_renderable(), id="help-body")
