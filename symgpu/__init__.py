"""symgpu: a symbolic tensor-graph compiler in the tradition of Theano, with a CUDA backend.

Build graphs from symbolic variables (`symgpu.tensor`), compile them with `function`, and run
them on the CPU or, with `device=cuda`, on an NVIDIA GPU. Importing needs no GPU or PyCUDA.

This module is the top layer (docs/internals.md): it may import anything, nothing inside the
package imports it. What a CPU user needs loads now; loops (`scan`, `ifelse`) load on first
use (PEP 562), and the GPU backend (`symgpu.gpu`) as soon as the flags ask for a GPU.
"""
from __future__ import annotations

import importlib
from typing import Any

from symgpu.config import config
from symgpu.graph.basic import Apply, Constant, Variable
from symgpu.graph.op import Op
from symgpu.compile.io import In, Out
from symgpu.compile.function import function
from symgpu.compile.sharedvalue import shared
import symgpu.tensor as tensor
from symgpu.compile.mode import Mode  # Theano's theano.Mode
import symgpu.gradient as gradient  # theano.gradient.jacobian, hessian...; installs T.grad
from symgpu.gradient import grad
import symgpu.printing as printing
from symgpu.compile.explain import explain
from symgpu.printing import pp  # Theano's theano.pp
from symgpu import theano_paths

theano_paths.install()  # Theano's module paths (symgpu.gof, symgpu.gpu.basic_ops...) resolve

__version__ = "0.1.0"

#: public name -> (module, attribute or None for the module itself), loaded on first use
_LAZY: dict[str, tuple[str, str | None]] = {
    "scan": ("symgpu.scan", None),  # a callable module: symgpu.scan(...) and symgpu.scan.until
    "map": ("symgpu.scan", "map"),
    "reduce": ("symgpu.scan", "reduce"),
    "foldl": ("symgpu.scan", "foldl"),
    "foldr": ("symgpu.scan", "foldr"),
    "scan_checkpoints": ("symgpu.scan", "scan_checkpoints"),  # Theano's theano.scan_checkpoints
    "scan_module": ("symgpu.scan_module", None),  # Theano's paths: symgpu/theano_paths.py
    "gof": ("symgpu.gof", None),
    "gpuarray": ("symgpu.gpuarray", None),
    "ifelse": ("symgpu.ifelse", None),  # symgpu.ifelse.ifelse, the lazy branch
    "OpFromGraph": ("symgpu.builders", "OpFromGraph"),  # Theano's theano.OpFromGraph
    "clone": ("symgpu.compile.clone", "clone"),  # Theano's theano.clone
    "function_dump": ("symgpu.compile.function", "function_dump"),
    "dot": ("symgpu.tensor", "dot"),  # Theano's theano.dot
    "gpu": ("symgpu.gpu", None),
    "sparse": ("symgpu.sparse", None),  # Theano's theano.sparse (loads scipy.sparse)
    "sparse_grad": ("symgpu.sparse", "sparse_grad"),  # Theano's theano.sparse_grad
    "sandbox": ("symgpu.sandbox", None),
    "misc": ("symgpu.misc", None),
    "d3viz": ("symgpu.d3viz", None),  # Theano's theano.d3viz: interactive graph pages
    "mixed_precision": ("symgpu.mixed_precision", None),  # autocast, DynamicLossScale
    "change_flags": ("symgpu.config", "change_flags"),  # Theano's theano.change_flags
    "pprint": ("symgpu.printing", "pprint"),  # Theano's theano.pprint
    "compat": ("symgpu.compat", None),  # Theano's theano.compat (Python 2/3 helpers)
}

__all__ = ["config", "function", "shared", "grad", "In", "Out", "Apply", "Op", "Variable",
           "Constant", "tensor", "__version__", "explain", "pp", "Mode", "printing", "gradient",
           "scan", "map", "reduce", "foldl", "foldr", "OpFromGraph"]


def __getattr__(name: str) -> Any:
    entry = _LAZY.get(name)
    if entry is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # deferred: start-up: loops, the GPU package and Theano's paths load on first use
    module = importlib.import_module(entry[0])
    value = module if entry[1] is None else getattr(module, entry[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def _load_gpu_backend() -> None:
    """Register the GPU backend (types, transfers, placement passes; no PyCUDA)."""
    importlib.import_module("symgpu.gpu")  # deferred: start-up: only when a GPU is asked for


config.on_device_request(_load_gpu_backend)  # now if the flags ask for a GPU, else when they do
