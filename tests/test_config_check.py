"""`nvmon config check` through the real command (issue 15, "what an SRE expects"): a good file
prints its effective configuration (defaults filled in, readable back as TOML and accepted again
by the same reader), the kind follows the file's tables or --kind, secrets never appear, and a bad
file is one line on stderr, exit 2, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from nvmon.cli.config import mask_url, masked
from nvmon.daemon.config import load_config
from nvmon.fleet.service import load_fleet_config

REPO = Path(__file__).resolve().parent.parent
SECRETS = ("T000SECRET", "B000SECRET", "tok3nvalue", "h3adervalue", "s3cr3tq", "bas1cpass")


def nvmon(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("INVOCATION_ID", "JOURNAL_STREAM")}
    env.update(HOME=str(tmp / "home"), XDG_STATE_HOME=str(tmp / "state"))
    return subprocess.run([sys.executable, "-m", "nvmon", "config", "check", *args], capture_output=True,
                          text=True, timeout=60, env=env, stdin=subprocess.DEVNULL, cwd=tmp)


def test_daemon_example_is_valid_and_printed_whole(tmp_path):
    r = nvmon(tmp_path, "--config", str(REPO / "systemd/nvmon.toml"))
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.startswith(f"# {REPO / 'systemd/nvmon.toml'}: valid for nvmon daemon")
    data = tomllib.loads(r.stdout)  # TOML that reads back ...
    assert data["node"] == {"name": "gpu-001", "cluster": "default", "rack": "r12",
                            "labels": {"role": "train", "pool": "a"}}
    assert data["alerts"]["for_s"] == 30.0 and data["alerts"]["min_count"] == 10  # defaults filled in
    assert data["store"]["raw_retention_h"] == 48.0 and data["prometheus"]["dcgm_compat"] == "4.8.3"
    assert "# listen = (not set)" in r.stdout
    out = tmp_path / "effective.toml"  # ... and that the daemon accepts as it is
    out.write_text(r.stdout)
    assert load_config(out).model_dump() == load_config(REPO / "systemd/nvmon.toml").model_dump()


def test_fleet_file_detected_by_its_table_and_json(tmp_path):
    r = nvmon(tmp_path, "--config", str(REPO / "systemd/fleet.toml"), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["kind"] == "fleet" and d["file"] == str(REPO / "systemd/fleet.toml")
    assert d["config"]["fleet"]["stale_after_intervals"] == 5.0
    assert d["config"]["fleet"]["clean_stop_after_s"] == 900.0
    assert d["config"]["mqtt"]["keepalive_s"] == 10 and "node" not in d["config"]
    # --kind daemon reads the same file with the daemon's reader: [fleet] is not its table
    r = nvmon(tmp_path, "--config", str(REPO / "systemd/fleet.toml"), "--kind", "daemon")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "fleet" in r.stderr, r.stderr


def test_no_file_is_the_built_in_defaults(tmp_path):
    if Path("/etc/nvmon/nvmon.toml").exists():
        pytest.skip("this machine has /etc/nvmon/nvmon.toml")
    r = nvmon(tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["kind"] == "daemon" and d["file"] is None
    assert d["config"]["mqtt"]["broker"] == "mqtt://localhost:1883"
    assert any(n.startswith("node name in use: ") for n in d["notes"])


@pytest.mark.parametrize("text, expected", [
    ("[mqtt]\nbroker = 3\n", "mqtt.broker: expected a string, got a number"),
    ("[alerts]\nfor_s = -1\n", "alerts.for_s: must be at least 0"),
    ("[sampling]\nsim = \"no-such-board\"\n", "sampling.sim:"),
    ("[node\nname = 1\n", "not valid TOML"),
    ("[fleet]\nsame_fault_nodes = 1\n", "fleet.same_fault_nodes: must be at least 2"),
    ("[fleet]\n[[hooks]]\ntype = \"webhook\"\nurl = \"https://u:p@x.example/h\"\n",
     "hooks[1].url: no credentials in the URL"),
])
def test_bad_file_is_one_line_exit_2(tmp_path, text, expected):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    r = nvmon(tmp_path, "--config", str(f))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"nvmon config check: {f}: ") and expected in lines[0], lines
    assert "u:p" not in r.stderr


def test_missing_file_is_one_line_exit_2(tmp_path):
    r = nvmon(tmp_path, "--config", str(tmp_path / "nope.toml"))
    assert r.returncode == 2 and r.stderr == f"nvmon config check: {tmp_path / 'nope.toml'}: no such file\n"


def test_secrets_masked(tmp_path):
    f = tmp_path / "fleet.toml"
    f.write_text(
        '[fleet]\ncluster = "prod"\n'
        '[fleet.rules."rack.power"]\nfor_s = 120\n'
        '[[hooks]]\ntype = "slack"\nurl = "https://hooks.slack.com/services/T000SECRET/B000SECRET"\n'
        '[[hooks]]\ntype = "webhook"\nurl = "https://pager.example:8443/in?token=tok3nvalue&team=gpu"\n'
        'headers = { "X-Api-Key" = "h3adervalue" }\n'
        '[[hooks]]\ntype = "alertmanager"\nurls = ["http://am-1:9093", "http://am-2:9093/s3cr3tq"]\n')
    for args in ((), ("--json",)):
        r = nvmon(tmp_path, "--config", str(f), *args)
        assert r.returncode == 0, r.stderr
        for s in SECRETS:
            assert s not in r.stdout, (s, r.stdout)
    d = json.loads(r.stdout)["config"]
    assert [h["url"] for h in d["hooks"][:2]] == ["https://hooks.slack.com/…", "https://pager.example:8443/…"]
    assert d["hooks"][1]["headers"] == {"X-Api-Key": "***"}
    assert d["hooks"][2]["urls"] == ["http://am-1:9093", "http://am-2:9093/…"]  # a bare base URL is shown
    text = nvmon(tmp_path, "--config", str(f)).stdout
    assert tomllib.loads(text)["fleet"]["rules"] == {"rack.power": {"enabled": True, "for_s": 120.0}}
    assert load_fleet_config(f).hooks[0].name == "slack"


def test_masking_rules():
    assert mask_url("https://bob:bas1cpass@h.example/x") == "https://***@h.example/…"
    assert mask_url("mqtt://localhost:1883") == "mqtt://localhost:1883"
    assert mask_url("http://[::1]:9093/api?k=v") == "http://[::1]:9093/…"
    assert masked({"password": "bas1cpass", "password_file": "/etc/p", "secret_env": "PD_KEY",
                   "api_token": "tok3nvalue", "headers": {"Authorization": "Bearer x"}}) == \
        {"password": "***", "password_file": "/etc/p", "secret_env": "PD_KEY", "api_token": "***",
         "headers": {"Authorization": "***"}}


def test_files_it_names_are_checked_as_warnings(tmp_path):
    """A password or hook secret file this user cannot read: a warning line each (named, no secret),
    the config still valid (exit 0: the service may run as another user)."""
    key = tmp_path / "pd.key"
    key.write_text("r0utingkey")
    key.chmod(0o644)  # others may read it: refused as the dispatcher refuses it
    f = tmp_path / "nvmon.toml"
    f.write_text(f'[mqtt]\nbroker = "mqtt://b.example:1883"\nusername = "gpu-001"\n'
                 f'password_file = "{tmp_path / "nope.password"}"\n'
                 f'[[hooks]]\ntype = "pagerduty"\nsecret_file = "{key}"\n')
    r = nvmon(tmp_path, "--config", str(f), "--json")
    assert r.returncode == 0, r.stderr
    warnings = json.loads(r.stdout)["warnings"]
    assert r.stderr.splitlines() == [f"nvmon config check: warning: {w}" for w in warnings]
    assert warnings[0] == f"password file {tmp_path / 'nope.password'}: No such file or directory"
    assert len(warnings) == 2 and str(key) in warnings[1] and "r0utingkey" not in r.stderr + r.stdout
