"""The hardware kit's comparator (bench/hardware/compare.py) on the real captures in shared/hardware/:
it must read what nvidia-smi really prints, and tell a match from a difference field by field."""

from __future__ import annotations

import copy

import pytest

from hardware_captures import capture

import compare  # bench/hardware/compare.py (hardware_captures puts it on the path)

# `nvidia-smi nvlink -s` of an H100 PCIe pair with three bridges (12 of 18 links active), driver 555:
# the real capture NVML-FACTS §1.2 cites, first GPU, indentation as nvidia-smi prints it.
NVLINK_S_H100_PCIE = "GPU 0: NVIDIA H100 PCIe (UUID: GPU-6968dfc2-d444-d92c-c36b-6abe53445cb9)\n" + "".join(
    f"\t Link {i}: {'<inactive>' if i in (4, 5, 10, 11, 16, 17) else '26.562 GB/s'}\n" for i in range(18))


@pytest.fixture(scope="module")
def h100():
    return compare.parse_smi_xml(capture("qx-h100.xml").read_bytes())


@pytest.fixture(scope="module")
def b200():
    return compare.parse_smi_xml(capture("qx-b200.xml").read_bytes())


@pytest.fixture(scope="module")
def gb200():
    return compare.parse_smi_xml(capture("qx-gb200.xml").read_bytes())


def test_h100_capture_parses_to_its_real_values(h100):
    assert h100["driver_version"] == "580.105.08" and h100["cuda_version"] == "13.0"
    assert h100["attached_gpus"] == 8 and len(h100["gpus"]) == 8
    g = h100["gpus"][0]
    assert g["bus_id"] == "00000000:53:00.0" and g["name"] == "NVIDIA H100 80GB HBM3"
    assert g["pci_device_id"] == "233010DE"
    assert (g["power_limit_w"], g["power_default_limit_w"], g["power_min_limit_w"], g["power_max_limit_w"]) == \
        (700.0, 700.0, 200.0, 700.0)
    assert g["power_draw_w"] == 68.57
    assert (g["pcie_gen"], g["pcie_max_gen"], g["pcie_device_max_gen"], g["pcie_width"], g["pcie_max_width"]) == \
        (5, 5, 5, 16, 16)
    assert g["pcie_replay"] == 150  # lifetime counters are history (README of the captures)
    assert (g["fb_total_mib"], g["fb_reserved_mib"], g["fb_used_mib"], g["fb_free_mib"]) == (81559, 480, 0, 81080)
    assert (g["sm_clock_max_mhz"], g["mem_clock_max_mhz"], g["sm_clock_mhz"]) == (1980, 2619, 345)
    assert (g["temperature_c"], g["memory_temperature_c"], g["utilization_pct"]) == (29, 37, 0)
    assert g["throttle_reasons"] == ["gpu_idle"]
    assert g["fabric"]["state"] == "Completed" and g["fabric"]["status"] == "Success"
    assert g["fabric"]["clique_id"] == 0 and g["fabric"]["health"]["summary"] == "N/A"
    assert all(compare.BUS_ID.match(x["bus_id"]) for x in h100["gpus"])


def test_b200_and_gb200_captures(b200, gb200):
    g = b200["gpus"][0]
    assert g["name"] == "NVIDIA B200" and g["pci_device_id"] == "290110DE"
    assert (g["power_limit_w"], g["power_min_limit_w"], g["power_max_limit_w"]) == (1000.0, 200.0, 1000.0)
    assert (g["pcie_max_gen"], g["pcie_device_max_gen"]) == (5, 5)
    assert (g["fb_total_mib"], g["sm_clock_max_mhz"], g["mem_clock_max_mhz"]) == (183359, 1965, 3996)
    assert g["fabric"]["health"]["summary"] == "Healthy"
    assert gb200["attached_gpus"] == 4 and gb200["driver_version"] == "580.173.02"
    g = gb200["gpus"][0]
    assert (g["power_limit_w"], g["pcie_device_max_gen"]) == (1200.0, 6)
    assert g["fabric"]["clique_id"] == 2 and g["fabric"]["cluster_uuid"] == "00000001-0000-0000-0000-000000000001"
    assert g["fabric"]["health"]["bandwidth"] == "Full"


# nvidia-smi's words -> NVML's numbers, from nvml.h (nvmlGpuFabricState_t, NVML_GPU_FABRIC_HEALTH_MASK_*,
# NVML_GPU_FABRIC_HEALTH_SUMMARY_*), written out here rather than taken from compare.py.
STATES = {"Not Started": 1, "In Progress": 2, "Completed": 3}
SUMMARIES = {"Healthy": 1, "Unhealthy": 2, "Limited Capacity": 3}
MASK_BITS = {"bandwidth": (0, {"Degraded": 1, "Full": 2}), "route_recovery_in_progress": (2, {"True": 1, "False": 2}),
             "route_unhealthy": (4, {"True": 1, "False": 2}), "access_timeout_recovery": (6, {"True": 1, "False": 2})}


def fabric_from(f: dict | None) -> dict:
    """`gpus[].fabric` as nvmon's sample carries it, for a capture's parsed <fabric>."""
    if f is None:
        return {k: None for k in ("state", "status", "clique_id", "cluster_uuid", "health_mask", "health_summary")}
    health = f["health"]
    mask = sum(values[health[tag]] << shift for tag, (shift, values) in MASK_BITS.items() if health.get(tag) in values)
    return {"state": STATES[f["state"]], "status": 0 if f["status"] == "Success" else 3, "clique_id": f["clique_id"],
            "cluster_uuid": f["cluster_uuid"], "health_mask": mask, "health_summary": SUMMARIES.get(health["summary"])}


def sample_from(smi: dict) -> dict:
    """What `nvmon sample --json` would say on the captured node, written from the capture by hand
    (keys and units from docs/sample-schema.md), to hold the comparator's mapping to."""
    gpus = []
    for i, g in enumerate(smi["gpus"]):
        gpus.append({
            "index": i, "name": g["name"], "uuid": g["uuid"], "serial": g["serial"], "pci_bus_id": g["bus_id"],
            "lost": False, "power_w": g["power_draw_w"], "power_limit_w": g["power_limit_w"],
            "power_default_limit_w": g["power_default_limit_w"], "power_max_limit_w": g["power_max_limit_w"],
            "temperature_c": g["temperature_c"], "memory_temperature_c": g["memory_temperature_c"],
            "utilization_pct": g["utilization_pct"], "throttle_reasons": list(g["throttle_reasons"]),
            "pcie": {"gen": g["pcie_gen"], "max_gen": g["pcie_max_gen"], "width": g["pcie_width"],
                     "max_width": g["pcie_max_width"], "device_max_gen": g["pcie_device_max_gen"],
                     "replay_errors": g["pcie_replay"]},
            "sm_clock_hz": g["sm_clock_mhz"] * 10**6, "mem_clock_hz": g["mem_clock_mhz"] * 10**6,
            "sm_clock_max_hz": g["sm_clock_max_mhz"] * 10**6, "mem_clock_max_hz": g["mem_clock_max_mhz"] * 10**6,
            "fb_total_bytes": g["fb_total_mib"] * 2**20, "fb_used_bytes": g["fb_used_mib"] * 2**20,
            "fb_free_bytes": g["fb_free_mib"] * 2**20, "nvlink_count": 18,
            "nvlink": [{"link": k, "active": True, "speed_mbps": 26562} for k in range(18)],
            "fabric": fabric_from(g["fabric"]),
        })
    return {"nvml": {"driver_version": smi["driver_version"]}, "gpus": gpus}


def verdicts(rows, scope: str) -> dict[str, str]:
    return {r.field: r.verdict for r in rows if r.scope == scope}


def row_of(rows, scope: str, field: str):
    return next(r for r in rows if (r.scope, r.field) == (scope, field))


@pytest.mark.parametrize("name", ["qx-h100.xml", "qx-b200.xml", "qx-gb200.xml"])
def test_a_sample_that_agrees_matches_everywhere(name):
    smi = compare.parse_smi_xml(capture(name).read_bytes())
    rows = compare.compare(smi, sample_from(smi))
    bad = [r for r in rows if r.verdict not in ("match", "smi only", "nvmon only")]
    assert not bad, bad
    # nvmon's one gap is named, not hidden: the minimum power limit.
    assert {r.field for r in rows if r.verdict == "smi only"} == {"power limit min"}
    fabric = {r.field for r in rows if r.field.startswith("fabric") and r.verdict == "match"}
    assert {"fabric state", "fabric status", "fabric clique id", "fabric cluster uuid"} <= fabric
    assert sum(r.verdict == "match" for r in rows) >= 29 * len(smi["gpus"])


def test_differences_are_found_field_by_field(h100):
    sample = sample_from(h100)
    g = sample["gpus"][3]
    g["pcie"]["width"] = 8
    g["power_limit_w"] = 450.0
    g["sm_clock_max_hz"] = 1755 * 10**6
    g["name"] = "NVIDIA H800"
    g["power_w"] += 5.0  # live: within tolerance
    g["temperature_c"] += 9  # live: beyond it
    g["pcie"]["replay_errors"] += 2  # a lifetime counter read later may only have risen
    v = verdicts(compare.compare(h100, sample), "gpu 3")
    assert v["PCIe width"] == v["power limit (enforced)"] == v["SM clock max"] == v["name"] == "DIFFERS"
    assert v["power draw"] == "close" and v["temperature"] == "DIFFERS"
    assert v["PCIe replays (lifetime)"] == "close"
    assert verdicts(compare.compare(h100, sample), "gpu 2")["PCIe width"] == "match"


def test_gpus_paired_by_bus_id_whatever_the_order(h100):
    sample = sample_from(h100)
    sample["gpus"].reverse()
    rows = compare.compare(h100, sample)
    assert verdicts(rows, "node")["GPU pairing"] == "match"
    assert all(r.verdict in ("match", "smi only", "nvmon only") for r in rows)


def test_different_bus_ids_pair_by_position_and_say_so(h100):
    sample = sample_from(h100)
    sample["gpus"][0]["pci_bus_id"] = "00000000:18:00.0"
    sample["gpus"].pop()
    rows = compare.compare(h100, sample)
    assert verdicts(rows, "node") == {"driver version": "match", "GPUs": "DIFFERS", "GPU pairing": "DIFFERS"}
    assert verdicts(rows, "gpu 0")["bus id"] == "DIFFERS"
    assert verdicts(rows, "gpu 7") == {"present": "smi only"}


def test_nvlink_status_parsed_and_compared_per_link(h100):
    nvl = compare.parse_nvlink_status(NVLINK_S_H100_PCIE)
    assert nvl[0]["uuid"] == "GPU-6968dfc2-d444-d92c-c36b-6abe53445cb9"
    assert [k for k, v in nvl[0]["links"].items() if v is None] == [4, 5, 10, 11, 16, 17]
    assert set(v for v in nvl[0]["links"].values() if v is not None) == {26.562}
    sample = sample_from(h100)
    links = sample["gpus"][0]["nvlink"]
    for lk in links:
        lk["active"] = lk["link"] not in (4, 5, 10, 11, 16, 17)
    v = verdicts(compare.compare(h100, sample, nvlink=nvl), "gpu 0")
    assert v["NVLink links"] == v["NVLink active links"] == v["NVLink speed per link"] == "match"
    links[6]["speed_mbps"] = 13281  # half speed on one link
    links[4]["active"] = True  # and one nvidia-smi calls inactive
    rows = [r for r in compare.compare(h100, sample, nvlink=nvl) if r.scope == "gpu 0"]
    by = {r.field: r for r in rows}
    assert by["NVLink active links"].verdict == "DIFFERS"
    assert by["NVLink speed per link"].verdict == "DIFFERS" and "link 6" in by["NVLink speed per link"].note
    # GPU 1 is not in this nvlink -s output at all
    assert verdicts(compare.compare(h100, sample, nvlink=nvl), "gpu 1")["NVLink links"] == "nvmon only"


def test_fabric_read_by_nvmon_compared_with_the_xml(h100, b200, gb200):
    """nvmon's own fabric reading (sample JSON gpus[].fabric) against nvidia-smi's <fabric>, on the
    three captures: every field either reports, the health fields only where one of them does."""
    v = verdicts(compare.compare(gb200, sample_from(gb200)), "gpu 0")
    fabric = {k: x for k, x in v.items() if k.startswith("fabric")}
    assert fabric == {"fabric state": "match", "fabric status": "match", "fabric clique id": "match",
                      "fabric cluster uuid": "match", "fabric health summary": "match",
                      "fabric health bandwidth": "match", "fabric health route recovery in progress": "match",
                      "fabric health route unhealthy": "match", "fabric health access timeout recovery": "match"}
    v = verdicts(compare.compare(b200, sample_from(b200)), "gpu 0")
    assert v["fabric health summary"] == v["fabric health access timeout recovery"] == "match"
    assert "fabric health bandwidth" not in v  # N/A in the capture, not in nvmon's mask either
    v = verdicts(compare.compare(h100, sample_from(h100)), "gpu 0")
    assert v["fabric state"] == "match" and "fabric health summary" not in v  # H100: N/A, nvmon none either


def test_fabric_differences_are_found(gb200):
    sample = sample_from(gb200)
    f = sample["gpus"][1]["fabric"]
    f["state"], f["status"] = 2, None  # Fabric Manager stopped: In Progress (NVML-FACTS §8)
    sample["gpus"][2]["fabric"]["health_mask"] |= 1  # degraded bandwidth: Degraded where smi says Full
    sample["gpus"][2]["fabric"]["health_mask"] &= ~2
    sample["gpus"][3]["fabric"]["health_summary"] = 3
    sample["gpus"][0]["fabric"]["cluster_uuid"] = "00000001-0000-0000-0000-000000000001".upper()  # case only
    rows = compare.compare(gb200, sample)
    by = {(r.scope, r.field): r for r in rows}
    assert by[("gpu 1", "fabric state")].verdict == "DIFFERS" and "Fabric Manager" in by[("gpu 1", "fabric state")].note
    assert (by[("gpu 1", "fabric state")].smi, by[("gpu 1", "fabric state")].nvmon) == ("Completed", "In Progress")
    assert by[("gpu 1", "fabric status")].verdict == "smi only"
    assert (by[("gpu 2", "fabric health bandwidth")].verdict, by[("gpu 2", "fabric health bandwidth")].nvmon) == \
        ("DIFFERS", "Degraded")
    assert by[("gpu 3", "fabric health summary")].nvmon == "Limited Capacity"
    assert by[("gpu 3", "fabric health summary")].verdict == "DIFFERS"
    assert by[("gpu 0", "fabric cluster uuid")].verdict == "match"
    # A GPU nvmon reads no fabric for (all None: Not Supported) while nvidia-smi shows one: nvmon's gap.
    sample["gpus"][0]["fabric"] = fabric_from(None)
    v = verdicts(compare.compare(gb200, sample), "gpu 0")
    assert v["fabric state"] == v["fabric clique id"] == v["fabric health summary"] == "smi only"
    # Neither has a fabric (a PCIe card): no fabric rows at all.
    pcie = copy.deepcopy(gb200)
    pcie["gpus"][0]["fabric"] = None
    assert not [k for k in verdicts(compare.compare(pcie, sample), "gpu 0") if k.startswith("fabric")]
    # Both a failure: nvmon has NVML's return code, nvidia-smi its text.
    failed = copy.deepcopy(gb200)
    failed["gpus"][0]["fabric"]["status"] = "Insufficient Resources"
    sample["gpus"][0]["fabric"] = {**fabric_from(gb200["gpus"][0]["fabric"]), "status": 23}
    row = row_of(compare.compare(failed, sample), "gpu 0", "fabric status")
    assert (row.verdict, row.nvmon) == ("close", "NVML return 23")


def test_fabric_rows_name_the_kits_nvml_probe_where_it_disagrees(gb200):
    probe = [{"index": i, "state": "Completed", "status": "Success", "clique_id": 2,
              "cluster_uuid": "00000001-0000-0000-0000-000000000001", "health_summary": "Healthy"} for i in range(4)]
    sample = sample_from(gb200)
    rows = compare.compare(gb200, sample, fabric=probe)
    assert all(r.verdict == "match" for r in rows if r.field.startswith("fabric"))
    probe[1]["clique_id"] = 7
    row = row_of(compare.compare(gb200, sample, fabric=probe), "gpu 1", "fabric clique id")
    assert row.verdict == "match"  # nvidia-smi and nvmon agree; the note is there for a mismatch only
    sample["gpus"][1]["fabric"]["clique_id"] = 5
    row = row_of(compare.compare(gb200, sample, fabric=probe), "gpu 1", "fabric clique id")
    assert row.verdict == "DIFFERS" and "the kit's direct NVML probe says 7" in row.note
    sample["gpus"][0]["fabric"] = fabric_from(None)
    failed = [{"index": 0, "error": "Not Supported"}]
    row = row_of(compare.compare(gb200, sample, fabric=failed), "gpu 0", "fabric state")
    assert row.verdict == "smi only" and "Not Supported" in row.note


def test_an_idle_gpus_pcie_generation_below_its_maximum_is_explained(h100):
    """The simulator's idle Gen1 against the idle H100 capture's Gen5 (docs/hardware.md): not a
    difference while the GPU idles; the same gap under load is one."""
    assert h100["gpus"][0]["throttle_reasons"] == ["gpu_idle"] and h100["gpus"][0]["pcie_gen"] == 5
    sample = sample_from(h100)
    sample["gpus"][0]["pcie"]["gen"] = 1
    row = row_of(compare.compare(h100, sample), "gpu 0", "PCIe gen")
    assert row.verdict == "close" and "idle" in row.note
    busy = copy.deepcopy(h100)
    busy["gpus"][0]["throttle_reasons"] = []
    sample["gpus"][0]["throttle_reasons"] = []
    row = row_of(compare.compare(busy, sample), "gpu 0", "PCIe gen")
    assert row.verdict == "DIFFERS"
    sample["gpus"][0]["throttle_reasons"] = ["gpu_idle"]  # idle, but beyond the link's maximum: a difference
    sample["gpus"][0]["pcie"]["gen"] = 6
    row = row_of(compare.compare(h100, sample), "gpu 0", "PCIe gen")
    assert row.verdict == "DIFFERS"


def test_older_xml_layout_and_bad_input():
    old = """<?xml version="1.0" ?><nvidia_smi_log><driver_version>525.85.12</driver_version>
    <attached_gpus>1</attached_gpus><gpu id="00000000:07:00.0"><product_name>NVIDIA A100-SXM4-80GB</product_name>
    <power_readings><power_draw>61.20 W</power_draw><power_limit>400.00 W</power_limit>
    <default_power_limit>400.00 W</default_power_limit><enforced_power_limit>400.00 W</enforced_power_limit>
    <min_power_limit>100.00 W</min_power_limit><max_power_limit>400.00 W</max_power_limit></power_readings>
    <clocks_throttle_reasons><clocks_throttle_reason_gpu_idle>Active</clocks_throttle_reason_gpu_idle>
    <clocks_throttle_reason_sw_power_cap>Not Active</clocks_throttle_reason_sw_power_cap></clocks_throttle_reasons>
    <temperature><gpu_temp>31 C</gpu_temp><memory_temp>N/A</memory_temp></temperature></gpu></nvidia_smi_log>"""
    g = compare.parse_smi_xml(old)["gpus"][0]
    assert (g["power_draw_w"], g["power_limit_w"], g["power_min_limit_w"]) == (61.2, 400.0, 100.0)
    assert g["throttle_reasons"] == ["gpu_idle"] and g["memory_temperature_c"] is None and g["fabric"] is None
    for bad in ("<nvidia_smi_log><gpu>", "not xml at all", "<other/>"):
        with pytest.raises(compare.CaptureError) as e:
            compare.parse_smi_xml(bad)
        assert "\n" not in str(e.value)


def test_render_table_and_summary(h100):
    sample = copy.deepcopy(sample_from(h100))
    sample["gpus"][0]["pcie"]["width"] = 4
    rows = compare.compare(h100, sample)
    text = compare.render(rows)
    assert text.splitlines()[0].split()[:5] == ["scope", "field", "nvidia-smi", "nvmon", "verdict"]
    assert text.rstrip().splitlines()[-1].startswith("summary: 1 DIFFERS")
    only = compare.render(rows, only=("DIFFERS",))
    assert len(only.splitlines()) == 5 and "PCIe width" in only  # header, rule, one row, blank, summary
