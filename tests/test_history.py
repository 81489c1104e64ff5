"""`nvmon history`: formats, filters, raw-vs-rollup choice, and one-line errors, on real files."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from click.testing import CliRunner
from samplefactory import healthy_sample, with_gpu, with_link

from nvmon.store import Store
from nvmon.cli.history import history_command, iso, parse_time

NOW = 1_714_568_400.0  # 2024-05-01T13:00:00Z


def run(*args: str):
    return CliRunner().invoke(history_command, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """Two hours of a node at 1 Hz: rollups for all of it, raw ticks for the last 30 minutes."""
    path = tmp_path_factory.mktemp("history") / "nvmon.db"
    st = Store(path, raw_retention_s=1800)
    st.open()
    base = with_link(healthy_sample(), 2, 4, active=False, tx_bytes_per_s=0.0, rx_bytes_per_s=0.0)
    start = NOW - 7200
    for minute in range(120):
        batch = []
        for sec in range(0, 60, 5):  # one tick per 5 s keeps the fixture fast
            t = start + minute * 60 + sec
            batch.append(with_gpu(replace(base, ts=t), 3, power_w=300.0 + minute,
                                  throttle_reasons=("sw_power_cap",)))
        st.write_many(batch)
        st.maintain(start + minute * 60 + 65)
    st.close()
    return str(path)


def test_default_table_is_raw_inside_the_raw_window(db):
    r = run("--db", db, "--since", iso(int((NOW - 120) * 1000)), "--until", iso(int(NOW * 1000)), "--limit", "0")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("raw ticks (one row per sample), 2024-05-01T12:58:00Z → 2024-05-01T13:00:00Z")
    assert "gpu: 192 rows" in r.output  # 2 min × 12 ticks × 8 GPUs
    assert "power W" in r.output and "nvl tx GB/s" in r.output


def test_rollups_beyond_the_raw_window_and_says_so(db):
    r = run("--db", db, "--since", str(NOW - 7200), "--until", str(NOW), "--gpu", "3", "-m", "power_w",
            "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["source"] == "rollup" and out["resolution_s"] == 60
    rows = out["gpu"]
    assert len(rows) == 120 and {row["gpu"] for row in rows} == {3}
    assert rows[0] == {"ts": NOW - 7200, "time": "2024-05-01T11:00:00Z", "gpu": 3,
                       "power_w_min": 300.0, "power_w_avg": 300.0, "power_w_max": 300.0}
    assert rows[-1]["power_w_max"] == 419.0


def test_source_can_be_forced(db):
    r = run("--db", db, "--since", str(NOW - 600), "--until", str(NOW), "--source", "rollup", "--json",
            "-m", "power_w")
    assert json.loads(r.output)["source"] == "rollup"
    r = run("--db", db, "--since", str(NOW - 7200), "--until", str(NOW), "--source", "raw", "--json",
            "-m", "power_w")
    out = json.loads(r.output)
    assert out["source"] == "raw" and len(out["gpu"]) == 30 * 12 * 8  # only what raw still holds


def test_csv_with_filters_and_several_kinds(db):
    r = run("--db", db, "--since", str(NOW - 60), "--until", str(NOW), "--csv", "--gpu", "2", "--link", "4",
            "--link", "5", "-m", "nvlink_active,throttle,nvlink_down", "-m", "link_tx_bytes_per_s,link_active",
            "-m", "ib_state", "-m", "node_power_w")
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(io.StringIO(r.output)))
    kinds = {row["kind"] for row in rows}
    assert kinds == {"gpu", "link", "ib", "node"} and {row["source"] for row in rows} == {"raw"}
    gpu = [row for row in rows if row["kind"] == "gpu"]
    assert len(gpu) == 12 and {row["gpu"] for row in gpu} == {"2"}
    assert gpu[0]["nvlink_active"] == "17" and gpu[0]["nvlink_down"] == "4" and gpu[0]["throttle"] == ""
    links = [row for row in rows if row["kind"] == "link"]
    assert {(row["link"], row["link_active"], row["link_tx_bytes_per_s"]) for row in links} == \
        {("4", "0", "0.0"), ("5", "1", "20000000000.0")}
    ib = [row for row in rows if row["kind"] == "ib"]
    assert {row["device"] for row in ib} == {f"mlx5_{k}" for k in range(8)} and ib[0]["ib_state"] == "ACTIVE"
    assert [row for row in rows if row["kind"] == "node"][0]["node_power_w"] == str(419.0 + 7 * 490)


def test_throttle_names_and_raw_only_metrics_in_rollups(db):
    r = run("--db", db, "--since", str(NOW - 7200), "--until", str(NOW - 7080), "--json", "--gpu", "3",
            "-m", "throttle,energy_j")
    out = json.loads(r.output)
    assert out["gpu"][0]["throttle"] == ["sw_power_cap"]
    assert out["notes"] == ["energy_j: kept in raw ticks only, not in rollups (ask for a range inside the raw window)"]
    assert "energy_j" not in out["gpu"][0]


def test_table_limit_says_what_it_left_out(db):
    r = run("--db", db, "--since", str(NOW - 600), "--until", str(NOW))
    assert r.exit_code == 0
    assert "(760 older rows not shown: --limit 0 for all, or --json/--csv)" in r.output


@pytest.mark.parametrize("args,message", [
    (["--since", "yesterday"], "Invalid value for '--since': 'yesterday': use a duration"),
    (["--since", "-5m"], "Invalid value for '--since'"),
    (["--until", "99999999999999"], "unix seconds out of range"),
    (["-m", "power_w,bogus"], "unknown metric 'bogus'"),
    (["--gpu", "x"], "Invalid value for '--gpu'"),
    (["--json", "--csv"], "choose one of --json and --csv"),
    (["--since", "1h", "--until", "2h"], "must be before --until"),
])
def test_bad_input_is_a_usage_error(db, args, message):
    r = CliRunner().invoke(history_command, ["--db", db, *args])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


def test_missing_corrupt_and_foreign_databases(tmp_path):
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"garbage" * 1000)
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    cases = [
        (tmp_path / "missing.db", "not found"),
        (corrupt, "not a database (SQLITE_NOTADB)"),
        (foreign, "not an nvmon database"),
        (empty, "empty, not an nvmon database yet"),
        (tmp_path, "is a directory"),
    ]
    for path, message in cases:
        r = CliRunner().invoke(history_command, ["--db", str(path)])
        assert r.exit_code == 1, (path, r.output)
        assert r.output.startswith(f"nvmon: database {path}: {message}") and r.output.count("\n") == 1
    assert not (tmp_path / "missing.db").exists() and empty.read_bytes() == b""  # nothing created


def test_real_process_error_has_no_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-c", "from nvmon.cli.history import history_command; history_command()",
                        "--db", str(tmp_path / "none.db")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == f"nvmon: database {tmp_path / 'none.db'}: not found\n"


def test_reads_while_the_daemon_writes_and_never_writes_itself(tmp_path):
    path = tmp_path / "nvmon.db"
    st = Store(path)
    st.open()
    now = time.time()
    st.write_many([replace(healthy_sample(), ts=now - 30 + i) for i in range(30)])
    before = path.stat().st_mtime_ns, (tmp_path / "nvmon.db-wal").stat().st_size
    # a separate process, while the writer holds its connection and WAL open
    r = subprocess.run([sys.executable, "-c", "from nvmon.cli.history import history_command; history_command()",
                        "--db", str(path), "--since", "1m", "--json", "-m", "power_w"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["gpu"]) == 30 * 8  # committed ticks still in the WAL are seen
    st.write(replace(healthy_sample(), ts=now))  # the writer is not blocked
    assert (path.stat().st_mtime_ns, before[1]) == before
    st.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    r = run("--db", str(path), "--since", "1m")
    assert r.exit_code == 0 and sorted(p.name for p in tmp_path.iterdir()) == files == ["nvmon.db"]


@pytest.mark.parametrize("text,expected", [
    ("90s", NOW - 90), ("10m", NOW - 600), ("2h", NOW - 7200), ("3d", NOW - 3 * 86400), ("1w", NOW - 604800),
    ("1.5h", NOW - 5400), ("1714564800", 1714564800.0), ("1714564800.5", 1714564800.5),
    ("2024-05-01T12:00:00Z", 1714564800.0), ("2024-05-01T12:00", 1714564800.0),
    ("2024-05-01T14:00:00+02:00", 1714564800.0), ("2024-05-01", 1714521600.0),
])
def test_parse_time(text, expected):
    assert parse_time(text, NOW) == expected


def test_help_lists_every_metric():
    from nvmon.store.metrics import METRICS

    r = run("--help")
    assert r.exit_code == 0
    for m in METRICS:
        assert m.name in r.output


def test_docs_describe_every_metric_and_table():
    from pathlib import Path

    from nvmon.store.metrics import METRICS
    from nvmon.store.schema import _V1

    doc = (Path(__file__).parent.parent / "docs" / "store.md").read_text()
    assert [m.name for m in METRICS if f"`{m.name}`" not in doc] == []
    import re

    tables = re.findall(r"CREATE (?:TABLE|VIEW) (\w+)", _V1)
    assert [t for t in tables if f"`{t}`" not in doc] == []


def test_the_table_shows_clocks_in_mhz_and_memory_in_gib_json_keeps_si_units(db):
    """The table view prints each metric in its catalog unit's display form (catalog.display_unit);
    JSON and CSV keep the stored SI values."""
    window = ("--db", db, "--since", str(NOW - 60), "--until", str(NOW), "--gpu", "0",
              "-m", "sm_clock_hz", "-m", "fb_used_bytes", "-m", "mem_clock_hz")
    r = run(*window, "--limit", "1")
    assert r.exit_code == 0, r.output
    assert "sm clk MHz" in r.output and "fb used GiB" in r.output and "mem clk MHz" in r.output
    assert "1980" in r.output and "68.4" in r.output and "2619" in r.output  # 70000 MiB = 68.4 GiB
    assert "1980000000" not in r.output and str(70_000 * 2**20) not in r.output
    rows = json.loads(run(*window, "--json").output)["gpu"]
    assert rows[0]["sm_clock_hz"] == 1_980_000_000 and rows[0]["fb_used_bytes"] == 70_000 * 2**20
    csv_out = run(*window, "--csv").output
    assert "1980000000" in csv_out and str(70_000 * 2**20) in csv_out
