"""Every `nvmon ... --help` fits the 80-column terminal nvmon promises (80×24): the commands are found
by walking the click tree from the root group, so a new command or subcommand is held to it too.
Prose paragraphs are rewrapped by click; the verbatim ones (`\\b`: examples, key lists, exit status)
and the history metric table must be written to fit."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from nvmon.cli import cli

WIDTH = 80


def walk(command: click.Command, path: tuple[str, ...] = ()):
    yield path, command
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            yield from walk(command.commands[name], (*path, name))


PATHS = [path for path, _ in walk(cli)]


def test_the_walk_reaches_every_command_and_subcommand():
    assert {p[0] for p in PATHS if p} == set(cli.commands)
    assert {("alerts", "ack"), ("alerts", "silences"), ("hooks", "test"), ("config", "check")} <= set(PATHS)


# terminal_width: click's own width setting; COLUMNS: what a real terminal gives it (click then
# wraps 2 columns short of the terminal)
@pytest.mark.parametrize("how", ["terminal_width", "COLUMNS"])
@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(("nvmon", *p)))
def test_help_fits_80_columns(path, how):
    if how == "terminal_width":
        r = CliRunner().invoke(cli, [*path, "--help"], prog_name="nvmon", terminal_width=WIDTH,
                               env={"COLUMNS": "200"})
    else:
        r = CliRunner().invoke(cli, [*path, "--help"], prog_name="nvmon", env={"COLUMNS": str(WIDTH), "LINES": "24"})
    name = " ".join(("nvmon", *path))
    assert r.exit_code == 0 and r.exception is None, (name, r.output)
    assert r.output.startswith(f"Usage: {name} "), (name, r.output[:200])
    long = [f"{len(line)}: {line}" for line in r.output.splitlines() if len(line) > WIDTH]
    assert not long, f"`{name} --help` has lines over {WIDTH} columns:\n" + "\n".join(long)



GROUPS = {path: command for path, command in walk(cli) if isinstance(command, click.Group)}


@pytest.mark.parametrize("path", GROUPS, ids=lambda p: " ".join(("nvmon", *p)))
def test_a_group_lists_each_subcommand_on_one_whole_line(path):
    """click cuts a subcommand's first docstring sentence with "..." to fit the line: such a command
    gets a short_help of its own (nvmon --help's are in nvmon.cli.root.SHORT_HELP)."""
    r = CliRunner().invoke(cli, [*path, "--help"], prog_name="nvmon", env={"COLUMNS": str(WIDTH), "LINES": "24"})
    assert r.exit_code == 0, r.output
    listing = r.output.split("\nCommands:\n", 1)[1].splitlines()
    for name in GROUPS[path].commands:
        line = next((ln for ln in listing if ln.split()[:1] == [name]), None)
        assert line is not None, (path, name, r.output)
        assert not line.rstrip().endswith(("...", "…")), \
            f"`{' '.join(('nvmon', *path))} --help` cuts {line!r}: give {name!r} a short_help"
