"""Judge one `Sample` against the expected spec of its hardware: stable finding codes and a verdict.

This is the single definition of "what is wrong with this node": `nvmon audit` prints the findings
and the alert rules key on the same codes, so a condition is defined once. The rules (codes,
severities, what counts as healthy) are listed in `RULES`; each fault is reported on its own GPU,
link or port, and a finding is unique per (code, gpu, link, device, port, xid), so that tuple can
be an alert's identity.

Two hardware facts shape the rules:
- GPUs lower their PCIe generation when idle to save power, so a low gen is judged only under load;
  a low width, or a slot that cannot reach the spec's gen, is judged always.
- Counters are never judged by their absolute value (they accumulate since boot), only their rise
  over the interval (`*_delta`).

The checks live in one module per part of the node (`gpus`, `board`, `ib`); this module runs them
(`audit`), once per sample for a daemon (`Judge`), and writes the `nvmon audit --json` contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from nvmon.audit.fabric import FabricDomain, _check_fabric, fabric_domain
from nvmon.audit.board import SPLIT_BOARDS, _check_topology, _expected_board, describe_board
from nvmon.audit.findings import (
    AUDIT_SCHEMA,
    BRAKE_THROTTLES,
    EXIT_CODES,
    POWER_THROTTLES,
    RULES,
    THERMAL_THROTTLES,
    AuditReport,
    Finding,
    Thresholds,
    _finding,
    is_busy,
    nvlink_bytes_per_s,
)
from nvmon.audit.gpus import (_check_logged_xids, _check_nvlink, _check_nvlink_errors, _check_pcie,
                              _check_power_thermal, _check_xid)
from nvmon.audit.ib import _check_ib, _is_active, _is_down
from nvmon.model import Sample, to_jsonable
from nvmon.xid import LoggedXid
from nvmon.specs import NodeSpec, gpu_spec_for

__all__ = [
    "AUDIT_SCHEMA", "BRAKE_THROTTLES", "EXIT_CODES", "POWER_THROTTLES", "RULES", "SPLIT_BOARDS", "THERMAL_THROTTLES",
    "AuditReport", "FabricDomain", "fabric_domain",
    "Finding", "Judge", "Thresholds", "audit", "describe_board", "finding_to_dict", "is_busy", "nvlink_bytes_per_s",
    "report_to_dict", "_is_active", "_is_down",
]

def _spec_profile(sample: Sample, node_spec: NodeSpec, thresholds: Thresholds) -> dict[str, Any]:
    models: dict[str, Any] = {}
    for g in sample.gpus:
        if g.lost:
            continue
        spec = gpu_spec_for(g.name)
        models[g.name or "?"] = "unknown" if spec is None else {
            "key": spec.key, "nvlink_links": spec.nvlink_links, "nvlink_version": spec.nvlink_version,
            "nvlink_link_mbps": spec.nvlink_link_mbps, "power_limit_w": spec.power_limit_w,
            "pcie_gen": spec.pcie_gen, "pcie_width": spec.pcie_width, "board": spec.board,
            "source": spec.source,
        }
    return {
        "models": models,
        "node": {"gpus": node_spec.gpus, "ib_ports": node_spec.ib_ports,
                 "ib_rate_gbps": node_spec.ib_rate_gbps, "topology": node_spec.topology},
        "expected_topology": _expected_board([g for g in sample.gpus if not g.lost], node_spec),
        "thresholds": {f.name: getattr(thresholds, f.name) for f in fields(thresholds)},
    }


def audit(sample: Sample, node_spec: NodeSpec = NodeSpec(), thresholds: Thresholds = Thresholds(),
          logged_xids: Sequence[LoggedXid] = ()) -> AuditReport:
    """Judge `sample` against its GPUs' specs and `node_spec`; see `RULES` and the module docstring.
    `logged_xids`: Xids the kernel log holds from before the sample (the one-shot `nvmon audit`)."""
    findings: list[Finding] = []
    judged = False  # did at least one GPU have a spec to be held to?
    if not sample.nvml.available:
        findings.append(_finding("nvml.unavailable",
                                 f"NVML unavailable: {sample.nvml.error or 'unknown error'}; GPUs not judged",
                                 observed=sample.nvml.error))
    else:
        if node_spec.gpus is not None and len(sample.gpus) < node_spec.gpus:
            findings.append(_finding(
                "gpu.count", f"{len(sample.gpus)} GPUs present, expected {node_spec.gpus}: "
                "check seating, power cables and dmesg for fallen-off-the-bus",
                observed=len(sample.gpus), expected=node_spec.gpus))
        unknown_names: dict[str, list[int]] = {}
        for gpu in sample.gpus:
            if gpu.xid_events:  # before the lost check: Xid 79 arrives as the GPU goes lost
                findings += _check_xid(gpu)
            if gpu.lost:
                findings.append(_finding(
                    "gpu.lost", f"GPU {gpu.index} lost (fell off the bus): check dmesg for Xid 79, reset or reboot",
                    gpu=gpu.index, observed="lost", expected="present"))
                continue
            spec = gpu_spec_for(gpu.name)
            busy = is_busy(gpu, thresholds)
            if spec is None:
                unknown_names.setdefault(gpu.name or "?", []).append(gpu.index)
            else:
                judged = True
                findings += _check_nvlink(gpu, spec, thresholds)
            findings += _check_nvlink_errors(gpu)
            findings += _check_pcie(gpu, spec, busy)
            findings += _check_power_thermal(gpu, spec, busy, thresholds)
        for name, idxs in unknown_names.items():
            findings.append(_finding(
                "gpu.model", f"GPU model {name!r} (GPU {', '.join(map(str, idxs))}) has no spec: "
                "NVLink, PCIe and power are judged only by generic rules",
                observed=name, expected="known model"))
        findings += _check_topology(sample, node_spec)
        findings += _check_fabric(sample)
    if logged_xids:  # also without NVML: an Xid 79 logged before the driver went is the news
        findings += _check_logged_xids(list(sample.gpus), list(logged_xids))
    findings += _check_ib(sample.ib, node_spec, thresholds)
    return AuditReport(sample.node, _spec_profile(sample, node_spec, thresholds), _verdict(findings, sample, judged),
                       tuple(findings))


class Judge:
    """The audit of one node (its spec, its thresholds), run once per sample.

    The daemon hands every tick to its alert rules, its Prometheus page and the wire's per-tick
    findings; all three ask the same `Judge`, which audits each sample once (it remembers the
    last one it saw, by identity: a `Sample` is immutable) and gives them the same report.
    """

    __slots__ = ("node_spec", "thresholds", "_last")

    def __init__(self, node_spec: NodeSpec = NodeSpec(), thresholds: Thresholds = Thresholds()) -> None:
        self.node_spec = node_spec
        self.thresholds = thresholds
        self._last: tuple[Sample, AuditReport] | None = None

    def __call__(self, sample: Sample) -> AuditReport:
        last = self._last  # one read: the exporter's HTTP thread may ask at the same time
        if last is not None and last[0] is sample:
            return last[1]
        report = audit(sample, self.node_spec, self.thresholds)
        self._last = (sample, report)
        return report


def _verdict(findings: list[Finding], sample: Sample, judged: bool) -> str:
    severities = {f.severity for f in findings}
    if "critical" in severities:
        return "critical"
    if not sample.nvml.available:
        return "unknown"
    if "warning" in severities:
        return "warning"
    return "ok" if judged else "unknown"


def finding_to_dict(f: Finding) -> dict[str, Any]:
    """A finding in the `nvmon audit --json` contract's key order."""
    return {"code": f.code, "severity": f.severity, "gpu": f.gpu, "link": f.link, "device": f.device,
            "port": f.port, "observed": to_jsonable(f.observed), "expected": to_jsonable(f.expected),
            "message": f.message}


def report_to_dict(report: AuditReport) -> dict[str, Any]:
    """The JSON contract of `nvmon audit --json` (schema 1)."""
    return {"schema": AUDIT_SCHEMA, "node": report.node, "spec": to_jsonable(report.spec),
            "verdict": report.verdict, "findings": [finding_to_dict(f) for f in report.findings]}
