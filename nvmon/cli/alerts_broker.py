"""`nvmon alerts --broker URL`: what every node and the fleet rules say is active now, read once
from the broker (nvmon.cli.fleetread), listed as `nvmon alerts` lists a database's.

Two sources, each row saying which (`source` in --json):

- `node`: each node's retained `alerts` set, the full set its daemon last published (its node
  rules' judgement). An offline node's set stays as it left it; its node.offline row says so.
- `fleet`: what no node can say of itself (node.offline, node.stale, rack.power, fleet.same_fault,
  fleet.feed_stalled), judged over the same read by the rules and engine `nvmon fleet` and the TUI
  run, in memory, paging nobody (`nvmon fleet` keeps its alerts in its database; the wire has no
  topic for them). One read cannot tell how long a condition has held, so a rule with a hold
  (for_s: node.stale 20 s, rack.power 60 s, fleet.same_fault 30 s) that holds now is listed
  pending; node.offline needs none. A node.offline / node.stale row starts when the node went
  quiet, by its own timestamps (the fleet state's liveness).

Under the table, one line per cluster whose `nvmon fleet` publishes a summary (`@summary`,
nvmon.wire.summary): its active alerts by code and severity as that evaluator counts them, firing
or still pending, and how old the summary is; the check on this read's own judgement (and all
there is on a central broker that carries only the summaries). Not in --json, whose shape is the
database listing's.

Marks from the clusters' shared `@controls` sets (nvmon.alerts.shared): `acked` when an ack names
the alert's episode (fingerprint and start; the node publishes its start), `silenced` when a shared
silence matches it (scoped to its cluster, as every evaluator matches). The fleet rules' rows are
this read's own episodes: an ack of `nvmon fleet`'s does not name them.
"""

from __future__ import annotations

import fnmatch
import json
import time
from dataclasses import replace

import click

from nvmon.alerts.model import AlertRecord, iso
from nvmon.cli.alerts_view import ordered, render_alerts, select
from nvmon.cli.common import on_terminal, stdout_console
from nvmon.cli.fleetread import fleet_settings, read, run

AGE_CODES = ("node.offline", "node.stale")
_SEV = {"critical": "crit", "warning": "warn", "info": "info"}  # as the SEV column  # fleet rows dated by the node's liveness, not by this read


def node_record(cluster: str, node: str, rack: str | None, a) -> AlertRecord:
    """A node's published alert (nvmon.wire.contract.Alert) as the record `nvmon alerts` lists."""
    from nvmon.codes import runbook

    return AlertRecord(fingerprint=a.fingerprint, status=a.state, code=a.code, severity=a.severity, cluster=cluster,
                       node=node, summary=a.summary, runbook=runbook(a.code, "(see the summary)"),
                       starts_at=a.starts_at if a.starts_at is not None else a.since, rack=rack, gpu=a.gpu,
                       link=a.link, device=a.device, port=a.port, labels=dict(a.labels),
                       fired_at=a.since if a.state == "firing" else None)


def fleet_records(state, settings, now: float, *, read_s: float) -> tuple[list[AlertRecord], str | None]:
    """The fleet rules' active alerts over `state` (one evaluation), and why none were judged
    (None when they were): the rules need the settle time `nvmon fleet` waits after connecting."""
    from nvmon.fleet.alerting import MIN_SETTLE_S, FleetAlerts
    from nvmon.fleet.rules import FleetRules, FleetSettings

    if read_s < MIN_SETTLE_S:
        return [], f"fleet rules not judged: read for {read_s:.1f} s, they need {MIN_SETTLE_S:g} s (--settle)"
    rules = FleetRules(settings or FleetSettings(stale_after_intervals=max(1.0, state.stale_factor)))
    fa = FleetAlerts(rules, clock=lambda: now)
    fa.evaluate(state, now)
    out = []
    for r in fa.active():
        view = state.nodes.get((r.cluster, r.node)) if r.node is not None else None
        if r.code in AGE_CODES and view is not None:
            since = now - view.liveness(now).age_s
            r = replace(r, starts_at=since, fired_at=since if r.status == "firing" else None)
        out.append(r)
    return out, None


def marks(records: list[AlertRecord], fleet: set[str], controls: dict, now: float) -> set[str]:
    """Set each node alert's `acked_at` from its cluster's shared acks (in place, by index) and
    return the fingerprints a shared silence matches."""
    from nvmon.alerts.shared import ack_key, engine_controls

    index = {c: engine_controls(cs, now) for c, cs in controls.items()}
    silenced = set()
    for i, r in enumerate(records):
        acks, silences = index.get(r.cluster, ({}, []))
        at = acks.get(ack_key(r.fingerprint, r.starts_at)) if r.fingerprint not in fleet else None
        if at is not None:
            records[i] = replace(r, acked_at=at)
        if any(s.matches(r, now) for s in silences):
            silenced.add(r.fingerprint)
    return silenced


def summary_lines(summaries: dict, now: float, *, code: str | None, severity: str | None) -> list[str]:
    """One line per cluster summary: its nodes by liveness and its alerts by code and severity
    (those --code and --severity keep), as the cluster's nvmon fleet counted them."""
    from nvmon.codes import Severity
    from nvmon.tui.text import age

    out = []
    for c, sm in sorted(summaries.items()):
        n = sm.nodes
        quiet = ", ".join(f"{v} {k}" for k, v in (("stale", n.stale), ("offline", n.offline)) if v)
        kinds = [f"{a.count} {a.code} {_SEV.get(a.severity, a.severity)}"
                 + (f" ({a.count - a.firing} pending)" if a.firing < a.count else "")
                 for a in sm.alerts if (code is None or fnmatch.fnmatchcase(a.code, code))
                 and (severity is None or Severity.rank_of(a.severity) <= Severity.rank_of(severity))]
        if sm.alert_kinds_omitted:
            kinds.append(f"{sm.alert_kinds_omitted} more kinds")
        out.append(f"summary of {c} (its nvmon fleet, {age(now - sm.ts)} old): {n.total} nodes"
                   + (f" ({quiet})" if quiet else "") + "; alerts: " + (", ".join(kinds) or "none"))
    return out


def list_from_broker(settings, *, cluster: str | None, settle_s: float, config_path, node: str | None,
                     code: str | None, severity: str | None, as_json: bool) -> None:
    fleet = fleet_settings(config_path)
    snap = run(settings, read(settings, cluster, settle_s, controls=True, judgeable=True,
                              stale_factor=fleet.stale_after_intervals if fleet is not None else None))
    state, now = snap.state, time.time()
    records: list[AlertRecord] = []
    omitted = []
    for (c, n), v in sorted(state.nodes.items()):
        if v.alerts is not None:
            records += [node_record(c, n, v.rack, a) for a in v.alerts.alerts]
            if v.alerts.omitted:
                omitted.append(f"{n} ({v.alerts.omitted})")
    by_rules, blind = fleet_records(state, fleet, now, read_s=snap.read_s)
    from_rules = {r.fingerprint for r in by_rules}
    records = ordered(select(records + by_rules, node=node, code=code, severity=severity))
    silenced = marks(records, from_rules, snap.controls, now)
    for note in ([blind] if blind else []) + ([f"not in their messages (too many): {', '.join(omitted)}"]
                                                if omitted else []):
        click.echo(f"nvmon: {note}", err=True)
    if not state.nodes:
        click.echo(f"nvmon: no nodes on {settings.url}" + (f" in cluster {cluster}" if cluster else ""), err=True)
    if as_json:
        click.echo(json.dumps([{**r.to_dict(), "acked_at": iso(r.acked_at), "silenced": r.fingerprint in silenced,
                                "source": "fleet" if r.fingerprint in from_rules else "node"} for r in records],
                              indent=2))
        return
    clusters = {c for c, _ in state.nodes} | {r.cluster for r in records}
    view = render_alerts(records, silenced, now, full=not on_terminal(), counts=False,
                         with_cluster=cluster is None and len(clusters) > 1)
    stdout_console().print(view, soft_wrap=True)  # lines are cut to fit a terminal already; piped, whole
    if node is None:  # the summaries count whole clusters
        for line in summary_lines(snap.summaries, now, code=code, severity=severity):
            click.echo(line)
