"""The daemon's `/metrics` under abuse: slowloris and huge headers, while a scraper keeps scraping.

Starts `nvmon daemon --sim hgx-h100 --broker '' --prometheus 127.0.0.1:<free port>` (1 s ticks) from
this tree, or from `--src DIR` (another checkout, e.g. the version before a change), then:

  before   scrapes for a few seconds; the daemon's RSS (psutil) is the baseline
  attack   for --seconds, from a child process, on 127.0.0.1 only:
           --slowloris clients each send a request line, `Host:` and the start of a header, then
           one more byte a second, forever; closed by the server, each reconnects after 0.5 s;
           --big clients each send a request line and 99 header lines of 64 KB (6.3 MB), then hold
           the connection, dripping like the others; closed, each reconnects after 1 s
           meanwhile the parent scrapes /metrics on a fresh connection every 0.5 s (1 s timeout)
  after    RSS followed for --settle seconds once the attackers are gone

and prints one JSON object: scrapes (ok, failed, slowest), RSS (baseline, peak, at the end),
missed ticks during the run (from the daemon's own nvmon_daemon_missed_ticks_total), and what the
attackers managed (connections made, bytes sent). Every socket goes to 127.0.0.1; every loop is
bounded by the clock and the whole run stops by itself. tests/test_metrics_abuse.py runs it.

    .venv/bin/python bench/metrics_dos.py [--seconds 10] [--slowloris 400] [--big 150] [--settle 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"  # never anything else
LINE = b"X-Big: " + b"a" * (65536 - 9) + b"\r\n"  # 65536 bytes: the longest line http.server accepts


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the attackers (child process)

async def _hold(reader, writer, stop_at: float) -> None:
    """Drip one byte a second until the server closes the connection or the time is up."""
    loop = asyncio.get_running_loop()
    while loop.time() < stop_at:
        try:
            got = await asyncio.wait_for(reader.read(65536), 1.0)
        except asyncio.TimeoutError:
            writer.write(b"b")
            continue
        if not got:
            return


async def _client(port: int, stop_at: float, big: bool, counts: dict) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < stop_at:
        writer = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 2.0)
            counts["connections"] += 1
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            if big:
                writer.write(b"a\r\n")
                for _ in range(99):
                    if loop.time() >= stop_at:
                        break
                    writer.write(LINE)
                    await asyncio.wait_for(writer.drain(), max(stop_at - loop.time(), 0.01))
                    counts["bytes"] += len(LINE)
                writer.write(b"X-Slow: ")
            await _hold(reader, writer, stop_at)
        except (OSError, asyncio.TimeoutError):
            counts["errors"] += 1
        finally:
            if writer is not None:
                writer.transport.abort()
        await asyncio.sleep(1.0 if big else 0.5)


async def _attack(port: int, seconds: float, slowloris: int, big: int) -> dict:
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    counts = {"connections": 0, "errors": 0, "bytes": 0}
    tasks = []
    kinds = [True] * big + [False] * slowloris
    random.Random(16).shuffle(kinds)  # both kinds from the start, in a fixed order
    for i, is_big in enumerate(kinds):
        tasks.append(asyncio.create_task(_client(port, stop_at, is_big, counts)))
        if i % 50 == 49:
            await asyncio.sleep(0.05)  # ramp up over ~0.5 s
    await asyncio.wait(tasks, timeout=seconds + 10)
    for t in tasks:
        t.cancel()
    return counts


def _attack_process(port: int, seconds: float, slowloris: int, big: int, out) -> None:
    out.put(asyncio.run(_attack(port, seconds, slowloris, big)))


# ---------------------------------------------------------------- the scraper and the daemon

def scrape(port: int, timeout: float = 1.0) -> tuple[float, bytes | None]:
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=timeout) as r:
            body = r.read()
        return time.perf_counter() - t0, body
    except OSError:
        return time.perf_counter() - t0, None


def counter(body: bytes, name: str) -> float:
    m = re.search(rb"^" + name.encode() + rb"(?:\{[^}]*\})? ([0-9.e+]+)$", body, re.M)
    return float(m.group(1)) if m else float("nan")


def run(seconds: float, slowloris: int, big: int, settle: float, src: Path | None) -> dict:
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="nvmon-dos-"))
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    (tmp / "none.toml").write_text("")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "nvmon", "daemon", "--config", str(tmp / "none.toml"), "--sim", "hgx-h100",
         "--broker", "", "--db", str(tmp / "nvmon.db"), "--node", "dos-1", "--interval", "1",
         "--prometheus", f"{HOST}:{port}", "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=open(tmp / "daemon.log", "wb"), env=env, cwd=tmp)
    proc = psutil.Process(daemon.pid)
    out: dict = {"slowloris": slowloris, "big": big, "seconds": seconds}
    try:
        deadline = time.monotonic() + 30
        while scrape(port)[1] is None:
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit(f"daemon did not serve /metrics: {(tmp / 'daemon.log').read_text()}")
            time.sleep(0.2)
        for _ in range(6):  # a few scrapes at 2 Hz: renderings, gzip off over loopback, caches warm
            _, body = scrape(port)
            time.sleep(0.5)
        base_rss = proc.memory_info().rss
        missed0 = counter(body, "nvmon_daemon_missed_ticks_total")
        ticks0 = counter(body, "nvmon_daemon_ticks_total")
        q = multiprocessing.Queue()
        attacker = multiprocessing.Process(target=_attack_process, args=(port, seconds, slowloris, big, q))
        attacker.start()
        lat, failed, peak = [], 0, base_rss
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            took, body = scrape(port)
            if body is None or took > 1.0:
                failed += 1
            else:
                lat.append(took)
            peak = max(peak, proc.memory_info().rss)
            time.sleep(max(0.5 - took, 0.05))
        attacker.join(20)
        out["attack"] = q.get(timeout=5) if not q.empty() else None
        if attacker.is_alive():
            attacker.kill()
        after_at = time.monotonic() + settle
        rss_series = []
        while time.monotonic() < after_at:
            rss_series.append(proc.memory_info().rss)
            peak = max(peak, rss_series[-1])
            time.sleep(0.5)
        took, body = scrape(port, timeout=5)
        out.update(
            scrapes_ok=len(lat), scrapes_failed=failed, scrape_max_s=round(max(lat), 4) if lat else None,
            scrape_p50_s=round(sorted(lat)[len(lat) // 2], 4) if lat else None,
            rss_base_mb=round(base_rss / 2**20, 1), rss_peak_mb=round(peak / 2**20, 1),
            rss_end_mb=round(proc.memory_info().rss / 2**20, 1),
            missed_ticks=counter(body, "nvmon_daemon_missed_ticks_total") - missed0 if body else None,
            ticks=counter(body, "nvmon_daemon_ticks_total") - ticks0 if body else None,
            threads=proc.num_threads(), alive=daemon.poll() is None,
        )
        log = (tmp / "daemon.log").read_text(errors="replace")
        out["log_tracebacks"] = log.count("Traceback")
        out["log_warnings"] = [ln for ln in log.splitlines() if "metrics endpoint" in ln][:3]
    finally:
        daemon.terminate()
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--slowloris", type=int, default=400)
    ap.add_argument("--big", type=int, default=150)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--src", type=Path, help="run the daemon from this source tree instead")
    a = ap.parse_args()
    print(json.dumps(run(min(a.seconds, 120), min(a.slowloris, 1000), min(a.big, 300), min(a.settle, 120), a.src)))


if __name__ == "__main__":
    main()
