"""Generated kernels and their launch path, timed on the GPU machine beside PyTorch.

Prints, in one run: the Python cost of one launch (the C runtime, PyCUDA, ctypes), the
per-call time of check1's exp (230,400 float32, result left on the device) at the thunk and
at the function level against ``torch.exp``, bandwidth of exp/add/sum over 2**26 floats against
torch and a device-to-device copy, and sgemm 4096^3.  Not a test: numbers, not assertions.

    python3 benchmarks/gpu_kernels.py                 # all of the above
    python3 benchmarks/gpu_kernels.py --chain         # the fused chain's launch shapes and
                                                      # variants, beside torch.compile and JAX
    python3 benchmarks/gpu_kernels.py --upload        # a 400x784 float32 upload per call:
                                                      # pageable, pinned-staged, PyTorch, JAX
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
    from symgpu.gpu.runtime import context as gctx
    from symgpu.gpu.runtime.array import to_gpu
    from symgpu.graph.fg import FunctionGraph
    from symgpu.link.vm import link
    from symgpu.gpu.ops.elemwise import GpuElemwise, GpuCAReduce
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.gpu.runtime.codegen import launch
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

    # -- launch cost, per backend, and where a call's time goes: each backend's thunk and
    # bare launch made first, then timed in interleaved rounds (best of each), so that no
    # backend gains from running last on a host whose clock has warmed up
    from symgpu.gpu.ops.elemwise import new_array
    default = launch.BACKEND
    rows: dict[str, dict[str, float]] = {}
    calls: dict[str, dict[str, object]] = {}
    for backend in ("c", "pycuda", "ctypes"):
        launch.BACKEND = backend
        launch.clear_cache()
        vm, th, storage, out = thunk_for(GpuElemwise(S["exp"]), x)
        th()
        sync()
        ok = np.allclose(np.asarray(storage[out][0]), np.exp(host), rtol=1e-5)
        print(f"[{backend:6s}] exp thunk correct: {ok}")
        cell = storage[out]

        def fresh(cell=cell, th=th):
            cell[0] = None
            th()
        ks = launch.load_kernels(ctx, ("symgpu.elemwise", vm.nodes[-1].op.signature(vm.nodes[-1])),
                                 None, {"sg_contig_vec": "qPP"})
        go = ks["sg_contig_vec"].fast_launcher()
        o = storage[out][0]
        grid, block = (max(1, n // 1024), 1, 1), (256, 1, 1)
        calls[backend] = {
            "exp thunk (230400 f32, output reused)": th,
            "exp thunk, output from the pool": fresh,
            "the launch alone": lambda go=go, o=o, grid=grid, block=block:
                go(grid, block, n, x.ptr, o.ptr)}
        rows[backend] = dict.fromkeys(calls[backend], float("inf"))
    order = list(calls)
    for r in range(6):
        for backend in order[r % 3:] + order[:r % 3]:
            for label, fn in calls[backend].items():
                rows[backend][label] = min(rows[backend][label], per_call(fn, 2000, sync, 1))
    for label in rows[order[0]]:
        print(f"{label} (best of 6 interleaved rounds), us/call: " + ", ".join(
            f"{b} {rows[b][label] * 1e6:.2f}" for b in order))
    launch.BACKEND = default
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
    from symgpu.gpu.ops.blas import GpuDot22
    m = 4096
    a = to_gpu(np.random.default_rng(2).random((m, m)).astype("float32"), ctx)
    vm, th, storage, out = thunk_for(GpuDot22(), a, a)
    t = gpu_time(th, ctx, 10)
    print(f"GpuDot22 4096^3 f32: {2 * m ** 3 / t / 1e12:5.1f} TFLOP/s")


# ============================================================================ fused chain sweep

CHAIN_VARIANTS = r"""
extern "C" __global__ void v_flat1(const long long n, const sg_ptrs p)
{   /* one vector per thread, no loop (a grid of n / (4 * block)) */
    const sg_scalars s = sg_load_scalars(p);
    const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j < (n >> 2)) sg_vec_store(p, s, j, sg_vec_load(p, j));
}
extern "C" __global__ void v_flat2(const long long n, const sg_ptrs p)
{   /* two vectors per thread, a block's 2 * block vectors contiguous, no loop */
    const sg_scalars s = sg_load_scalars(p);
    const long long nvec = n >> 2;
    const long long j = (long long)blockIdx.x * blockDim.x * 2 + threadIdx.x;
    const long long k = j + blockDim.x;
    sg_vin a, b;
    if (j < nvec) a = sg_vec_load(p, j);
    if (k < nvec) b = sg_vec_load(p, k);
    if (j < nvec) sg_vec_store(p, s, j, a);
    if (k < nvec) sg_vec_store(p, s, k, b);
}
extern "C" __global__ void v_gs1(const long long n, const sg_ptrs p)
{   /* grid-stride, one vector per step */
    const sg_scalars s = sg_load_scalars(p);
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < (n >> 2); j += step)
        sg_vec_store(p, s, j, sg_vec_load(p, j));
}
"""


def _event_time(launch, iters: int = 50, repeat: int = 3) -> float:
    """Best of `repeat` CUDA-event timings of `iters` launches, seconds per launch."""
    import pycuda.driver as drv
    launch()
    best = float("inf")
    for _ in range(repeat):
        start, end = drv.Event(), drv.Event()
        start.record()
        for _ in range(iters):
            launch()
        end.record()
        end.synchronize()
        best = min(best, end.time_since(start) / 1e3 / iters)
    return best


def chain_sweep(out_dir: str | None) -> None:
    """The chain tanh(x*.5+.1)*exp(-x*x)+log1p(x*x) over 2^26 float32: symgpu's module with
    other launch shapes and loop forms, its precise expf swapped for exp2f (where the time
    goes), then torch eager / torch.compile (its Triton source saved) / JAX."""
    import pycuda.driver as drv
    import symgpu
    import symgpu.tensor as T
    from symgpu.gpu.runtime import context as gctx
    from symgpu.gpu.runtime.array import GpuArray
    from symgpu.gpu.runtime.compiler import compile_to_cubin
    from symgpu.gpu.runtime.codegen.launch import sm_count
    from symgpu.gpu.ops.elemwise import GpuElemwise
    ctx = gctx.init_default_context()
    assert ctx is not None and not ctx.virtual
    sms = sm_count(ctx)
    dev = ctx.pycuda_device
    print(f"chain sweep on {ctx.devname}: {sms} SMs, "
          f"{dev.get_attribute(drv.device_attribute.MAX_THREADS_PER_MULTIPROCESSOR)} threads/SM, "
          f"L2 {dev.get_attribute(drv.device_attribute.L2_CACHE_SIZE) >> 20} MiB, "
          f"clock {dev.get_attribute(drv.device_attribute.CLOCK_RATE) / 1e6:.2f} GHz, "
          f"memory clock {dev.get_attribute(drv.device_attribute.MEMORY_CLOCK_RATE) / 1e6:.2f} "
          f"GHz x {dev.get_attribute(drv.device_attribute.GLOBAL_MEMORY_BUS_WIDTH)} bit")
    big = 1 << 26
    hb = np.random.default_rng(3).standard_normal(big).astype("float32")
    xb = symgpu.shared(hb)
    fc = symgpu.function([], T.tanh(xb * 0.5 + 0.1) * T.exp(-xb * xb) + T.log1p(xb * xb))
    (node,) = [n for n in fc.maker.fgraph.toposort() if isinstance(n.op, GpuElemwise)]
    ((_, factory, opts),) = node.op.prefetch_sources(node)
    base = factory()
    srcs = {"precise": base + CHAIN_VARIANTS,
            "exp2f": base.replace("expf(t4)", "exp2f(t4 * 1.4426950408889634f)") + CHAIN_VARIANTS}
    x = xb.get_value(borrow=True, return_internal_type=True)
    out = GpuArray((big,), np.dtype("float32"), ctx)
    want = (np.tanh(hb[:1 << 16] * 0.5 + 0.1) * np.exp(-hb[:1 << 16] ** 2)
            + np.log1p(hb[:1 << 16] ** 2))
    nbytes = 8 * big
    nvec = big // 4
    for label, src in srcs.items():
        _, cubin, _ = compile_to_cubin(src, opts, ctx.arch)
        mod = drv.module_from_buffer(cubin)
        fns = {}
        # sg_contig_vec: symgpu's own (grid-stride, four vectors in flight per thread)
        for name in ("sg_contig_vec", "v_flat1", "v_flat2", "v_gs1"):
            f = mod.get_function(name)
            f.prepare("qPP")
            fns[name] = f
        print(f"  [{label}] registers: " + ", ".join(
            f"{k} {f.get_attribute(drv.function_attribute.NUM_REGS)}" for k, f in fns.items()))
        shapes = []
        for block in (256, 512):
            for per_sm in (2, 4, 8, 16, 32):
                blocks = per_sm * sms * 256 // block
                shapes.append(("sg_contig_vec", blocks, block, f"{per_sm}x256 thr/SM"))
                shapes.append(("v_gs1", blocks, block, f"{per_sm}x256 thr/SM"))
            shapes.append(("v_flat1", -(-nvec // block), block, "flat"))
            shapes.append(("v_flat2", -(-nvec // (2 * block)), block, "flat"))
        results = []
        for name, grid, block, tag in shapes:
            f = fns[name]

            def go(f=f, grid=grid, block=block):
                f.prepared_async_call((grid, 1), (block, 1, 1), ctx.stream, big, x.ptr, out.ptr)
            t = _event_time(go)
            got = out[:1 << 16].get()
            ok = np.allclose(got, want, rtol=1e-4, atol=1e-5)
            results.append((t, name, grid, block, tag, ok))
            print(f"  [{label}] {name:14s} grid {grid:7d} block {block:4d} ({tag:16s}) "
                  f"{t * 1e6:8.1f} us {nbytes / t / 1e12:6.3f} TB/s{'' if ok else '  WRONG'}")
        best = min(results)
        print(f"  [{label}] best: {best[1]} grid {best[2]} block {best[3]}: "
              f"{nbytes / best[0] / 1e12:.3f} TB/s")
    t = _event_time(lambda: drv.memcpy_dtod_async(out.ptr, x.ptr, 4 * big, ctx.stream))
    print(f"  device-to-device copy 2^26 f32: {nbytes / t / 1e12:.3f} TB/s")
    try:
        import torch
        tb = torch.from_numpy(hb).cuda()

        def chain(v):
            return torch.tanh(v * 0.5 + 0.1) * torch.exp(-v * v) + torch.log1p(v * v)

        def torch_time(fn, iters=50):
            fn()
            torch.cuda.synchronize()
            best = float("inf")
            for _ in range(3):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(iters):
                    fn()
                e.record()
                torch.cuda.synchronize()
                best = min(best, s.elapsed_time(e) / 1e3 / iters)
            return best
        print(f"  torch eager: {nbytes / torch_time(lambda: chain(tb)) / 1e12:.3f} TB/s")
        cchain = torch.compile(chain)
        from torch._inductor.utils import run_and_get_code
        _, codes = run_and_get_code(cchain, tb)
        if out_dir:
            with open(os.path.join(out_dir, "torch_compile_chain.py"), "w") as fh:
                fh.write("\n\n# ----\n".join(codes))
        print(f"  torch.compile: {nbytes / torch_time(lambda: cchain(tb)) / 1e12:.3f} TB/s")
        tb = None
    except Exception as exc:  # a missing peer says why
        print(f"  torch: unavailable ({type(exc).__name__}: {exc})")
    try:
        import jax
        import jax.numpy as jnp
        jb = jax.device_put(hb)
        jchain = jax.jit(lambda v: jnp.tanh(v * 0.5 + 0.1) * jnp.exp(-v * v) + jnp.log1p(v * v))
        hold = [jchain(jb)]
        hold[0].block_until_ready()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(50):
                hold[0] = jchain(jb)
            hold[0].block_until_ready()
            best = min(best, (time.perf_counter() - t0) / 50)
        print(f"  JAX jit (host clock): {nbytes / best / 1e12:.3f} TB/s")
    except Exception as exc:
        print(f"  JAX: unavailable ({type(exc).__name__}: {exc})")


# ============================================================================ upload sweep

def upload_sweep() -> None:
    """What one 400x784 float32 upload per call costs (host clock, 300 calls, one sync):
    symgpu's path (pool block + pageable cuMemcpyHtoDAsync), a copy into a pinned staging
    buffer then an asynchronous copy (and each half alone), PyTorch (pageable; pinned +
    non_blocking) and JAX's device_put.  On the H100 machine (2026-11-25) pageable 123 us,
    pinned staging 163 us (the host copy into pinned memory alone 107 us, the DMA 26 us),
    PyTorch 138 us, JAX 114 us: staging through pinned memory does not pay.  An array uploaded
    again is registered with the driver instead (gpu/runtime/host_register.py): the rows
    "X registered" and "cuMemHostRegister + Unregister" measure that path and its set-up: on
    the H100 machine (2026-11-25) pageable 106.5 us (124.9 us with a stream sync per call),
    registered 50.0 us, registering and unregistering the 1.25 MB once 211 us."""
    import pycuda.driver as drv
    from symgpu.gpu.runtime import context as gctx
    from symgpu.gpu.runtime.array import GpuArray, to_gpu
    ctx = gctx.init_default_context()
    X = np.random.default_rng(0).standard_normal((400, 784)).astype("float32")
    sync = ctx.synchronize
    print(f"upload of {X.nbytes} bytes per call on {ctx.devname}")
    from symgpu.gpu.runtime.host_register import LibcudaRegistrar, registry_for
    reg = registry_for(ctx)
    min_bytes, reg.min_bytes = reg.min_bytes, 1 << 62     # registration off
    t = per_call(lambda: to_gpu(X, ctx), 300, sync)
    print(f"  symgpu to_gpu (pageable):        {t * 1e6:7.1f} us")
    idle = per_call(lambda: (to_gpu(X, ctx), sync()), 300)
    print(f"  the same, stream synced each:    {idle * 1e6:7.1f} us")
    reg.min_bytes = min_bytes
    t = per_call(lambda: to_gpu(X, ctx), 300, sync)      # X registered on its second upload
    print(f"  symgpu to_gpu (X registered):    {t * 1e6:7.1f} us")
    registrar, Z = LibcudaRegistrar(), X.copy()
    zp = Z.__array_interface__["data"][0]

    def register_unregister():
        assert registrar.register(zp, Z.nbytes) == 0
        registrar.unregister(zp)
    t = per_call(register_unregister, 50)
    print(f"  cuMemHostRegister + Unregister:  {t * 1e6:7.1f} us")
    dst = GpuArray(X.shape, X.dtype, ctx)
    staging = drv.pagelocked_empty(X.shape, X.dtype)
    ev = drv.Event()

    def staged():
        ev.synchronize()
        np.copyto(staging, X)
        drv.memcpy_htod_async(dst.ptr, staging, ctx.stream)
        ev.record(ctx.stream)
    print(f"  pinned staging + async copy:     {per_call(staged, 300, sync) * 1e6:7.1f} us")
    t = per_call(lambda: np.copyto(staging, X), 300)
    print(f"  the host copy into pinned alone: {t * 1e6:7.1f} us")
    t = per_call(lambda: drv.memcpy_htod_async(dst.ptr, staging, ctx.stream), 300, sync)
    print(f"  async copy from pinned alone:    {t * 1e6:7.1f} us")
    try:
        import torch
        d = torch.device("cuda")
        tX = torch.from_numpy(X)
        pX = tX.pin_memory()
        ts = torch.cuda.synchronize
        t = per_call(lambda: tX.to(d), 300, ts)
        print(f"  torch .to(cuda) pageable:        {t * 1e6:7.1f} us")
        print(f"  torch pinned non_blocking:       "
              f"{per_call(lambda: pX.to(d, non_blocking=True), 300, ts) * 1e6:7.1f} us")
    except Exception as exc:
        print(f"  torch: unavailable ({type(exc).__name__}: {exc})")
    try:
        import jax
        hold = [jax.device_put(X)]

        def jput():
            hold[0] = jax.device_put(X)
        print(f"  jax.device_put:                  "
              f"{per_call(jput, 300, lambda: hold[0].block_until_ready()) * 1e6:7.1f} us")
    except Exception as exc:
        print(f"  JAX: unavailable ({type(exc).__name__}: {exc})")


if __name__ == "__main__":
    os.environ.setdefault("SYMGPU_FLAGS", "device=cuda,floatX=float32")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if "--chain" in sys.argv[1:]:
        chain_sweep(os.environ.get("OUT"))
    if "--upload" in sys.argv[1:]:
        upload_sweep()
    if not {"--chain", "--upload"} & set(sys.argv[1:]):
        main()
