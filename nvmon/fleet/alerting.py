"""`nvmon fleet`'s alerts: fleet rules → one AlertEngine per place → store, hooks, log.

    every second (and at once when a node's status changes):
      FleetRules.conditions(state) ─► AlertEngine.step per place (node / rack / fault)
        ├─► notifier.submit(firing / resolved, minus silenced)   never blocks
        ├─► one log line per transition
        └─► persist loop: episodes to SQLite (thread), acks + silences back from it, merged
                          with the clusters' shared ones (MQTT @controls, nvmon.alerts.shared)

An engine per place, not one for the fleet: AlertEngine stamps its records with one identity
(cluster, node, rack, labels), exactly what a place has. Engines exist only while their place
has an active alert.

Blind spells: while the subscriber is not connected, and for a settle time after it (re)connects
(retained statuses come at once, samples only within an interval), no condition can be judged:
every active alert is held as it is and no new one starts. Losing the broker must not page the
whole fleet as stale, nor resolve what is still wrong.

Feed stalls: while the connection is up but no node has sent anything for several intervals
(FleetRules.stalled: a stopped or wedged broker), every alert but fleet.feed_stalled is held the
same way: one warning instead of a page per node.

Forgotten nodes: a node whose retained status was cleared (`nvmon forget`) leaves the state; its
alerts end at once in the database, logged, not paged (a resolved node.offline would read "back").

Two instances of one cluster (HA): the same conditions give the same fingerprints and labels
(nothing of the instance is in them), so Alertmanager and PagerDuty see one alert. Their episode
starts differ by a second or so; a shared ack of one's episode is taken by the other's episode of
the same fingerprint starting within ACK_MATCH_S (`_twin_acks`).

Restart: active episodes are read back from the database before the first evaluation, so an alert
still firing stays firing without a second page (AlertEngine.restore).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from nvmon.alerts.engine import AlertEngine, Notifier, NullNotifier, Transition
from nvmon.alerts.model import AlertRecord, Silence
from nvmon.alerts.persist import Outage, SharedSilencesSaver, UnsavedAlerts, woken
from nvmon.alerts.shared import DEFAULT_MAX_SILENCE_S, SharedControls, merge
from nvmon.fleet.rules import FleetRules, Identity, Place, place_of
from nvmon.fleet.state import FleetState
from nvmon.store import StoreError

log = logging.getLogger("nvmon.fleet")

CONTROLS_EVERY_S = 2.0  # acks and silences made with `nvmon alerts --db FLEET_DB` honoured within this
MAINTAIN_EVERY_S = 600.0  # prune resolved episodes past the retention
ACK_MATCH_S = 5.0  # an ack of the same alert's episode that started this close to ours is ours (HA twins)


class _PlaceRules:
    """What AlertEngine reads of its `rules` object: the rule book and the place's identity."""

    __slots__ = ("book", "cluster", "node", "rack", "labels")

    def __init__(self, book, ident: Identity):
        self.book = book
        self.cluster, self.node, self.rack, self.labels = ident.cluster, ident.node, ident.rack, dict(ident.labels)


MIN_SETTLE_S = 2.0


def blind_now(connected: bool, since: float | None, max_interval_s: float, now: float) -> bool:
    """Whether the fleet cannot be judged now: not connected, or connected for less than the settle
    time (retained statuses come at once, samples within an interval). Shared by nvmon fleet and the TUI."""
    return not connected or since is None or now - since < max(MIN_SETTLE_S, 2 * max_interval_s)


def _hold_all(r: AlertRecord) -> bool:
    return True


def _hold_none(r: AlertRecord) -> bool:
    return False


def _hold_but_feed(r: AlertRecord) -> bool:
    return r.code != "fleet.feed_stalled"


def _twin_acks(acks: dict[tuple[str, int], float], by_fp: dict[str, list[tuple[int, float]]],
               active: list[AlertRecord]) -> dict[tuple[str, int], float]:
    """`acks` plus, for each active episode not acked as itself, the ack of an episode of the same
    fingerprint that started within ACK_MATCH_S of it. Two instances of one cluster (HA) judge the
    same fault with starts a second or so apart (each evaluates on its own clock); an ack is keyed
    by (fingerprint, episode start), so without this an ack shared for one instance's episode would
    not reach the other's, which would go on re-paging. Episodes of one fingerprint start at least
    for_s + clear_s apart (30 s and more by default), so a nearby start is the same episode."""
    out = acks
    for r in active:
        own = round(r.starts_at * 1000)
        if (r.fingerprint, own) in acks or r.fingerprint not in by_fp:
            continue
        near = [(abs(ms - own), at) for ms, at in by_fp[r.fingerprint] if abs(ms - own) <= ACK_MATCH_S * 1000]
        if near:
            if out is acks:
                out = dict(acks)
            out[(r.fingerprint, own)] = min(near)[1]
    return out


def describe(r: AlertRecord) -> str:
    where = f"{r.cluster}/{r.node}" if r.node else f"{r.cluster} rack {r.rack}" if r.rack else r.cluster
    return f"{r.severity} {r.code} on {where} ({r.fingerprint}): {r.summary}"


class FleetAlerts:
    def __init__(self, rules: FleetRules, *, store=None, notifier: Notifier | None = None,
                 clock: Callable[[], float] = time.time, max_silence_s: float = DEFAULT_MAX_SILENCE_S):
        self.rules = rules
        self.store = store
        self.notifier: Notifier = notifier or NullNotifier()
        self.clock = clock
        self.engines: dict[Place, AlertEngine] = {}
        self.errors = 0
        self.eval_seconds = 0.0
        self._acks: dict[tuple[str, int], float] = {}
        self._silences: tuple[Silence, ...] = ()
        self._unsaved = UnsavedAlerts()  # episodes not yet in the database
        self._wake = asyncio.Event()
        # The database's acks/silences and the clusters' shared ones (MQTT; run_fleet listens).
        self._local: tuple[dict, list] = ({}, [])
        self.shared = SharedControls(on_change=self._wake.set, max_silence_s=max_silence_s)
        self._shared_saved = SharedSilencesSaver()  # what `nvmon alerts --db FLEET_DB` reads to say `silenced`

    # -- engines ---------------------------------------------------------------------------------

    def _engine(self, place: Place, ident: Identity, now: float) -> AlertEngine:
        eng = AlertEngine(_PlaceRules(self.rules.book, ident), started_at=now)
        if self._acks or self._silences:
            eng.set_controls(self._acks, self._silences)
        self.engines[place] = eng
        return eng

    def restore(self, records: Iterable[AlertRecord], now: float) -> int:
        """Take active episodes back (before the first evaluation). Returns how many."""
        by_place: dict[Place, list[AlertRecord]] = {}
        for r in records:
            if r.status in ("pending", "firing"):
                by_place.setdefault(place_of(r.cluster, r.node, r.rack, r.code, r.labels), []).append(r)
        n = 0
        for place, recs in by_place.items():
            first = recs[0]
            eng = self.engines.get(place) or self._engine(
                place, Identity(first.cluster, first.node, first.rack, dict(first.labels)), now)
            n += eng.restore(recs, now)
        return n

    def active(self) -> list[AlertRecord]:
        return [r for eng in self.engines.values() for r in eng.active()]

    # -- evaluation (on the loop) ----------------------------------------------------------------

    def evaluate(self, state: FleetState, now: float, *, blind: bool = False) -> list[Transition]:
        """One evaluation. Never raises: a failure costs this evaluation only (logged, counted)."""
        t0 = time.perf_counter()
        try:
            conds = {} if blind else self.rules.conditions(state, now)
            held = _hold_all if blind else _hold_but_feed if self.rules.stalled else _hold_none
            out: list[Transition] = []
            for place in list(self.engines.keys() | conds.keys()):
                eng = self.engines.get(place)
                if (eng is not None and not blind and place.kind == "node" and place not in conds
                        and (place.cluster, place.name) not in state.nodes):
                    self._forgotten(place, eng, now)
                    continue
                if eng is None:
                    eng = self._engine(place, self.rules.identities[place], now)
                trs = eng.step(conds.get(place, ()), now, held)
                if not trs:
                    continue
                out += trs
                self._after(eng, trs, now)
                if any(t.record.status == "resolved" for t in trs) and not eng.active():
                    del self.engines[place]
            return out
        except Exception:
            self.errors += 1
            if self.errors in (1, 10, 100) or self.errors % 1000 == 0:
                log.exception("fleet: rule evaluation failed (%d times so far); going on", self.errors)
            return []
        finally:
            self.eval_seconds = time.perf_counter() - t0

    def _forgotten(self, place: Place, eng: AlertEngine, now: float) -> None:
        """The node left the state: its retained status was cleared (`nvmon forget`). Its alerts end
        now, in the database, without a page: a resolved node.offline would say it came back."""
        ended = [replace(r.with_status("resolved", now), summary=f"{r.summary} (forgotten: node decommissioned)")
                 for r in eng.active()]
        for r in ended:
            log.info("fleet alert forgotten: %s", describe(r))
        self._unsaved.keep(eng.take_dirty(now, force=True) + ended)
        self._wake.set()
        del self.engines[place]

    def _after(self, eng: AlertEngine, trs: list[Transition], now: float) -> None:
        for tr in trs:
            r = tr.record
            paged = r.status == "firing" or (r.status == "resolved" and r.fired_at is not None)
            log.log(logging.INFO if paged else logging.DEBUG, "fleet alert %s: %s", r.status, describe(r))
        self._unsaved.keep(eng.take_dirty(now))
        self._wake.set()
        notify = eng.to_notify(trs, now)
        if notify:
            try:
                self.notifier.submit(notify)
            except Exception:  # the Notifier contract says it never raises; hold it to that here
                log.exception("fleet: notifier failed")

    def set_controls(self, acks, silences) -> None:
        self._acks, self._silences = dict(acks), tuple(silences)
        by_fp: dict[str, list[tuple[int, float]]] = {}
        for (fp, start_ms), at in self._acks.items():
            by_fp.setdefault(fp, []).append((start_ms, at))
        for eng in self.engines.values():
            eng.set_controls(_twin_acks(self._acks, by_fp, eng.active()), self._silences)

    def apply_controls(self) -> None:
        """The database's and the shared acks/silences to every engine; the active alerts and the
        silenced ones to the notifier (no repeat pages for acked or silenced ones; a new ack goes on
        to PagerDuty hooks)."""
        now = self.clock()
        self.set_controls(*merge(self._local, self.shared.controls(now)))
        active, silenced = [], []
        for eng in self.engines.values():
            for r in eng.active():
                active.append(r)
                if eng.silenced(r, now):
                    silenced.append(r.fingerprint)
        controls = getattr(self.notifier, "controls", None)
        if controls is not None:
            controls(active, silenced)
        elif (quiet := getattr(self.notifier, "quiet", None)) is not None:
            quiet([r.fingerprint for r in active if r.acked_at is not None] + silenced)

    # -- persistence ----------------------------------------------------------------------------

    async def persist_loop(self) -> None:
        """Save episodes as they change, read acks/silences back, prune now and then. A database
        that fails keeps changes in memory and is retried; evaluation never waits for it."""
        if self.store is None:
            return
        outage, maintained = Outage(log, "fleet", "fleet: database writable again"), time.monotonic()
        while True:
            await woken(self._wake, CONTROLS_EVERY_S)
            self.apply_controls()  # shared ones apply even while the database is failing
            try:
                now = self.clock()
                for eng in self.engines.values():  # counts of long-running alerts, every COUNT_FLUSH_S
                    self._unsaved.keep(eng.take_dirty(now))
                await self._unsaved.save(self.store, self.clock())
                await self._shared_saved.save(self.store, self.shared.controls(now)[1])
                self._local = await asyncio.to_thread(self.store.alert_controls, now)
                self.apply_controls()
                if time.monotonic() - maintained > MAINTAIN_EVERY_S:
                    maintained = time.monotonic()
                    await asyncio.to_thread(self.store.maintain, now)
            except StoreError as e:
                outage.failed(e)
                await asyncio.sleep(5.0)
                continue
            outage.ok()

    def flush(self) -> None:
        """Write what is unsaved, counts included (at shutdown, in a thread). Raises StoreError."""
        now = self.clock()
        for eng in list(self.engines.values()):
            self._unsaved.keep(eng.take_dirty(now, force=True))
        if self.store is not None:
            self._unsaved.flush(self.store, now)
