"""InfiniBand: ports down, slow or in Ethernet mode, rising error counters, missing ports, and the
HCAs' PCIe links."""

from __future__ import annotations

from nvmon.audit.findings import Finding, Thresholds, _finding, _fmt_rate, _rising, _sum
from nvmon.model import IbPortSample
from nvmon.specs import NodeSpec

def _is_down(port: IbPortSample) -> bool:
    # Unreadable state (None) is not evidence of a down port.
    return ((port.state is not None and port.state.upper() != "ACTIVE")
            or (port.phys_state is not None and port.phys_state.lower() != "linkup"))


def _is_active(port: IbPortSample) -> bool:
    return port.state is not None and port.state.upper() == "ACTIVE" and not _is_down(port)


def _is_ethernet(port: IbPortSample) -> bool:
    return (port.link_layer or "").lower() == "ethernet"


def _check_ib(ports: tuple[IbPortSample, ...], node_spec: NodeSpec, t: Thresholds = Thresholds()) -> list[Finding]:
    out: list[Finding] = []
    active = [p for p in ports if _is_active(p)]
    # Without an expected rate, compare with the fastest active port of the same link layer:
    # a 100G Ethernet front-end NIC beside 400G IB compute ports is not a downgrade.
    fastest: dict[bool, float] = {}
    for p in active:
        if p.rate_gbps is not None:
            eth = _is_ethernet(p)
            fastest[eth] = max(fastest.get(eth, 0.0), p.rate_gbps)
    for p in ports:
        where = {"device": p.device, "port": p.port}
        name = f"{p.device} port {p.port}"
        if _is_down(p):
            out.append(_finding(
                "ib.port_down",
                f"{name} {p.state or '?'}/{p.phys_state or '?'}: check cable, transceiver and switch port",
                observed={"state": p.state, "phys_state": p.phys_state},
                expected={"state": "ACTIVE", "phys_state": "LinkUp"}, **where))
        problems = []
        want = node_spec.ib_rate_gbps if node_spec.ib_rate_gbps else fastest.get(_is_ethernet(p))
        if _is_active(p) and want and p.rate_gbps is not None and p.rate_gbps < want:
            problems.append(f"at {_fmt_rate(p.rate_gbps)}, expected {_fmt_rate(want)}")
        if node_spec.ib_ports and _is_ethernet(p):
            problems.append("Ethernet (RoCE), expected InfiniBand")
        if problems:
            out.append(_finding(
                "ib.rate", f"{name} " + "; ".join(problems),
                observed={"rate_gbps": p.rate_gbps, "link_layer": p.link_layer},
                expected={"rate_gbps": want, "link_layer": "InfiniBand" if node_spec.ib_ports else None},
                **where))
        rising = _rising(p.errors_delta)
        if rising:
            what = ", ".join(f"{k} +{v}" for k, v in rising.items())
            out.append(_finding("ib.errors", f"{name} errors rising: {what}",
                                observed=dict(p.errors_delta), expected=0, **where))
    out += _check_hca_pcie(ports, t)
    if node_spec.ib_ports and (len(ports) < node_spec.ib_ports or len(active) < node_spec.ib_ports):
        out.append(_finding(
            "ib.count",
            f"{len(ports)} IB ports present, {len(active)} active, expected {node_spec.ib_ports}",
            observed={"present": len(ports), "active": len(active)}, expected=node_spec.ib_ports))
    return out


def _check_hca_pcie(ports: tuple[IbPortSample, ...], t: Thresholds) -> list[Finding]:
    """One finding per HCA (a dual-port HCA has one PCIe link) whose link trained below its
    maximum: a narrower width always (HDR/NDR need the full x16 to reach line rate), a lower gen
    only while its ports carry traffic (PCIe power management may lower it at idle, as on a GPU)."""
    by_hca: dict[str, list[IbPortSample]] = {}
    for port in ports:
        by_hca.setdefault(port.device, []).append(port)
    out: list[Finding] = []
    for device, feeds in by_hca.items():
        p, bdf = feeds[0].pcie, feeds[0].pci_bus_id
        name = f"{device} HCA" + (f" ({bdf})" if bdf else "")
        fed = ", ".join(f"port {q.port}" for q in feeds)
        if p.width is not None and p.max_width is not None and p.width < p.max_width:
            out.append(_finding(
                "pcie.width", f"{name} PCIe x{p.width}, expected x{p.max_width}: {fed} cannot reach line rate; "
                "reseat the HCA or riser, check BIOS bifurcation",
                device=device, observed=f"x{p.width}", expected=f"x{p.max_width}"))
        busy = sum(_sum(q.tx_bytes_per_s, q.rx_bytes_per_s) for q in feeds) >= t.busy_pcie_bytes_per_s
        if busy and p.gen is not None and p.max_gen is not None and p.gen < p.max_gen:
            out.append(_finding(
                "pcie.gen", f"{name} PCIe Gen{p.gen} under load, link allows Gen{p.max_gen} ({fed}): "
                "check riser/retimer signal integrity and BIOS PCIe speed",
                device=device, observed=f"Gen{p.gen}", expected=f"Gen{p.max_gen}"))
    return out
