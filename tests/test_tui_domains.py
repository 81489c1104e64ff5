"""The fleet table grouped by NVLink domain (issue 12: nodes whose GPUs report a fabric cluster
UUID, NVL72-class, are grouped by it): `g` cycles rack → NVLink domain → off, the domain step only
when some node reports a domain; each domain's header counts its nodes and those not online."""

from __future__ import annotations

from tuifleet import column_plain, make_app

from nvmon.loadgen.state import simulated_state
from nvmon.tui.widgets.fleet_table import FleetTable

DOM_A = "1a2b3c4d-0000-4000-8000-00000000000a"
DOM_B = "1a2b3c4d-0000-4000-8000-00000000000b"


def table(app) -> FleetTable:
    return app.screen.query_one(FleetTable)


def status(app) -> str:
    from tuifleet import plain

    return plain(app.screen.query_one("#fleet-status"))


async def test_g_groups_by_rack_then_by_nvlink_domain_then_off():
    sim = simulated_state(6, racks=2, faults={0: f"fabric_cluster={DOM_A}:1", 1: f"fabric_cluster={DOM_A}:1",
                                              3: f"fabric_cluster={DOM_B}:2"}, offline=[1])
    assert sim.state.nodes[("sim", "sim-000")].cluster_uuid == DOM_A
    app = make_app(sim)
    async with app.run_test(size=(160, 48)) as pilot:
        t = table(app)
        await pilot.press("g")
        assert t.grouped and t.group_by == "rack" and column_plain(t, "node")[0].startswith("▾ rack-00")
        await pilot.press("g")
        assert t.group_by == "domain" and "by NVLink domain" in status(app)
        nodes = column_plain(t, "node")
        a = nodes.index(next(n for n in nodes if n.startswith(f"▾ NVLink domain {DOM_A}")))
        b = nodes.index(next(n for n in nodes if n.startswith(f"▾ NVLink domain {DOM_B}")))
        none = nodes.index(next(n for n in nodes if n.startswith("▾ (no NVLink domain)")))
        assert nodes[a + 1:a + 3] == ["sim-000", "sim-001"] and nodes[b + 1] == "sim-003"
        assert none > max(a, b) and sorted(nodes[none + 1:]) == ["sim-002", "sim-004", "sim-005"]
        assert "1 down" in nodes[a] and "2 nodes" in nodes[a] and "all up" in nodes[b]  # sim-001 died
        await pilot.press("g")
        assert not t.grouped and column_plain(t, "node") == [f"sim-00{i}" for i in range(6)]


async def test_without_a_domain_g_goes_from_rack_back_to_off():
    app = make_app(simulated_state(3, racks=1))
    async with app.run_test(size=(160, 48)) as pilot:
        t = table(app)
        await pilot.press("g")
        assert t.grouped and t.group_by == "rack"
        await pilot.press("g")
        assert not t.grouped
