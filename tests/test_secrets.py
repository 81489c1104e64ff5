"""Secret files are refused when others may read them, as ssh refuses a loose private key
(nvmon.secretfile): the MQTT password file and TLS key (at start, one line naming the file and the
chmod that fixes it, and at each connection), and a hook's secret_file. Through the real commands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mqtt_broker import Broker, needs_mosquitto

from nvmon.secretfile import LooseSecretFile, check_private
from nvmon.wire.mqtt import MqttSettings, describe_error


def secret(path: Path, text: str, mode: int) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def nvmon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvmon", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_file_private_to_its_owner_is_accepted(tmp_path, mode):
    check_private(secret(tmp_path / "pw", "x\n", mode))


@pytest.mark.parametrize("mode, who", [(0o644, "group or others"), (0o640, "group or others"),
                                       (0o604, "others"), (0o666, "group or others"), (0o620, "group or others")])
def test_a_file_the_reader_owns_must_be_0600(tmp_path, mode, who):
    f = secret(tmp_path / "pw", "x\n", mode)
    with pytest.raises(LooseSecretFile) as e:
        check_private(f)
    assert e.value.strerror == f"open to {who} (mode {mode:04o}); run chmod 600 {f}" and e.value.filename == str(f)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another owner")
def test_a_file_someone_else_owns_may_be_shared_read_only_with_its_group(tmp_path):
    """The shipped layout: root:nvmon 0640 read by the nvmon user through its group."""
    f = secret(tmp_path / "pw", "x\n", 0o640)
    os.chown(f, 65534, 65534)  # nobody: the reader (root here) is not the owner
    check_private(f)
    for mode in (0o644, 0o660, 0o641):
        f.chmod(mode)
        with pytest.raises(LooseSecretFile) as e:
            check_private(f)
        assert str(e.value).endswith(f"(mode {mode:04o}); run chmod 640 {f}"), e.value


def test_the_mqtt_password_and_key_are_checked_at_each_read(tmp_path):
    pw = secret(tmp_path / "pw", "s3cret\n", 0o644)
    s = MqttSettings(url="mqtt://b", username="u", password_file=str(pw))
    with pytest.raises(LooseSecretFile) as e:
        s.read_password()
    assert describe_error(e.value) == f"open to group or others (mode 0644); run chmod 600 {pw}: {pw}"
    assert str(e.value) == f"open to group or others (mode 0644); run chmod 600 {pw}"
    pw.chmod(0o600)
    assert s.read_password() == "s3cret"
    key = secret(tmp_path / "client.key", "not a key\n", 0o644)
    tls = MqttSettings(url="mqtts://b", cert_file=str(tmp_path / "c.pem"), key_file=str(key))
    with pytest.raises(LooseSecretFile):
        tls.tls_context()


@needs_mosquitto
def test_nvmon_refuses_a_password_file_others_may_read_in_one_line(tmp_path):
    pw = secret(tmp_path / "mqtt.password", "s3cret\n", 0o644)
    with Broker(tmp_path, users={"gpu-001": "s3cret"}) as broker:
        cfg = tmp_path / "nvmon.toml"
        cfg.write_text(f'[mqtt]\nbroker = "{broker.url}"\nusername = "gpu-001"\npassword_file = "{pw}"\n')
        r = nvmon("nodes", "--config", str(cfg), "--settle", "0.2", "--json")
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr == f"nvmon: password file {pw}: open to group or others (mode 0644); run chmod 600 {pw}\n"
        pw.chmod(0o600)
        r = nvmon("nodes", "--config", str(cfg), "--settle", "0.2", "--json")
        assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


def test_a_hook_secret_file_others_may_read_is_refused_in_one_line(tmp_path):
    key = secret(tmp_path / "pd.key", "0123456789abcdef0123456789abcdef\n", 0o644)
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(f'[[hooks]]\ntype = "pagerduty"\nurl = "http://127.0.0.1:1/"\nsecret_file = "{key}"\n')
    r = nvmon("hooks", "test", "--config", str(cfg))
    line = f"secret_file {key}: open to group or others (mode 0644); run chmod 600 {key}"
    assert r.returncode == 1 and line in r.stdout and r.stderr == "nvmon: 1 of 1 hook(s) failed\n", r.stdout
    assert "0123456789abcdef" not in r.stderr + r.stdout
    key.chmod(0o600)
    r = nvmon("hooks", "test", "--config", str(cfg))
    assert "mode 0644" not in r.stderr + r.stdout and "Traceback" not in r.stderr
