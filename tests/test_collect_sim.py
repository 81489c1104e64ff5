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


def test_steady_state_costs_three_nvml_calls_per_gpu_per_tick(h100):
    """The field-value batch, one getter of the first rotation (throttle, utilization, the slow
    group) and one of the second (SM/memory clock, framebuffer memory: NVML has no field ids for
    them)."""
    _, sampler, clock = h100
    two_ticks(sampler, clock)
    before = sampler.nvml.calls[0]
    ticks = 40
    for _ in range(ticks):
        clock.t += 1
        sampler.sample()
    assert (sampler.nvml.calls[0] - before) / ticks / 8 == 3


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
        # What the installed nvidia-ml-py lacks is unsupported on every GPU (older bindings, .ci/run)
        absent = {c: list(range(8)) for c in sampler.nvml.api.absent.values()}
        if set(caps) & set(absent):
            pytest.skip(f"the installed nvidia-ml-py cannot read {what} at all")
        s = two_ticks(sampler, clock)
        assert check(s.gpus[2])
        assert not check(s.gpus[1])
        assert s.nvml.capabilities["unsupported"] == {**{c: [2] for c in caps}, **absent}
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


# -- faults with an end time (@START-END): on at START, healthy again from END --------------------

# fault (held from 5 s to 30 s) → whether a sample shows it, and the collector's lag in ticks to see
# it start / end: state fields and counters every tick, the slow rotation (temperature, PCIe gen and
# width, power limit) every 20, a lost GPU retried every 30.
ENDING = [
    ("nvlink_down=2.5", lambda s: (s.gpus[2].nvlink[5].active, s.gpus[2].nvlink[5].tx_bytes_per_s) == (False, 0), 1, 1),
    ("nvlink_errors=2.5", lambda s: s.gpus[2].nvlink[5].errors_delta["crc_flit"] > 0, 1, 1),
    ("pcie_width=3:8", lambda s: s.gpus[3].pcie.width == 8, 20, 20),
    ("pcie_gen=3:3", lambda s: s.gpus[3].pcie.gen == 3, 20, 20),
    ("ib_down=1", lambda s: s.ib[1].state == "DOWN" and s.ib[1].tx_bytes_per_s == 0, 1, 1),
    ("ib_rate=mlx5_1:100", lambda s: s.ib[1].rate_gbps == 100, 1, 1),
    ("ib_errors=3", lambda s: s.ib[3].errors_delta["symbol_error"] > 0, 1, 1),
    ("power_cap=4", lambda s: s.gpus[4].power_w < 430, 1, 1),  # capped at 60 % of 700 W: flat 420 W
    ("power_cap=4:350", lambda s: s.gpus[4].power_limit_w == 350, 20, 20),
    ("thermal=5", lambda s: s.gpus[5].temperature_c == 92, 20, 20),
    ("thermal=5", lambda s: "sw_thermal" in s.gpus[5].throttle_reasons, 3, 3),
    ("gpu_lost=6", lambda s: s.gpus[6].lost, 1, 30),
    ("notsup=energy:1", lambda s: s.gpus[1].energy_j is None and s.gpus[1].power_w is None, 1, 1),
]


def run_ticks(spec: str, until: float):
    """(board seconds, sample) once a second from 0 to `until`, through the real collector."""
    node, sampler, clock = make(spec)
    try:
        out = []
        while node.board.now() <= until:
            out.append((node.board.now(), sampler.sample()))
            clock.t += 1
        return node, out
    finally:
        node.close()


@pytest.mark.parametrize(("fault", "shows", "on_lag", "off_lag"), ENDING,
                         ids=[f"{f}-{i}" for i, (f, *_) in enumerate(ENDING)])
def test_fault_with_an_end_time_clears_in_the_same_run(fault, shows, on_lag, off_lag):
    node, ticks = run_ticks(f"hgx-h100,{fault}@5-30", until=30 + max(off_lag, 20) + 3)  # all re-read by then
    seen = {t: shows(s) for t, s in ticks[1:]}  # the first tick has no rates yet
    assert not any(v for t, v in seen.items() if t < 5), seen
    assert all(v for t, v in seen.items() if 5 + on_lag <= t < 30), seen
    assert not any(v for t, v in seen.items() if t >= 30 + off_lag), seen
    # Counters never run backwards (a drop would read as a reset: a None rate): every rate of every
    # GPU that answered this tick and the last one is there, and every IB port's.
    for (_, prev), (t, s) in zip(ticks[1:], ticks[2:]):
        for g, pg in zip(s.gpus, prev.gpus):
            if not (g.lost or pg.lost or (fault.startswith("notsup") and g.index == 1 and 5 <= t <= 31)):
                assert g.power_w is not None and all(lk.tx_bytes_per_s is not None for lk in g.nvlink), (t, g.index)
        assert all(p.tx_bytes_per_s is not None and p.rx_bytes_per_s is not None for p in s.ib), t
    # After the end the whole node is as healthy as a board that never had the fault.
    last = ticks[-1][1]
    assert not any(g.lost for g in last.gpus) and all(lk.active for g in last.gpus for lk in g.nvlink)
    assert all((g.pcie.gen, g.pcie.width, g.power_limit_w) == (5, 16, 700.0) for g in last.gpus)
    assert all(g.temperature_c < 80 and not {"sw_thermal", "sw_power_cap"} & set(g.throttle_reasons) for g in last.gpus)
    assert all((p.state, p.rate_gbps) == ("ACTIVE", 400) for p in last.ib)
    assert all(v == 0 for p in last.ib for v in p.errors_delta.values() if v is not None)
    assert all(v == 0 for g in last.gpus for lk in g.nvlink for v in lk.errors_delta.values() if v is not None)


def test_counters_are_monotonic_across_start_and_end_and_stop_rising_after_end():
    node = SimNode("pairs-a100,nvlink_down=2.1@3-7.5,gpu_lost=2@5-9,nvlink_errors=4.1@2-6,nvlink_errors=4.1@5-8,"
                   "power_cap=1:200@2-4.3,power_cap=1:120@3-6,ib_down=0@1-3,ib_rate=0:50@2-5,ib_errors=1@1.5-4",
                   clock=Clock())
    try:
        b = node.board
        ts = [i / 40 for i in range(40 * 12)]
        series = {
            "kib": [b.link_kib(2, 1, t) for t in ts],
            "peer_kib": [b.link_kib(3, 1, t) for t in ts],
            "errors": [tuple(b.link_errors(4, 1, t).values()) for t in ts],
            "energy": [b.energy_mj(1, t) for t in ts],
            "ib_words": [b.ib_words(0, t) for t in ts],
            "ib_errors": [tuple(b.ib_errors(1, t).values()) for t in ts],
        }
        for name, xs in series.items():
            assert all(all(n >= o for n, o in zip(new, old)) if isinstance(new, tuple) else new >= old
                       for old, new in zip(xs, xs[1:])), name
        # NVLink errors rise over the union of their two spans (2..8 s), then hold
        base = b.link_errors(4, 1, 0)
        assert b.link_errors(4, 1, 8) == b.link_errors(4, 1, 100) == {k: base[k] + int(r * 6) for k, r in
                                                                      {"crc_flit": 5.0, "crc_data": 2.0,
                                                                       "replay": 3.0, "recovery": 0.1}.items()}
        # traffic on 2.1 stops while the link is down or GPU 2 lost (3..9 s), then flows again
        assert b.link_kib(2, 1, 3) == b.link_kib(2, 1, 6) == b.link_kib(2, 1, 9) < b.link_kib(2, 1, 9.5)
        assert b.link_kib(3, 1, 3) == b.link_kib(3, 1, 7.5) < b.link_kib(3, 1, 8)  # the peer end: link only
        assert not b.link_active(3, 1, 7.4) and b.link_active(3, 1, 7.5)
        # energy: the capped waves while a cap holds (the later one wins), the uncapped one outside
        assert [b.power_limit_w(1, t) for t in (1, 2, 3, 4.5, 6)] == [300, 200, 120, 120, 300]
        e = b.energy_mj
        assert e(1, 4) - e(1, 3) == pytest.approx(120_000, abs=2)
        assert e(1, 3) - e(1, 2) == pytest.approx(200_000, abs=2)
        uncapped = SimNode("pairs-a100", clock=Clock()).board  # same seed: same phase, same base
        assert e(1, 12) - e(1, 10) == uncapped.energy_mj(1, 12) - uncapped.energy_mj(1, 10)
        # IB port 0: no traffic while down (1..3), 50 Gb/s while slow (3..5), 200 after
        w = b.ib_words
        assert w(0, 1) == w(0, 3) and b.ib_state(0, 2.9)[0] == "DOWN"
        assert b.ib_state(0, 3)[:3] == ("ACTIVE", "LinkUp", 50)
        assert b.ib_state(0, 5)[2] == 200
        full = uncapped.ib_words(0, 11)[0] - uncapped.ib_words(0, 7)[0]
        assert w(0, 11)[0] - w(0, 7)[0] == full
        assert b.ib_errors(1, 4) == b.ib_errors(1, 50) != b.ib_errors(1, 3.5)
        assert b.ib_errors(1, 50)["symbol_error"] - b.ib_errors(1, 0)["symbol_error"] == int(3.0 * 2.5)
    finally:
        node.close()


def test_ib_eth_and_notsup_end_at_the_driver_and_sysfs_level():
    """The collector reads a port's link layer once and treats Not Supported as permanent (as a real
    driver's is), so these two are checked where the simulator answers: sysfs and the NVML calls."""
    clock = Clock()
    node = SimNode("hgx-h100,ib_eth=mlx5_2@2-4,notsup=temperature:3@2-4", clock=clock)
    try:
        layer = node.sysfs_root / "class/infiniband/mlx5_2/ports/1/link_layer"
        nv = node.nvml
        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(3)
        seen = []
        for _ in range(6):
            node.sync()
            try:
                temp = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
            except nv.NVMLError_NotSupported:
                temp = None
            seen.append((layer.read_text().strip(), temp is None))
            clock.t += 1
        assert seen == [("InfiniBand", False)] * 2 + [("Ethernet", True)] * 2 + [("InfiniBand", False)] * 2
        nv.nvmlShutdown()
    finally:
        node.close()


def test_the_enforced_power_limit_is_read_every_tick_so_a_cap_ends_at_once():
    """Issue 12: with the limit re-read every 20 ticks, power.cap resolved ~17 s after a cap
    ended, saying 'power-capped at 574 W of 350 W'. The field-value batch now carries it."""
    import pynvml

    from nvmon.alerts.engine import AlertEngine
    from nvmon.alerts.rules import NodeRules
    from nvmon.alerts.settings import AlertsSettings

    if not hasattr(pynvml, "NVML_FI_DEV_POWER_CURRENT_LIMIT"):
        pytest.skip("the installed nvidia-ml-py (< 12.535) has no enforced-limit field: the slow getter reads it")
    clock = Clock()
    node, sampler, _ = make("hgx-h100,load=busy,power_cap=4:350@2-8", clock)
    try:
        settings = AlertsSettings(for_s=0, startup_grace_s=0)
        eng = AlertEngine(NodeRules(settings, cluster="c", node="n"), started_at=clock.t, startup_grace_s=0)
        sampler.sample()
        seen, calls = [], []
        for tick in range(1, 16):
            clock.t += 1
            before = sampler.nvml.calls[0]
            s = sampler.sample()
            calls.append(sampler.nvml.calls[0] - before)
            seen.append(s.gpus[4].power_limit_w)
            for tr in eng.evaluate(s, s.ts):
                if tr.record.code == "power.limit":
                    seen.append((tick, tr.record.status))
        limits = [v for v in seen if isinstance(v, float)]
        assert limits[:2] == [700.0, 350.0] and limits[7] == 700.0  # capped from 2 s; back the tick after 8 s
        assert limits[6] == 350.0
        events = [e for e in seen if isinstance(e, tuple)]
        assert events[0] == (2, "firing") and events[1][1] == "resolved"
        assert events[1][0] <= 8 + 2  # the tick the cap ends + clear_s (2 intervals), not ~17 s later
        assert max(calls) <= 3 * 8  # still at most 3 NVML calls per GPU per tick
    finally:
        node.close()
