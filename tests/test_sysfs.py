"""sysfs readers (nvmon.collect.sysfs) on trees written in the kernel's formats."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nvmon.collect.sysfs import (
    IB_ERROR_WIDTHS,
    IbCollector,
    collect_nvswitch_links,
    find_nvswitches,
    nvml_to_sysfs_bdf,
    parse_ib_rate,
    parse_ib_state,
    parse_int,
    parse_pci_speed,
    parse_phys_state,
    pci_numa_node,
    read_pci_link,
    sysfs_to_nvml_bdf,
)
from nvmon.model import IB_ERROR_KINDS, PcieLink
from nvmon.sim import sysfs_tree as st

FIXTURE = Path(__file__).parent / "data" / "sysfs-hgx"
HCA = "0000:18:00.0"
ZERO_ERRORS = {k: 0 for k in IB_ERROR_KINDS}


# --- parsers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4: ACTIVE\n", (4, "ACTIVE")),
        ("1: DOWN\n", (1, "DOWN")),
        ("2: INIT", (2, "INIT")),
        ("5: ACTIVE_DEFER\n", (5, "ACTIVE_DEFER")),
        ("4\n", (4, "ACTIVE")),  # bare number: named from the table
        ("9\n", None),  # bare unknown id: no name to give
        ("", None),
        ("ACTIVE", None),
        ("N/A (no PMA)\n", None),
        ("\u0664: ACTIVE\n", None),
        (None, None),
    ],
)
def test_parse_ib_state(text, expected):
    assert parse_ib_state(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("5: LinkUp\n", (5, "LinkUp")),
        ("2: Polling\n", (2, "Polling")),
        ("3: Disabled\n", (3, "Disabled")),
        ("4: PortConfigurationTraining\n", (4, "PortConfigurationTraining")),
        ("7: Phy Test\n", (7, "Phy Test")),  # name with a space
        ("0: <unknown>\n", (0, "<unknown>")),
        ("5\n", (5, "LinkUp")),  # old kernels' bare %d
        ("-1: <unknown>\n", (-1, "<unknown>")),  # %d of an out-of-range value
        ("LinkUp", None),
        ("\x00\xff", None),
    ],
)
def test_parse_phys_state(text, expected):
    assert parse_phys_state(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("200 Gb/sec (4X HDR)\n", (200.0, "HDR")),
        ("100 Gb/sec (2X HDR)\n", (100.0, "HDR")),  # HDR100
        ("400 Gb/sec (4X NDR)\n", (400.0, "NDR")),
        ("100 Gb/sec (4X EDR)\n", (100.0, "EDR")),
        ("25 Gb/sec (1X EDR)\n", (25.0, "EDR")),
        ("56 Gb/sec (4X FDR)\n", (56.0, "FDR")),
        ("40 Gb/sec (4X FDR10)\n", (40.0, "FDR10")),
        ("40 Gb/sec (4X QDR)\n", (40.0, "QDR")),
        ("10 Gb/sec (4X)\n", (10.0, "SDR")),  # old kernels: SDR without suffix
        ("2.5 Gb/sec (1X)\n", (2.5, "SDR")),  # the "%d%s" half-Gb form
        ("200 Gb/sec (4X)\n", (200.0, "HDR")),  # name derived from 50 Gb/s per lane
        ("30 Gb/sec (4X)\n", (30.0, None)),  # per-lane speed no IB generation has
        ("200 Gb/sec\n", (200.0, None)),
        ("fast\n", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_ib_rate(text, expected):
    assert parse_ib_rate(text) == expected


@pytest.mark.parametrize(
    "text, gen",
    [
        ("2.5 GT/s PCIe\n", 1),
        ("5.0 GT/s PCIe\n", 2),
        ("8.0 GT/s PCIe\n", 3),
        ("16.0 GT/s PCIe\n", 4),
        ("32.0 GT/s PCIe\n", 5),
        ("64.0 GT/s PCIe\n", 6),
        ("2.5 GT/s\n", 1),  # kernels ≤ 5.6
        ("5 GT/s\n", 2),
        ("8 GT/s\n", 3),
        ("16 GT/s\n", 4),
        ("Unknown\n", None),
        ("Unknown speed\n", None),
        ("12.0 GT/s PCIe\n", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_pci_speed(text, gen):
    assert parse_pci_speed(text) == gen


@pytest.mark.parametrize(
    "text, value",
    [
        ("16\n", 16),
        ("0\n", 0),
        ("-1\n", -1),
        ("0x10de\n", 0x10DE),
        ("0x068000\n", 0x068000),
        ("0X15B3", 0x15B3),
        ("18446744073709551615\n", 2**64 - 1),
        ("N/A (no PMA)\n", None),
        ("0x\n", None),
        ("12abc", None),
        ("1_000\n", None),  # int() would accept these three
        ("+5\n", None),
        ("\u0661\u0662\n", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_int(text, value):
    assert parse_int(text) == value


@pytest.mark.parametrize(
    "nvml, sysfs",
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("00000000:B1:00.0", "0000:b1:00.0"),
        ("00000001:DB:1F.7", "0001:db:1f.7"),
    ],
)
def test_bdf_conversion(nvml, sysfs):
    assert nvml_to_sysfs_bdf(nvml) == sysfs
    assert sysfs_to_nvml_bdf(sysfs) == nvml
    assert nvml_to_sysfs_bdf(sysfs) == sysfs  # already sysfs form: idempotent
    assert sysfs_to_nvml_bdf(nvml) == nvml


@pytest.mark.parametrize("bad", ["", "18:00.0", "0000:18:00", "0000:18:00.8", "zz:18:00.0"])
def test_bdf_conversion_garbage(bad):
    assert nvml_to_sysfs_bdf(bad) is None
    assert sysfs_to_nvml_bdf(bad) is None


def test_error_widths_cover_the_model_kinds():
    assert tuple(IB_ERROR_WIDTHS) == IB_ERROR_KINDS


# --- tree writer formats ----------------------------------------------------------------------


def test_writer_uses_kernel_formats(tmp_path):
    d = st.write_pci_device(tmp_path, HCA, cur_gen=5, max_gen=5, cur_width=16, max_width=16,
                            numa_node=1)
    pdir = st.write_ib_port(tmp_path, "mlx5_0", 1, counters={"port_xmit_data": 7}, bdf=HCA)
    assert (d / "vendor").read_text() == "0x15b3\n"
    assert (d / "class").read_text() == "0x020700\n"
    assert (d / "current_link_speed").read_text() == "32.0 GT/s PCIe\n"
    assert (d / "max_link_width").read_text() == "16\n"
    assert (pdir / "state").read_text() == "4: ACTIVE\n"
    assert (pdir / "phys_state").read_text() == "5: LinkUp\n"
    assert (pdir / "rate").read_text() == "200 Gb/sec (4X HDR)\n"
    assert (pdir / "counters" / "port_xmit_data").read_text() == "7\n"
    assert os.path.realpath(tmp_path / "class/infiniband/mlx5_0/device") == str(d)
    assert os.path.realpath(tmp_path / "bus/pci/devices" / HCA) == str(d)
    assert st.ib_rate_text(10, "4X", "") == "10 Gb/sec (4X)"
    assert st.ib_rate_text(2.5, "1X") == "2.5 Gb/sec (1X SDR)"
    assert st.ib_rate_text(100, "2X") == "100 Gb/sec (2X HDR)"
    # a shorter value (reset, state change) replaces the whole file, leaving no temp file
    st.update_ib_counters(tmp_path, "mlx5_0", 1, {"port_xmit_data": 123456789})
    st.update_ib_counters(tmp_path, "mlx5_0", 1, {"port_xmit_data": 5})
    st.update_ib_state(tmp_path, "mlx5_0", 1, state="DOWN", phys_state="Polling")
    assert (pdir / "counters" / "port_xmit_data").read_text() == "5\n"
    assert (pdir / "state").read_text() == "1: DOWN\n"
    assert (pdir / "phys_state").read_text() == "2: Polling\n"
    assert not list(tmp_path.rglob("*.tmp"))


# --- IbCollector ------------------------------------------------------------------------------


def _node(root: Path, *, rate=200, width="4X", counters=None, **kw) -> None:
    st.write_pci_device(root, HCA, cur_gen=4, max_gen=4, cur_width=16, max_width=16)
    st.write_ib_port(root, "mlx5_0", 1, rate_gbps=rate, width=width, bdf=HCA,
                     counters={"port_xmit_data": 0, "port_rcv_data": 0, **ZERO_ERRORS,
                               **(counters or {})}, **kw)


def _one(collector: IbCollector, ts: float):
    (port,) = collector.collect(ts)
    return port


def test_healthy_hdr_port_and_exact_rates(tmp_path):
    _node(tmp_path, counters={"port_xmit_data": 1000, "port_rcv_data": 2000})
    c = IbCollector(tmp_path)
    p = _one(c, 100.0)
    assert (p.device, p.port, p.state, p.phys_state) == ("mlx5_0", 1, "ACTIVE", "LinkUp")
    assert (p.rate_gbps, p.rate_name, p.link_layer) == (200.0, "HDR", "InfiniBand")
    assert p.tx_bytes_per_s is None and p.rx_bytes_per_s is None  # first tick
    assert p.errors == ZERO_ERRORS
    assert all(v is None for v in p.errors_delta.values())
    assert p.pci_bus_id == HCA
    assert p.pcie == PcieLink(gen=4, max_gen=4, width=16, max_width=16)
    assert p.notes == ()

    st.update_ib_counters(tmp_path, "mlx5_0", 1, {"port_xmit_data": 1000 + 250_000_000,
                                                  "port_rcv_data": 2000 + 1_000,
                                                  "symbol_error": 2})
    p = _one(c, 102.0)
    # 4-octet words: 250e6 words × 4 / 2 s
    assert p.tx_bytes_per_s == 500_000_000.0
    assert p.rx_bytes_per_s == 2_000.0
    assert p.errors["symbol_error"] == 2
    assert p.errors_delta == {**ZERO_ERRORS, "symbol_error": 2}


def test_counter_reset_gives_none_not_negative(tmp_path):
    _node(tmp_path, counters={"port_xmit_data": 10_000, "port_rcv_data": 10_000,
                              "link_downed": 5})
    c = IbCollector(tmp_path)
    c.collect(1.0)
    st.update_ib_counters(tmp_path, "mlx5_0", 1, {"port_xmit_data": 10, "port_rcv_data": 20,
                                                  "link_downed": 0})
    p = _one(c, 2.0)
    assert p.tx_bytes_per_s is None and p.rx_bytes_per_s is None
    assert p.errors_delta["link_downed"] is None
    st.update_ib_counters(tmp_path, "mlx5_0", 1, {"port_xmit_data": 110, "port_rcv_data": 20})
    p = _one(c, 3.0)
    assert p.tx_bytes_per_s == 400.0 and p.rx_bytes_per_s == 0.0  # counting again from the reset


def test_saturated_32bit_data_counter(tmp_path):
    _node(tmp_path, counters={"port_xmit_data": 4_000_000_000})
    c = IbCollector(tmp_path)
    c.collect(1.0)
    st.update_ib_counters(tmp_path, "mlx5_0", 1, {"port_xmit_data": 0xFFFFFFFF})
    p = _one(c, 2.0)
    assert p.tx_bytes_per_s is None
    assert "port_xmit_data saturated (32-bit)" in p.notes
    p = _one(c, 3.0)  # still stuck
    assert p.tx_bytes_per_s is None
    assert p.rx_bytes_per_s == 0.0  # the other direction is unaffected


def test_64bit_counter_in_counters_dir_is_recognised(tmp_path):
    big = 5 * 2**32
    _node(tmp_path, counters={"port_xmit_data": big})
    c = IbCollector(tmp_path)
    c.collect(1.0)
    # Passing through all-ones is not saturation once the counter has proved it is 64-bit.
    st.update_ib_counters(tmp_path, "mlx5_0", 1, {"port_xmit_data": big + 100})
    p = _one(c, 2.0)
    assert p.tx_bytes_per_s == 400.0
    assert not any("saturated" in n for n in p.notes)


def test_counters_ext_64bit_layout_preferred(tmp_path):
    _node(tmp_path, counters={"port_xmit_data": 0xFFFFFFFF, "port_rcv_data": 0xFFFFFFFF},
          counters_ext={"port_xmit_data_64": 2**40, "port_rcv_data_64": 10})
    c = IbCollector(tmp_path)
    assert not any("saturated" in n for n in _one(c, 10.0).notes)
    st.update_ib_counters(tmp_path, "mlx5_0", 1,
                          {"port_xmit_data_64": 2**40 + 1_000, "port_rcv_data_64": 0xFFFFFFFF},
                          ext=True)
    p = _one(c, 11.0)
    assert p.tx_bytes_per_s == 4_000.0
    assert p.rx_bytes_per_s == (0xFFFFFFFF - 10) * 4.0  # all-ones is a fine 64-bit value
    assert not any("saturated" in n for n in p.notes)


def test_saturated_error_counter(tmp_path):
    _node(tmp_path, counters={"symbol_error": 65_000, "link_error_recovery": 255})
    c = IbCollector(tmp_path)
    c.collect(1.0)
    st.update_ib_counters(tmp_path, "mlx5_0", 1, {"symbol_error": 65_535})
    p = _one(c, 2.0)
    assert p.errors["symbol_error"] == 65_535
    assert p.errors_delta["symbol_error"] is None
    assert p.errors_delta["link_error_recovery"] is None
    assert "symbol_error saturated (16-bit)" in p.notes
    assert "link_error_recovery saturated (8-bit)" in p.notes


def test_missing_and_garbage_files_become_none_with_notes(tmp_path):
    _node(tmp_path)
    pdir = tmp_path / "class/infiniband/mlx5_0/ports/1"
    (pdir / "rate").unlink()
    (pdir / "counters/port_rcv_data").unlink()
    (pdir / "state").write_text("banana\n")
    (pdir / "counters/symbol_error").write_text("N/A (no PMA)\n")
    p = _one(IbCollector(tmp_path), 1.0)
    assert p.rate_gbps is None and p.rate_name is None
    assert p.state is None and p.phys_state == "LinkUp"
    assert p.errors["symbol_error"] is None and p.errors["link_downed"] == 0
    assert "rate missing" in p.notes
    assert "port_rcv_data missing" in p.notes
    assert "state unparsable: 'banana'" in p.notes
    assert "symbol_error unparsable: 'N/A (no PMA)'" in p.notes


def test_one_bad_port_does_not_hide_others(tmp_path):
    _node(tmp_path)
    bad = tmp_path / "class/infiniband/mlx5_1/ports/1"
    bad.mkdir(parents=True)  # a port directory with nothing in it, and no device link
    (tmp_path / "class/infiniband/mlx5_1/ports/lost+found").mkdir()  # not a port number
    ports = IbCollector(tmp_path).collect(1.0)
    assert [(p.device, p.port) for p in ports] == [("mlx5_0", 1), ("mlx5_1", 1)]
    good, broken = ports
    assert good.notes == () and good.state == "ACTIVE"
    assert broken.state is None and broken.rate_gbps is None and broken.pci_bus_id is None
    assert "device link missing" in broken.notes and "state missing" in broken.notes


def test_roce_port(tmp_path):
    _node(tmp_path, rate=100, link_layer="Ethernet")
    p = _one(IbCollector(tmp_path), 1.0)
    assert p.link_layer == "Ethernet"
    assert (p.rate_gbps, p.rate_name) == (100.0, "EDR")  # RoCE reports the IB-equivalent speed


def test_port_down_polling(tmp_path):
    _node(tmp_path, state="DOWN", phys_state="Polling", rate=10, rate_name="")
    p = _one(IbCollector(tmp_path), 1.0)
    assert (p.state, p.phys_state) == ("DOWN", "Polling")
    assert (p.rate_gbps, p.rate_name) == (10.0, "SDR")


def test_state_changes_are_reread_each_tick(tmp_path):
    _node(tmp_path)
    c = IbCollector(tmp_path)
    assert _one(c, 1.0).rate_gbps == 200.0
    st.update_ib_state(tmp_path, "mlx5_0", 1, state="INIT", phys_state="LinkErrorRecovery",
                       rate_gbps=100, width="2X")
    st.update_pci_link(tmp_path, HCA, cur_width=8)
    p = _one(c, 2.0)
    assert (p.state, p.phys_state, p.rate_gbps, p.rate_name) == (
        "INIT", "LinkErrorRecovery", 100.0, "HDR")
    # The HCA's PCIe link only changes when it retrains: it is re-read every LINK_REFRESH_TICKS.
    from nvmon.collect.sysfs import LINK_REFRESH_TICKS

    assert p.pcie.width == 16
    for i in range(LINK_REFRESH_TICKS - 1):
        p = _one(c, 3.0 + i)
    assert p.pcie.width == 8 and p.pcie.max_width == 16


@pytest.mark.parametrize(
    "rate, width, expected",
    [(200, "4X", (200.0, "HDR")), (100, "2X", (100.0, "HDR")), (100, "4X", (100.0, "EDR")),
     (400, "4X", (400.0, "NDR"))],
)
def test_hdr_vs_100g(tmp_path, rate, width, expected):
    _node(tmp_path, rate=rate, width=width)
    p = _one(IbCollector(tmp_path), 1.0)
    assert (p.rate_gbps, p.rate_name) == expected


def test_hca_pcie_downtrained(tmp_path):
    _node(tmp_path)
    st.update_pci_link(tmp_path, HCA, cur_gen=4, cur_width=8)
    p = _one(IbCollector(tmp_path), 1.0)
    assert p.pcie == PcieLink(gen=4, max_gen=4, width=8, max_width=16)


def test_port_removed_then_back_starts_fresh(tmp_path):
    _node(tmp_path, counters={"port_xmit_data": 100})
    c = IbCollector(tmp_path)
    c.collect(1.0)
    os.rename(tmp_path / "class/infiniband/mlx5_0", tmp_path / "mlx5_0.away")
    assert c.collect(2.0) == ()
    os.rename(tmp_path / "mlx5_0.away", tmp_path / "class/infiniband/mlx5_0")
    assert _one(c, 3.0).tx_bytes_per_s is None  # no rate across the gap


def test_subfunction_device_resolves_to_its_pci_function(tmp_path):
    # mlx5 subfunctions: the IB device's parent is an auxiliary device below the PCI function
    pci = st.write_pci_device(tmp_path, HCA, cur_gen=4, max_gen=4, cur_width=16, max_width=16)
    (pci / "mlx5_core.sf.2").mkdir()
    dev_dir = tmp_path / "class/infiniband/mlx5_9"
    dev_dir.mkdir(parents=True)
    os.symlink(os.path.relpath(pci / "mlx5_core.sf.2", dev_dir), dev_dir / "device")
    st.write_ib_port(tmp_path, "mlx5_9", 1, link_layer="Ethernet",
                     counters={"port_xmit_data": 0, "port_rcv_data": 0, **ZERO_ERRORS})
    p = _one(IbCollector(tmp_path), 1.0)
    assert p.pci_bus_id == HCA and p.pcie.max_width == 16 and p.notes == ()


def test_no_infiniband_class_or_no_root(tmp_path):
    st.write_pci_device(tmp_path, HCA, cur_gen=4, max_gen=4, cur_width=16, max_width=16)
    assert IbCollector(tmp_path).collect(1.0) == ()
    assert IbCollector(tmp_path / "does-not-exist").collect(1.0) == ()


# --- PCI, NVSwitch, NUMA ----------------------------------------------------------------------


def test_read_pci_link_and_numa(tmp_path):
    st.write_pci_device(tmp_path, HCA, cur_gen=4, max_gen=5, cur_width=8, max_width=16,
                        numa_node=1)
    st.write_pci_device(tmp_path, "0000:19:00.0", cur_gen=None, max_gen=4, cur_width=16,
                        max_width=None, numa_node=-1)
    assert read_pci_link(tmp_path, HCA) == PcieLink(gen=4, max_gen=5, width=8, max_width=16)
    assert read_pci_link(tmp_path, "0000:19:00.0") == PcieLink(gen=None, max_gen=4, width=16)
    assert read_pci_link(tmp_path, "0000:99:00.0") is None
    assert pci_numa_node(tmp_path, HCA) == 1
    assert pci_numa_node(tmp_path, "0000:19:00.0") is None  # -1: no NUMA
    assert pci_numa_node(tmp_path, "0000:99:00.0") is None


def test_old_kernel_speed_format(tmp_path):
    d = st.write_pci_device(tmp_path, HCA, cur_gen=3, max_gen=4, cur_width=16, max_width=16)
    (d / "current_link_speed").write_text("8 GT/s\n")
    (d / "max_link_speed").write_text("16 GT/s\n")
    assert read_pci_link(tmp_path, HCA) == PcieLink(gen=3, max_gen=4, width=16, max_width=16)


def test_find_nvswitches(tmp_path):
    for bdf in ("0000:c2:00.0", "0000:c1:00.0"):
        st.write_pci_device(tmp_path, bdf, vendor=st.NVIDIA_VENDOR, device=0x22A3,
                            class_code=st.CLASS_NVSWITCH, cur_gen=4, max_gen=4,
                            cur_width=2, max_width=2, numa_node=1)
    st.write_pci_device(tmp_path, "0000:18:00.0", vendor=st.NVIDIA_VENDOR, device=0x2330,
                        class_code=st.CLASS_3D, cur_gen=5, max_gen=5, cur_width=16,
                        max_width=16)
    # another vendor's "bridge, other" is not an NVSwitch
    st.write_pci_device(tmp_path, "0000:00:1f.0", vendor=0x8086, device=0x1234,
                        class_code=0x068000, cur_gen=None, max_gen=None, cur_width=None,
                        max_width=None)
    st.write_pci_device(tmp_path, HCA.replace("18", "1a"), cur_gen=4, max_gen=4, cur_width=16,
                        max_width=16)
    assert find_nvswitches(tmp_path) == ["0000:c1:00.0", "0000:c2:00.0"]
    st.update_pci_link(tmp_path, "0000:c2:00.0", cur_width=1)
    links = collect_nvswitch_links(tmp_path)
    assert [(l.pci_bus_id, l.kind, l.pcie.width, l.pcie.max_width) for l in links] == [
        ("0000:c1:00.0", "nvswitch", 2, 2), ("0000:c2:00.0", "nvswitch", 1, 2)]
    # with a cached list (per tick), no discovery scan; a vanished switch gives an empty link
    again = collect_nvswitch_links(tmp_path, ["0000:c1:00.0", "0000:c9:00.0"])
    assert again[1].pcie == PcieLink()
    assert find_nvswitches(tmp_path / "nothing") == []


# --- hand-written fixture ---------------------------------------------------------------------


def test_fixture_tree_hgx():
    ports = IbCollector(FIXTURE).collect(1.0)
    assert [(p.device, p.port) for p in ports] == [("mlx5_0", 1), ("mlx5_1", 1)]
    m0, m1 = ports
    assert (m0.state, m0.phys_state, m0.rate_gbps, m0.rate_name, m0.link_layer) == (
        "ACTIVE", "LinkUp", 200.0, "HDR", "InfiniBand")
    assert m0.pci_bus_id == "0000:1a:00.0"
    assert m0.pcie == PcieLink(gen=4, max_gen=4, width=16, max_width=16)
    assert m0.notes == ()
    assert m1.pci_bus_id == "0000:2c:00.0"
    assert m1.pcie == PcieLink(gen=4, max_gen=4, width=8, max_width=16)
    assert m1.errors["symbol_error"] == 3
    assert find_nvswitches(FIXTURE) == ["0000:c1:00.0"]
    (sw,) = collect_nvswitch_links(FIXTURE)
    assert sw.kind == "nvswitch" and sw.pcie.max_gen == 4
    gpu = read_pci_link(FIXTURE, nvml_to_sysfs_bdf("00000000:18:00.0"))
    assert gpu == PcieLink(gen=1, max_gen=4, width=16, max_width=16)  # idle at Gen1
    assert pci_numa_node(FIXTURE, "0000:c1:00.0") == 1


def test_collect_8_ports_keeps_static_facts_cached(tmp_path):
    """Cost is measured in bench/sample_cost.py, never asserted here (tests don't time machines).
    What is tested: repeated collects stay correct on an 8-port tree and statics are cached."""
    for i in range(8):
        bdf = f"0000:{0x1a + i:02x}:00.0"
        st.write_pci_device(tmp_path, bdf, cur_gen=4, max_gen=4, cur_width=16, max_width=16)
        st.write_ib_port(tmp_path, f"mlx5_{i}", 1, bdf=bdf,
                         counters={"port_xmit_data": 0, "port_rcv_data": 0, **ZERO_ERRORS})
    c = IbCollector(tmp_path)
    assert len(c.collect(0.0)) == 8
    (tmp_path / "class/infiniband/mlx5_3/ports/1/link_layer").write_text("Ethernet\n")
    for i in range(1, 4):
        ports = c.collect(float(i))
        assert len(ports) == 8 and all(p.tx_bytes_per_s == 0.0 for p in ports)
    assert ports[3].link_layer == "InfiniBand"  # read once per port, not every tick
