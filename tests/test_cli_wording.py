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


# ---------------------------------------------------------------- help texts


def test_top_level_help_gives_each_command_a_whole_line_within_80_columns(tmp_path):
    from nvmon.cli import cli

    r = nvmon(tmp_path, "--help")
    assert r.returncode == 0, r.stderr
    listing = r.stdout.split("Commands:", 1)[1].splitlines()
    for name in cli.commands:
        line = next((ln for ln in listing if ln.split()[:1] == [name]), None)
        assert line is not None, (name, r.stdout)
        assert len(line) <= 80 and not line.rstrip().endswith(("...", "…")), line


def test_help_texts_name_the_right_things(tmp_path):
    history = nvmon(tmp_path, "history", "--help").stdout
    assert "nvmon-daemon" not in history and "(`nvmon daemon`)" in " ".join(history.split())
    audit = " ".join(nvmon(tmp_path, "audit", "--help").stdout.split())
    assert "docs/audit.md" in audit and "sample-schema" not in audit
    sample = " ".join(nvmon(tmp_path, "sample", "--help").stdout.split())
    assert "docs/sample-schema.md" in sample


def test_profiles_prints_plain_text_and_json(tmp_path):
    from nvmon.sim.profiles import PROFILES

    r = nvmon(tmp_path, "profiles")
    assert r.returncode == 0 and r.stderr == ""
    assert "``" not in r.stdout and "::" not in r.stdout and "`" not in r.stdout
    assert "--sim syntax: PROFILE[,KEY=VALUE]... — for example:\n" in r.stdout
    assert "    hgx-h100,load=idle,seed=7\n" in r.stdout  # examples keep their indentation
    assert "\nKeys (repeatable unless noted):\n" in r.stdout
    assert all(f"  {key} " in r.stdout for key in PROFILES)
    r = nvmon(tmp_path, "profiles", "--json")
    out = json.loads(r.stdout)
    assert set(out) == {"profiles", "sim_syntax"}
    assert [p["name"] for p in out["profiles"]] == list(PROFILES)
    h100 = next(p for p in out["profiles"] if p["name"] == "hgx-h100")
    assert h100 == {"name": "hgx-h100", "description": PROFILES["hgx-h100"].description,
                    "gpu": "NVIDIA H100 80GB HBM3", "gpus": 8, "nvlink": "NVSwitch", "ib_ports": 8,
                    "ib_rate_gbps": 400}
    assert out["sim_syntax"].startswith("PROFILE[,KEY=VALUE]...") and "``" not in out["sim_syntax"]
    help_text = " ".join(nvmon(tmp_path, "profiles", "--help").stdout.split())
    for key in ("profiles", "name", "description", "gpu", "gpus", "nvlink", "ib_ports", "ib_rate_gbps", "sim_syntax"):
        assert key in help_text


# ---------------------------------------------------------------- sample and audit output


def test_sample_names_ib_ports_as_the_tui_and_says_nvml_unavailable_once(tmp_path):
    r = nvmon(tmp_path, "sample", "--sim", "hgx-h100,ib_rate=mlx5_1:100", "--interval", "0.1")
    assert r.returncode == 0, r.stderr
    assert "mlx5_1:1" in r.stdout and "mlx5_1/1" not in r.stdout
    r = nvmon(tmp_path, "sample", "--sim", "hgx-h100,nvml=off", "--interval", "0.1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("NVML unavailable") == 1, r.stdout
    assert "✗ no GPU data (see Problems)" in r.stdout


def test_audit_marks_severities_with_the_tuis_symbols(tmp_path):
    from nvmon.render import SEVERITY_SYMBOL
    from nvmon.tui.text import BAD, INFO, SYMBOL, WARN

    assert SEVERITY_SYMBOL == {"critical": SYMBOL[BAD], "warning": SYMBOL[WARN], "info": SYMBOL[INFO]}
    r = nvmon(tmp_path, "audit", "--sim", "hgx-h100,nvlink_down=2.5,ib_rate=mlx5_1:100", "--interval", "0.1",
              "--expect-ib", "8x400", "--xid-window", "0")
    assert r.returncode == 2, r.stderr
    marks = [line.split()[0] for line in r.stdout.splitlines()[1:] if line[:1].strip()]
    assert marks[0] == "✗" and "⚠" in marks and set(marks) <= {"✗", "⚠", "ℹ"}, r.stdout
    assert "mlx5_1" in r.stdout and "!" not in "".join(marks)


def test_piped_sample_lists_every_problem(tmp_path):
    """Piped (stdout not a terminal, as here) nothing is cut: 12 links down are 12 Problems lines."""
    faults = ",".join(f"nvlink_down={g}.{link}" for g in range(4) for link in range(3))
    r = nvmon(tmp_path, "sample", "--sim", f"hgx-h100,{faults}", "--interval", "0.1")
    assert r.returncode == 0, r.stderr
    problems = r.stdout.split("\nProblems\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len([p for p in problems if p.strip().startswith("✗")]) == 12, r.stdout
    assert "… and" not in r.stdout and "…" not in r.stdout
