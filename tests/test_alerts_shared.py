"""Acks and silences shared over MQTT (`nvmon/v1/<cluster>/@controls`, retained): the strict
reader, the writers (`nvmon alerts … --broker`, the TUI's k / x) and the evaluators honouring them
(a real daemon with real hooks, `nvmon fleet`'s engines), against a real Mosquitto — its ACL too."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from mqtt_broker import Broker, Recorder, needs_mosquitto, wait_until
from test_alerts_daemon import ALERTS_TOML, active_set
from test_daemon import DaemonProc, wait_ticks
from test_hooks import FAST, Receiver, alert, calls, hook, receiver, recorder, running  # noqa: F401 - a fixture

from nvmon.alerts.engine import AlertEngine
from nvmon.alerts.hook_dispatch import HookDispatcher
from nvmon.alerts.shared import SharedControls, engine_controls, merge, shared_silence, update_shared
from nvmon.fleet.alerting import FleetAlerts
from nvmon.fleet.rules import FleetRules, FleetSettings
from nvmon.wire.contract import (
    MAX_PAYLOAD_BYTES,
    Alert,
    WireError,
    control_topic,
    parse_control_topic,
    parse_topic,
    subscription,
    topic,
)
from nvmon.wire.control import (
    ACK_KEEP_S,
    ControlSet,
    SharedAck,
    SharedSilence,
    controls_payload,
    empty,
    parse_controls,
)
from nvmon.wire.mqtt import MqttSettings, make_client
from nvmon.wire.payloads import alerts_payload

T = 1_700_000_000.0
TOPIC = "nvmon/v1/c1/@controls"


def a_set() -> ControlSet:
    return (empty("c1", T).with_silence(SharedSilence("ab12cd34", {"node": "gpu-07", "code": "nvlink.*"}, T, T + 7200,
                                                      "alice", "reseating the bridge"))
            .with_ack(SharedAck("3f2a9c1d00aa11bb", T - 60.123, T, "bob")))


# -- the contract -----------------------------------------------------------------------------


def test_control_topic_can_never_be_a_node_topic():
    assert control_topic("c1") == TOPIC and parse_control_topic(TOPIC) == "c1"
    with pytest.raises(WireError):
        parse_topic(TOPIC)  # 4 levels, and `@` is no node name
    with pytest.raises(WireError):
        parse_topic("nvmon/v1/c1/@controls/alerts")
    with pytest.raises(ValueError):
        topic("c1", "@controls", "alerts")
    for bad in ("nvmon/v1/c1/@controls/x", "nvmon/v1/c1/n1", "nvmon/v1/c+/@controls", "x/v1/c1/@controls"):
        with pytest.raises(WireError):
            parse_control_topic(bad)
    import aiomqtt

    assert not aiomqtt.Topic(TOPIC).matches(subscription("c1"))  # nvmon/v1/c1/+/+: views never see it


def test_round_trip_and_alerts_carry_their_episode_start():
    cs = a_set()
    assert parse_controls(TOPIC, controls_payload(cs)) == cs
    assert parse_controls(TOPIC, b"") == empty("c1")  # a cleared retained topic: nothing in force
    from nvmon.wire.parse import parse_message

    a = Alert("3f2a9c1d00aa11bb", "nvlink.link_down", "critical", "firing", "down", since=T, starts_at=T - 60.123)
    [back] = parse_message(topic("c1", "n1", "alerts"), alerts_payload([a], T)).alerts
    assert back.starts_at == T - 60.123


def _payload(**over) -> bytes:
    d = json.loads(controls_payload(a_set()))
    for k, v in over.items():
        d[k] = v
    return json.dumps(d).encode()


SILENCE = {"id": "x1", "matchers": {"node": "n1"}, "starts_at": T, "ends_at": T + 1}
MALFORMED = [
    (b"\xff\xfe", "UTF-8"),
    (b"[1,2]", "JSON object"),
    (b"{" * 100_000, "exceeds"),
    (_payload(schema=2), "unknown schema"),
    (_payload(cluster="c2"), "disagrees with the topic"),
    (_payload(silences=[{**SILENCE, "matchers": {}}]), "at least one matcher"),
    (_payload(silences=[{**SILENCE, "matchers": {"no/de": "x"}}]), "not a field or label name"),
    (_payload(silences=[{**SILENCE, "ends_at": T - 1}]), "not after starts_at"),
    (_payload(silences=[{**SILENCE, "ends_at": 1e999}]), "non-finite"),
    (_payload(silences=[SILENCE, SILENCE]), "id repeats"),
    (_payload(silences=[{**SILENCE, "id": "a b\x1b[2J"}]), "silences[0].id"),
    (_payload(silences=[{**SILENCE, "matchers": {"node": "x" * 300}}]), "longer than 256"),
    (_payload(silences=[SILENCE] * 501), "at most 500"),
    (_payload(acks=[{"fingerprint": "ZZZZ", "starts_at": T, "acked_at": T}]), "hex digits"),
    (_payload(acks=[{"fingerprint": "abcd", "starts_at": True, "acked_at": T}]), "expected number"),
]


@pytest.mark.parametrize(("payload", "fragment"), MALFORMED, ids=[f for _, f in MALFORMED])
def test_malformed_control_payloads_are_one_line_errors(payload, fragment):
    with pytest.raises(WireError) as e:
        parse_controls(TOPIC, payload)
    assert fragment in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) <= 300


def test_writers_prune_and_fit_the_size_limit():
    cs = a_set().with_silence(SharedSilence("old", {"node": "n2"}, T - 7200, T - 1))
    cs = cs.with_ack(SharedAck("aaaa", T - ACK_KEEP_S - 10, T - ACK_KEEP_S - 1))
    p = cs.pruned(T)
    assert [s.id for s in p.silences] == ["ab12cd34"] and [a.fingerprint for a in p.acks] == ["3f2a9c1d00aa11bb"]
    # re-acking an episode replaces its ack; a silence with the same id is replaced too
    assert len(p.with_ack(SharedAck("3f2a9c1d00aa11bb", T - 60.123, T + 5)).acks) == 1
    big = empty("c1", T)
    for i in range(2000):
        big = big.with_ack(SharedAck(f"{i:016x}", T, T + i, "x" * 64))
    body = controls_payload(big)
    back = parse_controls(TOPIC, body)
    assert len(body) <= MAX_PAYLOAD_BYTES and 0 < len(back.acks) < 2000
    assert back.acks[-1].acked_at == T + 1999  # the newest acks are the ones kept


def test_shared_controls_keep_the_last_good_set_and_scope_silences_to_their_cluster():
    changes = []
    sc = SharedControls(on_change=lambda: changes.append(1))
    assert sc.apply(TOPIC, controls_payload(a_set()))
    assert not sc.apply(TOPIC, b"{not json") and not sc.apply("nvmon/v1/c1/n1/alerts", b"{}")
    assert sc.malformed == 2 and len(changes) == 1 and "not an nvmon/v1/<cluster>/@controls" in sc.last_error
    acks, silences = sc.controls(T + 1)
    assert acks == {("3f2a9c1d00aa11bb", round((T - 60.123) * 1000)): T}
    [s] = silences
    assert s.matchers == {"node": "gpu-07", "code": "nvlink.*", "cluster": "c1"} and s.id == "c1/ab12cd34"
    r = alert(node="gpu-07", code="nvlink.down")  # cluster c1
    assert s.matches(r, T + 1) and not s.matches(replace(r, cluster="c2"), T + 1)
    assert sc.controls(T + 7201)[1] == []  # expired: no longer handed to the engine
    both = merge(({("f", 1): 5.0}, []), engine_controls(a_set(), T))
    assert ("f", 1) in both[0] and len(both[1]) == 1


async def test_dispatcher_skips_repeats_of_quiet_alerts_but_not_their_resolve(receiver):
    d = HookDispatcher([hook("webhook", url=receiver.url("/q"), repeat_interval_s=0.2)], backoff=FAST)
    rec = alert()
    async with running(d):
        d.submit([rec])
        await wait_until(lambda: len(receiver.bodies("/q")) >= 2, 15, "a repeat")
        d.quiet([rec.fingerprint])  # acked
        await asyncio.sleep(0.1)
        n = len(receiver.bodies("/q"))
        await asyncio.sleep(0.6)
        assert len(receiver.bodies("/q")) == n
        d.submit([alert("resolved")])
        await wait_until(lambda: receiver.bodies("/q")[-1]["status"] == "resolved", 15, "the resolve")


def test_fleet_engines_honour_shared_silences():
    fa = FleetAlerts(FleetRules(FleetSettings()), notifier=None)
    eng = AlertEngine(type("R", (), {"book": {}, "cluster": "c1", "node": "gpu-07", "rack": None, "labels": {}})(),
                      started_at=T)
    fa.engines[("node", "c1", "gpu-07")] = eng
    sid, change = shared_silence({"node": "gpu-07"}, T - 1, T + 3600, "alice", None)
    fa.shared.apply(TOPIC, controls_payload(change(empty("c1", T))))
    fa.clock = lambda: T
    fa.apply_controls()
    assert eng.silenced(alert(node="gpu-07"), T) and not eng.silenced(alert(node="gpu-08"), T)


# -- against Mosquitto ------------------------------------------------------------------------


def nvmon(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvmon", *args], capture_output=True, text=True, timeout=timeout)


def controls_on(rec: Recorder) -> list[dict]:
    """The valid control sets the recorder saw (not the test's own garbage)."""
    out = []
    for m in rec.messages:
        if m.topic.endswith("/@controls"):
            try:
                out.append(parse_controls(m.topic, m.payload))
            except WireError:
                pass
    return [json.loads(controls_payload(cs)) for cs in out]


@needs_mosquitto
async def test_a_shared_silence_keeps_a_running_daemons_new_alert_from_its_hooks(tmp_path):
    receiver = Receiver()
    argv, exec_out = recorder(tmp_path)
    hooks = (f'[[hooks]]\ntype = "exec"\ncommand = {json.dumps(argv)}\n'
             f'[[hooks]]\ntype = "webhook"\nurl = "{receiver.url("/webhook")}"\n')
    try:
        with Broker(tmp_path) as broker:
            async with Recorder(broker.url, "nvmon/v1/t/#") as rec:
                d = DaemonProc(tmp_path, broker=broker.url, sim="hgx-h100,nvlink_down=2.5@6",
                               extra_toml=ALERTS_TOML + hooks).start()
                try:
                    await rec.wait_for("status", timeout=30)  # the daemon is connected (and subscribed)
                    r = nvmon("alerts", "silence", "--match", "node=n1", "--match", "code=nvlink.*", "--for", "2h",
                              "--broker", broker.url, "--cluster", "t", "--db", str(tmp_path / "none.db"),
                              "--comment", "bridge swap")
                    assert r.returncode == 0, r.stderr
                    assert "shared silence" in r.stdout and "1 silence(s)" in r.stdout
                    await wait_until(lambda: "shared controls of cluster t: 1 silence(s)" in d.log_text(), 15,
                                     "the daemon to take the silence")
                    assert "alert firing" not in d.log_text()  # the fault comes later
                    await rec.wait_for("alerts", lambda m: [a["code"] for a in active_set(m)
                                                           if a["state"] == "firing"] == ["nvlink.link_down"], 15)
                    n = len(await wait_ticks(d.db, 1))
                    await wait_ticks(d.db, n + 6)  # 1.2 s more for any delivery
                finally:
                    assert d.stop() == 0
            async with Recorder(broker.url, control_topic("t")) as late:  # a late subscriber gets it: retained
                await wait_until(lambda: [m.retain for m in late.messages] == [True], 15, "the retained set")
        [shared] = controls_on(rec)
        assert shared["silences"][0]["matchers"] == {"node": "n1", "code": "nvlink.*"}
        assert shared["silences"][0]["comment"] == "bridge swap"
        assert calls(exec_out) == [] and receiver.bodies("/webhook") == []  # silenced: nobody paged
        assert "alert firing" in d.log_text() and "Traceback" not in d.log_text()
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()


@needs_mosquitto
async def test_a_shared_ack_stops_repeats_and_garbage_on_the_topic_is_counted_and_ignored(tmp_path):
    receiver = Receiver()
    hooks = f'[[hooks]]\ntype = "webhook"\nurl = "{receiver.url("/w")}"\nrepeat_interval_s = 0.3\n'
    try:
        with Broker(tmp_path) as broker:
            async with Recorder(broker.url, "nvmon/v1/t/#") as rec:
                d = DaemonProc(tmp_path, broker=broker.url, sim="hgx-h100,nvlink_down=2.5@1",
                               extra_toml=ALERTS_TOML + hooks).start()
                try:
                    await rec.wait_for("status", timeout=30)  # connected and subscribed
                    # Garbage first: refused, counted, the daemon carries on.
                    async with make_client(MqttSettings(url=broker.url), client_id="garbage") as c:
                        for junk in (b"\x1b[2J not json", b'{"schema":1,"ts":1,"cluster":"t","acks":[{}]}'):
                            await c.publish("nvmon/v1/t/@controls", junk, qos=1)
                    await wait_until(lambda: "refused (2 so far)" in d.log_text(), 30, "both refused")
                    await wait_until(lambda: len(receiver.bodies("/w")) >= 3, 30, "firing + repeats")
                    fp = receiver.bodies("/w")[0]["fingerprint"]
                    r = nvmon("alerts", "ack", fp[:8], "--broker", broker.url, "--db", str(tmp_path / "none.db"))
                    assert r.returncode == 0, r.stderr
                    assert f"acked {fp}" in r.stdout and "from its retained alerts" in r.stdout
                    await wait_until(lambda: "shared controls of cluster t: 0 silence(s), 1 ack(s)" in d.log_text(),
                                     15, "the daemon to take the ack")
                    await asyncio.sleep(1.0)  # a repeat already on its way when the ack applied lands first
                    n = len(receiver.bodies("/w"))
                    await asyncio.sleep(1.2)  # 4 repeat intervals
                    assert len(receiver.bodies("/w")) == n
                    assert d.alive()
                finally:
                    assert d.stop() == 0
        [shared] = controls_on(rec)[-1:]
        [ack] = shared["acks"]
        starts = [a["starts_at"] for a in active_set(rec.on("alerts")[-1]) if a["fingerprint"] == fp]
        assert ack["fingerprint"] == fp and [ack["starts_at"]] == starts
        assert {b["status"] for b in receiver.bodies("/w")} == {"firing"} and "Traceback" not in d.log_text()
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()


@needs_mosquitto
async def test_cli_unsilence_and_listing_of_shared_silences(tmp_path):
    with Broker(tmp_path) as broker:
        settings = MqttSettings(url=broker.url)
        sid, change = shared_silence({"node": "n9"}, T, 4e9, "alice", None)
        await update_shared(settings, "c1", change)
        r = nvmon("alerts", "silences", "--broker", broker.url, "--cluster", "c1", "--db", str(tmp_path / "x.db"))
        assert r.returncode == 0 and f"c1/{sid}" in r.stdout and "node=n9" in r.stdout and "cluster=c1" in r.stdout
        r = nvmon("alerts", "unsilence", f"c1/{sid}", "--broker", broker.url, "--db", str(tmp_path / "x.db"))
        assert r.returncode == 0 and "0 silence(s)" in r.stdout, r.stderr
        r = nvmon("alerts", "unsilence", sid, "--broker", broker.url, "--cluster", "c1")
        assert r.returncode == 1 and f"no shared silence {sid}" in r.stderr
        # garbage retained: writers refuse to overwrite it, in one line
        async with make_client(settings, client_id="g") as c:
            await c.publish(control_topic("c1"), b"garbage", qos=1, retain=True)
        r = nvmon("alerts", "silence", "--match", "node=n1", "--for", "1h", "--broker", broker.url, "--cluster", "c1")
        assert r.returncode == 1 and "not readable" in r.stderr and "Traceback" not in r.stderr
        r = nvmon("alerts", "ack", "abcd", "--broker", "mqtt://127.0.0.1:1", "--db", str(tmp_path / "x.db"))
        assert r.returncode == 1 and "broker mqtt://127.0.0.1:1" in r.stderr and len(r.stderr.splitlines()) == 1


SHIPPED_ACL = Path(__file__).parent.parent / "systemd" / "mosquitto" / "nvmon.acl"


@needs_mosquitto
async def test_the_shipped_acl_lets_ops_but_not_nodes_write_the_control_topic(tmp_path):
    """The shared-controls side of the shipped ACL (docs/alerts.md points to it); every account and
    forgery is in tests/test_broker_acl.py."""
    users = {"n1": "pw-n1", "@ops": "pw-ops"}
    (tmp_path / "n1.pw").write_text("pw-n1\n")
    (tmp_path / "n1.pw").chmod(0o600)  # a secret file: private to its reader, or refused (nvmon.secretfile)
    (tmp_path / "ops.pw").write_text("pw-ops\n")
    (tmp_path / "ops.pw").chmod(0o600)  # a secret file: private to its reader, or refused (nvmon.secretfile)
    assert "systemd/mosquitto/nvmon.acl" in (Path(__file__).parent.parent / "docs" / "alerts.md").read_text()
    with Broker(tmp_path, users=users, acl=SHIPPED_ACL.read_text()) as broker:
        node = MqttSettings(url=broker.url, username="n1", password_file=str(tmp_path / "n1.pw"))
        ops = MqttSettings(url=broker.url, username="@ops", password_file=str(tmp_path / "ops.pw"))
        sc = SharedControls()
        async with make_client(node, client_id="n1") as n:
            await n.subscribe(control_topic("t"), qos=1)
            reader = asyncio.create_task(_feed(n, sc))
            try:
                await n.publish(control_topic("t"), controls_payload(empty("t", T)), qos=1, retain=True)
                await n.publish(topic("t", "n1", "status"), b"{}", qos=1)  # its own topic: allowed
                await asyncio.sleep(0.3)
                assert sc.received == 0  # the node's write to the control topic was dropped
                sid, change = shared_silence({"node": "n1"}, T, 4e9, "ops", None)
                await update_shared(ops, "t", change)
                await wait_until(lambda: "t" in sc.sets and [s.id for s in sc.sets["t"].silences] == [sid], 15,
                                 "the ops write to reach the node")
                assert sc.malformed == 0
            finally:
                reader.cancel()


async def _feed(client, sc: SharedControls) -> None:
    async for m in client.messages:
        sc.apply(str(m.topic), bytes(m.payload))


@needs_mosquitto
async def test_tui_keys_publish_the_ack_and_a_silence_on_the_apps_broker(tmp_path):
    from nvmon.fleet.state import FleetState
    from nvmon.tui.app import NvmonApp

    fp = "3f2a9c1d00aa11bb"
    state = FleetState()
    a = Alert(fp, "nvlink.link_down", "critical", "firing", "GPU 2 NVLink 5 down", since=T, gpu=2, link=5,
              starts_at=T - 30.5)
    assert state.apply(topic("t", "n1", "alerts"), alerts_payload([a], T), T)
    with Broker(tmp_path) as broker:
        async with Recorder(broker.url, control_topic("t")) as rec:
            app = NvmonApp(MqttSettings(url=broker.url), cluster="t", state=state, clock=lambda: T, refresh_s=0.2)
            async with app.run_test(size=(160, 48)) as pilot:
                await pilot.press("a")
                await pilot.press("k")
                await wait_until(lambda: any(c["acks"] for c in controls_on(rec)), 30, "the ack on the broker")
                await pilot.press("x")
                await wait_until(lambda: any(c["silences"] for c in controls_on(rec)), 30, "the silence")
                await pilot.pause()
                notes = [n.message for n in app._notifications]
                from textual.widgets import DataTable
                from tuifleet import column_plain

                state_cell = column_plain(app.screen.query_one(DataTable), "state")[0]
        last = controls_on(rec)[-1]
        assert last["acks"] == [{"fingerprint": fp, "starts_at": T - 30.5, "acked_at": T, "by": last["acks"][0]["by"]}]
        [s] = last["silences"]
        assert s["matchers"] == {"node": "n1", "code": "nvlink.link_down"} and s["ends_at"] - s["starts_at"] == 7200
        assert any(n.startswith("acknowledged nvlink.link_down on n1; shared on mqtt://") for n in notes), notes
        assert any(n.startswith("silenced nvlink.link_down on n1 for 2 h") for n in notes), notes
        assert state_cell.endswith(" ack")


async def test_tui_key_without_a_reachable_broker_says_why(tmp_path):
    from mqtt_broker import free_port

    from nvmon.fleet.state import FleetState
    from nvmon.tui.app import NvmonApp

    state = FleetState()
    a = Alert("3f2a9c1d00aa11bb", "ib.rate", "warning", "firing", "x", since=T, starts_at=T)
    state.apply(topic("t", "n1", "alerts"), alerts_payload([a], T), T)
    app = NvmonApp(MqttSettings(url=f"mqtt://127.0.0.1:{free_port()}", timeout_s=1), cluster="t", state=state,
                   clock=lambda: T, refresh_s=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("a")
        await pilot.press("x")
        await wait_until(lambda: any(n.message.startswith("silence not shared:") for n in app._notifications), 30,
                         "the failure notice")
        assert app.subscriber_error is None  # the subscriber is not blamed for it


async def test_a_writer_finds_the_set_by_the_order_of_packets_not_a_clock(tmp_path):
    """A write reads the retained set first (read-modify-write). Whether there is one is told by
    the order of packets (the subscription made twice: the second SUBACK comes after the first's
    retained message), so a writer given no time at all (grace 0, as a process starved for
    seconds would be) still finds and keeps the set, and an absent set is told at once."""
    with Broker(tmp_path) as broker:
        settings = MqttSettings(url=broker.url)
        async with make_client(settings, client_id="seed") as c:
            await c.publish(TOPIC, controls_payload(a_set()), qos=1, retain=True)
        for _ in range(5):  # a race, if there were one, would show in some of them
            new = await update_shared(settings, "c1", lambda cs: cs.with_ack(
                SharedAck("99aa99aa99aa99aa", T, T, "carol")), wait_s=0.0, clock=lambda: T + 1)
            assert [s.id for s in new.silences] == ["ab12cd34"]
            assert {a.fingerprint for a in new.acks} == {"3f2a9c1d00aa11bb", "99aa99aa99aa99aa"}
        fresh = await update_shared(settings, "c-new", lambda cs: cs, wait_s=0.0)
        assert fresh.silences == () and fresh.acks == ()


@needs_mosquitto
async def test_a_flood_on_the_control_topic_costs_a_daemon_neither_its_journal_nor_its_ticks(tmp_path):
    """3,000 different control sets as fast as a client can publish them: the daemon applies the
    latest (the reader keeps each topic's newest, parsed one per loop turn), logs at most
    LINES_PER_MIN lines a minute about what it applied instead of two per message (the set, its new
    silence), and goes on sampling and storing."""
    from nvmon.alerts.persist import SHARED_SILENCES_KEY
    from nvmon.alerts.shared import LINES_PER_MIN
    from test_daemon import tick_times

    def a_silence(i: int, now: float) -> ControlSet:
        return empty("t", now).with_silence(SharedSilence(f"{i:08x}", {"node": "n1", "code": "nvlink.*"}, now,
                                                          now + 3600, "flood", f"set {i}"))

    def applied(db: Path) -> list[str]:
        import sqlite3
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                row = con.execute("SELECT value FROM state WHERE key = ?", (SHARED_SILENCES_KEY,)).fetchone()
            finally:
                con.close()
        except sqlite3.Error:
            return []
        return [d["id"] for d in json.loads(row[0])] if row else []

    with Broker(tmp_path) as broker:
        async with Recorder(broker.url, "nvmon/v1/t/n1/status") as rec:
            d = DaemonProc(tmp_path, broker=broker.url, sim="hgx-h100").start()
            try:
                await rec.wait_for("status", timeout=30)  # connected and subscribed
                await wait_ticks(d.db, 2, timeout=30)
                now = __import__("time").time()
                async with make_client(MqttSettings(url=broker.url), client_id="flood") as c:
                    for i in range(3000):
                        await c.publish("nvmon/v1/t/@controls", controls_payload(a_silence(i, now)), qos=0)
                    await c.publish("nvmon/v1/t/@controls", controls_payload(a_silence(0xFFFFFF, now)), qos=1,
                                    retain=True)
                await wait_until(lambda: applied(d.db) == ["t/00ffffff"], 30, "the last set applied")
                n = len(tick_times(d.db))
                await wait_ticks(d.db, n + 3, timeout=30)  # still sampling and storing
                assert d.alive()
            finally:
                assert d.stop() == 0
    text = d.log_text()
    lines = [ln for ln in text.splitlines() if "shared controls of cluster t:" in ln or "shared silence" in ln]
    # One line per set and per new silence would be 6,002: at most LINES_PER_MIN in the minute this
    # takes, and the flood said once when it reaches that (a slow daemon may have coalesced so many
    # sets that it never does).
    assert 2 <= len(lines) <= LINES_PER_MIN, len(lines)
    warned = text.count(f"more than {LINES_PER_MIN} lines a minute about shared controls")
    assert warned <= 1 and (warned == 0 or len(lines) == LINES_PER_MIN), (warned, len(lines))
    assert "Traceback" not in d.log_text()
