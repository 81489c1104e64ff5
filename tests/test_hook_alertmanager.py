"""The Alertmanager API hook (`type = "alertmanager"`: POST /api/v2/alerts) and PagerDuty
acknowledgements, against a local HTTP receiver: the PostableAlerts shape, an HA pair, keep-alive
re-sends, basic auth and TLS, the migration error for old configs, and `controls()` (acks sent on,
alerts restored after a restart taken up, alerts that ended while silenced forgotten). The same
hook against a real Alertmanager: tests/test_real_alertmanager.py."""

from __future__ import annotations

import asyncio
import base64
import ssl
import threading
from dataclasses import replace

import pytest
from mqtt_broker import Broker, make_tls, needs_mosquitto, needs_openssl, wait_until
from test_alerts_daemon import ALERTS_TOML
from test_alerts_shared import nvmon
from test_daemon import DaemonProc
from test_hooks import FAST, PD_KEY, Receiver, alert, hook, iso_ok, receiver, running, stats, until  # noqa: F401 (receiver: a fixture)

from nvmon.alerts.hook_dispatch import HookDispatcher
from nvmon.alerts.hook_kinds import alertmanager_api
from nvmon.alerts.hooks import HookConfigError, parse_hooks
from nvmon.alerts.model import AlertRecord, fingerprint

API = "/api/v2/alerts"



def ib_alert(status: str = "firing") -> AlertRecord:
    rec = AlertRecord(fingerprint=fingerprint("ib.rate", "c1", "gpu-07", device="mlx5_1", port=1), status="firing",
                      code="ib.rate", severity="warning", cluster="c1", node="gpu-07", device="mlx5_1", port=1,
                      summary="mlx5_1 port 1 at 100 Gb/s, expected 400", runbook="Check the cable", starts_at=1e9,
                      fired_at=1e9 + 30, value="100", threshold="400", labels={"gpu-role": "train", "9x": "y"})
    return rec if status == "firing" else rec.with_status(status, 1e9 + 99)


async def test_postable_alerts_to_every_alertmanager_of_an_ha_pair(receiver):
    urls = [receiver.url("/am1"), receiver.url("/am2/")]
    d = HookDispatcher([hook("alertmanager", urls=urls, external_url="https://grafana.example/d/x")], backoff=FAST)
    fire = alert(labels={"team": "gpu", "node": "spoofed"})
    async with running(d):
        d.submit([fire, ib_alert()])
        await until(lambda: stats(d, "alertmanager").sent == 2)
        d.submit([alert("resolved")])
        await until(lambda: stats(d, "alertmanager").sent == 3)
    first = receiver.bodies("/am1" + API)
    assert first == receiver.bodies("/am2" + API) and len(first) == 3  # both of the pair, the same bodies
    (nv,), (ib,), (res,) = first
    assert nv["labels"] == {"alertname": "nvlink.down", "severity": "critical", "cluster": "c1", "rack": "r3",
                            "node": "gpu-07", "gpu": "2", "link": "5", "team": "gpu"}  # extra labels never override
    assert ib["labels"] == {"alertname": "ib.rate", "severity": "warning", "cluster": "c1", "node": "gpu-07",
                            "hca": "mlx5_1", "port": "1", "gpu_role": "train", "_9x": "y"}  # names Alertmanager takes
    ann = nv["annotations"]
    assert ann["summary"] == fire.summary and ann["runbook"] == fire.runbook and ann["fingerprint"] == fire.fingerprint
    assert ann["description"].startswith(fire.summary) and "node gpu-07, rack r3, cluster c1" in ann["description"]
    assert set(nv) == {"labels", "annotations", "startsAt", "generatorURL"}  # firing: no endsAt
    assert nv["generatorURL"] == "https://grafana.example/d/x" and iso_ok(nv["startsAt"])
    assert res["labels"] == nv["labels"] and res["endsAt"] == "2024-05-01T12:10:00.000Z" > res["startsAt"]
    assert receiver.headers("/am1" + API)[0]["content-type"] == "application/json"
    assert alertmanager_api("https://ops.example/alertmanager/") == "https://ops.example/alertmanager" + API
    assert alertmanager_api("http://am:9093/api/v2/alerts") == "http://am:9093" + API


async def test_firing_alerts_are_re_sent_acked_or_not_until_resolved(receiver):
    d = HookDispatcher([hook("alertmanager", urls=[receiver.url("/am")], repeat_interval_s=0.2),
                        hook("webhook", url=receiver.url("/wh"), repeat_interval_s=0.2)], backoff=FAST)
    a, b = alert(gpu=1), alert(gpu=2)
    async with running(d):
        d.submit([a, b])
        await until(lambda: len(receiver.bodies("/am" + API)) >= 4)  # sent, then re-sent: both in one request
        d.controls([a, b], silenced=[])
        d.controls([a, b], silenced=[])
        d.quiet([a.fingerprint, b.fingerprint])  # acked: the webhook stops repeating, Alertmanager must not
        n_wh = len(receiver.bodies("/wh"))
        n_am = len(receiver.bodies("/am" + API))
        await until(lambda: len(receiver.bodies("/am" + API)) >= n_am + 2)
        assert len(receiver.bodies("/wh")) <= n_wh + 2  # at most what was already due
        d.submit([a.with_status("resolved", a.starts_at + 700)])
        await until(lambda: any("endsAt" in x for body in receiver.bodies("/am" + API) for x in body))
        n_am = len(receiver.bodies("/am" + API))
        await until(lambda: len(receiver.bodies("/am" + API)) >= n_am + 1)
    repeats = receiver.bodies("/am" + API)[2:]
    assert any(len(body) == 2 for body in repeats)  # re-sends due together go out as one request
    assert [x["labels"]["gpu"] for x in repeats[-1]] == ["2"]  # the resolved one is no longer re-sent


async def test_one_alertmanager_down_is_delivered_in_part_without_retries(receiver, caplog):
    dead = "http://127.0.0.1:9"  # discard port: connection refused
    d = HookDispatcher([hook("alertmanager", urls=[receiver.url("/am"), dead])], backoff=FAST)
    async with running(d):
        d.submit([alert()])
        await until(lambda: stats(d, "alertmanager").sent == 1)
    s = stats(d, "alertmanager")
    assert (s.sent, s.failed) == (1, 0) and len(receiver.bodies("/am" + API)) == 1
    assert s.last_error.startswith("1 of 2 servers took it; http://127.0.0.1:9/…: ") and s.target.endswith(" +1")
    assert "delivered in part" in caplog.text
    d = HookDispatcher([hook("alertmanager", urls=[dead, "http://127.0.0.1:7"], retries=1)], backoff=FAST)
    async with running(d):
        d.submit([alert()])
        await until(lambda: stats(d, "alertmanager").failed == 1)
    assert stats(d, "alertmanager").last_error.startswith("all 2 servers failed: ")


async def test_basic_auth_with_the_secret_as_password(receiver):
    d = HookDispatcher([hook("alertmanager", urls=[receiver.url("/am")], username="nvmon", secret_env="AM_PW"),
                        hook("webhook", url=receiver.url("/wh"), secret_env="AM_PW")],
                       environ={"AM_PW": "s3cret:with colon"}, backoff=FAST)
    async with running(d):
        d.submit([alert()])
        await until(lambda: stats(d, "alertmanager").sent == 1 and stats(d, "webhook").sent == 1)
    auth = receiver.headers("/am" + API)[0]["authorization"]
    assert auth == "Basic " + base64.b64encode(b"nvmon:s3cret:with colon").decode()
    assert receiver.headers("/wh")[0]["authorization"] == "Bearer s3cret:with colon"


@needs_openssl
async def test_tls_with_a_private_ca_and_a_client_certificate(receiver, tmp_path):
    tls = make_tls(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tls.ca))
    ctx.load_cert_chain(str(tls.server_cert), str(tls.server_key))
    ctx.verify_mode = ssl.CERT_REQUIRED  # the server wants nvmon's client certificate
    receiver.server.shutdown()
    receiver.server.socket = ctx.wrap_socket(receiver.server.socket, server_side=True)
    receiver.thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    receiver.thread.start()
    url = receiver.url("/am").replace("http:", "https:")
    good = hook("alertmanager", name="good", urls=[url], ca_file=tls.ca, cert_file=tls.client_cert,
                key_file=tls.client_key, retries=0)
    no_client_cert = hook("alertmanager", name="anon", urls=[url], ca_file=tls.ca, retries=0)
    wrong_ca = hook("alertmanager", name="wrong", urls=[url], ca_file=tls.other_ca, cert_file=tls.client_cert,
                    key_file=tls.client_key, retries=0)
    missing = hook("alertmanager", name="missing", urls=[url], ca_file=tmp_path / "nope.pem", retries=0)
    d = HookDispatcher([good, no_client_cert, wrong_ca, missing], backoff=FAST)
    assert d.check() == [f"hook missing: ca_file {tmp_path / 'nope.pem'}: no such file"]
    async with running(d):
        d.submit([alert()])
        await until(lambda: sum(s.sent + s.failed for s in d.stats()) == 4)
    assert [(s.name, s.sent) for s in d.stats()] == [("good", 1), ("anon", 0), ("wrong", 0), ("missing", 0)]
    assert "CERTIFICATE_VERIFY_FAILED" in stats(d, "wrong").last_error
    assert len(receiver.bodies("/am" + API)) == 1


@pytest.mark.parametrize("entry, message", [
    ({"type": "alertmanager", "url": "http://am:9093/alerts"},
     "hooks[1]: alertmanager hook: now posts to Alertmanager's API (/api/v2/alerts); give its base URLs as "
     'urls = ["http://alertmanager:9093"], or for a receiver of Alertmanager\'s webhook body use '
     'type = "alertmanager-webhook"'),
    ({"type": "alertmanager"}, 'hooks[1]: alertmanager hook needs urls = ["http://alertmanager:9093", …]'),
    ({"type": "alertmanager", "urls": ["am:9093"]}, "hooks[1].urls: must start with http:// or https://"),
    ({"type": "webhook", "urls": ["http://h/"]}, "hooks[1]: webhook hook: urls applies to alertmanager hooks only"),
    ({"type": "alertmanager", "urls": ["http://h/"], "username": "u"},
     "hooks[1]: alertmanager hook: username needs the password in secret_file or secret_env"),
    ({"type": "webhook", "url": "http://h/", "key_file": "/k"},
     "hooks[1]: webhook hook: key_file needs cert_file"),
    ({"type": "slack", "url": "https://h/x", "username": "u"},
     "hooks[1]: slack hook: username (basic auth) applies to webhook and alertmanager hooks only"),
    ({"type": "exec", "command": ["a"], "ca_file": "/ca.pem"}, "hooks[1]: exec hook: ca_file does not apply"),
    ({"type": "alertmanager", "urls": ["http://h/"], "username": "a:b", "secret_env": "X"},
     "hooks[1].username: must be 1-256 characters without ':'"),
])
def test_bad_config_is_one_line(entry, message):
    with pytest.raises(HookConfigError) as e:
        parse_hooks([entry], "nvmon.toml")
    assert str(e.value).startswith(f"nvmon.toml: {message}") and "\n" not in str(e.value)


def test_old_webhook_body_config_keeps_working_under_its_new_name():
    (h,) = parse_hooks([{"type": "alertmanager-webhook", "url": "http://router:9095/alerts", "group_wait_s": 30}])
    assert (h.name, h.target_url) == ("alertmanager-webhook", "http://router:9095/alerts")


# -- controls: acks to PagerDuty, restarts, silences ---------------------------------------------


async def test_an_ack_sends_pagerduty_acknowledge_once_per_episode(receiver):
    pd = hook("pagerduty", url=receiver.url("/pd"), secret_env="PD")
    d = HookDispatcher([pd, hook("webhook", url=receiver.url("/wh"))], environ={"PD": PD_KEY}, backoff=FAST)
    a, b = alert(gpu=1), alert(gpu=2)
    async with running(d):
        d.submit([a, b])
        await until(lambda: stats(d, "pagerduty").sent == 2)
        acked = replace(a, acked_at=a.starts_at + 60)
        for _ in range(3):  # applied every 2 s in the daemon: one acknowledge, not one per round
            d.controls([acked, b])
        await until(lambda: stats(d, "pagerduty").sent == 3)
        again = replace(acked, starts_at=a.starts_at + 900)
        d.controls([again, b])  # a new episode of the same alert, acked: acknowledged again
        await until(lambda: stats(d, "pagerduty").sent == 4)
    events = [(e["event_action"], e["dedup_key"]) for e in receiver.bodies("/pd")]
    assert events == [("trigger", a.fingerprint), ("trigger", b.fingerprint), ("acknowledge", a.fingerprint),
                      ("acknowledge", a.fingerprint)]
    assert receiver.bodies("/pd")[2] == {"routing_key": PD_KEY, "event_action": "acknowledge",
                                         "dedup_key": a.fingerprint}
    assert len(receiver.bodies("/wh")) == 2  # other kinds get no acknowledgement


async def test_alertmanager_takes_up_firing_alerts_it_never_saw_fire(receiver):
    """After a restart the daemon restores its firing alerts without paging again; Alertmanager
    still has to hear of them, or it resolves them after its resolve_timeout."""
    d = HookDispatcher([hook("alertmanager", urls=[receiver.url("/am")]), hook("webhook", url=receiver.url("/wh"))],
                       backoff=FAST)
    restored, silenced, pending = alert(gpu=1), alert(gpu=2), replace(alert(gpu=3), status="pending")
    async with running(d):
        d.controls([restored, silenced, pending], silenced=[silenced.fingerprint])
        await until(lambda: stats(d, "alertmanager").sent == 1)
    (body,) = receiver.bodies("/am" + API)
    assert [x["labels"]["gpu"] for x in body] == ["1"] and receiver.bodies("/wh") == []


async def test_an_alert_that_ended_while_silenced_is_no_longer_repeated(receiver):
    d = HookDispatcher([hook("alertmanager", urls=[receiver.url("/am")], repeat_interval_s=0.1)], backoff=FAST)
    a = alert()
    async with running(d):
        d.submit([a])
        await until(lambda: len(receiver.bodies("/am" + API)) >= 2)
        d.controls([], silenced=[])  # resolved while silenced: its resolve was never handed over
        n = len(receiver.bodies("/am" + API))
        await asyncio.sleep(0.4)
    assert len(receiver.bodies("/am" + API)) <= n + 1  # one may have been in flight


@needs_mosquitto
async def test_acks_by_the_cli_and_over_the_broker_reach_pagerduty_as_acknowledge(tmp_path):
    """A real daemon with a PagerDuty hook (its URL pointed at a local receiver): `nvmon alerts
    ack` on the node's database, and a shared ack over the broker (what the TUI's `k` publishes),
    each send `acknowledge` for that dedup key, once."""
    receiver = Receiver()
    key = tmp_path / "pd.key"
    key.write_text(PD_KEY)
    key.chmod(0o600)  # a secret file: private to its reader, or refused (nvmon.secretfile)
    hooks = f'[[hooks]]\ntype = "pagerduty"\nurl = "{receiver.url("/pd")}"\nsecret_file = "{key}"\n'

    def events(action: str) -> dict[str, str]:
        return {e["dedup_key"]: e for e in receiver.bodies("/pd") if e["event_action"] == action}

    try:
        with Broker(tmp_path) as broker:
            d = DaemonProc(tmp_path, broker=broker.url, sim="hgx-h100,pcie_width=3:8@1,nvlink_down=2.5@1",
                           extra_toml=ALERTS_TOML + hooks).start()
            try:
                await wait_until(lambda: len(events("trigger")) == 2, 30, "both alerts paged")
                by_code = {e["payload"]["class"]: fp for fp, e in events("trigger").items()}
                local, shared = by_code["pcie.width"], by_code["nvlink.link_down"]
                r = nvmon("alerts", "ack", local[:8], "--db", str(d.db), "--by", "alice")
                assert r.returncode == 0, r.stderr
                await wait_until(lambda: local in events("acknowledge"), 30, "the local ack sent on")
                r = nvmon("alerts", "ack", shared[:8], "--broker", broker.url, "--db", str(tmp_path / "none.db"))
                assert r.returncode == 0, r.stderr
                await wait_until(lambda: shared in events("acknowledge"), 30, "the shared ack sent on")
                await asyncio.sleep(2.5)  # another round of controls: no second acknowledge
            finally:
                assert d.stop() == 0
        acks = [e for e in receiver.bodies("/pd") if e["event_action"] == "acknowledge"]
        assert sorted(e["dedup_key"] for e in acks) == sorted([local, shared])
        assert acks[0] == {"routing_key": PD_KEY, "event_action": "acknowledge", "dedup_key": local}
        assert "Traceback" not in d.log_text() and "1 acknowledged alert(s) delivered" in d.log_text()
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
