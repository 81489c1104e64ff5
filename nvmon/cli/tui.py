"""`nvmon tui`: the command (registered by nvmon.cli). Bad input is a one-line error, exit 2."""

from __future__ import annotations

import logging
import os

import click

from nvmon.cli.common import NvmonUsageError, check_broker, check_broker_files, check_cluster

DEFAULT_BROKER = "mqtt://127.0.0.1:1883"


@click.command("tui")
@click.option("--broker", metavar="URL", default=lambda: os.environ.get("NVMON_BROKER") or DEFAULT_BROKER,
              callback=check_broker,
              show_default=f"$NVMON_BROKER or {DEFAULT_BROKER}", help="mqtt://HOST[:PORT] or mqtts://HOST[:PORT].")
@click.option("--cluster", callback=check_cluster, help="Show one cluster (default: every cluster on the broker).")
@click.option("--username", help="Broker user name.")
@click.option("--password-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="File holding the broker password (never on the command line).")
@click.option("--ca-file", type=click.Path(dir_okay=False), metavar="FILE", help="CA bundle for mqtts (default: system CAs).")
@click.option("--cert-file", type=click.Path(dir_okay=False), metavar="FILE", help="Client certificate (mutual TLS).")
@click.option("--key-file", type=click.Path(dir_okay=False), metavar="FILE", help="Client certificate key.")
@click.option("--tls-insecure", is_flag=True, help="Skip the broker host name check (the chain is still verified).")
@click.option("--rack-budget-kw", type=click.FloatRange(min=0, min_open=True), metavar="KW",
              help="Power budget per rack, shown against each rack's GPU draw when grouped by rack (g).")
@click.option("--log-file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write nvmon's log here (the terminal belongs to the TUI).")
def tui_command(broker: str, cluster: str | None, username: str | None, password_file: str | None,
                ca_file: str | None, cert_file: str | None, key_file: str | None, tls_insecure: bool,
                rack_budget_kw: float | None, log_file: str | None) -> None:
    """Live view of the fleet: one row per node, drill-down per node, alerts.

    \b
    Keys: Enter node · / filter · s sort · g racks · p problems · a alerts · ? help · q quit
    Try it without hardware:  nvmon sim-fleet --nodes 50 --racks 4 &  nvmon tui
    """
    from nvmon.wire.mqtt import MqttSettings

    try:
        settings = MqttSettings(url=broker, username=username, password_file=password_file, ca_file=ca_file,
                                cert_file=cert_file, key_file=key_file, tls_insecure=tls_insecure)
    except ValueError as e:
        raise NvmonUsageError(str(e)) from None
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

        NvmonApp(settings, cluster=cluster, rack_budget_kw=rack_budget_kw).run()
    finally:  # as it was: the process may go on (tests run the command in-process)
        for lg, propagate, level in saved:
            lg.removeHandler(handler)
            lg.propagate, lg.level = propagate, level
        handler.close()
