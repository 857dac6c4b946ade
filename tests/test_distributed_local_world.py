"""One process driving several GPUs as a data-parallel world (symgpu.distributed.local_world):
a rank per context, each in a thread of its own with its context current and its
communicator bound; NCCL's communicators made and torn down in the ranks' threads (a fake
NCCL here; on two GPUs, tests/test_multigpu.py)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import symgpu.distributed as dist
from symgpu.config import config
import symgpu.gpu.ops.collectives  # noqa: F401  (the GPU backend: NCCL, the context lookup)
from symgpu.distributed import local as lw
from symgpu.distributed import runtime
from symgpu.gpu.runtime import context as gctx
from test_distributed_nccl import FakeNccl


@pytest.fixture
def two_virtual_contexts():
    for k in range(2):
        gctx.register_context(f"lw{k}", device=f"cuda{k}")
    yield ["lw0", "lw1"]
    for k in range(2):
        gctx.unregister_context(f"lw{k}")


def test_each_rank_runs_in_its_thread_with_its_rank_and_host_collectives(two_virtual_contexts):
    world = dist.local_world(two_virtual_contexts, timeout=30)
    assert world.backend == "store" and world.world_size == 2   # virtual contexts: no NCCL
    assert [world.context(r) for r in range(2)] == ["lw0", "lw1"]

    def rank(r):
        got = dist.communicator().all_reduce(np.full(3, r + 1.0), "sum")
        return dist.get_rank(), dist.get_world_size(), threading.get_ident(), got.tolist()
    out = world.run(rank)
    assert [o[:2] for o in out] == [(0, 2), (1, 2)]
    assert threading.get_ident() not in (out[0][2], out[1][2])
    assert [o[3] for o in out] == [[3.0] * 3] * 2
    assert dist.get_rank() == 0 and dist.get_world_size() == 1   # outside: this process alone
    world.close()
    with pytest.raises(dist.DistributedError, match="closed"):
        world.run(rank)


def test_the_contexts_flag_names_the_ranks(two_virtual_contexts):
    with config.change_flags(contexts="lw0->cuda0;lw1->cuda1"):
        assert dist.local_world().contexts == ["lw0", "lw1"]
    with config.change_flags(contexts="", device="cpu"):
        world = dist.local_world()      # none named: a world of one on the default device
    assert world.contexts == ["default"] and world.backend == "store"
    assert world.run(lambda r: (dist.get_rank(), dist.get_world_size())) == [(0, 1)]


def test_bad_worlds_are_refused_naming_why(two_virtual_contexts):
    with pytest.raises(ValueError, match="at least one"):
        dist.LocalWorld([])
    with pytest.raises(ValueError, match="named twice"):
        dist.LocalWorld(["lw0", "lw0"])
    with pytest.raises(dist.DistributedError, match="real GPU"):
        dist.LocalWorld(two_virtual_contexts, backend="nccl")
    with pytest.raises(ValueError, match="unknown backend 'gloo'"):
        dist.LocalWorld(two_virtual_contexts, backend="gloo")
    with pytest.raises(gctx.ContextNotFound, match="no GPU context named 'nope'"):
        dist.LocalWorld(["lw0", "nope"])


class _RealLooking:
    """A context that claims a GPU: activating it records the thread (NCCL's setup and
    teardown must run in the rank's thread, its context current)."""

    virtual = False

    def __init__(self, name, device, log):
        self.name, self.device, self.log = name, device, log

    def activate(self):
        self.log.append((self.name, threading.current_thread().name))
        return self


def test_nccl_communicators_are_made_and_torn_down_in_each_ranks_thread(monkeypatch):
    from symgpu.gpu.ops.collectives import NcclCommunicator
    from symgpu.gpu.ops import nccl_lib
    log: list = []
    ctxs = {f"g{k}": _RealLooking(f"g{k}", f"cuda{k}", log) for k in range(2)}
    monkeypatch.setattr(lw, "_context", ctxs.__getitem__)
    fakes, made = [], []

    def factory(info, host, timeout, context=None):
        fake = FakeNccl()
        fakes.append(fake)
        comm = NcclCommunicator(info, host, timeout, ctx=context, binding=nccl_lib.Nccl(fake),
                                counters=(np.zeros(4, np.uint64), 0), watch=False)
        made.append((info.rank, context.name, threading.current_thread().name))
        return comm
    monkeypatch.setitem(runtime._BACKENDS, "nccl", factory)
    world = dist.local_world(["g0", "g1"], timeout=30)
    assert world.backend == "nccl"
    assert sorted((r, name) for r, name, _ in made) == [(0, "g0"), (1, "g1")]
    assert sorted(t for _, _, t in made) == ["rank0", "rank1"]      # each in its rank's thread
    comms = [world.communicator(r) for r in range(2)]
    assert [c.rank for c in comms] == [0, 1] and [c.ctx.name for c in comms] == ["g0", "g1"]
    uids = [f.log[[n for n, _ in f.log].index("ncclCommInitRankConfig")][1][2] for f in fakes]
    assert bytes(uids[0]) == bytes(uids[1]) == b"\x07" * 128    # rank 0's id, shared
    seen = world.run(lambda r: (dist.get_rank(), dist.communicator() is comms[r]))
    assert seen == [(0, True), (1, True)]
    del log[:]
    world.close()
    assert all([n for n, _ in f.log][-1] == "ncclCommDestroy" for f in fakes)
    assert set(log) == {("g0", "rank0"), ("g1", "rank1")}   # on its context, in its thread


def test_a_collective_on_another_device_than_the_threads_communicator_is_refused(monkeypatch):
    from symgpu.gpu.ops.collectives import GpuAllReduce
    from test_distributed_comm_stream import FakeNcclComm
    import graph_fakes as fakes
    gen = fakes.use_fake_gpu(monkeypatch)
    ctx = next(gen)
    comm = FakeNcclComm([])
    comm.ctx = _RealLooking("other", "cuda7", [])
    x = fakes.gvec()
    node = GpuAllReduce("sum", "world")(x).owner
    storage = {v: [None] for v in node.inputs + node.outputs}
    with dist.use_communicator(comm), pytest.raises(
            dist.DistributedError, match=r"on cuda0 .* communicator of group 'world' is on "
                                         r"cuda7: in a local world"):
        node.op.make_thunk(node, storage, {v: [False] for v in storage}, [])
    for _ in gen:
        pass


def _replica_grads(ctx_name: str):
    """An MLP's gradients averaged over the world, its parameters inputs on ``ctx_name``."""
    import symgpu.tensor as T
    from symgpu import function
    from symgpu.gpu.placement.type import GpuArrayType
    W1, W2 = (GpuArrayType("float32", (False, False), context_name=ctx_name)(n)
              for n in ("W1", "W2"))
    b1 = GpuArrayType("float32", (False,), context_name=ctx_name)("b1")
    x, y = T.fmatrix("x"), T.ivector("y")
    p = T.nnet.softmax(T.dot(T.tanh(T.dot(x, W1) + b1), W2))
    cost = -T.log(p[T.arange(y.shape[0]), y]).mean()
    params = [W1, b1, W2]
    return function([x, y, *params], dist.data_parallel(T.grad(cost, params)))


def test_each_ranks_step_is_placed_on_its_own_context(two_virtual_contexts):
    from symgpu.gpu.placement.type import is_gpu_var
    world = dist.local_world(two_virtual_contexts, timeout=60)

    def rank(r):
        nodes = _replica_grads(world.context(r)).maker.fgraph.apply_nodes
        names = {type(n.op).__name__ for n in nodes}
        where = {v.type.context_name for n in nodes for v in n.outputs if is_gpu_var(v)}
        return names, where
    with config.change_flags(floatX="float32"):
        out = world.run(rank)
    for r, (names, where) in enumerate(out):
        assert "GpuAllReduce" in names and "GpuToGpu" not in names
        assert where == {f"lw{r}"}


def test_the_one_process_example_runs_as_a_world_of_one_on_the_cpu():
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, SYMGPU_FLAGS="device=cpu,floatX=float32", TRAINING_STEPS="20",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(root, "examples",
                                                        "data_parallel_local.py")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("rank 0 of 1 on default: loss after 20 steps"), proc.stdout
