"""`nvmon demo`: the command (registered by nvmon.cli). Imports stay light here: the fleet, the
broker and the TUI load only when the command runs.

Stopping: `q` in the TUI, Ctrl-C, SIGTERM, SIGHUP or `--duration` all take the same path out of
`DemoFleet`'s context — daemons stop (status offline), broker stops, temporary files go — and
exit 0. Bad input is one line and exit 2 (usage) or 1, never a traceback.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

import click

from nvmon.cli.common import NvmonError, counted

STATUS_EVERY_S = 5.0
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Recent(logging.Handler):
    """Keeps the last few error records while the TUI owns the terminal; shown after it closes."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: collections.deque[str] = collections.deque(maxlen=10)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        with contextlib.suppress(Exception):
            self.records.append(" ".join(self.format(record).split()))


def _setup_logging(tui: bool) -> _Recent | None:
    """Errors only: the nodes' routine warnings (a dying node's lost connection) are the demo's point,
    not news. Under the TUI nothing may write to the terminal, so errors wait in memory."""
    fmt = logging.Formatter("nvmon demo: %(name)s: %(levelname)s: %(message)s")
    handler: logging.Handler = _Recent() if tui else logging.StreamHandler(sys.stderr)
    handler.setFormatter(fmt)
    logging.basicConfig(level=logging.ERROR, handlers=[handler], force=True)
    return handler if tui else None


def _load_tui():
    try:
        from nvmon.tui.app import NvmonApp
    except ImportError as e:
        if (e.name or "").startswith("nvmon.tui"):
            raise NvmonError("the TUI (nvmon/tui/app.py) is not part of this build yet; "
                               "run `nvmon demo --no-tui` and watch the broker with mosquitto_sub") from None
        raise
    return NvmonApp


def _say(text: str) -> None:
    """Print a headless line; a terminal that went away (SIGHUP) must not turn the stop into an error."""
    with contextlib.suppress(OSError):
        click.echo(text)


def _remove_own_sim_trees() -> None:
    """Belt and braces: a simulated /sys tree of this process that a daemon stopped too hard to close."""
    import tempfile

    for base in {"/dev/shm", tempfile.gettempdir()}:
        for d in Path(base).glob(f"nvmon-sim-{os.getpid()}-*"):
            shutil.rmtree(d, ignore_errors=True)


def _status_line(fleet, watch, last_published: int) -> tuple[str, int]:
    st = fleet.status()
    n = len(st.nodes)
    published = st.published
    online = f"online {watch.online}/{n}" if watch.status else f"up {st.up}/{n}"
    if watch.offline:
        online += f" (offline: {', '.join(watch.offline)})"
    rate = max(0, published - last_published) / STATUS_EVERY_S
    counts = watch.alert_counts()
    alerts = (f"alerts {sum(counts.values())} on {counted(watch.alert_nodes(), 'node')} ("
              + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + ")") if counts else "no alerts"
    return f"t+{st.elapsed_s:.0f}s  {online} · samples {rate:.1f}/s · {alerts}", published


async def _headless(fleet, stop: asyncio.Event) -> None:
    from nvmon.demo.watch import WireWatch

    p = fleet.plan
    racks = len({n.rack for n in p.nodes})
    n = len(p.nodes)
    _say(f"nvmon demo: {n} simulated node{'s' * (n != 1)} in {racks} rack{'s' * (racks != 1)}, "
         f"cluster {fleet.cluster!r}, {fleet.broker_name} {fleet.url}")
    _say(f"  view it:  nvmon tui --broker {fleet.url} --cluster {fleet.cluster}")
    _say(f"  raw:      mosquitto_sub -h 127.0.0.1 -p {fleet.port} -t 'nvmon/v1/#' -v")
    for line in p.describe():
        _say(f"  planted:  {line}")
    _say("  stop with Ctrl-C")
    watch = WireWatch(fleet.settings, fleet.cluster)
    task = asyncio.create_task(watch.run(), name="demo.watch")
    published = 0
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), STATUS_EVERY_S)
            if not stop.is_set():
                line, published = _status_line(fleet, watch, published)
                _say(line)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


_TAGS = {"pairs-a100": "pairs", "pcie_width": "x8", "ib_rate": "100G", "power_cap": "cap", "fabric": "fabric"}


def planted_notice(plan) -> str:
    """One line for the TUI: what is planted on which node, tersely ('04 pairs, 07 x8, 09 err@40s, …');
    the help screen has the plan's full sentences."""
    tags = []
    for n in plan.nodes:
        words = [_TAGS[n.profile]] if n.profile in _TAGS else []
        for part in n.sim.split(",")[1:]:
            kind, _, arg = part.partition("=")
            if kind == "nvlink_errors":
                words.append(f"err@{arg.rpartition('@')[2]}s")
            elif kind in _TAGS:
                words.append(_TAGS[kind])
        if n.dies_at_s is not None:
            words.append(f"dies@{n.dies_at_s:g}s")
        if words:
            tags.append((n.name, " ".join(words)))
    short = all(name.startswith("gpu-") for name, _ in tags)
    return "planted: " + ", ".join(f"{name[4:] if short else name} {w}" for name, w in tags)


async def _main(plan, *, port: int | None, tui_app, duration: float | None, broker: str = "auto") -> int:
    """Run the fleet (and the TUI on it) until a stop; returns the exit status."""
    from nvmon.demo.fleet import DemoFleet

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    app = None

    def request_stop() -> None:
        stop.set()
        if app is not None:
            app.exit()

    for sig in _SIGNALS:
        loop.add_signal_handler(sig, request_stop)
    if duration is not None:
        loop.call_later(duration, request_stop)
    echo = (lambda line: _say(f"  {line}")) if tui_app is None else None
    rc = 0
    try:
        async with DemoFleet(plan, port=port, on_event=echo, broker=broker) as fleet:
            if tui_app is None:
                await _headless(fleet, stop)
                _say("nvmon demo: stopping…")
            elif not stop.is_set():
                source = f"demo · {len(plan.nodes)} sim nodes · {fleet.url}"  # fits 80 columns
                app = tui_app(fleet.settings, cluster=fleet.cluster, source=source, notice=planted_notice(plan),
                              notes=tuple(f"planted: {line}" for line in plan.describe()))
                await app.run_async()
                rc = app.return_code or 0  # non-zero: the TUI failed (Textual has shown why)
    finally:
        for sig in _SIGNALS:
            loop.remove_signal_handler(sig)
    return rc


@click.command("demo")
@click.option("--nodes", type=int, default=16, show_default=True,
              help="Simulated nodes (1-100: the real daemon code, all in this one process).")
@click.option("--racks", type=int, help="Racks to spread them over (default 2).")
@click.option("--seed", type=click.IntRange(0, 2**31), default=1, show_default=True,
              help="Picks the faulty GPUs, links and ports, and each board's traffic.")
@click.option("--port", type=click.IntRange(1, 65535), help="Broker port on 127.0.0.1 (default: a free one).")
@click.option("--no-tui", "no_tui", is_flag=True,
              help="Run headless: print the broker URL and a status line every few seconds.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Stop after this long (default: until q / Ctrl-C).")
@click.option("--embedded-broker", "embedded", is_flag=True,
              help="Use the embedded pure-Python broker even where Mosquitto is installed.")
@click.option("--speed", type=float, default=1.0, hidden=True, help="Run the fault timeline this many times faster.")
def demo_command(nodes: int, racks: int | None, seed: int, port: int | None, no_tui: bool, duration: float | None,
                 embedded: bool, speed: float) -> None:
    """A simulated GPU fleet with planted faults, live in the TUI — no GPU, no broker needed.

    Starts an MQTT broker on a free 127.0.0.1 port (Mosquitto when it is installed, else an embedded
    pure-Python one) and N simulated 8-GPU nodes, each running
    the real `nvmon daemon` code (sampling, SQLite history in a temporary directory, MQTT), then
    opens `nvmon tui` on them. Planted: a pairs-bridged "fake NVLink" box, a GPU on PCIe x8, an IB
    port at 100G, a power-capped GPU, NVLink errors from t+40 s, and a node that dies at t+25 s
    (its will goes out) and returns 30 s later. q or Ctrl-C stops everything and removes its files.
    """
    from nvmon.demo.scenario import PlanError, plan_fleet

    try:
        plan = plan_fleet(nodes, racks, seed=seed, speed=speed)
    except PlanError as e:
        raise click.UsageError(str(e)) from None
    from nvmon.demo.brokers import DemoError, choose

    try:
        broker = choose("embedded" if embedded else "auto")
    except DemoError as e:
        raise click.UsageError(str(e)) from None
    tui_app = None
    if not no_tui:
        tui_app = _load_tui()
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise NvmonError("the TUI needs a terminal; use --no-tui to run headless")
    recent = _setup_logging(tui=tui_app is not None)
    try:
        rc = asyncio.run(_main(plan, port=port, tui_app=tui_app, duration=duration, broker=broker))
    except DemoError as e:
        raise NvmonError(str(e)) from None
    finally:
        _remove_own_sim_trees()
        if recent is not None and recent.count:
            click.echo(f"nvmon demo: {recent.count} errors were logged while the TUI ran; the last ones:", err=True)
            for line in recent.records:
                click.echo(f"  {line}", err=True)
    if tui_app is None:
        _say("nvmon demo: stopped; broker, nodes and temporary files are gone")
    sys.exit(rc)
