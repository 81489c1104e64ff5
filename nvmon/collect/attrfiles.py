"""Sysfs attributes read every tick through descriptors kept open, re-read with pread(fd, 0).

A sysfs attribute read at offset 0 runs its show() again (seq_file restarts at position 0), so
one pread replaces open + read + close: a third of the system calls, for the ~100 InfiniBand
attributes a node reads a second.

An open descriptor must not outlive the file it was opened on. On a real kernel a removed device's
attributes fail with ENODEV; a file replaced by a rename (the simulator, test trees) would keep
answering from its old inode. So the descriptors of a group (one IB port) are trusted only while
the group's directories keep the modification time they had, and only once that time is older
than the descriptors by more than the file system's coarse clock step; otherwise the group's files
are opened afresh on that tick. A read that fails on a kept descriptor is retried on the path,
which then tells the real state (missing, unreadable).
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Iterable, Sequence

# mtimes come from a coarse clock (one jiffy, ≤ 10 ms): a change within one step of the opening
# could leave the time unchanged, so only times older than this before the opening are trusted.
TRUST_AFTER_NS = 100_000_000


class FdBudget:
    """Descriptors that may be kept open across a whole process, by every user together: `nvmon
    demo` runs up to 200 simulated nodes in one process, each with its own collector, and a
    desktop's soft limit is often 1024. Past the budget, files are opened per read as before."""

    def __init__(self, share: int, cap: int = 1024):
        try:
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (ValueError, OSError):
            soft = 1024
        if soft == resource.RLIM_INFINITY or soft <= 0:
            soft = cap * share
        self.limit = min(cap, soft // share)
        self.used = 0
        self._lock = threading.Lock()  # collectors of several nodes run in several threads

    def take(self) -> bool:
        with self._lock:
            if self.used >= self.limit:
                return False
            self.used += 1
            return True

    def give(self, n: int = 1) -> None:
        if n:
            with self._lock:
                self.used -= n


FD_BUDGET = FdBudget(share=8)  # an eighth of the soft limit, at most 1024, for the collectors of a process


def read_path(path: str) -> bytes:
    """One attribute, opened and closed (os.open/os.read: a fraction of `open()`'s cost)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


class _Group:
    __slots__ = ("dirs", "sig", "opened_ns", "fds")

    def __init__(self, dirs: Sequence[str]):
        self.dirs = tuple(dirs)
        self.sig: tuple[int, ...] | None = None
        self.opened_ns = 0
        self.fds: dict[str, int] = {}


class AttrFiles:
    """Open attribute descriptors by group. `begin(key, dirs)` once per group per tick, then
    `read(key, path)` for each of its files. Not thread-safe: one per collector."""

    def __init__(self, budget: FdBudget = FD_BUDGET):
        self.budget = budget  # past it, attributes are opened and closed at each read
        self._groups: dict[object, _Group] = {}

    @property
    def open_count(self) -> int:
        return sum(len(g.fds) for g in self._groups.values())

    def begin(self, key: object, dirs: Sequence[str]) -> None:
        """Check that `key`'s kept descriptors still stand for its files; drop them if not."""
        g = self._groups.get(key)
        if g is None or g.dirs != tuple(dirs):
            self.forget(key)
            g = self._groups[key] = _Group(dirs)
        try:
            sig = tuple(os.stat(d).st_mtime_ns for d in g.dirs)
        except OSError:  # the group's directory is gone: read by path, which says what is missing
            sig = None
        now = time.time_ns()
        if sig is None or sig != g.sig or max(sig) >= g.opened_ns - TRUST_AFTER_NS:
            self._close(g)
            g.sig, g.opened_ns = sig, now

    def read(self, key: object, path: str) -> bytes:
        """The attribute's content; OSError as os.open/os.read raise it."""
        g = self._groups.get(key)
        if g is None or g.sig is None:
            return read_path(path)
        fd = g.fds.get(path)
        if fd is None:
            if not self.budget.take():
                return read_path(path)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self.budget.give()
                raise
            g.fds[path] = fd
        try:
            return os.pread(fd, 4096, 0)
        except OSError:  # ENODEV: the device went away under the descriptor
            del g.fds[path]
            self.budget.give()
            os.close(fd)
            return read_path(path)

    def forget(self, key: object) -> None:
        g = self._groups.pop(key, None)
        if g is not None:
            self._close(g)

    def keep_only(self, keys: Iterable[object]) -> None:
        """Forget every group not in `keys` (ports that went away)."""
        keep = set(keys)
        for key in [k for k in self._groups if k not in keep]:
            self.forget(key)

    def close(self) -> None:
        for key in list(self._groups):
            self.forget(key)

    def _close(self, g: _Group) -> None:
        for fd in g.fds.values():
            os.close(fd)
        self.budget.give(len(g.fds))
        g.fds.clear()
