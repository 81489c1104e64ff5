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
])
def test_malformed_specs_raise_one_line(spec):
    if spec == "hgx-h100,":
        parse_scenario(spec)  # a trailing comma is harmless
        return
    with pytest.raises(SimSpecError) as e:
        parse_scenario(spec)
    assert "\n" not in str(e.value) and str(e.value)
