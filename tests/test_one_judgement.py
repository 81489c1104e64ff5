"""A condition is judged once, in `nvmon.audit`: views only format findings (issue 11).

The views (`nvmon sample`'s tables, the TUI) must not reach for the things a judgement needs —
the hardware specs, the audit's thresholds, its "is this GPU busy" rule, the throttle-reason
groups — so that they cannot drift from `nvmon audit` and the alerts again. This test reads their
source, so a new comparison against a spec fails here instead of in front of an SRE.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "nvmon"
VIEWS = [PKG / "render.py", *sorted((PKG / "tui").rglob("*.py"))]
# What judging takes: a spec to hold a value to, a threshold, or the audit's own predicates.
FORBIDDEN_MODULES = {"nvmon.specs"}
FORBIDDEN_NAMES = {"Thresholds", "gpu_spec_for", "is_busy", "POWER_THROTTLES", "THERMAL_THROTTLES",
                   "GpuSpec", "NodeSpec", "_is_down", "_is_active"}


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module in FORBIDDEN_MODULES:
                out.append(f"line {node.lineno}: imports {node.module}")
            out += [f"line {node.lineno}: imports {a.name} from {node.module}"
                    for a in node.names if a.name in FORBIDDEN_NAMES]
        elif isinstance(node, ast.Import):
            out += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name in FORBIDDEN_MODULES]
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            out.append(f"line {node.lineno}: uses {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES:
            out.append(f"line {node.lineno}: uses .{node.attr}")
    return out


@pytest.mark.parametrize("path", VIEWS, ids=[str(p.relative_to(PKG)) for p in VIEWS])
def test_views_do_not_judge(path):
    assert not _offences(path), f"{path.relative_to(PKG)} judges for itself: {_offences(path)}"


def test_the_check_sees_a_judging_view(tmp_path):
    bad = tmp_path / "view.py"
    bad.write_text("from nvmon.audit import Thresholds\nT = Thresholds()\nfrom nvmon.specs import gpu_spec_for\n")
    assert len(_offences(bad)) == 4
