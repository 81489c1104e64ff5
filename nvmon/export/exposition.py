"""Prometheus' text format 0.0.4, from prometheus_client metric families, with reuse between pages.

Written here rather than by `prometheus_client.generate_latest` because that function appends
`_total` to every counter's `# TYPE` line, while dcgm-exporter's counters
(`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`) have no such suffix on either line. OpenMetrics is not
offered for the same reason (it requires `_total` on counters); dcgm-exporter serves 0.0.4 too.

Two things make a page cheap to write again a second later: `Labels` carry their rendered text
and are kept between pages, and `exposition()` reuses the text of every family whose samples are
the same as last time (most of a page: limits, link states, error counters, topology, audit).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString


class Labels(dict):
    """A sample's labels that carry their own rendered text (`k="v",...`).

    Label sets are built once and kept across renderings: `with_()` remembers its results, and the
    collector keeps the root sets (per node, per GPU), so a rendering mostly looks label sets up
    instead of building and escaping them again. Treat them as immutable.
    """

    __slots__ = ("text", "_kids")

    def __init__(self, pairs: Mapping[str, str] = {}):
        super().__init__(pairs)
        self.text = ",".join(f'{k}="{_escape(v)}"' for k, v in self.items())
        self._kids: dict[tuple[str, str], Labels] = {}

    def with_(self, key: str, value: str) -> Labels:
        """These labels plus one more (memoized)."""
        kid = self._kids.get((key, value))
        if kid is None:
            kid = Labels.__new__(Labels)
            dict.update(kid, self)
            kid[key] = value
            pair = f'{key}="{_escape(value)}"'
            kid.text = f"{self.text},{pair}" if self.text else pair
            kid._kids = {}
            if len(self._kids) < 4096:  # label values come from hardware: bounded, but be safe
                self._kids[(key, value)] = kid
        return kid


def _escape(v: str) -> str:
    if "\\" in v or "\n" in v or '"' in v:
        return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return v


def _family_text(m: Metric) -> str:
    typ = {"unknown": "untyped", "info": "gauge", "stateset": "gauge"}.get(m.type, m.type)
    name = m.samples[0].name if m.type == "counter" else m.name
    doc = m.documentation.replace("\\", r"\\").replace("\n", r"\n")
    out = [f"# HELP {name} {doc}\n# TYPE {name} {typ}\n"]
    append = out.append
    for sample in m.samples:
        sname, labels, value = sample[0], sample[1], sample[2]
        v = str(value) if type(value) is int else repr(value) if value - value == 0 else floatToGoString(value)
        if type(labels) is Labels:
            text = labels.text
        else:  # a plain dict (ProcessCollector's)
            text = ",".join(f'{k}="{_escape(val)}"' for k, val in labels.items())
        append(f"{sname}{{{text}}} {v}\n" if text else f"{sname} {v}\n")
    return "".join(out)


def exposition(metrics: Iterable[Metric], cache: dict[str, tuple[list, str]] | None = None) -> bytes:
    """Prometheus text format 0.0.4. A counter's `# TYPE` names its samples as they are: with
    `_total` for prometheus_client-style families, without for dcgm-exporter's names.

    `cache` (kept by the caller between calls, updated here) holds each family's samples and text
    from the previous call: a family whose samples compare equal is not formatted again. Most of a
    page (limits, link states, error counters, topology, audit) repeats from tick to tick, and the
    comparison is cheap, as label sets are the same objects each time (see `Labels`)."""
    previous = cache if cache is not None else {}
    current: dict[str, tuple[list, str]] = {}
    out: list[str] = []
    for m in metrics:
        samples = m.samples
        if not samples:
            continue
        hit = previous.get(m.name)
        text = hit[1] if hit is not None and hit[0] == samples else _family_text(m)
        current[m.name] = (samples, text)
        out.append(text)
    if cache is not None:
        cache.clear()
        cache.update(current)
    return "".join(out).encode()
