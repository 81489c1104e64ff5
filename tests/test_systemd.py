"""The shipped systemd unit and example config, checked by systemd's own tools.

`systemd-analyze verify` checks a unit offline, without a running systemd; the one thing it insists on
is that ExecStart='s binary exists (on this machine /usr/local/bin/nvmon usually doesn't), so the tests
verify a copy whose ExecStart points at the venv's `nvmon` console script, arguments unchanged.
Nothing else is relaxed: User=nvmon need not exist for `verify`, and every warning it prints (an
unknown or misspelt directive only warns, with exit status 0) fails the test.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "systemd" / "nvmon-daemon.service"
EXAMPLE_CONFIG = REPO / "systemd" / "nvmon.toml"
SHIPPED_EXEC = "/usr/local/bin/nvmon"
MAX_EXPOSURE = 4.0

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None,
                                   reason="systemd-analyze not installed (apt install systemd)")
# No colours, no pager, no hyperlinks: plain text to parse.
ENV = {**os.environ, "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "", "SYSTEMD_URLIFY": "0", "LC_ALL": "C.UTF-8"}


def nvmon_executable() -> str:
    """An existing executable for ExecStart: the console script next to this interpreter if there."""
    beside = Path(sys.executable).parent / "nvmon"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("nvmon") or "/bin/true"


def unit_directives(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) for every assignment, in order (systemd allows repeated keys)."""
    out, section = [], ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip(), value.strip()))
    return out


def values(key: str) -> list[str]:
    return [v for _, k, v in unit_directives(UNIT.read_text()) if k == key]


@pytest.fixture
def unit_copy(tmp_path) -> Path:
    """The shipped unit, same file name (systemd derives the unit name from it), runnable ExecStart."""
    text = UNIT.read_text()
    assert f"ExecStart={SHIPPED_EXEC} " in text
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace(f"ExecStart={SHIPPED_EXEC} ", f"ExecStart={nvmon_executable()} ", 1))
    return copy


def analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([ANALYZE, "--no-pager", *args], capture_output=True, text=True, env=ENV, timeout=60)


@needs_analyze
def test_unit_verifies_without_any_warning(unit_copy):
    r = analyze("verify", "--man=no", str(unit_copy))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (r.stdout + r.stderr).strip() == ""


@needs_analyze
def test_verify_catches_a_misspelt_directive(unit_copy):
    """Proves the test above can fail: a typo only warns (exit 0), and we see the warning."""
    unit_copy.write_text(unit_copy.read_text().replace("ProtectHome=yes", "ProtectHomes=yes"))
    r = analyze("verify", "--man=no", str(unit_copy))
    assert "ProtectHomes" in r.stdout + r.stderr


@needs_analyze
def test_verify_needs_the_binary_so_we_substitute_it(tmp_path):
    """Documents the one substitution: the shipped path only fails because it isn't installed here."""
    if Path(SHIPPED_EXEC).exists():
        pytest.skip(f"{SHIPPED_EXEC} is installed on this machine")
    copy = tmp_path / UNIT.name
    shutil.copy(UNIT, copy)
    r = analyze("verify", "--man=no", str(copy))
    assert r.returncode != 0
    assert f"Command {SHIPPED_EXEC} is not executable" in r.stdout + r.stderr


def exposure(unit: Path) -> tuple[float, str]:
    r = analyze("security", "--offline=yes", str(unit))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    m = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", out)
    assert m, out
    return float(m.group(1)), out


@needs_analyze
def test_security_exposure_at_most_4(unit_copy):
    level, report = exposure(unit_copy)
    assert level <= MAX_EXPOSURE, report
    # The same bound through systemd's own gate (tenths), as docs/install.md tells admins to run it.
    r = analyze("security", "--offline=yes", f"--threshold={int(MAX_EXPOSURE * 10)}", str(unit_copy))
    assert r.returncode == 0, r.stdout + r.stderr


@needs_analyze
def test_security_sees_the_gpu_device_allow_list(unit_copy):
    """The score is computed on our DeviceAllow= list, not on a PrivateDevices= that would hide GPUs."""
    _, report = exposure(unit_copy)
    line = next(ln for ln in report.splitlines() if "DeviceAllow=" in ln)
    assert "char-nvidiactl:rw" in line and "char-nvidia-uvm:rw" in line


def test_gpu_devices_stay_reachable():
    """Hardening must not cost the daemon its GPUs: NVML needs /dev/nvidiactl and /dev/nvidiaN."""
    assert values("PrivateDevices") in ([], ["no"]), "PrivateDevices=yes hides /dev/nvidia*"
    assert values("DevicePolicy") == ["closed"]
    allowed = {v.split()[0]: v.split()[1] if len(v.split()) > 1 else "rwm" for v in values("DeviceAllow")}
    for group in ("char-nvidia", "char-nvidiactl", "char-nvidia-frontend", "char-nvidia-uvm",
                  "char-nvidia-nvswitch", "char-nvidia-nvlink"):
        assert "r" in allowed.get(group, ""), group
    assert allowed.get("char-nvidia-caps") == "r"
    # The device cgroup only knows majors that exist at start; "char-<name>" entries look them up in
    # /proc/devices, which the driver fills with exactly these names.
    assert not [v for v in values("DeviceAllow") if v.startswith("/dev/nvidia")]


def test_service_contract():
    """What the daemon's code relies on (sd_notify, watchdog, state directory) and the install doc."""
    assert values("Type") == ["notify"]
    assert values("NotifyAccess") == ["main"]
    assert values("ExecStart") == [f"{SHIPPED_EXEC} daemon --config /etc/nvmon/nvmon.toml"]
    assert values("WatchdogSec") == ["30"]
    assert values("Restart") == ["on-failure"] and values("RestartSec") == ["5"]
    assert values("TimeoutStopSec") == ["5"]
    assert values("User") == ["nvmon"] and values("Group") == ["nvmon"]
    assert values("StateDirectory") == ["nvmon"] and values("ConfigurationDirectory") == ["nvmon"]
    assert values("CapabilityBoundingSet") == [""] and values("AmbientCapabilities") == [""]
    assert values("WantedBy") == ["multi-user.target"]


# --- MemoryDenyWriteExecute= ----------------------------------------------------------------------
# systemd enforces it with seccomp or, on newer kernels, prctl(PR_SET_MDWE). We can apply the same
# prctl without systemd and run the real CLI under it: CPython and nvmon's ctypes use must not need
# writable+executable memory.
PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
MDWE_EXEC = f"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl({PR_SET_MDWE}, {PR_MDWE_REFUSE_EXEC_GAIN}, 0, 0, 0) != 0:
    sys.exit(100 + ctypes.get_errno())
os.execv(sys.argv[1], sys.argv[1:])
"""


def test_nvmon_runs_under_memory_deny_write_execute():
    probe = subprocess.run([sys.executable, "-c", MDWE_EXEC, sys.executable, "-c", "pass"], timeout=60)
    if probe.returncode == 100 + errno.EINVAL:
        pytest.skip("kernel without PR_SET_MDWE (Linux < 6.3)")
    assert probe.returncode == 0
    check_wx = ("import mmap\ntry:\n    mmap.mmap(-1, 4096, prot=7)\nexcept OSError:\n    pass\n"
                "else:\n    raise SystemExit('W+X mapping allowed: MDWE not in force')")
    r = subprocess.run([sys.executable, "-c", MDWE_EXEC, sys.executable, "-c", check_wx],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-c", MDWE_EXEC, sys.executable, "-m", "nvmon", "sample", "--json",
                        "--interval", "0.2", "--sim", "hgx-h100"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["gpus"]) == 8


# --- The example configuration --------------------------------------------------------------------
SECTIONS = {
    "node": {"name", "cluster", "rack", "labels"},
    "sampling": {"interval_s", "sysfs_root", "sim"},
    "store": {"path", "raw_retention_h", "rollup_retention_d"},
    "mqtt": {"broker", "username", "password_file", "ca_file", "cert_file", "key_file", "keepalive_s"},
    "expect": {"gpus", "ib", "topology"},
    "prometheus": {"listen"},
    "alerts": {"enabled", "for_s", "clear_s", "startup_grace_s", "window_s", "min_count", "power_cap_pct",
               "power_limit_pct", "temperature_c", "keep_resolved_d", "rules"},
}
HOOK_KEYS = {"type", "command", "secret_file", "min_severity", "group_wait_s"}


def uncommented(text: str) -> str:
    """The example with every commented-out `# key = value` line and `# [table]` header switched on."""
    return re.sub(r"^# (\w+ = |\[\[?[\w.\"]+\]\]?)", r"\1", text, flags=re.MULTILINE)


def test_example_config_parses_with_the_documented_sections():
    data = tomllib.loads(EXAMPLE_CONFIG.read_text())
    assert set(data) == set(SECTIONS)  # [[hooks]] are all commented out: nobody is paged by default
    # Inside StateDirectory=, the only place ProtectSystem=strict leaves writable.
    assert data["store"]["path"].startswith("/var/lib/nvmon/")
    assert data["node"]["labels"] == {"role": "train", "pool": "a"}


def test_example_config_documents_every_key():
    data = tomllib.loads(uncommented(EXAMPLE_CONFIG.read_text()))
    hooks = data.pop("hooks")
    assert {s: set(keys) for s, keys in data.items()} == SECTIONS
    assert [h["type"] for h in hooks] == ["exec", "pagerduty", "slack"]
    assert set().union(*hooks) == HOOK_KEYS


def test_example_config_loads_with_the_daemons_loader(tmp_path):
    from nvmon.daemon.config import load_config

    plain = load_config(EXAMPLE_CONFIG)
    assert plain.node.name == "gpu-001" and plain.mqtt.broker == "mqtt://localhost:1883"
    everything = tmp_path / "nvmon.toml"
    everything.write_text(uncommented(EXAMPLE_CONFIG.read_text()))
    full = load_config(everything)
    assert full.expect.gpus == 8 and full.sampling.sim == "hgx-h100"
    assert str(full.mqtt.password_file) == "/etc/nvmon/mqtt.password"
    assert plain.prometheus.listen is None and full.prometheus.listen == "10.20.0.17:9400"
    assert not plain.hooks and [h.type for h in full.hooks] == ["exec", "pagerduty", "slack"]
    assert full.alerts.rules["pcie.gen"].for_s == 300 and full.alerts.for_s == plain.alerts.for_s == 30


def test_unit_points_at_the_example_config_location():
    assert "--config /etc/nvmon/nvmon.toml" in values("ExecStart")[0]
    assert tomllib.loads(EXAMPLE_CONFIG.read_text())["store"]["path"] == "/var/lib/nvmon/nvmon.db"


# --- The fleet evaluator's unit (nvmon fleet) -------------------------------------------------------
FLEET_UNIT = REPO / "systemd" / "nvmon-fleet.service"


def fleet_values(key: str) -> list[str]:
    return [v for _, k, v in unit_directives(FLEET_UNIT.read_text()) if k == key]


@pytest.fixture
def fleet_unit_copy(tmp_path) -> Path:
    text = FLEET_UNIT.read_text()
    assert f"ExecStart={SHIPPED_EXEC} " in text
    copy = tmp_path / FLEET_UNIT.name
    copy.write_text(text.replace(f"ExecStart={SHIPPED_EXEC} ", f"ExecStart={nvmon_executable()} ", 1))
    return copy


@needs_analyze
def test_fleet_unit_verifies_without_any_warning(fleet_unit_copy):
    r = analyze("verify", "--man=no", str(fleet_unit_copy))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (r.stdout + r.stderr).strip() == ""


@needs_analyze
def test_fleet_unit_security_exposure_at_most_4(fleet_unit_copy):
    level, report = exposure(fleet_unit_copy)
    assert level <= MAX_EXPOSURE, report


def test_fleet_service_contract():
    """What `nvmon fleet` relies on: its command line, the state directory for fleet.db (the
    default --db), a clean stop within TimeoutStopSec, and no GPU devices."""
    assert fleet_values("ExecStart") == [f"{SHIPPED_EXEC} fleet --config /etc/nvmon/fleet.toml"]
    assert fleet_values("Type") == ["exec"]
    assert fleet_values("Restart") == ["on-failure"] and fleet_values("TimeoutStopSec") == ["5"]
    assert fleet_values("User") == ["nvmon"] and fleet_values("StateDirectory") == ["nvmon"]
    assert fleet_values("PrivateDevices") == ["yes"] and not fleet_values("DeviceAllow")
    assert fleet_values("CapabilityBoundingSet") == [""]
    from nvmon.fleet.rules import FleetSettings
    from nvmon.fleet.service import DEFAULT_CONFIG

    assert str(DEFAULT_CONFIG) == "/etc/nvmon/fleet.toml"
    assert str(FleetSettings().db).startswith("/var/lib/nvmon/")


# --- The commands the unit files' own comments give ------------------------------------------------
INSTALLED_AT = "/etc/systemd/system/"


def commented_commands(unit: Path) -> list[list[str]]:
    """Each `#   systemd-analyze …` line of the unit's header comment, as argv."""
    return [line.lstrip("#").split() for line in unit.read_text().splitlines()
            if line.startswith("#") and line.lstrip("# ").startswith("systemd-analyze ")]


@needs_analyze
@pytest.mark.parametrize("unit", [UNIT, FLEET_UNIT], ids=lambda p: p.name)
def test_the_check_commands_in_the_units_comments_work_as_written(unit, tmp_path):
    """Run verbatim, but for the one thing an install provides: the unit at /etc/systemd/system/ (here
    a folder of our own) and ExecStart's /usr/local/bin/nvmon (here the venv's)."""
    commands = commented_commands(unit)
    assert [c[:2] for c in commands] == [["systemd-analyze", "verify"], ["systemd-analyze", "security"]]
    assert all(c[-1] == INSTALLED_AT + unit.name for c in commands)
    assert f"install -m 0644 systemd/{unit.name} {INSTALLED_AT}" in (REPO / "docs" / "install.md").read_text()
    copy = tmp_path / unit.name
    copy.write_text(unit.read_text().replace(f"ExecStart={SHIPPED_EXEC} ", f"ExecStart={nvmon_executable()} ", 1))
    for argv in commands:
        argv = [ANALYZE, *argv[1:-1], str(copy)]
        r = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=60)
        assert r.returncode == 0, (argv, r.stdout + r.stderr)
        if argv[1] == "verify":
            assert (r.stdout + r.stderr).strip() == ""
        else:
            assert "Overall exposure level" in r.stdout + r.stderr
    # The security check also runs on the shipped file itself, as the comment says.
    r = subprocess.run([ANALYZE, *commands[1][1:-1], str(unit)], capture_output=True, text=True, env=ENV,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


# --- The example fleet configuration (nvmon-fleet.service's /etc/nvmon/fleet.toml) ----------------
FLEET_CONFIG = REPO / "systemd" / "fleet.toml"


def test_fleet_unit_points_at_the_example_fleet_config():
    assert "--config /etc/nvmon/fleet.toml" in fleet_values("ExecStart")[0]
    assert f"install -m 0644 systemd/fleet.toml /etc/nvmon/fleet.toml" in (REPO / "docs" / "install.md").read_text()


def test_example_fleet_config_loads_as_shipped_and_with_every_line_switched_on(tmp_path):
    from nvmon.fleet.rules import FleetSettings
    from nvmon.fleet.service import load_fleet_config

    plain = load_fleet_config(FLEET_CONFIG)
    assert plain.mqtt.broker == "mqtt://localhost:1883" and not plain.hooks  # nobody paged by default
    assert plain.fleet.db == FleetSettings().db and str(plain.fleet.db).startswith("/var/lib/nvmon/")
    assert plain.fleet.cluster is None and plain.fleet.same_fault_nodes == 3
    everything = tmp_path / "fleet.toml"
    everything.write_text(uncommented(FLEET_CONFIG.read_text()))
    full = load_fleet_config(everything)
    assert full.fleet.cluster == "prod" and full.fleet.rack_budget_kw == 12
    assert full.fleet.racks["r12"].budget_kw == 20 and full.fleet.rules["rack.power"].for_s == 120
    assert str(full.mqtt.password_file) == "/etc/nvmon/mqtt.password" and full.mqtt.username == "@fleet"
    assert [h.type for h in full.hooks] == ["exec", "pagerduty", "alertmanager"]
    assert full.alerts.keep_resolved_d == 7


def test_nvmon_fleet_runs_on_the_example_config(tmp_path):
    """`nvmon fleet --config systemd/fleet.toml` as the unit runs it (the broker and the database
    given as flags, the file unchanged): it connects, evaluates, and stops cleanly on SIGTERM."""
    from mqtt_broker import MOSQUITTO, Broker

    if MOSQUITTO is None:
        pytest.skip("mosquitto binary not installed (apt-get install mosquitto)")
    log = tmp_path / "fleet.log"
    with Broker(tmp_path) as broker, open(log, "wb") as out:
        p = subprocess.Popen([sys.executable, "-m", "nvmon", "fleet", "--config", str(FLEET_CONFIG),
                              "--broker", broker.url, "--db", str(tmp_path / "fleet.db")],
                             stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while "fleet: watching" not in log.read_text() and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert "fleet: watching every cluster" in log.read_text(), log.read_text()
        finally:
            p.send_signal(signal.SIGTERM)
            rc = p.wait(20)
    assert rc == 0, log.read_text()
    assert "Traceback" not in log.read_text() and (tmp_path / "fleet.db").exists()
