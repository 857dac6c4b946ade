"""GPU convolution and pooling (symgpu/gpu/ops/conv.py, conv_gemm.py, cudnn.py, pooling.py):
placement on a virtual context and kernel compilation (CPU), and on a real GPU every
conv2d / pool_2d parameter combination of the CPU tests against the CPU ops, through cuDNN
and through the im2col + cuBLAS fallback, plus a LeNet step captured into a CUDA graph."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from gpu_helpers import (NON_LAUNCHING, assert_one_segment, compile_for_sm90, on_the_cpu,
                         requires_gpu, requires_nvcc)
from symgpu import config, function
from symgpu.gpu.ops import conv as gconv
from symgpu.gpu.ops.conv_gemm import conv_gemm_source
from symgpu.gpu.ops import pooling as gpooling
from symgpu.gpu.ops.pooling import index_suffix, pooling_source
from symgpu.gpu.placement.rewriting import cpu_nodes, virtual_context
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.tensor.nnet import bn, conv2d
from symgpu.tensor.signal.pool import pool_2d
from symgpu.tensor.signal.pool_numpy import MODES

RNG = np.random.default_rng(17)
CONV_COMBOS = list(itertools.product(["valid", "full", "half", 1, (2, 0), ((1, 0), (0, 2))],
                                     [(1, 1), (2, 3)], [(1, 1), (2, 1)], [True, False], [1, 2]))
POOL_COMBOS = [c for c in itertools.product([(2, 2), (3, 2), (1, 3)],
                                            [None, (1, 1), (2, 3), (3, 1)],
                                            [(0, 0), (1, 1), (2, 1)], [True, False], MODES)
               if (c[2] == (0, 0) or c[3]) and c[2][0] < c[0][0] and c[2][1] < c[0][1]]
# the pooling gradients (GpuMaxPoolGrad, GpuAveragePoolGrad) of these nets take tanh's
# derivative as their epilogue (symgpu/gpu/ops/pooling_epilogue.py)
GPU_NAMES = {"GpuConv2d", "GpuConv2dGradInputs", "GpuConv2dGradWeights", "GpuPool",
             "GpuPoolGradEpilogue"}


def _names(f):
    return {type(n.op).__name__ for n in f.maker.fgraph.toposort()}


def _lenet_like(x, y, params):
    """A small LeNet: conv, tanh, max-pool; conv ('half'), tanh, average-pool; dense softmax;
    cross-entropy against one-hot targets `y` (a float matrix: all of it runs on the GPU)."""
    w1, w2, wf, bf = params
    h = pool_2d(T.tanh(conv2d(x, w1)), (2, 2))
    h = pool_2d(T.tanh(conv2d(h, w2, border_mode="half")), (2, 2), mode="average_exc_pad")
    p = T.nnet.softmax(T.dot(h.flatten(2), wf) + bf)
    return T.mean(T.nnet.categorical_crossentropy(p, y))


# ============================================================================ CPU

def test_whole_training_step_is_placed_on_the_gpu():
    with config.change_flags(floatX="float32", assert_no_cpu_op="raise"), virtual_context(None):
        x, y = T.tensor4("x"), T.matrix("y")
        params = [symgpu.shared(np.zeros(s, "float32")) for s in
                  [(4, 1, 3, 3), (6, 4, 3, 3), (6 * 2 * 2, 10), (10,)]]
        cost = _lenet_like(x, y, params)
        grads = T.grad(cost, params + [x])
        f = function([x, y], [cost, grads[-1]],
                     updates=[(p, p - 0.1 * gp) for p, gp in zip(params, grads)])
        names = _names(f)
        assert GPU_NAMES <= names, names
        assert not names & {"Conv2d", "Conv2dGradInputs", "Conv2dGradWeights", "Pool",
                            "MaxPoolGrad", "AveragePoolGrad"}, names
        assert not cpu_nodes(f.maker.fgraph)


def test_batch_normalisation_runs_as_gpu_elementwise_and_reductions():
    with config.change_flags(floatX="float32"), virtual_context(None):
        x, g, b = T.tensor4("x"), T.vector("g"), T.vector("b")
        out, mean, invstd = bn.batch_normalization_train(x, g, b, "spatial")
        f = function([x, g, b], [out, T.grad(out.sum(), g)])
        floats = [n for n in cpu_nodes(f.maker.fgraph)
                  if any(o.dtype.startswith("float") and not all(o.broadcastable)
                         for o in n.outputs)]
        assert not floats, floats


def test_integer_pooling_and_float16_conv_stay_on_the_cpu():
    with config.change_flags(floatX="float32"), virtual_context(None):
        i = T.itensor4()
        f = function([i], pool_2d(i, (2, 2)))
        assert "Pool" in _names(f) and "GpuPool" not in _names(f)


def _lenet_step_on_gpu_inputs(shapes, conv_kw=None, second_pool="max"):
    """The compiled LeNet SGD step (benchmarks/convnet.py's graph) on a virtual context, its
    batch and parameters GPU variables as on the GPU machine (GPU shared variables cannot
    live on a virtual context, so they are explicit inputs and the new values outputs)."""
    gpu = lambda *bc: GpuArrayType("float32", bc, None)()   # noqa: E731
    x, y = gpu(False, False, False, False), gpu(False, False)
    ps = [gpu(*(False,) * len(s)) for s in shapes]
    w1, b1, w2, b2, w3, b3, w4, b4 = ps
    h = pool_2d(T.tanh(conv2d(x, w1) + b1.dimshuffle("x", 0, "x", "x")), (2, 2))
    h = pool_2d(T.tanh(conv2d(h, w2, **(conv_kw or {})) + b2.dimshuffle("x", 0, "x", "x")),
                (2, 2), mode=second_pool)
    h = T.tanh(T.dot(h.flatten(2), w3) + b3)
    p = T.nnet.softmax(T.dot(h, w4) + b4)
    cost = T.mean(T.nnet.categorical_crossentropy(p, y))
    grads = T.grad(cost, ps)
    return function([x, y] + ps, [q - 0.1 * g for q, g in zip(ps, grads)])


@pytest.mark.parametrize("conv_kw,second_pool", [(None, "max"),
                                                 (dict(border_mode="half"), "average_exc_pad")])
def test_lenet_step_has_no_host_work_between_its_kernels(conv_kw, second_pool):
    """The shapes the step needs on the host (flatten's, the reshape back in its gradient,
    the convolution gradients' spatial shapes) are computed from the inputs' shapes, never
    read from a convolution's or a pooling's output: so the graph runner (graph_plan.schedule)
    runs that host work before the first launch, and the whole step is one CUDA-graph segment.
    (On the H100 the reads split the step into 4 segments whose keys did not settle.)"""
    shapes = [(20, 1, 5, 5), (20,), (50, 20, 5, 5), (50,), (800, 500), (500,), (500, 10),
              (10,)]
    with config.change_flags(floatX="float32"), virtual_context(None):
        f = _lenet_step_on_gpu_inputs(shapes, conv_kw, second_pool)
    nodes = f.maker.fgraph.toposort()
    on_gpu = set()     # variables computed by device work (not shape reads or views of inputs)
    for n in nodes:
        name = type(n.op).__name__
        waits = [v for v in n.inputs if v in on_gpu]
        if name != "HostFromGpu":
            assert name.startswith("Gpu") or not waits, (n, waits)
        if (name.startswith("Gpu") and name not in NON_LAUNCHING) or waits:
            on_gpu.update(n.outputs)
    names = {type(n.op).__name__ for n in nodes}
    assert {"GpuConv2d", "GpuConv2dGradInputs", "GpuConv2dGradWeights", "GpuPool"} <= names
    assert_one_segment(nodes)


def test_references_compiled_on_the_cpu_stay_there_beside_a_default_gpu_context():
    """The GPU tests' references (gpu_helpers.on_the_cpu): with a default context registered
    (as the cuda fixture does), device=cpu alone would still place the graph on it."""
    x, w = T.ftensor4(), T.ftensor4()
    with config.change_flags(floatX="float32"), virtual_context(None):
        with config.change_flags(device="cpu"):
            assert "GpuConv2d" in _names(function([x, w], conv2d(x, w)))
        with on_the_cpu():
            names = _names(function([x, w], conv2d(x, w)))
            assert not isinstance(symgpu.shared(np.zeros(2, "float32")).type, GpuArrayType)
        assert "Conv2d" in names and not any(n.startswith("Gpu") for n in names), names
        assert "GpuConv2d" in _names(function([x, w], conv2d(x, w)))   # registered again


@requires_nvcc
def test_kernels_compile(tmp_path):
    cubin = compile_for_sm90(conv_gemm_source(), tmp_path / "a")
    for name in ("im2col_float32", "col2im_float64"):
        assert name.encode() in cubin
    cubin = compile_for_sm90(pooling_source(), tmp_path / "b")
    for kind, dt, sfx in itertools.product(("fwd", "grad", "ggrad"), ("float32", "float64"),
                                           ("", "_i32")):
        assert f"pool_{kind}_{dt}{sfx}\0".encode() in cubin


def test_pooling_kernels_index_with_ints_where_everything_fits():
    from symgpu.gpu.ops.pooling import GpuPool
    op = GpuPool((2, 2))
    assert index_suffix(op.geo((128, 20, 24, 24))) == "_i32"
    assert index_suffix(op.geo((1, 2, 3))) == "_i32"
    # 2**31 input elements, or an output index past it: 64-bit indices
    assert index_suffix(op.geo((2 ** 15, 2 ** 8, 16, 16))) == ""
    assert index_suffix(GpuPool((1, 1), pad=(0, 0)).geo((2 ** 20, 2 ** 5, 8, 8))) == ""
    assert index_suffix(op.geo((2 ** 14, 2 ** 8, 16, 16))) == "_i32"


def test_backend_message_is_said_once(capsys, monkeypatch):
    monkeypatch.setattr(gconv, "_announced", set())
    monkeypatch.setattr(gconv, "FORCE_GEMM", True)
    assert gconv.conv_backend()[0] == "gemm"
    gconv.conv_backend()
    err = capsys.readouterr().err
    assert err.count("im2col + cuBLAS") == 1


class _FakePlan:
    """The part of cudnn.ConvDescs that _GpuConvBase._execute uses, recording its calls."""

    def __init__(self):
        self.timed, self.search_workspace, self.workspace, self.calls = False, 1024, 256, []

    def time_algorithms(self, a, b, out, ws, size):
        self.calls.append(("time", a, b, out, size))
        self.timed = True

    def run(self, a, b, out, ws):
        self.calls.append(("run", a, b, out))


class _FakePool:
    def __init__(self, sink):
        self.sink, self.sizes = sink, []

    def allocate(self, n):
        self.sizes.append(n)
        return type("Block", (), {"ptr": 4096 * len(self.sizes)})()


@pytest.mark.parametrize("capturing", [False, True])
def test_cudnn_algorithms_are_timed_once_and_never_under_capture(monkeypatch, capturing):
    """The timed search (a sync) runs at a plan's first call outside a capture, once; under a
    capture (the pool's sink set) the plan keeps the heuristic choice; workspaces come from
    the pool."""
    monkeypatch.setattr(gconv, "ALGO_SEARCH", "time")
    ctx = type("Ctx", (), {"pool": _FakePool([] if capturing else None)})()
    plan = _FakePlan()
    for _ in range(3):
        gconv._GpuConvBase._execute(ctx, plan, 1, 2, 3)
    kinds = [c[0] for c in plan.calls]
    if capturing:
        assert kinds == ["run"] * 3 and ctx.pool.sizes == [256] * 3
    else:
        assert kinds == ["time", "run", "run", "run"], kinds
        assert plan.calls[0] == ("time", 1, 2, 3, 1024) and ctx.pool.sizes == [1024] + [256] * 3
    monkeypatch.setattr(gconv, "ALGO_SEARCH", "heuristic")
    plan = _FakePlan()
    gconv._GpuConvBase._execute(type("Ctx", (), {"pool": _FakePool(None)})(), plan, 1, 2, 3)
    assert [c[0] for c in plan.calls] == ["run"]


# ============================================================================ GPU

@pytest.fixture(params=["cudnn", "gemm"])
def backend(request, monkeypatch):
    monkeypatch.setattr(gconv, "FORCE_GEMM", request.param == "gemm")
    if request.param == "cudnn":
        from symgpu.gpu.ops.cudnn import cudnn_available
        if not cudnn_available():
            pytest.skip("cuDNN is not installed")
    return request.param


@requires_gpu
@pytest.mark.parametrize("bm,s,d,flip,g", CONV_COMBOS)
def test_gpu_conv_matches_cpu(cuda, backend, bm, s, d, flip, g):
    kw = dict(border_mode=bm, subsample=s, filter_dilation=d, filter_flip=flip, num_groups=g)
    xv = RNG.normal(size=(2, 4, 9, 8))
    wv = RNG.normal(size=(6, 4 // g, 3, 2))
    x, w, gy = T.dtensor4(), T.dtensor4(), T.dtensor4()
    y = conv2d(x, w, **kw)
    gx, gw = symgpu.grad((y * gy).sum(), [x, w])
    with on_the_cpu():
        gyv = RNG.normal(size=function([x, w], y)(xv, wv).shape)
        want = function([x, w, gy], [y, gx, gw])(xv, wv, gyv)
    f = function([x, w, gy], [y, gx, gw])
    assert {"GpuConv2d", "GpuConv2dGradInputs", "GpuConv2dGradWeights"} <= _names(f)
    for got, ref in zip(f(xv, wv, gyv), want):
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-10)


def _float32_conv_case(kw):
    """A float32 conv2d with its two gradients: (inputs, outputs, values, the CPU's results)."""
    x, w = T.ftensor4(), T.ftensor4()
    xv = RNG.normal(size=(8, 4, 12, 11)).astype("float32")
    wv = RNG.normal(size=(8, 4 // kw.get("num_groups", 1), 5, 3)).astype("float32")
    y = conv2d(x, w, **kw)
    outs = [y, *symgpu.grad(T.sum(y ** 2), [x, w])]
    with on_the_cpu():
        want = function([x, w], outs)(xv, wv)
    return [x, w], outs, (xv, wv), want


@requires_gpu
@pytest.mark.parametrize("kw", [dict(), dict(border_mode="half", subsample=(2, 2)),
                                dict(border_mode=((0, 1), (2, 0)), num_groups=2)])
def test_gpu_conv_float32(cuda, backend, kw):
    ins, outs, (xv, wv), want = _float32_conv_case(kw)
    f = function(ins, outs)
    assert "GpuConv2d" in _names(f)
    for got, ref in zip(f(xv, wv), want):
        np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-3 * np.abs(ref).max())


@requires_gpu
@pytest.mark.parametrize("kw", [dict(), dict(border_mode="half", subsample=(2, 2)),
                                dict(border_mode=((0, 1), (2, 0)), num_groups=2)])
def test_gpu_conv_timed_and_heuristic_algorithms_agree(cuda, monkeypatch, kw):
    """Both ways of choosing cuDNN's algorithm give the CPU's values; the timed one records
    its choice per geometry (cudnn._TIMED: keyed on the handle, then the direction)."""
    from symgpu.gpu.ops import cudnn
    if not cudnn.cudnn_available():
        pytest.skip("cuDNN is not installed")
    monkeypatch.setattr(gconv, "FORCE_GEMM", False)
    monkeypatch.setattr(cudnn, "_TIMED", {})
    ins, outs, (xv, wv), want = _float32_conv_case(kw)
    for how in ("heuristic", "time"):
        monkeypatch.setattr(gconv, "ALGO_SEARCH", how)
        f = function(ins, outs)
        for _ in range(3):   # plain, captured, replayed
            got = f(xv, wv)
        for g, ref in zip(got, want):
            np.testing.assert_allclose(g, ref, rtol=2e-4, atol=2e-3 * np.abs(ref).max())
        if how == "heuristic":
            assert not cudnn._TIMED
    assert {k[1] for k in cudnn._TIMED} == {"fwd", "bwd_data", "bwd_filter"}, cudnn._TIMED


@requires_gpu
@pytest.mark.parametrize("ws,stride,pad,ignore_border,mode", POOL_COMBOS)
def test_gpu_pool_matches_cpu(cuda, ws, stride, pad, ignore_border, mode):
    x, gz = T.dtensor4(), T.dtensor4()
    y = pool_2d(x, ws, ignore_border=ignore_border, stride=stride, pad=pad, mode=mode)
    gx = symgpu.grad((y * gz).sum(), x)
    xv = RNG.normal(size=(2, 3, 7, 8))
    with on_the_cpu():
        yv = function([x], y)(xv)
        gzv = RNG.normal(size=yv.shape)
        want = function([x, gz], [y, gx])(xv, gzv)
    f = function([x, gz], [y, gx])
    names = _names(f)
    assert "GpuPool" in names and not names & {"Pool", "MaxPoolGrad", "AveragePoolGrad"}
    for got, ref in zip(f(xv, gzv), want):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


@pytest.fixture(params=["int", "long long"])
def pool_index(request, monkeypatch):
    """Both index widths of the pooling kernels (64-bit ones are otherwise only taken past
    2**31 elements)."""
    if request.param == "long long":
        monkeypatch.setattr(gpooling, "_INT32_LIMIT", 0)
    return request.param


@requires_gpu
@pytest.mark.parametrize("ws,stride,pad,ignore_border,mode", POOL_COMBOS[::5])
def test_gpu_pool_64bit_indices_match_cpu(cuda, ws, stride, pad, ignore_border, mode,
                                          monkeypatch):
    monkeypatch.setattr(gpooling, "_INT32_LIMIT", 0)
    assert index_suffix([2, 7, 8, 3, 4, 2, 2, 2, 2, 0, 0]) == ""
    test_gpu_pool_matches_cpu(cuda, ws, stride, pad, ignore_border, mode)


@requires_gpu
@pytest.mark.parametrize("mode", ["max", "sum", "average_inc_pad"])
def test_gpu_pool_second_derivative(cuda, mode, pool_index):
    x = T.dtensor4()
    g = symgpu.grad((pool_2d(x, (2, 3), stride=(1, 2), mode=mode) ** 2).sum(), x)
    h = symgpu.grad((g * T.constant(RNG.normal(size=(1, 2, 5, 6)))).sum(), x)
    xv = RNG.permutation(60).reshape(1, 2, 5, 6) * 0.1
    with on_the_cpu():
        want = function([x], [g, h])(xv)
    for got, ref in zip(function([x], [g, h])(xv), want):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def _train_lenet(dev, calls=6):
    """(costs, final parameters, the function) of `calls` SGD steps of _lenet_like on `dev`."""
    x, y = T.tensor4("x"), T.matrix("y")
    shapes = [(4, 1, 3, 3), (6, 4, 3, 3), (6 * 3 * 3, 10), (10,)]
    rng = np.random.default_rng(5)
    init = [rng.normal(scale=0.3, size=s).astype("float32") for s in shapes]
    xv = rng.normal(size=(16, 1, 14, 14)).astype("float32")
    yv = np.eye(10, dtype="float32")[rng.integers(0, 10, 16)]
    with (on_the_cpu() if dev == "cpu" else config.change_flags(device=dev)):
        params = [symgpu.shared(v.copy()) for v in init]
        cost = _lenet_like(x, y, params)
        grads = T.grad(cost, params)
        f = function([x, y], cost, updates=[(p, p - 0.05 * g) for p, g in zip(params, grads)])
        costs = [float(f(xv, yv)) for _ in range(calls)]
        return costs, [p.get_value() for p in params], f


@requires_gpu
def test_gpu_lenet_step_matches_cpu(cuda, backend):
    cpu_costs, cpu_params, cpu_f = _train_lenet("cpu")
    assert not any(name.startswith("Gpu") for name in _names(cpu_f)), _names(cpu_f)
    costs, params, f = _train_lenet("cuda")
    np.testing.assert_allclose(costs, cpu_costs, rtol=1e-4)
    for a, b in zip(params, cpu_params):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    assert GPU_NAMES - {"GpuConv2dGradInputs"} <= _names(f)


@requires_gpu
@pytest.mark.parametrize("algo_search", ["heuristic", "time"])
def test_gpu_lenet_step_replays_as_one_graph(cuda, backend, monkeypatch, algo_search):
    """The whole step is one segment: captured at the second call, replayed from the third
    (the shared parameters keep their buffers, the uploads recycle theirs, the host shape
    work runs before the launches: test_lenet_step_has_no_host_work_between_its_kernels),
    with cuDNN's algorithms chosen either way (gconv.ALGO_SEARCH)."""
    if backend == "gemm" and algo_search == "time":
        pytest.skip("no cuDNN algorithm to choose on the im2col path")
    monkeypatch.setattr(gconv, "ALGO_SEARCH", algo_search)
    costs, _, f = _train_lenet("cuda", calls=8)
    st = f.vm.runner.stats()
    assert st["segments"] == 1 and st["captures"] >= 1, st
    assert st["replays"] >= 5, st
    cpu_costs = _train_lenet("cpu", calls=8)[0]
    np.testing.assert_allclose(costs, cpu_costs, rtol=1e-4)
