"""The per-GPU checks: Xid events, NVLink links and speed, link errors, PCIe, power and heat."""

from __future__ import annotations

from nvmon import xid as xids
from nvmon.audit.findings import (
    BRAKE_THROTTLES,
    POWER_THROTTLES,
    THERMAL_THROTTLES,
    Finding,
    Thresholds,
    _finding,
    _fmt_w,
    _rising,
)
from nvmon.model import GpuSample
from nvmon.specs import GpuSpec

def _check_xid(gpu: GpuSample) -> list[Finding]:
    """One finding per Xid number delivered this tick (an event, not a state: the alert rule holds it)."""
    counts: dict[int, int] = {}
    for x in gpu.xid_events:
        counts[x] = counts.get(x, 0) + 1
    return [Finding(code="gpu.xid", severity=xids.severity(x),
                    message=f"GPU {gpu.index} Xid {x}, {xids.meaning(x)} (+{n}): {xids.action(x)}",
                    gpu=gpu.index, observed={"xid": x, "events": n}, xid=x)
            for x, n in counts.items()]


def _bus_key(bus_id: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) of an NVML ("00000000:18:00.0") or kernel-log ("0000:18:00") bus id."""
    parts = (bus_id or "").split(":")
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16)
    except (IndexError, ValueError):
        return None


def _ago(seconds: float) -> str:
    s = int(seconds)
    return f"{s} s" if s < 120 else f"{s // 60} min"


def _check_logged_xids(gpus: list[GpuSample], logged: list[xids.LoggedXid]) -> list[Finding]:
    """Xids the kernel log holds from shortly before the audit (nvmon.collect.kmsg): one finding
    per GPU and Xid, as for NVML's events, unless NVML delivered that Xid on that GPU this sample.
    A bus id no GPU has (a GPU gone from NVML's list) is named by its bus id."""
    by_bus = {k: g for g in gpus if (k := _bus_key(g.pci_bus_id)) is not None}
    seen: dict[tuple[int | None, str, int], list[xids.LoggedXid]] = {}
    for lx in logged:
        gpu = by_bus.get(_bus_key(lx.bus_id))
        if gpu is not None and lx.xid in gpu.xid_events:
            continue  # NVML's finding has it
        seen.setdefault((gpu.index if gpu is not None else None, lx.bus_id, lx.xid), []).append(lx)
    out = []
    for (index, bus, x), items in seen.items():
        who = f"GPU {index}" if index is not None else f"GPU at PCI {bus} (not in NVML's list)"
        newest = min(lx.age_s for lx in items)
        times = f" ×{len(items)}, the last" if len(items) > 1 else ""
        out.append(Finding(
            code="gpu.xid", severity=xids.severity(x),
            message=f"{who} Xid {x}, {xids.meaning(x)} (kernel log{times} {_ago(newest)} before the audit): "
                    f"{xids.action(x)}",
            gpu=index, device=None if index is not None else bus,
            observed={"xid": x, "events": len(items), "source": "kernel log", "age_s": round(newest)}, xid=x))
    return out


def _check_nvlink(gpu: GpuSample, spec: GpuSpec, t: Thresholds) -> list[Finding]:
    out: list[Finding] = []
    i = gpu.index
    if spec.nvlink_links and (gpu.nvlink or gpu.nvlink_count is not None):
        slots = gpu.nvlink_count if gpu.nvlink_count is not None else len(gpu.nvlink)
        if slots == spec.nvlink_links:
            for link in gpu.nvlink:
                if link.active is False:
                    out.append(_finding(
                        "nvlink.link_down",
                        f"GPU {i} NVLink {link.link} down: " + (
                            "reseat the NVLink bridge and both cards" if link.remote_type == "gpu" or spec.board == "pairs"
                            else "reseat the GPU/baseboard, check NVSwitch and fabric manager"),
                        gpu=i, link=link.link, observed="down", expected="active"))
        else:
            # More slots than the SKU uses (bridged PCIe cards: 12 of 18) or fewer than expected:
            # only the number of usable links can be judged, not which ones. Unreadable ones get
            # the benefit of the doubt.
            active = sum(1 for link in gpu.nvlink if link.active is True)
            unreadable = sum(1 for link in gpu.nvlink if link.active is None)
            if active + unreadable < spec.nvlink_links:
                out.append(_finding(
                    "nvlink.link_down",
                    f"GPU {i} NVLink {active}/{spec.nvlink_links} links active ({slots} slots): "
                    "check NVLink bridges or baseboard",
                    gpu=i, observed=f"{active}/{spec.nvlink_links} active",
                    expected=f"{spec.nvlink_links}/{spec.nvlink_links} active"))
    for link in gpu.nvlink:
        if link.active is True:
            slow_version = (spec.nvlink_version is not None and link.version is not None
                            and link.version < spec.nvlink_version)
            slow_speed = (spec.nvlink_link_mbps is not None and link.speed_mbps is not None
                          and link.speed_mbps < t.nvlink_speed_ratio * spec.nvlink_link_mbps)
            if slow_version or slow_speed:
                seen = f"NVLink{link.version if link.version is not None else '?'} {link.speed_mbps or '?'} MB/s"
                want = f"NVLink{spec.nvlink_version or '?'} {spec.nvlink_link_mbps or '?'} MB/s"
                out.append(_finding(
                    "nvlink.speed", f"GPU {i} NVLink {link.link} at {seen}, {spec.key} expects {want}",
                    gpu=i, link=link.link,
                    observed={"version": link.version, "speed_mbps": link.speed_mbps},
                    expected={"version": spec.nvlink_version, "speed_mbps": spec.nvlink_link_mbps}))
    return out


def _check_nvlink_errors(gpu: GpuSample) -> list[Finding]:
    out = []
    for link in gpu.nvlink:
        if not any(link.errors_delta.values()):  # the rule: nothing rose (values are None or ≥ 0)
            continue
        rising = _rising(link.errors_delta)
        if rising:
            what = ", ".join(f"{k} +{v}" for k, v in rising.items())
            out.append(_finding(
                "nvlink.errors", f"GPU {gpu.index} NVLink {link.link} errors rising: {what}",
                gpu=gpu.index, link=link.link, observed=dict(link.errors_delta), expected=0))
    return out


def _check_pcie(gpu: GpuSample, spec: GpuSpec | None, busy: bool) -> list[Finding]:
    out = []
    i, p = gpu.index, gpu.pcie
    spec_name = spec.key if spec is not None else "the spec"
    # Width: a live link narrower than the slot allows, or a slot narrower than the SKU needs.
    downtrained = p.width is not None and p.max_width is not None and p.width < p.max_width
    narrow_slot = spec is not None and p.max_width is not None and p.max_width < spec.pcie_width
    if downtrained or narrow_slot:
        want = max(p.max_width or 0, spec.pcie_width if spec else 0)
        have = p.width if p.width is not None else p.max_width
        hint = ("reseat the card or riser, check BIOS bifurcation" if downtrained
                else f"the slot allows only x{p.max_width}, check slot choice, riser and BIOS bifurcation")
        out.append(_finding("pcie.width", f"GPU {i} PCIe x{have}, expected x{want}: {hint}",
                            gpu=i, observed=f"x{have}", expected=f"x{want}"))
    # Gen: a low current gen only matters under load; a low max gen (host limits the GPU) always.
    slow_now = busy and p.gen is not None and p.max_gen is not None and p.gen < p.max_gen
    slow_slot = spec is not None and p.max_gen is not None and p.max_gen < spec.pcie_gen
    if slow_now or slow_slot:
        want = max(p.max_gen or 0, spec.pcie_gen if spec else 0)
        if slow_now:
            also = f" ({spec_name} expects Gen{want})" if slow_slot else ""
            msg = (f"GPU {i} PCIe Gen{p.gen} under load, link allows Gen{p.max_gen}{also}: "
                   "check riser/retimer signal integrity and BIOS PCIe speed")
            have = p.gen
        else:
            msg = (f"GPU {i} PCIe limited to Gen{p.max_gen}, {spec_name} expects Gen{want}: "
                   "host, slot or BIOS setting limits the link")
            have = p.max_gen
        out.append(_finding("pcie.gen", msg, gpu=i, observed=f"Gen{have}", expected=f"Gen{want}"))
    if p.replay_errors_delta is not None and p.replay_errors_delta > 0:
        out.append(_finding(
            "pcie.replay", f"GPU {i} PCIe replays rising (+{p.replay_errors_delta}): signal integrity, check riser/slot",
            gpu=i, observed=p.replay_errors_delta, expected=0))
    return out


def _check_power_thermal(gpu: GpuSample, spec: GpuSpec | None, busy: bool, t: Thresholds) -> list[Finding]:
    out = []
    i = gpu.index
    ref = spec.power_limit_w if spec is not None else gpu.power_default_limit_w
    if gpu.power_limit_w is not None and ref and gpu.power_limit_w < t.power_limit_ratio * ref:
        what = "spec" if spec is not None else "default"
        out.append(_finding(
            "power.limit",
            f"GPU {i} power limit {_fmt_w(gpu.power_limit_w)}, {what} {_fmt_w(ref)}: "
            "check nvidia-smi -pl settings and the PSU/rack power budget",
            gpu=i, observed=round(gpu.power_limit_w, 1), expected=round(ref, 1)))
    capped_by = [r for r in POWER_THROTTLES if r in (gpu.throttle_reasons or ())] if busy else []
    at_limit = (gpu.power_w is not None and gpu.power_limit_w
                and gpu.power_w >= t.power_cap_ratio * gpu.power_limit_w)
    if capped_by or at_limit:
        why = ", ".join(capped_by) if capped_by else "drawing at the limit"
        out.append(_finding(
            "power.cap",
            f"GPU {i} power-capped ({why}) at {_fmt_w(gpu.power_w)} of {_fmt_w(gpu.power_limit_w)}",
            gpu=i, observed={"power_w": gpu.power_w, "throttle": list(capped_by)},
            expected={"power_limit_w": gpu.power_limit_w}))
    out += _check_brake(gpu)
    hot_by = [r for r in THERMAL_THROTTLES if r in (gpu.throttle_reasons or ())]
    too_hot = gpu.temperature_c is not None and gpu.temperature_c >= t.temperature_c
    if hot_by or too_hot:
        temp = f"{gpu.temperature_c:.0f} °C" if gpu.temperature_c is not None else "? °C"
        what = f"slowing down ({', '.join(hot_by)}) at {temp}" if hot_by else f"at {temp}"
        out.append(_finding(
            "thermal",
            f"GPU {i} {what}, limit {t.temperature_c:.0f} °C: check airflow, fans and inlet temperature",
            gpu=i, observed={"temperature_c": gpu.temperature_c, "throttle": hot_by},
            expected={"temperature_c_below": t.temperature_c}))
    return out


def _check_brake(gpu: GpuSample) -> list[Finding]:
    """HW slowdown: clocks cut by half or more, busy or not (NVML's clock event reasons).

    The HW power brake is an external signal (power delivery in trouble); HW slowdown without a
    cause NVML names is judged with it. HW slowdown with HW thermal is the `thermal` finding's.
    A state, judged per sample: how long it has held is the alert rule's (`power.brake` reads
    "active for 3 h 12 min" there, its for-duration keeps a flicker from paging)."""
    reasons = gpu.throttle_reasons or ()
    braked = [r for r in BRAKE_THROTTLES if r in reasons]
    if not braked or ("hw_power_brake" not in braked and "hw_thermal" in reasons):
        return []
    what = "HW power brake" if "hw_power_brake" in braked else "HW slowdown (no cause reported)"
    return [_finding(
        "power.brake",
        f"GPU {gpu.index} {what} active: clocks cut by half or more; check the PSUs, power cables and the "
        "BMC event log",
        gpu=gpu.index, observed={"throttle": braked}, expected={"throttle": []})]
