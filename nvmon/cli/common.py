"""What the `nvmon` commands share: the one error class, the name and interval checks, defaults,
the log format, the fleet/daemon config reader and the broker settings built from its `[mqtt]`.

Every command reports bad input the same way: one line, `nvmon: <message>` on stderr, and a
non-zero exit status, never a traceback (`main()` adds NVMON_DEBUG=1 for one).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import click

from nvmon.wire.contract import valid_name

DEFAULT_DB = "/var/lib/nvmon/nvmon.db"  # the daemon's history and alert state
NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # node, label and user names
NAME_HINT = "use 1-64 characters from A-Z a-z 0-9 . _ -"
# A duration: `90s`, `10m`, `2h`, `3d`, `1w` (`nvmon history --since`, `nvmon alerts silence --for`).
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)\s*$", re.IGNORECASE)
UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


class NvmonError(click.ClickException):
    """A user-facing one-line error: `nvmon: <message>`, exit status 1 unless a subclass says otherwise."""

    def show(self, file=None) -> None:
        click.echo(f"nvmon: {self.format_message()}", err=True)


def check_interval(ctx, param, value: float) -> float:
    if not 0.05 <= value <= 300:
        raise click.BadParameter("must be between 0.05 and 300 seconds")
    return value


def check_cluster(ctx, param, value: str | None) -> str | None:
    """A cluster name (a topic level: `nvmon.wire.contract.valid_name`), or None when not given."""
    if value is not None and not valid_name(value):
        raise click.BadParameter(NAME_HINT)
    return value


def setup_logging(level: str) -> None:
    """The long-running commands' log lines: under systemd (JOURNAL_STREAM set) the journal adds the
    time, so lines carry none."""
    import logging

    journald = bool(os.environ.get("JOURNAL_STREAM"))
    logging.basicConfig(
        level=level.upper(),
        format=("%(name)s: %(levelname)s: %(message)s" if journald
                else "%(asctime)s %(name)s %(levelname)s: %(message)s"),
    )


def load_fleet_config(path: Path | None):
    """The one reader of `--config` for `nvmon fleet` and `nvmon alerts` (a fleet file, or a daemon's:
    `nvmon.fleet.service.load_fleet_config` accepts both), its error a one-line NvmonError."""
    from nvmon.fleet.service import FleetConfigError, load_fleet_config as load

    try:
        return load(path)
    except FleetConfigError as e:
        raise NvmonError(str(e)) from None


def mqtt_settings(url: str, section=None, *, keepalive: bool = False):
    """Broker settings for `url` with an `[mqtt]` table's user, password and TLS files (None: the URL
    alone) and, with `keepalive`, its keepalive_s; a bad value is a one-line NvmonError."""
    from nvmon.wire.mqtt import MqttSettings

    def s(p):
        return None if p is None else str(p)

    m = section
    extra = {"keepalive_s": m.keepalive_s} if keepalive and m is not None else {}
    try:
        return MqttSettings(url=url, username=m.username if m else None,
                            password_file=s(m.password_file) if m else None,
                            ca_file=s(m.ca_file) if m else None, cert_file=s(m.cert_file) if m else None,
                            key_file=s(m.key_file) if m else None, **extra)
    except ValueError as e:
        raise NvmonError(str(e)) from None
