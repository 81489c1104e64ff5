"""One set of broker flags for every command that talks to a broker (issue 15): the same names in
each command's --help, $NVMON_BROKER honoured by each (a bad URL there is the same one-line usage
error, exit 2, from every one), one default, one precedence (flag, environment, config, default),
and docs/cli.md's "Common flags" table lists exactly those flags. Through the real CLI: click's
command tree and `python -m nvmon` in a subprocess."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import click
from click.testing import CliRunner
import pytest

from nvmon.cli.common import BROKER_FLAGS, DEFAULT_BROKER
from nvmon.cli.root import cli

REPO = Path(__file__).resolve().parent.parent
FLAGS = [flag for flag, _, _ in BROKER_FLAGS]
# Each command that talks to a broker, with the least it needs to get as far as reading its flags.
BROKER_COMMANDS = {
    "daemon": [],
    "fleet": [],
    "tui": [],
    "nodes": [],
    "forget": ["gpu-01", "--cluster", "c"],
    "sim-fleet": [],
    "alerts": [],  # the listing: --broker reads every node's alerts instead of a database
    "alerts ack": ["abcd"],
    "alerts silence": ["--match", "node=gpu-01", "--for", "1h"],
    "alerts silences": [],
    "alerts unsilence": ["1"],
}


def walk(group: click.Group, prefix: str = ""):
    for name, command in sorted(group.commands.items()):
        path = f"{prefix}{name}"
        yield path, command
        if isinstance(command, click.Group):
            yield from walk(command, f"{path} ")


def options(command: click.Command) -> dict[str, click.Option]:
    return {o: p for p in command.params if isinstance(p, click.Option) for o in p.opts}


def nvmon(tmp: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 30):
    base = {k: v for k, v in os.environ.items() if k not in ("NVMON_BROKER", "INVOCATION_ID", "JOURNAL_STREAM")}
    base.update(HOME=str(tmp / "home"), XDG_STATE_HOME=str(tmp / "state"), **(env or {}))
    return subprocess.run([sys.executable, "-m", "nvmon", *args], capture_output=True, text=True, timeout=timeout,
                          env=base, stdin=subprocess.DEVNULL, cwd=tmp)


def closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_command_that_takes_a_broker_takes_all_the_broker_flags_the_same_way():
    found = {path for path, command in walk(cli) if "--broker" in options(command)}
    assert found == set(BROKER_COMMANDS)
    reference = None
    for path, command in walk(cli):
        if path not in found:
            continue
        opts = options(command)
        assert set(FLAGS) <= set(opts), (path, set(FLAGS) - set(opts))
        shape = {f: (opts[f].opts, opts[f].is_flag, opts[f].metavar, opts[f].envvar, opts[f].default,
                     type(opts[f].type).__name__, opts[f].hidden) for f in FLAGS}
        shape |= {f: shape[f] + (opts[f].help,) for f in FLAGS if f != "--broker"}  # --broker adds its default
        assert shape == (reference := reference or shape), path
        assert opts["--broker"].envvar == "NVMON_BROKER"
        r = CliRunner().invoke(cli, [*path.split(), "--help"])
        assert r.exit_code == 0, r.output
        listed = set(re.findall(r"^\s+(--[a-z-]+)", r.output, re.M))
        assert set(FLAGS) <= listed, (path, set(FLAGS) - listed)
        assert "NVMON_BROKER" in r.output, path


def test_the_docs_table_lists_exactly_the_common_flags():
    text = (REPO / "docs" / "cli.md").read_text()
    section = text.split("\n## Common flags\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = [re.match(r"\| `(--[a-z-]+)", row).group(1) for row in rows]
    assert documented == FLAGS
    for path in BROKER_COMMANDS:  # and it names every command that takes them
        assert f"`nvmon {path}`" in section or f"`{path.split()[-1]}`" in section, path
    assert f"`{DEFAULT_BROKER}`" in section
    assert "docs/cli.md" in (REPO / "README.md").read_text()


@pytest.mark.parametrize("path", sorted(BROKER_COMMANDS))
def test_a_bad_url_in_NVMON_BROKER_is_the_same_one_line_usage_error_everywhere(tmp_path, path):
    r = nvmon(tmp_path, *path.split(), *BROKER_COMMANDS[path], env={"NVMON_BROKER": "http://u:secret@host"})
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.splitlines() == [f"nvmon {path}: $NVMON_BROKER: broker URL 'http://***@host': "
                                     "no credentials in the URL; use username and password_file"]
    assert "secret" not in r.stderr and "Traceback" not in r.stderr and r.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, not even a state directory


def test_NVMON_BROKER_comes_after_the_flag_and_before_the_config(tmp_path):
    flag, env, conf = closed_port(), closed_port(), closed_port()
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(f'[mqtt]\nbroker = "mqtt://127.0.0.1:{conf}"\n')
    out = {}
    for name, args, extra in (("flag", ["--broker", f"mqtt://127.0.0.1:{flag}"], {"NVMON_BROKER": f"mqtt://127.0.0.1:{env}"}),
                              ("env", [], {"NVMON_BROKER": f"mqtt://127.0.0.1:{env}"}),
                              ("config", [], {})):
        r = nvmon(tmp_path, "nodes", "--config", str(cfg), "--settle", "0.2", *args, env=extra)
        assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        out[name] = r.stderr
    assert f":{flag}:" in out["flag"] and f":{env}:" in out["env"] and f":{conf}:" in out["config"], out


def test_sim_fleet_takes_NVMON_BROKER_and_duration_as_demo_does(tmp_path):
    port = closed_port()
    r = nvmon(tmp_path, "sim-fleet", "--nodes", "1", "--duration", "1", env={"NVMON_BROKER": f"mqtt://127.0.0.1:{port}"})
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"nvmon: sim-fleet published nothing to mqtt://127.0.0.1:{port}" in r.stderr
    r = nvmon(tmp_path, "sim-fleet", "--duration", "1", "--seconds", "1")
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "nvmon sim-fleet: --seconds is the old name of --duration: give one"]
    help_text = nvmon(tmp_path, "sim-fleet", "--help").stdout
    assert "--duration SECONDS" in help_text and "--seconds" not in help_text


@pytest.mark.parametrize("path", ["daemon", "fleet", "tui", "nodes", "sim-fleet", "alerts silences"])
def test_the_auth_flags_reach_every_command_before_it_connects(tmp_path, path):
    """fleet had no --username / --password-file; the daemon's flags override its config's [mqtt]."""
    missing = tmp_path / "nope.pw"
    cfg = tmp_path / "c.toml"
    cfg.write_text('[mqtt]\nbroker = "mqtt://127.0.0.1:1"\nusername = "from-config"\n')
    args = {"daemon": ["--config", str(cfg), "--sim", "hgx-h100", "--db", str(tmp_path / "n.db")],
            "fleet": ["--config", str(cfg), "--db", str(tmp_path / "f.db")],
            "alerts silences": ["--config", str(cfg), "--db", str(tmp_path / "a.db")]}.get(path, ["--broker", "mqtt://127.0.0.1:1"])
    r = nvmon(tmp_path, *path.split(), *args, "--username", "u", "--password-file", str(missing))
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stderr.splitlines() == [f"nvmon: password file {missing}: No such file or directory"]


def test_tui_reads_the_mqtt_table_of_a_config(tmp_path, monkeypatch):
    from nvmon.cli.tui import tui_command

    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    pw.chmod(0o600)
    cfg = tmp_path / "nvmon.toml"
    cfg.write_text(f'[mqtt]\nbroker = "mqtt://broker.example:1884"\nusername = "ops"\npassword_file = "{pw}"\n')
    monkeypatch.delenv("NVMON_BROKER", raising=False)
    seen = {}
    monkeypatch.setattr("nvmon.tui.app.NvmonApp.run", lambda self: seen.update(
        url=self.settings.url, user=self.settings.username, pw=self.settings.password_file))
    r = CliRunner().invoke(tui_command, ["--config", str(cfg)])
    assert r.exit_code == 0, r.output
    assert seen == {"url": "mqtt://broker.example:1884", "user": "ops", "pw": str(pw)}
    r = CliRunner().invoke(tui_command, ["--config", str(cfg), "--username", "me"])  # a flag over its key
    assert r.exit_code == 0 and seen["user"] == "me"
    monkeypatch.setenv("NVMON_BROKER", "mqtt://other.example:1885")  # the environment over the file
    r = CliRunner().invoke(tui_command, ["--config", str(cfg)])
    assert r.exit_code == 0 and seen["url"] == "mqtt://other.example:1885"
    monkeypatch.delenv("NVMON_BROKER")
    r = CliRunner().invoke(tui_command, [])
    assert r.exit_code == 0 and seen["url"] == DEFAULT_BROKER
