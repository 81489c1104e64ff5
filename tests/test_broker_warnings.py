"""nvmon says at start-up, once, when its broker connection is open to abuse (nvmon.wire.session,
MqttSettings.exposure): a broker that lets it in without a login (anyone may then write as any
node or silence alerts), or a password sent over plain mqtt://. One WARNING line per process and
broker, whatever the reconnects and however many sessions share the settings; none with TLS and a
login. Real Mosquitto; in-process sessions and the real `nvmon fleet` / `nvmon daemon`."""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid

from mqtt_broker import Broker, make_tls, needs_mosquitto, needs_openssl, wait_until

from nvmon import aio
from nvmon.wire.mqtt import Backoff, MqttSettings, make_client
from nvmon.wire.session import MqttSession

pytestmark = needs_mosquitto

FAST = Backoff(initial_s=0.05, max_s=0.3, refused_initial_s=0.05, refused_max_s=0.3)
LOG = logging.getLogger("nvmon.test.warnings")
SECTION = 'docs/install.md, "Securing nvmon"'


async def subscribe(client) -> None:
    await client.subscribe("t/#", qos=1)


async def idle(client) -> None:
    async for _ in client.messages:
        pass


def running(s: MqttSession, name: str):
    """The session until the block ends; `connected` means subscribed (the subscribe is its setup),
    so a block that ends at `connected` never cancels a subscribe whose SUBACK is on its way (aiomqtt
    would log the late SUBACK as an error)."""
    return aio.running(s.run(idle, setup=subscribe), name=name)


def session(settings: MqttSettings) -> MqttSession:
    return MqttSession(settings, client_id="t-" + uuid.uuid4().hex[:8], log=LOG, what="test", backoff=FAST)


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG.name and r.levelno == logging.WARNING
            and SECTION in r.getMessage()]


async def test_an_anonymous_broker_is_said_once_across_reconnects_and_sessions(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=LOG.name)
    with Broker(tmp_path) as broker:
        settings = MqttSettings(url=broker.url, keepalive_s=2, timeout_s=2)
        a, b = session(settings), session(settings)  # e.g. nvmon fleet's subscriber and its controls
        async with running(a, "a"), running(b, "b"):
            await wait_until(lambda: a.connected and b.connected, 15, "both connected")
            broker.restart()
            await wait_until(lambda: a.stats.connects == 2 and b.stats.connects == 2, 30, "both back")
    assert warnings(caplog) == [f"test {broker.url}: connected without a username or client certificate: the "
                                "broker is unauthenticated; anyone who reaches it may publish as any node or "
                                f"silence alerts; give each client an account ({SECTION})"]


async def test_a_password_over_plain_mqtt_is_said_before_it_travels(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=LOG.name)
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    pw.chmod(0o600)
    with Broker(tmp_path, users={"gpu-001": "s3cret"}) as broker:
        s = session(MqttSettings(url=broker.url, username="gpu-001", password_file=str(pw), timeout_s=2))
        async with running(s, "s"):
            await wait_until(lambda: s.connected, 15, "connected")
            broker.restart()
            await wait_until(lambda: s.stats.connects == 2, 30, "back")
    assert warnings(caplog) == [f"test {broker.url}: the password of user 'gpu-001' travels unencrypted "
                                f"(mqtt://, no TLS); use an mqtts:// broker ({SECTION})"]
    first_attempt = next(i for i, r in enumerate(caplog.records) if "connected as" in r.getMessage())
    assert SECTION in caplog.records[first_attempt - 1].getMessage()  # said before the password went out


@needs_openssl
async def test_tls_and_a_login_say_nothing(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=LOG.name)
    tls = make_tls(tmp_path / "tls")
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    pw.chmod(0o600)
    with Broker(tmp_path, users={"gpu-001": "s3cret"}, tls=tls) as broker:
        s = session(MqttSettings(url=broker.url, username="gpu-001", password_file=str(pw), ca_file=str(tls.ca)))
        async with running(s, "s"):
            await wait_until(lambda: s.connected, 15, "connected")
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_nvmon_fleet_on_an_anonymous_broker_warns_once(tmp_path):
    with Broker(tmp_path) as broker:
        log = tmp_path / "fleet.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "nvmon", "fleet", "--broker", broker.url, "--cluster", "c1",
                                     "--db", str(tmp_path / "fleet.db")], stdout=out, stderr=out)
            try:
                await wait_until(lambda: "subscribed to" in log.read_text(), 20, "the fleet subscribed")
                broker.restart()
                await wait_until(lambda: log.read_text().count("subscribed to") >= 2, 20, "subscribed again")
            finally:
                proc.terminate()
                assert proc.wait(10) == 0
    text = log.read_text()
    lines = [ln for ln in text.splitlines() if "unauthenticated" in ln]
    assert len(lines) == 1 and "WARNING" in lines[0] and SECTION in lines[0], text
    assert "Traceback" not in text


async def test_a_late_suback_of_a_cancelled_subscribe_is_no_error(caplog):
    """A stop or reconnect can cancel a subscribe whose SUBACK is already on its way; aiomqtt then
    meets an unknown message id and logs it as an ERROR with a traceback. nvmon's client logger
    says it once at debug instead. The callback is aiomqtt's own, called as paho calls it."""
    caplog.set_level(logging.DEBUG)
    client = make_client(MqttSettings(url="mqtt://127.0.0.1:1"), client_id="t-late")
    client._on_subscribe(client._client, None, 4242, [], None)  # noqa: SLF001 - aiomqtt's paho callback
    client._on_unsubscribe(client._client, None, 4243, [], None)  # noqa: SLF001
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    late = [r.getMessage() for r in caplog.records if "came late" in r.getMessage()]
    assert late == ["mqtt: acknowledgement of a cancelled (un)subscribe came late (message id 4242)",
                    "mqtt: acknowledgement of a cancelled (un)subscribe came late (message id 4243)"]
    # Other aiomqtt warnings still come through, under nvmon's name.
    client._logger.warning("Message queue is full. Discarding message.")
    assert [(r.name, r.levelname) for r in caplog.records if r.levelno >= logging.WARNING] == \
        [("nvmon.wire.aiomqtt", "WARNING")]
