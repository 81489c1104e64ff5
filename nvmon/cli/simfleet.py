"""`nvmon sim-fleet`: the load generator as a command (registered by nvmon.cli).

Bad input is a one-line error and exit status 2 (usage) or 1, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal

import click

from nvmon.cli.common import (BrokerFlags, NvmonError, NvmonUsageError, broker_options, check_broker_files,
                              check_cluster, check_interval, counted)


def _faults(ctx, param, values: tuple[str, ...]) -> dict[int, str]:
    out: dict[int, str] = {}
    for v in values:
        index, sep, spec = v.partition("=")
        if not sep or not index.strip().isdigit() or not spec.strip():
            raise click.BadParameter(f"{v!r}: expected NODE_INDEX=SIMSPEC, e.g. 3=nvlink_down=2.5")
        if int(index) in out:
            raise click.BadParameter(f"node {int(index)} given twice: join its faults with commas")
        out[int(index)] = spec.strip()
    return out


@click.command("sim-fleet")
@click.option("--nodes", type=click.IntRange(1, 20_000), default=20, show_default=True, help="Nodes to simulate.")
@broker_options
@click.option("--cluster", default="sim", show_default=True, callback=check_cluster, help="Cluster name (topic level).")
@click.option("--racks", type=click.IntRange(1, 10_000), default=1, show_default=True,
              help="Racks to spread the nodes over, in order (rack-00 holds the first nodes).")
@click.option("--interval", type=float, default=1.0, show_default=True, callback=check_interval,
              help="Seconds between a node's samples.")
@click.option("--fault", "faults", multiple=True, callback=_faults, metavar="NODE_INDEX=SIMSPEC",
              help="Plant faults on one node, e.g. 3=nvlink_down=2.5,pcie_width=3:8 (keys as in --sim; "
                   "a spec starting with a profile replaces the board). Repeatable.")
@click.option("--profile", default="hgx-h100", show_default=True, help="Board profile of healthy nodes.")
@click.option("--prefix", default="sim", show_default=True, help="Node names are PREFIX-000, PREFIX-001, ...")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Stop after this long (default: until Ctrl-C or SIGTERM), as `nvmon demo --duration`.")
@click.option("--keepalive", type=click.IntRange(1, 3600), default=10, show_default=True, metavar="SECONDS",
              help="Each node's MQTT keepalive, as a daemon's [mqtt] keepalive_s: the broker publishes a "
                   "silent node's will after 1.5 × this.")
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), default=None, hidden=True)  # old --duration
def sim_fleet_command(nodes: int, broker: BrokerFlags, cluster: str, racks: int, interval: float,
                      faults: dict[int, str], profile: str, prefix: str, duration: float | None,
                      keepalive: int, seconds: float | None) -> None:
    """Publish a simulated fleet to a broker, as N node daemons would.

    Each node has its own connection, will, retained status/inventory/alerts and one sample per
    interval. A few real simulated boards (4 healthy seeds plus one per fault spec) feed all the
    nodes, so 1,000 nodes at 1 Hz run on one core. Stopping publishes `offline` for every node;
    killing the process lets the broker publish their wills.
    """
    from nvmon.loadgen.fleet import SimFleet, describe

    if duration is not None and seconds is not None:
        raise NvmonUsageError("--seconds is the old name of --duration: give one")
    settings = dataclasses.replace(broker.settings(), keepalive_s=keepalive)
    check_broker_files(settings)
    try:
        fleet = SimFleet(settings, nodes, cluster=cluster, racks=racks, faults=faults,
                         interval_s=interval, profile=profile, prefix=prefix)
    except ValueError as e:
        raise NvmonUsageError(str(e)) from None
    click.echo(describe(fleet) + "; Ctrl-C to stop", err=True)
    asyncio.run(_run(fleet, duration if duration is not None else seconds))
    s = fleet.stats
    if s.published == 0:  # a run that never reached the broker is a failure, not a quiet exit 0
        raise NvmonError(f"sim-fleet published nothing to {settings.url} ({counted(s.connects, 'connection')}, "
                         f"{counted(s.errors, 'error')}" + (f"; last: {s.last_error})" if s.last_error else ")"))


async def _run(fleet, seconds: float | None) -> None:
    from nvmon.wire.mqtt import quiet_aiomqtt_noise

    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(quiet_aiomqtt_noise)
    for sig in (signal.SIGINT, signal.SIGTERM):  # stop cleanly: every node says offline/stopped
        loop.add_signal_handler(sig, task.cancel)
    reporter = asyncio.create_task(_report(fleet))
    try:
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            async with asyncio.timeout(seconds):
                await fleet.run()
    finally:
        reporter.cancel()
    s = fleet.stats
    if s.published:  # else the caller's one-line error says it all
        click.echo(f"sim-fleet: stopped; {counted(s.published, 'sample')} published, "
                   f"{counted(s.connects, 'connection')}, {counted(s.errors, 'error')}"
                   + (f" (last: {s.last_error})" if s.last_error else ""), err=True)


async def _report(fleet, every_s: float = 10.0, first_s: float = 0.2) -> None:
    """The first connection error at once (a wrong broker shows within a second, then the nodes
    retry), then a line every `every_s` while nodes are not all connected."""
    while fleet.stats.errors == 0 and fleet.stats.connected == 0:
        await asyncio.sleep(first_s)
    s = fleet.stats
    if s.connected == 0 and s.last_error:
        click.echo(f"sim-fleet: cannot reach {fleet.settings.url}: {s.last_error}; retrying", err=True)
    errors = s.errors
    while True:
        await asyncio.sleep(every_s)
        s = fleet.stats
        if s.connected < s.nodes or s.errors > errors:
            click.echo(f"sim-fleet: {s.connected}/{s.nodes} nodes connected, {counted(s.published, 'sample')} published"
                       + (f"; last error: {s.last_error}" if s.last_error else ""), err=True)
        errors = s.errors
