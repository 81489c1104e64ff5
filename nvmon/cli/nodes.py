"""`nvmon nodes` (a fleet's nodes and their liveness, read once from the broker) and `nvmon forget`
(clear a decommissioned node's retained topics).

Both read the broker the way the TUI does: subscribe to the cluster's topics, feed what arrives for
a settle time (retained statuses, inventories and alert sets at once, samples within an interval)
into a `FleetState`, and judge liveness with its one rule (`NodeView.liveness`), so the list, the
TUI and `nvmon fleet` agree. The broker flags are the common ones (docs/cli.md): --broker or
$NVMON_BROKER, else --config's `[mqtt]` (whose user, password file and TLS files are used too, under
the flags), else mqtt://localhost:1883.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import click

from nvmon.cli.common import (DEFAULT_BROKER, BrokerFlags, NvmonError, broker_options, check_broker_files,
                              check_cluster, load_fleet_config)
from nvmon.tui.text import age as age_text

SETTLE_S = 2.0  # retained messages come at once; a sample within one interval (1 s by default)
CLEARED = ("alerts", "inventory", "status")  # the retained topics; the status last: views then drop the node


def _settings(broker: BrokerFlags, config_path: Path | None):
    m = load_fleet_config(config_path).mqtt if config_path is not None else None
    settings = broker.settings(m)
    check_broker_files(settings)
    return settings


def _run(settings, coro):
    from nvmon.wire.mqtt import describe_error

    try:
        return asyncio.run(coro)
    except NvmonError:
        raise
    except Exception as e:  # the broker: refused, unreachable, TLS — one line
        raise NvmonError(f"broker {settings.url}: {describe_error(e)}") from None


def _client_id(what: str) -> str:
    return f"nvmon-{what}-{os.getpid()}-{os.urandom(2).hex()}"


async def read_fleet(settings, cluster: str | None, settle_s: float):
    """A FleetState fed with what the broker sends within `settle_s` of subscribing."""
    from nvmon.fleet.state import FleetState
    from nvmon.wire.contract import subscription
    from nvmon.wire.mqtt import make_client

    state = FleetState()
    async with make_client(settings, client_id=settings.client_id or _client_id("nodes")) as client:
        await client.subscribe(subscription(cluster), qos=1)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settle_s
        try:
            async with asyncio.timeout_at(deadline):
                async for m in client.messages:
                    state.apply(str(m.topic), m.payload if m.payload is not None else b"", time.time())
        except TimeoutError:
            pass
    state.sweep(time.time())
    return state


def node_rows(state, now: float) -> list[dict]:
    """One dict per node (the --json objects), sorted by cluster and node."""
    out = []
    for (cluster, node), v in sorted(state.nodes.items()):
        live = v.liveness(now)
        st = v.status
        out.append({
            "cluster": cluster, "node": node, "rack": v.rack, "liveness": live.state, "reason": live.reason,
            "age_s": round(live.age_s, 1), "age_exact": live.exact,
            "version": st.version if st is not None else None,
            "interval_s": st.interval_s if st is not None else None,
            "alerts": v.alert_counts(), "clock_skew_s": v.clock_skew_s,
        })
    return out


def _table(rows: list[dict], with_cluster: bool) -> str:
    head = (["CLUSTER"] if with_cluster else []) + ["NODE", "RACK", "LIVENESS", "AGE", "VERSION", "ALERTS"]
    lines = [head]
    for r in rows:
        live = r["liveness"] + (f" ({r['reason']})" if r["reason"] else "")
        age = ("≤" if not r["age_exact"] else "") + age_text(r["age_s"])  # as the TUI writes it
        alerts = " ".join(f"{n} {sev}" for sev, n in sorted(r["alerts"].items())) or "-"
        line = [r["node"], r["rack"] or "-", live, age, r["version"] or "-", alerts]
        lines.append(([r["cluster"]] if with_cluster else []) + [_printable(c) for c in line])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def _printable(s: str) -> str:
    """Strings from the wire (racks, versions) without control characters: they are data."""
    return "".join(c if c.isprintable() else "?" for c in str(s))[:64]


def _broker_options(f):
    f = click.option("--config", "config_path", default=None, metavar="PATH",
                     type=click.Path(dir_okay=False, path_type=Path),
                     help="A daemon or fleet TOML config: its [mqtt] broker and credentials.")(f)
    return broker_options(f, broker_help=f"Default: --config's [mqtt] broker, else {DEFAULT_BROKER}.")


def _settle_option(f):
    return click.option("--settle", "settle_s", type=click.FloatRange(0.2, 60), default=SETTLE_S, show_default=True,
                        metavar="SECONDS", help="How long to collect what the broker sends before judging.")(f)


@click.command("nodes")
@_broker_options
@click.option("--cluster", default=None, callback=check_cluster, help="One cluster (default: every cluster).")
@_settle_option
@click.option("--json", "as_json", is_flag=True, help="A JSON list of node objects instead of the table.")
def nodes_command(broker: BrokerFlags, config_path: Path | None, cluster: str | None, settle_s: float,
                  as_json: bool) -> None:
    """List a fleet's nodes with their liveness, as the broker has them: one line per node (rack,
    online / stale / offline and why, since when, daemon version, active alerts).

    \b
    The age of an offline node comes from its status's own timestamp; `≤6m` (age_exact false in
    --json) is a will found retained: silent for at most that long. Exit 0 once listed.
    """
    settings = _settings(broker, config_path)
    state = _run(settings, read_fleet(settings, cluster, settle_s))
    rows = node_rows(state, time.time())
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif not rows:
        click.echo(f"no nodes on {settings.url}" + (f" in cluster {cluster}" if cluster else ""), err=True)
    else:
        click.echo(_table(rows, with_cluster=cluster is None))


@click.command("forget")
@click.argument("nodes", nargs=-1, required=True)
@_broker_options
@click.option("--cluster", required=True, callback=check_cluster, help="The nodes' cluster.")
@_settle_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--force", is_flag=True,
              help="Forget a node even though it looks alive (its daemon would publish again).")
def forget_command(nodes: tuple[str, ...], broker: BrokerFlags, config_path: Path | None, cluster: str,
                   settle_s: float, yes: bool, force: bool) -> None:
    """Forget decommissioned NODEs: clear their retained status, inventory and alerts topics on the
    broker (empty retained messages), so the TUI, nvmon nodes and nvmon fleet drop them; nvmon fleet
    ends their alerts without a page. Needs write access to those topics (the broker's ACL).

    \b
    A node still online or stale is refused (stop its daemon first, or --force).
    """
    from nvmon.wire.contract import topic, valid_name

    for n in nodes:
        if not valid_name(n):
            raise NvmonError(f"node {n[:80]!r}: use 1-64 characters from A-Z a-z 0-9 . _ -")
    settings = _settings(broker, config_path)
    state = _run(settings, read_fleet(settings, cluster, settle_s))
    now = time.time()
    alive = [n for n in nodes if (v := state.nodes.get((cluster, n))) is not None
             and v.liveness(now).state != "offline"]
    if alive and not force:
        raise NvmonError(f"{', '.join(alive)}: still alive in cluster {cluster} "
                         "(stop the daemon first, or --force)")
    unknown = [n for n in nodes if (cluster, n) not in state.nodes]
    if unknown:
        click.echo(f"nvmon: nothing retained for {', '.join(unknown)} in cluster {cluster}; clearing anyway", err=True)
    if not yes:
        if not sys.stdin.isatty():
            raise NvmonError("not a terminal: add --yes to confirm")
        click.confirm(f"Clear the retained topics of {len(nodes)} node(s) in cluster {cluster} on {settings.url}?",
                      abort=True)
    _run(settings, _clear(settings, [topic(cluster, n, kind) for n in nodes for kind in CLEARED]))
    left = _run(settings, read_fleet(settings, cluster, min(settle_s, 1.0)))
    kept = [n for n in nodes if (cluster, n) in left.nodes and left.nodes[(cluster, n)].status is not None]
    if kept:
        raise NvmonError(f"the broker still holds the retained status of {', '.join(kept)}: no write access to "
                         f"nvmon/v1/{cluster}/<node>/status? (the broker's ACL decides)")
    click.echo(f"forgot {', '.join(nodes)} in cluster {cluster} on {settings.url}")


async def _clear(settings, topics: list[str]) -> None:
    from nvmon.wire.mqtt import make_client

    async with make_client(settings, client_id=settings.client_id or _client_id("forget")) as client:
        for t in topics:
            await client.publish(t, b"", qos=1, retain=True)
