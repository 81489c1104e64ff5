"""Property tests for the wire format: generated samples survive sample_payload → parse_message
within the documented rounding, and the reader raises nothing but WireError on any input."""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvmon.model import (
    IB_ERROR_KINDS,
    NVLINK_ERROR_KINDS,
    GpuSample,
    HostSample,
    IbPortSample,
    NvLinkSample,
    NvmlStatus,
    PcieLink,
    Sample,
    Topology,
)
from nvmon.wire.contract import KINDS, WireError, topic
from nvmon.wire.payloads import (
    alerts_payload,
    inventory_payload,
    parse_message,
    sample_payload,
    status_payload,
)
from samplefactory import healthy_sample

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Whole 8-GPU samples are costly to generate on a 2-core CI machine: fewer, bigger examples.
BIG = settings(SETTINGS, max_examples=30)


def opt(s):
    return st.none() | s


rates = opt(st.floats(0, 60e9))
text = st.text(max_size=40)  # any code points: escapes, markup, RTL, NULs


@st.composite
def nvlinks(draw, n: int):
    base = draw(st.sampled_from([None, 25000, 26562, 53125]))
    out = []
    for i in range(n):
        active = draw(st.sampled_from([True, True, True, False, None]))
        out.append(NvLinkSample(
            link=i, active=active, version=draw(opt(st.integers(1, 6))),
            speed_mbps=draw(st.sampled_from([base, base, None, 20000])) if active else None,
            remote_type=draw(st.sampled_from(["gpu", "nvswitch", None])), remote_pci_bus_id=draw(opt(text)),
            tx_bytes_per_s=draw(rates), rx_bytes_per_s=draw(rates),
            errors_delta=draw(st.dictionaries(st.sampled_from(NVLINK_ERROR_KINDS), opt(st.integers(0, 10**12)))),
        ))
    return tuple(out)


def pcie():
    return st.builds(PcieLink, gen=opt(st.integers(1, 6)), max_gen=opt(st.integers(1, 6)), width=opt(st.integers(1, 32)),
                     max_width=opt(st.integers(1, 32)), tx_bytes_per_s=rates, rx_bytes_per_s=rates,
                     replay_errors_delta=opt(st.integers(0, 10**6)))


@st.composite
def gpus(draw, index: int):
    lost = draw(st.booleans()) and draw(st.booleans())
    n_links = 0 if lost else draw(st.integers(0, 18))
    return GpuSample(
        index=index, name=draw(opt(st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA A800-SXM4-80GB"]) | text)),
        uuid=draw(opt(text)), serial=draw(opt(text)), pci_bus_id=draw(opt(text)), lost=lost,
        power_w=None if lost else draw(opt(st.floats(0, 2000))), power_limit_w=draw(opt(st.floats(0, 2000))),
        power_default_limit_w=draw(opt(st.floats(0, 2000))), temperature_c=draw(opt(st.integers(-10, 120))),
        utilization_pct=draw(opt(st.integers(0, 100).map(float))),
        throttle_reasons=draw(opt(st.lists(st.sampled_from(["sw_power_cap", "sw_thermal", "gpu_idle"]),
                                           max_size=3, unique=True).map(tuple))),
        pcie=draw(pcie()), nvlink=draw(nvlinks(n_links)), nvlink_count=n_links,
    )


@st.composite
def samples(draw):
    indices = sorted(draw(st.sets(st.integers(0, 15), max_size=8)))
    ib = tuple(IbPortSample(
        device=draw(text), port=draw(st.integers(0, 4)), state=draw(st.sampled_from(["ACTIVE", "DOWN", None])),
        phys_state=draw(st.sampled_from(["LinkUp", "Polling", None])), rate_gbps=draw(opt(st.sampled_from([100.0, 200.0, 400.0]))),
        link_layer=draw(opt(text)), tx_bytes_per_s=draw(rates), rx_bytes_per_s=draw(rates),
        errors_delta=draw(st.dictionaries(st.sampled_from(IB_ERROR_KINDS), opt(st.integers(0, 10**6)))),
    ) for _ in range(draw(st.integers(0, 8))))
    nvml_ok = draw(st.booleans()) or bool(indices)
    return Sample(
        node="gpu-node-01", ts=draw(st.floats(1e9, 4e9)), interval_s=draw(st.floats(0.1, 60)),
        gpus=tuple(draw(gpus(i)) for i in indices), topology=Topology(class_=draw(st.sampled_from(["nvswitch", "pairs"]))),
        ib=ib, host=HostSample(cpu_pct=draw(opt(st.floats(0, 100))), mem_used_pct=draw(opt(st.floats(0, 100))),
                               load1=draw(opt(st.floats(0, 500)))),
        nvml=NvmlStatus(available=nvml_ok, error=None if nvml_ok else draw(text)),
    )


def close(a, b, tol):
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= tol)


@BIG
@given(samples())
def test_sample_round_trip(s: Sample):
    tick = parse_message(topic("c", "gpu-node-01", "sample"), sample_payload(s))
    assert tick.ts == round(s.ts, 3) and len(tick.gpus) == len(s.gpus) and len(tick.ib) == len(s.ib)
    for g, w in zip(s.gpus, tick.gpus):
        assert (w.index, w.lost, w.pcie_gen, w.pcie_width) == (g.index, g.lost, g.pcie.gen, g.pcie.width)
        assert close(w.power_w, g.power_w, 0.051) and close(w.temperature_c, g.temperature_c, 0.5)
        assert close(w.pcie_tx_bytes_per_s, g.pcie.tx_bytes_per_s, 0.5)
        assert w.throttle_reasons == g.throttle_reasons
        assert w.pcie_replay_delta == (g.pcie.replay_errors_delta or 0)
        txs = [lk.tx_bytes_per_s for lk in g.nvlink if lk.tx_bytes_per_s is not None]
        assert w.nvlink_tx_bytes_per_s == (round(sum(txs)) if txs else None)
        for lk in g.nvlink:
            assert w.link_active(lk.link) == lk.active
            tx, _ = w.link_bytes_per_s(lk.link)
            if w.link_ref_mbps is None or lk.tx_bytes_per_s is None:
                assert tx is None
            else:  # half a percent of the reference speed, plus float noise
                assert abs(tx - lk.tx_bytes_per_s) <= 0.005 * w.link_ref_mbps * 1e6 + 1
            if lk.active and lk.speed_mbps and lk.speed_mbps != w.link_ref_mbps:
                assert w.link_speed_mbps[lk.link] == lk.speed_mbps
            assert w.link_errors.get(lk.link, {}) == {k: v for k, v in lk.errors_delta.items() if v}
    for p, w in zip(s.ib, tick.ib):
        assert close(w.tx_bytes_per_s, p.tx_bytes_per_s, 0.5) and w.rate_gbps == p.rate_gbps
        assert (w.state, w.phys_state) == (p.state, p.phys_state) or (p.state, p.phys_state) == ("ACTIVE", "LinkUp")
        assert w.errors_delta == {k: v for k, v in p.errors_delta.items() if v}
    assert close(tick.load1, s.host.load1, 0.0051)
    assert (tick.nvml_error is None) == s.nvml.available


@settings(BIG, max_examples=15)
@given(samples(), st.dictionaries(st.text(min_size=1, max_size=64), st.text(max_size=100), max_size=5))
def test_inventory_round_trip(s: Sample, labels):
    inv = parse_message(topic("c", "gpu-node-01", "inventory"), inventory_payload(s, cluster="c", labels=labels))
    assert inv.labels == labels
    assert [(w.index, w.model, w.uuid, len(w.links)) for w in inv.gpus] == \
        [(g.index, g.name, g.uuid, len(g.nvlink)) for g in s.gpus]
    assert [(p.device, p.port) for p in inv.ib] == [(p.device, p.port) for p in s.ib]


# --- the reader survives anything ---------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner, max_size=6),
    max_leaves=25,
)
topics = st.sampled_from([topic("c", "n", k) for k in KINDS])


def must_parse_or_refuse(t: str, payload: bytes) -> None:
    try:
        parse_message(t, payload)
    except WireError as e:
        assert str(e).isprintable() and len(str(e)) <= 300


@SETTINGS
@given(topics, st.binary(max_size=2000))
def test_reader_on_arbitrary_bytes(t, payload):
    must_parse_or_refuse(t, payload)


@SETTINGS
@given(topics, json_values, st.booleans())
def test_reader_on_arbitrary_json(t, value, envelope):
    if envelope and isinstance(value, dict):  # get past the schema check more often
        value = {**value, "schema": 1, "ts": 1_700_000_000}
    must_parse_or_refuse(t, json.dumps(value).encode())


def good_payloads() -> dict[str, dict]:
    s = healthy_sample()
    from nvmon.wire.contract import Alert

    return {
        "status": json.loads(status_payload("online", version="1", interval_s=1, ts=1e9)),
        "inventory": json.loads(inventory_payload(s, cluster="c")),
        "sample": json.loads(sample_payload(s)),
        "alerts": json.loads(alerts_payload([Alert("f", "c", "info", "firing", "s", 1.0, gpu=1)], ts=1e9)),
    }


GOOD = good_payloads()
SAMPLE_KEYS = sorted(set(GOOD["sample"]) | {"gi", "lost", "ld", "lq", "lv", "le", "pe", "th", "is", "ie", "nv"})


@settings(SETTINGS, max_examples=200)
@given(st.sampled_from(KINDS), st.data())
def test_reader_on_valid_payloads_with_one_part_replaced(kind, data):
    """Walk a random path into a valid payload and replace what is there with any JSON value."""
    d = json.loads(json.dumps(GOOD[kind]))
    node = d
    for _ in range(data.draw(st.integers(0, 4))):
        keys = sorted(node) if isinstance(node, dict) else range(len(node))
        child = node[data.draw(st.sampled_from(list(keys)))] if keys else None
        if not isinstance(child, (dict, list)) or not child:
            break
        node = child
    if isinstance(node, dict):
        extra = SAMPLE_KEYS if node is d and kind == "sample" else ["x"]
        node[data.draw(st.sampled_from(sorted(set(node) | set(extra))))] = data.draw(json_values)
    else:
        node[data.draw(st.integers(0, len(node) - 1))] = data.draw(json_values)
    node_name = "gpu-node-01" if kind == "inventory" else "n"
    must_parse_or_refuse(topic("c", node_name, kind), json.dumps(d).encode())


def test_non_finite_values_in_a_sample_are_sent_as_null():
    from dataclasses import replace

    s = healthy_sample()
    s = replace(s, gpus=(replace(s.gpus[0], power_w=math.nan, temperature_c=math.inf),) + s.gpus[1:])
    w = parse_message(topic("c", "n", "sample"), sample_payload(s)).gpus[0]
    assert w.power_w is None and w.temperature_c is None
