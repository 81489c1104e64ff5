"""The hardware truth kit (bench/hardware/): its NVML timing wrapper, its wheel check, the device
command it prints, and its whole sequence run end to end in simulator mode."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import zipfile

import pytest

from hardware_captures import KIT, REPO, capture

import kit  # bench/hardware/kit.py
import prepare  # bench/hardware/prepare.py
from timed_nvml import TimedNvml

from nvmon.collect.node import NodeSampler
from nvmon.model import sample_to_dict
from nvmon.sim.node import SimNode


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def _two_samples(nv_of, spec="hgx-h100,seed=5"):
    clock = Clock()
    node = SimNode(spec, clock=clock)
    nv = nv_of(node.nvml)
    sampler = NodeSampler(nv, sysfs_root=node.sysfs_root, node="n", before_tick=node.sync, clock=clock)
    try:
        sampler.open()
        sampler.sample()
        clock.t += 1.0
        d = sample_to_dict(sampler.sample())
    finally:
        sampler.close()
        node.close()
    d.pop("host")
    return d, nv


def test_timed_module_changes_nothing_nvmon_reads_and_counts_every_call():
    plain, _ = _two_samples(lambda nv: nv)
    timed_sample, timed = _two_samples(TimedNvml)
    assert timed_sample == plain
    stats = timed.stats(ticks=2)["tick"]
    # The per-tick field-value batch calls the C symbol itself (nvml_batch): timed under C:...
    assert stats["C:nvmlDeviceGetFieldValues"]["count"] >= 16  # 8 GPUs x 2 ticks (+ the link-count read)
    assert stats["nvmlDeviceGetCount"]["count"] == 1 and "per_tick" in stats["nvmlDeviceGetCount"]
    wait = next(v for k, v in stats.items() if k.startswith("nvmlEventSetWait"))  # _v2 in newer bindings
    assert wait["errors"] == {"NVMLError_Timeout": 2}  # nothing happened: one wait a tick
    assert all(r["p50_us"] <= r["p99_us"] <= r["max_us"] for r in stats.values())


def test_timed_module_files_calls_by_phase():
    clock = Clock()
    node = SimNode("hgx-h100", clock=clock)
    try:
        t = TimedNvml(node.nvml)
        t.phase = "open"
        t.nvmlInit()
        assert t.nvmlDeviceGetCount() == 8
        t.phase = "tick"
        with pytest.raises(t.NVMLError_InvalidArgument):
            t.nvmlDeviceGetHandleByIndex(99)
        s = t.stats(ticks=1)
        assert set(s) == {"open", "tick"} and "per_tick" not in s["open"]["nvmlDeviceGetCount"]
        assert s["tick"]["nvmlDeviceGetHandleByIndex"]["errors"] == {"NVMLError_InvalidArgument": 1}
        assert t.NVML_FI_DEV_NVLINK_LINK_COUNT == node.nvml.NVML_FI_DEV_NVLINK_LINK_COUNT  # constants as they are
    finally:
        node.close()


def test_device_command_fits_the_device_tool():
    cmd = kit.DEVICE_COMMAND
    assert len(cmd) < 2000 and "bench/hardware/run.sh" in cmd and '"$OUT"' in cmd
    assert (REPO / "bench/hardware/run.sh").is_file() and os.access(REPO / "bench/hardware/run.sh", os.X_OK)
    assert 0 < len(kit.DEVICE_CARRY) <= 8 and 60 < kit.DEVICE_TIMEOUT_S <= 600
    out = subprocess.run([sys.executable, str(KIT / "kit.py"), "device-command"], capture_output=True, text=True)
    assert json.loads(out.stdout) == {"command": cmd, "carry": list(kit.DEVICE_CARRY), "timeout_s": kit.DEVICE_TIMEOUT_S}
    # The wheels are git-ignored, so they travel only as carried paths.
    if (REPO / ".git").exists():
        ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "bench/hardware/wheels/x.whl"])
        assert ignored.returncode == 0


def _wheel(d, name, version, requires=(), tag="py3-none-any"):
    path = d / f"{name.replace('-', '_')}-{version}-{tag}.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", meta)
    return path


def test_prepare_checks_every_dependency_is_named_and_pinned(tmp_path):
    _wheel(tmp_path, "alpha", "1.0", ["beta>=2", "gamma; python_version < '3.11'", "delta; extra == 'x'", "pip"])
    _wheel(tmp_path, "beta", "1.5")
    _wheel(tmp_path, "native", "3.0", tag="cp311-cp311-manylinux_2_17_x86_64")
    problems = prepare.check(tmp_path, {"alpha": "1.0", "beta": "1.5", "native": "3.0", "omega": "9"})
    assert any("beta>=2" in p and "pinned 1.5" in p for p in problems)
    assert any("native" in p and "not for CPython 3.12" in p for p in problems)
    assert any("no wheel for omega==9" in p for p in problems)
    assert not any("gamma" in p or "delta" in p or "'pip'" in p for p in problems)  # markers, extras, provided
    assert len(problems) == 3
    ok = tmp_path / "ok"
    ok.mkdir()
    _wheel(ok, "alpha", "1.0", ["beta>=1"])
    _wheel(ok, "beta", "1.5", tag="cp312-cp312-manylinux2014_x86_64")
    assert prepare.check(ok, {"alpha": "1.0", "beta": "1.5"}) == []


def test_requirements_pin_every_module_nvmon_imports():
    """The pins cover the third-party packages nvmon's modules import (a new dependency in
    pyproject.toml that sample/audit/daemon need must reach requirements.txt too)."""
    pins = prepare.pins(KIT / "requirements.txt")
    assert {"nvidia-ml-py", "psutil", "click", "pydantic", "pydantic-core", "sqlite-utils", "prometheus-client",
            "aiomqtt", "paho-mqtt", "rich"} <= set(pins)
    assert all(re.fullmatch(r"[0-9][0-9a-z.]*", v) for v in pins.values())


def test_kit_runs_its_whole_sequence_on_the_simulator(tmp_path):
    """run.sh --sim end to end (with this venv's packages; on a node it installs the wheels), a
    short daemon run: every step succeeds and at most 8 files come out, named as the tool allows."""
    xml = capture("qx-h100.xml")
    nvlink = tmp_path / "nvlink-s.txt"
    nvlink.write_text("".join(f"GPU {g}: NVIDIA H100 80GB HBM3 (UUID: GPU-{g})\n"
                              + "".join(f"\t Link {i}: 26.562 GB/s\n" for i in range(18)) for g in range(8)))
    out = tmp_path / "out"
    p = subprocess.run(["bash", str(KIT / "run.sh"), "--use-env", "--out", str(out), "--sim", "hgx-h100,load=idle",
                        "--smi-xml", str(xml), "--smi-nvlink", str(nvlink), "--daemon-seconds", "7"],
                       capture_output=True, text=True, timeout=110, env={**os.environ, "PYTHON": sys.executable})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    files = sorted(f.name for f in out.iterdir())
    assert files == sorted(["nvidia-smi-q.xml", "nvidia-smi.txt", "metrics.txt", "compare.txt", "nvmon.json",
                            "kit.log"])
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files) and len(files) <= 8
    result = json.loads((out / "nvmon.json").read_text())
    assert all(s["ok"] for s in result["kit"]["steps"]), result["kit"]["steps"]
    assert [s["rc"] for s in result["samples"]] == [0, 0, 0] and len(result["samples"][2]["json"]["gpus"]) == 8
    assert result["audit"]["rc"] in (0, 1) and "verdict" in result["audit"]["json"]
    d = result["daemon"]
    assert d["exit_code"] == 0 and d["daemon"]["ticks"] >= 3 and d["rss_mib_max"] > 10
    assert any(s.get("ok") and s["dcgm_names"] > 5 for s in d["scrapes"])
    assert d["nvml_calls"]["tick"]["C:nvmlDeviceGetFieldValues"]["count"] >= 8 * 3
    assert d["nvml_calls"]["open"]["nvmlDeviceGetName"]["count"] == 8
    # A simulator with no fabric info answers Function Not Found; one with it, the healthy state.
    assert d["fabric"][0].get("error") == "Function Not Found" or d["fabric"][0]["state"] == "Completed"
    summary = result["compare"]["summary"]
    assert summary["match"] > 100 and summary["DIFFERS"] > 0  # a capture of another box: bus ids, UUIDs...
    rows = {(r["scope"], r["field"]): r["verdict"] for r in result["compare"]["rows"]}
    assert rows[("gpu 0", "power limit max")] == "match" and rows[("gpu 0", "NVLink speed per link")] == "match"
    assert rows[("gpu 0", "uuid")] == "DIFFERS"
    assert "summary:" in (out / "compare.txt").read_text()
    # Every third-party module the daemon loaded comes from a distribution requirements.txt pins,
    # or the wheels installed on a node would not run it.
    dists = importlib.metadata.packages_distributions()
    pins = prepare.pins(KIT / "requirements.txt")
    unpinned = {m: dists.get(m) for m in d["modules"] if not m.startswith("_")
                and not {prepare.norm(x) for x in dists.get(m, [m])} & set(pins)}
    assert not unpinned, f"imported by the daemon, not in bench/hardware/requirements.txt: {unpinned}"
    assert "DCGM_FI_DEV_POWER_USAGE" in (out / "metrics.txt").read_text()
    assert "sim mode: no capture of `nvidia-smi topo -m`" in (out / "nvidia-smi.txt").read_text()
    # And its files land as a GPU run's would, under a docs folder of our own (never the repo's docs/).
    docs = tmp_path / "docs-hardware"
    p = subprocess.run([sys.executable, str(KIT / "kit.py"), "land", str(out), "--docs", str(docs)],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    dest = docs / f"{result['kit']['started'][:10]}-nvidia-h100-80gb-hbm3"
    assert p.stdout.startswith(f"{dest}  (driver 580.105.08): compare.txt, kit.log, metrics.txt")
    assert sorted(f.name for f in dest.iterdir()) == files
    assert all((dest / f).read_bytes() == (out / f).read_bytes() for f in files)


def test_land_copies_a_run_to_its_dated_folder_and_never_over_another(tmp_path):
    run = tmp_path / "out"
    run.mkdir()
    meta = {"kit": {"started": "2026-12-05T01:02:03Z"}, "compare": {"gpu": "NVIDIA H200", "driver": "570.86.15"}}
    (run / "nvmon.json").write_text(json.dumps(meta))
    (run / "compare.txt").write_text("summary: 1 match\n")
    (run / "sub").mkdir()  # not a file: left behind
    docs = tmp_path / "docs"
    first = kit.land(run, docs)
    assert first == docs / "2026-12-05-nvidia-h200"
    assert sorted(f.name for f in first.iterdir()) == ["compare.txt", "nvmon.json"]
    (run / "compare.txt").write_text("summary: 2 match\n")  # a second run the same day on the same GPU
    second = kit.land(run, docs)
    assert second == docs / "2026-12-05-nvidia-h200-2"
    assert (first / "compare.txt").read_text() == "summary: 1 match\n"  # the first is kept as it was
    meta["compare"] = None  # compare step failed: no GPU name
    (run / "nvmon.json").write_text(json.dumps(meta))
    assert kit.land(run, docs) == docs / "2026-12-05-unknown-gpu"


def test_land_refuses_what_is_not_a_kit_run_in_one_line(tmp_path):
    bad_json = tmp_path / "bad"
    bad_json.mkdir()
    (bad_json / "nvmon.json").write_text("{not json")
    no_date = tmp_path / "nodate"
    no_date.mkdir()
    (no_date / "nvmon.json").write_text(json.dumps({"kit": {"started": "../../etc"}}))
    for folder, expect in ((tmp_path / "missing", "not a kit run's files"), (bad_json, "not the kit's nvmon.json"),
                           (no_date, "kit.started is not a date")):
        p = subprocess.run([sys.executable, str(KIT / "kit.py"), "land", str(folder), "--docs", str(tmp_path / "d")],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and expect in p.stderr, p.stderr
        assert "Traceback" not in p.stderr and p.stdout == ""
    assert not (tmp_path / "d").exists()
