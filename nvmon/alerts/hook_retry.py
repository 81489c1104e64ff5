"""One hook's notifications waiting for delivery, each on its own retry schedule.

`Deliveries` holds what a hook's intake (`hook_dispatch`) made of its alerts, each notification
also written to the outbox (`hook_outbox`), and attempts whichever is due first, once: a failure
schedules that notification's own next attempt (exponential backoff with jitter, or the server's
Retry-After) and the next due one goes. So a notification that keeps failing never holds up the
others, and a resolve waits at most for one attempt in flight (`timeout_s`). A resolve also takes
its alert out of a firing still waiting for a retry (sending the firing after it would reopen the
incident).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

import httpx

from nvmon.alerts.hook_delivery import DeliveryError, Hook
from nvmon.alerts.hook_outbox import Outbox, Pending
from nvmon.wire.mqtt import Backoff

log = logging.getLogger("nvmon.hooks")


@dataclass(slots=True)
class Due:
    """A notification waiting for its next attempt (its own retry schedule)."""

    p: Pending
    at: float  # loop time of the next attempt
    seq: int  # order of arrival among those due at once
    attempt: int = 0  # attempts made so far
    superseded: set[str] = field(default_factory=set)  # its alerts with a newer notification: not retried


class Deliveries:
    """A hook's pending notifications and its delivery loop (`run`), with its counters."""

    def __init__(self, hook: Hook, backoff: Backoff, outbox: Outbox):
        self.hook = hook
        self.cfg = hook.config
        self.backoff = backoff
        self.outbox = outbox
        self.pending: list[Due] = []  # made, not yet delivered (each also in the outbox)
        self._seq = 0
        self._wake = asyncio.Event()
        self._inflight: Due | None = None
        self.sent = self.failed = 0
        self.last_error: str | None = None
        self.last_sent_at: float | None = None

    def add(self, p: Pending, now: float) -> None:
        self._seq += 1
        self.pending.append(Due(p, now, self._seq))
        self._wake.set()

    def supersede(self, fps: set[str], status: str) -> None:
        """A newer notification about alerts `fps` (`status`) is made. An alert resolved while its
        firing (or ack) still waits for a retry: that is not sent after the resolve (it would
        reopen the incident). A repeat of a firing still waiting: only the newer one goes (no
        pile of repeats while a receiver is down). One not tried yet (or in flight) goes first,
        as it came, but is not retried after the newer one."""
        older = ("firing", "acknowledged") if status == "resolved" else ("firing",) if status == "firing" else ()
        for d in list(self.pending):
            if d.p.status not in older:
                continue
            if d is self._inflight or d.attempt == 0:
                d.superseded |= fps
                continue
            self._drop(d, fps)

    def _drop(self, d: Due, fps: set[str]) -> None:
        """Take alerts `fps` out of a waiting notification (all of them: forget it)."""
        keep = [r for r in d.p.records if r.fingerprint not in fps]
        if len(keep) != len(d.p.records):
            if keep:
                d.p.n = max(0, d.p.n - (len(d.p.records) - len(keep)))
                d.p.records = keep
                self.outbox.update(d.p)
            else:
                self._finish(d)

    async def run(self, client: httpx.AsyncClient) -> None:
        """Attempt whichever notification is due first, once; a failure schedules its own retry
        (backoff, or the server's Retry-After) and the next due one goes: a notification that keeps
        failing never holds up the others."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                self._wake.clear()
                now = loop.time()
                d = min(self.pending, key=lambda x: (x.at, x.seq), default=None)
                if d is None or d.at > now:
                    delay = None if d is None else d.at - now
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await self._wake.wait()
                    continue
                self._inflight = d
                try:
                    await self._attempt(client, d, loop)
                finally:
                    self._inflight = None
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not stop this hook for good, nor the daemon
                log.exception("hook %s: internal error; continuing", self.hook.name)
                await asyncio.sleep(1.0)

    async def _attempt(self, client: httpx.AsyncClient, d: Due, loop: asyncio.AbstractEventLoop) -> None:
        hook, p = self.hook, d.p
        try:
            result = await hook.deliver(client, p.status, p.labels, p.records, p.grouped)
        except DeliveryError as e:
            if e.partial:  # some of several servers have it; the next re-send reaches the rest
                self._finish(d)
                self.sent += p.n
                self.last_sent_at = time.time()
                self.last_error = str(e)
                log.warning("hook %s: %d %s alert(s) delivered in part: %s", hook.name, p.n, p.status, e)
                return
            err = e
        except Exception as e:  # a payload bug (e.g. a value that is not JSON-able): no retry
            log.debug("hook %s: delivery raised", hook.name, exc_info=True)
            err = DeliveryError(hook.redact(f"internal error: {type(e).__name__}: {e}"), retryable=False)
        else:
            self._finish(d)
            self.sent += p.n
            self.last_sent_at = time.time()
            again = f" after {d.attempt + 1} attempts" if d.attempt else ""
            log.info("hook %s: %d %s alert(s) delivered%s (%s)", hook.name, p.n, p.status, again, result)
            return
        if err.retryable and d.attempt < self.cfg.retries and d.superseded:
            self._drop(d, d.superseded)  # a newer notification about them is sent instead
            if d not in self.pending:
                log.info("hook %s: %s alert(s) not retried: a newer notification replaces it", hook.name, p.status)
                return
        if err.retryable and d.attempt < self.cfg.retries:
            delay = err.retry_after if err.retry_after is not None else self.backoff.delay(d.attempt)
            log.debug("hook %s: attempt %d failed: %s; next in %.1f s", hook.name, d.attempt + 1, err, delay)
            d.attempt += 1
            d.at = loop.time() + delay
            return
        self._finish(d)
        self.failed += p.n
        self.last_error = str(err)
        log.warning("hook %s: %d %s alert(s) not delivered after %d attempt(s): %s", hook.name, p.n, p.status,
                    d.attempt + 1, err)

    def _finish(self, d: Due) -> None:
        with contextlib.suppress(ValueError):
            self.pending.remove(d)
        self.outbox.done(d.p)
