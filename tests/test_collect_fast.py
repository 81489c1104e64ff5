"""The collector's fast paths against their plain equivalents: the field-value batch decoder,
the InfiniBand reader's caches (port list, parsed texts) and a failed field-value call."""

from __future__ import annotations

import contextlib
import ctypes
import os

import pynvml
import pytest

from nvmon.collect.node import NodeSampler
from nvmon.collect.nvml_batch import FieldBatch, Readings
from nvmon.collect.sysfs import IbCollector
from nvmon.sim import sysfs_tree as st
from nvmon.sim.node import SimNode

# (valueType, union member's C type, value): every type nvml.h defines
TYPED = [(0, ctypes.c_double, 1.5), (1, ctypes.c_uint32, 7), (2, ctypes.c_uint64, 2**40),
         (3, ctypes.c_uint64, 2**40 + 1), (4, ctypes.c_int64, -5), (5, ctypes.c_int32, -3),
         (6, ctypes.c_uint16, 65535)]


def _array(garbage_high_bytes: bool):
    arr = (pynvml.c_nvmlFieldValue_t * (len(TYPED) + 1))()
    for i, (vt, ctype, value) in enumerate(TYPED):
        arr[i].fieldId, arr[i].scopeId, arr[i].timestamp = 100 + i, i, 1_000_000 + i
        if garbage_high_bytes:  # a C library may leave the union's unused bytes as they were
            arr[i].value.ullVal = 0xDEADBEEF_DEADBEEF
        arr[i].valueType = vt
        # Written through the union's memory, as the C library writes it (older pynvml unions lack
        # some members, e.g. usVal)
        ctype.from_buffer(arr[i].value).value = value
    arr[-1].valueType, arr[-1].nvmlReturn, arr[-1].value.ullVal = 3, pynvml.NVML_ERROR_NOT_SUPPORTED, 99
    return arr


@pytest.mark.parametrize("garbage", [False, True])
def test_batch_decoder_reads_every_value_type_like_the_wrapper(garbage):
    expected = Readings(rets=[0] * len(TYPED) + [pynvml.NVML_ERROR_NOT_SUPPORTED],
                        ts_us=[1_000_000 + i for i in range(len(TYPED))] + [0],
                        values=[v for _, _, v in TYPED] + [None])
    for fast in (True, False):
        batch = FieldBatch(pynvml, [], direct=False)
        batch.fast_decode = fast
        assert batch._decode(_array(garbage)) == expected, f"fast_decode={fast}"


ZERO = {"port_xmit_data": 0, "port_rcv_data": 0, "symbol_error": 0, "link_downed": 0, "port_rcv_errors": 0,
        "link_error_recovery": 0, "port_xmit_discards": 0}


def _ib_node(root, dev="mlx5_0"):
    st.write_pci_device(root, "0000:3b:00.0", cur_gen=4, max_gen=4, cur_width=16, max_width=16)
    st.write_ib_port(root, dev, 1, bdf="0000:3b:00.0", counters=ZERO)


def test_new_hca_shows_at_once_and_a_vanished_counter_lists_ports_again(tmp_path):
    _ib_node(tmp_path)
    c = IbCollector(tmp_path)
    assert [p.device for p in c.collect(1.0)] == ["mlx5_0"]
    _ib_node(tmp_path, "mlx5_1")
    assert [p.device for p in c.collect(2.0)] == ["mlx5_0", "mlx5_1"]  # no wait for a re-scan
    os.remove(tmp_path / "class/infiniband/mlx5_1/ports/1/counters/symbol_error")
    p = c.collect(3.0)[1]
    assert p.errors["symbol_error"] is None and "symbol_error missing" in p.notes
    assert c._devs is None  # the next tick lists the ports again
    assert [p.device for p in c.collect(4.0)] == ["mlx5_0", "mlx5_1"]


def test_parsed_text_cache_is_bounded_and_never_holds_garbage(tmp_path):
    _ib_node(tmp_path)
    c = IbCollector(tmp_path)
    for i in range(300):  # a garbled file that changes every tick
        (tmp_path / "class/infiniband/mlx5_0/ports/1/state").write_text(f"garbage {i}\n")
        p = c.collect(float(i))[0]
        assert p.state is None and any(n.startswith("state unparsable") for n in p.notes)
    (tmp_path / "class/infiniband/mlx5_0/ports/1/state").write_text("4: ACTIVE\n")
    assert c.collect(400.0)[0].state == "ACTIVE"
    assert len(c._parsed) <= 256 and all(v is not None for v in c._parsed.values())


class _Clock:
    def __init__(self):
        self.t = 1_700_000_000.0

    def __call__(self):
        return self.t

    def tick(self, sampler):
        sample = sampler.sample()
        self.t += 1
        return sample


@contextlib.contextmanager
def _warm(spec: str, ticks: int):
    """(node, sampler, clock): a simulated board sampled `ticks` times on a fake clock."""
    clock = _Clock()
    node = SimNode(spec, clock=clock)
    try:
        s = NodeSampler(node.nvml, sysfs_root=node.sysfs_root, node="n", before_tick=node.sync, clock=clock)
        s.open()
        for _ in range(ticks):
            clock.tick(s)
        yield node, s, clock
    finally:
        node.close()


def test_a_failed_field_value_call_costs_that_gpu_one_tick_of_rates():
    with _warm("hgx-h100,seed=2", 2) as (node, s, clock):
        g2 = s.nvml.gpus[2]
        real = g2.batch.fetch

        def broken(handle):
            raise node.nvml.NVMLError(node.nvml.NVML_ERROR_UNKNOWN)  # the simulated module's classes

        g2.batch.fetch = broken
        bad = clock.tick(s)
        assert bad.gpus[2].nvlink[0].tx_bytes_per_s is None and bad.gpus[2].power_w is None
        assert any("field_values" in n for n in bad.gpus[2].notes)
        assert bad.gpus[1].nvlink[0].tx_bytes_per_s is not None  # the other GPUs are untouched
        g2.batch.fetch = real
        clock.tick(s)  # first reading after the gap: no rate across it
        ok = clock.tick(s)
        assert ok.gpus[2].nvlink[0].tx_bytes_per_s is not None and ok.gpus[2].notes == ()


def test_a_counter_going_backwards_is_no_rate_and_only_for_that_entry():
    """The all-answered fast path subtracts whole columns; a reset (driver reload, GPU reset) must
    still give None for that counter alone, never a negative rate."""
    with _warm("hgx-h100,seed=4", 3) as (node, s, clock):
        g = s.nvml.gpus[5]
        tx = g.slot[("tx", 4)]
        real = g.batch.fetch

        def reset_one(handle):
            got = real(handle)
            got.values[tx] = 3  # the link's TX counter started again from zero
            return got

        g.batch.fetch = reset_one
        link = clock.tick(s).gpus[5].nvlink
        assert link[4].tx_bytes_per_s is None and link[4].rx_bytes_per_s is not None
        assert all(lk.tx_bytes_per_s is not None for lk in link if lk.link != 4)
        g.batch.fetch = real
        clock.tick(s)  # from 3 back up to the real count: a rise, and a big one, but not negative
        again = clock.tick(s)
        assert again.gpus[5].nvlink[4].tx_bytes_per_s is not None
        assert all(lk.tx_bytes_per_s >= 0 for gs in again.gpus for lk in gs.nvlink)


def test_nvlink_samples_are_built_positionally_in_field_order():
    """`_assemble` passes NvLinkSample's fields by position (one map() over all links): a
    reordered or added field must fail here, not shift values into the wrong fields."""
    from dataclasses import fields

    from nvmon.model import NvLinkSample

    assert [f.name for f in fields(NvLinkSample)] == [
        "link", "active", "version", "speed_mbps", "remote_type", "remote_pci_bus_id",
        "tx_bytes_per_s", "rx_bytes_per_s", "errors", "errors_delta"]
