"""The node's NVLink domain (issue 12, item 1): clique id and cluster UUID as the GPUs' fabric
reports them, from the simulator through the real pynvml, in `nvmon sample` (text and JSON), on the
wire's inventory with its validating reader, and in the fleet state, where a view can group nodes
of one NVL72-class domain by its cluster UUID."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from rich.console import Console

from nvmon.audit import fabric_domain
from nvmon.fleet.state import FleetState
from nvmon.render import render_sample
from simboard import first_sample
from nvmon.sim.scenario import SimSpecError, parse_scenario
from nvmon.wire.contract import WireError, topic
from nvmon.wire.parse import parse_message
from nvmon.wire.payloads import inventory_payload, status_payload

UUID = "1b2c3d4e-0000-4000-8000-00000000abcd"
ZERO = "00000000-0000-0000-0000-000000000000"
T0 = 1_700_000_000.0


def inventory_of(s, node: str = "n1") -> dict:
    return json.loads(inventory_payload(dataclasses.replace(s, node=node), cluster="c1"))


@pytest.mark.parametrize("spec, uuid, clique, multi", [
    (f"hgx-b200,fabric_cluster={UUID.upper()}:7", UUID, 7, True),
    (f"hgx-h100,fabric_cluster={UUID}", UUID, 1, True),
    ("hgx-h100", ZERO, 0, False),  # an HGX board: its own domain, the zero UUID (real captures)
    ("pcie-l40s", None, None, False),  # no fabric: nothing reported
])
def test_the_domain_from_the_simulated_fabric_to_the_inventory_and_back(spec, uuid, clique, multi):
    s = first_sample(spec, "n1")
    d = fabric_domain(s)
    assert (d.cluster_uuid, d.clique_id, d.multi_node) == (uuid, clique, multi)
    inv = inventory_of(s)
    assert inv["fabric"] == (None if uuid is None else {"cluster_uuid": uuid, "clique_id": clique})
    got = parse_message(topic("c1", "n1", "inventory"), json.dumps(inv).encode())
    assert (got.fabric_cluster_uuid, got.fabric_clique_id) == (uuid, clique)
    assert got.cluster_uuid == (uuid if multi else None)  # what a view groups by


@pytest.mark.parametrize("fabric, error", [
    ({"cluster_uuid": "not-a-uuid", "clique_id": 1}, "fabric.cluster_uuid: expected a UUID"),
    ({"cluster_uuid": "\x1b[31m" + "0" * 32, "clique_id": 1}, "fabric.cluster_uuid"),
    ({"cluster_uuid": UUID, "clique_id": -1}, "fabric.clique_id"),
    ({"cluster_uuid": UUID, "clique_id": 2**32}, "fabric.clique_id"),
    ({"cluster_uuid": UUID, "clique_id": True}, "fabric.clique_id"),
    ({"cluster_uuid": 7}, "fabric.cluster_uuid"),
    ([UUID], "fabric"),
    (0, "fabric"),
])
def test_the_reader_refuses_a_bad_domain(fabric, error):
    inv = inventory_of(first_sample("hgx-h100", "n1"))
    inv["fabric"] = fabric
    with pytest.raises(WireError, match=error.replace("[", r"\[")):
        parse_message(topic("c1", "n1", "inventory"), json.dumps(inv).encode())


def test_an_inventory_without_the_block_still_reads():  # from a daemon older than the field
    inv = inventory_of(first_sample("hgx-h100", "n1"))
    del inv["fabric"]
    got = parse_message(topic("c1", "n1", "inventory"), json.dumps(inv).encode())
    assert (got.fabric_cluster_uuid, got.fabric_clique_id, got.cluster_uuid) == (None, None, None)


def test_the_fleet_state_groups_nodes_by_cluster_uuid():
    other = "0f0e0d0c-1111-4222-8333-444455556666"
    boards = {"a1": f"hgx-b200,fabric_cluster={UUID}:1", "a2": f"hgx-b200,fabric_cluster={UUID}:2",
              "b1": f"hgx-b200,fabric_cluster={other}:1", "h1": "hgx-h100", "l1": "pcie-l40s"}
    state = FleetState()
    for node, spec in boards.items():
        assert state.apply(topic("c1", node, "status"), status_payload("online", version="1", interval_s=1.0,
                                                                        ts=T0), T0)
        assert state.apply(topic("c1", node, "inventory"), inventory_payload(
            dataclasses.replace(first_sample(spec, "n1"), node=node), cluster="c1"), T0)
    groups: dict = {}
    for (_, node), view in sorted(state.nodes.items()):
        groups.setdefault(view.cluster_uuid, []).append(node)
    assert groups == {UUID: ["a1", "a2"], other: ["b1"], None: ["h1", "l1"]}
    assert state.nodes[("c1", "a2")].inventory.fabric_clique_id == 2


def test_nvmon_sample_shows_the_domain_in_text_and_json():
    s = first_sample(f"hgx-b200,fabric_cluster={UUID}:7", "n1")
    console = Console(width=80, record=True, file=open("/dev/null", "w"))
    console.print(render_sample(s))
    assert f"NVLink domain: cluster {UUID}, clique 7" in console.export_text()
    console = Console(width=80, record=True, file=open("/dev/null", "w"))
    console.print(render_sample(first_sample("hgx-h100", "n1")))
    assert "NVLink domain: this board (cluster UUID zero, clique 0)" in console.export_text()
    r = subprocess.run([sys.executable, "-m", "nvmon", "sample", "--json", "--interval", "0.1", "--sim",
                        f"hgx-h200,fabric_cluster={UUID}:3"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert {(g["fabric"]["cluster_uuid"], g["fabric"]["clique_id"]) for g in json.loads(r.stdout)["gpus"]} == {
        (UUID, 3)}


@pytest.mark.parametrize("spec, error", [
    ("hgx-h100,fabric_cluster=xyz", "fabric_cluster takes a UUID"),
    (f"hgx-h100,fabric_cluster={UUID}:x", "clique id must be a number"),
    (f"hgx-h100,fabric_cluster={UUID}:4294967296", "below 2^32"),
    (f"pcie-l40s,fabric_cluster={UUID}", "pcie-l40s has no GPU fabric"),
])
def test_sim_spec_errors(spec, error):
    with pytest.raises(SimSpecError, match=error.replace("^", r"\^")):
        parse_scenario(spec)
