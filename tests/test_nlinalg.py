"""symgpu.tensor.nlinalg (Theano's theano.tensor.nlinalg): values against NumPy in float64 and
float32, stacks of matrices, gradients (verify_grad), R_op, and errors."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.gradient import Rop, verify_grad
from symgpu.tensor import extra_ops, nlinalg as N

DTYPES = ["float64", "float32"]
TOL = {"float64": dict(rtol=1e-7, atol=1e-9), "float32": dict(rtol=2e-4, atol=2e-5)}


def rng():
    return np.random.default_rng(0)


def randn(*shape, dtype="float64", seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def well_conditioned(n, batch=(), dtype="float64", seed=0):
    return (randn(*batch, n, n, seed=seed) + 3 * np.eye(n)).astype(dtype)


def spd(n, batch=(), dtype="float64", seed=0):
    a = randn(*batch, n, n, seed=seed)
    return (a @ np.swapaxes(a, -1, -2) + n * np.eye(n)).astype(dtype)


def sym_input(value, name="x"):
    return T.tensor(dtype=str(value.dtype), shape=(False,) * value.ndim, name=name)


def run(build, *values):
    ins = [sym_input(v, f"in{i}") for i, v in enumerate(values)]
    out = build(*ins)
    return function(ins, out)(*values)


def close(got, want, dtype):
    np.testing.assert_allclose(got, want, **TOL[dtype])


# ============================================================================ values

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_inverse_det_pinv_match_numpy(dtype, batch):
    a = well_conditioned(4, batch, dtype)
    inv, d, p = run(lambda x: [N.matrix_inverse(x), N.det(x), N.pinv(x)], a)
    assert inv.dtype == d.dtype == p.dtype == dtype
    close(inv, np.linalg.inv(a), dtype)
    close(d, np.linalg.det(a), dtype)
    close(p, np.linalg.pinv(a), dtype)
    assert d.shape == batch


@pytest.mark.parametrize("dtype", DTYPES)
def test_pinv_of_a_rectangular_matrix_and_hermitian(dtype):
    a = randn(5, 3, dtype=dtype)
    got = run(N.pinv, a)
    assert got.shape == (3, 5)
    close(got, np.linalg.pinv(a), dtype)
    s = spd(4, dtype=dtype)
    close(run(lambda x: N.MatrixPinv(hermitian=True)(x), s), np.linalg.pinv(s, hermitian=True),
          dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(), (3,)])
def test_eigh_matches_numpy(dtype, batch):
    s = spd(4, batch, dtype)
    for uplo in ("L", "U"):
        w, v = run(lambda x: N.eigh(x, uplo), s)
        ww, vv = np.linalg.eigh(s, uplo)
        assert w.dtype == v.dtype == dtype
        close(w, ww, dtype)
        np.testing.assert_allclose(np.abs(v), np.abs(vv), rtol=1e-3 if dtype == "float32" else 1e-7,
                                   atol=1e-4 if dtype == "float32" else 1e-9)


def test_eigh_reads_one_triangle():
    a = randn(4, 4)
    lower = np.tril(a) + np.tril(a, -1).T
    upper = np.triu(a) + np.triu(a, 1).T
    np.testing.assert_allclose(run(lambda x: N.eigh(x, "L")[0], a), np.linalg.eigvalsh(lower))
    np.testing.assert_allclose(run(lambda x: N.eigh(x, "U")[0], a), np.linalg.eigvalsh(upper))


@pytest.mark.parametrize("dtype", DTYPES)
def test_eig_matches_numpy_and_is_complex(dtype):
    a = randn(2, 4, 4, dtype=dtype)
    w, v = run(N.eig, a)
    assert w.dtype == v.dtype == ("complex64" if dtype == "float32" else "complex128")
    ww, vv = np.linalg.eig(a)
    close(w, ww, dtype)
    # A v = v diag(w), for each matrix
    np.testing.assert_allclose(a @ v, v * w[..., None, :], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 3)])
def test_qr_modes_match_numpy(dtype, shape):
    a = randn(*shape, dtype=dtype)
    for mode in ("reduced", "complete"):
        q, r = run(lambda x: N.qr(x, mode), a)
        qq, rr = np.linalg.qr(a, mode)
        close(q, qq, dtype)
        close(r, rr, dtype)
    close(run(lambda x: N.qr(x, "r"), a), np.linalg.qr(a, "r"), dtype)
    if len(shape) == 2:
        h, tau = run(lambda x: N.qr(x, "raw"), a)
        hh, tt = np.linalg.qr(a, "raw")
        close(h, hh, dtype)
        close(tau, tt, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 3)])
def test_svd_matches_numpy(dtype, shape):
    a = randn(*shape, dtype=dtype)
    for full in (True, False):
        u, s, vt = run(lambda x: N.svd(x, full), a)
        uu, ss, vv = np.linalg.svd(a, full)
        assert u.shape == uu.shape and vt.shape == vv.shape
        close(s, ss, dtype)
        k = min(shape[-2:])
        close((u[..., :k] * s[..., None, :]) @ vt[..., :k, :], a, dtype)
    close(run(lambda x: N.svd(x, compute_uv=False), a), np.linalg.svd(a, compute_uv=False), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b_shape", [(6,), (6, 2)])
def test_lstsq_matches_numpy(dtype, b_shape):
    a, b = randn(6, 3, dtype=dtype), randn(*b_shape, dtype=dtype, seed=1)
    x, res, rank, s = run(lambda a_, b_: N.lstsq()(a_, b_, -1), a, b)
    xx, rr, kk, ss = np.linalg.lstsq(a, b, rcond=-1)
    close(x, xx, dtype)
    np.testing.assert_allclose(res, np.atleast_1d(rr), rtol=1e-3)
    assert rank == kk and rank.dtype == np.int64
    close(s, ss, dtype)


def test_lstsq_residuals_when_numpy_gives_none():
    # rank-deficient: NumPy returns no residuals; ours are the squared norms of b - a x
    a = np.array([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])
    b = np.array([1.0, 0.0, 1.0])
    x, res, rank, s = run(lambda a_, b_: N.lstsq()(a_, b_, 1e-10), a, b)
    assert rank == 1 and res.shape == (1,)
    np.testing.assert_allclose(res, [np.sum((b - a @ x) ** 2)])
    np.testing.assert_allclose(x, np.linalg.lstsq(a, b, rcond=1e-10)[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensorinv_and_tensorsolve_match_numpy(dtype):
    a = (randn(4, 6, 8, 3) + 0).astype(dtype)
    a = (np.eye(24).reshape(4, 6, 8, 3) * 5 + a).astype(dtype)
    close(run(lambda x: N.tensorinv(x, 2), a), np.linalg.tensorinv(a, 2), dtype)
    b = randn(4, 6, dtype=dtype)
    close(run(N.tensorsolve, a, b), np.linalg.tensorsolve(a, b), dtype)
    a2 = np.moveaxis(a, 3, 0).copy()       # (3, 4, 6, 8): axes=(0,) moves axis 0 back to the end
    got = run(lambda x, y: N.tensorsolve(x, y, axes=(0,)), a2, b)
    assert got.shape == (8, 3)
    close(got, np.linalg.tensorsolve(a2, b, axes=(0,)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_trace_matrix_dot_matrix_power(dtype):
    a, b, c = (randn(3, 3, dtype=dtype, seed=k) for k in range(3))
    close(run(N.trace, a), np.trace(a), dtype)
    close(run(N.matrix_dot, a, b, c), a @ b @ c, dtype)
    m = well_conditioned(3, dtype=dtype) / 3
    for n in (0, 1, 2, 5, -2):
        close(run(lambda x: N.matrix_power(x, n), m), np.linalg.matrix_power(m, n),
              dtype if n >= 0 else "float32")
    stack = randn(2, 3, 3, dtype=dtype) / 2
    close(run(lambda x: N.matrix_power(x, 3), stack), np.linalg.matrix_power(stack, 3), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_matches_numpy(dtype):
    v = np.array([3.0, 0.0, -4.0, 1.5], dtype=dtype)
    for ord in (None, np.inf, -np.inf, "inf", "-inf", 0, 1, 2, 3, -1.5):
        with np.errstate(divide="ignore"):  # a negative power of the zero element
            want = np.linalg.norm(v, {"inf": np.inf, "-inf": -np.inf}.get(ord, ord))
            close(run(lambda x: N.norm(x, ord), v), want, dtype)
    m = randn(3, 4, dtype=dtype)
    for ord in (None, "fro", "nuc", np.inf, -np.inf, "inf", 1, -1, 2, -2):
        want = np.linalg.norm(m, {"inf": np.inf, "-inf": -np.inf}.get(ord, ord))
        close(run(lambda x: N.norm(x, ord), m), want, dtype)


def test_diagonal_names_are_extra_ops():
    assert isinstance(N.alloc_diag, extra_ops.AllocDiag)
    assert isinstance(N.extract_diag, extra_ops.ExtractDiag)
    assert N.AllocDiag is extra_ops.AllocDiag and N.ExtractDiag is extra_ops.ExtractDiag
    v, m = randn(3), randn(3, 4)
    np.testing.assert_array_equal(run(N.alloc_diag, v), np.diag(v))
    np.testing.assert_array_equal(run(N.extract_diag, m), np.diag(m))
    np.testing.assert_array_equal(run(N.diag, v), np.diag(v))
    np.testing.assert_array_equal(run(N.diag, m), np.diag(m))


def test_integer_input_is_cast_to_float64():
    x = T.lmatrix("x")
    out = N.matrix_inverse(x)
    assert out.dtype == "float64"
    np.testing.assert_allclose(function([x], out)(np.array([[2, 0], [0, 4]])),
                               [[0.5, 0], [0, 0.25]])


# ============================================================================ gradients

@pytest.mark.parametrize("dtype", DTYPES)
def test_matrix_inverse_grad(dtype):
    verify_grad(N.matrix_inverse, [well_conditioned(4, dtype=dtype)], rng=rng())
    verify_grad(N.matrix_inverse, [well_conditioned(3, (2,), dtype=dtype)], rng=rng())


def test_matrix_inverse_rop_matches_numpy():
    x, ev = T.dmatrix("x"), T.dmatrix("ev")
    a, e = well_conditioned(3), randn(3, 3, seed=5)
    got = function([x, ev], Rop(N.matrix_inverse(x), x, ev))(a, e)
    ai = np.linalg.inv(a)
    np.testing.assert_allclose(got, -ai @ e @ ai)
    eps = 1e-6   # against a finite difference of inv
    fd = (np.linalg.inv(a + eps * e) - np.linalg.inv(a - eps * e)) / (2 * eps)
    np.testing.assert_allclose(got, fd, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_det_grad(dtype):
    verify_grad(N.det, [well_conditioned(4, dtype=dtype)], rng=rng())
    verify_grad(N.det, [well_conditioned(3, (2,), dtype=dtype)], rng=rng())


@pytest.mark.parametrize("dtype", DTYPES)
def test_pinv_grad(dtype):
    for shape in [(5, 3), (3, 5), (4, 4)]:
        a = randn(*shape, dtype=dtype) + (3 * np.eye(*shape)).astype(dtype)
        verify_grad(N.pinv, [a], rng=rng())
    verify_grad(N.pinv, [randn(2, 4, 3, dtype=dtype)], rng=rng())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_grad(dtype, uplo):
    # distinct eigenvalues; one output at a time, then both
    s = spd(4, dtype=dtype) + np.diag([0.0, 1.0, 2.0, 3.0]).astype(dtype)
    verify_grad(lambda x: N.eigh(x, uplo)[0], [s], rng=rng())
    verify_grad(lambda x: N.eigh(x, uplo)[1], [s], rng=rng())
    verify_grad(lambda x: N.eigh(x, uplo), [s], rng=rng())


def test_eigh_grad_of_a_stack():
    s = spd(3, (2,)) + np.diag([0.0, 2.0, 5.0])
    verify_grad(lambda x: N.eigh(x), [s], rng=rng())


def test_eigh_grad_against_theano_loop_formula():
    """EighGrad against Theano's perform (the explicit sum over eigenpairs)."""
    s = spd(4) + np.diag([0.0, 1.0, 2.0, 3.0])
    w, v = np.linalg.eigh(s)
    W, V = randn(4, seed=3), randn(4, 4, seed=4)

    def G(n):
        return sum(v[:, m] * V.T[n].dot(v[:, m]) / (w[n] - w[m]) for m in range(4) if m != n)
    g = sum(np.outer(v[:, n], v[:, n] * W[n] + G(n)) for n in range(4))
    want = np.tril(g) + np.triu(g, 1).T
    ins = [T.dmatrix(), T.dvector(), T.dmatrix(), T.dvector(), T.dmatrix()]
    got = function(ins, N.EighGrad("L")(*ins))(s, w, v, W, V)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_grad_of_functions_of_ops():
    verify_grad(N.trace, [randn(3, 3)], rng=rng())
    verify_grad(lambda x: N.norm(x, "fro"), [randn(3, 4)], rng=rng())
    verify_grad(lambda x: N.matrix_power(x, 3), [randn(3, 3)], rng=rng())
    verify_grad(lambda x: N.matrix_power(x, -1), [well_conditioned(3)], rng=rng())


def test_ops_without_gradient_say_so():
    x = T.dmatrix("x")
    for out in (N.svd(x)[1], N.qr(x)[1], N.qr(x, "r"), N.tensorinv(x, 1)):
        with pytest.raises(NotImplementedError, match="no gradient"):
            symgpu.grad(T.sum(out), x)


# ============================================================================ errors

@pytest.mark.parametrize("fn", [N.matrix_inverse, N.det, N.pinv, N.eig, N.eigh, N.qr, N.svd])
def test_vector_input_is_refused_with_its_type(fn):
    with pytest.raises(ValueError, match=r"must be a matrix or a stack of matrices.*1 dimension"):
        fn(T.dvector("v"))


def test_complex_input_is_refused():
    with pytest.raises(TypeError, match="complex"):
        N.matrix_inverse(T.matrix(dtype="complex128"))


@pytest.mark.parametrize("fn,name", [(N.matrix_inverse, "matrix_inverse"), (N.det, "det"),
                                     (lambda x: N.eigh(x)[0], "eigh")])
def test_non_square_input_fails_with_its_shape(fn, name):
    x = T.dmatrix("x")
    f = function([x], fn(x))
    with pytest.raises(ValueError, match=rf"{name}: x must be square.*\(3, 4\)"):
        f(randn(3, 4))


def test_singular_matrix_raises_linalg_error():
    x = T.dmatrix("x")
    with pytest.raises(np.linalg.LinAlgError):
        function([x], N.matrix_inverse(x))(np.ones((3, 3)))


def test_bad_arguments():
    with pytest.raises(ValueError, match="UPLO"):
        N.Eigh("X")
    with pytest.raises(ValueError, match="mode"):
        N.qr(T.dmatrix(), "economic")
    with pytest.raises(ValueError, match="ind"):
        N.tensorinv(T.dtensor4(), 0)
    with pytest.raises(ValueError, match="invalid ord"):
        N.norm(T.dmatrix(), 3)
    with pytest.raises(ValueError, match="vector or a matrix"):
        N.norm(T.dtensor3(), None)
    with pytest.raises(ValueError, match="must be a matrix"):
        N.trace(T.dtensor3())
    with pytest.raises(TypeError, match="integer"):
        N.matrix_power(T.dmatrix(), 1.5)
    x = T.dtensor4("a")
    f = function([x], N.tensorinv(x, 2))
    with pytest.raises(ValueError, match=r"\(2, 3, 4, 5\) is not 'square'"):
        f(randn(2, 3, 4, 5))
