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
        })
    return {"nvml": {"driver_version": smi["driver_version"]}, "gpus": gpus}


def verdicts(rows, scope: str) -> dict[str, str]:
    return {r.field: r.verdict for r in rows if r.scope == scope}


@pytest.mark.parametrize("name", ["qx-h100.xml", "qx-b200.xml", "qx-gb200.xml"])
def test_a_sample_that_agrees_matches_everywhere(name):
    smi = compare.parse_smi_xml(capture(name).read_bytes())
    rows = compare.compare(smi, sample_from(smi))
    bad = [r for r in rows if r.verdict not in ("match", "smi only", "nvmon only")]
    assert not bad, bad
    # nvmon's gaps are named, not hidden: the minimum power limit and the fabric state.
    gaps = {r.field for r in rows if r.verdict == "smi only"}
    assert {"power limit min", "fabric state", "fabric status", "fabric clique id"} <= gaps
    assert sum(r.verdict == "match" for r in rows) >= 25 * len(smi["gpus"])


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


def test_fabric_compared_with_the_kits_nvml_probe(gb200):
    probe = [{"index": i, "state": "Completed", "status": "Success", "clique_id": 2,
              "cluster_uuid": "00000001-0000-0000-0000-000000000001", "health_summary": "Healthy"} for i in range(4)]
    v = verdicts(compare.compare(gb200, sample_from(gb200), fabric=probe), "gpu 0")
    assert v["fabric state"] == v["fabric clique id"] == v["fabric cluster uuid"] == v["fabric health summary"] == "match"
    probe[1]["state"] = "In Progress"  # Fabric Manager stopped (NVML-FACTS §8)
    assert verdicts(compare.compare(gb200, sample_from(gb200), fabric=probe), "gpu 1")["fabric state"] == "DIFFERS"
    failed = [{"index": 0, "error": "Not Supported"}]
    rows = [r for r in compare.compare(gb200, sample_from(gb200), fabric=failed) if r.scope == "gpu 0"]
    state = next(r for r in rows if r.field == "fabric state")
    assert state.verdict == "smi only" and "Not Supported" in state.note


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
