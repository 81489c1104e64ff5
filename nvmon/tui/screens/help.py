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
from nvmon.tui.screens.alerts import SILENCE_S, duration_words
from nvmon.tui.text import BAD, INFO, OK, SYMBOL, WARN, clean

KEYS = (
    ("everywhere", (("?", "this help"), ("a", "alerts across the fleet"), ("Esc", "back"), ("q / Ctrl-C", "quit"))),
    ("fleet", (("↑ ↓ PgUp PgDn Home End", "move"), ("← →", "scroll sideways by a column (the node column stays)"),
               ("shift+Home / shift+End", "first / last columns"), ("Enter / click", "open the node"),
               ("/", "filter (Esc clears)"),
               ("s / click a header", "sort by the next column / that column: worst (largest) first, ▼"),
               ("r", "reverse the sort"), ("g", "group: by rack (power vs budget), by NVLink domain, off"),
               ("p", "problems only"))),
    ("node", (("Esc", "back to the fleet"), ("↑ ↓ PgUp PgDn Home End", "scroll"), ("← →", "scroll sideways"))),
    ("alerts", (("Enter", "open the alert's node"), ("k", "acknowledge the episode (shared on the broker)"),
                ("x", "silence node + code for {silence} (shared on the broker)"))),
)
FILTER_HELP = ("Filter words must all match: text in node, cluster, rack, model or labels (key=value), "
               "or one of: online, stale, offline, problem.")


def help_renderable(notes: tuple[str, ...] = (), *, silence: str = "2 h", dropped: int = 0,
                    last_drop: str | None = None) -> Table:
    """Keys, symbols, columns; `notes` (the embedding program's, e.g. what the demo planted) first,
    then the messages this view dropped and why the last one was (whole, where the header cuts it).
    `silence`: how long `x` silences. Three columns (section, key, what), one line each, so it fits
    without scrolling at 160×48."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold underline", no_wrap=True)
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()

    def section(name: str, rows) -> None:
        for i, (key, what) in enumerate(rows):
            grid.add_row(Text(name if i == 0 else ""), key if isinstance(key, Text) else Text(key),
                         what if isinstance(what, Text) else Text(what))

    if notes:
        section("THIS FLEET", [("", clean(note, 200)) for note in notes])
    if dropped:
        section("DROPPED", [(f"{dropped} messages", "refused by this view: off the wire contract, over a cap, "
                                                    "or untrusted"), ("last", clean(last_drop or "?", 300))])
    for screen, keys in KEYS:
        section(screen.upper(), [(k, w.format(silence=silence)) for k, w in keys])
    for style, what in ((OK, "healthy"), (WARN, "degraded / worth a look (yellow)"), (BAD, "fault (red)"),
                        (INFO, "information")):
        section("SYMBOLS" if style == OK else "", [(Text(SYMBOL[style], style=style), what)])
    section("COLUMNS", [(c.label, c.help) for c in COLUMNS])
    section("FILTER", [("/", FILTER_HELP)])
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
            info, app = self.app.header_info, self.app
            yield Static(help_renderable(app.notes, silence=duration_words(min(SILENCE_S, app.max_silence_s)),
                                         dropped=info.dropped if info else 0, last_drop=info.last_drop if info else None),
                         id="help-body")
