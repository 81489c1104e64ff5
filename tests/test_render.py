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
    assert "gpu-node-01" in out and "2024-05-01 12:00:00 UTC" in out and "interval 1.00 s" in out
    # The shared model is named once, in the header, not on every row.
    assert "8 × NVIDIA H100 80GB HBM3, driver 550.54.15, board: all-to-all NVSwitch" in out
    assert out.count("H100") == 1
    gpu_rows = rows(out, "3")
    assert len(gpu_rows) == 1
    assert "Gen5 x16" in gpu_rows[0] and "18/18" in gpu_rows[0] and "490/700" in gpu_rows[0]
    assert "5.0/5.0" in gpu_rows[0] and "360/360" in gpu_rows[0]  # PCIe, and NVLink summed over 18 links
    assert "✗" not in out and "⚠" not in out and "Problems" not in out
    assert "NVLink topology: all-to-all through NVSwitch, NV18 between every GPU pair" in out
    matrix = [line for line in out.splitlines() if line.startswith(("GPU0 ", "GPU7 "))]
    assert len(matrix) == 2 and [line.count("NV18") for line in matrix] == [7, 7]
    assert out.count("NV18") == 8 * 7 + 1  # the matrix, and once in its title
    [port] = [line for line in out.splitlines() if line.startswith("mlx5_7:1")]
    assert port.split()[:7] == ["mlx5_7:1", "✓", "ACTIVE", "LinkUp", "400", "NDR", "IB"]
    assert "Gen5 x16" in port
    assert "NVSwitch PCIe links" in out and "0000:05:00.0" in out


def test_faults_are_marked_with_symbols_not_only_colour():
    s = with_pcie(healthy_sample(), 2, gen=3, width=8)
    s = with_link(s, 1, 3, errors_delta={"crc_flit": 4, "crc_data": 0, "replay": None, "recovery": 0})
    s = with_link(s, 6, 0, active=False)
    s = with_ib(s, 3, state="DOWN", phys_state="Polling")
    s = with_ib(s, 5, errors_delta={"symbol_error": 7, "port_rcv_errors": 2, "link_downed": 0})
    s = with_gpu(s, 4, throttle_reasons=("sw_power_cap", "sw_thermal"))
    out = text_of(render_sample(s), width=200)
    # Each cell carries its finding's severity: ✗ critical, ⚠ warning.
    assert "⚠ Gen3/5 x8/16" in rows(out, "2")[0]
    assert "err↑ L3" in rows(out, "1")[0]
    assert "✗ 17/18" in rows(out, "6")[0]
    assert rows(out, "4")[0].rstrip().endswith("pwrcap thermal")
    [port] = [line for line in out.splitlines() if line.startswith("mlx5_3:1")]
    assert "✗ DOWN" in port and "✗ Polling" in port
    [port] = [line for line in out.splitlines() if line.startswith("mlx5_5:1")]
    assert "err↑" in port
    # The detail the cells only mark: the audit's findings, critical first, each its message.
    problems = [line.strip() for line in out[out.index("Problems"):].splitlines()[1:] if line.strip()]
    report = audit(s)
    assert problems[:2] == ["✗ " + f.message for f in report.findings if f.severity == "critical"]
    assert "⚠ GPU 1 NVLink 3 errors rising: crc_flit +4" in problems
    assert "⚠ mlx5_5 port 1 errors rising: symbol_error +7, port_rcv_errors +2" in problems


def test_idle_gen_downshift_is_not_a_fault():
    out = text_of(render_sample(healthy_sample(busy=False)))
    row = rows(out, "0")[0]
    assert "Gen1/5 x16" in row and row.rstrip().endswith("idle")
    assert "✗" not in out and "Problems" not in out


def _gpu0_pcie_cell(sample) -> str:
    return pcie_cell(sample.gpus[0].pcie, audit(sample).findings and [
        f for f in audit(sample).findings if f.gpu == 0]).plain


def test_pcie_cell_shows_now_and_expected_as_the_audit_judged():
    busy, idle = healthy_sample(), healthy_sample(busy=False)
    assert _gpu0_pcie_cell(busy) == "Gen5 x16"
    assert _gpu0_pcie_cell(with_pcie(busy, 0, gen=4, max_gen=4)) == "⚠ Gen4/5 x16"  # slot below spec
    assert _gpu0_pcie_cell(with_pcie(idle, 0, width=8)) == "⚠ Gen1/5 x8/16"  # narrow: a fault even idle
    assert _gpu0_pcie_cell(idle) == "Gen1/5 x16"  # idle power saving: no finding
    assert _gpu0_pcie_cell(with_pcie(busy, 0, gen=1)) == "⚠ Gen1/5 x16"  # slow under load
    assert pcie_cell(replace(busy.gpus[0].pcie, gen=None, width=None)).plain == "-"


def test_flags_never_say_healthy_for_a_gpu_the_audit_faults():
    """GPU 3 at PCIe x8: its PCIe cell and its Flags cell agree (issue 11: '✗ Gen5 x8/16' beside '✓')."""
    s = with_pcie(healthy_sample(), 3, width=8)
    row = rows(text_of(render_sample(s)), "3")[0]
    assert "⚠ Gen5 x8/16" in row and "✓" not in row
    assert "✓" in rows(text_of(render_sample(s)), "2")[0]  # a healthy neighbour still says so


def test_unreadable_nvlink_is_not_marked_down():
    """A link whose state could not be read gets the audit's benefit of the doubt here too."""
    s = with_link(healthy_sample(), 2, 4, active=None)
    assert not [f for f in audit(s).findings if f.code == "nvlink.link_down"]
    row = rows(text_of(render_sample(s)), "2")[0]
    assert "17/18" in row and "✗" not in row


def test_hca_at_x8_is_a_finding_and_its_cell_says_so():
    hca = replace(healthy_sample().ib[2].pcie, width=8)
    s = with_ib(healthy_sample(), 2, pcie=hca)
    [f] = [f for f in audit(s).findings if f.code == "pcie.width"]
    assert (f.device, f.port, f.gpu, f.observed, f.expected) == ("mlx5_2", None, None, "x8", "x16")
    out = text_of(render_sample(s))
    [port] = [line for line in out.splitlines() if line.startswith("mlx5_2:1")]
    assert port.rstrip().endswith("⚠ Gen5 x8/16")
    assert "mlx5_2 HCA" in text_of(render_audit(audit(s)))


def test_sample_marks_follow_the_thresholds_it_is_given():
    from nvmon.audit import Thresholds

    s = with_gpu(healthy_sample(), 1, temperature_c=80.0)
    assert "hot" not in rows(text_of(render_sample(s)), "1")[0]
    row = rows(text_of(render_sample(s, audit(s, thresholds=Thresholds(temperature_c=75.0)))), "1")[0]
    assert "hot" in row


def test_host_limited_slot_is_explained_under_the_tables():
    s = with_pcie(healthy_sample(), 0, gen=4, max_gen=4)
    out = text_of(render_sample(s))
    assert "⚠ Gen4/5 x16" in rows(out, "0")[0]
    assert "⚠ GPU 0 PCIe limited to Gen4, H100-SXM expects Gen5: host, slot or BIOS setting limits the link" in out


def test_bridged_pairs_board_shows_12_of_18_without_fault():
    s = healthy_sample(name=H100_PCIE, slots=18, active_links=12, board="pairs")
    assert "⚠ 8 GPUs, GPUs bridged in pairs" in text_of(render_sample(s))  # unless it is what you expect:
    out = text_of(render_sample(s, audit(s, NodeSpec(topology="pairs"))))
    assert "12/18" in rows(out, "0")[0] and "✗ 12/18" not in out
    assert "board: NVLink pairs" in out
    assert "NVLink topology: GPUs bridged in pairs 0-1, 2-3, 4-5, 6-7 (NV12)" in out
    assert "SYS" in out and "NODE" in out and "Problems" not in out  # 6 idle slots are not "down"


def test_none_is_a_dash():
    s = with_gpu(healthy_sample(n_gpus=1, ib_ports=1), 0, temperature_c=None, utilization_pct=None,
                 power_w=None, pcie=replace(healthy_sample().gpus[0].pcie, tx_bytes_per_s=None, rx_bytes_per_s=None))
    row = rows(text_of(render_sample(s)), "0")[0]
    assert "-/700" in row and " - " in row


def test_lost_gpu_row():
    out = text_of(render_sample(with_gpu(healthy_sample(), 5, lost=True, throttle_reasons=None)), width=80)
    [row] = rows(out, "5")
    assert row.rstrip().endswith("✗ LOST") and "Gen5" not in row


def test_nvml_unavailable_header():
    out = text_of(render_sample(healthy_sample(nvml_available=False)))
    assert "✗ no GPU data (see Problems); InfiniBand, PCIe and host still sampled" in out
    assert out.count("NVML unavailable") == 1 and "⚠ NVML unavailable: NVML Shared Library Not Found" in out
    assert "mlx5_0:1" in out  # IB still shown


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
    assert out.startswith("✓ OK — 1 info — gpu-node-01")
    s = with_pcie(with_link(healthy_sample(), 4, 2, active=False), 3, width=8)
    out = text_of(render_audit(audit(s, NodeSpec(gpus=8))))
    assert out.startswith("✗ CRITICAL — 1 critical, 1 warning, 1 info — gpu-node-01")
    symbols = [line[0] for line in out.splitlines()[1:] if line[:1].strip()]
    assert symbols == ["✗", "⚠", "ℹ"]
    [crit] = [line for line in out.splitlines()[1:] if line.startswith("✗ ")]
    assert crit.split()[1:5] == ["nvlink.link_down", "GPU", "4", "link"]
    assert "GPU 3" in out and "pcie.width" in out


def test_render_audit_one_finding_per_line_at_80_columns():
    s = with_pcie(with_link(healthy_sample(), 4, 2, active=False), 3, width=8)
    s = with_link(s, 1, 3, errors_delta={"crc_flit": 4, "crc_data": 1, "replay": 2, "recovery": 0})
    s = with_ib(s, 1, rate_gbps=100.0, rate_name="EDR")
    report = audit(s, NodeSpec(gpus=8, ib_ports=8, ib_rate_gbps=400.0))
    out = text_of(render_audit(report), width=80)
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines)
    starts = [line for line in lines[1:] if line[:1].strip()]
    assert len(starts) == len(report.findings)  # only messages wrap, onto indented lines
    [ib] = [line for line in starts if "ib.rate" in line]
    assert ib.split()[:5] == ["⚠", "ib.rate", "mlx5_1", "port", "1"]
    message = " ".join(line.strip() for line in lines if line.strip()).replace("  ", " ")
    assert "reseat the GPU/baseboard, check NVSwitch and fabric manager" in " ".join(message.split())


def test_render_audit_unknown_and_empty():
    report = AuditReport(node="n1", spec={}, verdict="unknown", findings=())
    assert text_of(render_audit(report)).startswith("? UNKNOWN — no findings — n1")
    f = Finding("ib.port_down", "critical", "[x] down", device="mlx5_0", port=1,
                observed={"state": "DOWN", "phys_state": None}, expected=None)
    out = text_of(render_audit(AuditReport("n1", {}, "critical", (f,))))
    assert "mlx5_0 port 1" in out and "[x] down" in out


def test_nvml_unavailable_audit_renders():
    s = replace(healthy_sample(), nvml=NvmlStatus(False, error="Driver Not Loaded"), gpus=())
    out = text_of(render_audit(audit(s)))
    assert out.startswith("? UNKNOWN") and "nvml.unavailable" in out and "Driver Not Loaded" in out


def _faulty_hgx():
    """8 × H100, 18 links each, with a fault or a rise on most GPUs."""
    s = healthy_sample(name="NVIDIA H100 80GB HBM3", slots=18)
    s = with_link(s, 1, 3, errors_delta={"crc_flit": 3, "crc_data": 1, "replay": 2, "recovery": 0})
    s = with_link(s, 1, 11, errors_delta={"crc_flit": 1})
    s = with_link(s, 2, 5, active=False)
    s = with_pcie(s, 3, width=8, replay_errors_delta=4)
    s = with_gpu(s, 4, power_w=349.9, power_limit_w=350.0, throttle_reasons=("sw_power_cap", "hw_power_brake"))
    s = with_gpu(s, 5, lost=True, throttle_reasons=None)
    s = with_gpu(s, 6, temperature_c=92.0, throttle_reasons=("sw_thermal", "hw_slowdown"))
    s = with_ib(s, 1, rate_gbps=100.0, rate_name="EDR", errors_delta={"symbol_error": 9})
    return replace(s, interval_s=0.538613)


def test_8_gpus_18_links_fit_80_columns_one_line_per_gpu():
    out = text_of(render_sample(_faulty_hgx()), width=80)
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    for i in range(8):
        assert len(rows(out, str(i))) == 1, f"GPU {i} is not exactly one line"
    assert "interval 0.54 s" in out and "8 × NVIDIA H100 80GB HBM3" in out
    row = {i: rows(out, str(i))[0] for i in range(8)}
    assert "err↑ L3,L11" in row[1] and "✗ 17/18" in row[2]
    assert "⚠ Gen5 x8/16" in row[3] and "err↑ PCIe" in row[3]
    assert "350/350" in row[4] and "pwrcap brake" in row[4]
    assert row[5].rstrip().endswith("✗ LOST") and "thermal hwslow" in row[6]
    assert "H100" not in "".join(row.values())  # the model is in the header only
    # One line per IB port, too.
    [port] = [line for line in lines if line.startswith("mlx5_1:1")]
    assert "100 EDR" in port and "err↑" in port and "Gen5 x16" in port
    flat = " ".join(out.split())  # messages wrap under themselves at 80 columns
    assert "✗ GPU 2 NVLink 5 down" in flat and "✗ GPU 5 lost" in flat  # critical first
    assert "⚠ GPU 1 NVLink 3 errors rising: crc_flit +3, crc_data +1, replay +2" in flat
    assert "⚠ GPU 3 PCIe replays rising (+4)" in flat


def test_topology_matrix_fits_80_columns_and_names_its_class():
    out = text_of(render_sample(healthy_sample()), width=80)
    [title] = [line for line in out.splitlines() if line.startswith("NVLink topology")]
    assert "all-to-all through NVSwitch" in title
    [header] = [line for line in out.splitlines() if line.split()[:1] == ["GPU0"] and "NVSw" in line]
    assert len(header) <= 80


def test_mixed_models_get_a_short_model_column():
    s = healthy_sample()
    for i in (4, 5, 6, 7):
        s = with_gpu(s, i, name="NVIDIA H200")
    out = text_of(render_sample(s), width=80)
    assert "8 GPUs (4 × H100 80GB HBM3, 4 × H200)" in out
    assert all(len(line) <= 80 for line in out.splitlines())
    assert rows(out, "0")[0].split()[1] == "H100" and rows(out, "7")[0].split()[1] == "H200"
    assert "NVIDIA" not in "".join(rows(out, str(i))[0] for i in range(8))


def test_problems_and_notes_are_capped():
    s = healthy_sample()
    for link in range(15):
        s = with_link(s, 0, link, errors_delta={"crc_flit": 1})
    s = with_gpu(s, 1, notes=tuple(f"note {k}" for k in range(12)))
    out = text_of(render_sample(s), width=80)
    problems = out[out.index("Problems"):out.index("Notes")]
    assert problems.count("⚠ GPU 0 NVLink") == 10 and "… and 5 more" in problems
    notes = out[out.index("Notes"):]
    assert notes.count("GPU 1: note") == 10 and "… and 2 more" in notes


def test_long_notes_wrap_under_themselves():
    s = replace(healthy_sample(), notes=("word " * 30,))
    lines = text_of(render_sample(s), width=80).splitlines()
    start = lines.index(next(line for line in lines if line.startswith("  node: word")))
    assert lines[start + 1].startswith(" " * len("  node: ")) and "word" in lines[start + 1]


def test_hostile_shared_model_name_in_header_is_literal():
    s = healthy_sample()
    for i in range(8):
        s = with_gpu(s, i, name=HOSTILE)
    out = text_of(render_sample(s), color=True)
    assert "8 × Evil [bold]GPU[/bold] [31mred[0m [link=http://x]y[/link]" in out
    assert "\x1b[31mred" not in out
