"""A hostile publisher against the TUI running headless on a real Mosquitto: malformed JSON, wrong
types, unknown schema, oversize payloads, escape sequences and Rich markup in names and labels.
The app must survive, count the drops, and still show a good node correctly and literally."""

from __future__ import annotations

import json
import time
import uuid

import aiomqtt
from mqtt_broker import Broker, needs_mosquitto, wait_until
from tuifleet import column_plain, plain

from nvmon.loadgen.boards import Board, NodeIdentity
from nvmon.tui.app import NvmonApp
from nvmon.tui.widgets.fleet_table import FleetTable
from nvmon.wire.contract import MAX_PAYLOAD_BYTES, topic
from nvmon.wire.mqtt import MqttSettings
from nvmon.wire.payloads import status_payload

pytestmark = needs_mosquitto

HOSTILE_RACK = "[red]x[/red]\x1b[2J"
HOSTILE_LABELS = {"owner": "[bold]boss[/bold]", "esc": "\x1b]0;pwned\x07", "rtl": "\u202eevil"}


def bad_messages(c: str) -> list[tuple[str, bytes]]:
    """(topic, payload) pairs that a reader must refuse, one of each kind."""
    t = lambda node, kind: f"nvmon/v1/{c}/{node}/{kind}"  # noqa: E731
    return [
        (t("bad-json", "sample"), b"{not json"),
        (t("bad-json", "status"), b"\xff\xfe\x00"),  # not UTF-8
        (t("bad-types", "status"), b'{"schema":1,"ts":"yesterday","state":5}'),
        (t("bad-types", "sample"), b'{"schema":1,"ts":1,"dt":true,"lay":7,"p":"lots"}'),
        (t("bad-schema", "status"), b'{"schema":99,"ts":1,"state":"online"}'),
        (t("too-big", "inventory"), b'{"schema":1,"pad":"' + b"x" * (MAX_PAYLOAD_BYTES + 10) + b'"}'),
        (t("nan", "sample"), b'{"schema":1,"ts":NaN}'),
        (t("array", "alerts"), b"[1,2,3]"),
        (f"nvmon/v1/{c}/n1/unknown-kind", b"{}"),
        (t("deep", "alerts"), b'{"schema":1,"ts":1,"alerts":' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ]


async def test_hostile_publisher_cannot_break_the_tui(tmp_path):
    cluster = f"h{uuid.uuid4().hex[:8]}"  # unique topic tree per test
    with Broker(tmp_path) as broker:
        app = NvmonApp(MqttSettings(url=broker.url), cluster=cluster, source="hostile test", refresh_s=0.2)
        board = Board("hgx-h100", interval_s=1.0, clock_start=time.time(), workdir=tmp_path)
        try:
            async with app.run_test(size=(160, 48)) as pilot:
                await wait_until(lambda: app.subscriber.status.connected, 30, "the TUI's subscriber to connect")
                who = NodeIdentity(cluster, "good-1", HOSTILE_RACK, HOSTILE_LABELS)
                inventory, layout = board.inventory_for(who)
                bad = bad_messages(cluster)
                async with aiomqtt.Client("127.0.0.1", broker.port) as pub:
                    for tp, payload in bad:
                        await pub.publish(tp, payload, qos=1)
                    await pub.publish(topic(cluster, "good-1", "status"),
                                      status_payload("online", version="1", interval_s=1, ts=time.time()), qos=1)
                    await pub.publish(topic(cluster, "good-1", "inventory"), inventory, qos=1)
                    for _ in range(3):
                        await pub.publish(topic(cluster, "good-1", "sample"), board.payload_for(layout, time.time()),
                                          qos=1)
                    # a good node's own bad messages count against it, and it survives them
                    await pub.publish(topic(cluster, "good-1", "sample"), b'{"schema":1,"ts":"x"}', qos=1)
                    await pub.publish(topic(cluster, "good-1", "sample"), board.payload_for(layout, time.time()),
                                      qos=1)
                    # an inventory claiming another (hostile) node name than its topic's
                    forged = json.loads(inventory)
                    forged["node"] = "\x1b[2J[blink]x[/blink]"
                    await pub.publish(topic(cluster, "forged", "inventory"), json.dumps(forged).encode(), qos=1)
                # Node names with markup or escapes in the topic: Mosquitto drops a client that
                # publishes control characters, and the markup one was not delivered to the
                # subscriber in our runs; whichever arrives is a `topic` drop (FleetState's tests
                # cover both). Here they must simply not matter.
                for rogue_topic in (f"nvmon/v1/{cluster}/[red]x[/red]/status", f"nvmon/v1/{cluster}/\x1b[2J/status"):
                    try:
                        async with aiomqtt.Client("127.0.0.1", broker.port, timeout=2) as rogue:
                            await rogue.publish(rogue_topic, b'{"schema":1}', qos=1)
                    except aiomqtt.MqttError:
                        pass
                want_drops = len(bad) + 2
                await wait_until(lambda: app.state.stats.dropped >= want_drops, 30, f"every bad message counted ({app.state.stats})")
                await wait_until(lambda: app.screen.query_one(FleetTable).row_count == 1, 15, "the good node's row")
                await pilot.pause(0.5)

                assert app.is_running
                stats = app.state.stats
                assert want_drops <= stats.dropped <= want_drops + 2, stats
                assert {"json", "content", "schema", "oversize", "topic", "mismatch"} <= set(stats.dropped_by_reason)
                assert list(app.state.nodes) == [(cluster, "good-1")]  # bad messages never create nodes
                assert app.state.nodes[(cluster, "good-1")].dropped == 1

                t = app.screen.query_one(FleetTable)
                assert column_plain(t, "node") == ["good-1"]
                assert column_plain(t, "status") == ["✓ online"]
                assert column_plain(t, "links") == ["✓ 144/144"] and column_plain(t, "pcie") == ["✓ Gen5 x16"]
                assert column_plain(t, "rack")[0].startswith("[red]x[/red]\\x1b")  # literal, escaped
                header = plain(app.screen.query_one("#info"))
                assert f"dropped {stats.dropped}" in header and "msg/s" in header
                assert not app.screen.query_one("StatusHeader").has_class("-lost")

                await pilot.press("enter")
                await pilot.pause(0.3)
                info = plain(app.screen.query_one("#node-info"))
                assert "owner=[bold]boss[/bold]" in info and "esc=\\x1b]0;pwned\\x07" in info
                assert "rtl=\\u202eevil" in info and "\x1b" not in info and "\u202e" not in info
                assert "1 bad messages dropped" in info

                # the broker goes away: a banner, the last data stays; it comes back: reconnected
                broker.stop()
                await wait_until(lambda: app.screen.query_one("StatusHeader").has_class("-lost"), 30, "the banner")
                assert "broker lost" in plain(app.screen.query_one("#banner"))
                broker.start()
                await wait_until(lambda: not app.screen.query_one("StatusHeader").has_class("-lost"), 30,
                                 "the reconnect")
                assert app.subscriber.status.connects >= 2 and app.is_running
        finally:
            board.close()
