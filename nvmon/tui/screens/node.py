"""The node screen (Enter on a fleet row): its alerts, what its audit found this tick (each
finding's code, where, and its runbook), GPUs, the per-link NVLink grid, topology, IB, PCIe,
and sparklines of the last minutes. Redrawn only when the node's view changed."""

from __future__ import annotations

import math

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Sparkline, Static

from nvmon.fleet.state import NodeKey
from nvmon.tui import node_render
from nvmon.tui.text import DIM, gbs, known, kw
from nvmon.tui.widgets.header import StatusHeader

HISTORY_S = 300  # the sparklines' window
SERIES = (  # (history series, label, format of the latest value)
    ("nvlink_bytes_per_s", "NVLink", lambda v: f"{gbs(v)} GB/s"),
    ("pcie_bytes_per_s", "PCIe", lambda v: f"{gbs(v)} GB/s"),
    ("ib_bytes_per_s", "IB", lambda v: f"{gbs(v)} GB/s"),
    ("power_w", "GPU power", lambda v: f"{kw(v)} kW"),
    ("hottest_c", "hottest", lambda v: f"{v:.0f} °C" if known(v) else "–"),
)


class NodeScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("a", "app.alerts", "Alerts"),
        Binding("question_mark", "app.help", "Help"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, key: NodeKey):
        super().__init__(name="node")
        self.key = key
        self._drawn = None  # the NodeView last drawn
        self._live = None

    def compose(self) -> ComposeResult:
        yield StatusHeader(f"node {self.key[1]}")
        with VerticalScroll(id="node-body"):
            yield Static(id="node-info")
            yield Static(id="node-alerts")
            yield Static(id="node-findings")
            with Grid(id="node-spark"):
                for name, label, _ in SERIES:
                    yield Static(Text(label, style="bold"), classes="spark-label")
                    yield Sparkline([], id=f"spark-{name}", classes="spark")
                    yield Static(id=f"last-{name}", classes="spark-last")
            yield Static(id="node-sections")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_data(self.app.now())
        self.query_one("#node-body").focus()

    def refresh_data(self, now: float) -> None:
        view = self.app.state.nodes.get(self.key)
        if view is None:
            self.query_one("#node-info", Static).update(
                Text(f"{self.key[1]}: no longer in the fleet (its status was cleared)", style="bold red"))
            return
        live = view.liveness(now)
        status = (live.state, int(live.age_s) if live.state != "online" else 0)
        if view is self._drawn and status == self._live:
            return
        self.query_one("#node-info", Static).update(node_render.info(view, now))
        self.query_one("#node-alerts", Static).update(node_render.alerts_block(view, now))
        if view is not self._drawn:
            self.query_one("#node-findings", Static).update(node_render.findings_block(view))
            self.query_one("#node-sections", Static).update(node_render.sections(view, now))
            self._sparklines(now)
        self._drawn, self._live = view, status

    def _sparklines(self, now: float) -> None:
        points = self.app.state.history(self.key, since=now - HISTORY_S)
        for name, _, fmt in SERIES:
            values = [] if points is None else [v for v in points.values.get(name, ()) if not math.isnan(v)]
            self.query_one(f"#spark-{name}", Sparkline).data = values
            last = values[-1] if values else None
            self.query_one(f"#last-{name}", Static).update(Text(fmt(last) if last is not None else "–",
                                                               style="" if values else DIM))
