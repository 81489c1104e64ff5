"""What the CLI says, through the real `nvmon` command (issue 15, "help and wording", "output
details"): help texts that name the right things, config errors in plain words with hooks counted
from 1, the same marks as the TUI, nothing cut when piped; bad input is one line on stderr,
a non-zero exit, no traceback and nothing written."""

from __future__ import annotations

import json
import os
import re
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
        assert len(line) <= 80 and not line.rstrip().endswith(("...", "…")), \
            f"{line!r}: give {name!r} a short line in nvmon.cli.root.SHORT_HELP"


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


# ---------------------------------------------------------------- nvmon alerts on a fleet's database


def fleet_db(path: Path, now: float) -> dict[str, str]:
    """A fleet.db as `nvmon fleet` writes it (nvmon.store.alerts.save): node.offline on two nodes
    (one saved 5 minutes ago, 'offline for 0 s' then), a stale node, a rack over its budget, a
    resolved offline; returns the fingerprints by name."""
    from nvmon.alerts.model import AlertRecord, fingerprint
    from nvmon.store import Store
    from nvmon.store import alerts as db

    def rec(code, sev, node, summary, starts, **kw):
        fp = fingerprint(code, "prod", node, rack=kw.get("rack"))
        return AlertRecord(fingerprint=fp, status=kw.pop("status", "firing"), code=code, severity=sev,
                           cluster="prod", node=node, summary=summary, runbook="r", starts_at=starts,
                           fired_at=starts, **kw)

    old = rec("node.offline", "critical", "gpu-07", "gpu-07: daemon offline for 0 s: connection lost "
              "(the broker published its will)", now - 300)
    new = rec("node.offline", "critical", "gpu-03", "gpu-03: daemon offline for up to 2 min: stopped cleanly "
              "and not back", now - 60)
    stale = rec("node.stale", "warning", "gpu-11", "gpu-11: no sample for 9 s (stale after 3 intervals, 3 s)",
                now - 30)
    rack = rec("rack.power", "warning", None, "rack r2: 41.0 kW over its 40 kW budget (4 nodes reporting: "
               "38.0 kW GPU)", now - 600, rack="r2")
    gone = rec("node.offline", "critical", "gpu-01", "gpu-01: daemon offline for 12 s: stopped cleanly and not "
               "back", now - 900, status="resolved", ends_at=now - 800)
    store = Store(path)
    store.open()
    try:
        store.transact(lambda conn: db.save(conn, [old, rack, gone], now - 300))  # saved then, not since
        store.transact(lambda conn: db.save(conn, [new, stale], now - 10))
    finally:
        store.close()
    return {"old": old.fingerprint, "new": new.fingerprint, "stale": stale.fingerprint, "rack": rack.fingerprint,
            "gone": gone.fingerprint}


def test_alerts_on_a_fleet_db_name_nodes_order_by_severity_and_show_current_ages(tmp_path):
    import time

    now = time.time()
    path = tmp_path / "fleet.db"
    fleet_db(path, now)
    r = nvmon(tmp_path, "alerts", "--db", str(path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    facts = lines[1::2]
    assert [f.split()[4] for f in facts] == ["gpu-03", "gpu-07", "gpu-11", "rack", "gpu-01"], r.stdout
    # critical ones newest first, then the warnings newest first, then the resolved one
    assert [f.split()[0] for f in facts] == ["✗", "✗", "⚠", "⚠", "✓"]
    summaries = lines[2::2]
    # saved 5 minutes ago as 'for 0 s': about 5 min now; saved 10 s ago as 'up to 2 min': 2 min
    assert "gpu-07: daemon offline for 5 min: connection lost" in summaries[1], summaries
    assert "gpu-03: daemon offline for up to 2 min: stopped" in summaries[0]
    stale = re.search(r"gpu-11: no sample for (\d+) s \(stale", summaries[2])
    assert stale and 19 <= int(stale.group(1)) <= 40, summaries
    assert "gpu-01: daemon offline for 12 s" in summaries[4]  # resolved: as it was
    assert "rack r2" in facts[3]
    assert "…" not in r.stdout  # piped: nothing cut


def test_alerts_filters(tmp_path):
    import time

    now = time.time()
    path = tmp_path / "fleet.db"
    fps = fleet_db(path, now)

    def listed(*args):
        r = nvmon(tmp_path, "alerts", "--db", str(path), "--json", *args)
        assert r.returncode == 0, r.stderr
        return [a["fingerprint"] for a in json.loads(r.stdout)]

    assert listed() == [fps[k] for k in ("new", "old", "stale", "rack", "gone")]  # the listing's order
    assert listed("--node", "gpu-07") == [fps["old"]]
    assert listed("--node", "gpu-0*") == [fps["new"], fps["old"], fps["gone"]]
    assert listed("--node", "r2") == [fps["rack"]]
    assert listed("--code", "node.*", "--severity", "warning") == [fps["new"], fps["old"], fps["stale"], fps["gone"]]
    assert listed("--severity", "critical") == [fps["new"], fps["old"], fps["gone"]]
    assert listed("--code", "nvlink.*") == []
    before = files(tmp_path)
    r = nvmon(tmp_path, "alerts", "--db", str(path), "--severity", "fatal")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("nvmon alerts: Invalid value for '--severity': 'fatal' is not one of")
    assert r.stdout == "" and files(tmp_path) == before


def test_silences_json(tmp_path):
    import time

    path = tmp_path / "fleet.db"
    fleet_db(path, time.time())
    r = nvmon(tmp_path, "alerts", "silence", "--db", str(path), "--match", "node=gpu-07", "--match", "code=node.*",
              "--for", "2h", "--comment", "rebooting", "--by", "alice")
    assert r.returncode == 0, r.stderr
    r = nvmon(tmp_path, "alerts", "silences", "--db", str(path), "--json")
    assert r.returncode == 0, r.stderr
    [s] = json.loads(r.stdout)
    assert set(s) == {"id", "shared", "matchers", "starts_at", "ends_at", "created_by", "comment", "applied_until"}
    assert s["applied_until"] == s["ends_at"]  # a local silence of 2 h: applied in full
    assert (s["id"], s["shared"], s["matchers"], s["created_by"], s["comment"]) == \
        (1, False, {"node": "gpu-07", "code": "node.*"}, "alice", "rebooting")
    assert s["ends_at"].endswith("Z") and s["starts_at"] < s["ends_at"]
    help_text = nvmon(tmp_path, "alerts", "silences", "--help").stdout
    assert all(k in help_text for k in set(s))
    r = nvmon(tmp_path, "alerts", "--db", str(path))  # and the list says it is silenced
    assert "[silenced] gpu-07: daemon offline" in r.stdout


# ---------------------------------------------------------------- history and durations


def test_history_link_needs_a_link_metric(tmp_path):
    before = files(tmp_path)
    r = nvmon(tmp_path, "history", "--db", str(tmp_path / "nvmon.db"), "--link", "3")
    one_line_error(r, "nvmon history: --link selects NVLinks of the link_* metrics; add one, e.g. "
                      "-m link_tx_bytes_per_s (nvmon history --help lists them)", 2)
    r = nvmon(tmp_path, "history", "--db", str(tmp_path / "nvmon.db"), "--link", "3", "-m", "power_w,link_active")
    assert r.returncode == 1 and "--link" not in r.stderr  # accepted; the database is what is missing here
    assert files(tmp_path) == before


@pytest.mark.parametrize("args, expected", [
    (("history", "--since", "5M"), "nvmon history: Invalid value for '--since': '5M': units are lower case: "
                                   "s, m (minutes), h, d, w"),
    (("history", "--since", "1h", "--until", "2H"), "nvmon history: Invalid value for '--until': '2H': units are "
                                                    "lower case: s, m (minutes), h, d, w"),
    (("alerts", "silence", "--match", "node=gpu-07", "--for", "2H"),
     "nvmon alerts silence: '2H': units are lower case: s, m (minutes), h, d, w"),
])
def test_duration_units_are_lower_case(tmp_path, args, expected):
    before = files(tmp_path)
    one_line_error(nvmon(tmp_path, *args, "--db", str(tmp_path / "nvmon.db")), expected, 2)
    assert files(tmp_path) == before


# ---------------------------------------------------------------- --json on the listing commands


def test_hooks_test_json(tmp_path):
    cfg = tmp_path / "nvmon.toml"
    cfg.write_text(f'[node]\nname = "gpu-07"\ncluster = "c1"\n'
                   f'[[hooks]]\nname = "page"\ntype = "exec"\n'
                   f'command = [{json.dumps(sys.executable)}, "-c", "import sys; sys.stdin.read()"]\n'
                   f'[[hooks]]\nname = "gone"\ntype = "exec"\ncommand = ["/nonexistent/page"]\n')
    r = nvmon(tmp_path, "hooks", "test", "--config", str(cfg), "--json")
    assert r.returncode == 1 and r.stderr == "nvmon: 1 of 2 hook(s) failed\n", r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"fingerprint", "failed", "hooks"} and out["failed"] == 1
    assert [set(h) for h in out["hooks"]] == [{"name", "type", "target", "ok", "detail"}] * 2
    page, gone = out["hooks"]
    assert (page["name"], page["type"], page["ok"]) == ("page", "exec", True)
    assert page["detail"].startswith("firing: ") and "resolved: " in page["detail"]
    assert (gone["ok"], gone["detail"]) == (False, "firing: /nonexistent/page: no such program")
    help_text = nvmon(tmp_path, "hooks", "test", "--help").stdout
    assert all(f'"{k}"' in help_text for k in ("fingerprint", "hooks", "name", "type", "target", "ok", "detail",
                                                 "failed"))


def test_counts_agree_with_their_nouns(tmp_path):
    """'1 rack', not '1 racks' (sim-fleet's banner; its summary lines use the same helper)."""
    import socket

    from nvmon.cli.common import counted

    assert (counted(1, "rack"), counted(0, "error"), counted(3, "sample")) == ("1 rack", "0 errors", "3 samples")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"mqtt://127.0.0.1:{s.getsockname()[1]}"
    r = nvmon(tmp_path, "sim-fleet", "--broker", url, "--nodes", "1", "--racks", "1", "--seconds", "1")
    banner = r.stderr.splitlines()[0]
    assert banner.startswith("sim-fleet: 1 node (sim-000..sim-000, 1 rack, 0 faulty) of hgx-h100"), r.stderr
    assert r.returncode == 1 and "Traceback" not in r.stderr


def test_audit_view_cuts_code_and_place_only_on_a_terminal():
    """render_audit(full=True) is what piped `nvmon audit` prints: a long device name whole."""
    import io

    from rich.console import Console

    from nvmon.audit import audit
    from nvmon.render import render_audit
    from samplefactory import healthy_sample, with_ib

    s = with_ib(healthy_sample(), 1, device="mlx5_bond_rail_17", rate_gbps=100.0, rate_name="EDR")

    def text(full: bool) -> str:
        out = io.StringIO()
        Console(file=out, width=200, color_system=None).print(render_audit(audit(s), full=full))
        return out.getvalue()

    [line] = [ln for ln in text(True).splitlines() if "ib.rate" in ln]
    assert line.split()[:4] == ["⚠", "ib.rate", "mlx5_bond_rail_17", "port"]
    [line] = [ln for ln in text(False).splitlines() if "ib.rate" in ln]
    assert line.split()[:3] == ["⚠", "ib.rate", "mlx5_bond_rai…"]  # the message still names it whole


def test_demo_status_line_counts_one_node_as_one():
    from types import SimpleNamespace

    from nvmon.cli.demo import _status_line

    fleet = SimpleNamespace(status=lambda: SimpleNamespace(nodes=[1, 2], published=20, up=2, elapsed_s=12.0))
    watch = SimpleNamespace(status=True, online=2, offline=[], alert_counts=lambda: {"critical": 2},
                            alert_nodes=lambda: 1)
    line, _ = _status_line(fleet, watch, 0)
    assert line.endswith("alerts 2 on 1 node (2 critical)"), line


def test_alerts_list_fits_80_columns_on_a_terminal():
    import io
    import time

    from rich.console import Console

    from nvmon.alerts.model import AlertRecord
    from nvmon.cli.alerts_view import render_alerts

    now = time.time()
    r = AlertRecord(fingerprint="0123456789abcdef", status="firing", code="nvlink.link_down", severity="critical",
                    cluster="c", node="gpu-node-0123456789", summary="x " * 100, runbook="", starts_at=now - 60,
                    gpu=3, link=17, fired_at=now - 60)

    def lines(full: bool) -> list[str]:
        out = io.StringIO()
        Console(file=out, width=200, color_system=None).print(render_alerts([r], set(), now, full=full))
        return out.getvalue().splitlines()

    assert all(len(line.rstrip()) <= 80 for line in lines(False)), lines(False)
    assert " gpu-node-0123456…  " in lines(False)[1]
    assert "gpu-node-0123456789 GPU 3 link 17" in lines(True)[1] and len(lines(True)[2]) > 80
