"""Generated kernels and their launch path, timed on the GPU machine beside PyTorch.

Prints, in one run: the Python cost of one launch (ctypes cuLaunchKernel vs PyCUDA), the
per-call time of check1's exp (230,400 float32, result left on the device) at the thunk and
at the function level against ``torch.exp``, bandwidth of exp/add/sum over 2**26 floats against
torch and a device-to-device copy, and sgemm 4096^3.  Not a test: numbers, not assertions.
"""
from __future__ import annotations

import os
import sys
import time
import timeit

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def per_call(fn, number: int, sync=None, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        if sync is not None:
            sync()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def gpu_time(fn, ctx, iters: int = 20) -> float:
    """Seconds per call measured with CUDA events on the context's stream."""
    import pycuda.driver as drv
    fn()
    start, end = drv.Event(), drv.Event()
    start.record(ctx.stream)
    for _ in range(iters):
        fn()
    end.record(ctx.stream)
    end.synchronize()
    return end.time_since(start) / 1e3 / iters


def main() -> None:
    from symgpu.gpu import context as gctx
    from symgpu.gpu.array import to_gpu
    from symgpu.graph.fg import FunctionGraph
    from symgpu.link.vm import link
    from symgpu.gpu.elemwise import GpuElemwise, GpuCAReduce
    from symgpu.gpu.type import GpuArrayType
    from symgpu.gpu.codegen import launch
    from symgpu.scalar.basic import SCALAR_OPS as S
    import torch

    ctx = gctx.start_device("cuda0")
    gctx.register_context("bench", ctx)
    print(f"device: {ctx.devname}, {launch.sm_count(ctx)} SMs")
    n = 230400
    host = np.random.default_rng(0).random(n).astype("float32")
    x = to_gpu(host, ctx)
    tx = torch.from_numpy(host).cuda()
    sync = ctx.synchronize

    def thunk_for(op, *vals, bcast=None):
        vs = [GpuArrayType(v.dtype.name, (False,) * v.ndim, "bench")() for v in vals]
        out = op(*vs)
        fg = FunctionGraph(vs, [out], clone=False)
        storage = {v: [a] for v, a in zip(vs, vals)}
        vm = link(fg, storage, allow_gc=False)
        return vm, vm.thunks[-1], storage, out

    # -- launch cost, per backend, and where a call's time goes
    from symgpu.gpu.elemwise import new_array
    for backend in ("pycuda", "ctypes"):
        launch.BACKEND = backend
        launch.clear_cache()
        vm, th, storage, out = thunk_for(GpuElemwise(S["exp"]), x)
        th()
        sync()
        t = per_call(th, 5000, sync)
        ok = np.allclose(np.asarray(storage[out][0]), np.exp(host), rtol=1e-5)
        print(f"[{backend:6s}] exp thunk (230400 f32, output reused): {t * 1e6:6.2f} us/call  ok={ok}")
        cell = storage[out]

        def fresh():
            cell[0] = None
            th()
        t = per_call(fresh, 5000, sync)
        print(f"[{backend:6s}] exp thunk, output from the pool:        {t * 1e6:6.2f} us/call")
        thunk_obj = th.__closure__  # noqa: F841
        ks = launch.load_kernels(ctx, ("symgpu.elemwise", vm.nodes[-1].op.signature(vm.nodes[-1])),
                                 None, {"sg_contig_vec": "qPP"})
        go = ks["sg_contig_vec"].fast_launcher()
        o = storage[out][0]
        grid, block = (max(1, n // 1024), 1, 1), (256, 1, 1)
        t = per_call(lambda: go(grid, block, n, x.ptr, o.ptr), 5000, sync)
        print(f"[{backend:6s}] the launch alone:                       {t * 1e6:6.2f} us/call")
    launch.BACKEND = "pycuda"
    launch.clear_cache()
    dt = np.dtype("float32")
    shape, strides = (n,), (4,)
    t = per_call(lambda: new_array(ctx, shape, dt, strides, 4 * n), 20000)
    print(f"new_array from the pool (and its release):              {t * 1e6:6.2f} us/call")
    t = per_call(lambda: ctx.pool.allocate(4 * n), 20000)
    print(f"pool.allocate + release alone:                          {t * 1e6:6.2f} us/call")
    t = per_call(ctx.activate, 100000)
    print(f"ctx.activate():                                         {t * 1e6:6.2f} us/call")
    vm, th, storage, out = thunk_for(GpuElemwise(S["exp"]), x)
    vm()
    t = per_call(vm, 5000, sync)
    print(f"VM() of the one-node graph (output reused):             {t * 1e6:6.2f} us/call")

    t_torch = per_call(lambda: torch.exp(tx), 5000, torch.cuda.synchronize)
    print(f"torch.exp(x) on the device:                            {t_torch * 1e6:6.2f} us/call")

    # -- function level (check1 with the result on the device)
    try:
        from symgpu import function, shared
        import symgpu.tensor as T
        xs = shared(host, target="bench")
        f = function([], T.exp(xs).transfer("bench"))
        print("  graph:", [str(nd.op) for nd in f.maker.fgraph.toposort()])
        f()
        t_f = per_call(f, 5000, sync)
        print(f"check1 function() exp, result on device:               {t_f * 1e6:6.2f} us/call"
              f"  ({t_f / t_torch:.2f}x torch)")
        g = function([], T.exp(xs))
        t_g = per_call(g, 500)
        print(f"check1 function() exp, result to host:                 {t_g * 1e6:6.2f} us/call")
    except Exception as exc:  # the rewrite pipeline may be mid-change: say so, go on
        print(f"function() path unavailable: {type(exc).__name__}: {exc}")

    # -- bandwidth on 2**26 floats
    big = 1 << 26
    hb = np.random.default_rng(1).random(big).astype("float32")
    gb, gb2 = to_gpu(hb, ctx), to_gpu(hb[::-1].copy(), ctx)
    tb, tb2 = torch.from_numpy(hb).cuda(), torch.from_numpy(hb[::-1].copy()).cuda()
    nbytes = 4 * big
    for label, op, vals, bytes_moved, tfn in [
            ("exp", GpuElemwise(S["exp"]), (gb,), 2 * nbytes, lambda: torch.exp(tb)),
            ("add", GpuElemwise(S["add"]), (gb, gb2), 3 * nbytes, lambda: torch.add(tb, tb2)),
            ("sum", GpuCAReduce(S["add"]), (gb,), nbytes, lambda: torch.sum(tb))]:
        vm, th, storage, out = thunk_for(op, *vals)
        t = gpu_time(th, ctx)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        tfn()
        s.record()
        for _ in range(20):
            tfn()
        e.record()
        torch.cuda.synchronize()
        tt = s.elapsed_time(e) / 1e3 / 20
        print(f"{label} 2^26 f32: symgpu {bytes_moved / t / 1e12:5.2f} TB/s ({t * 1e6:7.1f} us), "
              f"torch {bytes_moved / tt / 1e12:5.2f} TB/s ({tt * 1e6:7.1f} us)")
    import pycuda.driver as drv
    t = gpu_time(lambda: drv.memcpy_dtod_async(gb2.ptr, gb.ptr, nbytes, ctx.stream), ctx)
    print(f"device-to-device copy 2^26 f32: {2 * nbytes / t / 1e12:5.2f} TB/s")
    (res,) = [np.asarray(storage[out][0])]
    print(f"sum check: rel err {abs(float(res) - hb.astype('float64').sum()) / hb.sum():.2e}")

    # -- sgemm
    from symgpu.gpu.blas import GpuDot22
    m = 4096
    a = to_gpu(np.random.default_rng(2).random((m, m)).astype("float32"), ctx)
    vm, th, storage, out = thunk_for(GpuDot22(), a, a)
    t = gpu_time(th, ctx, 10)
    print(f"GpuDot22 4096^3 f32: {2 * m ** 3 / t / 1e12:5.1f} TFLOP/s")


if __name__ == "__main__":
    main()
