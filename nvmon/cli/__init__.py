"""The `nvmon` command line: the front ends over the library, one module per command or group.

    root.py     the root group, `main()` (the console entry point `nvmon.cli:main`), registration
    common.py   what the commands share: the one error class (`NvmonError`), option checks
    node.py     sample, audit, daemon: the commands run on a node       profiles.py  profiles
    alerts.py   alerts (list, ack, silence, silences, unsilence)     hooks.py    hooks test
    alerts_view.py  what `nvmon alerts` lists: filters, order, the two-line view
    history.py  history          tui.py      tui          demo.py     demo
    fleet.py    fleet (the evaluator in nvmon.fleet.service, as a command)
    simfleet.py sim-fleet (the load generator, nvmon.loadgen, as a command)
    config.py   config check (the daemon's and fleet's readers; effective config, secrets masked)

Nothing below this package imports it (tests/test_layers.py); it may import any layer.
"""

from nvmon.cli.root import cli, main

__all__ = ["cli", "main"]
