"""Safe text and compact number formats for the TUI.

Strings from the wire (models, racks, labels, summaries) are data: `clean` makes them printable
(control characters, escape sequences and bidi overrides become visible `\\x1b`-style escapes)
and `literal` wraps them in a `rich.text.Text`, which Rich and Textual never parse as markup.
Nothing in nvmon/tui passes wire text to an API that reads markup.

Problems are shown by color and by a symbol, for readers who do not see the color:
`OK` ✓ green, `WARN` ⚠ yellow, `BAD` ✗ red.
"""

from __future__ import annotations

import math
from functools import lru_cache

from rich.text import Text

OK, WARN, BAD, DIM, INFO = "green", "yellow", "bold red", "dim", "cyan"
SYMBOL = {OK: "✓", WARN: "⚠", BAD: "✗", INFO: "ℹ", DIM: " "}
SEVERITY_STYLE = {"critical": BAD, "warning": WARN, "info": INFO}

Segment = tuple[str, str]  # (text, style): a cell is a tuple of segments, compared before building Text


@lru_cache(maxsize=4096)  # wire strings repeat across nodes (models, racks); bounded against variety
def clean(s: object, limit: int = 256) -> str:
    """`s` as one printable line: non-printable characters (C0/C1 controls, ESC, DEL, bidi and
    zero-width format characters, line breaks) are written as Python escapes, and long text is cut."""
    text = "" if s is None else str(s)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def literal(s: object, style: str = "", limit: int = 256) -> Text:
    """Wire text as a `Text`: shown exactly, never parsed as markup."""
    return Text(clean(s, limit), style=style, no_wrap=True, end="")


def assemble(segments: tuple[Segment, ...]) -> Text:
    """A cell's segments as one `Text` (the texts are already clean)."""
    if not segments:
        return Text(no_wrap=True, end="")
    if len(segments) == 1:
        return Text(segments[0][0], style=segments[0][1], no_wrap=True, end="")
    out = Text(no_wrap=True, end="")
    for text, style in segments:
        out.append(text, style)
    return out


def short_model(model: str | None) -> str:
    """'NVIDIA H100 80GB HBM3' → 'H100 80GB HBM3' (clean; '?' when unknown)."""
    if not model:
        return "?"
    m = clean(model, 64)
    return m[7:] if m.startswith("NVIDIA ") else m


def known(v: float | None) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def gbs(v: float | None, width: int = 0) -> str:
    """bytes/s → GB/s, few digits."""
    if not known(v):
        return "–".rjust(width)
    g = v / 1e9
    s = f"{g:.0f}" if g >= 100 else f"{g:.1f}" if g >= 1 else f"{g:.2f}"
    return s.rjust(width)


def kw(v: float | None) -> str:
    return "–" if not known(v) else f"{v / 1000:.1f}"


def age(seconds: float | None) -> str:
    """3s, 4m, 2h, 3d."""
    if seconds is None:
        return "?"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def pct_style(pct: float | None) -> str:
    """Utilization coloring: idle dim, busy bright; utilization itself is never a fault."""
    if not known(pct):
        return DIM
    if pct >= 75:
        return "bold magenta"
    if pct >= 40:
        return "magenta"
    if pct >= 5:
        return "blue"
    return DIM


LEVEL_STYLE = {"under": OK, "near": WARN, "over": BAD}  # nvmon.fleet.rules.rack_power_level
