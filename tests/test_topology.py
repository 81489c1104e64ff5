"""Board class and `nvidia-smi topo -m` matrix from the GPUs' NVLink remote ends."""

from __future__ import annotations

from nvmon.collect.topology import build_topology
from nvmon.model import GpuSample, NvLinkSample


def bus(i: int) -> str:
    return f"00000000:{0x18 + i:02X}:00.0"


def gpu(i: int, links: list[tuple[str, int | None]], *, lost: bool = False, down: set[int] = frozenset()) -> GpuSample:
    """links: (remote_type, peer index or switch) per link."""
    nvl = tuple(
        NvLinkSample(link=k, active=k not in down, remote_type=rt,
                     remote_pci_bus_id=bus(peer) if rt == "gpu" else None)
        for k, (rt, peer) in enumerate(links)
    )
    if lost:
        return GpuSample(index=i, pci_bus_id=None, lost=True)
    return GpuSample(index=i, pci_bus_id=bus(i), nvlink=nvl, nvlink_count=len(nvl))


def test_nvswitch_all_to_all_counts_min_switch_links():
    gpus = [gpu(i, [("nvswitch", 0)] * 18, down={5} if i == 2 else set()) for i in range(8)]
    t = build_topology(gpus)
    assert t.class_ == "nvswitch"
    assert t.matrix[0][1] == "NV18" and t.matrix[0][2] == "NV17" and t.matrix[3][3] == "X"
    assert t.nvswitch_links == (18, 18, 17, 18, 18, 18, 18, 18)


def test_bridged_pairs_are_pairs_and_others_show_numa():
    gpus = [gpu(i, [("gpu", i ^ 1)] * 4) for i in range(8)]
    t = build_topology(gpus, numa=[0, 0, 0, 0, 1, 1, 1, 1])
    assert t.class_ == "pairs"
    assert t.matrix[0][1] == "NV4" and t.matrix[0][2] == "NODE" and t.matrix[0][5] == "SYS"
    assert build_topology(gpus).matrix[0][2] == "PCI"  # NUMA unknown


def test_direct_full_mesh_is_mesh():
    gpus = [gpu(i, [("gpu", j) for j in range(4) if j != i]) for i in range(4)]
    assert build_topology(gpus).class_ == "mesh"


def test_no_links_is_none_and_partial_otherwise():
    assert build_topology([gpu(i, []) for i in range(8)]).class_ == "none"
    gpus = [gpu(i, [("gpu", 1 - i)] if i < 2 else []) for i in range(4)]
    assert build_topology(gpus).class_ == "partial"


def test_a_dead_bridge_breaks_the_pair():
    gpus = [gpu(i, [("gpu", i ^ 1)] * 4, down={0, 1, 2, 3} if i in (2, 3) else set()) for i in range(8)]
    assert build_topology(gpus).class_ == "partial"


def test_lost_gpu_is_left_out_of_the_class():
    gpus = [gpu(i, [("nvswitch", 0)] * 18, lost=(i == 6)) for i in range(8)]
    t = build_topology(gpus)
    assert t.class_ == "nvswitch" and t.matrix[6][0] == "?" and t.matrix[0][6] == "?"
    pairs = [gpu(i, [("gpu", i ^ 1)] * 12, lost=(i == 5)) for i in range(8)]
    assert build_topology(pairs).class_ == "pairs"  # GPU 4's partner is lost, not its bridge
    assert build_topology([gpu(0, [], lost=True)]).class_ == "unknown"
    assert build_topology([]).class_ == "none"
