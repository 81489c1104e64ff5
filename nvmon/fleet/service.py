"""`nvmon fleet`: the headless fleet evaluator (systemd/nvmon-fleet.service): its config and its run
loop. The command itself (options, logging, exit status) is nvmon/cli/fleet.py.

    nvmon fleet --broker mqtt://broker:1883 [--cluster prod[,lab ...]] [--config /etc/nvmon/fleet.toml] [--db PATH]

Subscribes to the fleet (FleetSubscriber → FleetState, the code the TUI uses), evaluates the fleet
rules (nvmon.fleet.rules) every second and at once when a node's status changes, runs the
`[[hooks]]` on firing / resolved, keeps alert state in SQLite (the same schema as a node's, so
`nvmon alerts --db /var/lib/nvmon/fleet.db` lists, acks and silences fleet alerts), honours the
acks and silences shared on the broker (`nvmon/v1/<cluster>/@controls`, nvmon.alerts.shared), logs
one line per transition, and the messages it refused (counts by reason and the last one) every
`log_drops_every_s` in which some were. SIGTERM / Ctrl-C: save, exit 0.

The config file is TOML: `[fleet]`, `[mqtt]`, `[alerts]` (only keep_resolved_d is used here) and
`[[hooks]]`; a node's own tables (`[node]`, `[sampling]`, …) are accepted and ignored, so one file
may serve a node that also runs the evaluator. Errors are one line naming the file and key.

Fleet alerts are not published over MQTT: the wire contract has per-node topics only
(nvmon/v1/<cluster>/<node>/<kind>), and a fleet alert has no node to publish under.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from nvmon.aio import raise_if_cancelled
from nvmon.alerts.hooks import HookConfig, check_hooks
from nvmon.alerts.settings import AlertsSettings
from nvmon.fleet.alerting import blind_now
from nvmon.fleet.rules import FleetSettings
from nvmon.tomlfile import TomlFileError, read_toml
from nvmon.tomlfile import validation_line as _one_line
from nvmon.wire.config import MqttSection

log = logging.getLogger("nvmon.fleet")

DEFAULT_CONFIG = Path("/etc/nvmon/fleet.toml")
NODE_TABLES = ("node", "sampling", "store", "expect", "prometheus")  # a node's config: accepted, unused
POLL_S = 0.1  # how often a status change is looked for (a will pages this fast after it arrives)


class FleetConfigError(Exception):
    """A config file that cannot be used; the message is one line naming the file (and key)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MqttTable(MqttSection):
    """`[mqtt]`: the daemon's keys and checks (keepalive_s is this client's own); no default broker."""

    broker: str | None = None


class FleetConfig(_Strict):
    fleet: FleetSettings = Field(default_factory=FleetSettings)
    mqtt: MqttTable = Field(default_factory=MqttTable)
    alerts: AlertsSettings = Field(default_factory=AlertsSettings)
    hooks: tuple[HookConfig, ...] = ()
    node: dict[str, Any] = Field(default_factory=dict)
    sampling: dict[str, Any] = Field(default_factory=dict)
    store: dict[str, Any] = Field(default_factory=dict)
    expect: dict[str, Any] = Field(default_factory=dict)
    prometheus: dict[str, Any] = Field(default_factory=dict)

    _check_hooks = field_validator("hooks")(check_hooks)




def load_fleet_config(path: Path | None) -> FleetConfig:
    """Read and validate; None: DEFAULT_CONFIG if it exists, else defaults. FleetConfigError (one line)."""
    if path is None and DEFAULT_CONFIG.exists():
        path = DEFAULT_CONFIG
    if path is None:
        return FleetConfig()
    try:
        data = read_toml(path)
    except TomlFileError as e:
        raise FleetConfigError(str(e)) from None
    try:
        return FleetConfig.model_validate(data)
    except ValidationError as e:
        raise FleetConfigError(_one_line(str(path), e)) from None


async def run_fleet(cfg: FleetConfig, settings, *, clusters: tuple[str, ...] = (), db: Path, clock=time.time) -> int:
    """Run until SIGTERM / SIGINT (or cancelled); 0 after a clean stop, 1 if the database is unusable.
    `clusters`: the clusters to watch, () for every cluster on the broker."""
    from nvmon.alerts.hook_dispatch import HookDispatcher
    from nvmon.alerts.hook_outbox import Outbox, outbox_path
    from nvmon.fleet.alerting import FleetAlerts
    from nvmon.fleet.clusters import fleet_feed, fleet_rules
    from nvmon.fleet.state import FleetState
    from nvmon.store import Store, StoreError

    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    # The file's owner, as a daemon is of its own (nvmon/store/store.py): `<db>.lock` keeps a second
    # `nvmon fleet` off this file and its outbox, and a corrupt file is set aside at the start.
    store = Store(db, alert_retention_s=cfg.alerts.keep_resolved_d * 86400, owner=True)
    try:
        # Read before the first evaluation, or a restart would page again what already paged.
        records = await asyncio.to_thread(_open_and_load, store)
    except StoreError as e:
        click.echo(f"nvmon: {e}", err=True)
        return 1
    # Pending notifications wait in `<db>.outbox`, as a daemon's do (nvmon.alerts.hook_outbox): a crash
    # or kill -9 during a receiver's outage loses none; the next start delivers them.
    outbox = await asyncio.to_thread(Outbox, outbox_path(db)) if cfg.hooks else None
    dispatcher = HookDispatcher(cfg.hooks, outbox=outbox)
    for problem in dispatcher.check():
        log.warning("hooks: %s", problem)
    rules = fleet_rules(cfg.fleet, clusters)  # over nodes, or over cluster summaries (nvmon.fleet.clusters)
    alerts = FleetAlerts(rules, store=store, notifier=dispatcher, clock=clock,
                         max_silence_s=cfg.alerts.max_silence_h * 3600)
    n = alerts.restore(records, clock())
    if n:
        log.info("fleet: %d active alerts restored from %s (no new pages for them)", n, db)
    f = cfg.fleet
    state = FleetState(stale_factor=f.stale_after_intervals, max_nodes=f.max_nodes, max_clusters=f.max_clusters,
                       max_without_inventory=f.max_nodes_without_inventory,
                       forget_without_inventory_s=f.forget_without_inventory_s)
    log.info("fleet: watching %s on %s; rules: %s; alert state in %s",
             f"cluster{'s' if len(clusters) > 1 else ''} {', '.join(clusters)}" if clusters else "every cluster",
             settings.url, ", ".join(sorted(rules.book)) or "none", db)
    # Outside the TaskGroup, as the daemon's: on stop the hooks get a moment to deliver what is queued.
    hooks = asyncio.create_task(dispatcher.run(), name="nvmon.fleet.hooks")
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(alerts.persist_loop(), name="nvmon.fleet.persist")
            tg.create_task(log_drops(state, cfg.fleet.log_drops_every_s), name="nvmon.fleet.drops")
            # Shared acks and silences come on the same connection, off its sample path (FleetSubscriber).
            # Its nodes (and their clusters' summaries published), or the summaries of clusters (--watch summaries).
            async with fleet_feed(cfg.fleet, settings, state, alerts, clusters=clusters, clock=clock) as sub:
                await _evaluate_loop(alerts, state, sub, clock)
    except asyncio.CancelledError:
        pass
    finally:
        stop_hooks = asyncio.create_task(dispatcher.stop(hooks))  # ≤ 1.5 s, alongside the flush
        try:
            await asyncio.wait_for(asyncio.to_thread(alerts.flush), 1.5)
        except (StoreError, TimeoutError) as e:
            log.error("fleet: alert state not saved at exit: %s", e)
        store.close()
        await stop_hooks
    log.info("fleet: stopped")
    return 0


async def log_drops(state, every_s: float) -> None:
    """Every `every_s`, if messages were refused since the last look: one line with how many, by
    reason, and the last one's reason and message (FleetStats.last_drop: one line, safe to log).
    A hostile or broken publisher shows in the journal without a line per message."""
    before: dict[str, int] = {}
    while True:
        await asyncio.sleep(every_s)
        st = state.stats
        new = {r: n - before.get(r, 0) for r, n in st.dropped_by_reason.items() if n > before.get(r, 0)}
        if not new:
            continue
        before = dict(st.dropped_by_reason)
        log.warning("fleet: %d messages dropped in the last %g s (%s; %d since start); last: %s",
                    sum(new.values()), every_s, ", ".join(f"{r} {n}" for r, n in sorted(new.items())), st.dropped,
                    (st.last_drop or "")[:300])


def _open_and_load(store):
    store.lock()
    store.open()
    return store.load_alerts()


async def _evaluate_loop(alerts, state, sub, clock) -> None:
    """Evaluate every second, and within POLL_S of a node's status changing (a will arriving)."""
    version, statuses = state.version, {}
    next_at = 0.0
    while True:
        await asyncio.sleep(POLL_S)
        raise_if_cancelled()
        urgent = False
        if state.version != version:
            for key in state.changed_since(version):
                view = state.nodes.get(key)
                st = view.status if view is not None else None
                if st is not statuses.get(key):
                    urgent = True
                    if st is None:
                        statuses.pop(key, None)
                    else:
                        statuses[key] = st
            version = state.version
        mono = time.monotonic()
        if not urgent and mono < next_at:
            continue
        next_at = mono + 1.0
        now = clock()
        s = sub.status
        blind = blind_now(s.connected, s.since, alerts.rules.max_interval_s, now)
        alerts.evaluate(state, now, blind=blind)

