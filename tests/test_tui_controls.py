"""The TUI reads the clusters' shared acks and silences (`nvmon/v1/<cluster>/@controls`) on its own
broker connection and shows them on the alerts screen, whoever made them (`nvmon alerts
ack/silence --broker`, another TUI): headless on a real Mosquitto. Garbage on the control topic
is counted in the header's drops and ignored; the last good set stays."""

from __future__ import annotations

import subprocess
import sys
import time

from mqtt_broker import Broker, needs_mosquitto, wait_until
from textual.widgets import DataTable, Static
from tuifleet import column_plain, header, plain

from nvmon.alerts.shared import shared_silence, update_shared
from nvmon.fleet.state import FleetState
from nvmon.tui.alertlog import AlertLog, Row, alert_record
from nvmon.tui.app import NvmonApp
from nvmon.tui.screens.alerts import AlertsScreen
from nvmon.wire.contract import Alert, control_topic, topic
from nvmon.wire.control import SharedAck, SharedSilence, controls_payload, empty
from nvmon.wire.mqtt import MqttSettings, make_client
from nvmon.wire.payloads import alerts_payload

FP_LINK, FP_IB = "3f2a9c1d00aa11bb", "77aa0c1d00aa11cc"


def node_alerts(now: float) -> list[Alert]:
    return [Alert(FP_LINK, "nvlink.link_down", "critical", "firing", "GPU 2 NVLink 5 down", since=now - 60, gpu=2,
                  link=5, starts_at=now - 90.25, labels={"team": "ml"}),
            Alert(FP_IB, "ib.rate", "warning", "firing", "mlx5_1 at 100G", since=now - 30, device="mlx5_1", port=1,
                  starts_at=now - 30)]


def nvmon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvmon", *args], capture_output=True, text=True, timeout=30)


def cells(app) -> dict[str, tuple[str, str]]:
    """code → (state cell, ack/silence cell) on the alerts screen."""
    t = app.screen.query_one(DataTable)
    return {c: (s, m) for c, s, m in zip(column_plain(t, "code"), column_plain(t, "state"),
                                         column_plain(t, "shared"))}


async def publish_alerts(url: str, cluster: str, node: str, now: float) -> None:
    async with make_client(MqttSettings(url=url), client_id="node-sim") as c:
        await c.publish(topic(cluster, node, "alerts"), alerts_payload(node_alerts(now), now), qos=1, retain=True)


@needs_mosquitto
async def test_acks_and_silences_made_elsewhere_show_on_the_alerts_screen(tmp_path):
    now = time.time()
    with Broker(tmp_path) as broker:
        await publish_alerts(broker.url, "t", "n1", now)
        # made before the TUI starts: it gets them from the retained set
        r = nvmon("alerts", "silence", "--match", "node=n1", "--match", "code=nvlink.*", "--for", "2h",
                  "--broker", broker.url, "--cluster", "t", "--db", str(tmp_path / "none.db"), "--comment", "bridge swap")
        assert r.returncode == 0, r.stderr
        # another cluster's silence naming the same node: scoped to its cluster, it mutes nothing of t
        _, change = shared_silence({"node": "n1"}, now - 1, now + 3600, "carol", None)
        await update_shared(MqttSettings(url=broker.url), "u", change)
        async with make_client(MqttSettings(url=broker.url), client_id="node-u") as c:  # u has a node (no alert):
            # a view of every cluster takes the control set of a cluster it knows a node of
            await c.publish(topic("u", "n2", "alerts"), alerts_payload([], now), qos=1, retain=True)
        app = NvmonApp(MqttSettings(url=broker.url), source="controls test", refresh_s=0.1)  # every cluster
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(lambda: app.subscriber.status.connected, 30, "the subscriber")
            await pilot.press("a")
            assert isinstance(app.screen, AlertsScreen)
            await wait_until(lambda: len(cells(app)) == 2 and cells(app)["nvlink.link_down"][1].startswith("muted "),
                             10, "the shared silence on screen")
            sid = app.controls.sets["t"].silences[0].id
            c = cells(app)
            assert c["nvlink.link_down"][0].endswith(" muted") and c["nvlink.link_down"][1].startswith(f"muted {sid} ")
            assert c["ib.rate"] == (c["ib.rate"][0], "") and not c["ib.rate"][0].endswith("muted")
            assert "alerts · 2 silences" in header(app)  # every cluster's, t's and u's
            hint = plain(app.screen.query_one("#alerts-hint", Static))
            assert f"silence t/{sid}; bridge swap" in hint and "until" in hint and "left" in hint

            # an ack made elsewhere while the TUI runs: shown with who and when
            r = nvmon("alerts", "ack", FP_IB[:8], "--broker", broker.url, "--db", str(tmp_path / "none.db"))
            assert r.returncode == 0, r.stderr
            await wait_until(lambda: cells(app)["ib.rate"][1].startswith("ack "), 30, "the shared ack on screen")
            state, mark = cells(app)["ib.rate"]
            assert state.endswith(" ack") and mark.split()[1] != "?"  # `ack <user> <age>`
            assert app.controls.malformed == 0 and "dropped 0" in header(app)

            # unsilenced elsewhere: the mark goes, the ack stays
            r = nvmon("alerts", "unsilence", f"t/{sid}", "--broker", broker.url, "--db", str(tmp_path / "none.db"))
            assert r.returncode == 0, r.stderr
            await wait_until(lambda: cells(app)["nvlink.link_down"][1] == "", 30, "the silence to go")
            assert "alerts · 1 silence" in header(app) and cells(app)["ib.rate"][1].startswith("ack ")


@needs_mosquitto
async def test_own_keys_are_confirmed_by_the_shared_set_and_garbage_is_counted(tmp_path):
    now = time.time()
    with Broker(tmp_path) as broker:
        await publish_alerts(broker.url, "t", "n1", now)
        app = NvmonApp(MqttSettings(url=broker.url), cluster="t", source="controls test", refresh_s=0.1)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(lambda: app.subscriber.status.connected, 30, "the subscriber")
            assert app.subscriber.controls_filters == (control_topic("t"),)
            await pilot.press("a")
            await wait_until(lambda: len(cells(app)) == 2, 30, "the node's alerts")
            assert "alerts · 0 silences" in header(app)
            await pilot.press("k", "x")  # on the critical one, first in the list
            await wait_until(lambda: (m := cells(app)["nvlink.link_down"][1]).startswith("ack ")
                             and " · muted " in m and "(sent)" not in m, 30, "both confirmed by the shared set")
            log = app.alert_log
            assert not log.acked and not log.silenced  # the local marks gave way to the shared set
            assert "alerts · 1 silence" in header(app)

            # garbage on the control topic: counted in the header's drops, the last good set stays
            async with make_client(MqttSettings(url=broker.url), client_id="garbage") as c:
                for junk in (b"\x1b[2J not json", b'{"schema":1,"ts":1,"cluster":"t","acks":[{}]}',
                             b'{"schema":1,"ts":1,"cluster":"other","silences":[]}'):
                    await c.publish(control_topic("t"), junk, qos=1)
            await wait_until(lambda: app.controls.malformed == 3, 30, "the garbage refused")
            await wait_until(lambda: "dropped 3" in header(app), 30, "the drops in the header")
            assert app.is_running and app.state.stats.dropped == 0  # the fleet state never saw them
            m = cells(app)["nvlink.link_down"][1]
            assert m.startswith("ack ") and " · muted " in m
            assert not app.screen.query_one("StatusHeader").has_class("-lost")


def test_shared_marks_use_the_engines_matching_and_episode_rules():
    now = 1_700_000_000.0
    state = FleetState()
    alerts = node_alerts(now)
    assert state.apply(topic("t", "n1", "alerts"), alerts_payload(alerts, now), now)
    rows = AlertLog.active(state)
    from nvmon.alerts.shared import SharedControls

    sc = SharedControls()
    cs = (empty("t", now)
          .with_silence(SharedSilence("s1", {"team": "m?", "gpu": "2"}, now - 10, now + 10, "alice", None,
                                      all_nodes=True))  # no node matcher: its writer said --all-nodes
          .with_silence(SharedSilence("later", {"node": "n1"}, now + 5, now + 50))
          .with_ack(SharedAck(FP_IB, now - 30, now - 5, "bob"))
          .with_ack(SharedAck(FP_LINK, now - 1000, now - 5, "bob")))  # an older episode: not this one
    assert sc.apply(control_topic("t"), controls_payload(cs))
    log = AlertLog()
    log.acked.add(Row(("t", "n1"), alerts[1]).ident)
    marks = log.shared_marks(rows, sc, state, now)
    link, ib = (Row(("t", "n1"), a).ident for a in alerts)
    assert marks[link].silence.id == "t/s1" and marks[link].ack is None  # labels and fields match; `later` not yet
    assert marks[ib].ack.by == "bob" and marks[ib].silence is None
    assert not log.acked  # confirmed: the local mark is dropped
    assert log.shared_marks(rows, sc, state, now + 20)[ib].silence.id == "t/later"
    assert log.shared_marks(rows, sc, state, now + 60).keys() == {ib}  # both silences over
    assert AlertLog.silence_count(sc, now) == 1 and AlertLog.silence_count(sc, now, "u") == 0
    assert alert_record(("t", "n1"), "r1", alerts[0]).rack == "r1"


@needs_mosquitto
async def test_silences_are_capped_at_the_configs_max_silence_h(tmp_path):
    """The TUI caps shared silences as nvmon fleet does ([alerts] max_silence_h): a 10 h silence
    set elsewhere shows as applied for 1 h, and `x` silences for 1 h instead of 2."""
    now = time.time()
    with Broker(tmp_path) as broker:
        await publish_alerts(broker.url, "t", "n1", now)
        _, change = shared_silence({"node": "n1", "code": "ib.rate"}, now - 60, now + 10 * 3600, "carol", None)
        await update_shared(MqttSettings(url=broker.url), "t", change)
        app = NvmonApp(MqttSettings(url=broker.url), cluster="t", source="caps test", refresh_s=0.1,
                       max_silence_s=3600.0)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(lambda: app.subscriber.status.connected, 30, "the subscriber")
            await pilot.press("a")
            await wait_until(lambda: len(cells(app)) == 2 and cells(app)["ib.rate"][1].startswith("muted "), 30,
                             "the shared silence on screen")
            (applied,) = app.controls.sets["t"].silences
            assert applied.ends_at == applied.starts_at + 3600 and abs(applied.starts_at - (now - 60)) < 0.01  # not 10 h
            assert cells(app)["ib.rate"][1].endswith(" 58m")  # left of the hour from 1 min ago, not 9h58m
            await pilot.press("x")  # on the critical one, first in the list
            await wait_until(lambda: len(app.controls.received_sets["t"].silences) == 2, 30, "x's silence shared")
            mine = next(s for s in app.controls.received_sets["t"].silences if s.comment == "nvmon tui")
            assert mine.ends_at - mine.starts_at == 3600.0 and mine.matchers == {"node": "n1", "code": "nvlink.link_down"}
            await wait_until(lambda: any("for 1 h (silence" in str(n.message) for n in app._notifications), 30,
                             "the toast")


def test_tui_takes_max_silence_h_from_its_config(tmp_path, monkeypatch):
    """`nvmon tui --config` hands the app the config's [alerts] max_silence_h (the app itself runs
    in the Pilot test above); without --config, the default (7 days)."""
    from click.testing import CliRunner

    from nvmon.alerts.shared import DEFAULT_MAX_SILENCE_S
    from nvmon.cli.tui import tui_command

    made = []
    monkeypatch.setattr(NvmonApp, "run", lambda self: made.append((self.max_silence_s, self.controls.max_silence_s)))
    cfg = tmp_path / "fleet.toml"
    cfg.write_text('[mqtt]\nbroker = "mqtt://127.0.0.1:1"\n[alerts]\nmax_silence_h = 1.5\n')
    assert CliRunner().invoke(tui_command, ["--config", str(cfg)]).exit_code == 0
    assert CliRunner().invoke(tui_command, ["--broker", "mqtt://127.0.0.1:1"]).exit_code == 0
    assert made == [(5400.0, 5400.0), (DEFAULT_MAX_SILENCE_S, DEFAULT_MAX_SILENCE_S)]
    cfg.write_text('[alerts]\nmax_silence_h = -1\n')
    r = CliRunner().invoke(tui_command, ["--config", str(cfg)])
    assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
    assert r.output.endswith("fleet.toml: alerts.max_silence_h: must be greater than 0\n")
