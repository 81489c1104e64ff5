"""`nvmon daemon`: sample → store / publish, in one asyncio TaskGroup, for months, unattended.

    sampler thread ──► loop ──► store writer thread (SQLite; maintenance; backlog + retry when unwritable)
                            ├─► wire queue ──► publisher (MQTT; reconnects; newest samples only while away)
                            ├─► alert rules · watchdog (sd_notify, only while samples arrive)
                            └─► Prometheus exporter (optional): gets a reference to each sample; its HTTP
                                thread renders /metrics from it on demand (nvmon/export/prometheus.py)

Blocking work runs in threads: NVML and sysfs in the sampler thread, which keeps its own drift-free
tick grid, and SQLite in the store writer's thread (nvmon/daemon/storewriter.py). The loop only
moves immutable Samples, and wakes once per tick: on a VM every wake-up (a thread hand-off, a
timer) costs a few tenths of a millisecond, as much as a whole step of the pipeline. Every failure
is local: a collector error skips a tick, an unwritable database keeps a bounded backlog and
retries, a missing broker never stops sampling or storing.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from dataclasses import dataclass

from nvmon import __version__
from nvmon.alerts.rules import thresholds_of
from nvmon.audit import Judge
from nvmon.collect.node import NodeSampler, load_real_pynvml
from nvmon.daemon import sdnotify
from nvmon.daemon.config import ConfigError, DaemonConfig
from nvmon.daemon.storewriter import StoreWriter
from nvmon.model import Sample
from nvmon.specs import NodeSpec, parse_expect_ib

log = logging.getLogger("nvmon.daemon")

STORE_BACKLOG = 120  # ticks kept in memory while the database is unwritable (~100 KB each)
WIRE_QUEUE = 4  # only the newest samples matter on the wire
MAINTAIN_EVERY_S = 60.0
FLUSH_ON_STOP_S = 1.0
SAMPLER_JOIN_S = 0.5  # on stop: the sampler thread finishing its tick before NVML is shut down
# On stop, alongside the store flush: time for queued notifications to go out, then for the hooks'
# tasks to end. Whatever is left stays in the outbox for the next start; the whole stop stays
# within 2 s whatever the hooks do (a receiver that hangs, one that is down).
HOOKS_DRAIN_S = 1.0
HOOKS_CANCEL_S = 0.5


@dataclass(slots=True)
class DaemonStats:
    ticks: int = 0
    missed_ticks: int = 0  # written by the sampler thread only
    sample_errors: int = 0
    wire_dropped: int = 0
    sample_seconds: float = 0.0  # how long the latest sampler.sample() took
    sample_seconds_total: float = 0.0  # summed over `ticks`


class _Stop(Exception):
    """Raised inside the TaskGroup to end it on SIGTERM/SIGINT."""


def _put_newest(q: asyncio.Queue, item) -> bool:
    """Put without blocking; when full, drop the oldest item. Returns True if one was dropped."""
    dropped = False
    while True:
        try:
            q.put_nowait(item)
            return dropped
        except asyncio.QueueFull:
            q.get_nowait()
            dropped = True


class Daemon:
    def __init__(self, cfg: DaemonConfig, *, embedded: bool = False):
        """`embedded`: one of several daemons inside another program (`nvmon demo`): no signal
        handlers and no sd_notify — the host program owns the process; stop with request_stop()."""
        self.cfg = cfg
        self.embedded = embedded
        self.node = cfg.node_name
        self.stats = DaemonStats()
        self.latest: Sample | None = None
        self.sim_node = None
        self.sampler: NodeSampler | None = None
        self.store = None
        self.writer: StoreWriter | None = None
        self.publisher = None
        self.exporter = None
        self.judge = Judge(self.node_spec(), thresholds_of(cfg.alerts))  # one audit per tick, shared
        self.alerts = None  # DaemonAlerts (nvmon/daemon/alerting.py); None when [alerts] enabled = false
        self.notifier = None  # an nvmon.alerts.engine.Notifier (the hooks); None: nobody is paged
        self.wire_q: asyncio.Queue[tuple[Sample, tuple]] = asyncio.Queue(maxsize=WIRE_QUEUE)  # (sample, findings)
        self._last_tick = 0.0
        self._inventory: tuple[str, bytes] | None = None  # (layout id, payload)
        self._stop = asyncio.Event()
        self._stopping = False  # set on shutdown: late samples are ignored
        self._sampler_thread: threading.Thread | None = None

    # -- setup ---------------------------------------------------------------------------------

    def _make_sampler(self) -> NodeSampler:
        s = self.cfg.sampling
        if s.sim:
            from nvmon.sim.node import SimNode

            self.sim_node = SimNode(s.sim, node=self.node)
            return NodeSampler(self.sim_node.nvml, sysfs_root=self.sim_node.sysfs_root, node=self.node,
                               before_tick=self.sim_node.sync)
        return NodeSampler(load_real_pynvml(), sysfs_root=s.sysfs_root, node=self.node)

    def _make_store(self):
        from nvmon.store import Store

        st = self.cfg.store
        return Store(st.path, raw_retention_s=st.raw_retention_h * 3600,
                     rollup_retention_s=st.rollup_retention_d * 86400,
                     alert_retention_s=self.cfg.alerts.keep_resolved_d * 86400, owner=True)

    def _make_publisher(self):
        m = self.cfg.mqtt
        if not m.broker:
            return None
        from nvmon.wire.mqtt import Backoff, MqttSettings, node_client_id
        from nvmon.wire.publisher import Publisher

        settings = MqttSettings(url=m.broker, username=m.username, password_file=m.password_file,
                                ca_file=m.ca_file, cert_file=m.cert_file, key_file=m.key_file,
                                tls_insecure=m.tls_insecure, keepalive_s=m.keepalive_s,
                                client_id=node_client_id(self.cfg.node.cluster, self.node, str(self.cfg.store.path)))
        # Backoff capped at 4 s (jittered down to 2 s): a node must be publishing again within 5 s
        # of its broker's return, and jitter keeps a fleet from reconnecting in lock-step. A refused
        # login or a TLS failure backs off to 60 s instead (Backoff.refused_max_s).
        return Publisher(settings, cluster=self.cfg.node.cluster, node=self.node, version=__version__,
                         interval_s=self.cfg.sampling.interval_s, backoff=Backoff(initial_s=0.5, max_s=4.0))

    def _make_exporter(self):
        listen = self.cfg.prometheus.listen
        if not listen:
            return None
        from nvmon.catalog.compat import line
        from nvmon.export.prometheus import PrometheusExporter

        n = self.cfg.node
        return PrometheusExporter(listen, judge=self.judge, health=self.health,
                                  node_info={"cluster": n.cluster, "rack": n.rack or "", "version": __version__},
                                  compat=line(self.cfg.prometheus.dcgm_compat))

    def health(self):
        """The daemon's own counters for the exporter (called from its HTTP thread: reads only)."""
        from nvmon.export.prometheus import DaemonHealth

        st, w = self.stats, self.writer
        pub = self.publisher.stats if self.publisher is not None else None
        return DaemonHealth(
            ticks=st.ticks, missed_ticks=st.missed_ticks, sample_errors=st.sample_errors,
            sample_seconds=st.sample_seconds, sample_seconds_total=st.sample_seconds_total,
            # a database found deleted, replaced or corrupt (and started anew) counts as a store error
            stored=w.stored if w else 0, store_errors=(w.errors + self.store.resets) if w else 0,
            store_dropped=w.dropped if w else 0, store_resets=dict(self.store.resets_by) if w else None,
            wire_dropped=st.wire_dropped,
            mqtt_connected=None if pub is None else pub.connected,
            mqtt_published=pub.published if pub else 0, mqtt_errors=pub.errors if pub else 0,
            mqtt_dropped=pub.dropped if pub else 0,
            alerts=self.alerts.counts if self.alerts is not None else None,
            hooks=tuple((h.name, h.type, h.sent, h.failed, h.dropped) for h in self.notifier.stats())
            if hasattr(self.notifier, "stats") else ())

    def node_spec(self) -> NodeSpec:
        e = self.cfg.expect
        ports, rate = parse_expect_ib(e.ib) if e.ib else (None, None)
        return NodeSpec(gpus=e.gpus, ib_ports=ports, ib_rate_gbps=rate, topology=e.topology)

    def inventory(self) -> bytes | None:
        """The retained `inventory` payload, from the latest sample (the publisher asks on each
        connect and when the hardware layout changes: rare, so it is built on demand)."""
        from nvmon.wire.payloads import inventory_payload, layout_id

        if self.latest is None:
            return None
        key = layout_id(self.latest)
        if self._inventory is None or self._inventory[0] != key:
            n = self.cfg.node
            self._inventory = (key, inventory_payload(self.latest, cluster=n.cluster, rack=n.rack,
                                                      labels=dict(n.labels), spec=self.node_spec()))
        return self._inventory[1]

    # -- tasks ---------------------------------------------------------------------------------

    async def _sample_loop(self) -> None:
        """Run the sampler thread until cancelled."""
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        self._sampler_thread = threading.Thread(target=self._sampling, args=(loop, stop),
                                                name=f"nvmon-sampler-{self.node}", daemon=True)
        self._sampler_thread.start()
        try:
            await asyncio.Event().wait()
        finally:
            stop.set()

    def _sampling(self, loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
        """The sampler thread: a sample per slot of a fixed grid, each handed to the loop."""
        interval = self.cfg.sampling.interval_s
        next_t = time.monotonic()
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                result: Sample | Exception = self.sampler.sample()
            except Exception as e:  # a collector bug must cost one tick, not the daemon
                result = e
            took = time.perf_counter() - t0
            try:
                loop.call_soon_threadsafe(self._on_sample, result, took)
            except RuntimeError:  # the loop is closed: the daemon is gone
                return
            # Drift-free: ticks sit on a fixed grid; when late (slow driver, suspended VM) skip
            # the missed slots instead of bursting to catch up.
            next_t += interval
            now = time.monotonic()
            if next_t <= now:
                missed = int((now - next_t) // interval) + 1
                next_t += missed * interval
                self.stats.missed_ticks += missed
            stop.wait(next_t - now)

    def _on_sample(self, result: Sample | Exception, took: float) -> None:
        """On the loop, once per tick: hand the sample to the store, the wire and the rules."""
        if self._stopping:
            return
        if isinstance(result, Exception):
            self.stats.sample_errors += 1
            if self.stats.sample_errors in (1, 10, 100) or self.stats.sample_errors % 1000 == 0:
                log.error("sampling failed (%d times so far)", self.stats.sample_errors, exc_info=result)
            return
        sample = result
        self.latest = sample
        self.stats.ticks += 1
        self.stats.sample_seconds = took
        self.stats.sample_seconds_total += took
        self._last_tick = time.monotonic()
        try:
            self.writer.put(sample)
            # Audited once here; the rules and the exporter get the same report from the judge.
            # The findings ride along on the wire, so that the TUI and `nvmon fleet` show what
            # this node's audit found instead of judging for themselves.
            findings = self.judge(sample).findings
            if self.exporter is not None:
                self.exporter.update(sample)
            if self.publisher is not None and _put_newest(self.wire_q, (sample, findings)):
                self.stats.wire_dropped += 1
            if self.alerts is not None:
                self.alerts.tick(sample)  # never raises; ≤ 1 ms
        except Exception:  # a bug in one consumer must not stop the ticks
            log.exception("handing out a sample failed")

    async def _watchdog_loop(self) -> None:
        """Ping systemd's watchdog only while ticks are flowing: a hung NVML call gets us restarted."""
        period = None if self.embedded else sdnotify.watchdog_interval_s()
        if period is None:
            return
        stale_after = max(3 * self.cfg.sampling.interval_s, 5.0)
        while True:
            if time.monotonic() - self._last_tick < stale_after:
                sdnotify.watchdog()
            await asyncio.sleep(period / 2)

    async def _publisher_loop(self) -> None:
        """Run the publisher; on stop, cancel it until it is really done. On Python 3.11 a cancel
        that lands while aiomqtt's asyncio.wait_for completes can be swallowed (CPython gh-86296),
        which would leave SIGTERM hanging: so the cancel is repeated, for at most 1.5 s."""
        alerts = self.alerts.wire_set if self.alerts is not None else None  # re-sent on each connect
        task = asyncio.create_task(self.publisher.run(self.wire_q, self.inventory, alerts), name="publisher.run")
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            deadline = asyncio.get_running_loop().time() + 1.5
            while not task.done() and asyncio.get_running_loop().time() < deadline:
                task.cancel()
                await asyncio.wait({task}, timeout=0.1)
            if not task.done():
                log.error("MQTT publisher did not stop within 1.5 s; exiting without it")
            raise

    async def _wait_stop(self) -> None:
        await self._stop.wait()
        raise _Stop()

    # -- lifecycle -----------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> int:
        """Run until SIGTERM/SIGINT (or `request_stop()`); returns the exit status."""
        loop = asyncio.get_running_loop()
        for sig in () if self.embedded else (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.request_stop)
            except (NotImplementedError, RuntimeError):  # not the main thread (tests)
                pass
        # One daemon per database file, and the endpoint: a second daemon on the same file, or a
        # taken port, must fail the start at once, in one line.
        self.store = self._make_store()
        await asyncio.to_thread(self._lock_store)
        self.exporter = self._make_exporter()
        if self.exporter is not None:
            from nvmon.export.server import ListenError

            try:
                self.exporter.start()
            except ListenError as e:
                self.store.close()  # releases the lock: an embedding program may try again
                raise ConfigError(f"prometheus.listen {e}") from None
        try:
            return await self._run()
        finally:
            if self.exporter is not None:
                self.exporter.stop()

    def _lock_store(self) -> None:
        from nvmon.store import StoreError
        from nvmon.store.guard import LOCKED

        try:
            self.store.lock()
        except StoreError as e:
            if e.code == LOCKED:
                raise ConfigError(str(e)) from None
            # e.g. a read-only disk: sample and publish anyway; the writer retries (and says why)
            log.debug("store: %s", e)

    async def _run(self) -> int:
        self.sampler = await asyncio.to_thread(self._make_sampler)  # a SimNode takes ~0.1 s to build
        status = await asyncio.to_thread(self.sampler.open)
        if not status.available:
            log.warning("NVML unavailable: %s; sampling InfiniBand/PCIe/host only", status.error)
        self.writer = StoreWriter(self.store, backlog=STORE_BACKLOG, maintain_every_s=MAINTAIN_EVERY_S,
                                  name=f"nvmon-store-{self.node}")
        self.publisher = self._make_publisher()
        dispatcher = None
        if self.cfg.hooks:
            from nvmon.alerts.hook_dispatch import HookDispatcher
            from nvmon.alerts.hook_outbox import Outbox, outbox_path

            outbox = await asyncio.to_thread(Outbox, outbox_path(self.cfg.store.path))
            dispatcher = HookDispatcher(self.cfg.hooks, outbox=outbox)
            for problem in dispatcher.check():  # e.g. an unreadable secret: warn, keep sampling
                log.warning("hooks: %s", problem)
            self.notifier = dispatcher
        if self.cfg.alerts.enabled:
            from nvmon.daemon.alerting import DaemonAlerts

            self.alerts = DaemonAlerts(self.cfg, node=self.node, node_spec=self.node_spec(), store=self.store,
                                       publisher=self.publisher, notifier=self.notifier, judge=self.judge)
            await self.alerts.restore()
        # The first sample before anything else: inventory and the first stored tick need it.
        self.latest = await asyncio.to_thread(self.sampler.sample)
        if self.exporter is not None:
            self.exporter.update(self.latest)
        log.info("nvmon %s on %s: %d GPUs, %d IB ports, every %.3g s, db %s, broker %s, metrics %s", __version__,
                 self.node, len(self.latest.gpus), len(self.latest.ib), self.cfg.sampling.interval_s,
                 self.cfg.store.path, self.cfg.mqtt.broker or "none",
                 self.exporter.server.url if self.exporter is not None else "none")
        if not self.embedded:
            sdnotify.ready()
            sdnotify.status(f"sampling {len(self.latest.gpus)} GPUs every {self.cfg.sampling.interval_s:g} s")
        # Outside the TaskGroup: on stop, hooks get a moment to deliver what is queued (a resolve).
        hooks_task = asyncio.create_task(dispatcher.run(), name="hooks") if dispatcher is not None else None
        try:
            async with asyncio.TaskGroup() as tg:
                self.writer.start()
                tg.create_task(self._sample_loop(), name="sampler")
                tg.create_task(self._watchdog_loop(), name="watchdog")
                if self.alerts is not None:
                    tg.create_task(self.alerts.persist_loop(), name="alerts.persist")
                    tg.create_task(self.alerts.publish_loop(), name="alerts.publish")
                if self.publisher is not None:
                    tg.create_task(self._publisher_loop(), name="publisher")
                tg.create_task(self._wait_stop(), name="stop")
        except* _Stop:
            pass
        finally:
            if not self.embedded:
                sdnotify.stopping()
            # The hooks drain while the store flushes (each bounded), so that the stop stays short.
            stop_hooks = (asyncio.create_task(self.notifier.stop(hooks_task, HOOKS_DRAIN_S, HOOKS_CANCEL_S))
                          if hooks_task is not None else None)
            await self._shutdown()
            if stop_hooks is not None:
                await stop_hooks
        return 0

    async def _shutdown(self) -> None:
        """Flush what is queued to the store (bounded time), then release hardware and files."""
        self._stopping = True
        if self.exporter is not None:  # stop answering scrapes first: the node is going away
            await asyncio.to_thread(self.exporter.stop)
        sampler_idle = True
        if self._sampler_thread is not None:  # its stop event is set: it ends after this tick
            await asyncio.to_thread(self._sampler_thread.join, SAMPLER_JOIN_S)
            sampler_idle = not self._sampler_thread.is_alive()
        store_idle = True
        if self.writer is not None:
            store_idle = await asyncio.to_thread(self.writer.stop, FLUSH_ON_STOP_S)
            if not store_idle:
                log.error("store flush on stop: still writing after %.1f s; exiting without it", FLUSH_ON_STOP_S)
        if self.alerts is not None and self.store is not None:
            try:
                await asyncio.wait_for(asyncio.to_thread(self.alerts.flush), FLUSH_ON_STOP_S)
            except (TimeoutError, Exception) as e:  # noqa: BLE001 - shutting down: report, never hang
                log.error("alerts flush on stop: %s", e)
        if self.store is not None and store_idle:
            await asyncio.to_thread(self.store.close)
        if self.sampler is not None:
            if sampler_idle:
                self.sampler.close()
            else:  # stuck in a driver call: shutting NVML down under it could crash the process
                log.error("sampler still busy after %.1f s (a hung driver call?); exiting without closing NVML",
                          SAMPLER_JOIN_S)
        if self.sim_node is not None and sampler_idle:
            self.sim_node.close()
        w = self.writer
        log.info("stopped after %d ticks (%d stored, %d missed, %d sampling errors)", self.stats.ticks,
                 w.stored if w else 0, self.stats.missed_ticks, self.stats.sample_errors)
