"""Expected hardware specs, as data, with sources.

A GPU is judged by the spec of its own SKU: an H800 with 8 NVLinks or a bridged H100 PCIe card with
12 active links of 18 is healthy at that count. A model not listed here is `unknown`, never guessed.

Sources (details in ../shared/NVML-FACTS.md §5 and DESIGN.md "Hardware reference"):
  A100 SXM4: NVIDIA NVLink page (12 × NVLink3, 600 GB/s), TechPowerUp (400 W, PCIe 4.0 x16),
             real `nvidia-smi nvlink -s` on A100-SXM4-80GB (12 × 25 GB/s).
  A800 SXM4: tweakers.net/aiwiki (NVLink cut to 400 GB/s, 400 W); 8 links inferred from 400 GB/s.
  H100 SXM5: NVIDIA health-validation docs (18 links × 26562 MB/s), K8SMOCK profile (700 W, Gen5 x16).
  H800 SXM5: real `nvidia-smi -q` / `nvlink --status` capture (8 links, 700 W).
  H200 SXM:  real `nvidia-smi nvlink -s` (18 × 26.562 GB/s); 700 W (vendor page).
  H200 NVL:  PCIe card (pci.ids 0x233B "GH100 [H200 NVL]"), 600 W and Gen5 x16 as real reports show it;
             NVLink bridges optional, so its links are not counted (the board class is judged).
  B200:      Vultr docs, K8SMOCK b200 (18 × 53125 MB/s, 1000 W); PCIe Gen6-capable, HGX hosts run Gen5.
  H100 PCIe: real `nvidia-smi nvlink -s` (18 slots, 12 active with 3 bridges → NV12), 350 W.
  A100 PCIe: NV12 with 3 bridges (NVML-FACTS §5), 300 W (80GB card), PCIe 4.0 x16.
  L40S:      no NVLink; 350 W; PCIe 4.0 x16.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuSpec:
    key: str
    pattern: str  # regex matched (search, case-insensitive) against NVML's device name
    nvlink_links: int  # active links expected per GPU
    nvlink_version: int | None  # NVLink generation
    nvlink_link_mbps: int | None  # per link per direction as NVML reports it
    power_limit_w: float  # default (TDP) power limit
    pcie_gen: int  # expected PCIe generation under load
    pcie_width: int
    board: str  # expected topology class of a multi-GPU board: "nvswitch" | "pairs" | "none"
    source: str

    @property
    def nvlink_bytes_per_s_per_link(self) -> float | None:
        return None if self.nvlink_link_mbps is None else self.nvlink_link_mbps * 1e6


GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("A100-SXM", r"A100[- ]SXM", 12, 3, 25000, 400, 4, 16, "nvswitch", "NVIDIA NVLink page; TechPowerUp"),
    GpuSpec("A800-SXM", r"A800[- ]SXM", 8, 3, 25000, 400, 4, 16, "nvswitch", "tweakers.net aiwiki (400 GB/s)"),
    GpuSpec("A100-PCIe", r"A100.*PCIE", 12, 3, 25000, 300, 4, 16, "pairs", "NVML-FACTS §5 (NV12 bridges)"),
    GpuSpec("H100-PCIe", r"H100.*PCIE", 12, 4, 26562, 350, 5, 16, "pairs", "nvidia-smi nvlink -s capture, NV12"),
    GpuSpec("H100-SXM", r"H100", 18, 4, 26562, 700, 5, 16, "nvswitch", "NVIDIA health-validation; K8SMOCK h100"),
    GpuSpec("H800-SXM", r"H800", 8, 4, 26562, 700, 5, 16, "nvswitch", "real H800 nvidia-smi -q capture"),
    # Bridges are optional on the H200 NVL (none, 2- or 4-way): no link count is required of a card,
    # a bridged box is held to its board class ("pairs", or --expect-topology). Before "H200".
    GpuSpec("H200-NVL", r"H200 NVL", 0, 4, 26562, 600, 5, 16, "pairs",
            "nvidia-smi reports of 'NVIDIA H200 NVL' (600 W); vendor pages (PCIe Gen5 x16, 2-/4-way bridges)"),
    GpuSpec("H200-SXM", r"H200", 18, 4, 26562, 700, 5, 16, "nvswitch", "real H200 nvlink -s capture"),
    GpuSpec("B200", r"B200", 18, 5, 53125, 1000, 5, 16, "nvswitch", "Vultr docs; K8SMOCK b200"),
    GpuSpec("L40S", r"L40S", 0, None, None, 350, 4, 16, "none", "NVIDIA L40S datasheet"),
)


@functools.lru_cache(maxsize=256)  # a node has one or two model names; the audit asks per GPU per tick
def gpu_spec_for(name: str | None) -> GpuSpec | None:
    """The spec whose pattern matches an NVML device name, or None (unknown model)."""
    if not name:
        return None
    for spec in GPU_SPECS:
        if re.search(spec.pattern, name, re.IGNORECASE):
            return spec
    return None


def gpu_spec_by_key(key: str) -> GpuSpec | None:
    for spec in GPU_SPECS:
        if spec.key.lower() == key.lower():
            return spec
    return None


IB_RATE_NAMES = {  # 4X rates as the kernel prints them (NVML-FACTS §6)
    10.0: "SDR",
    20.0: "DDR",
    40.0: "QDR",
    56.0: "FDR",
    100.0: "EDR",
    200.0: "HDR",
    400.0: "NDR",
    800.0: "XDR",
}


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """What a node is expected to have, beyond its GPUs' own specs (flags/config)."""

    gpus: int | None = None  # expected GPU count
    ib_ports: int | None = None  # expected active compute IB ports
    ib_rate_gbps: float | None = None
    topology: str | None = None  # "nvswitch" | "pairs" | "mesh" | "none"; None: from the GPU spec


def parse_expect_ib(text: str) -> tuple[int, float]:
    """'8x200' → (8, 200.0). Raises ValueError with a one-line reason."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\d+(?:\.\d+)?)\s*(?:[gG](?:b/?s)?)?\s*", text)
    if not m:
        raise ValueError(f"{text!r}: expected PORTSxGBPS, e.g. 8x200")
    ports, rate = int(m.group(1)), float(m.group(2))
    if ports < 0 or ports > 64 or rate <= 0:
        raise ValueError(f"{text!r}: port count 0..64 and a positive rate, e.g. 8x200")
    return ports, rate
