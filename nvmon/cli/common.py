"""What the `nvmon` commands share: the one error class and the option checks.

Every command reports bad input the same way: one line, `nvmon: <message>` on stderr, and a
non-zero exit status, never a traceback (`main()` adds NVMON_DEBUG=1 for one).
"""

from __future__ import annotations

import click


class NvmonError(click.ClickException):
    """A user-facing one-line error: `nvmon: <message>`, exit status 1 unless a subclass says otherwise."""

    def show(self, file=None) -> None:
        click.echo(f"nvmon: {self.format_message()}", err=True)


def check_interval(ctx, param, value: float) -> float:
    if not 0.05 <= value <= 300:
        raise click.BadParameter("must be between 0.05 and 300 seconds")
    return value
