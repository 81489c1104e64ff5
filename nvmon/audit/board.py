"""The board's NVLink topology: described in words, and held to what the node is expected to be."""

from __future__ import annotations

import functools
import re

from nvmon.audit.findings import Finding, _finding
from nvmon.codes import Severity
from nvmon.model import GpuSample, Sample, Topology
from nvmon.specs import NodeSpec, gpu_spec_for

_NV = re.compile(r"NV(\d+)$")


def _nv_count(cell: str) -> int:
    m = _NV.match(cell)
    return int(m.group(1)) if m else 0


def describe_board(sample: Sample) -> str:
    """The board's NVLink topology class in words, e.g. for `nvlink.board`."""
    return _describe_topology(sample.topology)


@functools.lru_cache(maxsize=32)  # the alert rules ask every tick; a node's topology rarely changes
def _describe_topology(topo: Topology) -> str:
    cls = topo.class_
    pairs = [(i, j, _nv_count(row[j])) for i, row in enumerate(topo.matrix)
             for j in range(i + 1, len(row)) if _nv_count(row[j])]
    counts = sorted({n for _, _, n in pairs})
    nv = "/".join(f"NV{n}" for n in counts) or "NV?"
    if cls == "nvswitch":
        return f"all-to-all through NVSwitch, {nv} between every GPU pair"
    if cls == "mesh":
        return f"all-to-all over direct NVLinks, {nv} between every GPU pair"
    if cls == "pairs":
        listed = ", ".join(f"{i}-{j}" for i, j, _ in pairs)
        return f"GPUs bridged in pairs {listed} ({nv}); other pairs talk over PCIe"
    if cls == "partial":
        listed = ", ".join(f"{i}-{j}" for i, j, _ in pairs) or "none"
        return f"NVLink between some GPU pairs only ({listed}); the rest talk over PCIe"
    if cls == "none":
        return "no active NVLink between GPUs; all GPU-to-GPU traffic goes over PCIe"
    return f"NVLink topology could not be determined ({cls})"


def _expected_board(gpus: list[GpuSample], node_spec: NodeSpec) -> str | None:
    if node_spec.topology:
        return node_spec.topology
    boards = {spec.board for g in gpus if (spec := gpu_spec_for(g.name)) is not None}
    unknown = any(gpu_spec_for(g.name) is None for g in gpus)
    # Mixed or unknown models: no single expectation to hold the board to.
    return boards.pop() if len(boards) == 1 and not unknown else None


def _check_topology(sample: Sample, node_spec: NodeSpec) -> list[Finding]:
    if len(sample.gpus) < 2:
        return []
    observed = sample.topology.class_
    out = [_finding("nvlink.board", f"NVLink board: {describe_board(sample)}", observed=observed)]
    expected = _expected_board([g for g in sample.gpus if not g.lost], node_spec)
    if expected and observed != "unknown" and not _board_matches(observed, expected, len(sample.gpus)):
        out.append(_finding(
            "nvlink.topology",
            f"NVLink topology '{observed}' ({describe_board(sample)}), expected '{expected}' "
            f"({_BOARD_WORDS.get(expected, expected)}): the board is not what its spec says",
            observed=observed, expected=expected))
    elif observed in SPLIT_BOARDS and len(sample.gpus) >= SPLIT_MIN_GPUS and node_spec.topology != observed:
        # The seed's first pitfall, the "fake 8-card NVLink" box: pairs of bridged cards may be
        # what the model's spec allows, but nobody buys eight GPUs for that without saying so.
        out.append(Finding(
            code="nvlink.topology", severity=Severity.WARNING,
            message=f"{len(sample.gpus)} GPUs, {describe_board(sample)}: not all-to-all, tensor-parallel "
                    "traffic between pairs goes over PCIe; if this is the board you bought, say so with "
                    f"--expect-topology {observed} ([expect] topology)",
            observed=observed, expected="all-to-all"))
    return out


SPLIT_BOARDS = ("pairs", "partial")  # boards whose GPUs are not all NVLink-connected
SPLIT_MIN_GPUS = 4  # from here on, a split board is a finding of its own (2 bridged GPUs are a mesh)
_BOARD_WORDS = {"nvswitch": "all-to-all through NVSwitch", "mesh": "all-to-all over direct NVLinks",
                "pairs": "GPUs bridged in pairs", "none": "no NVLink"}


def _board_matches(observed: str, expected: str, n_gpus: int) -> bool:
    if observed == expected:
        return True
    # Small boards wire GPUs directly instead of through NVSwitch (HGX 4-GPU), and two bridged
    # GPUs are both a pair and a full mesh: all-to-all is what the expectation asks for there.
    return observed == "mesh" and (
        (expected == "nvswitch" and n_gpus <= 4) or (expected == "pairs" and n_gpus == 2))
