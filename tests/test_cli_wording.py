"""What the CLI says, through the real `nvmon` command (issue 15, "help and wording", "output
details"): help texts that name the right things, config errors in plain words with hooks counted
from 1, the same marks as the TUI, nothing cut when piped; bad input is one line on stderr,
a non-zero exit, no traceback and nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SYSTEMD_ENV = ("INVOCATION_ID", "JOURNAL_STREAM")


def nvmon(tmp: Path, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in SYSTEMD_ENV}
    e.update(HOME=str(tmp / "home"), XDG_STATE_HOME=str(tmp / "state"), COLUMNS="80", **env)
    return subprocess.run([sys.executable, "-m", "nvmon", *args], capture_output=True, text=True,
                          timeout=timeout, env=e, stdin=subprocess.DEVNULL, cwd=tmp)


def files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def one_line_error(r: subprocess.CompletedProcess, expected: str, code: int = 1) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [expected], r.stderr
    assert r.stdout == ""


# ---------------------------------------------------------------- config errors


CONFIG_CASES = [
    # (command, file text, the key and what was expected)
    ("daemon", '[mqtt]\nbroker = ["mqtt://a:1883"]\n', "mqtt.broker: expected a string, got an array"),
    ("daemon", "[node]\nlabels = 3\n", "node.labels: expected a table, got a number"),
    ("daemon", "[alerts]\nfor_s = -1\n", "alerts.for_s: must be at least 0"),
    ("daemon", '[mqtt]\nbroker = 1\n[alerts]\nfor_s = "x"\n',
     "mqtt.broker: expected a string, got a number (and 1 more problem)"),
    ("hooks", '[[hooks]]\nname = "a"\ntype = "exec"\ncommand = ["true"]\n'
              '[[hooks]]\nname = "b"\ntype = "exec"\ncommand = "/bin/page --team gpu"\n',
     "hooks[2].command: expected an array, got a string"),
    ("hooks", '[[hooks]]\ntype = "email"\n',
     "hooks[1].type: must be one of exec, webhook, alertmanager, alertmanager-webhook, pagerduty, slack"),
    ("hooks", '[[hooks]]\ntype = "webhook"\nurl = "http://h/"\non = ["fired"]\n',
     "hooks[1].on[1]: must be one of firing or resolved"),
    ("fleet", "[fleet]\nsame_fault_nodes = 1\n", "fleet.same_fault_nodes: must be at least 2"),
    ("daemon", '[[hooks]]\ntype = "webhook"\n', "hooks[1]: webhook hook needs url"),
]


@pytest.mark.parametrize("command, text, expected", CONFIG_CASES)
def test_config_errors_are_plain_and_count_hooks_from_one(tmp_path, command, text, expected):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    args = {"daemon": ["daemon", "--sim", "hgx-h100", "--db", str(tmp_path / "d.db")],
            "fleet": ["fleet", "--db", str(tmp_path / "f.db")],
            "hooks": ["hooks", "test"]}[command]
    before = files(tmp_path)
    r = nvmon(tmp_path, *args, "--config", str(cfg), timeout=20)
    one_line_error(r, f"nvmon: {cfg}: {expected}")
    assert "Input should" not in r.stderr and "valid tuple" not in r.stderr
    assert files(tmp_path) == before
