"""The header every screen shows: where the data comes from and how fresh it is, plus a red
banner while the broker is unreachable.

It reads `NvmonApp.header_info` (a reactive the app sets once a second); it never touches the
state or the subscriber itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from nvmon.tui.text import BAD, DIM, OK, SYMBOL, WARN, age, clean


@dataclass(frozen=True, slots=True)
class HeaderInfo:
    source: str  # broker URL or a label (e.g. "demo broker 127.0.0.1:18830")
    cluster: str | None
    nodes: int = 0
    online: int = 0
    stale: int = 0
    offline: int = 0
    rate_per_s: float | None = None  # messages/s; None without a subscriber
    dropped: int = 0
    last_drop: str | None = None  # why the latest dropped message was dropped (one line, escaped when shown)
    fresh_s: float | None = None  # since the newest tick
    connected: bool | None = None  # None: no subscriber (a fixed state)
    lost_for_s: float | None = None
    error: str | None = None
    connecting: bool = False  # no connection attempt has finished yet
    alerts: int | None = None  # active alerts: the nodes' own and the fleet rules'


def _rate(r: float) -> str:
    return f"{r / 1000:.1f}k" if r >= 1000 else f"{r:.0f}"


def info_text(info: HeaderInfo, title: str) -> Text:
    line = Text(no_wrap=True, overflow="ellipsis", end="")
    line.append(" nvmon ", "bold reverse")
    line.append(f" {title}", "bold")
    line.append("  │ ", DIM)
    line.append(clean(info.source, 80))
    if info.cluster:
        line.append(" · cluster ", DIM)
        line.append(clean(info.cluster, 64))
    line.append("\n")
    line.append(f" {info.nodes} nodes ", "bold")
    line.append(f"{SYMBOL[OK]}{info.online} ", OK)
    line.append(f"{SYMBOL[WARN]}{info.stale} ", WARN if info.stale else DIM)
    line.append(f"{SYMBOL[BAD]}{info.offline}", BAD if info.offline else DIM)
    if info.alerts is not None:
        line.append("  │ ", DIM)
        line.append(f"alerts {info.alerts}", WARN if info.alerts else DIM)
    if info.rate_per_s is not None:
        line.append("  │ ", DIM)
        line.append(f"{_rate(info.rate_per_s)} msg/s")
    line.append("  │ ", DIM)
    line.append(f"dropped {info.dropped}", WARN if info.dropped else DIM)
    line.append("  │ ", DIM)
    if info.fresh_s is None:
        line.append("no ticks yet", DIM)
    else:
        stale = info.fresh_s > 5
        line.append(f"fresh {info.fresh_s:.1f}s" if info.fresh_s < 60 else f"fresh {age(info.fresh_s)}",
                    WARN if stale else "")
    if info.dropped and info.last_drop:  # last: cut first on a narrow screen (the help shows it whole)
        line.append("  │ ", DIM)
        line.append(f"last drop: {clean(info.last_drop, 160)}", DIM)
    return line


def banner_text(info: HeaderInfo) -> Text | None:
    if info.connected is None or info.connected:
        return None
    if info.connecting:
        return Text(f" … connecting to {clean(info.source, 80)}", no_wrap=True, end="")
    t = Text(f" {SYMBOL[BAD]} broker lost", style="bold", no_wrap=True, overflow="ellipsis", end="")
    if info.lost_for_s is not None:
        t.append(f" {age(info.lost_for_s)} ago")
    if info.error:
        t.append(": " + clean(info.error, 160))
    t.append(" — reconnecting; showing the last data")
    return t


class StatusHeader(Vertical):
    DEFAULT_CSS = """
    StatusHeader { height: auto; dock: top; }
    StatusHeader > #info { height: 2; background: $panel; text-wrap: nowrap; text-overflow: ellipsis; }
    StatusHeader > #banner { height: 1; background: $error; color: $text; display: none; }
    StatusHeader > #banner.-connecting { background: $warning; }
    StatusHeader.-lost > #banner { display: block; }
    """

    def __init__(self, title: str, **kw):
        super().__init__(**kw)
        self.title = title

    def compose(self) -> ComposeResult:
        yield Static(id="info")
        yield Static(id="banner")

    def on_mount(self) -> None:
        self.watch(self.app, "header_info", self.show_info)

    def show_info(self, info: HeaderInfo | None) -> None:
        if info is None:
            return
        self.query_one("#info", Static).update(info_text(info, self.title))
        banner = banner_text(info)
        self.set_class(banner is not None, "-lost")
        b = self.query_one("#banner", Static)
        b.set_class(info.connecting, "-connecting")
        if banner is not None:
            b.update(banner)
