"""Data-parallel training of an MLP from one process driving several GPUs: a rank per named
context, each in a thread of its own, gradients averaged across them (NCCL) before every
update.

    SYMGPU_FLAGS="contexts=dev0->cuda0;dev1->cuda1,floatX=float32" python examples/data_parallel_local.py
    python examples/data_parallel_local.py        # no contexts: a world of one (CPU or GPU)

Every rank prints the same loss: the replicas stay identical.
"""
import os

import numpy as np

import symgpu
import symgpu.distributed as dist
import symgpu.tensor as T
from symgpu import function, shared

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
floatX = symgpu.config.floatX
steps = int(os.environ.get("TRAINING_STEPS", "50"))
per_rank_batch = 64


def replica(rank: int) -> str:
    world = dist.get_world_size()
    where = local.context(rank)                 # this rank's values live on its context
    data = np.random.RandomState(1234)          # the same problem on every rank
    X = data.randn(per_rank_batch * world * 4, 20).astype(floatX)
    Y = (X[:, :10].sum(axis=1) > X[:, 10:].sum(axis=1)).astype("int64")
    init = np.random.RandomState(rank)          # deliberately different: broadcast fixes it
    params = [shared((init.randn(20, 64) * 0.2).astype(floatX), target=where, name="W1"),
              shared(np.zeros(64, dtype=floatX), target=where, name="b1"),
              shared((init.randn(64, 2) * 0.2).astype(floatX), target=where, name="W2"),
              shared(np.zeros(2, dtype=floatX), target=where, name="b2")]
    dist.broadcast_parameters(params, root=0)
    x, y = T.matrix("x"), T.lvector("y")
    W1, b1, W2, b2 = params
    p = T.nnet.softmax(T.dot(T.tanh(T.dot(x, W1) + b1), W2) + b2)
    cost = -T.log(p[T.arange(y.shape[0]), y]).mean()
    grads = T.grad(cost, params)
    lr = np.asarray(0.5, dtype=floatX)
    updates = dist.data_parallel([(q, q - lr * g) for q, g in zip(params, grads)],
                                 grads=grads, params=params)
    train = function([x, y], cost, updates=updates)
    mean_cost = function([x, y], dist.all_reduce(cost, "avg"))
    batches = len(X) // (per_rank_batch * world)
    for step in range(steps):
        lo = ((step % batches) * world + rank) * per_rank_batch
        train(X[lo:lo + per_rank_batch], Y[lo:lo + per_rank_batch])
    mine = slice(rank * len(X) // world, (rank + 1) * len(X) // world)
    return f"rank {rank} of {world} on {where}: loss after {steps} steps " \
           f"{float(mean_cost(X[mine], Y[mine])):.4f}"


with dist.local_world() as local:               # the contexts flag's names, or one rank
    for line in local.run(replica):
        print(line, flush=True)
