"""The alert lifecycle: pending → firing after for_s → resolved after clear_s of absence.

Pure and synchronous: `evaluate(sample, now)` (or `step(conditions, now)` for other rule sources)
returns the transitions of that tick; nothing here does I/O or reads a clock. The daemon persists
`take_dirty()`, publishes `active()` and hands `to_notify()` to a `Notifier`.

- One alert per fingerprint and episode: a condition seen again while its alert is active only
  raises `count` (power-cap throttling every tick is one alert with a count, not a flood).
- Hysteresis: an alert resolves only once its condition has been absent for the rule's `clear_s`
  (default max(for_s, 2 intervals)); a condition that comes back sooner continues the episode.
- Start-up grace: rules marked `grace` (link state and speed) may go pending but do not fire
  until `startup_grace_s` after the engine started, so links training after a reboot never page.
- Restart: `restore()` takes the store's active alerts back as they were: a firing alert stays
  firing, with no new transition (no second page), and resolves normally once its condition is gone.
- Acks and silences (`set_controls`) come from the store: a silenced alert is never handed to the
  notifier; an acked one carries `acked_at`, so a notifier that repeats pages can skip it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from nvmon.alerts.model import AlertRecord, Silence
from nvmon.alerts.rules import Condition, NodeRules, RuleSpec
from nvmon.model import Sample
from nvmon.wire.contract import Alert

COUNT_FLUSH_S = 10.0  # count-only changes reach the store at most this often (transitions at once)
_ACTIVE = ("pending", "firing")


class Notifier(Protocol):
    """Receives firing and resolved alerts (the hooks layer implements it). `submit` is called
    on the daemon's event loop: it must return at once and never raise."""

    def submit(self, records: list[AlertRecord]) -> None: ...


class NullNotifier:
    """The default: nobody is paged."""

    def submit(self, records: list[AlertRecord]) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Transition:
    before: str | None  # None: a new alert
    record: AlertRecord  # its state after the transition (`record.status`)


@dataclass(slots=True)
class _Track:
    """One active alert. The mutable per-tick parts live here; `record` is rebuilt from them only
    when someone needs it (a transition, a flush, `active()`), which keeps a tick cheap."""

    record: AlertRecord
    last_seen: float
    count: int
    summary: str | Callable[[], str]
    value: Any
    threshold: Any
    changed: bool = False  # count/value changed since the record was last built

    def build(self) -> AlertRecord:
        if self.changed:
            summary = self.summary() if callable(self.summary) else self.summary
            self.record = replace(self.record, count=self.count, summary=summary, value=self.value,
                                  threshold=self.threshold)
            self.changed = False
        return self.record


@dataclass(slots=True)
class EngineStats:
    evaluations: int = 0
    transitions: int = 0
    fired: int = 0
    resolved: int = 0


class AlertEngine:
    """One node's (or one evaluator's) alerts. `rules` supplies `book` (code → RuleSpec),
    `conditions(input, now)`, `holds(input)` and the identity (cluster, node, rack, labels)."""

    def __init__(self, rules: NodeRules, *, started_at: float, startup_grace_s: float = 0.0,
                 tick_slack_s: float = 0.0):
        """`tick_slack_s`: how far short of for_s a condition may be held and still fire. Ticks
        come every interval give or take scheduling jitter; with ticks 0.999 s apart a 2 s
        for-duration would otherwise wait for a third tick. The daemon passes a quarter interval."""
        self.rules = rules
        self.tick_slack_s = tick_slack_s
        self.started_at = started_at
        self.grace_until = started_at + startup_grace_s
        self.stats = EngineStats()
        self._tracks: dict[str, _Track] = {}
        self._urgent: dict[tuple[str, float], AlertRecord] = {}  # transitions not yet taken by the store
        self._flushed_at = started_at
        self._acks: dict[tuple[str, int], float] = {}  # (fingerprint, starts_ms) → acked_at
        self._silences: tuple[Silence, ...] = ()
        self._fallback = RuleSpec(code="?", severity="warning", for_s=0.0, clear_s=0.0, grace=False, runbook="")

    # -- evaluation -------------------------------------------------------------------------

    def evaluate(self, sample: Sample, now: float) -> list[Transition]:
        """Judge one sample; returns this tick's transitions (new pending, firing, resolved)."""
        return self.step(self.rules.conditions(sample, now), now, self.rules.holds(sample))

    def step(self, conditions: Iterable[Condition], now: float,
             held: Callable[[AlertRecord], bool] = lambda r: False) -> list[Transition]:
        """Advance every alert to `now` given the conditions that hold now."""
        self.stats.evaluations += 1
        out: list[Transition] = []
        seen = set()
        for c in conditions:
            if c.fingerprint in seen:
                continue  # one place, one alert
            seen.add(c.fingerprint)
            rule = self.rules.book.get(c.code, self._fallback)
            t = self._tracks.get(c.fingerprint)
            if t is None:
                rec = self._new_record(c, rule, now)
                self._tracks[c.fingerprint] = _Track(rec, now, 1, c.summary, c.value, c.threshold)
                if self._may_fire(rec, rule, now):
                    rec = self._tracks[c.fingerprint].record = rec.with_status("firing", now)
                out.append(self._emit(None, rec))
                continue
            t.last_seen = now
            t.count += 1
            t.summary, t.value, t.threshold = c.summary, c.value, c.threshold
            t.changed = True
            if t.record.status == "pending" and self._may_fire(t.record, rule, now):
                t.record = t.build().with_status("firing", now)
                out.append(self._emit("pending", t.record))
        for fp, t in list(self._tracks.items()):
            if fp in seen:
                continue
            if held(t.record):
                t.last_seen = now  # cannot be judged now: resolving would be a guess
                continue
            rule = self.rules.book.get(t.record.code, self._fallback)
            if now - t.last_seen >= rule.clear_s:
                before = t.record.status
                del self._tracks[fp]
                out.append(self._emit(before, t.build().with_status("resolved", now)))
        if out:
            self.stats.transitions += len(out)
        return out

    def _may_fire(self, rec: AlertRecord, rule: RuleSpec, now: float) -> bool:
        return (now - rec.starts_at >= rule.for_s - self.tick_slack_s
                and not (rule.grace and now < self.grace_until - self.tick_slack_s))

    def _new_record(self, c: Condition, rule: RuleSpec, now: float) -> AlertRecord:
        r = self.rules
        return AlertRecord(
            fingerprint=c.fingerprint, status="pending", code=c.code, severity=c.severity or rule.severity,
            cluster=r.cluster,
            node=r.node, summary=c.summary() if callable(c.summary) else c.summary, runbook=c.runbook, starts_at=now, rack=r.rack, gpu=c.gpu, link=c.link,
            device=c.device, port=c.port, value=c.value, threshold=c.threshold, count=1, labels=dict(r.labels))

    def _emit(self, before: str | None, rec: AlertRecord) -> Transition:
        self._urgent[(rec.fingerprint, rec.starts_at)] = rec
        if rec.status == "firing":
            self.stats.fired += 1
        elif rec.status == "resolved" and before == "firing":
            self.stats.resolved += 1
        return Transition(before, rec)

    # -- what the daemon reads -------------------------------------------------------------

    def active(self) -> list[AlertRecord]:
        """Pending and firing alerts, most severe and oldest first."""
        rank = {"critical": 0, "warning": 1, "info": 2}
        recs = [t.build() for t in self._tracks.values()]
        return sorted(recs, key=lambda r: (rank.get(r.severity, 3), r.starts_at, r.fingerprint))

    def take_dirty(self, now: float, *, force: bool = False) -> list[AlertRecord]:
        """Records the store has not seen yet: every transition at once, count/value changes of
        active alerts every COUNT_FLUSH_S (or now with `force`, e.g. at shutdown)."""
        out = dict(self._urgent)
        self._urgent.clear()
        if force or now - self._flushed_at >= COUNT_FLUSH_S:
            self._flushed_at = now
            for t in self._tracks.values():
                if t.changed:
                    rec = t.build()
                    out[(rec.fingerprint, rec.starts_at)] = rec
        return list(out.values())

    def to_notify(self, transitions: Iterable[Transition], now: float) -> list[AlertRecord]:
        """What a notifier gets: alerts that started firing, and resolved ones that had fired,
        minus those an active silence matches."""
        out = []
        for tr in transitions:
            r = tr.record
            if r.status == "firing" or (r.status == "resolved" and r.fired_at is not None):
                if not self.silenced(r, now):
                    out.append(r)
        return out

    def silenced(self, r: AlertRecord, now: float) -> bool:
        return any(s.matches(r, now) for s in self._silences)

    # -- restart, acks, silences ---------------------------------------------------------------

    def restore(self, records: Iterable[AlertRecord], now: float) -> int:
        """Take back active alerts from the store (after a restart). Unknown fingerprints only:
        what the engine already tracks wins. Returns how many were restored."""
        n = 0
        for r in records:
            if r.status not in _ACTIVE or r.fingerprint in self._tracks:
                continue
            self._tracks[r.fingerprint] = _Track(r, now, r.count, r.summary, r.value, r.threshold)
            resume = getattr(self.rules, "resume_held", None)  # a power brake held since before the restart
            if resume is not None:
                resume(r.fingerprint, r.code, r.starts_at, now)
            n += 1
        self._apply_acks()
        return n

    def set_controls(self, acks: Mapping[tuple[str, int], float], silences: Iterable[Silence]) -> None:
        """Acks by (fingerprint, episode start in unix ms) and the silences, as the store has them."""
        self._acks = dict(acks)
        self._silences = tuple(silences)
        self._apply_acks()

    def _apply_acks(self) -> None:
        for fp, t in self._tracks.items():
            acked = self._acks.get((fp, round(t.record.starts_at * 1000)))
            if acked != t.record.acked_at:
                t.record = replace(t.build(), acked_at=acked)


def wire_alert(r: AlertRecord) -> Alert:
    """An alert record as the `alerts` topic carries it (nvmon.wire.contract.Alert)."""
    since = r.fired_at if r.status == "firing" and r.fired_at is not None else r.starts_at
    if r.status == "resolved" and r.ends_at is not None:
        since = r.ends_at
    return Alert(fingerprint=r.fingerprint, code=r.code, severity=r.severity, state=r.status, summary=r.summary,
                 since=since, gpu=r.gpu, link=r.link, device=r.device, port=r.port, labels=dict(r.labels),
                 starts_at=r.starts_at)
