"""symgpu's CUDA backend.

Importing this package never imports PyCUDA: names load lazily (PEP 562), and the runtime
modules import PyCUDA only once a GPU context starts.  That keeps ``import symgpu`` working on
machines with no GPU, no driver and no PyCUDA.
"""
from __future__ import annotations

import importlib
from typing import Any

# --------------------------------------------------------------------------- runtime layer
# name -> module that defines it (symgpu.gpu.<module>)
_RUNTIME = {
    "GpuArray": "array", "empty": "array", "zeros": "array", "to_gpu": "array",
    "asarray": "array", "from_dlpack": "array", "from_cuda_array_interface": "array",
    "GpuContext": "context", "get_context": "context", "gpu_available": "context",
    "why_unavailable": "context", "init_default_context": "context",
    "register_context": "context", "GpuMemoryError": "pool", "CompileError": "compiler",
}

# --------------------------------------------------------------------------- graph layer
# Types, transfer ops and rewrites (type.py, basic_ops.py, ...) register their exports here,
# in the same name -> module form, so they stay lazy too.
_GRAPH: dict[str, str] = {}

_LAZY = {**_RUNTIME, **_GRAPH}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
