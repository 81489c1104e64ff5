"""docs/install.md, "Securing nvmon", run as written on a real Mosquitto and a real daemon.

What is changed, and only this: files go under a directory instead of /etc (`/etc/` → ROOT/etc/),
`sudo` runs the command as is (the test runs as root), `ssh HOST 'cmd'` runs `cmd` here,
`systemctl reload mosquitto` sends the test broker SIGHUP, `mosquitto_passwd FILE USER` is typed
`pw-USER` twice, the broker listens on a free loopback port with test certificates, and files the
section gives `root:nvmon` belong to `nobody:nogroup` (the test's reader, root, must not be their
owner, as the nvmon user is not: that is the case the mode check lets a group read). The block that
needs a terminal (the TUI) is not run; its flags are checked against `nvmon tui --help`."""

from __future__ import annotations

import asyncio
import grp
import logging
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from mqtt_broker import (SHIPPED, Broker, Recorder, TlsFiles, make_tls, needs_mosquitto, needs_openssl,
                         shipped_broker, wait_until)

from nvmon import aio
from nvmon.wire.mqtt import MqttSettings, make_client
from nvmon.wire.session import MqttSession

pytestmark = [needs_mosquitto, needs_openssl,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the section installs files -o root -g ...")]

REPO = Path(__file__).resolve().parent.parent
INSTALL = (REPO / "docs" / "install.md").read_text()
SECTION = INSTALL[INSTALL.index("\n## Securing nvmon\n"):]
SECTION = SECTION[:SECTION.index("\n## ", 1)]
BLOCKS = re.findall(r"^```(\w*)[^\n]*\n(.*?)^```$", SECTION, flags=re.M | re.S)  # (language, text), in order; a marker after the language (tests/test_docs_commands.py) is dropped
DOC_BROKER = "mqtts://broker.example.com:8883"

PRELUDE = r"""set -euo pipefail
sudo() { "$@"; }
ssh() { shift; bash -c "$*"; }
systemctl() { [ "$*" = "reload mosquitto" ] && kill -HUP "$(cat "$PIDFILE")"; }
mosquitto_passwd() {
  if [ $# -eq 2 ]; then printf 'pw-%s\npw-%s\n' "$2" "$2" | command mosquitto_passwd "$@"; else command mosquitto_passwd "$@"; fi
}
export -f sudo
"""


def blocks(lang: str, first_line: str) -> str:
    found = [text for lg, text in BLOCKS if lg == lang and text.startswith(first_line)]
    assert len(found) == 1, f"docs/install.md, Securing nvmon: one {lang} block starting {first_line!r}"
    return found[0]


def as_here(text: str, root: Path) -> str:
    text = text.replace("/etc/", f"{root}/etc/").replace("-o root -g nvmon", "-o nobody -g nogroup")
    try:
        grp.getgrnam("mosquitto")
    except KeyError:  # a Mosquitto installed without its own group
        text = text.replace("-g mosquitto", "-g root")
    return text


def run_sh(text: str, cwd: Path, root: Path, pidfile: Path) -> None:
    r = subprocess.run(["bash", "-c", PRELUDE + as_here(text, root)], cwd=cwd, capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PIDFILE": str(pidfile)})
    assert r.returncode == 0, f"{text}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"


def test_every_block_is_run_or_says_why_not():
    sh = [text for lang, text in BLOCKS if lang == "sh"]
    assert [t.splitlines()[0] for t in sh] == [
        "# broker host (root): the configuration, the ACL, an empty password file, the TLS files",
        "# broker host: one account per node, its user name = its node name ([node] name)",
        "# broker host → each node over ssh: its password (root:nvmon 0640) and ca.pem",
        "# operator's workstation (needs a terminal): the TUI as @ops",
        "# broker host, optional: each node writes under its own cluster only (here prod), not under any"]
    tui = blocks("sh", "# operator's workstation").splitlines()[-1].split()
    flags = {a for a in tui if a.startswith("--")}
    help_text = subprocess.run([sys.executable, "-m", "nvmon", "tui", "--help"], capture_output=True, text=True).stdout
    assert flags == {"--broker", "--username", "--password-file", "--ca-file"} and all(f in help_text for f in flags)
    assert "[docs/prometheus.md" in SECTION and 'listen = "10.20.0.17:9401"' in (REPO / "docs" / "prometheus.md").read_text()
    assert 'listen = "10.20.0.17:9401"' in blocks("toml", "[prometheus]")


async def test_the_section_as_written(tmp_path):
    root, work = tmp_path / "root", tmp_path / "work"
    for d in ("etc/mosquitto/conf.d", "etc/nvmon"):
        (root / d).mkdir(parents=True)
    work.mkdir()
    (work / "systemd").symlink_to(REPO / "systemd")
    tls = make_tls(tmp_path / "tls")
    for src, name in ((tls.ca, "ca.pem"), (tls.server_cert, "server.pem"), (tls.server_key, "server.key")):
        shutil.copy(src, work / name)
    pidfile = work / "mosquitto.pid"
    etc = root / "etc"

    # 1. the broker's files, then the broker from them
    run_sh(blocks("sh", "# broker host (root)"), work, root, pidfile)
    conf = etc / "mosquitto" / "conf.d" / "nvmon.conf"
    assert conf.read_bytes() == (SHIPPED / "nvmon.conf").read_bytes()
    certs = etc / "mosquitto" / "certs"
    installed = TlsFiles(ca=certs / "ca.pem", server_cert=certs / "server.pem", server_key=certs / "server.key",
                         client_cert=tls.client_cert, client_key=tls.client_key, other_ca=tls.other_ca)
    broker = shipped_broker(tmp_path, conf=conf, passwd=etc / "mosquitto" / "nvmon.passwd",
                            acl=etc / "mosquitto" / "nvmon.acl", tls=installed)
    with broker:
        pidfile.write_text(str(broker.proc.pid))

        # 2. the accounts, made live by the reload
        run_sh(blocks("sh", "# broker host: one account per node"), work, root, pidfile)
        plain = dict(line.split(":", 1) for line in (work / "nodes.plain").read_text().splitlines())
        assert sorted(plain) == ["gpu-001", "gpu-002"] and (work / "nodes.plain").stat().st_mode & 0o777 == 0o600
        assert not (work / "nodes.passwd").exists()
        st = (etc / "mosquitto" / "nvmon.passwd").stat()  # still for the broker's group only, after the edits
        assert st.st_mode & 0o777 == 0o640 and st.st_uid == 0
        assert [ln.split(":", 1)[0] for ln in (etc / "mosquitto" / "nvmon.passwd").read_text().splitlines()] == [
            "gpu-001", "gpu-002", "@ops", "@fleet", "@view"]
        view = Recorder(broker.url, "nvmon/v1/#", ca_file=str(tls.ca), username="@view", password="pw-@view")
        await wait_login(broker.url, tls.ca, "@view", "pw-@view")  # the reload made the accounts live

        # 3. a node's password and CA, its config, and the daemon with them
        run_sh(blocks("sh", "# broker host → each node over ssh"), work, root, pidfile)
        pw = etc / "nvmon" / "mqtt.password"
        st = pw.stat()
        assert pw.read_text().strip() == plain["gpu-001"] and st.st_mode & 0o777 == 0o640 and st.st_uid == 65534
        toml = as_here(blocks("toml", "[mqtt]"), root).replace(DOC_BROKER, broker.url)
        cfg = etc / "nvmon" / "nvmon.toml"
        cfg.write_text('[node]\ncluster = "c1"\n' + toml)
        async with view:
            await forge_as(broker.url, tls.ca, "gpu-002", plain["gpu-002"])  # another node's account
            log = tmp_path / "daemon.log"
            d = daemon(cfg, tmp_path, log)
            try:
                await wait_until(lambda: {"status", "inventory", "sample"} <= {m.topic.rsplit("/", 1)[1]
                                                                              for m in view.messages}, 30,
                                 "the daemon's topics at the @view account")
            finally:
                d.terminate()
                assert d.wait(10) == 0
        assert {m.topic.rsplit("/", 1)[0] for m in view.messages} == {"nvmon/v1/c1/gpu-001"}
        assert all(b"forged" not in m.payload for m in view.messages)
        text = log.read_text()
        assert "connected as" in text and "WARNING" not in text and "Traceback" not in text, text

        # 4. the optional per-node blocks: gpu-001 writes under prod only, no longer under any cluster
        reloads = broker.log_text().count("Reloading config")
        run_sh(blocks("sh", "# broker host, optional: each node writes under its own cluster"), work, root, pidfile)
        acl = (etc / "mosquitto" / "nvmon.acl").read_text()
        assert "\npattern write" not in acl and "\nuser gpu-001\ntopic write nvmon/v1/prod/gpu-001/+\n" in acl
        await wait_until(lambda: broker.log_text().count("Reloading config") > reloads, 30, "the reload")
        async with Recorder(broker.url, "nvmon/v1/#", ca_file=str(tls.ca), username="@view", password="pw-@view") as rec:
            async with make_client(settings(broker.url, tls.ca, "gpu-001", plain["gpu-001"]), client_id="t-n") as c:
                await c.publish("nvmon/v1/c1/gpu-001/sample", b"{}", qos=1)  # another cluster: dropped now
                await c.publish("nvmon/v1/prod/gpu-001/sample", b"{}", qos=1)
                await c.publish("nvmon/v1/prod/gpu-002/sample", b"{}", qos=1)  # another node: still dropped
                await c.publish("nvmon/v1/prod/gpu-001/status", b"{}", qos=1)
            await wait_until(lambda: len(rec.messages) >= 2, 15, "gpu-001's messages under prod")
            await asyncio.sleep(0.2)
        assert [m.topic for m in rec.messages if not m.retain] == ["nvmon/v1/prod/gpu-001/sample",
                                                                   "nvmon/v1/prod/gpu-001/status"]

        # 5. "Secret files": the documented refusal, word for word
        pw.chmod(0o644)
        r = subprocess.run([sys.executable, "-m", "nvmon", "daemon", "--config", str(cfg), "--node", "gpu-001",
                            "--db", str(tmp_path / "n.db"), "--sim", "hgx-h100"], capture_output=True, text=True,
                           timeout=30)
        refusal = next(t for lang, t in BLOCKS if lang == "" and t.startswith("nvmon: password file"))
        assert r.returncode == 1 and r.stderr == as_here(refusal, root), r.stderr


async def test_the_documented_warning_is_what_an_anonymous_broker_gets(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="nvmon.test.securing")
    line = next(t for lang, t in BLOCKS if lang == "" and t.startswith("nvmon.wire WARNING"))
    with Broker(tmp_path) as broker:
        s = MqttSession(MqttSettings(url=broker.url), client_id="t-" + uuid.uuid4().hex[:8],
                        log=logging.getLogger("nvmon.test.securing"))
        async with aio.running(s.run(idle), name="s"):
            await wait_until(lambda: s.connected, 15, "connected")
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == [line.split("WARNING: ", 1)[1].strip().replace("mqtt://broker:1883", broker.url)]


async def idle(client) -> None:
    await client.subscribe("t/#", qos=1)
    async for _ in client.messages:
        pass


def daemon(cfg: Path, tmp: Path, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "nvmon", "daemon", "--config", str(cfg), "--node", "gpu-001",
                                 "--db", str(tmp / "d.db"), "--sim", "hgx-h100", "--interval", "0.5",
                                 "--log-level", "info"], stdout=out, stderr=out)


async def wait_login(url: str, ca: Path, user: str, password: str, timeout: float = 10.0) -> None:
    """Until the broker lets `user` in (the reload is asynchronous); fail after `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            async with make_client(settings(url, ca, user, password), client_id="t-" + uuid.uuid4().hex[:8]):
                return
        except Exception:  # noqa: BLE001 - refused until the reload
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.1)


def settings(url: str, ca: Path, user: str, password: str) -> MqttSettings:
    f = ca.parent / f"{user}.password"
    f.write_text(password + "\n")
    f.chmod(0o600)
    return MqttSettings(url=url, username=user, password_file=str(f), ca_file=str(ca), timeout_s=3)


async def forge_as(url: str, ca: Path, user: str, password: str) -> None:
    async with make_client(settings(url, ca, user, password), client_id="t-forge") as c:
        await c.publish("nvmon/v1/c1/gpu-001/status", b'{"forged": 1}', qos=1, retain=True)
        await c.publish("nvmon/v1/c1/@controls", b'{"forged": 1}', qos=1, retain=True)
