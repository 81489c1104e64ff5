"""The simulator must be faithful to the installed nvidia-ml-py: same symbols, same call shapes,
same exception classes. A collector that only works against the simulator is broken."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pynvml
import pytest

import nvmon.collect.nvml as collector_module
import nvmon.collect.nvml_events as events_module
from nvmon.collect import nvml_fields
from nvmon.collect.nvml import NvmlCollector
from nvmon.sim.board import SimBoard
from nvmon.sim.fakenvml import FakeNvmlLib, load_sim_pynvml
from nvmon.sim.scenario import parse_scenario

PYNVML_SRC = Path(pynvml.__file__).read_text()
PYNVML_AST = ast.parse(PYNVML_SRC)


def _c_calls() -> dict[str, set[int]]:
    """C symbol → the argument counts pynvml's wrappers pass to it (`fn = _nvmlGetFunctionPointer(...)`)."""
    out: dict[str, set[int]] = {}
    for fn in ast.walk(PYNVML_AST):
        if not isinstance(fn, ast.FunctionDef):
            continue
        bound: dict[str, str] = {}
        for node in ast.walk(fn):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and getattr(node.value.func, "id", None) == "_nvmlGetFunctionPointer"
                    and node.value.args and isinstance(node.value.args[0], ast.Constant)):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        bound[target.id] = node.value.args[0].value
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in bound:
                out.setdefault(bound[node.func.id], set()).add(len(node.args))
    return out


C_CALLS = _c_calls()
FAKE_SYMBOLS = sorted(n for n, v in vars(FakeNvmlLib).items() if n.startswith("nvml") and callable(v))


def test_found_the_wrappers():
    assert len(C_CALLS) > 300  # sanity: the AST scan really read pynvml's wrappers
    assert C_CALLS["nvmlDeviceGetFieldValues"] == {3}


@pytest.mark.parametrize("symbol", FAKE_SYMBOLS)
def test_fake_symbol_exists_in_pynvml_with_same_arity(symbol):
    assert symbol in C_CALLS, f"{symbol} is not a C symbol the installed pynvml calls"
    params = list(inspect.signature(getattr(FakeNvmlLib, symbol)).parameters)[1:]  # drop self
    assert C_CALLS[symbol] == {len(params)}, f"{symbol}: pynvml passes {C_CALLS[symbol]} args, fake takes {len(params)}"


def _names_used_by_collector() -> set[str]:
    names = set()
    for module in (collector_module, events_module):
        names |= _module_names(module)
    return names


def _module_names(module) -> set[str]:
    tree = ast.parse(Path(module.__file__).read_text())
    names = set()
    for node in ast.walk(tree):
        # `nv.<name>` or `self.nvml.<name>`: the pynvml module the collector was given
        base = node.value if isinstance(node, ast.Attribute) else None
        is_module = (isinstance(base, ast.Name) and base.id == "nv") or (
            isinstance(base, ast.Attribute) and base.attr == "nvml")
        if is_module and node.attr.startswith(("nvml", "NVML")):
            names.add(node.attr)
    return names


def test_every_pynvml_name_the_collector_uses_exists():
    used = _names_used_by_collector()
    assert {"nvmlDeviceGetFieldValues", "nvmlDeviceGetHandleByIndex", "NVMLError_GpuIsLost"} <= used
    assert {"nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2", "nvmlEventSetFree",
            "nvmlEventTypeXidCriticalError", "NVMLError_Timeout"} <= used
    missing = sorted(n for n in used if not hasattr(pynvml, n))
    assert not missing, f"collector uses names the installed pynvml lacks: {missing}"


def test_field_ids_named_by_nvmon_exist_in_pynvml():
    names = [v for k, v in vars(nvml_fields).items() if k.startswith("FI_") and isinstance(v, str)]
    names += list(nvml_fields.FI_LINK_CRC_DATA)
    for name in names:
        assert isinstance(getattr(pynvml, name), int), name


def test_every_wrapper_the_collector_calls_is_backed_by_the_fake():
    """A wrapper the collector calls must resolve to a C symbol the fake implements (else the
    simulator would silently answer FunctionNotFound and the path would go untested)."""
    fake = set(FAKE_SYMBOLS)
    for name in _names_used_by_collector():
        obj = getattr(pynvml, name)
        if not (name.startswith("nvml") and callable(obj)) or name in ("nvmlInit", "nvmlShutdown"):
            continue
        src = inspect.getsource(obj)
        syms = set(_symbols_reached(name, src))
        assert syms & fake, f"{name} reaches {syms}, none implemented by the fake"


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
