"""The alerts screen: active alerts across the fleet, most severe first, then those this view saw
resolve. `k` acks the selected alert's episode and `x` silences its node + code for SILENCE_S (or
the app's `max_silence_s`, `[alerts] max_silence_h` of `--config`, when shorter), both published in the cluster's shared set on the app's broker (nvmon.alerts.shared), which every
daemon and `nvmon fleet` of the cluster honours. Without a broker they are marks in this view only.

With a broker the screen shows the shared set as it is (the app reads the clusters' control
topics): the "Ack / silence" column says who acked an alert's episode and when, and which shared
silence mutes it until when, whoever made them (`nvmon alerts ack/silence --broker`, another
TUI); the title counts the silences in force; the line under the table gives the details."""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.coordinate import Coordinate
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from nvmon.alerts.model import iso
from nvmon.codes import runbook
from nvmon.tui.alertlog import AlertLog, Row, Shared
from nvmon.tui.text import DIM, OK, SEVERITY_STYLE, SYMBOL, age, clean, literal
from nvmon.tui.widgets.header import StatusHeader

NOT_CONNECTED = "no broker: marked in this view only"
TITLE = "alerts"
# (key, label, most width). Columns are as wide as what they show, Summary takes the rest of the screen
# (cut with "…": the line under the table has all of it), and Ack / silence comes after it, there only
# while some alert has a mark (the State column ends in `ack` / `muted` too), off to the right on a
# narrow screen.
COLUMNS = (("sev", "Sev", 6), ("node", "Node", 14), ("code", "Code", 18), ("where", "Where", 12),
           ("state", "State", 18), ("summary", "Summary", 0), ("shared", "Ack / silence", 32))
SUMMARY_MIN = 16
SUMMARY_WIDE = 40  # Ack / silence is on screen beside Summary when Summary keeps at least this much
SILENCE_S = 2 * 3600.0  # `x`: silence the selected alert's node + code this long


def duration_words(seconds: float) -> str:
    """'2 h', '90 min', '45 s': how long `x` silences."""
    for unit, name in ((3600, "h"), (60, "min")):
        if seconds >= unit and seconds % unit == 0:
            return f"{seconds / unit:g} {name}"
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def hint(alert) -> str:
    labels = alert.labels or {}
    # An alert's `runbook` / `runbook_url` label wins over the code's own runbook.
    return labels.get("runbook") or labels.get("runbook_url") or runbook(alert.code)


def where(alert) -> str:
    parts = []
    if alert.gpu is not None:
        parts.append(f"GPU{alert.gpu}")
    if alert.link is not None:
        parts.append(f"L{alert.link}")
    if alert.device is not None:
        parts.append(clean(alert.device, 24) + (f":{alert.port}" if alert.port is not None else ""))
    elif alert.port is not None:
        parts.append(f"port {alert.port}")
    return " ".join(parts)


def _when(ts: float) -> str:
    return (iso(ts) or "?")[:16].replace("T", " ") + "Z"


def shared_details(shared: Shared, now: float) -> str:
    """The hint line: `acked by bob at 2026-11-30 17:25Z (5m ago) · silenced by alice until
    2026-11-30 19:25Z (1h left; silence c1/ab12cd34: reseating)`."""
    parts = []
    if (a := shared.ack) is not None:
        parts.append(f"acked by {a.by or '?'} at {_when(a.acked_at)} ({age(now - a.acked_at)} ago)")
    if (s := shared.silence) is not None:
        note = f"; {s.comment}" if s.comment else ""
        parts.append(f"silenced by {s.created_by or '?'} until {_when(s.ends_at)} ({age(s.ends_at - now)} left; "
                     f"silence {s.id}{note})")
    return " · ".join(parts)


class AlertsScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("k", "ack", "Ack"),
        Binding("x", "silence", "Silence"),
        Binding("enter", "open_node", "Node"),
        Binding("question_mark", "app.help", "Help"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self):
        super().__init__(name="alerts")
        self._rows: list[Row] = []
        self._shown: list[tuple] = []
        self._marks: dict[str, Shared] = {}
        self._layout: tuple = ()  # ((column key, width), ...) as laid out now

    def compose(self) -> ComposeResult:
        yield StatusHeader(TITLE)
        yield DataTable(id="alerts-table", cursor_type="row", cursor_foreground_priority="renderable")
        yield Static(id="alerts-hint")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_data(self.app.now())
        self.query_one(DataTable).focus()

    def on_resize(self, event) -> None:
        self.refresh_data(self.app.now())

    def _fit(self, t: DataTable, cells: list[dict[str, tuple[str, str]]]) -> bool:
        """Lay the columns out for the screen's width and these rows' cells; True when they changed."""
        shared = any(c["shared"][0] for c in cells)
        widths = {}
        for key, label, most in COLUMNS:
            if key == "summary" or (key == "shared" and not shared):
                continue
            widths[key] = min(most, max([len(label), *(cell_len(c[key][0]) for c in cells)]))
        before = [k for k in widths if k != "shared"]  # Ack / silence goes after Summary, off to the right
        used = sum(widths[k] for k in before) + 2 * t.cell_padding * (len(before) + 1) + 1  # + a 1-column scrollbar
        rest = (t.size.width or self.app.size.width) - used
        if shared and rest - widths["shared"] - 2 * t.cell_padding >= SUMMARY_WIDE:
            rest -= widths["shared"] + 2 * t.cell_padding  # room for both: Ack / silence on screen too
        widths["summary"] = max(SUMMARY_MIN, rest)
        layout = tuple((k, widths[k]) for k, _, _ in COLUMNS if k in widths)
        if layout == self._layout and t.columns:
            return False
        self._layout = layout
        t.clear(columns=True)
        for key, label, _ in COLUMNS:
            if key in widths:
                t.add_column(label, width=widths[key], key=key)
        return True

    def refresh_data(self, now: float) -> None:
        log: AlertLog = self.app.alert_log
        controls = getattr(self.app, "controls", None)
        self._show_title(controls, now)
        rows = AlertLog.active(self.app.state, log.fleet) + list(log.resolved)
        self._marks = log.shared_marks(rows, controls, self.app.state, now)
        t = next(iter(self.query(DataTable)), None)
        if t is None or not self.is_mounted:  # the app's redraw timer can come before compose / on_mount
            return
        keep = self._selected_ident()
        cells = [self._cells(r, now, log) for r in rows]
        if self._fit(t, cells):
            self._shown, self._rows = [], []
        keys = [k for k, _ in self._layout]
        summary_w = dict(self._layout)["summary"]
        for c in cells:  # cut to the column with "…"; the line under the table has it all
            text, style = c["summary"]
            c["summary"] = (text if cell_len(text) <= summary_w else set_cell_size(text, summary_w - 1) + "…", style)
        shown = [tuple(c[k] for k in keys) for c in cells]
        if shown == self._shown:
            return
        same_rows = [r.ident for r in rows] == [r.ident for r in self._rows] and t.row_count == len(rows)
        old = self._shown
        self._rows, self._shown = rows, shown
        if same_rows:  # only ages or marks moved: rewrite the cells that differ
            for i, (cells, before) in enumerate(zip(shown, old)):
                for col, (c, b) in enumerate(zip(cells, before)):
                    if c != b:
                        t.update_cell_at(Coordinate(i, col), Text(c[0], style=c[1], no_wrap=True, end=""))
        else:
            t.clear()
            for cells in shown:
                t.add_row(*(Text(c, style=s, no_wrap=True, end="") for c, s in cells))
            idents = [r.ident for r in rows]
            if keep in idents:
                t.move_cursor(row=idents.index(keep), animate=False)
        self._show_hint()

    def _cells(self, r: Row, now: float, log: AlertLog) -> dict[str, tuple[str, str]]:
        a = r.alert
        sev_style = SEVERITY_STYLE.get(a.severity, DIM)
        if r.resolved_at is not None:
            state = (f"{SYMBOL[OK]} resolved {age(now - r.resolved_at)}", OK)
            sev = (f"{SYMBOL[OK]} {clean(a.severity[:4])}", DIM)
        else:
            shared = self._marks.get(r.ident)
            acked = r.ident in log.acked or (shared is not None and shared.ack is not None)
            muted = r.ident in log.silenced or (shared is not None and shared.silence is not None)
            mark = " ack" if acked else " muted" if muted else ""
            state = (f"{clean(a.state, 8)} {age(now - a.since)}{mark}", DIM if mark else "")
            sev = (f"{SYMBOL.get(sev_style, '?')} {clean(a.severity[:4])}", sev_style)
        return {"sev": sev, "node": (r.key[1], "bold"), "code": (clean(a.code, 64), ""), "where": (where(a), ""),
                "state": state, "summary": (clean(a.summary, 512), DIM if r.resolved_at is not None else ""),
                "shared": (self._shared_cell(r, now, log), DIM)}

    def _shared_cell(self, r: Row, now: float, log: AlertLog) -> str:
        """`ack bob 5m · muted ab12cd34 1h`: who acked the episode how long ago, which shared
        silence mutes it for how much longer; `(local)` / `(sent)` for this view's own marks not
        (yet) in the shared set."""
        if r.resolved_at is not None:
            return ""
        shared = self._marks.get(r.ident) or Shared()
        pending = "(local)" if self.app.settings is None else "(sent)"
        parts = []
        if shared.ack is not None:
            parts.append(f"ack {clean(shared.ack.by or '?', 12)} {age(now - shared.ack.acked_at)}")
        elif r.ident in log.acked:
            parts.append(f"ack {pending}")
        if shared.silence is not None:
            parts.append(f"muted {str(shared.silence.id).split('/', 1)[-1]} {age(shared.silence.ends_at - now)}")
        elif r.ident in log.silenced:
            parts.append(f"muted {pending}")
        return " · ".join(parts)

    def _show_title(self, controls, now: float) -> None:
        """`alerts · 2 silences` with a broker: the shared silences in force (of --cluster, or all)."""
        title = TITLE
        if controls is not None:
            n = AlertLog.silence_count(controls, now, self.app.cluster)
            title = f"{TITLE} · {n} silence{'' if n == 1 else 's'}"
        header = next(iter(self.query(StatusHeader)), None)  # None: the redraw timer came before compose
        if header is not None and header.title != title:
            header.title = title
            header.show_info(self.app.header_info)

    def _selected_ident(self) -> str | None:
        t = self.query_one(DataTable)
        if not self._rows or not 0 <= t.cursor_row < len(self._rows):
            return None
        return self._rows[t.cursor_row].ident

    def _selected(self) -> Row | None:
        t = self.query_one(DataTable)
        return self._rows[t.cursor_row] if self._rows and 0 <= t.cursor_row < len(self._rows) else None

    def on_data_table_row_highlighted(self, event) -> None:
        self._show_hint()

    def on_data_table_row_selected(self, event) -> None:
        event.stop()
        self.action_open_node()

    def _show_hint(self) -> None:
        r = self._selected()
        if r is None:
            self.query_one("#alerts-hint", Static).update(Text(f" {SYMBOL[OK]} no active alerts", OK))
            return
        # label, text: wrapped text stays in its column (a hanging indent)
        grid = Table.grid(padding=(0, 1, 0, 0))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(ratio=1)
        h = hint(r.alert)

        def wrapped(text: object, style: str = "", limit: int = 512) -> Text:
            out = literal(text, style, limit)
            out.no_wrap = False
            return out

        grid.add_row(Text(f" {r.key[1]}"), wrapped(r.alert.summary))
        grid.add_row(Text(" runbook:"), wrapped(h or "(none: see docs/audit.md)", "" if h else DIM, 300))
        shared = self._marks.get(r.ident) if r.resolved_at is None else None
        if shared is not None:
            grid.add_row(Text(" shared:"), wrapped(shared_details(shared, self.app.now()), limit=400))
        self.query_one("#alerts-hint", Static).update(grid)

    def action_open_node(self) -> None:
        r = self._selected()
        if r is not None and r.key in self.app.state.nodes:
            self.app.open_node(r.key)

    def _mark(self, which: str) -> None:
        r = self._selected()
        if r is None or r.resolved_at is not None:
            return
        log: AlertLog = self.app.alert_log
        marks = log.acked if which == "ack" else log.silenced
        if self.app.settings is not None:
            self.run_worker(self._share(which, r), name=f"nvmon.tui.{which}", group="share", exit_on_error=False)
            return
        marks.symmetric_difference_update({r.ident})
        verb = {"ack": "acknowledged", "silence": "silenced"}[which]
        self.notify(f"{verb if r.ident in marks else 'un' + verb}: {NOT_CONNECTED}", title=which, markup=False)
        self.refresh_data(self.app.now())

    async def _share(self, which: str, r: Row) -> None:
        """Publish the ack or silence in the cluster's shared set; notify the outcome either way."""
        import getpass

        from nvmon.alerts.shared import shared_ack, shared_silence, update_shared
        from nvmon.wire.mqtt import describe_error

        cluster, node = r.key
        a, now = r.alert, self.app.now()
        by = getpass.getuser()
        if r.fleet and (which == "ack" or (cluster, node) not in self.app.state.nodes):
            # This view's episode of a fleet alert starts when the view first judged it, not when
            # nvmon fleet's did: an ack would name neither. A node's fleet alert can be silenced.
            self.notify(f"{a.code} is a fleet alert: {which} it with nvmon alerts {which} --broker (see nvmon alerts)",
                        title=which, severity="error", markup=False)
            return
        if which == "ack":
            if a.starts_at is None:
                self.notify(f"{node} does not publish episode starts (an older nvmon): ack it on the node",
                            title="ack", severity="error", markup=False)
                return
            change, done = shared_ack(a.fingerprint, a.starts_at, now, by), f"acknowledged {a.code} on {node}"
        else:
            length = min(SILENCE_S, self.app.max_silence_s)  # evaluators would cut a longer one anyway
            sid, change = shared_silence({"node": node, "code": a.code}, now, now + length, by, "nvmon tui")
            done = f"silenced {a.code} on {node} for {duration_words(length)} (silence {sid})"
        try:
            async with self.app.share_lock:  # one read-modify-write of the shared set at a time
                cs = await update_shared(self.app.settings, cluster, change, clock=self.app.now)
        except Exception as e:  # broker away, refused, unreadable set: say so, keep the view
            why = str(e) if isinstance(e, ValueError) else describe_error(e)
            self.notify(f"{which} not shared: {why}", title=which, severity="error", markup=False,
                        timeout=15)
            return
        log: AlertLog = self.app.alert_log
        (log.acked if which == "ack" else log.silenced).add(r.ident)
        self.notify(f"{done}; shared on {self.app.settings.url} (cluster {cluster}: {len(cs.silences)} "
                    f"silence{'s' * (len(cs.silences) != 1)}, {len(cs.acks)} ack{'s' * (len(cs.acks) != 1)})",
                    title=which, markup=False, timeout=8)
        self.refresh_data(self.app.now())

    def action_ack(self) -> None:
        self._mark("ack")

    def action_silence(self) -> None:
        self._mark("silence")
