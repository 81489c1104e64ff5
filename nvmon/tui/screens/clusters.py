"""The cluster overview (`nvmon tui --cluster a,b` or `--cluster '+'`): one row per cluster, built from
the clusters' retained summaries (nvmon/v1/<cluster>/@summary), not from their nodes' samples.

Enter opens the cluster's own fleet screen (the app subscribes to that cluster's node topics only
then); Escape there comes back here. Whether a cluster is in reach is the fleet layer's judgement
(`ClusterBoard.reach`, the same one that raises `cluster.unreachable`); this screen only shows it.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from nvmon.tui.text import BAD, DIM, INFO, LEVEL_STYLE, OK, SEVERITY_STYLE, SYMBOL, WARN, age, clean, kw
from nvmon.tui.widgets.header import StatusHeader
from nvmon.wire.summary import ClusterSummary

COLUMNS = (("cluster", "CLUSTER"), ("reach", "REACH"), ("nodes", "NODES"), ("alerts", "ALERTS"),
           ("power", "POWER kW"), ("worst", "WORST NODES"))
WORST_SHOWN = 3
_STATE = {"offline": (BAD, "offline"), "stale": (WARN, "stale"), "online": (DIM, "")}


def reach_cell(reach, stale_after_s: float) -> Text:
    if reach.state == "live":
        return Text(f"{SYMBOL[OK]} live {age(reach.age_s)}", style=OK, no_wrap=True, end="")
    if reach.state == "waiting":
        return Text("… waiting", style=DIM, no_wrap=True, end="")
    since = "never heard" if reach.age_s is None else f"{age(reach.age_s)} silent"
    return Text(f"{SYMBOL[BAD]} unreachable · {since}", style=BAD, no_wrap=True, end="")


def nodes_cell(s: ClusterSummary | None) -> Text:
    t = Text(no_wrap=True, end="")
    if s is None:
        return t.append("–", DIM)
    n = s.nodes
    t.append(f"{n.online}/{n.total}", "bold")
    t.append(f" {SYMBOL[WARN]}{n.stale}", WARN if n.stale else DIM)
    t.append(f" {SYMBOL[BAD]}{n.offline}", BAD if n.offline else DIM)
    return t


def alerts_cell(s: ClusterSummary | None) -> Text:
    t = Text(no_wrap=True, end="")
    if s is None:
        return t.append("–", DIM)
    by = s.alerts_by_severity()
    for sev, sym in (("critical", SYMBOL[BAD]), ("warning", SYMBOL[WARN]), ("info", SYMBOL[INFO])):
        t.append(f"{sym}{by[sev]} ", SEVERITY_STYLE[sev] if by[sev] else DIM)
    if s.alert_kinds_omitted:
        t.append("+", DIM)
    return t


def power_cell(s: ClusterSummary | None) -> Text:
    t = Text(no_wrap=True, end="")
    if s is None or s.power_w is None:
        return t.append("–", DIM)
    t.append(kw(s.power_w))
    levels = [r.level for r in s.racks if r.level in ("over", "near")]
    if "over" in levels:
        t.append(f" {SYMBOL[BAD]}{levels.count('over')} rack over", LEVEL_STYLE["over"])
    elif levels:
        t.append(f" {SYMBOL[WARN]}{len(levels)} near", LEVEL_STYLE["near"])
    return t


def worst_cell(s: ClusterSummary | None) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis", end="")
    if s is None:
        return t
    for i, w in enumerate(s.worst[:WORST_SHOWN]):
        if i:
            t.append(", ", DIM)
        t.append(clean(w.node, 64), "bold")
        style, word = _STATE[w.state]
        if word:
            t.append(f" {word}", style)
        elif w.code:
            t.append(f" {clean(w.code, 64)}", SEVERITY_STYLE.get(w.severity or "", DIM))
    if len(s.worst) > WORST_SHOWN:
        t.append(" …", DIM)
    return t


class ClustersScreen(Screen):
    """See the module docstring. Reads `app.board` (a ClusterBoard); Enter → `app.open_cluster`."""

    BINDINGS = [
        Binding("enter", "open_cluster", "Open cluster"),
        Binding("a", "app.alerts", "Alerts"),
        Binding("question_mark", "app.help", "Help"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self):
        super().__init__(name="clusters")
        self._drawn: dict[str, tuple] = {}

    def compose(self) -> ComposeResult:
        yield StatusHeader("clusters")
        yield DataTable(id="clusters-table", cursor_type="row", zebra_stripes=False)
        yield Static(id="clusters-status")
        yield Footer(compact=True)

    @property
    def table(self) -> DataTable:
        return self.query_one(DataTable)

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.table.add_column(label, key=key)
        self.refresh_data(self.app.now())
        self.table.focus()

    def on_screen_resume(self) -> None:
        self.refresh_data(self.app.now())

    def refresh_data(self, now: float) -> None:
        if not self.query(DataTable):
            return
        board, t = self.app.board, self.table
        names = sorted(board.clusters)
        for gone in [c for c in self._drawn if c not in board.clusters]:
            t.remove_row(gone)
            del self._drawn[gone]
        unreachable = 0
        for c in names:
            view = board.clusters[c]
            r = board.reach(c, now)
            unreachable += r.state == "unreachable"
            s = view.summary
            cells = (Text(clean(c, 64), style="bold", no_wrap=True, end=""), reach_cell(r, r.stale_after_s),
                     nodes_cell(s), alerts_cell(s), power_cell(s), worst_cell(s))
            plain = tuple(x.plain for x in cells)
            if c not in self._drawn:
                t.add_row(*cells, key=c)
            elif self._drawn[c] != plain:
                for (key, _), cell in zip(COLUMNS, cells):
                    t.update_cell(c, key, cell)
            self._drawn[c] = plain
        if list(self._drawn) != names:
            t.sort("cluster", key=lambda cell: cell.plain)
            self._drawn = {c: self._drawn[c] for c in names}
        line = Text(no_wrap=True, overflow="ellipsis", end="")
        line.append(f" {len(names)} clusters", "bold")
        if unreachable:
            line.append(f" · {SYMBOL[BAD]} {unreachable} unreachable", BAD)
        line.append(" · from their summaries; Enter: the cluster's nodes, live", DIM)
        self.query_one("#clusters-status", Static).update(line)

    def selected(self) -> str | None:
        t = self.table
        if not t.row_count:
            return None
        try:
            return t.coordinate_to_cell_key(t.cursor_coordinate).row_key.value
        except Exception:  # no row under the cursor
            return None

    def action_open_cluster(self) -> None:
        c = self.selected()
        if c is not None:
            self.app.open_cluster(c)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.app.open_cluster(event.row_key.value)
