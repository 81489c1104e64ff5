"""`nvmon nodes` (a fleet's nodes and their liveness, read once from the broker) and `nvmon forget`
(clear a decommissioned node's retained topics).

Both read the broker once (nvmon.cli.fleetread: the TUI's FleetState fed for a settle time, the
common broker flags) and judge liveness with its one rule (`NodeView.liveness`), so the list, the
TUI and `nvmon fleet` agree. `nvmon nodes` adds what each node's inventory says it is (board,
driver) and filters: node-name globs, --rack, --state, --problems.
"""

from __future__ import annotations

import fnmatch
import json
import sys
import time
from collections import Counter
from pathlib import Path

import click

from nvmon.cli.common import DEFAULT_BROKER, BrokerFlags, NvmonError, NvmonUsageError, broker_options, check_cluster
from nvmon.cli.fleetread import SETTLE_S, client_id, fleet_settings, read, run, settings_of
from nvmon.tui.text import age as age_text

CLEARED = ("alerts", "inventory", "status")  # the retained topics; the status last: views then drop the node
STATES = ("online", "stale", "offline", "lost", "stopped")  # --state: a liveness, or an offline one's reason


async def read_fleet(settings, cluster: str | None, settle_s: float, stale_factor: float | None = None):
    """A FleetState fed with what the broker sends within `settle_s` of subscribing."""
    return (await read(settings, cluster, settle_s, stale_factor=stale_factor)).state


def board(inv) -> dict:
    """What the inventory says the node is: GPU count, its most common GPU model, that model's spec
    key (`spec.models[].key`, e.g. H100-SXM), the board's topology class, and the driver. The
    `board` text is for the table: '8×H100-SXM nvswitch' (the model's name without the spec key)."""
    if inv is None:
        return {"board": None, "gpus": None, "model": None, "topology": None, "driver": None}
    common = Counter(g.model for g in inv.gpus if g.model).most_common(1)
    model = common[0][0] if common else None
    models = inv.spec.get("models") if isinstance(inv.spec, dict) else None
    key = next((m.get("key") for m in models or () if isinstance(m, dict) and m.get("model") == model
                and isinstance(m.get("key"), str)), None)
    name = key or (model.removeprefix("NVIDIA ") if model else "?")
    return {"board": f"{len(inv.gpus)}×{name} {inv.topology_class}", "gpus": len(inv.gpus), "model": model,
            "topology": inv.topology_class, "driver": inv.driver_version}


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
            "alerts": v.alert_counts(), "clock_skew_s": None if v.clock_skew_s is None else round(v.clock_skew_s, 1),
            "duplicate": v.duplicate, **board(v.inventory),
        })
    return out


def select(rows: list[dict], *, patterns: tuple[str, ...] = (), rack: str | None = None,
           states: tuple[str, ...] = (), problems: bool = False) -> list[dict]:
    """The rows that pass every filter given: a node name matching one of `patterns` (shell-style
    globs), a rack matching `rack`, a liveness in `states` (or, for `lost` / `stopped`, an offline
    node with that reason), and with `problems` a node that is not online, has active alerts, or
    that the fleet state found claimed by two daemons or with its clock off (`flags`)."""
    out = []
    for r in rows:
        if patterns and not any(fnmatch.fnmatchcase(r["node"], p) for p in patterns):
            continue
        if rack is not None and (r["rack"] is None or not fnmatch.fnmatchcase(r["rack"], rack)):
            continue
        if states and r["liveness"] not in states and not (r["liveness"] == "offline" and r["reason"] in states):
            continue
        if problems and r["liveness"] == "online" and not any(r["alerts"].values()) and not flags(r):
            continue
        out.append(r)
    return out


def flags(r: dict) -> list[str]:
    """What the fleet state found about a node itself (nvmon.fleet.guard's findings, formatted):
    '2 daemons' (a duplicate node name), 'clock +5m' (its clock ahead, '-' behind, beyond the bound)."""
    out = ["2 daemons"] if r["duplicate"] is not None else []
    if r["clock_skew_s"] is not None:
        out.append(f"clock {'+' if r['clock_skew_s'] > 0 else '-'}{age_text(abs(r['clock_skew_s']))}")
    return out


def _table(rows: list[dict], with_cluster: bool) -> str:
    head = (["CLUSTER"] if with_cluster else []) + ["NODE", "RACK", "BOARD", "DRIVER", "LIVENESS", "AGE", "VERSION",
                                                    "ALERTS", "FLAGS"]
    lines = [head]
    for r in rows:
        live = r["liveness"] + (f" ({r['reason']})" if r["reason"] else "")
        age = ("≤" if not r["age_exact"] else "") + age_text(r["age_s"])  # as the TUI writes it
        alerts = " ".join(f"{n} {sev}" for sev, n in sorted(r["alerts"].items())) or "-"
        line = [r["node"], r["rack"] or "-", r["board"] or "-", r["driver"] or "-", live, age, r["version"] or "-",
                alerts, ", ".join(flags(r)) or "-"]
        lines.append(([r["cluster"]] if with_cluster else []) + [_printable(c) for c in line])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def summaries_only(summaries: dict) -> str:
    """What to say after "no nodes on URL" when that broker carries clusters' summaries (a central
    broker that bridges only `@summary` up): which clusters, and where their nodes are listed."""
    if not summaries:
        return ""
    shown = [f"{_printable(c)} {s.nodes.online}/{s.nodes.total} online" for c, s in sorted(summaries.items())[:5]]
    more = f", +{len(summaries) - 5} more" if len(summaries) > 5 else ""
    return (f"; it carries the summaries of {len(summaries)} cluster{'s' if len(summaries) > 1 else ''} "
            f"({', '.join(shown)}{more}): list their nodes on each cluster's own broker, or drill in "
            "with `nvmon tui --cluster '+'`")


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
@click.argument("patterns", nargs=-1, metavar="[NODE_GLOB]...")
@_broker_options
@click.option("--cluster", default=None, callback=check_cluster, help="One cluster (default: every cluster).")
@click.option("--rack", "rack_glob", metavar="GLOB", help="Only nodes of these racks, e.g. r07 or 'r0*'.")
@click.option("--state", "states", multiple=True, type=click.Choice(STATES),
              help="Only nodes in this state (repeatable): online, stale, offline, or lost / stopped "
                   "(offline by the will, or stopped cleanly).")
@click.option("--problems", is_flag=True,
              help="Only nodes that are not online, have active alerts, or have a FLAG (two daemons, clock off).")
@_settle_option
@click.option("--json", "as_json", is_flag=True, help="A JSON list of node objects instead of the table.")
def nodes_command(patterns: tuple[str, ...], broker: BrokerFlags, config_path: Path | None, cluster: str | None,
                  rack_glob: str | None, states: tuple[str, ...], problems: bool, settle_s: float,
                  as_json: bool) -> None:
    """List a fleet's nodes with their liveness, as the broker has them: one line per node (rack,
    board and driver from its inventory, online / stale / offline and why, since when, daemon
    version, active alerts, flags). NODE_GLOBs (e.g. 'gpu-0*') pick nodes by name; the filters combine.

    The age of an offline node comes from its status's own timestamp; `≤6m` (age_exact false in
    --json) is a will found retained: silent for at most that long. BOARD is GPU count × the
    spec's model key and the board's topology class ('-': no inventory seen). FLAGS: '2 daemons'
    (two publish as this node; its evidence in --json's duplicate), 'clock +5m' (its clock ahead,
    '-' behind, beyond what its timestamps are trusted to). Exit 0 once listed, whether or not a
    node matched.
    """
    for p in (*patterns, *([rack_glob] if rack_glob is not None else [])):
        if not p or len(p) > 200 or not p.isprintable():
            raise NvmonUsageError(f"{p[:80]!r}: a glob is 1-200 printable characters")
    settings = settings_of(broker, config_path)
    fleet = fleet_settings(config_path)
    # The clusters' summaries too: a central broker of bridged clusters carries only those (docs/fleet.md).
    snap = run(settings, read(settings, cluster, settle_s, controls=True,
                              stale_factor=fleet.stale_after_intervals if fleet is not None else None))
    every = node_rows(snap.state, time.time())
    rows = select(every, patterns=patterns, rack=rack_glob, states=states, problems=problems)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    elif not rows:
        where = f"on {settings.url}" + (f" in cluster {cluster}" if cluster else "")
        click.echo(f"no nodes {where}{summaries_only(snap.summaries)}" if not every
                   else f"none of {len(every)} nodes {where} match", err=True)
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
    settings = settings_of(broker, config_path)
    state = run(settings, read_fleet(settings, cluster, settle_s))
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
    run(settings, _clear(settings, [topic(cluster, n, kind) for n in nodes for kind in CLEARED]))
    left = run(settings, read_fleet(settings, cluster, min(settle_s, 1.0)))
    kept = [n for n in nodes if (cluster, n) in left.nodes and left.nodes[(cluster, n)].status is not None]
    if kept:
        raise NvmonError(f"the broker still holds the retained status of {', '.join(kept)}: no write access to "
                         f"nvmon/v1/{cluster}/<node>/status? (the broker's ACL decides)")
    click.echo(f"forgot {', '.join(nodes)} in cluster {cluster} on {settings.url}")


async def _clear(settings, topics: list[str]) -> None:
    from nvmon.wire.mqtt import make_client

    async with make_client(settings, client_id=settings.client_id or client_id("forget")) as client:
        for t in topics:
            await client.publish(t, b"", qos=1, retain=True)
