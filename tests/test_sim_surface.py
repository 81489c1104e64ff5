"""The simulator must be faithful to the installed nvidia-ml-py: same symbols, same call shapes,
same exception classes. A collector that only works against the simulator is broken.

Runs against the newest nvidia-ml-py and the oldest pyproject.toml accepts (.ci/run): a name newer
than the installed release (`nvml_fields.ADDED`) is checked to be absent, and not exercised."""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
from pathlib import Path

import pynvml
import pytest

import nvmon.collect.nvml as collector_module
import nvmon.collect.nvml_api as api_module
import nvmon.collect.nvml_batch as batch_module
import nvmon.collect.fabric as fabric_module
import nvmon.collect.nvml_events as events_module
import nvmon.collect.nvml_catalog as catalog_module
import nvmon.collect.nvml_gpu as gpu_module
from nvmon.collect import nvml_fields
from nvmon.collect.nvml import NvmlCollector
from nvmon.collect.nvml_api import Api
from nvmon.sim.board import SimBoard
from nvmon.sim.fakenvml import FakeNvmlLib, load_sim_pynvml
from nvmon.sim.scenario import parse_scenario

PYNVML_SRC = Path(pynvml.__file__).read_text()
PYNVML_AST = ast.parse(PYNVML_SRC)
INSTALLED = tuple(int(x) for x in importlib.metadata.version("nvidia-ml-py").split(".")[:2])


def _newer_than_installed(name: str) -> bool:
    since = nvml_fields.ADDED.get(name)
    return since is not None and INSTALLED < since


def _c_calls() -> dict[str, set[int]]:
    """C symbol → the argument counts pynvml's wrappers pass to it (`fn = _nvmlGetFunctionPointer(...)`)."""
    out: dict[str, set[int]] = {}
    for fn in ast.walk(PYNVML_AST):
        if not isinstance(fn, ast.FunctionDef):
            continue
        # A name may be bound to one symbol or another (`if not version: fn = ...("nvmlDeviceGetMemoryInfo")
        # else: fn = ...("..._v2")`): each call of it counts for every symbol it may hold.
        bound: dict[str, set[str]] = {}
        for node in ast.walk(fn):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and getattr(node.value.func, "id", None) == "_nvmlGetFunctionPointer"
                    and node.value.args and isinstance(node.value.args[0], ast.Constant)):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        bound.setdefault(target.id, set()).add(node.value.args[0].value)
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in bound:
                for symbol in bound[node.func.id]:
                    out.setdefault(symbol, set()).add(len(node.args))
    return out


C_CALLS = _c_calls()
FAKE_SYMBOLS = sorted(n for n, v in vars(FakeNvmlLib).items() if n.startswith("nvml") and callable(v))


def test_found_the_wrappers():
    assert len(C_CALLS) > 250  # sanity: the AST scan really read pynvml's wrappers (282 in 11.525)
    assert C_CALLS["nvmlDeviceGetFieldValues"] == {3}


@pytest.mark.parametrize("symbol", FAKE_SYMBOLS)
def test_fake_symbol_exists_in_pynvml_with_same_arity(symbol):
    if _newer_than_installed(symbol):  # only newer bindings call it: nothing to compare with here
        assert symbol not in C_CALLS, f"{symbol}: nvml_fields.ADDED says it is newer than {INSTALLED}"
        pytest.skip(f"{symbol} is newer than nvidia-ml-py {INSTALLED}")
    assert symbol in C_CALLS, f"{symbol} is not a C symbol the installed pynvml calls"
    params = list(inspect.signature(getattr(FakeNvmlLib, symbol)).parameters)[1:]  # drop self
    assert C_CALLS[symbol] == {len(params)}, f"{symbol}: pynvml passes {C_CALLS[symbol]} args, fake takes {len(params)}"


def _names_used_by_collector() -> set[str]:
    """The names the collect modules look up in pynvml directly (not through `Api`)."""
    names = set()
    for module in (collector_module, gpu_module, catalog_module, events_module, api_module, batch_module, fabric_module):
        names |= _module_names(module)
    return names


def _module_names(module) -> set[str]:
    tree = ast.parse(Path(module.__file__).read_text())
    names = set()
    for node in ast.walk(tree):
        # `nv.<name>`, `self.nvml.<name>` or `self.api.nv.<name>`: the pynvml module it was given
        base = node.value if isinstance(node, ast.Attribute) else None
        is_module = (isinstance(base, ast.Name) and base.id == "nv") or (
            isinstance(base, ast.Attribute) and base.attr in ("nvml", "nv"))
        if is_module and node.attr.startswith(("nvml", "NVML")):
            names.add(node.attr)
    return names


def test_every_pynvml_name_the_collector_looks_up_directly_exists():
    """Direct lookups (error classes, return codes, enums) are for names every accepted release has."""
    used = _names_used_by_collector()
    assert {"NVMLError_GpuIsLost", "NVMLError_NotSupported", "NVML_ERROR_TIMEOUT",
            "nvmlEventTypeXidCriticalError", "NVML_TEMPERATURE_GPU"} <= used
    assert not used & set(nvml_fields.ADDED), "a newer name must go through nvml_api.Api"
    # (nvml_batch calls nvmlDeviceGetFieldValues itself: the batch runs inside the chokepoint's call)
    outside_batch = set().union(*(_module_names(m) for m in (collector_module, gpu_module, catalog_module,
                                                            events_module, api_module, fabric_module)))
    assert not {n for chain in nvml_fields.FUNCTIONS.values() for n in chain} & outside_batch, "call through Api.fn"
    missing = sorted(n for n in used if not hasattr(pynvml, n))
    assert not missing, f"collector uses names the installed pynvml lacks: {missing}"


def _field_id_names() -> list[str]:
    names = [v for k, v in vars(nvml_fields).items() if k.startswith("FI_") and isinstance(v, str)]
    # and the catalog's (nvmon.catalog Metric.nvml): its field ids and getter arguments
    return names + list(nvml_fields.FI_LINK_CRC_DATA) + list(nvml_fields.CATALOG_CONSTANTS)


def test_names_resolved_through_the_api_exist_exactly_from_their_release():
    """Every function and field id nvmon resolves is in the installed bindings, except those
    `ADDED` after this release — so a typo or a rename fails here, and so does a stale `ADDED`."""
    for name in [n for chain in nvml_fields.FUNCTIONS.values() for n in chain]:
        assert callable(getattr(pynvml, name, None)) != _newer_than_installed(name), name
    for name in _field_id_names():
        assert isinstance(getattr(pynvml, name, None), int) != _newer_than_installed(name), name
    api = Api(pynvml)
    # every purpose has a function in this release, but those whose every name is newer (the fabric's
    # versioned call: the unversioned one, its own purpose, is read instead)
    missing = {what for what, fn in api.fn.items() if fn is None}
    assert missing == {what for what, names in nvml_fields.FUNCTIONS.items()
                       if all(_newer_than_installed(n) for n in names)}
    newest = getattr(pynvml, "nvmlDeviceGetTemperatureV", None)
    assert (api.fn["temperature"] is newest) == (INSTALLED >= (12, 570))
    if newest is None:  # the fallback: the getter the versioned one deprecates, same arguments
        assert api.fn["temperature"] is pynvml.nvmlDeviceGetTemperature


def test_every_wrapper_the_collector_calls_is_backed_by_the_fake():
    """A wrapper the collector calls (the one `Api` picks in the installed bindings) must resolve to
    a C symbol the fake implements (else the simulator would silently answer FunctionNotFound and
    the path would go untested)."""
    fake = set(FAKE_SYMBOLS)
    for what, fn in Api(pynvml).fn.items():
        if what in ("init", "shutdown") or fn is None:  # None: newer than these bindings (checked above)
            continue
        syms = set(_symbols_reached(fn.__name__, inspect.getsource(fn)))
        assert syms & fake, f"{what}: {fn.__name__} reaches {syms}, none implemented by the fake"


def _symbols_reached(name: str, src: str, depth: int = 0):
    tree = ast.parse(src.lstrip() if not src.startswith("@") else src)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_nvmlGetFunctionPointer"
                and isinstance(node.args[0], ast.Constant)):
            yield node.args[0].value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and depth < 2:
            callee = getattr(pynvml, node.func.id, None)
            if callee is not None and node.func.id.startswith("nvml") and callable(callee) and node.func.id != name:
                yield from _symbols_reached(node.func.id, inspect.getsource(callee), depth + 1)


def test_sim_module_has_pynvml_exception_classes():
    sim = load_sim_pynvml(SimBoard(parse_scenario("hgx-h100")))
    classes = [n for n in dir(pynvml) if n.startswith("NVMLError_")]
    assert len(classes) > 25
    for n in classes:
        real, fake = getattr(pynvml, n), getattr(sim, n)
        assert fake.__name__ == real.__name__ and issubclass(fake, sim.NVMLError)
        assert fake().value == real().value
    # The simulated module is a private copy: the real bindings are untouched.
    assert sim is not pynvml and pynvml.nvmlLib is None or not isinstance(pynvml.nvmlLib, FakeNvmlLib)


def test_sim_errors_go_through_pynvml_error_mapping():
    sim = load_sim_pynvml(SimBoard(parse_scenario("hgx-h100,gpu_lost=2")))
    with pytest.raises(sim.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()
    sim.nvmlInit()
    with pytest.raises(sim.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(sim.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetHandleByIndex(8)
    h = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(sim.NVMLError_FunctionNotFound):
        sim.nvmlDeviceGetBoardId(h)  # not modelled: answers like an old driver
    # Return shapes are pynvml's own: str names, nvmlPciInfo_t with a str busId, ctypes field arrays.
    assert isinstance(sim.nvmlDeviceGetName(h), str)
    assert sim.nvmlDeviceGetPciInfo(h).busId == "00000000:18:00.0"
    vals = sim.nvmlDeviceGetFieldValues(h, [sim.NVML_FI_DEV_NVLINK_LINK_COUNT, (sim.NVML_FI_DEV_NVLINK_GET_STATE, 18)])
    assert type(vals[0]).__name__ == "c_nvmlFieldValue_t"
    assert vals[0].nvmlReturn == 0 and vals[0].value.uiVal == 18
    assert vals[1].nvmlReturn == sim.NVML_ERROR_INVALID_ARGUMENT  # past the real link count
    assert sim.nvmlDeviceGetPowerManagementLimitConstraints(h) == [200000, 700000]


def test_real_pynvml_without_driver_is_reported_not_raised():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - only on a machine with a driver
        pynvml.nvmlShutdown()
        pytest.skip("a real NVIDIA driver is present")
    c = NvmlCollector(pynvml)
    status = c.open()
    assert status.available is False
    assert "libnvidia-ml.so.1" in status.error
    assert c.collect(0.0) == ()


def test_sim_xid_events_through_the_real_event_wrappers():
    """nvmlEventSetCreate / RegisterEvents / EventSetWait_v2 / EventSetFree: pynvml's own ctypes
    types and error classes, one delivery per event, TIMEOUT when the queue is empty."""
    sim = load_sim_pynvml(SimBoard(parse_scenario("hgx-h100,xid=3:79")))
    sim.nvmlInit()
    es = sim.nvmlEventSetCreate()
    assert type(es) is sim.c_nvmlEventSet_t
    h = sim.nvmlDeviceGetHandleByIndex(3)
    with pytest.raises(sim.NVMLError_Timeout):  # nothing registered: nothing delivered
        sim.nvmlEventSetWait_v2(es, 0)
    assert sim.nvmlDeviceRegisterEvents(h, sim.nvmlEventTypeXidCriticalError, es) is None
    data = sim.nvmlEventSetWait_v2(es, 0)
    assert type(data).__name__ == "c_nvmlEventData_t"
    assert (data.eventType, data.eventData) == (sim.nvmlEventTypeXidCriticalError, 79)
    assert (data.gpuInstanceId, data.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert sim.nvmlDeviceGetIndex(data.device) == 3  # the event's device is a usable handle
    with pytest.raises(sim.NVMLError_Timeout):  # delivered once
        sim.nvmlEventSetWait(es, 0)
    assert sim.nvmlEventSetFree(es) is None
    with pytest.raises(sim.NVMLError_InvalidArgument):
        sim.nvmlEventSetWait_v2(es, 0)
    notsup = load_sim_pynvml(SimBoard(parse_scenario("hgx-h100,notsup=xid_events:2")))
    notsup.nvmlInit()
    es = notsup.nvmlEventSetCreate()
    with pytest.raises(notsup.NVMLError_NotSupported):
        notsup.nvmlDeviceRegisterEvents(notsup.nvmlDeviceGetHandleByIndex(2), notsup.nvmlEventTypeXidCriticalError, es)
