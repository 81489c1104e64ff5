"""The hook types, each declared once: its configuration rules, what it sends and how.

`HOOK_KINDS[cfg.type]` is all the rest of the hook code knows about a type. The configuration
(`HookConfig`, in `hooks`) is one flat model shared by every type; a kind's `check` says which of
its keys the type needs or refuses, in one line. Its `send` builds the payload (`hook_payloads`)
and delivers it through the hook's transport (`Hook.post` or `Hook.run_program`, in
`hook_delivery`), once. Its flags tell the dispatcher what differs: one alert per request
(PagerDuty), the group's whole state each time (Alertmanager), the secret being the URL (Slack).

Adding a type: write its `check` and `send` and add a `HookKind` to `HOOK_KINDS` (and a line to
docs/alerts.md). This module imports only the payload builders, so the config and the delivery
modules can both import it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nvmon.alerts.hook_payloads import alertmanager_payload, json_payload, pagerduty_event, slack_message
from nvmon.alerts.model import AlertRecord

PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"

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


def _check_exec(cfg) -> None:
    if cfg.command is None:
        raise ValueError('exec hook needs command = ["/path/to/program", "arg", …]')
    for key in ("url", "headers", "external_url"):
        if getattr(cfg, key):
            raise ValueError(f"exec hook: {key} does not apply (it has command)")


def _check_http(cfg) -> None:  # webhook, alertmanager: a URL, the secret as a bearer token
    _no_command(cfg)
    _needs_url(cfg)
    _bearer(cfg)


def _check_pagerduty(cfg) -> None:
    _no_command(cfg)
    if not _has_secret(cfg):
        raise ValueError("pagerduty hook needs the routing key in secret_file or secret_env")


def _check_slack(cfg) -> None:
    _no_command(cfg)
    if (cfg.url is None) == (not _has_secret(cfg)):
        raise ValueError("slack hook: give the incoming-webhook URL as url, or (better) "
                         "in secret_file / secret_env, not both")


# --- deliveries ---------------------------------------------------------------------------------


def _auth(secret: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"} if secret else {}


async def _send_exec(hook, client, status, labels, records, grouped, secret) -> str:
    body = json.dumps(json_payload(status, labels, records, grouped)).encode() + b"\n"
    return await hook.run_program(body, status, secret)  # the secret goes in NVMON_HOOK_SECRET


async def _send_webhook(hook, client, status, labels, records, grouped, secret) -> str:
    return await hook.post(client, hook.config.url, json_payload(status, labels, records, grouped), _auth(secret))


async def _send_alertmanager(hook, client, status, labels, records, grouped, secret) -> str:
    cfg = hook.config
    body = alertmanager_payload(hook.name, status, labels, records, cfg.external_url)
    return await hook.post(client, cfg.url, body, _auth(secret))


async def _send_pagerduty(hook, client, status, labels, records, grouped, secret) -> str:
    cfg, result = hook.config, ""
    for rec in records:
        result = await hook.post(client, cfg.target_url, pagerduty_event(secret, rec, cfg.external_url))
    return result


async def _send_slack(hook, client, status, labels, records, grouped, secret) -> str:
    cfg = hook.config
    return await hook.post(client, secret or cfg.url, slack_message(status, labels, records, cfg.external_url))


# In the order `must be one of` lists them.
HOOK_KINDS: dict[str, HookKind] = {k.name: k for k in (
    HookKind("exec", _check_exec, _send_exec, runs_program=True),
    HookKind("webhook", _check_http, _send_webhook),
    HookKind("alertmanager", _check_http, _send_alertmanager, whole_group=True),
    HookKind("pagerduty", _check_pagerduty, _send_pagerduty, default_url=PAGERDUTY_URL, one_alert_per_delivery=True),
    HookKind("slack", _check_slack, _send_slack, secret_is_url=True),
)}
