"""The hook-kind registry is the one place a hook type is spelled out: the config accepts exactly
its types, in its order, and no other hook module branches on a type's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nvmon.alerts.hook_kinds import HOOK_KINDS
from nvmon.alerts.hooks import HOOK_TYPES, HookConfig, HookConfigError, parse_hooks

ROOT = Path(__file__).resolve().parent.parent
HOOK_MODULES = [*(p for p in sorted((ROOT / "nvmon" / "alerts").glob("hook*.py")) if p.name != "hook_kinds.py"),
                ROOT / "nvmon" / "cli" / "hooks.py"]


def test_the_config_takes_the_registrys_types_in_its_order():
    assert HOOK_TYPES == tuple(HOOK_KINDS) and all(k.name == n for n, k in HOOK_KINDS.items())
    assert HookConfig.model_json_schema()["properties"]["type"]["enum"] == list(HOOK_KINDS)
    with pytest.raises(HookConfigError, match=f"must be one of {', '.join(HOOK_KINDS)}$"):
        parse_hooks([{"type": "email"}])


@pytest.mark.parametrize("path", HOOK_MODULES, ids=lambda p: p.name)
def test_no_hook_module_branches_on_a_type_name(path):
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            for part in (node.left, *node.comparators):
                names = part.elts if isinstance(part, ast.Tuple | ast.List | ast.Set) else [part]
                found += [f"line {node.lineno}: {n.value!r}" for n in names
                          if isinstance(n, ast.Constant) and n.value in HOOK_KINDS]
    assert not found, f"{path.name} compares against hook type names (use HOOK_KINDS): {found}"
