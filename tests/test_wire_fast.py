"""The compiled sample reader (nvmon.wire.parse_fast) against the hand-written one (nvmon.wire.parse):
whatever the fast path takes, the hand-written reader takes too and reads into the same Tick (compared
by repr: value and type, 521 is not 521.0); whatever it declines, parse_message still reads or
refuses exactly as before, with the same message. Samples from the load generator's boards (every
profile, the faults it simulates), generated ones (tests/test_wire_props.py's strategy), and
valid ones mutated at random: values replaced with hostile ones, keys dropped or added, bytes cut."""

from __future__ import annotations

import json
import random
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings

from nvmon.audit import audit
from nvmon.loadgen.boards import Board
from nvmon.sim.profiles import PROFILES
from nvmon.wire import parse
from nvmon.wire.contract import WireError, topic
from nvmon.wire.parse_fast import sample_tick
from nvmon.wire.payloads import sample_payload
from test_wire_props import samples

TOPIC = topic("c", "n", "sample")
FAULTS = ["nvlink_down=2.5,pcie_width=3:8", "ib_rate=mlx5_1:100", "power_cap=4:350", "thermal=6",
          "nvlink_errors=1.1", "pcie_width=3:8"]


def slow(payload: object):
    """The hand-written reader alone."""
    with mock.patch.object(parse, "sample_tick", lambda *a: None):
        return parse.parse_message(TOPIC, payload)


def outcome(read, payload) -> str:
    try:
        return repr(read(payload))
    except WireError as e:
        return f"refused: {e}"


def check(payload: object) -> bool:
    """The two readers agree on `payload`; True when the fast path took it."""
    fast = sample_tick(payload, "c", "n")
    expected = outcome(slow, payload)
    if fast is not None:
        assert repr(fast) == expected, payload[:300]
    assert outcome(lambda p: parse.parse_message(TOPIC, p), payload) == expected
    return fast is not None


@pytest.fixture(scope="module")
def board_payloads() -> dict[str, list[bytes]]:
    """spec → a few ticks' sample payloads (the load generator's, with the node's audit as `f`)."""
    specs = [f"{p},seed=3" for p in PROFILES] + [f"hgx-h100,{f}" for f in FAULTS]
    out = {}
    for spec in specs:
        board = Board(spec, interval_s=1.0, clock_start=1.7e9)
        try:
            out[spec] = []
            for k in range(1, 4):
                board.tick(1.7e9 + k)
                out[spec].append(board.payload_for("0123abcd", 1.7e9 + k + 0.25))
        finally:
            board.close()
    return out


def test_board_samples_read_the_same_and_the_usual_ones_take_the_fast_path(board_payloads):
    # Every board's samples but those with the rarer sparse maps (link speeds and errors, IB port
    # state and errors, GPU index gaps, lost GPUs) take the fast path.
    rare = {"lv", "le", "is", "ie", "gi", "lost"}
    taken = {spec: [(check(p), not rare & set(json.loads(p))) for p in payloads]
             for spec, payloads in board_payloads.items()}
    assert all(fast == usual for flags in taken.values() for fast, usual in flags), taken
    assert sum(fast for flags in taken.values() for fast, _ in flags) >= 3 * len(PROFILES)
    keys = {k for payloads in board_payloads.values() for p in payloads for k in json.loads(p)}
    assert {"f", "ld"} <= keys and rare & keys  # findings, a link down, and some of the rare ones


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples())
def test_generated_samples_read_the_same(s):
    check(sample_payload(s, audit(s).findings))


_NASTY = [None, True, False, 0, -1, 1, 2, 7, 8, 16, 18, 63, 64, 65, 100, 300, 301, 1000, 1001, 1023, 1024,
          10**5, 10**7, 10**7 + 1, 10**15, 10**15 + 1, 2**64, 2**64 + 1, 0.5, -0.0, 1.0, 1e5, 1e5 + 0.5, 1e300,
          "", "x", "0", "1", "99", "0.1", "abc", "ABC", "0123abcd0123abcd0", "nvlink.link_down", "warning", "critical",
          "\u001b[31mred", "[b]markup[/b]", "a" * 33, "a" * 65, "a" * 257, [], {}, [1], [None], [[1]], ["x"],
          {"0": ["sw_power_cap"]}, {"0": None}, {"99": ["x"]}, {"00": []}, {"0.1": [1]}, {"x": 1},
          [0] * 8, [0] * 65, [[0] * 18] * 8, [["pcie.width", "warning", 3]], [["pcie.width", "bogus"]],
          "@BIG", "@NEGBIG", "@LONGINT", "@SURROGATE", "@DEEP"]
_RAW = {'"@BIG"': "1e999", '"@NEGBIG"': "-1e999", '"@LONGINT"': "9" * 5000, '"@SURROGATE"': '"\\ud800x"',
        '"@DEEP"': "[" * 3000 + "]" * 3000}
_ADDED = ["gi", "lost", "ld", "lq", "lv", "le", "pe", "xe", "th", "is", "ie", "nv", "f", "h", "ig", "it", "ir",
          "sc", "mc", "fb", "mt", "mu", "zz", "schema", "ts", "dt", "lay"]


def mutate(d: dict, rng: random.Random) -> bytes:
    """One random change to a decoded sample, encoded again (hostile literals spliced in as text)."""
    how = rng.random()
    if how < 0.1:  # bytes cut or flipped
        raw = bytearray(json.dumps(d, separators=(",", ":")).encode())
        i = rng.randrange(len(raw))
        if rng.random() < 0.5:
            return bytes(raw[:i])
        raw[i] = rng.randrange(256)
        return bytes(raw)
    if how < 0.2:
        d.pop(rng.choice(sorted(d)), None)
    elif how < 0.35:
        d[rng.choice(_ADDED)] = rng.choice(_NASTY)
    else:  # walk into the sample and replace what is there
        node = d
        for _ in range(rng.randrange(4)):
            keys = sorted(node) if isinstance(node, dict) else range(len(node))
            child = node[rng.choice(list(keys))] if keys else None
            if not isinstance(child, (dict, list)) or not child:
                break
            node = child
        if isinstance(node, dict):
            node[rng.choice(sorted(node))] = rng.choice(_NASTY)
        elif node:
            node[rng.randrange(len(node))] = rng.choice(_NASTY)
    text = json.dumps(d, separators=(",", ":"))
    for k, v in _RAW.items():
        text = text.replace(k, v)
    return text.encode()


def test_mutated_samples_read_the_same(board_payloads):
    rng = random.Random(14)
    bases = [json.loads(p) for payloads in board_payloads.values() for p in payloads]
    taken = 0
    for _ in range(4000):
        taken += check(mutate(json.loads(json.dumps(rng.choice(bases))), rng))
    assert taken > 400  # many mutations leave the sample valid, and those the fast path takes


def test_what_the_fast_path_leaves_to_the_hand_written_reader():
    good = json.loads(sample_payload(__import__("samplefactory").healthy_sample()))
    assert check(json.dumps(good).encode())
    for payload in (json.dumps(good), bytearray(json.dumps(good).encode()), json.dumps({**good, "zz": 1}).encode(),
                    json.dumps({**good, "gi": list(range(len(good["p"])))}).encode()):
        assert sample_tick(payload, "c", "n") is None
        assert outcome(lambda p: parse.parse_message(TOPIC, p), payload) == outcome(slow, payload)
