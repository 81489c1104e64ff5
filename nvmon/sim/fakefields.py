"""`nvmlDeviceGetFieldValues` of the fake libnvidia-ml (`fakenvml`): it fills the caller's
c_nvmlFieldValue_t array in place, as the C library does.

A collector sends the same request every tick (on an HGX H100, ~140 fields per GPU), and what an
entry is (its value type, which value it reads, which return code answers it) depends only on its
(fieldId, scopeId) and the board profile. So each request layout is resolved once into a `_Plan`,
and a call then reads the GPU's values once, in bulk (one `SimBoard.nvlink_readings` for all its
links), picks each entry's answer by index and writes the array a column at a time.
"""

from __future__ import annotations

import struct
from array import array
from operator import itemgetter

import pynvml
from pynvml import NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED, NVML_SUCCESS

from nvmon.catalog import GPU_NVML
from nvmon.collect.nvml_fields import NVLINK_GEN_TO_ENUM
from nvmon.sim.board import NVLINK_ERR_KEYS, SimBoard
from nvmon.sim.profiles import BoardProfile
from nvmon.sim.values import VALUES, SimValue

# Field ids nvmon's collector asks for (pynvml names; see nvmon/collect/nvml_fields.py), and those of
# the catalog's field-id metrics (Metric.nvml.field), answered from nvmon.sim.values.
FI_TOTAL_ENERGY = 83
FI_LINK_COUNT = 91
FI_PCIE_REPLAY = 94
FI_THROUGHPUT_DATA_TX = 138
FI_THROUGHPUT_DATA_RX = 139
FI_ERROR_DL_REPLAY = 161
FI_ERROR_DL_RECOVERY = 162
FI_ERROR_DL_CRC = 163
FI_GET_SPEED = 164
FI_GET_STATE = 165
FI_GET_VERSION = 166
FI_POWER_CURRENT_LIMIT = 190  # the enforced limit, mW
FI_PCIE_TX_BYTES = 197
FI_PCIE_RX_BYTES = 198
FI_CRC_DATA_PER_LINK = {**{39 + i: i for i in range(6)}, **{102 + i: 6 + i for i in range(6)}}

VT_UINT = 1
VT_ULL = 3
_MASK = {VT_UINT: 0xFFFFFFFF, VT_ULL: 0xFFFFFFFFFFFFFFFF}
FV = struct.Struct("=IIqqIIQ")  # c_nvmlFieldValue_t, checked against pynvml in the tests
assert array("I").itemsize == 4 and array("q").itemsize == array("Q").itemsize == 8  # FV's sizes
_ERROR_FIELDS = {FI_ERROR_DL_REPLAY: "replay", FI_ERROR_DL_RECOVERY: "recovery", FI_ERROR_DL_CRC: "crc_flit"}
_PER_LINK = {FI_THROUGHPUT_DATA_TX, FI_THROUGHPUT_DATA_RX, FI_GET_SPEED, FI_GET_STATE, FI_GET_VERSION, *_ERROR_FIELDS}

# field id → (metric name, its simulated value), for the catalog's metrics the installed pynvml names
CATALOG: dict[int, tuple[str, SimValue]] = {
    getattr(pynvml, m.nvml.field): (m.name, VALUES[m.name]) for m in GPU_NVML
    if m.nvml.field and isinstance(getattr(pynvml, m.nvml.field, None), int)}
_CATALOG_INDEX = {fid: k for k, fid in enumerate(CATALOG)}

# Slots of a call's return codes: fixed ones, then those a `notsup` fault decides, then one per
# catalog field.
_R_OK, _R_NOTSUP, _R_INVALID, _R_ENERGY, _R_PCIE, _R_STATE, _R_CATALOG = range(7)
# Slots of a call's values: the GPU's, one per catalog field, then from _V_LINKS on a column per
# `_LINK` value (link 0 first).
_V_ZERO, _V_LINK_COUNT, _V_VERSION, _V_REPLAY, _V_ENERGY, _V_PCIE_TX, _V_PCIE_RX, _V_POWER_LIMIT, _V_CATALOG = range(9)
_V_LINKS = _V_CATALOG + len(CATALOG)
_LINK = ("tx", "rx", *NVLINK_ERR_KEYS, "state", "speed")


def _link_slot(p: BoardProfile, link: int, what: str) -> int:
    return _V_LINKS + _LINK.index(what) * p.link_slots + link


def _rule(p: BoardProfile, fid: int, scope: int) -> tuple[int, int, int]:
    """(valueType, return-code slot, value slot) of one requested field on a board of profile `p`;
    unmodelled fields answer NOT_SUPPORTED."""
    slots = p.link_slots
    blackwell = p.nvlink_gen is not None and p.nvlink_gen >= 5
    if fid == FI_TOTAL_ENERGY:
        return VT_ULL, _R_ENERGY, _V_ENERGY
    if fid == FI_LINK_COUNT:
        return VT_UINT, _R_OK, _V_LINK_COUNT
    if fid in _CATALOG_INDEX:
        k = _CATALOG_INDEX[fid]
        return CATALOG[fid][1].value_type, _R_CATALOG + k, _V_CATALOG + k
    if fid == FI_PCIE_REPLAY:
        return VT_UINT, _R_OK, _V_REPLAY
    if fid == FI_POWER_CURRENT_LIMIT:
        return VT_UINT, _R_OK, _V_POWER_LIMIT
    if fid in (FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES):
        return VT_ULL, _R_PCIE, _V_PCIE_TX + fid - FI_PCIE_TX_BYTES
    if fid in _PER_LINK:
        if scope >= slots:
            return VT_ULL, _R_INVALID, _V_ZERO
        if fid in (FI_THROUGHPUT_DATA_TX, FI_THROUGHPUT_DATA_RX):
            return VT_ULL, _R_OK, _link_slot(p, scope, "tx" if fid == FI_THROUGHPUT_DATA_TX else "rx")
        if fid in _ERROR_FIELDS:
            if blackwell:  # "unsupported for Blackwell+" (nvml.h)
                return VT_ULL, _R_NOTSUP, _V_ZERO
            return VT_ULL, _R_OK, _link_slot(p, scope, _ERROR_FIELDS[fid])
        if fid == FI_GET_STATE:
            return VT_UINT, _R_STATE, _link_slot(p, scope, "state")
        if fid == FI_GET_SPEED:
            return VT_UINT, _R_OK, _link_slot(p, scope, "speed")
        return VT_UINT, _R_OK, _V_VERSION  # FI_GET_VERSION
    if fid in FI_CRC_DATA_PER_LINK:
        lk = FI_CRC_DATA_PER_LINK[fid]
        if lk >= slots or blackwell:
            return VT_ULL, _R_NOTSUP, _V_ZERO
        return VT_ULL, _R_OK, _link_slot(p, lk, "crc_data")
    return VT_ULL, _R_NOTSUP, _V_ZERO


def _picker(slots: list[int]):
    """f(values) → tuple of values[i] for i in `slots`, at C speed."""
    return itemgetter(*slots) if len(slots) > 1 else lambda values, i=slots[0]: (values[i],)


class _Plan:
    """One request layout, resolved: which values a call must compute, and where each entry's
    return code and value come from."""

    __slots__ = ("n", "static", "rets", "vals", "energy", "pcie", "links", "state", "catalog", "power_limit")

    def __init__(self, p: BoardProfile, ids: list[tuple[int, int]]):
        rules = [_rule(p, fid, scope) for fid, scope in ids]
        self.n = len(ids)
        # The records with what never changes (fieldId, scopeId, latency 0, valueType) filled in.
        self.static = b"".join(FV.pack(fid, scope, 0, 0, vt, 0, 0) for (fid, scope), (vt, _, _) in zip(ids, rules))
        self.rets = _picker([r for _, r, _ in rules])
        self.vals = _picker([v for _, _, v in rules])
        self.energy = any(r == _R_ENERGY for _, r, _ in rules)
        self.pcie = any(r == _R_PCIE for _, r, _ in rules)
        self.state = any(r == _R_STATE for _, r, _ in rules)
        self.catalog = any(r >= _R_CATALOG for _, r, _ in rules)
        self.power_limit = any(v == _V_POWER_LIMIT for _, _, v in rules)
        self.links = any(v >= _V_LINKS for _, _, v in rules)


class FieldValues:
    """The field values of one board's GPUs: `fill(gpu, t, ts_us, entries)` per call."""

    MAX_PLANS = 64  # request layouts kept (a collector uses one or two); past that, start over

    def __init__(self, board: SimBoard):
        self.board = board
        p = board.profile
        # The valueType-UINT values that are constants, cut to 32 bits as C would store them (so
        # every value that goes out already fits its type; see `fill`). The NVLink version is only
        # ever answered on boards with links, which all have a generation.
        self._link_count = p.link_slots & _MASK[VT_UINT]
        self._version = NVLINK_GEN_TO_ENUM.get(p.nvlink_gen, 0) & _MASK[VT_UINT]
        self._link_mbps = (p.link_mbps or 0) & _MASK[VT_UINT]
        self._plans: dict[bytes, _Plan] = {}
        self._catalog_rets, self._catalog_vals = [NVML_SUCCESS] * len(CATALOG), [0] * len(CATALOG)

    def fill(self, g: int, t: float, ts_us: int, entries: memoryview) -> None:
        """Answer the c_nvmlFieldValue_t records in `entries` (raw bytes, written in place) for GPU
        `g` at board time `t`; `ts_us`: their timestamp."""
        n = len(entries) // FV.size
        if not n:
            return
        key = entries.cast("Q")[::5].tobytes()  # every record's fieldId and scopeId: its first 8 bytes
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= self.MAX_PLANS:
                self._plans.clear()
            ids = [(fid, scope) for fid, scope, *_ in FV.iter_unpack(entries)]
            plan = self._plans[key] = _Plan(self.board.profile, ids)
        b = self.board
        rets = [NVML_SUCCESS, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT, NVML_SUCCESS, NVML_SUCCESS,
                NVML_SUCCESS, *self._catalog_rets]
        vals = [0, self._link_count, self._version, b.gpus[g].replay_base & _MASK[VT_UINT], 0, 0, 0, 0,
                *self._catalog_vals]
        if plan.power_limit:
            vals[_V_POWER_LIMIT] = int(b.power_limit_w(g, t) * 1000) & _MASK[VT_UINT]
        if plan.catalog:  # the catalog's field-id metrics, from their simulated values
            for k, (_, sv) in enumerate(CATALOG.values()):
                rets[_R_CATALOG + k] = NVML_ERROR_NOT_SUPPORTED if sv.notsup and b.notsup(sv.notsup, g, t) \
                    else NVML_SUCCESS
                vals[_V_CATALOG + k] = sv.at(b, g, t) & _MASK[sv.value_type]
        if plan.energy:  # the value is written even when the query answers NOT_SUPPORTED
            rets[_R_ENERGY] = NVML_ERROR_NOT_SUPPORTED if b.notsup("energy", g, t) else NVML_SUCCESS
            vals[_V_ENERGY] = b.energy_mj(g, t)
        if plan.pcie:
            rets[_R_PCIE] = NVML_ERROR_NOT_SUPPORTED if b.notsup("pcie_bytes", g, t) else NVML_SUCCESS
            vals[_V_PCIE_TX], vals[_V_PCIE_RX] = b.pcie_bytes(g, t)
        if plan.links:  # the columns in _LINK order
            active, tx, rx, errors = b.nvlink_readings(g, t)
            state_ok = not (plan.state and b.notsup("nvlink_state_field", g, t))
            rets[_R_STATE] = NVML_SUCCESS if state_ok else NVML_ERROR_NOT_SUPPORTED
            vals += tx + rx
            for col in errors:
                vals += col
            vals += list(map(int, active)) if state_ok else [0] * len(active)
            vals += [self._link_mbps if a else 0 for a in active]
        picked = plan.vals(vals)
        try:  # every value already fits its type, but for counters past 2**64 (a clock millennia ahead)
            values = array("Q", picked)
        except OverflowError:  # which wrap, as in C
            values = array("Q", [v & _MASK[VT_ULL] for v in picked])
        stamps, codes = array("q", (ts_us,)) * n, array("I", plan.rets(rets))
        # Each record is 5 8-byte words (10 4-byte ones): the timestamp is word 1, the value word 4,
        # nvmlReturn 4-byte word 7. Strided writes of whole columns cost far less than packing each
        # record.
        entries[:] = plan.static
        entries.cast("q")[1::5] = stamps
        entries.cast("Q")[4::5] = values
        entries.cast("I")[7::10] = codes
