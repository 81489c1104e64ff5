"""The load generator: many simulated nodes on the wire, next to the simulator it drives.

    boards.py  the board pool: a few real simulated boards (`nvmon.sim`) whose payloads many nodes reuse
    fleet.py   SimFleet: N nodes publishing the wire contract to a broker (`nvmon sim-fleet`)
    state.py   a `FleetState` filled from the same boards without a broker (views' tests, benchmarks)

It sits above `nvmon.wire` and `nvmon.fleet` (it publishes over MQTT and fills a FleetState) and
below the command line; nothing in the core imports it. See docs/fleet.md.
"""
