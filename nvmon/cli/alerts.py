"""`nvmon alerts`: the node's active and recent alerts from its SQLite file; ack and silence them.

    nvmon alerts [--db PATH] [--json] [--all]
    nvmon alerts --broker URL [--cluster C]   (every node's active alerts and the fleet rules': alerts_broker)
    nvmon alerts ack FINGERPRINT            (a unique prefix will do)
    nvmon alerts silence --match node=gpu-07 --match code='nvlink.*' --for 2h [--comment TEXT]
    nvmon alerts silences                   (active silences)   ·   nvmon alerts unsilence ID

Acks and silences are written to the same database; the daemon reads them within a few seconds
and honours them: an acked alert is marked as such (no repeat pages), a silenced one is never
handed to the hooks. With `--broker URL` (or `[mqtt] broker` in `--config`) they are also shared:
published in the cluster's retained `nvmon/v1/<cluster>/@controls` set, which every daemon and
`nvmon fleet` of the cluster honours (nvmon.alerts.shared; docs/alerts.md). Without a local
database (an ops workstation) only the shared set is written; an ack then finds the alert in the
nodes' retained alert sets. Broker flags typed before a subcommand reach it (`_Share.of`).
"""

from __future__ import annotations

import getpass
import json
import os
import re
import sqlite3
import time
from pathlib import Path

import click

from nvmon.alerts.model import Silence, iso
from nvmon.cli.alerts_match import parse_duration, parse_matchers
from nvmon.cli.alerts_view import SEVERITY_CHOICES, ordered, render_alerts, select, where
from nvmon.cli.common import (DEFAULT_DB, NAME_HINT, NAME_RE, NvmonError, NvmonUsageError, BrokerFlags,
                              broker_options, check_broker, check_broker_files, load_fleet_config, on_terminal,
                              resolve_db, stdout_console)
from nvmon.store.errors import StoreError, describe

RECENT_S = 86400.0  # resolved alerts shown without --all


def _known_labels(path: str, config_path: Path | None) -> set[str]:
    """Label names on this database's alerts (every kept episode) and in --config's [node] labels."""
    from nvmon.store import alerts as db

    names: set[str] = set()
    if config_path is not None:
        labels = load_fleet_config(config_path).node.get("labels")
        names.update(labels if isinstance(labels, dict) else ())
    if Path(path).exists():
        names.update(k for r in _read(path, lambda conn: db.load(conn, since=None)) for k in r.labels)
    return names


def _who() -> str:
    return os.environ.get("SUDO_USER") or getpass.getuser()


def _read(db_path: str, fn):
    from nvmon.store.query import open_readonly

    try:
        conn = open_readonly(db_path)
    except StoreError as exc:
        raise NvmonError(str(exc)) from None
    try:
        return fn(conn)
    except sqlite3.Error as exc:
        raise NvmonError(str(describe(db_path, exc))) from None
    finally:
        conn.close()


def _write(db_path: str, fn):
    from nvmon.store import Store

    path = Path(db_path)
    if not path.exists():  # never create a database here: a typo would make an empty one
        raise NvmonError(f"database {path}: not found")
    store = Store(path)
    try:
        return store.transact(fn)
    except StoreError as exc:
        raise NvmonError(str(exc)) from None
    finally:
        store.close()


def _db_option(f):
    return click.option("--db", "db_path", default=None, metavar="PATH",
                        help=f"The node's database (default {DEFAULT_DB}; outside systemd, when its "
                             "directory is missing: $XDG_STATE_HOME/nvmon/nvmon.db).")(f)


def _db(ctx: click.Context, db_path: str | None) -> str:
    path = db_path or (ctx.parent.params.get("db_path") if ctx.parent else None) or DEFAULT_DB
    return str(resolve_db(path, DEFAULT_DB, create=False))  # outside systemd: maybe the user's state dir


def _share_options(f=None, *, listing: bool = False):
    """--broker, --config and --cluster of the alert commands; `listing`: worded for reading only."""
    if f is None:
        return lambda g: _share_options(g, listing=listing)
    f = click.option("--cluster", default=None, metavar="NAME",
                     help="Cluster whose shared set to read (default: --config's, else every cluster on the broker)."
                     if listing
                     else "Cluster whose shared set to change (default: the alert's, --config's [node] "
                          "or [fleet] cluster).")(f)
    f = click.option("--config", "config_path", default=None, metavar="PATH",
                     type=click.Path(dir_okay=False, path_type=Path),
                     help="A daemon or fleet TOML config: its [mqtt] broker and credentials, its cluster.")(f)
    return broker_options(f, broker_help="Also list the shared ones retained there, on nvmon/v1/<cluster>/@controls "
                                         "(default: --config's [mqtt] broker, else none)." if listing
                          else "Also share it there, retained on nvmon/v1/<cluster>/@controls (default: "
                               "--config's [mqtt] broker, else none).")


_TYPED = click.core.ParameterSource.COMMANDLINE
_GROUP_FLAGS = "nvmon.alerts.group_flags"  # ctx.meta: broker flags typed before a subcommand


def _check_group_broker(ctx: click.Context, param, value: str | None) -> str | None:
    """The group's --broker: checked as typed; from $NVMON_BROKER only by the listing itself, so that
    a subcommand's own check of it names the subcommand (`nvmon alerts ack: $NVMON_BROKER: ...`)."""
    if ctx.get_parameter_source(param.name) is click.core.ParameterSource.ENVIRONMENT:
        return value
    return check_broker(ctx, param, value)


def _group_broker_options(f):
    from nvmon.cli.fleetread import SETTLE_S

    f = click.option("--settle", "settle_s", type=click.FloatRange(0.2, 60), default=SETTLE_S, show_default=True,
                     metavar="SECONDS", help="With a broker: how long to read before listing (longer while the "
                     "slowest node's two sample intervals have not passed).")(f)
    f = click.option("--cluster", default=None, metavar="NAME",
                     help="With a broker: one cluster (default: --config's, else every cluster).")(f)
    f = click.option("--config", "config_path", default=None, metavar="PATH",
                     type=click.Path(dir_okay=False, path_type=Path),
                     help="A daemon or fleet TOML config: its [mqtt] broker and credentials, its cluster, and "
                          "its [fleet] rules (stale_after_intervals, rack budgets).")(f)
    return broker_options(f, broker_help="List what every node and the fleet rules say is active there, instead "
                                         "of a database (default: --config's [mqtt] broker, else none).",
                          check=_check_group_broker)


class _Share:
    """Where to share: broker settings (None: do not share) and the config's cluster."""

    def __init__(self, broker: BrokerFlags, config_path: Path | None, cluster: str | None):
        from nvmon.wire.contract import valid_name

        m, cfg_cluster = None, None
        if config_path is not None:
            cfg = load_fleet_config(config_path)
            m, cfg_cluster = cfg.mqtt, cfg.node.get("cluster") or cfg.fleet.cluster
        if cluster is not None and not valid_name(cluster):
            raise NvmonUsageError(f"--cluster {cluster[:80]!r}: {NAME_HINT}")
        self.cluster = cluster or (cfg_cluster if valid_name(cfg_cluster) else None)
        url = broker.url(m, default=None)
        self.settings = broker.settings(m, url=url) if url else None  # the table's keepalive_s is for daemons
        if self.settings is not None:
            check_broker_files(self.settings)

    @classmethod
    def of(cls, ctx: click.Context, broker: BrokerFlags, config_path: Path | None, cluster: str | None) -> _Share:
        """As given to the subcommand, else to the group (`nvmon alerts --broker URL ack FP`): a
        flag typed after the subcommand wins, then one typed before it, then $NVMON_BROKER."""
        typed, group_config, group_cluster = ctx.meta.get(_GROUP_FLAGS, ({}, None, None))
        mine = {f: v for f, v in broker.given.items() if ctx.get_parameter_source(f"_b_{f}") is _TYPED}
        return cls(BrokerFlags(**{**broker.given, **typed, **mine}), config_path or group_config,
                   cluster or group_cluster)

    def local(self, db_path: str) -> bool:
        """Write the local database? Always without a broker (a missing one is an error then)."""
        return self.settings is None or Path(db_path).exists()

    def run(self, coro):
        import asyncio

        from nvmon.wire.contract import WireError
        from nvmon.wire.mqtt import describe_error

        try:
            return asyncio.run(coro)
        except WireError as e:
            raise NvmonError(str(e)) from None
        except Exception as e:  # the broker: refused, unreachable, TLS — one line
            raise NvmonError(f"broker {self.settings.url}: {describe_error(e)}") from None

    def report(self, cluster: str, cs) -> None:
        click.echo(f"shared on {self.settings.url} (cluster {cluster}): {len(cs.silences)} silence(s), "
                   f"{len(cs.acks)} ack(s) in force")


@click.group("alerts", invoke_without_command=True)
@_db_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of alert objects (docs/alerts.md).")
@click.option("--all", "show_all", is_flag=True, help="Every kept episode (7 days), not only the last 24 h.")
@click.option("--node", "node_glob", metavar="GLOB", help="Only alerts of these nodes, e.g. gpu-07 or 'gpu-0*' "
              "(a rack alert: its rack's name).")
@click.option("--code", "code_glob", metavar="GLOB", help="Only these codes, e.g. 'nvlink.*' or node.offline.")
@click.option("--severity", type=click.Choice(SEVERITY_CHOICES), help="Only this severity or worse.")
@_group_broker_options
@click.pass_context
def alerts_command(ctx: click.Context, db_path: str | None, as_json: bool, show_all: bool, node_glob: str | None,
                   code_glob: str | None, severity: str | None, broker: BrokerFlags, config_path: Path | None,
                   cluster: str | None, settle_s: float) -> None:
    """This node's alerts, or the fleet's with --db fleet.db: active, and resolved in the last 24 h.
    With --broker (or $NVMON_BROKER, or --config's [mqtt] broker): every node's active alerts and
    the fleet rules' (node.offline, node.stale, rack.power, ...), read once from the broker.

    Order: active first, by severity (critical, warning, info), firing before pending, newest
    start first; then resolved ones, the latest to end first. STATE marks an active alert by its
    severity (✗ critical, ⚠ warning, ℹ info, as the TUI); WHERE names the node (and GPU, link,
    port) or the rack; SINCE is how long ago it fired (resolved: ended). An age in a node.offline
    or node.stale summary is brought up to now. On a terminal long lines are cut to 80 columns;
    piped, nothing is cut. docs/alerts.md; with --broker, docs/fleet.md.
    """
    typed = {f: v for f, v in broker.given.items() if ctx.get_parameter_source(f"_b_{f}") is _TYPED}
    if ctx.invoked_subcommand is not None:  # its own flags win (_Share.of)
        ctx.meta[_GROUP_FLAGS] = (typed, config_path, cluster)
        return
    url_param = next(p for p in ctx.command.params if p.name == "_b_url")
    check_broker(ctx, url_param, broker.broker)  # from $NVMON_BROKER: not checked while parsing (_check_group_broker)
    db_typed = ctx.get_parameter_source("db_path") is _TYPED
    if db_typed and "url" in typed:
        raise NvmonUsageError("--db lists a database, --broker the fleet on a broker: give one")
    share = _Share(broker, config_path, cluster) if not db_typed else None
    if share is not None and share.settings is not None:
        if show_all:
            raise NvmonUsageError("--all: the broker holds only active alerts (the resolved ones are in the "
                                  "databases: --db)")
        from nvmon.cli.alerts_broker import list_from_broker

        list_from_broker(share.settings, cluster=share.cluster, settle_s=settle_s, config_path=config_path,
                         node=node_glob, code=code_glob, severity=severity, as_json=as_json)
        return
    from nvmon.store import alerts as db

    now = time.time()
    db_path = str(resolve_db(db_path or DEFAULT_DB, DEFAULT_DB, create=False))

    from nvmon.alerts.persist import applied_shared_silences

    def read(conn):
        saved = ({(fp, s / 1000): u / 1000 for fp, s, u in conn.execute(
            "SELECT fingerprint, starts_ms, updated_ms FROM alerts WHERE status != 'resolved'")}
            if db.has_alert_tables(conn) else {})
        # The database's own silences, and the shared ones (MQTT) its daemon last applied.
        silences = db.silences(conn, now) + applied_shared_silences(conn, now)
        return db.load(conn, since=None if show_all else now - RECENT_S), silences, saved

    records, silences, saved = _read(db_path, read)
    records = ordered(select(records, node=node_glob, code=code_glob, severity=severity))
    silenced = {r.fingerprint for r in records if any(s.matches(r, now) for s in silences)}
    if as_json:
        out = [{**r.to_dict(), "acked_at": iso(r.acked_at), "silenced": r.fingerprint in silenced} for r in records]
        click.echo(json.dumps(out, indent=2))
        return
    stdout_console().print(render_alerts(records, silenced, now, saved=saved, full=not on_terminal()),
                           soft_wrap=True)  # lines are cut to fit a terminal already; piped, whole


def _check_by(by: str | None) -> str:
    who = by or _who()
    if not NAME_RE.match(who):
        raise NvmonUsageError("--by: 1-64 characters from A-Z a-z 0-9 . _ -")
    return who


@alerts_command.command("ack",
                        short_help="Acknowledge an active alert: not paged again, still active.")
@click.argument("fingerprint")
@_db_option
@click.option("--by", default=None, help="Who acks (default: the user running this).")
@_share_options
@click.pass_context
def ack_command(ctx: click.Context, fingerprint: str, db_path: str | None, by: str | None, broker: BrokerFlags,
                config_path: Path | None, cluster: str | None) -> None:
    """Acknowledge an active alert: it stays active but is not paged again."""
    from nvmon.store import alerts as db

    if not re.fullmatch(r"[0-9a-fA-F]{4,64}", fingerprint):
        raise NvmonUsageError(f"fingerprint {fingerprint[:80]!r}: give its hex digits (at least 4), see `nvmon alerts`")
    fingerprint = fingerprint.lower()
    now, who = time.time(), _check_by(by)
    share = _Share.of(ctx, broker, config_path, cluster)

    def do(conn):
        found = db.find_active(conn, fingerprint)
        if len(found) == 1:
            db.ack(conn, found[0], now, who)
        return found

    path = _db(ctx, db_path)
    found = _write(path, do) if share.local(path) else []
    if len(found) > 1:
        raise NvmonError(f"{len(found)} active alerts start with {fingerprint}; give more digits")
    if found:
        r = found[0]
        click.echo(f"acked {r.fingerprint}: {r.code} on {where(r)}")
        target = (share.cluster or r.cluster, r.fingerprint, r.starts_at)
    elif share.settings is None:
        raise NvmonError(f"no active alert with fingerprint {fingerprint}")
    else:
        target = _find_on_broker(share, fingerprint)
    if share.settings is not None:
        from nvmon.alerts.shared import shared_ack, update_shared

        c, fp, starts = target
        share.report(c, share.run(update_shared(share.settings, c, shared_ack(fp, starts, now, who))))


def _find_on_broker(share: _Share, fingerprint: str) -> tuple[str, str, float]:
    from nvmon.alerts.shared import find_alerts

    found = share.run(find_alerts(share.settings, fingerprint, cluster=share.cluster))
    where = f"locally or in the retained alert sets on {share.settings.url}"
    if not found:
        raise NvmonError(f"no active alert with fingerprint {fingerprint} {where}")
    if len({a.fingerprint for _, _, a in found}) > 1:
        raise NvmonError(f"{len(found)} active alerts start with {fingerprint}; give more digits")
    c, node, a = found[0]
    if a.starts_at is None:
        raise NvmonError(f"node {node} does not publish episode starts (an older nvmon): ack it there")
    click.echo(f"acked {a.fingerprint}: {a.code} on {node} (from its retained alerts)")
    return c, a.fingerprint, a.starts_at


@alerts_command.command("silence",
                        short_help="Stop paging matching alerts for a while (they still show).")
@click.option("--match", "matches", multiple=True, metavar="KEY=GLOB",
              help="Alert field or label to match, e.g. node=gpu-07, code='nvlink.*', gpu=3, label.team=ml "
                   "(repeatable; all must match; docs/alerts.md).")
@click.option("--for", "duration", required=True, metavar="DURATION", help="How long, e.g. 30m, 2h, 1d.")
@click.option("--comment", default=None, help="Why (shown in `nvmon alerts silences`).")
@click.option("--all-nodes", is_flag=True, help="Allow a shared silence that covers every node (no node=, or "
              "node='*'); daemons and nvmon fleet refuse one without it.")
@_db_option
@click.option("--by", default=None, help="Who silences (default: the user running this).")
@_share_options
@click.pass_context
def silence_command(ctx: click.Context, matches: tuple[str, ...], duration: str, comment: str | None,
                    all_nodes: bool, db_path: str | None, by: str | None, broker: BrokerFlags,
                    config_path: Path | None, cluster: str | None) -> None:
    """Stop paging alerts that match, for a while (they still show, and are still published).
    At most [alerts] max_silence_h of --config (default 7 days)."""
    from nvmon.alerts.settings import DEFAULT_MAX_SILENCE_H
    from nvmon.store import alerts as db

    path = _db(ctx, db_path)
    try:
        seconds = parse_duration(duration)
        matchers = parse_matchers(matches, _known_labels(path, config_path))
    except ValueError as e:
        raise NvmonUsageError(str(e)) from None
    max_h = load_fleet_config(config_path).alerts.max_silence_h if config_path is not None else DEFAULT_MAX_SILENCE_H
    if seconds > max_h * 3600:
        raise NvmonUsageError(f"--for {duration}: longer than the maximum silence, {max_h:g} h "
                              "([alerts] max_silence_h)")
    if comment is not None and (len(comment) > 512 or not comment.isprintable()):
        raise NvmonUsageError("--comment: printable text, up to 512 characters")
    now, who = time.time(), _check_by(by)
    share = _Share.of(ctx, broker, config_path, cluster)
    from nvmon.wire.contract import valid_name

    c = share.cluster or (matchers["cluster"] if valid_name(matchers.get("cluster")) else None)  # not a glob
    if share.settings is not None and c is None:
        raise NvmonUsageError("--cluster NAME: which cluster's shared set (or a --config with [node] cluster)")
    what = " ".join(f"{k}={v}" for k, v in matchers.items())
    from nvmon.alerts.shared import covers_every_node

    every = covers_every_node(matchers)
    if share.settings is not None and every and not all_nodes:
        raise NvmonUsageError(f"{what}: a shared silence for every node needs --all-nodes "
                              "(or narrow it with --match node=GLOB)")
    if share.local(path):
        sid = _write(path, lambda conn: db.add_silence(conn, matchers, now, now + seconds, who, comment))
        click.echo(f"silence {sid} until {iso(now + seconds)}: {what}")
    if share.settings is not None:
        from nvmon.alerts.shared import shared_silence, update_shared

        shared_id, change = shared_silence(matchers, now, now + seconds, who, comment, all_nodes=every)
        cs = share.run(update_shared(share.settings, c, change))
        click.echo(f"shared silence {shared_id} until {iso(now + seconds)}: {what}")
        share.report(c, cs)


@alerts_command.command("silences",
                        short_help="List the silences in force, local and shared.")
@_db_option
@_share_options(listing=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list (keys above).")
@click.pass_context
def silences_command(ctx: click.Context, db_path: str | None, broker: BrokerFlags, config_path: Path | None,
                     cluster: str | None, as_json: bool) -> None:
    """List the silences in force: this database's, and with --broker the shared ones of --cluster
    (default: of every cluster on the broker); without --broker, the shared ones the database's
    daemon (or nvmon fleet) applies, as it last saved them.

    \b
    --json: a list of objects, oldest first, local ones before shared ones:
      id             the local silence's number, or "CLUSTER/ID" for a shared
                     one (for unsilence)
      shared         true for a silence from the broker's shared set
      matchers       {KEY: GLOB}, as given to --match
      starts_at, ends_at   ISO 8601 UTC
      created_by, comment  who set it and why (null when not given)
      applied_until  until when evaluators apply it: ends_at, or a shared one
                     cut to the maximum ([alerts] max_silence_h of --config,
                     else 7 days); null: they refuse it (it covers every node
                     and was not set with --all-nodes)
    """
    from nvmon.render import plain
    from nvmon.store import alerts as db

    now = time.time()
    share = _Share.of(ctx, broker, config_path, cluster)
    path = _db(ctx, db_path)
    if share.settings is None:  # the shared ones as this database's evaluator applies them (capped, vetted)
        from nvmon.alerts.persist import applied_shared_silences

        found: list[Silence] = _read(path, lambda conn: db.silences(conn, now) + applied_shared_silences(conn, now))
    else:
        found = _read(path, lambda conn: db.silences(conn, now)) if share.local(path) else []
    until: dict[int | str, float | None] = {s.id: s.ends_at for s in found}  # as evaluators apply it
    if share.settings is not None:
        from nvmon.alerts.settings import DEFAULT_MAX_SILENCE_H
        from nvmon.alerts.shared import engine_controls, judged, read_every_shared, read_shared

        max_h = (load_fleet_config(config_path).alerts.max_silence_h if config_path is not None
                 else DEFAULT_MAX_SILENCE_H)
        # Without --cluster every cluster's set, as `ack --broker` searches every cluster.
        sets = ([share.run(read_shared(share.settings, share.cluster))] if share.cluster is not None
                else share.run(read_every_shared(share.settings)))
        for cs in sets:
            found += engine_controls(cs, now)[1]
            until.update((f"{cs.cluster}/{s.id}", judged(s, max_h * 3600)) for s in cs.silences)
    if as_json:
        click.echo(json.dumps([{"id": s.id, "shared": isinstance(s.id, str), "matchers": dict(s.matchers),
                                "starts_at": iso(s.starts_at), "ends_at": iso(s.ends_at),
                                "created_by": s.created_by, "comment": s.comment,
                                "applied_until": iso(until.get(s.id))} for s in found], indent=2))
        return
    if not found:
        click.echo("No silences.")
    for s in found:
        what = " ".join(f"{k}={v}" for k, v in s.matchers.items())
        u = until.get(s.id)
        note = ("  REFUSED by evaluators: covers every node, not set with --all-nodes" if u is None
                else f"  (applied only until {iso(u)}: the maximum)" if u < s.ends_at else "")
        click.echo(plain(f"{s.id:>4}  until {iso(s.ends_at)}  {what}  by {s.created_by or '?'}"
                         + (f": {s.comment}" if s.comment else "") + note))


@alerts_command.command("unsilence",
                        short_help="End a silence now: a local one by number, a shared one by id.")
@click.argument("silence_id")
@_db_option
@_share_options
@click.pass_context
def unsilence_command(ctx: click.Context, silence_id: str, db_path: str | None, broker: BrokerFlags,
                      config_path: Path | None, cluster: str | None) -> None:
    """End a silence now: a local one by its number, a shared one (--broker) by its id."""
    from nvmon.store import alerts as db

    now = time.time()
    share = _Share.of(ctx, broker, config_path, cluster)
    if share.settings is None:
        if not silence_id.isdigit() or int(silence_id) < 1:
            raise NvmonUsageError(f"silence {silence_id[:40]!r}: give its number (see `nvmon alerts silences`)")
        if not _write(_db(ctx, db_path), lambda conn: db.end_silence(conn, int(silence_id), now)):
            raise NvmonError(f"no silence {silence_id} in force")
        click.echo(f"silence {silence_id} ended")
        return
    from nvmon.alerts.shared import update_shared

    sid = silence_id.rsplit("/", 1)[-1]  # `silences` shows shared ones as CLUSTER/ID
    c = share.cluster or (silence_id.split("/", 1)[0] if "/" in silence_id else None)
    if c is None:
        raise NvmonUsageError("--cluster NAME: which cluster's shared set (or give CLUSTER/ID)")
    gone: list[bool] = []

    def change(cs):
        gone.append(cs.silence(sid) is not None)
        return cs.without_silence(sid)

    cs = share.run(update_shared(share.settings, c, change))
    if not gone or not gone[0]:
        raise NvmonError(f"no shared silence {sid} in cluster {c}")
    click.echo(f"shared silence {sid} ended")
    share.report(c, cs)
