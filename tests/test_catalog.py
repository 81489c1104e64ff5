"""The metric catalog (nvmon.catalog) against the layers it drives: schema, codec, rollups,
history, exporter and docs. A metric added to the catalog must show everywhere, or these fail."""

from __future__ import annotations

import ast
import sqlite3
from pathlib import Path

import pytest

from nvmon import catalog
from nvmon.catalog import BY_NAME, FAMILIES, GPU_TICK_SCALARS, METRICS, Rollup, Scope, Static
from nvmon.catalog.docs import TABLES, render, stale
from nvmon.store import codec, rollup
from nvmon.store.schema import migrate
from samplefactory import healthy_sample

REPO = Path(__file__).resolve().parent.parent
RAW = {Scope.GPU: "gpu_ticks", Scope.IB_PORT: "ib_ticks", Scope.NODE: "ticks"}
MINUTES = {Scope.GPU: "gpu_minutes", Scope.IB_PORT: "ib_minutes", Scope.NODE: "node_minutes",
           Scope.NVLINK: "gpu_minutes"}


@pytest.fixture(scope="module")
def columns() -> dict[str, list[str]]:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    migrate(conn)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")]
    out = {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables}
    conn.close()
    return out


def test_names_are_unique_and_say_their_units():
    assert len(BY_NAME) == len(METRICS)
    for m in METRICS:
        if m.unit == "W":
            assert m.name.endswith("_w"), m.name
        if m.unit == "Hz":
            assert m.name.endswith("_hz"), m.name
        if m.unit == "B":
            assert m.name.endswith("_bytes"), m.name
        if m.unit == "B/s":
            assert m.name.endswith("_bytes_per_s"), m.name


def test_every_path_reads_a_value_of_the_sample():
    s = healthy_sample()
    on = {Scope.GPU: s.gpus[0], Scope.IB_PORT: s.ib[0], Scope.NODE: s}
    for m in METRICS:
        if m.path is not None:
            m.get(on[m.scope])  # raises AttributeError on a path the model does not have
        if m.in_values:
            assert m.scope is Scope.GPU and m.name in s.gpus[0].values, m.name


def test_every_stored_column_exists_and_every_tick_column_is_written(columns):
    for m in METRICS:
        if m.column and m.static is Static.TICK and m.scope in RAW:
            assert m.column in columns[RAW[m.scope]], m.name
    # The GPU row writes every column of gpu_ticks, each once; likewise the node and port rows.
    assert sorted(codec.GPU_COLUMNS) == sorted(columns["gpu_ticks"])
    assert sorted(codec.TICK_COLUMNS) == sorted(columns["ticks"])
    assert sorted(codec.IB_COLUMNS) == sorted(columns["ib_ticks"])
    row = codec.gpu_row(1000, healthy_sample().gpus[0])
    assert len(row) == len(codec.GPU_COLUMNS)


def test_every_rollup_column_exists(columns):
    for m in METRICS:
        if m.scope in MINUTES and m.rollup not in (Rollup.NONE, Rollup.CUSTOM):
            for col, _ in m.rollup_sql():
                assert col in columns[MINUTES[m.scope]], (m.name, col)
    gpu_cols = [c.strip() for c in rollup._GPU_COLUMNS.split(",")]
    assert sorted(gpu_cols) == sorted(columns["gpu_minutes"])


def test_history_offers_every_history_metric():
    from nvmon.store.metrics import BY_NAME as HISTORY

    assert [m.name for m in METRICS if m.history] == list(HISTORY)


def test_families_name_catalog_metrics_with_a_gpu_path():
    for f in FAMILIES:
        if f.metric is not None:
            m = BY_NAME[f.metric]
            assert f.scope == "GPU" and m.scope is Scope.GPU and m.sampled, f.name
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)


def test_the_gpu_row_is_the_catalogs_scalars_in_order():
    g = healthy_sample().gpus[0]
    row = codec.gpu_row(5, g)
    for m, v in zip(GPU_TICK_SCALARS, row[2:]):
        assert codec.ENCODERS[m.encode](m.get(g)) == v, m.name


def test_docs_hold_the_tables_the_catalog_generates():
    assert stale(REPO) == [], "run: python -m nvmon.catalog.docs"


def test_a_new_catalog_entry_changes_the_generated_docs(monkeypatch):
    from nvmon.catalog import docs, metrics

    extra = catalog.Metric("demo_hz", "Hz", catalog.Kind.GAUGE, Scope.GPU, "a metric only this test has",
                           "power_w", "demo_hz")
    monkeypatch.setattr(docs, "METRICS", metrics.METRICS + (extra,))
    text = (REPO / "docs" / "store.md").read_text()
    assert "`demo_hz`" in render(text, TABLES["docs/store.md"])


def test_the_catalog_is_a_leaf():
    """It imports the standard library and nvmon.model only, so every layer may import it."""
    for path in (REPO / "nvmon" / "catalog").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                if name.startswith("nvmon"):
                    assert name == "nvmon.model" or name.startswith("nvmon.catalog"), (path.name, name)


# -- migration: a database written before the catalog's metrics opens, keeps its data, gains them --

def _v2_database(path: Path) -> None:
    """A database as nvmon wrote it at schema version 2, with one GPU tick in it."""
    from nvmon.store import schema

    conn = sqlite3.connect(path, isolation_level=None)
    for script in (schema._V1, schema._V2):
        for statement in schema._statements(script):
            conn.execute(statement)
    conn.execute(f"PRAGMA application_id = {schema.APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 2")
    conn.execute("INSERT INTO ticks (ts_ms, interval_s, nvml_available, gpus, gpus_lost) VALUES (1699999940000, 1.0, 1, 1, 0)")
    conn.execute("INSERT INTO gpu_ticks (ts_ms, gpu, lost, power_w, temperature_c) VALUES (1699999940000, 0, 0, 512.0, 61.0)")
    conn.close()


def test_a_version_2_database_opens_keeps_its_rows_and_gains_the_new_columns(tmp_path):
    from nvmon.store.schema import SCHEMA_VERSION
    from nvmon.store.store import Store

    path = tmp_path / "old.db"
    _v2_database(path)
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 3
        old = store.query("SELECT * FROM gpu_ticks WHERE ts_ms = 1699999940000")
        assert old[0]["power_w"] == 512.0 and old[0]["temperature_c"] == 61.0
        assert old[0]["sm_clock_hz"] is None and old[0]["memory_temperature_c"] is None
        g = healthy_sample().gpus[0]
        from dataclasses import replace

        s = replace(healthy_sample(), ts=1_700_000_000.0,
                    gpus=(replace(g, values={**g.values, "sm_clock_hz": 1_980_000_000,
                                             "memory_temperature_c": 66.0}),))
        store.write(s)
        new = store.query("SELECT sm_clock_hz, memory_temperature_c FROM gpu_ticks WHERE ts_ms = ?",
                          (1_700_000_000_000,))
        assert new == [{"sm_clock_hz": 1_980_000_000, "memory_temperature_c": 66.0}]
        store.maintain(1_700_000_000.0 + 120)
        minute = store.query("SELECT sm_clock_hz_max, memory_temperature_c_avg FROM gpu_minutes "
                             "WHERE ts_ms = ?", (1_700_000_000_000 // 60000 * 60000,))
        assert minute == [{"sm_clock_hz_max": 1_980_000_000, "memory_temperature_c_avg": 66.0}]


def test_a_metric_added_to_the_catalog_gets_its_column_when_the_database_opens(tmp_path, monkeypatch):
    from nvmon.store import schema
    from nvmon.store.store import Store

    path = tmp_path / "n.db"
    with Store(path):
        pass
    extra = catalog.Metric("demo_c", "°C", catalog.Kind.GAUGE, Scope.GPU, "only in this test", "temperature_c",
                           "demo_c", rollup=Rollup.MIN_MAX)
    monkeypatch.setattr(schema, "METRICS", METRICS + (extra,))
    conn = sqlite3.connect(path, isolation_level=None)
    assert schema.migrate(conn) == schema.SCHEMA_VERSION
    assert "demo_c" in {r[1] for r in conn.execute("PRAGMA table_info(gpu_ticks)")}
    assert {"demo_c_min", "demo_c_max"} <= {r[1] for r in conn.execute("PRAGMA table_info(gpu_minutes)")}
    conn.close()


# -- wire: the catalog's keys travel in their units and come back in the metric's -------------------

def test_the_wire_carries_the_catalogs_gpu_values_and_the_inventory_its_static_ones():
    import json

    from nvmon.wire.parse import parse_message
    from nvmon.wire.payloads import inventory_payload, sample_payload

    s = healthy_sample()
    d = json.loads(sample_payload(s))
    # every GPU of this board agrees: each column goes as one number (docs/wire.md, uniform columns)
    assert (d["sc"], d["mc"], d["fb"], d["mt"], d["mu"]) == (1980, 2619, 70_000, 69, 47)
    tick = parse_message("nvmon/v1/c1/n1/sample", sample_payload(s))
    assert tick.gpus[0].values == {"sm_clock_hz": 1_980_000_000, "mem_clock_hz": 2_619_000_000,
                                   "fb_used_bytes": 70_000 * 2**20, "memory_temperature_c": 69.0,
                                   "mem_copy_util_pct": 47.0}
    assert all(g.values == tick.gpus[0].values for g in tick.gpus)
    inv = json.loads(inventory_payload(s, cluster="c1"))
    assert inv["gpus"][0]["sm_clock_max_hz"] == 1_980_000_000 and inv["gpus"][0]["fb_total_bytes"] == 81_559 * 2**20


def test_a_tick_without_the_catalog_keys_reads_and_one_out_of_range_is_refused():
    import json

    from nvmon.wire.contract import WireError
    from nvmon.wire.parse import parse_message
    from nvmon.wire.payloads import sample_payload

    d = json.loads(sample_payload(healthy_sample()))
    old = {k: v for k, v in d.items() if k not in ("sc", "mc", "fb", "mt", "mu")}  # an older node's tick
    assert parse_message("nvmon/v1/c1/n1/sample", json.dumps(old).encode()).gpus[0].values == {}
    d["sc"] = [d["sc"]] * 8
    d["sc"][2] = 10**9
    with pytest.raises(WireError, match="sc"):
        parse_message("nvmon/v1/c1/n1/sample", json.dumps(d).encode())


# -- NVML sources: the collector reads a catalog metric with no code of its own ---------------------

def test_every_nvml_source_is_a_value_the_collector_reads_generically():
    from nvmon.collect import nvml_catalog, nvml_fields

    for m in METRICS:
        if m.nvml is not None:
            assert m.in_values and m.scope is Scope.GPU, m.name
            src = m.nvml
            assert bool(src.field) != bool(src.fn), f"{m.name}: a field id or a getter"
            if src.fn:
                assert nvml_fields.FUNCTIONS[src.call] == src.fn, m.name
    # metrics sharing a call agree on it
    for call, ms in nvml_catalog.CALLS.items():
        assert len({(m.nvml.fn, m.nvml.args, m.nvml.once) for m in ms}) == 1, call


def test_the_catalog_rotation_gives_each_call_its_turns():
    from nvmon.collect.nvml_catalog import CALLS, rotation

    assert rotation(CALLS, ("utilization",)) == ("sm_clock", "memory", "sm_clock", "memory", "mem_clock")

    def m(call, turns, once=False):
        return catalog.Metric(call + "_x", "", catalog.Kind.GAUGE, Scope.GPU, "", catalog.IN_VALUES,
                              nvml=catalog.Nvml(call, ("f",), turns=turns, once=once))
    calls = {"a": (m("a", 3),), "b": (m("b", 1),), "c": (m("c", 2),), "d": (m("d", 1, once=True),),
             "own": (m("own", 5),)}
    assert rotation(calls, ("own",)) == ("a", "a", "c", "a", "c", "b")


def test_the_simulator_answers_every_catalog_nvml_metric():
    """nvmon.sim.values is the one place a catalog NVML metric's simulated value comes from."""
    from nvmon.catalog import GPU_NVML
    from nvmon.sim import values
    from nvmon.sim.board import SimBoard
    from nvmon.sim.scenario import parse_scenario

    assert {m.name for m in GPU_NVML} <= set(values.VALUES)
    b = SimBoard(parse_scenario("hgx-h100"), clock=lambda: 1_700_000_000.0)
    for m in GPU_NVML:
        assert isinstance(values.value(m.name, b, 0, 10.0), int), m.name


def test_views_show_values_in_their_units_display_form():
    assert catalog.show("Hz", 1_980_000_000) == "1980 MHz"
    assert catalog.show("B", 70_000 * 2**20) == "68.4 GiB"
    assert catalog.show("B/s", 5e9) == "5.0 GB/s"
    assert catalog.show("%", 49.0) == "49 %" and catalog.show("%", 49.5) == "49.5 %"
    assert catalog.show("", 3) == "3" and catalog.display_unit("W") == ("W", 1.0, None)


def test_memory_copy_utilization_end_to_end(tmp_path):
    """mem_copy_util_pct is declared in the catalog and given a simulated value (nvmon.sim.values), and
    nothing else: it rides on the collector's utilization call (still 3 NVML calls per GPU per tick)
    and reaches the Sample, the store, its minute rollups, nvmon history and /metrics."""
    import json

    from click.testing import CliRunner

    from nvmon.cli.history import history_command
    from nvmon.collect.node import NodeSampler
    from nvmon.export.prometheus import PrometheusExporter
    from nvmon.model import sample_to_dict
    from nvmon.sim.node import SimNode
    from nvmon.store.store import Store

    t = [1_700_000_000.0]
    node = SimNode("hgx-h100,notsup=utilization:5", clock=lambda: t[0])
    db = tmp_path / "n.db"
    try:
        sampler = NodeSampler(node.nvml, sysfs_root=node.sysfs_root, node="n", before_tick=node.sync,
                              clock=lambda: t[0])
        sampler.open()
        with Store(db) as store:
            for _ in range(3):  # a tick that reads utilization (the probe's is the first)
                s = sampler.sample()
                store.write(s)
                t[0] += 1
            calls = sampler.nvml.calls[0]
            for _ in range(120):
                s = sampler.sample()
                store.write(s)
                t[0] += 1
            assert (sampler.nvml.calls[0] - calls) / 120 / 8 <= 3.0  # (GPU 5 skips its utilization turns)
            store.maintain(t[0] + 60)
        sampler.close()
    finally:
        node.close()
    util = [g.utilization_pct for g in s.gpus]
    assert [g.values["mem_copy_util_pct"] for g in s.gpus] == [None if u is None else int(u) // 2 for u in util]
    assert s.gpus[5].values["mem_copy_util_pct"] is None and s.nvml.capabilities["unsupported"]["utilization"] == [5]
    assert sample_to_dict(s)["gpus"][0]["mem_copy_util_pct"] == int(util[0]) // 2
    ex = PrometheusExporter("127.0.0.1:0")
    ex.update(s)
    page = ex.page()[0].decode()
    assert f'DCGM_FI_DEV_MEM_COPY_UTIL{{gpu="0",' in page and "# TYPE DCGM_FI_DEV_MEM_COPY_UTIL gauge" in page
    args = ["--db", str(db), "--since", str(t[0] - 200), "--until", str(t[0]), "-m", "mem_copy_util_pct",
            "--gpu", "0", "--json"]
    raw = json.loads(CliRunner().invoke(history_command, args + ["--source", "raw"]).output)["gpu"]
    assert raw[-1]["mem_copy_util_pct"] == int(util[0]) // 2
    minutes = json.loads(CliRunner().invoke(history_command, args + ["--source", "rollup"]).output)["gpu"]
    assert minutes and {"mem_copy_util_pct_min", "mem_copy_util_pct_avg", "mem_copy_util_pct_max"} <= set(minutes[0])
