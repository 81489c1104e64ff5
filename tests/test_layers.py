"""The package graph runs one way: every import in nvmon/ points down the layer table below.

Each module is mapped to a unit (the longest prefix in LAYERS). An import may go to a module of
the same unit, or to a unit that sits lower: a lower layer, or an earlier group of the same layer
(the order inside a layer is declared by the groups, so a same-layer edge is allowed only where it
is written down here). Units in one group may not import each other, and only the programs
import the hardware layer (the layers between read the Sample, not the collector). Also checked:
no import cycle between modules, none between packages (nvmon.store, nvmon.alerts, ...), and no
module over MAX_LINES.

Which imports count: every `import` / `from ... import` anywhere in a module, at module level,
inside functions and under `if TYPE_CHECKING:` alike. A lazy import still ties the two modules
together (it only moves the cost to later), and a type-only one still says that one layer knows
the other's types. Importing a module also runs its packages' `__init__.py`, so a module's
imports include those of every enclosing package that belongs to another unit (a leaf such as
nvmon.alerts.model stays a leaf only while nvmon/alerts/__init__.py imports nothing above it).

To add a module or package, put it in LAYERS where it belongs; a failure names the edge
(importer, line, imported) and the two units.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "nvmon"

# Bottom first. Each layer is a list of groups, lowest group first; a group lists units (module or
# package names; a module belongs to the longest unit that prefixes it).
LAYERS: list[tuple[str, list[list[str]]]] = [
    ("leaf", [
        ["nvmon", "nvmon.aio", "nvmon.secretfile", "nvmon.tomlfile", "nvmon.xid"],  # "nvmon": the package root, __version__
        ["nvmon.codes"],  # Severity, the finding codes and their runbooks
        ["nvmon.model", "nvmon.specs"],  # the Sample and its names; the expected hardware
        ["nvmon.catalog"],  # the metric catalog: what each Sample metric is, once
        ["nvmon.alerts.model"],  # AlertRecord, Silence: value types the store keeps
    ]),
    ("hardware", [
        ["nvmon.collect"],
        ["nvmon.sim"],  # the simulator uses the collector's NVML field names and kept-open files
    ]),
    ("judgement", [
        ["nvmon.audit"],
    ]),
    ("services", [
        ["nvmon.store", "nvmon.wire"],
        ["nvmon.alerts", "nvmon.export"],  # alert rules publish over the wire; the store keeps their state
    ]),
    ("aggregation", [
        ["nvmon.fleet"],
    ]),
    ("programs", [
        ["nvmon.render"],  # rich renderables of a Sample and an audit report
        ["nvmon.tui", "nvmon.daemon", "nvmon.loadgen"],  # the load generator fills FleetStates, publishes
        ["nvmon.demo"],  # runs real daemons on simulated boards
        ["nvmon.cli"],  # the command line: front ends over everything
        ["nvmon.__main__"],  # python -m nvmon
    ]),
]
# Hardware is driven, not read: between it and the programs that run it, layers read the Sample
# (nvmon.model), never the collector or the simulator, so only these layers import them.
DRIVES_HARDWARE = ("hardware", "programs")
MAX_LINES = 500
# Modules over MAX_LINES when this test was written, each held at its size then: they may shrink,
# not grow. Split them and delete the entry.
OVER_LIMIT: dict[str, int] = {}


def unit_ranks() -> dict[str, tuple[int, int, str]]:
    ranks = {}
    for li, (layer, groups) in enumerate(LAYERS):
        for gi, group in enumerate(groups):
            for unit in group:
                assert unit not in ranks, f"{unit} is in LAYERS twice"
                ranks[unit] = (li, gi, layer)
    return ranks


def find_modules(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Module name → file, packages by their __init__.py."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module an import of `name` loads: itself, or the nearest enclosing module (a name from it)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module, line) for every import of a package module anywhere in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    here = module if is_pkg else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):  # walks function bodies and `if TYPE_CHECKING:` blocks too
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from pkg import sub` imports the submodule when there is one, else a name from pkg
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for name in names:
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                target = _resolve(name, modules)
                if target is not None and target != module:
                    out.append((target, node.lineno))
    return list(dict.fromkeys(out))  # `from m import a, b` is one edge


def unit_of(module: str, ranks: dict) -> str | None:
    """The longest unit that prefixes `module`; the root unit "nvmon" holds only nvmon/__init__.py."""
    if module == PACKAGE:
        return PACKAGE if PACKAGE in ranks else None
    parts = module.split(".")
    while len(parts) > 1:
        if ".".join(parts) in ranks:
            return ".".join(parts)
        parts.pop()
    return None


def package_of(module: str) -> str:
    """The top-level package (or single-file module) under nvmon a module belongs to."""
    return ".".join(module.split(".")[:2])


def graph(root: Path = ROOT) -> tuple[dict[str, Path], dict[str, list[tuple[str, int]]]]:
    modules = find_modules(root)
    return modules, {m: imports_of(m, p, modules) for m, p in modules.items()}


def layer_violations(modules: dict[str, Path], edges: dict[str, list[tuple[str, int]]],
                     root: Path = ROOT) -> list[str]:
    ranks = unit_ranks()
    problems = [f"{m} ({modules[m].relative_to(root)}): not in LAYERS; add its package where it belongs"
                for m in modules if unit_of(m, ranks) is None]
    for m in modules:
        u = unit_of(m, ranks)
        if u is None:
            continue
        # its own imports, and those of each enclosing package's __init__ from another unit (run first)
        sources = [(m, "")]
        parts = m.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent in modules and unit_of(parent, ranks) != u:
                sources.append((parent, f" (run by importing {m})"))
        for src, via in sources:
            for target, line in edges[src]:
                t = unit_of(target, ranks)
                if t is None or t == u or target == src:
                    continue
                (la, ga, layer_a), (lb, gb, layer_b) = ranks[u], ranks[t]
                if (lb, gb) < (la, ga):
                    if layer_b == "hardware" and layer_a not in DRIVES_HARDWARE:
                        problems.append(f"{modules[src].relative_to(root)}:{line}: {src} imports {target}{via}: "
                                        f"{u} -> {t} ('{layer_a}' reads the Sample: names it needs belong in "
                                        f"nvmon.model, only {' and '.join(DRIVES_HARDWARE)} import the hardware)")
                    continue
                where = (f"same layer '{layer_a}', group {gb + 1} vs {ga + 1}" if la == lb
                         else f"'{layer_a}' -> '{layer_b}' runs up")
                problems.append(f"{modules[src].relative_to(root)}:{line}: {src} imports {target}{via}: "
                                f"{u} -> {t} ({where})")
    return problems


def cycles(nodes: list[str], adjacency: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node, or a node importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(adjacency.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in adjacency.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def describe_cycle(comp: list[str], edges: dict[str, list[tuple[str, int]]], key=lambda m: m) -> str:
    """One shortest loop through the cycle, each step with the import that makes it
    (`a -> b (a.py:12)`), so the failure says which import to cut; then how many are caught in it."""
    members = set(comp)
    step: dict[str, dict[str, str]] = defaultdict(dict)  # unit → next unit → an import making that step
    for src, targets in sorted(edges.items()):
        for t, line in sorted(targets):
            a, b = key(src), key(t)
            if a in members and b in members and a != b:
                step[a].setdefault(b, f"line {line}" if (a, b) == (src, t) else f"{src} -> {t}, line {line}")
    start = comp[0]
    previous: dict[str, str] = {}
    queue, seen = [start], {start}
    while queue:  # breadth first: the shortest way from start back to start
        a = queue.pop(0)
        if start in step[a]:
            path = [start]
            while a != start:
                path.append(a)
                a = previous[a]
            path = [start] + path[:0:-1] + [start]
            break
        for b in sorted(step[a]):
            if b not in seen:
                seen.add(b)
                previous[b] = a
                queue.append(b)
    hops = [f"{a} -> {b} ({step[a][b]})" for a, b in zip(path, path[1:])]
    return "; ".join(hops) + f"  [{len(comp)} caught in the cycle: {', '.join(comp)}]"


def module_cycles(edges) -> list[str]:
    adjacency = {m: {t for t, _ in targets} for m, targets in edges.items()}
    return [describe_cycle(c, edges) for c in cycles(list(edges), adjacency)]


def package_cycles(edges) -> list[str]:
    adjacency: dict[str, set[str]] = defaultdict(set)
    for m, targets in edges.items():
        for t, _ in targets:
            if package_of(t) != package_of(m):
                adjacency[package_of(m)].add(package_of(t))
    nodes = sorted({package_of(m) for m in edges})
    return [describe_cycle(c, edges, key=package_of) for c in cycles(nodes, adjacency)]


# --- the checks on nvmon itself


def test_every_import_points_down_the_layers():
    modules, edges = graph()
    problems = layer_violations(modules, edges)
    assert not problems, "imports that run back up the layers (tests/test_layers.py LAYERS):\n  " + \
        "\n  ".join(problems)


def test_no_import_cycle_between_modules():
    _, edges = graph()
    found = module_cycles(edges)
    assert not found, "module import cycles:\n  " + "\n  ".join(found)


def test_no_import_cycle_between_packages():
    _, edges = graph()
    found = package_cycles(edges)
    assert not found, "package import cycles:\n  " + "\n  ".join(found)


def test_modules_stay_small():
    modules = find_modules(ROOT)
    over = []
    for path in modules.values():
        rel = path.relative_to(ROOT).as_posix()
        n = len(path.read_text(encoding="utf-8").splitlines())
        limit = OVER_LIMIT.get(rel, MAX_LINES)
        if n > limit:
            over.append(f"{rel}: {n} lines (limit {limit})")
    assert not over, "modules over the size limit (split them):\n  " + "\n  ".join(over)
    for rel in OVER_LIMIT:
        assert (ROOT / rel).exists(), f"{rel} is gone: drop it from OVER_LIMIT"


# --- the checker catches what it is meant to (a small package tree written for the test)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / PACKAGE / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_checker_sees_lazy_type_only_and_relative_imports(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "model.py": "",
        "store/__init__.py": "from nvmon.store.store import Store\n",
        "store/store.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nvmon.alerts.engine import X\n"
                           "def f():\n    from ..alerts import engine\n    from . import codec\n"),
        "store/codec.py": "from .. import model\nfrom nvmon.collect.sysfs import IB_STATES\n",
        "collect/__init__.py": "",
        "collect/sysfs.py": "",
        "alerts/__init__.py": "",
        "alerts/engine.py": "import nvmon.store.codec\n",
    })
    modules, edges = graph(root)
    assert sorted(edges["nvmon.store.store"]) == [("nvmon.alerts.engine", 3), ("nvmon.alerts.engine", 5),
                                                  ("nvmon.store.codec", 6)]
    assert edges["nvmon.store.codec"] == [("nvmon.model", 1), ("nvmon.collect.sysfs", 2)]
    assert edges["nvmon.store"] == [("nvmon.store.store", 1)]
    problems = layer_violations(modules, edges, root)
    up = [p for p in problems if "nvmon.store.store imports nvmon.alerts.engine" in p]
    assert len(up) == 2 and "store/store.py:3" in up[0] + up[1] and "'services', group 2 vs 1" in up[0]
    assert [p for p in problems if p not in up] == [
        "nvmon/store/codec.py:2: nvmon.store.codec imports nvmon.collect.sysfs: nvmon.store -> nvmon.collect "
        "('services' reads the Sample: names it needs belong in nvmon.model, only hardware and programs import "
        "the hardware)"]


def test_checker_sees_back_edges_cycles_and_unmapped_modules(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "audit.py": "from nvmon.fleet.state import S\n",  # judgement -> aggregation: up
        "fleet/__init__.py": "",
        "fleet/state.py": "from nvmon.fleet.rules import R\n",
        "fleet/rules.py": "def f():\n    from nvmon.fleet.state import S\n    from nvmon import audit\n",
        "mystery.py": "",
        "alerts/__init__.py": "from nvmon.fleet import rules\n",  # runs whenever the leaf alerts.model loads
        "alerts/model.py": "",
    })
    modules, edges = graph(root)
    problems = layer_violations(modules, edges, root)
    assert any(p.startswith("nvmon.mystery") and "not in LAYERS" in p for p in problems)
    assert any("audit.py:1: nvmon.audit imports nvmon.fleet.state" in p and "'judgement' -> 'aggregation'" in p
               for p in problems)
    assert any("nvmon.alerts imports nvmon.fleet.rules (run by importing nvmon.alerts.model)" in p for p in problems)
    found = module_cycles(edges)
    assert found == ["nvmon.audit -> nvmon.fleet.state (line 1); nvmon.fleet.state -> nvmon.fleet.rules (line 1); "
                     "nvmon.fleet.rules -> nvmon.audit (line 3)  "
                     "[3 caught in the cycle: nvmon.audit, nvmon.fleet.rules, nvmon.fleet.state]"]
    assert package_cycles(edges) == ["nvmon.audit -> nvmon.fleet (nvmon.audit -> nvmon.fleet.state, line 1); "
                                     "nvmon.fleet -> nvmon.audit (nvmon.fleet.rules -> nvmon.audit, line 3)  "
                                     "[2 caught in the cycle: nvmon.audit, nvmon.fleet]"]


@pytest.mark.parametrize("unit", [u for _, groups in LAYERS for g in groups for u in g])
def test_every_unit_in_the_table_exists(unit):
    modules = find_modules(ROOT)
    assert any(m == unit or m.startswith(unit + ".") for m in modules), f"{unit}: no such module; drop it from LAYERS"
