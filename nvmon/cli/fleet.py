"""`nvmon fleet`: the headless fleet evaluator as a command (systemd/nvmon-fleet.service).

Options, logging and the exit status; the config, the rules and the run loop are nvmon.fleet.service.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from nvmon.cli.common import (DEFAULT_BROKER, DEFAULT_FLEET_DB, NAME_HINT, BrokerFlags, broker_options,
                              check_broker_files, check_db_writable, load_fleet_config, resolve_db, setup_logging,
                              log_options)
from nvmon.fleet.service import DEFAULT_CONFIG


def check_clusters(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    """`--cluster a --cluster b` or `--cluster a,b` → ('a', 'b'), in order, each once; () when not given."""
    from nvmon.wire.contract import valid_name

    names = [n.strip() for v in values for n in v.split(",")]
    for n in names:
        if not valid_name(n):
            raise click.BadParameter(f"{n!r}: {NAME_HINT}" if n else f"an empty name in {','.join(values)!r}")
    return tuple(dict.fromkeys(names))


@click.command("fleet")
@broker_options(broker_help=f"Default: --config's [mqtt] broker, else {DEFAULT_BROKER}.")
@click.option("--cluster", "clusters", multiple=True, metavar="NAME[,NAME...]", callback=check_clusters,
              help="Watch these clusters only (repeatable, or a comma list; default: [fleet] cluster or clusters, "
                   "else every cluster).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="PATH", help=f"TOML config: [fleet], [mqtt], [[hooks]] (default {DEFAULT_CONFIG} if present).")
@click.option("--db", "db_path", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="PATH",
              help=f"SQLite file for fleet alert state (default: [fleet] db, {DEFAULT_FLEET_DB}; outside "
                   "systemd, when /var/lib/nvmon is missing: $XDG_STATE_HOME/nvmon/fleet.db).")
@click.option("--watch", type=click.Choice(["nodes", "summaries"]), default=None,
              help="nodes (default: [fleet] watch): judge the clusters' nodes and publish each cluster's summary "
                   "(nvmon/v1/<cluster>/@summary); summaries: a central instance that reads only the clusters' "
                   "summaries and raises one cluster.unreachable for a cluster whose summary stops coming.")
@log_options
def fleet_command(broker: BrokerFlags, clusters: tuple[str, ...], config_path: Path | None, db_path: Path | None,
                  watch: str | None, log_level: str, log_format: str) -> None:
    """Evaluate fleet rules and run the on-call hooks: node offline (MQTT will) or stale, rack
    power over budget, many nodes with the same fault (docs/alerts.md, "Fleet rules").

    Under systemd: systemd/nvmon-fleet.service.

    \b
    For a look: nvmon sim-fleet in another shell, then
      nvmon fleet --broker mqtt://localhost:1883 --cluster sim --db /tmp/fleet.db

    Stop with SIGTERM or Ctrl-C: alert state is saved, exit 0.

    One instance may watch several clusters (--cluster a,b); their alerts carry their own cluster.
    Two instances of the same clusters (HA) raise the same alerts with the same identities, so
    Alertmanager and PagerDuty see one (docs/fleet.md, "Scaling out"). Clusters of clusters: each
    cluster's instance publishes its summary; a central one with --watch summaries pages once per
    cluster out of reach.
    """
    from nvmon.fleet.service import run_fleet

    cfg = load_fleet_config(config_path)
    if watch is not None:
        cfg = cfg.model_copy(update={"fleet": cfg.fleet.model_copy(update={"watch": watch})})
    settings = broker.settings(cfg.mqtt, keepalive=True)
    check_broker_files(settings)
    db = resolve_db(db_path or cfg.fleet.db, DEFAULT_FLEET_DB, create=True)
    check_db_writable(db)
    setup_logging(log_level, log_format)
    sys.exit(asyncio.run(run_fleet(cfg, settings, clusters=clusters or cfg.fleet.watched, db=db)))
