"""The GPU fabric of an NVSwitch board: configured by Fabric Manager, and healthy.

When Fabric Manager is not running, every NVLink still reads Active and `nvidia-smi topo -m` still
shows NV18, but NVLink peer-to-peer is unusable: the fabric state (NVML, per GPU) is the only
sign. Three codes:

- `fabric.not_ready` (critical, one per node: Fabric Manager serves the whole board): a GPU's
  fabric state is not started / in progress on a board with NVSwitch links. The alert rules give
  it the start-up grace: the fabric completes some seconds after the driver loads.
- `fabric.status` (critical, one per node): completed, with an NVML error as its status (e.g.
  "Insufficient Resources", the clique-0 node that passed validation).
- `fabric.health` (per GPU, its severity from the worst field it names): the health summary
  unhealthy (critical) or limited capacity (warning), or a health-mask field set: route unhealthy,
  incorrect configuration (critical); degraded bandwidth, route recovery in progress,
  access-timeout recovery, global fabric manager disconnected (warning).

A GPU without a fabric (NotSupported: PCIe cards, NVLink bridges, A100 HGX) is never judged here.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from nvmon.audit.findings import Finding, _finding
from nvmon.codes import Severity
from nvmon.model import (FABRIC_INCORRECT_CONFIGURATION, FABRIC_STATES, GpuSample, Sample, fabric_flags,
                          fabric_health)

COMPLETED = 3
# nvmlReturn_t words as nvidia-smi prints a fabric status (nvml.h's nvmlErrorString).
NVML_RETURN_WORDS = {
    0: "Success", 1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 4: "Insufficient Permissions",
    6: "Not Found", 7: "Insufficient Size", 9: "Driver Not Loaded", 10: "Timeout", 12: "Library Not Found",
    15: "GPU is lost", 17: "Operating System", 19: "In use by another client", 20: "Insufficient Memory",
    21: "No data", 23: "Insufficient Resources", 999: "Unknown Error",
}
_STATE_WORDS = {"not_started": "Not Started", "in_progress": "In Progress", "completed": "Completed"}
_C, _W = Severity.CRITICAL, Severity.WARNING
# model.FABRIC_FLAGS → (severity, words) when set
_TROUBLE = {
    "unhealthy": (_C, "health summary Unhealthy"),
    "limited_capacity": (_W, "health summary Limited Capacity"),
    "route_unhealthy": (_C, "route unhealthy"),
    "incorrect_configuration": (_C, "incorrect configuration"),
    "degraded_bandwidth": (_W, "degraded bandwidth"),
    "route_recovery": (_W, "route recovery in progress"),
    "access_timeout_recovery": (_W, "access-timeout recovery"),
    "gfm_disconnected": (_W, "global fabric manager disconnected"),
}


ZERO_UUID = "00000000-0000-0000-0000-000000000000"  # an HGX board's: not in a multi-node NVLink domain


class FabricDomain(NamedTuple):
    """The node's NVLink domain as its GPUs' fabric reports it (the inventory's `fabric`)."""

    cluster_uuid: str | None  # None: no GPU reported one
    clique_id: int | None

    def as_dict(self) -> dict | None:
        """The wire inventory's `fabric` block; None where no GPU reported a fabric."""
        if self.cluster_uuid is None and self.clique_id is None:
            return None
        return {"cluster_uuid": self.cluster_uuid, "clique_id": self.clique_id}

    @property
    def multi_node(self) -> bool:
        """True in an NVL72-class domain: a cluster UUID that is not all zeros (nodes group by it)."""
        return self.cluster_uuid is not None and self.cluster_uuid != ZERO_UUID


def fabric_domain(sample: Sample) -> FabricDomain:
    """The cluster UUID and clique id most of the node's GPUs report (all do on a healthy node)."""
    uuids = Counter(g.fabric.cluster_uuid for g in sample.gpus if g.fabric.cluster_uuid is not None)
    cliques = Counter(g.fabric.clique_id for g in sample.gpus if g.fabric.clique_id is not None)
    return FabricDomain(uuids.most_common(1)[0][0] if uuids else None,
                        cliques.most_common(1)[0][0] if cliques else None)


def status_words(code: int | None) -> str:
    return "?" if code is None else f"{NVML_RETURN_WORDS.get(code, 'NVML error')} ({code})"


def _gpu_list(gpus: list[GpuSample]) -> str:
    idx = [g.index for g in gpus]
    if len(idx) > 2 and idx == list(range(idx[0], idx[-1] + 1)):
        return f"GPUs {idx[0]}-{idx[-1]}"
    return ("GPU " if len(idx) == 1 else "GPUs ") + ", ".join(map(str, idx))


def _switched(sample: Sample) -> bool:
    """Whether the board's GPUs reach each other through NVSwitches (links read, or the topology)."""
    return (sample.topology.class_ == "nvswitch" or any(sample.topology.nvswitch_links)
            or any(lk.remote_type == "nvswitch" for g in sample.gpus for lk in g.nvlink))


def _check_fabric(sample: Sample) -> list[Finding]:
    gpus = [g for g in sample.gpus if not g.lost and g.fabric.state is not None]
    if not gpus:
        return []
    out: list[Finding] = []
    waiting = [g for g in gpus if g.fabric.state != COMPLETED]
    if waiting and _switched(sample):
        states = sorted({_STATE_WORDS.get(FABRIC_STATES.get(g.fabric.state, ""), str(g.fabric.state))
                         for g in waiting})
        out.append(_finding(
            "fabric.not_ready",
            f"GPU fabric not ready on {_gpu_list(waiting)} (state {' / '.join(states)}): Fabric Manager is not "
            "running or has not configured the NVSwitches, so NVLink peer-to-peer is unusable though the links "
            "read Active; run systemctl status nvidia-fabricmanager and nvidia-smi -q | grep -A8 Fabric",
            observed={g.index: FABRIC_STATES.get(g.fabric.state, g.fabric.state) for g in waiting},
            expected="completed"))
    failed = [g for g in gpus if g.fabric.state == COMPLETED and g.fabric.status not in (0, None)]
    if failed:
        words = sorted({status_words(g.fabric.status) for g in failed})
        out.append(_finding(
            "fabric.status",
            f"GPU fabric on {_gpu_list(failed)} completed with status {' / '.join(words)}: the GPUs are not "
            "usable over NVLink; check journalctl -u nvidia-fabricmanager and nvidia-smi -q | grep -A8 Fabric",
            observed={g.index: status_words(g.fabric.status) for g in failed}, expected="Success (0)"))
    for g in gpus:
        if g.fabric.state == COMPLETED:
            out += _check_health(g)
    return out


def _check_health(g: GpuSample) -> list[Finding]:
    flags = fabric_flags(g.fabric.health_mask, g.fabric.health_summary)
    bad = [name for name in _TROUBLE if flags.get(name)]
    if not bad:
        return []
    severity = _C if any(_TROUBLE[name][0] is _C for name in bad) else _W
    words = []
    for name in bad:
        text = _TROUBLE[name][1]
        if name == "incorrect_configuration":
            kind = fabric_health(g.fabric.health_mask).get(name)
            text += f" ({FABRIC_INCORRECT_CONFIGURATION.get(kind, kind)})"
        words.append(text)
    return [Finding(
        code="fabric.health", severity=severity,
        message=f"GPU {g.index} fabric health: {', '.join(words)}; check nvidia-smi -q | grep -A14 Fabric, "
                "nvidia-smi nvlink -s and journalctl -u nvidia-fabricmanager",
        gpu=g.index, observed=bad, expected="healthy")]
