"""Issue 6: the seeds' GPU workloads, symgpu against PyTorch, CuPy and JAX, in one run.

    python3 benchmarks/gpu_seeds.py            # on the GPU machine, well under 3 minutes

Prints, per workload, the time per call of symgpu (CUDA graphs on, and off), and of each peer
that imports: check1 (exp over 230,400 float32) with the result left on the device and with
it returned to the host, one step of the tutorial's logistic regression (400 x 784) with its
outputs on the device and with prediction and cross-entropy returned to the host, and the
compile time of that step (symgpu with an empty kernel cache in a fresh process, then warm;
JAX's first jitted call).  Then the ratios against issue 7's goals.  Device work is timed by
running N calls and synchronising once (``ctx.synchronize()`` for symgpu,
``torch.cuda.synchronize()``, ``block_until_ready()``, CuPy's stream sync); each figure is the
median of 5 such loops.  Numbers, not assertions; a peer that fails prints why and the run
goes on.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # JAX shares the GPU
os.environ.setdefault("SYMGPU_FLAGS", "device=cuda,floatX=float32")

import numpy as np  # noqa: E402
from timing import guarded, per_call, say  # noqa: E402

N_VEC = 10 * 30 * 768
N, FEATS = 400, 784
RESULTS: dict[str, dict[str, float]] = {}


def record(workload: str, who: str, seconds: float) -> None:
    RESULTS.setdefault(workload, {})[who] = seconds
    say(f"  {who:22s} {seconds * 1e6:10.1f} us")


# ============================================================================ data

def data():
    rng = np.random.RandomState(22)
    vec = np.asarray(rng.rand(N_VEC), "float32")
    r2 = np.random.RandomState(1)
    X = r2.randn(N, FEATS).astype("float32")
    Y = r2.randint(size=N, low=0, high=2).astype("float32")
    w0 = r2.randn(FEATS).astype("float32")
    return vec, X, Y, w0


# ============================================================================ symgpu

LOGREG_SOURCE = r'''
import numpy
import symgpu
import symgpu.tensor as tt
from symgpu import Out
from symgpu.gpu.placement.basic_ops import gpu_from_host


def build(X, Y, w0, on_device):
    x = symgpu.shared(X, name="x")
    y = symgpu.shared(Y, name="y")
    w = symgpu.shared(w0.copy(), name="w")
    b = symgpu.shared(numpy.asarray(0., dtype="float32"), name="b")
    p_1 = 1 / (1 + tt.exp(-tt.dot(x, w) - b))
    prediction = p_1 > 0.5
    xent = -y * tt.log(p_1) - (1 - y) * tt.log(1 - p_1)
    cost = tt.cast(xent.mean(), "float32") + 0.01 * (w ** 2).sum()
    gw, gb = tt.grad(cost, [w, b])
    if on_device:
        outputs = [Out(gpu_from_host(tt.cast(prediction, "float32")), borrow=True),
                   Out(gpu_from_host(tt.cast(xent, "float32")), borrow=True)]
    else:
        outputs = [prediction, xent]
    train = symgpu.function([], outputs, updates=[(w, w - 0.01 * gw), (b, b - 0.01 * gb)],
                            name="train")
    return train, w, b
'''

COMPILE_PROBE = LOGREG_SOURCE + r'''
import json, time, sys
import numpy as np
import symgpu.gpu
ctx = symgpu.gpu.init_default_context()
assert ctx is not None, "no GPU"
r = np.random.RandomState(1)
X = r.randn(400, 784).astype("float32"); Y = r.randint(0, 2, 400).astype("float32")
w0 = r.randn(784).astype("float32")
t0 = time.perf_counter()
train, w, b = build(X, Y, w0, on_device=False)
t1 = time.perf_counter()
train()
ctx.synchronize()
t2 = time.perf_counter()
print(json.dumps({"compile": t1 - t0, "first_call": t2 - t1}))
'''


def symgpu_logreg_module():
    ns: dict = {}
    exec(compile(LOGREG_SOURCE, "<logreg>", "exec"), ns)
    return ns["build"]


def bench_symgpu(vec, X, Y, w0) -> None:
    import symgpu
    import symgpu.gpu
    import symgpu.tensor as T
    from symgpu import config, function, shared
    from symgpu.gpu.placement.basic_ops import gpu_from_host
    ctx = symgpu.gpu.init_default_context()
    assert ctx is not None and not ctx.virtual, "symgpu found no GPU"
    sync = ctx.synchronize
    say(f"symgpu on {ctx.devname}")
    build = symgpu_logreg_module()
    want = np.exp(vec)
    final: dict[str, np.ndarray] = {}
    for graphs_on in (True, False):
        tag = "symgpu" if graphs_on else "symgpu (no graphs)"
        with config.change_flags(**{"gpuarray.cuda_graphs": graphs_on}):
            x = shared(vec)
            f_dev = function([], gpu_from_host(T.exp(x)))
            f_host = function([], T.exp(x))
            train_dev, wd, bd = build(X, Y, w0, on_device=True)
            train_host, wh, bh = build(X, Y, w0, on_device=False)
        r = f_dev()
        np.testing.assert_allclose(np.asarray(r), want, rtol=2e-6)
        say(f"check1, result on device [{tag}]")
        record("check1 device", tag, per_call(f_dev, 2000, sync))
        np.testing.assert_allclose(np.asarray(f_dev()), want, rtol=2e-6)
        say(f"check1, result to host [{tag}]")
        record("check1 host", tag, per_call(f_host, 500))
        np.testing.assert_allclose(f_host(), want, rtol=2e-6)
        say(f"logistic regression step, outputs on device [{tag}]")
        record("logreg device", tag, per_call(train_dev, 500, sync))
        say(f"logistic regression step, prediction and xent to host [{tag}]")
        record("logreg host", tag, per_call(train_host, 500))
        if graphs_on:
            for name, f in (("check1 device", f_dev), ("check1 host", f_host),
                            ("logreg device", train_dev), ("logreg host", train_host)):
                runner = f.vm.runner
                st = runner.stats() if runner is not None else "no runner"
                say(f"  graphs of {name}: {st}")
                if runner is not None and not runner.enabled:
                    say(f"    disabled: {runner.disabled_reason}")
            say(f"  pinned pool: {ctx.pinned.stats() if ctx.pinned is not None else None}")
            say("  logreg graph: " + ", ".join(
                type(n.op).__name__ for n in train_host.maker.fgraph.toposort()))
        final[tag] = (wh.get_value(), wd.get_value(), bh.get_value(), bd.get_value())
    # the same steps with and without graphs must give the same models
    for k, name in enumerate(("w (to host)", "w (on device)", "b (to host)", "b (on device)")):
        on, off = final["symgpu"][k], final["symgpu (no graphs)"][k]
        err = float(np.max(np.abs(on - off)) / (np.max(np.abs(off)) + 1e-30))
        say(f"  logreg {name}, graphs on vs off after the same steps: max rel diff {err:.2e}")


def bench_compile() -> None:
    say("compile of the logistic-regression step (fresh processes)")
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="symgpu-compiledir-") as tmp:
        env["SYMGPU_FLAGS"] = f"device=cuda,floatX=float32,compiledir={tmp}"
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        for label in ("cold", "warm"):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", COMPILE_PROBE], env=env,
                                 capture_output=True, text=True, timeout=120)
            wall = time.perf_counter() - t0
            if out.returncode:
                raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr else
                                   f"exit {out.returncode}")
            got = json.loads(out.stdout.strip().splitlines()[-1])
            record(f"compile {label}", "symgpu", got["compile"])
            say(f"    (first call {got['first_call'] * 1e3:.1f} ms, process {wall:.1f} s)")


# ============================================================================ peers

def bench_torch(vec, X, Y, w0) -> None:
    import torch
    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    tx = torch.from_numpy(vec).to(dev)
    say(f"PyTorch {torch.__version__}")
    record("check1 device", "PyTorch", per_call(lambda: torch.exp(tx), 2000, sync))
    record("check1 host", "PyTorch", per_call(lambda: torch.exp(tx).cpu(), 500))
    tX, tY = torch.from_numpy(X).to(dev), torch.from_numpy(Y).to(dev)
    tw = torch.from_numpy(w0.copy()).to(dev).requires_grad_(True)
    tb = torch.zeros((), device=dev, requires_grad=True)

    def step():
        p1 = 1 / (1 + torch.exp(-(tX @ tw) - tb))
        pred = p1 > 0.5
        xent = -tY * torch.log(p1) - (1 - tY) * torch.log(1 - p1)
        cost = xent.mean() + 0.01 * (tw ** 2).sum()
        gw, gb = torch.autograd.grad(cost, [tw, tb])
        with torch.no_grad():
            tw.sub_(0.01 * gw)
            tb.sub_(0.01 * gb)
        return pred, xent

    def step_host():
        pred, xent = step()
        return pred.cpu(), xent.detach().cpu()
    record("logreg device", "PyTorch", per_call(step, 300, sync))
    record("logreg host", "PyTorch", per_call(step_host, 300))


def bench_cupy(vec) -> None:
    import cupy
    cx = cupy.asarray(vec)
    stream = cupy.cuda.get_current_stream()
    say(f"CuPy {cupy.__version__}")
    record("check1 device", "CuPy", per_call(lambda: cupy.exp(cx), 2000, stream.synchronize))
    record("check1 host", "CuPy", per_call(lambda: cupy.exp(cx).get(), 500))


def bench_jax(vec, X, Y, w0) -> None:
    import jax
    import jax.numpy as jnp
    say(f"JAX {jax.__version__} on {jax.devices()[0]}")
    jx = jax.device_put(vec)
    jexp = jax.jit(jnp.exp)
    holder = [jexp(jx)]

    def dev_call():
        holder[0] = jexp(jx)
    record("check1 device", "JAX", per_call(dev_call, 2000, lambda: holder[0].block_until_ready()))
    record("check1 host", "JAX", per_call(lambda: np.asarray(jexp(jx)), 500))

    def loss(w, b, Xd, Yd):
        p1 = 1 / (1 + jnp.exp(-(Xd @ w) - b))
        xent = -Yd * jnp.log(p1) - (1 - Yd) * jnp.log(1 - p1)
        return xent.mean() + 0.01 * (w ** 2).sum(), (p1 > 0.5, xent)

    def step(w, b, Xd, Yd):
        (_, (pred, xent)), (gw, gb) = jax.value_and_grad(loss, argnums=(0, 1),
                                                         has_aux=True)(w, b, Xd, Yd)
        return pred, xent, w - 0.01 * gw, b - 0.01 * gb
    jstep = jax.jit(step)
    jX, jY = jax.device_put(X), jax.device_put(Y)
    state = [jax.device_put(w0.copy()), jax.device_put(np.float32(0.0)), None, None]
    t0 = time.perf_counter()
    out = jstep(state[0], state[1], jX, jY)
    out[3].block_until_ready()
    record("compile cold", "JAX", time.perf_counter() - t0)

    def run_dev():
        pred, xent, state[0], state[1] = jstep(state[0], state[1], jX, jY)
        state[2], state[3] = pred, xent

    def run_host():
        run_dev()
        return np.asarray(state[2]), np.asarray(state[3])
    record("logreg device", "JAX", per_call(run_dev, 500, lambda: state[1].block_until_ready()))
    record("logreg host", "JAX", per_call(run_host, 500))


# ============================================================================ report

GOALS = [  # (workload, peer, factor): symgpu <= factor * peer
    ("check1 device", "PyTorch", 1.0),
    ("check1 host", "PyTorch", 0.5),
    ("logreg device", "JAX", 0.8),
    ("logreg host", "JAX", 0.5),
]


def report() -> None:
    say("")
    say("=" * 100)
    peers = ["symgpu", "symgpu (no graphs)", "PyTorch", "CuPy", "JAX"]
    say(f"{'workload (us per call; compile: s)':36s}" + "".join(f"{p:>20s}" for p in peers))
    for workload, row in RESULTS.items():
        scale = 1.0 if workload.startswith("compile") else 1e6
        cells = "".join(f"{row[p] * scale:20.3f}" if p in row else f"{'-':>20s}" for p in peers)
        say(f"{workload:36s}{cells}")
    say("")
    say("goals (issue 7):")
    for workload, peer, factor in GOALS:
        row = RESULTS.get(workload, {})
        if "symgpu" not in row or peer not in row:
            say(f"  {workload:16s} symgpu <= {factor:.1f}x {peer}: not measured")
            continue
        ratio = row["symgpu"] / row[peer]
        ok = "MET" if ratio <= factor else "not met"
        say(f"  {workload:16s} symgpu/{peer} = {ratio:5.2f} (goal <= {factor:.1f}): {ok}")
    for label, limit in (("compile warm", 0.3), ("compile cold", 3.0)):
        t = RESULTS.get(label, {}).get("symgpu")
        if t is not None:
            say(f"  {label:16s} symgpu {t:.3f} s (goal <= {limit} s): "
                f"{'MET' if t <= limit else 'not met'}")


def main() -> None:
    t_start = time.perf_counter()
    vec, X, Y, w0 = data()
    guarded("symgpu", lambda: bench_symgpu(vec, X, Y, w0))
    guarded("PyTorch", lambda: bench_torch(vec, X, Y, w0))
    guarded("CuPy", lambda: bench_cupy(vec))
    guarded("JAX", lambda: bench_jax(vec, X, Y, w0))
    guarded("symgpu compile", bench_compile)
    report()
    say(f"(benchmark took {time.perf_counter() - t_start:.1f} s)")


if __name__ == "__main__":
    main()
