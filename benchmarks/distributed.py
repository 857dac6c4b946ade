"""Data-parallel benchmarks on NCCL, symgpu against torch.distributed in the same run.

    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=2 benchmarks/distributed.py [--rounds 7]

Part 1: all-reduce bus bandwidth of float32 buffers, 1 MB .. 1 GB: busbw = size * 2(n-1)/n /
time (nccl-tests' definition), medians of interleaved rounds (symgpu, torch, symgpu, ...).
Part 2: a data-parallel MLP step (784-1024-1024-10, fixed per-GPU batch): symgpu's step
(data_parallel buckets) against PyTorch DDP (bucket_cap_mb=25, gradient_as_bucket_view, CUDA
graph-free eager step, as its documentation writes it), throughput on this world size; run it
once with --nproc_per_node=1 for the scaling ratio.  LeNet is not in this script yet.
Rank 0 prints the tables.
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
    rows = []
    for mb in (1, 4, 16, 64, 256, 1024):
        n = mb * (1 << 20) // 4
        v = shared(np.ones(n, dtype="float32"))
        f = function([], sdist.all_reduce(v, "sum").transfer(None))
        t = torch.ones(n, dtype=torch.float32, device=f"cuda:{sdist.local_rank}")
        iters = max(5, min(200, 2000 // mb))
        ours, theirs = [], []
        f()
        tdist.all_reduce(t)
        for _ in range(rounds):
            ours.append(timed(f, ctx.synchronize, iters))
            theirs.append(timed(lambda: tdist.all_reduce(t), torch.cuda.synchronize, iters))
        bus = n * 4 * 2 * (world - 1) / world
        a, b = bus / statistics.median(ours) / 1e9, bus / statistics.median(theirs) / 1e9
        rows.append((mb, a, b))
    if rank == 0:
        print(f"all-reduce bus bandwidth, {world} GPUs (GB/s, medians of {rounds} rounds)")
        print(f"{'MB':>6} {'symgpu':>10} {'torch':>10} {'ratio':>7}")
        for mb, a, b in rows:
            print(f"{mb:>6} {a:>10.1f} {b:>10.1f} {a / b:>7.3f}")


def mlp_table(rounds, world, rank, ctx, batch):
    rng = np.random.RandomState(0)
    sizes = [784, 1024, 1024, 10]
    Ws = [(rng.randn(a, b) * 0.05).astype("float32") for a, b in zip(sizes, sizes[1:])]
    params = []
    for W in Ws:
        params += [shared(W), shared(np.zeros(W.shape[1], "float32"))]
    x, y = T.fmatrix(), T.ivector()
    h = x
    for i in range(0, len(params), 2):
        h = T.dot(h, params[i]) + params[i + 1]
        if i + 2 < len(params):
            h = T.nnet.relu(h)
    cost = T.nnet.categorical_crossentropy(T.nnet.softmax(h), y).mean()
    grads = T.grad(cost, params)
    lr = np.float32(0.01)
    ups = sdist.data_parallel([(p, p - lr * g) for p, g in zip(params, grads)], grads=grads,
                              params=params)
    step = function([x, y], [], updates=ups)
    X = rng.randn(batch, 784).astype("float32")
    Y = rng.randint(0, 10, batch).astype("int32")
    dev = torch.device(f"cuda:{sdist.local_rank}")
    layers = []
    for W in Ws:
        lin = torch.nn.Linear(*W.shape)
        layers += [lin, torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index],
                                                    bucket_cap_mb=25,
                                                    gradient_as_bucket_view=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    tx, ty = torch.from_numpy(X).to(dev), torch.from_numpy(Y).long().to(dev)
    loss_fn = torch.nn.CrossEntropyLoss()

    def torch_step():
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(tx), ty).backward()
        opt.step()
    ours, theirs = [], []
    step(X, Y)
    torch_step()
    for _ in range(rounds):
        ours.append(timed(lambda: step(X, Y), ctx.synchronize, 50))
        theirs.append(timed(torch_step, torch.cuda.synchronize, 50))
    a = batch * world / statistics.median(ours)
    b = batch * world / statistics.median(theirs)
    if rank == 0:
        print(f"\ndata-parallel MLP step, {world} GPUs, batch {batch} per GPU (samples/s)")
        print(f"{'symgpu':>12} {'DDP':>12} {'ratio':>7}")
        print(f"{a:>12.0f} {b:>12.0f} {a / b:>7.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    symgpu.config.floatX = "float32"
    sdist.init()
    world, rank = sdist.get_world_size(), sdist.get_rank()
    torch.cuda.set_device(sdist.local_rank)
    tdist.init_process_group("nccl")
    from symgpu.gpu import get_context
    ctx = get_context(None)
    allreduce_table(args.rounds, world, rank, ctx)
    mlp_table(args.rounds, world, rank, ctx, args.batch)
    tdist.destroy_process_group()
    sdist.finalize()


if __name__ == "__main__":
    main()
