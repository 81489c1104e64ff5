"""The commands about this node: `sample` and `audit` (once), `daemon` (the node agent).

`--sim SPEC` puts a simulated board (nvmon.sim) in place of the hardware for any of them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click

from nvmon.cli.common import (DEFAULT_BROKER, DEFAULT_DB, NAME_HINT, NAME_RE, NvmonError, NvmonUsageError,
                              broker_options, check_broker_files, check_db_writable, check_interval, mqtt_settings,
                              log_options, on_terminal, resolve_db, setup_logging, stdout_console)


class AuditError(NvmonError):
    exit_code = 3  # Nagios UNKNOWN: the check itself could not run


def _check_node(ctx, param, value: str | None) -> str | None:
    if value is not None and not NAME_RE.match(value):
        raise click.BadParameter(NAME_HINT)
    return value


def _check_sysfs(ctx, param, value: str | None) -> Path | None:
    if value is None:
        return None
    p = Path(value)
    if not p.is_dir():
        raise click.BadParameter(f"{value}: not a directory")
    if not os.access(p, os.R_OK | os.X_OK):
        raise click.BadParameter(f"{value}: not readable")
    return p


def sampling_options(f):
    """Options shared by `sample` and `audit` (and later the daemon)."""
    f = click.option("--node", callback=_check_node, help="Node name to report (default: short host name).")(f)
    f = click.option("--sysfs-root", "sysfs_root", callback=_check_sysfs, metavar="DIR",
                     help="Directory standing in for /sys (InfiniBand and PCIe readers).")(f)
    f = click.option("--sim", metavar="SPEC",
                     help="Simulate a board instead of reading hardware, e.g. 'hgx-h100' or "
                          "'hgx-h100,nvlink_down=2.5,ib_rate=mlx5_1:100'. See `nvmon profiles`.")(f)
    f = click.option("--interval", type=float, default=1.0, show_default=True, callback=check_interval,
                     help="Seconds between the two readings that rates are measured over.")(f)
    return f


def _take_sample(sim: str | None, sysfs_root: Path | None, node: str | None, interval: float, error_cls,
                 after=None):
    """Two readings `interval` apart; returns the second (rates need a previous reading).
    `after(sim_node or None)` runs once they are taken, before a simulated board closes."""
    from nvmon.collect.node import NodeSampler, load_real_pynvml

    sim_node = None
    if sim is not None:
        from nvmon.sim.node import SimNode
        from nvmon.sim.scenario import SimSpecError

        if sysfs_root is not None:
            raise error_cls("--sim brings its own fake /sys: drop --sysfs-root")
        try:
            sim_node = SimNode(sim, node=node or "sim-node")
        except SimSpecError as e:
            raise error_cls(str(e)) from None
        sampler = NodeSampler(sim_node.nvml, sysfs_root=sim_node.sysfs_root, node=node or "sim-node",
                              before_tick=sim_node.sync)
    else:
        sampler = NodeSampler(load_real_pynvml(), sysfs_root=sysfs_root or "/sys", node=node)
    try:
        sampler.open()
        sampler.sample()
        time.sleep(interval)
        s = sampler.sample()
        if after is not None:
            after(sim_node)
        return s
    finally:
        sampler.close()
        if sim_node is not None:
            sim_node.close()


@click.command()
@sampling_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema in docs/sample-schema.md).")
def sample(as_json: bool, interval: float, sim: str | None, sysfs_root: Path | None, node: str | None) -> None:
    """One snapshot of this node: GPUs, NVLink per link, PCIe, power, InfiniBand, topology.

    Rates (NVLink/PCIe/IB bytes per second, error counters' rise) are measured over --interval.
    Without a GPU driver the GPU part is empty and says why; the rest still works.
    """
    s = _take_sample(sim, sysfs_root, node, interval, NvmonUsageError)
    if as_json:
        from nvmon.model import sample_to_dict

        click.echo(json.dumps(sample_to_dict(s), indent=2))
    else:
        from nvmon.render import render_sample

        stdout_console().print(render_sample(s, full=not on_terminal()))


@click.command()
@sampling_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (keys in docs/audit.md).")
@click.option("--expect-gpus", type=click.IntRange(1, 64), metavar="N", help="GPUs this node must have.")
@click.option("--expect-ib", metavar="PORTSxGBPS", help="Active InfiniBand ports and rate, e.g. 8x200.")
@click.option("--expect-topology", type=click.Choice(["nvswitch", "pairs", "mesh", "none"]),
              help="Board class to require (default: what the GPU model's spec says; "
                   "use 'nvswitch' to insist on all-to-all NVSwitch).")
@click.option("--kernel-log", metavar="FILE", default="/dev/kmsg", show_default=True,
              help="Kernel log to read Xids from that the driver logged before the audit (needs root).")
@click.option("--xid-window", type=click.IntRange(0, 10080), default=10, show_default=True, metavar="MINUTES",
              help="How far back the kernel log's Xids count; 0: do not read it.")
def audit(as_json: bool, interval: float, sim: str | None, sysfs_root: Path | None, node: str | None,
          expect_gpus: int | None, expect_ib: str | None, expect_topology: str | None, kernel_log: str,
          xid_window: int) -> None:
    """Check this node against its hardware's spec: pass/fail with findings.

    \b
    Exit status (Nagios / Slurm HealthCheckProgram style):
      0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN
      (3: no NVML, an unknown GPU model, bad input)
    """
    from nvmon.audit import EXIT_CODES, audit as run_audit, report_to_dict
    from nvmon.specs import NodeSpec, parse_expect_ib

    ib_ports = ib_rate = None
    if expect_ib is not None:
        try:
            ib_ports, ib_rate = parse_expect_ib(expect_ib)
        except ValueError as e:
            raise AuditError(f"--expect-ib: {e}") from None
    spec = NodeSpec(gpus=expect_gpus, ib_ports=ib_ports, ib_rate_gbps=ib_rate, topology=expect_topology)
    logs = []

    def read_log(sim_node) -> None:  # the simulator keeps its own fake /dev/kmsg, on its own clock
        from nvmon.collect.kmsg import read_logged_xids

        if xid_window:
            where = (dict(path=sim_node.kmsg_path, uptime_s=sim_node.kernel_uptime()) if sim_node is not None
                     else dict(path=kernel_log))
            logs.append((str(where["path"]), read_logged_xids(**where, window_s=xid_window * 60.0)))

    s = _take_sample(sim, sysfs_root, node, interval, AuditError, after=read_log)
    report = run_audit(s, spec, logged_xids=logs[0][1].xids if logs else ())
    for _, log in logs:
        if log.note:
            click.echo(f"nvmon audit: note: {log.note}", err=True)
    if as_json:
        d = report_to_dict(report)
        d["kernel_log"] = ({"path": logs[0][0], "window_s": xid_window * 60, "xids": len(logs[0][1].xids),
                            "skipped": logs[0][1].skipped, "note": logs[0][1].note} if logs else None)
        click.echo(json.dumps(d, indent=2))
    else:
        from nvmon.render import render_audit

        stdout_console().print(render_audit(report, full=not on_terminal()))
    sys.exit(EXIT_CODES[report.verdict])


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="TOML config (default /etc/nvmon/nvmon.toml if it exists; example: systemd/nvmon.toml).")
@broker_options(broker_help=f"'' to not publish. Default: --config's [mqtt] broker, else {DEFAULT_BROKER}.")
@click.option("--db", metavar="PATH", help="SQLite history database (default /var/lib/nvmon/nvmon.db; outside "
              "systemd, when /var/lib/nvmon is missing: $XDG_STATE_HOME/nvmon/nvmon.db).")
@click.option("--interval", type=float, metavar="SECONDS", help="Sampling period (default 1).")
@click.option("--node", help="Node name on the wire and in the db (default: short host name).")
@click.option("--cluster", help="Cluster name: the topic tree is nvmon/v1/<cluster>/<node>/.")
@click.option("--rack", help="Rack name, for per-rack power views.")
@click.option("--sim", metavar="SPEC", help="Simulate a board (see `nvmon profiles`), e.g. on a machine without GPUs.")
@click.option("--sysfs-root", metavar="DIR", help="Directory standing in for /sys.")
@click.option("--prometheus", metavar="HOST:PORT",
              help="Serve Prometheus /metrics there, e.g. 0.0.0.0:9400 (docs/prometheus.md); '' for none.")
@log_options
def daemon(config_path, broker, db, interval, node, cluster, rack, sim, sysfs_root, prometheus, log_level,
           log_format) -> None:
    """Run the node agent: sample every second, keep history in SQLite, publish over MQTT,
    and (with --prometheus) serve /metrics, dcgm-exporter compatible.

    On a GPU node, under systemd: see systemd/nvmon-daemon.service and docs/install.md.

    \b
    On any machine, for a look:
      nvmon daemon --sim hgx-h100 --db /tmp/nvmon.db \\
          --broker mqtt://localhost:1883

    Stop with SIGTERM or Ctrl-C: status goes `offline`, queued ticks are flushed, exit 0.
    """
    import asyncio

    from nvmon.daemon.config import ConfigError, load_config

    overrides = {**{k: v or None for k, v in broker.given.items() if k != "url"}, "broker": broker.broker,
                 "db": db, "interval": interval, "node": node, "cluster": cluster,
                 "rack": rack, "sim": sim, "sysfs_root": sysfs_root, "prometheus": prometheus}
    try:
        cfg = load_config(config_path, overrides)
    except ConfigError as e:  # a flag's value (the message starts with it) is bad usage; the file's is not
        raise (NvmonUsageError if str(e).startswith("--") else NvmonError)(str(e)) from None
    if cfg.sampling.sim:
        from nvmon.sim.scenario import SimSpecError, parse_scenario

        try:
            parse_scenario(cfg.sampling.sim)
        except SimSpecError as e:
            raise (NvmonUsageError if sim else NvmonError)(str(e)) from None
    cfg = _checked_paths(cfg)
    setup_logging(log_level, log_format)
    from nvmon.daemon.main import Daemon

    try:
        status = asyncio.run(Daemon(cfg).run())
    except ConfigError as e:  # found only when used, e.g. the Prometheus port is taken
        raise NvmonError(str(e)) from None
    sys.exit(status)


def _checked_paths(cfg):
    """What the daemon writes and reads, checked before it starts: a database path or a broker file
    given wrongly is a one-line error now, not a retry loop for ever (those are for later faults)."""
    db = resolve_db(cfg.store.path, DEFAULT_DB, create=True)
    check_db_writable(db)
    if cfg.mqtt.broker:
        check_broker_files(mqtt_settings(cfg.mqtt.broker, cfg.mqtt, keepalive=True))
    return cfg if db == cfg.store.path else cfg.model_copy(update={"store": cfg.store.model_copy(update={"path": db})})
