"""`nvmon alerts silence --match KEY=GLOB` through the real CLI (issue 15): a key that is neither an
alert field nor a label known here is refused in one line (a silence matching nothing is a trap);
`label.NAME` is always a label; `silences --broker` works without --cluster, as `ack --broker` does."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest
from mqtt_broker import Broker, needs_mosquitto
from test_alerts_store import T0, rec

from nvmon.store import Store


def nvmon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvmon", *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def db(tmp_path):
    s = Store(tmp_path / "nvmon.db")
    s.open()
    s.save_alerts([rec()], T0 + 60)  # labels {"team": "gpu"}
    s.close()
    return s.path


def silences(path) -> list[str]:
    con = sqlite3.connect(path)
    try:
        return [r[0] for r in con.execute("SELECT matchers FROM silences ORDER BY id")]
    finally:
        con.close()


def test_a_misspelt_key_is_one_line_and_writes_nothing(db):
    r = nvmon("alerts", "--db", str(db), "silence", "--match", "nod=gpu-01", "--for", "1h")
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""  # bad usage
    assert r.stderr.splitlines() == [
        "nvmon alerts silence: --match nod=…: unknown key (did you mean node?); use a field (fingerprint, code, severity, status, "
        "cluster, rack, node, gpu, link, device, port), a label (labels seen here: team), or label.nod=… for a "
        "label not seen yet"]
    assert silences(db) == []


def test_fields_known_labels_and_label_prefix_are_accepted(db):
    r = nvmon("alerts", "--db", str(db), "silence", "--match", "node=gpu-01", "--match", "team=gpu", "--for", "1h")
    assert r.returncode == 0, r.stderr
    r = nvmon("alerts", "--db", str(db), "silence", "--match", "label.owner=ml", "--for", "1h")
    assert r.returncode == 0, r.stderr
    assert [m.replace(" ", "") for m in silences(db)] == ['{"node":"gpu-01","team":"gpu"}', '{"owner":"ml"}']
    r = nvmon("alerts", "--db", str(db), "silences")
    assert "owner=ml" in r.stdout and "node=gpu-01 team=gpu" in r.stdout


def test_labels_from_the_config_count_as_known(db, tmp_path):
    cfg = tmp_path / "n.toml"
    cfg.write_text('[node]\ncluster = "c1"\nlabels = { owner = "ml" }\n[mqtt]\nbroker = ""\n')
    r = nvmon("alerts", "--db", str(db), "silence", "--match", "owner=ml", "--for", "1h", "--config", str(cfg))
    assert r.returncode == 0, r.stderr


@needs_mosquitto
def test_silences_list_every_cluster_without_cluster(tmp_path):
    with Broker(tmp_path) as b:
        for c in ("c1", "c2"):
            r = nvmon("alerts", "--db", str(tmp_path / "none.db"), "silence", "--match", "label.owner=ml",
                      "--for", "1h", "--broker", b.url, "--cluster", c, "--all-nodes")  # no node=: every node
            assert r.returncode == 0, r.stderr
        r = nvmon("alerts", "--db", str(tmp_path / "none.db"), "silences", "--broker", b.url)
        assert r.returncode == 0, r.stderr
        lines = [ln for ln in r.stdout.splitlines() if "owner=ml" in ln]
        assert len(lines) == 2 and any("c1/" in ln for ln in lines) and any("c2/" in ln for ln in lines), r.stdout
