"""`nvmon fleet` logs the messages it refused (issue 16, item 3): every `log_drops_every_s` in which
some were, one line with how many, by reason, and the last one; nothing while none come. Through a
real Mosquitto and a hostile publisher."""

from __future__ import annotations

import asyncio

from mqtt_broker import Broker, needs_mosquitto, wait_until
from test_fleet_service import cluster_name, fleet, fleet_config

from nvmon.wire.mqtt import MqttSettings, make_client

pytestmark = needs_mosquitto


def drop_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if "messages dropped in the last" in ln]


async def test_drops_are_logged_periodically_by_reason_with_the_last_one(tmp_path):
    cluster = cluster_name()
    cfg, _ = fleet_config(tmp_path, "[fleet]\nlog_drops_every_s = 1\n")
    with Broker(tmp_path) as broker:
        f = fleet(tmp_path, broker.url, cluster, cfg, tmp_path / "fleet.db").start()
        try:
            await wait_until(lambda: "subscribed to" in f.text(), 15, "nvmon fleet subscribed")
            # The 7 go out in one burst (queued in order, acknowledged together), so that they land in
            # one of the fleet's 1 s windows: one by one, each waiting for its PUBACK, they could
            # straddle two on a loaded machine, and be logged as two lines.
            msgs = [*((f"nvmon/v1/{cluster}/n{i}/sample", b"{not json") for i in range(5)),
                    (f"nvmon/v1/{cluster}/n9/status", b'{"schema": "nvmon.status/v99"}'),
                    (f"nvmon/v1/{cluster}/n9/sample", b"\x1b[2J" * 10)]
            async with make_client(MqttSettings(url=broker.url), client_id="hostile") as c:
                await asyncio.gather(*(c.publish(t, p, qos=1) for t, p in msgs))
            await wait_until(lambda: drop_lines(f.text()), 15, "a drop line")
            await asyncio.sleep(2.5)  # no new drops: no new line
            [line] = drop_lines(f.text())
            assert "WARNING" in line and "fleet: 7 messages dropped in the last 1 s (json 6, schema 1; 7 since start)" \
                in line, line
            assert line.endswith(f"; last: json: {cluster}/n9/sample: invalid JSON: Expecting value at byte 0"), line
            assert "\x1b" not in f.text()  # the hostile bytes are not echoed

            async with make_client(MqttSettings(url=broker.url), client_id="hostile2") as c:
                await c.publish(f"nvmon/v1/{cluster}/n1/inventory", b"[]", qos=1)
            await wait_until(lambda: len(drop_lines(f.text())) == 2, 15, "a second drop line")
            second = drop_lines(f.text())[1]
            assert second.endswith("fleet: 1 messages dropped in the last 1 s (json 1; 8 since start); last: json: "
                                   f"{cluster}/n1/inventory: inventory: expected a JSON object, got list"), second
            rc, _ = f.stop()
            assert rc == 0, f.text()
        finally:
            if f.proc.poll() is None:
                f.kill()
