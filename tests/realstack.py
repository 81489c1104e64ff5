"""Real Prometheus, promtool and Alertmanager processes for the tests, on free loopback ports
(Debian's `prometheus` and `prometheus-alertmanager` packages, which .ci/run installs). Without
them the tests that need them are skipped, saying so; in CI (`CI=true`) that skip is a failure
(tests/conftest.py)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "docs" / "prometheus" / "nvmon-rules.yml"
RULE_TESTS = REPO / "docs" / "prometheus" / "nvmon-rules.test.yml"


def tool(*names: str, package: str) -> str:
    """The first of `names` on PATH; else the test is skipped ("... not installed")."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(f"{names[0]} not installed (apt-get install {package})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)


def wait_for(cond, timeout: float, what: str, every: float = 0.2):
    """Poll `cond()` until it returns something truthy (returned), or fail saying `what`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = cond()
        except OSError:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


class _Process:
    """A server process whose output goes to a log file; `stop()` ends it."""

    name = "server"

    def _start(self, argv: list[str], log: Path, ready_url: str, timeout: float = 30.0) -> None:
        self.log = log
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT)

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(ready_url, timeout=2) as r:
                    return r.status == 200
            except (urllib.error.URLError, OSError):
                return False

        wait_for(ready, timeout, f"{self.name} to be ready", every=0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._out.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Alertmanager(_Process):
    """One Alertmanager on 127.0.0.1 (no clustering), routing everything to `webhook_url` (a
    receiver of its notifications) grouped by cluster and node, fast: 1 s group wait/interval."""

    name = "alertmanager"

    def __init__(self, workdir: Path, webhook_url: str, *, resolve_timeout: str = "5m"):
        binary = tool("prometheus-alertmanager", "alertmanager", package="prometheus-alertmanager")
        self.dir = Path(workdir) / f"alertmanager-{free_port()}"
        self.dir.mkdir(parents=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = self.dir / "alertmanager.yml"
        config.write_text(
            f"global:\n  resolve_timeout: {resolve_timeout}\n"
            "route:\n  receiver: hook\n  group_by: [cluster, node]\n  group_wait: 1s\n  group_interval: 1s\n"
            "  repeat_interval: 1h\n"
            f"receivers:\n  - name: hook\n    webhook_configs:\n      - url: {webhook_url}\n"
            "        send_resolved: true\n")
        self._start([binary, f"--config.file={config}", f"--storage.path={self.dir / 'data'}",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=",
                     "--log.level=info"], self.dir / "alertmanager.log", f"{self.url}/-/ready")

    def alerts(self, **filters: str) -> list[dict]:
        """GET /api/v2/alerts (active ones: resolved alerts are not listed), label filters as matchers."""
        query = urllib.parse.urlencode([("filter", f'{k}="{v}"') for k, v in filters.items()])
        return get_json(f"{self.url}/api/v2/alerts?{query}")

    def groups(self) -> list[dict]:
        return get_json(f"{self.url}/api/v2/alerts/groups")


class Prometheus(_Process):
    """One Prometheus on 127.0.0.1 scraping `targets` (job "nvmon") each second and evaluating
    `rule_files` each second."""

    name = "prometheus"

    def __init__(self, workdir: Path, targets: list[str], rule_files: tuple[Path, ...] = ()):
        binary = tool("prometheus", package="prometheus")
        self.dir = Path(workdir) / f"prometheus-{free_port()}"
        self.dir.mkdir(parents=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        rules = "".join(f"  - {p}\n" for p in rule_files)
        config = self.dir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            + (f"rule_files:\n{rules}" if rules else "")
            + "scrape_configs:\n  - job_name: nvmon\n    static_configs:\n"
            f"      - targets: [{', '.join(repr(t) for t in targets)}]\n")
        self._start([binary, f"--config.file={config}", f"--storage.tsdb.path={self.dir / 'data'}",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                    self.dir / "prometheus.log", f"{self.url}/-/ready")

    def query(self, expr: str) -> dict:
        return get_json(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=10)

    def result(self, expr: str) -> list[dict]:
        r = self.query(expr)
        assert r["status"] == "success", (expr, r.get("error"))
        return r["data"]["result"]

    def alerts(self) -> list[dict]:
        return get_json(f"{self.url}/api/v1/alerts")["data"]["alerts"]

    def rules(self) -> list[dict]:
        return get_json(f"{self.url}/api/v1/rules")["data"]["groups"]
