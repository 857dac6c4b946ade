"""Two real GPUs in one process (``pytest -m multigpu`` on a machine with two or more; skipped,
with the reason, elsewhere): the seeds' multi-GPU program on cuda0 and cuda1 with the right
result and its two products overlapping in time, GpuToGpu's device-to-device copies both
ways, shared variables placed with ``target='dev1'``, and a function mixing both contexts
called from two threads.  The same paths on the CPU, with fakes:
tests/test_gpu_multi_context.py.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

import symgpu.tensor as T
from symgpu import function, shared
from symgpu.config import config
from symgpu.gpu import overlap_ms, step_intervals
from symgpu.gpu.exec import graphs
from symgpu.gpu.runtime import context as gctx
from symgpu.gpu.runtime import peer
from symgpu.gpu.runtime.array import GpuArray

pytestmark = pytest.mark.multigpu


@pytest.fixture
def two_gpus():
    """Names dev0 -> cuda0 and dev1 -> cuda1 (as contexts=dev0->cuda0;dev1->cuda1 maps them),
    floatX=float32; yields the two contexts, asserted real and distinct."""
    c0, c1 = gctx.start_device("cuda0"), gctx.start_device("cuda1")
    assert not c0.virtual and not c1.virtual and c0 is not c1
    assert c0.context_handle and c1.context_handle and c0.context_handle != c1.context_handle
    gctx.register_context("dev0", c0)
    gctx.register_context("dev1", c1)
    try:
        with config.change_flags(floatX="float32"):
            yield c0, c1
    finally:
        gctx.unregister_context("dev0")
        gctx.unregister_context("dev1")


def _rand(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((n, n), dtype=np.float32)


def _on(var, ctx) -> bool:
    v = var.get_value(borrow=True, return_internal_type=True)
    return isinstance(v, GpuArray) and v.context is ctx and \
        gctx.device_of_pointer(v.ptr) == ctx.ordinal


def test_the_seeds_program_gives_the_right_result_on_two_devices(two_gpus):
    c0, c1 = two_gpus
    v01 = shared(_rand(1024, 1), target="dev0")
    v02 = shared(_rand(1024, 2), target="dev0")
    v11 = shared(_rand(1024, 3), target="dev1")
    v12 = shared(_rand(1024, 4), target="dev1")
    assert str(v11.type) == "GpuArrayType<dev1>(float32, (False, False))"
    assert _on(v01, c0) and _on(v11, c1)
    f = function([], [T.dot(v01, v02), T.dot(v11, v12)])
    products = [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "GpuDot22"]
    assert sorted(n.outputs[0].type.context_name for n in products) == ["dev0", "dev1"]
    runner = f.vm.runner
    assert isinstance(runner, graphs.Runner) and set(runner.contexts) == {c0, c1}
    for _ in range(4):   # a plain call, a capture, replays
        r0, r1 = f()
        np.testing.assert_allclose(r0, v01.get_value() @ v02.get_value(), rtol=1e-3)
        np.testing.assert_allclose(r1, v11.get_value() @ v12.get_value(), rtol=1e-3)
    assert {seg.ctx for seg in runner.segments} == {c0, c1}


def test_the_seeds_two_products_run_at_the_same_time(two_gpus):
    """Events on both streams (symgpu.gpu.step_intervals): the product on cuda1 runs while
    the one on cuda0 does, for at least half of the shorter one (one after the other, they
    would share a few microseconds at most)."""
    c0, c1 = two_gpus
    n = 8192
    v01, v02 = shared(_rand(n, 1), target="dev0"), shared(_rand(n, 2), target="dev0")
    v11, v12 = shared(_rand(n, 3), target="dev1"), shared(_rand(n, 4), target="dev1")
    f = function([], [T.dot(v01, v02).transfer("dev0"), T.dot(v11, v12).transfer("dev1")])
    for _ in range(3):
        f()
    (r0, r1), iv = step_intervals(f)
    assert r0.context is c0 and r1.context is c1
    prods = [i for i in iv if "GpuDot22" in i.label]
    assert sorted(i.device for i in prods) == ["cuda0", "cuda1"], iv
    a, b = prods
    shorter = min(a.end_ms - a.start_ms, b.end_ms - b.start_ms)
    assert shorter > 0, iv
    assert overlap_ms(a, b) >= 0.5 * shorter, iv
    np.testing.assert_allclose(r1.get()[:64, :64],
                               (v11.get_value() @ v12.get_value())[:64, :64], rtol=1e-3)


def test_gpu_to_gpu_copies_device_to_device_both_ways(two_gpus):
    c0, c1 = two_gpus
    x0 = _rand(512, 5)
    x1 = _rand(512, 6)
    s0, s1 = shared(x0, target="dev0"), shared(x1, target="dev1")
    before = dict(peer.STATS)
    to1 = function([], s0.transfer("dev1"))
    to0 = function([], s1.transfer("dev0"))
    strided = function([], s0.T.transfer("dev1"))   # a transposed view: made contiguous first
    chain = function([], T.dot(s0, s0).transfer("dev1") + s1)   # product, copy, add on dev1
    for _ in range(3):
        y1, y0, yt, yc = to1(), to0(), strided(), chain()
        assert y1.context is c1 and gctx.device_of_pointer(y1.ptr) == 1
        assert y0.context is c0 and gctx.device_of_pointer(y0.ptr) == 0
        np.testing.assert_array_equal(y1.get(), x0)
        np.testing.assert_array_equal(y0.get(), x1)
        np.testing.assert_array_equal(yt.get(), x0.T)
        np.testing.assert_allclose(yc.get() if isinstance(yc, GpuArray) else yc,
                                   x0 @ x0 + x1, rtol=1e-3)
    assert peer.STATS["peer_copies"] - before["peer_copies"] >= 12
    assert peer.STATS["host_copies"] == before["host_copies"]
    assert frozenset((0, 1)) in peer._pairs


def test_shared_variables_live_on_their_target_device_and_update_there(two_gpus):
    c0, c1 = two_gpus
    w = shared(np.ones((256, 256), dtype=np.float32), target="dev1")
    assert _on(w, c1)
    step = function([], w.sum(), updates={w: w * 2})
    for k in range(4):
        total = step()
        assert float(total) == pytest.approx(256 * 256 * 2.0 ** k)
    assert _on(w, c1)
    np.testing.assert_array_equal(w.get_value(), np.full((256, 256), 16.0, np.float32))


def test_a_function_mixing_both_devices_called_from_two_threads(two_gpus):
    c0, c1 = two_gpus
    a0, b1 = _rand(256, 7), _rand(256, 8)
    s0, s1 = shared(a0, target="dev0"), shared(b1, target="dev1")
    x = T.matrix("x")
    y = T.dot(s0, x.transfer("dev0")).transfer("dev1") + T.dot(s1, s1)
    f = function([x], [y.transfer("cpu"), T.dot(s0, s0).transfer("cpu")])
    want_other = a0 @ a0
    errors: list = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(20):
                xv = rng.random((256, 256), dtype=np.float32)
                r, other = f(xv)
                np.testing.assert_allclose(r, a0 @ xv + b1 @ b1, rtol=1e-3)
                np.testing.assert_allclose(other, want_other, rtol=1e-3)
        except Exception as exc:  # reported by the main thread
            errors.append(exc)
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not c0.call_lock.locked() and not c1.call_lock.locked()


def _mlp_step(ctx_name: str, parallel: bool):
    """A float32 MLP step whose parameters live on ``ctx_name`` (rank 0's values everywhere)."""
    import symgpu.distributed as dist
    rng = np.random.RandomState(0)
    params = [shared(rng.randn(20, 64).astype("float32") * 0.2, target=ctx_name, name="W1"),
              shared(np.zeros(64, "float32"), target=ctx_name, name="b1"),
              shared(rng.randn(64, 3).astype("float32") * 0.2, target=ctx_name, name="W2")]
    W1, b1, W2 = params
    x, y = T.fmatrix("x"), T.ivector("y")
    p = T.nnet.softmax(T.dot(T.tanh(T.dot(x, W1) + b1), W2))
    cost = -T.log(p[T.arange(y.shape[0]), y]).mean()
    grads = T.grad(cost, params)
    updates = [(q, q - np.float32(0.5) * g) for q, g in zip(params, grads)]
    if parallel:
        updates = dist.data_parallel(updates, grads=grads, params=params, bucket_bytes=4096)
    return function([x, y], cost, updates=updates), params


def test_one_process_trains_data_parallel_on_both_gpus_as_one_does_the_full_batch(two_gpus):
    import symgpu.distributed as dist
    rng = np.random.RandomState(1)
    X, Y = rng.randn(64, 20).astype("float32"), rng.randint(0, 3, 64).astype("int32")
    full, full_params = _mlp_step("dev0", parallel=False)
    for _ in range(4):
        full(X, Y)
    want = [q.get_value() for q in full_params]
    with dist.local_world(["dev0", "dev1"], timeout=120) as world:
        assert world.backend == "nccl"

        def replica(r):
            step, params = _mlp_step(world.context(r), parallel=True)
            names = {type(n.op).__name__ for n in step.maker.fgraph.apply_nodes}
            assert "GpuAllReduce" in names and "GpuToGpu" not in names
            for _ in range(4):   # a plain call, a capture, replays
                step(X[32 * r:32 * r + 32], Y[32 * r:32 * r + 32])
            return [q.get_value() for q in params], [_on(q, two_gpus[r]) for q in params]
        out = world.run(replica)
    for values, placed in out:
        assert all(placed)
        for got, ref in zip(values, want):
            np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-5)
