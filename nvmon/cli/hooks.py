"""`nvmon hooks test`: send a synthetic alert (firing, then resolved) through every configured hook
and say, one line per hook, whether it arrived.

Registered by the main CLI (`cli.add_command(hooks_group)`).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from nvmon.alerts.model import AlertRecord, fingerprint
from nvmon.cli.common import NAME_RE, NvmonError

if TYPE_CHECKING:  # imported when the command runs: `nvmon --help` stays quick (httpx, pydantic)
    from nvmon.alerts.hook_delivery import Hook

DEFAULT_CONFIG = Path("/etc/nvmon/nvmon.toml")
TEST_CODE = "nvmon.test"


def _name(value: object, default: str | None) -> str | None:
    return value if isinstance(value, str) and NAME_RE.match(value) else default


def synthetic_alert(node_table: dict, severity: str, now: float) -> AlertRecord:
    """The synthetic alert: a real-looking record with its own code, marked as a test everywhere."""
    node = _name(node_table.get("name"), None) or re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname().split(".")[0])
    cluster = _name(node_table.get("cluster"), "default")
    rack = _name(node_table.get("rack"), None)
    return AlertRecord(
        fingerprint=fingerprint(TEST_CODE, cluster, node), status="firing", code=TEST_CODE, severity=severity,
        cluster=cluster, rack=rack, node=node or "node",
        summary="Test alert from `nvmon hooks test`: hook delivery works, no action needed",
        runbook="Nothing to do: sent by `nvmon hooks test`; a resolve follows at once.",
        starts_at=now, fired_at=now, labels={"test": "true"},
    )


async def _try(hook: Hook, firing: AlertRecord, resolved: AlertRecord) -> tuple[bool, str]:
    """One attempt per transition (no retries: a test should answer fast and say what is wrong)."""
    from nvmon.alerts.hook_delivery import DeliveryError, make_client
    from nvmon.alerts.hook_payloads import group_labels

    cfg = hook.config
    done = []
    try:
        async with make_client() as client:
            for rec in (firing, resolved):
                if rec.status not in cfg.on:
                    continue
                labels = group_labels(rec, cfg.group_by)
                result = await hook.deliver(client, rec.status, labels, [rec], cfg.group_wait_s > 0)
                done.append(f"{rec.status}: {result}")
    except DeliveryError as e:
        step = "resolved" if done else "firing" if "firing" in cfg.on else "resolved"
        return False, f"{step}: {e}"
    except Exception as e:  # a bug: still one line, still no secret
        return False, hook.redact(f"internal error: {type(e).__name__}: {e}")
    finally:
        await hook.aclose()  # its own TLS client, if it has one
    return True, ", ".join(done)


async def _run_all(hooks: list[Hook], firing: AlertRecord, resolved: AlertRecord) -> list[tuple[bool, str]]:
    return list(await asyncio.gather(*(_try(h, firing, resolved) for h in hooks)))


@click.group("hooks")
def hooks_group() -> None:
    """On-call hooks (exec, webhook, alertmanager, alertmanager-webhook, pagerduty, slack): see docs/alerts.md."""


@hooks_group.command("test",
                     short_help="Fire a test alert (firing, then resolved) through every hook.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="TOML config with [[hooks]] (default /etc/nvmon/nvmon.toml).")
@click.option("--hook", "only", multiple=True, metavar="NAME", help="Test only this hook (repeatable).")
@click.option("--severity", type=click.Choice(["info", "warning", "critical"]), default="info", show_default=True,
              help="Severity of the test alert (min_severity is not applied to it).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (keys above) instead of one line per hook.")
def hooks_test_command(config_path: Path | None, only: tuple[str, ...], severity: str, as_json: bool) -> None:
    """Fire a test alert (firing, then resolved) through every configured hook, all at once.

    One line per hook: its name, type, target and `ok` or the error. Each transition is tried
    once (no retries) within the hook's timeout_s; a hook's `on` list is honoured.

    \b
    Exit status: 0 all delivered, 1 any failed or a configuration error.
    --json: {"fingerprint": the test alert's,
             "hooks": [{"name", "type", "target" (secrets redacted),
                        "ok" (true/false),
                        "detail" (what each transition got, or the error)}],
             "failed": N}
    """
    from nvmon.alerts.hook_delivery import Hook
    from nvmon.alerts.hooks import HookConfigError, load_hooks

    path = config_path or DEFAULT_CONFIG
    try:
        configs, node_table = load_hooks(path)
    except HookConfigError as e:
        raise NvmonError(str(e)) from None
    if only:
        unknown = [n for n in only if n not in {c.name for c in configs}]
        if unknown:
            raise NvmonError(f"--hook {unknown[0]}: no such hook in {path} "
                             f"(hooks: {', '.join(c.name for c in configs) or 'none'})")
        configs = tuple(c for c in configs if c.name in only)
    if not configs:
        raise NvmonError(f"{path}: no [[hooks]] configured")
    now = time.time()
    firing = synthetic_alert(node_table, severity, now)
    resolved = firing.with_status("resolved", now)
    hooks = [Hook(c) for c in configs]
    results = asyncio.run(_run_all(hooks, firing, resolved))
    failed = sum(1 for ok, _ in results if not ok)
    if as_json:
        click.echo(json.dumps({"fingerprint": firing.fingerprint, "failed": failed, "hooks": [
            {"name": h.name, "type": h.config.type, "target": h.target, "ok": ok, "detail": detail}
            for h, (ok, detail) in zip(hooks, results, strict=True)]}, indent=2))
    else:
        width = max(len(h.name) for h in hooks)
        for hook, (ok, detail) in zip(hooks, results, strict=True):
            verdict = f"ok ({detail})" if ok else f"FAILED: {detail}"
            click.echo(f"{hook.name:<{width}}  {hook.config.type:<12} {hook.target:<32} {verdict}")
    if failed:
        click.echo(f"nvmon: {failed} of {len(hooks)} hook(s) failed", err=True)
        sys.exit(1)
