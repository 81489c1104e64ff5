"""`nvmon tui`: the Textual front end over the fleet aggregator (`nvmon.fleet`).

`app.NvmonApp` owns a `FleetState` (fed by a `FleetSubscriber` when given broker settings) and
shows it on four screens: fleet, node, alerts and help. Everything from the wire is displayed
through `text.clean` / `rich.text.Text`, never as markup. See docs/tui.md.
"""
