"""The `[mqtt]` table (issue 16, item 6): IPv6 broker URLs (`mqtt://[::1]:1883`) and `tls_insecure`
are accepted in the daemon's and the fleet's config files, as `--broker` and `nvmon tui
--tls-insecure` already were. Through a real daemon and a real Mosquitto listening on ::1 only (a
TLS one whose certificate names 127.0.0.1 and localhost, not ::1: only `tls_insecure` gets in)."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mqtt_broker import Broker, make_tls, needs_mosquitto, needs_openssl, wait_until

from nvmon.daemon.config import ConfigError, load_config
from nvmon.fleet.service import FleetConfigError, load_fleet_config
from nvmon.wire.mqtt import MqttSettings, make_client


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")


def test_ipv6_urls_and_tls_insecure_load(tmp_path):
    cfg = tmp_path / "nvmon.toml"
    for url in ("mqtt://[::1]:1883", "mqtts://[2001:db8::5]", "mqtt://broker.example:1884", "mqtts://10.0.0.1/"):
        cfg.write_text(f'[mqtt]\nbroker = "{url}"\n' + ("tls_insecure = true\n" if url.startswith("mqtts") else ""))
        assert load_config(cfg).mqtt.broker == url
        f = load_fleet_config(cfg)
        assert f.mqtt.broker == url and f.mqtt.tls_insecure == url.startswith("mqtts")
        MqttSettings(url=url, tls_insecure=f.mqtt.tls_insecure)  # what the daemon builds from it


def test_bad_broker_urls_are_one_line(tmp_path):
    cfg = tmp_path / "nvmon.toml"
    for text, expect in (('broker = "mqtt://[::1"', "mqtt://HOST[:PORT]"),
                         ('broker = "mqtt://[::1]:99999"', "mqtt://HOST[:PORT]"),
                         ('broker = "http://[::1]:1883"', "mqtt://HOST[:PORT]"),
                         ('broker = "mqtt://u:pw@[::1]:1883"', "no credentials in the URL"),
                         ('broker = "mqtt://h/x"', "mqtt://HOST[:PORT]"),
                         ('broker = "mqtt://h:1883"\ntls_insecure = true', "tls_insecure needs an mqtts://"),
                         ('tls_insecure = "yes"', "tls_insecure")):
        cfg.write_text(f"[mqtt]\n{text}\n")
        for load, error in ((load_config, ConfigError), (load_fleet_config, FleetConfigError)):
            with pytest.raises(error) as e:
                load(cfg)
            msg = str(e.value)
            assert expect in msg and "\n" not in msg and "pw@" not in msg, msg
        r = subprocess.run([sys.executable, "-m", "nvmon", "fleet", "--config", str(cfg), "--db",
                            str(tmp_path / "f.db")], capture_output=True, text=True, timeout=30)
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and expect in r.stderr, r.stderr


class Ipv6Broker(Broker):
    """The test Mosquitto, listening on ::1 only."""

    def __init__(self, workdir: Path, **kw):
        super().__init__(workdir, **kw)
        text = self.conf.read_text().replace(f"listener {self.port} 127.0.0.1", f"listener {self.port} ::1")
        self.conf.write_text(text)

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://[::1]:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        self.proc = subprocess.Popen([self._binary(), "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"mosquitto exited at start: {self.log_text()[-500:]}"
            try:
                with socket.create_connection(("::1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"mosquitto did not listen on [::1]:{self.port}")

    @staticmethod
    def _binary() -> str:
        from mqtt_broker import MOSQUITTO
        return MOSQUITTO


async def _sample_on(url: str, ca_file: str | None, *, tls_insecure: bool, timeout: float) -> bool:
    settings = MqttSettings(url=url, ca_file=ca_file, tls_insecure=tls_insecure)
    async with make_client(settings, client_id="ipv6-test") as c:
        await c.subscribe("nvmon/v1/v6/n1/sample", qos=0)
        async with asyncio.timeout(timeout):
            async for _ in c.messages:
                return True
    return False


def _daemon(tmp_path: Path, mqtt: str) -> tuple[subprocess.Popen, Path]:
    cfg, log = tmp_path / "node.toml", tmp_path / "daemon.log"
    cfg.write_text(f'[node]\ncluster = "v6"\n[mqtt]\n{mqtt}\nkeepalive_s = 2\n')
    out = open(log, "ab")
    p = subprocess.Popen([sys.executable, "-m", "nvmon", "daemon", "--config", str(cfg), "--db", str(tmp_path / "n.db"),
                          "--node", "n1", "--sim", "hgx-h100", "--interval", "0.5"], stdout=out, stderr=out)
    out.close()
    return p, log


def _stop(p: subprocess.Popen) -> int:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    return p.wait(10)


@needs_mosquitto
@needs_ipv6
async def test_daemon_publishes_to_an_ipv6_broker_from_its_config(tmp_path):
    with Ipv6Broker(tmp_path) as broker:
        p, log = _daemon(tmp_path, f'broker = "{broker.url}"')
        try:
            assert await _sample_on(broker.url, None, tls_insecure=False, timeout=20), log.read_text()
            await wait_until(lambda: f"MQTT {broker.url}: connected as" in log.read_text(), 15, "the log line")
        finally:
            assert _stop(p) == 0, log.read_text()


@needs_mosquitto
@needs_ipv6
@needs_openssl
async def test_tls_insecure_in_the_config_reaches_a_broker_its_certificate_does_not_name(tmp_path):
    tls = make_tls(tmp_path / "tls")  # the server certificate names 127.0.0.1 and localhost, not ::1
    with Ipv6Broker(tmp_path, tls=tls) as broker:
        with pytest.raises(Exception, match="IP address mismatch|certificate verify failed"):
            await _sample_on(broker.url, str(tls.ca), tls_insecure=False, timeout=5)
        p, log = _daemon(tmp_path, f'broker = "{broker.url}"\nca_file = "{tls.ca}"\ntls_insecure = true')
        try:
            assert await _sample_on(broker.url, str(tls.ca), tls_insecure=True, timeout=20), log.read_text()
            assert "TLS handshake failed" not in log.read_text()
        finally:
            assert _stop(p) == 0, log.read_text()
