"""Data-parallel training of an MLP: one process per GPU, each on its share of the batch,
gradients averaged across processes (NCCL on GPUs) before every update.

    torchrun --nproc_per_node=2 examples/data_parallel_mlp.py       # 2 GPUs
    mpirun -n 2 python examples/data_parallel_mlp.py                # with mpi4py
    python examples/data_parallel_mlp.py                            # one process (CPU or GPU)

Every rank prints the same loss: the replicas stay identical.
"""
import os

import numpy as np

import symgpu
import symgpu.distributed as dist
import symgpu.tensor as T
from symgpu import function, shared

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
dist.init()                                  # device cuda{LOCAL_RANK} where there is a GPU
rank, world = dist.get_rank(), dist.get_world_size()
floatX = symgpu.config.floatX
steps = int(os.environ.get("TRAINING_STEPS", "50"))
per_rank_batch = 64

# the same synthetic problem on every rank; each rank reads its own slice of every batch
data = np.random.RandomState(1234)
X = data.randn(per_rank_batch * world * 4, 20).astype(floatX)
Y = (X[:, :10].sum(axis=1) > X[:, 10:].sum(axis=1)).astype("int64")

init = np.random.RandomState(rank)           # deliberately different: broadcast fixes it
params = [shared((init.randn(20, 64) * 0.2).astype(floatX), name="W1"),
          shared(np.zeros(64, dtype=floatX), name="b1"),
          shared((init.randn(64, 2) * 0.2).astype(floatX), name="W2"),
          shared(np.zeros(2, dtype=floatX), name="b2")]
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
    b = step % batches
    lo = (b * world + rank) * per_rank_batch
    train(X[lo:lo + per_rank_batch], Y[lo:lo + per_rank_batch])
mine = slice(rank * len(X) // world, (rank + 1) * len(X) // world)
loss = float(mean_cost(X[mine], Y[mine]))
print(f"rank {rank} of {world} on {symgpu.config.device}: loss after {steps} steps "
      f"{loss:.4f}", flush=True)
dist.finalize()
