"""symgpu.tensor.sort: the re-exported sort/argsort and Theano's topk family (values against
np.partition / np.argsort, negative kth, axes, sorted and unsorted results, gradients with
verify_grad, infer_shape, clear errors)."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

import symgpu.tensor as T
from symgpu import function
from symgpu.gradient import verify_grad
from symgpu.tensor import extra_ops
from symgpu.tensor.rewriting.shape_feature import node_shapes
from symgpu.tensor.sort import (ArgSort, Sort, TopKOp, argsort, argtopk, sort, topk,
                                topk_and_argtopk)

RNG = np.random.RandomState(3)


def distinct(*shape):
    """Values without ties (the selection is then unique)."""
    return RNG.permutation(np.prod(shape)).reshape(shape).astype("float64") / 7.0


def ref_topk(a, k, axis, ordered=True):
    """The k largest (k < 0: |k| smallest) along axis, largest (smallest) first."""
    if axis is None:
        a, axis = a.ravel(), 0
    idx = np.argsort(a, axis=axis, kind="stable")
    n = a.shape[axis]
    idx = np.flip(np.take(idx, np.arange(n - k, n), axis=axis), axis=axis) if k > 0 else \
        np.take(idx, np.arange(-k), axis=axis)
    return np.take_along_axis(a, idx, axis=axis), idx


def test_sort_names_are_extra_ops():
    assert Sort is extra_ops.Sort and ArgSort is extra_ops.ArgSort
    assert sort is extra_ops.sort and argsort is extra_ops.argsort
    x = T.dmatrix()
    v = distinct(3, 4)
    np.testing.assert_array_equal(function([x], sort(x, axis=0))(v), np.sort(v, axis=0))
    np.testing.assert_array_equal(function([x], argsort(x))(v), np.argsort(v))


def test_importing_the_module_keeps_T_sort_the_function():
    mod = importlib.import_module("symgpu.tensor.sort")  # the package imported it already
    assert callable(T.sort) and T.sort is mod.sort and T.topk is mod.topk
    x = T.dvector()
    v = distinct(5)
    np.testing.assert_array_equal(function([x], T.sort(x))(v), np.sort(v))


@pytest.mark.parametrize("shape, axis", [((7,), -1), ((4, 6), -1), ((4, 6), 0), ((3, 4, 5), 1),
                                         ((3, 4, 5), -3), ((3, 4), None)])
@pytest.mark.parametrize("k", [1, 2, 4, -1, -3])
def test_topk_and_argtopk_match_numpy(shape, axis, k):
    x = T.tensor(dtype="float64", shape=(False,) * len(shape))
    v = distinct(*shape)
    vals, idx = topk_and_argtopk(x, k, axis=axis)
    f = function([x], [vals, idx, topk(x, k, axis), argtopk(x, k, axis)])
    n = v.size if axis is None else shape[axis]
    if abs(k) > n:
        with pytest.raises(ValueError, match="larger than the length"):
            f(v)
        return
    got_v, got_i, only_v, only_i = f(v)
    want_v, want_i = ref_topk(v, k, axis)
    np.testing.assert_array_equal(got_v, want_v)
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_array_equal(only_v, want_v)
    np.testing.assert_array_equal(only_i, want_i)
    assert got_i.dtype == np.int64


@pytest.mark.parametrize("k", [3, -3, 6, -6])
def test_unsorted_selects_the_same_set(k):
    x = T.dmatrix()
    v = distinct(4, 6)
    got_v, got_i = function([x], list(topk_and_argtopk(x, k, sorted=False)))(v)
    part = np.partition(v, -k if k > 0 else -k - 1, axis=1)
    want = part[:, -k:] if k > 0 else part[:, :-k]
    np.testing.assert_array_equal(np.sort(got_v, axis=1), np.sort(want, axis=1))
    np.testing.assert_array_equal(np.take_along_axis(v, got_i, axis=1), got_v)


def test_symbolic_kth_and_idx_dtype():
    x, k = T.dmatrix(), T.iscalar()
    v = distinct(3, 8)
    f = function([x, k], argtopk(x, k, idx_dtype="int32"))
    for kv in (1, 5, -2, 8, -8):
        got = f(v, kv)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, ref_topk(v, kv, -1)[1])


def test_integer_values():
    x = T.lmatrix()
    v = RNG.permutation(12).reshape(3, 4)
    got = function([x], topk(x, 2))(v)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, ref_topk(v, 2, -1)[0])


@pytest.mark.parametrize("k, axis, ordered", [(3, -1, True), (-2, 0, True), (2, 1, False),
                                              (5, None, True), (4, -1, True)])
def test_topk_gradient(k, axis, ordered):
    v = distinct(3, 4)
    verify_grad(lambda a: topk(a, k, axis=axis, sorted=ordered), [v],
                rng=np.random.default_rng(0))
    verify_grad(lambda a: topk_and_argtopk(a, k, axis=axis, sorted=ordered)[0], [v],
                rng=np.random.default_rng(0))


def test_gradient_scatters_into_the_selected_positions():
    x, g = T.dmatrix(), T.dmatrix()
    v, gv = distinct(2, 5), RNG.rand(2, 2)
    dx = function([x, g], T.grad((topk(x, -2) * g).sum(), x))(v, gv)
    want = np.zeros_like(v)
    np.put_along_axis(want, ref_topk(v, -2, -1)[1], gv, axis=1)
    np.testing.assert_array_equal(dx, want)
    # the indices carry no gradient
    z = function([x], T.grad(T.cast(argtopk(x, 2), "float64").sum() + x.sum(), x))(v)
    np.testing.assert_array_equal(z, np.ones_like(v))


@pytest.mark.parametrize("build, shape", [
    (lambda x: topk_and_argtopk(x, -2, axis=0)[0], (5, 3)),
    (lambda x: argtopk(x, 3), (2, 4)),
    (lambda x: topk(x, 2, axis=1), (2, 5, 3)),
])
def test_infer_shape(build, shape):
    x = T.tensor(dtype="float64", shape=(False,) * len(shape))
    out = build(x)
    dims = node_shapes(out.owner)
    f = function([x], list(out.owner.outputs) + [T.cast(d, "int64") for s in dims for d in s])
    got = f(distinct(*shape))
    outs = got[:len(dims)]
    flat = [int(d) for d in got[len(dims):]]
    assert flat == [d for o in outs for d in o.shape]


def test_errors():
    x = T.dmatrix()
    f = function([x, k := T.lscalar()], topk(x, k))
    with pytest.raises(ValueError, match=r"\|kth\| = 5 .* length 4 .*\(3, 4\)"):
        f(distinct(3, 4), 5)
    with pytest.raises(ValueError, match=r"\|kth\| = 5"):
        f(distinct(3, 4), -5)
    with pytest.raises(ValueError, match="must not be 0"):
        f(distinct(3, 4), 0)
    with pytest.raises(IndexError, match="axis 2 is out of range"):
        topk(x, 1, axis=2)
    with pytest.raises(TypeError, match="kth must be an integer scalar"):
        topk(x, T.dscalar())
    with pytest.raises(TypeError, match="kth must be an integer scalar"):
        topk(x, T.lvector())
    with pytest.raises(ValueError, match="scalar"):
        topk(T.dscalar(), 1)
    with pytest.raises(TypeError, match="idx_dtype"):
        argtopk(x, 1, idx_dtype="float32")
    with pytest.raises(ValueError, match="nothing to return"):
        TopKOp(return_values=False, return_indices=False)


def test_a_gpu_graph_runs_topk_and_its_gradient_on_the_gpu():
    from symgpu import config
    from symgpu.gpu.placement.rewriting import virtual_context
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.fmatrix("x")
        y = topk(x * 2, 2) + 1
        f = function([x], [y, T.grad(y.sum(), x)])
        names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
        assert {"GpuTopK", "GpuScatterAlongAxis"} <= names, names
        assert not {"TopKOp", "ScatterAlongAxis"} & names, names


def test_functions_and_graphs_pickle():
    import pickle
    x = T.dmatrix("x")
    vals, idx = topk_and_argtopk(x, -2, axis=0)
    outs = [vals, idx, topk(x, 3), T.grad((topk(x, 2) ** 2).sum(), x)]
    v = distinct(4, 5)
    f = function([x], outs)
    for got, want in zip(pickle.loads(pickle.dumps(f))(v), f(v)):
        np.testing.assert_array_equal(got, want)
    x2, outs2 = pickle.loads(pickle.dumps((x, outs)))
    for got, want in zip(function([x2], outs2)(v), f(v)):
        np.testing.assert_array_equal(got, want)
