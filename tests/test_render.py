"""Terminal rendering: readable without colour, None as "-", hardware strings shown literally."""

from __future__ import annotations

import io
from dataclasses import replace

from rich.console import Console

from nvmon.audit import AuditReport, Finding, audit
from nvmon.model import NvmlStatus
from nvmon.render import markup_safe, pcie_cell, plain, render_audit, render_sample
from nvmon.specs import NodeSpec
from samplefactory import H100_PCIE, healthy_sample, with_gpu, with_ib, with_link, with_pcie

HOSTILE = "Evil [bold]GPU[/bold] \x1b[31mred\x1b[0m [link=http://x]y[/link]"


def text_of(renderable, width: int = 160, color: bool = False) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), force_terminal=color,
                      color_system="truecolor" if color else None)
    console.print(renderable)
    return console.export_text()


def rows(text: str, first_cell: str) -> list[str]:
    return [line for line in text.splitlines() if line.split()[:1] == [first_cell]]


def test_healthy_sample_sections():
    out = text_of(render_sample(healthy_sample()))
    assert "gpu-node-01" in out and "2024-05-01 12:00:00 UTC" in out and "driver 550.54.15" in out
    assert "board nvswitch" in out
    gpu_rows = rows(out, "3")
    assert gpu_rows and "Gen5 x16" in gpu_rows[0] and "18/18" in gpu_rows[0] and "490/700" in gpu_rows[0]
    assert "✗" not in out and "!" not in out
    assert "NVLink topology: nvswitch" in out and out.count("NV18") == 8 * 7
    assert "mlx5_7/1" in out and "400 Gb/s NDR" in out and "✓ ACTIVE" in out
    assert "NVSwitch PCIe links" in out and "0000:05:00.0" in out


def test_faults_are_marked_with_symbols_not_only_colour():
    s = with_pcie(healthy_sample(), 2, gen=3, width=8)
    s = with_link(s, 1, 3, errors_delta={"crc_flit": 4, "crc_data": 0, "replay": None, "recovery": 0})
    s = with_link(s, 6, 0, active=False)
    s = with_ib(s, 3, state="DOWN", phys_state="Polling")
    out = text_of(render_sample(s))
    assert "✗ Gen3 x8 of Gen5 x16" in rows(out, "2")[0]
    assert "! L3 crc_flit+4" in rows(out, "1")[0]
    assert "✗ 17/18" in rows(out, "6")[0]
    [port] = [line for line in out.splitlines() if "mlx5_3/1" in line]
    assert "✗ DOWN" in port and "✗ Polling" in port


def test_idle_gen_downshift_is_not_a_fault():
    out = text_of(render_sample(healthy_sample(busy=False)))
    assert "Gen1 x16 of Gen5 x16 idle" in rows(out, "0")[0]
    assert "✗" not in out


def test_pcie_cell_marks_host_limited_slot_against_spec():
    from nvmon.specs import gpu_spec_for

    spec = gpu_spec_for("NVIDIA H100 80GB HBM3")
    p = healthy_sample().gpus[0].pcie
    assert pcie_cell(replace(p, gen=4, max_gen=4), True, spec).plain == "✗ Gen4 x16 (spec Gen5 x16)"
    assert pcie_cell(p, True, spec).plain == "Gen5 x16"


def test_bridged_pairs_board_shows_12_of_18_without_fault():
    out = text_of(render_sample(healthy_sample(name=H100_PCIE, slots=18, active_links=12, board="pairs")))
    assert "12/18" in rows(out, "0")[0] and "✗ 12/18" not in out
    assert "NVLink topology: pairs" in out and "SYS" in out and "NODE" in out


def test_none_is_a_dash():
    s = with_gpu(healthy_sample(n_gpus=1, ib_ports=1), 0, temperature_c=None, utilization_pct=None,
                 power_w=None, pcie=replace(healthy_sample().gpus[0].pcie, tx_bytes_per_s=None, rx_bytes_per_s=None))
    row = rows(text_of(render_sample(s)), "0")[0]
    assert "-/700" in row and " - " in row


def test_lost_gpu_row():
    out = text_of(render_sample(with_gpu(healthy_sample(), 5, lost=True)))
    assert "✗ lost" in out


def test_nvml_unavailable_header():
    out = text_of(render_sample(healthy_sample(nvml_available=False)))
    assert "✗ NVML unavailable: NVML Shared Library Not Found" in out
    assert "mlx5_0/1" in out  # IB still shown


def test_hostile_gpu_name_and_notes_are_literal():
    s = with_gpu(healthy_sample(), 0, name=HOSTILE, notes=("[red]note[/red]\x07",))
    s = with_ib(s, 1, device="mlx5_[i]1\x1b]0;title\x07", notes=("[b]x",))
    s = replace(s, node="node[bold]1\x1b[2J", notes=("\x1b[31m[blink]n",))
    out = text_of(render_sample(s))
    assert "\x1b" not in out and "\x07" not in out
    assert "Evil [bold]GPU[/bold] [31mred[0m [link=http://x]y[/link]" in out
    assert "[red]note[/red]" in out and "[blink]n" in out and "[b]x" in out
    assert "mlx5_[i]1]0;title" in out and "node[bold]1[2J" in out


def test_hostile_name_through_audit_is_literal():
    s = with_gpu(healthy_sample(), 0, name=HOSTILE)
    out = text_of(render_audit(audit(s)), color=True)
    assert "[bold]GPU[/bold]" in out and "\x1b[31mred" not in out


def test_hostile_strings_with_colour_on_do_not_inject():
    s = with_gpu(healthy_sample(), 0, name=HOSTILE)
    console = Console(record=True, width=200, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    console.print(render_sample(s))
    raw = console.file.getvalue()
    assert "\x1b[31mred" not in raw  # only Rich's own styling escapes, never the name's
    assert "[bold]GPU[/bold]" in raw


def test_markup_helpers():
    assert plain(None) == "-"
    assert plain("a\x1b[31mb\u202ec") == "a[31mbc"
    assert markup_safe("[bold]x") == "\\[bold]x"


def test_render_audit_ok_and_sorted_by_severity():
    out = text_of(render_audit(audit(healthy_sample(), NodeSpec(gpus=8))))
    assert out.startswith("✓ OK") and "1 info" in out
    s = with_pcie(with_link(healthy_sample(), 4, 2, active=False), 3, width=8)
    out = text_of(render_audit(audit(s, NodeSpec(gpus=8))))
    assert out.startswith("✗ CRITICAL  gpu-node-01")
    crit, warn, info = (out.index(word) for word in ("✗ critical", "! warning", "i info"))
    assert crit < warn < info
    assert "GPU 4 link 2" in out and "nvlink.link_down" in out and "GPU 3" in out


def test_render_audit_unknown_and_empty():
    report = AuditReport(node="n1", spec={}, verdict="unknown", findings=())
    assert text_of(render_audit(report)).startswith("? UNKNOWN  n1  no findings")
    f = Finding("ib.port_down", "critical", "[x] down", device="mlx5_0", port=1,
                observed={"state": "DOWN", "phys_state": None}, expected=None)
    out = text_of(render_audit(AuditReport("n1", {}, "critical", (f,))))
    assert "mlx5_0/1" in out and "state=DOWN phys_state=-" in out and "[x] down" in out


def test_nvml_unavailable_audit_renders():
    s = replace(healthy_sample(), nvml=NvmlStatus(False, error="Driver Not Loaded"), gpus=())
    out = text_of(render_audit(audit(s)))
    assert out.startswith("? UNKNOWN") and "nvml.unavailable" in out and "Driver Not Loaded" in out
