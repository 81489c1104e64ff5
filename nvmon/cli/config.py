"""`nvmon config check`: validate a config file and print it as nvmon reads it.

Which file: `--config FILE`, else /etc/nvmon/nvmon.toml (the daemon's), or /etc/nvmon/fleet.toml
with `--kind fleet`. Which reader: `--kind daemon|fleet`, else by the file's tables: a `[fleet]`
table makes it a fleet file (`nvmon fleet`), anything else a daemon file (`nvmon daemon`). The
same readers the two commands use (nvmon.daemon.config, nvmon.fleet.service) judge it, so a file
this command accepts is one they start with.

The output is the effective configuration, every default filled in, as TOML (or `--json`), with
secrets shown as `***`: header values, URLs' credentials, paths and queries (webhook URLs carry
their tokens there), and any password / token / secret value (the config keeps those in files:
their paths are shown). A bad file is one line on stderr naming the file and key, exit 2. The
files a valid config names (broker password and TLS files, hook secrets) are read as the daemon
reads them at start; a problem there is a warning line on stderr (exit 0: the user running the
check may not be the service's user).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from nvmon.cli.common import NvmonUsageError

MASK = "***"
SECRET_KEY = re.compile(r"(password|passwd|secret|token|api_?key|routing_key|auth)", re.I)
BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")  # TOML keys that need no quotes


def mask_url(url: str) -> str:
    """`https://hooks.slack.com/…`, `https://***@host:8443/…`: scheme, host and port only when the
    URL carries anything else (a user or password, a path or a query may hold a token)."""
    try:
        u = urlsplit(url)
        host, port = u.hostname or "?", u.port
    except ValueError:
        return MASK
    if not (u.username or u.password or u.path not in ("", "/") or u.query or u.fragment):
        return url
    host = f"[{host}]" if ":" in host else host
    return (f"{u.scheme}://{MASK + '@' if u.username or u.password else ''}{host}"
            f"{f':{port}' if port else ''}{'/…' if u.path not in ('', '/') or u.query or u.fragment else ''}")


def masked(value: Any, key: str = "") -> Any:
    """`value` (a JSON-able config dump) with its secrets replaced by `***` (see the module doc)."""
    if isinstance(value, dict):
        if key == "headers":
            return {k: MASK for k in value}
        return {k: masked(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v, key) for v in value]
    if isinstance(value, str):
        if SECRET_KEY.search(key) and not key.endswith(("_file", "_env")) and value:
            return MASK
        return mask_url(value) if "://" in value else value
    return value


# ---- TOML out (tomllib reads only; the shapes here are few: tables, arrays of tables, values) ----

def _key(k: str) -> str:
    return k if BARE_KEY.match(k) else json.dumps(k, ensure_ascii=False)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return json.dumps(v, ensure_ascii=False)  # strings, numbers: JSON's forms are TOML's


def _table_of_tables(v: Any) -> bool:
    return isinstance(v, dict) and bool(v) and all(isinstance(x, dict) for x in v.values())


def to_toml(data: dict[str, Any], prefix: str = "") -> list[str]:
    """Lines of TOML for `data`: plain values first, then sub-tables, then arrays of tables. An
    unset value (None) is a comment, so the file still reads back as TOML."""
    lines: list[str] = []
    subs: list[tuple[str, dict]] = []
    arrays: list[tuple[str, list]] = []
    for k, v in data.items():
        if _table_of_tables(v) or (isinstance(v, dict) and not v and k in ("racks", "rules")):
            subs += [(f"{prefix}{_key(k)}.{_key(name)}", t) for name, t in v.items()]
        elif isinstance(v, dict) and k not in ("labels", "headers"):
            subs.append((f"{prefix}{_key(k)}", v))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            arrays.append((f"{prefix}{_key(k)}", v))
        elif v is None:
            lines.append(f"# {_key(k)} = (not set)")
        elif v == [] and not prefix and k == "hooks":
            lines.append("# no [[hooks]]: nobody is paged")
        else:
            lines.append(f"{_key(k)} = {_value(v)}")
    for name, table in subs:
        lines += ["", f"[{name}]", *to_toml(table, f"{name}.")]
    for name, items in arrays:
        for item in items:
            lines += ["", f"[[{name}]]", *to_toml(item, f"{name}.")]
    return lines


# ---- the command ---------------------------------------------------------------------------------

def effective(kind: str, path: Path | None) -> tuple[str | None, Any, dict[str, Any], list[str]]:
    """(the file read or None for built-in defaults, the config, the effective config as JSON-able
    data, notes); a bad file raises NvmonUsageError (one line, from the reader the command uses)."""
    notes: list[str] = []
    if kind == "daemon":
        from nvmon.daemon.config import DEFAULT_CONFIG, ConfigError, load_config
        from nvmon.sim.scenario import SimSpecError, parse_scenario

        source = path or (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
        try:
            cfg = load_config(path)
            if cfg.sampling.sim:
                parse_scenario(cfg.sampling.sim)
        except ConfigError as e:
            raise NvmonUsageError(str(e)) from None
        except SimSpecError as e:
            raise NvmonUsageError(f"{source}: sampling.sim: {e}") from None
        if cfg.node.name is None:
            notes.append(f"node name in use: {cfg.node_name} (the short host name)")
        return (str(source) if source else None), cfg, cfg.model_dump(mode="json"), notes
    from nvmon.fleet.service import DEFAULT_CONFIG as FLEET_CONFIG, NODE_TABLES, FleetConfigError, load_fleet_config

    source = path or (FLEET_CONFIG if FLEET_CONFIG.exists() else None)
    try:
        cfg = load_fleet_config(path)
    except FleetConfigError as e:
        raise NvmonUsageError(str(e)) from None
    data = cfg.model_dump(mode="json")
    if data["mqtt"]["broker"] is None:
        from nvmon.cli.common import DEFAULT_BROKER

        data["mqtt"]["broker"] = DEFAULT_BROKER
        notes.append(f"[mqtt] broker not set: nvmon fleet's default, {DEFAULT_BROKER}")
    notes.append("of [alerts], nvmon fleet uses keep_resolved_d and max_silence_h")
    unused = [t for t in NODE_TABLES if data.pop(t, None)]
    if unused:
        notes.append(f"a node's tables, not used by nvmon fleet: {', '.join(f'[{t}]' for t in unused)}")
    return (str(source) if source else None), cfg, data, notes


def file_problems(cfg) -> list[str]:
    """What the command would trip over in the files the config names, one line each, no secret:
    the broker's password, CA, certificate and key files (checked as the daemon and nvmon fleet
    check them at start) and each hook's secret, headers and TLS files. Read as the user running
    this, who may not be the service's user: warnings, not a verdict on the config."""
    from nvmon.alerts.hook_dispatch import HookDispatcher
    from nvmon.cli.common import NvmonError, check_broker_files, mqtt_settings

    out = []
    if cfg.mqtt.broker:
        try:
            check_broker_files(mqtt_settings(cfg.mqtt.broker, cfg.mqtt))
        except NvmonError as e:
            out.append(e.format_message())
    return out + HookDispatcher(cfg.hooks).check()


def detect_kind(path: Path) -> str:
    """'fleet' for a file with a [fleet] table, else 'daemon'; an unreadable file is a one-line error."""
    from nvmon.tomlfile import TomlFileError, read_toml

    try:
        return "fleet" if "fleet" in read_toml(path) else "daemon"
    except TomlFileError as e:
        raise NvmonUsageError(str(e)) from None


@click.group("config")
def config_group() -> None:
    """The daemon's and nvmon fleet's config files."""


@config_group.command("check", short_help="Validate a config file; print it with defaults filled in.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", help="The file to check (default /etc/nvmon/nvmon.toml; with --kind fleet, "
                                   "/etc/nvmon/fleet.toml; built-in defaults where it does not exist).")
@click.option("--kind", type=click.Choice(["auto", "daemon", "fleet"]), default="auto", show_default=True,
              help="Whose file: auto = fleet if it has a [fleet] table, else daemon.")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON: kind, file (null: built-in defaults), notes, warnings, config.")
def check_command(config_path: Path | None, kind: str, as_json: bool) -> None:
    """Validate a config file and print the effective configuration: every default filled in,
    secrets as ***. Exit 0 when nvmon daemon (or nvmon fleet) would accept it; else one line
    naming the file and key, exit 2. Files it names that this user cannot use (the broker's
    password or TLS files, hook secrets) are warnings on stderr: the service may run as another.

    \b
    nvmon config check --config systemd/nvmon.toml
    nvmon config check --config systemd/fleet.toml --json
    """
    if kind == "auto":
        kind = detect_kind(config_path) if config_path is not None else "daemon"
    source, cfg, data, notes = effective(kind, config_path)
    data = masked(data)
    warnings = file_problems(cfg)
    for w in warnings:
        click.echo(f"nvmon config check: warning: {w}", err=True)
    if as_json:
        click.echo(json.dumps({"kind": kind, "file": source, "notes": notes, "warnings": warnings, "config": data},
                              indent=2))
        return
    reader = "nvmon daemon" if kind == "daemon" else "nvmon fleet"
    head = [f"# {source}: valid for {reader}" if source else f"# no file: {reader}'s built-in defaults",
            "# the effective configuration, every default filled in; secrets shown as ***"]
    click.echo("\n".join(head + [f"# {n}" for n in notes] + to_toml(data)))
