"""The NCCL side of symgpu.distributed: the binding's arguments against a fake library, the
watchdog against fake counters and a fake clock, the communicator's rendezvous; on one GPU a
world of one rank through real NCCL; on 2+ GPUs (``pytest -m multigpu``) two processes, also
with NCCL's network transport forced and with a rank killed mid-run."""
from __future__ import annotations

import ctypes
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

import symgpu.tensor as T
import symgpu.distributed as dist
from symgpu import function
from symgpu.gpu.ops import nccl_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Entry:
    """A fake C entry point: records its converted arguments, returns 0."""

    def __init__(self, log, name, result=0):
        self.log, self.name, self.result = log, name, result
        self.argtypes = self.restype = None

    def __call__(self, *args):
        self.log.append((self.name, args))
        if self.name == "ncclGetUniqueId":
            ctypes.memmove(args[0], b"\x07" * 128, 128)
        if self.name in ("ncclCommInitRank", "ncclCommInitRankConfig"):
            args[0]._obj.value = 0xC0FFEE
        if self.name == "ncclCommGetAsyncError":
            args[1]._obj.value = self.statuses.pop(0) if self.statuses else self.async_status
        return self.result


class FakeNccl:
    """``statuses``: what ncclCommGetAsyncError answers first (one per call), then
    ``async_status`` for good; ncclCommInitRankConfig answers ``init_result``."""

    def __init__(self, async_status=0, statuses=(), init_result=nccl_lib.IN_PROGRESS,
                 without=()):
        self.log = []
        for name in nccl_lib._SIGNATURES:
            if name in without:
                continue
            e = _Entry(self.log, name)
            e.async_status, e.statuses = async_status, list(statuses)
            setattr(self, name, e)
        if "ncclCommInitRankConfig" not in without:
            self.ncclCommInitRankConfig.result = init_result
        self.ncclGetErrorString = lambda status: b"remote process exited"
        self.ncclGetLastError = lambda comm: b"socket closed"


def test_binding_builds_each_collectives_arguments():
    fake = FakeNccl()
    b = nccl_lib.Nccl(fake)
    assert fake.ncclAllReduce.argtypes[2] is ctypes.c_size_t
    b.all_reduce(0x1000, 0x2000, 12, "float32", "avg", "COMM", 0x55)
    b.broadcast(0x1000, 0x2000, 3, "float64", 1, "COMM", 0x55)
    b.all_gather(0x1000, 0x2000, 4, "bfloat16", "COMM", 0x55)
    b.reduce_scatter(0x1000, 0x2000, 2, "int64", "max", "COMM", 0x55)
    calls = {name: args for name, args in fake.log}
    ar = calls["ncclAllReduce"]
    assert (ar[0].value, ar[1].value, ar[2].value, ar[3], ar[4], ar[5], ar[6].value) == \
        (0x1000, 0x2000, 12, 7, 4, "COMM", 0x55)
    assert calls["ncclBroadcast"][3:5] == (8, 1)
    assert calls["ncclAllGather"][3] == 9 and calls["ncclAllGather"][2].value == 4
    assert calls["ncclReduceScatter"][3:5] == (4, 2)
    uid = b.unique_id()
    assert uid == b"\x07" * 128
    comm, status = b.comm_init_rank(2, uid, 1)
    name, (ptr, n, ident, rank) = fake.log[-1]
    assert (name, n, rank, bytes(ident.internal)) == ("ncclCommInitRank", 2, 1, b"\x07" * 128)
    assert comm.value == 0xC0FFEE and status == 0
    with pytest.raises(TypeError, match="NCCL has no data type for complex64"):
        b.all_reduce(1, 2, 3, "complex64", "sum", "COMM", 0)
    with pytest.raises(ValueError, match="no reduce op 'mean'"):
        b.all_reduce(1, 2, 3, "float32", "mean", "COMM", 0)
    with pytest.raises(ValueError, match="128 bytes"):
        b.comm_init_rank(2, b"short", 0)


def test_a_failing_call_names_the_result_and_nccls_last_error():
    fake = FakeNccl()
    fake.ncclAllReduce.result = 6
    with pytest.raises(nccl_lib.NcclError, match="ncclAllReduce failed: ncclRemoteError "
                                                 r"\(remote process exited\): socket closed"):
        nccl_lib.Nccl(fake).all_reduce(1, 2, 3, "float32", "sum", "COMM", 0)


def test_library_candidates_include_the_wheels_directory(tmp_path, monkeypatch):
    lib = tmp_path / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    importlib.invalidate_caches()
    cands = nccl_lib.library_candidates()
    assert cands[0] == "libnccl.so.2" and str(lib / "libnccl.so.2") in cands


def _communicator(world=2, rank=0, async_status=0, statuses=(0,), clock=None, **fake_kw):
    from symgpu.distributed.env import LaunchInfo
    from symgpu.gpu.ops.collectives import NcclCommunicator
    class Host(dist.SelfCommunicator):
        closed = False

        def broadcast(self, x, root=0):      # rank 0's unique id, whichever rank this is
            return np.full_like(x, 7)

        def close(self):
            self.closed = True
    host = Host(timeout=5)
    host.rank, host.world_size = rank, world
    fake = FakeNccl(async_status, statuses, **fake_kw)
    ctx = type("VirtualCtx", (), {"virtual": True})()
    counters = np.zeros(4, np.uint64)
    now = [0.0]

    def sleep(dt):
        now[0] += dt
    comm = NcclCommunicator(LaunchInfo(rank, world), host, 5.0, ctx=ctx,
                            binding=nccl_lib.Nccl(fake), counters=(counters, 0), watch=False,
                            clock=lambda: now[0], sleep=sleep)
    return comm, fake, counters


def test_the_communicator_shares_rank_0s_unique_id_and_inits_its_rank():
    comm, fake, _ = _communicator(world=2, rank=0)
    names = [n for n, _ in fake.log]
    assert names[:3] == ["ncclGetUniqueId", "ncclCommInitRankConfig", "ncclCommGetAsyncError"]
    assert fake.log[1][1][1:4:2] == (2, 0)
    config = fake.log[1][1][4]._obj                 # the ncclConfig_t NCCL received
    assert (config.size, config.magic, config.version, config.blocking) == \
        (48, 0xCAFEBEEF, 21700, 0)
    assert (config.cgaClusterSize, config.minCTAs, config.maxCTAs, config.netName,
            config.splitShare) == (-2 ** 31,) * 3 + (None, -2 ** 31)
    assert comm.nonblocking and comm.handle.value == 0xC0FFEE
    assert comm.supports_device and comm.backend == "nccl"
    comm.close()
    assert fake.log[-1][0] == "ncclCommDestroy"


def test_close_finalizes_polls_then_destroys_a_nonblocking_communicator():
    comm, fake, _ = _communicator()
    fake.ncclCommFinalize.result = nccl_lib.IN_PROGRESS
    fake.ncclCommGetAsyncError.statuses = [7, 7, 0]
    del fake.log[:]
    comm.close()
    assert [n for n, _ in fake.log] == ["ncclCommFinalize"] + ["ncclCommGetAsyncError"] * 3 \
        + ["ncclCommDestroy"]
    assert comm.host.closed and comm.handle is None


def test_a_teardown_that_never_finishes_is_aborted_with_a_warning():
    comm, fake, _ = _communicator()
    fake.ncclCommFinalize.result = nccl_lib.IN_PROGRESS
    fake.ncclCommGetAsyncError.async_status = nccl_lib.IN_PROGRESS
    with pytest.warns(RuntimeWarning, match=r"rank 0 of 2: NCCL communicator teardown "
                                            r"\(ncclCommFinalize\) did not finish within 5 s"):
        comm.close()
    names = [n for n, _ in fake.log]
    assert names[-1] == "ncclCommAbort" and "ncclCommDestroy" not in names
    assert comm.aborted and comm.host.closed


def test_a_collective_on_a_closed_communicator_says_so():
    comm, fake, _ = _communicator()
    comm.close()
    with pytest.raises(dist.DistributedError, match=r"rank 0 of 2: a collective runs on an "
                                                    r"NCCL communicator that was closed"):
        comm.launch(None, None, lambda: 0)


def test_a_library_without_finalize_destroys_directly():
    comm, fake, _ = _communicator(without=("ncclCommFinalize",))
    del fake.log[:]
    comm.close()
    assert [n for n, _ in fake.log] == ["ncclCommDestroy"]


def test_setup_polls_a_nonblocking_communicator_until_it_is_ready():
    comm, fake, _ = _communicator(statuses=(7, 7, 7, 0))
    assert [n for n, _ in fake.log].count("ncclCommGetAsyncError") == 4
    assert comm.error is None and not comm.aborted


def test_a_rank_missing_at_setup_times_out_naming_rank_and_world():
    with pytest.raises(dist.DistributedTimeoutError,
                       match=r"rank 1 of 3: NCCL communicator setup \(ncclCommInitRankConfig\) "
                             r"did not finish within 5 s \(distributed.timeout\)"):
        _communicator(world=3, rank=1, statuses=(), async_status=nccl_lib.IN_PROGRESS)


def test_setup_that_fails_in_nccl_aborts_and_names_the_error():
    with pytest.raises(dist.DistributedError, match="rank 0 of 2: NCCL communicator setup .*"
                                                    "failed: NCCL reported ncclRemoteError"):
        _communicator(statuses=(7, 6))


def test_setup_aborts_the_communicator_on_expiry():
    from symgpu.gpu.ops.collectives import NcclCommunicator
    seen = {}
    orig = NcclCommunicator.settle

    def spy(self, what):
        seen["comm"] = self
        return orig(self, what)
    NcclCommunicator.settle = spy
    try:
        with pytest.raises(dist.DistributedTimeoutError):
            _communicator(statuses=(), async_status=nccl_lib.IN_PROGRESS)
    finally:
        NcclCommunicator.settle = orig
    comm = seen["comm"]
    assert comm.aborted and isinstance(comm.error, dist.DistributedTimeoutError)
    names = [n for n, _ in comm.nccl.lib.log]
    assert names[-1] == "ncclCommAbort" and "ncclCommDestroy" not in names
    assert comm.host.closed                        # the rendezvous is released too


def test_a_library_without_the_config_entry_point_inits_blocking():
    comm, fake, _ = _communicator(without=("ncclCommInitRankConfig",))
    names = [n for n, _ in fake.log]
    assert names == ["ncclGetUniqueId", "ncclCommInitRank"] and not comm.nonblocking


def test_a_collective_still_in_progress_is_settled_before_the_next_call(monkeypatch):
    from symgpu.gpu.ops import collectives
    comm, fake, _ = _communicator(statuses=(0, 7, 7, 0))
    launched = []

    class Kernel:
        def prepared_async_call(self, *args):
            launched.append("started")
    monkeypatch.setattr(collectives, "get_prepared_kernel", lambda *a, **k: Kernel())
    monkeypatch.setattr(collectives, "launch_checked", lambda *a: launched.append("finished"))
    ctx = type("Ctx", (), {"stream": None})()
    node = type("Node", (), {"op": "GpuAllReduce{sum, world}"})()
    binding = comm.nccl
    fake.ncclAllReduce.result = nccl_lib.IN_PROGRESS
    comm.launch(node, ctx, lambda: binding.all_reduce(1, 2, 3, "float32", "sum", comm.handle,
                                                      0))
    assert launched == ["started", "finished"]
    assert [n for n, _ in fake.log][-4:] == ["ncclAllReduce"] + ["ncclCommGetAsyncError"] * 3
    fake.ncclCommGetAsyncError.async_status = nccl_lib.IN_PROGRESS   # never completes
    with pytest.raises(dist.DistributedTimeoutError,
                       match=r"rank 0 of 2: GpuAllReduce\{sum, world\} did not finish"):
        comm.launch(node, ctx, lambda: binding.all_reduce(1, 2, 3, "float32", "sum",
                                                          comm.handle, 0))
    assert comm.aborted and fake.log[-1][0] == "ncclCommAbort"


def test_the_watchdog_aborts_a_collective_that_makes_no_progress(capsys):
    from symgpu.gpu.ops.collectives import Watchdog
    comm, fake, counters = _communicator()
    now = [0.0]
    dog = Watchdog(comm, counters, timeout=10.0, clock=lambda: now[0])
    counters[:2] = (5, 5)
    assert dog.poll() is None                      # idle
    counters[0] = 6                                 # collective 6 started
    assert dog.poll() is None
    now[0] = 8.0
    counters[:2] = (7, 6)                           # progress: 6 finished, 7 started
    assert dog.poll() is None
    now[0] = 16.0                                   # 8 s without progress: under the timeout
    assert dog.poll() is None
    now[0] = 18.5
    exc = dog.poll()
    assert isinstance(exc, dist.DistributedTimeoutError)
    assert "collective #7 did not finish within 10 s" in str(exc)
    assert comm.error is exc and comm.aborted and counters[2] == 1
    assert fake.log[-1][0] == "ncclCommAbort"
    assert "a peer rank died or hangs" in capsys.readouterr().err
    with pytest.raises(dist.DistributedTimeoutError):
        comm.launch(None, None, lambda: None)      # later collectives raise at once
    comm.close()
    assert fake.log[-1][0] == "ncclCommAbort"      # aborted: never destroyed after


def test_the_watchdog_aborts_on_an_asynchronous_nccl_error():
    from symgpu.gpu.ops.collectives import Watchdog
    comm, fake, counters = _communicator(async_status=6)
    exc = Watchdog(comm, counters, timeout=600.0).poll()
    assert isinstance(exc, dist.DistributedError)
    assert "NCCL reported ncclRemoteError" in str(exc) and "socket closed" in str(exc)
    assert fake.log[-1][0] == "ncclCommAbort"


@pytest.mark.nvcc
def test_the_watch_kernels_compile(tmp_path):
    from symgpu.gpu.ops.collectives import watch_source
    from symgpu.gpu.runtime import compiler
    src = tmp_path / "w.cu"
    src.write_text(watch_source())
    out = subprocess.run([compiler._nvcc(), "-cubin", "-arch=sm_90", str(src), "-o",
                          str(tmp_path / "w.cubin")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# ----------------------------------------------------------------------------- one GPU

@pytest.mark.gpu
def test_a_world_of_one_rank_through_real_nccl(cuda, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    from symgpu.distributed.env import LaunchInfo
    from symgpu.gpu.ops.collectives import GpuAllGather, GpuAllReduce, NcclCommunicator
    from symgpu.gpu.runtime.array import GpuArray
    comm = NcclCommunicator(LaunchInfo(), dist.SelfCommunicator(), 60.0, ctx=cuda)
    try:
        with dist.use_communicator(comm):
            x = T.fmatrix()
            f = function([x], [dist.all_reduce(T.exp(x), "sum").transfer(None),
                               dist.all_gather(x * 2)])
            kinds = {type(n.op) for n in f.maker.fgraph.apply_nodes}
            assert GpuAllReduce in kinds and GpuAllGather in kinds
            v = np.random.RandomState(0).randn(64, 33).astype("float32")
            for _ in range(3):                       # plain run, capture, replay
                a, g = f(v)
            assert isinstance(a, GpuArray)
            np.testing.assert_allclose(a.get(), np.exp(v), rtol=1e-6)
            np.testing.assert_allclose(g, v * 2, rtol=1e-6)
            assert int(comm.counters[1]) >= 6 and comm.error is None   # NCCL really ran
    finally:
        comm.close()


@pytest.mark.gpu
def test_broadcast_parameters_stays_on_the_gpu_through_real_nccl(cuda, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    from symgpu import shared
    from symgpu.distributed.env import LaunchInfo
    from symgpu.gpu.ops.collectives import GpuBroadcast, NcclCommunicator
    comm = NcclCommunicator(LaunchInfo(), dist.SelfCommunicator(), 60.0, ctx=cuda)
    try:
        v = np.random.RandomState(1).randn(300, 7).astype("float32")
        W = shared(v.copy())
        with dist.use_communicator(comm):
            f = dist.broadcast_function([W], root=0)
            assert any(isinstance(n.op, GpuBroadcast) for n in f.maker.fgraph.apply_nodes)
            before = int(comm.counters[1])
            dist.broadcast_parameters([W], root=0)
        np.testing.assert_array_equal(W.get_value(), v)
        assert int(comm.counters[1]) > before and comm.error is None   # ncclBroadcast ran
    finally:
        comm.close()


# ----------------------------------------------------------------------------- several GPUs


_WORKER = r"""
import os, sys, time, numpy as np
import symgpu, symgpu.tensor as T
import symgpu.distributed as dist
from symgpu import function, shared
dist.init()
r, n = dist.get_rank(), dist.get_world_size()
assert symgpu.config.device == f"cuda{dist.local_rank}", symgpu.config.device
x = T.fmatrix()
f = function([x], [dist.all_reduce(x, "sum"), dist.all_gather(x), dist.broadcast(x, 1)])
names = [type(nd.op).__name__ for nd in f.maker.fgraph.apply_nodes]
assert "GpuAllReduce" in names, names
v = (np.arange(12, dtype="float32").reshape(4, 3) + 100 * r)
if os.environ.get("MISMATCH") == str(r):
    v = np.ones((5, 3), "float32")
for step in range(int(os.environ.get("STEPS", "3"))):
    if os.environ.get("KILL") == str(r) and step == 2:
        os._exit(17)
    s, g, b = f(v)
line = f"RESULT {r} {n} {s.tolist()} {g.shape} {b.tolist()}"
print(line, flush=True)
if os.environ.get("RESULT_DIR"):     # torchrun merges the ranks' output: each its own file
    with open(os.path.join(os.environ["RESULT_DIR"], f"{r}.txt"), "w") as fh:
        fh.write(line)
dist.finalize()
"""


def _launch(tmp_path, extra_env, timeout=500):
    script = tmp_path / "w.py"
    script.write_text(_WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    env.update({"SYMGPU_FLAGS": "device=cuda,floatX=float32", "NCCL_NVLS_ENABLE": "0",
                "PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", "")})
    env.update(extra_env)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={port}", str(script)], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout, env=env)


@pytest.mark.multigpu   # skipped with the reason below two GPUs (tests/conftest.py)
@pytest.mark.parametrize("transport", ["default", "network"])
def test_two_gpus_two_processes(tmp_path, transport):
    pytest.importorskip("torch.distributed")
    env = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"} if transport == "network" else {}
    env["RESULT_DIR"] = str(tmp_path)
    proc = _launch(tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = [(tmp_path / f"{r}.txt").read_text() for r in range(2)]
    v = np.arange(12, dtype="float32").reshape(4, 3)
    s = (2 * v + 100).tolist()
    assert got == [f"RESULT {r} 2 {s} (8, 3) {(v + 100).tolist()}" for r in range(2)], got


def _by_hand(tmp_path, extra_env):
    """Two workers started with the environment contract by hand: torchrun's agent would stop
    the survivor itself once a worker exits, hiding symgpu's own fault handling."""
    script = tmp_path / "w.py"
    script.write_text(_WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        env = dict(os.environ)
        env.update({"SYMGPU_FLAGS": "device=cuda,floatX=float32,distributed.timeout=20",
                    "NCCL_NVLS_ENABLE": "0", "RANK": str(r),
                    "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "PYTHONPATH": ROOT + os.pathsep + env.get("PYTHONPATH", "")})
        env.update(extra_env)
        procs.append(subprocess.Popen([sys.executable, str(script)], cwd=ROOT, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env))
    return procs


@pytest.mark.multigpu   # skipped with the reason below two GPUs (tests/conftest.py)
def test_mismatched_shapes_fail_on_every_rank_at_the_first_call(tmp_path):
    procs = _by_hand(tmp_path, {"MISMATCH": "1"})
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=300)
        assert p.returncode != 0 and f"RESULT {r}" not in out
        assert "CollectiveMismatchError" in err, err[-4000:]
        # each rank names itself first: "rank 1 passes 15 elements (shape (5, 3)), rank 0
        # passes 12 (shape (4, 3))" on rank 1
        assert re.search(r"rank 1 passes 15( elements)? \(shape \(5, 3\)\)", err), err[-4000:]
        assert re.search(r"rank 0 passes 12( elements)? \(shape \(4, 3\)\)", err), err[-4000:]


@pytest.mark.multigpu   # skipped with the reason below two GPUs (tests/conftest.py)
def test_a_killed_rank_makes_the_other_fail_within_the_timeout(tmp_path):
    procs = _by_hand(tmp_path, {"KILL": "1", "STEPS": "50"})
    (out1, err1) = procs[1].communicate(timeout=300)
    assert procs[1].returncode == 17, err1[-4000:]
    out0, err0 = procs[0].communicate(timeout=300)     # within timeout + the poll: no hang
    assert procs[0].returncode != 0 and "RESULT 0" not in out0
    assert "symgpu.distributed: rank 0 of 2" in err0, err0[-4000:]
    assert "DistributedTimeoutError" in err0 or "DistributedError" in err0, err0[-4000:]
