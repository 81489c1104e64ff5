"""The hook types, each declared once: its configuration rules, what it sends and how.

`HOOK_KINDS[cfg.type]` is all the rest of the hook code knows about a type. The configuration
(`HookConfig`, in `hooks`) is one flat model shared by every type; a kind's `check` says which of
its keys the type needs or refuses, in one line. Its `send` builds the payload (`hook_payloads`)
and delivers it through the hook's transport (`Hook.post` or `Hook.run_program`, in
`hook_delivery`), once. Its flags tell the dispatcher what differs: one alert per request
(PagerDuty), acknowledgements sent on (PagerDuty), firing alerts kept alive by re-sending them
(Alertmanager's API), the group's whole state each time (Alertmanager's webhook body), the secret
being the URL (Slack).

Adding a type: write its `check` and `send` and add a `HookKind` to `HOOK_KINDS` (and a line to
docs/alerts.md). This module imports only the payload builders, so the config and the delivery
modules can both import it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nvmon.alerts.hook_payloads import (
    ALERTMANAGER_BATCH,
    alertmanager_alerts,
    alertmanager_payload,
    json_payload,
    pagerduty_ack,
    pagerduty_event,
    slack_message,
)
from nvmon.alerts.model import AlertRecord

PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
ALERTMANAGER_API = "/api/v2/alerts"
# Below Alertmanager's default resolve_timeout (5 m): a firing alert not heard of again within it is
# resolved by Alertmanager itself, so the client re-sends every firing alert this often.
ALERTMANAGER_RESEND_S = 60.0

# (hook, client, status, group labels, records, grouped, secret) → a short result ("HTTP 202")
Send = Callable[[Any, Any, str, dict[str, str], list[AlertRecord], bool, "str | None"], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class HookKind:
    name: str
    check: Callable[[Any], None]  # the type's rules for a HookConfig; ValueError (one line) if broken
    send: Send
    default_url: str | None = None  # where it posts when `url` is not set
    runs_program: bool = False  # its target is a program (shown as such), not a URL
    secret_is_url: bool = False  # the secret is the endpoint itself (checked as a URL when read)
    one_alert_per_delivery: bool = False  # the API takes one event per request: batches are split
    whole_group: bool = False  # each notification carries every alert still firing in its group
    keep_alive_s: float | None = None  # re-send firing alerts this often (repeat_interval_s = 0), acked or not
    sends_acks: bool = False  # an ack (nvmon alerts ack, the TUI's k) is sent on as status "acknowledged"


# --- configuration rules ------------------------------------------------------------------------


def _has_secret(cfg) -> bool:
    return cfg.secret_file is not None or cfg.secret_env is not None


def _no_command(cfg) -> None:
    if cfg.command is not None:
        raise ValueError(f"{cfg.type} hook: command applies to exec hooks only")


def _needs_url(cfg) -> None:
    if cfg.url is None:
        raise ValueError(f"{cfg.type} hook needs url")


def _bearer(cfg) -> None:
    if _has_secret(cfg) and any(k.lower() == "authorization" for k in cfg.headers):
        raise ValueError(f"{cfg.type} hook: the secret is sent as 'Authorization: Bearer'; "
                         "drop the Authorization header or the secret")


def _no_urls(cfg) -> None:
    if cfg.urls:
        raise ValueError(f"{cfg.type} hook: urls applies to alertmanager hooks only (give url)")


def _no_username(cfg) -> None:
    if cfg.username is not None:
        raise ValueError(f"{cfg.type} hook: username (basic auth) applies to webhook and alertmanager hooks only")


def _tls(cfg) -> None:
    if cfg.key_file is not None and cfg.cert_file is None:
        raise ValueError(f"{cfg.type} hook: key_file needs cert_file (the client certificate)")


def _auth_keys(cfg) -> None:  # the secret as a bearer token, or as the password of `username`
    if cfg.username is not None and not _has_secret(cfg):
        raise ValueError(f"{cfg.type} hook: username needs the password in secret_file or secret_env")
    _bearer(cfg)


def _check_exec(cfg) -> None:
    if cfg.command is None:
        raise ValueError('exec hook needs command = ["/path/to/program", "arg", …]')
    for key in ("url", "urls", "headers", "headers_file", "external_url", "username", "ca_file", "cert_file",
                "key_file"):
        if getattr(cfg, key):
            raise ValueError(f"exec hook: {key} does not apply (it has command)")


def _check_http(cfg) -> None:  # webhook, alertmanager-webhook: a URL, the secret as a token or password
    _no_command(cfg)
    _no_urls(cfg)
    _needs_url(cfg)
    _auth_keys(cfg)
    _tls(cfg)


def _check_alertmanager(cfg) -> None:  # Alertmanager's own API, on every URL of `urls`
    _no_command(cfg)
    if cfg.url is not None:  # an older config: "alertmanager" was the webhook-body hook before
        raise ValueError('alertmanager hook: now posts to Alertmanager\'s API (/api/v2/alerts); give its base URLs '
                         'as urls = ["http://alertmanager:9093"], or for a receiver of Alertmanager\'s webhook body '
                         'use type = "alertmanager-webhook"')
    if not cfg.urls:
        raise ValueError('alertmanager hook needs urls = ["http://alertmanager:9093", …] (each of an HA pair)')
    _auth_keys(cfg)
    _tls(cfg)


def _check_pagerduty(cfg) -> None:
    _no_command(cfg)
    _no_urls(cfg)
    _no_username(cfg)
    _tls(cfg)
    if not _has_secret(cfg):
        raise ValueError("pagerduty hook needs the routing key in secret_file or secret_env")


def _check_slack(cfg) -> None:
    _no_command(cfg)
    _no_urls(cfg)
    _no_username(cfg)
    _tls(cfg)
    if (cfg.url is None) == (not _has_secret(cfg)):
        raise ValueError("slack hook: give the incoming-webhook URL as url, or (better) "
                         "in secret_file / secret_env, not both")


# --- deliveries ---------------------------------------------------------------------------------


def _auth(cfg, secret: str | None) -> dict[str, str]:
    """The secret as `Authorization`: basic with `username` (the secret is the password), else bearer."""
    if not secret:
        return {}
    if cfg.username is not None:
        return {"Authorization": "Basic " + base64.b64encode(f"{cfg.username}:{secret}".encode()).decode()}
    return {"Authorization": f"Bearer {secret}"}


def alertmanager_api(base: str) -> str:
    """An Alertmanager's alerts endpoint from its base URL (`http://am:9093`, or with the route
    prefix it runs under, `https://ops.example/alertmanager`); a URL that already ends in it stays."""
    base = base.rstrip("/")
    return base if base.endswith(ALERTMANAGER_API) else base + ALERTMANAGER_API


async def _send_exec(hook, client, status, labels, records, grouped, secret) -> str:
    body = json.dumps(json_payload(status, labels, records, grouped)).encode() + b"\n"
    return await hook.run_program(body, status, secret)  # the secret goes in NVMON_HOOK_SECRET


async def _send_webhook(hook, client, status, labels, records, grouped, secret) -> str:
    cfg = hook.config
    return await hook.post(client, cfg.url, json_payload(status, labels, records, grouped), _auth(cfg, secret))


async def _send_alertmanager(hook, client, status, labels, records, grouped, secret) -> str:
    """Alertmanager's PostableAlerts to every URL (as Prometheus does: each of an HA pair gets
    every alert, and the pair deduplicates its notifications)."""
    cfg = hook.config
    alerts = alertmanager_alerts(records, cfg.external_url)
    urls = [alertmanager_api(u) for u in cfg.urls]
    result = ""
    for i in range(0, len(alerts), ALERTMANAGER_BATCH):
        result = await hook.post_all(client, urls, alerts[i:i + ALERTMANAGER_BATCH], _auth(cfg, secret))
    return result


async def _send_alertmanager_webhook(hook, client, status, labels, records, grouped, secret) -> str:
    cfg = hook.config
    body = alertmanager_payload(hook.name, status, labels, records, cfg.external_url)
    return await hook.post(client, cfg.url, body, _auth(cfg, secret))


async def _send_pagerduty(hook, client, status, labels, records, grouped, secret) -> str:
    cfg, result = hook.config, ""
    for rec in records:
        event = (pagerduty_ack(secret, rec) if status == "acknowledged"
                 else pagerduty_event(secret, rec, cfg.external_url))
        result = await hook.post(client, cfg.target_url, event)
    return result


async def _send_slack(hook, client, status, labels, records, grouped, secret) -> str:
    cfg = hook.config
    return await hook.post(client, secret or cfg.url, slack_message(status, labels, records, cfg.external_url))


# In the order `must be one of` lists them.
HOOK_KINDS: dict[str, HookKind] = {k.name: k for k in (
    HookKind("exec", _check_exec, _send_exec, runs_program=True),
    HookKind("webhook", _check_http, _send_webhook),
    HookKind("alertmanager", _check_alertmanager, _send_alertmanager, keep_alive_s=ALERTMANAGER_RESEND_S),
    HookKind("alertmanager-webhook", _check_http, _send_alertmanager_webhook, whole_group=True),
    HookKind("pagerduty", _check_pagerduty, _send_pagerduty, default_url=PAGERDUTY_URL, one_alert_per_delivery=True,
             sends_acks=True),
    HookKind("slack", _check_slack, _send_slack, secret_is_url=True),
)}
