"""`nvmon sample` and `nvmon audit` as users run them: real processes, real exit codes, JSON out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nvmon.sim.profiles import PROFILES

FIXTURE = Path(__file__).parent / "data" / "sysfs-hgx"
INTERVAL = "0.5"  # long enough for every injected error counter to rise at least once


def nvmon(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvmon", *args], capture_output=True, text=True, timeout=timeout)


def audit_json(spec: str, *extra: str) -> tuple[int, dict]:
    r = nvmon("audit", "--json", "--interval", INTERVAL, "--sim", spec, *extra)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


def problems(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] in ("warning", "critical")]


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_sample_json_contract_for_every_profile(profile):
    r = nvmon("sample", "--json", "--interval", "0.2", "--sim", profile, "--node", "gpu-01")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    p = PROFILES[profile]
    assert d["schema"] == 1 and d["node"] == "gpu-01" and d["interval_s"] > 0.1
    assert {"ts", "gpus", "topology", "ib", "host", "nvml"} <= d.keys()
    assert len(d["gpus"]) == p.gpus and len(d["ib"]) == p.ib_ports
    g = d["gpus"][0]
    for key in ("index", "name", "uuid", "pci_bus_id", "lost", "power_w", "power_limit_w", "power_default_limit_w",
                "temperature_c", "utilization_pct", "throttle_reasons", "pcie", "nvlink"):
        assert key in g, key
    assert {"gen", "max_gen", "width", "max_width", "tx_bytes_per_s", "rx_bytes_per_s", "replay_errors"} <= g["pcie"].keys()
    assert g["name"] == p.gpu_name and g["power_limit_w"] == p.power_limit_w
    assert len(g["nvlink"]) == p.link_slots
    if p.link_slots:
        link = g["nvlink"][0]
        assert {"link", "active", "version", "remote_type", "remote_pci_bus_id", "tx_bytes_per_s",
                "rx_bytes_per_s", "errors"} <= link.keys()
        assert link["errors"].keys() == {"crc_flit", "crc_data", "replay", "recovery"}
        # an unbridged card's links (h200-single) lead nowhere
        assert link["remote_type"] == {"pairs": "gpu", "nvswitch": "nvswitch"}.get(p.fabric)
    assert d["topology"]["class"] == p.fabric and len(d["topology"]["matrix"]) == p.gpus
    port = d["ib"][0]
    for key in ("device", "port", "state", "phys_state", "rate_gbps", "link_layer", "tx_bytes_per_s",
                "rx_bytes_per_s", "errors", "pcie"):
        assert key in port, key
    assert port["rate_gbps"] == p.ib_rate_gbps and port["state"] == "ACTIVE"


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_healthy_board_audits_ok(profile):
    # A pairs board is healthy only as the board you said you bought (else: a warning, below).
    code, d = audit_json(profile, *(("--expect-topology", "pairs") if profile.startswith("pairs") else ()))
    assert d["verdict"] == "ok" and code == 0, problems(d)
    assert problems(d) == []
    assert d["schema"] == 1 and d["node"] == "sim-node" and d["spec"]


def test_fake_8_card_nvlink_box_exits_1_by_default_and_2_when_nvswitch_is_expected():
    code, d = audit_json("pairs-a100")
    assert code == 1 and [f["code"] for f in problems(d)] == ["nvlink.topology"]
    code, d = audit_json("pairs-a100", "--expect-topology", "nvswitch")
    assert code == 2 and [(f["code"], f["severity"]) for f in problems(d)] == [("nvlink.topology", "critical")]


FAULTS = [
    # (spec suffix, extra flags, code, where) — where: ("gpu", G, link) or ("device", DEV)
    ("nvlink_down=2.5", (), "nvlink.link_down", ("gpu", 2, 5)),
    ("nvlink_errors=1.3", (), "nvlink.errors", ("gpu", 1, 3)),
    ("pcie_width=3:8", (), "pcie.width", ("gpu", 3, None)),
    ("pcie_gen=6:3", (), "pcie.gen", ("gpu", 6, None)),
    ("power_cap=4:350", (), "power.limit", ("gpu", 4, None)),
    ("thermal=7", (), "thermal", ("gpu", 7, None)),
    ("gpu_lost=0", (), "gpu.lost", ("gpu", 0, None)),
    ("ib_down=5", (), "ib.port_down", ("device", "mlx5_5")),
    ("ib_rate=mlx5_1:200", (), "ib.rate", ("device", "mlx5_1")),
    ("ib_eth=2", ("--expect-ib", "8x400"), "ib.rate", ("device", "mlx5_2")),
    ("ib_errors=6", (), "ib.errors", ("device", "mlx5_6")),
]
SEVERITY = {"nvlink.link_down": "critical", "gpu.lost": "critical", "ib.port_down": "critical"}


@pytest.mark.parametrize("fault,extra,code,where", FAULTS, ids=[f[0] for f in FAULTS])
def test_each_fault_is_found_where_it_was_planted_and_nowhere_else(fault, extra, code, where):
    rc, d = audit_json(f"hgx-h100,{fault}", *extra)
    found = [f for f in problems(d) if f["code"] == code]
    assert len(found) == 1, problems(d)
    f = found[0]
    if where[0] == "gpu":
        assert (f["gpu"], f["link"]) == (where[1], where[2])
        others = [p for p in problems(d) if p["gpu"] != where[1]]
    else:
        assert f["device"] == where[1] and f["port"] == 1
        others = [p for p in problems(d) if p["device"] != where[1]]
    assert others == [], others
    assert f["severity"] == SEVERITY.get(code, "warning")
    assert d["verdict"] == f["severity"]
    assert rc == {"warning": 1, "critical": 2}[d["verdict"]]
    assert f["message"] and "\n" not in f["message"]


def test_power_cap_under_load_also_reports_throttling():
    _, d = audit_json("hgx-h100,power_cap=4:350")
    assert {f["code"] for f in problems(d)} == {"power.limit", "power.cap"}


def test_pairs_box_fails_an_all_to_all_expectation():
    rc, d = audit_json("pairs-a100", "--expect-topology", "nvswitch")
    assert rc == 2 and [f["code"] for f in problems(d)] == ["nvlink.topology"]
    assert d["findings"][-1]["code"] == "nvlink.board" or any(f["code"] == "nvlink.board" for f in d["findings"])


def test_expected_gpu_count_and_ib_count():
    rc, d = audit_json("hgx-a800", "--expect-gpus", "8", "--expect-ib", "8x200")
    assert [f["code"] for f in problems(d)] == ["ib.count"] and rc == 1


def test_no_nvml_sample_still_reports_ib_and_audit_says_unknown():
    r = nvmon("sample", "--json", "--interval", "0.2", "--sim", "hgx-h100,nvml=off")
    d = json.loads(r.stdout)
    assert r.returncode == 0 and d["gpus"] == [] and d["nvml"]["available"] is False
    assert len(d["ib"]) == 8 and d["notes"]
    rc, a = audit_json("hgx-h100,nvml=off")
    assert rc == 3 and a["verdict"] == "unknown" and [f["code"] for f in a["findings"]] == ["nvml.unavailable"]


def test_real_path_without_driver_reads_sysfs_fixture():
    """The real pynvml on this machine (no libnvidia-ml): not bad input, just no GPU data."""
    r = nvmon("sample", "--json", "--interval", "0.1", "--sysfs-root", str(FIXTURE))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    if d["nvml"]["available"]:  # pragma: no cover - a machine with a driver
        pytest.skip("real NVIDIA driver present")
    assert "libnvidia-ml.so.1" in d["nvml"]["error"]
    assert [p["device"] for p in d["ib"]] == ["mlx5_0", "mlx5_1"]
    assert d["nvswitches"][0]["pci_bus_id"] == "0000:c1:00.0"
    r = nvmon("audit", "--json", "--interval", "0.1", "--sysfs-root", str(FIXTURE))
    a = json.loads(r.stdout)
    assert r.returncode == 3 and "nvml.unavailable" in [f["code"] for f in a["findings"]]


def test_table_output_is_readable():
    r = nvmon("sample", "--interval", "0.2", "--sim", "hgx-h100,nvlink_down=2.5")
    assert r.returncode == 0, r.stderr
    assert "H100" in r.stdout and "mlx5_0" in r.stdout
    r = nvmon("audit", "--interval", "0.2", "--sim", "hgx-h100,nvlink_down=2.5")
    assert r.returncode == 2 and "nvlink.link_down" in r.stdout


def test_piped_tables_carry_no_trailing_spaces():
    """Piped output is laid out 200 columns wide (nothing cut for grep), without the spaces Rich
    pads table cells with at the ends of lines (a wrapped finding's first line was padded)."""
    for args in (("audit", "--sim", "hgx-h100,pcie_width=3:8,fabric=in_progress"), ("sample", "--sim", "hgx-h100")):
        r = nvmon(*args, "--interval", "0.2")
        assert r.returncode in (0, 2) and r.stdout.count("\n") > 3, r
        padded = [ln for ln in r.stdout.splitlines() if ln != ln.rstrip()]
        assert padded == [], (args, padded[:3])


BAD = [
    (("sample", "--sim", "hgx-h999"), "unknown board profile"),
    (("sample", "--sim", "hgx-h100,nvlink_down=2"), "GPU.LINK"),
    (("sample", "--sim", "hgx-h100,nvlink_down=9.1"), "GPU 9 does not exist"),
    (("sample", "--sim", "hgx-h100,nvlink_down=1.30"), "link 30 does not exist"),
    (("sample", "--sim", "hgx-h100,bogus=1"), "unknown key"),
    (("sample", "--sim", "hgx-h100,pcie_width=1:7"), "pcie_width"),
    (("sample", "--sim", "hgx-h100,ib_down=mlx5_9"), "no IB device"),
    (("sample", "--sim", "hgx-h100,load=crazy"), "load must be"),
    (("sample", "--sim", "hgx-h100,gpu_lost=1@soon"), "must be a number"),
    (("sample", "--sysfs-root", "/nonexistent/dir"), "not a directory"),
    (("sample", "--interval", "0"), "between"),
    (("sample", "--interval", "abc"), "abc"),
    (("sample", "--node", "bad name!"), "A-Z"),
    (("sample", "--sim", "hgx-h100", "--sysfs-root", "/tmp"), "--sysfs-root"),
    (("sample", "--frobnicate"), "frobnicate"),
    (("audit", "--expect-ib", "eight"), "--expect-ib"),
    (("audit", "--expect-topology", "ring"), "ring"),
]


@pytest.mark.parametrize("args,fragment", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_nonzero(args, fragment):
    r = nvmon(*args)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and fragment in lines[0], r.stderr
    if args[0] == "audit":
        assert r.returncode == 3  # Nagios UNKNOWN: the check could not run


def test_unreadable_sysfs_root(tmp_path):
    d = tmp_path / "locked"
    d.mkdir(mode=0o000)
    try:
        r = nvmon("sample", "--sysfs-root", str(d))
        import os

        if os.geteuid() == 0:  # root reads anything: then it is simply an empty tree
            assert r.returncode == 0
        else:
            assert r.returncode != 0 and "not readable" in r.stderr
        assert "Traceback" not in r.stderr
    finally:
        d.chmod(0o700)


def test_help_documents_sim_syntax_and_exit_codes():
    assert "nvlink_down=G.L" in nvmon("profiles").stdout
    assert "hgx-h100" in nvmon("profiles").stdout
    h = nvmon("audit", "--help").stdout
    assert "0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN" in h and "--expect-ib" in h
    assert "--sim" in nvmon("sample", "--help").stdout


def test_unsupported_query_is_null_in_json_and_not_a_finding():
    r = nvmon("sample", "--json", "--interval", "0.2", "--sim", "hgx-h100,notsup=temperature:3")
    d = json.loads(r.stdout)
    assert d["gpus"][3]["temperature_c"] is None and d["gpus"][2]["temperature_c"] is not None
    assert d["nvml"]["capabilities"]["unsupported"] == {"temperature": [3]}
    code, a = audit_json("hgx-h100,notsup=temperature:3")
    assert code == 0 and problems(a) == []
