"""Board profiles for the hardware simulator: what a real box of each kind looks like to NVML and sysfs.

Numbers come from `nvmon.specs` (one place, with sources); this module only adds what a simulated
box needs beyond the spec: NVML names and PCI ids, bus ids, switch count, IB HCAs.
"""

from __future__ import annotations

from dataclasses import dataclass


# Typical HGX bus numbers for the 8 GPUs and the 8 compute HCAs (one per GPU, same PCIe switch).
_GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_HCA_BUSES = (0x1A, 0x2C, 0x3C, 0x5F, 0x9C, 0xAD, 0xBC, 0xDD)
_SWITCH_BUSES = (0xC1, 0xC2, 0xC3, 0xC4, 0xC5, 0xC6)


@dataclass(frozen=True, slots=True)
class BoardProfile:
    key: str
    description: str
    gpu_name: str  # as nvmlDeviceGetName returns it
    pci_device_id: int  # device<<16 | vendor
    gpus: int
    link_slots: int  # NVML_FI_DEV_NVLINK_LINK_COUNT
    links_used: int  # links wired by design (≤ slots)
    nvlink_gen: int | None
    link_mbps: int | None
    fabric: str  # "nvswitch" | "pairs" | "none"
    switches: int
    switch_sentinel: bool  # switch links report FFFFFFFF:FF:FF.0 instead of the switch's bus id
    power_limit_w: int
    power_min_w: int
    power_max_w: int
    pcie_gen: int  # host/slot max
    gpu_pcie_gen: int  # what the GPU itself supports
    pcie_width: int
    ib_ports: int
    ib_rate_gbps: int
    driver: str = "550.54.15"
    nvml_version: str = "12.550.54.15"
    # nvmlDeviceGetMaxClockInfo (MHz) and nvmlDeviceGetMemoryInfo().total (MiB), as nvidia-smi -q
    # shows them for the model ("Max Clocks", "FB Memory Usage").
    sm_clock_max_mhz: int = 1980
    mem_clock_max_mhz: int = 2619
    fb_total_mib: int = 81559

    def gpu_bus_id(self, i: int) -> str:
        """NVML form: 8-hex-digit domain, upper case."""
        return f"00000000:{_GPU_BUSES[i % 8] + (i // 8) * 0x40 & 0xFF:02X}:00.0"

    def hca_bdf(self, i: int) -> str:
        """sysfs form: 4-digit domain, lower case."""
        return f"0000:{_HCA_BUSES[i % 8] + (i // 8) * 0x40 & 0xFF:02x}:00.0"

    def switch_bdf(self, s: int) -> str:
        return f"0000:{_SWITCH_BUSES[s % len(_SWITCH_BUSES)]:02x}:00.0"


def _p(**kw) -> BoardProfile:
    return BoardProfile(**kw)


PROFILES: dict[str, BoardProfile] = {
    p.key: p
    for p in (
        _p(key="hgx-a100", description="HGX A100 80GB: 8 SXM4 GPUs, 6 NVSwitches, NV12 all-to-all, 8×HDR",
           gpu_name="NVIDIA A100-SXM4-80GB", pci_device_id=0x20B210DE, gpus=8, link_slots=12, links_used=12,
           nvlink_gen=3, link_mbps=25000, fabric="nvswitch", switches=6, switch_sentinel=False,
           power_limit_w=400, power_min_w=100, power_max_w=400, pcie_gen=4, gpu_pcie_gen=4, pcie_width=16,
           ib_ports=8, ib_rate_gbps=200,
           sm_clock_max_mhz=1410, mem_clock_max_mhz=1593, fb_total_mib=81920),
        _p(key="hgx-a800", description="HGX A800 80GB: 8 SXM4 GPUs, NV8 all-to-all (400 GB/s), 4×HDR",
           gpu_name="NVIDIA A800-SXM4-80GB", pci_device_id=0x20F310DE, gpus=8, link_slots=8, links_used=8,
           nvlink_gen=3, link_mbps=25000, fabric="nvswitch", switches=6, switch_sentinel=False,
           power_limit_w=400, power_min_w=100, power_max_w=400, pcie_gen=4, gpu_pcie_gen=4, pcie_width=16,
           ib_ports=4, ib_rate_gbps=200,
           sm_clock_max_mhz=1410, mem_clock_max_mhz=1593, fb_total_mib=81920),
        _p(key="hgx-h100", description="HGX H100 80GB: 8 SXM5 GPUs, 4 NVSwitches, NV18 all-to-all, 8×NDR",
           gpu_name="NVIDIA H100 80GB HBM3", pci_device_id=0x233010DE, gpus=8, link_slots=18, links_used=18,
           nvlink_gen=4, link_mbps=26562, fabric="nvswitch", switches=4, switch_sentinel=False,
           power_limit_w=700, power_min_w=200, power_max_w=700, pcie_gen=5, gpu_pcie_gen=5, pcie_width=16,
           ib_ports=8, ib_rate_gbps=400),
        _p(key="hgx-h800", description="HGX H800 80GB: 8 SXM5 GPUs, NV8 all-to-all, 8×NDR",
           gpu_name="NVIDIA H800", pci_device_id=0x232410DE, gpus=8, link_slots=8, links_used=8,
           nvlink_gen=4, link_mbps=26562, fabric="nvswitch", switches=4, switch_sentinel=False,
           power_limit_w=700, power_min_w=200, power_max_w=700, pcie_gen=5, gpu_pcie_gen=5, pcie_width=16,
           ib_ports=8, ib_rate_gbps=400),
        _p(key="hgx-h200", description="HGX H200 141GB: 8 SXM GPUs, 4 NVSwitches, NV18 all-to-all, 8×NDR",
           gpu_name="NVIDIA H200", pci_device_id=0x233510DE, gpus=8, link_slots=18, links_used=18,
           nvlink_gen=4, link_mbps=26562, fabric="nvswitch", switches=4, switch_sentinel=False,
           power_limit_w=700, power_min_w=200, power_max_w=700, pcie_gen=5, gpu_pcie_gen=5, pcie_width=16,
           ib_ports=8, ib_rate_gbps=400,
           sm_clock_max_mhz=1980, mem_clock_max_mhz=3201, fb_total_mib=143771),
        _p(key="hgx-b200", description="HGX B200: 8 GPUs, 2 NVLink switch chips, NV18 (NVLink5), 8×NDR",
           gpu_name="NVIDIA B200", pci_device_id=0x290110DE, gpus=8, link_slots=18, links_used=18,
           nvlink_gen=5, link_mbps=53125, fabric="nvswitch", switches=2, switch_sentinel=True,
           # Limits 1000 W (min 200, max 1000) and the GPU's own PCIe max Gen5, as a real HGX B200
           # reports them (shared/hardware/qx-b200.xml, driver 580.105.08; tests/test_sim_vs_captures.py).
           power_limit_w=1000, power_min_w=200, power_max_w=1000, pcie_gen=5, gpu_pcie_gen=5, pcie_width=16,
           ib_ports=8, ib_rate_gbps=400, driver="570.124.06", nvml_version="12.570.124.06",
           sm_clock_max_mhz=1965, mem_clock_max_mhz=3996, fb_total_mib=183359),
        _p(key="pairs-a100", description="'fake 8-card NVLink': 8 A100 PCIe cards bridged in 4 pairs (NV12), 2×HDR",
           gpu_name="NVIDIA A100 80GB PCIe", pci_device_id=0x20B510DE, gpus=8, link_slots=12, links_used=12,
           nvlink_gen=3, link_mbps=25000, fabric="pairs", switches=0, switch_sentinel=False,
           power_limit_w=300, power_min_w=150, power_max_w=300, pcie_gen=4, gpu_pcie_gen=4, pcie_width=16,
           ib_ports=2, ib_rate_gbps=200,
           sm_clock_max_mhz=1410, mem_clock_max_mhz=1512, fb_total_mib=81920),
        # One H200 NVL PCIe card without an NVLink bridge (the card takes 2- or 4-way bridges): NVML
        # name and PCI id 0x233B as pci.ids has them, 143771 MiB, 600 W limit, SM max 1785 MHz (real
        # nvidia-smi / CUDA reports of "NVIDIA H200 NVL"); the min limit (200 W) and memory clock are
        # the SXM H200's (no NVL capture). Its 18 NVLinks are there but unused (no bridge), and with
        # no NVSwitch the GPU fabric answers Not Supported.
        _p(key="h200-single", description="one H200 NVL PCIe card, no NVLink bridge (fabric Not Supported), 1×NDR",
           gpu_name="NVIDIA H200 NVL", pci_device_id=0x233B10DE, gpus=1, link_slots=18, links_used=0,
           nvlink_gen=4, link_mbps=26562, fabric="none", switches=0, switch_sentinel=False,
           power_limit_w=600, power_min_w=200, power_max_w=600, pcie_gen=5, gpu_pcie_gen=5, pcie_width=16,
           ib_ports=1, ib_rate_gbps=400, driver="570.124.06", nvml_version="12.570.124.06",
           sm_clock_max_mhz=1785, mem_clock_max_mhz=3201, fb_total_mib=143771),
        _p(key="pcie-l40s", description="PCIe-only box: 8 L40S, no NVLink, 2×HDR",
           gpu_name="NVIDIA L40S", pci_device_id=0x26B910DE, gpus=8, link_slots=0, links_used=0,
           nvlink_gen=None, link_mbps=None, fabric="none", switches=0, switch_sentinel=False,
           power_limit_w=350, power_min_w=100, power_max_w=350, pcie_gen=4, gpu_pcie_gen=4, pcie_width=16,
           ib_ports=2, ib_rate_gbps=200,
           sm_clock_max_mhz=2520, mem_clock_max_mhz=9001, fb_total_mib=46068),
    )
}
