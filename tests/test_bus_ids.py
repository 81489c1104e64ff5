"""Bus ids in one form wherever nvmon shows them (issue 15, output details: "bus ids in two formats
side by side"): NVML's `00000000:18:00.0` and sysfs' `0000:18:00.0` are both shown as
`0000:18:00.0`, as lspci and sysfs write them (nvmon.model.short_bus_id, the one place). The data
(sample JSON, wire, dcgm-exporter labels) keeps each source's own form (docs/sample-schema.md)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from test_tui_80cols import screen_text
from tuifleet import make_app

from nvmon.loadgen.state import simulated_state
from nvmon.model import short_bus_id
from nvmon.tui.widgets.fleet_table import FleetTable

SHORT = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
ANY_BUS_ID = re.compile(r"\b[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]\b")


@pytest.mark.parametrize("given, shown", [
    ("00000000:18:00.0", "0000:18:00.0"),  # NVML
    ("00000000:C1:00.0", "0000:c1:00.0"),
    ("0000:c1:00.0", "0000:c1:00.0"),  # sysfs, unchanged
    ("00000001:9A:1F.7", "0001:9a:1f.7"),
    ("00010000:18:00.0", "10000:18:00.0"),  # a domain past 16 bits keeps its digits
    ("FFFFFFFF:FF:FF.0", "ffffffff:ff:ff.0"),
    ("not a bus id", "not a bus id"),
    (None, None),
    ("", ""),
])
def test_short_bus_id(given, shown):
    assert short_bus_id(given) == shown


async def test_node_screen_pcie_table_one_form():
    """GPUs (NVML's form on the wire), HCAs and NVSwitches (sysfs') side by side, all short."""
    sim = simulated_state(1)
    app = make_app(sim)
    async with app.run_test(size=(160, 200)) as pilot:
        app.screen.query_one(FleetTable).move_cursor(0)
        await pilot.press("enter")
        await pilot.pause()
        lines = screen_text(app)
        head = next(i for i, line in enumerate(lines) if line.split()[:3] == ["device", "bus", "id"])
        rows = [line.split() for line in lines[head + 2:head + 30] if line.strip()]
        ids = {r[0] if r[0] != "HCA" else f"HCA {r[1]}": next(w for w in r if ANY_BUS_ID.fullmatch(w))
               for r in rows if any(ANY_BUS_ID.fullmatch(w) for w in r)}
    assert ids["GPU0"] == "0000:18:00.0", ids  # NVML said 00000000:18:00.0
    assert any(k.startswith("HCA") for k in ids) and any(k.startswith("NVSwitch") for k in ids), ids
    assert all(SHORT.match(v) for v in ids.values()), ids


def test_sample_text_shows_the_short_form():
    r = subprocess.run([sys.executable, "-m", "nvmon", "sample", "--sim", "hgx-h100", "--interval", "0.1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    shown = ANY_BUS_ID.findall(r.stdout)
    assert shown and all(SHORT.match(b) for b in shown), shown
