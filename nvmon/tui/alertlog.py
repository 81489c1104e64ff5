"""Active alerts across the fleet, and the ones this view saw resolve.

Nodes publish their full active set (`alerts`, retained). An alert that leaves a node's set was
resolved; `AlertLog` notices that by comparing each changed node's set with the one it saw before,
and keeps the most recent `keep` resolutions. It also holds the view's local ack / silence marks
(not yet shared with an alert engine).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from nvmon.fleet.state import FleetState, NodeKey
from nvmon.tui.text import SEVERITY_RANK
from nvmon.wire.contract import Alert


@dataclass(frozen=True, slots=True)
class Row:
    key: NodeKey
    alert: Alert
    resolved_at: float | None = None  # None: active

    @property
    def ident(self) -> str:
        return f"{self.key[0]}/{self.key[1]}/{self.alert.fingerprint}"


class AlertLog:
    def __init__(self, keep: int = 200):
        self._version = -1
        self._seen: dict[NodeKey, tuple] = {}  # node → its alerts tuple as last seen (identity check)
        self.resolved: deque[Row] = deque(maxlen=keep)
        self.acked: set[str] = set()
        self.silenced: set[str] = set()

    def sync(self, state: FleetState, now: float) -> None:
        keys = state.nodes.keys() if self._version < 0 else state.changed_since(self._version)
        self._version = state.version
        for key in keys:
            view = state.nodes.get(key)
            new = view.alerts.alerts if view is not None and view.alerts is not None else ()
            old = self._seen.get(key, ())
            if new is old:
                continue
            if old:
                still = {a.fingerprint for a in new}
                for a in old:
                    if a.fingerprint not in still:
                        self.resolved.appendleft(Row(key, a, now))
            if new:
                self._seen[key] = new
            else:
                self._seen.pop(key, None)

    @staticmethod
    def active(state: FleetState) -> list[Row]:
        """Every active alert, most severe first, then oldest, then by node."""
        rows = [Row(view.key, a) for view in state.nodes.values() if view.alerts is not None
                for a in view.alerts.alerts]
        rows.sort(key=lambda r: (SEVERITY_RANK.get(r.alert.severity, 9), r.alert.since, r.key, r.alert.fingerprint))
        return rows
