"""Data-parallel benchmarks on NCCL, symgpu against torch.distributed in the same run.

    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=2 benchmarks/distributed.py [--rounds 7]

Part 1: all-reduce bus bandwidth of float32 buffers, 1 MB .. 1 GB: busbw = size * 2(n-1)/n /
time (nccl-tests' definition), medians of interleaved rounds (symgpu, torch, symgpu, ...);
symgpu as compiled by default (its NCCL call replayed from a CUDA graph) and, beside it, the
same function without CUDA graphs (the ratio is the default's).
Part 2: data-parallel training steps at a fixed per-GPU batch, the MLP (784-1024-1024-10,
batch 256) and LeNet (benchmarks/convnet.py's network, batch 128): symgpu's step
(data_parallel buckets, batch and parameters on the device) against PyTorch DDP as its
experts tune it (bucket_cap_mb=25, gradient_as_bucket_view, static_graph), eager and with
the whole step captured in a CUDA graph (the faster counts), and
the same networks' plain steps on one GPU (no collectives) in the same run: throughput on
one GPU, on the world, and the scaling ratio (world / one GPU).  Rank 0 prints the tables.
``--batch``/``--lenet-batch`` set the per-GPU batches, ``--bucket-mb 25,2`` sweeps the bucket
size of both contenders, ``--nets mlp`` and ``--skip-allreduce`` leave parts out.

Seen on two H200s (NVLink, NCCL 2.28.9): at batch 256 per GPU an MLP step is ~140 us and the
all-reduce of its 7.4 MB of gradients is not hidden (scaling 1.15); at 4096 per GPU it scales
1.69 with 25 MB buckets and 1.83 with 2 MB ones (the 4 MB W2 bucket then overlaps W1's
gradient), DDP 1.42-1.49.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
import symgpu  # noqa: E402
import symgpu.distributed as sdist  # noqa: E402
import symgpu.tensor as T  # noqa: E402
from symgpu import function, shared  # noqa: E402
import torch  # noqa: E402
import torch.distributed as tdist  # noqa: E402


def timed(fn, sync, iters):
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters


def allreduce_table(rounds, world, rank, ctx):
    """Bus bandwidth per buffer size: symgpu's all-reduce as a compiled function (its NCCL call
    replayed from a CUDA graph), the same compiled without CUDA graphs (NCCL launched
    eagerly, as torch's), and torch.distributed's, in interleaved rounds."""
    rows = []
    for mb in (1, 4, 16, 64, 256, 1024):
        n = mb * (1 << 20) // 4
        v = shared(np.ones(n, dtype="float32"))
        f = function([], sdist.all_reduce(v, "sum").transfer(None))
        with symgpu.config.change_flags(**{"gpuarray.cuda_graphs": False}):
            g = function([], sdist.all_reduce(v, "sum").transfer(None))
        t = torch.ones(n, dtype=torch.float32, device=f"cuda:{sdist.local_rank}")
        iters = max(5, min(200, 2000 // mb))
        times: dict[str, list[float]] = {"graph": [], "plain": [], "torch": []}
        f(), g()
        tdist.all_reduce(t)
        for _ in range(rounds):
            times["graph"].append(timed(f, ctx.synchronize, iters))
            times["plain"].append(timed(g, ctx.synchronize, iters))
            times["torch"].append(timed(lambda: tdist.all_reduce(t), torch.cuda.synchronize,
                                        iters))
        bus = n * 4 * 2 * (world - 1) / world
        rows.append((mb, *(bus / statistics.median(times[k]) / 1e9
                           for k in ("graph", "plain", "torch"))))
    if rank == 0:
        print(f"all-reduce bus bandwidth, {world} GPUs (GB/s, medians of {rounds} rounds; "
              f"symgpu from its CUDA graph, and without graphs)")
        print(f"{'MB':>6} {'symgpu':>10} {'no graphs':>10} {'torch':>10} {'ratio':>7}")
        for mb, a, p, b in rows:
            print(f"{mb:>6} {a:>10.1f} {p:>10.1f} {b:>10.1f} {a / b:>7.3f}")


# ----------------------------------------------------------------------------- training steps
# Each builder returns (symgpu step, torch step) for one GPU of a world: ``parallel`` True
# gives symgpu's data_parallel step and the DDP-wrapped model, False the plain single-GPU
# step (no collectives) of the same network and batch: the 1-GPU throughput of the ratio.

#: gradient bucket size of both contenders (--bucket-mb; 25: DDP's default, data_parallel's)
BUCKET_MB = 25.0


def _symgpu_sgd(params, cost, lr, parallel, inputs=()):
    grads = T.grad(cost, params)
    ups = [(p, p - np.float32(lr) * g) for p, g in zip(params, grads)]
    if parallel:
        ups = sdist.data_parallel(ups, grads=grads, params=params,
                                  bucket_bytes=int(BUCKET_MB * (1 << 20)))
    return function(list(inputs), [], updates=ups)


def _ddp(model, dev, parallel):
    """PyTorch DDP as its documentation tunes it: 25 MB buckets (--bucket-mb), gradients as
    views of the buckets (no copy in and out), static graph (the bucket order learnt once)."""
    if not parallel:
        return model
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index],
                                                     bucket_cap_mb=BUCKET_MB,
                                                     gradient_as_bucket_view=True,
                                                     static_graph=True)


def _torch_step(model, lr, x, y):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    return step


def _graphed_step(model, dev, parallel, lr, x, y, warmup=11):
    """The whole step (forward, backward with DDP's all-reduces, SGD) replayed from one CUDA
    graph, as PyTorch's CUDA-graph notes do it with DDP: the wrapper built on a side stream,
    11 eager warm-up steps there, then the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step = _torch_step(_ddp(model, dev, parallel), lr, x, y)
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def _torch_variants(make_model, dev, parallel, lr, x, y, rank):
    """PyTorch's step both ways its experts run it: eager, and captured whole in a CUDA graph
    (a model of its own each: two DDP wrappers may not share parameters).  A capture that
    fails is reported and left out."""
    out = {"eager": _torch_step(_ddp(make_model().to(dev), dev, parallel), lr, x, y)}
    try:
        out["graph"] = _graphed_step(make_model().to(dev), dev, parallel, lr, x, y)
    except Exception as exc:   # the eager step still runs; the table says which ran
        print(f"  rank {rank}: PyTorch's CUDA-graph step failed ({type(exc).__name__}: {exc})")
    # every rank must time the same steps (a DDP graph replayed on one rank alone would wait
    # for its peers forever): keep the graph only where every rank captured it
    ok = torch.tensor([int("graph" in out)], device=dev)
    tdist.all_reduce(ok, op=tdist.ReduceOp.MIN)
    if not int(ok.item()):
        out.pop("graph", None)
    return out


def mlp_steps(rank, batch, parallel):
    """784-1024-1024-10 ReLU MLP, softmax cross-entropy, SGD 0.01."""
    rng = np.random.RandomState(rank)
    sizes = [784, 1024, 1024, 10]
    Ws = [(rng.randn(a, b) * 0.05).astype("float32") for a, b in zip(sizes, sizes[1:])]
    params = []
    for W in Ws:
        params += [shared(W), shared(np.zeros(W.shape[1], "float32"))]
    X = rng.randn(batch, 784).astype("float32")
    Y = rng.randint(0, 10, batch).astype("int32")
    xs, ys = shared(X), shared(Y)               # the batch lives on the device, as torch's
    h = xs
    for i in range(0, len(params), 2):
        h = T.dot(h, params[i]) + params[i + 1]
        if i + 2 < len(params):
            h = T.nnet.relu(h)
    cost = T.nnet.categorical_crossentropy(T.nnet.softmax(h), ys).mean()
    ours = _symgpu_sgd(params, cost, 0.01, parallel)
    dev = torch.device(f"cuda:{sdist.local_rank}")

    def make_model():
        layers = []
        for W in Ws:
            layers += [torch.nn.Linear(*W.shape), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers[:-1])
    theirs = _torch_variants(make_model, dev, parallel, 0.01, torch.from_numpy(X).to(dev),
                             torch.from_numpy(Y).long().to(dev), rank)
    return ours, theirs


LENET_SHAPES = [(20, 1, 5, 5), (20,), (50, 20, 5, 5), (50,), (800, 500), (500,), (500, 10),
                (10,)]


def lenet_steps(rank, batch, parallel):
    """benchmarks/convnet.py's network (Theano's LeNet tutorial): conv 20 5x5, tanh, max-pool
    2; conv 50 5x5, tanh, max-pool 2; dense 500 tanh; dense 10 softmax; SGD 0.1."""
    from symgpu.tensor.nnet import conv2d
    from symgpu.tensor.signal.pool import pool_2d
    rng = np.random.default_rng(rank)
    x0 = rng.normal(size=(batch, 1, 28, 28)).astype("float32")
    y0 = rng.integers(0, 10, batch)
    p0 = []
    for s in LENET_SHAPES:
        fan_in = int(np.prod(s[1:])) if len(s) > 1 else 1
        p0.append(np.zeros(s, "float32") if len(s) == 1 else
                  (rng.uniform(-1, 1, s) / np.sqrt(fan_in)).astype("float32"))
    x, y = shared(x0), shared(np.eye(10, dtype="float32")[y0])
    ps = [shared(p.copy()) for p in p0]
    w1, b1, w2, b2, w3, b3, w4, b4 = ps
    h = pool_2d(T.tanh(conv2d(x, w1) + b1.dimshuffle("x", 0, "x", "x")), (2, 2),
                ignore_border=True)
    h = pool_2d(T.tanh(conv2d(h, w2) + b2.dimshuffle("x", 0, "x", "x")), (2, 2),
                ignore_border=True)
    h = T.tanh(T.dot(h.flatten(2), w3) + b3)
    cost = T.mean(T.nnet.categorical_crossentropy(T.nnet.softmax(T.dot(h, w4) + b4), y))
    ours = _symgpu_sgd(ps, cost, 0.1, parallel)
    dev = torch.device(f"cuda:{sdist.local_rank}")
    nn = torch.nn

    def make_model():
        return nn.Sequential(nn.Conv2d(1, 20, 5), nn.Tanh(), nn.MaxPool2d(2),
                             nn.Conv2d(20, 50, 5), nn.Tanh(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(800, 500), nn.Tanh(), nn.Linear(500, 10))
    theirs = _torch_variants(make_model, dev, parallel, 0.1, torch.from_numpy(x0).to(dev),
                             torch.from_numpy(y0).long().to(dev), rank)
    return ours, theirs


def scaling_table(name, build, rounds, world, rank, ctx, batch, iters=50):
    """Throughput (samples/s over the world) of the data-parallel step on ``world`` GPUs and
    of the plain step on one GPU, symgpu and PyTorch (eager and CUDA-graphed: the faster
    counts, on each side), medians of interleaved rounds; the scaling ratio is world
    throughput / one GPU's."""
    par_ours, par_theirs = build(rank, batch, True)
    one_ours, one_theirs = build(rank, batch, False)
    contenders = {"symgpu": (par_ours, ctx.synchronize), "symgpu 1": (one_ours, ctx.synchronize)}
    for way, fn in par_theirs.items():
        contenders[f"DDP {way}"] = (fn, _tsync)
    for way, fn in one_theirs.items():
        contenders[f"torch 1 {way}"] = (fn, _tsync)
    times = {k: [] for k in contenders}
    for fn, _ in contenders.values():           # first calls: compile, capture, warm up
        fn()
        fn()
    for _ in range(rounds):
        for k, (fn, sync) in contenders.items():
            times[k].append(timed(fn, sync, iters))
    med = {k: statistics.median(v) for k, v in times.items()}
    best_ddp = min((k for k in med if k.startswith("DDP ")), key=med.__getitem__)
    best_one = min((k for k in med if k.startswith("torch 1 ")), key=med.__getitem__)
    n_ours, n_theirs = batch * world / med["symgpu"], batch * world / med[best_ddp]
    o_ours, o_theirs = batch / med["symgpu 1"], batch / med[best_one]
    if rank == 0:
        print(f"\ndata-parallel {name} step, batch {batch} per GPU (samples/s, medians of "
              f"{rounds} rounds)")
        print(f"{'':>8} {'1 GPU':>12} {f'{world} GPUs':>12} {'scaling':>8}")
        print(f"{'symgpu':>8} {o_ours:>12.0f} {n_ours:>12.0f} {n_ours / o_ours:>8.3f}")
        print(f"{'PyTorch':>8} {o_theirs:>12.0f} {n_theirs:>12.0f} {n_theirs / o_theirs:>8.3f}"
              f"   ({best_one.split()[-1]} on 1, DDP {best_ddp.split()[-1]} on {world})")
        others = ", ".join(f"{k} {batch * (world if k.startswith('DDP') else 1) / v:.0f}"
                           for k, v in med.items() if k.startswith(("DDP", "torch")))
        print(f"  PyTorch, every way: {others}")
        print(f"symgpu / PyTorch on {world} GPUs: {n_ours / n_theirs:.3f}")


def _tsync():
    torch.cuda.synchronize()


def main():
    global BUCKET_MB
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch", type=int, default=256, help="MLP batch per GPU")
    ap.add_argument("--lenet-batch", type=int, default=128, help="LeNet batch per GPU")
    ap.add_argument("--skip-allreduce", action="store_true")
    ap.add_argument("--nets", default="mlp,lenet", help="which steps: mlp, lenet")
    ap.add_argument("--bucket-mb", default="25",
                    help="gradient bucket size of both contenders (MB); a comma list sweeps")
    args = ap.parse_args()
    symgpu.config.floatX = "float32"
    sdist.init()
    world, rank = sdist.get_world_size(), sdist.get_rank()
    torch.cuda.set_device(sdist.local_rank)
    tdist.init_process_group("nccl")
    from symgpu.gpu import get_context
    ctx = get_context(None)
    if not args.skip_allreduce:
        allreduce_table(args.rounds, world, rank, ctx)
    nets = args.nets.split(",")
    for mb in args.bucket_mb.split(","):
        BUCKET_MB = float(mb)
        if "mlp" in nets:
            scaling_table(f"MLP 784-1024-1024-10 ({BUCKET_MB:g} MB buckets)", mlp_steps,
                          args.rounds, world, rank, ctx, args.batch)
        if "lenet" in nets:
            scaling_table(f"LeNet ({BUCKET_MB:g} MB buckets)", lenet_steps, args.rounds,
                          world, rank, ctx, args.lenet_batch)
    tdist.destroy_process_group()
    sdist.finalize()


if __name__ == "__main__":
    main()
