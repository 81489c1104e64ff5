"""`nvmon tui`: the command (registered by nvmon.cli). Bad input is a one-line error, exit 2."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from nvmon.cli.common import (DEFAULT_BROKER, NAME_HINT, BrokerFlags, broker_options, check_broker_files,
                              load_fleet_config)


def check_clusters(ctx, param, value: str | None) -> tuple[str, ...] | None:
    """`a` → ('a',); `a,b` → ('a', 'b'); `+` → () (every cluster, from their summaries); None when not given."""
    if value is None:
        return None
    if value.strip() == "+":
        return ()
    from nvmon.wire.contract import valid_name

    names = [n.strip() for n in value.split(",")]
    for n in names:
        if not valid_name(n):
            raise click.BadParameter(f"{n!r}: {NAME_HINT}, or + for every cluster" if n
                                     else f"an empty name in {value!r}")
    return tuple(dict.fromkeys(names))


@click.command("tui")
@broker_options(broker_help=f"Default: --config's [mqtt] broker, else {DEFAULT_BROKER}.")
@click.option("--config", "config_path", default=None, metavar="PATH", type=click.Path(dir_okay=False, path_type=Path),
              help="A daemon or fleet TOML config: its [mqtt] broker, user, password and TLS files, and "
                   "[alerts] max_silence_h (the longest shared silence shown as applied, and x's cap), [fleet] "
                   "summary_stale_intervals (the cluster overview's unreachable), and its other [fleet] keys "
                   "for one cluster's nodes (stale_after_intervals, the caps and expiry: as nvmon fleet).")
@click.option("--cluster", "clusters", callback=check_clusters, metavar="NAME[,NAME...]|+",
              help="Show one cluster's nodes; or, for several (a,b) or every one (+), open on a cluster overview "
                   "built from their summaries (nvmon fleet publishes them), subscribing to a cluster's nodes only "
                   "when you open it (Enter; Escape goes back). Default: the overview of every cluster when the "
                   "broker holds several clusters' summaries, else every node of every cluster.")
@click.option("--rack-budget-kw", type=click.FloatRange(min=0, min_open=True), metavar="KW",
              help="Power budget per rack, shown against each rack's GPU draw when grouped by rack (g).")
@click.option("--log-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write nvmon's log here (the terminal belongs to the TUI).")
def tui_command(broker: BrokerFlags, config_path: Path | None, clusters: tuple[str, ...] | None,
                rack_budget_kw: float | None, log_file: str | None) -> None:
    """Live view of the fleet: one row per node, drill-down per node, alerts.

    \b
    Keys: Enter node · / filter · s sort · g racks · p problems · a alerts
          ? help · q quit
    Try it without hardware:  nvmon sim-fleet --nodes 50 --racks 4 &  nvmon tui
    Many clusters: nvmon tui --cluster '+'
                   (an overview from their summaries; docs/fleet.md)
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
        state = None
        if cfg is not None and "fleet" in cfg.model_fields_set:  # the fleet's caps and expiry, as nvmon fleet's
            from nvmon.fleet.state import FleetState

            f = cfg.fleet
            state = FleetState(stale_factor=f.stale_after_intervals, max_nodes=f.max_nodes, max_clusters=f.max_clusters,
                               max_without_inventory=f.max_nodes_without_inventory,
                               forget_without_inventory_s=f.forget_without_inventory_s)
        if clusters is None:  # the broker holds several clusters' summaries: open on their overview
            import asyncio

            from nvmon.fleet.clusters import summarized_clusters

            if len(asyncio.run(summarized_clusters(settings))) > 1:
                clusters = ()
        if clusters is not None and len(clusters) != 1:  # several, or every one (+): the overview
            from nvmon.tui.clusters_app import ClustersApp

            stale = {"stale_intervals": cfg.fleet.summary_stale_intervals} if cfg is not None else {}
            ClustersApp(settings, clusters=clusters, rack_budget_kw=rack_budget_kw, **caps, **stale).run()
        else:
            NvmonApp(settings, cluster=clusters[0] if clusters else None, rack_budget_kw=rack_budget_kw, state=state,
                     **caps).run()
    finally:  # as it was: the process may go on (tests run the command in-process)
        for lg, propagate, level in saved:
            lg.removeHandler(handler)
            lg.propagate, lg.level = propagate, level
        handler.close()
