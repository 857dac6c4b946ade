"""Markers for tests that need a GPU or nvcc (imported by test modules; no conftest needed),
a fake device context for thunk tests that run on the CPU, and virtual sm_90 contexts for
tests that build and render GPU graphs without one.

``requires_gpu`` marks a test ``gpu`` and skips it, with ``why_unavailable()`` as the reason,
where no usable GPU is present; ``requires_nvcc`` marks ``nvcc`` and skips without nvcc.
"""
from __future__ import annotations

import shutil
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

import pytest

from symgpu.gpu.runtime.context import (gpu_available, register_context, unregister_context,
                                why_unavailable)

F = TypeVar("F", bound=Callable)

_GPU_SKIP = pytest.mark.skipif(not gpu_available(),
                               reason=f"no usable GPU here: {why_unavailable() or 'unknown'}")
_NVCC_SKIP = pytest.mark.skipif(shutil.which("nvcc") is None,
                                reason="nvcc is not on PATH (install the CUDA toolkit to run "
                                       "kernel-compilation tests)")


def requires_gpu(obj: F) -> F:
    """Mark ``obj`` (a test function or class) ``gpu`` and skip it without a usable GPU."""
    return pytest.mark.gpu(_GPU_SKIP(obj))


def requires_nvcc(obj: F) -> F:
    """Mark ``obj`` ``nvcc`` and skip it where nvcc is not on PATH."""
    return pytest.mark.nvcc(_NVCC_SKIP(obj))


@contextmanager
def real_default_gpu() -> Iterator[object]:
    """The machine's first GPU as symgpu's default context for the block (asserted real,
    not virtual); whatever was the default before is put back."""
    from symgpu.gpu.runtime import context as gctx
    ctx = gctx.start_device("cuda0")
    assert not ctx.virtual and ctx.stream_handle, "these tests must run on a real GPU"
    prev = gctx.get_context(None) if None in gctx.context_names() else None
    gctx.register_context(None, ctx)
    try:
        yield ctx
    finally:
        if prev is not None:
            gctx.register_context(None, prev)
        else:
            gctx.unregister_context(None)


@contextmanager
def on_the_cpu() -> Iterator[None]:
    """No default GPU context for the block, and device=cpu: functions compiled (and shared
    variables made) inside stay on the host, as a GPU test's reference must.  (With the
    ``cuda`` fixture's default context registered, device=cpu alone still moves graphs to
    the GPU: placement follows the registered context.)"""
    from symgpu.config import config
    from symgpu.gpu.runtime import context as gctx
    prev = gctx.get_context(None) if None in gctx.context_names() else None
    unregister_context(None)
    try:
        with config.change_flags(device="cpu"):
            yield
    finally:
        if prev is not None:
            register_context(None, prev)


def virtual_context(name: str):
    """A module-scoped autouse fixture that registers the virtual context `name` (an sm_90
    device: graphs are built and kernels rendered and compiled, nothing runs). Assign it to
    a module-level name in the test module."""
    @pytest.fixture(scope="module", autouse=True)
    def fixture():
        ctx = register_context(name, device="cuda0", arch="sm_90")
        yield ctx
        unregister_context(name)
    return fixture


def gpu_vector_maker(name: str) -> Callable:
    """gvar(dtype, bcast=(False,)): a fresh GPU variable on the context `name`."""
    from symgpu.gpu.placement.type import GpuArrayType

    def gvar(dtype: str, bcast: tuple = (False,)) -> object:
        return GpuArrayType(dtype, bcast, name)()
    return gvar


def recording_loader(calls: list) -> Callable:
    """A stand-in for ``launch.load_kernels``: it renders the source (rendering must work)
    and returns kernels whose launches check their argument format and append (name, grid,
    block, args) to `calls`."""
    import struct

    class FakeKernel:
        def __init__(self, name, fmt):
            self.name, self.fmt = name, fmt

        def fast_launcher(self):
            def go(grid, block, *args):
                struct.pack("@" + self.fmt, *args)       # the format matches the arguments
                calls.append((self.name, grid, block, args))
            return go

    def fake_load(context, key, source_factory, formats, options=()):
        source_factory()
        return {n: FakeKernel(n, f) for n, f in formats.items()}
    return fake_load


def fake_kernel_device(monkeypatch, calls: list) -> "FakeCtx":
    """A FakeCtx that GPU elementwise/reduction thunks are built against, their kernels
    recording each launch in `calls` (see `recording_loader`)."""
    import symgpu.gpu.runtime.codegen.launch as launch
    import symgpu.gpu.ops.careduce as gcareduce
    import symgpu.gpu.ops.elemwise as gelem
    ctx = FakeCtx()
    monkeypatch.setattr(launch, "load_kernels", recording_loader(calls))
    for module in (gelem, gcareduce):     # the elementwise and reduction thunks
        monkeypatch.setattr(module, "_context", lambda name: ctx)
    return ctx


def fake_reduce_device(monkeypatch, sms: int):
    """A fake kernel device (fake_kernel_device) of `sms` multiprocessors for planning
    reductions: (its context, the launches recorded); the one-pass kernels' counter fills
    are no-ops."""
    import symgpu.gpu.runtime.codegen.launch as launch
    from symgpu.gpu.runtime.array import GpuArray
    calls: list = []
    ctx = fake_kernel_device(monkeypatch, calls)
    monkeypatch.setattr(launch, "sm_count", lambda c: sms)
    monkeypatch.setattr(GpuArray, "fill", lambda self, v: self)
    return ctx, calls


def fake_gpu_array(ctx, shape, dtype="float32", strides=None, ptr=None):
    """A GpuArray header on `ctx`'s fake pool (C-contiguous unless `strides` are given)."""
    import numpy as np
    from symgpu.gpu.runtime.array import GpuArray, c_strides
    a = GpuArray.__new__(GpuArray)
    dt = np.dtype(dtype)
    nbytes = max(dt.itemsize * int(np.prod(shape)), 1)
    a._set(ctx, ptr if ptr is not None else ctx.pool.allocate(nbytes).ptr, tuple(shape),
           tuple(strides) if strides else c_strides(shape, dt.itemsize), dt, object())
    return a


def thunk_over(node, values):
    """`node`'s thunk over fresh cells holding `values`; returns (thunk, storage map)."""
    storage = {v: [x] for v, x in zip(node.inputs, values)}
    storage.update({v: [None] for v in node.outputs})
    return node.op.make_thunk(node, storage, {}, []), storage


def compile_for_sm90(source: str, compiledir, arch: str = "sm_90") -> bytes:
    """The cubin nvcc makes of `source` for sm_90 (or `arch`), compiled afresh in
    `compiledir`."""
    from symgpu.config import config
    from symgpu.gpu.runtime import compiler
    compiler.clear_memory_cache()
    with config.change_flags(compiledir=str(compiledir), compile_log=False,
                             **{"nvcc.flags": ""}):
        _, cubin, _ = compiler.compile_to_cubin(source, (), arch)
    compiler.clear_memory_cache()
    return cubin


def check_on_gpu(inputs, out, values, want, cpu_names, rtol=None):
    """Compile `out`, assert no op named in `cpu_names` stayed on the host, and compare the
    result with `want` (dtype and shape too; floats within rtol). Returns the function."""
    import numpy as np
    from symgpu import function
    f = function(inputs, out, on_unused_input="ignore")
    names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
    assert not names & cpu_names, names
    got, want = np.asarray(f(*values)), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (
        got.shape, got.dtype, want.shape, want.dtype)
    if got.dtype.kind == "f":
        tol = rtol or (1e-5 if got.dtype == np.float32 else 1e-12)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got, want)
    return f


class FakePool:
    """Hands out distinct fake device addresses (and records the sizes asked for)."""

    def __init__(self) -> None:
        self.next = 1 << 20
        self.sizes: list[int] = []

    def allocate(self, nbytes: int):
        from symgpu.gpu.runtime.pool import Block, size_class
        ptr, self.next = self.next, self.next + size_class(nbytes) + 4096
        self.sizes.append(nbytes)
        return Block(ptr, size_class(nbytes), None, None)


class FakeCtx:
    """A context with a FakePool whose thunks can be built (not run) without a GPU."""

    virtual, name, arch, pycuda_device, stream_handle = False, "fake", "sm_90", None, 0

    def __init__(self) -> None:
        self.pool = FakePool()

    def activate(self) -> "FakeCtx":
        return self


#: GPU ops that launch nothing (views and shape reads)
NON_LAUNCHING = {"GpuShape_i", "GpuShape", "GpuDimShuffle", "GpuReshape"}


def planned_steps(nodes) -> list[tuple[str, list]]:
    """The CUDA-graph runner's plan (graph_plan.plan_steps) of a function compiled on a
    virtual context, with the flags the GPU thunks carry on the GPU machine: device ops are
    capturable, views and shape reads capture without launching, transfers to the host are
    not capturable and batch their syncs. ``(kind, [node, ...])`` per step."""
    from symgpu.gpu.exec.graph_plan import plan_steps
    names = [type(n.op).__name__ for n in nodes]
    capt = [nm.startswith("Gpu") and nm != "HostFromGpu" for nm in names]
    launches = [c and nm not in NON_LAUNCHING for c, nm in zip(capt, names)]
    batch = [nm == "HostFromGpu" for nm in names]
    return [(k, [nodes[i] for i in idx]) for k, idx in plan_steps(nodes, capt, launches, batch)]


def planned_step_kinds(nodes) -> list[str]:
    """The kinds of planned_steps' steps."""
    return [k for k, _ in planned_steps(nodes)]


def assert_one_segment(nodes) -> None:
    """Host work only before the step's one captured segment, syncs only after it."""
    kinds = planned_step_kinds(nodes)
    assert kinds.count("segment") == 1, kinds
    first = kinds.index("segment")
    assert all(k == "plain" for k in kinds[:first]) and \
        all(k == "batch" for k in kinds[first + 1:]), kinds


def tutorial_minibatch_step(**flags):
    """The deep-learning tutorials' minibatch MLP step on a virtual GPU context: data sliced by
    an index from GPU variables, the NLL's pairs gather, SGD outputs (compiled with `flags`)."""
    import symgpu.tensor as T
    from symgpu import function
    from symgpu.config import config
    from symgpu.gpu.placement.rewriting import virtual_context
    from symgpu.gpu.placement.type import GpuArrayType
    gpu = lambda dt, *bc: GpuArrayType(dt, bc, None)()   # noqa: E731
    with config.change_flags(floatX="float32", **flags), virtual_context(None):
        sx, sy = gpu("float32", False, False), gpu("int32", False)
        w1, w2 = gpu("float32", False, False), gpu("float32", False, False)
        b1, b2 = gpu("float32", False), gpu("float32", False)
        i = T.lscalar("i")
        x, y = sx[i * 128:(i + 1) * 128], sy[i * 128:(i + 1) * 128]
        p = T.nnet.softmax(T.dot(T.tanh(T.dot(x, w1) + b1), w2) + b2)
        cost = -T.mean(T.log(p)[T.arange(y.shape[0]), y])
        ps = [w1, b1, w2, b2]
        return function([i, sx, sy] + ps,
                        [cost] + [q - 0.01 * g for q, g in zip(ps, T.grad(cost, ps))])


def example_module(name: str):
    """The module examples/<name>.py (imported once; examples/ is on the path only meanwhile)."""
    import importlib
    import sys
    from pathlib import Path
    examples = str(Path(__file__).resolve().parents[1] / "examples")
    sys.path.insert(0, examples)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(examples)
