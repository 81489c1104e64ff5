"""`nvmon tui`: the command (registered by nvmon.cli). Bad input is a one-line error, exit 2."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from nvmon.cli.common import (DEFAULT_BROKER, BrokerFlags, broker_options, check_broker_files, check_cluster,
                              load_fleet_config)


@click.command("tui")
@broker_options(broker_help=f"Default: --config's [mqtt] broker, else {DEFAULT_BROKER}.")
@click.option("--config", "config_path", default=None, metavar="PATH", type=click.Path(dir_okay=False, path_type=Path),
              help="A daemon or fleet TOML config: its [mqtt] broker, user, password and TLS files, and "
                   "[alerts] max_silence_h (the longest shared silence shown as applied, and x's cap).")
@click.option("--cluster", callback=check_cluster, help="Show one cluster (default: every cluster on the broker).")
@click.option("--rack-budget-kw", type=click.FloatRange(min=0, min_open=True), metavar="KW",
              help="Power budget per rack, shown against each rack's GPU draw when grouped by rack (g).")
@click.option("--log-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write nvmon's log here (the terminal belongs to the TUI).")
def tui_command(broker: BrokerFlags, config_path: Path | None, cluster: str | None, rack_budget_kw: float | None,
                log_file: str | None) -> None:
    """Live view of the fleet: one row per node, drill-down per node, alerts.

    \b
    Keys: Enter node · / filter · s sort · g racks · p problems · a alerts · ? help · q quit
    Try it without hardware:  nvmon sim-fleet --nodes 50 --racks 4 &  nvmon tui
    """
    cfg = load_fleet_config(config_path) if config_path is not None else None
    m = cfg.mqtt if cfg is not None else None
    settings = broker.settings(m)
    check_broker_files(settings)  # before the screen opens: a wrong file is not a retry loop
    # Logs must not scribble over the screen: to --log-file, else nowhere (the header and its
    # banner show the broker's state and the drop counts).
    handler = logging.FileHandler(log_file) if log_file else logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    loggers = [logging.getLogger(name) for name in ("nvmon", "asyncio")]
    saved = [(lg, lg.propagate, lg.level) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.propagate = False
    logging.getLogger("nvmon").setLevel(logging.INFO)
    try:
        from nvmon.tui.app import NvmonApp

        caps = {"max_silence_s": cfg.alerts.max_silence_h * 3600} if cfg is not None else {}
        NvmonApp(settings, cluster=cluster, rack_budget_kw=rack_budget_kw, **caps).run()
    finally:  # as it was: the process may go on (tests run the command in-process)
        for lg, propagate, level in saved:
            lg.removeHandler(handler)
            lg.propagate, lg.level = propagate, level
        handler.close()
