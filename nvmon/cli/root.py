"""The `nvmon` command. Each subcommand is a thin front end over the library; bad input gives a
one-line error and a non-zero exit, never a traceback (set NVMON_DEBUG=1 to see one)."""

from __future__ import annotations

import os
import sys

import click

from nvmon import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="nvmon")
def cli() -> None:
    """nvmon — NVLink, PCIe, power and InfiniBand health of 8-GPU servers.

    \b
    Start here:  nvmon demo   (a simulated fleet + the TUI; no GPU, no broker)
    On a node:   nvmon sample    /    nvmon audit --expect-ib 8x400
    Ops view:    nvmon tui --broker mqtt://broker:1883
    Exit status: 0 done, 1 could not do it ("nvmon: ..."),
                 2 bad usage ("nvmon CMD: ..."); audit: 0-3 Nagios
    """


def _register_subcommands() -> None:
    """One module per command or group in this package."""
    from nvmon.cli.alerts import alerts_command
    from nvmon.cli.config import config_group
    from nvmon.cli.demo import demo_command
    from nvmon.cli.fleet import fleet_command
    from nvmon.cli.history import history_command
    from nvmon.cli.hooks import hooks_group
    from nvmon.cli.node import audit, daemon, sample
    from nvmon.cli.nodes import forget_command, nodes_command
    from nvmon.cli.profiles import profiles_command
    from nvmon.cli.simfleet import sim_fleet_command
    from nvmon.cli.tui import tui_command

    for command in (sample, audit, daemon, profiles_command, alerts_command, demo_command, history_command,
                    hooks_group, fleet_command, sim_fleet_command, tui_command, nodes_command, forget_command,
                    config_group):
        command.short_help = SHORT_HELP.get(command.name, command.short_help)
        cli.add_command(command)


# `nvmon --help`'s one line per command: whole, within 80 columns (click would cut each
# command's first docstring sentence with "..."). tests/test_cli_wording.py holds them to it.
SHORT_HELP = {
    "sample": "One snapshot of this node: GPUs, NVLink, PCIe, power, IB.",
    "audit": "Check this node against its spec (Nagios exit 0-3).",
    "daemon": "Run the node agent: history, MQTT, Prometheus /metrics.",
    "profiles": "List the simulator's boards and the --sim syntax.",
    "alerts": "This node's alerts (or a fleet's): list, ack, silence.",
    "demo": "A simulated fleet with planted faults, live in the TUI.",
    "history": "Show this node's recorded history (read-only).",
    "hooks": "On-call hooks: send a test alert through each one.",
    "fleet": "Evaluate fleet rules and page: offline nodes, racks.",
    "sim-fleet": "Publish a simulated fleet to a broker (load test).",
    "tui": "Live view of the fleet: nodes, GPUs, alerts.",
    "nodes": "List a fleet's nodes and their liveness.",
    "forget": "Forget decommissioned nodes on the broker.",
    "config": "Check a config file; print it with defaults filled in.",
}


_register_subcommands()


def main() -> None:
    """Console entry point: one-line errors for everything, tracebacks only with NVMON_DEBUG=1."""
    try:
        cli(standalone_mode=False, prog_name="nvmon")  # "nvmon …" in messages, however started (python -m)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.Abort:
        click.echo("nvmon: aborted", err=True)
        sys.exit(130)
    except click.UsageError as e:
        cmd = e.ctx.command_path if e.ctx else "nvmon"
        code = 3 if e.ctx is not None and e.ctx.info_name == "audit" else 2
        click.echo(f"{cmd}: {e.format_message()}", err=True)
        sys.exit(code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as e:  # a bug: say so in one line, keep the traceback for NVMON_DEBUG=1
        if os.environ.get("NVMON_DEBUG"):
            raise
        click.echo(f"nvmon: internal error: {type(e).__name__}: {e} (set NVMON_DEBUG=1 for details)", err=True)
        sys.exit(70)
