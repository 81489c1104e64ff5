"""The daemon's node alerts: evaluate each tick, persist, publish, notify.

    sampler ──► tick(sample) on the loop (≤ 1 ms): AlertEngine.evaluate
                 ├─► notifier.submit(firing / resolved, minus silenced)   never blocks
                 ├─► persist loop: episodes to SQLite (thread), acks + silences back from it,
                 │                 merged with the cluster's shared ones (MQTT, nvmon.alerts.shared)
                 └─► publish loop: the active set, retained, on …/alerts

Every failure is local: an engine bug costs that tick's evaluation (logged, counted), an
unwritable database keeps changes in memory and retries, a broker away delays the publish.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from nvmon.alerts.engine import AlertEngine, Notifier, NullNotifier, Transition, wire_alert
from nvmon.alerts.model import AlertRecord
from nvmon.alerts.rules import NodeRules
from nvmon.alerts.persist import Outage, SharedSilencesSaver, UnsavedAlerts
from nvmon.alerts.shared import SharedControls, merge
from nvmon.model import Sample
from nvmon.specs import NodeSpec
from nvmon.store import StoreError
from nvmon.wire.contract import control_topic

log = logging.getLogger("nvmon.alerts")

CONTROLS_EVERY_S = 2.0  # acks and silences made with `nvmon alerts` are honoured within this (+ a tick)
CONTROLS_REREAD_S = 60.0  # the database's acks and silences are re-read at least this often


def _where(r: AlertRecord) -> str:
    parts = []
    if r.gpu is not None:
        parts.append(f"GPU {r.gpu}")
    if r.link is not None:
        parts.append(f"link {r.link}")
    if r.device is not None:
        parts.append(f"{r.device}" + (f":{r.port}" if r.port is not None else ""))
    return " ".join(parts) or "node"


class DaemonAlerts:
    def __init__(self, cfg, *, node: str, node_spec: NodeSpec, store, publisher=None,
                 notifier: Notifier | None = None, clock: Callable[[], float] = time.time, judge=None):
        a = cfg.alerts
        self.rules = NodeRules(a, cluster=cfg.node.cluster, node=node, rack=cfg.node.rack, labels=cfg.node.labels,
                               node_spec=node_spec, interval_s=cfg.sampling.interval_s, judge=judge)
        self.engine = AlertEngine(self.rules, started_at=clock(), startup_grace_s=a.startup_grace_s,
                                  tick_slack_s=cfg.sampling.interval_s / 4)
        self.store, self.publisher = store, publisher
        self.notifier: Notifier = notifier or NullNotifier()
        self.clock = clock
        self.errors = 0  # ticks whose evaluation failed
        self._resets = 0  # the store's resets already noted (its database deleted, replaced, corrupt)
        self.eval_seconds = 0.0  # the latest evaluation's cost
        self.eval_seconds_max = 0.0
        self._unsaved = UnsavedAlerts()  # episodes not yet in the database
        self._restored = False
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._notify_errors = 0
        # Acks and silences: the node's own (SQLite, `nvmon alerts`) and the cluster's shared set
        # (retained on MQTT, heard on the publisher's connection), merged for the engine.
        self._local: tuple[dict, list] = ({}, [])
        self._local_due = 0.0  # time.monotonic() when the database's controls are re-read anyway
        self._housekeeping_at = 0.0  # time.monotonic() of the next tick that looks at controls
        self.shared = SharedControls(on_change=self._wake.set, max_silence_s=a.max_silence_h * 3600)
        self._shared_saved = SharedSilencesSaver()  # what `nvmon alerts` reads to say `silenced`
        if publisher is not None and hasattr(publisher, "listen"):
            publisher.listen(control_topic(cfg.node.cluster), self.shared.apply)
        # (code, severity, status) → active alerts, zeros included for every enabled rule; replaced
        # whole on the loop, so the exporter's HTTP thread can read it at any time.
        self.counts: dict[tuple[str, str, str], int] = self._count()

    def _count(self) -> dict[tuple[str, str, str], int]:
        counts = {(code, rule.severity, st): 0 for code, rule in self.rules.book.items() for st in ("pending", "firing")}
        for r in self.engine.active():
            key = (r.code, r.severity, r.status)
            counts[key] = counts.get(key, 0) + 1
        return counts

    # -- on the loop, every tick ---------------------------------------------------------------

    def tick(self, sample: Sample) -> list[Transition]:
        """Evaluate one sample. Never raises: a failure costs this tick's evaluation only."""
        t0 = time.perf_counter()
        try:
            resets = getattr(self.store, "resets", 0)  # written by the store's thread; an int, read once
            if resets > self._resets:  # its database was started anew since the last tick: an alert
                self._resets = resets
                self.rules.note("store.reset", self.store.last_reset or "database started anew", value=resets)
            transitions = self.engine.evaluate(sample, sample.ts)
            notify = self.engine.to_notify(transitions, sample.ts)
            dirty = self.engine.take_dirty(sample.ts)
        except Exception:
            self.errors += 1
            if self.errors in (1, 10, 100) or self.errors % 1000 == 0:
                log.exception("alert evaluation failed (%d times so far); sampling goes on", self.errors)
            return []
        finally:
            self.eval_seconds = took = time.perf_counter() - t0
            self.eval_seconds_max = max(self.eval_seconds_max, took)
        for tr in transitions:
            r = tr.record
            level = logging.INFO if r.status == "firing" or (r.status == "resolved" and r.fired_at) else logging.DEBUG
            log.log(level, "alert %s: %s %s on %s (%s): %s", r.status, r.severity, r.code, _where(r),
                    r.fingerprint, r.summary)
        if dirty:
            self._unsaved.keep(dirty)
            self._wake.set()
        if transitions:
            self._changed.set()
            self.counts = self._count()
        if notify:
            try:
                self.notifier.submit(notify)
            except Exception:  # the Notifier contract says it never raises; hold it to that here
                self._notify_errors += 1
                if self._notify_errors in (1, 100):
                    log.exception("alert notifier failed (%d times so far)", self._notify_errors)
        self._housekeeping()
        return transitions

    def _housekeeping(self) -> None:
        """Every CONTROLS_EVERY_S, from a tick (the ticks are the clock: no timer of its own wakes
        the loop): apply the acks and silences again (a silence may have ended), and wake the
        persist loop when it has work: another process wrote acks or silences, the minutely re-read,
        a retry of unsaved alerts, or the restore still to do."""
        now = time.monotonic()
        if now < self._housekeeping_at:
            return
        self._housekeeping_at = now + CONTROLS_EVERY_S
        try:
            self.apply_controls()
        except Exception:  # noqa: BLE001 - as for evaluation: cost this round only
            log.exception("alerts: applying acks and silences failed")
        if self.store.others_wrote or now >= self._local_due or len(self._unsaved) or not self._restored:
            self._wake.set()

    def wire_set(self):
        return [wire_alert(r) for r in self.engine.active()]

    # -- start-up -------------------------------------------------------------------------------

    async def restore(self) -> None:
        """Take firing/pending alerts back from the database. Failure is logged; the persist
        loop retries it before its first write, so a stale episode never stays 'firing'."""
        try:
            await self._restore()
        except StoreError as e:
            log.error("alerts: cannot read earlier alerts (%s); retrying", e)

    async def _restore(self) -> None:
        records = await asyncio.to_thread(self.store.load_alerts)
        self._restored = True
        now = self.clock()
        tracked = {r.fingerprint: r.starts_at for r in self.engine.active()}
        stale = [r.with_status("resolved", now) for r in records
                 if r.fingerprint in tracked and tracked[r.fingerprint] != r.starts_at]
        n = self.engine.restore(records, now)
        if stale:  # episodes superseded while the database was unreadable
            self._unsaved.keep(stale)
        if n:
            log.info("alerts: %d active alerts restored from the database (no new pages for them)", n)
            self._changed.set()

    # -- tasks ----------------------------------------------------------------------------------

    async def persist_loop(self) -> None:
        outage, retry_at = Outage(log, "alerts", "alerts: database back; alert state saved"), 0.0
        while True:
            await self._wake.wait()  # set by the ticks' housekeeping, new dirty records, shared controls
            self._wake.clear()
            self.apply_controls()  # shared ones apply even while the database is failing
            if time.monotonic() < retry_at:
                continue
            try:
                if not self._restored:
                    await self._restore()
                await self._unsaved.save(self.store, self.clock())
                await self._shared_saved.save(self.store, self.shared.controls(self.clock())[1])
                # Only when another process wrote (`nvmon alerts ack`): a thread hand-off every
                # 2 s would cost more CPU than the rules themselves.
                if self.store.others_wrote or time.monotonic() >= self._local_due:
                    self._local = await asyncio.to_thread(self.store.alert_controls, self.clock())
                    self._local_due = time.monotonic() + CONTROLS_REREAD_S
                    self.apply_controls()
            except StoreError as e:
                retry_at = outage.failed(e) + 5.0
                continue
            outage.ok()

    def apply_controls(self) -> None:
        """Hand the engine the node's and the cluster's acks and silences, and tell the notifier
        which alerts are active, acked or silenced now (no repeat pages for acked or silenced ones;
        a new ack goes on to PagerDuty hooks)."""
        now = self.clock()
        self.engine.set_controls(*merge(self._local, self.shared.controls(now)))
        active = self.engine.active()
        silenced = [r.fingerprint for r in active if self.engine.silenced(r, now)]
        controls = getattr(self.notifier, "controls", None)
        if controls is not None:
            controls(active, silenced)
        elif (quiet := getattr(self.notifier, "quiet", None)) is not None:
            quiet([r.fingerprint for r in active if r.acked_at is not None] + silenced)

    async def publish_loop(self) -> None:
        """Publish the active set whenever it changes (the publisher re-sends it on reconnect)."""
        if self.publisher is None:
            return
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await self.publisher.publish_alerts(self.wire_set())
            except Exception:  # an alert that breaks the wire contract: a bug, not a reason to stop
                log.exception("alerts: active set not published")

    def flush(self) -> None:
        """Write what is unsaved, counts included (at shutdown, in a thread). Raises StoreError."""
        self._unsaved.keep(self.engine.take_dirty(self.clock(), force=True))
        self._unsaved.flush(self.store, self.clock())
