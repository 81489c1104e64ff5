"""dcgm-exporter compatibility lines: which dcgm-exporter's page the `DCGM_*` families copy.

`[prometheus] dcgm_compat` picks one. A line is data, read by the exporter (nvmon.export.collector)
and the docs generator: the spelling of the host label (on every series of the page, nvmon_* too,
so one label joins them), the driver label dcgm-exporter puts on each of its per-GPU series (from
the `DCGM_FI_DRIVER_VERSION, label` row of its etc/default-counters.csv), and whether the `DCGM_*`
families are exported at all. Names, types and units of the `DCGM_*` families are those of
nvmon.catalog.families, the same in both lines below.

Verified against NVIDIA/dcgm-exporter's git history (docs/prometheus.md, "Compatibility lines"):
up to tag 4.5.3-4.8.2 the per-GPU template writes `Hostname=`; commit d5e5f51 (#655, 2026-05-12,
"Rename Hostname label to hostname") changed it, first released in 4.6.0-4.8.3. 4.9.0 renames 23
fields (new units) and 4.10.0 four more, by their release notes; the 23 names themselves (their
tag's etc/default-counters.csv) could not be read, so no line claims them.
"""

from __future__ import annotations

from dataclasses import dataclass

# The host label as SCOPE_LABELS spells it (the default line); a line may spell it otherwise.
HOST_LABEL = "hostname"


@dataclass(frozen=True, slots=True)
class Line:
    key: str  # the value of `[prometheus] dcgm_compat`
    matches: str  # the dcgm-exporter releases whose page it copies, for the docs
    host_label: str  # "hostname" | "Hostname"
    driver_label: str | None  # label with the driver version on each DCGM_* per-GPU series
    dcgm: bool = True  # False: no DCGM_* families, only nvmon_*

    def label(self, name: str) -> str:
        """A label name of SCOPE_LABELS as this line spells it."""
        return self.host_label if name == HOST_LABEL else name


LINES: dict[str, Line] = {line.key: line for line in (
    Line("4.8.3", "dcgm-exporter 4.6.0-4.8.3 (the first release with `hostname`)", "hostname",
         "DCGM_FI_DRIVER_VERSION"),
    Line("4.8.2", "dcgm-exporter up to 4.5.3-4.8.2 (`Hostname`; nvmon before dcgm_compat)", "Hostname",
         "DCGM_FI_DRIVER_VERSION"),
    Line("off", "none: only nvmon's own nvmon_* families", "hostname", None, dcgm=False),
)}
DEFAULT = "4.8.3"


def line(key: str = DEFAULT) -> Line:
    """The line `key` names; ValueError (one line, with the choices) for any other value."""
    try:
        return LINES[key]
    except (KeyError, TypeError):
        raise ValueError(f"{key!r} is not a dcgm-exporter line nvmon copies; "
                         f"choose one of {', '.join(LINES)}") from None
