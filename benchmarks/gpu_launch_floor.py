"""What one launch of the plain path (issue 18: at most ~5 us of host time per launched kernel)
is made of, each piece timed alone on the GPU machine: the host time of a bare kernel
launch, of cuBLAS's gemv and cuBLASLt's matmul called with ready arguments, of the pool's
allocation, of a small upload; beside them, a whole GpuElemwise / GpuGemv / GpuDot22 thunk.
The difference between a thunk and the floors it is made of is symgpu's own Python; PyTorch's
eager calls of the same work are the peer (their ratio is printed).

    python3 benchmarks/gpu_launch_floor.py
    python3 benchmarks/gpu_launch_floor.py --profile   # also cProfile of each whole thunk

Every figure is host time per call (no wait for the device inside the loop, one at its end),
the best of 5 loops.
"""
from __future__ import annotations

import ctypes
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("SYMGPU_FLAGS", "device=cuda,floatX=float32")

from gpu_seeds import say  # noqa: E402
from timing import profile_calls  # noqa: E402

EMPTY_KERNEL = ('extern "C" __global__ void sg_floor_empty(float *a, const float *b, '
                'unsigned long long n) { }')


def host_us(fn, sync, number: int = 3000, repeat: int = 5) -> float:
    """Best of ``repeat`` loops: host microseconds per call of ``fn``."""
    best = float("inf")
    for _ in range(repeat):
        sync()
        t = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t) / number)
        sync()
    return best * 1e6


def thunk_of(f, op_name: str):
    """The first thunk of ``f`` whose node's op class is ``op_name``, with the cells its
    inputs read filled by one plain run (the thunk can then run again and again)."""
    vm = f.vm
    for node, thunk in zip(vm.nodes, vm.thunks):
        if type(node.op).__name__ == op_name:
            break
    else:
        raise LookupError(f"no {op_name} in {[type(n.op).__name__ for n in vm.nodes]}")
    inputs = [vm.storage_map[v] for v in node.inputs]
    saved = {}

    def keep(vm):   # a profiler hook run once: every thunk runs, the node's inputs are kept
        for i, th in enumerate(vm.thunks):
            th()
            if vm.nodes[i] is node:
                saved["values"] = [c[0] for c in inputs]
    vm.profiler = keep
    f()
    vm.profiler = None

    def run():
        for cell, value in zip(inputs, saved["values"]):
            cell[0] = value
        thunk()
    return run


def main() -> None:
    import pycuda.driver as drv

    import symgpu
    import symgpu.tensor as T
    from symgpu import config
    from symgpu.gpu import init_default_context
    from symgpu.gpu.ops import blas, blaslt
    from symgpu.gpu.ops.elemwise import new_array
    from symgpu.gpu.runtime.codegen.launch import load_kernels
    ctx = init_default_context()
    assert ctx is not None and not ctx.virtual, "symgpu found no GPU"
    sync = ctx.synchronize
    say(f"host time per call on {ctx.devname}, microseconds")
    rows = []

    def row(label, fn, **kw):
        fn()
        rows.append((label, host_us(fn, sync, **kw)))
        say(f"  {rows[-1][1]:8.2f}  {label}")

    def noop():
        pass
    row("a Python call of an empty function (calibration)", noop)

    x = new_array(ctx, (400, 784), np.dtype("float32"))
    v = new_array(ctx, (784,), np.dtype("float32"))
    out = new_array(ctx, (400,), np.dtype("float32"))
    kernel = load_kernels(ctx, ("benchmarks.floor",), lambda: EMPTY_KERNEL,
                          {"sg_floor_empty": "PPQ"})["sg_floor_empty"]
    go = kernel.fast_launcher()
    grid, block = (1, 1, 1), (256, 1, 1)
    row("empty kernel, symgpu's fast launcher (3 arguments)",
        lambda: go(grid, block, out.ptr, x.ptr, 400))

    cb = blas.cublas()
    h = cb.handle(ctx)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    A, xv, yv = ctypes.c_void_p(x.ptr), ctypes.c_void_p(v.ptr), ctypes.c_void_p(out.ptr)
    gemv = cb.gemv["float32"]
    row("cublasSgemv_v2 400x784, host scalars, arguments ready",
        lambda: gemv(h, 1, 784, 400, ctypes.byref(one), A, 784, xv, 1, ctypes.byref(zero),
                     yv, 1))
    row("cublasSetPointerMode_v2 (host)", lambda: cb.pointer_mode(h, 0))

    a = new_array(ctx, (128, 784), np.dtype("float32"))
    w = new_array(ctx, (784, 512), np.dtype("float32"))
    d = new_array(ctx, (128, 512), np.dtype("float32"))
    if blaslt.lt_available("float32"):
        got = {}

        def lt_once():   # the problem and its plan as GpuDot22's thunk makes them
            blas._lt_gemm(ctx, "float32", blas.gemm_math_mode("float32"), 0, 0, 512, 128,
                          784, 512, 784, 512, w, a, d, ctypes.byref(one), ctypes.byref(zero),
                          False, got)
        row("GpuDot22's cuBLASLt call 128x784 @ 784x512 (_lt_gemm, memo warm)", lt_once)
    cg = cb.gemm["float32"]
    row("cublasSgemm_v2 128x784 @ 784x512, arguments ready",
        lambda: cg(h, 0, 0, 512, 128, 784, ctypes.byref(one), ctypes.c_void_p(w.ptr), 512,
                   ctypes.c_void_p(a.ptr), 784, ctypes.byref(zero), ctypes.c_void_p(d.ptr),
                   512))

    pool = ctx.pool
    row("pool allocate + release, 1600 bytes", lambda: pool.allocate(1600))
    f32 = np.dtype("float32")
    row("new_array (400,) float32 + release", lambda: new_array(ctx, (400,), f32))
    host8 = np.zeros(1, "int64")
    dev8 = new_array(ctx, (1,), np.dtype("int64"))
    row("cuMemcpyHtoDAsync 8 bytes, pageable (pycuda)",
        lambda: drv.memcpy_htod_async(dev8.ptr, host8, ctx.stream))
    row("GpuArray.set of a 0-d int64", lambda: dev8.set(host8))

    xs = symgpu.shared(np.random.rand(400, 784).astype("float32"), name="x")
    ws = symgpu.shared(np.random.rand(784).astype("float32"), name="w")
    ms = symgpu.shared(np.random.rand(128, 784).astype("float32"), name="m")
    W1 = symgpu.shared(np.random.rand(784, 512).astype("float32"), name="W1")
    with config.change_flags(**{"gpuarray.cuda_graphs": False}):
        fe = symgpu.function([], symgpu.Out(T.exp(T.dot(xs, ws)), borrow=True))
        fd = symgpu.function([], symgpu.Out(T.tanh(T.dot(ms, W1)), borrow=True))
    thunks = {"gemv": ("GpuGemv thunk (dot(x, w), 400x784)", thunk_of(fe, "GpuGemv")),
              "exp": ("GpuElemwise thunk (exp of 400)", thunk_of(fe, "GpuElemwise")),
              "dot22": ("GpuDot22 thunk (128x784 @ 784x512)", thunk_of(fd, "GpuDot22"))}
    for label, fn in thunks.values():
        row(f"whole {label}", fn)
    ours = {name: t for name, (_, t) in zip(thunks, rows[-len(thunks):])}
    row("whole function: exp(dot(x, w)), graphs off", fe)
    row("whole function: tanh(dot(m, W1)), graphs off", fd)
    peers = torch_rows(sync)
    for name, peer in (("gemv", "torch.mv(out=)"), ("exp", "torch.exp(out=)"),
                       ("dot22", "torch.mm(out=)")):
        if name in peers:
            say(f"  {thunks[name][0].split()[0]} thunk / {peer}: "
                f"{ours[name] / peers[name]:.2f}")
    if "--profile" in sys.argv:
        for name, (_, fn) in thunks.items():
            say(f"== cProfile of the {name} thunk")
            profile_calls(fn, 3000, sync, top=12)


def torch_rows(sync) -> dict:
    """PyTorch's eager calls of the same work (host time per call), when it is installed."""
    try:
        import torch
    except ImportError as exc:
        say(f"  PyTorch: unavailable ({exc})")
        return {}
    dev = "cuda"
    x, v, y = (torch.rand(400, 784, device=dev), torch.rand(784, device=dev),
               torch.empty(400, device=dev))
    a, w, d = (torch.rand(128, 784, device=dev), torch.rand(784, 512, device=dev),
               torch.empty(128, 512, device=dev))
    s = torch.empty(400, device=dev)
    sync_t = torch.cuda.synchronize
    got = {}
    for name, label, fn in (
            ("gemv", "torch.mv(x, v, out=y) 400x784", lambda: torch.mv(x, v, out=y)),
            ("exp", "torch.exp(y, out=s) of 400", lambda: torch.exp(y, out=s)),
            ("exp_new", "torch.exp(y) of 400 (a new tensor)", lambda: torch.exp(y)),
            ("dot22", "torch.mm(a, w, out=d) 128x784 @ 784x512",
             lambda: torch.mm(a, w, out=d))):
        fn()
        got[name] = host_us(fn, sync_t)
        say(f"  {got[name]:8.2f}  PyTorch {torch.__version__}: {label}")
    return got


if __name__ == "__main__":
    main()
