"""The history database's schema and its migrations (`PRAGMA user_version`).

Each migration is literal SQL, frozen once released: a migration must mean the same thing on every
database, whatever the code around it later becomes. To change the schema, append a migration;
never edit one. The one exception is additive and safe to repeat: the columns of the catalog's
metrics (`add_catalog_columns`, version 3), added to any database that lacks one when it is opened
for writing, so adding a metric to `nvmon/catalog/metrics.py` needs no migration of its own. `docs/store.md` describes the tables; `tests/test_store.py` checks that every column
the metric table names exists here.

Why `WITHOUT ROWID` for the tick and rollup tables: their natural key is `(ts_ms, gpu)`; a rowid
table would keep that key twice (table plus index), about 10 MB more per node-day (measured).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from nvmon.catalog import METRICS, Scope, Static

# PRAGMA application_id: "nvmn". Lets a reader tell an nvmon database from any other SQLite file.
APPLICATION_ID = 0x6E766D6E

_V1 = """
CREATE TABLE state (
    key TEXT PRIMARY KEY,
    value ANY
) STRICT;

CREATE TABLE inventory (
    kind TEXT NOT NULL,             -- 'node' | 'gpu' | 'ib'
    key TEXT NOT NULL,              -- '' for the node, GPU index, 'mlx5_0:1' for an IB port
    since_ms INTEGER NOT NULL,      -- first tick these facts were seen (unix ms, UTC)
    facts TEXT NOT NULL,            -- JSON object of static facts
    PRIMARY KEY (kind, key, since_ms)
) STRICT, WITHOUT ROWID;

CREATE TABLE ib_ports (
    id INTEGER PRIMARY KEY,
    device TEXT NOT NULL,
    port INTEGER NOT NULL,
    UNIQUE (device, port)
) STRICT;

CREATE TABLE ticks (
    ts_ms INTEGER PRIMARY KEY,      -- unix ms, UTC (the node's name is in inventory)
    interval_s REAL,
    nvml_available INTEGER NOT NULL,
    gpus INTEGER NOT NULL,
    gpus_lost INTEGER NOT NULL,
    gpu_power_w REAL,               -- sum over GPUs that reported power
    topology TEXT,
    cpu_pct REAL,
    mem_used_pct REAL,
    load1 REAL,
    notes TEXT                      -- JSON array, NULL when none
) STRICT;

CREATE TABLE gpu_ticks (
    ts_ms INTEGER NOT NULL,
    gpu INTEGER NOT NULL,
    lost INTEGER NOT NULL,
    power_w REAL,                   -- whole watts
    power_limit_w REAL,
    energy_j REAL,
    temperature_c REAL,
    utilization_pct REAL,
    throttle_mask INTEGER,          -- nvmlClocksEventReason bits (docs/store.md), NULL unreadable
    pcie_gen INTEGER,
    pcie_width INTEGER,
    pcie_tx_bytes_per_s REAL,
    pcie_rx_bytes_per_s REAL,
    pcie_replay_delta INTEGER,
    nvlink_active INTEGER,          -- number of active links
    nvlink_up_mask INTEGER,         -- bit n: link n active
    nvlink_down_mask INTEGER,       -- bit n: link n known inactive (neither bit: unknown)
    nvlink_tx_bytes_per_s REAL,     -- sums over links
    nvlink_rx_bytes_per_s REAL,
    nvlink_errors_delta INTEGER,    -- all kinds, all links that report; NULL when none does
    nvlink_tx_mb BLOB,              -- per link: little-endian uint16 MB/s, 65535 = unknown
    nvlink_rx_mb BLOB,
    nvlink_errors TEXT,             -- JSON {"<link>": {"<kind>": delta}}, non-zero deltas only
    notes TEXT,
    PRIMARY KEY (ts_ms, gpu)
) STRICT, WITHOUT ROWID;

CREATE TABLE ib_ticks (
    ts_ms INTEGER NOT NULL,
    port_id INTEGER NOT NULL REFERENCES ib_ports(id),
    state INTEGER,                  -- the kernel's numbers: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, ...
    phys_state INTEGER,             -- 2 Polling, 3 Disabled, 5 LinkUp, ... (ib_raw names them)
    rate_gbps REAL,
    tx_bytes_per_s REAL,
    rx_bytes_per_s REAL,
    errors_delta INTEGER,           -- sum over error kinds that were read
    errors TEXT,                    -- JSON {"<kind>": delta}, non-zero deltas only
    PRIMARY KEY (ts_ms, port_id)
) STRICT, WITHOUT ROWID;

CREATE TABLE node_minutes (
    ts_ms INTEGER PRIMARY KEY,      -- start of the minute
    samples INTEGER NOT NULL,
    gpus_lost_max INTEGER,
    gpu_power_w_min REAL, gpu_power_w_avg REAL, gpu_power_w_max REAL,
    cpu_pct_min REAL, cpu_pct_avg REAL, cpu_pct_max REAL,
    mem_used_pct_min REAL, mem_used_pct_avg REAL, mem_used_pct_max REAL,
    load1_min REAL, load1_avg REAL, load1_max REAL
) STRICT;

CREATE TABLE gpu_minutes (
    ts_ms INTEGER NOT NULL,
    gpu INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    lost_samples INTEGER NOT NULL,
    power_w_min REAL, power_w_avg REAL, power_w_max REAL,
    power_limit_w_min REAL, power_limit_w_max REAL,
    temperature_c_min REAL, temperature_c_avg REAL, temperature_c_max REAL,
    utilization_pct_min REAL, utilization_pct_avg REAL, utilization_pct_max REAL,
    throttle_mask INTEGER,          -- OR of the minute's throttle reasons
    pcie_gen_min INTEGER, pcie_gen_max INTEGER,
    pcie_width_min INTEGER, pcie_width_max INTEGER,
    pcie_tx_bytes_per_s_min REAL, pcie_tx_bytes_per_s_avg REAL, pcie_tx_bytes_per_s_max REAL,
    pcie_rx_bytes_per_s_min REAL, pcie_rx_bytes_per_s_avg REAL, pcie_rx_bytes_per_s_max REAL,
    pcie_replay_delta INTEGER,
    nvlink_active_min INTEGER, nvlink_active_max INTEGER,
    nvlink_down_mask INTEGER,       -- links seen inactive at least once during the minute
    nvlink_tx_bytes_per_s_min REAL, nvlink_tx_bytes_per_s_avg REAL, nvlink_tx_bytes_per_s_max REAL,
    nvlink_rx_bytes_per_s_min REAL, nvlink_rx_bytes_per_s_avg REAL, nvlink_rx_bytes_per_s_max REAL,
    nvlink_errors_delta INTEGER,
    nvlink_errors TEXT,             -- JSON {"<link>": {"<kind>": sum}} over the minute, non-zero only
    nvlink_tx_mb_avg BLOB, nvlink_tx_mb_max BLOB,   -- per link, same encoding as gpu_ticks
    nvlink_rx_mb_avg BLOB, nvlink_rx_mb_max BLOB,
    PRIMARY KEY (ts_ms, gpu)
) STRICT, WITHOUT ROWID;

CREATE TABLE ib_minutes (
    ts_ms INTEGER NOT NULL,
    port_id INTEGER NOT NULL REFERENCES ib_ports(id),
    samples INTEGER NOT NULL,
    active_samples INTEGER NOT NULL, -- ticks with state ACTIVE
    rate_gbps_min REAL, rate_gbps_avg REAL, rate_gbps_max REAL,
    tx_bytes_per_s_min REAL, tx_bytes_per_s_avg REAL, tx_bytes_per_s_max REAL,
    rx_bytes_per_s_min REAL, rx_bytes_per_s_avg REAL, rx_bytes_per_s_max REAL,
    errors_delta INTEGER,
    PRIMARY KEY (ts_ms, port_id)
) STRICT, WITHOUT ROWID;

-- Views for people at a sqlite3 / Datasette prompt: readable times, port names, one row per link.
CREATE VIEW gpu_raw AS
    SELECT strftime('%Y-%m-%dT%H:%M:%fZ', ts_ms / 1000.0, 'unixepoch') AS time, *,
        rtrim(CASE WHEN throttle_mask & 1 THEN 'gpu_idle,' ELSE '' END
           || CASE WHEN throttle_mask & 2 THEN 'applications_clocks,' ELSE '' END
           || CASE WHEN throttle_mask & 4 THEN 'sw_power_cap,' ELSE '' END
           || CASE WHEN throttle_mask & 8 THEN 'hw_slowdown,' ELSE '' END
           || CASE WHEN throttle_mask & 16 THEN 'sync_boost,' ELSE '' END
           || CASE WHEN throttle_mask & 32 THEN 'sw_thermal,' ELSE '' END
           || CASE WHEN throttle_mask & 64 THEN 'hw_thermal,' ELSE '' END
           || CASE WHEN throttle_mask & 128 THEN 'hw_power_brake,' ELSE '' END
           || CASE WHEN throttle_mask & 256 THEN 'display_clocks,' ELSE '' END, ',') AS throttle
    FROM gpu_ticks;

CREATE VIEW ib_raw AS
    SELECT strftime('%Y-%m-%dT%H:%M:%fZ', t.ts_ms / 1000.0, 'unixepoch') AS time, p.device, p.port,
        CASE t.state WHEN 0 THEN 'NOP' WHEN 1 THEN 'DOWN' WHEN 2 THEN 'INIT' WHEN 3 THEN 'ARMED'
            WHEN 4 THEN 'ACTIVE' WHEN 5 THEN 'ACTIVE_DEFER' END AS state_name,
        CASE t.phys_state WHEN 1 THEN 'Sleep' WHEN 2 THEN 'Polling' WHEN 3 THEN 'Disabled'
            WHEN 4 THEN 'PortConfigurationTraining' WHEN 5 THEN 'LinkUp' WHEN 6 THEN 'LinkErrorRecovery'
            WHEN 7 THEN 'Phy Test' END AS phys_state_name,
        t.*
    FROM ib_ticks t JOIN ib_ports p ON p.id = t.port_id;

CREATE VIEW ib_minutes_named AS
    SELECT strftime('%Y-%m-%dT%H:%M:%SZ', m.ts_ms / 1000, 'unixepoch') AS time, p.device, p.port, m.*
    FROM ib_minutes m JOIN ib_ports p ON p.id = m.port_id;

-- One row per (tick, GPU, link), decoding the uint16 blobs in SQL: hex() gives 4 hex digits per
-- link, low byte first; each digit's value is its position in '0123456789ABCDEF'. Filter on ts_ms.
CREATE VIEW nvlink_raw AS
    SELECT g.ts_ms, g.gpu, CAST(l.value AS INTEGER) AS link,
        CASE WHEN (g.nvlink_up_mask >> l.value) & 1 THEN 1
             WHEN (g.nvlink_down_mask >> l.value) & 1 THEN 0 END AS active,
        nullif(
            (instr('0123456789ABCDEF', substr(hex(g.nvlink_tx_mb), l.value * 4 + 3, 1)) - 1) * 4096
           + (instr('0123456789ABCDEF', substr(hex(g.nvlink_tx_mb), l.value * 4 + 4, 1)) - 1) * 256
           + (instr('0123456789ABCDEF', substr(hex(g.nvlink_tx_mb), l.value * 4 + 1, 1)) - 1) * 16
           + (instr('0123456789ABCDEF', substr(hex(g.nvlink_tx_mb), l.value * 4 + 2, 1)) - 1),
            65535) * 1000000 AS tx_bytes_per_s,
        nullif(
            (instr('0123456789ABCDEF', substr(hex(g.nvlink_rx_mb), l.value * 4 + 3, 1)) - 1) * 4096
           + (instr('0123456789ABCDEF', substr(hex(g.nvlink_rx_mb), l.value * 4 + 4, 1)) - 1) * 256
           + (instr('0123456789ABCDEF', substr(hex(g.nvlink_rx_mb), l.value * 4 + 1, 1)) - 1) * 16
           + (instr('0123456789ABCDEF', substr(hex(g.nvlink_rx_mb), l.value * 4 + 2, 1)) - 1),
            65535) * 1000000 AS rx_bytes_per_s,
        json_extract(g.nvlink_errors, '$."' || l.value || '"') AS errors_delta
    FROM gpu_ticks g
    JOIN json_each('[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,'
                || '18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35]') l
      ON l.value < length(g.nvlink_tx_mb) / 2;
"""

# The alert lifecycle (nvmon.alerts): one row per alert episode, acks per episode, silences.
_V2 = """
CREATE TABLE alerts (
    fingerprint TEXT NOT NULL,      -- rule + node + gpu/link/device/port (nvmon.alerts.model.fingerprint)
    starts_ms INTEGER NOT NULL,     -- the episode's first observation (pending), unix ms
    status TEXT NOT NULL,           -- 'pending' | 'firing' | 'resolved'
    code TEXT NOT NULL,
    severity TEXT NOT NULL,
    cluster TEXT NOT NULL,
    rack TEXT,
    node TEXT,
    gpu INTEGER,
    link INTEGER,
    device TEXT,
    port INTEGER,
    summary TEXT NOT NULL,
    runbook TEXT NOT NULL,
    value TEXT,                     -- JSON
    threshold TEXT,                 -- JSON
    fired_ms INTEGER,               -- NULL while pending
    ends_ms INTEGER,                -- NULL while active
    count INTEGER NOT NULL,         -- observations in this episode
    labels TEXT,                    -- JSON object, NULL when none
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (fingerprint, starts_ms)
) STRICT;

CREATE INDEX alerts_active ON alerts (fingerprint) WHERE status != 'resolved';
CREATE INDEX alerts_ends ON alerts (ends_ms) WHERE status = 'resolved';

CREATE TABLE alert_acks (
    fingerprint TEXT NOT NULL,
    starts_ms INTEGER NOT NULL,     -- the episode acked (alerts.starts_ms)
    acked_ms INTEGER NOT NULL,
    acked_by TEXT,
    PRIMARY KEY (fingerprint, starts_ms)
) STRICT;

CREATE TABLE silences (
    id INTEGER PRIMARY KEY,
    matchers TEXT NOT NULL,         -- JSON object: label → shell-style glob, all must match
    starts_ms INTEGER NOT NULL,
    ends_ms INTEGER NOT NULL,
    created_by TEXT,
    comment TEXT
) STRICT;
"""


# Raw and rollup table of each scope whose metrics the catalog declares per tick.
_TABLES = {Scope.GPU: ("gpu_ticks", "gpu_minutes"), Scope.IB_PORT: ("ib_ticks", "ib_minutes"),
           Scope.NODE: ("ticks", "node_minutes")}


def catalog_columns() -> dict[str, list[tuple[str, str]]]:
    """Every (column, type) the catalog's per-tick metrics need, by table: raw column and rollups."""
    out: dict[str, list[tuple[str, str]]] = {t: [] for pair in _TABLES.values() for t in pair}
    for m in METRICS:
        if m.column is None or m.static is not Static.TICK or m.scope not in _TABLES:
            continue
        raw, minutes = _TABLES[m.scope]
        sql_type = m.sql_type.split()[0]  # an added column cannot be NOT NULL without a default
        out[raw].append((m.column, sql_type))
        out[minutes] += [(col, sql_type) for col, _ in m.rollup_sql()]
    return out


def add_catalog_columns(conn: sqlite3.Connection) -> list[str]:
    """Add the columns of catalog metrics a database does not have yet (NULL in its older rows):
    a metric added to the catalog needs no hand-written migration. Returns what was added."""
    added = []
    for table, cols in catalog_columns().items():
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        for col, sql_type in cols:
            if col not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {col} {sql_type}")
                have.add(col)
                added.append(f"{table}.{col}")
    return added


# Version 3: the first metrics added through the catalog (clocks, framebuffer, memory temperature),
# and from then on every column the catalog declares (`migrate` adds new ones on every open).
MIGRATIONS: list[Callable[[sqlite3.Connection], None] | str] = [_V1, _V2, add_catalog_columns]
SCHEMA_VERSION = len(MIGRATIONS)


class SchemaError(Exception):
    """The file is not an nvmon database, or one from a newer nvmon."""


def check_version(conn: sqlite3.Connection) -> int:
    """The database's schema version; raises SchemaError when this code cannot use it."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    if app_id not in (0, APPLICATION_ID):
        raise SchemaError(f"not an nvmon database (application_id {app_id:#x})")
    if version > SCHEMA_VERSION:
        raise SchemaError(f"schema version {version} is newer than this nvmon's ({SCHEMA_VERSION}); upgrade nvmon")
    if version == 0:
        # An empty file is fine (it becomes one); a file holding other tables is someone else's.
        tables = conn.execute("SELECT count(*) FROM sqlite_schema WHERE type = 'table'").fetchone()[0]
        if tables:
            raise SchemaError("not an nvmon database (no schema version, has other tables)")
    return version


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the database to SCHEMA_VERSION, one transaction per migration; returns the version.

    The caller's connection must be in autocommit mode (isolation_level=None) or idle.
    `user_version` is written inside each migration's transaction, so a crash leaves either
    the old or the new version, never a half-applied one.
    """
    version = check_version(conn)
    for number in range(version + 1, SCHEMA_VERSION + 1):
        step = MIGRATIONS[number - 1]
        conn.execute("BEGIN IMMEDIATE")
        try:
            if callable(step):
                step(conn)
            else:
                for statement in _statements(step):
                    conn.execute(statement)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {number}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    if version == SCHEMA_VERSION and _missing_columns(conn):
        # Metrics added to the catalog since this database was last migrated: their columns.
        conn.execute("BEGIN IMMEDIATE")
        try:
            add_catalog_columns(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return SCHEMA_VERSION


def _missing_columns(conn: sqlite3.Connection) -> bool:
    for table, cols in catalog_columns().items():
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if any(col not in have for col, _ in cols):
            return True
    return False


def _statements(script: str) -> list[str]:
    """Split a script into statements (executescript would COMMIT the open transaction)."""
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf.strip())
            buf = ""
    if buf.strip() and not buf.strip().startswith("--"):
        out.append(buf.strip())
    return out
