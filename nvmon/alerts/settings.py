"""The `[alerts]` table of the TOML config: for-durations, hysteresis, start-up grace, thresholds
and per-rule overrides. Shared by `nvmon daemon` (node rules) and, later, `nvmon fleet`.

Validation is pydantic's; the daemon's config loader turns the first error into one line naming
the key, e.g. `nvmon.toml: alerts.rules: unknown rule 'pcie.widht'; known: gpu.count, …`.
Documented in docs/alerts.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from nvmon.audit import RULES
from nvmon.codes import DAEMON_CODES

WEEK_S = 7 * 86400.0
DEFAULT_MAX_SILENCE_H = 168.0  # [alerts] max_silence_h: the longest silence honoured (7 days)
# Which node rules there are: here, not in nvmon.alerts.rules (which builds them from these
# settings), so that checking `[alerts.rules."CODE"]` needs no import back up.
SKIPPED = frozenset({"nvlink.board", "gpu.model"})  # facts about the board, not faults
RATE_CODES = frozenset({"nvlink.errors", "pcie.replay", "ib.errors", "gpu.xid"})  # counter rules
NODE_RULES: dict[str, str] = ({code: sev for code, sev in RULES.items() if code not in SKIPPED}  # code → severity
                              | {code: c.severity for code, c in DAEMON_CODES.items()})  # the daemon's own


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RuleOverride(_Strict):
    """`[alerts.rules."CODE"]`: what one rule does differently from the `[alerts]` defaults."""

    enabled: bool = True
    severity: Literal["critical", "warning", "info"] | None = None
    for_s: float | None = Field(None, ge=0, le=WEEK_S)
    clear_s: float | None = Field(None, ge=0, le=WEEK_S)
    min_count: int | None = Field(None, ge=1, le=10**12)  # counter rules only
    window_s: float | None = Field(None, gt=0, le=86400)  # counter rules only


class AlertsSettings(_Strict):
    enabled: bool = True
    for_s: float = Field(30.0, ge=0, le=WEEK_S)  # condition held this long: pending → firing
    clear_s: float | None = Field(None, ge=0, le=WEEK_S)  # absent this long: → resolved (None: see rules)
    startup_grace_s: float = Field(120.0, ge=0, le=3600)  # link-type rules do not fire this soon after start
    window_s: float = Field(60.0, gt=0, le=86400)  # counter rules: rise summed over this window…
    min_count: int = Field(10, ge=1, le=10**12)  # …must reach this many errors
    power_cap_pct: float = Field(98.0, gt=0, le=100)  # draw ≥ this % of the enforced limit → power.cap
    power_limit_pct: float = Field(95.0, gt=0, le=100)  # enforced limit < this % of spec → power.limit
    temperature_c: float = Field(87.0, gt=0, le=150)  # at or above → thermal
    keep_resolved_d: float = Field(7.0, gt=0, le=365)  # resolved alerts kept for `nvmon alerts`
    max_silence_h: float = Field(DEFAULT_MAX_SILENCE_H, gt=0, le=8760)  # the CLI refuses longer; shared ones are cut
    rules: dict[str, RuleOverride] = Field(default_factory=dict)

    @field_validator("rules")
    @classmethod
    def _known_rules(cls, v: dict[str, RuleOverride]) -> dict[str, RuleOverride]:
        for code, o in v.items():
            if code not in NODE_RULES:
                raise ValueError(f"unknown rule {code!r}; known: {', '.join(sorted(NODE_RULES))}")
            if code not in RATE_CODES and (o.min_count is not None or o.window_s is not None):
                raise ValueError(f"{code}: min_count and window_s apply only to counter rules "
                                 f"({', '.join(sorted(RATE_CODES))})")
        return v
