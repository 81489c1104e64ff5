"""What the `nvmon` commands share: the one error class, the name and interval checks, defaults.

Every command reports bad input the same way: one line, `nvmon: <message>` on stderr, and a
non-zero exit status, never a traceback (`main()` adds NVMON_DEBUG=1 for one).
"""

from __future__ import annotations

import re

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
