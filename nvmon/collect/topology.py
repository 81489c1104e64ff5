"""GPU×GPU NVLink topology from each link's remote end, as `nvidia-smi topo -m` shows it.

Direct GPU↔GPU links count toward the pair they join (bridged cards: NV4, NV12). Links whose remote
end is an NVSwitch join a GPU to every other GPU with switch links: the pair shows
NV<min(active switch links of the two)>, so an HGX H100 shows NV18 everywhere — and a GPU that lost
a few links shows fewer. Pairs without NVLink show NODE/SYS by NUMA node when known, else PCI.
"""

from __future__ import annotations

from collections.abc import Sequence

from nvmon.model import GpuSample, Topology


def _norm(bus_id: str | None) -> str | None:
    """Compare NVML (00000000:18:00.0) and shorter forms alike: domain as an int, rest upper case."""
    if not bus_id or ":" not in bus_id:
        return None
    dom, rest = bus_id.split(":", 1)
    try:
        return f"{int(dom, 16)}:{rest.upper()}"
    except ValueError:
        return None


def build_topology(gpus: Sequence[GpuSample], numa: Sequence[int | None] | None = None) -> Topology:
    """Matrix and board class from the GPUs' NVLink samples. `numa[i]`: NUMA node of GPU i or None."""
    n = len(gpus)
    if n == 0:
        return Topology(class_="none")
    by_bus = {_norm(g.pci_bus_id): i for i, g in enumerate(gpus) if _norm(g.pci_bus_id)}
    direct = [[0] * n for _ in range(n)]
    switch_links = [0] * n
    dangling = [0] * n  # active direct links to a GPU we cannot see (lost before we read its bus id)
    known = [not g.lost for g in gpus]
    for i, g in enumerate(gpus):
        for link in g.nvlink:
            if not link.active:
                continue
            if link.remote_type == "nvswitch":
                switch_links[i] += 1
            elif link.remote_type in ("gpu", None):
                j = by_bus.get(_norm(link.remote_pci_bus_id))
                if j is not None and j != i:
                    direct[i][j] += 1
                elif link.remote_type == "gpu":
                    dangling[i] += 1
    matrix = []
    connected = [[False] * n for _ in range(n)]
    for i in range(n):
        row = []
        for j in range(n):
            if i == j:
                row.append("X")
                continue
            if gpus[i].lost or gpus[j].lost:
                row.append("?")  # a lost GPU's links cannot be read
                continue
            links = max(direct[i][j], direct[j][i])
            if switch_links[i] and switch_links[j]:
                links += min(switch_links[i], switch_links[j])
            if links:
                connected[i][j] = True
                row.append(f"NV{links}")
            elif numa is not None and numa[i] is not None and numa[j] is not None:
                row.append("NODE" if numa[i] == numa[j] else "SYS")
            else:
                row.append("PCI")
        matrix.append(tuple(row))
    return Topology(class_=_classify(n, connected, switch_links, dangling, known),
                    matrix=tuple(matrix), nvswitch_links=tuple(switch_links))


def _classify(n, connected, switch_links, dangling, known) -> str:
    """Board class over the GPUs that answer: a lost GPU is reported on its own (gpu.lost), and
    must not turn an all-to-all board into "partial" as well."""
    live = [i for i in range(n) if known[i]]
    # A GPU whose only NVLink peer is lost is judged with that peer, i.e. not at all.
    live = [i for i in live if not (dangling[i] and not any(connected[i][j] for j in live if j != i))]
    if not live:
        return "unknown"
    pairs = [(i, j) for a, i in enumerate(live) for j in live[a + 1:]]
    if not any(connected[i][j] for i, j in pairs):
        return "none"
    if all(connected[i][j] for i, j in pairs):
        return "nvswitch" if any(switch_links[i] for i in live) else "mesh"
    partners = {i: [j for j in live if j != i and connected[i][j]] for i in live}
    if len(live) % 2 == 0 and all(len(p) == 1 and partners[p[0]] == [i] for i, p in partners.items()):
        return "pairs"
    return "partial"
