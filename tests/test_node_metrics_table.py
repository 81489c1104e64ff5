"""The TUI node screen's "Clocks and memory" table is driven by the catalog: every per-GPU metric
the sample carries and every static one the inventory carries, with no TUI code per metric."""

from __future__ import annotations

import io

from rich.console import Console

from nvmon.catalog import GPU_WIRE_FACTS, GPU_WIRE_READ
from nvmon.tui.node_render import metrics_table
from tuifleet import shared_showcase


def text(renderable) -> str:
    console = Console(width=200, file=io.StringIO(), color_system=None, record=True)
    console.print(renderable)
    return console.export_text()


def test_every_wire_metric_and_inventory_fact_has_a_column():
    sim = shared_showcase()
    view = next(v for v in sim.state.nodes.values() if v.tick is not None and v.inventory is not None)
    out = text(metrics_table(view))
    header = next(line for line in out.splitlines() if line.lstrip().startswith("GPU"))
    for m in GPU_WIRE_READ:
        assert m.label in header, m.name
    for m in GPU_WIRE_FACTS:
        if any(m.name in g.facts for g in view.inventory.gpus):
            assert m.label in header, m.name
    # the clocks in MHz, the framebuffer in GiB, each from its catalog `fmt`
    assert "2619 MHz" in out and "GiB" in out and "1980 MHz" in out


def test_a_node_without_an_inventory_shows_the_sampled_columns_only():
    from dataclasses import replace

    sim = shared_showcase()
    view = next(v for v in sim.state.nodes.values() if v.tick is not None)
    out = text(metrics_table(replace(view, inventory=None)))
    assert "sm clk" in out and "fb total" not in out and "sm max" not in out
