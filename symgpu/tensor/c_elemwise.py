"""Elemwise nodes of fused chains, and full float sums, run as compiled C loops
(``symgpu.scalar.ccode``).

Why: NumPy evaluates a fused Composite one ufunc per step, each with its dispatch and its
temporary; on the arrays of a training step that overhead is most of the time. The C loop
computes all outputs in one pass, vectorised.

Which nodes: Composites (two or more steps; a lone ufunc gains nothing and would cost a
compile) whose dtypes and rows ``ccode.supports``, with every input either of the output's
broadcast pattern or broadcastable in every dimension (read as a scalar). At run time the
full inputs must be C-contiguous and of one shape; any other call, and every call when no C
compiler is usable, runs the node's NumPy thunk (``fallback``), which also raises the usual
errors. Compiling uses the ``cxx`` flag; FAST_COMPILE never compiles (``c_kernels_allowed``).
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

import numpy as np

from symgpu.scalar import ccode
from symgpu.scalar.composite import Composite

__all__ = ["c_elemwise_thunk", "c_sum_thunk", "allow_c_kernels", "c_kernels_enabled"]

_allowed: ContextVar[bool] = ContextVar("symgpu_c_kernels_allowed", default=True)
_warned: set[str] = set()


@contextmanager
def allow_c_kernels(allowed: bool) -> Iterator[None]:
    """Within the block, Elemwise thunks compile C kernels only if `allowed` (modes use it)."""
    token = _allowed.set(allowed)
    try:
        yield
    finally:
        _allowed.reset(token)


def c_kernels_enabled() -> bool:
    """Whether thunks made now may use C kernels (mode allows, compiler and runtime usable)."""
    if not _allowed.get():
        return False
    from symgpu.link import c_runtime
    return c_runtime.runner() is not None


def _kinds(node) -> str | None:
    """'f' (full) or 's' (scalar) per input, or None when an input is partly broadcast."""
    out = node.outputs[0].type.broadcastable
    kinds = []
    for v in node.inputs:
        b = v.type.broadcastable
        if all(b):
            kinds.append("s")
        elif b == out:
            kinds.append("f")
        else:
            return None
    return "".join(kinds)


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _kernel_address(source: str, what: object) -> int | None:
    """The compiled kernel of `source` (libmvec first where there is one); None, with a
    warning naming `what`, when it does not compile, so the node runs on NumPy."""
    from symgpu.link import cc
    attempts = [(("-DSYMGPU_MVEC",), ("mvec", "m"))] if cc.has_libmvec() else []
    attempts.append(((), ("m",)))
    error = None
    for defines, libs in attempts:
        try:
            lib = cc.load_library(source, (*cc.OPTIMIZE_FLAGS, *defines), libs)
            return _address(lib)
        except cc.CCompileError as exc:
            error = exc
    _warn_once(f"symgpu: the C kernel of {what} did not compile, so it runs on NumPy: {error}")
    return None


def _address(lib) -> int:
    import ctypes
    return ctypes.cast(getattr(lib, ccode.SYMBOL), ctypes.c_void_p).value


def c_elemwise_thunk(node, storage_map: dict, fallback: Callable) -> Callable | None:
    """A thunk running `node` through its C kernel (`fallback` for layouts it does not
    take), or None when the node is not one for C or C kernels are off."""
    composite = node.op.scalar_op
    if (not isinstance(composite, Composite) or len(composite.steps) < 2
            or not ccode.supports(composite) or not c_kernels_enabled()):
        return None
    kinds = _kinds(node)
    from symgpu.link import c_runtime
    if kinds is None or len(node.inputs) + len(node.outputs) > c_runtime.MAX_ARRAYS:
        return None
    address = _kernel_address(ccode.elemwise_source(composite, kinds), composite)
    if address is None:
        return None
    return _generate(c_runtime.runner(), address, node, kinds, storage_map, fallback)


def c_sum_thunk(node, storage_map: dict, fallback: Callable) -> Callable | None:
    """A thunk for a sum over every axis of a float32/float64 array (the node's input and
    output dtype alike) through the pairwise-sum kernel; `fallback` for strided inputs."""
    (x,), (out,) = node.inputs, node.outputs
    if (x.dtype not in ("float32", "float64") or out.dtype != x.dtype or out.ndim != 0
            or not c_kernels_enabled()):
        return None
    address = _kernel_address(ccode.sum_source(x.dtype), node.op)
    if address is None:
        return None
    from symgpu.link import c_runtime
    run, empty, dtype = c_runtime.runner(), np.empty, out.dtype
    tags = f"f{np.dtype(dtype).itemsize}o{np.dtype(dtype).itemsize}".encode()
    cin, cout = storage_map[x], storage_map[out]

    def thunk():
        r = empty((), dtype)
        if run(address, tags, cin[0], r):
            cout[0] = r
        else:
            fallback()
    thunk.op, thunk.node, thunk.lazy = node.op, node, False
    thunk.inputs, thunk.outputs = [cin], [cout]
    thunk.c_kernel, thunk.fallback = address, fallback
    return thunk


def _generate(run, address: int, node, kinds: str, storage_map: dict, fallback: Callable):
    """A closure written for this node's arity: reads the cells, allocates the outputs
    (or takes the overwritten inputs), runs the kernel or else `fallback`."""
    nin, nout = len(node.inputs), len(node.outputs)
    inplace = dict(node.op.inplace_pattern)
    sizes = [np.dtype(v.dtype).itemsize for v in [*node.inputs, *node.outputs]]
    tags = "".join(k + str(s) for k, s in zip(kinds + "w" * nout, sizes)).encode()
    shape_from = f"a{kinds.index('f')}" if "f" in kinds else "a0"
    src = ["def make(in_cells, out_cells):"]
    src += [f"    c{k} = in_cells[{k}]" for k in range(nin)]
    src += [f"    o{j} = out_cells[{j}]" for j in range(nout)]
    src += ["    def thunk():"]
    src += [f"        a{k} = c{k}[0]" for k in range(nin)]
    src += [f"        shape = {shape_from}.shape"]
    for j, v in enumerate(node.outputs):
        src.append(f"        r{j} = a{inplace[j]}" if j in inplace
                   else f"        r{j} = empty(shape, '{v.dtype}')")
    args = ", ".join([f"a{k}" for k in range(nin)] + [f"r{j}" for j in range(nout)])
    src += [f"        if run(address, tags, {args}):"]
    src += [f"            o{j}[0] = r{j}" for j in range(nout)]
    src += ["        else:", "            fallback()", "    return thunk"]
    ns = {"run": run, "address": address, "tags": tags, "empty": np.empty,
          "fallback": fallback}
    exec(compile("\n".join(src), f"<C thunk {node.op}>", "exec"), ns)
    thunk = ns["make"]([storage_map[v] for v in node.inputs],
                       [storage_map[v] for v in node.outputs])
    thunk.op, thunk.node, thunk.lazy = node.op, node, False
    thunk.inputs = [storage_map[v] for v in node.inputs]
    thunk.outputs = [storage_map[v] for v in node.outputs]
    thunk.c_kernel = address
    thunk.fallback = fallback
    return thunk
