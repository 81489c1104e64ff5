"""`nvmon fleet` as it runs: real processes (`nvmon daemon`, `nvmon sim-fleet`, `nvmon fleet`), a real
Mosquitto, SQLite on disk and an exec hook that records what it is handed, with the time it got it.

- a daemon killed with kill -9 pages "node offline" at its will (within keepalive × 1.5), not later as stale;
- a rack over its budget pages exactly once, and a restarted `nvmon fleet` does not page it again;
- SIGTERM stops it with status 0 (within 2 s on a quiet machine; timed here only against systemd's
  TimeoutStopSec=5); bad config is one line, exit 1.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from mqtt_broker import Broker, Recorder, needs_mosquitto, wait_until

pytestmark = needs_mosquitto

KEEPALIVE_S = 2
HOOK = """\
import json, sys, time
data = sys.stdin.read()
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"rx": time.time(), "alert": json.loads(data)}) + "\\n")
"""


def cluster_name() -> str:
    return "t" + uuid.uuid4().hex[:10]


class Proc:
    """An `nvmon` subcommand in a subprocess, output to a log file."""

    def __init__(self, tmp: Path, name: str, *args: str):
        self.log = tmp / f"{name}.log"
        self.args = [sys.executable, "-m", "nvmon", *args]
        self.proc: subprocess.Popen | None = None

    def start(self) -> Proc:
        self._out = open(self.log, "ab")
        self.proc = subprocess.Popen(self.args, stdout=self._out, stderr=self._out)
        return self

    def stop(self, sig=signal.SIGTERM, timeout: float = 10) -> tuple[int, float]:
        """(exit status, seconds it took)."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        finally:
            self._out.close()
        return rc, time.monotonic() - t0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(5)
        self._out.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def fleet_config(tmp: Path, extra: str = "") -> tuple[Path, Path]:
    """A config with one exec hook; returns (config, the file the hook appends to)."""
    hook, out = tmp / "hook.py", tmp / "pages.jsonl"
    hook.write_text(HOOK)
    cfg = tmp / "fleet.toml"
    argv = json.dumps([sys.executable, str(hook), str(out)])
    cfg.write_text(f'{extra}\n[[hooks]]\ntype = "exec"\ncommand = {argv}\ntimeout_s = 10\n')
    return cfg, out


def pages(out: Path) -> list[dict]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def fleet(tmp: Path, broker: str, cluster: str, cfg: Path, db: Path, name: str = "fleet") -> Proc:
    return Proc(tmp, name, "fleet", "--broker", broker, "--cluster", cluster, "--config", str(cfg), "--db", str(db))


def offline_status(m, node: str) -> bool:
    return m.topic.endswith(f"/{node}/status") and json.loads(m.payload or b"{}").get("state") == "offline"


async def test_dead_daemons_page_node_offline_within_keepalive(tmp_path):
    """n1 is killed with kill -9: its socket closes, the broker publishes its will at once, and the
    page must come at the will, not after node.stale's hold. n2 is frozen with SIGSTOP (socket open, no
    traffic: a hung host, a cut cable), which only the broker's keepalive check can tell (Mosquitto
    2.0 checks in whole seconds, so 3-5 s here); the page must follow its will (at once; a second or
    so on a slow machine).
    Each pages once, as offline (n2 is stale first, but node.stale waits 20 s for the will)."""
    cluster = cluster_name()
    cfg, out = fleet_config(tmp_path)
    node_cfg = tmp_path / "node.toml"
    node_cfg.write_text(f'[node]\ncluster = "{cluster}"\nrack = "r1"\n[mqtt]\nkeepalive_s = {KEEPALIVE_S}\n')
    with Broker(tmp_path) as broker:
        f = fleet(tmp_path, broker.url, cluster, cfg, tmp_path / "fleet.db").start()
        daemons = {n: Proc(tmp_path, n, "daemon", "--config", str(node_cfg), "--broker", broker.url, "--db",
                           str(tmp_path / f"{n}.db"), "--node", n, "--sim", "hgx-h100", "--interval", "0.5").start()
                   for n in ("n1", "n2")}
        try:
            async with Recorder(broker.url, f"nvmon/v1/{cluster}/+/+") as rec:
                for n in daemons:
                    await rec.wait_for("sample", lambda m, n=n: f"/{n}/" in m.topic, timeout=15)
                await wait_until(lambda: "subscribed to" in f.text(), 30, "nvmon fleet subscribed")
                await asyncio.sleep(2.5)  # past the fleet's settle time, so it judges the nodes
                killed = time.time()
                daemons["n1"].kill()
                daemons["n2"].proc.send_signal(signal.SIGSTOP)
                await rec.wait_for("status", lambda m: offline_status(m, "n2"), timeout=KEEPALIVE_S * 1.5 + 7)
                will_n2 = time.time()
                await wait_until(lambda: len(pages(out)) >= 2, 15, "two node.offline pages")
                await asyncio.sleep(0.5)
            got = {p["alert"]["node"]: p for p in pages(out)}
            assert set(got) == {"n1", "n2"} and len(pages(out)) == 2
            for n, page in got.items():
                a = page["alert"]
                assert (a["status"], a["code"], a["severity"], a["cluster"], a["rack"], a["value"]) == \
                    ("firing", "node.offline", "critical", cluster, "r1", "lost")
            n1_after_kill = got["n1"]["rx"] - killed
            n2_after_will = got["n2"]["rx"] - will_n2
            print(f"node.offline paged: n1 {n1_after_kill:.2f} s after kill -9; n2 {will_n2 - killed:.2f} s after "
                  f"SIGSTOP, {n2_after_will:.2f} s after its will (keepalive {KEEPALIVE_S} s)")
            # Paged at the will (a fraction of a second here, the time of an exec hook's Python start
            # included), not by node.stale, which holds 20 s past the node's 2.5 s of silence: the
            # bounds tell those apart with room for a slow machine; the figures are printed above.
            assert n1_after_kill <= KEEPALIVE_S * 1.5 + 5
            assert n2_after_will <= 5.0
            assert "fleet alert firing: critical node.offline on" in f.text()
            rc, took = f.stop()
            assert rc == 0 and took < 5.0, f.text()  # a stop systemd would not kill; room for a slow machine
        finally:
            for d in daemons.values():
                if d.proc.poll() is None:
                    d.kill()  # SIGKILL ends a stopped process too
            if f.proc.poll() is None:
                f.kill()


async def test_rack_over_budget_pages_once_and_restart_does_not_page_again(tmp_path):
    cluster = cluster_name()
    cfg, out = fleet_config(tmp_path, '[fleet]\nrack_budget_kw = 100\nnode_overhead_w = 2000\n'
                                      '[fleet.racks.rack-00]\nbudget_kw = 5\n'
                                      '[fleet.rules."rack.power"]\nfor_s = 1\n')
    db = tmp_path / "fleet.db"
    with Broker(tmp_path) as broker:
        sim = Proc(tmp_path, "sim", "sim-fleet", "--broker", broker.url, "--cluster", cluster, "--nodes", "3",
                   "--racks", "1", "--interval", "0.5").start()
        f = fleet(tmp_path, broker.url, cluster, cfg, db).start()
        f2 = None
        try:
            def rack_pages():
                return [p["alert"] for p in pages(out) if p["alert"]["code"] == "rack.power"]

            await wait_until(rack_pages, 15, "a rack.power page")
            await asyncio.sleep(3)  # a few more evaluations: still one page
            [a] = rack_pages()
            assert (a["status"], a["rack"], a["node"], a["threshold"]) == ("firing", "rack-00", None, 5)
            assert a["value"] > 5 and "over its 5 kW budget (3 nodes reporting" in a["summary"]
            assert len(pages(out)) == 1  # nothing else: healthy nodes, a budget-less rack elsewhere
            # A second `nvmon fleet` on the same --db would share its alert state and outbox: refused.
            second = subprocess.run([*fleet(tmp_path, broker.url, cluster, cfg, db, name="second").args],
                                    capture_output=True, text=True, timeout=30)
            assert second.returncode == 1 and second.stderr == (
                f"nvmon: database {db} is in use by another nvmon process (pid {f.proc.pid}, lock fleet.db.lock); "
                "give each daemon or fleet its own --db\n"), second.stderr
            assert f.proc.poll() is None
            rc, took = f.stop()
            assert rc == 0 and took < 5.0, f.text()  # a stop systemd would not kill; room for a slow machine

            listed = subprocess.run([sys.executable, "-m", "nvmon", "alerts", "--db", str(db), "--json"],
                                    capture_output=True, text=True, timeout=30)
            assert listed.returncode == 0, listed.stderr
            assert [(x["code"], x["status"]) for x in json.loads(listed.stdout)] == [("rack.power", "firing")]

            f2 = fleet(tmp_path, broker.url, cluster, cfg, db, name="fleet2").start()
            await wait_until(lambda: "restored" in f2.text(), 30, "alerts restored")
            await asyncio.sleep(4)  # settle (2 s) and then evaluations with the rack still over budget
            assert len(pages(out)) == 1, pages(out)
            assert "1 active alerts restored" in f2.text()
        finally:
            for p in (f, f2, sim):
                if p is not None and p.proc.poll() is None:
                    p.stop()


def test_bad_config_is_one_line(tmp_path):
    cfg = tmp_path / "fleet.toml"
    for text, expect in (('[fleet]\nsame_fault_nodes = 1\n', "fleet.same_fault_nodes: must be "),
                         ('[fleet.racks."r 1"]\nbudget_kw = 3\n', "fleet.racks: rack 'r 1'"),
                         ('[fleet]\nbogus = 1\n', "fleet.bogus: unknown key"),
                         ('[[hooks]]\ntype = "exec"\n', "hooks"),
                         ('[fleet\n', "not valid TOML")):
        cfg.write_text(text)
        r = subprocess.run([sys.executable, "-m", "nvmon", "fleet", "--config", str(cfg), "--db",
                            str(tmp_path / "f.db")], capture_output=True, text=True, timeout=30)
        assert r.returncode == 1, r.stderr
        assert r.stderr.count("\n") == 1 and expect in r.stderr and "Traceback" not in r.stderr, r.stderr
