"""Issue 17: the LeNet training step, symgpu against the peers present, in one run.

    python3 benchmarks/convnet.py                 # GPU machine: symgpu, PyTorch eager,
                                                  # torch.compile, JAX jit
    python3 benchmarks/convnet.py --cpu           # CPU: symgpu, a NumPy step, PyTensor and
                                                  # PyTorch eager when installed
    python3 benchmarks/convnet.py --no-torch-compile
    python3 benchmarks/convnet.py --variants --profile   # symgpu with timed cuDNN
                                                  # algorithms and with TF32; time per op
    python3 benchmarks/convnet.py --kernels       # device time per kernel, every contender

The step (Theano's LeNet tutorial at batch 128): input 128 x 1 x 28 x 28; conv 20 5x5, tanh,
max-pool 2; conv 50 5x5, tanh, max-pool 2; dense 500, tanh; dense 10, softmax cross-entropy;
plain SGD (lr 0.1) on all eight parameters, everything float32. The batch lives on the device
(symgpu: shared variables; the step has no outputs, its updates are the work), labels are
one-hot for symgpu and NumPy and class indices for the peers (the same loss). Each figure is
the median of 5 loops of N steps with one synchronisation each. Goals (issue 17): symgpu at
most 0.8x PyTorch eager and at most 1.0x JAX jit on the GPU.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402
from timing import guarded, per_call, say  # noqa: E402

BATCH, LR = 128, 0.1
SHAPES = [(20, 1, 5, 5), (20,), (50, 20, 5, 5), (50,), (800, 500), (500,), (500, 10), (10,)]
RESULTS: dict[str, float] = {}
#: label -> (step, sync) of the GPU contenders, for --kernels
STEPS: dict[str, tuple] = {}


def record(who: str, seconds: float) -> None:
    RESULTS[who] = seconds
    say(f"  {who:26s} {seconds * 1e6:12.1f} us per step")


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(BATCH, 1, 28, 28)).astype("float32")
    y = rng.integers(0, 10, BATCH)
    params = []
    for s in SHAPES:
        if len(s) == 1:
            params.append(np.zeros(s, "float32"))
        else:
            fan_in = int(np.prod(s[1:]))
            params.append((rng.uniform(-1, 1, s) / np.sqrt(fan_in)).astype("float32"))
    return x, y, params


# ----------------------------------------------------------------------------- symgpu

def symgpu_step(lib, T, conv2d, pool_2d, x0, y0, params0, **kw):
    """The training function (no inputs, no outputs: the batch and the parameters are shared
    variables) built with symgpu or PyTensor (same API); returns (step, compile seconds)."""
    lib.config.floatX = "float32"
    x = lib.shared(x0, name="x")
    y = lib.shared(np.eye(10, dtype="float32")[y0], name="y")
    ps = [lib.shared(p.copy()) for p in params0]
    w1, b1, w2, b2, w3, b3, w4, b4 = ps
    h = pool_2d(T.tanh(conv2d(x, w1) + b1.dimshuffle("x", 0, "x", "x")), (2, 2),
                ignore_border=True)
    h = pool_2d(T.tanh(conv2d(h, w2) + b2.dimshuffle("x", 0, "x", "x")), (2, 2),
                ignore_border=True)
    h = T.tanh(T.dot(h.flatten(2), w3) + b3)
    p = T.nnet.softmax(T.dot(h, w4) + b4)
    cost = T.mean(T.nnet.categorical_crossentropy(p, y))
    grads = T.grad(cost, ps)
    t0 = time.perf_counter()
    f = lib.function([], [], updates=[(q, q - LR * g) for q, g in zip(ps, grads)], name="lenet",
                     **kw)
    return f, time.perf_counter() - t0


def bench_symgpu(x, y, params, number: int, gpu: bool, label: str = "symgpu",
                 algo_search: str = "heuristic", tf32: bool = False) -> None:
    """symgpu's step; on the GPU with cuDNN's algorithms chosen by `algo_search`
    (symgpu.gpu.ops.conv.ALGO_SEARCH) and float32 products on TF32 tensor cores or not."""
    import symgpu
    import symgpu.tensor as T
    from symgpu.tensor.nnet import conv2d
    from symgpu.tensor.signal.pool import pool_2d
    if gpu:
        from symgpu.gpu.ops import conv as gconv
        gconv.ALGO_SEARCH = algo_search
    with symgpu.config.change_flags(**{"gpuarray.allow_tf32": tf32}):
        _bench_symgpu(symgpu, T, conv2d, pool_2d, x, y, params, number, gpu, label)


def _bench_symgpu(symgpu, T, conv2d, pool_2d, x, y, params, number, gpu, label) -> None:
    f, comp = symgpu_step(symgpu, T, conv2d, pool_2d, x, y, params)
    names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
    sync = None
    if gpu:
        if "GpuConv2d" not in names:
            raise RuntimeError("the step did not move to the GPU (no GpuConv2d)")
        from symgpu.gpu.runtime.context import get_context
        ctx = get_context(None)
        sync = ctx.synchronize
    say(f"  ({label} compile {comp:.2f} s, {len(f.maker.fgraph.apply_nodes)} nodes)")
    record(label, per_call(f, number, sync))
    STEPS[label] = (f, sync)
    if sync is not None:
        # the host's share: the same calls without waiting for the GPU (the launches queue);
        # when it is well under the step's time, the step is GPU-bound
        sync()
        t0 = time.perf_counter()
        for _ in range(number):
            f()
        host = (time.perf_counter() - t0) / number
        sync()
        say(f"  ({label}: {host * 1e6:.1f} us per call on the host, not waiting for the GPU)")
    runner = getattr(getattr(f, "vm", None), "runner", None)
    if runner is not None and hasattr(runner, "stats"):
        why = getattr(runner, "disabled_reason", None)
        say(f"  ({label} CUDA graphs: {runner.stats()}"
            + (f"; turned off: {why}" if why else "") + ")")


def profile_symgpu(x, y, params, number: int) -> None:
    """Per-node times of the step (CUDA-event timers on the GPU; a profiled function runs
    its nodes one by one, without CUDA graphs): where the kernel time goes."""
    import io
    import symgpu
    import symgpu.tensor as T
    from symgpu.tensor.nnet import conv2d
    from symgpu.compile.profiling import ProfileStats
    from symgpu.tensor.signal.pool import pool_2d
    stats = ProfileStats(atexit_print=False, message="lenet", line_width=160)
    f, _ = symgpu_step(symgpu, T, conv2d, pool_2d, x, y, params, profile=stats)
    for _ in range(number):
        f()
    out = io.StringIO()
    f.profile.summary_ops(out, 40)
    say(out.getvalue())


def bench_pytensor(x, y, params, number: int) -> None:
    import pytensor
    import pytensor.tensor as T
    from pytensor.tensor.conv import conv2d
    from pytensor.tensor.signal.pool import pool_2d
    f, comp = symgpu_step(pytensor, T, conv2d, pool_2d, x, y, params)
    say(f"  (pytensor compile {comp:.2f} s)")
    record("pytensor", per_call(f, number))


# ----------------------------------------------------------------------------- NumPy

def bench_numpy(x, y, params, number: int) -> None:
    """The same step by hand with symgpu's NumPy kernels (conv_numpy, pool_numpy): what the
    graph would cost with no interpretation overhead at all."""
    from symgpu.tensor.nnet import conv_numpy as cn
    from symgpu.tensor.signal import pool_numpy as pn
    ps = [p.copy() for p in params]
    onehot = np.eye(10, dtype="float32")[y]
    z, one, two = ((0, 0), (0, 0)), (1, 1), (2, 2)

    def conv(a, w):
        return cn.conv_forward(a, w, z, one, one, True, 1, "float32")

    def step():
        w1, b1, w2, b2, w3, b3, w4, b4 = ps
        a1 = np.tanh(conv(x, w1) + b1[:, None, None])
        p1 = pn.pool_forward(a1, two, two, (0, 0), True, "max")
        a2 = np.tanh(conv(p1, w2) + b2[:, None, None])
        p2 = pn.pool_forward(a2, two, two, (0, 0), True, "max")
        f2 = p2.reshape(BATCH, -1)
        h3 = np.tanh(f2 @ w3 + b3)
        lg = h3 @ w4 + b4
        e = np.exp(lg - lg.max(1, keepdims=True))
        d4 = (e / e.sum(1, keepdims=True) - onehot) / BATCH
        d3 = (d4 @ w4.T) * (1 - h3 * h3)
        dp2 = (d3 @ w3.T).reshape(p2.shape)
        dc2 = pn.max_pool_grad(a2, p2, dp2, two, two, (0, 0), True) * (1 - a2 * a2)
        dp1 = cn.conv_grad_inputs(w2, dc2, p1.shape[2:], z, one, one, True, 1, "float32")
        dc1 = pn.max_pool_grad(a1, p1, dp1, two, two, (0, 0), True) * (1 - a1 * a1)
        grads = [cn.conv_grad_weights(x, dc1, (5, 5), z, one, one, True, 1, "float32"),
                 dc1.sum((0, 2, 3)),
                 cn.conv_grad_weights(p1, dc2, (5, 5), z, one, one, True, 1, "float32"),
                 dc2.sum((0, 2, 3)), f2.T @ d3, d3.sum(0), h3.T @ d4, d4.sum(0)]
        for p, g in zip(ps, grads):
            p -= LR * g
    record("numpy", per_call(step, number))


# ----------------------------------------------------------------------------- PyTorch / JAX

def torch_model(x, y, params, device):
    import torch
    import torch.nn.functional as F
    ps = [torch.tensor(p, device=device, requires_grad=True) for p in params]
    xt = torch.tensor(x, device=device)
    yt = torch.tensor(y, device=device)

    def loss_fn():
        w1, b1, w2, b2, w3, b3, w4, b4 = ps
        h = F.max_pool2d(torch.tanh(F.conv2d(xt, w1.flip(2, 3), b1)), 2)
        h = F.max_pool2d(torch.tanh(F.conv2d(h, w2.flip(2, 3), b2)), 2)
        h = torch.tanh(h.flatten(1) @ w3 + b3)
        return F.cross_entropy(h @ w4 + b4, yt)
    return torch, ps, loss_fn


def bench_torch(x, y, params, number: int, device: str, compiled: bool) -> None:
    torch, ps, loss_fn = torch_model(x, y, params, device)
    opt = torch.optim.SGD(ps, lr=LR)
    fn = torch.compile(loss_fn) if compiled else loss_fn

    def step():
        opt.zero_grad(set_to_none=True)
        fn().backward()
        opt.step()
    sync = torch.cuda.synchronize if device == "cuda" else None
    t0 = time.perf_counter()
    step()
    if sync:
        sync()
    if compiled:
        say(f"  (torch.compile first step {time.perf_counter() - t0:.1f} s)")
    label = "torch.compile" if compiled else f"torch eager ({device})"
    record(label, per_call(step, number, sync))
    STEPS[label] = (step, sync)


def bench_jax(x, y, params, number: int) -> None:
    import jax
    import jax.numpy as jnp

    def conv(a, w):
        return jax.lax.conv_general_dilated(a, w[:, :, ::-1, ::-1], (1, 1), "VALID")

    def pool(a):
        return jax.lax.reduce_window(a, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2),
                                     "VALID")

    def loss(ps, xb, yb):
        w1, b1, w2, b2, w3, b3, w4, b4 = ps
        h = pool(jnp.tanh(conv(xb, w1) + b1[:, None, None]))
        h = pool(jnp.tanh(conv(h, w2) + b2[:, None, None]))
        h = jnp.tanh(h.reshape(h.shape[0], -1) @ w3 + b3)
        lg = h @ w4 + b4
        return -jnp.mean(jax.nn.log_softmax(lg)[jnp.arange(lg.shape[0]), yb])

    @jax.jit
    def step(ps, xb, yb):
        g = jax.grad(loss)(ps, xb, yb)
        return [p - LR * gp for p, gp in zip(ps, g)]
    state = {"ps": [jnp.asarray(p) for p in params]}
    xb, yb = jnp.asarray(x), jnp.asarray(y)

    def run():
        state["ps"] = step(state["ps"], xb, yb)
    sync = lambda: jax.block_until_ready(state["ps"])   # noqa: E731
    record("jax jit", per_call(run, number, sync))
    STEPS["jax jit"] = (run, sync)


# ----------------------------------------------------------------------------- kernels

def kernel_tables(steps: int = 20, top: int = 14) -> None:
    """Each GPU contender's device time per step by kernel (CUPTI through torch.profiler,
    which sees every kernel of the process, those replayed from CUDA graphs included): what
    the GPU runs, apart from the host's share."""
    from torch.profiler import ProfilerActivity, profile
    for label, (fn, sync) in STEPS.items():
        fn()
        sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                fn()
            sync()
        rows = []
        for ka in prof.key_averages():
            t = getattr(ka, "self_device_time_total", None)
            if t is None:
                t = getattr(ka, "self_cuda_time_total", 0.0)
            if t > 0:
                rows.append((t / steps, ka.count // steps, ka.key))
        rows.sort(reverse=True)
        total = sum(r[0] for r in rows)
        n = sum(r[1] for r in rows)
        say(f"  {label}: {total:.1f} us of device work per step, {n} kernels/copies")
        for t, c, name in rows[:top]:
            say(f"    {t:8.1f} us  {c:3d}x  {name[:90]}")


# ----------------------------------------------------------------------------- main

def ratios(goals: list[tuple[str, float]]) -> None:
    if "symgpu" not in RESULTS:
        return
    say("ratios (symgpu / peer):")
    for peer, goal in goals:
        if peer in RESULTS:
            r = RESULTS["symgpu"] / RESULTS[peer]
            verdict = "" if goal is None else (" goal <= %.2f: %s" % (goal, "met" if r <= goal
                                                                         else "NOT met"))
            say(f"  symgpu/{peer:24s} = {r:6.3f}{verdict}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (symgpu device=cpu)")
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--number", type=int, default=None, help="steps per timing loop")
    ap.add_argument("--variants", action="store_true",
                    help="GPU: also symgpu with cuDNN's algorithms timed at the first call "
                         "(ALGO_SEARCH='time') and symgpu with TF32 tensor cores (the peers' "
                         "default for convolutions)")
    ap.add_argument("--kernels", action="store_true",
                    help="GPU: each contender's device time per step by kernel (needs PyTorch)")
    ap.add_argument("--profile", action="store_true",
                    help="also print symgpu's time per op (a profiled run, without graphs)")
    args = ap.parse_args()
    gpu = not args.cpu
    os.environ.setdefault("SYMGPU_FLAGS", f"device={'cuda' if gpu else 'cpu'},floatX=float32")
    x, y, params = data()
    assert all(p.dtype == np.float32 for p in params + [x])
    n = args.number or (50 if gpu else 3)
    say(f"LeNet SGD step, batch {BATCH} of 1x28x28, float32, on the {'GPU' if gpu else 'CPU'}")
    guarded("symgpu", lambda: bench_symgpu(x, y, params, n, gpu))
    if gpu and args.variants:
        guarded("symgpu timed", lambda: bench_symgpu(
            x, y, params, n, gpu, "symgpu (timed algos)", "time"))
        guarded("symgpu tf32", lambda: bench_symgpu(x, y, params, n, gpu, "symgpu (TF32)",
                                                    tf32=True))
    if args.profile:
        guarded("symgpu profile", lambda: profile_symgpu(x, y, params, n))
    if gpu:
        guarded("torch eager", lambda: bench_torch(x, y, params, n, "cuda", False))
        if not args.no_torch_compile:
            guarded("torch.compile", lambda: bench_torch(x, y, params, n, "cuda", True))
        guarded("jax", lambda: bench_jax(x, y, params, n))
        ratios([("torch eager (cuda)", 0.8), ("torch.compile", None), ("jax jit", 1.0),
                ("symgpu (timed algos)", None), ("symgpu (TF32)", None)])
        if args.kernels:
            guarded("kernels", kernel_tables)
    else:
        guarded("numpy", lambda: bench_numpy(x, y, params, n))
        guarded("pytensor", lambda: bench_pytensor(x, y, params, n))
        guarded("torch eager (cpu)", lambda: bench_torch(x, y, params, n, "cpu", False))
        ratios([("numpy", None), ("pytensor", None), ("torch eager (cpu)", None)])


if __name__ == "__main__":
    main()
