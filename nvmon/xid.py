"""Xid numbers: what they mean, how severe they are for a node, and the first thing to do.

Meanings are NVIDIA's names from the Xid error listing (docs.nvidia.com/deploy/xid-errors, "Xid
error listing"; the Ampere+ catalog is docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html).
NVML reports an Xid it cannot identify as 999 (nvml.h, nvmlEventTypeXidCriticalError).

Severity for paging: "critical" where NVIDIA's guidance is to drain, reset the GPU or reboot now
(or the GPU is gone); "warning" for the rest, including the Xids NVIDIA says may wait for a
convenient reset (63 without 48, 94 contained ECC, 92 high single-bit ECC rate) and the ones usually
caused by the application (13, 31, 43, 45).
"""

from __future__ import annotations

from dataclasses import dataclass

# Xid → (meaning, severity, first action). Unlisted Xids are "warning" with a generic action.
XIDS: dict[int, tuple[str, str, str]] = {
    13: ("Graphics Engine Exception", "warning",
         "usually the application (illegal memory access): check the job; if it follows the GPU, not the "
         "job, run dcgmi diag -r 3"),
    31: ("GPU memory page fault", "warning",
         "usually the application (illegal address): check the job; if it follows the GPU, run dcgmi diag"),
    43: ("GPU stopped processing", "warning", "usually the application: check the job that was running"),
    45: ("Preemptive cleanup, due to previous errors", "warning",
         "informational: channels torn down after another error; look for the Xid before it"),
    48: ("Double Bit ECC Error", "critical",
         "drain the node; if Xid 63/64 follow, reset the GPU (nvidia-smi -r), else run field diagnostics; "
         "RMA if it repeats"),
    61: ("Internal micro-controller breakpoint/warning", "critical",
         "drain, reset the GPU (nvidia-smi -r) and report to NVIDIA (nvidia-bug-report.sh)"),
    62: ("Internal micro-controller halt", "critical",
         "drain, reset the GPU (nvidia-smi -r) and report to NVIDIA (nvidia-bug-report.sh); check cooling"),
    63: ("ECC page retirement or row remapping recording event", "warning",
         "reset the GPU or reboot at a convenient time to activate the remap; drain now if Xid 48 came too"),
    64: ("ECC page retirement or row remapper recording failure", "critical",
         "drain and reset the GPU (or reboot) now: the remap could not be recorded; RMA if it repeats"),
    74: ("NVLINK Error", "critical",
         "check nvidia-smi nvlink -e and the fabric manager log; reset the GPU; reseat the GPU/baseboard "
         "if it repeats on the same link"),
    79: ("GPU has fallen off the bus", "critical",
         "GPU fell off the bus: drain the node, check power and thermals (PSUs, cables, inlet temperature), "
         "reseat the GPU; RMA if it repeats"),
    92: ("High single-bit ECC error rate", "warning",
         "run field diagnostics (dcgmi diag -r 3); RMA per NVIDIA's guidelines if it persists"),
    94: ("Contained ECC error", "warning",
         "restart the application that hit it; reset the GPU at a convenient time to activate the row remap"),
    95: ("Uncontained ECC error", "critical",
         "drain and reboot the node (with MIG: reset the GPU after draining its instances); RMA if it repeats"),
    119: ("GSP RPC Timeout", "critical",
          "drain, reset the GPU or reboot; update the driver and report to NVIDIA if it repeats"),
    120: ("GSP Error", "critical",
          "drain, reset the GPU or reboot; update the driver and report to NVIDIA if it repeats"),
    999: ("unknown Xid (NVML could not identify it)", "warning",
          "read the kernel log: dmesg | grep -i xid"),
}

CRITICAL = frozenset(x for x, (_, sev, _) in XIDS.items() if sev == "critical")


def meaning(xid: int) -> str:
    return XIDS[xid][0] if xid in XIDS else "see NVIDIA's Xid catalog"


def severity(xid: int) -> str:
    return XIDS[xid][1] if xid in XIDS else "warning"


def action(xid: int) -> str:
    if xid in XIDS:
        return XIDS[xid][2]
    return "look it up in NVIDIA's Xid catalog; dmesg | grep -i xid; run dcgmi diag -r 3 if it repeats"


@dataclass(frozen=True, slots=True)
class LoggedXid:
    """An Xid the driver wrote to the kernel log (nvmon.collect.kmsg), before NVML could deliver it."""

    bus_id: str  # as the log names the GPU, normalized: "0000:18:00" (domain:bus:device, lower case)
    xid: int
    age_s: float  # how long before the log was read
    text: str  # the rest of the line (pid, process name, the driver's words), shortened
