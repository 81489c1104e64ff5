"""Time to render and to update the TUI's fleet screen with N nodes (default 1,000), headless.

Builds a simulated fleet of N nodes (`nvmon.loadgen.state`, no broker), opens the app at
160×48 under Textual's test driver, and measures:

- first draw: the fleet table's first `sync` (all N rows) plus painting its visible lines;
- update: every node receives a new tick whose values differ (two boards alternate), then one
  redraw (`sync`: marks changed rows, re-judges sort and filter) plus painting the visible lines
  (only changed rows are rebuilt); median and worst of `--rounds` rounds. This is the timer's
  work once a second when the whole fleet ticks at 1 Hz. Textual's compositor then copies the
  lines to the terminal, a cost that does not grow with N;
- idle redraw: a redraw with nothing changed (the common case between ticks of a quiet fleet).

Applying the messages (the subscriber's work, measured by bench/fleet_scale.py) is not counted.
Target (issue 5): ≤ 50 ms to render the fleet screen with 1,000 rows.

    .venv/bin/python bench/tui_render.py [--nodes 1000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import statistics
import time

from nvmon.loadgen.boards import Board
from nvmon.loadgen.state import T0, simulated_state
from nvmon.tui.app import NvmonApp
from nvmon.tui.widgets.fleet_table import FleetTable
from nvmon.wire.contract import topic


def paint_lines(table: FleetTable) -> None:
    """What a frame asks of the table: every visible line (rows not yet drawn are built here)."""
    for y in range(table.size.height):
        table.render_line(y)


async def measure(nodes: int, rounds: int) -> dict:
    t = time.perf_counter()
    sim = simulated_state(nodes, racks=max(1, nodes // 20), ticks=2, faults={3: "pcie_width=3:8"})
    build_s = time.perf_counter() - t
    clock = [sim.now]
    app = NvmonApp(None, state=sim.state, clock=lambda: clock[0], source="bench", refresh_s=3600)
    boards = [Board(f"hgx-h100,seed={k}", interval_s=1.0, clock_start=T0) for k in (11, 12)]
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause()
            table = app.screen.query_one(FleetTable)
            # first draw, from scratch: forget everything the table drew at mount
            table._version = -1
            for d in (table._segs, table._strips, table._sortval, table._group):
                d.clear()
            table._visible.clear()
            gc.collect()
            t = time.perf_counter()
            table.sync(clock[0])
            sync_first = time.perf_counter() - t
            paint_lines(table)
            first = time.perf_counter() - t
            await pilot.pause()
            assert table.row_count == nodes, table.row_count

            keys = list(sim.state.nodes)
            layouts = {k: sim.state.nodes[k].inventory.layout for k in keys}
            updates, syncs, drawn = [], [], []
            for r in range(rounds):
                clock[0] += 1.0
                for b in boards:
                    b.tick(clock[0])
                for i, k in enumerate(keys):
                    b = boards[(i + r) % 2]
                    sim.state.apply(topic(k[0], k[1], "sample"), b.payload_for(layouts[k], clock[0]), clock[0])
                gc.collect()  # the messages' garbage is the subscriber's cost, not the redraw's
                t = time.perf_counter()
                drawn.append(table.sync(clock[0]))
                syncs.append(time.perf_counter() - t)
                paint_lines(table)
                updates.append(time.perf_counter() - t)
                await pilot.pause()
            t = time.perf_counter()
            idle_drawn = table.sync(clock[0])
            idle = time.perf_counter() - t
    finally:
        for b in boards:
            b.close()
    return {"nodes": nodes, "build_s": build_s, "first_ms": first * 1e3, "first_sync_ms": sync_first * 1e3,
            "update_median_ms": statistics.median(updates) * 1e3, "update_max_ms": max(updates) * 1e3,
            "sync_median_ms": statistics.median(syncs) * 1e3, "rows_redrawn": statistics.median(drawn),
            "idle_ms": idle * 1e3, "idle_drawn": idle_drawn}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    r = asyncio.run(measure(args.nodes, args.rounds))
    print(f"tui_render: {r['nodes']} nodes on {platform.python_implementation()} {platform.python_version()}, "
          f"{platform.machine()} (fleet built in {r['build_s']:.1f} s)")
    print(f"  first draw of the fleet screen ({r['nodes']} rows): {r['first_ms']:.1f} ms "
          f"(table sync {r['first_sync_ms']:.1f} ms + painting the visible lines)")
    print(f"  update after every node ticked: median {r['update_median_ms']:.1f} ms, worst {r['update_max_ms']:.1f} ms "
          f"(sync {r['sync_median_ms']:.1f} ms for {r['rows_redrawn']:.0f} changed rows + painting)")
    print(f"  redraw with nothing changed: {r['idle_ms']:.2f} ms ({r['idle_drawn']} rows)")
    ok = r["update_median_ms"] <= 50 and r["first_ms"] <= 50
    print(f"  target ≤ 50 ms: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
