"""Alert episodes, acks and silences in the node's SQLite file (schema v2), the migration of a v1
database, and the `nvmon alerts` command on real files."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace

import pytest
from click.testing import CliRunner
from samplefactory import healthy_sample

from nvmon.cli.alerts import alerts_command, parse_duration, parse_matchers
from nvmon.alerts.model import AlertRecord
from nvmon.store import Store, schema
from nvmon.store import alerts as db

T0 = 1_714_564_800.0


def rec(fp: str = "0123456789abcdef", status: str = "firing", **kw) -> AlertRecord:
    base = dict(fingerprint=fp, status=status, code="pcie.width", severity="warning", cluster="c1", node="n1",
                summary="GPU 3 PCIe x8, expected x16", runbook="PCIe x8: reseat the GPU or riser", starts_at=T0,
                rack="r1", gpu=3, value="x8", threshold={"width": 16}, count=7, labels={"team": "gpu"},
                fired_at=T0 + 30 if status != "pending" else None)
    base.update(kw)
    return AlertRecord(**base)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "nvmon.db")
    s.open()
    yield s
    s.close()


def test_a_v1_database_migrates_and_keeps_its_history(tmp_path):
    """A database as nvmon wrote it at schema version 1 (before alerts and the catalog's columns):
    its ticks survive, it gains the alert tables and the new metric columns."""
    path = tmp_path / "old.db"
    con = sqlite3.connect(path, isolation_level=None)
    for statement in schema._statements(schema._V1):
        con.execute(statement)
    con.execute(f"PRAGMA application_id = {schema.APPLICATION_ID}")
    con.execute("PRAGMA user_version = 1")
    for i in range(5):
        ts_ms = int((T0 + i) * 1000)
        con.execute("INSERT INTO ticks (ts_ms, interval_s, nvml_available, gpus, gpus_lost) VALUES (?, 1.0, 1, 8, 0)",
                    (ts_ms,))
        for g in range(8):
            con.execute("INSERT INTO gpu_ticks (ts_ms, gpu, lost, power_w) VALUES (?, ?, 0, 500.0)", (ts_ms, g))
    assert not db.has_alert_tables(con)
    con.close()
    with Store(path) as new:
        assert new.schema_version == schema.SCHEMA_VERSION
        assert new.query("SELECT count(*) AS n FROM ticks")[0]["n"] == 5
        assert new.query("SELECT count(*) AS n FROM gpu_ticks")[0]["n"] == 40
        new.write_many([replace(healthy_sample(), ts=T0 + 10)])  # and the current writer's columns exist
        assert new.query("SELECT count(*) AS n FROM gpu_ticks")[0]["n"] == 48
        new.save_alerts([rec()], T0 + 40)
        assert [r.fingerprint for r in new.load_alerts()] == ["0123456789abcdef"]
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()


def test_episodes_round_trip_and_update_in_place(store):
    r = rec()
    store.save_alerts([r], T0 + 31)
    assert store.load_alerts() == [r]
    later = replace(r, count=90, value="x4")
    store.save_alerts([later], T0 + 60)
    assert store.load_alerts() == [later]
    done = later.with_status("resolved", T0 + 100)
    store.save_alerts([done], T0 + 100)
    assert store.load_alerts() == []  # only active ones come back to an engine
    [kept] = store.transact(lambda conn: db.load(conn))
    assert kept == done and kept.ends_at == T0 + 100
    again = rec(starts_at=T0 + 500, fired_at=T0 + 530)  # a new episode of the same alert
    store.save_alerts([again], T0 + 530)
    assert [(x.starts_at, x.status) for x in store.transact(lambda conn: db.load(conn))] == [
        (T0 + 500, "firing"), (T0, "resolved")]


def test_a_pending_alert_that_never_fired_is_deleted_when_it_clears(store):
    p = rec(status="pending")
    store.save_alerts([p], T0 + 1)
    assert store.load_alerts() == [p]
    store.save_alerts([p.with_status("resolved", T0 + 5)], T0 + 5)
    assert store.transact(lambda conn: db.load(conn)) == []


def test_acks_and_silences_reach_the_engine_and_old_ones_are_pruned(store):
    r = rec()
    store.save_alerts([r], T0 + 31)
    store.transact(lambda conn: db.ack(conn, r, T0 + 40, "alice"))
    sid = store.transact(lambda conn: db.add_silence(conn, {"node": "n1"}, T0, T0 + 3600, "bob", "maintenance"))
    acks, silences = store.alert_controls(T0 + 50)
    assert acks == {(r.fingerprint, round(T0 * 1000)): T0 + 40}
    assert [(s.id, dict(s.matchers), s.created_by, s.comment) for s in silences] == [(sid, {"node": "n1"}, "bob",
                                                                                     "maintenance")]
    assert store.load_alerts()[0].acked_at == T0 + 40
    assert store.alert_controls(T0 + 3600)[1] == []  # ended
    store.save_alerts([r.with_status("resolved", T0 + 100)], T0 + 100)
    assert store.alert_controls(T0 + 200)[0] == {}  # acks of resolved episodes do not apply
    store.maintain(T0 + 100 + 8 * 86400)  # past the 7-day retention
    assert store.query("SELECT count(*) AS n FROM alerts")[0]["n"] == 0
    assert store.query("SELECT count(*) AS n FROM alert_acks")[0]["n"] == 0
    assert store.query("SELECT count(*) AS n FROM silences")[0]["n"] == 0


# -- nvmon alerts ---------------------------------------------------------------------------------


def cli(*args: str):
    return CliRunner().invoke(alerts_command, list(args))


def test_alerts_json_lists_the_contract_objects(tmp_path, store):
    store.save_alerts([rec(), rec("fedcba9876543210", code="gpu.lost", severity="critical", gpu=6,
                                  status="resolved", ends_at=T0 + 60)], T0 + 60)
    store.close()
    r = cli("--db", str(store.path), "--json", "--all")
    assert r.exit_code == 0, r.output
    items = json.loads(r.stdout)
    assert sorted(i["fingerprint"] for i in items) == ["0123456789abcdef", "fedcba9876543210"]
    first = next(i for i in items if i["fingerprint"] == "0123456789abcdef")
    assert set(first) >= {"fingerprint", "status", "code", "severity", "cluster", "rack", "node", "gpu", "link",
                          "device", "port", "summary", "runbook", "value", "threshold", "starts_at", "ends_at",
                          "count"}
    assert first["starts_at"] == "2024-05-01T12:00:00.000Z" and first["threshold"] == {"width": 16}
    assert first["acked_at"] is None and first["silenced"] is False


def test_alerts_table_fits_80_columns_and_shows_hostile_text_literally(tmp_path, store, monkeypatch):
    store.save_alerts([rec(summary="GPU 3 \x1b[31mred\x1b[0m [bold]x[/bold] " + "y" * 200, device="mlx5_\x07")],
                      T0 + 60)
    store.close()
    r = CliRunner().invoke(alerts_command, ["--db", str(store.path)], terminal_width=80)  # piped: not cut
    assert r.exit_code == 0 and "y" * 200 in r.stdout and "…" not in r.stdout, r.output
    for module in ("nvmon.cli.common", "nvmon.cli.alerts"):  # as on an 80-column terminal
        monkeypatch.setattr(f"{module}.on_terminal", lambda: True)
    r = CliRunner().invoke(alerts_command, ["--db", str(store.path)], terminal_width=80, env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout and "[bold]x[/bold]" in r.stdout
    assert all(len(line) <= 80 for line in r.stdout.splitlines())
    assert "firing" in r.stdout and "pcie.width" in r.stdout


def test_ack_by_prefix_and_silence_then_list(store):
    store.save_alerts([rec(), rec("0123ffff00000000", gpu=4)], T0 + 60)
    store.close()
    path = str(store.path)
    r = cli("ack", "0123", "--db", path)
    assert r.exit_code == 1 and "2 active alerts start with 0123" in r.stderr
    r = cli("ack", "012345", "--db", path, "--by", "alice")
    assert r.exit_code == 0 and "acked 0123456789abcdef" in r.stdout
    r = cli("--db", path, "silence", "--match", "node=n1", "--match", "code=pcie.*", "--for", "2h")
    assert r.exit_code == 0 and "silence 1 until" in r.stdout, r.output
    r = cli("silences", "--db", path)
    assert "code=pcie.* node=n1" in r.stdout
    items = json.loads(cli("--db", path, "--json").stdout)
    assert {i["fingerprint"]: (i["acked_at"] is not None, i["silenced"]) for i in items} == {
        "0123456789abcdef": (True, True), "0123ffff00000000": (False, True)}
    assert cli("unsilence", "1", "--db", path).exit_code == 0
    assert cli("unsilence", "1", "--db", path).exit_code == 1


@pytest.mark.parametrize("args,code", [
    (["ack", "xyz"], 2),
    (["ack", "abcdef12"], 1),  # well formed, not there: not a usage error
    (["silence", "--match", "node", "--for", "1h"], 2),
    (["silence", "--match", "no de=x", "--for", "1h"], 2),
    (["silence", "--match", "node=x", "--for", "soon"], 2),
])
def test_bad_input_is_one_line(store, args, code):
    """Bad usage: exit 2 and `<command>: <message>`; could not do it: exit 1 and `nvmon: <message>`
    (nvmon/cli/common.py)."""
    store.close()
    r = cli(*args, "--db", str(store.path))
    prefix = f"alerts {args[0]}: " if code == 2 else "nvmon: "
    assert r.exit_code == code and r.stderr.count("\n") == 1 and r.stderr.startswith(prefix), r.output


def test_missing_database_is_one_line(tmp_path):
    for args in (["--db", str(tmp_path / "none.db")], ["ack", "abcd", "--db", str(tmp_path / "none.db")]):
        r = cli(*args)
        assert r.exit_code == 1 and r.stderr == f"nvmon: database {tmp_path / 'none.db'}: not found\n"
    assert not (tmp_path / "none.db").exists()


def test_duration_and_matcher_parsing():
    assert parse_duration("2h") == 7200 and parse_duration("90s") == 90 and parse_duration("1.5d") == 129600
    assert parse_matchers(("node=gpu-07", "gpu=3", "team=ml")) == {"node": "gpu-07", "gpu": "3", "team": "ml"}
    for bad in ("0h", "-1h", "2 hours"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_others_wrote_tells_a_silence_from_another_process_and_ignores_our_own_writes(store, tmp_path):
    """The daemon re-reads acks and silences only when another connection committed (PRAGMA
    data_version), so its own tick writes must not count and `nvmon alerts` writes must."""
    t = 1_700_000_000.0
    store.write_many([replace(healthy_sample(), ts=t)])
    store.alert_controls(t)
    assert not store.others_wrote
    for i in range(1, 4):  # our own ticks and alert saves
        store.write_many([replace(healthy_sample(), ts=t + i)])
        store.save_alerts([rec()], t + i)
    assert not store.others_wrote
    other = Store(tmp_path / "nvmon.db")  # what `nvmon alerts silence` does
    other.transact(lambda conn: db.add_silence(conn, {"node": "n1"}, t, t + 3600, "bob", "maintenance"))
    other.close()
    assert not store.others_wrote  # noticed at our next write
    store.write_many([replace(healthy_sample(), ts=t + 5)])
    assert store.others_wrote
    acks, silences = store.alert_controls(t + 5)
    assert not store.others_wrote and [s.matchers for s in silences] == [{"node": "n1"}]
