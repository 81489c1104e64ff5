"""`nvmon fleet`: the headless fleet evaluator as a command (systemd/nvmon-fleet.service).

Options, logging and the exit status; the config, the rules and the run loop are nvmon.fleet.service.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from nvmon.cli.common import (DEFAULT_FLEET_DB, check_broker, check_broker_files, check_cluster, check_db_writable,
                              load_fleet_config, mqtt_settings, resolve_db, setup_logging)
from nvmon.fleet.service import DEFAULT_CONFIG

DEFAULT_BROKER = "mqtt://localhost:1883"


@click.command("fleet")
@click.option("--broker", default=None, metavar="URL", callback=check_broker,
              help=f"mqtt://HOST[:PORT] or mqtts://HOST[:PORT] (default: [mqtt] broker, else {DEFAULT_BROKER}).")
@click.option("--cluster", default=None, callback=check_cluster, help="Watch this cluster only (default: every cluster).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="PATH", help=f"TOML config: [fleet], [mqtt], [[hooks]] (default {DEFAULT_CONFIG} if present).")
@click.option("--db", "db_path", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="PATH",
              help=f"SQLite file for fleet alert state (default: [fleet] db, {DEFAULT_FLEET_DB}; outside "
                   "systemd, when /var/lib/nvmon is missing: $XDG_STATE_HOME/nvmon/fleet.db).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def fleet_command(broker: str | None, cluster: str | None, config_path: Path | None, db_path: Path | None,
                  log_level: str) -> None:
    """Evaluate fleet rules and run the on-call hooks: node offline (MQTT will) or stale, rack
    power over budget, many nodes with the same fault (docs/alerts.md, "Fleet rules").

    \b
    Under systemd: systemd/nvmon-fleet.service.   For a look: nvmon sim-fleet in another shell, then
    nvmon fleet --broker mqtt://localhost:1883 --cluster sim --db /tmp/fleet.db
    Stop with SIGTERM or Ctrl-C: alert state is saved, exit 0.
    """
    from nvmon.fleet.service import run_fleet

    cfg = load_fleet_config(config_path)
    m = cfg.mqtt
    settings = mqtt_settings(broker or m.broker or DEFAULT_BROKER, m, keepalive=True)
    check_broker_files(settings)
    db = resolve_db(db_path or cfg.fleet.db, DEFAULT_FLEET_DB, create=True)
    check_db_writable(db)
    setup_logging(log_level)
    sys.exit(asyncio.run(run_fleet(cfg, settings, cluster=cluster or cfg.fleet.cluster, db=db)))
