"""Where the real `nvidia-smi -q -x` captures are, and the kit's modules (bench/hardware/).

The captures live in the project's shared folder (shared/hardware/, README there), which is not part
of the repo: CI has a read-only copy of it beside the clone (../shared), and a checkout may hold it
inside (shared/). A test that needs one skips, saying why, where neither has it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KIT = REPO / "bench" / "hardware"
if str(KIT) not in sys.path:
    sys.path.insert(0, str(KIT))


def captures_dir() -> Path | None:
    for d in (REPO.parent / "shared" / "hardware", REPO / "shared" / "hardware"):
        if (d / "qx-h100.xml").is_file():
            return d
    return None


def capture(name: str) -> Path:
    """The path of a capture (qx-h100.xml, qx-b200.xml, qx-gb200.xml), or a skip."""
    d = captures_dir()
    if d is None or not (d / name).is_file():
        pytest.skip(f"no {name}: the shared folder's hardware/ captures are not beside the repo (../shared)")
    return d / name
