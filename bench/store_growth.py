"""History store growth and speed on a simulated HGX H100 node (8 GPUs × 18 NVLinks + 8 IB ports).

Prints (never asserts):
  - bytes per node-day of raw ticks (target <= 150 MB), per table, from N simulated hours at
    1 Hz with a fast-forwarded clock (default 2 h, extrapolated ×24/N; `--hours 24` for a full day);
  - the steady-state file at default retention (target <= 1 GB): 48 h of raw ticks plus 90 days of
    rollups, built for real by copying the simulated rows with shifted timestamps in SQL;
  - ingest rate, one transaction per tick and as 60-tick backlogs (target >= 200 node-ticks/s);
  - maintain() cost: per simulated minute while ingesting, and on the steady-state file.

    .venv/bin/python bench/store_growth.py [--hours 2] [--sim hgx-h100] [--dir /tmp] [--keep]
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from nvmon.collect.node import NodeSampler
from nvmon.sim.node import SimNode
from nvmon.wire.payloads import sample_payload
from nvmon.store import Store

DAY = 86_400
RAW_TABLES = ("ticks", "gpu_ticks", "ib_ticks")
ROLLUP_TABLES = ("gpu_minutes", "ib_minutes", "node_minutes")
MB = 1e6


def table_bytes(path: Path) -> dict[str, int]:
    """Bytes of each table and index, from SQLite's dbstat (pages × page size)."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall()
    finally:
        conn.close()
    return dict(rows)


def ms(xs: list[float]) -> str:
    xs = sorted(xs)
    p95 = xs[int(len(xs) * 0.95)]
    return f"median {statistics.median(xs) * 1e3:.2f} ms, p95 {p95 * 1e3:.2f} ms, max {xs[-1] * 1e3:.2f} ms"


def simulate(db: Path, sim: str, seconds: int, keep_samples: int):
    """Sample the simulated node once per (fake) second into the store; maintain() every minute."""
    start = 1_700_000_040.0  # minute-aligned: the shifted copies of rollups then tile exactly
    now = [start]
    node = SimNode(sim, clock=lambda: now[0])
    sampler = NodeSampler(node.nvml, sysfs_root=node.sysfs_root, node="bench", before_tick=node.sync,
                          clock=lambda: now[0])
    sampler.open()
    store = Store(db)
    store.open()
    writes, maint, kept = [], [], []
    try:
        for i in range(seconds):
            s = sampler.sample()
            if len(kept) < keep_samples:
                kept.append(s)
            t = time.perf_counter()
            store.write(s)
            writes.append(time.perf_counter() - t)
            if i % 60 == 59:
                t = time.perf_counter()
                store.maintain(now[0])
                maint.append(time.perf_counter() - t)
            now[0] += 1.0
        store.maintain(now[0] + 120)  # roll up the last minutes too
    finally:
        store.close()
        sampler.close()
        node.close()
    return writes, maint, kept, start, now[0]


def burst(db: Path, samples: list, batch: int) -> float:
    """node-ticks/s writing pre-built samples as fast as possible, `batch` per transaction."""
    store = Store(db)
    store.open()
    t = time.perf_counter()
    for i in range(0, len(samples), batch):
        store.write_many(samples[i:i + batch])
    dt = time.perf_counter() - t
    store.close()
    return len(samples) / dt


def steady_state(src: Path, dst: Path, seconds: int, start_s: float, end_s: float) -> tuple[int, float, dict]:
    """Build 48 h of raw ticks and 90 days of rollups from the simulated rows, copied span by span
    with shifted timestamps, oldest first (appending, as a node does), then time one maintain()
    at the end of that window. Returns (file bytes, maintain seconds, maintain's counts)."""
    Store(dst).open()  # the schema, through the store's own open()
    conn = sqlite3.connect(dst, isolation_level=None)
    conn.execute("ATTACH ? AS src", (str(src),))
    span_ms, since = seconds * 1000, int(start_s * 1000)
    conn.execute("BEGIN")
    for table in ("state", "inventory", "ib_ports"):
        conn.execute(f"INSERT INTO main.{table} SELECT * FROM src.{table}")
    conn.execute("COMMIT")
    for tables, span_s in ((RAW_TABLES, 48 * 3600), (ROLLUP_TABLES, 90 * DAY)):
        for k in reversed(range(-(-span_s // seconds))):
            conn.execute("BEGIN")
            for table in tables:
                cols = ", ".join(r[1] for r in conn.execute(f"PRAGMA main.table_info({table})") if r[1] != "ts_ms")
                conn.execute(f"INSERT INTO main.{table} (ts_ms, {cols}) SELECT ts_ms - ?, {cols} "
                             f"FROM src.{table} WHERE ts_ms >= ?", (k * span_ms, since))
            conn.execute("COMMIT")
    # Step the rollup point back one minute, so that the timed maintain() does a steady-state
    # call's work: roll up one minute, prune one minute of raw ticks and of rollups.
    conn.execute("UPDATE main.state SET value = (SELECT max(ts_ms) / 60000 * 60000 FROM main.ticks) "
                 "WHERE key = 'rollup_done_ms'")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    store = Store(dst)
    store.open()
    t = time.perf_counter()
    stats = store.maintain(end_s + 60)
    dt = time.perf_counter() - t
    store.close()
    return dst.stat().st_size, dt, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=2.0, help="simulated hours (24 = a full node-day)")
    ap.add_argument("--sim", default="hgx-h100")
    ap.add_argument("--dir", default=None, help="where to put the databases (default: a temp dir on disk)")
    ap.add_argument("--keep", action="store_true", help="keep the databases")
    args = ap.parse_args()
    seconds = int(args.hours * 3600)
    work = Path(tempfile.mkdtemp(prefix="nvmon-store-bench-", dir=args.dir or "/var/tmp"))
    try:
        run(work, args.sim, seconds)
    finally:
        if args.keep:
            print(f"databases kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def run(work: Path, sim: str, seconds: int) -> None:
    db = work / "sim.db"
    t0 = time.perf_counter()
    writes, maint, kept, start_s, end_s = simulate(db, sim, seconds, keep_samples=1200)
    sim_wall = time.perf_counter() - t0
    sizes = table_bytes(db)
    raw = sum(v for k, v in sizes.items() if k in RAW_TABLES)
    scale = DAY / seconds
    print(f"board            {sim}; machine {platform.node()} {platform.machine()} Python {platform.python_version()}")
    print(f"simulated        {seconds} ticks ({seconds / 3600:g} h at 1 Hz, fast-forwarded clock) "
          f"in {sim_wall:.0f} s wall"
          + ("" if seconds >= DAY else f"; per-day figures extrapolated ×{scale:g}"))
    print(f"raw ticks        {raw * scale / MB:.1f} MB per node-day (target <= 150 MB); "
          f"{raw / seconds:.0f} B per tick")
    for name in RAW_TABLES:
        print(f"  {name:<14} {sizes.get(name, 0) * scale / MB:7.1f} MB/day  {sizes.get(name, 0) / seconds:6.0f} B/tick")
    print(f"write (1 tx/tick) {ms(writes)} while sampling")
    print(f"maintain/minute  {ms(maint)} while ingesting")

    rate1 = burst(work / "burst1.db", kept, 1)
    rate60 = burst(work / "burst60.db", kept, 60)
    print(f"ingest           {rate1:.0f} node-ticks/s one transaction per tick; {rate60:.0f} node-ticks/s "
          f"as 60-tick backlogs (target >= 200); {len(kept)} pre-sampled ticks")

    size, dt, stats = steady_state(db, work / "steady.db", seconds, start_s, end_s)
    sizes = table_bytes(work / "steady.db")
    raw48 = sum(sizes.get(k, 0) for k in RAW_TABLES)
    roll90 = sum(sizes.get(k, 0) for k in ROLLUP_TABLES)
    wire = [len(sample_payload(k)) for k in kept]
    print(f"wire payload     `sample` avg {sum(wire) / len(wire):.0f} B per node-tick (target <= 2048 B), "
          f"min {min(wire)}, max {max(wire)} over {len(wire)} ticks")
    print(f"steady state     {size / MB:.0f} MB file at default retention (target <= 1000 MB): "
          f"48 h raw {raw48 / MB:.0f} MB + 90 days of rollups {roll90 / MB:.0f} MB "
          f"({roll90 / 90 / MB:.2f} MB/day) + other {(size - raw48 - roll90) / MB:.0f} MB;")
    print("                 built for real by copying the simulated rows back in time with shifted timestamps")
    print(f"maintain at steady state  {dt * 1e3:.0f} ms: {stats}")


if __name__ == "__main__":
    main()
