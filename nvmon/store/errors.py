"""One exception type for every store failure, with a one-line message that names the file and
SQLite's own error name, e.g. `database /var/lib/nvmon/nvmon.db: disk full (SQLITE_FULL)`."""

from __future__ import annotations

import sqlite3
from pathlib import Path

# Most specific first: SQLite's extended names start with their primary name (SQLITE_IOERR_WRITE).
_REASONS = (
    ("SQLITE_FULL", "disk full"),
    ("SQLITE_READONLY", "read-only (file, directory or file system)"),
    ("SQLITE_CANTOPEN", "cannot open (missing directory or no permission)"),
    ("SQLITE_PERM", "permission denied"),
    ("SQLITE_IOERR", "I/O error"),
    ("SQLITE_CORRUPT", "corrupt"),
    ("SQLITE_NOTADB", "not a database"),
    ("SQLITE_BUSY", "locked by another writer"),
    ("SQLITE_LOCKED", "locked"),
    ("SQLITE_TOOBIG", "value too big"),
)

# Errors after which the connection itself is suspect (opened read-only, file moved or gone):
# the next call reconnects instead of reusing it.
RECONNECT_ON = ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_IOERR", "SQLITE_CORRUPT", "SQLITE_NOTADB",
                "SQLITE_PERM")


class StoreError(Exception):
    """A store operation failed; the message is one line. `code` is SQLite's error name when known
    (e.g. "SQLITE_FULL"), else None."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


def error_name(exc: BaseException) -> str | None:
    """SQLite's error name of an exception (Python ≥ 3.11 attaches it), e.g. "SQLITE_IOERR_WRITE"."""
    return getattr(exc, "sqlite_errorname", None)


def describe(path: str | Path, exc: BaseException) -> StoreError:
    """A StoreError for `exc`, one line: what went wrong, in words, then SQLite's name for it."""
    name = error_name(exc)
    if name:
        for prefix, words in _REASONS:
            if name.startswith(prefix):
                return StoreError(f"database {path}: {words} ({name})", name)
        return StoreError(f"database {path}: {_one_line(exc)} ({name})", name)
    if isinstance(exc, sqlite3.Error):
        return StoreError(f"database {path}: {_one_line(exc)}")
    if isinstance(exc, OSError):
        return StoreError(f"database {path}: {exc.strerror or _one_line(exc)}")
    return StoreError(f"database {path}: {type(exc).__name__}: {_one_line(exc)}")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
