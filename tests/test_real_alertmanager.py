"""nvmon's Alertmanager hook against real Alertmanagers (Debian's prometheus-alertmanager on
loopback ports): `nvmon hooks test` passes; a daemon on a simulated board whose GPU 3 drops to
PCIe x8 from 5 s to 40 s puts the alert, with its gpu label and runbook, into both Alertmanagers
of an HA pair, keeps it there past Alertmanager's resolve_timeout by re-sending it, and takes it
out when the fault ends; Alertmanager groups it by nvmon's labels and notifies its own receiver of
the firing and of the resolve. The alerts.md example config passes `amtool check-config`."""

from __future__ import annotations

import re
import subprocess
import sys
import time

from realstack import REPO, Alertmanager, tool, wait_for
from test_hooks import receiver  # noqa: F401 (a fixture)
from test_prometheus import Daemon

RUNBOOK = "PCIe x8: reseat the card (GPU, HCA) or its riser, check BIOS bifurcation; lspci -vv LnkSta"



def nvmon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvmon", *args], capture_output=True, text=True, timeout=60)


def test_hooks_test_passes_against_a_real_alertmanager(tmp_path, receiver):
    with Alertmanager(tmp_path, receiver.url("/am")) as am:
        cfg = tmp_path / "nvmon.toml"
        cfg.write_text(f'[node]\nname = "gpu-07"\ncluster = "c1"\n'
                       f'[[hooks]]\nname = "am"\ntype = "alertmanager"\nurls = ["{am.url}"]\n'
                       f'[[hooks]]\nname = "firing-only"\ntype = "alertmanager"\nurls = ["{am.url}"]\n'
                       'on = ["firing"]\n')
        r = nvmon("hooks", "test", "--config", str(cfg), "--hook", "am")
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.split()[:2] == ["am", "alertmanager"]
        assert r.stdout.rstrip().endswith("ok (firing: HTTP 200, resolved: HTTP 200)"), r.stdout
        assert am.alerts(alertname="nvmon.test") == []  # fired and resolved: not active
        r = nvmon("hooks", "test", "--config", str(cfg), "--hook", "firing-only")  # and it is there when firing
        assert r.returncode == 0, r.stdout + r.stderr
        [a] = am.alerts(alertname="nvmon.test")
        assert a["labels"] == {"alertname": "nvmon.test", "severity": "info", "cluster": "c1", "node": "gpu-07",
                               "test": "true"}
        assert a["annotations"]["summary"].startswith("Test alert from `nvmon hooks test`")
        assert a["status"]["state"] == "active"


def test_a_daemons_alert_reaches_an_ha_pair_with_gpu_and_runbook_and_resolves(tmp_path, receiver):
    # resolve_timeout 10 s, the fault 35 s long: only the hook's re-sends (every 3 s) keep it active
    ams = [Alertmanager(tmp_path, receiver.url(f"/am{i}"), resolve_timeout="10s") for i in (1, 2)]
    d = None
    try:
        urls = ", ".join(f'"{am.url}"' for am in ams)
        toml = ('[alerts]\nfor_s = 0.5\nclear_s = 1\nstartup_grace_s = 0\n'
                f'[[hooks]]\ntype = "alertmanager"\nurls = [{urls}]\nrepeat_interval_s = 3\n')
        d = Daemon(tmp_path, "hgx-h100,pcie_width=3:8@5-40", toml=toml)
        t0 = time.monotonic()
        for am in ams:
            [a] = wait_for(lambda am=am: am.alerts(alertname="pcie.width"), 30, "the alert in each Alertmanager")
            assert a["labels"] == {"alertname": "pcie.width", "severity": "warning", "cluster": "t",
                                   "node": "prom-1", "gpu": "3"}
            assert a["annotations"]["runbook"] == RUNBOOK and a["annotations"]["summary"].startswith("GPU 3 PCIe x8")
            assert a["status"]["state"] == "active" and "endsAt" in a
        # Alertmanager grouped it by nvmon's labels and told its receiver, in each of the pair
        for i, am in enumerate(ams, 1):
            [group] = [g for g in am.groups() if g["alerts"]]
            assert group["labels"] == {"cluster": "t", "node": "prom-1"}
            note = wait_for(lambda i=i: [b for b in receiver.bodies(f"/am{i}") if b["status"] == "firing"], 30,
                            "Alertmanager's firing notification")[0]
            assert note["groupLabels"] == {"cluster": "t", "node": "prom-1"}
            assert note["alerts"][0]["labels"]["gpu"] == "3"
        # Still active well past resolve_timeout, while the fault lasts
        time.sleep(max(0.0, 30 - (time.monotonic() - t0)))
        for am in ams:
            [a] = am.alerts(alertname="pcie.width")
            assert a["status"]["state"] == "active"
        # The fault ends at 40 s: nvmon resolves it and both Alertmanagers drop it at once, not
        # resolve_timeout after the last re-send
        wait_for(lambda: "alert resolved: warning pcie.width" in d.log.read_text(), 30, "nvmon to resolve it")
        for am in ams:
            wait_for(lambda am=am: am.alerts(alertname="pcie.width") == [], 5, "the alert to leave Alertmanager")
        for i in (1, 2):
            wait_for(lambda i=i: [b for b in receiver.bodies(f"/am{i}") if b["status"] == "resolved"], 30,
                     "Alertmanager's resolved notification")
        log = d.log.read_text()
        assert "resolved alert(s) delivered (HTTP 200 from 2 servers)" in log and "Traceback" not in log
    finally:
        if d is not None and d.proc.poll() is None:
            d.stop()
        for am in ams:
            am.stop()


def test_the_documented_alertmanager_config_is_valid(tmp_path):
    amtool = tool("amtool", package="prometheus-alertmanager")
    doc = (REPO / "docs" / "alerts.md").read_text()
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", doc, re.S) if "alertmanager.yml" in b]
    config = tmp_path / "alertmanager.yml"
    config.write_text(block + "receivers:\n  - name: gpu-oncall\n  - name: gpu-pager\n")  # the receivers are yours
    r = subprocess.run([amtool, "check-config", str(config)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
