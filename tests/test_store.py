"""The history store on real SQLite files: schema and migrations, round trips of real and odd
samples, rollups, pruning. Faults (disk full, read-only, kill -9) are in test_store_faults.py."""

from __future__ import annotations

import math
import sqlite3
import threading
from dataclasses import replace

import pytest
from samplefactory import healthy_sample, with_gpu, with_link

from nvmon.collect.node import NodeSampler
from nvmon.model import IbPortSample, NvLinkSample, PcieLink
from nvmon.sim.node import SimNode
from nvmon.store import SCHEMA_VERSION, Store, StoreError
from nvmon.store.codec import pack_mb, unpack_mb
from nvmon.store.metrics import METRICS
from nvmon.store.query import facts_at, history, open_readonly, read_tick
from nvmon.store.schema import APPLICATION_ID

T0 = 1_714_564_800.0  # a minute boundary (2024-05-01T12:00:00Z)


def ticks(sample, n: int, start: float = T0, step: float = 1.0):
    """n copies of `sample`, one per `step` seconds from `start`."""
    return [replace(sample, ts=start + i * step) for i in range(n)]


def small(**kw):
    """A 2-GPU, 4-link, 1-port node: fast enough for tests that need thousands of ticks."""
    return healthy_sample(n_gpus=2, active_links=4, ib_ports=1, **kw)


def sim_sample(spec: str, ticks_: int = 2):
    """A sample from the simulator after `ticks_` one-second ticks (rates need two readings)."""
    now = [T0]
    node = SimNode(spec, clock=lambda: now[0])
    try:
        sampler = NodeSampler(node.nvml, sysfs_root=node.sysfs_root, node="n1", before_tick=node.sync,
                              clock=lambda: now[0])
        sampler.open()
        for _ in range(ticks_ - 1):
            sampler.sample()
            now[0] += 1
        return sampler.sample()
    finally:
        node.close()


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "nvmon.db")
    s.open()
    yield s
    s.close()


def ms(ts: float) -> int:
    return int(round(ts * 1000))


# -- schema, migrations ---------------------------------------------------------------------------


def test_open_creates_wal_database_at_current_version_and_reopens(tmp_path):
    path = tmp_path / "nvmon.db"
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        s.write(healthy_sample())
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    assert {"ticks", "gpu_ticks", "ib_ticks", "gpu_minutes", "ib_minutes", "node_minutes", "inventory"} <= tables
    conn.close()
    with Store(path) as s:  # re-open: no migration runs again, data kept
        assert s.query("SELECT count(*) AS n FROM ticks")[0]["n"] == 1


def test_migrates_an_existing_empty_file(tmp_path):
    path = tmp_path / "empty.db"
    path.write_bytes(b"")
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION


def test_refuses_other_databases_and_newer_schemas(tmp_path):
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE customers (id)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match=r"other\.db: not an nvmon database"):
        Store(other).open()
    newer = tmp_path / "newer.db"
    with Store(newer):
        pass
    conn = sqlite3.connect(newer)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer than this nvmon"):
        Store(newer).open()


def test_corrupt_file_is_one_line_store_error(tmp_path):
    path = tmp_path / "corrupt.db"
    path.write_bytes(b"this is not sqlite at all" * 200)
    with pytest.raises(StoreError) as e:
        Store(path).open()
    assert str(e.value) == f"database {path}: not a database (SQLITE_NOTADB)"
    assert path.read_bytes().startswith(b"this is not")  # untouched


def test_every_metric_reads_from_the_schema(store):
    """The metric table and the schema agree: every raw and rollup expression runs."""
    store.write_many(ticks(healthy_sample(), 3))
    store.maintain(T0 + 120)
    conn = open_readonly(store.path)
    names = [m.name for m in METRICS]
    for source in ("raw", "rollup"):
        h = history(conn, names, ms(T0), ms(T0 + 120), source=source)
        assert {t.kind for t in h.tables} == {"gpu", "link", "ib", "node"}
        assert all(t.rows for t in h.tables), source
    conn.close()


# -- round trips ----------------------------------------------------------------------------------


def test_round_trip_of_a_simulated_h100_with_faults(store):
    s = sim_sample("hgx-h100,seed=4,gpu_lost=4@1,nvlink_down=1.4,nvlink_errors=2.3", ticks_=3)
    store.write(s)
    conn = open_readonly(store.path)
    got = read_tick(conn, ms(s.ts))
    assert got["interval_s"] == s.interval_s and got["gpus_lost"] == 1 and got["topology"] == s.topology.class_
    assert got["gpu_power_w"] == sum(round(g.power_w) for g in s.gpus if g.power_w is not None)
    for g, r in zip(s.gpus, got["gpus"], strict=True):
        assert r["gpu"] == g.index and bool(r["lost"]) == g.lost
        assert r["power_w"] == (round(g.power_w) if g.power_w is not None else None)
        assert r["temperature_c"] == g.temperature_c and r["utilization_pct"] == g.utilization_pct
        assert (r["pcie_gen"], r["pcie_width"]) == (g.pcie.gen, g.pcie.width)
        tx = g.pcie.tx_bytes_per_s
        assert r["pcie_tx_bytes_per_s"] == (round(tx) if tx is not None else None)
        reasons = g.throttle_reasons
        assert r["throttle"] == (tuple(sorted(reasons, key=_throttle_order)) if reasons is not None else None)
        assert len(r["nvlink"]) == len(g.nvlink)
        for lk, rl in zip(g.nvlink, r["nvlink"], strict=True):
            assert rl["active"] == lk.active
            for d in ("tx", "rx"):
                want = getattr(lk, f"{d}_bytes_per_s")
                assert rl[f"{d}_bytes_per_s"] == pytest.approx(want, abs=0.5e6)  # 1 MB/s steps
            assert rl["errors_delta"] == {k: v for k, v in lk.errors_delta.items() if v}
        if g.nvlink:
            assert r["nvlink_tx_bytes_per_s"] == round(sum(lk.tx_bytes_per_s for lk in g.nvlink))
            assert r["nvlink_active"] == sum(1 for lk in g.nvlink if lk.active)
            assert r["nvlink_errors_delta"] == sum(v for lk in g.nvlink for v in lk.errors_delta.values() if v)
    lost = got["gpus"][4]
    assert lost["lost"] == 1 and lost["power_w"] is None and lost["nvlink"] == [] and lost["nvlink_active"] is None
    assert got["gpus"][1]["nvlink"][4]["active"] is False
    assert got["gpus"][2]["nvlink"][3]["errors_delta"] == {"crc_flit": 5, "replay": 3, "crc_data": 2}  # 1 s
    for p, r in zip(s.ib, got["ib"], strict=True):
        assert (r["device"], r["port"], r["state"], r["phys_state"], r["rate_gbps"]) == \
            (p.device, p.port, p.state, p.phys_state, p.rate_gbps)
        assert r["tx_bytes_per_s"] == round(p.tx_bytes_per_s)
    # static facts went to the inventory, once
    facts = facts_at(conn, "gpu", "4", ms(s.ts))
    assert facts["uuid"] == s.gpus[4].uuid and facts["pci_bus_id"] == "00000000:9A:00.0"
    link_facts = facts_at(conn, "gpu", "0", ms(s.ts))["nvlink"][0]
    assert (link_facts["version"], link_facts["speed_mbps"], link_facts["remote_type"]) == (4, 26562, "nvswitch")
    assert facts_at(conn, "ib", "mlx5_0:1", ms(s.ts))["rate_name"] == "NDR"
    assert facts_at(conn, "node", "", ms(s.ts))["nvml"]["driver_version"]
    conn.close()


def _throttle_order(name: str) -> int:
    from nvmon.model import THROTTLE_BITS

    return [n for _, n in THROTTLE_BITS].index(name)


def test_blackwell_null_error_counters_stay_null_not_zero(store):
    s = sim_sample("hgx-b200")
    assert s.gpus[0].nvlink[0].errors == {"crc_flit": None, "crc_data": None, "replay": None, "recovery": None}
    store.write(s)
    row = store.query("SELECT nvlink_errors_delta, nvlink_errors, nvlink_tx_bytes_per_s FROM gpu_ticks "
                      "WHERE gpu = 0")[0]
    assert row["nvlink_errors_delta"] is None and row["nvlink_errors"] is None
    assert row["nvlink_tx_bytes_per_s"] > 0
    store.maintain(T0 + 300)
    assert store.query("SELECT nvlink_errors_delta FROM gpu_minutes WHERE gpu = 0")[0]["nvlink_errors_delta"] is None


def test_inventory_row_only_when_static_facts_change(store):
    s = healthy_sample()
    store.write_many(ticks(s, 5))
    down = with_link(replace(s, ts=T0 + 5), 1, 4, active=False, speed_mbps=None, version=None)
    store.write(down)  # a link going down is per-tick state, not a new fact
    assert store.query("SELECT count(*) AS n FROM inventory")[0]["n"] == 1 + 8 + 8
    store.write(with_gpu(replace(s, ts=T0 + 6), 2, uuid="GPU-replaced"))
    rows = store.query("SELECT since_ms FROM inventory WHERE kind = 'gpu' AND key = '2' ORDER BY since_ms")
    assert [r["since_ms"] for r in rows] == [ms(T0), ms(T0 + 6)]


def test_bad_values_are_stored_as_null_and_never_fail_the_batch(store):
    good = healthy_sample()
    weird = with_gpu(replace(good, ts=T0 + 1), 0, power_w=math.nan, temperature_c=math.inf,
                     utilization_pct="97", energy_j=10**40, throttle_reasons=("made_up", 7), notes=("\x1b[31m",))
    weird = with_link(weird, 1, 2, tx_bytes_per_s=-5.0, rx_bytes_per_s=1e30, errors_delta={"crc_flit": "x"})
    weird = replace(weird, ib=(IbPortSample(device="mlx5_0", port=1, state="WEIRD", tx_bytes_per_s=math.nan,
                                            errors_delta={"symbol_error": 2**70}, pcie=PcieLink()),))
    no_time = replace(good, ts=math.nan)
    not_a_sample = object()
    store.write_many([good, weird, no_time, not_a_sample, replace(good, ts=T0 + 2)])
    assert store.skipped == 2
    assert [r["ts_ms"] for r in store.query("SELECT ts_ms FROM ticks")] == [ms(T0), ms(T0 + 1), ms(T0 + 2)]
    conn = open_readonly(store.path)
    g0 = read_tick(conn, ms(T0 + 1))["gpus"][0]
    assert (g0["power_w"], g0["temperature_c"], g0["utilization_pct"], g0["energy_j"]) == (None, None, None, None)
    assert g0["throttle_mask"] == 0 and g0["notes"] == ["\x1b[31m"]  # stored literally; views escape
    link = read_tick(conn, ms(T0 + 1))["gpus"][1]["nvlink"][2]
    assert link["tx_bytes_per_s"] is None and link["rx_bytes_per_s"] == 65534e6  # saturated, not wrapped
    port = read_tick(conn, ms(T0 + 1))["ib"][0]
    assert port["state"] is None and port["tx_bytes_per_s"] is None and port["errors_delta"] is None
    conn.close()


def test_same_timestamp_twice_keeps_the_first_so_backlog_retries_are_safe(store):
    s = healthy_sample()
    store.write(s)
    store.write_many([with_gpu(s, 0, power_w=1.0), replace(s, ts=T0 + 1)])
    assert store.query("SELECT power_w FROM gpu_ticks WHERE ts_ms = ? AND gpu = 0", [ms(T0)])[0]["power_w"] == 490
    assert store.query("SELECT count(*) AS n FROM gpu_ticks")[0]["n"] == 16


def test_nvml_off_sample_stores_ib_and_host(store):
    s = sim_sample("hgx-h100,nvml=off")
    store.write(s)
    conn = open_readonly(store.path)
    got = read_tick(conn, ms(s.ts))
    assert got["nvml_available"] == 0 and got["gpus"] == [] and len(got["ib"]) == 8
    conn.close()


def test_pack_mb_round_trip_and_limits():
    assert unpack_mb(pack_mb([0.0, 26.562e9, None, -1.0, 1e12, 0.4e6, 0.6e6])) == \
        [0.0, 26562e6, None, None, 65534e6, 0.0, 1e6]
    assert pack_mb([0x0102 * 1e6]) == b"\x02\x01"  # little-endian on every host


def test_sql_views_decode_blobs_masks_and_codes(store):
    s = with_link(healthy_sample(), 3, 5, active=False, tx_bytes_per_s=1234e6, rx_bytes_per_s=None)
    s = with_gpu(s, 3, throttle_reasons=("sw_power_cap", "hw_slowdown"))
    store.write(s)
    rows = store.query("SELECT link, active, tx_bytes_per_s, rx_bytes_per_s FROM nvlink_raw "
                       "WHERE ts_ms = ? AND gpu = 3 AND link IN (4, 5)", [ms(T0)])
    assert rows == [{"link": 4, "active": 1, "tx_bytes_per_s": 20_000_000_000, "rx_bytes_per_s": 20_000_000_000},
                    {"link": 5, "active": 0, "tx_bytes_per_s": 1_234_000_000, "rx_bytes_per_s": None}]
    assert store.query("SELECT throttle FROM gpu_raw WHERE gpu = 3")[0]["throttle"] == "sw_power_cap,hw_slowdown"
    assert store.query("SELECT state_name, phys_state_name FROM ib_raw LIMIT 1")[0] == \
        {"state_name": "ACTIVE", "phys_state_name": "LinkUp"}


def test_writes_from_changing_threads(store):
    """The daemon calls through asyncio.to_thread: a different worker thread each time."""
    s = healthy_sample()
    errors = []

    def write(i):
        try:
            store.write(replace(s, ts=T0 + i))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and store.query("SELECT count(*) AS n FROM ticks")[0]["n"] == 20


# -- rollups --------------------------------------------------------------------------------------


def test_rollup_min_avg_max_of_a_minute(store):
    base = healthy_sample()
    samples = []
    for i in range(60):
        s = with_gpu(replace(base, ts=T0 + i), 0, power_w=400.0 + i, temperature_c=50.0 + (i % 2),
                     throttle_reasons=("sw_power_cap",) if i == 10 else ("hw_slowdown",) if i == 20 else ())
        s = with_link(s, 0, 7, tx_bytes_per_s=(1000 + i) * 1e6, active=i != 30,
                      errors_delta={"crc_flit": 1 if i < 3 else 0, "crc_data": 0, "replay": 0, "recovery": 0})
        samples.append(s)
    samples.append(replace(base, ts=T0 + 60))  # next minute: not complete yet
    store.write_many(samples)
    store.maintain(T0 + 60 + 4)  # inside the grace period: nothing rolled up
    assert store.query("SELECT count(*) AS n FROM gpu_minutes")[0]["n"] == 0
    stats = store.maintain(T0 + 65)
    assert stats["minutes"] == 1
    r = store.query("SELECT * FROM gpu_minutes WHERE gpu = 0")[0]
    assert r["ts_ms"] == ms(T0) and r["samples"] == 60
    assert (r["power_w_min"], r["power_w_avg"], r["power_w_max"]) == (400, 430, 459)  # avg 429.5 → 430
    assert (r["temperature_c_min"], r["temperature_c_max"]) == (50, 51)
    assert r["throttle_mask"] == 4 | 8
    assert r["nvlink_active_min"] == 17 and r["nvlink_active_max"] == 18 and r["nvlink_down_mask"] == 1 << 7
    assert r["nvlink_errors_delta"] == 3 and r["nvlink_errors"] == '{"7":{"crc_flit":3}}'
    assert unpack_mb(r["nvlink_tx_mb_avg"])[7] == 1030e6 and unpack_mb(r["nvlink_tx_mb_max"])[7] == 1059e6
    assert unpack_mb(r["nvlink_tx_mb_avg"])[6] == 20000e6
    other = store.query("SELECT * FROM gpu_minutes WHERE gpu = 1")[0]
    assert other["power_w_min"] == other["power_w_max"] == 490 and other["throttle_mask"] == 0
    ib = store.query("SELECT * FROM ib_minutes_named WHERE device = 'mlx5_0'")[0]
    assert ib["samples"] == ib["active_samples"] == 60 and ib["tx_bytes_per_s_avg"] == 10e9
    node = store.query("SELECT * FROM node_minutes")[0]
    assert node["gpu_power_w_min"] == 400 + 7 * 490 and node["gpu_power_w_max"] == 459 + 7 * 490


def test_late_ticks_roll_their_minute_up_again(store):
    s = healthy_sample()
    store.write_many(ticks(s, 30))
    store.maintain(T0 + 120)
    assert store.query("SELECT samples FROM gpu_minutes WHERE gpu = 0")[0]["samples"] == 30
    store.write_many(ticks(s, 30, start=T0 + 30))  # a backlog written after an outage
    store.maintain(T0 + 130)
    assert store.query("SELECT samples FROM gpu_minutes WHERE gpu = 0")[0]["samples"] == 60


def test_rollups_skip_gaps_and_catch_up_in_bounded_steps(store):
    s = small()
    store.write_many(ticks(s, 60, start=T0))
    store.write_many(ticks(s, 60, start=T0 + 3 * 3600))  # the daemon was down 3 h
    stats = store.maintain(T0 + 3 * 3600 + 120)
    assert stats["minutes"] == 1  # the gap is skipped, the chunk ends an hour after the first minute
    store.maintain(T0 + 3 * 3600 + 120)
    assert [r["ts_ms"] for r in store.query("SELECT DISTINCT ts_ms FROM gpu_minutes")] == \
        [ms(T0), ms(T0 + 3 * 3600)]


# -- pruning --------------------------------------------------------------------------------------


def test_pruning_keeps_the_windows_and_the_file_bounded(tmp_path):
    st = Store(tmp_path / "nvmon.db", raw_retention_s=300, rollup_retention_s=1200)
    st.open()
    s = small()
    sizes = []
    for minute in range(60):
        start = T0 + minute * 60
        st.write_many(ticks(s, 60, start=start))
        st.maintain(start + 65)
        sizes.append(st.query("PRAGMA page_count")[0]["page_count"])
        now = start + 65
        oldest_raw = st.query("SELECT min(ts_ms) AS t FROM ticks")[0]["t"]
        assert oldest_raw >= ms(now - 300 - 60)
        oldest_roll = st.query("SELECT min(ts_ms) AS t FROM gpu_minutes")[0]["t"]
        assert oldest_roll >= ms(now - 1200 - 60)
    # every minute that left the raw window was rolled up before it went: all those starting
    # within the last 1200 s (the last maintain ran 65 s into the last minute) are there
    assert st.query("SELECT count(DISTINCT ts_ms) AS n FROM gpu_minutes")[0]["n"] == 19
    assert max(sizes[30:]) <= max(sizes[:30])  # steady state reuses pages: the file stops growing
    assert st.query("PRAGMA integrity_check")[0]["integrity_check"] == "ok"
    st.close()


def test_raw_is_never_pruned_before_its_rollup(tmp_path):
    st = Store(tmp_path / "nvmon.db", raw_retention_s=60)
    st.open()
    st.write_many(ticks(small(), 180))
    st.maintain(T0 + 10_000)  # long after: roll up first, then prune
    assert st.query("SELECT count(*) AS n FROM gpu_minutes")[0]["n"] == 3 * 2
    assert st.query("SELECT count(*) AS n FROM ticks")[0]["n"] == 0
    st.write(replace(small(), ts=T0 + 5))  # older than the pruned horizon: skipped, not stored
    assert st.skipped == 1 and st.query("SELECT count(*) AS n FROM ticks")[0]["n"] == 0
    st.close()


def test_a_future_timestamp_does_not_prune_real_history(store):
    store.write_many(ticks(healthy_sample(), 60))
    store.write(replace(healthy_sample(), ts=T0 + 10 * 365 * 86400))  # a clock jumped a decade
    store.maintain(T0 + 65)
    assert store.query("SELECT count(*) AS n FROM ticks")[0]["n"] == 61
    assert store.query("SELECT count(*) AS n FROM gpu_minutes")[0]["n"] == 8


def test_maintain_on_an_empty_store(store):
    assert store.maintain(T0) == {"minutes": 0, "raw_pruned": 0, "rollups_pruned": 0, "alerts_pruned": 0}


def test_link_gap_in_a_sample_stays_a_gap(store):
    g = healthy_sample().gpus[0]
    links = (NvLinkSample(link=0, active=True, tx_bytes_per_s=1e9, rx_bytes_per_s=1e9),
             NvLinkSample(link=2, active=False, tx_bytes_per_s=0.0, rx_bytes_per_s=0.0))
    s = replace(healthy_sample(), gpus=(replace(g, nvlink=links),))
    store.write(s)
    conn = open_readonly(store.path)
    got = read_tick(conn, ms(T0))["gpus"][0]["nvlink"]
    assert [(lk["link"], lk["active"], lk["tx_bytes_per_s"]) for lk in got] == \
        [(0, True, 1e9), (1, None, None), (2, False, 0.0)]
    conn.close()
