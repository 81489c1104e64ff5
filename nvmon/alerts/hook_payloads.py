"""What each hook type sends: pure functions from alert records to JSON-able dicts.

A *batch* is what one notification carries: one status (`firing` or `resolved`), the group's
labels (the hook's `group_by` values) and its alerts. Without grouping a batch holds one alert.

- exec / webhook: one alert → its `AlertRecord.to_dict()` object; grouped (`group_wait_s` > 0) →
  `{"status", "group", "alerts": [...]}` so that a script sees one shape per configuration;
- alertmanager: Alertmanager's own API, `POST /api/v2/alerts` with a `PostableAlerts` array
  (api/v2/openapi.yaml in prometheus/alertmanager): labels, annotations, startsAt, endsAt once
  resolved, generatorURL;
- alertmanager-webhook: the body Alertmanager sends *its* receivers, version "4"
  (https://prometheus.io/docs/alerting/latest/configuration/#webhook_config);
- pagerduty: one Events API v2 event per alert, dedup_key = fingerprint: trigger, acknowledge
  (after an ack), resolve (https://developer.pagerduty.com/docs/events-API-v2/trigger-events/);
- slack: one incoming-webhook message per batch, an attachment per alert coloured by severity
  (https://api.slack.com/messaging/webhooks). Slack interprets `<…>` and `&` in text, so every
  alert string is escaped: a label cannot ping @channel or forge a link.
"""

from __future__ import annotations

import json
import re
from typing import Any

from nvmon.alerts.model import AlertRecord, iso

ALERTMANAGER_ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt while an alert is firing
MAX_GROUP_ALERTS = 200  # an Alertmanager batch beyond this is cut (truncatedAlerts says by how many)
ALERTMANAGER_BATCH = 64  # alerts per POST /api/v2/alerts (Prometheus' notifier sends at most 64)
_AM_LABEL = re.compile(r"[^A-Za-z0-9_]")  # Alertmanager refuses a batch with any other label name character
SLACK_MAX_ATTACHMENTS = 20
PD_SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}  # PD also has "error"
SLACK_COLOR = {"critical": "#d00000", "warning": "#daa038", "info": "#439fe0", "resolved": "#2eb886"}
_CORE_LABELS = ("cluster", "rack", "node", "gpu", "link", "device", "port")


def alert_labels(rec: AlertRecord) -> dict[str, str]:
    """Prometheus-style string labels: alertname (= code), severity, the place, then extra labels
    (which never override the core ones)."""
    out = {"alertname": rec.code, "severity": rec.severity}
    for key in _CORE_LABELS:
        v = getattr(rec, key)
        if v is not None:
            out[key] = str(v)
    for k, v in rec.labels.items():
        out.setdefault(str(k), str(v))
    return out


def group_value(rec: AlertRecord, key: str) -> str:
    """The value a batch is grouped by for `key` ('' where the alert has none)."""
    if key in ("code", "alertname"):
        return rec.code
    if key == "severity":
        return rec.severity
    if key in _CORE_LABELS:
        v = getattr(rec, key)
        return "" if v is None else str(v)
    return str(rec.labels.get(key, ""))


def group_labels(rec: AlertRecord, group_by: tuple[str, ...]) -> dict[str, str]:
    return {k: group_value(rec, k) for k in group_by}


def json_payload(status: str, labels: dict[str, str], records: list[AlertRecord], grouped: bool) -> dict[str, Any]:
    """exec's stdin and webhook's body."""
    if not grouped and len(records) == 1:
        return records[0].to_dict()
    return {"status": status, "group": dict(labels), "alerts": [r.to_dict() for r in records]}


def _annotations(rec: AlertRecord) -> dict[str, str]:
    out = {"summary": rec.summary, "runbook": rec.runbook, "count": str(rec.count)}
    if rec.value is not None:
        out["value"] = rec.value if isinstance(rec.value, str) else json.dumps(rec.value)
    if rec.threshold is not None:
        out["threshold"] = rec.threshold if isinstance(rec.threshold, str) else json.dumps(rec.threshold)
    return out


def _common(dicts: list[dict[str, str]]) -> dict[str, str]:
    if not dicts:
        return {}
    first = dicts[0]
    return {k: v for k, v in first.items() if all(d.get(k) == v for d in dicts[1:])}


def _group_key(labels: dict[str, str]) -> str:
    inner = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return "{}:{" + inner + "}"


def alertmanager_payload(receiver: str, status: str, labels: dict[str, str], records: list[AlertRecord],
                         external_url: str | None) -> dict[str, Any]:
    """Alertmanager's webhook_config body, so receivers written for Alertmanager work unchanged.
    The group key is stable for a group (firing and resolved share it)."""
    shown = records[:MAX_GROUP_ALERTS]
    alerts = []
    for r in shown:
        alerts.append({
            "status": r.status,
            "labels": alert_labels(r),
            "annotations": _annotations(r),
            "startsAt": iso(r.starts_at),
            "endsAt": iso(r.ends_at) if r.ends_at is not None else ALERTMANAGER_ZERO_TIME,
            "generatorURL": external_url or "",
            "fingerprint": r.fingerprint,
        })
    glabels = {("alertname" if k == "code" else k): v for k, v in labels.items()}
    return {
        "version": "4",
        "groupKey": _group_key(glabels),
        "truncatedAlerts": len(records) - len(shown),
        "status": "firing" if any(r.status == "firing" for r in records) else "resolved",
        "receiver": receiver,
        "groupLabels": glabels,
        "commonLabels": _common([a["labels"] for a in alerts]),
        "commonAnnotations": _common([a["annotations"] for a in alerts]),
        "externalURL": external_url or "",
        "alerts": alerts,
    }


def _label_name(name: str) -> str:
    """An extra label's name as Alertmanager accepts it (Prometheus' convention: other characters → _)."""
    name = _AM_LABEL.sub("_", name)
    return "_" + name if not name or name[0].isdigit() else name


def _description(rec: AlertRecord) -> str:
    where = ", ".join(p for p in (f"node {rec.node}" if rec.node else None, f"rack {rec.rack}" if rec.rack else None,
                                 f"cluster {rec.cluster}") if p)
    text = f"{rec.summary} ({where}; seen {rec.count}×"
    if rec.value is not None:
        text += f"; value {json.dumps(rec.value)}"
        if rec.threshold is not None:
            text += f", threshold {json.dumps(rec.threshold)}"
    return text + ")"


def alertmanager_alerts(records: list[AlertRecord], generator_url: str | None) -> list[dict[str, Any]]:
    """`PostableAlerts` for Alertmanager's API. Labels: alertname (the code), severity, the place
    (cluster, rack, node, gpu, link, hca = the IB device, port) where the alert has it, then extra
    labels (never overriding those). A firing alert has no endsAt (Alertmanager keeps it for its
    resolve_timeout after each receipt: the hook re-sends it); a resolved one ends at its end."""
    out = []
    for r in records:
        labels = {"alertname": r.code, "severity": r.severity, "cluster": r.cluster}
        for key, v in (("rack", r.rack), ("node", r.node), ("gpu", r.gpu), ("link", r.link), ("hca", r.device),
                       ("port", r.port)):
            if v is not None and v != "":
                labels[key] = str(v)
        for k, v in r.labels.items():
            if v is not None and str(v) != "":
                labels.setdefault(_label_name(str(k)), str(v))
        alert: dict[str, Any] = {
            "labels": labels,
            "annotations": {"summary": r.summary, "description": _description(r), "runbook": r.runbook,
                            "fingerprint": r.fingerprint},
            "startsAt": iso(r.starts_at),
        }
        if r.status == "resolved":
            alert["endsAt"] = iso(max(r.ends_at or r.starts_at, r.starts_at + 0.001))  # Alertmanager: starts < ends
        if generator_url:
            alert["generatorURL"] = generator_url
        out.append(alert)
    return out


def _component(rec: AlertRecord) -> str | None:
    parts = []
    if rec.gpu is not None:
        parts.append(f"gpu{rec.gpu}")
    if rec.link is not None:
        parts.append(f"link{rec.link}")
    if rec.device is not None:
        parts.append(rec.device)
    if rec.port is not None:
        parts.append(f"port{rec.port}")
    return "/".join(parts) or None


def pagerduty_event(routing_key: str, rec: AlertRecord, external_url: str | None) -> dict[str, Any]:
    """One Events API v2 event: trigger for firing, resolve for resolved; dedup_key = fingerprint so
    the resolve closes the incident the trigger opened."""
    if rec.status == "resolved":
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": rec.fingerprint}
    source = rec.node or (f"rack {rec.rack}" if rec.rack else f"cluster {rec.cluster}")
    payload: dict[str, Any] = {
        "summary": (f"{rec.node}: {rec.summary}" if rec.node else rec.summary)[:1024] or rec.code,
        "source": source[:255],
        "severity": PD_SEVERITY.get(rec.severity, "warning"),
        "timestamp": iso(rec.fired_at or rec.starts_at),
        "group": (rec.rack or rec.cluster)[:255],
        "class": rec.code[:255],
        "custom_details": rec.to_dict(),
    }
    component = _component(rec)
    if component:
        payload["component"] = component[:255]
    event: dict[str, Any] = {"routing_key": routing_key, "event_action": "trigger", "dedup_key": rec.fingerprint,
                             "payload": payload, "client": "nvmon"}
    if external_url:
        event["client_url"] = external_url
    return event


def pagerduty_ack(routing_key: str, rec: AlertRecord) -> dict[str, Any]:
    """The acknowledge event for an alert someone acked (nvmon alerts ack, the TUI's `k`)."""
    return {"routing_key": routing_key, "event_action": "acknowledge", "dedup_key": rec.fingerprint}


def slack_escape(text: str) -> str:
    """Slack's three control characters; after this a label is shown, never interpreted."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _place(rec: AlertRecord) -> str:
    where = [rec.node or (f"rack {rec.rack}" if rec.rack else rec.cluster)]
    comp = _component(rec)
    if comp:
        where.append(comp)
    return " ".join(where)


def slack_message(status: str, labels: dict[str, str], records: list[AlertRecord],
                  external_url: str | None) -> dict[str, Any]:
    """An incoming-webhook message: plain `text` (notifications, and clients without blocks) and a
    coloured attachment with blocks per alert."""
    head = "RESOLVED" if status == "resolved" else "FIRING"
    first = records[0]
    text = f"[{head}] {_place(first)}: {first.summary}"
    if len(records) > 1:
        text += f" (+{len(records) - 1} more)"
    attachments = []
    for r in records[:SLACK_MAX_ATTACHMENTS]:
        color = SLACK_COLOR["resolved"] if r.status == "resolved" else SLACK_COLOR.get(r.severity, "#808080")
        body = f"*[{head}] {slack_escape(r.severity)} · {slack_escape(_place(r))}*\n{slack_escape(r.summary)}"
        if r.runbook and r.status != "resolved":
            body += f"\n_Runbook:_ {slack_escape(r.runbook)}"
        facts = [f"code `{slack_escape(r.code)}`", f"fingerprint `{r.fingerprint}`", f"since {iso(r.starts_at)}"]
        if r.count > 1:
            facts.append(f"seen {r.count}×")
        if r.value is not None:
            facts.append(f"value {slack_escape(str(r.value))}"
                         + (f" (threshold {slack_escape(str(r.threshold))})" if r.threshold is not None else ""))
        blocks: list[dict[str, Any]] = [
            {"type": "section", "text": {"type": "mrkdwn", "text": body[:2900]}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(facts)[:2900]}]},
        ]
        attachments.append({"color": color, "fallback": slack_escape(f"[{head}] {_place(r)}: {r.summary}")[:300],
                            "blocks": blocks})
    if len(records) > SLACK_MAX_ATTACHMENTS:
        attachments.append({"color": "#808080", "blocks": [{"type": "context", "elements": [
            {"type": "mrkdwn", "text": f"…and {len(records) - SLACK_MAX_ATTACHMENTS} more alerts"}]}]})
    if external_url:
        attachments.append({"color": "#808080", "blocks": [{"type": "context", "elements": [
            {"type": "mrkdwn", "text": f"<{slack_escape(external_url)}|Open dashboard>"}]}]})
    return {"text": slack_escape(text)[:3000], "attachments": attachments}
