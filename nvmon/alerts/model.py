"""The alert record: what the rule engine produces, the store keeps, hooks deliver and
`nvmon alerts --json` lists (issue 4's contract, documented in docs/alerts.md).

One record per fingerprint (rule + node + gpu/link/device/port). `to_dict()` is the JSON object
an exec hook reads on stdin and a generic webhook receives; times are ISO 8601 UTC strings there
and unix seconds here.

`Silence` (what `nvmon alerts silence` writes and the engine honours) is a value type too: it
lives here so that the store, which keeps silences, needs nothing from the engine.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from nvmon.codes import FLEET_CODES as _FLEET_CODES

STATUSES = ("pending", "firing", "resolved")
# Codes beyond the audit's RULES that only the fleet evaluator raises: code → severity.
FLEET_CODES = {code: c.severity for code, c in _FLEET_CODES.items()}


def fingerprint(code: str, cluster: str, node: str | None, *, gpu: int | None = None, link: int | None = None,
                device: str | None = None, port: int | None = None, rack: str | None = None,
                xid: int | None = None) -> str:
    """Stable 16-hex-digit identity of one condition on one place. The same inputs always give
    the same fingerprint (across restarts, hosts and Python versions). `xid` (gpu.xid only: one
    alert per GPU and Xid number) is hashed only when given, so other fingerprints are unchanged."""
    parts = (code, cluster, node or "", "" if gpu is None else str(gpu), "" if link is None else str(link),
             device or "", "" if port is None else str(port), (rack or "") if node is None else "")
    if xid is not None:
        parts += (f"xid={xid}",)
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def iso(ts: float | None) -> str | None:
    """Unix seconds → '2026-11-30T17:25:40.123Z' (UTC, milliseconds); None stays None."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class AlertRecord:
    """One alert in its current state. Immutable: transitions make a new record (`replace`)."""

    fingerprint: str
    status: str  # STATUSES
    code: str  # an audit finding code (nvmon.audit.RULES) or a FLEET_CODES key
    severity: str  # a nvmon.codes.Severity word
    cluster: str
    node: str | None  # None for rack/fleet-wide alerts
    summary: str
    runbook: str
    starts_at: float  # unix seconds the condition was first seen (pending) in this episode
    rack: str | None = None
    gpu: int | None = None
    link: int | None = None
    device: str | None = None
    port: int | None = None
    value: Any = None  # the observed value that breached, JSON-able
    threshold: Any = None  # what it was judged against, JSON-able
    ends_at: float | None = None  # unix seconds it resolved; None while active
    count: int = 1  # times the condition was (re)observed in this episode (e.g. throttling events)
    fired_at: float | None = None  # unix seconds it became firing; None while pending
    labels: dict[str, str] = field(default_factory=dict)  # extra labels (config / inventory)
    acked_at: float | None = None  # unix seconds someone acked this episode (`nvmon alerts ack`); not in to_dict

    def to_dict(self) -> dict[str, Any]:
        """The contract's JSON object (all keys always present; null where not applicable)."""
        return {
            "fingerprint": self.fingerprint, "status": self.status, "code": self.code,
            "severity": self.severity, "cluster": self.cluster, "rack": self.rack, "node": self.node,
            "gpu": self.gpu, "link": self.link, "device": self.device, "port": self.port,
            "summary": self.summary, "runbook": self.runbook, "value": self.value,
            "threshold": self.threshold, "starts_at": iso(self.starts_at), "ends_at": iso(self.ends_at),
            "count": self.count, "labels": dict(self.labels),
        }

    def with_status(self, status: str, ts: float) -> AlertRecord:
        if status == "firing":
            return replace(self, status=status, fired_at=ts)
        if status == "resolved":
            return replace(self, status=status, ends_at=ts)
        return replace(self, status=status)


@dataclass(frozen=True, slots=True)
class Silence:
    """Alerts whose labels match every matcher (shell-style globs) are not notified until `ends_at`."""

    id: int | str  # the database's number, or "<cluster>/<id>" for a shared one (nvmon.alerts.shared)
    matchers: Mapping[str, str]
    starts_at: float
    ends_at: float
    created_by: str | None = None
    comment: str | None = None

    def matches(self, r: AlertRecord, now: float) -> bool:
        if not self.starts_at <= now < self.ends_at:
            return False
        for key, pattern in self.matchers.items():
            value = getattr(r, key) if key in MATCH_FIELDS else r.labels.get(key)
            if value is None or not fnmatch.fnmatchcase(str(value), pattern):
                return False
        return True


MATCH_FIELDS = ("fingerprint", "code", "severity", "status", "cluster", "rack", "node", "gpu", "link", "device",
                "port")
