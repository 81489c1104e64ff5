"""The daemon's hold on its database file: one daemon per file, and a file that was deleted,
replaced or found corrupt is noticed instead of written into the void.

- `FileLock`: an exclusive `flock` on `<db>.lock` (the pid inside, for the message). flock, not
  SQLite's own locks: those are POSIX record locks, dropped by any close of the file in the same
  process, and SQLite holds them only during a transaction. The lock dies with the process (kill
  -9 included), so a stale lock file never blocks a restart; it is never unlinked (unlinking would
  let a second daemon lock a new file while the first still holds the old one).
- `identity(path)`: (device, inode) of the file at the path now, compared with the open one's.
- `set_aside(path)`: rename a corrupt database and its -wal/-shm to `<name>.corrupt-<UTC time>`.
- `quick_check(conn, path)`: SQLite's `PRAGMA quick_check`, its finding a one-line StoreError.
- `check_writable(path)`: refuse a file or directory we could only read, before SQLite opens it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import time
from pathlib import Path

from nvmon.store.errors import StoreError, describe

LOCKED = "LOCKED"  # StoreError.code: another daemon holds the database
# Errors that say what the disk or another process did, not what the file holds: no quick_check for them.
NOT_THE_FILE = ("SQLITE_FULL", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM",
                "SQLITE_INTERRUPT", "ENOENT", "EROFS", "EACCES", "LOCKED")
RESET_REASONS = ("deleted", "replaced", "corrupt")
QUICK_CHECK_ROWS = 3  # problems quick_check reports, at most (the first names the damage)


def identity(path: Path) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file at `path`, or None when there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class FileLock:
    """An exclusive, non-blocking lock on `<db>.lock`, held from `acquire()` to `release()`."""

    def __init__(self, db: Path):
        self.db = db
        self.path = Path(f"{db}.lock")
        self._fd: int | None = None
        self._ident: tuple[int, int] | None = None

    @property
    def held(self) -> bool:
        """Held, and still on the file at the path (not deleted or replaced under us)."""
        return self._fd is not None and identity(self.path) == self._ident

    def acquire(self) -> None:
        """Take the lock (again, if its file was deleted). Raises StoreError: code LOCKED when
        another process holds it, else the file system's reason."""
        if self.held:
            return
        self.release()
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)  # hooks must not inherit it
        except OSError as e:
            raise StoreError(f"database {self.db}: cannot create lock file {self.path.name}: "
                             f"{e.strerror or e} ({errno.errorcode.get(e.errno, e.errno)})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            pid = _read(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                who = f"pid {pid}" if pid else "another process"
                raise StoreError(f"database {self.db} is in use by another nvmon process ({who}, lock "
                                 f"{self.path.name}); give each daemon or fleet its own --db", LOCKED) from None
            raise StoreError(f"database {self.db}: cannot lock {self.path.name}: {e.strerror or e}") from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:
            pass  # the pid is only for the message; the lock is what counts
        st = os.fstat(fd)
        self._fd, self._ident = fd, (st.st_dev, st.st_ino)

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = self._ident = None


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return ""


def sidecars(path: Path) -> tuple:
    """The identities of `path`'s -wal and -shm now (None for one that is not there)."""
    return identity(Path(f"{path}-wal")), identity(Path(f"{path}-shm"))


def remove_sidecars(path: Path, ours: tuple) -> None:
    """After the file at `path` was deleted or replaced: remove its old -wal and -shm (those in
    `ours`, or any when no file is left). A new file must not start with the old one's WAL: SQLite
    would replay the old pages into it. (It leaves them when the moved file's checkpoint fails.)"""
    gone = identity(path) is None
    for suffix, mine in zip(("-wal", "-shm"), ours):
        side = Path(f"{path}{suffix}")
        now = identity(side)
        if now is not None and (gone or now == mine):
            try:
                os.unlink(side)
            except FileNotFoundError:
                pass


def set_aside(path: Path, now: float | None = None) -> Path:
    """Rename `path` and its -wal/-shm to `<path>.corrupt-<UTC time>`; returns the new name.
    The connection must be closed. Raises OSError."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    target = Path(f"{path}.corrupt-{stamp}")
    n = 1
    while target.exists():  # twice in one second
        n += 1
        target = Path(f"{path}.corrupt-{stamp}-{n}")
    if path.exists():
        os.replace(path, target)
    for suffix in ("-wal", "-shm"):
        if os.path.exists(f"{path}{suffix}"):
            os.replace(f"{path}{suffix}", f"{target}{suffix}")
    return target


def quick_check(conn: sqlite3.Connection, path: Path) -> None:
    """Owner: `PRAGMA quick_check` (every page and record read, no index cross-check: about a
    second per GB). Raises StoreError (code SQLITE_CORRUPT) naming the first problem."""
    try:
        rows = [r[0] for r in conn.execute(f"PRAGMA quick_check({QUICK_CHECK_ROWS})")]
    except sqlite3.Error as exc:  # damage bad enough to stop the check itself
        found = describe(path, exc)
        if not (found.code or "").startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
            raise found from None
        rows = [f"{' '.join(str(exc).split())[:150]}, {found.code}"]
    if rows != ["ok"]:
        first = " ".join(str(rows[0] if rows else "no answer").split())[:200]
        raise StoreError(f"database {path}: corrupt (quick_check: {first})", "SQLITE_CORRUPT")


def check_writable(path: Path) -> None:
    """Refuse a file we could only read, before SQLite touches it: SQLite would open it read-only
    and create the -wal/-shm files with the file's read-only mode, and that -shm keeps blocking
    writes after the file itself is made writable again."""
    parent = path.parent
    try:
        if not parent.is_dir():
            raise StoreError(f"database {path}: directory {parent} does not exist (ENOENT)", "ENOENT")
        if hasattr(os, "ST_RDONLY") and os.statvfs(parent).f_flag & os.ST_RDONLY:
            raise StoreError(f"database {path}: read-only file system (EROFS)", "EROFS")
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            if p.exists() and not os.access(p, os.R_OK | os.W_OK):
                raise StoreError(f"database {path}: no write permission on {p.name} (EACCES)", "EACCES")
        if not os.access(parent, os.W_OK | os.X_OK):
            # SQLite needs the directory for the -wal and -shm files, even for an existing database.
            raise StoreError(f"database {path}: no write permission on directory {parent} (EACCES)", "EACCES")
    except OSError as exc:
        raise describe(path, exc) from None
