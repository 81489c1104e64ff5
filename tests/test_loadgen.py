"""The load generator's board pool: patched payloads read back as the real builder's, nodes get
their own identities, and persistent findings become alerts."""

from __future__ import annotations

import dataclasses
import json

import pytest

from nvmon.loadgen.boards import ALERT_HOLD, Board, NodeIdentity, node_sample
from nvmon.loadgen.fleet import fault_spec, node_names
from nvmon.sim.scenario import SimSpecError
from nvmon.wire.contract import topic
from nvmon.audit import audit
from nvmon.wire.payloads import layout_id, parse_message, sample_payload

T0 = 1_700_000_000.0
WHO = NodeIdentity("c1", "sim-007", "rack-01", {"sim": "x"})


@pytest.fixture(scope="module")
def board():
    b = Board("hgx-h100,nvlink_down=2.5", interval_s=1.0, clock_start=T0)
    yield b
    b.close()


def test_patched_payload_reads_back_as_the_builders(board):
    _, layout = board.inventory_for(WHO)
    payload = board.payload_for(layout, T0 + 0.25)
    assert board._parts[1] is not None, "sample_payload's header changed: the fast path is off"
    got = parse_message(topic("c1", WHO.name, "sample"), payload)
    findings = audit(board.sample, board.node_spec).findings
    want = parse_message(topic("c1", WHO.name, "sample"), sample_payload(board.sample, findings))
    assert [(f.code, f.gpu, f.link) for f in got.findings] == [("nvlink.link_down", 2, 5)]  # the node's audit
    assert got.ts == T0 + 0.25 and got.layout == layout != want.layout
    assert dataclasses.replace(got, ts=want.ts, layout=want.layout) == want


def test_fallback_reencodes_when_the_header_is_unknown(board, monkeypatch):
    monkeypatch.setattr(board, "_parts", (b"null", None, json.loads(sample_payload(board.sample))))
    d = parse_message(topic("c1", "n", "sample"), board.payload_for("abcdef01", T0))
    assert d.layout == "abcdef01" and d.ts == T0 and len(d.gpus) == 8


def test_nodes_have_their_own_identities(board):
    a = node_sample(board.sample, WHO)
    b = node_sample(board.sample, dataclasses.replace(WHO, name="sim-008"))
    assert a.node == "sim-007" and a.host.hostname == "sim-007"
    assert {g.uuid for g in a.gpus}.isdisjoint(g.uuid for g in b.gpus)
    assert a.gpus[0].uuid == node_sample(board.sample, WHO).gpus[0].uuid  # stable
    assert layout_id(a) != layout_id(b)
    inv = parse_message(topic("c1", "sim-007", "inventory"), board.inventory_for(WHO)[0])
    assert (inv.rack, inv.labels, inv.hostname) == ("rack-01", {"sim": "x"}, "sim-007")


def test_persistent_findings_become_alerts(board):
    for k in range(ALERT_HOLD):
        board.tick(T0 + 1 + k)
    alerts = parse_message(topic("c1", "n", "alerts"), board.alerts)
    assert {a.code for a in alerts.alerts} == {"nvlink.link_down"}
    assert alerts.alerts[0].gpu == 2 and alerts.alerts[0].link == 5


def test_fault_specs_and_names():
    assert fault_spec("hgx-h100", "nvlink_down=2.5") == "hgx-h100,nvlink_down=2.5"
    assert fault_spec("hgx-h100", "pairs-a100,ib_down=0") == "pairs-a100,ib_down=0"
    with pytest.raises(SimSpecError):
        fault_spec("hgx-h100", "nvlink_down=99.1")
    assert node_names("sim", 3) == ["sim-000", "sim-001", "sim-002"]
    assert node_names("n", 20_000)[-1] == "n-19999"
