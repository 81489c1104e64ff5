"""The TUI's cluster overview without a broker (Pilot, fixed clock): rows from a board of summaries,
the reach the fleet layer judges, the cluster.unreachable alert on the alerts screen, drilling in and
back; and `nvmon tui --cluster` / `nvmon fleet --watch` bad input as one line. The bridged, real
version is tests/test_cluster_bridges.py."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

import click
import pytest
from click.testing import CliRunner
from mqtt_broker import Broker, needs_mosquitto, wait_until
from test_cluster_summary import T0, summary
from tuifleet import plain

from nvmon.fleet.clusters import ClusterBoard
from nvmon.tui.clusters_app import ClusterFleetScreen, ClustersApp
from nvmon.tui.screens.alerts import AlertsScreen
from nvmon.tui.screens.clusters import ClustersScreen
from nvmon.wire.mqtt import MqttSettings, make_client
from nvmon.wire.summary import RackLine, WorstNode, summary_payload, summary_topic


def board() -> ClusterBoard:
    b = ClusterBoard(started=T0 - 100)
    hot = (RackLine("r1", 5, 5, 19000.0, 18000.0, "over"), RackLine("r2", 5, 5, 17000.0, 18000.0, "near"))
    b.apply(summary_topic("a"), summary_payload(summary("a", ts=T0 - 1, interval_s=1.0, racks=hot)), T0 - 1)
    b.apply(summary_topic("b"), summary_payload(summary("b", ts=T0 - 60, interval_s=1.0)), T0 - 60)
    many = tuple(WorstNode(f"n{i}", "stale", None, None, 0) for i in range(5))
    b.apply(summary_topic("c"), summary_payload(summary("c", ts=T0, interval_s=10.0, worst=many, alerts=())), T0)
    return b


def rows(app) -> dict[str, list[str]]:
    t = app.screen.table
    return {cells[0].plain: [c.plain for c in cells] for cells in (t.get_row_at(i) for i in range(t.row_count))}


async def test_overview_rows_alerts_and_drilling():
    app = ClustersApp(None, board=board(), clock=lambda: T0)
    async with app.run_test(size=(140, 30)) as pilot:
        # each step awaits the screen it leads to (a state), not a fixed pause a slow machine can outrun
        await wait_until(lambda: isinstance(app.screen, ClustersScreen) and app.screen.table.row_count == 3, 30,
                         "the overview's rows")
        shown = rows(app)
        assert list(shown) == ["a", "b", "c"]
        assert shown["a"] == ["a", "✓ live 1s", "8/10 ⚠1 ✗1", "✗1 ⚠2 ℹ0 ", "31.4 ✗1 rack over",
                              "n07 offline, n03 ib.rate"]
        assert shown["b"][1] == "✗ unreachable · 60s silent"
        assert shown["c"][3] == "✗0 ⚠0 ℹ0 " and shown["c"][5] == "n0 stale, n1 stale, n2 stale …"
        info = app.header_info
        assert (info.cluster, info.nodes, info.online, info.stale, info.offline) == ("3 clusters", 30, 24, 3, 3)
        # b's summary is a minute old: one cluster.unreachable (judged by the fleet layer), in the header's count.
        assert [(r.key, r.alert.code) for r in app.alert_log.fleet] == [(("b", "fleet"), "cluster.unreachable")]
        assert info.alerts == 1 + 3 + 3
        await pilot.press("question_mark")  # the help says what the overview is and how to get around
        await wait_until(lambda: app.screen.query("#help-body"), 30, "the help")
        assert "Enter opens a cluster, its nodes live" in plain(app.screen.query_one("#help-body"))
        await pilot.press("escape", "a")
        await wait_until(lambda: isinstance(app.screen, AlertsScreen), 30, "the alerts screen")
        await pilot.press("escape")
        await wait_until(lambda: isinstance(app.screen, ClustersScreen), 30, "the overview again")
        await pilot.press("down", "enter")  # open b
        await wait_until(lambda: isinstance(app.screen, ClusterFleetScreen) and app.drilled == "b"
                         and app.header_info.cluster == "b", 30, "b's fleet screen")
        await pilot.press("slash", "x")  # a filter: the first Esc clears it, the second goes back
        await pilot.pause(0.2)
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert isinstance(app.screen, ClusterFleetScreen)
        await pilot.press("escape")
        await wait_until(lambda: isinstance(app.screen, ClustersScreen) and app.drilled is None
                         and app.header_info.cluster == "3 clusters", 30, "back on the overview")


def nvmon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvmon", *args], capture_output=True, text=True, timeout=30)


def test_cluster_lists_and_bad_input_as_one_line():
    from nvmon.cli.tui import check_clusters

    assert check_clusters(None, None, None) is None  # every node of every cluster, as before
    assert check_clusters(None, None, "a") == ("a",) and check_clusters(None, None, " + ") == ()
    assert check_clusters(None, None, "a, b,a") == ("a", "b")
    for value, words in (("a,,b", "an empty name"), ("++", "'++': use"), ("a/b", "'a/b': use")):
        with pytest.raises(click.BadParameter, match=re.escape(words)):
            check_clusters(None, None, value)
    r = nvmon("tui", "--broker", "mqtt://127.0.0.1:1", "--cluster", "a,b/c")
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "nvmon tui: Invalid value for '--cluster': 'b/c': use 1-64 characters from A-Z a-z 0-9 . _ -, "
        "or + for every cluster"], r.stderr
    r = nvmon("fleet", "--broker", "mqtt://127.0.0.1:1", "--watch", "everything")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "--watch" in r.stderr, r.stderr


@needs_mosquitto
def test_without_cluster_the_tui_opens_on_the_overview_when_the_broker_holds_several_summaries(tmp_path,
                                                                                                monkeypatch):
    """No --cluster: the retained summaries decide the start screen (a look of at most a second)."""
    from nvmon.cli.tui import tui_command

    started = []
    monkeypatch.setattr("nvmon.tui.app.NvmonApp.run", lambda self: started.append((type(self).__name__,
                                                                                    self.cluster)))
    monkeypatch.setattr("nvmon.tui.clusters_app.ClustersApp.run", lambda self: started.append(
        (type(self).__name__, self.watched)))

    async def publish(url: str, *clusters: str) -> None:
        async with make_client(MqttSettings(url=url), client_id="summaries") as c:
            for cl in clusters:
                await c.publish(summary_topic(cl), summary_payload(summary(cl, ts=T0)), qos=1, retain=True)

    with Broker(tmp_path) as broker:
        for published, expected in (((), ("NvmonApp", None)), (("a",), ("NvmonApp", None)),
                                     (("b",), ("ClustersApp", ()))):
            asyncio.run(publish(broker.url, *published))
            t0 = time.monotonic()
            r = CliRunner().invoke(tui_command, ["--broker", broker.url])
            assert r.exit_code == 0, r.output
            # The look ends 0.3 s after the last retained summary and is capped at 2 s (2 × PROBE_S):
            # the bound catches an uncapped look, with room for a slow machine (~0.5 s here).
            assert started.pop() == expected and time.monotonic() - t0 < 5.0
        r = CliRunner().invoke(tui_command, ["--broker", broker.url, "--cluster", "a"])  # one named: its nodes
        assert r.exit_code == 0 and started.pop() == ("NvmonApp", "a")
        cfg = tmp_path / "fleet.toml"
        cfg.write_text("[fleet]\nsummary_stale_intervals = 7\n")
        monkeypatch.setattr("nvmon.tui.clusters_app.ClustersApp.run", lambda self: started.append(
            (self.watched, self.board.stale_intervals)))
        r = CliRunner().invoke(tui_command, ["--broker", broker.url, "--cluster", "a,b", "--config", str(cfg)])
        assert r.exit_code == 0 and started.pop() == (("a", "b"), 7.0)
    t0 = time.monotonic()
    r = CliRunner().invoke(tui_command, ["--broker", broker.url])  # the broker is gone: the TUI says so itself
    assert r.exit_code == 0 and started.pop() == ("NvmonApp", None) and time.monotonic() - t0 < 5.0  # (as above)
