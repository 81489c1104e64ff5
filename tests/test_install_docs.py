"""What README.md and docs/install.md tell a new user to run: the distribution they install is this
project (not the unrelated `nvmon` on the package index), the wheel they build has the name the docs
glob for, README's test command is the one CI runs, and its quick subset names real test files."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
INSTALL = (REPO / "docs" / "install.md").read_text()
DIST = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]
# `pip install nvmon`, `pipx install --global nvmon`, `pip install -U nvmon==0.1`: the index's `nvmon`.
INDEX_NVMON = re.compile(r"\bpipx? install(?: +-{1,2}[\w-]+)* +['\"]?nvmon(?![\w./-])")


def test_the_distribution_is_not_the_unrelated_nvmon_and_no_doc_installs_that():
    assert DIST == "nvmon-hgx"  # "nvmon" on the package index is another project
    docs = {p.relative_to(REPO): p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}
    found = {str(p): INDEX_NVMON.findall(text) for p, text in docs.items() if INDEX_NVMON.search(text)}
    assert not found, found
    assert INDEX_NVMON.search("sudo pipx install --global nvmon") and INDEX_NVMON.search("pip install nvmon")
    assert not INDEX_NVMON.search("pip install ./dist/nvmon_hgx-0.1.0-py3-none-any.whl")
    assert f"**`{DIST}`**" in INSTALL and "pip install ." in INSTALL


def test_the_wheel_built_as_install_md_says_has_the_name_it_globs_for(tmp_path):
    """`python3 -m pip wheel --no-deps . -w dist`, on a copy of the tracked files (the build leaves
    build/ and *.egg-info behind, which must not land in the working tree)."""
    tree = tmp_path / "src"
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        src = REPO / name
        if src.is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_bytes(src.read_bytes())
    (tree / "pyproject.toml").write_bytes((REPO / "pyproject.toml").read_bytes())  # the one being tested
    cmd = next(line for line in INSTALL.splitlines() if line.startswith("python3 -m pip wheel"))
    argv = shlex.split(cmd.split("#")[0])
    assert argv[1:] == ["-m", "pip", "wheel", "--no-deps", ".", "-w", "dist"]
    r = subprocess.run([sys.executable, *argv[1:], "-q"], cwd=tree, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = list((tree / "dist").glob("*.whl"))
    assert len(wheels) == 1
    globs = set(re.findall(r"\./dist/(\S+\.whl)", INSTALL))
    assert globs == {"nvmon_hgx-*.whl"} and wheels[0].match(next(iter(globs)))
    with zipfile.ZipFile(wheels[0]) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        entry = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
        assert any(n.startswith("nvmon/tui/") and n.endswith(".tcss") for n in z.namelist())  # package data
    assert f"\nName: {DIST}\n" in meta
    assert "nvmon = nvmon.cli:main" in entry  # the command keeps its name


def test_readme_test_command_is_the_one_ci_runs():
    ci = (REPO / ".ci" / "run").read_text()
    line = next(x for x in README.splitlines() if "pytest" in x and x.startswith("python3 -m venv"))
    assert line in ci.splitlines()


def test_readme_says_how_to_reach_the_nvmon_command_and_what_the_tests_need():
    assert ". .venv/bin/activate" in README
    for tool in ("mosquitto", "tmux", "openssl", "systemd-analyze", "promtool", "prometheus-alertmanager", "CI=true"):
        assert tool in README, tool
    quick = next(x for x in README.splitlines() if x.startswith(".venv/bin/python -m pytest -q tests/"))
    files = [a for a in shlex.split(quick) if a.startswith("tests/")]
    assert len(files) >= 5 and all((REPO / f).is_file() for f in files), files
    # No external tool in the quick subset: none of its files uses the broker, tmux or systemd-analyze.
    for f in files:
        text = (REPO / f).read_text()
        assert not re.search(r"mqtt_broker|needs_mosquitto|tmux|systemd-analyze|promtool|realstack", text), f
