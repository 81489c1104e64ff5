"""The --sim spec parser: the documented syntax, and one-line errors for everything else."""

from __future__ import annotations

import pytest

from nvmon.sim.scenario import Fault, SimSpecError, parse_scenario


def test_full_syntax():
    s = parse_scenario("HGX-H100, seed=7, load=idle, nvlink_down=2.5@30, pcie_width=3, pcie_gen=1:2,"
                       "ib_rate=mlx5_1:100, ib_down=4, power_cap=4:350, notsup=throttle, nvml=on")
    assert (s.profile, s.seed, s.load, s.nvml) == ("hgx-h100", 7, "idle", True)
    assert s.faults[0] == Fault("nvlink_down", gpu=2, link=5, after_s=30.0)
    assert s.faults[1] == Fault("pcie_width", gpu=3, value=8.0)
    assert s.faults[2] == Fault("pcie_gen", gpu=1, value=2.0)
    assert s.faults[3] == Fault("ib_rate", port="mlx5_1", value=100.0)
    assert s.faults[4] == Fault("ib_down", port="4")
    assert s.faults[5] == Fault("power_cap", gpu=4, value=350.0)
    assert s.faults[6] == Fault("notsup", what="throttle")


@pytest.mark.parametrize("spec", [
    "", "nope", "hgx-h100,", "hgx-h100,=", "hgx-h100,seed=-1", "hgx-h100,seed=x", "hgx-h100,nvml=maybe",
    "hgx-h100,thermal=1:2", "hgx-h100,ib_down=mlx5_0:3", "hgx-h100,notsup=everything", "hgx-h100,gpu_lost=",
    "hgx-h100,pcie_gen=1:9", "hgx-h100,nvlink_errors=1.2.3", "pcie-l40s,nvlink_down=0.0", "hgx-a800,ib_down=5",
    "hgx-h100,power_cap=1:lots", "hgx-h100,nvlink_down=1.2@-3",
    # @START-END: END after START, both numbers; xid is an event, not a state
    "hgx-h100,pcie_width=3:8@20-5", "hgx-h100,pcie_width=3:8@5-5", "hgx-h100,ib_down=1@5-", "hgx-h100,ib_down=1@-5",
    "hgx-h100,thermal=2@5-x", "hgx-h100,gpu_lost=2@1-2-3", "hgx-h100,xid=3:79@5-20", "hgx-h100,nvlink_errors=1.2@5-",
])
def test_malformed_specs_raise_one_line(spec):
    if spec == "hgx-h100,":
        parse_scenario(spec)  # a trailing comma is harmless
        return
    with pytest.raises(SimSpecError) as e:
        parse_scenario(spec)
    assert "\n" not in str(e.value) and str(e.value)


def test_fault_end_time():
    s = parse_scenario("hgx-h100,pcie_width=3:8@5-20,ib_down=mlx5_1@1.5-6.25,notsup=energy:2@0-3,thermal=1@7,"
                       "nvlink_errors=2.5@2-4,xid=3:79@10")
    width, down, notsup, hot, errs, xid = s.faults
    assert width == Fault("pcie_width", gpu=3, value=8.0, after_s=5.0, until_s=20.0)
    assert down == Fault("ib_down", port="mlx5_1", after_s=1.5, until_s=6.25)
    assert notsup == Fault("notsup", gpu=2, what="energy", after_s=0.0, until_s=3.0)
    assert hot == Fault("thermal", gpu=1, after_s=7.0) and hot.until_s is None  # @START alone: never ends
    assert errs == Fault("nvlink_errors", gpu=2, link=5, after_s=2.0, until_s=4.0)
    assert xid.until_s is None
    # [START, END): on at START, off again at END
    assert [width.active(t) for t in (4.99, 5.0, 19.99, 20.0, 1e9)] == [False, True, True, False, False]
    assert [hot.active(t) for t in (6.9, 7.0, 1e9)] == [False, True, True]


@pytest.mark.parametrize(("spec", "fragment"), [
    ("hgx-h100,pcie_width=3:8@20-5", "pcie_width end time 5 must be after its start time 20"),
    ("hgx-h100,ib_down=1@5-5", "ib_down end time 5 must be after its start time 5"),
    ("hgx-h100,xid=3:79@5-20", "xid is one event at its start time: @SECONDS, not @START-END"),
    ("hgx-h100,thermal=2@5-x", "thermal end time must be a number, got 'x'"),
])
def test_bad_end_time_says_why(spec, fragment):
    with pytest.raises(SimSpecError) as e:
        parse_scenario(spec)
    assert fragment in str(e.value) and "\n" not in str(e.value)
