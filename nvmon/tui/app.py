"""`NvmonApp`: the fleet TUI over one `FleetState`.

With broker settings, the app runs a `FleetSubscriber` as a named worker in its own event loop,
feeding the state; without them it shows the state it was given (tests, snapshots, benchmarks).
The same connection reads the clusters' shared acks and silences (`nvmon/v1/<cluster>/@controls`)
into `controls` (a `SharedControls`: the last good set per cluster; refused messages, and silences
refused for covering every node without --all-nodes, count in the header's drops), which the
alerts screen shows. The `FleetState` never sees them.
The fleet rules (`FleetAlerts`, the engine `nvmon fleet` runs) are judged over the same state on each
redraw, so a dead node is on the alerts screen and in the header's alert count.
Either way one timer (`refresh_s`, 1 s) redraws: it sets `header_info` (a reactive the headers
watch) and asks the active screen to `refresh_data(now)`, which draws only what changed since
that screen's last look (`FleetState.changed_since`). Nothing is pushed from the subscriber to
widgets, so the message rate never reaches the screen.

All times come from `clock` (default `time.time`), so a fixed clock gives a fixed screen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from textual.app import App
from textual.binding import Binding
from textual.reactive import reactive
from textual.scrollbar import ScrollBar, ScrollBarRender
from textual.worker import Worker, WorkerState

from nvmon.alerts.shared import DEFAULT_MAX_SILENCE_S, SharedControls
from nvmon.fleet.alerting import FleetAlerts, blind_now
from nvmon.fleet.rules import FleetRules, FleetSettings
from nvmon.fleet.state import FleetState, NodeKey
from nvmon.fleet.subscriber import FleetSubscriber
from nvmon.tui.alertlog import AlertLog
from nvmon.tui.screens.alerts import AlertsScreen
from nvmon.tui.screens.fleet import FleetScreen
from nvmon.tui.screens.help import HelpScreen
from nvmon.tui.screens.node import NodeScreen
from nvmon.tui.widgets.header import HeaderInfo
from nvmon.wire.mqtt import MqttSettings, describe_error, quiet_aiomqtt_noise


class WholeCellScrollBar(ScrollBarRender):
    """Scrollbar thumbs in whole cells: Textual's eighth-cell ends (▂ ▇ ▏) read as stray glyphs beside
    the content in a terminal that shows them without the thumb's colour (tmux, a monochrome screen)."""

    VERTICAL_BARS = [" "] * 8
    HORIZONTAL_BARS = [" "] * 8


class NvmonApp(App):
    """The fleet TUI; see the module docstring. `await NvmonApp(settings).run_async()`."""

    CSS_PATH = Path(__file__).with_name("nvmon.tcss")
    TITLE = "nvmon"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
        Binding("a", "alerts", "Alerts"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    header_info: reactive[HeaderInfo | None] = reactive(None, always_update=False)

    def __init__(self, settings: MqttSettings | None, *, cluster: str | None = None, source: str | None = None,
                 state: FleetState | None = None, clock: Callable[[], float] = time.time,
                 rack_budget_kw: float | None = None, refresh_s: float = 1.0, notice: str | None = None,
                 notes: tuple[str, ...] = (), max_silence_s: float = DEFAULT_MAX_SILENCE_S):
        super().__init__()
        ScrollBar.renderer = WholeCellScrollBar  # Textual's documented hook; nvmon's is the process's only app
        self.settings, self.cluster, self.clock, self.refresh_s = settings, cluster, clock, refresh_s
        self.state = state if state is not None else FleetState()
        # Shared acks and silences, per cluster, capped as the evaluators cap them ([alerts]
        # max_silence_h of --config, as nvmon fleet's): a longer silence shows as applied only up to
        # its cap, and `x` silences for at most that long.
        self.max_silence_s = max_silence_s
        self.controls = SharedControls(max_silence_s=max_silence_s) if settings else None
        self.subscriber = (FleetSubscriber(settings, self.state, cluster=cluster, clock=clock,
                                           controls=self.controls.apply) if settings else None)
        self.source = source or (settings.url if settings is not None else "local state")
        self.rack_budget_w = rack_budget_kw * 1000 if rack_budget_kw else None
        self.alert_log = AlertLog()
        # What no node can say of itself (offline, stale, rack power, one fault on many nodes): the
        # rules and engine nvmon fleet runs, over this view's state, in memory only (no hooks).
        self.fleet_alerts = FleetAlerts(FleetRules(FleetSettings(
            stale_after_intervals=max(1.0, self.state.stale_factor), rack_budget_kw=rack_budget_kw)), clock=clock)
        self.subscriber_error: str | None = None
        # What the embedding program wants said (nvmon demo: what it planted where): `notice` is one
        # line under the fleet table, `notes` are lines at the top of the help screen.
        self.notice, self.notes = notice, notes
        # One read-modify-write of a cluster's shared set at a time: `k` then `x` at once would each read
        # the same set and the second publish would drop the first's change.
        self.share_lock = asyncio.Lock()
        # The reason of the message dropped last, whoever dropped it (the header and help show it).
        self._drop_counts, self._last_drop = (0, 0, 0), None

    def now(self) -> float:
        return self.clock()

    # --- lifecycle -----------------------------------------------------------------------------

    def on_mount(self) -> None:
        if self.subscriber is not None:
            # aiomqtt leaves harmless "never retrieved" errors behind when the broker goes away
            asyncio.get_running_loop().set_exception_handler(quiet_aiomqtt_noise)
            self.run_worker(self.subscriber.run(), name="nvmon.tui.subscriber", group="mqtt", exit_on_error=False)
        self.refresh_data()
        self.push_screen(FleetScreen(self.rack_budget_w))
        self.set_interval(self.refresh_s, self.refresh_data, name="nvmon.tui.redraw")

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place subscriber failures land: it only ends on a bug. (The alerts screen's
        ack/silence workers report their own outcome.)"""
        if event.state == WorkerState.ERROR and event.worker.group == "mqtt":
            self.subscriber_error = describe_error(event.worker.error)
            self.notify(f"MQTT subscriber stopped: {self.subscriber_error}", title="nvmon", severity="error",
                        markup=False, timeout=30)
            self.refresh_data()

    def refresh_data(self) -> None:
        now = self.clock()
        self._judge(now)
        self.header_info = self._header(now)
        self.alert_log.sync(self.state, now)
        screen = self.screen if self.screen_stack else None
        refresh = getattr(screen, "refresh_data", None)
        # A screen just pushed is on top before its widgets exist: it draws itself in on_mount.
        if refresh is not None and screen.is_mounted:
            refresh(now)

    def _judge(self, now: float) -> None:
        fa, sub = self.fleet_alerts, self.subscriber
        blind = sub is not None and blind_now(sub.status.connected, sub.status.since, fa.rules.max_interval_s, now)
        transitions = fa.evaluate(self.state, now, blind=blind)
        self.alert_log.fleet_sync(fa.active(), transitions, now)

    def _header(self, now: float) -> HeaderInfo:
        st = self.state
        counts = st.counts(now)
        newest = max((v.tick_rx for v in st.nodes.values() if v.tick_rx is not None), default=None)
        stats = st.stats
        # control messages refused, and shared silences refused (they cover every node without --all-nodes)
        refused = self.controls.malformed + self.controls.refused_silences if self.controls is not None else 0
        info = HeaderInfo(source=self.source, cluster=self.cluster, nodes=len(st.nodes), online=counts["online"],
                          stale=counts["stale"], offline=counts["offline"], dropped=stats.dropped + refused,
                          last_drop=self._latest_drop(stats), fresh_s=None if newest is None else max(0.0, now - newest),
                          alerts=len(self.alert_log.fleet) + sum(len(v.alerts.alerts) for v in st.nodes.values()
                                                                 if v.alerts is not None))
        sub = self.subscriber
        if sub is None:
            return info
        s = sub.status
        return replace(info, rate_per_s=s.rate_per_s, connected=s.connected and self.subscriber_error is None,
                       connecting=s.since is None and s.errors == 0 and self.subscriber_error is None,
                       lost_for_s=None if s.since is None else max(0.0, now - s.since),
                       error=self.subscriber_error or s.last_error)

    def _latest_drop(self, stats) -> str | None:
        """The reason of the latest drop, whichever counter moved last: the fleet state's (a bad
        sample, status, topic…) or the shared controls' (a malformed control message, a silence
        refused for covering every node)."""
        c = self.controls
        counts = (stats.dropped, c.malformed if c else 0, c.refused_silences if c else 0)
        if counts != self._drop_counts:
            was, self._drop_counts = self._drop_counts, counts
            if counts[0] > was[0]:
                self._last_drop = stats.last_drop
            if counts[1] > was[1]:
                why = c.last_error or "?"  # "reason: message", as the state's
                self._last_drop = why if why.startswith("controls") else f"controls: {why}"
            if counts[2] > was[2]:
                self._last_drop = "shared silence refused: it covers every node without --all-nodes"
        return self._last_drop

    # --- navigation ------------------------------------------------------------------------------

    def open_node(self, key: NodeKey) -> None:
        self.push_screen(NodeScreen(key))

    def action_alerts(self) -> None:
        if not isinstance(self.screen, AlertsScreen):
            self.push_screen(AlertsScreen())

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())
