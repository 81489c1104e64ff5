"""nvmon's readings against nvidia-smi's on the same machine: a table of matches and differences.

Inputs: `nvidia-smi -q -x` (the XML; both the r535+ layout, `gpu_power_readings` and
`clocks_event_reasons`, and the older `power_readings` / `clocks_throttle_reasons`), optionally
`nvidia-smi nvlink -s` (per-link state and speed: the XML has no NVLink data), one
`nvmon sample --json` (docs/sample-schema.md: its `gpus[].fabric` is compared with the XML's
`<fabric>`) and, optionally, the kit's direct NVML fabric probe (bench/hardware/probe.py: nvml.h's
own struct layouts, a third opinion named in a fabric row's note where it disagrees with nvmon).

Verdicts: `match`; `close` (a live value, read a moment apart by the two tools, within the
tolerance the row's note gives; an idle GPU's PCIe generation below the maximum; a fabric status
both report as a failure); `DIFFERS`; `smi only` (nvidia-smi shows it, nvmon does not read
it: a gap, not an error); `nvmon only` (nvidia-smi says N/A); `n/a` (neither has it).

    python bench/hardware/compare.py QX.xml SAMPLE.json [--nvlink NVLINK-S.txt] [--fabric PROBE.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

from nvmon.model import fabric_health

NA = {"", "N/A", "[N/A]", "Not Supported", "[Not Supported]", "Unknown Error", "[Unknown Error]",
      "Requested functionality has been deprecated", "None"}
# nvidia-smi's clocks-event tags (after the clocks_event_reason_ / clocks_throttle_reason_ prefix)
# -> nvmon's throttle reason names (docs/sample-schema.md).
REASONS = {"gpu_idle": "gpu_idle", "applications_clocks_setting": "applications_clocks",
           "sw_power_cap": "sw_power_cap", "hw_slowdown": "hw_slowdown", "sync_boost": "sync_boost",
           "sw_thermal_slowdown": "sw_thermal", "hw_thermal_slowdown": "hw_thermal",
           "hw_power_brake_slowdown": "hw_power_brake", "display_clocks_setting": "display_clocks"}
BUS_ID = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")
MIB = 2**20


class CaptureError(ValueError):
    """An nvidia-smi output that cannot be read (one line, for the kit's log)."""


@dataclass(frozen=True, slots=True)
class Row:
    scope: str  # "node", "gpu 3"
    field: str
    smi: str
    nvmon: str
    verdict: str
    note: str = ""


# ---- nvidia-smi -q -x ------------------------------------------------------------------------

def number(text: str | None) -> float | None:
    """'700.00 W' -> 700.0, '16x' -> 16.0, '29 C' -> 29.0; None for N/A and the like."""
    if text is None or text.strip() in NA:
        return None
    m = re.match(r"\s*(-?[0-9]+(?:\.[0-9]+)?)", text)
    return float(m.group(1)) if m else None


def _int(text: str | None) -> int | None:
    v = number(text)
    return None if v is None else int(v)


def _text(el: ET.Element, path: str) -> str | None:
    t = el.findtext(path)
    return None if t is None or t.strip() in NA else t.strip()


def _first(el: ET.Element, *paths: str) -> str | None:
    for p in paths:
        t = el.findtext(p)
        if t is not None:
            return t
    return None


def _children(el: ET.Element, path: str) -> list[ET.Element]:
    found = el.find(path)
    return [] if found is None else list(found)


def parse_gpu(g: ET.Element) -> dict:
    pw = "gpu_power_readings" if g.find("gpu_power_readings") is not None else "power_readings"
    reasons_el = g.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if reasons_el is None:
        reasons_el, prefix = g.find("clocks_throttle_reasons"), "clocks_throttle_reason_"
    reasons = None
    if reasons_el is not None:
        reasons = sorted(REASONS.get(e.tag.removeprefix(prefix), e.tag.removeprefix(prefix))
                         for e in reasons_el if (e.text or "").strip() == "Active")
    fabric = None
    fab = g.find("fabric")
    if fab is not None:
        fabric = {"state": _text(fab, "state"), "status": _text(fab, "status"),
                  "clique_id": _int(fab.findtext("cliqueId")), "cluster_uuid": _text(fab, "clusterUuid"),
                  "health": {e.tag: (e.text or "").strip() for e in _children(fab, "health")}}
    link = "pci/pci_gpu_link_info"
    return {
        "bus_id": g.get("id") or _text(g, "pci/pci_bus_id"),
        "name": _text(g, "product_name"),
        "uuid": _text(g, "uuid"),
        "serial": _text(g, "serial"),
        "pci_device_id": _text(g, "pci/pci_device_id"),
        "power_draw_w": number(_first(g, f"{pw}/average_power_draw", f"{pw}/power_draw")),
        "power_limit_w": number(_first(g, f"{pw}/current_power_limit", f"{pw}/enforced_power_limit")),
        "power_requested_limit_w": number(_first(g, f"{pw}/requested_power_limit", f"{pw}/power_limit")),
        "power_default_limit_w": number(g.findtext(f"{pw}/default_power_limit")),
        "power_min_limit_w": number(g.findtext(f"{pw}/min_power_limit")),
        "power_max_limit_w": number(g.findtext(f"{pw}/max_power_limit")),
        "pcie_gen": _int(g.findtext(f"{link}/pcie_gen/current_link_gen")),
        "pcie_max_gen": _int(g.findtext(f"{link}/pcie_gen/max_link_gen")),
        "pcie_device_max_gen": _int(g.findtext(f"{link}/pcie_gen/max_device_link_gen")),
        "pcie_width": _int(g.findtext(f"{link}/link_widths/current_link_width")),
        "pcie_max_width": _int(g.findtext(f"{link}/link_widths/max_link_width")),
        "pcie_replay": _int(g.findtext("pci/replay_counter")),
        "temperature_c": number(g.findtext("temperature/gpu_temp")),
        "memory_temperature_c": number(g.findtext("temperature/memory_temp")),
        "utilization_pct": number(g.findtext("utilization/gpu_util")),
        "throttle_reasons": reasons,
        "sm_clock_mhz": _int(g.findtext("clocks/sm_clock")),
        "mem_clock_mhz": _int(g.findtext("clocks/mem_clock")),
        "sm_clock_max_mhz": _int(g.findtext("max_clocks/sm_clock")),
        "mem_clock_max_mhz": _int(g.findtext("max_clocks/mem_clock")),
        "fb_total_mib": _int(g.findtext("fb_memory_usage/total")),
        "fb_reserved_mib": _int(g.findtext("fb_memory_usage/reserved")),
        "fb_used_mib": _int(g.findtext("fb_memory_usage/used")),
        "fb_free_mib": _int(g.findtext("fb_memory_usage/free")),
        "fabric": fabric,
    }


def parse_smi_xml(text: str | bytes) -> dict:
    """The node and its GPUs from `nvidia-smi -q -x`, values in plain numbers (W, MHz, MiB, °C)."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise CaptureError(f"nvidia-smi XML does not parse: {e}") from None
    if root.tag != "nvidia_smi_log":
        raise CaptureError(f"not an nvidia-smi -q -x log: root element <{root.tag}>")
    return {"driver_version": _text(root, "driver_version"), "cuda_version": _text(root, "cuda_version"),
            "attached_gpus": _int(root.findtext("attached_gpus")),
            "gpus": [parse_gpu(g) for g in root.findall("gpu")]}


# ---- nvidia-smi nvlink -s ---------------------------------------------------------------------

_GPU_LINE = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]*)\))?\s*$")
_LINK_LINE = re.compile(r"^\s+Link (\d+): (.*?)\s*$")


def parse_nvlink_status(text: str) -> dict[int, dict]:
    """{gpu index: {"name", "uuid", "links": {link: GB/s, or None when '<inactive>'}}}.
    Lines of other shapes (a driver's 'NVML: Unable to retrieve NVLink information ...') are
    kept in "notes" of the GPU they follow, or of GPU -1 before any."""
    out: dict[int, dict] = {}
    cur = -1
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _GPU_LINE.match(line)
        if m:
            cur = int(m.group(1))
            out[cur] = {"name": m.group(2).strip(), "uuid": m.group(3), "links": {}, "notes": []}
            continue
        m = _LINK_LINE.match(line)
        if m and cur in out:
            value = m.group(2)
            gbps = number(value.split()[0]) if "GB/s" in value else None
            out[cur]["links"][int(m.group(1))] = gbps
            continue
        out.setdefault(cur, {"name": None, "uuid": None, "links": {}, "notes": []})["notes"].append(line.strip())
    return out


# ---- the comparison -----------------------------------------------------------------------------

def _fmt(v, unit: str = "") -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        v = f"{v:.2f}".rstrip("0").rstrip(".")
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v)) or "none"
    return f"{v}{unit}"


def _verdict(smi, nv, *, tol: float | None = None) -> str:
    if smi is None and nv is None:
        return "n/a"
    if nv is None:
        return "smi only"
    if smi is None:
        return "nvmon only"
    if tol is None:
        return "match" if smi == nv else "DIFFERS"
    diff = abs(float(smi) - float(nv))
    return "match" if diff < 1e-6 else "close" if diff <= tol else "DIFFERS"


def _scaled(v, div: float):
    return None if v is None else round(v / div, 3)


class _Rows:
    def __init__(self) -> None:
        self.rows: list[Row] = []

    def add(self, scope: str, field: str, smi, nv, *, unit: str = "", tol: float | None = None,
            note: str = "", verdict: str | None = None) -> None:
        v = verdict or _verdict(smi, nv, tol=tol)
        self.rows.append(Row(scope, field, _fmt(smi, unit), _fmt(nv, unit), v, note if v != "match" else ""))


def _pair(smi_gpus: list[dict], nv_gpus: list[dict]) -> tuple[list[tuple[dict | None, dict | None]], str]:
    """Pairs (nvidia-smi GPU, nvmon GPU): by bus id when both tools list the same ones, else by
    position (both list GPUs in PCI bus order by default)."""
    smi_ids = {g["bus_id"] for g in smi_gpus}
    nv_ids = {g.get("pci_bus_id") for g in nv_gpus}
    if smi_ids == nv_ids and len(smi_ids) == len(smi_gpus) == len(nv_gpus):
        by_id = {g.get("pci_bus_id"): g for g in nv_gpus}
        return [(g, by_id[g["bus_id"]]) for g in smi_gpus], "by bus id"
    n = max(len(smi_gpus), len(nv_gpus))
    pairs = [(smi_gpus[i] if i < len(smi_gpus) else None, nv_gpus[i] if i < len(nv_gpus) else None)
             for i in range(n)]
    return pairs, "by position: the two tools list different bus ids"


def _power(r: _Rows, scope: str, s: dict, g: dict) -> None:
    r.add(scope, "power draw", s["power_draw_w"], g.get("power_w"), unit=" W",
          tol=max(10.0, 0.1 * (s["power_draw_w"] or 0)),
          note="live: nvidia-smi's 1 s average vs nvmon's energy slope; close = within 10 W or 10 %")
    r.add(scope, "power limit (enforced)", s["power_limit_w"], g.get("power_limit_w"), unit=" W", tol=0.5)
    r.add(scope, "power limit default", s["power_default_limit_w"], g.get("power_default_limit_w"), unit=" W",
          tol=0.5)
    r.add(scope, "power limit max", s["power_max_limit_w"], g.get("power_max_limit_w"), unit=" W", tol=0.5)
    r.add(scope, "power limit min", s["power_min_limit_w"], None, unit=" W", note="nvmon does not report it")


def _pcie(r: _Rows, scope: str, s: dict, g: dict) -> None:
    p = g.get("pcie") or {}
    idle = "gpu_idle" in (g.get("throttle_reasons") or []) + (s["throttle_reasons"] or [])
    gen, nv_gen, top = s["pcie_gen"], p.get("gen"), s["pcie_max_gen"] or p.get("max_gen")
    # A link trains down to save power when the GPU idles (to Gen1 on some GPUs, not at all on others:
    # docs/hardware.md): an idle GPU's generation below the maximum is no difference. Under load it is.
    explained = (idle and None not in (gen, nv_gen, top) and gen != nv_gen and max(gen, nv_gen) <= top)
    r.add(scope, "PCIe gen", gen, nv_gen, verdict="close" if explained else None,
          note="GPU idle: a link may train down below its maximum to save power" if explained else
          "live: the generation drops at idle" + (" (GPU idle)" if idle else ""))
    r.add(scope, "PCIe gen max", s["pcie_max_gen"], p.get("max_gen"))
    r.add(scope, "PCIe gen device max", s["pcie_device_max_gen"], p.get("device_max_gen"))
    r.add(scope, "PCIe width", s["pcie_width"], p.get("width"), unit="x")
    r.add(scope, "PCIe width max", s["pcie_max_width"], p.get("max_width"), unit="x")
    smi, nv = s["pcie_replay"], p.get("replay_errors")
    rose = smi is not None and nv is not None and nv > smi
    r.add(scope, "PCIe replays (lifetime)", smi, nv, verdict="close" if rose else None,
          note="a counter: nvmon read it later, it may only have risen")


def _live(r: _Rows, scope: str, s: dict, g: dict) -> None:
    r.add(scope, "temperature", s["temperature_c"], g.get("temperature_c"), unit=" C", tol=3,
          note="live; close = within 3 C")
    r.add(scope, "memory temperature", s["memory_temperature_c"], g.get("memory_temperature_c"), unit=" C",
          tol=3, note="live; close = within 3 C")
    r.add(scope, "utilization", s["utilization_pct"], g.get("utilization_pct"), unit=" %", tol=15,
          note="live; close = within 15 points")
    smi, nv = s["throttle_reasons"], g.get("throttle_reasons")
    r.add(scope, "clocks event reasons", smi, None if nv is None else sorted(nv), note="live")
    sm, mem = s["sm_clock_mhz"], s["mem_clock_mhz"]
    r.add(scope, "SM clock", sm, _scaled(g.get("sm_clock_hz"), 1e6), unit=" MHz", tol=0.1 * (sm or 0),
          note="live; close = within 10 %")
    r.add(scope, "memory clock", mem, _scaled(g.get("mem_clock_hz"), 1e6), unit=" MHz", tol=0.1 * (mem or 0),
          note="live; close = within 10 %")


def _memory(r: _Rows, scope: str, s: dict, g: dict) -> None:
    r.add(scope, "SM clock max", s["sm_clock_max_mhz"], _scaled(g.get("sm_clock_max_hz"), 1e6), unit=" MHz")
    r.add(scope, "memory clock max", s["mem_clock_max_mhz"], _scaled(g.get("mem_clock_max_hz"), 1e6), unit=" MHz")
    r.add(scope, "memory total", s["fb_total_mib"], _scaled(g.get("fb_total_bytes"), MIB), unit=" MiB", tol=1,
          note="nvidia-smi rounds to whole MiB")
    for key, name in (("fb_used", "memory used"), ("fb_free", "memory free")):
        smi = s[f"{key}_mib"]
        r.add(scope, name, smi, _scaled(g.get(f"{key}_bytes"), MIB), unit=" MiB",
              tol=max(256.0, 0.05 * (smi or 0)), note="live; close = within 256 MiB or 5 %")


def _nvlink(r: _Rows, scope: str, links: dict | None, g: dict) -> None:
    nv_links = g.get("nvlink") or []
    if links is None:
        r.add(scope, "NVLink links", None, g.get("nvlink_count"), note="no nvidia-smi nvlink -s output")
        return
    got = links["links"]
    r.add(scope, "NVLink links", len(got) if got else None, g.get("nvlink_count") or None,
          note="; ".join(links.get("notes") or []))
    smi_active = sorted(k for k, v in got.items() if v is not None)
    nv_active = sorted(lk["link"] for lk in nv_links if lk.get("active"))
    if got or nv_links:
        r.add(scope, "NVLink active links", smi_active, nv_active, note="link indices up")
    bad = []
    for lk in nv_links:
        smi = got.get(lk["link"])
        mbps = lk.get("speed_mbps") if lk.get("active") else None
        if smi is None and mbps is None:
            continue
        if smi is None or mbps is None or abs(smi * 1000 - mbps) >= 1:  # 26.562 GB/s == 26562 MB/s
            bad.append(f"link {lk['link']}: {_fmt(smi)} GB/s vs {_fmt(mbps)} MB/s")
    speeds_smi = sorted({v for v in got.values() if v is not None})
    speeds_nv = sorted({lk.get("speed_mbps") for lk in nv_links if lk.get("active") and lk.get("speed_mbps")})
    if speeds_smi or speeds_nv:
        r.add(scope, "NVLink speed per link", " ".join(f"{v} GB/s" for v in speeds_smi) or None,
              " ".join(f"{v} MB/s" for v in speeds_nv) or None, verdict="DIFFERS" if bad else "match",
              note="; ".join(bad[:4]) + (f" (+{len(bad) - 4} more)" if len(bad) > 4 else ""))


# nvmon's fabric (sample JSON gpus[].fabric: NVML's numbers, docs/sample-schema.md) in nvidia-smi's words.
FABRIC_STATE_WORDS = {1: "Not Started", 2: "In Progress", 3: "Completed"}
FABRIC_SUMMARY_WORDS = {1: "Healthy", 2: "Unhealthy", 3: "Limited Capacity"}  # 0: not reported
# nvidia-smi's <health> tags -> (the healthMask field nvmon decodes, words for its values 1 and 2).
FABRIC_HEALTH_TAGS = {"bandwidth": ("degraded_bandwidth", "Degraded", "Full"),
                      "route_recovery_in_progress": ("route_recovery", "True", "False"),
                      "route_unhealthy": ("route_unhealthy", "True", "False"),
                      "access_timeout_recovery": ("access_timeout_recovery", "True", "False")}
_FABRIC_ROWS = (("state", "fabric state"), ("status", "fabric status"), ("clique_id", "fabric clique id"),
                ("cluster_uuid", "fabric cluster uuid"), ("health_summary", "fabric health summary"),
                *((tag, f"fabric health {tag.replace('_', ' ')}") for tag in FABRIC_HEALTH_TAGS))


def nvmon_fabric(fab: dict | None) -> dict:
    """A sample's `gpus[].fabric` as nvidia-smi would print it (None where nvmon has nothing)."""
    fab = fab or {}
    state, status, summary = fab.get("state"), fab.get("status"), fab.get("health_summary")
    uuid = fab.get("cluster_uuid")
    out = {"state": None if state is None else FABRIC_STATE_WORDS.get(state, f"state {state}"),
           "status": None if status is None else "Success" if status == 0 else f"NVML return {status}",
           "clique_id": fab.get("clique_id"), "cluster_uuid": None if uuid is None else uuid.lower(),
           "health_summary": FABRIC_SUMMARY_WORDS.get(summary)}
    fields = fabric_health(fab.get("health_mask"))
    for tag, (name, one, two) in FABRIC_HEALTH_TAGS.items():
        out[tag] = {1: one, 2: two}.get(fields.get(name))
    return out


def smi_fabric(fab: dict | None) -> dict:
    """The XML's parsed `<fabric>` with the same keys (N/A and the like: None)."""
    fab = fab or {}
    health = {k: (None if v in NA else v) for k, v in (fab.get("health") or {}).items()}
    uuid = fab.get("cluster_uuid")
    return {"state": fab.get("state"), "status": fab.get("status"), "clique_id": fab.get("clique_id"),
            "cluster_uuid": None if uuid is None else uuid.lower(), "health_summary": health.get("summary"),
            **{tag: health.get(tag) for tag in FABRIC_HEALTH_TAGS}}


def _fabric(r: _Rows, scope: str, s: dict, g: dict, probe: dict | None) -> None:
    smi, nv = smi_fabric(s.get("fabric")), nvmon_fabric(g.get("fabric"))
    if s.get("fabric") is None and not any(v is not None for v in nv.values()):
        return  # neither tool knows of a fabric (a PCIe card, an older driver's XML)
    probe_error = None if probe is None else probe.get("error")
    for key, name in _FABRIC_ROWS:
        a, b = smi[key], nv[key]
        if (key == "health_summary" or key in FABRIC_HEALTH_TAGS) and a is None and b is None:
            continue  # health neither the driver nor nvmon reports (no summary before v3, most fields before GB200)
        verdict, notes = None, []
        if key == "status" and a not in (None, "Success") and b not in (None, "Success"):
            verdict = "close"  # both a failure: nvmon keeps NVML's return code, nvidia-smi prints its text
            notes.append("both report a failure (nvmon: NVML's return code, nvidia-smi: its text)")
        if key == "state" and a != b and "In Progress" in (a, b):
            notes.append("live: In Progress until Fabric Manager has configured the GPU")
        said = None if probe is None or probe_error else probe.get(key)
        if said is not None and key != "status" and said != b:
            notes.append(f"the kit's direct NVML probe says {said}")
        if b is None and probe_error:
            notes.append(f"the kit's NVML probe got: {probe_error}")
        r.add(scope, name, a, b, verdict=verdict, note="; ".join(notes))


def compare(smi: dict, sample: dict, *, nvlink: dict[int, dict] | None = None,
            fabric: list[dict] | None = None) -> list[Row]:
    """Rows comparing one parsed `nvidia-smi -q -x` with one `nvmon sample --json` dict."""
    r = _Rows()
    nvml = sample.get("nvml") or {}
    r.add("node", "driver version", smi.get("driver_version"), nvml.get("driver_version"))
    r.add("node", "GPUs", smi.get("attached_gpus"), len(sample.get("gpus") or []))
    pairs, how = _pair(smi["gpus"], sample.get("gpus") or [])
    by_id = how == "by bus id"
    r.add("node", "GPU pairing", "bus ids", "by bus id" if by_id else "by position",
          verdict="match" if by_id else "DIFFERS", note=how)
    for i, (s, g) in enumerate(pairs):
        scope = f"gpu {g['index'] if g and 'index' in g else i}"
        if s is None or g is None:
            r.add(scope, "present", None if s is None else s["bus_id"], None if g is None else g.get("pci_bus_id"))
            continue
        if g.get("lost"):
            r.add(scope, "lost", "no", "yes", verdict="DIFFERS", note="nvmon reports the GPU lost")
            continue
        r.add(scope, "name", s["name"], g.get("name"))
        r.add(scope, "uuid", s["uuid"], g.get("uuid"))
        r.add(scope, "serial", s["serial"], g.get("serial"))
        bus = g.get("pci_bus_id")
        r.add(scope, "bus id", s["bus_id"], bus)
        if bus is not None and not BUS_ID.match(bus):
            r.add(scope, "bus id form", "00000000:BB:DD.F", bus, verdict="DIFFERS", note="not NVML's 8-digit form")
        _power(r, scope, s, g)
        _pcie(r, scope, s, g)
        _live(r, scope, s, g)
        _memory(r, scope, s, g)
        links = None if nvlink is None else nvlink.get(g.get("index", i), {"links": {}, "notes": ["GPU not listed"]})
        _nvlink(r, scope, links, g)
        probe = None
        if fabric is not None:
            probe = next((p for p in fabric if p.get("index") == g.get("index", i)), None)
        _fabric(r, scope, s, g, probe)
    return r.rows


# ---- output ------------------------------------------------------------------------------------

ORDER = ("DIFFERS", "smi only", "nvmon only", "close", "match", "n/a")


def summary(rows: list[Row]) -> dict[str, int]:
    counts = {v: 0 for v in ORDER}
    for row in rows:
        counts[row.verdict] = counts.get(row.verdict, 0) + 1
    return {k: v for k, v in counts.items() if v}


def render(rows: list[Row], *, only: tuple[str, ...] | None = None) -> str:
    """A plain-text table (`only`: just these verdicts), and a line of counts at the end."""
    shown = [row for row in rows if only is None or row.verdict in only]
    head = Row("scope", "field", "nvidia-smi", "nvmon", "verdict", "note")
    cols = ("scope", "field", "smi", "nvmon", "verdict")
    width = {c: min(40, max(len(getattr(x, c)) for x in [head, *shown])) for c in cols}
    lines = []
    for x in [head, *shown]:
        cells = [getattr(x, c)[:width[c]].ljust(width[c]) for c in cols]
        lines.append("  ".join(cells + [x.note]).rstrip())
    lines.insert(1, "  ".join("-" * width[c] for c in cols) + "  ----")
    lines.append("")
    lines.append("summary: " + ", ".join(f"{n} {v}" for v, n in summary(rows).items()))
    return "\n".join(lines)


def rows_to_dicts(rows: list[Row]) -> list[dict]:
    return [asdict(x) for x in rows]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xml", type=Path)
    ap.add_argument("sample", type=Path)
    ap.add_argument("--nvlink", type=Path, help="nvidia-smi nvlink -s output")
    ap.add_argument("--fabric", type=Path, help="the kit's fabric probe (JSON list)")
    a = ap.parse_args(argv)
    try:
        smi = parse_smi_xml(a.xml.read_bytes())
        sample = json.loads(a.sample.read_text())
        nvlink = parse_nvlink_status(a.nvlink.read_text()) if a.nvlink else None
        fabric = json.loads(a.fabric.read_text()) if a.fabric else None
    except (OSError, CaptureError, json.JSONDecodeError) as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    print(render(compare(smi, sample, nvlink=nvlink, fabric=fabric)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
