"""The daemon's store writer: one thread that owns the node's writes of samples to SQLite.

The event loop hands it each Sample with `put()`, which never blocks. The thread writes what has
arrived in one transaction, runs maintenance (rollups, pruning) between writes, and while the
database is unwritable keeps a bounded backlog and retries with backoff. Nothing comes back to the
event loop per tick: on a VM a loop wake-up costs more CPU than the write itself, so the writer
reports through counters and the log only.

    loop ── put(sample) ──► incoming (≤ backlog) ──► thread: backlog (≤ backlog) ──► Store.write_many
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from nvmon.model import Sample
from nvmon.store import StoreError

log = logging.getLogger("nvmon.daemon")


class StoreWriter:
    """Writes samples to `store` from its own thread. Counters (each written by one thread only):
    `stored`, `errors` (failed writes, retried), `dropped` (samples never stored)."""

    def __init__(self, store, *, backlog: int = 120, maintain_every_s: float = 60.0, name: str = "nvmon-store"):
        self.store = store
        self.backlog = backlog
        self.maintain_every_s = maintain_every_s
        self.stored = 0
        self.errors = 0
        self._dropped_put = 0  # by put(), on the loop: the thread was stuck in one long call
        self._dropped_backlog = 0  # by the thread: the database stayed unwritable too long
        self._incoming: collections.deque[Sample] = collections.deque()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def dropped(self) -> int:
        return self._dropped_put + self._dropped_backlog

    def start(self) -> None:
        self._thread.start()

    def put(self, sample: Sample) -> None:
        """Queue one sample for the thread (never blocks; the oldest is dropped when full)."""
        inc = self._incoming
        if len(inc) >= self.backlog:
            try:
                inc.popleft()
                self._dropped_put += 1
            except IndexError:  # the thread took everything meanwhile
                pass
        inc.append(sample)
        self._wake.set()

    def stop(self, timeout_s: float) -> bool:
        """Write what is queued (one last attempt, even while failing) and end the thread; wait at
        most `timeout_s`. Blocks: call it in a thread. False if the thread is still busy (a hung
        disk); it is a daemon thread and ends with the process."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        backlog: collections.deque[Sample] = collections.deque()
        opened = failing = False
        retry_at, backoff, last_report = 0.0, 2.0, 0.0
        maintain_at = time.monotonic() + self.maintain_every_s
        while True:
            now = time.monotonic()
            wait = maintain_at - now
            if backlog:
                wait = min(wait, retry_at - now)
            self._wake.wait(max(wait, 0.0))
            self._wake.clear()  # before taking what came: a put() after this wakes the next wait
            inc = self._incoming
            while inc:
                backlog.append(inc.popleft())
            while len(backlog) > self.backlog:
                backlog.popleft()
                self._dropped_backlog += 1
            stopping = self._stopping
            now = time.monotonic()
            if backlog and (now >= retry_at or stopping):
                try:
                    if not opened:
                        self.store.open()
                        opened = True
                    batch = list(backlog)
                    self.store.write_many(batch)
                except Exception as e:  # StoreError: the disk; anything else, a bug: retried either way
                    self.errors += 1
                    if not isinstance(e, StoreError):
                        log.exception("store: unexpected error writing %d ticks; retrying", len(backlog))
                    elif stopping:
                        log.error("store flush on stop: %s; %d ticks not stored", e, len(backlog))
                    elif not failing or now - last_report > 60:
                        log.error("store: %s; keeping up to %d ticks in memory and retrying", e, self.backlog)
                        last_report = now
                    failing = True
                    retry_at, backoff = now + backoff, min(backoff * 2, 30.0)
                else:
                    self.stored += len(batch)
                    backlog.clear()
                    if failing:
                        log.warning("store: writable again; wrote %d queued ticks (%d dropped while failing)",
                                    len(batch), self.dropped)
                        failing, backoff = False, 2.0
            if stopping:
                return
            if now >= maintain_at:
                maintain_at = now + self.maintain_every_s
                if opened and not failing:
                    self._maintain()

    def _maintain(self) -> None:
        try:
            self.store.maintain(time.time())
        except StoreError as e:
            log.error("store maintenance: %s", e)
        except Exception:  # noqa: BLE001 - as for writes: log it, keep the writer
            log.exception("store maintenance: unexpected error")
