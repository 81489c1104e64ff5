"""MqttSession, the reconnecting connection every MQTT client runs on, against a real Mosquitto:
back after the broker is killed and restarted, a refused connection logged once and then
"connected again", a cancel during the connect (plain, and one aiomqtt swallows) stops it, a bug
in the client's work is logged once with its traceback. Each test has its own broker and topics."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

from mqtt_broker import Broker, Recorder, free_port, needs_mosquitto, wait_until

from nvmon import aio
from nvmon.wire.mqtt import Backoff, MqttSettings
from nvmon.wire.session import MqttSession

pytestmark = needs_mosquitto

FAST = Backoff(initial_s=0.05, max_s=0.3, refused_initial_s=0.05, refused_max_s=0.3)  # refusals too
LOG = logging.getLogger("nvmon.test.session")


def session(url: str, **kw) -> MqttSession:
    kw.setdefault("backoff", FAST)
    return MqttSession(MqttSettings(url=url, keepalive_s=2, timeout_s=kw.pop("timeout_s", 2)),
                       client_id="t-" + uuid.uuid4().hex[:8], log=LOG, what="test", **kw)


async def listen_until_dropped(client) -> None:
    """A subscriber's work: read until the connection goes (aiomqtt raises then)."""
    await client.subscribe("t/#", qos=1)
    async for _ in client.messages:
        pass


def running(s: MqttSession, on_connect=listen_until_dropped, **kw):
    """The session running as a task for the block (nvmon.aio.running), then cancelled."""
    return aio.running(s.run(on_connect, **kw), name="test.session")


def lines(caplog, level: int | None = None) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOG.name and (level is None or r.levelno == level)]


async def test_back_after_the_broker_is_killed_and_restarted(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    with Broker(tmp_path) as broker:
        s = session(broker.url)
        async with running(s) as task:
            await wait_until(lambda: s.connected, what="the first connection")
            up = s.stats.since
            broker.kill()  # no DISCONNECT, no goodbye: the socket just dies
            await wait_until(lambda: not s.connected, what="the session to notice")
            assert s.stats.since >= up and s.stats.errors >= 1 and s.stats.last_error
            await asyncio.sleep(0.5)  # a few refused attempts while it is down
            broker.start()  # same port
            await wait_until(lambda: s.connected and s.stats.connects == 2, timeout=15, what="the reconnection")
            assert not task.done() and s.stats.errors >= 2
    assert any("connection lost" in m for m in lines(caplog, logging.WARNING))
    infos = lines(caplog, logging.INFO)
    assert len(infos) == 2 and "connected as" in infos[0] and "connected again as" in infos[1]
    assert "failed attempt" in infos[1]
    assert len(lines(caplog, logging.ERROR)) == 1  # the refused attempts, logged once


async def test_a_refused_connection_is_logged_once_then_connected_again(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    broker = Broker(tmp_path, port=free_port())  # not started yet: nobody listens on its port
    s = session(broker.url)
    async with running(s):
        await wait_until(lambda: s.stats.errors >= 4, what="several refused attempts")
        st = s.stats
        assert not st.connected and st.connects == 0 and st.since is None
        assert "refused" in st.last_error.lower() and st.last_error_at is not None
        errors = lines(caplog, logging.ERROR)
        assert len(errors) == 1 and "cannot connect" in errors[0] and "\n" not in errors[0]
        assert len(lines(caplog, logging.DEBUG)) >= 3  # the repeats: "still cannot connect"
        with broker:
            await wait_until(lambda: s.connected, timeout=15, what="the connection once the broker listens")
            errors_then = s.stats.errors
            [again] = [m for m in lines(caplog, logging.INFO) if "connected" in m]
            assert f"connected again as {s.client_id} after {errors_then} failed attempts" in again
            assert s.stats.last_error  # kept for the status page, with its time


async def test_a_cancel_during_the_connect_stops_it(tmp_path):
    """The broker accepts the TCP connection and never answers: the session waits for its CONNACK
    (timeout 30 s), and a cancel must end that wait at once."""
    accepted = asyncio.Event()
    writers = []

    async def silent(reader, writer):
        writers.append(writer)
        accepted.set()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        s = session(f"mqtt://127.0.0.1:{port}", timeout_s=30)
        calls = []
        task = asyncio.create_task(s.run(lambda client: calls.append(client)))
        await asyncio.wait_for(accepted.wait(), 15)
        await asyncio.sleep(0.1)  # the CONNECT is out; the CONNACK never comes
        task.cancel()
        # The connect's own timeout is 30 s: a cancel that waited for it (or for the CONNACK) would
        # time out here instead; 10 s is room for a slow machine, the stop takes ~10 ms.
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        assert calls == [] and s.stats.connects == 0 and not s.connected
    finally:
        for w in writers:
            w.close()
        server.close()
        await server.wait_closed()


async def test_a_cancel_swallowed_by_the_connect_still_stops_it_with_a_goodbye(tmp_path, monkeypatch):
    """Python 3.11's asyncio.wait_for (inside aiomqtt) can let the CONNACK win over a cancel
    (CPython gh-86296): the connect returns, connected. The session must still stop, without
    starting the client's work, and a clean stop says goodbye (retained)."""
    import aiomqtt
    entered = asyncio.Event()
    real_enter = aiomqtt.Client.__aenter__

    async def enter(self):
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass  # what the buggy wait_for does: the result wins over the cancel
        return await real_enter(self)

    with Broker(tmp_path) as broker:
        topic = f"t{uuid.uuid4().hex[:8]}/status"
        async with Recorder(broker.url, topic) as rec:
            monkeypatch.setattr(aiomqtt.Client, "__aenter__", enter)
            s = session(broker.url, will=lambda: (topic, b"lost"), goodbye=lambda: (topic, b"stopped"))
            calls = []
            task = asyncio.create_task(s.run(lambda client: calls.append(client)))
            await asyncio.wait_for(entered.wait(), 15)
            task.cancel()
            # A session that carried on after the swallowed cancel would not end: it fails here.
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), 10)
            assert calls == [] and s.stats.connects == 0
            assert (await rec.wait_for("status")).payload == b"stopped"
        monkeypatch.undo()
        async with Recorder(broker.url, topic) as late:  # retained: a late subscriber gets it too
            msg = await late.wait_for("status")
            assert msg.payload == b"stopped" and msg.retain


async def test_setup_comes_first_and_a_bug_in_the_work_is_logged_once_with_its_traceback(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    seen = []

    async def setup(client):
        seen.append(("setup", s.connected))
        await client.subscribe("t/#", qos=1)

    async def buggy(client):
        seen.append(("work", s.connected))
        raise KeyError("no such node")

    with Broker(tmp_path) as broker:
        s = session(broker.url)
        async with running(s, buggy, setup=setup) as task:
            await wait_until(lambda: s.stats.connects >= 3, what="reconnections after the bug")
            assert not task.done()
    assert seen[:2] == [("setup", False), ("work", True)]  # up (connected) only once setup returned
    st = s.stats
    assert st.errors >= 2 and st.last_error == "KeyError: 'no such node'"
    tracebacks = [r for r in caplog.records if r.name == LOG.name and r.exc_info]
    assert len(tracebacks) == 1 and "unexpected error" in tracebacks[0].getMessage()


async def test_quiet_sessions_log_only_at_debug(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    s = session(f"mqtt://127.0.0.1:{free_port()}", quiet=True)
    async with running(s):
        await wait_until(lambda: s.stats.errors >= 2, what="refused attempts")
    assert lines(caplog) and lines(caplog) == lines(caplog, logging.DEBUG)
