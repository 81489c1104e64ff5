"""The Publisher against a real Mosquitto: retained announcements, the will, broker restarts,
bad credentials, TLS. Each test uses its own broker and its own cluster name (topic root), and
waits for conditions with timeouts rather than sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mqtt_broker import Broker, Recorder, free_port, make_tls, needs_mosquitto, needs_openssl, wait_until
from nvmon.wire.contract import Alert, AlertSet, Inventory, Status, Tick
from nvmon.wire.mqtt import Backoff, MqttSettings, make_client, write_at_once
from nvmon.wire.publisher import Publisher
from nvmon.wire.payloads import inventory_payload, parse_message
from samplefactory import healthy_sample

pytestmark = needs_mosquitto

FAST = Backoff(initial_s=0.05, max_s=0.3, refused_initial_s=0.05, refused_max_s=0.3)  # refusals too
TESTS = Path(__file__).parent


def cluster_name() -> str:
    return "t" + uuid.uuid4().hex[:10]


@contextlib.asynccontextmanager
async def running(pub: Publisher, sample=None, *, inventory=None, period: float = 0.05, alerts_provider=None):
    """Run `pub` fed with `sample` every `period` s, as the daemon would; cancel it on exit."""
    sample = sample or healthy_sample()
    inv = inventory_payload(sample, cluster=pub.cluster, rack="r7", labels={"pool": "train"}) \
        if inventory is None else inventory
    queue: asyncio.Queue = asyncio.Queue(maxsize=4)

    async def feed():
        while True:
            if not queue.full():
                queue.put_nowait(sample)
            await asyncio.sleep(period)

    feeder = asyncio.create_task(feed())
    task = asyncio.create_task(pub.run(queue, lambda: inv, alerts_provider))
    try:
        yield task, queue
    finally:
        feeder.cancel()
        task.cancel()
        for t in (feeder, task):
            with contextlib.suppress(asyncio.CancelledError):
                await t


def publisher(url: str, **kw) -> Publisher:
    settings = MqttSettings(url=url, keepalive_s=2, timeout_s=2, **kw)
    return Publisher(settings, cluster=cluster_name(), node="gpu-node-01", version="9.9", interval_s=1.0,
                     backoff=FAST)


def parsed(msg):
    return parse_message(msg.topic, msg.payload)


async def test_announces_retained_status_and_inventory_then_samples(tmp_path):
    with Broker(tmp_path) as broker:
        pub = publisher(broker.url)
        async with running(pub):
            await wait_until(lambda: pub.stats.published >= 2, what="samples published")
            # A subscriber arriving late still gets the node's state: status and inventory are retained.
            async with Recorder(broker.url, f"nvmon/v1/{pub.cluster}/#") as rec:
                status = await rec.wait_for("status")
                inv = await rec.wait_for("inventory")
                sample = await rec.wait_for("sample")
                assert status.retain and inv.retain and not sample.retain
                st = parsed(status)
                assert isinstance(st, Status) and (st.state, st.version, st.interval_s) == ("online", "9.9", 1.0)
                iv = parsed(inv)
                assert isinstance(iv, Inventory) and iv.rack == "r7" and iv.labels == {"pool": "train"}
                tick = parsed(sample)
                assert isinstance(tick, Tick) and tick.layout == iv.layout and len(tick.gpus) == 8
        stats = pub.stats
        assert stats.connects == 1 and stats.errors == 0 and not stats.connected


async def test_packets_go_out_as_they_are_published_and_a_full_socket_falls_back_to_the_loop(tmp_path):
    """write_at_once: a packet is on the socket before paho's publish() returns (stock aiomqtt
    waits for a later loop turn); what the socket cannot take at once is finished by the loop."""
    with Broker(tmp_path) as broker:
        async with Recorder(broker.url, "wat/#") as rec:
            client = make_client(MqttSettings(url=broker.url, timeout_s=10), client_id="wat")
            async with client:
                paho = client._client
                assert not paho.publish("wat/stock", b"s" * 1900, 0).is_published()  # queued for the loop
                await wait_until(lambda: rec.on("stock"), what="the stock publish")
                to_loop = []  # packets handed to aiomqtt's writer callback
                stock = paho.on_socket_register_write
                paho.on_socket_register_write = lambda *a: (to_loop.append(1), stock(*a))
                write_at_once(client)
                info = paho.publish("wat/small", b"x" * 1900, 0)
                assert info.is_published() and not paho.want_write()
                await client.publish("wat/sample", b"y" * 1900, qos=0)
                await client.publish("wat/status", b"z" * 300, qos=1, retain=True)
                assert to_loop == []
                big = os.urandom(16 << 20)  # far more than a socket buffer takes at once
                await client.publish("wat/big", big, qos=0)
                assert to_loop and not paho.want_write()
            await wait_until(lambda: len(rec.messages) == 5, timeout=30, what="every message")
    got = {m.topic: m.payload for m in rec.messages}
    assert got["wat/small"] == b"x" * 1900 and got["wat/sample"] == b"y" * 1900
    assert got["wat/status"] == b"z" * 300 and got["wat/big"] == big


async def test_cancel_publishes_offline_and_disconnects_within_a_second(tmp_path):
    with Broker(tmp_path) as broker:
        pub = publisher(broker.url)
        async with Recorder(broker.url, f"nvmon/v1/{pub.cluster}/+/status") as rec:
            async with running(pub) as (task, _):
                await rec.wait_for("status", lambda m: b'"online"' in m.payload)
                t0 = time.monotonic()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                # The goodbye went out (the status below says "stopped", not the will's "lost"), and
                # the stop's own bounds (0.8 s goodbye, 0.5 s DISCONNECT) end it: this catches a stop
                # that hangs, with room for a slow machine; the product's figure is ~10 ms here.
                assert time.monotonic() - t0 < 5.0
            offline = parsed(await rec.wait_for("status", lambda m: b'"offline"' in m.payload))
            assert offline.reason == "stopped"


@pytest.mark.parametrize("where", ["connect", "publish"])
async def test_a_cancel_swallowed_by_aiomqtt_still_stops_the_publisher(tmp_path, monkeypatch, where):
    """Python 3.11's asyncio.wait_for (inside aiomqtt) can return normally when the caller is
    cancelled just as the awaited reply lands (CPython gh-86296). Simulated here: the cancel
    arrives during connect (which then fails) or during a publish (which then succeeds)."""
    import aiomqtt
    entered = asyncio.Event()
    real_enter, real_publish = aiomqtt.Client.__aenter__, aiomqtt.Client.publish

    async def swallow(then):
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass  # what the buggy wait_for does: the result wins over the cancel
        return await then()

    async def enter(self):
        if where == "connect":
            return await swallow(lambda: _raise(aiomqtt.MqttError("Connection refused: not authorised")))
        return await real_enter(self)

    async def publish(self, topic, payload=None, **kw):
        if where == "publish" and topic.endswith("/sample"):
            return await swallow(lambda: real_publish(self, topic, payload, **kw))
        return await real_publish(self, topic, payload, **kw)

    monkeypatch.setattr(aiomqtt.Client, "__aenter__", enter)
    monkeypatch.setattr(aiomqtt.Client, "publish", publish)
    with Broker(tmp_path) as broker:
        pub = publisher(broker.url)
        async with running(pub) as (task, _):
            await asyncio.wait_for(entered.wait(), 15)
            task.cancel()
            # A publisher that carried on after the swallowed cancel would not end: it fails here.
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), 10)


async def _raise(exc):
    raise exc


async def test_a_cancel_swallowed_while_publishing_alerts_still_stops_the_caller(tmp_path, monkeypatch):
    """The daemon's alert loop awaits publish_alerts() and then the next change: a cancel that
    aiomqtt swallowed in the publish must still end it (it once hung a SIGTERM)."""
    import aiomqtt
    entered = asyncio.Event()
    real_publish = aiomqtt.Client.publish

    async def publish(self, topic, payload=None, **kw):
        if topic.endswith("/alerts") and entered.is_set() is False and pub.stats.connects:
            entered.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                pass  # the result wins over the cancel, as in the buggy wait_for
        return await real_publish(self, topic, payload, **kw)

    monkeypatch.setattr(aiomqtt.Client, "publish", publish)
    with Broker(tmp_path) as broker:
        pub = publisher(broker.url)
        async with running(pub):
            await wait_until(lambda: pub.stats.published >= 1, what="connected and publishing")

            async def alert_loop():
                await pub.publish_alerts([])
                await asyncio.sleep(30)  # where the daemon waits for the next change

            task = asyncio.create_task(alert_loop())
            await asyncio.wait_for(entered.wait(), 15)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):  # not the loop's next 30 s wait
                await asyncio.wait_for(task, 10)


async def test_will_marks_node_offline_when_the_process_dies(tmp_path):
    script = """
import asyncio, sys
sys.path.insert(0, sys.argv[3])
from samplefactory import healthy_sample
from nvmon.wire.mqtt import MqttSettings
from nvmon.wire.publisher import Publisher
from nvmon.wire.payloads import inventory_payload

async def main():
    s = healthy_sample()
    pub = Publisher(MqttSettings(url=sys.argv[1], keepalive_s=2), cluster=sys.argv[2], node=s.node,
                    version="t", interval_s=0.1)
    q = asyncio.Queue()
    inv = inventory_payload(s, cluster=sys.argv[2])
    async def feed():
        while True:
            q.put_nowait(s)
            await asyncio.sleep(0.1)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(feed())
        tg.create_task(pub.run(q, lambda: inv))

asyncio.run(main())
"""
    cluster = cluster_name()
    with Broker(tmp_path) as broker:
        async with Recorder(broker.url, f"nvmon/v1/{cluster}/+/status") as rec:
            proc = subprocess.Popen([sys.executable, "-c", script, broker.url, cluster, str(TESTS)],
                                    stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            try:
                await rec.wait_for("status", lambda m: b'"online"' in m.payload, timeout=15)
            finally:
                proc.kill()  # SIGKILL: no DISCONNECT, no goodbye — only the will can tell
                _, err = proc.communicate(timeout=10)
            offline = parsed(await rec.wait_for("status", lambda m: b'"offline"' in m.payload, timeout=15))
            assert offline.reason == "lost", err.decode(errors="replace")[-500:]


async def test_broker_restart_reconnects_and_reannounces_within_5s(tmp_path):
    with Broker(tmp_path) as broker:
        pub = publisher(broker.url)
        async with running(pub):
            await wait_until(lambda: pub.stats.published >= 1, what="first sample")
            broker.stop()
            await wait_until(lambda: not pub.stats.connected, what="publisher to notice the broker is gone")
            broker.start()  # same port; retained messages did not survive the restart
            t0 = time.monotonic()
            async with Recorder(broker.url, f"nvmon/v1/{pub.cluster}/#") as rec:
                # The restart forgot every retained message: these can only be re-announcements.
                await rec.wait_for("status", lambda m: b'"online"' in m.payload, timeout=15)
                await rec.wait_for("inventory", timeout=15)
                await rec.wait_for("sample", timeout=15)
            # Back at its 0.3 s backoff (~1 s here): the bound has room for a slow machine, and
            # still catches a publisher that waited out its default backoff (up to 30 s).
            assert time.monotonic() - t0 < 10.0
            assert pub.stats.connects == 2 and pub.stats.errors >= 1


async def test_wrong_password_is_reported_once_and_retried(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="nvmon.wire")
    pw = tmp_path / "password"
    pw.write_text("not-the-password\n")
    pw.chmod(0o600)  # a secret file: private to its reader, or refused (nvmon.secretfile)
    with Broker(tmp_path, users={"nvmon": "s3cret"}) as broker:
        pub = publisher(broker.url, username="nvmon", password_file=str(pw))
        async with running(pub) as (task, queue):
            await wait_until(lambda: pub.stats.errors >= 3, what="several refused attempts")
            assert not task.done() and pub.stats.connects == 0 and not pub.stats.connected
            assert "not authori" in pub.stats.last_error.lower() and "password_file" in pub.stats.last_error
            errors = [r for r in caplog.records if r.name == "nvmon.wire" and r.levelno >= logging.ERROR]
            assert len(errors) == 1 and "\n" not in errors[0].getMessage()
            assert queue.qsize() <= 1 and pub.stats.dropped >= 1  # samples drained, not piling up
            # Fix the file: the next attempt reads it again and gets in, no restart needed.
            pw.write_text("s3cret\n")
            await wait_until(lambda: pub.stats.connected, what="connection with the right password")


async def test_samples_are_dropped_not_buffered_while_no_broker(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="nvmon.wire")
    pub = publisher(f"mqtt://127.0.0.1:{free_port()}")
    async with running(pub, period=0.005) as (task, queue):
        await wait_until(lambda: pub.stats.dropped >= 100, what="samples dropped")
        assert queue.qsize() <= 1 and pub.stats.published == 0 and pub.stats.errors >= 2
        assert "refused" in pub.stats.last_error.lower()
        errors = [r for r in caplog.records if r.name == "nvmon.wire" and r.levelno >= logging.ERROR]
        assert len(errors) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):  # between attempts: a cancel ends it at once
            await asyncio.wait_for(task, 10)  # (not an attempt's 2 s timeout or a backoff per sample)


async def test_alerts_are_retained_and_resent_on_reconnect(tmp_path):
    alerts = [Alert("a1b2", "nvlink.link_down", "critical", "firing", "GPU 2 NVLink 5 down", 1_700_000_000.0,
                    gpu=2, link=5),
              Alert("c3d4", "ib.rate", "warning", "pending", "mlx5_1 at 100 Gb/s", 1_700_000_100.0,
                    device="mlx5_1", port=1, labels={"team": "[red]infra[/red]"})]
    with Broker(tmp_path) as broker:
        pub = publisher(broker.url)
        async with running(pub):
            await wait_until(lambda: pub.stats.connected, what="connection")
            await pub.publish_alerts(alerts)
            broker.restart()
            async with Recorder(broker.url, f"nvmon/v1/{pub.cluster}/+/alerts") as rec:
                msg = await rec.wait_for("alerts", timeout=15)  # only a re-publish survives a restart
                got = parsed(msg)
                assert isinstance(got, AlertSet) and [a.fingerprint for a in got.alerts] == ["a1b2", "c3d4"]
                assert got.alerts[1].labels == {"team": "[red]infra[/red]"}  # markup kept as text


async def test_alerts_provider_sets_the_retained_set_on_connect(tmp_path):
    with Broker(tmp_path) as broker:
        pub = publisher(broker.url)
        async with running(pub, alerts_provider=lambda: []):  # an empty set clears a stale one
            await wait_until(lambda: pub.stats.published >= 1, what="connection")
            async with Recorder(broker.url, f"nvmon/v1/{pub.cluster}/+/alerts") as rec:
                got = parsed(await rec.wait_for("alerts", lambda m: m.retain))
                assert got.alerts == () and got.omitted == 0


async def test_inventory_is_republished_when_the_layout_changes(tmp_path):
    first = healthy_sample()
    second = dataclasses.replace(first, ib=first.ib[:7])  # a port vanished: arrays shift
    current = {"s": first}
    with Broker(tmp_path) as broker:
        pub = publisher(broker.url)
        queue: asyncio.Queue = asyncio.Queue()
        task = asyncio.create_task(pub.run(queue, lambda: inventory_payload(current["s"], cluster=pub.cluster)))
        try:
            async with Recorder(broker.url, f"nvmon/v1/{pub.cluster}/#") as rec:
                queue.put_nowait(first)
                await rec.wait_for("sample")
                current["s"] = second
                queue.put_nowait(second)
                await wait_until(lambda: len(rec.on("inventory")) == 2, what="second inventory")
                tick = parsed(await rec.wait_for("sample", lambda m: len(parsed(m).ib) == 7))
                assert parsed(rec.on("inventory")[-1]).layout == tick.layout
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@needs_openssl
async def test_tls_with_generated_ca(tmp_path):
    tls = make_tls(tmp_path / "tls")
    with Broker(tmp_path, tls=tls) as broker:
        assert broker.url.startswith("mqtts://")
        pub = publisher(broker.url, ca_file=str(tls.ca))
        async with running(pub):
            async with Recorder(broker.url, f"nvmon/v1/{pub.cluster}/#", ca_file=str(tls.ca)) as rec:
                assert parsed(await rec.wait_for("status")).state == "online"
                await rec.wait_for("sample")


@needs_openssl
async def test_tls_with_the_wrong_ca_fails_with_a_clear_error(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="nvmon.wire")
    tls = make_tls(tmp_path / "tls")
    with Broker(tmp_path, tls=tls) as broker:
        pub = publisher(broker.url, ca_file=str(tls.other_ca))
        async with running(pub) as (task, _):
            await wait_until(lambda: pub.stats.errors >= 2, what="failed TLS attempts")
            assert not task.done() and pub.stats.connects == 0
            assert "certificate verify failed" in pub.stats.last_error
            errors = [r.getMessage() for r in caplog.records if r.name == "nvmon.wire" and r.levelno >= logging.ERROR]
            assert len(errors) == 1 and "TLS" in errors[0]


@needs_openssl
async def test_mutual_tls_with_a_client_certificate(tmp_path):
    tls = make_tls(tmp_path / "tls")
    with Broker(tmp_path, tls=tls, require_certificate=True) as broker:
        pub = publisher(broker.url, ca_file=str(tls.ca), cert_file=str(tls.client_cert), key_file=str(tls.client_key))
        async with running(pub):
            await wait_until(lambda: pub.stats.published >= 1, what="a sample over mutual TLS")
