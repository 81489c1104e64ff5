"""`--log-format json` (issue 15, structured logs for journald / Loki): `nvmon daemon` and `nvmon fleet`
run for real, stopped by SIGTERM, and every stderr line is one JSON object with time, level, logger
and message; the formatter adds the exception's text."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from nvmon.cli.logformat import JsonFormatter

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def run_until(tmp: Path, args: list[str], wait_for: str, timeout: float = 60) -> tuple[int, list[str]]:
    """Start `nvmon ARGS`, SIGTERM it once `wait_for` is on its stderr; (exit status, stderr lines)."""
    env = {k: v for k, v in os.environ.items() if k not in ("INVOCATION_ID", "JOURNAL_STREAM")}
    env.update(HOME=str(tmp / "home"), XDG_STATE_HOME=str(tmp / "state"))
    err = tmp / "stderr"
    with open(err, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "nvmon", *args], stdout=subprocess.DEVNULL, stderr=f,
                             stdin=subprocess.DEVNULL, env=env, cwd=tmp)
    try:
        deadline = time.monotonic() + timeout
        while wait_for not in err.read_text() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        code = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return code, err.read_text().splitlines()


def parsed(lines: list[str]) -> list[dict]:
    records = [json.loads(line) for line in lines]  # every line is JSON, or this fails
    for r in records:
        assert {"time", "level", "logger", "message"} <= set(r), r
        assert TIME.match(r["time"]) and r["level"] in ("debug", "info", "warning", "error", "critical"), r
    return records


def test_daemon_json_lines(tmp_path):
    code, lines = run_until(tmp_path, ["daemon", "--sim", "hgx-h100", "--broker", "", "--db",
                                       str(tmp_path / "n.db"), "--interval", "0.2", "--log-format", "json"],
                            wait_for="8 GPUs")
    assert code == 0, lines
    records = parsed(lines)
    assert len(records) >= 2, lines
    assert records[0]["logger"] == "nvmon.daemon" and "8 GPUs" in records[0]["message"]
    assert records[-1]["level"] == "info" and records[-1]["message"].startswith("stopped after")


def test_daemon_text_is_the_default(tmp_path):
    code, lines = run_until(tmp_path, ["daemon", "--sim", "hgx-h100", "--broker", "", "--db",
                                       str(tmp_path / "n.db"), "--interval", "0.2"], wait_for="8 GPUs")
    assert code == 0 and lines and not lines[0].startswith("{"), lines
    assert " nvmon.daemon INFO: " in lines[0]


def test_fleet_json_lines(tmp_path):
    # a broker nobody listens on: the retry lines are errors, each one JSON line too
    code, lines = run_until(tmp_path, ["fleet", "--broker", "mqtt://127.0.0.1:1", "--db", str(tmp_path / "f.db"),
                                       "--log-format", "json"], wait_for="retrying")
    assert code == 0, lines
    records = parsed(lines)
    assert any(r["logger"] == "nvmon.fleet" and r["level"] == "error" and "cannot connect" in r["message"]
               for r in records), records
    assert records[-1]["message"] == "fleet: stopped"


def test_bad_log_format_is_usage_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "nvmon", "fleet", "--log-format", "xml"], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "--log-format" in r.stderr, r.stderr


def test_formatter_exception_and_line_breaks():
    log = logging.getLogger("nvmon.test")
    try:
        raise ValueError("boom")
    except ValueError:
        record = log.makeRecord("nvmon.test", logging.ERROR, __file__, 1, "two\nlines %s", ("x",), sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line
    d = json.loads(line)
    assert d["message"] == "two\nlines x" and d["level"] == "error" and d["logger"] == "nvmon.test"
    assert d["exception"].startswith("Traceback") and "ValueError: boom" in d["exception"]
