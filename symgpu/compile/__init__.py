"""Compiling graphs: modes (`Mode`, `DebugMode`, `MonitorMode`, `NanGuardMode`),
`In`/`Out`, shared variables and the profiler. Names load on first use (Theano's
``theano.compile.MonitorMode`` spelling) so importing this package stays cheap."""
from __future__ import annotations

import importlib
from typing import Any

#: public name -> module of this package that defines it
#: (`function` is not listed: `symgpu.compile.function` is the module; use `symgpu.function`)
_LAZY = {
    "Function": "function", "In": "io", "Out": "io",
    "Mode": "mode", "get_mode": "mode", "FAST_RUN": "mode", "FAST_COMPILE": "mode",
    "DebugMode": "debugmode", "MonitorMode": "monitormode", "NanGuardMode": "monitormode",
    "detect_nan": "monitormode", "shared": "sharedvalue", "SharedVariable": "sharedvalue",
    "ProfileStats": "profiling",
    "pfunc": "shared_rebuild", "rebuild_collect_shared": "shared_rebuild",  # theano.compile.pfunc
    "DeepCopyOp": "deepcopy", "deep_copy_op": "deepcopy",  # theano.compile.ops
    "get_default_mode": "mode", "config": "mode", "UnusedInputError": "function",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # deferred: Theano's theano.compile.X names resolve lazily (PEP 562), as documented
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # kept: Theano's path theano.compile.pfunc stays callable as pfunc
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
