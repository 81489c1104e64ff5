"""The daemon's Prometheus endpoint: `/metrics` rendered from the latest `Sample`, never from hardware.

    daemon tick ──update(sample)──► snapshot (sample + integrated byte counters), one reference swap
                                   └─► (scraped every tick or so) render thread: page ready before the scrape
    scrape ──► page for this snapshot ready? ──yes──► bytes copied to the socket
                                            └─no──► render once (collector → text), keep, serve

A scrape never reads hardware and never waits for the event loop. The page is rendered at most once
per sample: lazily, in the first scrape after it (no scrapes, no cost), or — while Prometheus scrapes
about as often as the daemon samples — just ahead of the scrapes in one render thread, so that a
scrape is a copy of ready bytes (see `PrometheusExporter`). The audit behind `nvmon_audit_findings`
runs inside that rendering, so also at most once per sample.

The pieces: `collector.SampleCollector` (a `prometheus_client` Collector over the snapshot, in the
exporter's own registry next to prometheus_client's `ProcessCollector`), `exposition` (the text
format, with reuse between pages), `server.MetricsServer` (HTTP), `catalog` (what is exported).
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from nvmon.audit import Judge, Thresholds
from nvmon.catalog.compat import Line
from nvmon.export.collector import DaemonHealth, SampleCollector, Snapshot, advance
from nvmon.export.exposition import exposition
from nvmon.export.server import MetricsServer
from nvmon.model import Sample
from nvmon.specs import NodeSpec

__all__ = ["CONTENT_TYPE", "DaemonHealth", "PrometheusExporter", "Snapshot", "advance", "exposition"]

log = logging.getLogger("nvmon.export")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(slots=True)
class _Page:
    snapshot: Snapshot
    body: bytes
    gzipped: bytes | None = field(default=None)


class PrometheusExporter:
    """`/metrics` for one daemon. `start()` binds (raising `ListenError`, one line) and serves from a
    thread; `update(sample)` is all the daemon does per tick; `stop()` closes the socket.

    Rendering: at most once per sample. Lazily, in the first scrape after a sample; or, while
    Prometheus scrapes about as often as the daemon samples (scrapes no more than two sample
    intervals apart), ahead of the scrapes in one render thread woken by `update()`, so a scrape is
    a copy of ready bytes. While such a rendering runs, a scrape gets the previous tick's page
    instead of waiting for it.
    """

    def __init__(self, listen: str, *, node_spec: NodeSpec = NodeSpec(), thresholds: Thresholds = Thresholds(),
                 judge: Judge | None = None, node_info: Mapping[str, str] = {},
                 health: Callable[[], DaemonHealth | None] = lambda: None, process_metrics: bool = True,
                 compat: Line | None = None):
        """`judge`: the daemon's shared audit (its spec and `[alerts]` thresholds), so that
        `nvmon_audit_findings` is what its alerts see; without one, `node_spec` and `thresholds`."""
        self.listen = listen
        self.collector = SampleCollector(judge=judge or Judge(node_spec, thresholds), node_info=node_info,
                                         health=health, compat=compat)  # compat: the dcgm-exporter line
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        if process_metrics:
            ProcessCollector(registry=self.registry)
        self.server: MetricsServer | None = None
        self._snapshot: Snapshot | None = None
        self._page: _Page | None = None
        self._texts: dict[str, tuple[list, str]] = {}  # exposition()'s cache, kept between renderings
        self._lock = threading.Lock()  # one rendering at a time
        self._gzip_lock = threading.Lock()  # one compression at a time (not behind a rendering)
        self._rendering = False
        self._last_scrape = float("-inf")  # time.monotonic() of the latest scrape
        self._ahead = False  # render ahead of scrapes (see the class docstring)
        self._want_gzip = False
        self._wake = threading.Event()
        self._stopping = False
        self._errors = 0
        self._thread: threading.Thread | None = None

    # -- the daemon's side

    def update(self, sample: Sample) -> None:
        """Called by the daemon with every new sample (on the event loop): O(links), no rendering."""
        self._snapshot = advance(self._snapshot, sample)
        if self._ahead:
            self._wake.set()

    def start(self) -> None:
        self.server = MetricsServer(self.listen, self.page, content_type=CONTENT_TYPE)
        self.server.start()
        self._thread = threading.Thread(target=self._render_ahead, name="nvmon-prometheus-render", daemon=True)
        self._thread.start()
        log.info("serving Prometheus metrics on %s", self.server.url)

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self.server is not None:
            self.server.stop()
        if self._thread is not None:
            self._thread.join(1.0)
            self._thread = None

    # -- the scrapers' side (HTTP threads)

    def page(self, accept_gzip: bool = False) -> tuple[bytes, bool] | None:
        """(body, gzipped) for the latest snapshot; None before the first sample."""
        snap = self._snapshot
        if snap is None:
            return None
        now = time.monotonic()
        gap, self._last_scrape = now - self._last_scrape, now
        self._ahead = gap <= 2 * max(snap.sample.interval_s, 0.1)
        self._want_gzip = accept_gzip
        page = self._page
        if page is None or page.snapshot is not snap:
            if page is None or not (self._ahead and self._rendering):
                page = self._ensure_page()
        if not accept_gzip:
            return page.body, False
        return self._ensure_gzip(page), True

    def _ensure_page(self) -> _Page:
        with self._lock:
            snap = self._snapshot  # the newest, which may be newer than the one the caller saw
            page = self._page
            if page is None or page.snapshot is not snap:
                self._rendering = True
                try:
                    page = self._page = self._render(snap)
                finally:
                    self._rendering = False
            return page

    def _ensure_gzip(self, page: _Page) -> bytes:
        if page.gzipped is None:
            with self._gzip_lock:
                if page.gzipped is None:  # level 1: a tenth of the size for a fraction of level 6's CPU
                    cpu0 = time.thread_time()
                    page.gzipped = gzip.compress(page.body, compresslevel=1, mtime=0)
                    self.collector.compress_cpu_seconds += time.thread_time() - cpu0
        return page.gzipped

    def _render(self, snap: Snapshot) -> _Page:
        c = self.collector
        t0, cpu0 = time.perf_counter(), time.thread_time()
        c.snapshot = snap
        body = exposition(self.registry.collect(), self._texts)
        c.render_seconds = time.perf_counter() - t0
        c.renders += 1
        c.render_cpu_seconds += time.thread_time() - cpu0
        return _Page(snap, body)

    def _render_ahead(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            snap = self._snapshot
            # Only while scrapes keep coming: a Prometheus that went away costs nothing.
            if snap is None or not self._ahead or time.monotonic() - self._last_scrape > 3 * max(
                    snap.sample.interval_s, 0.1) + 1:
                self._ahead = False
                continue
            try:
                page = self._ensure_page()
                if self._want_gzip:
                    self._ensure_gzip(page)
            except Exception:  # a bug; the next scrape renders again and answers 500 if it fails again
                self._errors += 1
                if self._errors in (1, 10, 100) or self._errors % 1000 == 0:
                    log.exception("rendering /metrics failed (%d times so far)", self._errors)
