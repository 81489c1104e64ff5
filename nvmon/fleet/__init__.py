"""The fleet side: one aggregator shared by `nvmon tui` and `nvmon fleet`.

`state.FleetState` (pure: messages in, per-node views out), `subscriber.FleetSubscriber` (feeds it
from MQTT) and `nvmon fleet`'s rules, alert state and service. The load generator that publishes
simulated fleets is `nvmon.loadgen`. See docs/fleet.md.
"""
