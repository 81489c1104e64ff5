"""The simulator's per-tick shortcuts answer exactly what the slow, one-value-at-a-time paths do:
bulk NVLink readings, field-value requests resolved once per layout, sysfs files rewritten only
when their value changes."""

from __future__ import annotations

import itertools

from nvmon.sim.board import NVLINK_ERR_KEYS
from nvmon.sim.node import SimNode

FAULTS = ("nvlink_down=2.5@3-7.5,gpu_lost=2@5-9,nvlink_errors=4.1@2-6,nvlink_errors=4.1@5-8,"
          "notsup=energy:1@2-4,notsup=pcie_bytes@3-5,notsup=nvlink_state_field:0@1-6,ib_down=0@1-3,"
          "ib_rate=mlx5_1:50@2-5,ib_errors=1@1.5-4")
TIMES = [i / 4 for i in range(48)] + [1e4, 1e7]


class Clock:
    def __init__(self, t: float = 1_700_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_nvlink_readings_equal_the_per_link_values():
    for profile in ("hgx-h100", "pairs-a100", "hgx-b200", "pcie-l40s"):
        node = SimNode(f"{profile},{FAULTS}" if profile != "pcie-l40s" else profile, clock=Clock())
        try:
            b = node.board
            links = range(b.profile.link_slots)
            for g, t in itertools.product(range(len(b.gpus)), TIMES):
                expected = ([b.link_active(g, lk, t) for lk in links], [b.link_kib(g, lk, t)[0] for lk in links],
                            [b.link_kib(g, lk, t)[1] for lk in links],
                            [[b.link_errors(g, lk, t)[k] for lk in links] for k in NVLINK_ERR_KEYS])
                assert b.nvlink_readings(g, t) == expected, (profile, g, t)
        finally:
            node.close()


def _answers(nv, handle, request):
    return [(v.fieldId, v.scopeId, v.nvmlReturn, v.valueType, v.value.ullVal)
            for v in nv.nvmlDeviceGetFieldValues(handle, request)]


def test_a_batch_answers_each_field_as_when_asked_alone():
    """Answers must not depend on the request layout (each one is resolved once, then reused)."""
    clock = Clock()
    for profile in ("hgx-h100", "hgx-b200", "pcie-l40s"):
        node = SimNode(f"{profile},{FAULTS}" if profile != "pcie-l40s" else profile, clock=clock)
        try:
            nv = node.nvml
            nv.nvmlInit()
            slots = node.board.profile.link_slots
            request = [0, 83, 91, 94, 197, 198, 39, 44, 102, 107, 250]
            request += [(fid, lk) for lk in (0, 1, 5, slots - 1, slots, 40) for fid in range(138, 167)]
            for step in range(12):
                clock.t += 0.75
                handle = nv.nvmlDeviceGetHandleByIndex(step % 2)  # GPU 2 is lost a while: not asked
                batch = _answers(nv, handle, request)
                alone = [_answers(nv, handle, [item])[0] for item in request]
                assert batch == alone, (profile, step)
                assert _answers(nv, handle, request[::-1]) == batch[::-1]
        finally:
            node.close()


def test_sync_leaves_every_counter_file_at_the_boards_value():
    clock = Clock()
    node = SimNode(f"hgx-h100,{FAULTS}", clock=clock)
    try:
        b = node.board
        for _ in range(30):
            clock.t += 0.4
            node.sync()
            t = b.now()
            for i, dev in enumerate(b.ib_names):
                d = node.sysfs_root / "class/infiniband" / dev / "ports/1/counters"
                assert {f.name: f.read_text() for f in d.iterdir()} == {
                    k: f"{v}\n" for k, v in node._counters(i, t).items()}
    finally:
        node.close()


def test_counters_past_2_64_wrap_as_in_c():
    clock = Clock(1e9)
    node = SimNode("hgx-h100", clock=clock)
    try:
        nv = node.nvml
        nv.nvmlInit()
        handle = nv.nvmlDeviceGetHandleByIndex(0)
        clock.t = 9e12  # ~285,000 years on: the KiB counters have passed 2**64 (the µs timestamp not yet)
        t = node.board.now()
        tx = [node.board.link_kib(0, lk, t)[0] for lk in range(3)]
        assert all(v >= 1 << 64 for v in tx)
        got = _answers(nv, handle, [(138, lk) for lk in range(3)] + [91])
        assert [v[4] for v in got] == [v & (1 << 64) - 1 for v in tx] + [18]
    finally:
        node.close()
