"""Broker settings, URL parsing, backoff and error wording — no broker needed."""

from __future__ import annotations

import ssl

import aiomqtt
import pytest
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from nvmon.wire.mqtt import Backoff, BrokerAddress, MqttSettings, describe_error, parse_broker_url
from nvmon.wire.publisher import Publisher


@pytest.mark.parametrize("url,want", [
    ("mqtt://broker", BrokerAddress(False, "broker", 1883)),
    ("mqtts://broker.example.org", BrokerAddress(True, "broker.example.org", 8883)),
    ("mqtt://10.1.2.3:1884", BrokerAddress(False, "10.1.2.3", 1884)),
    ("mqtts://[::1]:8884/", BrokerAddress(True, "::1", 8884)),
    (" mqtt://b:1 ", BrokerAddress(False, "b", 1)),
])
def test_parse_broker_url(url, want):
    assert parse_broker_url(url) == want
    assert parse_broker_url(str(want)) == want


@pytest.mark.parametrize("url,why", [
    ("http://broker:1883", "expected mqtt://"),
    ("broker:1883", "expected mqtt://"),
    ("mqtt://user:pw@broker", "no credentials"),
    ("mqtt://", "no host"),
    ("mqtt://broker:99999", "broker URL"),
    ("mqtt://broker:port", "broker URL"),
    ("mqtt://broker/topic", "path"),
    ("mqtt://broker?x=1", "path or query"),
])
def test_parse_broker_url_refuses(url, why):
    with pytest.raises(ValueError, match=why) as e:
        parse_broker_url(url)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kw,why", [
    ({"url": "mqtt://b", "ca_file": "/x"}, "mqtts"),
    ({"url": "mqtt://b", "tls_insecure": True}, "mqtts"),
    ({"url": "mqtts://b", "cert_file": "/c"}, "both cert_file and key_file"),
    ({"url": "mqtt://b", "password_file": "/p"}, "needs a username"),
    ({"url": "mqtt://b", "keepalive_s": 0}, "keepalive"),
    ({"url": "ftp://b"}, "expected mqtt://"),
])
def test_settings_are_checked_when_made(kw, why):
    with pytest.raises(ValueError, match=why):
        MqttSettings(**kw)


def test_password_comes_from_the_file_without_its_newline(tmp_path):
    f = tmp_path / "pw"
    f.write_text(" pass word \n")
    f.chmod(0o600)  # a secret file: private to its reader, or refused (nvmon.secretfile)
    assert MqttSettings(url="mqtt://b", username="u", password_file=str(f)).read_password() == " pass word "
    assert MqttSettings(url="mqtt://b").read_password() is None
    with pytest.raises(OSError):
        MqttSettings(url="mqtt://b", username="u", password_file=str(tmp_path / "missing")).read_password()


def test_tls_context(tmp_path):
    assert MqttSettings(url="mqtt://b").tls_context() is None
    ctx = MqttSettings(url="mqtts://b").tls_context()  # system CAs
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert not MqttSettings(url="mqtts://b", tls_insecure=True).tls_context().check_hostname
    with pytest.raises(OSError):
        MqttSettings(url="mqtts://b", ca_file=str(tmp_path / "none.pem")).tls_context()


def test_backoff_grows_to_its_cap_with_jitter():
    b = Backoff(initial_s=0.5, max_s=30.0)
    for attempt in range(40):
        d = min(30.0, 0.5 * 2 ** attempt)
        for _ in range(20):
            assert 0.5 * d <= b.delay(attempt) <= d
    assert len({round(b.delay(3), 6) for _ in range(20)}) > 1  # jittered, not lock-step


def test_errors_are_described_in_one_line():
    refused = MqttConnectError(ReasonCode(PacketTypes.CONNACK, identifier=135))
    assert describe_error(refused) == \
        "broker refused the connection: Not authorized (check username and password_file)"
    tls = aiomqtt.MqttError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed (_ssl.c:1006)")
    assert describe_error(tls).startswith("TLS handshake failed: [SSL: CERTIFICATE_VERIFY_FAILED]")
    assert describe_error(FileNotFoundError(2, "No such file or directory", "/etc/nvmon/pw")) == \
        "No such file or directory: /etc/nvmon/pw"
    assert "\n" not in describe_error(RuntimeError("two\nlines"))


def test_publisher_refuses_names_that_cannot_be_topic_levels():
    for cluster, node in (("c/1", "n"), ("c", "n+"), ("c", "")):
        with pytest.raises(ValueError):
            Publisher(MqttSettings(), cluster=cluster, node=node, version="1", interval_s=1)
