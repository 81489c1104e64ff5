"""Hand-built `Sample`s for audit and render tests: a healthy board plus small edits for faults.

`healthy_sample()` is a busy 8×H100 SXM HGX node (18 NVLinks per GPU to NVSwitch, Gen5 x16,
8 × 400G NDR IB). Its knobs make the other boards (bridged PCIe pairs, H800, unknown models);
`with_gpu` / `with_link` / `with_pcie` / `with_ib` return a copy with one part changed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nvmon.model import (
    IB_ERROR_KINDS,
    NVLINK_ERROR_KINDS,
    GpuSample,
    HostSample,
    IbPortSample,
    NvLinkSample,
    NvmlStatus,
    PciDeviceLink,
    PcieLink,
    Sample,
    Topology,
)
from nvmon.specs import gpu_spec_for

H100 = "NVIDIA H100 80GB HBM3"
H100_PCIE = "NVIDIA H100 PCIe"
H800 = "NVIDIA H800"


def _zeros(kinds: tuple[str, ...]) -> dict[str, int | None]:
    return {k: 0 for k in kinds}


def make_links(slots: int, active: int, version: int | None, speed: int | None, remote: str,
               busy: bool) -> tuple[NvLinkSample, ...]:
    per_link = 20e9 if busy else 0.0
    return tuple(
        NvLinkSample(
            link=n, active=n < active, version=version if n < active else None,
            speed_mbps=speed if n < active else None, remote_type=remote if n < active else None,
            tx_bytes_per_s=per_link if n < active else 0.0, rx_bytes_per_s=per_link if n < active else 0.0,
            errors=_zeros(NVLINK_ERROR_KINDS), errors_delta=_zeros(NVLINK_ERROR_KINDS),
        )
        for n in range(slots)
    )


def nvswitch_matrix(n: int, links: int) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple("X" if i == j else f"NV{links}" for j in range(n)) for i in range(n))


def pairs_matrix(n: int, links: int) -> tuple[tuple[str, ...], ...]:
    def cell(i: int, j: int) -> str:
        if i == j:
            return "X"
        if i // 2 == j // 2:
            return f"NV{links}"
        return "NODE" if i * 2 // n == j * 2 // n else "SYS"

    return tuple(tuple(cell(i, j) for j in range(n)) for i in range(n))


def healthy_sample(
    n_gpus: int = 8,
    name: str = H100,
    *,
    slots: int | None = None,
    active_links: int | None = None,
    board: str | None = None,
    busy: bool = True,
    ib_ports: int = 8,
    ib_rate: float = 400.0,
    power_limit_w: float | None = None,
    pcie_gen: int | None = None,
    nvml_available: bool = True,
) -> Sample:
    """A healthy node of `n_gpus` × `name`; unspecified values come from the model's spec."""
    spec = gpu_spec_for(name)
    links = active_links if active_links is not None else (spec.nvlink_links if spec else 0)
    slots = slots if slots is not None else links
    board = board or (spec.board if spec else "none")
    limit = power_limit_w or (spec.power_limit_w if spec else 300.0)
    gen = pcie_gen or (spec.pcie_gen if spec else 4)
    remote = "nvswitch" if board == "nvswitch" else "gpu"
    gpus = tuple(
        GpuSample(
            index=i, name=name, uuid=f"GPU-{i:08d}-0000", serial=f"16520000{i}",
            pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            power_w=0.7 * limit if busy else 0.12 * limit, power_limit_w=limit,
            power_default_limit_w=limit, power_max_limit_w=limit, energy_j=1e6,
            temperature_c=65.0 if busy else 35.0, utilization_pct=95.0 if busy else 0.0,
            throttle_reasons=() if busy else ("gpu_idle",),
            pcie=PcieLink(gen=gen if busy else 1, max_gen=gen, width=16, max_width=16, device_max_gen=gen,
                          tx_bytes_per_s=5e9 if busy else 1e6, rx_bytes_per_s=5e9 if busy else 1e6,
                          replay_errors=0, replay_errors_delta=0),
            nvlink=make_links(slots, links, spec.nvlink_version if spec else None,
                              spec.nvlink_link_mbps if spec else None, remote, busy),
            nvlink_count=slots,
            values={"sm_clock_hz": 1_980_000_000 if busy else 345_000_000, "sm_clock_max_hz": 1_980_000_000,
                    "mem_clock_hz": 2_619_000_000, "mem_clock_max_hz": 2_619_000_000,
                    "fb_used_bytes": (70_000 if busy else 4) * 2**20,
                    "fb_free_bytes": (81_559 - 531 - (70_000 if busy else 4)) * 2**20,
                    "fb_total_bytes": 81_559 * 2**20, "memory_temperature_c": 69.0 if busy else 38.0,
                    "mem_copy_util_pct": 47 if busy else 0},
        )
        for i in range(n_gpus)
    )
    if board == "nvswitch":
        topo = Topology("nvswitch", nvswitch_matrix(n_gpus, links), (links,) * n_gpus)
    elif board == "pairs":
        topo = Topology("pairs", pairs_matrix(n_gpus, links), (0,) * n_gpus)
    else:
        topo = Topology(board, pairs_matrix(n_gpus, 0), (0,) * n_gpus)
    ib = tuple(
        IbPortSample(
            device=f"mlx5_{k}", port=1, state="ACTIVE", phys_state="LinkUp", rate_gbps=ib_rate,
            rate_name="NDR" if ib_rate == 400 else "HDR" if ib_rate == 200 else None,
            link_layer="InfiniBand", tx_bytes_per_s=10e9, rx_bytes_per_s=10e9,
            errors=_zeros(IB_ERROR_KINDS), errors_delta=_zeros(IB_ERROR_KINDS),
            pcie=PcieLink(gen=5, max_gen=5, width=16, max_width=16), pci_bus_id=f"0000:{0x19 + 0x10 * k:02x}:00.0",
        )
        for k in range(ib_ports)
    )
    switches = tuple(
        PciDeviceLink(f"0000:{0x05 + s:02x}:00.0", "nvswitch", PcieLink(gen=4, max_gen=4, width=2, max_width=2))
        for s in range(4 if board == "nvswitch" else 0)
    )
    nvml = (NvmlStatus(True, driver_version="550.54.15", nvml_version="12.550.54.15") if nvml_available
            else NvmlStatus(False, error="NVML Shared Library Not Found"))
    return Sample(
        node="gpu-node-01", ts=1_714_564_800.0, interval_s=1.0,
        gpus=gpus if nvml_available else (), topology=topo if nvml_available else Topology("unknown"),
        ib=ib, host=HostSample(hostname="gpu-node-01", kernel="6.5.0", cpu_pct=12.0, mem_used_pct=30.0),
        nvml=nvml, nvswitches=switches,
    )


def with_gpu(sample: Sample, index: int, **changes: Any) -> Sample:
    gpus = tuple(replace(g, **changes) if g.index == index else g for g in sample.gpus)
    return replace(sample, gpus=gpus)


def with_pcie(sample: Sample, index: int, **changes: Any) -> Sample:
    gpu = sample.gpus[index]
    return with_gpu(sample, index, pcie=replace(gpu.pcie, **changes))


def with_link(sample: Sample, index: int, link: int, **changes: Any) -> Sample:
    gpu = sample.gpus[index]
    links = tuple(replace(ln, **changes) if ln.link == link else ln for ln in gpu.nvlink)
    return with_gpu(sample, index, nvlink=links)


def with_ib(sample: Sample, k: int, **changes: Any) -> Sample:
    ib = tuple(replace(p, **changes) if n == k else p for n, p in enumerate(sample.ib))
    return replace(sample, ib=ib)
