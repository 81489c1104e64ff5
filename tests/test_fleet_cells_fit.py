"""Fleet cells abbreviate rather than cut (issue 15, TUI: the 80-column fleet screen): a node with
several faults in one column (an IB port down beside one at 100G and one in Ethernet mode, PCIe
short in both generation and width, NVLink pairs with rising errors, a link down with rising
errors), a node stale or lost for over 100 minutes, 3 alert severities, 10 kW capped... each cell fits its
column whole, still naming what matters, with no `…`. Through simulated nodes (the real sampler,
audit, wire and fleet state) on the Pilot-driven app at 80×24, plus the cells of views with
bigger numbers than a simulated board reaches."""

from __future__ import annotations

from dataclasses import replace

from rich.cells import cell_len
from test_tui_80cols import row_of, screen_text
from tuifleet import make_app

from nvmon.loadgen.state import simulated_state
from nvmon.tui.rows import COLUMNS, WIDTH, c_alerts, c_gpus, c_power, c_status, c_temp, row_segments
from nvmon.tui.widgets.fleet_table import FleetTable

FAULTS = {
    1: "ib_down=mlx5_0,ib_rate=mlx5_1:100,ib_eth=mlx5_2",
    2: "pcie_gen=4:3,pcie_width=4:8",
    3: "pairs-a100,nvlink_errors=0.1",
    4: "nvlink_down=2.5,nvlink_errors=1.1",
    5: "power_cap=0,power_cap=1,power_cap=2,power_cap=3,power_cap=4,power_cap=5,power_cap=6,power_cap=7",
}
LOST = 6


def plain(cells) -> str:
    return "".join(t for t, _ in cells)


def assert_fits(cells_by_column: dict[str, str]) -> None:
    for key, text in cells_by_column.items():
        if key not in ("node", "rack"):  # names, cut with … when longer than their column
            assert cell_len(text) <= WIDTH[key] and "…" not in text, (key, text)


async def test_several_faults_in_one_cell_abbreviate_at_80x24():
    sim = simulated_state(7, faults=FAULTS, offline=(LOST,))
    late = sim.now + 6500  # the lost node: "lost ≤108m", one character over its column in full
    app = make_app(sim)
    app.clock = lambda: late
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        table = app.screen.query_one(FleetTable)
        table.sync(late)
        await pilot.pause()
        rows = {table.row_cells(i)["node"]: table.row_cells(i) for i in range(table.row_count)}
        for cells in rows.values():
            assert_fits(cells)
        n = sim.names
        assert rows[n[1]]["ib"] == "✗6/8 100G", rows[n[1]]  # +1eth left out: 6/8 says two are not IB ports up
        assert rows[n[2]]["pcie"] == "⚠Gen3x8 G4", rows[n[2]]  # was "⚠ Gen3 x8 G…"
        assert rows[n[3]]["links"].startswith("⚠pairs ⚠"), rows[n[3]]  # the rate too, without its /s
        assert rows[n[4]]["links"] == "✗ 143/144⚠", rows[n[4]]  # the down link, and errors rising (a bare ⚠)
        assert rows[n[5]]["power"].startswith("⚠cap8"), rows[n[5]]
        assert "lost" in rows[n[LOST]]["status"] and "108m" in rows[n[LOST]]["status"], rows[n[LOST]]
        lines = screen_text(app)
        assert all(len(line) <= 80 for line in lines)
        assert rows[n[1]]["ib"] in row_of(lines, n[1])  # on screen, no scrolling


def test_big_numbers_abbreviate():
    sim = simulated_state(2, faults={1: "power_cap=4:350,thermal=6,gpu_lost=2"})
    view = sim.state.nodes[(sim.cluster, sim.names[1])]
    live = view.liveness(sim.now)
    s = view.summary
    assert s.marks.get("power") and s.marks.get("temp")  # the node's findings mark these columns

    big = replace(view, summary=replace(s, power_w=12_345.0, power_capped=12, hottest_c=102.0, hottest_gpu=12,
                                        gpu_model="NVIDIA H200 141GB HBM3e", gpu_count=16, gpus_lost=1))
    assert plain(c_power(big, live)) == "⚠cap12 12"
    assert plain(c_temp(big, live)) == "⚠102°G12"
    assert plain(c_gpus(big, live)) == "✗ 15/16×H200"
    healthy = replace(view, summary=replace(s, power_w=10_400.0, power_limit_w=11_200.0, marks={}))
    assert plain(c_power(healthy, live)) == "10.4/11.2"  # fits whole

    one = view.alerts.alerts[0]
    many = [replace(one, severity=sev) for sev, k in (("critical", 12), ("warning", 30), ("info", 1)) for _ in range(k)]
    crowded = replace(view, alerts=replace(view.alerts, alerts=tuple(many)))
    assert plain(c_alerts(crowded, live)) == "✗12 ⚠30"  # info dropped: the alerts screen lists it
    three = replace(view, alerts=replace(view.alerts, alerts=tuple(many[:1] + many[12:13] + many[-1:])))
    assert plain(c_alerts(three, live)) == "✗1⚠1ℹ1"

    stale = replace(live, state="stale", age_s=7000.0)
    assert plain(c_status(view, stale)) == "⚠stale 116m"
    lost = replace(live, state="offline", reason="lost", age_s=7000.0, exact=False)  # a will found retained
    assert plain(c_status(view, lost)) == "✗lost ≤116m"
    for cells in (row_segments(big, live), row_segments(crowded, live)):
        assert_fits({c.key: plain(x) for c, x in zip(COLUMNS, cells)})
