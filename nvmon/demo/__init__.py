"""`nvmon demo`: an embedded broker, a simulated fleet running the real daemon code, and the TUI on it.

    scenario.py  the fleet as data: names, racks, board profiles, planted faults, the timeline
    fleet.py     DemoFleet: broker + one `Daemon` per node in this process's event loop
    relay.py     the TCP pass-through that lets a node "die" the way a crashed daemon does
    watch.py     a small wire reader for the headless status line

The command itself (options, logging, the headless status line) is nvmon/cli/demo.py.
"""
