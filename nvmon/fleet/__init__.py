"""The fleet side: one aggregator shared by `nvmon tui` and `nvmon fleet`.

`state.FleetState` (pure: messages in, per-node views out), `subscriber.FleetSubscriber` (feeds it
from MQTT), `simfleet` (a load generator publishing many simulated nodes) and `cli` (its command).
See docs/fleet.md.
"""
