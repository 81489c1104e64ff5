"""What the fleet state found about a node itself, shown (issue 16, item 3): a node name claimed by
two daemons (`NodeView.duplicate`, the fleet's `fleet.duplicate_node` evidence) and a node clock off
beyond the bound its timestamps are trusted to (`NodeView.clock_skew_s`). The fleet screen's status
cell marks them (`⚠ 2 daemons`, `⚠ clock +5m`), the problems filter keeps them, the node screen says
what was found; `nvmon nodes` has them in FLAGS, `--problems` and `--json`. The judgement is the
fleet state's (nvmon.fleet.guard): the state here is fed real wire messages, and the views only
format what it concluded.

Pilot over the real app (the showcase fleet, fixed clock); `nvmon nodes` in a subprocess against a
real Mosquitto.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

from mqtt_broker import Broker, needs_mosquitto, wait_until
from textual.widgets import Static
from tuifleet import column_plain, make_app, plain, showcase

from nvmon.tui.rows import is_problem
from nvmon.tui.screens.node import NodeScreen
from nvmon.tui.widgets.fleet_table import FleetTable
from nvmon.wire.contract import topic
from nvmon.wire.mqtt import MqttSettings, make_client
from nvmon.wire.payloads import status_payload

SIZE = (80, 24)
TWIN, SKEWED = 0, 10  # healthy nodes of the showcase (sim-000, sim-010)


def flips(cluster: str, node: str, t0: float, n: int = 8) -> list[tuple[str, bytes, float]]:
    """`n` statuses of one node alternating online / offline a second apart (two sessions taking
    each other over), the last online: (topic, payload, when received)."""
    out = []
    for i in range(n):
        state = "online" if i % 2 == 0 else "offline"
        out.append((topic(cluster, node, "status"),
                    status_payload(state, version="1", interval_s=1, ts=t0 + i, reason=None if i % 2 == 0 else "lost"),
                    t0 + i))
    return out


async def test_a_duplicate_name_and_a_clock_off_are_marked_on_the_fleet_and_node_screens():
    sim = showcase()
    st, now = sim.state, sim.now
    twin, skewed = sim.names[TWIN], sim.names[SKEWED]
    for t, payload, rx in flips("sim", twin, now - 8):
        assert st.apply(t, payload, rx)
    assert st.apply(topic("sim", skewed, "status"), status_payload("online", version="1", interval_s=1, ts=now + 300),
                    now)
    # the fleet state's findings (the views below only show them)
    assert "flipped online/offline" in (st.nodes[("sim", twin)].duplicate or "")
    assert round(st.nodes[("sim", skewed)].clock_skew_s) == 300
    assert (st.stats.duplicates, st.stats.clock_skewed) == (1, 1)
    app = make_app(sim)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        t = app.screen.query_one(FleetTable)
        status = dict(zip(column_plain(t, "node"), column_plain(t, "status")))
        assert status[twin] == "⚠ 2 daemons" and status[skewed] == "⚠ clock +5m", status
        assert status[sim.names[6]] == "✓ online"  # a node with nothing found stays as it was
        await pilot.press("p")  # problems only: both are
        shown = column_plain(t, "node")
        assert twin in shown and skewed in shown and sim.names[6] not in shown
        assert is_problem(st.nodes[("sim", twin)], st.nodes[("sim", twin)].liveness(now))
        await pilot.press("p")
        app.open_node(("sim", twin))
        await pilot.pause()
        assert isinstance(app.screen, NodeScreen)
        info = plain(app.screen.query_one("#node-info", Static))
        assert "⚠ 2 daemons" in info
        assert "⚠ two daemons publish as this node: its status flipped online/offline 6 times in 5 s: two " \
               "sessions taking turns (give each its own node name)" in " ".join(info.split()), info
        assert "clock" not in info
        await pilot.press("escape")
        app.open_node(("sim", skewed))
        await pilot.pause()
        info = " ".join(plain(app.screen.query_one("#node-info", Static)).split())
        assert "⚠ its clock is 5m ahead of this viewer's: its timestamps are not trusted, its messages dated by " \
               "arrival" in info and "two daemons" not in info, info


def nodes_json(url: str, cluster: str, *args: str, settle: float = 6.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "nvmon", "nodes", "--broker", url, "--cluster", cluster,
                             "--settle", str(settle), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)


@needs_mosquitto
async def test_nodes_lists_the_flags_and_problems_keeps_them(tmp_path):
    """One read of the broker: `twin`'s status flips while nvmon nodes listens (what two daemons
    sharing a session look like to any reader), then stays online; `ahead`'s retained status is
    dated 10.5 min ahead; `fine` is a plain online node (a minute's interval: no samples needed to
    stay online). FLAGS in the table, `duplicate` / `clock_skew_s` in --json, --problems keeps the
    two flagged nodes, both online, and leaves `fine` out."""
    c = "flags"
    with Broker(tmp_path) as broker:
        settings = MqttSettings(url=broker.url)
        async with make_client(settings, client_id="flags-test") as client:
            now = time.time()
            for node, ts in (("fine", now), ("ahead", now + 630), ("twin", now)):
                await client.publish(topic(c, node, "status"),
                                     status_payload("online", version="1", interval_s=60, ts=ts), qos=1, retain=True)
            connected = broker.log_text().count("New client connected")
            readers = {name: nodes_json(broker.url, c, *args, settle=8.0) for name, args in
                       (("json", ("--json",)), ("problems", ("--json", "--problems")), ("table", ()))}
            # the flips start once all three readers are in (a loaded machine takes seconds to start
            # them) and last 2 s of their 8: each sees more than the 6 within 15 s that tell two
            # sessions taking turns, and twin online at the end (readers up to 5 s apart)
            await wait_until(lambda: broker.log_text().count("New client connected") >= connected + 3, 30,
                             "the three nvmon nodes connected")
            await asyncio.sleep(0.3)  # and subscribed (right after their connect)
            for i in range(20):  # the last (i = 19) online
                state = "offline" if i % 2 == 0 else "online"
                await client.publish(topic(c, "twin", "status"),
                                     status_payload(state, version="1", interval_s=60, ts=time.time(),
                                                    reason="lost" if state == "offline" else None), qos=1)
                await asyncio.sleep(0.1)
            outs = {}
            for name, p in readers.items():
                out, err = await asyncio.to_thread(p.communicate, timeout=30)
                assert p.returncode == 0 and "Traceback" not in err, err
                outs[name] = out
    rows = {r["node"]: r for r in json.loads(outs["json"])}
    assert set(rows) == {"fine", "ahead", "twin"}
    assert "flipped online/offline" in rows["twin"]["duplicate"] and rows["twin"]["clock_skew_s"] is None
    assert 615 <= rows["ahead"]["clock_skew_s"] <= 631 and rows["ahead"]["duplicate"] is None
    assert (rows["fine"]["duplicate"], rows["fine"]["clock_skew_s"], rows["fine"]["liveness"]) == (None, None, "online")
    problems = json.loads(outs["problems"])
    assert {r["node"] for r in problems} == {"ahead", "twin"} and {r["liveness"] for r in problems} == {"online"}
    assert rows["twin"]["liveness"] == "online" and not rows["twin"]["alerts"]
    lines = outs["table"].splitlines()
    assert lines[0].split()[-1] == "FLAGS"
    flags = {ln.split()[0]: ln.split("  ")[-1].strip() for ln in lines[1:]}
    assert flags == {"ahead": "clock +10m", "fine": "-", "twin": "2 daemons"}, lines
