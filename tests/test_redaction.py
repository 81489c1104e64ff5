"""Hook secrets stay out of everything printed or logged: URL query strings (`?token=…`), header
values (`headers`, `headers_file`), bearer and basic credentials, even when a receiver echoes the
whole request back in its error body. And `headers_file` itself: `Name: value` lines, private to
its owner, read at each delivery. Real parts: a real HTTP receiver, `nvmon hooks test` through
click's runner, the dispatcher's log."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from nvmon.alerts.hook_dispatch import HookDispatcher
from nvmon.alerts.hooks import HookConfig, HookConfigError, parse_hooks, redact
from nvmon.cli import cli
from test_hook_outbox import Switchable
from test_hooks import alert, running, stats, until

SECRETS = {
    "query": "QSECRET0123456789",
    "header": "HSECRET0123456789",
    "file": "FSECRET0123456789",
    "bearer": "BSECRET0123456789",
    "password": "PSECRET0123456789",
}


@pytest.fixture
def receiver():
    r = Switchable()
    r.mode = "down"  # 500, with the request line and every header echoed in the body
    yield r
    r.close()


def private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def config(tmp_path: Path, receiver: Switchable, pad: str = "") -> Path:
    headers_file = private(tmp_path / "headers", f"# API gateway\nX-Api-Key: {SECRETS['file']}\n\n")
    token = private(tmp_path / "token", SECRETS["bearer"] + "\n")
    password = private(tmp_path / "password", SECRETS["password"] + "\n")
    cfg = tmp_path / "hooks.toml"
    cfg.write_text(
        f'[[hooks]]\nname = "bearer"\ntype = "webhook"\nurl = "{receiver.url(pad + "/wh?token=" + SECRETS["query"])}"\n'
        f'headers = {{ X-Auth-Token = "{SECRETS["header"]}", X-Team = "gpu" }}\n'
        f'headers_file = "{headers_file}"\nsecret_file = "{token}"\n'
        f'[[hooks]]\nname = "basic"\ntype = "alertmanager-webhook"\n'
        f'url = "{receiver.url("/am?key=" + SECRETS["query"])}"\n'
        f'username = "nvmon"\nsecret_file = "{password}"\n')
    return cfg


def leaks(text: str) -> list[str]:
    basic = base64.b64encode(f"nvmon:{SECRETS['password']}".encode()).decode()
    found = [name for name, s in SECRETS.items() if s[:6] in text]  # no piece of one either
    return found + (["basic"] if basic[:12] in text else [])


@pytest.mark.parametrize("as_json", [False, True])
def test_hooks_test_output_shows_no_secret_when_the_receiver_echoes_the_request(tmp_path, receiver, as_json):
    result = CliRunner().invoke(cli, ["hooks", "test", "--config", str(config(tmp_path, receiver)),
                                      *(["--json"] if as_json else [])])
    assert result.exit_code == 1
    out = result.output + (result.stderr if result.stderr_bytes is not None else "")
    # The receiver did get every secret, and echoed them in its error body ...
    assert len(receiver.requests) == 2
    # ... but what nvmon printed has none of them, and still says what happened.
    assert leaks(out) == [], out
    assert "HTTP 500" in out and "***" in out
    if as_json:
        hooks = json.loads(result.stdout)["hooks"]
        assert [h["target"] for h in hooks] == [f"http://127.0.0.1:{receiver.server.server_address[1]}/…"] * 2


def test_a_secret_where_the_error_text_is_cut_is_not_half_shown(tmp_path, receiver):
    # The echoed request line puts the query's token across the 200th character of the body.
    cfg = config(tmp_path, receiver, pad="/" + "p" * 178)
    result = CliRunner().invoke(cli, ["hooks", "test", "--config", str(cfg)])
    assert result.exit_code == 1 and "HTTP 500" in result.output
    assert leaks(result.output) == [], result.output


async def test_dispatcher_log_and_stats_show_no_secret(tmp_path, receiver, caplog):
    caplog.set_level(logging.DEBUG, logger="nvmon.hooks")
    hooks = parse_hooks(_toml_hooks(config(tmp_path, receiver)))
    d = HookDispatcher([h.model_copy(update={"retries": 1}) for h in hooks])
    async with running(d):
        d.submit([alert()])
        await until(lambda: all(s.failed == 1 for s in d.stats()), timeout=30)
    assert "HTTP 500" in caplog.text
    assert leaks(caplog.text) == [], caplog.text
    for s in d.stats():
        assert leaks(s.last_error or "") == [] and "HTTP 500" in s.last_error


def _toml_hooks(path: Path) -> list[dict]:
    import tomllib

    return tomllib.loads(path.read_text())["hooks"]


async def test_headers_file_headers_are_sent_and_reread(tmp_path, receiver):
    receiver.mode = "up"
    seen: list[dict] = []
    f = private(tmp_path / "headers", "X-Api-Key: one\n")
    d = HookDispatcher([HookConfig(type="webhook", name="wh", url=receiver.url("/h"), headers={"X-Team": "gpu"},
                                   headers_file=f)])
    handler = receiver.server.RequestHandlerClass
    orig = handler.do_POST

    def spy(self):
        seen.append({k.lower(): v for k, v in self.headers.items()})
        orig(self)

    handler.do_POST = spy
    try:
        async with running(d):
            d.submit([alert(gpu=1)])
            await until(lambda: stats(d, "wh").sent == 1)
            private(f, "X-Api-Key: two\nX-Extra:  spaced value \n")  # rotated: no restart needed
            d.submit([alert(gpu=2)])
            await until(lambda: stats(d, "wh").sent == 2)
    finally:
        handler.do_POST = orig
    assert [(h["x-api-key"], h["x-team"], h.get("x-extra")) for h in seen] == [("one", "gpu", None),
                                                                              ("two", "gpu", "spaced value")]


@pytest.mark.parametrize(("content", "mode", "expected"), [
    ("X-Api-Key: k\n", 0o644, "open to group or others (mode 0644); run chmod 600"),
    ("X-Api-Key k-no-colon-SECRET\n", 0o600, "line 1: expected 'Name: value' with a valid HTTP header name"),
    ("# c\nBad Name: SECRETVALUE\n", 0o600, "line 2: expected 'Name: value'"),
    ("X-Api-Key:\n", 0o600, "line 1: X-Api-Key: the value must be 1-4096 characters"),
    ("Authorization: Bearer SECRETVALUE\n", 0o600, "line 1: the secret is sent as Authorization; drop one of them"),
])
def test_a_bad_headers_file_is_one_line_naming_the_file_never_a_value(tmp_path, content, mode, expected):
    f = tmp_path / "headers"
    f.write_text(content)
    f.chmod(mode)
    secret = private(tmp_path / "tok", "tok-xyz\n")
    cfg = tmp_path / "hooks.toml"
    cfg.write_text(f'[[hooks]]\ntype = "webhook"\nurl = "http://127.0.0.1:9/x"\nheaders_file = "{f}"\n'
                   f'secret_file = "{secret}"\n')
    result = CliRunner().invoke(cli, ["hooks", "test", "--config", str(cfg)])
    assert result.exit_code == 1
    assert f"hook webhook: headers_file {f}: {expected}" in result.output
    assert "SECRET" not in result.output and "k-no-colon" not in result.output


def test_headers_file_does_not_apply_to_exec_hooks(tmp_path):
    with pytest.raises(HookConfigError, match="exec hook: headers_file does not apply"):
        parse_hooks([{"type": "exec", "command": ["/bin/true"], "headers_file": str(tmp_path / "h")}])


def test_redact_hides_query_strings_raw_and_decoded():
    url = "https://hooks.example/in?token=a%2Fb%3Dsecret&team=gpu-oncall"
    text = redact(f"POST /in?token=a%2Fb%3Dsecret&team=gpu-oncall failed; token was a/b=secret", [url])
    assert "secret" not in text and "gpu-oncall" not in text
    assert text.startswith("POST /***?***")
