"""Download what the GPU node needs, here: the kit's runtime dependencies as CPython 3.12 manylinux
x86-64 wheels in bench/hardware/wheels/ (git-ignored; the device tool carries it).

Every dependency is named in bench/hardware/requirements.txt and fetched with --no-deps
--only-binary=:all:, so nothing is resolved on the node (it reaches no package index). Then each
wheel is checked: one per pin, at the pinned version, a tag CPython 3.12 on x86-64 Linux accepts,
and every Requires-Dist of it (markers evaluated for that interpreter) met by the pins. Prints the
total size (the device tool carries at most 64 MiB, the working tree included) and the device
command.

    python bench/hardware/prepare.py [--dest DIR]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
except ImportError:  # pip vendors it, and pip is here (it does the download)
    from pip._vendor.packaging.markers import default_environment
    from pip._vendor.packaging.requirements import Requirement

HERE = Path(__file__).resolve().parent
LIMIT_MIB = 64
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_12_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")
# The interpreter on the node: CPython 3.12 on x86-64 Linux.
TARGET_ENV = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
              "implementation_name": "cpython", "platform_python_implementation": "CPython",
              "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
              "os_name": "posix", "extra": ""}
# Requirements the interpreter meets itself: sqlite-utils names pip (for its own `install` command,
# which nvmon never runs), and the node's python3 has pip.
PROVIDED = {"pip"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            if not version:
                raise SystemExit(f"{path}: {line!r} is not pinned (NAME==VERSION)")
            out[norm(name)] = version.strip()
    return out


def wheel_info(path: Path) -> tuple[str, str, str, list[str]]:
    """(normalized name, version, tags, Requires-Dist lines) of a wheel file."""
    name, version, *_, py, abi, plat = path.name[:-4].split("-")
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    requires = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]
    return norm(name), version, f"{py}-{abi}-{plat}", requires


def tag_ok(tags: str) -> bool:
    py, abi, plat = tags.split("-")
    pys, abis, plats = py.split("."), abi.split("."), plat.split(".")
    return (("py3" in pys or "py2.py3" in py or "cp312" in pys or ("cp36" in pys and "abi3" in abis))
            and ("any" in plats or any(p in PLATFORMS for p in plats)))


def check(dest: Path, want: dict[str, str]) -> list[str]:
    problems, have = [], {}
    for w in sorted(dest.glob("*.whl")):
        name, version, tags, requires = wheel_info(w)
        if name in have:
            problems.append(f"two wheels of {name}")
        have[name] = version
        if want.get(name) != version:
            problems.append(f"{w.name}: not pinned at this version (pin: {want.get(name)})")
        if not tag_ok(tags):
            problems.append(f"{w.name}: tag {tags} is not for CPython 3.12 on x86-64 Linux")
        for line in requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(TARGET_ENV):
                continue  # an extra, or another Python / platform
            dep = norm(req.name)
            if dep in PROVIDED:
                continue
            if dep not in want:
                problems.append(f"{name} requires {line!r}: not in requirements.txt")
            elif not req.specifier.contains(want[dep], prereleases=True):
                problems.append(f"{name} requires {line!r}: pinned {want[dep]}")
    for name in sorted(set(want) - set(have)):
        problems.append(f"no wheel for {name}=={want[name]}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=HERE / "wheels")
    ap.add_argument("--requirements", type=Path, default=HERE / "requirements.txt")
    a = ap.parse_args()
    want = pins(a.requirements)
    if a.dest.exists():
        shutil.rmtree(a.dest)  # one version of each: a stale wheel would stop the install
    a.dest.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none",
           *[x for p in PLATFORMS for x in ("--platform", p)], "-d", str(a.dest),
           *[f"{n}=={v}" for n, v in want.items()]]
    if subprocess.run(cmd).returncode != 0:
        print("prepare: pip download failed", file=sys.stderr)
        return 1
    problems = check(a.dest, want)
    for p in problems:
        print(f"prepare: {p}", file=sys.stderr)
    wheels = sorted(a.dest.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        print(f"  {w.stat().st_size / 2**20:7.2f} MiB  {w.name}")
    print(f"{len(wheels)} wheels, {total / 2**20:.2f} MiB in {a.dest} (the device tool carries at most {LIMIT_MIB} MiB)")
    if total > LIMIT_MIB * 2**20:
        problems.append("over the size limit")
    sys.path.insert(0, str(HERE))
    from kit import DEVICE_CARRY, DEVICE_COMMAND, DEVICE_TIMEOUT_S

    print(f"device tool run: command={DEVICE_COMMAND!r} carry={list(DEVICE_CARRY)} timeout_s={DEVICE_TIMEOUT_S} "
          f"({len(DEVICE_COMMAND)} characters)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
