"""Issue 18: speed that holds however users write it — the same programs in the spellings a
user would choose, beside JAX and PyTorch doing the same, in one run.

    python3 benchmarks/gpu_spellings.py          # GPU machine, about a minute
    python3 benchmarks/gpu_spellings.py --logreg # the logistic-regression rows only
    python3 benchmarks/gpu_spellings.py --thunks plain-minibatch   # host time per node type
    python3 benchmarks/gpu_spellings.py --profile plain-logreg   # where one spelling's host
                       # time goes (cProfile); also plain-minibatch, cycling-minibatch,
                       # lr-input-minibatch, gpuarrays-logreg and data-per-call-logreg
                       # (profiled_spellings)
    python3 benchmarks/gpu_spellings.py --steps shared-logreg,gpuarrays-logreg
                       # wall time per call of each runner step of those spellings

Logistic-regression step (400 x 784, prediction and cross-entropy to the host unless said):
the bias as a 0-d array, a Python float or a NumPy scalar; the data in shared variables or
passed on every call; results held across calls or dropped; ``T.nnet.sigmoid`` or the explicit
``1 / (1 + exp(-z))``.  Minibatch MLP 784-512-10 (tanh, the tutorials' negative
log-likelihood ``-mean(log(p)[arange(n), y])`` with int32 labels in a shared variable, data
set of 50 minibatches of 128 in shared variables, ``givens`` slicing it by the index input,
the cost to the host as the tutorials' ``train_model``): the same index every call, cycling
over the 50 minibatches, and cycling with the learning rate as a second input.  Each figure
is the median of 5 loops of N calls with one synchronisation at the end of each loop.  The
summary prints each spelling's ratio to the best of its group.
"""
from __future__ import annotations

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# appended: run as a script, benchmarks/ is first already; loaded by kernel_breakdown.py, it
# must not go first (benchmarks/random.py would shadow the standard library's random)
sys.path.append(os.path.join(ROOT, "benchmarks"))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("SYMGPU_FLAGS", "device=cuda,floatX=float32")

import numpy as np  # noqa: E402

from contextlib import nullcontext  # noqa: E402

from gpu_seeds import guarded, per_call, say  # noqa: E402
from timing import profile_calls  # noqa: E402

N, FEATS = 400, 784
HIDDEN, CLASSES, BS, BATCHES = 512, 10, 128, 50
ROWS: dict[str, dict[str, float]] = {}
#: --logreg: the logistic-regression and upload rows only (no minibatch MLP)
LOGREG_ONLY = "--logreg" in sys.argv[1:]


def row(group: str, name: str, seconds: float) -> None:
    ROWS.setdefault(group, {})[name] = seconds * 1e6
    say(f"  {group:8s} {name:52s} {seconds * 1e6:9.1f} us")


def logreg_data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N, FEATS)).astype("float32")
    Y = rng.integers(0, 2, N).astype("float32")
    w0 = (rng.standard_normal(FEATS) * 0.01).astype("float32")
    return X, Y, w0


def mlp_data():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((BS * BATCHES, FEATS)).astype("float32")
    Y = rng.integers(0, CLASSES, BS * BATCHES).astype("int32")
    W1 = (rng.standard_normal((FEATS, HIDDEN)) * np.sqrt(1 / FEATS)).astype("float32")
    W2 = (rng.standard_normal((HIDDEN, CLASSES)) * np.sqrt(1 / HIDDEN)).astype("float32")
    return X, Y, W1, W2


# ============================================================================ symgpu

def symgpu_logreg(bias, data_shared=True, sigmoid=False):
    import symgpu
    import symgpu.tensor as T
    X, Y, w0 = logreg_data()
    if data_shared:
        x, y = symgpu.shared(X, name="x"), symgpu.shared(Y, name="y")
        inputs, args = [], ()
    else:
        x, y = T.fmatrix("x"), T.fvector("y")
        inputs, args = [x, y], (X, Y)
    w = symgpu.shared(w0.copy(), name="w")
    b = symgpu.shared(bias, name="b")
    z = T.dot(x, w) + b
    p_1 = T.nnet.sigmoid(z) if sigmoid else 1 / (1 + T.exp(-z))
    xent = -y * T.log(p_1) - (1 - y) * T.log(1 - p_1)
    cost = T.cast(xent.mean(), "float32") + 0.01 * (w ** 2).sum()
    gw, gb = T.grad(cost, [w, b])
    f = symgpu.function(inputs, [p_1 > 0.5, xent],
                        updates=[(w, w - 0.01 * gw), (b, b - 0.01 * gb)])
    return f, args


class pageable:
    """Registration of user memory off for the block (gpu/runtime/host_register.py)."""

    def __init__(self, registry):
        self.registry = registry

    def __enter__(self):
        self.min_bytes, self.registry.min_bytes = self.registry.min_bytes, 1 << 62

    def __exit__(self, *exc):
        self.registry.min_bytes = self.min_bytes


def bench_symgpu_logreg(sync) -> None:
    import symgpu
    spellings = [
        ("bias numpy.asarray(0., dtype=floatX)", dict(bias=np.asarray(0., dtype="float32"))),
        ("bias shared(0.)", dict(bias=0.)),
        ("bias shared(numpy.float32(0))", dict(bias=np.float32(0))),
        ("T.nnet.sigmoid", dict(bias=0., sigmoid=True)),
        ("data passed per call", dict(bias=0., data_shared=False)),
    ]
    from symgpu.gpu.runtime.array import to_gpu
    from symgpu.gpu.runtime.context import get_context
    from symgpu.gpu.runtime.host_register import registry_for
    registry = registry_for(get_context(None))
    X = logreg_data()[0]
    with pageable(registry):
        row("upload", "symgpu to_gpu of the 400x784 batch alone, pageable",
            per_call(lambda: to_gpu(X), 300, sync))
    row("upload", "symgpu to_gpu of the 400x784 batch alone, registered",
        per_call(lambda: to_gpu(X), 300, sync))
    for name, kw in spellings:
        f, args = symgpu_logreg(**kw)
        row("logreg", f"symgpu {name}", per_call(lambda: f(*args), 300, sync))
        if not kw.get("data_shared", True):
            with pageable(registry):
                Xp, Yp = (a.copy() for a in args)   # arrays never registered before
                row("logreg", f"symgpu {name}, pageable upload",
                    per_call(lambda: f(Xp, Yp), 300, sync))
            Xd, Yd = (to_gpu(a) for a in args)
            row("logreg", f"symgpu {name}, as GpuArrays (no upload)",
                per_call(lambda: f(Xd, Yd), 300, sync))
            say(f"    runner: {f.vm.runner.stats()}")
            g, _ = symgpu_logreg(**kw)   # a function never given host arrays
            row("logreg", f"symgpu {name}, only ever as GpuArrays",
                per_call(lambda: g(Xd, Yd), 300, sync))
            say(f"    runner: {g.vm.runner.stats()}")
        if name.startswith("bias shared(0.)"):
            held = []

            def keep():
                held[:] = f(*args)
            row("logreg", "symgpu bias shared(0.), results held", per_call(keep, 300, sync))
            say("    " + str(symgpu.explain(f, file=None)).replace("\n", "\n    "))


def symgpu_minibatch(lr_input=False, profile=None):
    import symgpu
    import symgpu.tensor as T
    X, Y, W1, W2 = mlp_data()
    sx, sy = symgpu.shared(X, name="X"), symgpu.shared(Y, name="Y")
    w1, w2 = symgpu.shared(W1, name="W1"), symgpu.shared(W2, name="W2")
    b1 = symgpu.shared(np.zeros(HIDDEN, "float32"), name="b1")
    b2 = symgpu.shared(np.zeros(CLASSES, "float32"), name="b2")
    i = T.lscalar("i")
    x, y = T.fmatrix("x"), T.ivector("y")
    h = T.tanh(T.dot(x, w1) + b1)
    p = T.nnet.softmax(T.dot(h, w2) + b2)
    cost = -T.mean(T.log(p)[T.arange(y.shape[0]), y])
    params = [w1, b1, w2, b2]
    grads = T.grad(cost, params)
    lr = T.fscalar("lr") if lr_input else np.float32(0.01)
    f = symgpu.function([i, lr] if lr_input else [i], cost,
                        updates=[(q, q - lr * g) for q, g in zip(params, grads)],
                        givens={x: sx[i * BS:(i + 1) * BS], y: sy[i * BS:(i + 1) * BS]},
                        profile=profile)
    return f


def cycling(f, *extra):
    """A call of the minibatch step ``f`` on the next of the BATCHES minibatches each time
    (``extra``: its other arguments), as a training loop makes it."""
    k = [0]

    def call():
        k[0] = (k[0] + 1) % BATCHES
        f(k[0], *extra)
    return call


def bench_symgpu_minibatch(sync) -> None:
    import symgpu
    from symgpu import config
    from workloads import WAVE2_PASSES
    f = symgpu_minibatch()
    row("minibatch", "symgpu fixed index", per_call(lambda: f(0), 300, sync))
    row("minibatch", "symgpu cycling index", per_call(cycling(f), 300, sync))
    say("    " + str(symgpu.explain(f, file=None)).replace("\n", "\n    "))
    row("minibatch", "symgpu cycling index, learning rate input",
        per_call(cycling(symgpu_minibatch(lr_input=True), 0.01), 300, sync))
    for name, flags in (("TF32 (gpuarray.allow_tf32)", {"gpuarray.allow_tf32": True}),
                        ("wave-2 passes off", {"optimizer_excluding": WAVE2_PASSES})):
        with config.change_flags(**flags):
            g = symgpu_minibatch()
        row("minibatch", f"symgpu cycling index, {name}", per_call(cycling(g), 300, sync))


def launched_kernels(f) -> int:
    """Nodes of ``f`` that queue device work (what a plain run launches one by one)."""
    from symgpu.gpu.exec.graph_plan import node_launches
    vm = f.vm
    return sum(node_launches(n, t) for n, t in zip(vm.nodes, vm.thunks))


def bench_symgpu_plain(sync) -> None:
    """The plain path (first calls, functions that cannot be captured): CUDA graphs off.
    Wall time per call over the kernels it launches bounds the host time per launch."""
    spellings = profiled_spellings()
    for name, key in (("logreg, bias 0-d array", "plain-logreg"),
                      ("minibatch MLP, cycling index", "plain-minibatch")):
        fn, call = spellings[key]()
        t = per_call(call, 300, sync)
        n = launched_kernels(fn)
        row("plain", f"symgpu {name}, CUDA graphs off ({n} launches)", t)
        say(f"    {t * 1e6 / n:.1f} us per launched kernel, wall (goal: at most ~5 us of host)")


def bench_symgpu() -> None:
    import symgpu.gpu
    ctx = symgpu.gpu.init_default_context()
    assert ctx is not None and not ctx.virtual, "symgpu found no GPU"
    say(f"symgpu on {ctx.devname}")
    bench_symgpu_logreg(ctx.synchronize)
    if not LOGREG_ONLY:
        bench_symgpu_minibatch(ctx.synchronize)
        bench_symgpu_plain(ctx.synchronize)


# ============================================================================ JAX

def bench_jax() -> None:
    import jax
    import jax.numpy as jnp
    say(f"JAX {jax.__version__}")
    X, Y, w0 = logreg_data()
    jX, jY = jax.device_put(X), jax.device_put(Y)

    @jax.jit
    def step(w, b, Xd, Yd):
        def cost(w, b):
            p = jax.nn.sigmoid(Xd @ w + b)
            xent = -Yd * jnp.log(p) - (1 - Yd) * jnp.log(1 - p)
            return xent.mean() + 0.01 * (w ** 2).sum(), (p, xent)
        (c, (p, xent)), (gw, gb) = jax.value_and_grad(cost, (0, 1), has_aux=True)(w, b)
        return p > 0.5, xent, w - 0.01 * gw, b - 0.01 * gb
    state = [jax.device_put(w0), jnp.float32(0)]

    def run():
        pred, xent, state[0], state[1] = step(state[0], state[1], jX, jY)
        np.asarray(pred), np.asarray(xent)
    row("logreg", "JAX jit (results to host)", per_call(run, 300))

    def run_data():   # X and Y from host memory on every call, as symgpu's per-call inputs
        pred, xent, state[0], state[1] = step(state[0], state[1], X, Y)
        np.asarray(pred), np.asarray(xent)
    row("logreg", "JAX jit, data passed per call", per_call(run_data, 300))
    hold = [jX]

    def put():
        hold[0] = jax.device_put(X)
    row("upload", "JAX device_put of the 400x784 batch alone",
        per_call(put, 300, lambda: hold[0].block_until_ready()))
    if LOGREG_ONLY:
        return

    Xm, Ym, W1, W2 = mlp_data()
    jXm, jYm = jax.device_put(Xm), jax.device_put(Ym)
    params = [jax.device_put(W1), jnp.zeros(HIDDEN), jax.device_put(W2), jnp.zeros(CLASSES)]

    def mb_step(ps, i, lr):
        xb = jax.lax.dynamic_slice(jXm, (i * BS, 0), (BS, FEATS))
        yb = jax.lax.dynamic_slice(jYm, (i * BS,), (BS,))

        def cost(ps):
            h = jnp.tanh(xb @ ps[0] + ps[1])
            logp = jax.nn.log_softmax(h @ ps[2] + ps[3], axis=1)
            return -jnp.mean(logp[jnp.arange(BS), yb])
        c, gs = jax.value_and_grad(cost)(ps)
        return c, [q - lr * g for q, g in zip(ps, gs)]
    box = [params]
    k = [0]
    # like for like: "highest" is full float32 as symgpu's default; JAX's own default on
    # NVIDIA GPUs is TF32 matrix products (beside symgpu with gpuarray.allow_tf32)
    for tag, precision in (("", "highest"), (", TF32 (JAX default)", None)):
        with jax.default_matmul_precision(precision) if precision else nullcontext():
            jstep = jax.jit(mb_step)

            def fixed():
                c, box[0] = jstep(box[0], 0, 0.01)
                float(c)
            row("minibatch", f"JAX jit fixed index{tag}", per_call(fixed, 300))

            def cycling():
                k[0] = (k[0] + 1) % BATCHES
                c, box[0] = jstep(box[0], k[0], 0.01)
                float(c)
            row("minibatch", f"JAX jit cycling index{tag}", per_call(cycling, 300))


# ============================================================================ PyTorch

def bench_torch() -> None:
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    say(f"PyTorch {torch.__version__}")
    X, Y, w0 = logreg_data()
    tX, tY = torch.from_numpy(X).to(dev), torch.from_numpy(Y).to(dev)
    tw = torch.from_numpy(w0.copy()).to(dev).requires_grad_(True)
    tb = torch.zeros((), device=dev, requires_grad=True)

    def step():
        p = torch.sigmoid(tX @ tw + tb)
        xent = -tY * torch.log(p) - (1 - tY) * torch.log(1 - p)
        cost = xent.mean() + 0.01 * (tw ** 2).sum()
        gw, gb = torch.autograd.grad(cost, [tw, tb])
        with torch.no_grad():
            tw.sub_(0.01 * gw)
            tb.sub_(0.01 * gb)
        (p > 0.5).cpu(), xent.detach().cpu()
    row("logreg", "PyTorch eager (results to host)", per_call(step, 300))

    def step_data():  # X and Y from host memory on every call
        nonlocal tX, tY
        tX, tY = torch.from_numpy(X).to(dev), torch.from_numpy(Y).to(dev)
        step()
    row("logreg", "PyTorch eager, data passed per call", per_call(step_data, 300))
    if LOGREG_ONLY:
        return

    Xm, Ym, W1, W2 = mlp_data()
    tXm, tYm = torch.from_numpy(Xm).to(dev), torch.from_numpy(Ym).long().to(dev)
    ps = [torch.from_numpy(W1).to(dev), torch.zeros(HIDDEN, device=dev),
          torch.from_numpy(W2).to(dev), torch.zeros(CLASSES, device=dev)]
    for q in ps:
        q.requires_grad_(True)
    k = [0]

    def mb():
        k[0] = (k[0] + 1) % BATCHES
        xb, yb = tXm[k[0] * BS:(k[0] + 1) * BS], tYm[k[0] * BS:(k[0] + 1) * BS]
        h = torch.tanh(xb @ ps[0] + ps[1])
        logp = torch.log_softmax(h @ ps[2] + ps[3], dim=1)
        cost = -logp[torch.arange(BS, device=dev), yb].mean()
        gs = torch.autograd.grad(cost, ps)
        with torch.no_grad():
            for q, g in zip(ps, gs):
                q.sub_(0.01 * g)
        cost.item()
    row("minibatch", "PyTorch eager cycling index", per_call(mb, 300))


def report() -> None:
    say("\nratios to the best full-float32 symgpu spelling of each group")
    for group, rows in ROWS.items():
        mine = {k: v for k, v in rows.items() if k.startswith("symgpu") and "TF32" not in k}
        if not mine:
            continue
        best = min(mine.values())
        for name, us in rows.items():
            say(f"  {group:9s} {name:52s} {us:9.1f} us  {us / best:5.2f}x")
    say("\ngoals:")
    logreg, mb = ROWS.get("logreg", {}), ROWS.get("minibatch", {})
    # the pageable-upload row shows what registration saves; it is no spelling of its own
    mine = {k: v for k, v in logreg.items() if k.startswith("symgpu") and "pageable" not in k}
    if mine:
        worst = max(mine, key=mine.get)
        r = mine[worst] / min(mine.values())
        say(f"  every logreg spelling within 1.25x of the best: worst {worst!r} {r:.2f}x: "
            f"{'MET' if r <= 1.25 else 'not met'}")
        per_call_rows = {k: v for k, v in logreg.items() if "data passed per call" in k}
        best_shared = min(v for k, v in mine.items() if "per call" not in k)
        for k, v in per_call_rows.items():
            if k.startswith("symgpu"):
                say(f"    {k!r}: {v / best_shared:.2f}x the best spelling with data held "
                    f"on the GPU ({best_shared:.1f} us)")
        if len(per_call_rows) > 1:
            say("    data passed per call, every contender: " + ", ".join(
                f"{k} {v:.1f} us" for k, v in per_call_rows.items()))
        uploads = ROWS.get("upload", {})
        if uploads:
            cheapest = min(uploads.values())
            bound = min(mine.values()) + cheapest
            say(f"    the cheapest upload of the batch alone is {cheapest:.1f} us: the best "
                f"spelling plus it is {bound:.1f} us, {bound / min(mine.values()):.2f}x the "
                f"best (the 1.25x goal leaves {0.25 * min(mine.values()):.1f} us for it)")
    for a, b, limit in (("symgpu cycling index", "symgpu fixed index", 1.1),
                        ("symgpu cycling index", "JAX jit cycling index", 1.0),
                        ("symgpu cycling index, TF32 (gpuarray.allow_tf32)",
                         "JAX jit cycling index, TF32 (JAX default)", 1.0)):
        if a in mb and b in mb:
            r = mb[a] / mb[b]
            say(f"  {a} / {b} = {r:.3f} (goal <= {limit}): {'MET' if r <= limit else 'not met'}")


def profiled_spellings() -> dict:
    """The spellings `--profile` can look into (the plain rows among them): name -> a
    builder, which compiles that spelling's function alone (and uploads its data) when
    called and returns (function, one call). Each builder makes a function of its own."""
    from symgpu import config

    def logreg(**kw):
        fn, args = symgpu_logreg(**kw)
        return fn, lambda: fn(*args)

    def plain_logreg():
        with config.change_flags(**{"gpuarray.cuda_graphs": False}):
            return logreg(bias=np.asarray(0., dtype="float32"))

    def plain_minibatch():
        with config.change_flags(**{"gpuarray.cuda_graphs": False}):
            fn = symgpu_minibatch()
        return fn, cycling(fn)

    def cycling_minibatch():
        fn = symgpu_minibatch()
        return fn, cycling(fn)

    def lr_input_minibatch():
        fn = symgpu_minibatch(lr_input=True)
        return fn, cycling(fn, 0.01)

    def gpuarrays_logreg():
        from symgpu.gpu.runtime.array import to_gpu
        fn, args = symgpu_logreg(0., data_shared=False)
        on_device = tuple(to_gpu(a) for a in args)
        return fn, lambda: fn(*on_device)

    return {"shared-logreg": lambda: logreg(bias=np.asarray(0., dtype="float32")),
            "plain-logreg": plain_logreg,
            "plain-minibatch": plain_minibatch,
            "cycling-minibatch": cycling_minibatch,
            "lr-input-minibatch": lr_input_minibatch,
            "gpuarrays-logreg": gpuarrays_logreg,
            "data-per-call-logreg": lambda: logreg(bias=0., data_shared=False)}


def profile(name: str, number: int = 300) -> None:
    """cProfile's top functions (own time, then cumulative) over `number` calls of one
    spelling, after its warm-up calls, with the function's explain report."""
    import symgpu
    import symgpu.gpu
    ctx = symgpu.gpu.init_default_context()
    fn, call = profiled_spellings()[name]()
    for _ in range(5):
        call()
    ctx.synchronize()
    say(str(symgpu.explain(fn, file=None)))
    say(f"{name}: {per_call(call, number, ctx.synchronize) * 1e6:.1f} us per call, "
        f"{launched_kernels(fn)} launching nodes")
    profile_calls(call, number, ctx.synchronize, sorts=("tottime", "cumulative"), top=25,
                  warmup=0)


class _TimedStep:
    """A runner step (gpu/exec/graphs.py) that adds its wall time to ``spent[name]``."""

    def __init__(self, step, name: str, spent: dict) -> None:
        self.step, self.name, self.spent = step, name, spent

    @property
    def current(self):
        return self.step.current

    def run(self) -> None:
        t = time.perf_counter()
        try:
            self.step.run()
        finally:
            self.spent[self.name] += time.perf_counter() - t


def step_walls(name: str, number: int = 300) -> None:
    """Wall time per call of each step of one spelling's runner (plain steps, segments,
    batched copies to the host: a wait for the device lands in the step that waits), and of
    the call around them."""
    import symgpu.gpu
    ctx = symgpu.gpu.init_default_context()
    fn, call = profiled_spellings()[name]()
    for _ in range(5):
        call()
    ctx.synchronize()
    runner = fn.vm.runner
    spent: dict = {}
    for i, step in enumerate(runner.steps):
        label = f"{i}: {type(step).__name__} at node {step.current} " \
                f"({type(fn.vm.nodes[step.current].op).__name__})"
        spent[label] = 0.0
        runner.steps[i] = _TimedStep(step, label, spent)   # the runner reads this list
    t = time.perf_counter()
    for _ in range(number):
        call()
    ctx.synchronize()
    total = (time.perf_counter() - t) / number * 1e6
    say(f"{name}: {total:.1f} us per call; runner {runner.stats()}")
    for label, sec in spent.items():
        say(f"  {sec / number * 1e6:7.1f} us  {label}")
    say(f"  {total - sum(spent.values()) / number * 1e6:7.1f} us  outside the steps")


def thunk_walls(name: str, number: int = 300) -> None:
    """Host time of each node's thunk of one spelling, CUDA graphs or not (the plain path's
    cost per launch): the VM's profiler hook runs the thunks of each call in order, each
    timed alone, with no wait for the device (a download's wait lands in its node)."""
    import symgpu.gpu
    from symgpu.gpu.exec.graph_plan import node_launches
    ctx = symgpu.gpu.init_default_context()
    fn, call = profiled_spellings()[name]()
    for _ in range(5):
        call()
    ctx.synchronize()
    vm = fn.vm
    spent = [0.0] * len(vm.thunks)
    clock = time.perf_counter

    def timed(vm) -> None:
        for i, th in enumerate(vm.thunks):
            t = clock()
            th()
            spent[i] += clock() - t
            for cell in vm.gc_after[i] if vm.gc_after is not None else ():
                cell[0] = None

    vm.profiler = timed
    t_all = clock()
    for _ in range(number):
        call()
    ctx.synchronize()
    total = (clock() - t_all) / number * 1e6
    vm.profiler = None
    launches = sum(node_launches(n, t) for n, t in zip(vm.nodes, vm.thunks))
    say(f"{name}: {total:.1f} us per call, thunks {sum(spent) / number * 1e6:.1f} us "
        f"({launches} launches: {sum(spent) / number * 1e6 / max(launches, 1):.1f} us each)")
    by_op: dict = {}
    for node, th, sec in zip(vm.nodes, vm.thunks, spent):
        label = type(node.op).__name__
        n, s, k = by_op.get(label, (0, 0.0, 0))
        by_op[label] = (n + 1, s + sec, k + node_launches(node, th))
    for label, (n, sec, k) in sorted(by_op.items(), key=lambda kv: -kv[1][1]):
        say(f"  {sec / number * 1e6:7.1f} us  {n} x {label} ({k} launches)")


def main() -> None:
    if "--thunks" in sys.argv:
        for name in sys.argv[sys.argv.index("--thunks") + 1].split(","):
            thunk_walls(name)
        return
    if "--steps" in sys.argv:
        for name in sys.argv[sys.argv.index("--steps") + 1].split(","):
            step_walls(name)
        return
    if "--profile" in sys.argv:
        profile(sys.argv[sys.argv.index("--profile") + 1])
        return
    guarded("symgpu", bench_symgpu)
    guarded("JAX", bench_jax)
    guarded("PyTorch", bench_torch)
    report()


if __name__ == "__main__":
    main()
