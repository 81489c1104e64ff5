"""Xids from the kernel log (issue 12, item 6): the one-shot `nvmon audit` reports the Xids the
driver logged shortly before it started. The reader on files in /dev/kmsg's record format, the
audit's use of them, the simulator's fake kmsg, and the CLI in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from samplefactory import healthy_sample, with_gpu

from nvmon.audit import audit
from nvmon.collect.kmsg import parse_record, read_logged_xids
from nvmon.model import NvmlStatus
from nvmon.sim.node import BOOTED_S, SimNode
from nvmon.xid import LoggedXid

NOW = 5000.0  # seconds since boot, the reader's present in these tests


def rec(age_s: float, text: str, seq: int = 1, level: int = 4) -> str:
    return f"{level},{seq},{int((NOW - age_s) * 1e6)},-;{text}"


@pytest.mark.parametrize("line, want", [
    # the driver's format (pid/name since ~R450), and older ones without them
    (rec(42, "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python3, GPU has fallen off the bus."),
     LoggedXid("0000:18:00", 79, 42.0, "pid=1234, name=python3, GPU has fallen off the bus.")),
    (rec(5, "NVRM: Xid (PCI:0000:9A:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error"),
     LoggedXid("0000:9a:00", 48, 5.0, "pid='<unknown>', name=<unknown>, An uncorrectable double bit error")),
    (rec(1, "NVRM: Xid (PCI:0001:3b:00.0): 13, Graphics Exception: ESR 0x405840=0x0"),
     LoggedXid("0001:3b:00", 13, 1.0, "Graphics Exception: ESR 0x405840=0x0")),
    (rec(1, "NVRM: GPU at PCI:0000:18:00: GPU-5b4d0e0c"), None),  # NVRM, not an Xid
    (rec(1, "mlx5_core 0000:1a:00.0: Port module event: module 0, Cable plugged"), None),
    (rec(601, "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."), None),  # older than the window
    ("garbage without the record prefix", False),
    ("4,x,12,-;NVRM: Xid (PCI:0000:18:00): 79, z", False),
])
def test_parse_record(line, want):
    got = parse_record(line, NOW, 600.0)
    if isinstance(want, LoggedXid):
        assert got == replace(want, age_s=pytest.approx(want.age_s, abs=1e-3))
    else:
        assert got is want


def test_read_a_log_file_skips_continuations_and_counts_malformed_records(tmp_path):
    log = tmp_path / "kmsg"
    log.write_bytes("\n".join([
        rec(3000, "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.", 1),  # before the window
        rec(30, "NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=a, GPU has fallen off the bus.", 2),
        " SUBSYSTEM=pci",
        " DEVICE=+pci:0000:18:00.0",
        "not a record",
        rec(20, "NVRM: Xid (PCI:0000:3a:00): 74, pid=1, name=a, NVLink: fatal error detected on link 3", 3),
    ]).encode() + b"\n\xff\xfe\x00 binary junk\n" + rec(10, "NVRM: Xid (PCI:0000:18:00): 79, again").encode())
    got = read_logged_xids(log, window_s=600.0, uptime_s=NOW)
    assert [(x.bus_id, x.xid, round(x.age_s)) for x in got.xids] == [
        ("0000:18:00", 79, 30), ("0000:3a:00", 74, 20), ("0000:18:00", 79, 10)]  # the last line has no newline
    assert got.skipped == 2 and got.note == "2 malformed kernel log records skipped"


@pytest.mark.parametrize("make", ["missing", "directory"])
def test_an_unreadable_log_is_a_note_not_an_error(tmp_path, make):
    path = tmp_path / "kmsg"
    if make == "directory":
        path.mkdir()
    got = read_logged_xids(path, uptime_s=NOW)
    assert got.xids == () and got.note.startswith(f"kernel log {path} not readable (")
    assert got.note.endswith("Xids logged before the audit are not checked")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_a_log_without_permission_says_how_to_read_it(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text("")
    path.chmod(0)
    assert "permission denied: run as root, or sysctl kernel.dmesg_restrict=0" in read_logged_xids(path).note


def test_the_real_dev_kmsg_is_read_or_noted_never_raised():
    got = read_logged_xids("/dev/kmsg", window_s=60.0)  # root: the ring buffer; else a permission note
    assert got.note is None or "kernel log" in got.note


# -- the audit -----------------------------------------------------------------------------------


def test_audit_reports_a_logged_xid_on_its_gpu_by_bus_id():
    s = healthy_sample()
    bus = s.gpus[3].pci_bus_id  # NVML's form, e.g. 00000000:5D:00.0
    logged = [LoggedXid(f"{bus[4:14].lower()}", 79, 95.0, "GPU has fallen off the bus."),
              LoggedXid(f"{bus[4:14].lower()}", 79, 65.0, "GPU has fallen off the bus.")]
    [f] = [f for f in audit(s, logged_xids=logged).findings if f.code == "gpu.xid"]
    assert (f.gpu, f.xid, f.severity) == (3, 79, "critical")
    assert f.observed == {"xid": 79, "events": 2, "source": "kernel log", "age_s": 65}
    assert f.message.startswith("GPU 3 Xid 79, GPU has fallen off the bus (kernel log ×2, the last 65 s before "
                                "the audit): ")


def test_an_xid_nvml_delivered_too_is_one_finding():
    s = with_gpu(healthy_sample(), 2, xid_events=(74,))
    bus = s.gpus[2].pci_bus_id[4:14].lower()
    found = [f for f in audit(s, logged_xids=[LoggedXid(bus, 74, 0.5, "")]).findings if f.code == "gpu.xid"]
    assert [(f.gpu, f.xid, "source" in f.observed) for f in found] == [(2, 74, False)]


def test_without_nvml_a_logged_xid_is_named_by_its_bus_id():
    s = replace(healthy_sample(), gpus=(), nvml=NvmlStatus(available=False, error="Driver Not Loaded"))
    report = audit(s, logged_xids=[LoggedXid("0000:18:00", 79, 30.0, "")])
    [f] = [f for f in report.findings if f.code == "gpu.xid"]
    assert (f.gpu, f.device, report.verdict) == (None, "0000:18:00", "critical")
    assert f.message.startswith("GPU at PCI 0000:18:00 (not in NVML's list) Xid 79")


# -- the simulator's fake kmsg and the CLI --------------------------------------------------------


class Clock:
    def __init__(self, t: float = 1_700_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_the_simulator_logs_each_xid_fault_when_it_is_due():
    clock = Clock()
    node = SimNode("hgx-h100,xid=3:79,xid=1:48@30", clock=clock)
    try:
        first = read_logged_xids(node.kmsg_path, uptime_s=node.kernel_uptime())
        clock.t += 40
        node.sync()
        later = read_logged_xids(node.kmsg_path, uptime_s=node.kernel_uptime())
        text = node.kmsg_path.read_text()
    finally:
        node.close()
    bus3, bus1 = (node.board.gpus[i].bus_id[4:14].lower() for i in (3, 1))
    assert [(x.bus_id, x.xid, x.age_s) for x in first.xids] == [(bus3, 79, 0.0)] and first.note is None
    assert [(x.bus_id, x.xid, x.age_s) for x in later.xids] == [(bus3, 79, 40.0), (bus1, 48, 10.0)]
    assert f"4,3,{int(BOOTED_S * 1e6)},-;NVRM: Xid (PCI:{bus3}): 79, pid=2331, name=python3, GPU has fallen off " \
           "the bus." in text
    assert text.count("Xid") == 2  # each logged once


def nvmon(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvmon", *args], capture_output=True, text=True, timeout=120, **kw)


def test_cli_audit_finds_an_xid_raised_before_it_started():
    r = nvmon("audit", "--sim", "hgx-h100,xid=3:79", "--interval", "0.2", "--json")
    assert r.returncode == 2, r.stderr
    d = json.loads(r.stdout)
    [f] = [f for f in d["findings"] if f["code"] == "gpu.xid"]
    assert (f["gpu"], f["severity"], f["observed"]["xid"], f["observed"]["source"]) == (3, "critical", 79,
                                                                                          "kernel log")
    assert d["kernel_log"]["xids"] == 1 and d["kernel_log"]["note"] is None and r.stderr == ""
    r = nvmon("audit", "--sim", "hgx-h100,xid=3:79", "--interval", "0.2", "--xid-window", "0")
    assert r.returncode == 0, r.stdout + r.stderr  # not read: the Xid before the audit is not seen


def test_cli_audit_reads_a_kernel_log_file_and_notes_a_bad_one(tmp_path):
    log = tmp_path / "kmsg"
    up = time.monotonic()  # CLOCK_MONOTONIC: the subprocess's clock too
    log.write_text(f"4,1,{int((up - 30) * 1e6)},-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen "
                   "off the bus.\nnonsense\n")
    r = nvmon("audit", "--kernel-log", str(log), "--interval", "0.1", "--sysfs-root", str(tmp_path))
    assert "Traceback" not in r.stderr
    assert "nvmon audit: note: 1 malformed kernel log record skipped" in r.stderr
    assert "Xid 79" in r.stdout and r.returncode == 2  # whatever NVML says on this machine, the Xid is critical
    r = nvmon("audit", "--kernel-log", str(tmp_path / "none"), "--interval", "0.1", "--sysfs-root", str(tmp_path))
    assert "Traceback" not in r.stderr and f"note: kernel log {tmp_path / 'none'} not readable" in r.stderr
