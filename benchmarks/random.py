"""Issue 16: random-number generation and the dropout MLP step, symgpu against PyTorch, CuPy
and JAX (GPU) and NumPy's Generator(Philox) (CPU), in one run.

    python3 benchmarks/random.py            # GPU machine: GPU figures, then the CPU ones
    python3 benchmarks/random.py --cpu      # CPU figures only
    python3 benchmarks/random.py --mlp      # GPU machine: the dropout MLP step only

GPU: 2**26 float32 standard normals and uniforms (result left on the device), as GB/s
written; dropout (p=0.5) of 2**26 float32 (GB/s read + written; symgpu with the mask made
inside the kernel and, for comparison, written to memory first); one SGD step of the MLP
784-1024-1024-10 with two dropout layers (p=0.5), batch 512 (symgpu with CUDA graphs on and
off, with its runner's counts of plain runs, captures and replays; PyTorch eager; JAX jit), in
full float32 everywhere ("mlp step", JAX at matmul precision "highest") and with TF32 matrix
products everywhere ("mlp step tf32": symgpu's gpuarray.allow_tf32, PyTorch's allow_tf32,
JAX's default precision). CPU: 2**22 float32 normals and
uniforms, symgpu's CPU function against NumPy's Generator(Philox) (a Philox4x64 stream) and
NumPy's default PCG64. Each figure is the median of 5 loops of N calls with one sync, except
the MLP steps: their contenders (symgpu; symgpu without graphs, with the masks written to
memory, with gpuarray.cublaslt's timed choice; PyTorch eager; JAX jit) are timed in
interleaved rounds (``MLP_ROUNDS`` blocks of ``MLP_STEPS`` steps, alternating, a sync ending
each block: JAX's own time swings by a third between runs), printing best and median and the
ratios of medians and of bests against JAX; the figure kept is the median. Numbers, not
assertions; a peer that fails prints why and the run goes on.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # JAX shares the GPU

import numpy as np  # noqa: E402
from timing import build_and_time, guarded, per_call, say  # noqa: E402
from workloads import KERNEL_FUSION_PASSES, WAVE2_PASSES  # noqa: E402

N_GPU = 1 << 26
N_CPU = 1 << 22
BATCH = 512
#: the dropout MLP step in full float32 everywhere (JAX at matmul precision "highest") and
#: with TF32 matrix products everywhere (symgpu's gpuarray.allow_tf32, PyTorch's allow_tf32,
#: JAX's default precision on NVIDIA GPUs)
MLP, MLP_TF32 = "mlp step", "mlp step tf32"
MLP_ROUNDS, MLP_STEPS = 9, 100


RESULTS: dict[str, dict[str, float]] = {}


def record(workload: str, who: str, seconds: float, nbytes: int | None = None) -> None:
    RESULTS.setdefault(workload, {})[who] = seconds
    rate = f"  {nbytes / seconds / 1e9:8.1f} GB/s" if nbytes else ""
    say(f"  {workload:16s} {who:24s} {seconds * 1e6:10.1f} us{rate}")


# ============================================================================ GPU

def bench_symgpu_gpu() -> None:
    import symgpu
    from symgpu import Out, config, function
    from symgpu.gpu import init_default_context
    from symgpu.gpu.placement.basic_ops import gpu_from_host
    from symgpu.tensor.random import RandomStreams
    ctx = init_default_context()
    assert ctx is not None, "no GPU"
    say(f"symgpu on {getattr(ctx, 'devname', ctx)}")
    x = symgpu.shared(np.random.default_rng(0).standard_normal(N_GPU).astype("float32"), name="x")

    def dropout_fn():
        srng = RandomStreams(seed=2)
        keep = srng.binomial(x.shape, p=0.5, dtype="float32")
        return function([], Out(gpu_from_host(x * keep * 2.0), borrow=True))

    for graphs_on in (True, False):
        tag = "symgpu" + ("" if graphs_on else " (no graphs)")
        with config.change_flags(**{"gpuarray.cuda_graphs": graphs_on}):
            srng = RandomStreams(seed=1)
            for dist in ("normal", "uniform"):
                rv = getattr(srng, dist)((N_GPU,), dtype="float32")
                f = function([], Out(gpu_from_host(rv), borrow=True))
                names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
                assert "GpuPhiloxSample" in names, names
                record(dist, tag, per_call(f, 50, ctx.synchronize), 4 * N_GPU)
            f = dropout_fn()
            names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
            assert "GpuPhiloxElemwise" in names, names        # the mask made in the kernel
            record("dropout", tag, per_call(f, 50, ctx.synchronize), 8 * N_GPU)
    # the same with the draws written to memory (gpu_philox_fusion off), then fused again,
    # to see the fusion's effect apart from the order of the measurements
    with config.change_flags(optimizer_excluding="gpu_philox_fusion"):
        record("dropout", "symgpu (mask in memory)", per_call(dropout_fn(), 50, ctx.synchronize),
               8 * N_GPU)


def symgpu_mlp_contenders(rows: dict) -> None:
    """symgpu's dropout MLP steps added to ``rows`` as (name, step, sync): the default
    (graphs on; TF32 too), graphs off, the masks in memory, classic cuBLAS's own choice of
    algorithm, without the fusions made default on 2026-11-28 (reduction epilogues, the
    arange-free gather, the state advanced by the draw), and without WAVE2_PASSES (the
    passes made default after their GPU run)."""
    from symgpu import config
    from symgpu.gpu import init_default_context
    import mlp_dropout
    ctx = init_default_context()
    assert ctx is not None, "no GPU"
    variants = (
        (MLP, "symgpu", {}),
        (MLP, "symgpu (no graphs)", {"gpuarray.cuda_graphs": False}),
        (MLP, "symgpu (masks in memory)", {"optimizer_excluding": "gpu_philox_fusion"}),
        (MLP, "symgpu (classic cuBLAS)", {"gpuarray.cublaslt": False}),
        (MLP, "symgpu (fusions off)", {"optimizer_excluding": KERNEL_FUSION_PASSES}),
        (MLP, "symgpu (wave-2 passes off)", {"optimizer_excluding": WAVE2_PASSES}),
        (MLP_TF32, "symgpu", {"gpuarray.allow_tf32": True}),
    )
    for row, who, flags in variants:
        with config.change_flags(**flags):
            train, _, _ = mlp_dropout.build(BATCH, on_device=True)
            train()
        rows[row].append((who, train, ctx.synchronize))
        RUNNER_STATS.append((f"{row} {who}", train))


#: (label, symgpu function): their graph runners' counts, printed after the timing
RUNNER_STATS: list = []


def bench_torch() -> None:
    import torch
    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    say(f"PyTorch {torch.__version__}")
    out = torch.empty(N_GPU, device=dev, dtype=torch.float32)
    record("normal", "PyTorch", per_call(lambda: torch.randn(N_GPU, device=dev), 50, sync), 4 * N_GPU)
    record("normal", "PyTorch (out=)", per_call(lambda: out.normal_(), 50, sync), 4 * N_GPU)
    record("uniform", "PyTorch", per_call(lambda: torch.rand(N_GPU, device=dev), 50, sync), 4 * N_GPU)
    tx = torch.randn(N_GPU, device=dev)
    F = torch.nn.functional
    record("dropout", "PyTorch", per_call(lambda: F.dropout(tx, 0.5, training=True), 50, sync),
           8 * N_GPU)


def _torch_mlp_step():
    """PyTorch eager's SGD step of the dropout MLP (its TF32 setting is the caller's)."""
    import torch
    import mlp_dropout
    F = torch.nn.functional
    dev = torch.device("cuda")
    xv, yv = _mlp_data()
    x, y = torch.from_numpy(xv).to(dev), torch.from_numpy(yv).to(dev)
    sizes = mlp_dropout.SIZES
    g = torch.Generator().manual_seed(0)
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        params.append((torch.randn(n_in, n_out, generator=g) * (2.0 / n_in) ** 0.5).to(dev).requires_grad_())
        params.append(torch.zeros(n_out, device=dev, requires_grad=True))

    def step():
        h = x
        for k in range(0, len(params) - 2, 2):
            h = F.dropout(F.relu(h @ params[k] + params[k + 1]), 0.5, training=True)
        loss = F.cross_entropy(h @ params[-2] + params[-1], y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, gr in zip(params, grads):
                p -= 0.02 * gr
        return loss
    return step


def torch_mlp_contenders(rows: dict) -> None:
    """PyTorch eager's dropout MLP step, full float32 and TF32, added to ``rows``."""
    import torch
    step = _torch_mlp_step()

    def with_tf32(flag: bool):
        def call():
            torch.backends.cuda.matmul.allow_tf32 = flag   # a host setting, per call
            return step()
        return call
    rows[MLP].append(("PyTorch eager", with_tf32(False), torch.cuda.synchronize))
    rows[MLP_TF32].append(("PyTorch eager", with_tf32(True), torch.cuda.synchronize))


def _mlp_data():
    rng = np.random.default_rng(1234)
    centers = rng.standard_normal((10, 784))
    labels = rng.integers(0, 10, size=BATCH)
    return ((centers[labels] + 2.0 * rng.standard_normal((BATCH, 784))).astype("float32"),
            labels.astype("int64"))


def bench_cupy() -> None:
    import cupy
    say(f"CuPy {cupy.__version__}")
    sync = cupy.cuda.get_current_stream().synchronize
    gen = cupy.random.default_rng(0)
    record("normal", "CuPy Generator", per_call(lambda: gen.standard_normal(N_GPU, dtype=cupy.float32), 50, sync), 4 * N_GPU)
    record("uniform", "CuPy Generator", per_call(lambda: gen.random(N_GPU, dtype=cupy.float32), 50, sync), 4 * N_GPU)
    rs = cupy.random.RandomState(0)
    record("normal", "CuPy RandomState", per_call(lambda: rs.standard_normal(N_GPU, dtype=cupy.float32), 50, sync), 4 * N_GPU)


def bench_jax() -> None:
    import jax
    import jax.numpy as jnp
    say(f"JAX {jax.__version__} on {jax.devices()[0]}")
    state = {"key": jax.random.PRNGKey(0)}

    @jax.jit
    def normal(key):
        key, sub = jax.random.split(key)
        return key, jax.random.normal(sub, (N_GPU,), jnp.float32)

    @jax.jit
    def uniform(key):
        key, sub = jax.random.split(key)
        return key, jax.random.uniform(sub, (N_GPU,), jnp.float32)

    def run(fn):
        def call():
            state["key"], state["out"] = fn(state["key"])
        return call

    sync = lambda: state["out"].block_until_ready()  # noqa: E731
    record("normal", "JAX jit", per_call(run(normal), 50, sync), 4 * N_GPU)
    record("uniform", "JAX jit", per_call(run(uniform), 50, sync), 4 * N_GPU)

    jx = jax.device_put(np.random.default_rng(0).standard_normal(N_GPU).astype("float32"))

    @jax.jit
    def dropout(key):
        key, sub = jax.random.split(key)
        return key, jx * jax.random.bernoulli(sub, 0.5, jx.shape) * 2.0
    record("dropout", "JAX jit", per_call(run(dropout), 50, sync), 8 * N_GPU)


def jax_mlp_contenders(rows: dict) -> None:
    """JAX's jitted dropout MLP step at matmul precision "highest" and at its default (TF32
    on NVIDIA GPUs), added to ``rows``; the precision is given to each product, so a call
    needs no configuration context around it."""
    import jax
    import jax.numpy as jnp
    import mlp_dropout
    xv, yv = _mlp_data()
    x, y = jax.device_put(xv), jax.device_put(yv)
    rng = np.random.default_rng(0)
    sizes = mlp_dropout.SIZES
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        params += [jax.device_put((rng.standard_normal((n_in, n_out)) * (2.0 / n_in) ** 0.5).astype("float32")),
                   jax.device_put(np.zeros(n_out, "float32"))]

    def make(precision):
        def loss_fn(params, key):
            h = x
            for k in range(0, len(params) - 2, 2):
                key, sub = jax.random.split(key)
                h = jax.nn.relu(jnp.matmul(h, params[k], precision=precision) + params[k + 1])
                h = h * jax.random.bernoulli(sub, 0.5, h.shape) * 2.0
            logits = jnp.matmul(h, params[-2], precision=precision) + params[-1]
            return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(BATCH), y])

        def step(params, key):
            key, sub = jax.random.split(key)
            loss, grads = jax.value_and_grad(loss_fn)(params, sub)
            return [p - 0.02 * g for p, g in zip(params, grads)], key, loss
        jstep = jax.jit(step)
        st = {"p": params, "key": jax.random.PRNGKey(1)}

        def call():
            st["p"], st["key"], st["out"] = jstep(st["p"], st["key"])
        call()
        return call, lambda: st["out"].block_until_ready()

    for row, precision in ((MLP, jax.lax.Precision.HIGHEST), (MLP_TF32, None)):
        rows[row].append(("JAX jit", *make(precision)))


def bench_mlp_interleaved() -> None:
    """The dropout MLP rows: every contender that builds, timed in interleaved rounds."""
    timed = build_and_time("dropout MLP step", [MLP, MLP_TF32],
                           [("symgpu", symgpu_mlp_contenders), ("PyTorch", torch_mlp_contenders),
                            ("JAX", jax_mlp_contenders)], MLP_STEPS, MLP_ROUNDS, "JAX jit")
    for row, meds in timed.items():
        RESULTS.setdefault(row, {}).update(meds)
    for label, fn in RUNNER_STATS:
        runner = fn.vm.runner
        stats = runner.stats() if hasattr(runner, "stats") else "no CUDA graphs (plain runs)"
        say(f"    {label} runner: {stats}")


# ============================================================================ CPU

def bench_cpu() -> None:
    from symgpu import config, function
    from symgpu.tensor.random import RandomStreams
    say(f"CPU: {N_CPU} float32 numbers")
    with config.change_flags(device="cpu"):
        srng = RandomStreams(seed=1)
        for dist in ("normal", "uniform"):
            f = function([], getattr(srng, dist)((N_CPU,), dtype="float32"))
            record(f"cpu {dist}", "symgpu", per_call(f, 3), 4 * N_CPU)
    for name, gen in (("NumPy Philox", np.random.Generator(np.random.Philox(1))),
                      ("NumPy PCG64", np.random.default_rng(1))):
        record("cpu normal", name, per_call(lambda: gen.standard_normal(N_CPU, dtype=np.float32), 3), 4 * N_CPU)
        record("cpu uniform", name, per_call(lambda: gen.random(N_CPU, dtype=np.float32), 3), 4 * N_CPU)


def ratios() -> None:
    say("== ratios (peer time / symgpu time; > 1: symgpu faster)")
    for workload, row in RESULTS.items():
        base = row.get("symgpu")
        if not base:
            continue
        for who, t in row.items():
            if who != "symgpu":
                say(f"  {workload:16s} vs {who:24s} {t / base:6.2f}x")


def main() -> None:
    cpu_only = "--cpu" in sys.argv
    if "--mlp" in sys.argv:
        os.environ.setdefault("SYMGPU_FLAGS", "device=cuda,floatX=float32")
        bench_mlp_interleaved()
        ratios()
        return
    if not cpu_only:
        os.environ.setdefault("SYMGPU_FLAGS", "device=cuda,floatX=float32")
        say("== GPU")
        guarded("symgpu", bench_symgpu_gpu)
        guarded("PyTorch", bench_torch)
        guarded("CuPy", bench_cupy)
        guarded("JAX", bench_jax)
        guarded("MLP", bench_mlp_interleaved)
        ratios()
        say("== CPU (a fresh process with device=cpu)")
        import subprocess
        env = dict(os.environ, SYMGPU_FLAGS="device=cpu,floatX=float32")
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--cpu"], env=env,
                              capture_output=True, text=True, timeout=600)
        say(proc.stdout + proc.stderr[-2000:])
        return
    guarded("symgpu cpu", bench_cpu)
    ratios()


if __name__ == "__main__":
    main()
