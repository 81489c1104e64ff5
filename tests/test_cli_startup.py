"""Start-up of the long-running commands through the real CLI (issue 15): what the user typed wrongly
(a database path, a password / CA / certificate file) fails at once in one line, exit 1, no
traceback, nothing written; the packaged default database falls back to the user's state
directory outside systemd, and says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SYSTEMD_ENV = ("INVOCATION_ID", "JOURNAL_STREAM")


def env_for(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SYSTEMD_ENV}
    env.update(HOME=str(tmp / "home"), XDG_STATE_HOME=str(tmp / "state"), **extra)
    return env


def nvmon(tmp: Path, *args: str, timeout: float = 30, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvmon", *args], capture_output=True, text=True,
                          timeout=timeout, env=env_for(tmp, **env), stdin=subprocess.DEVNULL)


def files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def one_line_error(r: subprocess.CompletedProcess, expected: str, code: int = 1) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [expected], r.stderr
    assert r.stdout == ""


def db_cases(tmp: Path) -> list[tuple[str, str]]:
    (tmp / "adir").mkdir()
    return [
        (f"{tmp}/missing/nvmon.db", f"nvmon: database {tmp}/missing/nvmon.db: directory {tmp}/missing does not exist"),
        (f"{tmp}/adir", f"nvmon: database {tmp}/adir: is a directory; give a file, e.g. {tmp}/adir/nvmon.db"),
        ("/dev/null/nvmon.db", "nvmon: database /dev/null/nvmon.db: /dev/null is not a directory"),
        ("/dev/null", "nvmon: database /dev/null: not a regular file"),
    ]


def test_daemon_bad_db_fails_at_once(tmp_path):
    for db, expected in db_cases(tmp_path):
        before = files(tmp_path)
        t0 = time.monotonic()
        r = nvmon(tmp_path, "daemon", "--sim", "hgx-h100", "--broker", "", "--db", db)
        one_line_error(r, expected)
        assert time.monotonic() - t0 < 20  # not a retry loop
        assert files(tmp_path) == before


def test_daemon_db_where_files_cannot_be_created(tmp_path):
    """/proc: access() says yes to root, creating a file says no."""
    r = nvmon(tmp_path, "daemon", "--sim", "hgx-h100", "--broker", "", "--db", "/proc/nvmon.db")
    assert r.returncode == 1 and "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("nvmon: database /proc/nvmon.db: ")


def test_fleet_bad_db_fails_at_once(tmp_path):
    for db, expected in db_cases(tmp_path):
        before = files(tmp_path)
        r = nvmon(tmp_path, "fleet", "--broker", "mqtt://127.0.0.1:1", "--db", db)
        if db.endswith("adir"):  # refused by click's option type already: a usage error
            expected, code = f"nvmon fleet: Invalid value for '--db': File '{db}' is a directory.", 2
        else:
            code = 1
        one_line_error(r, expected, code)
        assert files(tmp_path) == before


def broker_file_cases(tmp: Path) -> list[tuple[list[str], list[str], str]]:
    """(TOML [mqtt] lines, the same as tui flags, expected line)."""
    pem = tmp / "not-a-cert.pem"
    pem.write_text("hello\n")
    cert = tmp / "cert.pem"
    cert.write_text("x\n")
    return [
        ([f'username = "u"', f'password_file = "{tmp}/pw"'], ["--username", "u", "--password-file", f"{tmp}/pw"],
         f"nvmon: password file {tmp}/pw: No such file or directory"),
        (['broker = "mqtts://127.0.0.1:1"', f'ca_file = "{tmp}/ca.pem"'],
         ["--broker", "mqtts://127.0.0.1:1", "--ca-file", f"{tmp}/ca.pem"],
         f"nvmon: CA file {tmp}/ca.pem: No such file or directory"),
        (['broker = "mqtts://127.0.0.1:1"', f'cert_file = "{cert}"', f'key_file = "{tmp}/key.pem"'],
         ["--broker", "mqtts://127.0.0.1:1", "--cert-file", str(cert), "--key-file", f"{tmp}/key.pem"],
         f"nvmon: key file {tmp}/key.pem: No such file or directory"),
        (['broker = "mqtts://127.0.0.1:1"', f'ca_file = "{pem}"'],
         ["--broker", "mqtts://127.0.0.1:1", "--ca-file", str(pem)],
         f"nvmon: TLS files ({pem}): [X509: NO_CERTIFICATE_OR_CRL_FOUND] no certificate or crl found"),
    ]


def test_missing_broker_files_fail_at_once_in_every_broker_command(tmp_path):
    for i, (toml, flags, expected) in enumerate(broker_file_cases(tmp_path)):
        cfg = tmp_path / f"c{i}.toml"
        cfg.write_text("[mqtt]\n" + "\n".join(toml) + "\n")
        before = files(tmp_path)
        one_line_error(nvmon(tmp_path, "daemon", "--sim", "hgx-h100", "--config", str(cfg),
                             "--db", str(tmp_path / "d.db")), expected)
        one_line_error(nvmon(tmp_path, "fleet", "--config", str(cfg), "--db", str(tmp_path / "f.db")), expected)
        one_line_error(nvmon(tmp_path, "tui", *flags), expected)  # before the screen opens
        url = "mqtts://127.0.0.1:1" if "mqtts" in toml[0] else "mqtt://127.0.0.1:1"
        one_line_error(nvmon(tmp_path, "alerts", "silences", "--config", str(cfg), "--cluster", "c", "--broker", url),
                       expected)
        assert files(tmp_path) == before


def test_default_db_falls_back_to_the_state_directory(tmp_path):
    if Path("/var/lib/nvmon").exists():
        pytest.skip("/var/lib/nvmon exists here: the default is used as it is")
    state = tmp_path / "state" / "nvmon"
    p = subprocess.Popen([sys.executable, "-m", "nvmon", "daemon", "--sim", "hgx-h100", "--broker", "",
                          "--interval", "0.2", "--log-level", "warning"], env=env_for(tmp_path),
                         stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (state / "nvmon.db").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=20)
    assert p.returncode == 0, err
    assert (state / "nvmon.db").exists()
    note = f"nvmon: database {state / 'nvmon.db'} (/var/lib/nvmon does not exist; --db to choose)"
    assert err.splitlines()[0] == note
    assert "Traceback" not in err
    for reader in (["history", "--since", "1h", "--json"], ["alerts", "--json"]):  # they read it from there
        r = nvmon(tmp_path, *reader)
        assert r.returncode == 0 and r.stderr.splitlines() == [note], (reader, r.stderr)


def test_default_db_under_systemd_is_not_moved(tmp_path):
    """A unit's StateDirectory= makes /var/lib/nvmon; without it the unit is wrong: say so."""
    if Path("/var/lib/nvmon").exists():
        pytest.skip("/var/lib/nvmon exists here")
    r = nvmon(tmp_path, "daemon", "--sim", "hgx-h100", "--broker", "", INVOCATION_ID="x")
    one_line_error(r, "nvmon: database /var/lib/nvmon/nvmon.db: directory /var/lib/nvmon does not exist")
    assert not (tmp_path / "state").exists()


def test_sim_fleet_that_never_publishes_fails(tmp_path):
    """An unreachable broker: the first error at once, then retries; nothing published by the end
    is exit 1 with the reason in one line (it was exit 0 after "0 samples published, 18 errors")."""
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"mqtt://127.0.0.1:{port}"
    r = nvmon(tmp_path, "sim-fleet", "--broker", url, "--nodes", "2", "--seconds", "2")
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stdout == "", r.stderr
    lines = r.stderr.splitlines()
    assert lines[1].startswith(f"sim-fleet: cannot reach {url}: ") and lines[1].endswith("; retrying"), lines
    assert len(lines) == 3 and lines[2].startswith(f"nvmon: sim-fleet published nothing to {url} (0 connections, ")
    assert "Connection refused" in lines[2]


def test_a_password_in_the_broker_url_is_never_echoed(tmp_path):
    """As --broker: bad usage (exit 2, `nvmon <command>: `); in a config file: exit 1."""
    cfg = tmp_path / "c.toml"
    commands = (["tui"], ["sim-fleet", "--seconds", "1"], ["fleet", "--db", str(tmp_path / "f.db")],
                ["daemon", "--sim", "hgx-h100", "--db", str(tmp_path / "d.db")],
                ["alerts", "silences", "--cluster", "c"])
    for url in ("mqtt://bob:s3cret@h:1883", "mqtts://bob:s3/cr@t@h"):
        cfg.write_text(f'[mqtt]\nbroker = "{url}"\n')
        for cmd in commands:
            r = nvmon(tmp_path, *cmd, "--broker", url)
            assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
            assert r.stderr.startswith(f"nvmon {cmd[0]}") and "no credentials in the URL" in r.stderr, r.stderr
            assert "s3" not in r.stderr and "***@h" in r.stderr, r.stderr
        for cmd in commands[2:4]:
            r = nvmon(tmp_path, *cmd, "--config", str(cfg))
            assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
            assert r.stderr == f"nvmon: {cfg}: mqtt.broker: no credentials in the URL; use username and password_file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


def test_usage_errors_exit_2_with_the_command_and_failures_exit_1(tmp_path):
    """One convention (nvmon/cli/common.py): bad usage `nvmon <command>: …` exit 2, click's own
    usage errors included; could not do it `nvmon: …` exit 1; audit 3 (Nagios UNKNOWN)."""
    cases = [
        (["tui", "--broker", "http://x"], 2, "nvmon tui: Invalid value for '--broker': broker URL 'http://x': "),
        (["sample", "--sim", "hgx-h999"], 2, "nvmon sample: --sim: unknown board profile 'hgx-h999'"),
        (["daemon", "--sim", "hgx-h999"], 2, "nvmon daemon: --sim: unknown board profile 'hgx-h999'"),
        (["daemon", "--interval", "0"], 2, "nvmon daemon: --interval: "),
        (["alerts", "ack", "xyz"], 2, "nvmon alerts ack: fingerprint 'xyz': give its hex digits"),
        (["alerts", "silence", "--match", "node=x"], 2, "nvmon alerts silence: Missing option '--for'"),
        (["sim-fleet", "--fault", "30=ib_down=1"], 2, "nvmon sim-fleet: --fault 30=ib_down=1: node index must be"),
        (["fleet", "--frobnicate"], 2, "nvmon fleet: No such option '--frobnicate'"),
        (["alerts", "--db", str(tmp_path / "none.db")], 1, f"nvmon: database {tmp_path / 'none.db'}: not found"),
        (["audit", "--expect-ib", "eight"], 3, "nvmon: --expect-ib: 'eight': expected PORTSxGBPS"),
    ]
    for args, code, start in cases:
        r = nvmon(tmp_path, *args)
        assert r.returncode == code and len(r.stderr.splitlines()) == 1, (args, r.returncode, r.stderr)
        assert r.stderr.startswith(start) and "Traceback" not in r.stderr and r.stdout == "", (args, r.stderr)
