"""`HookDispatcher`: the rule engine's notifier. It takes alert transitions and delivers them to
every configured hook, without ever blocking or failing the caller.

One asyncio worker per hook, fed by its own bounded queue: a slow or failing hook delays only
itself (a full queue drops that hook's newest alerts, counted and logged once per episode).
Per hook: filters (`on`, `min_severity`), grouping (`group_wait_s` / `group_by`: alerts of one
status and group that arrive within the wait go out as one notification), a repeat interval for
alerts still firing, retries with exponential backoff and jitter (a server's Retry-After wins),
and statistics. Each notification has its own retry schedule: while one waits for its next
attempt the others go (a resolve never waits behind another alert's failing firing, only behind
at most one attempt in flight), and a newer notification (a resolve, a repeat) supersedes its
alert's firing still waiting. Every notification is written to the outbox (`hook_outbox`, with
the daemon's `<db>.outbox`) before its first attempt and removed when delivered or given up, so a
stop or crash loses none.
Kinds with `keep_alive_s` (Alertmanager's API) re-send every firing alert at that interval,
acked or not, so that Alertmanager does not resolve it by itself; kinds with `sends_acks`
(PagerDuty) get an `acknowledged` notification when someone acks an alert they paged.

Wiring (daemon or fleet aggregator):

    dispatcher = HookDispatcher(cfg.hooks, outbox=Outbox(path))  # validated HookConfigs; outbox optional
    for problem in dispatcher.check():              # missing secret files etc., one line each
        log.warning(problem)
    tg.create_task(dispatcher.run(), name="hooks")  # stops when cancelled
    engine = ...(notifier=dispatcher)               # dispatcher.submit(records) on transitions
    dispatcher.controls(active, silenced)           # whenever acks/silences are applied (every 2 s)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import httpx

from nvmon.aio import raise_if_cancelled
from nvmon.alerts.hook_delivery import DeliveryError, Hook, make_client
from nvmon.alerts.hook_outbox import Outbox, Pending
from nvmon.alerts.hook_retry import Deliveries
from nvmon.alerts.hook_payloads import group_labels
from nvmon.alerts.hooks import HOOK_STATUSES, HookConfig, HookConfigError, check_hooks
from nvmon.alerts.model import AlertRecord
from nvmon.wire.mqtt import Backoff

log = logging.getLogger("nvmon.hooks")

DEFAULT_QUEUE_SIZE = 1000
MAX_TRACKED_FIRING = 10_000  # alerts remembered per hook for repeat_interval_s
HOOK_BACKOFF = Backoff(initial_s=1.0, max_s=60.0)


@dataclass(frozen=True, slots=True)
class HookStats:
    """One hook's counters since start. Counts are alert notifications (one alert's firing or
    resolved to this hook), so a grouped notification of three alerts counts three."""

    name: str
    type: str
    target: str  # safe to show: the program, or scheme://host/…
    sent: int
    failed: int  # gave up after the retries
    dropped: int  # never attempted: the hook's queue was full
    queued: int  # waiting in the queue now
    last_error: str | None  # one line, secrets redacted
    last_sent_at: float | None  # unix seconds of the last successful delivery


@dataclass(slots=True)
class _Batch:
    status: str
    labels: dict[str, str]
    records: dict[str, AlertRecord]  # fingerprint → newest record
    grouped: bool
    deadline: float = 0.0  # loop time it is due


@dataclass(slots=True)
class _Firing:
    record: AlertRecord
    group: tuple[str, ...]  # its group_by values
    next_repeat: float  # loop time; inf without repeat_interval_s


@dataclass(frozen=True, slots=True)
class _Ack:
    """An ack to send on (kinds with `sends_acks`), queued behind the alert's own transitions."""

    record: AlertRecord


class _Worker:
    """Makes one hook's notifications (intake) and delivers them one attempt at a time, each on its
    own retry schedule."""

    def __init__(self, hook: Hook, queue_size: int, backoff: Backoff, outbox: Outbox):
        self.hook = hook
        self.outbox = outbox
        self.deliveries = Deliveries(hook, backoff, outbox)
        self.cfg: HookConfig = hook.config
        self.queue: asyncio.Queue[AlertRecord | _Ack | None] = asyncio.Queue(maxsize=queue_size)
        self.backoff = backoff
        self.dropped = 0
        self._overflowing = False
        self.draining = False  # stopping: deliver grouped alerts now instead of at their deadline
        self._ready: deque[_Batch] = deque()
        self._groups: dict[tuple, _Batch] = {}
        self._firing: dict[str, _Firing] = {}
        self.quiet: frozenset[str] = frozenset()  # acked or silenced now: no repeats (HookDispatcher.quiet)
        self._acked: set[tuple[str, float]] = set()  # (fingerprint, starts_at) whose ack went to the queue
        # Re-send firing alerts this often (0: never): the config's, else the kind's keep-alive.
        self.repeat_s: float = self.cfg.repeat_interval_s or hook.kind.keep_alive_s or 0.0

    # -- intake (called from submit: must not block or raise) --

    def offer(self, rec: AlertRecord) -> None:
        if rec.status not in HOOK_STATUSES or not self.cfg.wants_severity(rec.severity):
            return
        self._put(rec)

    def _wants_firing(self, rec: AlertRecord) -> bool:
        return "firing" in self.cfg.on and self.cfg.wants_severity(rec.severity)

    def sync(self, active: dict[str, AlertRecord], silenced: frozenset[str], now: float) -> None:
        """The engine's active alerts now (HookDispatcher.controls): forget firing alerts that
        ended unseen (resolved while silenced: no resolve comes), queue acks to send on, and for
        keep-alive kinds take up firing alerts this hook never saw fire (restored after a restart)."""
        for fp in [fp for fp in self._firing if fp not in active]:
            del self._firing[fp]
        firing = [r for r in active.values() if r.status == "firing"]
        kind = self.hook.kind
        if kind.keep_alive_s:
            self.quiet = frozenset()  # an ack is not an end: Alertmanager must keep hearing of it
            adopted = False
            for r in firing:
                if r.fingerprint not in self._firing and r.fingerprint not in silenced and self._wants_firing(r):
                    group = tuple(group_labels(r, self.cfg.group_by).values())
                    self._firing[r.fingerprint] = _Firing(r, group, now)  # due now
                    adopted = True
            if adopted:
                self._put(None)  # wake the worker: something is due before its current deadline
        else:
            self.quiet = frozenset(fp for fp, r in active.items() if r.acked_at is not None or fp in silenced)
        if kind.sends_acks:
            for r in firing:
                key = (r.fingerprint, r.starts_at)
                if r.acked_at is not None and key not in self._acked and self._wants_firing(r):
                    self._acked.add(key)
                    self._put(_Ack(r))
            self._acked &= {(r.fingerprint, r.starts_at) for r in active.values()}

    def _put(self, item: AlertRecord | _Ack | None) -> None:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            if item is None:
                return  # a wake-up: the full queue wakes the worker anyway
            self.dropped += 1
            if not self._overflowing:
                self._overflowing = True
                log.warning("hook %s: queue full (%d), dropping alerts until it drains (%d dropped so far)",
                            self.hook.name, self.queue.maxsize, self.dropped)

    def _accept(self, rec: AlertRecord | _Ack, now: float) -> None:
        cfg = self.cfg
        if isinstance(rec, _Ack):  # one acknowledgement, at once, for the one alert
            r = rec.record
            self._ready.append(_Batch("acknowledged", group_labels(r, cfg.group_by), {r.fingerprint: r}, grouped=False))
            return
        fp = rec.fingerprint
        labels = group_labels(rec, cfg.group_by)
        if rec.status == "firing":
            if fp in self._firing or len(self._firing) < MAX_TRACKED_FIRING:
                repeat = now + cfg.group_wait_s + self.repeat_s if self.repeat_s > 0 else math.inf
                self._firing[fp] = _Firing(rec, tuple(labels.values()), repeat)
        else:
            self._firing.pop(fp, None)
        if rec.status not in cfg.on:
            return
        if cfg.group_wait_s <= 0:
            self._ready.append(_Batch(rec.status, labels, {fp: rec}, grouped=False))
            return
        key = (rec.status, tuple(labels.values()))
        batch = self._groups.get(key)
        if batch is None:
            batch = self._groups[key] = _Batch(rec.status, labels, {}, grouped=True, deadline=now + cfg.group_wait_s)
        batch.records[fp] = rec

    # -- scheduling --

    @property
    def idle(self) -> bool:
        """Nothing queued, grouped or waiting for delivery (repeats of firing alerts do not count)."""
        return self.queue.empty() and not self._ready and not self._groups and not self.deliveries.pending

    def _next_due(self, now: float) -> float | None:
        """Seconds until something is due (0: now), None if nothing is scheduled."""
        if self._ready or (self.draining and self._groups):
            return 0.0
        times = [b.deadline for b in self._groups.values()]
        if self._firing and "firing" in self.cfg.on and self.repeat_s > 0:
            times.append(min(f.next_repeat for f in self._firing.values()))
        return max(0.0, min(times) - now) if times else None

    def _due(self, now: float) -> list[_Batch]:
        out = list(self._ready)
        self._ready.clear()
        for key, batch in list(self._groups.items()):
            if batch.deadline <= now or self.draining:
                out.append(batch)
                del self._groups[key]
        cfg = self.cfg
        if self._firing and "firing" in cfg.on and self.repeat_s > 0:
            repeats: dict[tuple, _Batch] = {}
            for fp, f in self._firing.items():
                if f.next_repeat > now:
                    continue
                f.next_repeat = now + self.repeat_s
                if fp in self.quiet:  # acked or silenced since it fired: someone is on it
                    continue
                labels = dict(zip(cfg.group_by, f.group, strict=True))
                if self.hook.kind.keep_alive_s and cfg.group_wait_s <= 0:  # one request for every re-send due
                    repeats.setdefault((), _Batch("firing", {}, {}, grouped=False)).records[fp] = f.record
                    continue
                if cfg.group_wait_s <= 0:
                    out.append(_Batch("firing", labels, {fp: f.record}, grouped=False))
                    continue
                repeats.setdefault(f.group, _Batch("firing", labels, {}, grouped=True)).records[fp] = f.record
            out.extend(repeats.values())
        return out

    # -- the loop: intake (queue → batches → outbox) and delivery (one schedule per notification) --

    async def run(self, client: httpx.AsyncClient) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._intake_loop(), name=f"hook-{self.hook.name}-intake")
            tg.create_task(self.deliveries.run(client), name=f"hook-{self.hook.name}-deliver")

    async def _intake_loop(self) -> None:
        """Turn queued transitions into notifications as they come (or when their group's wait
        or repeat is due) and write each to the outbox: never held up by a delivery."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                delay = self._next_due(loop.time())
                rec: AlertRecord | _Ack | None = None
                try:
                    async with asyncio.timeout(delay):
                        rec = await self.queue.get()  # None: a wake-up from drain() or sync()
                except TimeoutError:
                    pass
                raise_if_cancelled()
                now = loop.time()
                while rec is not None:
                    self._accept(rec, now)
                    rec = None if self.queue.empty() else self.queue.get_nowait()
                self._overflowing = False
                for batch in self._due(now):
                    self._schedule(batch, now)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not stop this hook for good, nor the daemon
                log.exception("hook %s: internal error; continuing", self.hook.name)
                await asyncio.sleep(1.0)

    def _schedule(self, batch: _Batch, now: float) -> None:
        """A due batch becomes one notification per request (PagerDuty: one per alert), each
        written to the outbox before its first attempt, due now."""
        records = list(batch.records.values())
        if self.hook.kind.whole_group:
            # Alertmanager sends a group's whole state each time: every alert still firing in the
            # group rides along, so receivers keyed on groupKey see the full set.
            group = tuple(batch.labels.values())
            records += [f.record for fp, f in self._firing.items() if f.group == group and fp not in batch.records]
        self.deliveries.supersede({r.fingerprint for r in batch.records.values()}, batch.status)
        parts = [[r] for r in records] if self.hook.one_alert_per_delivery else [records]
        for part in parts:
            p = Pending(None, self.hook.name, batch.status, batch.labels, part, batch.grouped,
                        min(len(part), len(batch.records)), time.time())
            self.outbox.add(p)
            self.deliveries.add(p, now)

    def stats(self) -> HookStats:
        d = self.deliveries
        return HookStats(self.hook.name, self.cfg.type, self.hook.target, d.sent, d.failed, self.dropped,
                         self.queue.qsize() + len(d.pending), d.last_error, d.last_sent_at)


class HookDispatcher:
    """Delivers alert transitions to the configured hooks. `submit()` never blocks or raises;
    `run()` does the work until cancelled (put it in the daemon's TaskGroup)."""

    def __init__(self, hooks: Iterable[HookConfig], *, queue_size: int = DEFAULT_QUEUE_SIZE,
                 backoff: Backoff = HOOK_BACKOFF, environ: Mapping[str, str] | None = None,
                 outbox: Outbox | None = None):
        configs = check_hooks(tuple(hooks))  # names any unnamed hook; refuses duplicate names
        # Where notifications wait until delivered: the daemon's outbox file; else memory only.
        self.outbox = outbox if outbox is not None else Outbox(None)
        self._workers = [_Worker(Hook(c, environ=environ), queue_size, backoff, self.outbox) for c in configs]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._submit_errors = 0

    @property
    def hooks(self) -> list[Hook]:
        return [w.hook for w in self._workers]

    def check(self) -> list[str]:
        """Problems visible now (an unreadable secret file, an unset variable), one line each,
        without secrets. Deliveries to such a hook fail (and are retried) until it is fixed."""
        problems = []
        for w in self._workers:
            try:
                w.hook.secret()
                w.hook.headers_file()
                if w.cfg.tls:
                    w.hook.tls_context()
            except (HookConfigError, DeliveryError) as e:
                problems.append(str(e))
        return problems

    def submit(self, records: list[AlertRecord]) -> None:
        """Queue `records` (transitions; `pending` ones are ignored) for every hook that wants them.
        Call from the event loop; from another thread it is handed over to the loop."""
        try:
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # not on a loop thread
                if self._loop is not None and not self._loop.is_closed():
                    self._loop.call_soon_threadsafe(self._offer, list(records))
                    return
            self._offer(records)
        except Exception:  # never fail the caller (the rule engine's tick)
            self._submit_errors += 1
            if self._submit_errors == 1:
                log.exception("hooks: could not queue alerts")

    def controls(self, active: Iterable[AlertRecord], silenced: Iterable[str] = ()) -> None:
        """The alerts active now (pending and firing, `acked_at` set where acked) and the
        fingerprints a silence matches, whenever the engine's acks and silences are applied. Repeats
        of acked or silenced alerts stop (as with `quiet`), except for keep-alive kinds
        (Alertmanager: an unrepeated alert expires there); a new ack of an alert a PagerDuty hook
        paged goes to it as `acknowledge`; firing alerts nobody resolved are forgotten once they
        leave the set. Call from the event loop."""
        current = {r.fingerprint: r for r in active}
        quiet = frozenset(silenced)
        now = self._loop.time() if self._loop is not None else time.monotonic()
        for w in self._workers:
            w.sync(current, quiet, now)

    def quiet(self, fingerprints: Iterable[str]) -> None:
        """The alerts acked or silenced now (the engine knows; the dispatcher only saw them fire):
        their repeats (`repeat_interval_s`) are skipped while they stay in this set. Resolves are
        unaffected. Call from the event loop with the whole current set each time."""
        fps = frozenset(fingerprints)
        for w in self._workers:
            if not w.hook.kind.keep_alive_s:  # Alertmanager: an unrepeated alert expires there
                w.quiet = fps

    def _offer(self, records: Iterable[AlertRecord]) -> None:
        for rec in records:
            for w in self._workers:
                w.offer(rec)

    async def run(self) -> None:
        """Deliver until cancelled. Returns at once when no hook is configured."""
        self._loop = asyncio.get_running_loop()
        if not self._workers:
            return
        log.info("hooks: %s", ", ".join(f"{w.hook.name} ({w.cfg.type} → {w.hook.target})" for w in self._workers))
        workers = {w.hook.name: w for w in self._workers}
        now = self._loop.time()
        for p in self.outbox.load(set(workers)):  # what the last run left: due now, in order
            workers[p.hook].deliveries.add(p, now)
        try:
            async with make_client() as client, asyncio.TaskGroup() as tg:
                for w in self._workers:
                    tg.create_task(w.run(client), name=f"hook-{w.hook.name}")
        finally:
            for w in self._workers:  # the hooks' own TLS clients
                with contextlib.suppress(Exception):
                    await asyncio.shield(w.hook.aclose())
            self.outbox.close()

    async def drain(self, timeout_s: float) -> bool:
        """On stop, before cancelling `run()`: deliver what is queued or grouped now (retries
        included), for at most `timeout_s`. True if everything went out; what did not stays in the
        outbox for the next start (with an outbox file)."""
        if not self._workers:
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for w in self._workers:
            w.draining = True
            with contextlib.suppress(asyncio.QueueFull):
                w.queue.put_nowait(None)  # wake a worker waiting for its next deadline
        while loop.time() < deadline:
            if all(w.idle for w in self._workers):
                return True
            await asyncio.sleep(0.02)
        left = sum(w.queue.qsize() + len(w._ready) + len(w._groups) + len(w.deliveries.pending) for w in self._workers)
        kept = "; kept in the outbox for the next start" if self.outbox.persistent else ""
        log.warning("hooks: stopping with %d notification(s) not delivered%s", left, kept)
        return False

    async def stop(self, task: asyncio.Task, drain_s: float = 1.0, cancel_s: float = 0.5) -> None:
        """On stop: let the hooks deliver what is queued (≤ `drain_s`), then cancel `task` (the one
        running `run()`, kept outside the caller's TaskGroup) and wait ≤ `cancel_s` for it; what is
        left stays in the outbox. The daemon and nvmon fleet both stop their hooks this way."""
        if not task.done():
            await self.drain(drain_s)
        task.cancel()
        await asyncio.wait({task}, timeout=cancel_s)  # wait_for could wait on past its timeout
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.error("hooks: stopped with an error: %s", task.exception())

    def stats(self) -> list[HookStats]:
        return [w.stats() for w in self._workers]
