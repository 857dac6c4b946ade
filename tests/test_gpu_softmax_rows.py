"""GpuSoftmaxRows (softmax / log_softmax along the last axis in one launch): which graphs take
it (virtual context, CPU), how an array is seen as rows, nvcc compilation of its kernels
(``nvcc``), and values against NumPy on a real GPU (``gpu``): short rows (a warp each), long
rows (a block each), strided and non-collapsible layouts, NaN and infinities, inside a
replayed CUDA graph, and the gradient of a classifier's loss."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import compile_for_sm90, requires_gpu, requires_nvcc
from symgpu import config, function, shared
from symgpu.gpu.ops.softmax_rows import (WIDE_ROW, GpuSoftmaxRows, rows_layout,
                                         softmax_rows_source)
from symgpu.gpu.placement.rewriting import virtual_context

CPU_NAMES = {"Softmax", "LogSoftmax", "Elemwise", "CAReduce"}


def _ops(f):
    return [n.op for n in f.maker.fgraph.toposort()]


# ============================================================================ CPU

@pytest.mark.parametrize("build, log", [
    (lambda x: T.nnet.softmax(x), False),
    (lambda x: T.nnet.log_softmax(x), True),
    (lambda x: T.nnet.softmax(x, axis=1), False),
    (lambda x: T.log(T.nnet.softmax(x)), True),        # stabilised into log_softmax first
])
def test_last_axis_softmax_of_a_matrix_is_one_node(build, log):
    with config.change_flags(floatX="float32", assert_no_cpu_op="raise"), virtual_context(None):
        x = T.matrix("x")
        ops = _ops(function([x], build(x)))
        rows = [op for op in ops if isinstance(op, GpuSoftmaxRows)]
        assert rows == [GpuSoftmaxRows(log=log)], ops
        assert not any(type(op).__name__ in ("GpuCAReduce", "GpuElemwise") for op in ops), ops


def test_other_axes_stay_expanded():
    with config.change_flags(floatX="float32", assert_no_cpu_op="raise"), virtual_context(None):
        x, v, t = T.matrix("x"), T.vector("v"), T.tensor3("t")
        for out in (T.nnet.softmax(x, axis=0), T.nnet.log_softmax(x, axis=None),
                    T.nnet.softmax(v, axis=None)):
            ops = _ops(function([x, v], out, on_unused_input="ignore"))
            assert not any(isinstance(op, GpuSoftmaxRows) for op in ops), ops
        ops = _ops(function([t], T.nnet.softmax(t)))      # a 3-d array's last axis: rows
        assert GpuSoftmaxRows(log=False) in ops, ops
        ops = _ops(function([v], T.nnet.softmax(v)))      # a vector is a 1 x n row (Theano)
        assert GpuSoftmaxRows(log=False) in ops, ops


def test_a_classifiers_loss_and_gradient_take_the_row_kernels():
    """-mean(log(softmax(z))[arange(n), y]) and its gradient (the tutorials' spelling): the
    forward log_softmax and the softmax of its gradient are GpuSoftmaxRows nodes."""
    with config.change_flags(floatX="float32", assert_no_cpu_op="raise"), virtual_context(None):
        x, w, y = T.matrix("x"), T.matrix("w"), T.lvector("y")
        p = T.nnet.softmax(T.dot(x, w))
        loss = -T.mean(T.log(p)[T.arange(y.shape[0]), y])
        ops = _ops(function([x, w, y], [loss, T.grad(loss, w)]))
        assert GpuSoftmaxRows(log=True) in ops, ops


def test_a_classifiers_bias_add_is_read_by_the_row_kernel():
    """log_softmax(dot(h, W) + b): the row kernel adds b as it reads (GpuSoftmaxRows{bias}),
    no add kernel, by default (gpu_softmax_rows_bias is in fast_run); with
    ``optimizer_excluding=gpu_softmax_rows_bias``, the add is back. A sum read by something
    else too keeps its add."""
    def ops(extra=False, **flags):
        with config.change_flags(floatX="float32", **flags), virtual_context(None):
            h, w, b = T.matrix("h"), T.matrix("w"), T.vector("b")
            z = T.dot(h, w) + b
            outs = [T.nnet.log_softmax(z)] + ([z * 2] if extra else [])
            return [str(n.op) for n in function([h, w, b], outs).maker.fgraph.toposort()]
    fused, plain = ops(), ops(optimizer_excluding="gpu_softmax_rows_bias")
    assert "GpuSoftmaxRows{log,bias}" in fused and not any("add" in o for o in fused), fused
    assert "GpuSoftmaxRows{log}" in plain and any("add" in o for o in plain), plain
    assert "GpuSoftmaxRows{log}" in ops(extra=True)


def test_props_and_errors():
    assert GpuSoftmaxRows(True) == GpuSoftmaxRows(log=True) != GpuSoftmaxRows()
    assert str(GpuSoftmaxRows()) == "GpuSoftmaxRows{softmax}"
    assert str(GpuSoftmaxRows(True)) == "GpuSoftmaxRows{log}"
    with pytest.raises(TypeError, match="expected a GPU variable"):
        GpuSoftmaxRows()(T.matrix("x"))
    from symgpu.gpu.placement.type import GpuArrayType
    with pytest.raises(TypeError, match="float16, bfloat16, float32, float64"):
        GpuSoftmaxRows()(GpuArrayType("int32", (False, False), None)())
    with pytest.raises(TypeError, match="at least one dimension"):
        GpuSoftmaxRows()(GpuArrayType("float32", (), None)())


@pytest.mark.parametrize("shape, strides, want", [
    ((4, 5), (20, 4), (4, 5, 5, 1)),              # C-contiguous
    ((5, 4), (4, 20), (5, 4, 1, 5)),              # transposed: rows along a stride
    ((2, 3, 5), (60, 20, 4), (6, 5, 5, 1)),       # leading axes collapse
    ((3, 1, 5), (20, 20, 4), (3, 5, 5, 1)),       # a length-1 axis is skipped
    ((2, 3, 5), (120, 20, 4), None),              # they do not: copied first
    ((2, 3), (12, 6), None),                      # a stride that is not whole elements
    ((7,), (4,), (1, 7, 0, 1)),
])
def test_rows_layout(shape, strides, want):
    assert rows_layout(shape, strides, 4) == want


@requires_nvcc
def test_kernels_compile(tmp_path):
    src = softmax_rows_source()
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        for name in ("softmax_warp_rows", "log_softmax_block_rows"):
            assert f"{name}_{dtype}" in src
    assert compile_for_sm90(src, tmp_path)


# ============================================================================ GPU

RNG = np.random.default_rng(7)


def _np(a, log):
    s = a - a.max(axis=-1, keepdims=True)
    if log:
        return s - np.log(np.exp(s).sum(axis=-1, keepdims=True))
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def _run(x, out, a):
    f = function([x], out)
    names = {type(op).__name__ for op in _ops(f)}
    assert "GpuSoftmaxRows" in names and not names & CPU_NAMES, names
    return np.asarray(f(a))


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", [1, 10, 33, WIDE_ROW, WIDE_ROW + 1, 5000])
def test_values_against_numpy(cuda, dtype, n):
    x = T.matrix("x", dtype=dtype)
    a = (RNG.standard_normal((37, n)) * 10).astype(dtype)
    tol = 1e-5 if dtype == "float32" else 1e-12
    for log in (False, True):
        out = T.nnet.log_softmax(x) if log else T.nnet.softmax(x)
        np.testing.assert_allclose(_run(x, out, a), _np(a, log), rtol=tol, atol=tol)


@requires_gpu
@pytest.mark.parametrize("n", [10, WIDE_ROW + 1])
def test_the_bias_kernel_equals_the_add_then_the_row_kernel(cuda, n):
    h, w, b = T.matrix("h"), T.matrix("w"), T.vector("b")
    outs = [T.nnet.log_softmax(T.dot(h, w) + b), T.nnet.softmax(T.dot(h, w) + b)]
    fused = function([h, w, b], outs)                          # in fast_run
    assert "GpuSoftmaxRows{log,bias}" in [str(op) for op in _ops(fused)]
    with config.change_flags(optimizer_excluding="gpu_softmax_rows_bias"):
        plain = function([h, w, b], outs)
    assert "GpuSoftmaxRows{log,bias}" not in [str(op) for op in _ops(plain)]
    args = [RNG.standard_normal(s).astype("float32") for s in ((37, 20), (20, n), (n,))]
    for got, want in zip(fused(*args), plain(*args)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)


@requires_gpu
def test_strided_and_non_collapsible_layouts(cuda):
    t = T.tensor3("t")
    a = RNG.standard_normal((4, 6, 9)).astype("float32")
    for out, view in ((T.nnet.softmax(t.dimshuffle(0, 2, 1)), a.transpose(0, 2, 1)),
                      (T.nnet.log_softmax(t[:, ::2, ::-1]), a[:, ::2, ::-1]),
                      (T.nnet.softmax(t.dimshuffle(1, 0, 2)), a.transpose(1, 0, 2))):
        log = isinstance(out.owner.op, T.nnet.LogSoftmax)
        np.testing.assert_allclose(_run(t, out, a), _np(view, log), rtol=1e-5, atol=1e-6)


@requires_gpu
def test_nan_and_infinities_as_numpy(cuda):
    x = T.matrix("x")
    a = np.zeros((4, 40), "float32")
    a[0, 3] = np.nan                   # a NaN row is all NaN
    a[1, :] = -np.inf                  # all -inf: NaN, as exp(-inf - -inf)
    a[2, 5] = np.inf                   # +inf: NaN where inf - inf
    a[3, 7] = -np.inf                  # one -inf: probability 0, log -inf
    with np.errstate(invalid="ignore"):
        for log in (False, True):
            out = T.nnet.log_softmax(x) if log else T.nnet.softmax(x)
            got, want = _run(x, out, a), _np(a, log).astype("float32")
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)   # NaNs equal


@requires_gpu
def test_a_classifier_step_replays_and_matches_the_cpu(cuda):
    """An SGD step of softmax regression with the tutorials' loss, 30 calls (captured then
    replayed), against the same step on the host."""
    from gpu_helpers import on_the_cpu
    xv = RNG.standard_normal((64, 20)).astype("float32")
    yv = RNG.integers(0, 7, 64).astype("int64")

    def build():
        x, y = shared(xv), shared(yv)
        w = shared(np.zeros((20, 7), "float32"))
        p = T.nnet.softmax(T.dot(x, w))
        loss = -T.mean(T.log(p)[T.arange(y.shape[0]), y])
        return w, function([], loss, updates=[(w, w - 0.5 * T.grad(loss, w))])
    w_gpu, step = build()
    assert GpuSoftmaxRows(log=True) in _ops(step)
    with on_the_cpu():
        w_cpu, step_cpu = build()
    for _ in range(30):
        got, want = float(np.asarray(step())), float(step_cpu())
        assert abs(got - want) <= 1e-5 * max(1.0, abs(want))
    runner = step.vm.runner
    assert runner is not None and runner.stats()["replays"] > 0, runner
    np.testing.assert_allclose(np.asarray(w_gpu.get_value()), w_cpu.get_value(),
                               rtol=1e-4, atol=1e-5)
