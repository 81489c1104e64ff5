"""On-call hooks against real parts: a local HTTP receiver (a real server on 127.0.0.1) checking
each format's payload, real exec'd programs, the dispatcher's retries/timeouts/grouping, secrets
kept out of logs and output, and `nvmon hooks test`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from nvmon.alerts.hook_dispatch import HookDispatcher
from nvmon.alerts.hooks import HookConfig, HookConfigError, parse_hooks
from nvmon.alerts.model import AlertRecord, fingerprint
from nvmon.cli import cli
from nvmon.wire.mqtt import Backoff

FAST = Backoff(initial_s=0.02, max_s=0.05, jitter=0.5)
T0 = 1_714_564_800.0
PD_KEY = "R0UT1NGKEY-0123456789abcdef012345"
HOSTILE = "$(touch {marker}); `touch {marker}`; rm -rf /nonexistent; echo '\"'\n<!channel> & |cat /etc/passwd"


# -- a real HTTP receiver ------------------------------------------------------------------------


class Receiver:
    """Records every POST; answers from a per-path script of statuses, else 200 (202 for /pd)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes, float]] = []
        self.script: dict[str, list[tuple[int, str]]] = {}
        self.hang: dict[str, float] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    receiver.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                                              time.monotonic()))
                    steps = receiver.script.get(self.path)
                    status, text = steps.pop(0) if steps else (202 if self.path.startswith("/pd") else 200, "ok")
                if self.path in receiver.hang:
                    time.sleep(receiver.hang[self.path])
                data = text.encode()
                with contextlib.suppress(OSError):
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def bodies(self, path: str) -> list[dict]:
        with self.lock:
            return [json.loads(b) for p, _, b, _ in self.requests if p == path]

    def headers(self, path: str) -> list[dict[str, str]]:
        with self.lock:
            return [h for p, h, _, _ in self.requests if p == path]


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


# -- helpers -------------------------------------------------------------------------------------


def alert(status: str = "firing", *, node: str = "gpu-07", gpu: int | None = 2, link: int | None = 5,
          code: str = "nvlink.down", severity: str = "critical", summary: str = "NVLink 5 of GPU 2 is down",
          labels: dict | None = None, **kw) -> AlertRecord:
    rec = AlertRecord(fingerprint=fingerprint(code, "c1", node, gpu=gpu, link=link), status="firing", code=code,
                      severity=severity, cluster="c1", rack="r3", node=node, gpu=gpu, link=link, summary=summary,
                      runbook="Reseat the NVLink bridge; check `nvidia-smi nvlink -s`", starts_at=T0, value=0,
                      threshold=1, fired_at=T0 + 30, labels=labels or {"team": "gpu"}, **kw)
    return rec if status == "firing" else rec.with_status(status, T0 + 600)


def hook(type_: str, **kw) -> HookConfig:
    return HookConfig(type=type_, **kw)


async def until(cond, timeout: float = 15.0) -> None:
    """Wait for `cond()` to hold (polling), or fail the test. Generous by default: a deadline costs
    time only when the test fails anyway (a loaded CI machine is slow, not wrong)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def running(dispatcher: HookDispatcher):
    task = asyncio.create_task(dispatcher.run())
    try:
        yield dispatcher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def iso_ok(s: str) -> bool:
    return isinstance(s, str) and s.endswith("Z") and datetime.fromisoformat(s.replace("Z", "+00:00")) is not None


def stats(d: HookDispatcher, name: str):
    return next(s for s in d.stats() if s.name == name)


# -- formats -------------------------------------------------------------------------------------


async def test_webhook_posts_the_alert_contract_with_headers_and_bearer(receiver):
    d = HookDispatcher([hook("webhook", url=receiver.url("/wh"), headers={"X-Team": "gpu"}, secret_env="WH_TOKEN")],
                       environ={"WH_TOKEN": "tok-123"}, backoff=FAST)
    fire, res = alert(), alert("resolved")
    async with running(d):
        d.submit([fire])
        d.submit([res])
        await until(lambda: stats(d, "webhook").sent == 2)
    assert receiver.bodies("/wh") == [fire.to_dict(), res.to_dict()]
    h = receiver.headers("/wh")[0]
    assert h["content-type"] == "application/json" and h["x-team"] == "gpu"
    assert h["authorization"] == "Bearer tok-123" and h["user-agent"].startswith("nvmon/")


async def test_grouping_sends_one_notification_per_group(receiver):
    d = HookDispatcher([hook("webhook", url=receiver.url("/g"), group_wait_s=0.3, group_by=["node"])], backoff=FAST)
    a = [alert(gpu=g) for g in range(3)] + [alert(node="gpu-08")]
    async with running(d):
        for rec in a:  # separate ticks, within the group wait
            d.submit([rec])
            await asyncio.sleep(0.02)
        d.submit([alert("pending", gpu=7)])  # not a hook transition
        await until(lambda: stats(d, "webhook").sent == 4)
        await asyncio.sleep(0.1)
    by_node = {b["group"]["node"]: b for b in receiver.bodies("/g")}
    assert sorted(by_node) == ["gpu-07", "gpu-08"]
    assert by_node["gpu-07"]["status"] == "firing"
    assert [x["gpu"] for x in by_node["gpu-07"]["alerts"]] == [0, 1, 2]
    assert len(receiver.bodies("/g")) == 2


async def test_alertmanager_webhook_payload_is_valid_and_resolves(receiver):
    d = HookDispatcher([hook("alertmanager-webhook", url=receiver.url("/am"), external_url="https://grafana.example/d/x")],
                       backoff=FAST)
    fire = alert(labels={"team": "gpu", "node": "spoofed"})
    async with running(d):
        d.submit([fire])
        await until(lambda: len(receiver.bodies("/am")) == 1)
        d.submit([alert("resolved")])
        await until(lambda: len(receiver.bodies("/am")) == 2)
    first, second = receiver.bodies("/am")
    for body, status in ((first, "firing"), (second, "resolved")):
        assert body["version"] == "4" and body["status"] == status and body["receiver"] == "alertmanager-webhook"
        assert isinstance(body["groupKey"], str) and body["truncatedAlerts"] == 0
        assert body["externalURL"] == "https://grafana.example/d/x"
        for key in ("groupLabels", "commonLabels", "commonAnnotations"):
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in body[key].items())
        (a,) = body["alerts"]
        assert set(a) == {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"}
        assert a["status"] == status and a["fingerprint"] == fire.fingerprint
        assert all(isinstance(v, str) for v in {**a["labels"], **a["annotations"]}.values())
        assert a["labels"]["alertname"] == "nvlink.down" and a["labels"]["severity"] == "critical"
        assert a["labels"]["node"] == "gpu-07" and a["labels"]["gpu"] == "2" and a["labels"]["team"] == "gpu"
        assert a["annotations"]["summary"] == fire.summary and iso_ok(a["startsAt"]) and iso_ok(a["endsAt"])
    assert first["groupKey"] == second["groupKey"] and first["groupLabels"] == {"cluster": "c1", "node": "gpu-07"}
    assert first["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
    assert second["alerts"][0]["endsAt"] == "2024-05-01T12:10:00.000Z"


async def test_alertmanager_webhook_notifications_carry_the_groups_whole_state(receiver):
    d = HookDispatcher([hook("alertmanager-webhook", url=receiver.url("/am"))], backoff=FAST)
    a, b, other = alert(gpu=1), alert(gpu=2), alert(node="gpu-08")
    async with running(d):
        for batch in ([a], [b], [other], [a.with_status("resolved", T0 + 99)]):
            d.submit(batch)
            n = stats(d, "alertmanager-webhook").sent
            await until(lambda n=n: stats(d, "alertmanager-webhook").sent == n + 1)
    bodies = receiver.bodies("/am")
    assert [[(x["labels"]["gpu"], x["status"]) for x in body["alerts"]] for body in bodies] == [
        [("1", "firing")], [("2", "firing"), ("1", "firing")], [("2", "firing")], [("1", "resolved"), ("2", "firing")]]
    assert bodies[3]["status"] == "firing" and bodies[3]["groupKey"] == bodies[0]["groupKey"] != bodies[2]["groupKey"]


async def test_pagerduty_trigger_then_resolve_share_the_dedup_key(receiver, tmp_path):
    key_file = tmp_path / "pd.key"
    key_file.write_text(PD_KEY + "\n")
    key_file.chmod(0o600)  # a secret file: private to its reader, or refused (nvmon.secretfile)
    d = HookDispatcher([hook("pagerduty", url=receiver.url("/pd"), secret_file=key_file),
                        hook("pagerduty", name="pd-warn", url=receiver.url("/pd2"), secret_file=key_file)],
                       backoff=FAST)
    warn = alert(code="pcie.width", gpu=4, link=None, severity="warning", summary="PCIe x8 (expected x16)")
    async with running(d):
        d.submit([alert(), warn])
        await until(lambda: len(receiver.bodies("/pd")) == 2)
        d.submit([alert("resolved")])
        await until(lambda: len(receiver.bodies("/pd")) == 3)
    trig, trig_warn, resolve = receiver.bodies("/pd")
    assert trig["routing_key"] == PD_KEY and trig["event_action"] == "trigger"
    assert trig["dedup_key"] == alert().fingerprint and trig_warn["dedup_key"] == warn.fingerprint
    p = trig["payload"]
    assert p["severity"] in {"critical", "error", "warning", "info"} and p["severity"] == "critical"
    assert trig_warn["payload"]["severity"] == "warning"
    assert isinstance(p["summary"], str) and 0 < len(p["summary"]) <= 1024 and "gpu-07" in p["summary"]
    assert p["source"] == "gpu-07" and p["component"] == "gpu2/link5" and p["group"] == "r3"
    assert p["class"] == "nvlink.down" and p["custom_details"] == alert().to_dict() and iso_ok(p["timestamp"])
    assert resolve == {"routing_key": PD_KEY, "event_action": "resolve", "dedup_key": alert().fingerprint}


async def test_slack_message_colours_by_severity_and_escapes_markup(receiver):
    d = HookDispatcher([hook("slack", secret_env="SLACK_URL")], environ={"SLACK_URL": receiver.url("/slack/T0/B0/x")},
                       backoff=FAST)
    hostile = alert(summary="<!channel> <https://evil|click> & more", severity="warning")
    async with running(d):
        d.submit([hostile])
        await until(lambda: receiver.bodies("/slack/T0/B0/x"))
        d.submit([hostile.with_status("resolved", T0 + 60)])
        await until(lambda: len(receiver.bodies("/slack/T0/B0/x")) == 2)
    fire, res = receiver.bodies("/slack/T0/B0/x")
    assert fire["text"].startswith("[FIRING] gpu-07 gpu2/link5: ")
    assert "<!channel>" not in json.dumps(fire) and "&lt;!channel&gt;" in fire["text"]
    assert fire["attachments"][0]["color"] == "#daa038" and res["attachments"][0]["color"] == "#2eb886"
    assert res["text"].startswith("[RESOLVED]")
    for b in fire["attachments"][0]["blocks"]:
        assert b["type"] in ("section", "context")


# -- exec ----------------------------------------------------------------------------------------

RECORDER = textwrap.dedent("""
    import json, os, sys
    out = sys.argv[1]
    data = sys.stdin.read()
    with open(out, "a") as f:
        f.write(json.dumps({"stdin": data, "argv": sys.argv[2:], "status": os.environ["NVMON_ALERT_STATUS"],
                            "secret": os.environ.get("NVMON_HOOK_SECRET")}) + "\\n")
""")


def recorder(tmp_path: Path) -> tuple[list[str], Path]:
    script = tmp_path / "record.py"
    script.write_text(RECORDER)
    out = tmp_path / "calls.jsonl"
    return [sys.executable, str(script), str(out)], out


def calls(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


async def test_exec_gets_hostile_text_only_as_data(tmp_path):
    marker = tmp_path / "pwned"
    argv, out = recorder(tmp_path)
    evil = HOSTILE.format(marker=marker)
    d = HookDispatcher([hook("exec", command=[*argv, f"$(touch {marker})", "; rm x"], secret_env="EXEC_SECRET")],
                       environ={**os.environ, "EXEC_SECRET": "s3cr3t"}, backoff=FAST)
    rec = alert(summary=evil, labels={"note": evil, "x\n$(touch y)": "`id`"}, device=f"mlx5_0;{evil}")
    async with running(d):
        d.submit([rec])
        d.submit([rec.with_status("resolved", T0 + 9)])
        await until(lambda: stats(d, "exec").sent == 2)
    first, second = calls(out)
    assert json.loads(first["stdin"]) == rec.to_dict()  # round-trips exactly, newlines included
    assert json.loads(second["stdin"])["status"] == "resolved" and second["status"] == "resolved"
    assert first["argv"] == [f"$(touch {marker})", "; rm x"] and first["secret"] == "s3cr3t"
    assert not marker.exists() and not (Path.cwd() / "y").exists()


async def test_exec_timeout_kills_the_program_and_exit_status_is_logged(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="nvmon.hooks")
    pidfile = tmp_path / "pid"
    slow = tmp_path / "slow.py"
    slow.write_text(f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    failing = tmp_path / "fail.py"
    failing.write_text("import sys\nsys.stdin.read()\nprint('boom: pager unreachable', file=sys.stderr)\nsys.exit(3)\n")
    d = HookDispatcher([hook("exec", name="slow", command=[sys.executable, str(slow)], timeout_s=0.5, retries=0),
                        hook("exec", name="failing", command=[sys.executable, str(failing)], retries=1),
                        hook("exec", name="ok", command=["/bin/true"])], backoff=FAST)
    async with running(d):
        d.submit([alert()])
        await until(lambda: stats(d, "slow").failed == 1 and stats(d, "failing").failed == 1, timeout=30)
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "killed after the 0.5 s timeout" in stats(d, "slow").last_error
    assert stats(d, "failing").last_error == "python exited 3: boom: pager unreachable"
    assert "not delivered after 2 attempt(s): python exited 3" in caplog.text
    assert "hook ok: 1 firing alert(s) delivered (exit 0)" in caplog.text


# -- dispatcher behaviour ------------------------------------------------------------------------


async def test_retries_on_500_then_succeeds_and_4xx_is_not_retried(receiver):
    receiver.script["/flaky"] = [(500, "oops"), (503, "busy")]
    receiver.script["/bad"] = [(400, "invalid event")]
    d = HookDispatcher([hook("webhook", name="flaky", url=receiver.url("/flaky"), retries=3),
                        hook("webhook", name="bad", url=receiver.url("/bad"), retries=3)], backoff=FAST)
    async with running(d):
        d.submit([alert()])
        await until(lambda: stats(d, "flaky").sent == 1 and stats(d, "bad").failed == 1)
    assert len(receiver.bodies("/flaky")) == 3 and len(receiver.bodies("/bad")) == 1
    assert stats(d, "flaky").failed == 0
    assert stats(d, "bad").last_error == "HTTP 400 Bad Request: invalid event"


async def test_hanging_receiver_does_not_delay_other_hooks_or_the_caller(receiver):
    # By order of events, not by a clock: "fast" delivers all 50 while "hang" is still stuck on its
    # first alert (its receiver holds it 6 s, past its 5 s timeout), so a "fast" held behind "hang"
    # cannot pass, however slow the machine; a correct one has 5 s for its 50 local requests.
    receiver.hang["/hang"] = 6.0
    d = HookDispatcher([hook("webhook", name="hang", url=receiver.url("/hang"), timeout_s=5.0, retries=0),
                        hook("webhook", name="fast", url=receiver.url("/fast"))], backoff=FAST)
    async with running(d):
        for i in range(50):
            d.submit([alert(gpu=i % 8, link=i)])
        # submit never waits for delivery: it queues, and nothing went out while the loop was ours
        assert stats(d, "fast").sent == 0 and stats(d, "hang").sent + stats(d, "hang").failed == 0
        await until(lambda: stats(d, "fast").sent == 50 or stats(d, "hang").failed, timeout=15)
        assert stats(d, "fast").sent == 50
        assert stats(d, "hang").sent + stats(d, "hang").failed == 0  # still stuck on its first alert
        await until(lambda: stats(d, "hang").failed >= 1, timeout=15)
    assert stats(d, "hang").last_error == "timed out after 5 s"


async def test_full_queue_drops_counts_and_logs_once(caplog):
    caplog.set_level(logging.WARNING, logger="nvmon.hooks")
    d = HookDispatcher([hook("exec", command=["/bin/true"])], queue_size=3)
    d.submit([alert(gpu=i) for i in range(10)])  # not running: nothing drains
    d.submit([alert(gpu=i) for i in range(10, 15)])
    s = stats(d, "exec")
    assert (s.queued, s.dropped) == (3, 12)
    assert caplog.text.count("queue full") == 1
    d.submit(None)  # a caller's bug is logged, never raised into the rule engine's tick
    d.submit([object()])


async def test_filters_on_and_min_severity(receiver):
    d = HookDispatcher([hook("webhook", url=receiver.url("/f"), on=["firing"], min_severity="warning")], backoff=FAST)
    async with running(d):
        d.submit([alert(severity="info", code="power.high"), alert(), alert("resolved")])
        await until(lambda: receiver.bodies("/f"))
        await asyncio.sleep(0.2)
    assert [(b["code"], b["status"]) for b in receiver.bodies("/f")] == [("nvlink.down", "firing")]


async def test_repeat_interval_renotifies_until_resolved(receiver):
    d = HookDispatcher([hook("webhook", url=receiver.url("/r"), repeat_interval_s=0.25)], backoff=FAST)
    async with running(d):
        d.submit([alert()])
        await until(lambda: len(receiver.bodies("/r")) >= 3, timeout=15)
        d.submit([alert("resolved")])
        await until(lambda: receiver.bodies("/r")[-1]["status"] == "resolved")
        n = len(receiver.bodies("/r"))
        await asyncio.sleep(0.6)
    assert len(receiver.bodies("/r")) == n
    assert {b["status"] for b in receiver.bodies("/r")[:-1]} == {"firing"}


async def test_submit_from_another_thread_is_handed_to_the_loop(receiver):
    d = HookDispatcher([hook("webhook", url=receiver.url("/t"))], backoff=FAST)
    async with running(d):
        await asyncio.sleep(0.05)
        await asyncio.to_thread(d.submit, [alert()])
        await until(lambda: receiver.bodies("/t"))


# -- secrets -------------------------------------------------------------------------------------


async def test_secrets_never_reach_logs_or_stats(receiver, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    key_file = tmp_path / "pd.key"
    key_file.write_text(PD_KEY)
    key_file.chmod(0o600)  # a secret file: private to its reader, or refused (nvmon.secretfile)
    receiver.script["/pd"] = [(400, f'{{"message": "bad routing_key {PD_KEY}"}}')]
    receiver.script["/slack/T0/B0/SLACKSECRET"] = [(500, "no")] * 5
    dead = Receiver()  # a closed port: connection refused, the error names no URL path
    dead_url = dead.url("/services/DEADSECRET")
    dead.server.shutdown()
    dead.server.server_close()
    d = HookDispatcher([hook("pagerduty", url=receiver.url("/pd"), secret_file=key_file),
                        hook("slack", name="slack-a", secret_env="SLACK_URL", retries=1),
                        hook("slack", name="slack-b", url=dead_url, retries=0),
                        hook("webhook", url=receiver.url("/wh"), secret_env="TOKEN")],
                       environ={"SLACK_URL": receiver.url("/slack/T0/B0/SLACKSECRET"), "TOKEN": "BEARERSECRET"},
                       backoff=FAST)
    async with running(d):
        d.submit([alert()])
        await until(lambda: all(s.sent + s.failed == 1 for s in d.stats()))
    shown = caplog.text + json.dumps([s.last_error for s in d.stats()])
    assert "bad routing_key ***" in stats(d, "pagerduty").last_error
    for secret in (PD_KEY, "SLACKSECRET", "DEADSECRET", "BEARERSECRET"):
        assert secret not in shown
    assert stats(d, "slack-a").target == "(url from secret)"


async def test_missing_secret_is_one_line_without_value(tmp_path):
    d = HookDispatcher([hook("pagerduty", secret_file=tmp_path / "nope"), hook("slack", secret_env="UNSET_X")],
                       environ={})
    assert d.check() == [f"hook pagerduty: secret_file {tmp_path / 'nope'}: no such file",
                         "hook slack: secret_env UNSET_X: not set"]


# -- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize("entry, message", [
    ({"type": "email"}, "hooks[1].type: must be one of exec, webhook, alertmanager, alertmanager-webhook, pagerduty, slack"),
    ({"type": "exec"}, 'hooks[1]: exec hook needs command = ["/path/to/program", "arg", …]'),
    ({"type": "exec", "command": "/bin/page --team gpu"}, "hooks[1].command: expected an array, got a string"),
    ({"type": "exec", "command": []}, "hooks[1].command: must be a non-empty argv list"),
    ({"type": "webhook"}, "hooks[1]: webhook hook needs url"),
    ({"type": "webhook", "url": "ftp://x/y"}, "hooks[1].url: must start with http:// or https://"),
    ({"type": "webhook", "url": "https://u:TOPSECRET@h/"}, "hooks[1].url: no credentials in the URL"),
    ({"type": "webhook", "url": "http://h/", "colour": 1}, "hooks[1].colour: unknown key"),
    ({"type": "webhook", "url": "http://h/", "timeout_s": 0}, "hooks[1].timeout_s: must be greater than 0"),
    ({"type": "pagerduty"}, "hooks[1]: pagerduty hook needs the routing key in secret_file or secret_env"),
    ({"type": "slack"}, "hooks[1]: slack hook: give the incoming-webhook URL as url, or (better) in secret_file"),
    ({"type": "webhook", "url": "http://h/", "secret_file": "/a", "secret_env": "B"},
     "hooks[1]: webhook hook: give secret_file or secret_env, not both"),
    ({"type": "webhook", "url": "http://h/", "on": ["fired"]}, "hooks[1].on[1]: must be one of firing or resolved"),
])
def test_bad_hook_config_is_one_line(entry, message):
    with pytest.raises(HookConfigError) as e:
        parse_hooks([entry], "nvmon.toml")
    text = str(e.value)
    assert text.startswith(f"nvmon.toml: {message}") and "\n" not in text and "TOPSECRET" not in text


def test_hook_names_default_and_must_be_unique():
    hooks = parse_hooks([{"type": "slack", "url": "https://h/x"}, {"type": "exec", "command": ["a"]},
                         {"type": "exec", "command": ["b"]}])
    assert [h.name for h in hooks] == ["slack", "exec-1", "exec-2"]
    with pytest.raises(HookConfigError, match="two hooks are named 'x'"):
        parse_hooks([{"type": "exec", "command": ["a"], "name": "x"}, {"type": "exec", "command": ["b"], "name": "x"}])


def test_daemon_config_reads_hooks(tmp_path):
    from nvmon.daemon.config import ConfigError, load_config

    path = tmp_path / "nvmon.toml"
    path.write_text('[[hooks]]\ntype = "exec"\ncommand = ["/usr/local/bin/page", "--team", "gpu"]\n'
                    '[[hooks]]\ntype = "webhook"\nurl = "http://alerts.local/in"\ngroup_wait_s = 30\n')
    cfg = load_config(path)
    assert [(h.name, h.type) for h in cfg.hooks] == [("exec", "exec"), ("webhook", "webhook")]
    assert HookDispatcher(cfg.hooks).stats()[1].target == "http://alerts.local/…"
    path.write_text('[[hooks]]\ntype = "webhook"\n')
    with pytest.raises(ConfigError, match=r"^.*nvmon.toml: hooks\[1\]: webhook hook needs url$"):
        load_config(path)


# -- nvmon hooks test ----------------------------------------------------------------------------


def write_config(tmp_path: Path, receiver: Receiver, extra: str = "") -> Path:
    argv, _ = recorder(tmp_path)
    key = tmp_path / "pd.key"
    key.write_text(PD_KEY)
    key.chmod(0o600)  # a secret file: private to its reader, or refused (nvmon.secretfile)
    path = tmp_path / "nvmon.toml"
    path.write_text(textwrap.dedent(f"""
        [node]
        name = "gpu-07"
        cluster = "c1"
        [[hooks]]
        type = "exec"
        command = {json.dumps(argv)}
        [[hooks]]
        type = "webhook"
        url = "{receiver.url('/wh')}"
        [[hooks]]
        type = "alertmanager"
        urls = ["{receiver.url('/amapi')}"]
        [[hooks]]
        type = "alertmanager-webhook"
        url = "{receiver.url('/am')}"
        [[hooks]]
        type = "pagerduty"
        url = "{receiver.url('/pd')}"
        secret_file = "{key}"
        [[hooks]]
        type = "slack"
        secret_env = "NVMON_TEST_SLACK"
    """) + extra)
    return path


def test_hooks_test_command_delivers_to_every_hook(tmp_path, receiver):
    path = write_config(tmp_path, receiver)
    env = {"NVMON_TEST_SLACK": receiver.url("/slack/SLACKSECRET")}
    r = CliRunner().invoke(cli, ["hooks", "test", "--config", str(path)], env=env)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == ["exec", "webhook", "alertmanager", "alertmanager-webhook", "pagerduty",
                                               "slack"]
    assert all(" ok (firing: " in ln and "resolved: " in ln for ln in lines), r.stdout
    assert PD_KEY not in r.output and "SLACKSECRET" not in r.output
    (trig, res) = receiver.bodies("/pd")
    assert (trig["event_action"], res["event_action"]) == ("trigger", "resolve")
    assert trig["dedup_key"] == res["dedup_key"] and trig["payload"]["source"] == "gpu-07"
    assert [b["status"] for b in receiver.bodies("/am")] == ["firing", "resolved"]
    fire, res = receiver.bodies("/amapi/api/v2/alerts")  # PostableAlerts: a list, endsAt once resolved
    assert [a["labels"]["alertname"] for a in fire + res] == ["nvmon.test", "nvmon.test"]
    assert "endsAt" not in fire[0] and res[0]["endsAt"] > res[0]["startsAt"]
    assert [b["code"] for b in receiver.bodies("/wh")] == ["nvmon.test", "nvmon.test"]
    assert [c["status"] for c in calls(tmp_path / "calls.jsonl")] == ["firing", "resolved"]


def test_hooks_test_command_reports_failures_without_secrets(tmp_path, receiver):
    receiver.script["/pd"] = [(400, f"bad key {PD_KEY}")]
    path = write_config(tmp_path, receiver, '[[hooks]]\ntype = "exec"\nname = "gone"\ncommand = ["/nonexistent/page"]\n')
    r = subprocess.run([sys.executable, "-m", "nvmon", "hooks", "test", "--config", str(path)], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "NVMON_TEST_SLACK": "http://127.0.0.1:9/SLACKSECRET"})
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = {ln.split()[0]: ln for ln in r.stdout.splitlines()}
    assert lines["pagerduty"].endswith("FAILED: firing: HTTP 400 Bad Request: bad key ***")
    assert "FAILED: firing: " in lines["slack"] and lines["slack"].split()[2] == "(url"
    assert lines["gone"].endswith("FAILED: firing: /nonexistent/page: no such program")
    assert " ok (" in lines["webhook"]
    assert r.stderr == "nvmon: 3 of 7 hook(s) failed\n"
    assert PD_KEY not in r.stdout + r.stderr and "SLACKSECRET" not in r.stdout + r.stderr


def test_hooks_test_command_bad_config_is_one_line(tmp_path):
    path = tmp_path / "nvmon.toml"
    path.write_text('[[hooks]]\ntype = "webhook"\nurl = "gopher://x"\n')
    r = subprocess.run([sys.executable, "-m", "nvmon", "hooks", "test", "--config", str(path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == f"nvmon: {path}: hooks[1].url: must start with http:// or https://\n"
    r = CliRunner().invoke(cli, ["hooks", "test", "--config", str(tmp_path / "missing.toml")])
    assert r.exit_code == 1 and r.stderr == f"nvmon: {tmp_path / 'missing.toml'}: no such file\n"
    path.write_text("[node]\nname = 'x'\n")
    r = CliRunner().invoke(cli, ["hooks", "test", "--config", str(path)])
    assert r.exit_code == 1 and r.stderr == f"nvmon: {path}: no [[hooks]] configured\n"
