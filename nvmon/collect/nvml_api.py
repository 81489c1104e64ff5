"""The NVML chokepoint: every call nvmon makes into the pynvml bindings, and every name it looks
up in them, goes through the `Api` made once per pynvml module (the real one or a simulated copy).

Names. `pyproject.toml` accepts a range of nvidia-ml-py releases, and the bindings grow over them
(`nvml_fields.ADDED`). `Api` resolves each function nvmon calls by purpose (`nvml_fields.FUNCTIONS`:
newest name first, then older names that answer the same question with the same arguments, e.g.
`nvmlDeviceGetTemperatureV` → `nvmlDeviceGetTemperature`) once, and field-id constants on first use.
A name the installed bindings lack, with no older one to fall back on, makes its metric
*unsupported*: logged once per process, listed in the sample's `nvml.capabilities.bindings`, and a
field id never requested — never an AttributeError.

Calls. `Api.call(fn, *args)` gives the value, or one of three `NoValue`s, never raising for NVML:

* `Unsupported` — NVML_ERROR_NOT_SUPPORTED or FUNCTION_NOT_FOUND, or a function the bindings lack
  (`ABSENT`): a missing capability, not asked again;
* `Lost` — NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus (never reported as unsupported);
* `Failed` — any other NVML error, with its code and text: a note, and asked again later.

One `isinstance(v, NoValue)` tells a value from the rest (NVML values are ints, floats, strings,
bytes or ctypes structures, never a NoValue).
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import types
from collections.abc import Callable
from typing import Any

from nvmon.collect.nvml_fields import FUNCTIONS

log = logging.getLogger("nvmon.collect")

# Names already logged as absent: once per process, though every simulated node has its own module.
_logged: set[str] = set()


class NoValue:
    """What an NVML call gave instead of a value; `error` is pynvml's exception (None: `ABSENT`)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception | None = None):
        self.error = error

    @property
    def code(self) -> int | None:
        """The nvmlReturn_t code, when NVML answered."""
        return getattr(self.error, "value", None)

    def __str__(self) -> str:
        return str(self.error) if self.error is not None else "not in the installed nvidia-ml-py"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self})"


class Unsupported(NoValue):
    """The GPU, the driver or the bindings cannot answer this query: a missing capability."""

    __slots__ = ()


class Lost(NoValue):
    """The GPU is lost (NVML_ERROR_GPU_IS_LOST)."""

    __slots__ = ()


class Failed(NoValue):
    """Any other NVML error: worth a note, and asking again."""

    __slots__ = ()


ABSENT = Unsupported()  # the function is not in the installed bindings: no NVML call was made


@functools.cache
def bindings_version() -> str:
    """The installed nvidia-ml-py release (simulated modules are copies of the same file)."""
    try:
        return importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class Api:
    """One pynvml module as nvmon uses it. `fn[purpose]`: the resolved function or None (absent);
    `const(name, purpose)`: a constant or None (absent); `call(fn, *args)`: a typed outcome;
    `absent`: {missing name: the purpose it costs}, for the sample's capabilities."""

    def __init__(self, nv: types.ModuleType):
        self.nv = nv
        self.absent: dict[str, str] = {}
        self._consts: dict[str, int | None] = {}
        # Every pynvml since 2.285 has these classes (tests/test_sim_surface.py, on the floor too).
        self._unsupported = (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound)
        self._lost = nv.NVMLError_GpuIsLost
        self._error = nv.NVMLError
        self.fn: dict[str, Callable | None] = {what: self._resolve(what, names) for what, names in FUNCTIONS.items()}

    def _resolve(self, what: str, names: tuple[str, ...]) -> Callable | None:
        for name in names:
            fn = getattr(self.nv, name, None)
            if callable(fn):
                if name != names[0] and names[0] not in _logged:
                    _logged.add(names[0])
                    log.info("nvidia-ml-py %s has no %s: %s is read with %s", bindings_version(), names[0], what, name)
                return fn
        self._absent(names[0], what)
        return None

    def const(self, name: str, what: str) -> int | None:
        """A constant (a field id) by name; None, logged once, when the bindings lack it."""
        try:
            return self._consts[name]
        except KeyError:
            pass
        value = getattr(self.nv, name, None)
        if not isinstance(value, int):
            value = None
            self._absent(name, what)
        self._consts[name] = value
        return value

    def struct(self, name: str) -> type | None:
        """A ctypes structure class of the bindings by name, or None when they lack it. Not logged:
        callers of this keep their own copy of the C layout (nvmon.collect.fabric), nothing is lost."""
        cls = getattr(self.nv, name, None)
        return cls if isinstance(cls, type) else None

    def _absent(self, name: str, what: str) -> None:
        self.absent[name] = what
        if name not in _logged:
            _logged.add(name)
            log.warning("nvidia-ml-py %s has no %s: %s is reported unsupported (a newer nvidia-ml-py reads it)",
                        bindings_version(), name, what)

    def call(self, fn: Callable | None, *args) -> Any:
        """`fn(*args)`'s value, or Unsupported / Lost / Failed (see the module docstring)."""
        if fn is None:
            return ABSENT
        try:
            return fn(*args)
        except self._unsupported as e:
            return Unsupported(e)
        except self._lost as e:
            return Lost(e)
        except self._error as e:
            return Failed(e)
