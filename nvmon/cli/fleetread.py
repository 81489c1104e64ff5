"""One read of a fleet from the broker, for the commands that list it once (`nvmon nodes`,
`nvmon forget`, `nvmon alerts --broker`).

They read the broker the way the TUI does: subscribe to the cluster's topics (and, for the alert
listing, its shared `@controls` set), feed what arrives for a settle time (retained statuses,
inventories and alert sets at once, samples within an interval) into a `FleetState`, and judge
liveness with its one rule (`NodeView.liveness`), so the list, the TUI and `nvmon fleet` agree.
The broker flags are the common ones (docs/cli.md): --broker or $NVMON_BROKER, else --config's
`[mqtt]` (whose user, password file and TLS files are used too, under the flags), else
mqtt://localhost:1883.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from nvmon.cli.common import BrokerFlags, NvmonError, check_broker_files, load_fleet_config

SETTLE_S = 2.0  # retained messages come at once; a sample within one interval (1 s by default)
MAX_READ_S = 60.0  # the longest a read goes on to see two intervals of the slowest live node


def settings_of(broker: BrokerFlags, config_path: Path | None, *, default: str | None = None):
    """MqttSettings from the flags over --config's [mqtt] (files checked now: one line each)."""
    m = load_fleet_config(config_path).mqtt if config_path is not None else None
    settings = broker.settings(m) if default is None else broker.settings(m, url=broker.url(m, default=default))
    check_broker_files(settings)
    return settings


def fleet_settings(config_path: Path | None):
    """The `[fleet]` table of --config when the file has one (its stale_after_intervals, rack
    budgets, rule overrides), else None: judged as the TUI judges without a config."""
    if config_path is None:
        return None
    cfg = load_fleet_config(config_path)
    return cfg.fleet if "fleet" in cfg.model_fields_set else None


def run(settings, coro):
    """asyncio.run(coro); the broker's failures (refused, unreachable, TLS) as one line."""
    from nvmon.wire.mqtt import describe_error

    try:
        return asyncio.run(coro)
    except NvmonError:
        raise
    except Exception as e:  # the broker: refused, unreachable, TLS — one line
        raise NvmonError(f"broker {settings.url}: {describe_error(e)}") from None


def client_id(what: str) -> str:
    return f"nvmon-{what}-{os.getpid()}-{os.urandom(2).hex()}"


@dataclass
class Snapshot:
    """What one read brought: the fleet state and the clusters' shared acks and silences."""

    state: object  # nvmon.fleet.state.FleetState
    controls: dict = field(default_factory=dict)  # cluster → ControlSet (only with controls=True)
    summaries: dict = field(default_factory=dict)  # cluster → ClusterSummary, its nvmon fleet's (controls=True)
    subscribed_at: float = 0.0  # unix s
    read_s: float = 0.0  # how long it read


def _slowest_live_interval(state, now: float) -> float:
    """The longest sample interval among nodes not offline (their statuses say it)."""
    out = 1.0
    for v in state.nodes.values():
        st = v.status
        if st is not None and st.interval_s and v.liveness(now).state != "offline":
            out = max(out, float(st.interval_s))
    return out


async def read(settings, cluster: str | None, settle_s: float, *, controls: bool = False,
               stale_factor: float | None = None, judgeable: bool = False) -> Snapshot:
    """Subscribe and feed what the broker sends within `settle_s` into a new FleetState.
    `controls`: also read the shared `@controls` sets and the `@summary` each cluster's
    `nvmon fleet` publishes (nvmon.wire.summary). `judgeable`: go on reading (up to
    MAX_READ_S) until two intervals of the slowest live node have passed, the settle time the
    fleet rules need before they judge (nvmon.fleet.alerting.blind_now)."""
    from nvmon.fleet.state import FleetState
    from nvmon.wire.contract import WireError, control_subscription, parse_control_topic, subscription
    from nvmon.wire.control import read_controls
    from nvmon.wire.mqtt import make_client
    from nvmon.wire.summary import SUMMARY_LEVEL, parse_summary, summary_subscription

    state = FleetState() if stale_factor is None else FleetState(stale_factor=stale_factor)
    sets: dict = {}
    summaries: dict = {}
    loop = asyncio.get_running_loop()
    async with make_client(settings, client_id=settings.client_id or client_id("read")) as client:
        await client.subscribe(subscription(cluster), qos=1)
        if controls:
            await client.subscribe(control_subscription(cluster), qos=1)
            await client.subscribe(summary_subscription(cluster), qos=1)
        t0, start = loop.time(), time.time()
        until = t0 + settle_s
        while True:
            try:
                async with asyncio.timeout_at(until):
                    async for m in client.messages:
                        payload = m.payload if m.payload is not None else b""
                        t = str(m.topic)
                        if controls and t.count("/") == 3:  # @controls, @summary: never a node's topic
                            try:
                                if t.endswith("/" + SUMMARY_LEVEL):
                                    if payload:  # empty: the topic cleared
                                        got = parse_summary(t, bytes(payload))
                                        summaries[got.cluster] = got
                                else:
                                    c = parse_control_topic(t)
                                    sets[c] = read_controls(c, bytes(payload))
                            except (WireError, ValueError, TypeError):
                                pass  # someone else's junk there: not ours to list (as read_every_shared)
                            continue
                        state.apply(t, payload, time.time())
            except TimeoutError:
                pass
            if not judgeable:
                break
            need = t0 + min(MAX_READ_S, max(settle_s, 2 * _slowest_live_interval(state, time.time())))
            if need <= loop.time() + 0.05:
                break
            until = need
        read_s = loop.time() - t0
    state.sweep(time.time())
    return Snapshot(state, sets, summaries, start, read_s)
