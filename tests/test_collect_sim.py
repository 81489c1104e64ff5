"""The NVML collector and node sampler, run through the real pynvml wrappers over the simulator,
with a controlled clock so that rates can be checked exactly."""

from __future__ import annotations

import pytest

from nvmon.collect.node import NodeSampler
from nvmon.collect.nvml import NvmlCollector
from nvmon.sim.board import square_integral
from nvmon.sim.node import SimNode
from nvmon.sim.profiles import PROFILES


class Clock:
    def __init__(self, t: float = 1_700_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(spec: str, clock: Clock | None = None):
    clock = clock or Clock()
    node = SimNode(spec, clock=clock)
    sampler = NodeSampler(node.nvml, sysfs_root=node.sysfs_root, node="n1", before_tick=node.sync, clock=clock)
    sampler.open()
    return node, sampler, clock


@pytest.fixture
def h100():
    node, sampler, clock = make("hgx-h100,seed=3")
    yield node, sampler, clock
    node.close()


def two_ticks(sampler, clock, dt=1.0):
    sampler.sample()
    clock.t += dt
    return sampler.sample()


def test_nvlink_rate_is_exact_kib_delta_over_field_timestamps(h100):
    node, sampler, clock = h100
    b = node.board
    t0 = b.now()
    s = two_ticks(sampler, clock, 1.0)
    link = s.gpus[2].nvlink[7]
    kib0, kib1 = b.link_kib(2, 7, t0), b.link_kib(2, 7, t0 + 1.0)
    assert link.tx_bytes_per_s == pytest.approx((kib1[0] - kib0[0]) * 1024.0)
    assert link.rx_bytes_per_s == pytest.approx((kib1[1] - kib0[1]) * 1024.0)
    # and that is the all-reduce wave: between 2 % and 80 % of 26.562 GB/s
    assert 0.01 * 26.562e9 < link.tx_bytes_per_s < 0.81 * 26.562e9


def test_power_is_energy_slope(h100):
    node, sampler, clock = h100
    b = node.board
    t0 = b.now()
    s = two_ticks(sampler, clock, 2.0)
    expected = (b.energy_mj(0, t0 + 2) - b.energy_mj(0, t0)) / 1000 / 2.0
    assert s.gpus[0].power_w == pytest.approx(expected)
    assert 0.7 * 700 <= s.gpus[0].power_w <= 0.82 * 700


def test_static_facts_and_shapes(h100):
    _, sampler, clock = h100
    s = two_ticks(sampler, clock)
    assert len(s.gpus) == 8 and s.topology.class_ == "nvswitch"
    g = s.gpus[0]
    assert g.name == "NVIDIA H100 80GB HBM3" and g.uuid.startswith("GPU-") and g.pci_bus_id == "00000000:18:00.0"
    assert (g.power_limit_w, g.power_default_limit_w, g.power_max_limit_w) == (700.0, 700.0, 700.0)
    assert (g.pcie.gen, g.pcie.max_gen, g.pcie.width, g.pcie.max_width) == (5, 5, 16, 16)
    assert g.nvlink_count == 18 and len(g.nvlink) == 18
    assert all(lk.active and lk.version == 4 and lk.speed_mbps == 26562 for lk in g.nvlink)
    assert {lk.remote_type for lk in g.nvlink} == {"nvswitch"}
    assert s.topology.matrix[0][1] == "NV18"
    assert len(s.ib) == 8 and all(p.rate_gbps == 400 and p.rate_name == "NDR" for p in s.ib)
    assert len(s.nvswitches) == 4
    assert s.interval_s == pytest.approx(1.0)


def test_steady_state_costs_two_nvml_calls_per_gpu_per_tick(h100):
    _, sampler, clock = h100
    two_ticks(sampler, clock)
    before = sampler.nvml.calls[0]
    ticks = 40
    for _ in range(ticks):
        clock.t += 1
        sampler.sample()
    assert (sampler.nvml.calls[0] - before) / ticks / 8 == 2


def test_rotated_values_are_carried_over_and_refreshed():
    node, sampler, clock = make("hgx-h100,thermal=3@5")
    try:
        s = two_ticks(sampler, clock)
        assert s.gpus[3].temperature_c < 80 and s.gpus[3].throttle_reasons == ()
        seen_hot = False
        for _ in range(25):  # temperature is in the slow group: refreshed within 20 ticks
            clock.t += 1
            s = sampler.sample()
            assert s.gpus[3].temperature_c is not None
            seen_hot |= s.gpus[3].temperature_c == 92
        assert seen_hot and "sw_thermal" in s.gpus[3].throttle_reasons
    finally:
        node.close()


def test_gpu_lost_mid_run_leaves_the_others_flowing():
    node, sampler, clock = make("hgx-h100,gpu_lost=4@3")
    try:
        s = two_ticks(sampler, clock)
        assert not any(g.lost for g in s.gpus)
        clock.t += 3
        s = sampler.sample()
        lost = s.gpus[4]
        assert lost.lost and lost.power_w is None and lost.nvlink == ()
        assert lost.uuid is not None and lost.pci_bus_id == "00000000:9A:00.0"  # static facts kept
        clock.t += 1
        s = sampler.sample()
        for g in s.gpus:
            if g.index != 4:
                assert not g.lost and g.power_w is not None and g.nvlink[0].tx_bytes_per_s is not None
        assert s.topology.class_ == "nvswitch"  # judged on the GPUs that answer
    finally:
        node.close()


def test_gpu_lost_from_start_is_reported_not_fatal():
    node, sampler, clock = make("hgx-h100,gpu_lost=0")
    try:
        s = two_ticks(sampler, clock)
        assert s.gpus[0].lost and not s.gpus[1].lost and len(s.gpus) == 8
    finally:
        node.close()


@pytest.mark.parametrize("what,check,caps", [
    ("temperature", lambda g: g.temperature_c is None, ["temperature"]),
    ("utilization", lambda g: g.utilization_pct is None, ["utilization"]),
    ("throttle", lambda g: g.throttle_reasons is None, ["throttle"]),
    ("pcie_bytes", lambda g: g.pcie.tx_bytes_per_s is None and g.pcie.rx_bytes_per_s is None, ["pcie_rx", "pcie_tx"]),
])
def test_unsupported_query_is_local_to_that_value(what, check, caps):
    node, sampler, clock = make(f"hgx-h100,notsup={what}:2")
    try:
        s = two_ticks(sampler, clock)
        assert check(s.gpus[2])
        assert not check(s.gpus[1])
        assert s.nvml.capabilities["unsupported"] == {c: [2] for c in caps}
        assert s.gpus[2].power_w is not None and s.gpus[2].nvlink[0].tx_bytes_per_s is not None
    finally:
        node.close()


def test_energy_unsupported_falls_back_to_power_usage():
    node, sampler, clock = make("hgx-h100,notsup=energy:1")
    try:
        s = two_ticks(sampler, clock)
        assert s.gpus[1].energy_j is None and s.gpus[1].power_w is not None and s.gpus[1].power_w > 100
    finally:
        node.close()


def test_link_state_field_unsupported_falls_back_to_getter():
    node, sampler, clock = make("hgx-h100,notsup=nvlink_state_field,nvlink_down=1.4")
    try:
        s = two_ticks(sampler, clock)
        assert [lk.active for lk in s.gpus[1].nvlink].count(False) == 1
        assert s.gpus[1].nvlink[4].active is False
        assert all(lk.active for lk in s.gpus[0].nvlink)
    finally:
        node.close()


def test_blackwell_error_fields_unsupported_are_null_not_zero():
    node, sampler, clock = make("hgx-b200")
    try:
        s = two_ticks(sampler, clock)
        link = s.gpus[0].nvlink[0]
        assert link.errors == {"crc_flit": None, "crc_data": None, "replay": None, "recovery": None}
        assert link.tx_bytes_per_s is not None and link.version == 5 and link.remote_pci_bus_id is None
        assert "nvlink_replay" in s.nvml.capabilities["unsupported"]
    finally:
        node.close()


def test_error_deltas_not_absolute_counts():
    node, sampler, clock = make("hgx-h100,nvlink_errors=2.3")
    try:
        s = two_ticks(sampler, clock, 2.0)
        d = s.gpus[2].nvlink[3].errors_delta
        assert d["crc_flit"] == 10 and d["replay"] == 6 and d["crc_data"] == 4
        assert all(v == 0 for lk in s.gpus[0].nvlink for v in lk.errors_delta.values() if v is not None)
        # data-CRC exists per link only for links 0..11 (one field id each); beyond: unknown, not 0
        assert [lk.errors_delta["crc_data"] is None for lk in s.gpus[0].nvlink] == [False] * 12 + [True] * 6
    finally:
        node.close()


def test_nvml_off_still_samples_ib_and_host():
    node, sampler, clock = make("hgx-h100,nvml=off")
    try:
        s = two_ticks(sampler, clock)
        assert s.gpus == () and not s.nvml.available and "Driver Not Loaded" in s.nvml.error
        assert len(s.ib) == 8 and s.ib[0].tx_bytes_per_s is not None
        assert s.host.hostname and any("NVML unavailable" in n for n in s.notes)
    finally:
        node.close()


def test_never_probes_links_past_the_reported_count():
    node, sampler, clock = make("hgx-a800")
    try:
        collector: NvmlCollector = sampler.nvml
        s = two_ticks(sampler, clock)
        assert [len(g.nvlink) for g in s.gpus] == [8] * 8
        for g in collector.gpus:
            assert all(item[1] < 8 for item in g.batch.request if isinstance(item, tuple))
    finally:
        node.close()


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile_samples_cleanly(profile):
    node, sampler, clock = make(profile)
    try:
        s = two_ticks(sampler, clock)
        p = PROFILES[profile]
        assert len(s.gpus) == p.gpus and len(s.ib) == p.ib_ports
        assert s.topology.class_ == {"nvswitch": "nvswitch", "pairs": "pairs", "none": "none"}[p.fabric]
        assert all(g.notes == () for g in s.gpus)
        assert all(not n for n in s.notes)
    finally:
        node.close()


@pytest.mark.parametrize("direct", [True, False], ids=["direct-batch", "public-wrapper"])
def test_both_field_value_paths_give_the_same_sample(direct):
    """The fast path (pynvml's C symbol + one reused array) and the public wrapper must agree."""
    clock = Clock()
    node = SimNode("hgx-h100,seed=5,nvlink_errors=3.2", clock=clock)
    try:
        sampler = NodeSampler(node.nvml, sysfs_root=node.sysfs_root, node="n1", before_tick=node.sync, clock=clock)
        sampler.nvml.direct_fields = direct
        sampler.open()
        assert all(g.batch.direct is direct for g in sampler.nvml.gpus)
        s = two_ticks(sampler, clock, 2.0)
        g = s.gpus[3]
        b = node.board
        t = b.now()
        assert g.nvlink[2].tx_bytes_per_s == pytest.approx((b.link_kib(3, 2, t)[0] - b.link_kib(3, 2, t - 2)[0]) * 512.0)
        assert g.nvlink[2].errors_delta == {"crc_flit": 10, "crc_data": 4, "replay": 6, "recovery": 0}
        assert g.energy_j == b.energy_mj(3, t) / 1000
    finally:
        node.close()


def test_square_integral_is_monotonic_and_matches_average():
    shape = (2.0, 0.45, 0.8, 0.02)
    xs = [square_integral(t / 10, shape, 0.7) for t in range(200)]
    assert all(b >= a for a, b in zip(xs, xs[1:]))
    assert square_integral(20.0, shape, 0.7) == pytest.approx(20.0 * (0.45 * 0.8 + 0.55 * 0.02))


# -- Xid critical-error events (NVML event set, drained once a tick) ------------------------------


def test_xid_event_reaches_its_gpu_once_and_the_drain_is_one_call_per_node():
    node, sampler, clock = make("hgx-h100,xid=3:79@2,xid=5:13@2,xid=5:13@2")
    try:
        ev = sampler.nvml.events
        assert ev.set is not None and ev.registered == set(range(8))
        seen = []
        for _ in range(6):
            before, gpu_calls = ev.calls[0], sampler.nvml.calls[0]
            s = sampler.sample()
            seen.append({g.index: g.xid_events for g in s.gpus if g.xid_events})
            drained = sum(len(x) for x in seen[-1].values())
            assert ev.calls[0] - before == 1 + drained  # one wait that times out, plus one per event
            assert sampler.nvml.calls[0] - gpu_calls <= 8 * 4  # the per-GPU budget is counted apart
            clock.t += 1
        assert seen == [{}, {}, {3: (79,), 5: (13, 13)}, {}, {}, {}]  # delivered once, to its GPU
        assert not s.gpus[3].lost  # the event only: no gpu_lost fault was given
        assert "xid_events" not in s.nvml.capabilities
        sampler.close()
        assert ev.set is None and node.nvml.nvmlLib.event_sets == {}  # nvmlEventSetFree ran
    finally:
        node.close()


def test_xid_registration_not_supported_on_one_gpu_is_a_capability_not_a_crash():
    node, sampler, clock = make("hgx-h100,notsup=xid_events:6,xid=6:48,xid=2:48")
    try:
        s = sampler.sample()
        assert s.nvml.capabilities["unsupported"]["xid_events"] == [6]
        assert sampler.nvml.events.registered == set(range(8)) - {6}
        assert {g.index: g.xid_events for g in s.gpus if g.xid_events} == {2: (48,)}
        assert len(s.gpus) == 8 and all(not g.lost for g in s.gpus)
        clock.t += 1
        assert all(not g.xid_events for g in sampler.sample().gpus)  # GPU 6 was never registered
    finally:
        node.close()


def test_xid_wait_error_is_counted_not_raised():
    node, sampler, clock = make("hgx-h100,xid=1:74")
    try:
        node.nvml.nvmlLib.event_wait_error = 999  # NVML_ERROR_UNKNOWN from nvmlEventSetWait_v2
        s = two_ticks(sampler, clock)
        assert len(s.gpus) == 8 and all(not g.xid_events for g in s.gpus)
        ev = s.nvml.capabilities["xid_events"]
        assert ev["wait_errors"] == 2 and "Unknown Error" in ev["last_wait_error"]
        node.nvml.nvmlLib.event_wait_error = 0  # the driver recovers: the event was kept, not lost
        assert sampler.sample().gpus[1].xid_events == (74,)
    finally:
        node.close()


def test_xid_79_with_the_gpu_lost_reaches_the_lost_sample():
    node, sampler, clock = make("hgx-h100,xid=4:79@1,gpu_lost=4@1")
    try:
        s = two_ticks(sampler, clock)
        assert s.gpus[4].lost and s.gpus[4].xid_events == (79,)
        clock.t += 1
        assert sampler.sample().gpus[4].xid_events == ()
    finally:
        node.close()


def test_no_xid_event_set_means_no_wait_and_every_gpu_reports_the_capability(monkeypatch):
    node = SimNode("hgx-h100")
    try:
        monkeypatch.delattr(type(node.nvml.nvmlLib), "nvmlEventSetCreate")  # an old / non-Linux driver
        c = NvmlCollector(node.nvml)
        assert c.open().available
        assert c.events.set is None and "nvmlEventSetCreate" in c.events.error
        before = c.event_calls[0]
        c.collect(node.board.clock())
        assert c.event_calls[0] == before  # nothing registered: no wait at all
        assert c.capabilities()["unsupported"]["xid_events"] == list(range(8))
        c.close()
    finally:
        node.close()
