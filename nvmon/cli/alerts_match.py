"""Parsing what `nvmon alerts silence` is given: a duration (--for) and matchers (--match)."""

from __future__ import annotations

from nvmon.alerts.model import MATCH_FIELDS
from nvmon.cli.common import DURATION, NAME_RE, UNIT_CASE_HINT, UNIT_S, unit_case_wrong


def parse_duration(text: str) -> float:
    """'90s', '30m', '2h', '1d', '1w' → seconds; ValueError otherwise."""
    m = DURATION.match(text)
    if unit_case_wrong(text):
        raise ValueError(f"{text.strip()!r}: {UNIT_CASE_HINT}")
    if not m or float(m.group(1)) <= 0:
        raise ValueError("use a duration such as 30m, 2h or 1d")
    return float(m.group(1)) * UNIT_S[m.group(2)]


def parse_matchers(items: tuple[str, ...], labels: set[str] | None = None) -> dict[str, str]:
    """('node=gpu-07', 'code=nvlink.*') → {'node': 'gpu-07', 'code': 'nvlink.*'}; ValueError otherwise.

    A key is an alert field (MATCH_FIELDS) or a label name; `label.NAME` is always a label. With
    `labels` (the label names known here), a bare key that is neither is refused: `nod=gpu-01`
    would otherwise be a silence that matches nothing."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        explicit = key.startswith("label.") and key not in MATCH_FIELDS
        if explicit:
            key = key.removeprefix("label.")
        if not sep or not value:
            raise ValueError(f"{item!r}: expected KEY=VALUE, e.g. node=gpu-07")
        if key not in MATCH_FIELDS and not NAME_RE.match(key):
            raise ValueError(f"{key!r}: match on {', '.join(MATCH_FIELDS)} or a label name")
        if labels is not None and not explicit and key not in MATCH_FIELDS and key not in labels:
            raise ValueError(_unknown_key(key, labels))
        if len(value) > 256 or not value.isprintable():
            raise ValueError(f"{key}: value must be printable, up to 256 characters")
        out[key] = value
    if not out:
        raise ValueError("give at least one --match KEY=VALUE")
    return out


def _unknown_key(key: str, labels: set[str]) -> str:
    import difflib

    near = difflib.get_close_matches(key, [*MATCH_FIELDS, *labels], n=1)
    seen = f"labels seen here: {', '.join(sorted(labels))}" if labels else "no labels seen here"
    return (f"--match {key}=…: unknown key{f' (did you mean {near[0]}?)' if near else ''}; use a field "
            f"({', '.join(MATCH_FIELDS)}), a label ({seen}), or label.{key}=… for a label not seen yet")
