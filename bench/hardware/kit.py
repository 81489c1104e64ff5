"""The hardware truth kit: on a GPU node, in one go, what nvidia-smi and nvmon say, side by side.

    python bench/hardware/kit.py run --out DIR [--sim SPEC --smi-xml QX.xml [--smi-nvlink NVLINK-S.txt]]
    python bench/hardware/kit.py device-command     # what to pass to the device tool's `run`
    python bench/hardware/kit.py land FILES_DIR [--docs DIR]   # copy a run's files to docs/hardware/<date>-<gpu>/

`run` (bench/hardware/run.sh calls it after installing the wheels) saves nvidia-smi's outputs,
runs `nvmon sample --json` three times and `nvmon audit --json`, runs the daemon (the real code,
every NVML call timed: bench/hardware/probe.py) with /metrics scraped while its CPU time and RSS
are read from /proc, compares nvmon's readings with nvidia-smi's (bench/hardware/compare.py) and
writes six files to DIR (the device tool brings back at most 8). A step that fails is logged and
the rest still run. `--sim` puts the simulator in place of NVML and /sys, and a captured
`nvidia-smi -q -x` in place of nvidia-smi, so the whole sequence can be tried on any machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
import compare  # noqa: E402  (a sibling module, not a package)

# The device tool's `run` takes a command of at most 2,000 characters and up to 8 carried paths
# (the wheels are git-ignored, so they travel only when carried).
DEVICE_COMMAND = 'PYTHONUNBUFFERED=1 bash bench/hardware/run.sh --out "$OUT"'
DEVICE_CARRY = ("bench/hardware/wheels",)
DEVICE_TIMEOUT_S = 420  # the run takes ~2 min; leaves room, and device time for a second try
MAX_FILES = 8
SMI_COMMANDS = (  # (file label, arguments); -gt d / -gt r exist from r535 on: others just fail
    ("q-x", ["-q", "-x"]),
    ("topo-m", ["topo", "-m"]),
    ("nvlink-s", ["nvlink", "-s"]),
    ("nvlink-e", ["nvlink", "-e"]),
    ("nvlink-gt-d", ["nvlink", "-gt", "d"]),
    ("nvlink-gt-r", ["nvlink", "-gt", "r"]),
    ("q-d", ["-q", "-d", "PERFORMANCE,POWER,PCIE"]),
)
SCRAPE_EVERY_S = 5.0
WARMUP_S = 5.0  # the daemon's start (imports, NVML init, first ticks) is left out of its CPU figure


class Kit:
    def __init__(self, out: Path, *, sim: str | None, smi_xml: Path | None, smi_nvlink: Path | None,
                 daemon_s: float, python: str):
        self.out, self.sim, self.smi_xml, self.smi_nvlink = out, sim, smi_xml, smi_nvlink
        self.daemon_s, self.python = daemon_s, python
        self.tmp = Path(tempfile.mkdtemp(prefix="nvmon-kit-"))
        self.t0 = time.monotonic()
        self.log_lines: list[str] = []
        self.steps: list[dict] = []
        self.result: dict = {"kit": {"mode": "sim" if sim else "hardware", "sim": sim,
                                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
        self.smi_outputs: dict[str, dict] = {}

    # -- plumbing --------------------------------------------------------------------------------

    def log(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {msg}"
        self.log_lines.append(line)
        print(line, flush=True)

    def step(self, name: str, fn, *args):
        t = time.monotonic()
        self.log(f"step {name}")
        try:
            value = fn(*args)
            ok = True
        except Exception as e:  # one step's failure must not cost the others their device time
            self.log(f"step {name} FAILED: {type(e).__name__}: {e}")
            value, ok = None, False
        self.steps.append({"step": name, "ok": ok, "seconds": round(time.monotonic() - t, 2)})
        return value

    def _smi(self, args: list[str]) -> tuple[int, str, str]:
        if self.sim:  # the stand-in: captured files only, everything else "not captured"
            if args == ["-q", "-x"] and self.smi_xml:
                return 0, self.smi_xml.read_text(), ""
            if args == ["nvlink", "-s"] and self.smi_nvlink:
                return 0, self.smi_nvlink.read_text(), ""
            return 1, "", f"sim mode: no capture of `nvidia-smi {' '.join(args)}`\n"
        exe = shutil.which("nvidia-smi") or next(
            (p for p in ("/usr/local/nvidia/bin/nvidia-smi", "/usr/bin/nvidia-smi") if os.access(p, os.X_OK)), None)
        if exe is None:
            return 127, "", "nvidia-smi not found\n"
        try:
            p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=45)
        except subprocess.TimeoutExpired:
            return 124, "", "timed out after 45 s\n"
        return p.returncode, p.stdout, p.stderr

    def _nvmon(self, *args: str, timeout: float = 60) -> dict:
        cmd = [self.python, "-m", "nvmon", *args] + (["--sim", self.sim] if self.sim else [])
        t = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.tmp)
        except subprocess.TimeoutExpired as e:  # a hung NVML: recorded, and the next step still runs
            p = subprocess.CompletedProcess(cmd, 124, _str(e.stdout), _str(e.stderr) + f"\ntimed out after {timeout:.0f} s")
        rec: dict = {"argv": ["nvmon", *cmd[3:]], "rc": p.returncode, "seconds": round(time.monotonic() - t, 2)}
        try:
            rec["json"] = json.loads(p.stdout)
        except json.JSONDecodeError:
            rec["stdout"] = p.stdout[-4000:]
        if p.stderr.strip():
            rec["stderr"] = p.stderr[-4000:]
            self.log_lines.append(f"--- stderr of {' '.join(rec['argv'])}\n{p.stderr.rstrip()}")
        self.log(f"  {' '.join(rec['argv'])}: rc {p.returncode}, {rec['seconds']} s")
        return rec

    # -- steps -------------------------------------------------------------------------------------

    def environment(self) -> dict:
        env = {"python": sys.version.split()[0], "executable": self.python, "platform": platform.platform(),
               "machine": platform.machine(), "host": socket.gethostname(), "cpus": os.cpu_count(),
               "ld_library_path": os.environ.get("LD_LIBRARY_PATH", "")}
        try:
            import importlib.metadata as md

            env["nvidia_ml_py"] = md.version("nvidia-ml-py")
        except Exception as e:  # noqa: BLE001  (reported, not fatal)
            env["nvidia_ml_py"] = f"unknown ({e})"
        git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True) if shutil.which("git") else None
        env["nvmon_commit"] = git.stdout.strip() if git is not None and git.returncode == 0 else "unknown"
        self.log(f"  python {env['python']} on {env['platform']}, nvidia-ml-py {env['nvidia_ml_py']}")
        return env

    def nvidia_smi(self) -> None:
        for label, args in SMI_COMMANDS:
            t = time.monotonic()
            rc, out, err = self._smi(args)
            self.smi_outputs[label] = {"args": args, "rc": rc, "stdout": out, "stderr": err,
                                       "seconds": round(time.monotonic() - t, 2)}
            self.log(f"  nvidia-smi {' '.join(args)}: rc {rc}, {len(out)} bytes, {time.monotonic() - t:.1f} s")

    def samples(self) -> None:
        self.result["samples"] = [self._nvmon("sample", "--json") for _ in range(3)]

    def audit(self) -> None:
        self.result["audit"] = self._nvmon("audit", "--json")

    def daemon(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        stats = self.tmp / "probe.json"
        cmd = [self.python, str(HERE / "probe.py"), "--stats", str(stats), "--prometheus", f"127.0.0.1:{port}",
               "--db", str(self.tmp / "nvmon.db")] + (["--sim", self.sim] if self.sim else [])
        log = open(self.tmp / "probe.log", "wb")
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp)
        url = f"http://127.0.0.1:{port}/metrics"
        d: dict = {"seconds": self.daemon_s, "scrapes": []}
        tick = os.sysconf("SC_CLK_TCK")
        try:
            start = time.monotonic()
            cpu0 = wall0 = None
            rss: list[int] = []
            next_scrape = start + 2.0
            while time.monotonic() - start < self.daemon_s and child.poll() is None:
                time.sleep(0.5)
                now = time.monotonic()
                if cpu0 is None and now - start >= WARMUP_S:
                    cpu0, wall0 = _cpu_s(child.pid, tick), now
                rss.append(_rss_kib(child.pid))
                if now >= next_scrape:
                    got = self._scrape(url)
                    if got["ok"] and "first_scrape_s" not in d:
                        d["first_scrape_s"] = round(now - start, 1)  # the daemon's start, /metrics up
                    if got["ok"] or "first_scrape_s" in d:  # before the endpoint is up: retry each second
                        d["scrapes"].append(got)
                    next_scrape = now + (SCRAPE_EVERY_S if "first_scrape_s" in d else 1.0)
            if cpu0 is not None and child.poll() is None:
                d["cpu_pct_of_one_core"] = round((_cpu_s(child.pid, tick) - cpu0) / (time.monotonic() - wall0) * 100, 2)
                d["cpu_window_s"] = round(time.monotonic() - wall0, 1)
            d["cpu_s_total"] = round(_cpu_s(child.pid, tick), 2)
            d["rss_mib_last"] = round(rss[-1] / 1024, 1) if rss and rss[-1] else None
            d["rss_mib_max"] = round(max(rss) / 1024, 1) if rss else None
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
            try:
                d["exit_code"] = child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
                d["exit_code"] = child.wait()
            log.close()
        probe_log = (self.tmp / "probe.log").read_text(errors="replace")
        if probe_log.strip():
            self.log_lines.append("--- probe.py output\n" + probe_log.rstrip())
        if stats.exists():
            d.update(json.loads(stats.read_text()))
        ok = [s for s in d["scrapes"] if s.get("ok")]
        self.log(f"  daemon {self.daemon_s:.0f} s: exit {d['exit_code']}, CPU {d.get('cpu_pct_of_one_core')} % "
                 f"of one core, RSS {d.get('rss_mib_max')} MiB, {len(ok)}/{len(d['scrapes'])} scrapes")
        if d.get("error"):
            self.log(f"  daemon error: {d['error']}")
        for name, row in list((d.get("nvml_calls") or {}).get("tick", {}).items())[:8]:
            self.log(f"  NVML {name}: {row.get('per_tick')} a tick, p50 {row['p50_us']} us, p99 {row['p99_us']} us, "
                     f"max {row['max_us']} us" + (f", errors {row['errors']}" if "errors" in row else ""))
        self.result["daemon"] = d

    def _scrape(self, url: str) -> dict:
        t = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                text = r.read().decode()
        except OSError as e:
            return {"ok": False, "error": str(e)}
        (self.tmp / "metrics.txt").write_text(text)
        names = {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}
        return {"ok": True, "ms": round((time.monotonic() - t) * 1e3, 1), "bytes": len(text),
                "series": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
                "dcgm_names": sum(1 for n in names if n.startswith("DCGM_FI_")),
                "nvmon_names": sum(1 for n in names if n.startswith("nvmon_"))}

    def compare(self) -> str:
        xml = self.smi_outputs.get("q-x", {})
        if xml.get("rc") != 0:
            raise compare.CaptureError(f"no nvidia-smi -q -x (rc {xml.get('rc')}): {xml.get('stderr', '').strip()}")
        smi = compare.parse_smi_xml(xml["stdout"])
        first = next((s["json"] for s in self.result.get("samples") or [] if "json" in s), None)
        if first is None:
            raise compare.CaptureError("no nvmon sample --json to compare with")
        nvl = self.smi_outputs.get("nvlink-s", {})
        nvlink = compare.parse_nvlink_status(nvl["stdout"]) if nvl.get("rc") == 0 else None
        fabric = (self.result.get("daemon") or {}).get("fabric")
        rows = compare.compare(smi, first, nvlink=nvlink, fabric=fabric if isinstance(fabric, list) else None)
        self.result["compare"] = {"summary": compare.summary(rows), "rows": compare.rows_to_dicts(rows),
                                  "gpu": (smi["gpus"][0]["name"] if smi["gpus"] else None),
                                  "driver": smi["driver_version"]}
        not_match = ("DIFFERS", "smi only", "nvmon only", "close")
        table = (compare.render(rows) + "\n\nNot matching (DIFFERS first):\n"
                 + compare.render(sorted(rows, key=lambda r: compare.ORDER.index(r.verdict)), only=not_match))
        (self.tmp / "compare.txt").write_text(table + "\n")
        return table

    # -- output --------------------------------------------------------------------------------------

    def pack(self) -> list[Path]:
        """At most MAX_FILES plain files straight under `out`."""
        self.out.mkdir(parents=True, exist_ok=True)
        files: list[Path] = []

        def put(name: str, text: str) -> None:
            (self.out / name).write_text(text)
            files.append(self.out / name)

        xml = self.smi_outputs.get("q-x", {})
        if xml.get("rc") == 0:
            put("nvidia-smi-q.xml", xml["stdout"])
        parts = []
        for label, rec in self.smi_outputs.items():
            if label == "q-x" and rec.get("rc") == 0:
                continue
            parts.append(f"===== nvidia-smi {' '.join(rec['args'])}   (rc {rec['rc']}, {rec['seconds']} s)\n"
                         f"{rec['stdout']}{rec['stderr']}")
        put("nvidia-smi.txt", "\n".join(parts))
        for name in ("metrics.txt", "compare.txt"):
            if (self.tmp / name).exists():
                put(name, (self.tmp / name).read_text())
        self.result["kit"].update(steps=self.steps, seconds=round(time.monotonic() - self.t0, 1))
        put("nvmon.json", json.dumps(self.result, indent=1, default=str))
        put("kit.log", "\n".join(self.log_lines) + "\n")
        assert len(files) <= MAX_FILES, files
        return files

    def run(self, install_log: Path | None) -> int:
        if install_log is not None and install_log.exists():
            self.log_lines.append("--- wheel install\n" + install_log.read_text(errors="replace").rstrip())
        self.log(f"nvmon hardware kit, {'sim mode: ' + self.sim if self.sim else 'real hardware'}; out {self.out}")
        self.result["env"] = self.step("environment", self.environment)
        self.step("nvidia-smi", self.nvidia_smi)
        self.step("nvmon sample x3", self.samples)
        self.step("nvmon audit", self.audit)
        self.step(f"daemon {self.daemon_s:.0f} s", self.daemon)
        table = self.step("compare", self.compare)
        if table:
            head, _, diffs = table.partition("\n\nNot matching")
            print("\nNot matching" + diffs[:9000] if diffs else head[-2000:])
        self.log(f"done in {time.monotonic() - self.t0:.0f} s")
        files = self.pack()
        print(f"{len(files)} files in {self.out}: " + ", ".join(f"{f.name} ({f.stat().st_size} B)" for f in files))
        shutil.rmtree(self.tmp, ignore_errors=True)
        return 0 if all(s["ok"] for s in self.steps) else 1


def _str(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _cpu_s(pid: int, tick: int) -> float:
    """utime + stime of a process, seconds (/proc/PID/stat fields 14 and 15)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick
    except (OSError, IndexError, ValueError):
        return 0.0


def _rss_kib(pid: int) -> int:
    try:
        m = re.search(r"^VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M)
        return int(m.group(1)) if m else 0
    except OSError:
        return 0


class LandError(Exception):
    """A folder `land` cannot use (one line)."""


def land(files: Path, docs: Path) -> Path:
    """Copy a run's files to DOCS/<date>-<gpu>/ (the date and GPU from its nvmon.json), -2, -3, … when a
    run of that day and GPU has landed already. Returns the folder."""
    try:
        meta = json.loads((files / "nvmon.json").read_text())
        date = meta["kit"]["started"][:10]
    except OSError as e:
        raise LandError(f"{files}: not a kit run's files ({e.strerror}: nvmon.json)") from None
    except (ValueError, KeyError, TypeError):
        raise LandError(f"{files / 'nvmon.json'}: not the kit's nvmon.json (no kit.started)") from None
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        raise LandError(f"{files / 'nvmon.json'}: kit.started is not a date: {date!r}")
    gpu = (meta.get("compare") or {}).get("gpu") or "unknown-gpu"
    base = docs / f"{date}-{re.sub(r'[^a-z0-9]+', '-', gpu.lower()).strip('-')}"
    dest, n = base, 1
    while dest.exists() and any(dest.iterdir()):
        n += 1
        dest = base.with_name(f"{base.name}-{n}")
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(files.iterdir()):
        if f.is_file():
            shutil.copyfile(f, dest / f.name)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="the whole sequence")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--sim", metavar="SPEC", help="simulate the board (e.g. 'hgx-h100,load=idle')")
    r.add_argument("--smi-xml", type=Path, help="with --sim: the nvidia-smi -q -x capture to stand in")
    r.add_argument("--smi-nvlink", type=Path, help="with --sim: an nvidia-smi nvlink -s capture to stand in")
    r.add_argument("--daemon-seconds", type=float, default=60.0)
    r.add_argument("--install-log", type=Path)
    sub.add_parser("device-command", help="print the device tool's run arguments")
    ld = sub.add_parser("land", help="copy a run's files under docs/hardware/")
    ld.add_argument("files", type=Path)
    ld.add_argument("--docs", type=Path, default=REPO / "docs" / "hardware",
                    help="the folder to land in (default: the repo's docs/hardware)")
    a = ap.parse_args(argv)
    if a.cmd == "device-command":
        print(json.dumps({"command": DEVICE_COMMAND, "carry": list(DEVICE_CARRY), "timeout_s": DEVICE_TIMEOUT_S}))
        print(f"# {len(DEVICE_COMMAND)} characters (limit 2000); run bench/hardware/prepare.py first", file=sys.stderr)
        return 0
    if a.cmd == "land":
        try:
            dest = land(a.files, a.docs)
        except LandError as e:
            print(f"kit.py land: {e}", file=sys.stderr)
            return 2
        meta = json.loads((dest / "nvmon.json").read_text())
        print(f"{dest}  (driver {(meta.get('compare') or {}).get('driver') or 'unknown'}): "
              + ", ".join(sorted(f.name for f in dest.iterdir())))
        return 0
    if a.sim and a.smi_xml is None:
        ap.error("--sim needs --smi-xml (a captured nvidia-smi -q -x)")
    if a.out.exists() and any(a.out.iterdir()):
        ap.error(f"--out {a.out}: not empty")
    kit = Kit(a.out, sim=a.sim, smi_xml=a.smi_xml, smi_nvlink=a.smi_nvlink, daemon_s=a.daemon_seconds,
              python=sys.executable)
    return kit.run(a.install_log)


if __name__ == "__main__":
    sys.exit(main())
