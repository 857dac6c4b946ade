"""symgpu.tensor.extra_ops and extra_funcs: values against NumPy, gradients with verify_grad,
infer_shape against the computed shapes, clear errors, and graphs that still compile for a
(virtual) GPU."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from symgpu import config, function
from symgpu.gradient import verify_grad
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.tensor.extra_ops import (AllocDiag, ArgSort, CumOp, Eye, ExtractDiag, Nonzero,
                                     Repeat, Sort)

RNG = np.random.RandomState(42)


def run(inputs, outputs, *values):
    return function(inputs, outputs, on_unused_input="ignore")(*values)


def check_infer_shape(inputs, out, *values):
    """The op's infer_shape, compiled, gives the shape its perform computes."""
    node = out.owner
    shapes = [tuple(T.shape_i(i, d) for d in range(i.ndim)) for i in node.inputs]
    inferred = node.op.infer_shape(None, node, shapes)
    assert len(inferred) == len(node.outputs)
    dims = [T.cast(d, "int64") for d in inferred[0]]
    for d in inferred[0]:
        assert d.dtype == "int64" and d.ndim == 0, (node.op, d.type)
    got = run(inputs, [out] + dims, *values)
    assert tuple(int(d) for d in got[1:]) == got[0].shape, node.op


# ============================================================================ cumsum / cumprod

@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_cumsum_and_cumprod_match_numpy(axis):
    x = T.dmatrix("x")
    X = RNG.rand(3, 4) + 0.5
    got = run([x], [T.cumsum(x, axis), T.cumprod(x, axis), x.cumsum(axis)], X)
    np.testing.assert_allclose(got[0], np.cumsum(X, axis))
    np.testing.assert_allclose(got[1], np.cumprod(X, axis))
    np.testing.assert_allclose(got[2], np.cumsum(X, axis))


def test_cumsum_dtypes_follow_numpy():
    for dtype in ("int8", "bool", "int32", "float32", "uint8"):
        x = T.TensorType(dtype, (False,))("x")
        X = np.array([1, 0, 1, 1], dtype)
        for fn, ref in ((T.cumsum, np.cumsum), (T.cumprod, np.cumprod)):
            out = fn(x)
            assert out.dtype == ref(X).dtype.name, (dtype, fn)
            np.testing.assert_array_equal(run([x], out, X), ref(X))


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_cumsum_and_cumprod_gradients(axis):
    X = RNG.rand(3, 4) + 0.5  # no zeros: cumprod's gradient divides by x
    verify_grad(lambda x: T.cumsum(x, axis), [X])
    verify_grad(lambda x: T.cumprod(x, axis), [X])


def test_cum_infer_shape_and_errors():
    x = T.dtensor3("x")
    X = RNG.rand(2, 3, 4)
    check_infer_shape([x], CumOp(1, "add")(x), X)
    with pytest.raises(ValueError, match="axis 3 is out of range"):
        T.cumsum(x, 3)
    with pytest.raises(ValueError, match="scalar"):
        T.cumsum(T.dscalar("s"), 0)


# ============================================================================ sort / argsort

@pytest.mark.parametrize("axis", [-1, 0, None])
def test_sort_and_argsort_match_numpy(axis):
    x = T.dmatrix("x")
    X = RNG.randn(4, 5)
    got = run([x], [T.sort(x, axis), T.argsort(x, axis), x.sort(axis), x.argsort(axis)], X)
    np.testing.assert_array_equal(got[0], np.sort(X, axis))
    np.testing.assert_array_equal(got[1], np.argsort(X, axis))
    assert got[1].dtype == np.int64
    np.testing.assert_array_equal(got[2], got[0])
    np.testing.assert_array_equal(got[3], got[1])


def test_sort_kinds_and_errors():
    x = T.ivector("x")
    X = np.array([3, 1, 2, 1], "int32")
    np.testing.assert_array_equal(run([x], T.argsort(x, kind="stable"), X),
                                  np.argsort(X, kind="stable"))
    with pytest.raises(ValueError, match="kind"):
        T.sort(x, kind="bogo")
    with pytest.raises(ValueError, match="order"):
        T.sort(x, order="a")
    with pytest.raises(ValueError, match="out of range"):
        T.sort(x, axis=1)


@pytest.mark.parametrize("axis", [-1, 0, None])
def test_sort_gradient(axis):
    verify_grad(lambda x: T.sort(x, axis), [RNG.randn(3, 4)])


def test_sort_infer_shape_and_no_gradient_through_argsort():
    x = T.dmatrix("x")
    X = RNG.randn(3, 5)
    check_infer_shape([x], Sort(0)(x), X)
    check_infer_shape([x], ArgSort(1)(x), X)
    g = T.grad(T.sum(T.sort(x) * T.argsort(x)), x)  # argsort passes no gradient
    np.testing.assert_allclose(run([x], g, X),
                               np.take_along_axis(np.argsort(X, -1),
                                                  np.argsort(np.argsort(X, -1), -1), -1))


# ============================================================================ repeat

@pytest.mark.parametrize("repeats,axis", [(2, None), (3, 0), (2, 1), ([1, 0, 2], 0),
                                          ([2, 1, 0, 3], 1), (0, 1)])
def test_repeat_matches_numpy(repeats, axis):
    x = T.dmatrix("x")
    X = RNG.randn(3, 4)
    np.testing.assert_array_equal(run([x], T.repeat(x, repeats, axis), X),
                                  np.repeat(X, repeats, axis))
    np.testing.assert_array_equal(run([x], x.repeat(repeats, axis), X),
                                  np.repeat(X, repeats, axis))


def test_repeat_with_symbolic_counts():
    x, r, rs = T.dvector("x"), T.lscalar("r"), T.ivector("rs")
    X = np.array([1.0, 2.0, 3.0])
    f = function([x, r, rs], [T.repeat(x, r), T.repeat(x, rs, 0)])
    a, b = f(X, 2, np.array([0, 2, 1], "int32"))
    np.testing.assert_array_equal(a, np.repeat(X, 2))
    np.testing.assert_array_equal(b, np.repeat(X, [0, 2, 1]))
    with pytest.raises(ValueError, match=r"repeat: cannot repeat an array of shape \(3,\)"):
        f(X, 1, np.array([1, 2], "int32"))


@pytest.mark.parametrize("repeats,axis", [(3, 0), (2, 1), ([1, 0, 2], 0), ([2, 1, 0, 3], 1),
                                          (2, None)])
def test_repeat_gradient(repeats, axis):
    verify_grad(lambda x: T.repeat(x, repeats, axis), [RNG.randn(3, 4)])


def test_repeat_infer_shape_and_errors():
    x, r, rs = T.dmatrix("x"), T.lscalar("r"), T.lvector("rs")
    X = RNG.randn(3, 4)
    check_infer_shape([x, r], Repeat(1)(x, r), X, 3)
    check_infer_shape([x, rs], Repeat(0)(x, rs), X, np.array([2, 0, 5]))
    with pytest.raises(TypeError, match="repeats must be integers"):
        T.repeat(x, T.dscalar("f"))
    with pytest.raises(ValueError, match="scalar or a vector"):
        T.repeat(x, T.lmatrix("m"), 0)


# ============================================================================ eye / diag

def test_eye_and_identity_like():
    n, m, k = T.lscalars("n", "m", "k")
    f = function([n, m, k], [T.eye(n, m, k), T.eye(n), T.eye(n, m, k, dtype="int32")])
    a, b, c = f(3, 5, -1)
    np.testing.assert_array_equal(a, np.eye(3, 5, -1))
    assert a.dtype == config.floatX and c.dtype == np.int32
    np.testing.assert_array_equal(b, np.eye(3))
    x = T.fmatrix("x")
    out = run([x], T.identity_like(x), np.zeros((2, 4), "float32"))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.eye(2, 4))
    check_infer_shape([n, m, k], Eye("float64")(n, m, k), 2, 6, 1)
    with pytest.raises(ValueError, match="not a matrix"):
        T.identity_like(T.dvector())
    with pytest.raises(ValueError, match="negative"):
        f(-1, 2, 0)


@pytest.mark.parametrize("k", [0, 1, -2])
def test_diag_both_ways(k):
    v, x = T.dvector("v"), T.dmatrix("x")
    V, X = RNG.randn(3), RNG.randn(4, 5)
    got = run([v, x], [T.diag(v, k), T.diag(x, k), T.diagonal(x, k), x.diagonal(k),
                       x.trace(k), T.trace(x, k)], V, X)
    for g, e in zip(got, [np.diag(V, k), np.diag(X, k), np.diagonal(X, k), np.diagonal(X, k),
                          np.trace(X, k), np.trace(X, k)]):
        np.testing.assert_allclose(g, e)
    verify_grad(lambda v: T.diag(v, k), [V])
    verify_grad(lambda x: T.diag(x, k), [X])
    check_infer_shape([v], AllocDiag(k)(v), V)
    check_infer_shape([x], ExtractDiag(k)(x), X)


def test_diagonal_of_other_axes():
    x = T.dtensor3("x")
    X = RNG.randn(2, 3, 4)
    for offset, a1, a2 in [(0, 1, 2), (1, 2, 0), (-1, 0, 2), (5, 1, 2)]:
        np.testing.assert_allclose(run([x], T.diagonal(x, offset, a1, a2), X),
                                   np.diagonal(X, offset, a1, a2))
        check_infer_shape([x], ExtractDiag(offset, a1, a2)(x), X)
    verify_grad(lambda x: T.diagonal(x, 1, 2, 0), [X])
    with pytest.raises(ValueError, match="vector or a matrix"):
        T.diag(x)
    with pytest.raises(ValueError, match="both 1"):
        T.diagonal(x, 0, 1, 1)


# ============================================================================ nonzero

def test_nonzero_family():
    x = T.dmatrix("x")
    X = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]])
    rows, cols = T.nonzero(x)
    got = run([x], [rows, cols, T.nonzero(x, return_matrix=True), T.flatnonzero(x),
                    T.nonzero_values(x), x.nonzero_values()], X)
    np.testing.assert_array_equal(got[0], np.nonzero(X)[0])
    np.testing.assert_array_equal(got[1], np.nonzero(X)[1])
    np.testing.assert_array_equal(got[2], np.array(np.nonzero(X)))
    np.testing.assert_array_equal(got[3], np.flatnonzero(X))
    np.testing.assert_array_equal(got[4], X[np.nonzero(X)])
    np.testing.assert_array_equal(got[5], X[np.nonzero(X)])
    empty = run([x], T.nonzero(x, return_matrix=True), np.zeros((2, 3)))
    assert empty.shape == (2, 0) and empty.dtype == np.int64
    check_infer_shape([x], Nonzero()(x), X)
    with pytest.raises(ValueError, match="scalar"):
        T.nonzero(T.dscalar())


# ============================================================================ extra_funcs

def test_round_modes_and_iround():
    x = T.dvector("x")
    X = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999999999999994, 2.4, -0.0])
    even, away, default, ie, ia, meth = run(
        [x], [T.round(x, "half_to_even"), T.round(x, "half_away_from_zero"), T.round(x),
              T.iround(x), T.iround(x, "half_away_from_zero"), x.round("half_away_from_zero")],
        X)
    np.testing.assert_array_equal(even, np.round(X))
    np.testing.assert_array_equal(default, np.round(X))
    np.testing.assert_array_equal(away, [1, 2, 3, -1, -2, -3, 0, 2, 0])
    assert np.signbit(away[-1])  # C's round keeps the sign of zero
    assert ie.dtype == np.int64 and ia.dtype == np.int64
    np.testing.assert_array_equal(ia, [1, 2, 3, -1, -2, -3, 0, 2, 0])
    np.testing.assert_array_equal(meth, away)
    with pytest.raises(ValueError, match="half_away_from_zero"):
        T.round(x, "up")
    # integer inputs keep their dtype and values
    i = T.bvector("i")
    assert run([i], T.round(i, "half_away_from_zero"), np.array([-3, 4], "int8")).dtype == np.int8


def test_round_half_away_from_zero_fuses_and_runs_on_the_gpu_graph():
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.fvector("x")
        f = function([x], T.round(x * 2, "half_away_from_zero") + 1)
        names = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
        assert names.count("GpuElemwise") == 1, names
        assert "Elemwise" not in names


@pytest.mark.parametrize("reps", [(2,), (2, 3), (1, 2, 2), 3, (1, 1)])
def test_tile_matches_numpy(reps):
    x = T.dmatrix("x")
    X = RNG.randn(2, 3)
    np.testing.assert_array_equal(run([x], T.tile(x, reps), X), np.tile(X, reps))
    verify_grad(lambda x: T.tile(x, reps), [X])


def test_tile_with_symbolic_reps():
    v, r, rv = T.dvector("v"), T.lscalar("r"), T.lvector("rv")
    V = np.array([1.0, 2.0])
    f = function([v, r, rv], [T.tile(v, (r, 2)), T.tile(v, rv, ndim=2), T.tile(v, r)])
    a, b, c = f(V, 3, np.array([2, 2]))
    np.testing.assert_array_equal(a, np.tile(V, (3, 2)))
    np.testing.assert_array_equal(b, np.tile(V, (2, 2)))
    np.testing.assert_array_equal(c, np.tile(V, 3))
    with pytest.raises(ValueError, match="pass ndim"):
        T.tile(v, rv)
    with pytest.raises(ValueError, match="ndim=1 is less"):
        T.tile(T.dmatrix(), (2, 2), ndim=1)


@pytest.mark.parametrize("shift,axis", [(1, None), (-7, None), (2, 0), (-1, 1), (9, 1),
                                        (0, 1), ((1, -2), (0, 1))])
def test_roll_matches_numpy(shift, axis):
    x = T.dmatrix("x")
    X = RNG.randn(3, 4)
    np.testing.assert_array_equal(run([x], T.roll(x, shift, axis), X), np.roll(X, shift, axis))
    verify_grad(lambda x: T.roll(x, shift, axis), [X])


def test_roll_with_a_symbolic_shift():
    x, s = T.dvector("x"), T.lscalar("s")
    f = function([x, s], T.roll(x, s))
    X = np.arange(5.0)
    for shift in (-11, -1, 0, 3, 5, 12):
        np.testing.assert_array_equal(f(X, shift), np.roll(X, shift))
    np.testing.assert_array_equal(f(np.zeros(0), 3), np.zeros(0))


def test_max_and_argmax():
    x = T.dmatrix("x")
    X = RNG.randn(3, 4)
    mx, am = T.max_and_argmax(x, axis=1)
    got = run([x], [mx, am], X)
    np.testing.assert_array_equal(got[0], X.max(1))
    np.testing.assert_array_equal(got[1], X.argmax(1))
    mx, am = T.max_and_argmax(x)
    assert run([x], am, X) == X.argmax()


@pytest.mark.parametrize("L", [1, 2, 3, 0.5, np.inf, -np.inf, 0])
def test_norm_matches_numpy(L):
    x = T.dmatrix("x")
    X = RNG.randn(3, 4)
    X[0, 0] = 0.0
    np.testing.assert_allclose(run([x], x.norm(L), X), np.linalg.norm(X.ravel(), L))
    np.testing.assert_allclose(run([x], T.norm(x, L, axis=0), X), np.linalg.norm(X, L, axis=0))
    assert run([x], x.norm(L, axis=1, keepdims=True), X).shape == (3, 1)


def test_norm_gradient():
    X = RNG.rand(3, 4) + 0.5
    verify_grad(lambda x: x.norm(2), [X])
    verify_grad(lambda x: x.norm(3, axis=1), [X])


def test_swapaxes():
    x = T.dtensor3("x")
    X = RNG.randn(2, 3, 4)
    np.testing.assert_array_equal(run([x], x.swapaxes(0, 2), X), np.swapaxes(X, 0, 2))
    np.testing.assert_array_equal(run([x], T.swapaxes(x, -1, 1), X), np.swapaxes(X, -1, 1))
    with pytest.raises(ValueError, match="out of range"):
        T.swapaxes(x, 0, 3)


# ============================================================================ on a GPU graph

def test_new_ops_compile_for_a_gpu_context():
    """Host-only ops keep their transfers around them; the composed functions lift; sort
    and eye run on the GPU (symgpu/gpu/ops/sort.py, constructors.py)."""
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.fmatrix("x")
        outs = [T.cumsum(x, 1) * 2, T.sort(x) + 1, T.repeat(x, 2, 0).sum(), T.diag(x),
                T.eye(x.shape[0]) * x[0, 0], T.nonzero_values(x), T.tile(x, (2, 1)),
                T.roll(x, 1, 0), x.norm(2)]
        f = function([x], outs)
        nodes = f.maker.fgraph.toposort()
        names = {type(n.op).__name__ for n in nodes}
        assert {"CumOp", "GpuSort", "Repeat", "ExtractDiag", "GpuEye", "Nonzero"} <= names
        assert "Sort" not in names and "Eye" not in names
        assert "GpuFromHost" in names and "HostFromGpu" in names
        assert names & {"GpuElemwise", "GpuElemwiseGroup"}   # (the outputs' kernels: a group)


# ============================================================================ new table rows

@pytest.mark.parametrize("name,low,high", [("arcsin", -0.9, 0.9), ("arccos", -0.9, 0.9),
                                           ("arcsinh", -3, 3), ("arccosh", 1.1, 4),
                                           ("arctanh", -0.9, 0.9), ("deg2rad", -400, 400),
                                           ("rad2deg", -7, 7)])
def test_inverse_trigonometry_and_degrees(name, low, high):
    X = RNG.uniform(low, high, (3, 4))
    x = T.dmatrix("x")
    np.testing.assert_allclose(run([x], getattr(T, name)(x), X), getattr(np, name)(X),
                               rtol=1e-13)
    verify_grad(getattr(T, name), [X])
    assert getattr(T, name)(T.ivector()).dtype == "float64"
    assert getattr(T, name)(T.bvector()).dtype == "float32"


def test_arctan2_quadrants_and_gradient():
    y, x = T.dvectors("y", "x")
    Y = np.array([1.0, 1.0, -1.0, -1.0, 0.0, 2.0])
    X = np.array([1.0, -1.0, -1.0, 1.0, -1.0, 0.0])
    np.testing.assert_allclose(run([y, x], T.arctan2(y, x), Y, X), np.arctan2(Y, X))
    verify_grad(T.arctan2, [RNG.uniform(0.5, 2, 4), RNG.uniform(-2, -0.5, 4)])


def test_new_rows_fuse_on_a_gpu_graph():
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.fvector("x")
        f = function([x], T.rad2deg(T.arcsin(x)) + T.arctan2(x, 2.0) * T.arccosh(x + 2))
        names = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
        assert names.count("GpuElemwise") == 1 and "Elemwise" not in names, names


# ============================================================================ broadcast, pad

def test_broadcast_patterns():
    x = T.dmatrix("x")
    r = T.addbroadcast(x, 0)
    assert r.broadcastable == (True, False)
    y = T.dmatrix("y")
    np.testing.assert_array_equal(run([x, y], r + y, np.ones((1, 3)), np.ones((2, 3))),
                                  np.full((2, 3), 2.0))
    with pytest.raises(ValueError, match="declared broadcastable"):
        run([x], r, np.ones((2, 3)))
    assert T.unbroadcast(T.drow(), 0).broadcastable == (False, False)
    assert T.unbroadcast(x, 1) is x
    assert T.patternbroadcast(x, (False, True)).broadcastable == (False, True)
    with pytest.raises(ValueError, match="out of range"):
        T.addbroadcast(x, 2)
    with pytest.raises(ValueError, match="2 dimensions"):
        T.patternbroadcast(x, (True,))


def test_shape_padding():
    v = T.dvector("v")
    assert T.shape_padleft(v).broadcastable == (True, False)
    assert T.shape_padright(v, 2).broadcastable == (False, True, True)
    assert T.shape_padaxis(v, 0).broadcastable == (True, False)
    assert T.shape_padaxis(v, -1).broadcastable == (False, True)
    V = np.arange(3.0)
    got = run([v], [T.shape_padleft(v, 2), T.shape_padright(v), T.shape_padaxis(v, 1)], V)
    assert [g.shape for g in got] == [(1, 1, 3), (3, 1), (3, 1)]
    with pytest.raises(ValueError, match="out of range"):
        T.shape_padaxis(v, 3)


# ============================================================================ tri, stacks, diff

@pytest.mark.parametrize("k", [0, 1, -1])
def test_tri_tril_triu(k):
    x = T.dmatrix("x")
    X = RNG.randn(3, 4)
    X[0, 3] = np.inf  # zeroed by tril, not nan
    got = run([x], [T.tri(3, 4, k), T.tril(x, k), T.triu(x, k)], X)
    np.testing.assert_array_equal(got[0], np.tri(3, 4, k))
    np.testing.assert_array_equal(got[1], np.tril(X, k))
    np.testing.assert_array_equal(got[2], np.triu(X, k))
    verify_grad(lambda x: T.tril(x, k), [RNG.randn(3, 4)])
    verify_grad(lambda x: T.triu(x, k), [RNG.randn(3, 4)])
    t = T.dtensor3("t")
    B = RNG.randn(2, 3, 3)
    np.testing.assert_array_equal(run([t], T.tril(t, k), B), np.tril(B, k))
    with pytest.raises(ValueError, match="2 dimensions"):
        T.tril(T.dvector())


def test_stacks():
    a, b, c, d = T.dscalars("a", "b", "c", "d")
    np.testing.assert_array_equal(run([a, b, c, d], T.stacklists([[a, b], [c, d]]), 1, 2, 3, 4),
                                  [[1.0, 2.0], [3.0, 4.0]])
    x, y = T.dmatrices("x", "y")
    X, Y = RNG.randn(2, 3), RNG.randn(2, 1)
    np.testing.assert_array_equal(run([x, y], T.horizontal_stack(x, y), X, Y), np.hstack([X, Y]))
    np.testing.assert_array_equal(run([x, y], T.vertical_stack(x, x), X, Y), np.vstack([X, X]))


@pytest.mark.parametrize("n,axis", [(1, -1), (2, -1), (1, 0), (0, 1)])
def test_diff(n, axis):
    x = T.dmatrix("x")
    X = RNG.randn(4, 5)
    np.testing.assert_allclose(run([x], T.diff(x, n, axis), X), np.diff(X, n, axis))
    verify_grad(lambda x: T.diff(x, n, axis), [X])


def test_ptp_and_take():
    x = T.dmatrix("x")
    i = T.lvector("i")
    X = RNG.randn(3, 4)
    I = np.array([2, 0, 2])
    got = run([x, i], [T.ptp(x), T.ptp(x, axis=1), T.take(x, i), T.take(x, i, axis=1),
                       T.take(x, i, axis=0)], X, I)
    np.testing.assert_allclose(got[0], np.ptp(X))
    np.testing.assert_allclose(got[1], np.ptp(X, axis=1))
    np.testing.assert_array_equal(got[2], np.take(X, I))
    np.testing.assert_array_equal(got[3], np.take(X, I, axis=1))
    np.testing.assert_array_equal(got[4], np.take(X, I, axis=0))


# ============================================================================ PyTensor

CALLS = [  # (name, args after the matrix, kwargs): the same call in both libraries
    ("sort", (), {}), ("sort", (0,), {}), ("argsort", (), {}), ("cumsum", (), {"axis": 1}),
    ("cumprod", (), {}), ("repeat", (2,), {"axis": 0}), ("tile", ((2, 1),), {}),
    ("roll", (1,), {"axis": 1}), ("roll", (-2,), {}), ("diag", (), {}), ("diag", (1,), {}),
    ("tril", (), {}), ("triu", (1,), {}), ("iround", (), {}), ("round", (), {}),
    ("round", ("half_away_from_zero",), {}), ("nonzero_values", (), {}),
    ("flatnonzero", (), {}), ("diff", (), {}), ("diff", (2, 0), {}), ("ptp", (), {"axis": 1}),
    ("trace", (), {}), ("swapaxes", (0, 1), {}), ("diagonal", (1,), {}),
    ("shape_padleft", (), {}), ("shape_padaxis", (1,), {}), ("arcsin", (), {}),
    ("deg2rad", (), {}), ("rad2deg", (), {}), ("identity_like", (), {}),
]


def test_same_results_as_pytensor():
    pt = pytest.importorskip("pytensor.tensor")
    import pytensor
    M = np.array([[0.5, -0.25, 0.0], [0.75, 0.5, -0.5], [2.5, 0.0, 0.125]])
    compared = 0
    for name, args, kwargs in CALLS:
        if not hasattr(pt, name):
            continue
        x, px = T.dmatrix("x"), pt.dmatrix("x")
        ours = run([x], getattr(T, name)(x, *args, **kwargs), M)
        theirs = pytensor.function([px], getattr(pt, name)(px, *args, **kwargs))(M)
        np.testing.assert_allclose(ours, theirs, err_msg=name)
        assert ours.dtype == theirs.dtype, name
        compared += 1
    for ours, theirs in [(T.max_and_argmax, getattr(pt, "max_and_argmax", None)),
                         (T.nonzero, pt.nonzero)]:
        if theirs is None:
            continue
        x, px = T.dmatrix("x"), pt.dmatrix("x")
        a = run([x], list(ours(x)), M)
        b = pytensor.function([px], list(theirs(px)))(M)
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)
        compared += 1
    n, pn = T.lscalar("n"), pt.lscalar("n")
    np.testing.assert_array_equal(run([n], T.eye(n, 4, 1), 3),
                                  pytensor.function([pn], pt.eye(pn, 4, 1))(3))
    assert compared >= 25


def test_the_new_ops_pickle():
    """The ops (and the graphs made of them) round-trip through pickle; whole functions with
    elementwise steps are test_pickle's business."""
    import pickle
    from symgpu.tensor.extra_ops import ExtractDiagGrad, PermuteAlongAxis, RepeatGrad
    x, n = T.dmatrix("x"), T.lscalar("n")
    X = np.abs(RNG.randn(3, 4)) + 0.5
    outs = [T.sort(x, 0), T.argsort(x), T.cumprod(x, 1), T.repeat(x, 2, 0), T.diag(T.diag(x)),
            T.eye(n, 4, 1), T.nonzero(x, True), PermuteAlongAxis(1)(x, T.argsort(x)),
            RepeatGrad(0)(T.repeat(x, 2, 0), 2, x), ExtractDiagGrad(1, 0, 1)(x, T.diag(x, 1))]
    ins2, outs2 = pickle.loads(pickle.dumps(([x, n], outs)))
    assert [o.owner.op for o in outs2] == [o.owner.op for o in outs]
    for a, b in zip(function(ins2, outs2)(X, 3), function([x, n], outs)(X, 3)):
        np.testing.assert_array_equal(a, b)


# ========================================================================= bincount, search, misc

def test_bincount():
    x, w = T.lvector("x"), T.dvector("w")
    X, W = np.array([0, 3, 3, 1, 7]), RNG.rand(5)
    got = run([x, w], [T.bincount(x), T.bincount(x, minlength=10), T.bincount(x, W)], X, W)
    np.testing.assert_array_equal(got[0], np.bincount(X))
    np.testing.assert_array_equal(got[1], np.bincount(X, minlength=10))
    np.testing.assert_allclose(got[2], np.bincount(X, W))
    assert got[0].dtype == np.int64
    empty = run([x], T.bincount(x, minlength=3), np.zeros(0, "int64"))
    np.testing.assert_array_equal(empty, [0, 0, 0])
    check_infer_shape([x], T.bincount(x, minlength=2), X)
    check_infer_shape([x], T.bincount(x, minlength=2), np.zeros(0, "int64"))
    verify_grad(lambda w: T.bincount(X, w), [W])
    with pytest.raises(ValueError, match="negative value -1"):
        run([x], T.bincount(x), np.array([1, -1]))
    with pytest.raises(TypeError, match="integers"):
        T.bincount(w)


@pytest.mark.parametrize("side", ["left", "right"])
def test_searchsorted(side):
    a, v = T.dvector("a"), T.dmatrix("v")
    A = np.array([1.0, 2.0, 2.0, 5.0])
    V = np.array([[0.0, 2.0], [3.0, 9.0]])
    got = run([a, v], T.searchsorted(a, v, side), A, V)
    np.testing.assert_array_equal(got, np.searchsorted(A, V, side))
    assert got.dtype == np.int64
    check_infer_shape([a, v], T.searchsorted(a, v, side), A, V)
    with pytest.raises(ValueError, match="side"):
        T.searchsorted(a, v, "middle")


def test_isclose_allclose_largest_smallest():
    x, y = T.dvectors("x", "y")
    X = np.array([1.0, np.inf, -np.inf, np.nan, 1e-9, np.inf, 100.0])
    Y = np.array([1 + 1e-7, np.inf, np.inf, np.nan, 0.0, 1.0, 100.001])
    with np.errstate(all="ignore"):
        got = run([x, y], [T.isclose(x, y), T.isclose(x, y, equal_nan=True),
                           T.isclose(x, y, rtol=1e-3), T.allclose(x[:2], y[:2]),
                           T.allclose(x, y), T.largest(x, y, 0.5), T.smallest(x, y, 0.5)], X, Y)
    np.testing.assert_array_equal(got[0], np.isclose(X, Y))
    np.testing.assert_array_equal(got[1], np.isclose(X, Y, equal_nan=True))
    np.testing.assert_array_equal(got[2], np.isclose(X, Y, rtol=1e-3))
    assert bool(got[3]) and not bool(got[4])
    np.testing.assert_array_equal(got[5], np.maximum(np.maximum(X, Y), 0.5))
    np.testing.assert_array_equal(got[6], np.minimum(np.minimum(X, Y), 0.5))


@pytest.mark.parametrize("a_shape,b_shape", [((4, 3), (4, 3)), ((4, 2, 3), (4, 3, 5)),
                                             ((4, 3), (4, 3, 5)), ((4, 2, 3), (4, 3))])
def test_batched_dot(a_shape, b_shape):
    A, B = RNG.randn(*a_shape), RNG.randn(*b_shape)
    a = T.TensorType("float64", (False,) * len(a_shape))("a")
    b = T.TensorType("float64", (False,) * len(b_shape))("b")
    np.testing.assert_allclose(run([a, b], T.batched_dot(a, b), A, B),
                               np.array([np.dot(A[i], B[i]) for i in range(4)]))
    verify_grad(T.batched_dot, [A, B])


def test_fill_diagonal_and_to_one_hot():
    m, y = T.dmatrix("m"), T.lvector("y")
    M = RNG.randn(3, 4)
    expected = M.copy()
    np.fill_diagonal(expected, 5.0)
    np.testing.assert_array_equal(run([m], T.fill_diagonal(m, 5), M), expected)
    verify_grad(lambda m: T.fill_diagonal(m, 0.0), [M])
    oh = run([y], T.to_one_hot(y, 4), np.array([0, 3, 1]))
    np.testing.assert_array_equal(oh, np.eye(4)[[0, 3, 1]])
    assert oh.dtype == config.floatX
    with pytest.raises(TypeError, match="integer vector"):
        T.to_one_hot(T.dvector(), 3)


# ============================================================================ grids, constants, copy

def test_mgrid_and_ogrid():
    a = T.mgrid[0:5, 0:3]
    np.testing.assert_array_equal(a[0].eval(), np.mgrid[0:5, 0:3][0])
    np.testing.assert_array_equal(a[1].eval(), np.mgrid[0:5, 0:3][1])
    b = T.ogrid[0:5, 0:3]
    np.testing.assert_array_equal(b[0].eval(), np.ogrid[0:5, 0:3][0])
    np.testing.assert_array_equal(b[1].eval(), np.ogrid[0:5, 0:3][1])
    assert b[0].broadcastable == (False, True)
    np.testing.assert_allclose(T.mgrid[0:1:5j][0].eval(), np.mgrid[0:1:5j])
    np.testing.assert_array_equal(T.mgrid[1:9:3, 2:0:-1][1].eval(), np.mgrid[1:9:3, 2:0:-1][1])
    n = T.lscalar("n")
    got = run([n], T.mgrid[0:n, 1:3], 2)
    np.testing.assert_array_equal(got[0], np.mgrid[0:2, 1:3][0])
    with pytest.raises(TypeError, match="stop"):
        T.mgrid[0:]
    with pytest.raises(ValueError, match="complex step"):
        T.mgrid[0:n:3j]


def test_get_scalar_constant_value():
    gscv = T.get_scalar_constant_value
    assert gscv(T.constant(3) * 2 + 1) == 7
    assert gscv(T.drow("r").shape[0]) == 1
    assert gscv(T.cast(T.constant(2.7), "int32")) == 2
    assert gscv(T.constant(np.array([[4.5]])).dimshuffle()) == 4.5
    assert gscv(5) == 5 and T.constant(2.5).get_scalar_constant_value() == 2.5
    with pytest.raises(T.NotScalarConstantError, match="input"):
        gscv(T.dscalar("s") + 1)
    with pytest.raises(T.NotScalarConstantError, match="not fix"):
        gscv(T.constant(3) + 1, elemwise=False)
    with pytest.raises(T.NotScalarConstantError, match="3 values"):
        gscv(T.constant(np.arange(3)))
    with pytest.raises(T.NotScalarConstantError):
        gscv(T.dmatrix().shape[0])


def test_copy_method():
    x = T.dvector("x")
    c = x.copy("c")
    assert c.name == "c" and c is not x and c.owner is not None
    np.testing.assert_array_equal(run([x], c, np.arange(3.0)), np.arange(3.0))
    verify_grad(lambda x: x.copy(), [RNG.randn(3)])


def test_shapes_of_the_new_ops_compute_nothing_heavy():
    """With the shape rewrites, x.shape of a sort/cumsum/repeat/diag/tile/roll result comes
    from infer_shape: the op itself is not run."""
    x, r = T.dmatrix("x"), T.lscalar("r")
    X = np.ones((3, 4))
    for expr, want in [(T.sort(x), (3, 4)), (T.cumsum(x), (12,)), (T.repeat(x, r, 1), (3, 8)),
                       (T.diag(x), (3,)), (T.tile(x, (2, 3)), (6, 12)), (T.roll(x, 1, 0), (3, 4)),
                       (T.argsort(x, 0), (3, 4)), (T.searchsorted(x[0], x), (3, 4))]:
        f = function([x, r], expr.shape, on_unused_input="ignore")
        ops = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
        assert not ops & {"Sort", "ArgSort", "CumOp", "Repeat", "ExtractDiag", "Alloc",
                          "Join", "SearchSorted"}, (expr, ops)
        assert tuple(f(X, 2)) == want
