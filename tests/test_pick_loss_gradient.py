"""The gradient of a picked-out loss, ``-mean(lp[arange(y.shape[0]), y])``, computes no pick:
the fill of ``-1/n`` takes its shape from the labels (local_fill_model_of_its_shape), the
scatter takes ``-1/n`` as a broadcast value (local_inc_fill_of_index_shape), and the count
is ``y.shape[0]`` itself (an arange's length and NumPy's broadcast of two equal lengths,
simplified in shape_rules). Graphs inspected on the CPU and a virtual GPU; values against
NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import config, function
from symgpu.graph.fg import FunctionGraph
from symgpu.tensor.rewriting.shape_feature import inferred_shape
from symgpu.tensor.shape_rules import arange_length, numpy_broadcast, same_dim

RNG = np.random.default_rng(5)


def _op_names(f) -> list[str]:
    return [type(n.op).__name__ for n in f.maker.fgraph.toposort()]


def _scalar_names(f) -> list[str]:
    return [str(getattr(n.op, "scalar_op", "")) for n in f.maker.fgraph.toposort()]


def _loss(m, y, rows=None):
    lp = T.nnet.logsoftmax(m)
    rows = y.shape[0] if rows is None else rows
    return -T.mean(lp[T.arange(rows), y])


def _numpy_grad(a: np.ndarray, labels: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    p[np.arange(len(labels)), labels] -= 1
    return p / len(labels)


def test_an_arange_to_a_length_is_that_length_long():
    y = T.lvector("y")
    n = y.shape[0]
    assert arange_length(T.constant(0), n, T.constant(1)) is n
    # one length broadcast with a second read of it needs no run-time choice
    (d,) = numpy_broadcast([(n,), (y.shape[0],)])
    assert same_dim(d, n)
    x = T.lvector("x")
    (d,) = numpy_broadcast([(n,), (x.shape[0],)])
    assert not same_dim(d, n) and str(d.owner.op.scalar_op) == "switch"


def test_the_pick_has_the_labels_shape():
    m, y = T.matrix("m"), T.lvector("y")
    pick = T.nnet.logsoftmax(m)[T.arange(y.shape[0]), y]
    fg = FunctionGraph([m, y], [pick], clone=False)
    (d,) = inferred_shape(fg, pick)
    assert str(d.owner.op.scalar_op) == "switch"      # as infer_shape builds it ...
    from symgpu.tensor.rewriting.shape_ops import _input_of_its_shape
    assert _input_of_its_shape(fg, pick) is y          # ... which resolves to y's length


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_gradient_computes_no_pick_and_no_length_test(dtype):
    with config.change_flags(floatX=dtype):
        m, y = T.matrix("m"), T.lvector("y")
        f = function([m, y], T.grad(_loss(m, y), m))
    names = _op_names(f)
    assert "AdvancedSubtensor" not in names, names
    scalars = _scalar_names(f)
    assert not any(s in ("switch", "maximum") for s in scalars), scalars
    a = RNG.standard_normal((9, 5)).astype(dtype)
    labels = RNG.integers(0, 5, 9)
    tol = 1e-12 if dtype == "float64" else 1e-6
    np.testing.assert_allclose(f(a, labels), _numpy_grad(a, labels), rtol=tol, atol=tol)


@pytest.mark.parametrize("spelling", ["-mean(pick)", "mean(-pick)", "(-pick).mean()",
                                      "-pick.sum() / n"])
def test_other_spellings_compute_no_pick_either(spelling):
    """The fill's shape is found through elementwise ops of the pick's shape (a negation
    applied before the mean) and whatever divides the sum."""
    m, y = T.matrix("m"), T.lvector("y")
    pick = T.nnet.logsoftmax(m)[T.arange(y.shape[0]), y]
    loss = {"-mean(pick)": lambda: -T.mean(pick), "mean(-pick)": lambda: T.mean(-pick),
            "(-pick).mean()": lambda: (-pick).mean(),
            "-pick.sum() / n": lambda: -pick.sum() / y.shape[0]}[spelling]()
    f = function([m, y], T.grad(loss, m))
    assert "AdvancedSubtensor" not in _op_names(f), _op_names(f)
    a, labels = RNG.standard_normal((7, 4)), RNG.integers(0, 4, 7)
    np.testing.assert_allclose(f(a, labels), _numpy_grad(a, labels), rtol=1e-12, atol=1e-12)


def test_the_loss_and_its_gradient_together_still_pick():
    m, y = T.matrix("m"), T.lvector("y")
    loss = _loss(m, y)
    f = function([m, y], [loss, T.grad(loss, m)])
    assert "AdvancedSubtensor" in _op_names(f)
    a, labels = RNG.standard_normal((6, 4)), RNG.integers(0, 4, 6)
    got_loss, got_grad = f(a, labels)
    lp = a - a.max(axis=1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(got_loss, -lp[np.arange(6), labels].mean(), rtol=1e-12)
    np.testing.assert_allclose(got_grad, _numpy_grad(a, labels), rtol=1e-12, atol=1e-12)


def test_rows_counted_from_another_array_keep_their_length_test():
    """lp[arange(m.shape[0]), y]: the two lengths are not provably one, so the broadcast's
    check stays and a mismatch still raises."""
    m, y = T.matrix("m"), T.lvector("y")
    f = function([m, y], T.grad(_loss(m, y, rows=m.shape[0]), m))
    a = RNG.standard_normal((6, 4))
    np.testing.assert_allclose(f(a, RNG.integers(0, 4, 6) * 0), _numpy_grad(a, np.zeros(6, int)),
                               rtol=1e-12, atol=1e-12)
    with pytest.raises(Exception):
        f(a, np.zeros(4, "int64"))


def test_switch_between_one_value_is_that_value():
    c, a = T.bscalar("c"), T.vector("a")
    f = function([c, a], T.switch(c, a, a))
    assert "switch" not in _scalar_names(f)
    np.testing.assert_array_equal(f(0, np.arange(3.0)), np.arange(3.0))


def test_on_a_virtual_gpu_the_gradient_is_the_nll_kernel_and_no_pick(vgpu):
    """The mixed-precision classifier of benchmarks/half.py: GpuNLLGrad computes ``-1/n`` from
    the labels' count (gpu_nll_grad_count); no GpuTakeRows, no fill of the labels' shape, no
    length test, no one-element kernel."""
    from symgpu.gpu.ops.nll_grad import GpuNLLGrad
    with config.change_flags(mixed_precision="bfloat16"):
        x, w, y = T.matrix("x"), symgpu.shared(np.zeros((8, 5), "float32")), T.lvector("y")
        loss = _loss(T.dot(x, w), y)
        f = function([x, y], [], updates=[(w, w - 0.1 * T.grad(loss, w))])
    nodes = f.maker.fgraph.toposort()
    (nll,) = [n for n in nodes if isinstance(n.op, GpuNLLGrad)]
    assert nll.op.count_op is not None and nll.inputs[0].ndim == 0, nll.op
    assert "reciprocal" in str(nll.op.count_op)
    assert not any(type(n.op).__name__ == "GpuElemwise" and all(n.outputs[0].broadcastable)
                   for n in nodes)
    names = [type(n.op).__name__ for n in nodes]
    assert "GpuTakeRows" not in names and "GpuARange" not in names, names
    # (as table rows or inside a fused Composite)
    assert not any(word in s for s in _scalar_names(f) for word in ("switch", "maximum",
                                                                     "second"))
