"""Reconnect backoff (issue 16, item 5): a refusal (a wrong password, a bad certificate) backs off
on the slow schedule, to a minute in production; network trouble keeps retrying quickly. Against a
real Mosquitto, with short schedules so that nothing waits a minute: the attempts' times are read
off the session's error count, and the gaps between them must grow past the quick schedule's cap."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import uuid

import aiomqtt
import pytest
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from mqtt_broker import Broker, free_port, make_tls, needs_mosquitto, needs_openssl

from nvmon import aio
from nvmon.wire.mqtt import Backoff, MqttSettings, refused
from nvmon.wire.session import MqttSession

pytestmark = needs_mosquitto
LOG = logging.getLogger("nvmon.test.backoff")

QUICK_CAP = 0.2
# jitter 0: the delays are exactly 0.1, 0.2, 0.4, 0.8, 1.2, 1.2 ... for refusals, ≤ 0.2 otherwise
SHORT = Backoff(initial_s=0.05, max_s=QUICK_CAP, jitter=0.0, refused_initial_s=0.1, refused_max_s=1.2)


async def attempt_times(settings: MqttSettings, n: int, timeout: float = 15.0) -> list[float]:
    """Monotonic times of the first `n` failed attempts of a session that cannot get in."""
    s = MqttSession(settings, client_id="t-" + uuid.uuid4().hex[:8], log=LOG, what="test", backoff=SHORT)

    async def never(client) -> None:  # pragma: no cover - the broker lets nobody in
        raise AssertionError("connected")

    times: list[float] = []
    async with aio.running(s.run(never), name="test.backoff"):
        deadline = time.monotonic() + timeout
        seen = 0
        while len(times) < n:
            assert time.monotonic() < deadline, f"only {len(times)} attempts in {timeout} s: {s.stats}"
            errors = s.stats.errors
            if errors > seen:
                times += [time.monotonic()] * (errors - seen)
                seen = errors
            await asyncio.sleep(0.005)
        assert s.stats.connects == 0
        last_error = s.stats.last_error
    return times, last_error


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


async def test_wrong_password_backs_off_past_the_quick_cap(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    pw = tmp_path / "password"
    pw.write_text("not-the-password\n")
    pw.chmod(0o600)  # a secret file: private to its reader, or refused (nvmon.secretfile)
    with Broker(tmp_path, users={"nvmon": "s3cret"}) as broker:
        settings = MqttSettings(url=broker.url, username="nvmon", password_file=str(pw), timeout_s=2)
        times, last_error = await attempt_times(settings, 6)
    g = gaps(times)
    print("gaps after a refused login:", [round(x, 2) for x in g])
    assert "not authori" in last_error.lower()
    # 0.1, 0.2, 0.4, 0.8, 1.2 (+ the handshake each): growing, and well past the quick cap of 0.2 s
    assert g[2] > 1.5 * QUICK_CAP and g[3] > 3 * QUICK_CAP and g[4] >= 1.1, g
    assert g[4] < 2.0, g  # capped at refused_max_s
    assert all(b > a * 1.3 for a, b in zip(g[:4], g[1:4])), g
    errors = [r.getMessage() for r in caplog.records if r.name == LOG.name and r.levelno == logging.ERROR]
    assert len(errors) == 1 and "up to 1.2 s" in errors[0], errors


async def test_nobody_listening_retries_quickly(tmp_path):
    settings = MqttSettings(url=f"mqtt://127.0.0.1:{free_port()}", timeout_s=2)
    times, last_error = await attempt_times(settings, 8)
    g = gaps(times)
    assert "refused" in last_error.lower()  # ECONNREFUSED: the network's "no", not the broker's
    assert max(g) < QUICK_CAP + 0.15, g  # the quick schedule, capped at 0.2 s


@needs_openssl
async def test_an_untrusted_broker_certificate_backs_off_too(tmp_path):
    tls = make_tls(tmp_path / "tls")
    with Broker(tmp_path, tls=tls) as broker:
        settings = MqttSettings(url=broker.url, ca_file=str(tls.other_ca), timeout_s=2)
        times, last_error = await attempt_times(settings, 5)
    g = gaps(times)
    assert last_error.startswith("TLS handshake failed"), last_error
    assert g[2] > 1.5 * QUICK_CAP and g[3] > 3 * QUICK_CAP, g


def test_what_counts_as_a_refusal():
    def connack(name: str):
        return MqttConnectError(ReasonCode(PacketTypes.CONNACK, name))

    assert refused(connack("Bad user name or password")) and refused(connack("Not authorized"))
    assert refused(MqttConnectError(4)) and refused(MqttConnectError(5))
    assert not refused(connack("Server unavailable")) and not refused(MqttConnectError(3))
    assert refused(aiomqtt.MqttError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"))
    assert refused(ssl.SSLError("bad key")) and refused(FileNotFoundError(2, "No such file", "/etc/nvmon/pw"))
    for transient in (aiomqtt.MqttError("[Errno 111] Connection refused"), aiomqtt.MqttError("timed out"),
                      ConnectionResetError(104, "reset"), aiomqtt.MqttError("Disconnected during message iteration")):
        assert not refused(transient), transient


def test_the_production_schedules():
    b = Backoff(initial_s=0.5, max_s=4.0)  # the daemon's
    assert max(b.delay(a) for a in range(20) for _ in range(5)) <= 4.0
    slow = [b.delay(a, refused=True) for a in range(12)]
    assert 1.0 <= slow[0] <= 2.0 and all(30.0 <= d <= 60.0 for d in slow[6:]), slow
    with pytest.raises(TypeError):
        b.delay(1, True)  # refused is keyword-only: a positional flag would read as a number
