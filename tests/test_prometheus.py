"""The Prometheus endpoint: metric names, types, labels and values against the sample they come
from, the text format as prometheus_client parses it, the HTTP server's behaviour with bad clients,
and a real `nvmon daemon --sim ... --prometheus` scraped over HTTP while it keeps sampling."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from samplefactory import healthy_sample, with_gpu, with_ib, with_link, with_pcie

from nvmon.audit import RULES, audit
from nvmon.export.catalog import GPU_LABELS, METRICS, NVMON_GPU_LABELS, exported_names, labels_of
from nvmon.export.prometheus import DaemonHealth, PrometheusExporter, advance
from nvmon.export.server import ListenError, MetricsServer, parse_listen
from nvmon.model import GpuFabric

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "docs" / "grafana" / "nvmon.json"
DOC = REPO / "docs" / "prometheus.md"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Page(dict):
    """Family name → family, as prometheus_client's parser sees the page; `.samples` indexes the
    samples by name."""

    def __init__(self, text: str):
        super().__init__((f.name, f) for f in text_string_to_metric_families(text))
        self.samples: dict[str, list] = {}
        for fam in self.values():
            for s in fam.samples:
                self.samples.setdefault(s.name, []).append(s)


def parse(text: str) -> Page:
    return Page(text)


def family(fams: Page, name: str):
    """The family of a catalogue name: the parser files nvmon's `X_total` counters as family X."""
    return fams.get(name) or fams.get(name.removesuffix("_total"))


def series(fams: Page, name: str) -> list:
    """The samples of one metric. The parser renames a counter `X` without `_total` (dcgm-exporter's)
    to samples `X_total` (its OpenMetrics convention), so both spellings are looked up."""
    got = fams.samples.get(name) or fams.samples.get(name + "_total")
    assert got, f"{name} not exported"
    return got


def value(fams: dict, name: str, **labels: str) -> float:
    hits = [s.value for s in series(fams, name) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} series"
    return hits[0]


def render(sample, **kw) -> str:
    ex = PrometheusExporter("127.0.0.1:0", **kw)
    ex.update(sample)
    return ex.page()[0].decode()


# ---------------------------------------------------------------- names, types, labels, values


def test_catalog_names_follow_prometheus_and_dcgm_conventions():
    for m in METRICS.values():
        assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", m.name), m.name
        assert m.type in ("gauge", "counter", "summary")
        if m.name.startswith("nvmon_"):
            assert m.name.endswith("_total") == (m.type == "counter"), m.name  # OpenMetrics style
        else:
            assert m.name.startswith("DCGM_FI_"), m.name  # everything else is dcgm-exporter's name


def full_page() -> str:
    """A page with every family: a throttle reason active, a broker configured, rendered twice."""
    s = with_gpu(healthy_sample(), 1, throttle_reasons=("sw_power_cap",),
                 fabric=GpuFabric(state=3, status=0, clique_id=0, cluster_uuid="00000000-0000-0000-0000-000000000000",
                                  health_mask=0x80, health_summary=1))  # B200's: access-timeout recovery False
    health = DaemonHealth(ticks=5, sample_seconds_total=0.05, mqtt_connected=True, mqtt_published=4,
                          alerts={("pcie.width", "warning", "firing"): 1, ("pcie.width", "warning", "pending"): 0},
                          hooks=(("oncall", "pagerduty", 3, 1, 0),),
                          store_resets={"deleted": 0, "replaced": 0, "corrupt": 1})
    ex = PrometheusExporter("127.0.0.1:0", health=lambda: health)
    ex.update(s)
    ex.page()
    ex.update(replace(s, ts=s.ts + 1))
    return ex.page()[0].decode()


def test_every_family_is_typed_as_the_catalog_says_and_parses():
    text = full_page()
    fams = parse(text)
    for m in METRICS.values():
        fam = family(fams, m.name)
        assert fam is not None, m.name
        assert fam.type == m.type, m.name
        assert fam.documentation == m.help
        for sample in fam.samples:  # the scope's label set plus the metric's own labels, nothing else
            assert set(sample.labels) == set(labels_of(m)), (m.name, sample.labels)
    # dcgm-exporter's counters carry no `_total`, on the TYPE line and on the samples alike
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert re.search(r"^DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION\{", text, re.M)
    assert "# TYPE nvmon_nvlink_tx_bytes_total counter\n" in text
    assert "process_cpu_seconds_total" in fams["process_cpu_seconds"].samples[0].name


def test_gpu_metrics_carry_dcgm_exporters_labels_and_values():
    s = with_gpu(healthy_sample(), 2, power_w=512.5, temperature_c=71.0, energy_j=1234.5678,
                 throttle_reasons=("sw_power_cap", "hw_slowdown"))
    s = with_pcie(s, 3, width=8, replay_errors=17)
    fams = parse(render(s))
    power = series(fams, "DCGM_FI_DEV_POWER_USAGE")
    assert len(power) == 8
    g = s.gpus[2]
    labels = next(x.labels for x in power if x.labels["gpu"] == "2")
    assert list(labels) == [*GPU_LABELS, "DCGM_FI_DRIVER_VERSION"]  # and in dcgm-exporter's order
    own = next(x.labels for x in series(fams, "nvmon_gpu_lost") if x.labels["gpu"] == "3")
    assert list(own) == list(NVMON_GPU_LABELS) and own["model_name"] == labels["modelName"]
    assert labels == {"gpu": "2", "UUID": g.uuid, "pci_bus_id": g.pci_bus_id, "device": "nvidia2",
                      "modelName": g.name, "hostname": s.node, "DCGM_FI_DRIVER_VERSION": s.nvml.driver_version}
    assert value(fams, "DCGM_FI_DEV_POWER_USAGE", gpu="2") == 512.5
    assert value(fams, "DCGM_FI_DEV_GPU_TEMP", gpu="2") == 71.0
    assert value(fams, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="2") == 1234568  # mJ
    assert value(fams, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", gpu="2") == 700
    assert value(fams, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu="2") == 0x4 | 0x8
    assert value(fams, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", gpu="2") == 0x4 | 0x8
    assert {x.labels["reason"] for x in series(fams, "nvmon_gpu_clocks_event_reason")} == {"sw_power_cap",
                                                                                          "hw_slowdown"}
    assert value(fams, "DCGM_FI_DEV_PCIE_LINK_WIDTH", gpu="3") == 8
    assert value(fams, "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", gpu="3") == 16
    assert value(fams, "DCGM_FI_DEV_PCIE_LINK_GEN", gpu="3") == 5
    assert value(fams, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", gpu="3") == 17
    assert value(fams, "DCGM_FI_PROF_PCIE_TX_BYTES", gpu="0") == 5e9
    assert value(fams, "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", gpu="0") == 5e9 / 1024


def test_nvlink_metrics_per_gpu_and_per_link():
    s = with_link(healthy_sample(), 1, 7, active=False, tx_bytes_per_s=0.0, rx_bytes_per_s=0.0)
    s = with_link(s, 4, 2, errors={"crc_flit": 3, "crc_data": 1, "replay": 5, "recovery": None})
    fams = parse(render(s))
    assert len(series(fams, "nvmon_nvlink_up")) == 144
    assert value(fams, "nvmon_nvlink_up", gpu="1", link="7") == 0
    assert sum(x.value for x in series(fams, "nvmon_nvlink_up")) == 143
    assert value(fams, "nvmon_gpu_nvlink_active_links", gpu="1") == 17
    assert value(fams, "nvmon_gpu_nvlink_min_speed_bytes_per_second", gpu="0") == 26562e6
    assert value(fams, "nvmon_nvlink_errors_total", gpu="4", link="2") == 9  # all kinds together
    assert value(fams, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", gpu="4") == 3
    assert value(fams, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", gpu="4") == 5
    assert value(fams, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", gpu="4") == 0  # other links' zeros
    assert value(fams, "DCGM_FI_PROF_NVLINK_TX_BYTES", gpu="0") == 18 * 20e9
    assert value(fams, "DCGM_FI_PROF_NVLINK_TX_BYTES", gpu="1") == 17 * 20e9
    # DCGM's "bandwidth total": tx + rx in MiB/s
    assert value(fams, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu="0") == pytest.approx(2 * 18 * 20e9 / 2**20)
    per_link = next(x for x in series(fams, "nvmon_nvlink_up") if x.labels["link"] == "0")
    assert set(per_link.labels) == {"gpu", "UUID", "hostname", "link"}


def test_byte_counters_integrate_rates_and_stay_monotonic():
    s0 = replace(healthy_sample(), interval_s=0.0)  # first tick: no rates yet
    snap = advance(None, s0)
    assert snap.link_bytes(0, 0) == (0.0, 0.0)
    s1 = replace(healthy_sample(), interval_s=0.5)
    snap = advance(snap, s1)
    assert snap.link_bytes(0, 0) == (10e9, 10e9)  # 20 GB/s for half a second
    assert snap.ib_bytes[("mlx5_0", 1)] == (5e9, 5e9)
    s2 = with_link(replace(healthy_sample(), interval_s=1.0), 0, 0, tx_bytes_per_s=None)  # counter reset
    snap = advance(snap, s2)
    assert snap.link_bytes(0, 0) == (10e9, 30e9)
    assert snap.link_bytes(0, 17) == (30e9, 30e9)
    fewer = with_gpu(replace(healthy_sample(), interval_s=1.0), 0, nvlink=healthy_sample().gpus[0].nvlink[1:])
    assert advance(snap, fewer).link_bytes(0, 17) == (50e9, 50e9)  # counts follow the link id
    fams = parse(exposition_of(snap))
    assert value(fams, "nvmon_nvlink_tx_bytes_total", gpu="0", link="0") == 10e9
    assert value(fams, "nvmon_ib_port_rx_bytes_total", device="mlx5_0", port="1") == 15e9


def exposition_of(snap) -> str:
    ex = PrometheusExporter("127.0.0.1:0", process_metrics=False)
    ex._snapshot = snap
    return ex.page()[0].decode()


def test_infiniband_pci_topology_and_audit():
    s = with_ib(healthy_sample(), 2, state="DOWN", phys_state="Polling", tx_bytes_per_s=0.0)
    s = with_ib(s, 5, rate_gbps=200.0)
    fams = parse(render(s))
    assert value(fams, "nvmon_ib_port_up", device="mlx5_2", port="1") == 0
    assert value(fams, "nvmon_ib_port_up", device="mlx5_0", port="1") == 1
    assert value(fams, "nvmon_ib_port_state", device="mlx5_2", state="DOWN", phys_state="Polling") == 1
    assert value(fams, "nvmon_ib_port_rate_bytes_per_second", device="mlx5_5") == 200e9 / 8
    assert len(series(fams, "nvmon_ib_port_errors_total")) == 8 * 5
    assert value(fams, "nvmon_pcie_link_width", kind="hca", device="mlx5_1") == 16
    assert len([x for x in series(fams, "nvmon_pcie_link_gen") if x.labels["kind"] == "nvswitch"]) == 4
    assert value(fams, "nvmon_topology_class", **{"class": "nvswitch"}) == 1
    assert value(fams, "nvmon_topology_class", **{"class": "pairs"}) == 0
    assert value(fams, "nvmon_topology_nvlink_pairs") == 28
    assert len(series(fams, "nvmon_topology_pair_nvlinks")) == 28
    assert value(fams, "nvmon_topology_pair_nvlinks", gpu="0", peer_gpu="7") == 18
    report = audit(s)
    for code, severity in RULES.items():
        n = sum(1 for f in report.findings if f.code == code)
        assert value(fams, "nvmon_audit_findings", code=code, severity=severity) == n
    assert value(fams, "nvmon_audit_findings", code="ib.port_down") == 1
    assert value(fams, "nvmon_audit_verdict", verdict=report.verdict) == 1


def test_audit_findings_use_the_daemons_configured_thresholds(tmp_path):
    """`nvmon_audit_findings` agrees with the daemon's own alerts once `[alerts]` thresholds are set."""
    from nvmon.alerts.rules import thresholds_of
    from nvmon.daemon.config import load_config
    from nvmon.daemon.main import Daemon

    s = with_gpu(healthy_sample(), 1, temperature_c=80.0)  # under the default 87 °C, over a configured 75
    assert value(parse(render(s)), "nvmon_audit_findings", code="thermal") == 0
    cfg = tmp_path / "daemon.toml"
    cfg.write_text('[alerts]\ntemperature_c = 75\n[prometheus]\nlisten = "127.0.0.1:0"\n')
    config = load_config(cfg)
    exporter = Daemon(config)._make_exporter()
    exporter.update(s)
    fams = parse(exporter.page()[0].decode())
    assert value(fams, "nvmon_audit_findings", code="thermal") == 1
    rule_findings = [f for f in audit(s, thresholds=thresholds_of(config.alerts)).findings if f.code == "thermal"]
    assert len(rule_findings) == 1  # what the alert rules (built on the same audit) see


def test_last_xid_per_gpu_like_dcgm_exporter():
    s = healthy_sample()
    snap = advance(None, s)
    assert value(parse(exposition_of(snap)), "DCGM_FI_DEV_XID_ERRORS", gpu="3") == 0
    snap = advance(snap, with_gpu(replace(s, ts=s.ts + 1), 3, xid_events=(48, 79)))
    snap = advance(snap, replace(s, ts=s.ts + 2))  # the value stays: it is the last Xid seen
    fams = parse(exposition_of(snap))
    assert value(fams, "DCGM_FI_DEV_XID_ERRORS", gpu="3") == 79
    assert value(fams, "DCGM_FI_DEV_XID_ERRORS", gpu="2") == 0


def test_pairs_board_topology():
    fams = parse(render(healthy_sample(name="NVIDIA H100 PCIe")))
    assert value(fams, "nvmon_topology_class", **{"class": "pairs"}) == 1
    assert value(fams, "nvmon_topology_nvlink_pairs") == 4
    assert value(fams, "nvmon_topology_pair_nvlinks", gpu="0", peer_gpu="1") == 12
    assert value(fams, "nvmon_topology_pair_nvlinks", gpu="0", peer_gpu="2") == 0


def test_unknown_values_are_absent_not_zero_and_hostile_strings_are_escaped():
    s = with_gpu(healthy_sample(), 0, temperature_c=None, throttle_reasons=None,
                 name='Evil "GPU" \\ with\nnewline')
    s = replace(s, node="n1")
    text = render(s)
    fams = parse(text)
    assert [x.labels["gpu"] for x in series(fams, "DCGM_FI_DEV_GPU_TEMP")] == [str(i) for i in range(1, 8)]
    assert "0" not in {x.labels["gpu"] for x in series(fams, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")}
    assert value(fams, "DCGM_FI_DEV_POWER_USAGE", gpu="0") == s.gpus[0].power_w  # the rest of the GPU is there
    assert next(x.labels["modelName"] for x in series(fams, "DCGM_FI_DEV_POWER_USAGE")
                if x.labels["gpu"] == "0") == 'Evil "GPU" \\ with\nnewline'


def test_lost_gpu_and_no_driver():
    s = with_gpu(healthy_sample(), 6, lost=True, power_w=None, nvlink=(), throttle_reasons=None)
    fams = parse(render(s))
    assert value(fams, "nvmon_gpu_lost", gpu="6") == 1
    assert value(fams, "nvmon_gpu_lost", gpu="0") == 0
    assert value(fams, "nvmon_audit_findings", code="gpu.lost") == 1
    fams = parse(render(healthy_sample(nvml_available=False)))
    assert value(fams, "nvmon_nvml_up") == 0
    assert "DCGM_FI_DEV_POWER_USAGE" not in fams
    assert value(fams, "nvmon_ib_port_up", device="mlx5_0") == 1  # InfiniBand without a driver
    assert value(fams, "nvmon_audit_verdict", verdict="unknown") == 1


def test_rendered_once_per_sample_with_the_audit_inside(monkeypatch):
    import nvmon.audit

    audits = []
    real = nvmon.audit.audit
    monkeypatch.setattr(nvmon.audit, "audit", lambda *a, **k: audits.append(1) or real(*a, **k))  # the Judge's
    ex = PrometheusExporter("127.0.0.1:0")
    assert ex.page() is None  # no sample yet
    s = healthy_sample()
    ex.update(s)
    first = ex.page()[0]
    for _ in range(20):
        assert ex.page()[0] is first  # the same bytes object: a copy to the socket, no rendering
    body, gz = ex.page(accept_gzip=True)
    assert gz and gzip.decompress(body) == first
    assert ex.collector.renders == 1 and len(audits) == 1
    ex.update(replace(s, ts=s.ts + 1))
    assert ex.page()[0] is not first
    assert ex.collector.renders == 2 and len(audits) == 2


def test_renders_ahead_while_scraped_every_tick():
    ex = PrometheusExporter("127.0.0.1:0")
    ex.start()
    try:
        s = healthy_sample()
        for k in range(3):  # a Prometheus scraping once per sample
            ex.update(replace(s, ts=s.ts + k))
            ex.page()
        renders = ex.collector.renders
        ex.update(replace(s, ts=s.ts + 3))  # the render thread renders without waiting for a scrape
        deadline = time.monotonic() + 15
        while ex.collector.renders == renders and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ex.collector.renders == renders + 1
        ex.page()
        assert ex.collector.renders == renders + 1
    finally:
        ex.stop()


# ---------------------------------------------------------------- the HTTP server


@pytest.mark.parametrize("text, expected", [
    ("0.0.0.0:9400", ("0.0.0.0", 9400)), ("127.0.0.1:0", ("127.0.0.1", 0)), (":9400", ("0.0.0.0", 9400)),
    ("[::]:9400", ("::", 9400)), ("[::1]:9401", ("::1", 9401)), ("localhost:9400", ("localhost", 9400)),
])
def test_parse_listen(text, expected):
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["9400", "0.0.0.0", "host:port", "0.0.0.0:99999", "::1:9400", "a b:1", ""])
def test_parse_listen_rejects(text):
    with pytest.raises(ValueError):
        parse_listen(text)


def test_config_flag_and_file(tmp_path):
    from nvmon.daemon.config import ConfigError, load_config

    cfg = tmp_path / "n.toml"
    cfg.write_text('[prometheus]\nlisten = "127.0.0.1:9401"\n')
    assert load_config(cfg).prometheus.listen == "127.0.0.1:9401"
    assert load_config(cfg, {"prometheus": "[::]:9402"}).prometheus.listen == "[::]:9402"
    assert load_config(cfg, {"prometheus": ""}).prometheus.listen is None  # '' switches it off
    with pytest.raises(ConfigError) as e:
        load_config(cfg, {"prometheus": "9400"})
    assert str(e.value).startswith("--prometheus: must be HOST:PORT") and "\n" not in str(e.value)
    cfg.write_text('[prometheus]\nlisten = "nope"\n')
    with pytest.raises(ConfigError, match=r"n\.toml: prometheus\.listen: must be HOST:PORT"):
        load_config(cfg)


def http(port: int, path: str = "/metrics", method: str = "GET", headers: dict | None = None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.fixture
def served():
    ex = PrometheusExporter(f"127.0.0.1:{free_port()}")
    ex.start()
    yield ex
    ex.stop()


def test_http_get_head_404_and_not_ready(served):
    port = served.server.port
    assert http(port)[0] == 503  # no sample yet
    served.update(healthy_sample())
    status, headers, body = http(port)
    assert status == 200 and headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert int(headers["Content-Length"]) == len(body) and b"DCGM_FI_DEV_POWER_USAGE" in body
    assert http(port, "/metrics?name[]=x")[2] == body
    status, headers, head_body = http(port, method="HEAD")
    assert status == 200 and head_body == b"" and int(headers["Content-Length"]) == len(body)
    assert http(port, "/nope")[0] == 404 and http(port, "/metrics/x")[0] == 404
    assert http(port, "/")[0] == 200
    assert http(port, method="POST")[0] == 501
    # over loopback the answer is plain even when gzip is asked for: compressing costs CPU for nothing
    assert "Content-Encoding" not in http(port, headers={"Accept-Encoding": "gzip"})[1]


def test_loopback_detection():
    from nvmon.export.server import _is_loopback

    assert _is_loopback("127.0.0.1") and _is_loopback("::1") and _is_loopback("::ffff:127.0.0.1")
    assert not _is_loopback("10.1.2.3") and not _is_loopback("fe80::1%eth0")


def test_bind_errors_are_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError, match="address already in use"):
            MetricsServer(f"127.0.0.1:{port}", lambda gz: None, content_type="text/plain").start()
    with pytest.raises(ListenError, match="cannot resolve"):
        MetricsServer("no-such-host.invalid:9400", lambda gz: None, content_type="text/plain").start()
    with pytest.raises(ListenError, match="not an address of this machine"):
        MetricsServer("192.0.2.1:9400", lambda gz: None, content_type="text/plain").start()


def raw(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it (or `timeout`)."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(data)
        s.settimeout(timeout)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out


@pytest.fixture
def tiny():
    """A server on a short leash: 4 connections, 0.5 s idle, 0.5 s for headers, 1 s to read an answer."""
    server = MetricsServer(f"127.0.0.1:{free_port()}", lambda gz: (b"ok\n", False), content_type="text/plain",
                           idle_s=0.5, header_s=0.5, write_s=1.0, max_connections=4, max_header_bytes=4096,
                           max_header_lines=20)
    server.start()
    yield server
    server.stop()


def closed(s: socket.socket, within: float) -> bool:
    """Did the server close `s` (EOF or reset) within `within` seconds, without answering?"""
    s.settimeout(within)
    try:
        return s.recv(100) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_full_server_sheds_its_longest_waiting_connection_instead_of_refusing(tiny):
    silent = [socket.create_connection(("127.0.0.1", tiny.port)) for _ in range(3)]
    time.sleep(0.05)
    partial = socket.create_connection(("127.0.0.1", tiny.port))
    partial.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    time.sleep(0.05)
    assert tiny.connections == 4
    assert http(tiny.port)[2] == b"ok\n"  # the 5th: served; the oldest waiting one made room
    assert closed(silent[0], 0.2) and tiny.shed == 1
    for s in silent[1:] + [partial]:
        assert closed(s, 2.0)  # past idle_s / header_s: gone, without an answer
        s.close()
    silent[0].close()
    assert tiny.header_timeouts == 1 and tiny.connections == 0


def test_slowloris_is_cut_at_the_header_deadline_though_bytes_keep_coming(tiny):
    s = socket.create_connection(("127.0.0.1", tiny.port))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    t0 = time.monotonic()
    s.settimeout(0.1)
    gone = False
    while time.monotonic() - t0 < 10:  # a byte every 0.1 s: each receive is quick, the request never ends
        try:
            s.sendall(b"a")
            if s.recv(100) == b"":
                gone = True
                break
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            gone = True
            break
    s.close()
    # Cut by its header deadline (the counter says which; it is counted before the close), not
    # before it (0.5 s); a deadline the bytes kept pushing back would never cut it. The upper bound
    # has room for a slow machine (~0.5 s here).
    assert gone and 0.4 < time.monotonic() - t0 < 5.0 and tiny.header_timeouts == 1


def test_oversized_headers_get_431_and_are_not_kept(tiny):
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
    long_line = raw(tiny.port, head + b"X-Big: " + b"a" * 65536 + b"\r\n\r\n")
    assert long_line.startswith(b"HTTP/1.1 431 ") and b"Connection: close" in long_line
    many = raw(tiny.port, head + b"".join(b"X-%d: 1\r\n" % i for i in range(25)) + b"\r\n")
    assert many.startswith(b"HTTP/1.1 431 ")
    assert raw(tiny.port, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    ok = raw(tiny.port, head + b"".join(b"X-%d: 1\r\n" % i for i in range(15)) + b"Connection: close\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200 ") and ok.endswith(b"\r\n\r\nok\n")
    assert tiny.bad_requests == 3 and tiny.connections == 0


def test_keep_alive_pipelining_http10_and_unread_answers(tiny):
    req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    two = raw(tiny.port, req + req.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
    assert two.count(b"HTTP/1.1 200 ") == 2 and two.endswith(b"ok\n")  # both answered, in order, then closed
    assert raw(tiny.port, b"GET /metrics HTTP/1.0\r\n\r\n").endswith(b"\r\n\r\nok\n")  # 1.0: closed after
    head = raw(tiny.port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert b"Content-Length: 3" in head and head.endswith(b"\r\n\r\n")
    post = raw(tiny.port, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
    assert post.startswith(b"HTTP/1.1 501 ")
    with socket.create_connection(("127.0.0.1", tiny.port)) as kept:  # keep-alive: one connection, 3 answers
        kept.settimeout(5)
        for _ in range(3):
            kept.sendall(req)
            got = b""
            while not got.endswith(b"ok\n"):
                got += kept.recv(1000)
            assert got.startswith(b"HTTP/1.1 200 ")
    # A client that asks and never reads: the answers pile up in the kernel, then it is cut at write_s.
    server = MetricsServer(f"127.0.0.1:{free_port()}", lambda gz: (b"x" * 2**20, False), content_type="text/plain",
                           write_s=0.5)
    server.start()
    try:
        greedy = socket.create_connection(("127.0.0.1", server.port))
        greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        greedy.sendall(req * 20)
        deadline = time.monotonic() + 15  # cut at write_s (0.5 s); awaited, not a fixed 1.5 s
        while (server.write_timeouts, server.connections) != (1, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.write_timeouts == 1 and server.connections == 0
        assert http(server.port)[0] == 200
        greedy.close()
    finally:
        server.stop()


def test_gzip_for_remote_clients(monkeypatch):
    import nvmon.export.server as server_mod

    monkeypatch.setattr(server_mod, "_is_loopback", lambda host: False)  # as if Prometheus were elsewhere
    ex = PrometheusExporter(f"127.0.0.1:{free_port()}")
    ex.start()
    try:
        ex.update(healthy_sample())
        status, headers, body = http(ex.server.port, headers={"Accept-Encoding": "gzip"})
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        assert int(headers["Content-Length"]) == len(body)
        assert gzip.decompress(body) == http(ex.server.port)[2]  # and plain when not asked for
    finally:
        ex.stop()


def test_a_rendering_bug_is_a_500_and_serving_goes_on():
    calls = []

    def page(gz):
        calls.append(gz)
        if len(calls) == 1:
            raise RuntimeError("bug")
        return b"ok\n", False

    server = MetricsServer(f"127.0.0.1:{free_port()}", page, content_type="text/plain")
    server.start()
    try:
        assert http(server.port)[0] == 500 and http(server.port)[2] == b"ok\n"
        assert server.render_errors == 1
    finally:
        server.stop()


# ---------------------------------------------------------------- docs and dashboard

PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "by", "without", "on", "ignoring", "group_left", "group_right", "and",
    "or", "unless", "rate", "irate", "increase", "delta", "deriv", "topk", "bottomk", "time", "offset",
    "max_over_time", "min_over_time", "avg_over_time", "changes", "resets", "abs", "clamp_min", "clamp_max",
    "label_replace", "vector", "scalar", "bool", "count_values", "quantile", "sort", "sort_desc", "absent",
    "last_over_time", "round", "inf", "nan", "e",
}


def query_metrics(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside {...}, [...] and "...", that are not
    functions, keywords, label lists of by/without/on/group_*, or Grafana variables."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\$\{?\w+\}?", "", expr)
    names = set(re.findall(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()", expr))
    return {n for n in names if n.lower() not in PROMQL_WORDS}


def dashboard_queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    out = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                out.append(node["expr"])
            if node.get("type") == "query" and isinstance(node.get("query"), (str, dict)):
                q = node["query"]
                out.append(q if isinstance(q, str) else q.get("query", ""))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(dash)
    return out


def test_query_parser_finds_metric_names():
    assert query_metrics('sum by (hostname) (rate(nvmon_nvlink_tx_bytes_total{hostname=~"$node"}[5m]))') == {
        "nvmon_nvlink_tx_bytes_total"}
    assert query_metrics("DCGM_FI_DEV_PCIE_LINK_WIDTH < on(UUID) DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH") == {
        "DCGM_FI_DEV_PCIE_LINK_WIDTH", "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"}
    assert query_metrics("label_values(nvmon_node_info, hostname)") == {"nvmon_node_info", "hostname"}


def test_dashboard_queries_name_only_exported_metrics():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["title"] and dash["panels"]
    queries = dashboard_queries()
    assert len(queries) >= 15
    page = parse(full_page())  # names in the catalogue, and on a real page
    exported = {n for n in exported_names()
                if n in page.samples or n + "_total" in page.samples or family(page, n) is not None}
    used = set()
    for q in queries:
        names = query_metrics(q) - {"hostname", "gpu", "UUID", "link", "device", "port", "cluster", "rack"}
        assert names, q
        assert names <= exported, f"{q}: {names - exported} not exported"
        used |= names
    # the dashboard covers the three views the issue asks for, on both name families
    assert any(n.startswith("DCGM_") for n in used) and any(n.startswith("nvmon_") for n in used)
    titles = {p["title"].lower() for p in dash["panels"] if p.get("type") == "row"}
    assert {"fleet overview", "node drill-down", "interconnect health"} <= titles


def test_docs_list_every_metric():
    doc = DOC.read_text()
    for name in METRICS:
        assert f"`{name}`" in doc, name


# ---------------------------------------------------------------- a real daemon


class Daemon:
    def __init__(self, tmp: Path, sim: str, interval: float = 0.25, toml: str = ""):
        self.port = free_port()
        self.db = tmp / "nvmon.db"
        self.log = tmp / "daemon.log"
        self.args = [sys.executable, "-m", "nvmon", "daemon", "--config", str(tmp / "none.toml"), "--sim", sim,
                     "--broker", "", "--db", str(self.db), "--node", "prom-1", "--cluster", "t",
                     "--interval", str(interval), "--prometheus", f"127.0.0.1:{self.port}", "--log-level", "info"]
        (tmp / "none.toml").write_text("[expect]\ngpus = 8\n" + toml)
        self._out = open(self.log, "wb")
        self.proc = subprocess.Popen(self.args, stdout=self._out, stderr=self._out)

    def scrape(self) -> str:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, _, body = http(self.port)
                if status == 200:
                    return body.decode()
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"no /metrics: {self.log.read_text()}")
            time.sleep(0.1)

    def stop(self) -> int:
        self.proc.terminate()
        rc = self.proc.wait(10)
        self._out.close()
        return rc


SIM = "hgx-h100,nvlink_down=2.5,pcie_width=3:8,ib_down=mlx5_2,power_cap=4,nvlink_errors=1.3,ib_errors=mlx5_3"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("prom"), SIM)
    d.scrape()
    yield d
    if d.proc.poll() is None:
        d.stop()


def test_scrape_a_running_daemon_matches_nvmon_sample(daemon, tmp_path):
    ref = json.loads(subprocess.run([sys.executable, "-m", "nvmon", "sample", "--sim", SIM, "--json", "--node",
                                     "prom-1", "--interval", "0.2"], capture_output=True, text=True,
                                    timeout=60, check=True).stdout)
    time.sleep(0.6)  # a few ticks, so rates and the audit have a previous reading
    fams = parse(daemon.scrape())
    power = series(fams, "DCGM_FI_DEV_POWER_USAGE")
    assert len(power) == len(ref["gpus"]) == 8
    for g in ref["gpus"]:
        i = str(g["index"])
        labels = next(x.labels for x in power if x.labels["gpu"] == i)
        assert labels == {"gpu": i, "UUID": g["uuid"], "pci_bus_id": g["pci_bus_id"], "device": f"nvidia{i}",
                          "modelName": g["name"], "hostname": "prom-1",
                          "DCGM_FI_DRIVER_VERSION": ref["nvml"]["driver_version"]}
        assert value(fams, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", gpu=i) == g["power_limit_w"]
        for key, name in (("width", "LINK_WIDTH"), ("max_width", "MAX_LINK_WIDTH"), ("max_gen", "MAX_LINK_GEN")):
            assert value(fams, f"DCGM_FI_DEV_PCIE_{name}", gpu=i) == g["pcie"][key]
        assert value(fams, "nvmon_gpu_nvlink_active_links", gpu=i) == sum(ln["active"] for ln in g["nvlink"])
    assert value(fams, "DCGM_FI_DEV_PCIE_LINK_WIDTH", gpu="3") == 8
    assert value(fams, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", gpu="4") < 700  # power_cap
    up = series(fams, "nvmon_nvlink_up")
    assert len(up) == 144 and [(x.labels["gpu"], x.labels["link"]) for x in up if x.value == 0] == [("2", "5")]
    for p in ref["ib"]:
        assert value(fams, "nvmon_ib_port_up", device=p["device"], port=str(p["port"])) == (p["state"] == "ACTIVE")
        assert value(fams, "nvmon_ib_port_state", device=p["device"], state=p["state"],
                     phys_state=p["phys_state"]) == 1
    assert value(fams, "nvmon_ib_port_up", device="mlx5_2", port="1") == 0
    assert value(fams, "nvmon_topology_class", **{"class": ref["topology"]["class"]}) == 1
    for code in ("nvlink.link_down", "pcie.width", "ib.port_down", "power.limit"):
        assert value(fams, "nvmon_audit_findings", code=code) >= 1, code
    assert value(fams, "nvmon_audit_verdict", verdict="critical") == 1
    assert value(fams, "nvmon_node_info", cluster="t", rack="") == 1
    assert value(fams, "nvmon_daemon_ticks_total") >= 2
    assert value(fams, "nvmon_daemon_sample_duration_seconds_count") == value(fams, "nvmon_daemon_ticks_total")
    assert value(fams, "nvmon_daemon_sample_duration_seconds_sum") > 0
    assert series(fams, "process_resident_memory_bytes")[0].value > 0


def test_active_alerts_and_hook_deliveries_are_exported(tmp_path):
    from test_hooks import Receiver

    receiver = Receiver()
    toml = ("[alerts]\nfor_s = 0\nstartup_grace_s = 0\n"
            f'[[hooks]]\nname = "oncall"\ntype = "webhook"\nurl = "{receiver.url("/hook")}"\n')
    d = Daemon(tmp_path, "hgx-h100,pcie_width=3:8", toml=toml)
    try:
        deadline = time.monotonic() + 30
        while True:
            fams = parse(d.scrape())
            sent = value(fams, "nvmon_hook_notifications_total", hook="oncall", type="webhook", result="sent")
            if sent or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert value(fams, "nvmon_alerts_active", code="pcie.width", severity="warning", state="firing") == 1
        assert value(fams, "nvmon_alerts_active", code="nvlink.link_down", severity="critical", state="firing") == 0
        assert sent == 1 and [b["code"] for b in receiver.bodies("/hook")] == ["pcie.width"]
        assert value(fams, "nvmon_hook_notifications_total", hook="oncall", type="webhook", result="failed") == 0
    finally:
        d.stop()
        receiver.server.shutdown()
        receiver.server.server_close()


def test_bad_scrapes_leave_sampling_untouched(daemon):
    port = daemon.port
    fams0 = parse(daemon.scrape())
    t0 = time.monotonic()
    assert http(port, method="HEAD")[2] == b"" and http(port, "/favicon.ico")[0] == 404
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]  # connect, send nothing
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(b"GET /metr")  # and stop mid-line
    unread = socket.create_connection(("127.0.0.1", port))
    unread.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 50)  # and never read the answers
    with ThreadPoolExecutor(100) as pool:
        results = list(pool.map(lambda _: http(port), range(100)))
    assert all(status == 200 for status, _, _ in results)
    for _, _, body in results[:3]:
        assert "DCGM_FI_DEV_POWER_USAGE" in parse(body.decode())
    time.sleep(1.5)
    for s in idle + [slow, unread]:
        s.close()
    elapsed = time.monotonic() - t0
    fams = parse(daemon.scrape())
    # Sampling went on through it (the daemon's own counters, over this test's window only): a
    # sampler the server held up would have next to no ticks while held; a loaded test machine
    # costs a few ticks too, so the bounds sit far from both (40 % of the 0.25 s grid).
    due = elapsed / 0.25
    ticks = value(fams, "nvmon_daemon_ticks_total") - value(fams0, "nvmon_daemon_ticks_total")
    missed = value(fams, "nvmon_daemon_missed_ticks_total") - value(fams0, "nvmon_daemon_missed_ticks_total")
    assert ticks >= due * 0.4 and missed <= due * 0.4, f"{ticks} ticks, {missed} missed in {elapsed:.1f} s"
    assert value(fams, "nvmon_daemon_sample_errors_total") == 0
    log = daemon.log.read_text()
    assert "Traceback" not in log and " ERROR" not in log, log


needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,  # a failure where CI=true (conftest.py)
                                    reason="promtool not installed (apt install prometheus)")
needs_prometheus = pytest.mark.skipif(shutil.which("prometheus") is None,
                                      reason="prometheus not installed (apt install prometheus)")


@needs_promtool
def test_promtool_lints_only_dcgm_exporters_own_choices():
    text = full_page()
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    problems = {ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()}
    # Only dcgm-exporter's own choices, for the reasons docs/prometheus.md gives, on the names it lists
    no_total = {m.name for m in METRICS.values() if m.name.startswith("DCGM_") and m.type == "counter"
                and not m.name.endswith("_total")}
    typed = {m.name for m in METRICS.values() if m.name.startswith("DCGM_")
             and (m.name.lower().endswith("_" + m.type) or f"_{m.type}_" in m.name.lower())}
    expected = {f"{m.name} label names should be written in 'snake_case' not 'camelCase'"
                for m in METRICS.values() if m.name.startswith("DCGM_") and "modelName" in labels_of(m)}
    expected |= {f'{n} counter metrics should have "_total" suffix' for n in no_total}
    expected |= {f"{n} metric name should not include type '{METRICS[n].type}'" for n in typed}
    assert problems == expected, sorted(problems ^ expected)
    doc = DOC.read_text()
    for marker, names in (("promtool:total", no_total), ("promtool:type", typed)):
        line = next(ln for ln in doc.splitlines() if f"<!-- {marker} -->" in ln)
        assert set(re.findall(r"`(DCGM_\w+)`", line)) == names, (marker, sorted(names))
    # and the nvmon_* part of a page alone passes
    own = "".join(block for block in re.split(r"(?m)^(?=# HELP )", text) if not block.startswith("# HELP DCGM_"))
    r = subprocess.run(["promtool", "check", "metrics"], input=own, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
    assert "# HELP nvmon_gpu_lost" in own and 'model_name="' in own


# NVIDIA's own dcgm-exporter dashboard (grafana/dcgm-exporter-dashboard.json in NVIDIA/dcgm-exporter,
# read at d5e5f51, the `hostname` commit: 8 panels, variables instance and gpu), its PromQL by panel.
# nvmon measures all but the tensor pipe (a DCGM profiling field NVML does not expose: docs/prometheus.md).
NVIDIA_DASHBOARD = {
    "GPU Temperature": 'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Avg. Temp": 'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})',
    "GPU Power Usage": 'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Power Total": 'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})',
    "GPU SM Clocks": 'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000',
    "GPU Utilization": 'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}',
    "GPU Framebuffer Mem Used": 'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}',
    "Tensor Core Utilization": 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}',
}
NOT_MEASURED = {"Tensor Core Utilization"}


def docs_yaml(marker: str) -> str:
    """The ```yaml block of docs/prometheus.md whose text contains `marker`, as written."""
    text = (Path(__file__).parent.parent / "docs" / "prometheus.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, (marker, len(found))
    return found[0]


@needs_promtool
def test_the_documented_scrape_configs_are_valid_as_written(tmp_path):
    rules = Path(__file__).parent.parent / "docs" / "prometheus" / "nvmon-rules.yml"
    for marker in ("scrape_interval: 15s", "rule_files:"):
        conf = docs_yaml(marker).replace("/etc/prometheus/rules/nvmon-rules.yml", str(rules))
        (tmp_path / "prometheus.yml").write_text(conf)
        r = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0 and "SUCCESS" in r.stdout + r.stderr, (marker, r.stdout + r.stderr)


@needs_prometheus
def test_dashboard_queries_run_on_a_real_prometheus(daemon, tmp_path):
    """nvmon's dashboard and NVIDIA's dcgm-exporter dashboard, on a Prometheus configured with the
    docs' prometheus.yml (the "Alerting from Prometheus" block: its rules file and job, this daemon as
    the target, scraped every second)."""
    port = free_port()
    rules = Path(__file__).parent.parent / "docs" / "prometheus" / "nvmon-rules.yml"
    conf = docs_yaml("rule_files:").replace("/etc/prometheus/rules/nvmon-rules.yml", str(rules))
    conf = re.sub(r"targets: \[.*\]", f"targets: ['127.0.0.1:{daemon.port}']", conf)
    (tmp_path / "prometheus.yml").write_text("global:\n  scrape_interval: 1s\n" + conf)
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def query(expr: str) -> dict:
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            return json.load(e)

    try:
        deadline = time.monotonic() + 60
        while True:  # until rates have two points in a 5 s window
            try:
                if query("count(rate(nvmon_nvlink_tx_bytes_total[5s]))")["data"]["result"]:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "Prometheus never scraped the daemon"
            time.sleep(0.5)
        meta = query("up")  # and the metadata Prometheus keeps: dcgm-exporter's counters stay counters
        assert meta["data"]["result"][0]["value"][1] == "1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/metadata", timeout=10) as r:
            types = {k: v[0]["type"] for k, v in json.load(r)["data"].items()}
        assert types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
        assert types["nvmon_nvlink_tx_bytes_total"] == "counter" and types["DCGM_FI_DEV_POWER_USAGE"] == "gauge"
        empty = []
        for expr in dashboard_queries():
            if expr.startswith("label_values("):  # a Grafana function, not PromQL
                continue
            e = re.sub(r"\$\{?(node|gpu|cluster)\}?", ".*", expr.replace("$__rate_interval", "5s"))
            r = query(e)
            assert r["status"] == "success", (expr, r.get("error"))
            if not r["data"]["result"]:
                unfiltered = re.sub(r"\s*(>|==)\s*[01]\s*$", "", e)  # "errors rising", "links down": may be none
                if unfiltered == e or not query(unfiltered)["data"]["result"]:
                    empty.append(expr)
        # no broker in this daemon, and no HCA or NVSwitch downtrained in its simulated board
        assert all("mqtt" in e or "nvmon_pcie_link_width" in e for e in empty), empty
        # NVIDIA's dashboard: its variables come from DCGM_FI_DEV_GPU_TEMP's instance and gpu labels
        temps = query("DCGM_FI_DEV_GPU_TEMP")["data"]["result"]
        assert len(temps) == 8 and all({"instance", "gpu", "hostname"} <= set(t["metric"]) for t in temps)
        for panel, expr in NVIDIA_DASHBOARD.items():
            r = query(expr.replace("$instance", ".*").replace("$gpu", ".*"))
            assert r["status"] == "success", (panel, r.get("error"))
            assert bool(r["data"]["result"]) == (panel not in NOT_MEASURED), panel
        # the docs' rules file was loaded from the documented rule_files entry
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=10) as r:
            groups = json.load(r)["data"]["groups"]
        assert any(rule.get("name") == "NvmonNVLinkDown" for g in groups for rule in g["rules"])
    finally:
        prom.terminate()
        prom.wait(10)


def test_port_taken_is_one_line_and_stop_releases_the_port(daemon, tmp_path):
    r = subprocess.run([sys.executable, "-m", "nvmon", "daemon", "--sim", "hgx-h100", "--broker", "", "--db",
                        str(tmp_path / "x.db"), "--prometheus", f"127.0.0.1:{daemon.port}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "prometheus.listen" in r.stderr and "address already in use" in r.stderr
    assert daemon.stop() == 0
    with socket.socket() as s:  # released: another daemon may take it at once
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", daemon.port))
