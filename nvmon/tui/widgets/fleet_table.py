"""The fleet table: one row per node, kept in step with a `FleetState` incrementally.

A Line-API widget (`ScrollView`) rather than `DataTable`: DataTable re-renders every visible cell
through Rich whenever any cell changes (its caches are keyed on one global update count), which
costs hundreds of milliseconds a frame when a 1,000-node fleet ticks every second. Here each row
is one cached `Strip`, rebuilt only when that row's cells changed; a frame crops the visible ones.

`sync(now)` asks the state which nodes changed since the version it last drew
(`changed_since`) and drops those rows' cached cells; a row's cells (cheap `(text, style)`
tuples) and strip are computed again only when it is next painted, so a tick of the whole fleet
costs the rows on screen, not all of them. Sort keys and the filter are judged per changed row.
Rows are reordered (sort, rack groups, filter) by rewriting the order list; nothing is cleared.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from nvmon.fleet.state import FleetState, NodeKey
from nvmon.tui.rows import BY_KEY, COLUMNS, is_problem, matches, row_segments
from nvmon.tui.text import Segment as Cell
from nvmon.tui.widgets.fleet_groups import GROUP_PREFIX, domain_headers, group_of, rack_headers, sort_key
GAP = 1  # a space before every cell (and after the last): columns one space apart, to fit 80 columns
NODE_MIN, NODE_MAX = 6, 24  # the node column is as wide as the longest name, within these


def layout(node_width: int) -> list[int]:
    """Each column's cell width (its gap included), for a node column `node_width` wide."""
    return [(node_width if c.key == "node" else c.width) + GAP for c in COLUMNS]


WIDTHS = layout(COLUMNS[0].width)  # with the narrowest node column; a table's own is `FleetTable.widths`
TOTAL_WIDTH = sum(WIDTHS) + GAP


def row_key(key: NodeKey) -> str:
    return f"{key[0]}/{key[1]}"


def node_key(row: str) -> NodeKey | None:
    if row.startswith(GROUP_PREFIX):
        return None
    cluster, _, node = row.partition("/")
    return (cluster, node)


@lru_cache(maxsize=256)
def _style(spec: str) -> Style:
    return Style.parse(spec) if spec else Style()


def _cell(cells: tuple[Cell, ...], width: int) -> list[Segment]:
    """One cell: the gap, then its text padded and cropped to `width`, with an ellipsis when cut."""
    out = [Segment(" " * GAP)]
    used = 0
    for text, style in cells:
        if used >= width:
            break
        n = cell_len(text)
        if used + n > width:
            text, n = set_cell_size(text, width - used - 1) + "…", width - used
        out.append(Segment(text, _style(style)))
        used += n
    out.append(Segment(" " * (width - used)))
    return out


def row_strip(cells: tuple[tuple[Cell, ...], ...], widths: list[int] = WIDTHS) -> Strip:
    segments: list[Segment] = []
    if len(cells) == 1:  # a rack group header: one line across the columns
        segments += _cell(cells[0], sum(widths) - GAP)
    else:
        for w, c in zip(widths, cells):
            segments += _cell(c, w - GAP)
    segments.append(Segment(" " * GAP))
    return Strip(segments, sum(widths) + GAP)


class FleetTable(ScrollView, can_focus=True):
    """See the module docstring. `sort_column`, `reverse`, `grouped`, `group_by` ("rack" or
    "domain": nvmon.tui.widgets.fleet_groups), `query_text` and `problems_only` are plain
    attributes: change them, then call `resort` (`regroup` after `group_by`) or `refilter`."""

    COMPONENT_CLASSES = {"fleet-table--header", "fleet-table--cursor"}
    DEFAULT_CSS = """
    FleetTable { background: $surface; scrollbar-size-vertical: 1; scrollbar-size-horizontal: 0; }
    FleetTable > .fleet-table--header { background: $panel; text-style: bold; }
    FleetTable > .fleet-table--cursor { background: $accent 35%; }
    FleetTable:focus > .fleet-table--cursor { background: $accent 60%; }
    """
    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False), Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", show=False), Binding("pagedown", "page(1)", show=False),
        Binding("home", "cursor(-1000000000)", show=False), Binding("end", "cursor(1000000000)", show=False),
        # sideways by whole columns (the node column stays); shift+Home / shift+End: first / last columns
        Binding("left", "column(-1)", show=False), Binding("right", "column(1)", show=False),
        Binding("shift+home", "column(-1000)", show=False), Binding("shift+end", "column(1000)", show=False),
        Binding("enter", "select", "Node"),
    ]
    cursor_row: reactive[int] = reactive(0, always_update=False)
    # Optional probe (bench/fleet_scale.py): called with a node's key whenever its row's line is
    # rebuilt to be painted: after `sync` found the node changed, or when a row not drawn since
    # scrolls into view. An online row's cells are built at that moment from `state.nodes[key]`,
    # so the probe may read the tick now on screen there. None, the default, costs one test per
    # rebuilt row.
    paint_probe: Callable[[NodeKey], None] | None = None

    class OpenNode(Message):
        def __init__(self, key: NodeKey):
            super().__init__()
            self.key = key

    class Scrolled(Message):
        """Scrolled sideways: the screen's status line says which columns are shown."""

    class HeaderClicked(Message):
        def __init__(self, column: str):
            super().__init__()
            self.column = column

    def __init__(self, state: FleetState, *, rack_budget_w: float | None = None, **kw):
        super().__init__(**kw)
        self.state, self.rack_budget_w = state, rack_budget_w
        self.sort_column, self.reverse, self.grouped, self.group_by = "node", False, False, "rack"
        self.query_text, self.problems_only = "", False
        self._version = -1  # never drawn
        self._segs: dict[str, tuple] = {}  # row key → cells shown (absent: compute when painted)
        # Rows taken in. Not their NodeViews: holding the old view would move the freeing of every
        # replaced tick (thousands of objects a node) from the subscriber into our redraw.
        self._rows: set[str] = set()
        self._now = 0.0
        self._strips: dict[str, Strip] = {}
        self._sortval: dict[str, object] = {}
        self._group: dict[str, str] = {}  # row key → its group in `group_by`
        self._visible: set[str] = set()
        self._aging: set[str] = set()  # rows whose status shows an age that ticks without changes
        self._order: list[str] = []
        self._index: dict[str, int] = {}
        self.widths = WIDTHS  # the columns' widths now (the node column follows the longest name)

    # --- the incremental redraw ---------------------------------------------------------------

    def sync(self, now: float, *, reorder: bool = False) -> int:
        """Bring the table up to the state at `now`; returns the number of rows redrawn."""
        state = self.state
        first = self._version < 0
        changed = {row_key(k) for k in (state.nodes if first else state.changed_since(self._version))}
        self._version = state.version
        self._now = now
        changed |= self._aging
        nodes = state.nodes
        need_order = reorder or first
        drawn = 0
        query, problems, col = self.query_text.strip(), self.problems_only, BY_KEY[self.sort_column]
        for rk in changed:
            key = node_key(rk)
            view = nodes.get(key) if key is not None else None
            if view is None:
                need_order |= self._forget(rk)
                continue
            live = view.liveness(now)
            if live.state == "online":
                self._aging.discard(rk)
            else:
                self._aging.add(rk)
            visible = (not query or matches(view, live, query)) and (not problems or is_problem(view, live))
            old_sort = self._sortval.get(rk)
            try:
                self._sortval[rk] = col.sort(view, live)
            except Exception:  # a hostile value that does not compare: sort it by name
                self._sortval[rk] = None
            group = group_of(view, self.group_by)
            if self._group.get(rk) != group:
                self._group[rk] = group
                need_order |= self.grouped
            if visible != (rk in self._visible):
                need_order = True
                (self._visible.add if visible else self._visible.discard)(rk)
            elif visible and self._sortval[rk] != old_sort:
                need_order = True
            self._rows.add(rk)
            if rk in self._aging:  # few rows: compare their cells now, so unchanged ages cost no repaint
                drawn += self._draw(rk, row_segments(view, live))
            else:
                self._segs.pop(rk, None)
                self._strips.pop(rk, None)
                drawn += 1
        if need_order:
            self._reorder(now)
        elif self.grouped:
            self._draw_groups(now)
        if drawn:
            self.refresh()
        return drawn

    def resort(self, now: float) -> None:
        """Recompute every sort key (the sort column changed) and reorder."""
        col = BY_KEY[self.sort_column]
        for rk in list(self._rows):
            key = node_key(rk)
            view = self.state.nodes.get(key) if key else None
            if view is not None:
                try:
                    self._sortval[rk] = col.sort(view, view.liveness(now))
                except Exception:
                    self._sortval[rk] = None
        self._reorder(now)

    def regroup(self, now: float) -> None:
        """Recompute every row's group (`group_by` changed) and reorder."""
        for rk in list(self._rows):
            key = node_key(rk)
            view = self.state.nodes.get(key) if key else None
            if view is not None:
                self._group[rk] = group_of(view, self.group_by)
        self._reorder(now)

    def refilter(self, now: float) -> None:
        """Re-judge every row against the filter (the query or problems toggle changed)."""
        query, problems = self.query_text.strip(), self.problems_only
        self._visible = set()
        for rk in list(self._rows):
            key = node_key(rk)
            view = self.state.nodes.get(key) if key else None
            if view is None:
                continue
            live = view.liveness(now)
            if (not query or matches(view, live, query)) and (not problems or is_problem(view, live)):
                self._visible.add(rk)
        self._reorder(now)

    def _draw(self, rk: str, cells) -> int:
        if self._segs.get(rk) == cells:
            return 0
        self._segs[rk] = cells
        self._strips.pop(rk, None)  # rebuilt when next painted, if it is on screen
        return 1

    def _forget(self, rk: str) -> bool:
        existed = rk in self._segs
        existed |= rk in self._rows
        self._rows.discard(rk)
        for d in (self._segs, self._strips, self._sortval, self._group):
            d.pop(rk, None)
        self._visible.discard(rk)
        self._aging.discard(rk)
        return existed

    # --- order, groups ---------------------------------------------------------------------

    def _ordered_nodes(self) -> list[str]:
        keys = sorted(self._visible)  # row keys sort by cluster/node: the tie-break
        if self.sort_column != "node":
            val = self._sortval
            have = [k for k in keys if val.get(k) is not None]
            try:
                have.sort(key=val.__getitem__, reverse=self.reverse)
            except TypeError:  # values of different types (hostile input): keep name order
                pass
            keys = have + [k for k in keys if val.get(k) is None]  # unknown last, either way
        elif self.reverse:
            keys.reverse()
        if self.grouped:
            keys.sort(key=lambda k: sort_key(self._group.get(k, "")))
        return keys

    def _reorder(self, now: float) -> None:
        current = self._cursor_key()
        top = self.scroll_offset.y  # follow the cursor only if it was on screen (not after a wheel scroll)
        followed = top <= self.cursor_row < top + max(1, self.scrollable_content_region.height - 1)
        order = self._ordered_nodes()
        if self.grouped:
            grouped: list[str] = []
            last = None
            for rk in order:
                group = self._group.get(rk, "")
                if group != last:
                    grouped.append(GROUP_PREFIX + group)
                    last = group
                grouped.append(rk)
            order = grouped
        self._order = order
        self._index = {rk: i for i, rk in enumerate(order)}
        if self.grouped:
            self._draw_groups(now)
        longest = max((len(rk) - len(rk.partition("/")[0]) - 1 for rk in self._rows), default=0)
        widths = layout(max(NODE_MIN, min(NODE_MAX, longest)))
        if widths != self.widths:
            self.widths = widths
            self._strips.clear()
        self._fit_virtual(len(order) + 1)
        if current in self._index:
            self.cursor_row = self._index[current]
        self.cursor_row = max(0, min(self.cursor_row, len(order) - 1))
        # The scroll limits follow the new row count only after the next layout: show the cursor
        # again then (a cursor moved at once, e.g. End right after `p`, would be off screen).
        if followed:
            self.call_after_refresh(self._show_cursor)
        self.refresh()

    def _fit_virtual(self, height: int | None = None) -> None:
        """The virtual size: every row, and wide enough that scrolling sideways as far as it goes
        stops on a column's edge (the node column stays; the last column ends at or before the
        right edge)."""
        view = max(1, self.scrollable_content_region.width - self.widths[0])
        rest = self.total_width - self.widths[0]
        last = next((e for e in self.column_edges() if rest - e <= view), 0)
        width = max(self.total_width, self.widths[0] + last + view)
        self.virtual_size = Size(width, self.virtual_size.height if height is None else height)

    @property
    def total_width(self) -> int:
        return sum(self.widths) + GAP

    def _draw_groups(self, now: float) -> None:
        """The group headers in the order (nvmon.tui.widgets.fleet_groups): one line each."""
        shown: dict[str, int] = {}
        for rk in self._visible:
            group = self._group.get(rk, "")
            shown[group] = shown.get(group, 0) + 1
        headers = rack_headers(self.state, now, self.rack_budget_w, shown) if self.group_by == "rack" \
            else domain_headers(self.state, now, shown)
        for rk, line in headers.items():
            if rk in self._index and self._draw(rk, (line,)):
                self.refresh()

    # --- painting --------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        if y == 0:
            strip = self._header()
        else:
            index = scroll_y + y - 1
            if index >= len(self._order):
                return Strip.blank(width, self.rich_style)
            rk = self._order[index]
            strip = self._strips.get(rk)
            if strip is None:
                strip = self._strips[rk] = row_strip(self._cells(rk), self.widths)
                if self.paint_probe is not None and not rk.startswith(GROUP_PREFIX):
                    self.paint_probe(node_key(rk))
            if index == self.cursor_row:
                strip = strip.apply_style(self.get_component_rich_style("fleet-table--cursor"))
        # the node column stays put when scrolling sideways (a rack header line does not scroll)
        first = self.widths[0]
        if scroll_x and (y == 0 or not rk.startswith(GROUP_PREFIX)):
            strip = Strip.join([strip.crop(0, first), strip.crop(first + scroll_x, first + scroll_x + width - first)])
        return strip.crop_extend(0, width, self.rich_style)

    def _header(self) -> Strip:
        style = self.get_component_rich_style("fleet-table--header")
        cells = []
        for c, w in zip(COLUMNS, self.widths):
            mark = ("▼" if self.reverse else "▲") if c.key == self.sort_column else ""
            gap = " " if mark and len(c.label) + 2 <= w - GAP else ""  # "Hottest▲" where " ▲" does not fit
            cells.append(((c.label + gap + mark, ""),))
        return row_strip(tuple(cells), self.widths).apply_style(style)

    def watch_scroll_x(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_x(old_value, new_value)
        if round(old_value) != round(new_value):
            self.post_message(self.Scrolled())

    def on_resize(self, event: events.Resize) -> None:
        self._fit_virtual()
        self.post_message(self.Scrolled())  # which columns fit changed
        self.call_after_refresh(self._show_cursor)

    def watch_cursor_row(self, old: int, new: int) -> None:
        self.refresh()
        self._show_cursor()
        self.call_after_refresh(self._show_cursor)  # again once a new row count is laid out

    def _show_cursor(self) -> None:
        """Scroll so that the cursor's row is on screen (forced: right after a reorder the scroll
        bars, and so the allowed scrolling, still follow the old row count)."""
        top = self.scroll_offset.y
        visible = max(1, self.scrollable_content_region.height - 1)
        row = self.cursor_row
        if row < top:
            self.scroll_to(y=row, animate=False, force=True, immediate=True)
        elif row >= top + visible:
            self.scroll_to(y=row - visible + 1, animate=False, force=True, immediate=True)

    # --- sideways, by columns ----------------------------------------------------------------

    def column_edges(self) -> list[int]:
        """The scroll offsets that start each column after the (fixed) node column."""
        edges, x = [], 0
        for w in self.widths[1:]:
            edges.append(x)
            x += w
        return edges

    def action_column(self, delta: int) -> None:
        """Scroll sideways by `delta` columns (the node column stays); at most to the last ones."""
        x, edges = round(self.scroll_offset.x), self.column_edges()
        first = max(i for i, e in enumerate(edges) if e <= x)
        if delta > 0 and x >= self.max_scroll_x:
            return
        target = edges[max(0, min(len(edges) - 1, first + delta))]
        self.scroll_to(x=min(target, self.max_scroll_x), animate=False, force=True, immediate=True)

    def columns_shown(self) -> tuple[int, int]:
        """(first, last) column numbers (1-based, the node column is 1) whose text is wholly on screen."""
        x, width = round(self.scroll_offset.x), self.scrollable_content_region.width - self.widths[0]
        shown = [i + 2 for i, e in enumerate(self.column_edges()) if e >= x and e + self.widths[i + 1] <= x + width]
        return (shown[0] if shown else 2, shown[-1] if shown else 2)

    def _cells(self, rk: str) -> tuple:
        cells = self._segs.get(rk)
        if cells is None:
            key = node_key(rk)
            view = self.state.nodes.get(key) if key is not None else None
            cells = ((),) * len(COLUMNS) if view is None else row_segments(view, view.liveness(self._now))
            self._segs[rk] = cells
        return cells

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()

    # --- selection and input ----------------------------------------------------------------

    @property
    def row_count(self) -> int:
        return len(self._order)

    def _cursor_key(self) -> str | None:
        return self._order[self.cursor_row] if 0 <= self.cursor_row < len(self._order) else None

    @property
    def selected(self) -> NodeKey | None:
        rk = self._cursor_key()
        return node_key(rk) if rk else None

    def move_cursor(self, row: int) -> None:
        self.cursor_row = max(0, min(row, len(self._order) - 1))

    def row_cells(self, row: int) -> dict[str, str]:
        """The plain text of a row's cells by column key (tests, accessibility); a rack group
        header's one line is its `node`."""
        cells = self._cells(self._order[row])
        if len(cells) == 1:
            return {c.key: "".join(t for t, _ in cells[0]) if c.key == "node" else "" for c in COLUMNS}
        return {c.key: "".join(t for t, _ in cell) for c, cell in zip(COLUMNS, cells)}

    def action_cursor(self, delta: int) -> None:
        self.move_cursor(self.cursor_row + delta)

    def action_page(self, direction: int) -> None:
        self.move_cursor(self.cursor_row + direction * max(1, self.size.height - 2))

    def action_select(self) -> None:
        key = self.selected
        if key is not None and key in self.state.nodes:
            self.post_message(self.OpenNode(key))

    def on_click(self, event: events.Click) -> None:
        scroll_x, scroll_y = self.scroll_offset
        if event.y == 0:
            x = event.x if event.x < self.widths[0] else event.x + scroll_x
            edge = 0
            for col, w in zip(COLUMNS, self.widths):
                edge += w
                if x < edge:
                    self.post_message(self.HeaderClicked(col.key))
                    return
            return
        row = scroll_y + event.y - 1
        if 0 <= row < len(self._order):
            again = row == self.cursor_row or event.chain > 1
            self.move_cursor(row)
            if again:
                self.action_select()
