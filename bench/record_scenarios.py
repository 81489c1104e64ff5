"""Record what nvmon emits for fixed simulated scenarios, and compare two recordings byte for byte.

    python bench/record_scenarios.py record /tmp/rec-before
    ... change the code ...
    python bench/record_scenarios.py record /tmp/rec-after
    python bench/record_scenarios.py compare /tmp/rec-before /tmp/rec-after [--ignore NAME,...]

Per scenario (a `--sim` spec on a fake clock, so every run of it is the same), for every tick:
the sample JSON (`nvmon sample --json`'s `sample_to_dict`), the wire `sample` payload, the
`inventory` payload and the `/metrics` page; after the run: every row of every table of the
SQLite file the store wrote (raw ticks and the rollups `maintain()` built), and its schema.
The host block (psutil: this machine's CPU and load) is replaced by a fixed one.

`--ignore` drops the named keys (JSON), metric families (`/metrics`) and columns (SQLite) from both
sides before comparing: how a refactor that adds metrics proves that nothing else changed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sqlite3
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

T0 = 1_700_000_000.0  # 20 s into a minute: the run covers two complete minutes for the rollups
TICKS = 125
SCENARIOS = {
    "h100": "hgx-h100",
    "h100-faults": "hgx-h100,pcie_width=3:8,nvlink_errors=1.3,ib_rate=mlx5_1:100,power_cap=4:350,thermal=2",
    "h100-events": "hgx-h100,gpu_lost=6@30-70,xid=3:79@10,nvlink_down=2.5@20,ib_down=mlx5_2@40-90",
    "h100-notsup": "hgx-h100,notsup=energy:1,notsup=nvlink_state_field:2,notsup=temperature,notsup=pcie_bytes:4",
    "a100-idle": "hgx-a100,load=idle,seed=7",
    "b200": "hgx-b200,ib_errors=mlx5_0",
    "pairs": "pairs-a100,ib_eth=1",
    "l40s": "pcie-l40s",
    "nvml-off": "hgx-h100,nvml=off",
}


def _host():
    from nvmon.model import HostSample

    return HostSample(hostname="rec", kernel="6.1.0-rec", cpu_pct=12.5, mem_used_pct=40.0, load1=1.25, uptime_s=1000.0)


class _Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def record_one(spec: str, out: Path) -> None:
    from nvmon.collect.node import NodeSampler
    from nvmon.audit import Judge
    from nvmon.export.collector import DaemonHealth, SampleCollector, advance
    from nvmon.export.exposition import exposition
    from nvmon.model import sample_to_dict
    from nvmon.sim.node import SimNode
    from nvmon.specs import NodeSpec
    from nvmon.store.store import Store
    from nvmon.wire.payloads import inventory_payload, sample_payload

    clock = _Clock()
    node = SimNode(spec, clock=clock)
    root = str(node.sysfs_root)
    host = _host()
    collector = SampleCollector(judge=Judge(NodeSpec()), node_info={"cluster": "c1", "rack": "r1", "version": "rec"},
                                health=lambda: DaemonHealth(ticks=1))
    texts: dict = {}
    snap = None
    with tempfile.TemporaryDirectory() as tmp, \
            gzip.open(out / "sample.jsonl.gz", "wt", compresslevel=1) as f_sample, \
            gzip.open(out / "wire.jsonl.gz", "wt", compresslevel=1) as f_wire, \
            gzip.open(out / "metrics.txt.gz", "wt", compresslevel=1) as f_metrics:
        store = Store(Path(tmp) / "rec.db")
        store.open()
        try:
            sampler = NodeSampler(node.nvml, sysfs_root=node.sysfs_root, node="rec", before_tick=node.sync,
                                  clock=clock)
            sampler.open()
            for _ in range(TICKS):
                s = replace(sampler.sample(), host=host)
                f_sample.write(json.dumps(sample_to_dict(s), sort_keys=False).replace(root, "<ROOT>") + "\n")
                f_wire.write(sample_payload(s).decode() + "\n")
                f_wire.write(inventory_payload(s, cluster="c1", rack="r1").decode().replace(root, "<ROOT>") + "\n")
                snap = advance(snap, s)
                collector.snapshot = snap
                page = exposition(collector.collect(), texts).decode()
                f_metrics.write(page.replace(root, "<ROOT>") + "\f\n")
                store.write(s)
                clock.t += 1.0
            sampler.close()
            store.maintain(clock.t + 10)
        finally:
            store.close()
            node.close()
        _dump_db(Path(tmp) / "rec.db", out)


def _dump_db(path: Path, out: Path) -> None:
    conn = sqlite3.connect(path)
    tables = {}
    for name, sql in conn.execute("SELECT name, sql FROM sqlite_schema WHERE type = 'table' ORDER BY name"):
        cur = conn.execute(f"SELECT * FROM {name}")
        cols = [d[0] for d in cur.description]
        rows = [[v.hex() if isinstance(v, bytes) else v for v in r] for r in cur]
        rows.sort(key=lambda r: json.dumps(r))
        tables[name] = {"sql": sql, "columns": cols, "rows": rows}
    conn.close()
    (out / "store.json").write_text(json.dumps(tables, indent=0))


def record(dest: Path, only: list[str] | None) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for label, spec in SCENARIOS.items():
        if only and label not in only:
            continue
        d = dest / label
        d.mkdir(exist_ok=True)
        record_one(spec, d)
        print(f"recorded {label}: {spec}")


# -- comparing ---------------------------------------------------------------------------------

def _strip(obj, ignore: set[str]):
    if isinstance(obj, dict):
        return {k: _strip(v, ignore) for k, v in obj.items() if k not in ignore}
    if isinstance(obj, list):
        return [_strip(v, ignore) for v in obj]
    return obj


def _json_lines(path: Path, ignore: set[str]) -> list[str]:
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()
    if not ignore:
        return lines
    return [json.dumps(_strip(json.loads(line), ignore)) for line in lines]


def _metric_lines(path: Path, ignore: set[str]) -> list[str]:
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()

    def name(line: str) -> str:
        if line.startswith("# "):
            return line.split(" ", 3)[2] if line.count(" ") >= 2 else ""
        return line.split("{", 1)[0].split(" ", 1)[0]

    return [ln for ln in lines if not ignore or name(ln) not in ignore]


def _store(path: Path, ignore: set[str]) -> dict:
    tables = json.loads(path.read_text())
    out = {}
    for name, t in tables.items():
        keep = [i for i, c in enumerate(t["columns"]) if c not in ignore]
        rows = [[_cell(r[i], ignore) for i in keep] for r in t["rows"]]
        # The schema text changes when columns are added; compare it only when nothing is ignored.
        out[name] = {"columns": [t["columns"][i] for i in keep], "rows": rows,
                     **({"sql": t["sql"]} if not ignore else {})}
    return out


def _cell(v, ignore: set[str]):
    """A JSON object stored as text (inventory facts) loses the ignored keys too."""
    if ignore and isinstance(v, str) and v.startswith("{"):
        try:
            return json.dumps(_strip(json.loads(v), ignore), sort_keys=True)
        except ValueError:
            return v
    return v


def compare(a: Path, b: Path, ignore: set[str]) -> int:
    bad = 0
    for label in SCENARIOS:
        da, db = a / label, b / label
        if not da.is_dir() or not db.is_dir():
            continue
        checks = {
            "sample": _json_lines(da / "sample.jsonl.gz", ignore) == _json_lines(db / "sample.jsonl.gz", ignore),
            "wire": _json_lines(da / "wire.jsonl.gz", ignore) == _json_lines(db / "wire.jsonl.gz", ignore),
            "metrics": _metric_lines(da / "metrics.txt.gz", ignore) == _metric_lines(db / "metrics.txt.gz", ignore),
            "store": _store(da / "store.json", ignore) == _store(db / "store.json", ignore),
        }
        if not ignore:  # byte for byte, files as written
            checks["bytes"] = all(
                gzip.open(da / n).read() == gzip.open(db / n).read()
                for n in ("sample.jsonl.gz", "wire.jsonl.gz", "metrics.txt.gz")
            ) and (da / "store.json").read_bytes() == (db / "store.json").read_bytes()
        failed = [k for k, ok in checks.items() if not ok]
        bad += bool(failed)
        print(f"{label:12} {'identical' if not failed else 'DIFFERS: ' + ', '.join(failed)}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("dest", type=Path)
    r.add_argument("--only", nargs="*")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.add_argument("--ignore", default="", help="comma-separated keys / metric names / columns to leave out")
    args = ap.parse_args()
    if args.cmd == "record":
        record(args.dest, args.only)
        return 0
    return compare(args.a, args.b, {x for x in args.ignore.split(",") if x})


if __name__ == "__main__":
    sys.exit(main())
