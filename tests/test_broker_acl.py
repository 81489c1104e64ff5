"""The shipped Mosquitto configuration (systemd/mosquitto/nvmon.conf and nvmon.acl) on a real
Mosquitto, as written but for its paths and port: every forgery of issue 16 is refused by the
broker. A node account cannot write another node's topics nor a control topic, an operator can
write the control topic, views read and cannot write, nobody gets in without a login, and a real
daemon with its node account publishes its own topics (and does not warn: TLS and a login).

How a refusal is seen: Mosquitto drops a denied publish without telling the client, so each test
publishes the forgeries first and a message that is allowed last, on one connection; the broker
handles one client's messages in order and delivers them to a subscriber in order, so once the
allowed one has arrived, a forgery that got through would have arrived before it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from mqtt_broker import Recorder, make_tls, needs_mosquitto, needs_openssl, password_line, shipped_broker, wait_until

from nvmon.wire.contract import control_topic, topic
from nvmon.wire.mqtt import MqttSettings, make_client

pytestmark = [needs_mosquitto, needs_openssl]

ACCOUNTS = {"gpu-001": "pw-gpu-001", "gpu-002": "pw-gpu-002", "@ops": "pw-ops", "@fleet": "pw-fleet",
            "@view": "pw-view"}
C = "c1"


class Site:
    """The shipped broker with ACCOUNTS, and each account's client settings (its password file 0600)."""

    def __init__(self, tmp: Path):
        self.tls = make_tls(tmp / "tls")
        passwd = tmp / "nvmon.passwd"
        passwd.write_text("".join(password_line(u, p) + "\n" for u, p in ACCOUNTS.items()))
        self.broker = shipped_broker(tmp, passwd=passwd, tls=self.tls)
        self.tmp = tmp

    def settings(self, user: str | None) -> MqttSettings:
        if user is None:
            return MqttSettings(url=self.broker.url, ca_file=str(self.tls.ca), timeout_s=3)
        pw = self.tmp / f"{user}.password"
        pw.write_text(ACCOUNTS[user] + "\n")
        pw.chmod(0o600)
        return MqttSettings(url=self.broker.url, username=user, password_file=str(pw), ca_file=str(self.tls.ca))

    def recorder(self, user: str, filter: str = "nvmon/v1/#") -> Recorder:
        return Recorder(self.broker.url, filter, ca_file=str(self.tls.ca), username=user, password=ACCOUNTS[user])


@pytest.fixture
def site(tmp_path):
    s = Site(tmp_path)
    with s.broker:
        yield s


async def publish_all(settings: MqttSettings, messages: list[tuple[str, bytes]]) -> None:
    async with make_client(settings, client_id=f"t-{settings.username}") as c:
        for t, payload in messages:
            await c.publish(t, payload, qos=1)


def topics(rec: Recorder) -> list[str]:
    return [m.topic for m in rec.messages]


async def test_a_node_writes_only_its_own_topics(site):
    forged = [(topic(C, "gpu-002", "status"), b'{"forged": 1}'), (topic(C, "gpu-002", "sample"), b"{}"),
              (control_topic(C), b'{"forged": 1}'), (f"nvmon/v1/{C}/gpu-001", b"{}"),  # the name level itself
              (f"nvmon/v1/{C}/gpu-001/status/x", b"{}"), ("elsewhere/t", b"{}")]
    own = [(topic(C, "gpu-001", "status"), b'{"own": 1}'), (topic("other", "gpu-001", "alerts"), b'{"own": 2}')]
    async with site.recorder("@ops", "#") as rec:
        await publish_all(site.settings("gpu-001"), forged + own)
        await wait_until(lambda: len(rec.messages) >= 2, 15, "the node's own messages")
        await asyncio.sleep(0.2)
    assert topics(rec) == [t for t, _ in own]


async def test_only_an_operator_writes_the_control_topic_and_the_nodes_read_it(site):
    async with site.recorder("gpu-002", control_topic(C)) as node_reads, site.recorder("@view") as view:
        await publish_all(site.settings("@fleet"), [(control_topic(C), b'{"by": "fleet"}')])
        await publish_all(site.settings("@view"), [(control_topic(C), b'{"by": "view"}')])
        await publish_all(site.settings("gpu-001"), [(control_topic(C), b'{"by": "node"}')])
        await publish_all(site.settings("@ops"), [(control_topic(C), b'{"by": "ops"}'),
                                                  (topic(C, "gpu-009", "status"), b"")])  # nodes forget
        await wait_until(lambda: node_reads.messages and len(view.messages) >= 2, 15, "the operator's writes")
        await asyncio.sleep(0.2)
    assert [json.loads(m.payload)["by"] for m in node_reads.messages] == ["ops"]
    assert topics(view) == [control_topic(C), topic(C, "gpu-009", "status")]


async def test_views_and_the_fleet_read_everything_and_write_nothing(site):
    async with site.recorder("@view") as view, site.recorder("@fleet") as fleet:
        for user in ("@view", "@fleet"):
            await publish_all(site.settings(user), [(topic(C, "gpu-001", "status"), b'{"forged": 1}'),
                                                    (topic(C, "gpu-002", "sample"), b"{}"), (control_topic(C), b"{}")])
        await publish_all(site.settings("gpu-001"), [(topic(C, "gpu-001", "status"), b'{"own": 1}')])
        await wait_until(lambda: view.messages and fleet.messages, 15, "the node's message at both views")
        await asyncio.sleep(0.2)
    for rec in (view, fleet):
        assert [(m.topic, m.payload) for m in rec.messages] == [(topic(C, "gpu-001", "status"), b'{"own": 1}')]


async def test_only_the_fleet_writes_cluster_summaries(site):
    from nvmon.wire.summary import summary_topic

    async with site.recorder("@view", summary_topic(C)) as view:
        for user in ("gpu-001", "@ops", "@view", "@fleet"):
            await publish_all(site.settings(user), [(summary_topic(C), json.dumps({"by": user}).encode())])
        await wait_until(lambda: view.messages, 15, "the fleet's summary")
        await asyncio.sleep(0.2)
    assert [json.loads(m.payload)["by"] for m in view.messages] == ["@fleet"]


async def test_nobody_gets_in_without_a_login(site):
    from aiomqtt.exceptions import MqttConnectError

    with pytest.raises(MqttConnectError):
        async with make_client(site.settings(None), client_id="anon"):
            pass
    wrong = site.tmp / "wrong.password"
    wrong.write_text("not-it\n")
    wrong.chmod(0o600)
    with pytest.raises(MqttConnectError):
        async with make_client(MqttSettings(url=site.broker.url, username="gpu-001", password_file=str(wrong),
                                            ca_file=str(site.tls.ca)), client_id="wrong"):
            pass


async def test_a_real_daemon_publishes_with_its_node_account_and_does_not_warn(site):
    s = site.settings("gpu-001")
    cfg = site.tmp / "nvmon.toml"
    cfg.write_text(f'[node]\nname = "gpu-001"\ncluster = "{C}"\n[mqtt]\nbroker = "{s.url}"\nusername = "gpu-001"\n'
                   f'password_file = "{s.password_file}"\nca_file = "{s.ca_file}"\nkeepalive_s = 2\n')
    log = site.tmp / "daemon.log"
    async with site.recorder("@fleet") as rec:
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "nvmon", "daemon", "--config", str(cfg), "--db",
                                     str(site.tmp / "n.db"), "--sim", "hgx-h100", "--interval", "0.5",
                                     "--log-level", "info"], stdout=out, stderr=out)
            try:
                await wait_until(lambda: {"status", "inventory", "sample"} <= {t.rsplit("/", 1)[1] for t in topics(rec)},
                                 30, "the daemon's status, inventory and samples")
            finally:
                proc.terminate()
                assert proc.wait(10) == 0
    assert {t.rsplit("/", 1)[0] for t in topics(rec)} == {f"nvmon/v1/{C}/gpu-001"}
    text = log.read_text()
    assert "connected as" in text and "WARNING" not in text and "Traceback" not in text, text
