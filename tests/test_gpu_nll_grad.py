"""GpuNLLGrad and gpu_nll_grad_fusion: the gradient of the tutorials' negative log-likelihood
(``-mean(log(softmax(z))[arange(n), y])``) reaching the logits in one launch. Which graphs the
pass rewrites (virtual context, CPU), nvcc compilation (``nvcc``), and on a real GPU
(``gpu``): values equal to the unfused ops' (to rounding) and NumPy's, labels checked as the scatter checks
them, and a failing step leaving its shared variables untouched."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import compile_for_sm90, requires_gpu, requires_nvcc
from symgpu import config, function, shared
from symgpu.gpu.ops.nll_grad import GpuNLLGrad, nll_grad_source
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.gpu.placement.type import GpuArrayType

UNFUSED = "gpu_nll_grad_fusion"


def _loss(z, y, rows=None):
    p = T.nnet.softmax(z)
    r = T.arange(y.shape[0]) if rows is None else rows
    return -T.mean(T.log(p)[r, y])


def _logsoftmax_loss(z, y):
    """The same loss spelled with ``T.nnet.logsoftmax`` (its gradient writes the softmax as
    ``exp(logsoftmax(z))``)."""
    return -T.mean(T.nnet.logsoftmax(z)[T.arange(y.shape[0]), y])


def _names(f):
    return [type(n.op).__name__ for n in f.maker.fgraph.toposort()]


# ============================================================================ CPU

@pytest.mark.parametrize("label_dtype", ["int32", "int64"])
def test_the_classifier_gradient_is_one_node(label_dtype):
    with config.change_flags(floatX="float32", assert_no_cpu_op="raise"), virtual_context(None):
        x, w, y = T.matrix("x"), T.matrix("w"), T.vector("y", dtype=label_dtype)
        loss = _loss(T.dot(x, w), y)
        names = _names(function([x, w, y], [loss, T.grad(loss, w)]))
        assert names.count("GpuNLLGrad") == 1, names
        assert "GpuAdvancedIncSubtensor2" not in names, names
        with config.change_flags(optimizer_excluding=UNFUSED):
            names = _names(function([x, w, y], [loss, T.grad(loss, w)]))
        assert "GpuNLLGrad" not in names and "GpuAdvancedIncSubtensor2" in names, names


def _classifier_ops(loss_of, **flags) -> list[str]:
    """The ops of a classifier's loss and weight gradient on a virtual GPU (``loss_of(z, y)``
    the loss of the logits z = x . w)."""
    with config.change_flags(floatX="float32", **flags), virtual_context(None):
        x, w, y = T.matrix("x"), T.matrix("w"), T.lvector("y")
        loss = loss_of(T.dot(x, w), y)
        f = function([x, w, y], [loss, T.grad(loss, w)])
    return [str(n.op) for n in f.maker.fgraph.toposort()]


def test_the_gradient_reads_the_losss_log_softmax_instead_of_a_softmax_of_its_own():
    """With the loss computed too, its log-softmax feeds the gradient (exp taken there): one
    softmax kernel less, by default (gpu_nll_grad_log_softmax is in fast_run); with
    ``optimizer_excluding=gpu_nll_grad_log_softmax``, the softmax is back."""
    fused = _classifier_ops(_loss)
    plain = _classifier_ops(_loss, optimizer_excluding="gpu_nll_grad_log_softmax")
    assert "GpuNLLGrad{exp}" in fused and "GpuSoftmaxRows{softmax}" not in fused, fused
    assert "GpuSoftmaxRows{log}" in fused
    assert "GpuNLLGrad" in plain and "GpuSoftmaxRows{softmax}" in plain, plain
    assert len(fused) == len(plain) - 1


def test_the_logsoftmax_spelling_takes_the_exp_in_the_gradients_kernel():
    """``-mean(logsoftmax(z)[arange(n), y])``: its gradient's softmax is ``exp`` of the
    log-softmax, an elementwise launch of its own; gpu_nll_grad_log_softmax folds it into
    GpuNLLGrad{exp}, which reads the log-softmax."""
    fused = _classifier_ops(_logsoftmax_loss)
    plain = _classifier_ops(_logsoftmax_loss, optimizer_excluding="gpu_nll_grad_log_softmax")
    assert "GpuNLLGrad{exp}" in fused and not any("{exp," in o for o in fused), fused
    assert "GpuNLLGrad" in plain and any("GpuElemwise{exp" in o for o in plain), plain
    assert len(fused) == len(plain) - 1


def test_rows_folded_into_a_constant_still_match():
    """``arange(4)`` of constants is folded into a constant vector before the pass runs."""
    with config.change_flags(floatX="float32"), virtual_context(None):
        z, y = T.matrix("z"), T.lvector("y")
        names = _names(function([z, y], T.grad(_loss(z, y, T.arange(4)), z)))
        assert "GpuNLLGrad" in names and "GpuAdvancedIncSubtensor2" not in names, names
        names = _names(function([z, y], T.grad(_loss(z, y, T.arange(1, 5)), z)))
        assert "GpuNLLGrad" not in names, names


def test_other_scatters_are_left_alone():
    """Rows other than arange(0, r, 1), or a scatter into something that is not zeros, keep
    the general ops (their row sums are not a single value)."""
    with config.change_flags(floatX="float32"), virtual_context(None):
        z, y, rows = T.matrix("z"), T.lvector("y"), T.lvector("rows")
        for loss in (_loss(z, y, rows),                              # rows given by the caller
                     _loss(z, y, T.arange(1, y.shape[0] + 1)),       # shifted rows
                     _loss(z, y, T.arange(0, 2 * y.shape[0], 2))):   # every other row
            names = _names(function([z, y, rows], T.grad(loss, z), on_unused_input="ignore"))
            assert "GpuNLLGrad" not in names, names
        g = T.matrix("g")   # a scatter added to a non-zero matrix
        s = T.inc_subtensor(g[T.arange(y.shape[0]), y], 1.0)
        out = s - T.nnet.softmax(z) * s.sum(axis=1, keepdims=True)
        assert "GpuNLLGrad" not in _names(function([g, z, y], out))


def test_the_log_softmax_swap_needs_the_softmaxs_own_bias():
    """gpu_nll_grad_log_softmax gives the gradient exp(log_softmax) for its softmax only when
    both are of the same arguments: with ``bias``, the same logits and the same bias. A
    log-softmax of those logits with another bias, or with none (or a softmax with none and
    a log-softmax with one), computes something else, and the gradient keeps its softmax."""
    from symgpu.graph.fg import FunctionGraph
    from symgpu.gpu.ops.nll_grad import gpu_nll_grad_log_softmax
    from symgpu.gpu.ops.softmax_rows import GpuSoftmaxRows
    with virtual_context(None):
        mat = GpuArrayType("float32", (False, False), None)
        vec = GpuArrayType("float32", (False,), None)
        z, b, other, v = mat("z"), vec("b"), vec("other"), vec("v")
        y, r = GpuArrayType("int64", (False,), None)("y"), T.lscalar("r")

        def swapped(m, log):
            fg = FunctionGraph([z, b, other, v, r, y], [GpuNLLGrad()(v, m, r, y), log])
            done = gpu_nll_grad_log_softmax(fg)
            ops = [str(n.op) for n in fg.toposort()]
            assert ("GpuNLLGrad{exp}" in ops) == bool(done), ops
            return done

        soft, log = GpuSoftmaxRows(), GpuSoftmaxRows(log=True)
        soft_b, log_b = GpuSoftmaxRows(bias=True), GpuSoftmaxRows(log=True, bias=True)
        assert swapped(soft(z), log(z)) == 1
        assert swapped(soft_b(z, b), log_b(z, b)) == 1
        assert swapped(soft_b(z, b), log_b(z, other)) == 0
        assert swapped(soft_b(z, b), log(z)) == 0
        assert swapped(soft(z), log_b(z, b)) == 0


def test_make_node_checks_its_inputs():
    ctx = None
    m = GpuArrayType("float32", (False, False), ctx)()
    v = GpuArrayType("float32", (False,), ctx)()
    y = GpuArrayType("int64", (False,), ctx)()
    r = T.lscalar("r")
    assert GpuNLLGrad()(v, m, r, y).type == m.type
    with pytest.raises(TypeError, match="GPU variables"):
        GpuNLLGrad()(v, T.matrix("m"), r, y)
    with pytest.raises(TypeError, match="matrix"):
        GpuNLLGrad()(GpuArrayType("float64", (False,), ctx)(), m, r, y)
    with pytest.raises(TypeError, match="labels"):
        GpuNLLGrad()(v, m, r, GpuArrayType("float32", (False,), ctx)())
    with pytest.raises(TypeError, match="row count"):
        GpuNLLGrad()(v, m, T.dscalar("r"), y)


@requires_nvcc
def test_kernels_compile(tmp_path):
    src = nll_grad_source()
    for name in ("nll_grad_float32_int32", "nll_grad_float64_int64",
                 "nll_grad_exp_float32_int64", "nll_grad_bfloat16_int64",
                 "nll_grad_exp_float16_int32"):
        assert name in src
    assert compile_for_sm90(src, tmp_path)


# ============================================================================ GPU

RNG = np.random.default_rng(11)


def _np_grad(z, y, rows):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    sm = e / e.sum(axis=1, keepdims=True)
    g = np.zeros_like(z)
    g[np.arange(rows), y] = -1.0 / rows
    return g - sm * g.sum(axis=1, keepdims=True)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("label_dtype", ["int32", "int64"])
def test_values_equal_the_unfused_ops_and_numpy(cuda, dtype, label_dtype):
    z, y = T.matrix("z", dtype=dtype), T.vector("y", dtype=label_dtype)
    zv = (RNG.standard_normal((40, 13)) * 3).astype(dtype)
    yv = RNG.integers(-13, 13, 40).astype(label_dtype)        # negative labels count from the end
    grad = T.grad(_loss(z, y), z)
    fused = function([z, y], grad)
    assert "GpuNLLGrad" in _names(fused)
    with config.change_flags(optimizer_excluding=UNFUSED):
        plain = function([z, y], grad)
    got, want = np.asarray(fused(zv, yv)), np.asarray(plain(zv, yv))
    tol = 1e-6 if dtype == "float32" else 1e-14   # the same arithmetic (nvcc may fuse the
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)   # multiply-subtract in either)
    np.testing.assert_allclose(got, _np_grad(zv.astype("float64"), yv, 40), rtol=tol, atol=tol)


@requires_gpu
@pytest.mark.parametrize("spelling", ["log(softmax)", "logsoftmax"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_gradient_from_the_log_softmax_matches_the_softmaxs(cuda, dtype, spelling):
    z, y = T.matrix("z", dtype=dtype), T.lvector("y")
    zv = (RNG.standard_normal((40, 13)) * 3).astype(dtype)
    yv = RNG.integers(0, 13, 40)
    loss = _loss(z, y) if spelling == "log(softmax)" else _logsoftmax_loss(z, y)
    outs = [loss, T.grad(loss, z)]
    fused = function([z, y], outs)                             # in fast_run
    assert "GpuNLLGrad{exp}" in [str(n.op) for n in fused.maker.fgraph.toposort()]
    with config.change_flags(optimizer_excluding="gpu_nll_grad_log_softmax"):
        plain = function([z, y], outs)
    assert "GpuNLLGrad{exp}" not in [str(n.op) for n in plain.maker.fgraph.toposort()]
    tol = 1e-6 if dtype == "float32" else 1e-14
    for got, want in zip(fused(zv, yv), plain(zv, yv)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(fused(zv, yv)[1]),
                               _np_grad(zv.astype("float64"), yv, 40), rtol=tol, atol=tol)


@requires_gpu
def test_fewer_labelled_rows_and_one_broadcast_label(cuda):
    z, y = T.matrix("z"), T.lvector("y")
    zv = RNG.standard_normal((9, 5)).astype("float32")
    grad = T.grad(_loss(z, y, T.arange(4)), z)             # rows 0..3 labelled, y of length 4
    f = function([z, y], grad)
    assert "GpuNLLGrad" in _names(f)
    with config.change_flags(optimizer_excluding=UNFUSED):
        g = function([z, y], grad)
    for yv in (np.array([4, 0, 2, 1]), np.array([3])):      # a length-1 y broadcasts
        np.testing.assert_allclose(np.asarray(f(zv, yv)), np.asarray(g(zv, yv)), rtol=1e-6,
                                   atol=1e-7)


@requires_gpu
def test_a_bad_label_raises_and_leaves_the_step_undone(cuda):
    """An SGD step whose labels hold an out-of-range class raises IndexError naming the
    shapes; its weights keep their values, and a good call afterwards runs."""
    xv = RNG.standard_normal((16, 6)).astype("float32")
    w = shared(np.zeros((6, 4), "float32"))
    x, y = T.matrix("x"), T.lvector("y")
    loss = _loss(T.dot(x, w), y)
    step = function([x, y], loss, updates=[(w, w - 0.1 * T.grad(loss, w))])
    assert "GpuNLLGrad" in _names(step)
    good = RNG.integers(0, 4, 16)
    step(xv, good)
    before = np.asarray(w.get_value())
    bad = good.copy()
    bad[5] = 4
    with pytest.raises(IndexError, match=r"out of bounds .*shape \(16, 4\)"):
        step(xv, bad)
        np.asarray(w.get_value())       # a deferred check raises here at the latest
    np.testing.assert_array_equal(np.asarray(w.get_value()), before)
    step(xv, good)
    assert not np.array_equal(np.asarray(w.get_value()), before)
