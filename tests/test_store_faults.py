"""The store under faults, on real files: disk full, read-only file/directory/file system, and a
writer killed with SIGKILL mid-write. Each failure must be one StoreError line, leave the database
intact, and the same Store object must write again once the fault is gone."""

from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
from samplefactory import healthy_sample

from nvmon.store import Store, StoreError

TESTS = Path(__file__).parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}


def count(path: Path, table: str = "ticks") -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()


def integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def test_disk_full_is_one_error_and_the_backlog_lands_later(tmp_path):
    """SQLITE_FULL through max_page_count: the same error SQLite gives for ENOSPC, on any machine."""
    path = tmp_path / "nvmon.db"
    st = Store(path)
    st.open()
    s = healthy_sample()
    st.write(s)
    pages = st.query("PRAGMA page_count")[0]["page_count"]
    st.query(f"PRAGMA max_page_count = {pages + 2}")
    backlog, err = [], None
    for i in range(1, 200):
        backlog.append(replace(s, ts=s.ts + i))
        try:
            st.write_many(backlog)
            backlog.clear()
        except StoreError as exc:
            err = exc
            if len(backlog) > 5:
                break
    assert err is not None and str(err) == f"database {path}: disk full (SQLITE_FULL)" and err.code == "SQLITE_FULL"
    stored = count(path)
    with pytest.raises(StoreError, match="disk full"):
        st.write_many(backlog)  # still full: still one clear error
    st.query("PRAGMA max_page_count = 1000000")  # space is back
    st.write_many(backlog)
    assert count(path) == stored + len(backlog)
    assert count(path, "gpu_ticks") == 8 * count(path)
    assert integrity(path) == "ok"
    st.close()


@pytest.fixture
def tmpfs(tmp_path):
    """A 3 MB tmpfs (needs root and mount rights; skipped elsewhere)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3M", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root with mount rights)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_real_disk_full_on_a_small_tmpfs(tmpfs):
    path = tmpfs / "nvmon.db"
    st = Store(path)
    st.open()
    s = healthy_sample()
    filler = tmpfs / "filler"
    filler.write_bytes(b"\0" * 2_600_000)
    written, err = 0, None
    for i in range(2000):
        try:
            st.write(replace(s, ts=s.ts + i))
            written += 1
        except StoreError as exc:
            err = exc
            break
    assert err is not None and "disk full (SQLITE_FULL)" in str(err) and "\n" not in str(err)
    backlog = [replace(s, ts=s.ts + written + k) for k in range(5)]
    with pytest.raises(StoreError):
        st.write_many(backlog)
    filler.unlink()
    st.write_many(backlog)
    st.close()
    assert count(path) == written + 5 and integrity(path) == "ok"


def test_read_only_file_system_then_writable_again(tmpfs):
    path = tmpfs / "nvmon.db"
    s = healthy_sample()
    with Store(path) as st:
        st.write(s)
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    st = Store(path)
    with pytest.raises(StoreError) as e:
        st.open()
    assert str(e.value) == f"database {path}: read-only file system (EROFS)"
    with pytest.raises(StoreError, match="EROFS"):
        st.write(replace(s, ts=s.ts + 1))
    subprocess.run(["mount", "-o", "remount,rw", str(tmpfs)], check=True)
    st.write(replace(s, ts=s.ts + 1))
    st.close()
    assert count(path) == 2


def _read_only_scenario(top: str) -> list[str]:
    """What a daemon sees as its file, then its directory, turn read-only and back."""
    d = os.path.join(top, "db")
    os.mkdir(d)
    p = os.path.join(d, "nvmon.db")
    s = healthy_sample()
    out = []
    with Store(p) as st:
        st.write(s)
    os.chmod(p, 0o444)  # the file read-only
    st = Store(p)
    for what in ("open", "write"):
        try:
            st.open() if what == "open" else st.write(replace(s, ts=s.ts + 1))
            out.append(f"{what} ok")
        except StoreError as e:
            out.append(f"{what}: {e}")
    os.chmod(p, 0o644)
    os.chmod(d, 0o555)  # the file writable, its directory not
    try:
        st.write(replace(s, ts=s.ts + 1))
        out.append("write ok")
    except StoreError as e:
        out.append(f"dir: {e}")
    os.chmod(d, 0o755)  # all writable again: the same object writes the backlog
    st.write_many([replace(s, ts=s.ts + 1), replace(s, ts=s.ts + 2)])
    out.append(f"ticks {st.query('SELECT count(*) AS n FROM ticks')[0]['n']}")
    st.close()
    out.append(f"files {sorted(os.listdir(d))}")
    return out


def _run_unprivileged(fn, *args) -> list[str]:
    """fn(*args) in a forked child; as user 65534 when we are root (root ignores permissions).
    Forked, not exec'd: the interpreter may live where that user cannot reach (/root)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(r)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
            text, code = "\n".join(fn(*args)), 0
        except BaseException as exc:
            text = f"ERROR {exc!r}"
        os.write(w, text.encode())
        os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    text = b"".join(chunks).decode()
    assert os.waitstatus_to_exitcode(status) == 0, text
    return text.splitlines()


def test_read_only_file_and_directory_then_writable_again():
    top = Path(tempfile.mkdtemp(prefix="nvmon-ro-"))
    try:
        top.chmod(0o777)
        lines = _run_unprivileged(_read_only_scenario, str(top))
        p = top / "db" / "nvmon.db"
        assert lines == [
            f"open: database {p}: no write permission on nvmon.db (EACCES)",
            f"write: database {p}: no write permission on nvmon.db (EACCES)",
            f"dir: database {p}: no write permission on directory {p.parent} (EACCES)",
            "ticks 3",
            "files ['nvmon.db']",  # closed cleanly: WAL checkpointed and removed
        ]
        assert integrity(p) == "ok"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_missing_directory_is_one_line(tmp_path):
    path = tmp_path / "nope" / "nvmon.db"
    with pytest.raises(StoreError) as e:
        Store(path).open()
    assert str(e.value) == f"database {path}: directory {path.parent} does not exist (ENOENT)"
    path.parent.mkdir()
    st = Store(path)
    st.write(healthy_sample())  # a write opens on demand once the directory exists
    st.close()
    assert count(path) == 1


_WRITER = textwrap.dedent(r"""
    import sys
    from dataclasses import replace
    from samplefactory import healthy_sample
    from nvmon.store import Store
    st = Store(sys.argv[1]); st.open()
    s = healthy_sample()
    i = int(sys.argv[2])
    while True:
        st.write(replace(s, ts=s.ts + i))
        i += 1
        if i % 50 == 0:
            st.maintain(s.ts + i)
        print(i, flush=True)
""")


def test_kill_9_while_writing_loses_at_most_the_last_tick(tmp_path):
    path = tmp_path / "nvmon.db"
    rng = random.Random(7)
    done = 0
    for round_ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(done)], env=ENV,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        target = done + 60 + rng.randrange(60)
        reported = done
        try:
            for line in proc.stdout:
                reported = int(line)
                if reported >= target:
                    time.sleep(rng.random() * 0.003)  # somewhere inside a later write
                    os.kill(proc.pid, signal.SIGKILL)
                    break
        finally:
            proc.kill()
            rest = proc.stdout.read()
            proc.wait()
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
        reported = max([reported, *(int(x) for x in rest.split())])
        assert integrity(path) == "ok"
        n = count(path)
        assert reported <= n <= reported + 1, (round_, reported, n)
        assert count(path, "gpu_ticks") == count(path, "ib_ticks") == 8 * n  # whole ticks only
        done = n
    with Store(path) as st:  # and the file opens and takes writes again
        st.write(replace(healthy_sample(), ts=healthy_sample().ts + done))
    assert count(path) == done + 1
