"""Node alert rules: the audit's findings, turned into alert conditions.

Each condition has ONE definition, in `nvmon.audit`: a rule here never judges hardware itself, it
only decides how long a finding must last (for_s), how long it must be gone (clear_s), whether a
reboot's link training excuses it (start-up grace), and for counters how many errors in a window
make a rate worth a page. `nvmon audit` and the alerts therefore always agree on what is wrong.

- Counter rules (`RATE_CODES`): the audit reports a counter that rose this tick; the rule sums
  those rises per place over `window_s` and holds a condition while the sum is ≥ `min_count`, so a
  lone corrected CRC error never pages, a steady stream does.
- Events (`gpu.xid`, an NVML Xid critical error) ride the same windows with their own defaults
  (`RULE_DEFAULTS`): one event fires at once, and the alert holds until `window_s` (10 min) has
  passed without another, so an Xid pages once and resolves after a quiet period. One alert per
  GPU and Xid number, with that Xid's own severity and runbook (nvmon/xid.py).
- Info findings that describe the board rather than a fault (`nvlink.board`, `gpu.model`) are
  not alerts.
- While NVML is unavailable, or a GPU is lost, alerts on what can no longer be judged are held
  as they are (`holds`): "cannot see" is not "fixed".
- The daemon's own conditions (`DAEMON_CODES`: its database found deleted, replaced or corrupt and
  started anew) are events it hands over with `note()`: one alert per code, firing at once and
  resolving after the rule's clear_s (1 h) without another.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from nvmon.alerts.model import AlertRecord, fingerprint
from nvmon import xid as xids
from nvmon.alerts.settings import NODE_RULES, RATE_CODES, AlertsSettings
from nvmon.audit import Finding, Judge, Thresholds
from nvmon.codes import DAEMON_CODES, NODE_CODES
from nvmon.model import Sample, to_jsonable
from nvmon.specs import NodeSpec

log = logging.getLogger("nvmon.alerts")

# Built-in settings of a rule, between a config override and the `[alerts]` defaults.
RULE_DEFAULTS: dict[str, dict[str, float]] = {
    "gpu.xid": {"for_s": 0.0, "window_s": 600.0, "min_count": 1},
    # A brake held a minute pages once; one that flickers (gaps under clear_s) stays that one alert.
    "power.brake": {"for_s": 60.0, "clear_s": 300.0},
    "store.reset": {"for_s": 0.0, "clear_s": 3600.0},  # pages once; another reset within the hour is that alert
}
# States whose alert says how long they have held ("active for 3 h 12 min", value: seconds held),
# counted from the first tick of the episode: gaps shorter than the rule's clear_s do not restart it.
HELD_CODES = frozenset({"power.brake"})
PER_FINDING_SEVERITY = frozenset({"gpu.xid", "nvlink.topology", "fabric.health"})  # the finding's severity (its Xid; a split board: warning) unless overridden
# Links train up after a reboot (NVLink through the fabric manager, IB through the subnet manager,
# PCIe at power-on, the NVSwitch fabric some seconds after the driver loads, once Fabric Manager has
# configured it): these do not fire during the start-up grace period.
GRACE_CODES = frozenset({"nvlink.link_down", "nvlink.topology", "nvlink.speed", "ib.port_down", "ib.rate",
                         "ib.count", "pcie.width", "pcie.gen", "fabric.not_ready"})
_GPU_SCOPED = ("gpu.", "nvlink.", "pcie.", "power.", "thermal", "fabric.")  # judged from NVML

RUNBOOKS: dict[str, str] = {code: c.runbook for code, c in (NODE_CODES | DAEMON_CODES).items()}  # one table: nvmon.codes

@dataclass(frozen=True, slots=True)
class RuleSpec:
    """One rule with every setting resolved (config override, then `[alerts]`, then built-in)."""

    code: str
    severity: str
    for_s: float
    clear_s: float
    grace: bool
    runbook: str
    window_s: float | None = None  # counter rules only
    min_count: int | None = None
    finding_severity: bool = False  # each alert takes its finding's severity (gpu.xid: the Xid's)


def rule_book(settings: AlertsSettings, interval_s: float) -> dict[str, RuleSpec]:
    """The enabled rules. clear_s defaults to max(for_s, 2 × interval): a condition gone for one
    tick (a missed read, a noisy counter) never resolves an alert on its own."""
    book = {}
    for code, severity in NODE_RULES.items():
        o = settings.rules.get(code)
        if o is not None and not o.enabled:
            continue
        d = RULE_DEFAULTS.get(code, {})
        for_s = o.for_s if o is not None and o.for_s is not None else d.get("for_s", settings.for_s)
        clear_s = o.clear_s if o is not None and o.clear_s is not None else d.get("clear_s", settings.clear_s)
        rate = code in RATE_CODES
        book[code] = RuleSpec(
            code=code, severity=(o.severity if o is not None and o.severity else severity), for_s=for_s,
            clear_s=clear_s if clear_s is not None else max(for_s, 2 * interval_s), grace=code in GRACE_CODES,
            runbook=RUNBOOKS[code],
            window_s=((o.window_s if o is not None and o.window_s else d.get("window_s", settings.window_s))
                      if rate else None),
            min_count=(int(o.min_count if o is not None and o.min_count else d.get("min_count", settings.min_count))
                       if rate else None),
            finding_severity=code in PER_FINDING_SEVERITY and not (o is not None and o.severity))
    return book


def thresholds_of(settings: AlertsSettings) -> Thresholds:
    return Thresholds(power_cap_ratio=settings.power_cap_pct / 100, power_limit_ratio=settings.power_limit_pct / 100,
                      temperature_c=settings.temperature_c)


class Condition(NamedTuple):  # a tuple: made for every condition every tick, so cheap to build
    """A rule's condition holding at one place, this tick."""

    fingerprint: str
    code: str
    summary: str | Callable[[], str]  # a callable when costly to build: called only when needed
    runbook: str
    gpu: int | None = None
    link: int | None = None
    device: str | None = None
    port: int | None = None
    value: Any = None
    threshold: Any = None
    severity: str | None = None  # None: the rule's


@dataclass(slots=True)
class _Window:
    """A counter's rises at one place over the last window: (ts, rise, {kind: rise})."""

    finding: Finding
    events: deque = field(default_factory=deque)
    total: int = 0
    kinds: dict[str, int] = field(default_factory=dict)  # the window's rise per kind


_PER_TICK = re.compile(r" \(\+\d+\)")


class NodeRules:
    """Turns one `Sample` into the conditions that hold now (`conditions`), keeping the counter
    windows between ticks. Everything that identifies the node (cluster, rack, labels) is here."""

    def __init__(self, settings: AlertsSettings = AlertsSettings(), *, cluster: str, node: str,
                 rack: str | None = None, labels: Mapping[str, str] | None = None,
                 node_spec: NodeSpec = NodeSpec(), interval_s: float = 1.0, judge: Judge | None = None):
        """`judge`: the daemon's shared audit (it must use `thresholds_of(settings)`); by default
        one of the rules' own."""
        self.book = rule_book(settings, interval_s)
        self.judge = judge if judge is not None else Judge(node_spec, thresholds_of(settings))
        self.thresholds = self.judge.thresholds
        self.node_spec = self.judge.node_spec
        self.cluster, self.node, self.rack = cluster, node, rack
        self.labels = dict(labels or {})
        self.errors = 0  # findings that could not be turned into a condition (bugs), counted
        self._fps: dict[tuple, str] = {}
        self._windows: dict[str, _Window] = {}
        self._held: dict[str, list[float]] = {}  # HELD_CODES: fingerprint → [since, last seen, clear_s]
        self._noted: dict[str, list] = {}  # DAEMON_CODES: code → [summary, value, first evaluated at]

    def fingerprint(self, code: str, gpu=None, link=None, device=None, port=None, xid=None) -> str:
        key = (code, gpu, link, device, port, xid)
        fp = self._fps.get(key)
        if fp is None:
            if len(self._fps) > 100_000:  # a bounded cache, whatever the hardware claims
                self._fps.clear()
            fp = self._fps[key] = fingerprint(code, self.cluster, self.node, gpu=gpu, link=link, device=device,
                                              port=port, rack=self.rack, xid=xid)
        return fp

    def conditions(self, sample: Sample, now: float) -> list[Condition]:
        """The conditions holding at `now`. Raises only if the audit itself fails."""
        findings = self.judge(sample).findings
        out: list[Condition] = []
        for f in findings:
            rule = self.book.get(f.code)
            if rule is None:
                continue
            try:
                if rule.window_s is not None:
                    self._observe(f, now)
                elif f.code in HELD_CODES:
                    out.append(self._held_condition(f, rule, now))
                else:
                    out.append(self._condition(f, rule))
            except Exception:  # one rule's bug must not cost the others
                self._error(f.code)
        if self._held:
            self._forget_held(now)
        if self._noted:
            out += self._noted_conditions(now)
        return out + self._rate_conditions(now)

    def note(self, code: str, summary: str, value: Any = None) -> None:
        """An event the daemon met outside the sample (a DAEMON_CODES code): its condition holds at
        the next evaluations, for the rule's for_s (at least one), so that its alert fires."""
        self._noted[code] = [summary, value, None]

    def _noted_conditions(self, now: float) -> list[Condition]:
        out = []
        for code, noted in list(self._noted.items()):
            rule = self.book.get(code)
            if rule is None:  # disabled
                del self._noted[code]
                continue
            summary, value, since = noted
            if since is None:
                since = noted[2] = now
            out.append(Condition(self.fingerprint(code), code, summary, rule.runbook, value=value))
            if now - since >= rule.for_s:
                del self._noted[code]
        return out

    def holds(self, sample: Sample) -> Callable[[AlertRecord], bool]:
        """A predicate: True for an alert this sample cannot judge (its absence proves nothing)."""
        if not sample.nvml.available:
            # An HCA's PCIe link (device set, no GPU) is read from sysfs: still judged.
            return lambda r: (r.code != "nvml.unavailable" and r.code.startswith(_GPU_SCOPED)
                              and not (r.device is not None and r.gpu is None))
        lost = {g.index for g in sample.gpus if g.lost}
        if not lost:
            return lambda r: False
        return lambda r: r.gpu in lost and r.code != "gpu.lost"

    # -- internals --------------------------------------------------------------------------

    def _error(self, code: str) -> None:
        self.errors += 1
        if self.errors in (1, 10, 100) or self.errors % 1000 == 0:
            log.exception("alert rule %s failed (%d rule failures so far)", code, self.errors)

    def _condition(self, f: Finding, rule: RuleSpec) -> Condition:
        observed = to_jsonable(f.observed)
        runbook = rule.runbook.format(observed=observed) if "{observed}" in rule.runbook else rule.runbook
        return Condition(self.fingerprint(f.code, f.gpu, f.link, f.device, f.port, f.xid), f.code, f.message,
                         runbook, f.gpu, f.link, f.device, f.port, observed, to_jsonable(f.expected),
                         f.severity if rule.finding_severity else None)

    def _held_condition(self, f: Finding, rule: RuleSpec, now: float) -> Condition:
        c = self._condition(f, rule)
        held = self._held.get(c.fingerprint)
        if held is None or now - held[1] >= rule.clear_s:
            held = self._held[c.fingerprint] = [now, now, rule.clear_s]
        held[1] = now
        seconds = now - held[0]
        head, sep, rest = f.message.partition(":")
        summary = f"{head} for {held_words(seconds)}{sep}{rest}"
        return c._replace(summary=summary, value=round(seconds))

    def resume_held(self, fingerprint: str, code: str, since: float, now: float) -> None:
        """An alert taken back after a restart: its state has held since its episode began, not
        since this process started ("active for 3 h", not "for 1 min")."""
        rule = self.book.get(code)
        if code in HELD_CODES and rule is not None:
            self._held[fingerprint] = [since, now, rule.clear_s]

    def _forget_held(self, now: float) -> None:
        for fp, (_, seen, clear_s) in list(self._held.items()):
            if now - seen >= clear_s:
                del self._held[fp]

    def _observe(self, f: Finding, now: float) -> None:
        fp = self.fingerprint(f.code, f.gpu, f.link, f.device, f.port, f.xid)
        w = self._windows.get(fp)
        if w is None:
            w = self._windows[fp] = _Window(f)
        w.finding = f
        obs = f.observed  # {kind: rise} (NVLink, IB), one rise (PCIe replays), {xid, events} (Xid)
        if f.xid is not None:
            obs = obs.get("events") if isinstance(obs, Mapping) else None
        rise = 0
        if isinstance(obs, Mapping):
            kinds = {k: n for k, n in obs.items() if type(n) is int and n > 0}
            acc = w.kinds
            for k, n in kinds.items():
                rise += n
                acc[k] = acc.get(k, 0) + n
        elif type(obs) is int and obs > 0:
            rise, kinds = obs, None
        if rise > 0:
            w.events.append((now, rise, kinds))
            w.total += rise

    def _rate_conditions(self, now: float) -> list[Condition]:
        out, empty = [], []
        book = self.book
        for fp, w in self._windows.items():
            try:
                rule = book[w.finding.code]
                events, cut = w.events, now - rule.window_s
                while events and events[0][0] <= cut:
                    _, rise, kinds = events.popleft()
                    w.total -= rise
                    if kinds:
                        acc = w.kinds
                        for k, n in kinds.items():
                            acc[k] -= n
                if not events:
                    empty.append(fp)
                elif w.total >= rule.min_count:
                    out.append(self._rate_condition(fp, w, rule))
            except Exception:  # a bug, or a rule disabled since: forget the window
                self._error(w.finding.code)
                empty.append(fp)
        for fp in empty:
            del self._windows[fp]
        return out

    def _rate_condition(self, fp: str, w: _Window, rule: RuleSpec) -> Condition:
        f, total, kinds = w.finding, w.total, dict(w.kinds)  # this tick's values, for a summary built later

        def summary() -> str:  # built only when a record is (a transition, a flush): most ticks never
            head = _PER_TICK.sub("", f.message.split(":", 1)[0])
            what = ", ".join(f"{k} +{n}" for k, n in kinds.items() if n > 0)
            return f"{head}: +{total} in the last {rule.window_s:g} s" + (f" ({what})" if what else "")

        if f.xid is not None:  # an event: its Xid's own runbook, and the Xid number in the value
            return Condition(fp, f.code, summary, xids.action(f.xid), f.gpu, f.link, f.device, f.port,
                             {"xid": f.xid, "events": total}, rule.min_count,
                             f.severity if rule.finding_severity else None)
        return Condition(fp, f.code, summary, rule.runbook, f.gpu, f.link, f.device, f.port, total, rule.min_count)


def held_words(seconds: float) -> str:
    """'45 s', '12 min', '3 h 12 min', '2 d 4 h': how long a state has held, for an alert summary."""
    s = int(max(0.0, seconds))
    if s < 120:
        return f"{s} s"
    m = s // 60
    if m < 60:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"
