"""Finding and alert codes: one severity order, and one severity and runbook per code.

A leaf of the package graph (it imports nothing of nvmon), so every layer shares these names: the
audit gives a finding its code's severity, the alert rules and `nvmon fleet` take the runbook from
here, the TUI shows the same runbook on its alerts screen, hooks and the wire sort and filter by
`Severity.rank`. Which condition a code stands for is decided in one place only: `nvmon.audit`
(node codes) and `nvmon.fleet.rules` (fleet codes).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Severity(StrEnum):
    """A finding's or alert's severity. A `str`, so JSON, SQLite and the wire see the plain word."""

    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """0 for the most severe: sorting by rank puts critical first."""
        return _RANK[self]

    @classmethod
    def rank_of(cls, value: str) -> int:
        """The rank of a severity word, unknown words last (they come off the wire)."""
        return _RANK.get(value, len(_RANK))  # type: ignore[call-overload]

    @classmethod
    def worst(cls, values) -> str | None:
        """The most severe of some severity words (None when there are none)."""
        return min(values, key=cls.rank_of, default=None)

    def at_least(self, other: str) -> bool:
        """True when this severity is `other` or more severe."""
        return self.rank <= Severity.rank_of(other)


SEVERITIES: tuple[Severity, ...] = tuple(Severity)  # most severe first: the one order
_RANK = {s: i for i, s in enumerate(SEVERITIES)} | {s.value: i for i, s in enumerate(SEVERITIES)}


@dataclass(frozen=True, slots=True)
class Code:
    """What a code means for on-call: its severity and what to do about it."""

    severity: Severity
    runbook: str  # may hold "{observed}", filled from the finding


_C, _W, _I = Severity.CRITICAL, Severity.WARNING, Severity.INFO

# Node codes: judged by `nvmon.audit`, one finding per GPU / link / port / HCA.
NODE_CODES: dict[str, Code] = {
    "nvml.unavailable": Code(_W, "Check the NVIDIA driver: nvidia-smi, dmesg | grep -i -e nvrm -e xid; reload the "
                                 "driver or reboot"),
    "gpu.count": Code(_C, "GPU missing: check seating and power cables, lspci | grep -i nvidia, dmesg for Xid 79"),
    "gpu.lost": Code(_C, "GPU fell off the bus: drain the node, check dmesg for Xid 79/48, reset the GPU "
                         "(nvidia-smi -r) or reboot; RMA if it recurs"),
    "gpu.model": Code(_I, "No spec for this GPU model: NVLink, PCIe and power are judged by generic rules only"),
    # The most severe an Xid can be; each finding carries its own Xid's severity (nvmon/xid.py).
    "gpu.xid": Code(_C, "Xid error: the alert's summary names the Xid; see NVIDIA's Xid catalog and "
                        "dmesg | grep -i xid"),
    "nvlink.link_down": Code(_C, "NVLink down: drain the node, check nvidia-smi nvlink -s and the fabric manager; "
                                 "reseat the GPU/baseboard (or the bridge on paired cards)"),
    # Critical against an expected board; a warning for an unexpected split (pairs) board.
    "nvlink.topology": Code(_C, "Board not wired all-to-all or not as its spec says: compare nvidia-smi topo -m "
                                "with the spec, check the fabric manager and NVSwitches; hold the vendor to the spec, "
                                "or state the board you bought with --expect-topology / [expect] topology"),
    "nvlink.board": Code(_I, "The board's NVLink topology, for the record"),
    "nvlink.speed": Code(_W, "NVLink trained below spec: check nvidia-smi nvlink -s, driver and firmware; reseat"),
    "nvlink.errors": Code(_W, "NVLink errors rising: check nvidia-smi nvlink -e; reset the GPU, reseat or replace "
                              "the GPU/bridge if it persists"),
    "pcie.width": Code(_W, "PCIe {observed}: reseat the card (GPU, HCA) or its riser, check BIOS bifurcation; "
                           "lspci -vv LnkSta"),
    "pcie.gen": Code(_W, "PCIe below its generation: check riser/retimer signal integrity and the BIOS "
                         "PCIe speed setting"),
    "pcie.replay": Code(_W, "PCIe replays rising: signal integrity; reseat the GPU or riser, check retimers and slot"),
    "power.limit": Code(_W, "Enforced power limit below spec: check nvidia-smi -q -d POWER and nvidia-smi -pl, "
                            "the PSUs and the rack power budget"),
    "power.cap": Code(_W, "GPU held at its power limit: check the enforced limit, PSUs and rack budget; "
                          "expected only briefly at peak load"),
    # HW slowdown (clocks cut by half or more) from the power-brake signal, or with no cause NVML names.
    "power.brake": Code(_C, "GPU clocks held down by HW slowdown / power brake (half speed or less): nvidia-smi -q -d "
                            "PERFORMANCE; the board's power-brake signal comes from power delivery: check the PSUs "
                            "and their cables, the BMC event log (ipmitool sel list) and the chassis power budget"),
    "thermal": Code(_W, "GPU thermal slowdown: check airflow, fans, inlet temperature and blanking panels"),
    # The NVSwitch fabric (nvmon.audit.fabric): one not-ready / status finding per node (Fabric
    # Manager serves the board), health per GPU with its field's severity (critical the most).
    "fabric.not_ready": Code(_C, "GPU fabric not configured: NVLink peer-to-peer is unusable although links read "
                                 "Active. systemctl status nvidia-fabricmanager (start it; its version must match "
                                 "the driver's), journalctl -u nvidia-fabricmanager, nvidia-smi -q | grep -A8 Fabric"),
    "fabric.status": Code(_C, "GPU fabric configured with an error: nvidia-smi -q | grep -A8 Fabric (Status), "
                              "journalctl -u nvidia-fabricmanager; restart Fabric Manager, reset the GPUs or reboot; "
                              "check NVSwitch and NVLink health (nvidia-smi nvlink -s)"),
    "fabric.health": Code(_C, "GPU fabric degraded: nvidia-smi -q | grep -A14 Fabric names the health field; "
                              "nvidia-smi nvlink -s -e, journalctl -u nvidia-fabricmanager; drain and reset the GPU "
                              "if route unhealthy or a misconfiguration persists"),
    "ib.port_down": Code(_C, "IB port down: check cable and transceiver, the switch port, ibstat and the subnet "
                             "manager"),
    "ib.rate": Code(_W, "IB port below the expected rate or in Ethernet mode: check cable/transceiver type (HDR vs "
                        "HDR100/EDR), switch port speed, ibstat; link type with mlxconfig"),
    "ib.errors": Code(_W, "IB errors rising: check perfquery, cable and transceiver; replace the cable if symbol "
                          "errors or link_downed keep rising"),
    "ib.count": Code(_W, "Fewer active IB ports than expected: check ibstat, HCAs, cables and the driver"),
}

# Fleet codes: judged by `nvmon.fleet.rules` from what the broker carries.
FLEET_CODES: dict[str, Code] = {
    "node.offline": Code(_C, "Node's daemon is gone: ping/ssh the host, check its BMC (power, console), "
                             "systemctl status nvmon-daemon, the network path to the broker"),
    "node.stale": Code(_W, "Node says online but sends no samples: journalctl -u nvmon-daemon (a hung NVML "
                           "call shows as a watchdog restart), nvidia-smi, the broker's ACL and load"),
    "rack.power": Code(_W, "Rack draws more than its budget: check which nodes run hot (nvmon tui), the PDU "
                           "readings, and lower GPU power limits (nvidia-smi -pl) or move jobs"),
    "fleet.same_fault": Code(_C, "Many nodes share one fault: look for the common cause first (switch, PDU, "
                                 "fabric manager, a driver or firmware rollout) before working node by node"),
    "fleet.feed_stalled": Code(_W, "No message from any node while the broker connection is up: check the "
                                   "broker (stopped, swapping, disk full, its log), then the network to the nodes"),
    # A whole cluster out of sight: its summary (nvmon/v1/<cluster>/@summary) stopped coming.
    "cluster.unreachable": Code(_C, "No summary from the cluster: check its bridge ($SYS/broker/connection/+/state "
                                    "on both brokers, the bridge's log lines in the cluster broker's log), the "
                                    "cluster's broker, and its nvmon fleet (systemctl status nvmon-fleet there); "
                                    "its own nvmon fleet still pages node faults through its hooks"),
}

# Daemon codes: what the node's daemon finds about itself (nvmon.store's guard), alerted by its rules.
DAEMON_CODES: dict[str, Code] = {
    "store.reset": Code(_W, "The node's database was deleted, replaced or found corrupt and a new one started (its "
                            "history is gone, or in <db>.corrupt-<time>: sqlite3 FILE .recover): journalctl -u "
                            "nvmon-daemon names the file; check the disk (dmesg, smartctl) and who touched it"),
}

CODES: dict[str, Code] = NODE_CODES | FLEET_CODES | DAEMON_CODES


def runbook(code: str, observed: object = None) -> str:
    """The runbook of `code` ("" for a code nvmon does not know, e.g. from a newer daemon)."""
    c = CODES.get(code)
    if c is None:
        return ""
    return c.runbook.format(observed=observed) if "{observed}" in c.runbook else c.runbook
