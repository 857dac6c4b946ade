"""BLAS: dot -> Gemv/Dot22/Gemm, folded scalings and updates; the ops on every layout."""
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.tensor.blas import Dot22, Gemm, Gemv, gemm_value, gemv_value, _blas
from test_rewriting_helpers import op_names, raise_on_rewrite_errors, rewritten, same_values  # noqa: F401

rng = np.random.RandomState(7)


def blas_nodes(f):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, (Gemv, Gemm, Dot22))]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dot_matrix_vector_is_gemv(dtype):
    m, v = T.matrix("m", dtype=dtype), T.vector("v", dtype=dtype)
    f = rewritten([m, v], T.dot(m, v))
    assert op_names(f) == ["Gemv"]
    mv, vv = rng.randn(5, 4).astype(dtype), rng.randn(4).astype(dtype)
    same_values([m, v], T.dot(m, v), mv, vv, rtol=1e-5, atol=1e-5)
    f = rewritten([m, v], T.dot(v, m.T))
    assert "Gemv" in op_names(f)
    same_values([m, v], T.dot(v, m.T), mv, vv, rtol=1e-5, atol=1e-5)


def test_dot_matrix_matrix_is_dot22_and_gemm():
    a, b, c = T.dmatrix("a"), T.dmatrix("b"), T.dmatrix("c")
    assert op_names(rewritten([a, b], T.dot(a, b))) == ["Dot22"]
    out = c * 2 + 0.5 * T.dot(a, b)
    f = rewritten([a, b, c], out)
    assert op_names(f) == ["Gemm"]
    (node,) = blas_nodes(f)
    assert float(node.inputs[1].data) == 0.5 and float(node.inputs[4].data) == 2.0
    av, bv, cv = rng.randn(3, 4), rng.randn(4, 5), rng.randn(3, 5)
    same_values([a, b, c], out, av, bv, cv)
    same_values([a, b, c], out, np.asfortranarray(av), bv.T.copy().T, cv)


def test_bias_is_folded_into_gemv():
    x, w, b = T.dmatrix("x"), T.dvector("w"), T.dscalar("b")
    out = T.dot(x, w) + b
    f = rewritten([x, w, b], out)
    assert op_names(f) == ["DimShuffle", "Gemv"]
    same_values([x, w, b], out, rng.randn(6, 3), rng.randn(3), 0.25)


def test_update_with_weight_decay_is_one_gemv():
    x, g = T.dmatrix("x"), T.dvector("g")
    w = symgpu.shared(rng.randn(3), name="w")
    gw = T.dot(x.T, g) + 0.02 * w
    new_w = w - 0.01 * gw
    f = rewritten([x, g], new_w)
    (node,) = blas_nodes(f)
    assert op_names(f) == ["DimShuffle", "Gemv"]
    assert node.inputs[0] in f.maker.fgraph.inputs  # y is w itself
    assert np.isclose(float(node.inputs[1].data), -0.01)
    assert np.isclose(float(node.inputs[4].data), 1 - 0.01 * 0.02)
    same_values([x, g], new_w, rng.randn(5, 3), rng.randn(5))


def test_symbolic_scalings_fold_into_alpha():
    x, v, lr = T.dmatrix("x"), T.dvector("v"), T.dscalar("lr")
    out = -(lr * T.dot(x, v))
    f = rewritten([x, v, lr], out)
    assert "Gemv" in op_names(f) and op_names(f).count("mul") <= 1
    same_values([x, v, lr], out, rng.randn(4, 3), rng.randn(3), 0.3)


def test_no_blas_for_integers_or_mixed_dtypes():
    a, b = T.lmatrix("a"), T.lvector("b")
    assert op_names(rewritten([a, b], T.dot(a, b))) == ["Dot"]
    c, d = T.fmatrix("c"), T.dvector("d")
    assert "Gemv" not in op_names(rewritten([c, d], T.dot(c, d)))


@pytest.mark.parametrize("layout", ["C", "F", "strided"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gemv_and_gemm_values_on_every_layout(layout, dtype):
    def arrange(m):
        if layout == "F":
            return np.asfortranarray(m)
        if layout == "strided":
            big = np.zeros((m.shape[0] * 2, m.shape[1] * 2), dtype=m.dtype)
            big[::2, ::2] = m
            return big[::2, ::2]
        return m
    a = rng.randn(5, 4).astype(dtype)
    x = rng.randn(4).astype(dtype)
    y = rng.randn(5).astype(dtype)
    tol = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gemv_value(_blas("gemv", dtype), y, 0.5, arrange(a), x, 2.0, False, dtype),
                               2 * y + 0.5 * a @ x, **tol)
    np.testing.assert_allclose(gemv_value(_blas("gemv", dtype), y[:1], 1.0, arrange(a), x, 1.0, False, dtype),
                               y[0] + a @ x, **tol)
    r = gemv_value(_blas("gemv", dtype), y[:1], 0.5, arrange(a), x, -3.0, False, dtype)
    assert r.dtype == dtype
    np.testing.assert_allclose(r, -3 * y[0] + 0.5 * a @ x, **tol)
    yc = y.copy()
    r = gemv_value(_blas("gemv", dtype), yc, 0.5, arrange(a), x, 2.0, True, dtype)
    assert r is yc or np.shares_memory(r, yc)   # in place: the result is y's own buffer
    np.testing.assert_allclose(r, 2 * y + 0.5 * a @ x, **tol)
    b = rng.randn(4, 3).astype(dtype)
    c = rng.randn(5, 3).astype(dtype)
    np.testing.assert_allclose(gemm_value(_blas("gemm", dtype), c, 0.5, arrange(a), arrange(b), 2.0, False, dtype),
                               2 * c + 0.5 * a @ b, **tol)
    r = gemm_value(_blas("gemm", dtype), None, 1.0, arrange(a), arrange(b), 0.0, False, dtype)
    assert r.flags.c_contiguous
    np.testing.assert_allclose(r, a @ b, **tol)


def test_empty_and_misaligned_shapes():
    dtype = "float64"
    fn = _blas("gemv", dtype)
    np.testing.assert_array_equal(gemv_value(fn, np.ones(3), 1.0, np.ones((3, 0)), np.ones(0), 2.0, False, dtype),
                                  [2.0, 2.0, 2.0])
    with pytest.raises(ValueError, match=r"\(3, 4\) and \(5,\)"):
        gemv_value(fn, np.ones(3), 1.0, np.ones((3, 4)), np.ones(5), 0.0, False, dtype)
    gfn = _blas("gemm", dtype)
    np.testing.assert_array_equal(gemm_value(gfn, None, 1.0, np.ones((2, 0)), np.ones((0, 3)), 0.0, False, dtype),
                                  np.zeros((2, 3)))


def test_inplace_gemv_on_an_intermediate_only():
    x, v, u = T.dmatrix("x"), T.dvector("v"), T.dvector("u")
    out = T.exp(u) + T.dot(x, v)  # y = exp(u) is an intermediate: may be overwritten
    f = function([x, v, u], out, mode=symgpu.compile.mode.Mode("FAST_RUN").excluding_tags("fusion"))
    (node,) = blas_nodes(f)
    assert node.op.inplace
    xv, vv, uv = rng.randn(4, 3), rng.randn(3), rng.randn(4)
    np.testing.assert_allclose(f(xv, vv, uv), np.exp(uv) + xv @ vv)
    w = symgpu.shared(np.ones(3), name="w")
    g = function([x, v], w + T.dot(x.T, v), updates={w: w + T.dot(x.T, v)})
    assert not any(n.op.destroy_map for n in g.maker.fgraph.toposort())
