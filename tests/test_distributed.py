"""symgpu.distributed on the CPU: collectives and the data-parallel rewrite in fake worlds of
threads (results equal the single-process full-batch ones), a dead rank, mismatched graphs,
the launchers' environment contract, the TCP store across processes, and the GPU ops'
placement on a virtual GPU.  NCCL's binding and watchdog: tests/test_distributed_nccl.py."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
import symgpu.distributed as dist
from symgpu import function, shared
from symgpu.distributed import ThreadWorld

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
rng = np.random.RandomState(7)


def _ops_of(f) -> list[str]:
    return [type(n.op).__name__ for n in f.maker.fgraph.toposort()]


# ----------------------------------------------------------------------------- collectives

@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "avg"])
def test_all_reduce_in_a_world_of_three_equals_numpy(op):
    data = [rng.uniform(0.5, 1.5, size=(4, 3)) for _ in range(3)]
    world = ThreadWorld(3, timeout=30)

    def rank(r):
        x = T.dmatrix()
        f = function([x], dist.all_reduce(x * 1.0, op))
        assert "AllReduce" in _ops_of(f)
        return f(data[r])
    want = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min,
            "avg": np.mean}[op](np.stack(data), axis=0)
    for got in world.run(rank):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_broadcast_all_gather_reduce_scatter_equal_numpy():
    data = [rng.randn(4, 2) for _ in range(2)]
    world = ThreadWorld(2, timeout=30)

    def rank(r):
        x = T.dmatrix()
        f = function([x], [dist.broadcast(x, root=1), dist.all_gather(x),
                           dist.reduce_scatter(x, "sum")])
        return f(data[r])
    full = data[0] + data[1]
    for r, (b, g, s) in enumerate(world.run(rank)):
        np.testing.assert_array_equal(b, data[1])
        np.testing.assert_array_equal(g, np.concatenate(data))
        np.testing.assert_allclose(s, full[2 * r:2 * r + 2])


def test_collective_gradients_are_the_collectives_of_the_output_gradients():
    data = [rng.randn(4) for _ in range(2)]
    world = ThreadWorld(2, timeout=30)

    def rank(r):
        x = T.dvector()
        w = np.arange(1.0, 5.0) * (r + 1)
        g_ar = T.grad((dist.all_reduce(x, "sum") * w).sum(), x)
        g_ag = T.grad((dist.all_gather(x) * np.arange(8.0)).sum(), x)
        g_rs = T.grad((dist.reduce_scatter(x, "avg") * np.arange(2.0)).sum(), x)
        return function([x], [g_ar, g_ag, g_rs])(data[r])
    out = world.run(rank)
    for r, (g_ar, g_ag, g_rs) in enumerate(out):
        # every rank's cost depends on x through the sum: the gradients add up over ranks
        np.testing.assert_allclose(g_ar, np.arange(1.0, 5.0) * 3)
        # d/dx_r of sum over ranks of gathered . arange(8): this rank's slice, twice
        np.testing.assert_allclose(g_ag, 2 * np.arange(8.0)[4 * r:4 * r + 4])
        np.testing.assert_allclose(g_rs, np.concatenate([np.arange(2.0)] * 2) / 2)


def test_broadcast_has_no_gradient_and_says_why():
    with dist.use_communicator(dist.SelfCommunicator()):
        x = T.dvector()
        with pytest.raises(Exception, match="broadcast_parameters"):
            T.grad(dist.broadcast(x).sum(), x)


def test_a_world_of_one_is_the_identity_and_ops_need_a_communicator():
    x = T.dvector()
    v = rng.randn(5)
    f = function([x], [dist.all_reduce(x, group="self"), dist.all_gather(x, group="self")])
    a, g = f(v)
    np.testing.assert_array_equal(a, v)
    np.testing.assert_array_equal(g, v)
    y = dist.all_reduce(x * 2, group="nobody")
    with pytest.raises(dist.DistributedError, match="no communicator for the group 'nobody'"):
        function([x], y)


def test_bad_arguments_name_the_op_and_types():
    with pytest.raises(TypeError, match="'avg' reduction needs floats, got int64"):
        dist.all_reduce(T.lvector(), "avg", group="self")
    with pytest.raises(ValueError, match="unknown reduce op 'mean'"):
        dist.AllReduce("mean")
    world = ThreadWorld(2, timeout=30)

    def rank(r):
        x = T.dvector()
        return function([x], dist.reduce_scatter(x))(np.ones(3))
    with pytest.raises(ValueError, match=r"first dimension \(\(3,\)\) must split into 2"):
        world.run(rank)


def test_ranks_passing_different_shapes_are_named():
    world = ThreadWorld(2, timeout=30)

    def rank(r):
        x = T.dvector()
        return function([x], dist.all_reduce(x))(np.ones(3 + r))
    with pytest.raises(dist.CollectiveMismatchError, match=r"rank 1 gave shape \(4,\)"):
        world.run(rank)


# ----------------------------------------------------------------------------- faults

def test_a_dead_rank_makes_the_others_time_out_with_a_clear_error():
    world = ThreadWorld(2, timeout=0.5)

    def rank(r):
        x = T.dvector()
        f = function([x], dist.all_reduce(x))
        if r == 1:
            return None                     # compiled, then died before its first step
        return f(np.ones(3))
    with pytest.raises(dist.DistributedTimeoutError,
                       match=r"all_reduce sum of shape \(3,\).*rank 1 did not answer within "
                             r"0.5 s \(distributed.timeout\): it died, hangs"):
        world.run(rank)


def test_a_rank_dead_from_the_start_fails_the_compile_of_the_others():
    world = ThreadWorld(2, timeout=0.5)

    def rank(r):
        x = T.dvector()
        return function([x], dist.all_reduce(x))
    with pytest.raises(dist.DistributedTimeoutError,
                       match=r"schedule check.*rank 1 did not answer within 0.5 s"):
        world.run(rank, ranks=[0])      # rank 1 never starts


def test_the_timeout_flag_is_the_default_timeout():
    with symgpu.config.change_flags(**{"distributed.timeout": 3.5}):
        assert ThreadWorld(2).communicator(0).timeout == 3.5


def test_mismatched_graphs_are_detected_before_the_first_collective():
    world = ThreadWorld(3, timeout=30)
    ran = []

    def rank(r):
        x = T.dmatrix()
        y = dist.all_reduce(x, "sum")
        z = dist.all_reduce(y.sum(axis=0), "max" if r == 2 else "sum")
        try:
            f = function([x], z)
        except dist.CollectiveMismatchError as exc:
            return str(exc)
        ran.append(r)
        return None
    msgs = world.run(rank)
    assert not ran, "no rank may compile a function whose collectives differ"
    assert "rank 2 differs from rank 0 first at collective #2" in msgs[0]
    assert "AllReduce{max, world}" in msgs[0] and "AllReduce{sum, world}" in msgs[0]
    assert "rank 0 differs from rank 2" in msgs[2] or "rank 1 differs from rank 2" in msgs[2]


def test_schedule_comparison_names_a_missing_collective():
    from symgpu.distributed.schedule import compare_schedules
    msg = compare_schedules(["a", "b"], [["a", "b"], ["a"]], 0)
    assert "rank 1 differs from rank 0 first at collective #2" in msg
    assert "its schedule ends" in msg
    assert compare_schedules(["a"], [["a"], ["a"]], 1) is None


# ----------------------------------------------------------------------------- data parallel

def _mlp(seed=0):
    r = np.random.RandomState(seed)
    W1 = shared(r.randn(5, 8) * 0.3, name="W1")
    b1 = shared(np.zeros(8), name="b1")
    W2 = shared(r.randn(8, 3) * 0.3, name="W2")
    b2 = shared(np.zeros(3), name="b2")
    return [W1, b1, W2, b2]


def _step(params, parallel, bucket_bytes=dist.DEFAULT_BUCKET_BYTES):
    W1, b1, W2, b2 = params
    x, y = T.dmatrix("x"), T.lvector("y")
    h = T.tanh(T.dot(x, W1) + b1)
    p = T.nnet.softmax(T.dot(h, W2) + b2)
    cost = -T.log(p[T.arange(y.shape[0]), y]).mean()
    grads = T.grad(cost, params)
    updates = [(q, q - 0.5 * g) for q, g in zip(params, grads)]
    if parallel:
        updates = dist.data_parallel(updates, grads=grads, params=params,
                                     bucket_bytes=bucket_bytes)
    return function([x, y], cost, updates=updates)


@pytest.mark.parametrize("bucket_bytes", [dist.DEFAULT_BUCKET_BYTES, 100])
def test_data_parallel_shards_equal_the_full_batch(bucket_bytes):
    X, Y = rng.randn(12, 5), rng.randint(0, 3, 12)
    full = _mlp()
    f = _step(full, False)
    for _ in range(3):
        f(X, Y)
    world = ThreadWorld(3, timeout=60)

    def rank(r):
        params = _mlp(seed=100 + r)            # different starts: broadcast makes them equal
        dist.broadcast_parameters(params, root=0)
        g = _step(params, True, bucket_bytes)
        n_reduce = _ops_of(g).count("AllReduce")
        for _ in range(3):
            g(X[4 * r:4 * r + 4], Y[4 * r:4 * r + 4])
        return [q.get_value() for q in params], n_reduce
    start = _mlp(seed=100)
    f0 = _step(start, False)
    for _ in range(3):
        f0(X, Y)
    for values, n_reduce in world.run(rank):
        assert n_reduce == (1 if bucket_bytes > 1000 else 4)
        for got, want in zip(values, start):
            np.testing.assert_allclose(got, want.get_value(), rtol=1e-10, atol=1e-12)


def test_buckets_fill_in_reverse_order_by_size_and_dtype():
    g = [T.dvector(), T.dvector(), T.fvector(), T.dvector(), T.dvector()]
    sizes = [800, 800, 400, 8, 8]
    assert dist.plan_buckets(g, sizes, 1000) == [[4, 3], [2], [1], [0]]
    assert dist.plan_buckets(g, [None] * 5, 1000) == [[4], [3], [2], [1], [0]]
    assert dist.plan_buckets(g[:2], sizes[:2], 2000) == [[1, 0]]


def test_data_parallel_of_grads_returns_reduced_grads_in_order():
    with dist.use_communicator(dist.SelfCommunicator()):
        a, b = shared(np.ones(3)), shared(np.ones((2, 2)))
        cost = (a.sum() * 2 + (b ** 2).sum())
        ga, gb = T.grad(cost, [a, b])
        ra, rb = dist.data_parallel([ga, gb], params=[a, b])
        f = function([], [ra, rb])
        assert _ops_of(f).count("AllReduce") == 1
        va, vb = f()
        np.testing.assert_allclose(va, 2 * np.ones(3))
        np.testing.assert_allclose(vb, 2 * np.ones((2, 2)))
    with pytest.raises(TypeError, match="grads="):
        dist.data_parallel([(a, a - ga)])


# ----------------------------------------------------------------------------- launchers

def test_environment_contracts_of_the_launchers():
    from symgpu.distributed.env import launch_info
    t = launch_info({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                     "MASTER_ADDR": "node0", "MASTER_PORT": "29500",
                     "TORCHELASTIC_RUN_ID": "x"})
    assert (t.launcher, t.rank, t.world_size, t.local_rank, t.local_world_size) == \
        ("torchrun", 3, 4, 1, 2)
    assert (t.master_addr, t.master_port, t.agent_store) == ("node0", 29500, True)
    o = launch_info({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                     "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert (o.launcher, o.rank, o.world_size, o.local_rank, o.agent_store) == \
        ("openmpi", 1, 2, 1, False)
    p = launch_info({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0"})
    assert (p.launcher, p.rank, p.local_rank) == ("mpich", 2, 0)
    s = launch_info({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
                     "SLURM_NTASKS_PER_NODE": "4(x2)"})
    assert (s.launcher, s.rank, s.world_size, s.local_rank, s.local_world_size) == \
        ("slurm", 5, 8, 1, 4)
    n = launch_info({})
    assert (n.launcher, n.rank, n.world_size, n.local_rank) == ("none", 0, 1, 0)
    with pytest.raises(dist.LaunchError, match="RANK=4 is not a rank of a world of"):
        launch_info({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(dist.LaunchError, match="WORLD_SIZE='two' is not an integer"):
        launch_info({"RANK": "0", "WORLD_SIZE": "two"})


def test_init_without_a_launcher_is_a_world_of_one_on_the_cpu():
    with symgpu.config.change_flags(device="cpu"):
        comm = dist.init(environ={})
        try:
            assert (dist.get_rank(), dist.get_world_size(), dist.local_rank) == (0, 1, 0)
            assert comm.backend == "self"
            with pytest.raises(dist.DistributedError, match="called already"):
                dist.init(environ={})
        finally:
            dist.finalize()
    assert not dist.is_initialized()


def test_a_world_needs_a_rendezvous_address():
    with symgpu.config.change_flags(device="cpu"):
        with pytest.raises(dist.LaunchError, match="needs MASTER_ADDR and MASTER_PORT"):
            dist.init(environ={"RANK": "0", "WORLD_SIZE": "2"})


def test_mpi_communicator_maps_onto_mpi4py_calls():
    class FakeComm:
        def Get_rank(self):
            return 1

        def Get_size(self):
            return 2

        def allgather(self, payload):
            return [payload, payload]

        def bcast(self, payload, root):
            assert root == 0 and payload is None
            return fake_root_payload
    from symgpu.distributed.communicator import _pack
    fake_root_payload = _pack(np.arange(3.0))
    comm = dist.MpiCommunicator(FakeComm(), timeout=1)
    np.testing.assert_array_equal(comm.all_reduce(np.ones(2)), [2.0, 2.0])
    np.testing.assert_array_equal(comm.broadcast(np.zeros(3)), np.arange(3.0))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_WORKER = r"""
import os, sys, numpy as np
import symgpu.tensor as T
import symgpu.distributed as dist
from symgpu import function
dist.init()
r = dist.get_rank()
x = T.dvector()
f = function([x], [dist.all_reduce(x, "sum"), dist.all_gather(x)])
s, g = f(np.arange(3.0) + 10 * r)
# one write(2) of under PIPE_BUF bytes: the ranks share torchrun's stdout, and print's
# separate writes of each field interleave ("RESULTRESULT 1 ...")
os.write(1, f"RESULT {r} {dist.get_world_size()} {s.tolist()} {g.tolist()}\n".encode())
dist.finalize()
"""


def _env(**extra):
    env = dict(os.environ)
    env.update({"SYMGPU_FLAGS": "device=cpu", "SYMGPURC": os.devnull, "NCCL_NVLS_ENABLE": "0",
                "PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", "")})
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(extra)
    return env


def _check_results(outputs):
    got = sorted(line for out in outputs for line in out.splitlines()
                 if line.startswith("RESULT"))
    assert got == ["RESULT 0 2 [10.0, 12.0, 14.0] [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]",
                   "RESULT 1 2 [10.0, 12.0, 14.0] [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]"], outputs


def test_two_processes_with_the_environment_contract_through_our_tcp_store(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, str(script)], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=_env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
             for r in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        outs.append(out)
    _check_results(outs)


def test_two_processes_under_torchrun_through_its_agent_store(tmp_path):
    pytest.importorskip("torch.distributed", reason="torchrun comes with torch")
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={_free_port()}", str(script)], cwd=ROOT, text=True,
                          capture_output=True, timeout=300, env=_env(OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr
    _check_results([proc.stdout])


# ----------------------------------------------------------------------------- placement

def test_collectives_lift_to_their_nccl_twins_on_a_virtual_gpu(vgpu):
    from symgpu.gpu.ops.collectives import (GpuAllGather, GpuAllReduce, GpuBroadcast,
                                            GpuReduceScatter)
    x = T.fmatrix()
    outs = [dist.all_reduce(T.exp(x), "avg", group="self"),
            dist.broadcast(x, 0, group="self"), dist.all_gather(x, group="self"),
            dist.reduce_scatter(x, "max", group="self")]
    f = function([x], outs)
    kinds = {type(n.op) for n in f.maker.fgraph.apply_nodes}
    assert {GpuAllReduce, GpuBroadcast, GpuAllGather, GpuReduceScatter} <= kinds
    assert not kinds & {dist.AllReduce, dist.Broadcast, dist.AllGather, dist.ReduceScatter}
    node = next(n for n in f.maker.fgraph.apply_nodes if isinstance(n.op, GpuAllReduce))
    assert str(node.op) == "GpuAllReduce{avg, self}"
    assert node.op.schedule_entry(node).startswith("AllReduce{avg, self} of float32 2-d")


def test_a_host_communicator_keeps_collectives_on_the_host_with_a_real_context(vgpu,
                                                                              monkeypatch):
    # with a virtual context every collective lifts (placement only); with a real one the
    # lifter asks the group's communicator, and a host one keeps the node on the CPU
    from symgpu.gpu.ops import collectives
    assert collectives._device_group("self") is False
    monkeypatch.setattr(collectives, "_context", lambda name: type("C", (), {"virtual": False})())
    x = T.fmatrix()
    f = function([x], dist.all_reduce(T.exp(x), group="self"))
    assert "AllReduce" in _ops_of(f)


def test_the_example_runs_as_one_process_on_the_cpu():
    env = _env(SYMGPU_FLAGS="device=cpu,floatX=float32", TRAINING_STEPS="20")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples",
                                                        "data_parallel_mlp.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("rank 0 of 1 on cpu: loss after 20 steps")


# ----------------------------------------------------------------------------- broadcast_parameters

class _DeviceStoreCommunicator(dist.StoreCommunicator):
    """A store communicator that claims device collectives (as NCCL's does): on the CPU the
    function's Broadcast ops stay host ops, so the device path runs here end to end."""

    supports_device = True

    def __init__(self, base):
        super().__init__(base.store, base.rank, base.world_size, base.timeout,
                         prefix="device")        # keys apart from the host communicator's
        self.exchanges = []

    def exchange(self, payload, what="exchange"):
        self.exchanges.append(what)
        return super().exchange(payload, what)


def test_broadcast_parameters_on_a_device_communicator_runs_one_compiled_function():
    world = ThreadWorld(3, timeout=60)
    comms = [_DeviceStoreCommunicator(world.communicator(r)) for r in range(3)]

    def rank(r):
        params = [shared(np.full((3, 4), float(r))), shared(np.arange(5.0) + 10 * r)]
        with dist.use_communicator(comms[r]):
            f = dist.broadcast_function(params, root=1)
            kinds = _ops_of(f)
            f()
        return [p.get_value() for p in params], kinds, comms[r].exchanges

    for values, kinds, exchanges in world.run(rank):
        np.testing.assert_array_equal(values[0], np.full((3, 4), 1.0))
        np.testing.assert_array_equal(values[1], np.arange(5.0) + 10)
        assert kinds.count("Broadcast") == 2
        assert exchanges[0] == "schedule check"      # a compiled function's collectives


def test_broadcast_parameters_takes_the_device_path_only_on_device_communicators(monkeypatch):
    dp = sys.modules["symgpu.distributed.data_parallel"]   # the name is the function's
    built = []
    real = dp.broadcast_function
    import threading
    monkeypatch.setattr(dp, "broadcast_function", lambda *a, **k:
                        built.append(threading.current_thread().name) or real(*a, **k))
    world = ThreadWorld(2, timeout=60)
    device = [_DeviceStoreCommunicator(world.communicator(r)) for r in range(2)]

    def rank(r):
        p = shared(np.full(4, float(r)))
        dist.broadcast_parameters([p], root=0)          # the thread's host communicator
        host_built = built.count(f"rank{r}")
        p.set_value(np.full(4, float(r)))
        with dist.use_communicator(device[r]):
            dist.broadcast_parameters([p], root=1)
        return host_built, p.get_value()
    out = world.run(rank)
    assert [h for h, _ in out] == [0, 0]                # the host path compiles nothing
    assert sorted(built) == ["rank0", "rank1"]          # the device path: once per rank
    for _, v in out:
        np.testing.assert_array_equal(v, np.ones(4))


def test_the_broadcast_function_lifts_to_ncclbroadcast_on_a_virtual_gpu(vgpu):
    from symgpu.gpu.ops.collectives import GpuBroadcast
    params = [shared(np.ones((3, 4), "float32")), shared(np.zeros(7, "float32"))]
    f = dist.broadcast_function(params, root=0, group="self")
    nodes = [n for n in f.maker.fgraph.apply_nodes if isinstance(n.op, GpuBroadcast)]
    assert len(nodes) == 2 and all(n.op.root == 0 for n in nodes)
    assert "Broadcast" not in _ops_of(f)               # nothing left on the host


# ----------------------------------------------------------------------------- shape check

def _shape_check_world(shapes, flag=True):
    from symgpu.distributed.schedule import ShapeCheck
    world = ThreadWorld(len(shapes), timeout=60)

    def rank(r):
        with symgpu.config.change_flags(**{"distributed.check_shapes": flag}):
            with dist.use_communicator(world.communicator(r)):
                x = T.fmatrix()
                node = dist.all_reduce(x, "sum").owner
                check = ShapeCheck(world.communicator(r), node)
        outcome = []
        for _ in range(2):                            # the first call checks, later ones not
            try:
                check(shapes[r])
                outcome.append("ok")
            except dist.CollectiveMismatchError as exc:
                outcome.append(str(exc))
        return outcome, world.communicator(r).seq
    return world.run(rank)


def test_the_first_call_compares_element_counts_of_each_collective():
    out = _shape_check_world([(4, 3), (3, 4), (4, 3)])    # same counts: NCCL is fine
    assert [o for o, _ in out] == [["ok", "ok"]] * 3
    assert [seq for _, seq in out] == [1, 1, 1]            # one exchange, first call only


def test_a_rank_with_another_count_makes_every_rank_raise_naming_it():
    out = _shape_check_world([(4, 3), (5, 3)])
    for r, (outcome, _) in enumerate(out):
        msg = outcome[0]
        other = 1 - r
        shape = [(4, 3), (5, 3)][other]
        assert f"rank {other} passes {[12, 15][other]} elements (shape {shape})" in msg, msg
        assert f"rank {r} passes {[12, 15][r]}" in msg
        assert msg.startswith("AllReduce{sum, world} (schedule entry: AllReduce{sum, world} "
                              "of float32 2-d")
        assert "distributed.check_shapes" in msg and outcome[1] == "ok"


def test_the_shape_check_is_off_with_its_flag_and_in_a_world_of_one():
    out = _shape_check_world([(4, 3), (5, 3)], flag=False)
    assert [o for o, _ in out] == [["ok", "ok"]] * 2 and [s for _, s in out] == [0, 0]
    from symgpu.distributed.schedule import ShapeCheck
    x = T.fmatrix()
    with dist.use_communicator(dist.SelfCommunicator()):
        node = dist.all_reduce(x).owner
    assert not ShapeCheck(dist.SelfCommunicator(), node).pending
