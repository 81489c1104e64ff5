"""The wire contract, example by example: payloads built from simulated boards read back to the
same facts, the sample stays under its size target, and readers refuse what breaks the contract."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from nvmon.collect.node import NodeSampler
from nvmon.sim.node import SimNode
from nvmon.specs import NodeSpec
from nvmon.fleet.summary import Facts
from nvmon.wire.contract import (
    MAX_PAYLOAD_BYTES,
    Alert,
    AlertSet,
    Inventory,
    Status,
    Tick,
    WireError,
    parse_topic,
    subscription,
    topic,
    valid_name,
)
from nvmon.wire.payloads import (
    alerts_payload,
    inventory_payload,
    layout_id,
    parse_message,
    sample_payload,
    status_payload,
)
from samplefactory import healthy_sample

T = {kind: topic("c1", "gpu-node-01", kind) for kind in ("status", "inventory", "sample", "alerts")}


class Clock:
    def __init__(self, t: float = 1_700_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def sim_ticks(spec: str, n: int, node: str = "gpu-node-01"):
    """`n` consecutive samples (after a warm-up tick) of a simulated board."""
    clock = Clock()
    sim = SimNode(spec, clock=clock)
    try:
        sampler = NodeSampler(sim.nvml, sysfs_root=sim.sysfs_root, node=node, before_tick=sim.sync, clock=clock)
        sampler.open()
        sampler.sample()
        out = []
        for _ in range(n):
            clock.t += 1
            out.append(sampler.sample())
        return out
    finally:
        sim.close()


def read(kind: str, payload: bytes):
    return parse_message(T[kind], payload)


# --- topics --------------------------------------------------------------------------------


@pytest.mark.parametrize("name,ok", [
    ("gpu-node-01", True), ("a.b_c-D9", True), ("x" * 64, True), ("", False), ("x" * 65, False),
    ("a/b", False), ("+", False), ("#", False), ("a b", False), ("..", False), (".", False),
    ("n\x1b[31m", False), ("nöde", False), (None, False), (7, False),
])
def test_valid_name(name, ok):
    assert valid_name(name) is ok


def test_topic_helpers():
    assert topic("c1", "n1", "sample") == "nvmon/v1/c1/n1/sample"
    assert parse_topic("nvmon/v1/c1/n1/status") == ("c1", "n1", "status")
    assert subscription() == "nvmon/v1/+/+/+"
    assert subscription("c1", kind="status") == "nvmon/v1/c1/+/status"
    for bad in (("c/1", "n", "sample"), ("c", "n#", "sample"), ("c", "n", "metrics")):
        with pytest.raises(ValueError):
            topic(*bad)
    for bad in ("nvmon/v1/c1/n1", "nvmon/v2/c1/n1/sample", "nvmon/v1/c+/n1/sample", "nvmon/v1/c1/n1/x", "x" * 300):
        with pytest.raises(WireError):
            parse_topic(bad)


# --- sample ------------------------------------------------------------------------------


def test_sample_reads_back_within_its_rounding():
    s = sim_ticks("hgx-h100,seed=3", 2)[-1]
    payload = sample_payload(s)
    tick = read("sample", payload)
    assert isinstance(tick, Tick) and (tick.cluster, tick.node) == ("c1", "gpu-node-01")
    assert tick.ts == s.ts and tick.interval_s == pytest.approx(s.interval_s) and tick.layout == layout_id(s)
    assert len(tick.gpus) == 8 and len(tick.ib) == 8
    for g, w in zip(s.gpus, tick.gpus):
        assert w.index == g.index and not w.lost
        assert w.power_w == pytest.approx(g.power_w, abs=0.05)
        assert (w.temperature_c, w.utilization_pct) == (g.temperature_c, g.utilization_pct)
        assert (w.pcie_gen, w.pcie_width) == (g.pcie.gen, g.pcie.width)
        assert w.pcie_tx_bytes_per_s == round(g.pcie.tx_bytes_per_s)
        # per-GPU NVLink totals are exact; per-link values are within half a percent of the link speed
        assert w.nvlink_tx_bytes_per_s == round(sum(lk.tx_bytes_per_s for lk in g.nvlink))
        assert w.link_ref_mbps == 26562 and len(w.link_tx_pct) == 18
        for lk in g.nvlink:
            tx, rx = w.link_bytes_per_s(lk.link)
            assert tx == pytest.approx(lk.tx_bytes_per_s, abs=0.005 * 26562e6)
            assert rx == pytest.approx(lk.rx_bytes_per_s, abs=0.005 * 26562e6)
            assert w.link_active(lk.link) is True
        assert w.throttle_reasons == () and w.links_down == () and w.link_errors == {}
    for p, w in zip(s.ib, tick.ib):
        assert (w.rate_gbps, w.state, w.phys_state) == (p.rate_gbps, "ACTIVE", "LinkUp")
        assert w.tx_bytes_per_s == round(p.tx_bytes_per_s)
    assert tick.nvml_error is None and tick.cpu_pct is not None


def test_uniform_columns_travel_as_one_number_and_read_back_per_gpu():
    s = sim_ticks("hgx-h100,pcie_width=6:8", 2)[-1]
    d = json.loads(sample_payload(s))
    # the board's limits, PCIe gen and link speed agree: one number each; the x8 GPU keeps pw a list
    assert (d["pl"], d["pg"], d["ls"]) == (700, 5, 26562) and d["pw"] == [16] * 6 + [8, 16]
    assert isinstance(d["p"], list) and len(d["p"]) == 8  # the GPU count
    tick = read("sample", sample_payload(s))
    assert [(w.power_limit_w, w.pcie_gen, w.pcie_width, w.link_ref_mbps) for w in tick.gpus] == [
        (700.0, 5, 8 if g.index == 6 else 16, 26562) for g in s.gpus]
    # a single GPU's columns stay lists (nothing to save), and so does a column of nulls
    one = json.loads(sample_payload(replace(s, gpus=s.gpus[:1])))
    assert all(isinstance(one[k], list) for k in ("p", "pl", "pg", "pw", "ls")), one
    unread = json.loads(sample_payload(replace(s, gpus=tuple(replace(g, temperature_c=None) for g in s.gpus))))
    assert unread["t"] == [None] * 8


def test_sample_carries_faults_sparsely():
    s = sim_ticks("hgx-h100,nvlink_down=2.5,nvlink_errors=3.1,ib_down=4,ib_errors=mlx5_2,thermal=3,"
                  "pcie_width=6:8,power_cap=1", 3)[-1]
    tick = read("sample", sample_payload(s))
    g = {w.index: w for w in tick.gpus}
    assert g[2].links_down == (5,) and g[2].link_active(5) is False
    assert g[3].link_errors[1]["crc_flit"] > 0 and set(g[3].link_errors) == {1}
    assert "sw_thermal" in g[3].throttle_reasons and g[3].temperature_c == 92
    assert g[1].power_limit_w < 700 and "sw_power_cap" in g[1].throttle_reasons
    assert g[6].pcie_width == 8
    assert (tick.ib[4].state, tick.ib[4].phys_state) == ("DOWN", "Polling")
    assert tick.ib[2].errors_delta["symbol_error"] > 0 and tick.ib[0].errors_delta == {}


def test_sample_carries_the_nodes_findings_without_info():
    from nvmon.audit import audit

    s = sim_ticks("hgx-h100,nvlink_down=2.5,pcie_width=6:8,ib_pcie_width=mlx5_1,ib_rate=3", 3)[-1]
    report = audit(s)
    tick = read("sample", sample_payload(s, report.findings))
    assert [(f.code, f.severity, f.gpu, f.link, f.device, f.port) for f in tick.findings] == [
        (f.code, f.severity, f.gpu, f.link, f.device, f.port) for f in report.findings if f.severity != "info"]
    assert {f.code for f in tick.findings} == {"nvlink.link_down", "pcie.width", "ib.rate"}
    assert b'"f"' not in sample_payload(s) and read("sample", sample_payload(s)).findings == ()  # an older daemon


def test_lost_gpu_and_missing_nvml():
    s = sim_ticks("hgx-h100,gpu_lost=4", 1)[-1]
    w = read("sample", sample_payload(s)).gpus[4]
    assert w.lost and w.power_w is None and w.link_tx_pct == () and w.link_ref_mbps is None
    s = sim_ticks("hgx-h100,nvml=off", 1)[-1]
    tick = read("sample", sample_payload(s))
    assert tick.gpus == () and "not loaded" in tick.nvml_error.lower() and len(tick.ib) == 8


def test_gpu_indices_other_than_0_to_n_are_sent_explicitly():
    from dataclasses import replace

    s = healthy_sample(n_gpus=2)
    s = replace(s, gpus=(replace(s.gpus[0], index=3), replace(s.gpus[1], index=5)))
    d = json.loads(sample_payload(s))
    assert d["gi"] == [3, 5]
    assert [w.index for w in read("sample", sample_payload(s)).gpus] == [3, 5]


@pytest.mark.parametrize("spec", ["hgx-h100", "hgx-h100,load=busy", "hgx-h200", "hgx-b200"])
def test_average_sample_payload_is_under_2_kb_for_8_gpus_18_links_8_ports(spec):
    # The host block is this machine's (CPU %, memory %, load): held at a busy node's widths so the
    # figure is the board's, not the test machine's mood.
    from nvmon.model import HostSample

    busy_host = HostSample(hostname="gpu-node-01", kernel="6.8.0", cpu_pct=87.5, mem_used_pct=43.2, load1=31.07)
    ticks = [replace(s, host=busy_host) for s in sim_ticks(spec, 30)]
    sizes = [len(sample_payload(s)) for s in ticks]
    assert sum(sizes) / len(sizes) <= 2048, sizes


# --- inventory -----------------------------------------------------------------------------


def test_inventory_reads_back():
    s = sim_ticks("hgx-h100", 1)[-1]
    labels = {"pool": "[bold red]train[/]", "owner": "\x1b[2J\x1b[31mops"}
    payload = inventory_payload(s, cluster="c1", rack="R12", labels=labels, spec=NodeSpec(gpus=8, ib_ports=8))
    assert len(payload) < MAX_PAYLOAD_BYTES
    inv = read("inventory", payload)
    assert isinstance(inv, Inventory) and inv.rack == "R12" and inv.labels == labels  # kept literally
    assert inv.layout == layout_id(s) and inv.topology_class == "nvswitch" and inv.topology_matrix[0][1] == "NV18"
    for g, w in zip(s.gpus, inv.gpus):
        assert (w.model, w.uuid, w.serial, w.bus_id) == (g.name, g.uuid, g.serial, g.pci_bus_id)
        assert len(w.links) == 18 and {lk.remote_type for lk in w.links} == {"nvswitch"}
        assert w.links[3].speed_mbps == 26562 and w.pcie.max_width == 16
    assert [(p.device, p.port, p.rate_gbps) for p in inv.ib] == [(p.device, p.port, p.rate_gbps) for p in s.ib]
    assert len(inv.nvswitches) == 4 and inv.driver_version == s.nvml.driver_version
    assert inv.spec["node"]["gpus"] == 8 and inv.spec["models"][0]["key"] == "H100-SXM"
    # Counts stay integers through the reader: the fleet view compares ib_ports with ports up.
    assert type(inv.spec["node"]["ib_ports"]) is int and type(inv.spec["models"][0]["power_limit_w"]) is int
    assert Facts.of(inv).ib_expected == 8
    # the catalog's static metrics come back by name, in the metric's units
    facts = inv.gpus[0].facts
    assert {k: facts[k] for k in ("sm_clock_max_hz", "mem_clock_max_hz", "fb_total_bytes")} == {
        "sm_clock_max_hz": 1_980_000_000, "mem_clock_max_hz": 2_619_000_000,
        "fb_total_bytes": s.gpus[0].values["fb_total_bytes"]}


def test_inventory_without_the_catalogs_facts_reads_and_a_bad_one_is_refused():
    d = json.loads(inventory_payload(healthy_sample(), cluster="c1"))
    for g in d["gpus"]:
        del g["sm_clock_max_hz"], g["fb_total_bytes"]  # an older daemon's inventory: no such keys
    inv = read("inventory", json.dumps(d).encode())
    assert "mem_clock_max_hz" in inv.gpus[0].facts and not {"sm_clock_max_hz", "fb_total_bytes"} & set(inv.gpus[0].facts)
    d["gpus"][1]["fb_total_bytes"] = "80 GB"
    with pytest.raises(WireError, match=r"gpus\[1\]\.fb_total_bytes: expected number"):
        read("inventory", json.dumps(d).encode())


def test_inventory_must_match_its_topic():
    payload = inventory_payload(healthy_sample(), cluster="other")
    with pytest.raises(WireError, match="disagree"):
        read("inventory", payload)


def test_inventory_writer_refuses_bad_names_and_labels():
    s = healthy_sample()
    with pytest.raises(ValueError):
        inventory_payload(s, cluster="bad/cluster")
    with pytest.raises(ValueError):
        inventory_payload(s, cluster="c1", labels={"k": "v" * 300})


# --- status and alerts ---------------------------------------------------------------------


def test_status_round_trip():
    st = read("status", status_payload("offline", version="1.2", interval_s=1, ts=1_700_000_000.5, reason="lost"))
    assert st == Status("c1", "gpu-node-01", 1_700_000_000.5, "offline", "1.2", 1.0, "lost")
    with pytest.raises(ValueError):
        status_payload("maybe", version="1", interval_s=1, ts=0)


def alert(i: int, severity: str = "warning", summary: str = "x") -> Alert:
    return Alert(f"fp{i:05d}", "nvlink.errors", severity, "firing", summary, 1_700_000_000.0 + i, gpu=i % 8, link=i % 18)


def test_alerts_round_trip_most_severe_first():
    alerts = [alert(1, "info"), alert(2, "critical"), alert(3, "warning")]
    got = read("alerts", alerts_payload(alerts, ts=1_700_000_500.0))
    assert isinstance(got, AlertSet) and got.omitted == 0
    assert [a.severity for a in got.alerts] == ["critical", "warning", "info"]
    assert got.alerts[0] == alerts[1]


def test_alerts_over_the_size_limit_keep_the_most_severe_and_count_the_rest():
    alerts = [alert(i, "critical" if i < 10 else "info", summary="s" * 500) for i in range(300)]
    payload = alerts_payload(alerts, ts=1_700_000_500.0)
    assert len(payload) <= MAX_PAYLOAD_BYTES
    got = read("alerts", payload)
    assert got.omitted > 0 and len(got.alerts) + got.omitted == 300
    assert all(a.severity == "critical" for a in got.alerts[:10])


# --- readers refuse -----------------------------------------------------------------------

GOOD_STATUS = {"schema": 1, "ts": 1_700_000_000, "state": "online", "version": "1", "interval_s": 1}


def good_sample() -> dict:
    return json.loads(sample_payload(healthy_sample()))


def with_(d: dict, **kw) -> bytes:
    return json.dumps({**d, **kw}).encode()


@pytest.mark.parametrize("kind,payload,why", [
    ("status", b"", "invalid JSON"),
    ("status", b"\xff\xfe", "UTF-8"),
    ("status", b"[1,2]", "JSON object"),
    ("status", with_(GOOD_STATUS, schema=2), "schema"),
    ("status", with_(GOOD_STATUS, schema=True), "schema"),
    ("status", with_(GOOD_STATUS, schema="1"), "schema"),
    ("status", with_(GOOD_STATUS, state="dancing"), "online or offline"),
    ("status", b'{"schema":1,"ts":NaN,"state":"online"}', "non-finite"),
    ("status", b'{"schema":1,"ts":1e999,"state":"online"}', "outside"),
    ("status", b'{"schema":1,"ts":' + b"9" * 5000 + b',"state":"online"}', "too long"),
    ("status", with_(GOOD_STATUS, ts=-5), "outside"),
    ("status", with_(GOOD_STATUS, version="v" * 1000), "longer"),
    ("status", b"[" * 20000 + b"]" * 20000, "nested"),
    ("status", b" " * (MAX_PAYLOAD_BYTES + 1), "exceeds"),
    ("status", json.dumps({**GOOD_STATUS, "version": "\ud800"}).encode(), "Unicode"),
    ("sample", with_(good_sample(), pt=[-1] * 8), "outside"),
    ("sample", with_(good_sample(), p=[1.0] * 1_000_000), "exceeds"),
    ("sample", with_(good_sample(), p=[1.0] * 1000), "items"),
    ("sample", with_(good_sample(), t=[True] * 8), "number"),
    ("sample", with_(good_sample(), lt=[[5] * 100] * 8), "items"),
    ("sample", with_(good_sample(), lt=[[5] * 18] * 7 + [[5] * 17 + [True]]), r"lt\[7\]\[17\]: expected integer"),
    ("sample", with_(good_sample(), lr=[[5] * 18] * 7 + ["x"]), r"lr\[7\]: expected list"),
    ("sample", with_(good_sample(), lt=[[5] * 18] * 7 + [[5] * 17 + [1001]]), r"lt\[7\]\[17\]: 1001 outside"),
    ("sample", with_(good_sample(), lt=[[5] * 18] * 7), "7 items, expected 8"),
    ("sample", with_(good_sample(), ld={"9": [1]}), "GPU index"),
    ("sample", with_(good_sample(), le={"0.99": {"crc_flit": 1}}), "GPU.LINK"),
    ("sample", with_(good_sample(), ie={"42": {"symbol_error": 1}}), "port position"),
    ("sample", with_(good_sample(), lay="not-hex!"), "hex"),
    ("sample", with_(good_sample(), gi=[0, 0, 1, 2, 3, 4, 5, 6]), "repeat"),
    # the whole-column fast paths must refuse what the item-by-item checks refuse, wherever it hides
    ("sample", with_(good_sample(), p=[1.0] * 3 + [True] + [1.0] * 4), r"p\[3\]: expected number"),
    ("sample", with_(good_sample(), pg=[5] * 7 + [5.0]), r"pg\[7\]: expected integer"),
    ("sample", with_(good_sample(), pw=[16] * 3 + [None, 65] + [16] * 3), r"pw\[4\]: 65 outside"),
    ("sample", with_(good_sample(), t=[None, 60, 1e300, 60, 60, 60, 60, 60]).replace(b"1e+300", b"1e999"),
     r"t\[2\]: inf outside"),
    ("sample", with_(good_sample(), u=[50] * 4 + [1000.5] + [50] * 3), r"u\[4\]: 1000.5 outside"),
    ("sample", with_(good_sample(), nt=[1] * 5 + [10**15 + 1] + [1] * 2), r"nt\[5\]: \d+ outside"),
    ("sample", with_(good_sample(), lr=[[5] * 18] * 2 + [[5] * 9 + [False] + [5] * 8] + [[5] * 18] * 5),
     r"lr\[2\]\[9\]: expected integer"),
    ("sample", with_(good_sample(), lr=[[5] * 18] * 2 + [[5] * 9 + [-1] + [5] * 8] + [[5] * 18] * 5), r"lr\[2\]\[9\]: -1"),
    ("sample", with_(good_sample(), lr=[[5] * 18] * 7 + [[5] * 17]), "differ in length"),
    ("sample", with_(good_sample(), gi=[0, 1, 2, 3, 4, 5, 6, True]), r"gi\[7\]: expected integer"),
    ("sample", with_(good_sample(), gi=[0, 1, 2, 3, None, 5, 6, 7]), r"gi\[4\]: expected integer"),
    ("sample", with_(good_sample(), lost=[None]), r"lost\[0\]: expected integer"),
    ("sample", with_(good_sample(), ld={"2": [17, 18]}), r"ld.2\[1\]: 18 outside"),
    ("sample", with_(good_sample(), xe={"2": [13, 2**32]}), r"xe.2\[1\]: \d+ outside"),
    ("sample", with_(good_sample(), it=[1] * 7 + [1.5]), r"it\[7\]: expected integer"),
    ("sample", with_(good_sample(), ig=[400] * 7 + [1e300]).replace(b"1e+300", b"1e999"), r"ig\[7\]: inf outside"),
    ("sample", with_(good_sample(), h=[1.0, 2.0]), "h: 2 items"),
    # a uniform column sent as one number is checked as the column it stands for; `p` gives the count
    ("sample", with_(good_sample(), pw=65), r"pw\[0\]: 65 outside"),
    ("sample", with_(good_sample(), pg=True), "pg: expected list, got bool"),
    ("sample", with_(good_sample(), ls="26562"), "ls: expected list, got str"),
    ("sample", with_(good_sample(), pl=1e300).replace(b"1e+300", b"1e999"), r"pl\[0\]: inf outside"),
    ("sample", with_(good_sample(), p=551.4), "p: expected list"),
    ("sample", with_(good_sample(), f=[["pcie.width", "fatal", 3]]), r"f\[0\]: unknown severity"),
    ("sample", with_(good_sample(), f=[["\x1b[2J", "warning"]]), r"f\[0\]: bad finding code"),
    ("sample", with_(good_sample(), f=[["ib.rate", "warning", None, None, "mlx5_0", -1]]), r"f\[0\]: -1 outside"),
    ("sample", with_(good_sample(), f=[["ib.rate"]]), r"f\[0\]: expected \[code"),
    ("sample", with_(good_sample(), f=[["gpu.lost", "critical"]] * 257), r"f: 257 items"),
    ("alerts", with_({"schema": 1, "ts": 1}, alerts=[{"fingerprint": "a", "code": "c", "severity": "bad",
                                                        "state": "firing", "since": 1}]), "severity"),
    ("inventory", with_({"schema": 1, "ts": 1, "node": "gpu-node-01", "cluster": "c1", "layout": "ab"},
                        gpus=[{"index": 0}] * 65), "items"),
])
def test_readers_refuse(kind, payload, why):
    with pytest.raises(WireError, match=why) as e:
        read(kind, payload)
    assert "\n" not in str(e.value) and len(str(e.value)) < 200


def test_reader_refuses_non_bytes_and_bad_topics():
    with pytest.raises(WireError):
        parse_message(T["status"], "a string")
    with pytest.raises(WireError):
        parse_message("nvmon/v1/c1/n\x1b[2J/status", json.dumps(GOOD_STATUS).encode())


def test_unknown_keys_are_ignored_for_forward_compatibility():
    st = read("status", with_(GOOD_STATUS, future_field={"x": [1, 2]}))
    assert st.state == "online"
