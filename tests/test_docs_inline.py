"""Commands written inline in the docs' prose (`` `nvmon nodes --problems` ``), not only the fenced
blocks tests/test_docs_commands.py runs: each names a real command and only options it has, so a
renamed flag cannot live on in a sentence. Messages quoted inline (`nvmon audit: note: …`,
`nvmon <command>: <message>`) and the words below are prose, not commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_docs_commands import options_of, resolve

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PROSE = {"only"}  # `nvmon only`: a column of the hardware kit's comparison (docs/hardware.md)
SPAN = re.compile(r"(?<!`)`(nvmon [^`]+)`(?!`)")
FLAG = re.compile(r"(?<![\w-])(--?[a-z][\w-]*)")


def spans(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # fenced blocks: the other test's
    return [m.group(1) for m in SPAN.finditer(text)]


def problem(span: str) -> str | None:
    """Why `span` is not a valid nvmon command line, or None (also for prose and quoted messages)."""
    words = span.split()
    if words[1] in PROSE or words[1].endswith(":") or words[1].startswith("<") or words[1] in ("…", "..."):
        return None
    cmd, path, stray = resolve(words)
    if stray is not None and not cmd.invoke_without_command:
        return f"{' '.join(path)} has no command {stray!r}"
    unknown = set(FLAG.findall(span)) - options_of(cmd)
    return f"{' '.join(path)} has no {sorted(unknown)}" if unknown else None


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_inline_commands_name_real_commands_and_options(path: Path):
    bad = [f"`{s}`: {why}" for s in spans(path) if (why := problem(s))]
    assert bad == [], f"{path.name}:\n" + "\n".join(bad)


def test_the_check_catches_a_wrong_command_or_flag():
    assert problem("nvmon nodes --problems --json") is None
    assert problem("nvmon alerts silence --for 2h") is None
    assert problem("nvmon nodez") == "nvmon has no command 'nodez'"
    assert problem("nvmon nodes --problem") == "nvmon nodes has no ['--problem']"
    assert problem("nvmon audit: note: kernel log") is None and problem("nvmon …") is None
    assert sum(len(spans(p)) for p in DOCS) > 200  # the docs do name commands inline
