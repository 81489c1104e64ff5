"""The docs' metric tables, generated from the catalog, and the check that the docs hold them.

Each generated table sits in its page between `<!-- catalog:NAME -->` and `<!-- /catalog:NAME -->`;
`python -m nvmon.catalog.docs` rewrites them in place, and tests/test_catalog.py fails when a page
differs from what the catalog generates (so a metric added to the catalog shows in the docs).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from nvmon.catalog.compat import DEFAULT, LINES
from nvmon.catalog.families import FAMILIES, GPU_LABELS
from nvmon.catalog.metrics import METRICS, Rollup, Scope, Static

_HISTORY_TABLE = {Scope.GPU: "gpu", Scope.NVLINK: "link", Scope.IB_PORT: "ib", Scope.NODE: "node"}
_LABEL_SET = {"GPU": "GPU", "LINK": "link", "IB": "IB", "PCI": "PCI", "NODE": "node"}


def _rollup_text(m) -> str:
    if m.rollup is Rollup.CUSTOM:
        return ", ".join(stat for stat, _ in m.history_rollup)
    if m.rollup is Rollup.ANY:
        return "any during the minute"
    return m.rollup.value


def history_table() -> str:
    """docs/store.md: the metrics of `nvmon history --metric`."""
    rows = ["| metric | table | unit | meaning | in rollups |", "| --- | --- | --- | --- | --- |"]
    for m in METRICS:
        if m.history:
            rows.append(f"| `{m.name}` | {_HISTORY_TABLE[m.scope]} | {m.unit} | {m.doc} | {_rollup_text(m)} |")
    return "\n".join(rows)


def gpu_metrics_table() -> str:
    """docs/sample-schema.md: the catalog's per-GPU metrics, where each lives in the sample."""
    rows = ["| key | unit | kind | meaning | stored | wire |", "| --- | --- | --- | --- | --- | --- |"]
    for m in METRICS:
        if m.scope is Scope.GPU and m.sampled:
            stored = ("inventory" if m.static is Static.FACT else f"`{m.column}`") if m.column else ""
            rows.append(f"| `{m.key}` | {m.unit} | {m.kind.value} | {m.doc} | {stored} | "
                        f"{'`' + m.wire + '`' if m.wire else ''} |")
    return "\n".join(rows)


def families_table() -> str:
    """docs/prometheus.md: every family, its type, labels and help, in page order."""
    rows = ["| metric | type | labels | help |", "| --- | --- | --- | --- |"]
    for f in FAMILIES:
        labels = _LABEL_SET[f.scope] + (" + " + ", ".join(f"`{x}`" for x in f.labels) if f.labels else "")
        source = f" Filled from the catalog's `{f.metric}`." if f.metric else ""
        rows.append(f"| `{f.name}` | {f.type} | {labels} | {f.help}{source} |")
    return "\n".join(rows)


def compat_table() -> str:
    """docs/prometheus.md: the dcgm-exporter lines side by side (nvmon.catalog.compat)."""
    lines = list(LINES.values())
    dcgm = [f for f in FAMILIES if f.name.startswith("DCGM_")]

    def row(what: str, cells) -> str:
        return f"| {what} | " + " | ".join(cells) + " |"

    return "\n".join([
        row("`dcgm_compat`", (f"`{x.key}`" + (" (default)" if x.key == DEFAULT else "") for x in lines)),
        row("---", ("---" for _ in lines)),
        row("copies", (x.matches for x in lines)),
        row("host label, every series", (f"`{x.host_label}`" for x in lines)),
        row("GPU labels of `DCGM_*`", (", ".join(f"`{x.label(n)}`" for n in GPU_LABELS)
                                       + (f", `{x.driver_label}`" if x.driver_label else "") if x.dcgm else "—"
                                       for x in lines)),
        row("driver label", (f"`{x.driver_label}` = the driver version" if x.driver_label else "—"
                             for x in lines)),
        row("`DCGM_*` families", (f"{len(dcgm)}, names and units as in the table above" if x.dcgm else "none"
                                  for x in lines)),
    ])


# page (relative to the repository root) → {table name: generator}
TABLES: dict[str, dict[str, Callable[[], str]]] = {
    "docs/store.md": {"history": history_table},
    "docs/sample-schema.md": {"gpu-metrics": gpu_metrics_table},
    "docs/prometheus.md": {"families": families_table, "compat": compat_table},
}


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- catalog:{name} -->)(.*?)(<!-- /catalog:{name} -->)", re.S)


def render(text: str, tables: dict[str, Callable[[], str]]) -> str:
    """`text` with each generated table replaced by what the catalog generates now."""
    for name, gen in tables.items():
        pattern = _block(name)
        if not pattern.search(text):
            raise ValueError(f"no <!-- catalog:{name} --> block")
        text = pattern.sub(lambda m, gen=gen: m.group(1) + "\n" + gen() + "\n" + m.group(3), text, count=1)
    return text


def stale(root: Path) -> list[str]:
    """The pages whose generated tables differ from the catalog."""
    out = []
    for page, tables in TABLES.items():
        text = (root / page).read_text()
        if render(text, tables) != text:
            out.append(page)
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[2]
    for page, tables in TABLES.items():
        path = root / page
        text = path.read_text()
        new = render(text, tables)
        if new != text:
            path.write_text(new)
            print(f"updated {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
