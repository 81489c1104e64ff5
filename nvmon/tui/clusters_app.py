"""`ClustersApp`: the TUI over many clusters (`nvmon tui --cluster a,b`, `--cluster '+'`).

It opens on the cluster overview (nvmon.tui.screens.clusters), fed by a `SummaryWatcher`: the
clusters' retained summaries (nvmon/v1/<cluster>/@summary) and their shared acks and silences, a
few small messages every ten seconds per cluster however many nodes each has. Enter on a cluster
subscribes to that cluster's node topics only (a `FleetSubscriber` on a fresh `FleetState`) and
shows its fleet screen, node screens and alerts as `NvmonApp` does for one cluster; Escape there
unsubscribes and comes back. So one operator watches 10 × 2,000 nodes without receiving 20,000
samples a second.

The rules are `ClusterRules`: the fleet rules over the cluster drilled into, plus `cluster.unreachable`
over the summaries (judged in nvmon.fleet.clusters, one alert per cluster out of reach), on the
alerts screen and in the header's count like any fleet alert.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from textual.binding import Binding

from nvmon.fleet.alerting import FleetAlerts, blind_now
from nvmon.fleet.clusters import DEFAULT_STALE_INTERVALS, ClusterBoard, ClusterRules, SummaryWatcher
from nvmon.fleet.state import FleetState
from nvmon.fleet.subscriber import FleetSubscriber
from nvmon.tui.alertlog import AlertLog
from nvmon.tui.app import NvmonApp
from nvmon.tui.screens.clusters import ClustersScreen
from nvmon.tui.screens.fleet import FleetScreen
from nvmon.tui.widgets.header import HeaderInfo
from nvmon.wire.mqtt import MqttSettings, quiet_aiomqtt_noise


HELP_NOTE = ("Clusters: one row each, from its summary (✗ unreachable: none for 3 of its intervals). Enter opens "
             "a cluster, its nodes live; Esc there (no filter up) comes back")


class ClusterFleetScreen(FleetScreen):
    """A drilled-into cluster's fleet screen: Escape clears the filter, else goes back to the overview."""

    BINDINGS = [Binding("escape", "clear_filter", "Clusters")]  # over FleetScreen's hidden one: in the footer

    def action_clear_filter(self) -> None:
        box = self.query_one("#fleet-filter")
        if box.display or self.table.query_text:
            super().action_clear_filter()
        else:
            self.app.close_cluster()


class ClustersApp(NvmonApp):
    """See the module docstring. `clusters`: the clusters to show, () for every cluster whose summary
    is on the broker; `stale_intervals`: a cluster is unreachable after this many of its summary
    intervals without one. Without settings, it shows the `board` (and `state`) it was given (tests)."""

    def __init__(self, settings: MqttSettings | None, *, clusters: Sequence[str] = (),
                 board: ClusterBoard | None = None, stale_intervals: float = DEFAULT_STALE_INTERVALS, **kw):
        kw["notes"] = (*kw.get("notes", ()), HELP_NOTE)  # the help screen's first lines
        super().__init__(settings, **kw)
        self.subscriber = None  # NvmonApp's every-node subscriber is never run: one cluster's only, on Enter
        self.board = board if board is not None else ClusterBoard(clusters, stale_intervals=stale_intervals,
                                                                  started=self.clock())
        self.watched = tuple(clusters)
        self.watcher = (SummaryWatcher(settings, self.board, clusters=clusters, controls=self.controls.apply,
                                       clock=self.clock) if settings is not None else None)
        rules = self.fleet_alerts.rules
        self.fleet_alerts = FleetAlerts(ClusterRules(rules.settings, self.board), clock=self.clock)
        self.drilled: str | None = None
        self._drill_worker = None

    def on_mount(self, event) -> None:
        event.prevent_default()  # instead of NvmonApp's (Textual would run it after this one): no every-node feed
        if self.watcher is not None:
            asyncio.get_running_loop().set_exception_handler(quiet_aiomqtt_noise)
            self.run_worker(self.watcher.run(), name="nvmon.tui.summaries", group="mqtt", exit_on_error=False)
        self.refresh_data()
        self.push_screen(ClustersScreen())
        self.set_interval(self.refresh_s, self.refresh_data, name="nvmon.tui.redraw")

    # --- drilling in and out ---------------------------------------------------------------------

    def open_cluster(self, cluster: str) -> None:
        if self.drilled is not None:
            return
        self.drilled = self.cluster = cluster
        self._fresh_state()
        if self.settings is not None:
            self.subscriber = FleetSubscriber(self.settings, self.state, cluster=cluster, clock=self.clock)
            self._drill_worker = self.run_worker(self.subscriber.run(), name="nvmon.tui.subscriber", group="mqtt",
                                                 exit_on_error=False)
        self.push_screen(ClusterFleetScreen(self.rack_budget_w))
        self.refresh_data()  # the header names the cluster at once

    def close_cluster(self) -> None:
        if self.drilled is None:
            return
        if self._drill_worker is not None:
            self._drill_worker.cancel()
        self._drill_worker = self.subscriber = None
        self.drilled = self.cluster = None
        self._fresh_state()
        while len(self.screen_stack) > 1 and not isinstance(self.screen, ClustersScreen):
            self.pop_screen()
        self.refresh_data()

    def _fresh_state(self) -> None:
        """Another cluster's nodes (or none): a new state, and a new log of the nodes' alerts."""
        old = self.state
        self.state = FleetState(stale_factor=old.stale_factor, default_interval_s=old.default_interval_s,
                                history_points=old.history_points)
        self.alert_log = AlertLog()

    # --- what the header and the rules see -------------------------------------------------------

    def _judge(self, now: float) -> None:
        fa = self.fleet_alerts
        blind = False
        for s in (self.watcher, self.subscriber):
            if s is not None:
                st = s.status
                blind = blind or blind_now(st.connected, st.since, fa.rules.max_interval_s, now)
        transitions = fa.evaluate(self.state, now, blind=blind)
        self.alert_log.fleet_sync(fa.active(), transitions, now)

    def _header(self, now: float) -> HeaderInfo:
        if self.drilled is not None:
            return super()._header(now)
        summaries = [v.summary for v in self.board.clusters.values() if v.summary is not None]
        n = [s.nodes for s in summaries]
        refused = self.controls.malformed + self.controls.refused_silences if self.controls is not None else 0
        info = HeaderInfo(source=self.source, cluster=f"{len(self.board.clusters)} clusters",
                          nodes=sum(c.total for c in n), online=sum(c.online for c in n),
                          stale=sum(c.stale for c in n), offline=sum(c.offline for c in n),
                          dropped=self.board.dropped + refused, last_drop=self.board.last_drop,
                          alerts=len(self.alert_log.fleet) + sum(a.count for s in summaries for a in s.alerts))
        w = self.watcher
        if w is None:
            return info
        s = w.status
        return replace(info, connected=s.connected and self.subscriber_error is None,
                       connecting=s.since is None and s.errors == 0 and self.subscriber_error is None,
                       lost_for_s=None if s.since is None else max(0.0, now - s.since),
                       error=self.subscriber_error or s.last_error)
