"""Kept-open sysfs attribute descriptors (nvmon/collect/attrfiles.py): re-read with pread, and
never trusted past a change to the files they were opened on."""

from __future__ import annotations

import os
import time

import pytest

from nvmon.collect import attrfiles
from nvmon.collect.attrfiles import AttrFiles
from nvmon.collect.sysfs import IB_ERROR_WIDTHS, IbCollector
from nvmon.sim import sysfs_tree as st


def aged(*dirs) -> None:
    """Back-date directories' mtimes, as a tree written long ago looks (real sysfs, a warm simulator)."""
    past = time.time() - 60
    for d in dirs:
        os.utime(d, (past, past))


@pytest.fixture
def opens(monkeypatch):
    calls = []
    real = os.open

    def counting(path, flags, *a, **kw):
        if not flags & (os.O_WRONLY | os.O_RDWR):  # reads only (the simulator writes too)
            calls.append(str(path))
        return real(path, flags, *a, **kw)

    monkeypatch.setattr(attrfiles.os, "open", counting)
    return calls


def test_descriptors_are_kept_and_see_in_place_updates(tmp_path, opens):
    f = tmp_path / "port_xmit_data"
    f.write_text("100\n")
    aged(tmp_path)
    files = AttrFiles()
    for value in (100, 2000, 7):  # written in place, shorter included: the same inode
        f.write_text(f"{value}\n")
        files.begin("p", [str(tmp_path)])
        assert files.read("p", str(f)) == f"{value}\n".encode()
    assert opens == [str(f)] and files.open_count == 1
    files.close()
    assert files.open_count == 0


@pytest.mark.parametrize("change", ["rename", "remove"])
def test_a_replaced_or_removed_file_is_never_read_through_its_old_descriptor(tmp_path, change):
    """Within the same tick of the file system's coarse clock as the opening, too."""
    f = tmp_path / "state"
    f.write_text("4: ACTIVE\n")
    files = AttrFiles()
    for _ in range(3):  # fresh tree: its mtime is too recent to trust, and it stays so here
        files.begin("p", [str(tmp_path)])
        assert files.read("p", str(f)) == b"4: ACTIVE\n"
    if change == "rename":
        (tmp_path / "tmp").write_text("1: DOWN\n")
        os.replace(tmp_path / "tmp", f)
    else:
        f.unlink()
    files.begin("p", [str(tmp_path)])
    if change == "rename":
        assert files.read("p", str(f)) == b"1: DOWN\n"
    else:
        with pytest.raises(FileNotFoundError):
            files.read("p", str(f))


def test_a_change_to_an_aged_directory_drops_the_descriptors(tmp_path, opens):
    f = tmp_path / "state"
    f.write_text("4: ACTIVE\n")
    aged(tmp_path)
    files = AttrFiles()
    files.begin("p", [str(tmp_path)])
    files.read("p", str(f))
    (tmp_path / "tmp").write_text("1: DOWN\n")
    os.replace(tmp_path / "tmp", f)  # the directory's mtime moves to now
    files.begin("p", [str(tmp_path)])
    assert files.read("p", str(f)) == b"1: DOWN\n" and opens == [str(f), str(f)]


def test_past_the_limit_files_are_opened_per_read(tmp_path):
    paths = []
    for i in range(5):
        (tmp_path / f"c{i}").write_text(f"{i}\n")
        paths.append(str(tmp_path / f"c{i}"))
    aged(tmp_path)
    files = AttrFiles(budget=attrfiles.FdBudget(share=1, cap=3))
    files.begin("p", [str(tmp_path)])
    assert [files.read("p", p) for p in paths] == [f"{i}\n".encode() for i in range(5)]
    assert files.open_count == 3


def test_ib_collector_keeps_port_files_open_and_closes_them(tmp_path, opens):
    st.write_pci_device(tmp_path, "0000:18:00.0", cur_gen=4, max_gen=4, cur_width=16, max_width=16)
    counters = dict.fromkeys(["port_xmit_data", "port_rcv_data", *IB_ERROR_WIDTHS], 0)
    st.write_ib_port(tmp_path, "mlx5_0", 1, bdf="0000:18:00.0", counters=counters)
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    aged(port, port / "counters")
    c = IbCollector(tmp_path)
    c.collect(1.0)
    opens[:] = [p for p in opens if p.startswith(str(port))]
    first = len(opens)
    assert first == 1 + 3 + 2 + len(IB_ERROR_WIDTHS) and c._files.open_count == first - 1
    # (link_layer is read once, by path; state, phys_state, rate and the counters are kept open)
    st.update_ib_counters(tmp_path, "mlx5_0", 1, {"port_xmit_data": 250_000_000})
    opens.clear()
    (p,) = c.collect(2.0)
    assert not [p for p in opens if p.startswith(str(port))] and p.tx_bytes_per_s == pytest.approx(1e9)
    c.close()
    assert c._files.open_count == 0


def test_a_process_wide_budget_bounds_the_descriptors_of_all_collectors(tmp_path):
    """`nvmon demo` runs up to 200 nodes in one process: together they keep at most the budget
    open, and the rest read by path; closing one hands its share back."""
    (tmp_path / "c").write_text("1\n")
    aged(tmp_path)
    budget = attrfiles.FdBudget(share=1, cap=3)
    many = [AttrFiles(budget=budget) for _ in range(5)]
    for f in many:
        f.begin("p", [str(tmp_path)])
        assert f.read("p", str(tmp_path / "c")) == b"1\n"
    assert [f.open_count for f in many] == [1, 1, 1, 0, 0] and budget.used == 3
    many[0].close()
    assert budget.used == 2
    many[4].begin("p", [str(tmp_path)])
    many[4].read("p", str(tmp_path / "c"))
    assert many[4].open_count == 1 and budget.used == 3


def test_simulated_counters_rewritten_in_place_through_kept_descriptors(tmp_path):
    budget = attrfiles.FdBudget(share=1, cap=1)
    files = st.OpenFiles(budget=budget)
    a, b = tmp_path / "a", tmp_path / "b"
    files.put(str(a), "9\n")
    files.put(str(b), "5\n")  # past the budget: written by path
    ino = a.stat().st_ino
    files.put(str(a), "10\n")  # longer: in place, same file
    assert a.read_text() == "10\n" and a.stat().st_ino == ino and budget.used == 1
    files.put(str(a), "0\n")  # a reset, shorter: replaced whole (a reader never sees "0\n\n")
    assert a.read_text() == "0\n" and a.stat().st_ino != ino and budget.used == 1
    files.put(str(b), "6\n")
    assert b.read_text() == "6\n"
    files.close()
    assert budget.used == 0
