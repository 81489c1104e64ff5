"""`[prometheus] dcgm_compat`: each dcgm-exporter line's label spelling, driver label and families on
a rendered page, the Xid labels, a bad value in the config, and promtool on each line's page."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace

import pytest
from samplefactory import healthy_sample, with_gpu
from test_prometheus import parse, series, value

from nvmon.catalog.compat import DEFAULT, LINES, line
from nvmon.daemon.config import ConfigError, load_config
from nvmon.export.catalog import METRICS, labels_of
from nvmon.export.prometheus import DaemonHealth, PrometheusExporter


def page(compat: str, sample=None) -> str:
    s = sample or with_gpu(healthy_sample(), 1, throttle_reasons=("sw_power_cap",))
    health = DaemonHealth(ticks=3, sample_seconds_total=0.03, mqtt_connected=True,
                          alerts={("pcie.width", "warning", "firing"): 1}, hooks=(("oncall", "pagerduty", 1, 0, 0),))
    ex = PrometheusExporter("127.0.0.1:0", health=lambda: health, process_metrics=False, compat=line(compat))
    ex.update(s)
    ex.page()
    ex.update(replace(s, ts=s.ts + 1))  # a second tick: rates and byte counters have a previous reading
    return ex.page()[0].decode()


@pytest.mark.parametrize("key", list(LINES))
def test_every_series_carries_the_labels_of_its_line(key):
    compat = line(key)
    fams = parse(page(key))
    seen = set()
    for m in METRICS.values():
        fam = fams.get(m.name) or fams.get(m.name.removesuffix("_total"))
        if fam is None or not fam.samples:
            continue
        seen.add(m.name)
        for sample in fam.samples:
            assert set(sample.labels) == set(labels_of(m, compat)), (key, m.name, sample.labels)
    assert any(n.startswith("DCGM_") for n in seen) == compat.dcgm
    assert "nvmon_gpu_lost" in seen and "nvmon_nvlink_up" in seen and "nvmon_node_info" in seen


def test_host_label_and_driver_label_per_line():
    s = healthy_sample()
    new, old, off = parse(page("4.8.3", s)), parse(page("4.8.2", s)), parse(page("off", s))
    for fams, host in ((new, "hostname"), (old, "Hostname"), (off, "hostname")):
        for name in ("nvmon_node_info", "nvmon_gpu_lost", "nvmon_nvlink_up", "nvmon_ib_port_up"):
            assert {x.labels[host] for x in series(fams, name)} == {s.node}, (host, name)
        other = "Hostname" if host == "hostname" else "hostname"
        assert not any(other in x.labels for xs in fams.samples.values() for x in xs)
    for fams in (new, old):  # dcgm-exporter's driver label, from its default-counters.csv `label` row
        power = series(fams, "DCGM_FI_DEV_POWER_USAGE")
        assert len(power) == 8
        assert {x.labels["DCGM_FI_DRIVER_VERSION"] for x in power} == {s.nvml.driver_version}
        assert not any("DCGM_FI_DRIVER_VERSION" in x.labels for x in series(fams, "nvmon_gpu_lost"))
    assert not any(n.startswith("DCGM_") for n in off.samples)
    assert DEFAULT == "4.8.3" and load_config(None).prometheus.dcgm_compat == DEFAULT


def test_xid_errors_carry_err_code_and_err_msg():
    s = healthy_sample()
    ex = PrometheusExporter("127.0.0.1:0", process_metrics=False)
    ex.update(s)
    ex.update(with_gpu(replace(s, ts=s.ts + 1), 3, xid_events=(48, 79)))
    ex.update(with_gpu(replace(s, ts=s.ts + 2), 5, xid_events=(12345,)))
    fams = parse(ex.page()[0].decode())
    labels = {x.labels["gpu"]: (x.labels["err_code"], x.labels["err_msg"], x.value)
              for x in series(fams, "DCGM_FI_DEV_XID_ERRORS")}
    assert labels["3"] == ("79", "GPU has fallen off the bus", 79)  # the last Xid, as dcgm-exporter names it
    assert labels["5"] == ("12345", "Unknown Error", 12345)
    assert labels["0"] == ("0", "No Error", 0)
    assert value(fams, "DCGM_FI_DEV_XID_ERRORS", gpu="3", err_code="79") == 79


@pytest.mark.parametrize("bad", ['"4.10"', '"4.8"', '""', "4.8"])
def test_a_bad_dcgm_compat_is_a_one_line_error(tmp_path, bad):
    cfg = tmp_path / "nvmon.toml"
    cfg.write_text(f"[prometheus]\ndcgm_compat = {bad}\n")
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    msg = str(e.value)
    assert "\n" not in msg and "dcgm_compat" in msg and "4.8.3, 4.8.2, off" in msg, msg
    cfg.write_text('[prometheus]\ndcgm_compat = "4.8.2"\n')
    assert load_config(cfg).prometheus.dcgm_compat == "4.8.2"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt install prometheus)")
@pytest.mark.parametrize("key", list(LINES))
def test_promtool_passes_the_nvmon_part_of_every_line(key):
    text = page(key)
    own = "".join(b for b in re.split(r"(?m)^(?=# HELP )", text) if not b.startswith("# HELP DCGM_"))
    assert "# HELP nvmon_gpu_lost" in own
    r = subprocess.run(["promtool", "check", "metrics"], input=own, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), (key, r.stdout + r.stderr)
    if key == "off":  # nothing else on the page
        assert own == text
