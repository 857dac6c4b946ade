"""Elemwise nodes of fused chains, and full float sums, run as compiled C loops
(``symgpu.scalar.ccode``).

Why: NumPy evaluates a fused Composite one ufunc per step, each with its dispatch and its
temporary; on the arrays of a training step that overhead is most of the time. The C loop
computes all outputs in one pass, vectorised.

Which nodes: Composites (two or more steps; a lone ufunc gains nothing and would cost a
compile) whose dtypes and rows ``ccode.supports``. Inputs of the output's broadcast pattern
or broadcastable in every dimension (read as scalars) take the flat kernel; partly broadcast
inputs (a row added to a matrix, a column subtracted), up to 4 dimensions, take the
broadcasting one. At run time every array must be C-contiguous and of the shapes its
pattern says; any other call, and every call when no C compiler is usable, runs the node's
NumPy thunk (``fallback``), which also raises the usual errors. Compiling uses the ``cxx`` flag; FAST_COMPILE never compiles (``allow_c_kernels``).
"""
from __future__ import annotations

import concurrent.futures
import os
import warnings
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

import numpy as np

from symgpu.link import c_runtime, cc, vm
from symgpu.scalar import ccode
from symgpu.scalar.composite import Composite

__all__ = ["c_elemwise_thunk", "c_sum_thunk", "allow_c_kernels", "c_kernels_allowed",
           "c_kernels_enabled"]

_allowed: ContextVar[bool] = ContextVar("symgpu_c_kernels_allowed", default=True)
_failed: set[str] = set()  # sources that did not compile in this process


@contextmanager
def allow_c_kernels(allowed: bool) -> Iterator[None]:
    """Within the block, thunks compile C kernels only if `allowed` and no enclosing block
    said no (modes use it: FAST_COMPILE says no)."""
    token = _allowed.set(_allowed.get() and allowed)
    try:
        yield
    finally:
        _allowed.reset(token)


def c_kernels_allowed() -> bool:
    """Whether thunks made now may compile C at all: the mode allows it (`allow_c_kernels`)
    and the ``cxx`` flag names a compiler. Enough for C loaded with ctypes (the Philox
    generator); the kernels here need the runtime too (`c_kernels_enabled`)."""
    if not _allowed.get():
        return False
    return cc.compiler() is not None


def c_kernels_enabled() -> bool:
    """Whether thunks made now may use C kernels (mode allows, compiler and runtime usable)."""
    if not c_kernels_allowed():
        return False
    return c_runtime.runner() is not None


def _kinds(node) -> str:
    """Per input: 's' broadcastable in every dimension (read as a scalar), 'f' of the
    output's pattern, 'b' partly broadcast."""
    out = node.outputs[0].type.broadcastable
    return "".join("s" if all(v.type.broadcastable) else "f" if v.type.broadcastable == out
                   else "b" for v in node.inputs)


def _attempts() -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(extra flags, libraries) to try in turn: with libmvec's SIMD math first where it is."""
    plain = ((), ("m",))
    return [(("-DSYMGPU_MVEC",), ("mvec", "m")), plain] if cc.has_libmvec() else [plain]


def _kernel_address(source: str, what: object) -> int | None:
    """The compiled kernel of `source`; None, with a warning naming `what`, when it does not
    compile, so the node runs on NumPy."""
    if source in _failed:
        return None
    error = None
    for defines, libs in _attempts():
        try:
            return cc.kernel_address(source, ccode.SYMBOL, (*cc.OPTIMIZE_FLAGS, *defines), libs)
        except cc.CCompileError as exc:
            error = exc
    _failed.add(source)  # once: not rebuilt, not warned about again, in this process
    warnings.warn(f"symgpu: the C kernel of {what} did not compile, so it runs on NumPy: "
                  f"{error}", RuntimeWarning, stacklevel=3)
    return None


def c_source(node) -> str | None:
    """The C source `node`'s kernel is built from, or None when the node stays on NumPy:
    an Elemwise of a Composite of two or more C-able steps (inputs full or scalar; or, up to
    MAX_BROADCAST_NDIM dimensions, any broadcast patterns), or a sum of every axis of a float32/float64 array. (Whether a compiler is usable is
    asked separately: `c_kernels_enabled`.)"""
    op = node.op
    kind = getattr(op, "c_kernel_kind", None)  # Elemwise and CAReduce declare it
    if kind == "elemwise":
        composite = op.scalar_op
        if (not isinstance(composite, Composite) or len(composite.steps) < 2
                or len(node.inputs) + len(node.outputs) > c_runtime.MAX_ARRAYS
                or not ccode.supports(composite)):
            return None
        kinds = _kinds(node)
        if "b" not in kinds:
            return ccode.elemwise_source(composite, kinds)
        if not 2 <= node.outputs[0].ndim <= ccode.MAX_BROADCAST_NDIM:
            return None
        return ccode.broadcast_source(composite,
                                      tuple(v.type.broadcastable for v in node.inputs))
    if kind == "reduce" and op.scalar_op.name == "add":
        (x,), (out,) = node.inputs, node.outputs
        if x.dtype in ("float32", "float64") and out.dtype == x.dtype and out.ndim == 0:
            return ccode.sum_source(x.dtype)
    return None


def c_elemwise_thunk(node, storage_map: dict, fallback: Callable) -> Callable | None:
    """A thunk running `node` through its C kernel (`fallback` for layouts it does not
    take), or None when the node is not one for C or C kernels are off."""
    if not node.inputs:       # constants fused after constant folding: no shape to read
        return None
    source = c_source(node)
    if source is None or not c_kernels_enabled():
        return None
    address = _kernel_address(source, node.op.scalar_op)
    if address is None:
        return None
    kinds = _kinds(node)
    if "b" in kinds:
        return _generate(c_runtime.sized_runner(), address, node, "f" * len(kinds),
                         storage_map, fallback, _broadcast_shape(node))
    return _generate(c_runtime.runner(), address, node, kinds, storage_map, fallback)


def _broadcast_shape(node) -> str:
    """Python for the output shape: each dimension's length read from the first input not
    broadcast along it (the kernel checks the others)."""
    dims = []
    for d in range(node.outputs[0].ndim):
        k = next((k for k, v in enumerate(node.inputs) if not v.type.broadcastable[d]), None)
        dims.append("1" if k is None else f"a{k}.shape[{d}]")
    return "(" + ", ".join(dims) + ",)"


def c_sum_thunk(node, storage_map: dict, fallback: Callable) -> Callable | None:
    """A thunk for a sum over every axis of a float32/float64 array (the node's input and
    output dtype alike) through the pairwise-sum kernel; `fallback` for strided inputs."""
    source = c_source(node)
    if source is None or not c_kernels_enabled():
        return None
    address = _kernel_address(source, node.op)
    if address is None:
        return None
    (x,), (out,) = node.inputs, node.outputs
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


def _generate(run, address: int, node, kinds: str, storage_map: dict, fallback: Callable,
              shape_expr: str | None = None):
    """A closure written for this node's arity: reads the cells, allocates the outputs
    (or takes the overwritten inputs), runs the kernel or else `fallback`. The outputs'
    shape is `shape_expr` (Python over the inputs a0, a1...), by default the first full
    input's."""
    nin, nout = len(node.inputs), len(node.outputs)
    inplace = dict(node.op.inplace_pattern)
    sizes = [np.dtype(v.dtype).itemsize for v in [*node.inputs, *node.outputs]]
    tags = "".join(k + str(s) for k, s in zip(kinds + "w" * nout, sizes)).encode()
    if shape_expr is None:
        shape_expr = f"a{kinds.index('f') if 'f' in kinds else 0}.shape"
    ins = ", ".join(f"a{k}" for k in range(nin))
    src = ["def make(in_cells, out_cells):"]
    src += [f"    c{k} = in_cells[{k}]" for k in range(nin)]
    src += [f"    o{j} = out_cells[{j}]" for j in range(nout)]
    src += [f"    def attempt({ins}):"]
    src += [f"        shape = {shape_expr}"]
    for j, v in enumerate(node.outputs):
        src.append(f"        r{j} = a{inplace[j]}" if j in inplace
                   else f"        r{j} = empty(shape, d{j})")
    args = ", ".join([f"a{k}" for k in range(nin)] + [f"r{j}" for j in range(nout)])
    src += [f"        if not run(address, tags, {args}):", "            return False"]
    src += [f"        o{j}[0] = r{j}" for j in range(nout)]
    src += ["        return True"]
    src += ["    def thunk():"]
    src += [f"        a{k} = c{k}[0]" for k in range(nin)]
    # strided views (an LSTM's gates are column blocks of one product) are packed and the
    # kernel tried again: a copy of each is far cheaper than the NumPy thunk's ufunc-by-ufunc
    # pass with its temporaries; shapes the kernel refuses go to the fallback and its errors
    src += [f"        if not attempt({ins}) and not (packable({ins}) and attempt("
            + ", ".join(f"packed(a{k})" for k in range(nin)) + ")):"]
    src += ["            fallback()", "    return thunk"]
    ns = {"run": run, "address": address, "tags": tags, "empty": np.empty,
          "fallback": fallback, "packed": _packed,
          "packable": _packable_for(set(inplace.values()))}
    ns.update({f"d{j}": np.dtype(v.dtype) for j, v in enumerate(node.outputs)})  # not parsed per call
    exec(compile("\n".join(src), f"<C thunk {node.op}>", "exec"), ns)
    thunk = ns["make"]([storage_map[v] for v in node.inputs],
                       [storage_map[v] for v in node.outputs])
    thunk.op, thunk.node, thunk.lazy = node.op, node, False
    thunk.inputs = [storage_map[v] for v in node.inputs]
    thunk.outputs = [storage_map[v] for v in node.outputs]
    thunk.c_kernel = address
    thunk.fallback = fallback
    return thunk


def _packed(a):
    """`a` C-contiguous (a copy only when it is a strided view)."""
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _packable_for(overwritten: set) -> Callable:
    """Whether packing strided inputs may help: some input is a strided NumPy view and no
    input the node overwrites is one (packing it would leave the view unwritten)."""
    def packable(*arrays) -> bool:
        strided = [k for k, a in enumerate(arrays)
                   if isinstance(a, np.ndarray) and not a.flags.c_contiguous]
        return bool(strided) and not overwritten.intersection(strided)
    return packable


def prefetch(fgraph, nodes: list) -> None:
    """``LINK_HOOKS`` entry: build the runtime and the function's missing kernels in
    parallel (the compiler is a subprocess, so threads suffice) before any thunk asks for
    one; a cold compile then waits for the slowest build, not for their sum. Failures are
    left to the thunks, which warn and fall back."""
    if not _allowed.get():
        return
    if cc.compiler() is None:
        return
    defines, libs = _attempts()[0]
    flags = (*cc.OPTIMIZE_FLAGS, *defines)
    sources = list(dict.fromkeys(s for s in map(c_source, nodes) if s is not None))
    jobs = [lambda s=s: cc.build_library(s, flags, libs) for s in sources
            if not cc.is_built(s, flags, libs)]
    if not sources or (not jobs and c_runtime.is_loaded()):
        return
    jobs.append(c_runtime.runner)
    if len(jobs) == 1:
        return
    with concurrent.futures.ThreadPoolExecutor(min(len(jobs), os.cpu_count() or 1)) as pool:
        for future in [pool.submit(job) for job in jobs]:
            try:
                future.result()
            except Exception:  # noqa: BLE001 - the node's own build raises and warns
                pass


def _register() -> None:
    if prefetch not in vm.LINK_HOOKS:
        vm.LINK_HOOKS.append(prefetch)


_register()
