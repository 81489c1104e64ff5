"""Reconnect backoff (issue 16, item 5): a refusal (a wrong password, a bad certificate) backs off
on the slow schedule, to a minute in production; network trouble keeps retrying quickly. Against a
real Mosquitto, with short schedules so that nothing waits a minute. Which schedule a failure took
is read off the delays the session asks its Backoff for (state, exact with jitter 0); that it really
waits them, off the time between those asks, which can only be longer on a slow machine (so only
lower bounds are put on it, never upper ones)."""

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


class _Asked(list):
    """(monotonic time, refused, delay) of each delay a Backoff was asked for."""


def recording(b: Backoff, asked: _Asked) -> Backoff:
    class Recording(Backoff):
        def delay(self, attempt: int, *, refused: bool = False) -> float:
            d = Backoff.delay(self, attempt, refused=refused)
            asked.append((time.monotonic(), refused, d))
            return d

    return Recording(**{f: getattr(b, f) for f in Backoff.__dataclass_fields__})


async def attempt_times(settings: MqttSettings, n: int, timeout: float = 15.0) -> tuple[_Asked, str]:
    """The delays asked for after the first `n` failed attempts of a session that cannot get in
    (each with the time it was asked, just before the session sleeps it), and its last error."""
    asked = _Asked()
    s = MqttSession(settings, client_id="t-" + uuid.uuid4().hex[:8], log=LOG, what="test",
                    backoff=recording(SHORT, asked))

    async def never(client) -> None:  # pragma: no cover - the broker lets nobody in
        raise AssertionError("connected")

    async with aio.running(s.run(never), name="test.backoff"):
        deadline = time.monotonic() + timeout
        while len(asked) < n:
            assert time.monotonic() < deadline, f"only {len(asked)} attempts in {timeout} s: {s.stats}"
            await asyncio.sleep(0.005)
        assert s.stats.connects == 0 and s.stats.errors >= n
        last_error = s.stats.last_error
    return asked[:n], last_error


def delays(asked: _Asked) -> list[float]:
    return [round(d, 6) for _, _, d in asked]


def waited(asked: _Asked) -> None:
    """Between two asks the session slept the first delay (then tried again): never less."""
    for (t0, _, d), (t1, _, _) in zip(asked, asked[1:]):
        assert t1 - t0 >= d - 0.01, [(round(b[0] - a[0], 3), a[2]) for a, b in zip(asked, asked[1:])]


async def test_wrong_password_backs_off_past_the_quick_cap(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    pw = tmp_path / "password"
    pw.write_text("not-the-password\n")
    pw.chmod(0o600)  # a secret file: private to its reader, or refused (nvmon.secretfile)
    with Broker(tmp_path, users={"nvmon": "s3cret"}) as broker:
        settings = MqttSettings(url=broker.url, username="nvmon", password_file=str(pw), timeout_s=2)
        asked, last_error = await attempt_times(settings, 6)
    print("delays after a refused login:", delays(asked))
    assert "not authori" in last_error.lower()
    # the slow schedule: growing, well past the quick cap of 0.2 s, capped at refused_max_s
    assert all(r for _, r, _ in asked) and delays(asked) == [0.1, 0.2, 0.4, 0.8, 1.2, 1.2], delays(asked)
    waited(asked)
    errors = [r.getMessage() for r in caplog.records if r.name == LOG.name and r.levelno == logging.ERROR]
    assert len(errors) == 1 and "up to 1.2 s" in errors[0], errors


async def test_nobody_listening_retries_quickly(tmp_path):
    settings = MqttSettings(url=f"mqtt://127.0.0.1:{free_port()}", timeout_s=2)
    asked, last_error = await attempt_times(settings, 8)
    assert "refused" in last_error.lower()  # ECONNREFUSED: the network's "no", not the broker's
    # the quick schedule, capped at 0.2 s
    assert not any(r for _, r, _ in asked) and delays(asked) == [0.05, 0.1] + [QUICK_CAP] * 6, delays(asked)
    waited(asked)
    # and nothing else held the retries up: 1.35 s of delays here; a retry that also waited out the
    # 2 s connect timeout would take 14 s more. The room is for a slow machine.
    took = asked[-1][0] - asked[0][0]
    assert took < sum(d for _, _, d in asked[:-1]) + 5.0, took


@needs_openssl
async def test_an_untrusted_broker_certificate_backs_off_too(tmp_path):
    tls = make_tls(tmp_path / "tls")
    with Broker(tmp_path, tls=tls) as broker:
        settings = MqttSettings(url=broker.url, ca_file=str(tls.other_ca), timeout_s=2)
        asked, last_error = await attempt_times(settings, 5)
    assert last_error.startswith("TLS handshake failed"), last_error
    assert all(r for _, r, _ in asked) and delays(asked) == [0.1, 0.2, 0.4, 0.8, 1.2], delays(asked)
    waited(asked)


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
