"""symgpu.tensor.slinalg (Theano's theano.tensor.slinalg) and symgpu.sandbox.linalg: values
against SciPy in float64 and float32, stacks of matrices, gradients (verify_grad), errors."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.linalg as sl

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.gradient import verify_grad
from symgpu.sandbox import linalg as SB
from symgpu.tensor import slinalg as S

DTYPES = ["float64", "float32"]
TOL = {"float64": dict(rtol=1e-7, atol=1e-9), "float32": dict(rtol=3e-4, atol=3e-5)}


def rng():
    return np.random.default_rng(0)


def randn(*shape, dtype="float64", seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def spd(n, batch=(), dtype="float64", seed=0):
    a = randn(*batch, n, n, seed=seed)
    return (a @ np.swapaxes(a, -1, -2) + n * np.eye(n)).astype(dtype)


def lower_tri(n, batch=(), dtype="float64", seed=0):
    return np.ascontiguousarray(np.tril(randn(*batch, n, n, seed=seed)) + 3 * np.eye(n)).astype(dtype)


def upper_tri(n, batch=(), dtype="float64", seed=0):
    return np.ascontiguousarray(np.swapaxes(lower_tri(n, batch, dtype, seed), -1, -2))


def run(build, *values):
    ins = [T.tensor(dtype=str(v.dtype), shape=(False,) * v.ndim, name=f"in{i}")
           for i, v in enumerate(values)]
    return function(ins, build(*ins))(*values)


def close(got, want, dtype):
    np.testing.assert_allclose(got, want, **TOL[dtype])


# ============================================================================ cholesky

@pytest.mark.parametrize("dtype", DTYPES)
def test_cholesky_matches_scipy_and_is_lower_by_default(dtype):
    s = spd(5, dtype=dtype)
    L = run(S.cholesky, s)
    assert L.dtype == dtype
    close(L, sl.cholesky(s, lower=True), dtype)
    # Theano's check_lower_triangular
    assert L[0, 4] == 0 and L[4, 0] != 0
    close(L @ L.T, s, dtype)
    U = run(S.Cholesky(lower=False), s)
    assert U[4, 0] == 0 and U[0, 4] != 0
    close(U, sl.cholesky(s, lower=False), dtype)


def test_cholesky_of_a_stack():
    s = spd(3, (2, 2))
    L = run(S.cholesky, s)
    np.testing.assert_allclose(L, np.linalg.cholesky(s))


def test_cholesky_on_error():
    x = T.dmatrix("x")
    bad = np.array([[1.0, 2.0], [2.0, 1.0]])
    with pytest.raises(sl.LinAlgError):
        function([x], S.cholesky(x))(bad)
    assert np.isnan(function([x], S.Cholesky(on_error="nan")(x))(bad)).all()
    # a stack: only the matrix that is not positive definite turns to NaN
    xs = T.dtensor3("xs")
    got = function([xs], S.Cholesky(on_error="nan")(xs))(np.stack([bad, np.eye(2)]))
    assert np.isnan(got[0]).all() and np.array_equal(got[1], np.eye(2))
    with pytest.raises(ValueError, match="on_error"):
        S.Cholesky(on_error="ignore")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lower", [True, False])
def test_cholesky_grad(dtype, lower):
    # Theano's test: a function of the symmetric part, so both triangles matter
    def fn(x):
        return S.Cholesky(lower=lower)(x.dot(x.T) + 4 * T.eye(4, dtype=dtype))
    verify_grad(fn, [randn(4, 4, dtype=dtype)], rng=rng())
    verify_grad(S.Cholesky(lower=lower), [spd(4, dtype=dtype)], rng=rng())


def test_cholesky_grad_of_a_stack_and_nan_mode():
    verify_grad(S.cholesky, [spd(3, (2,))], rng=rng())
    verify_grad(S.Cholesky(on_error="nan"), [spd(3)], rng=rng())
    x = T.dmatrix("x")
    g = symgpu.grad(S.Cholesky(on_error="nan")(x).sum(), x)
    assert np.isnan(function([x], g)(np.array([[1.0, 2.0], [2.0, 1.0]]))).all()


# ============================================================================ solves

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b_shape", [(4,), (4, 3)])
def test_solve_matches_scipy(dtype, b_shape):
    a, b = randn(4, 4, dtype=dtype) + 3 * np.eye(4, dtype=dtype), randn(*b_shape, dtype=dtype, seed=1)
    close(run(S.solve, a, b), sl.solve(a, b), dtype)
    s = spd(4, dtype=dtype)
    for assume_a in ("sym", "pos", "symmetric", "positive_definite"):
        close(run(lambda x, y: S.solve(x, y, assume_a=assume_a), s, b), sl.solve(s, b), dtype)
    close(run(S.solve_symmetric, s, b), sl.solve(s, b), dtype)
    L, U = lower_tri(4, dtype=dtype), upper_tri(4, dtype=dtype)
    close(run(S.solve_lower_triangular, L, b), sl.solve_triangular(L, b, lower=True), dtype)
    close(run(S.solve_upper_triangular, U, b), sl.solve_triangular(U, b, lower=False), dtype)
    close(run(lambda x, y: S.solve(x, y, "lower_triangular"), L, b), np.linalg.solve(L, b), dtype)


def test_triangular_solves_read_one_triangle():
    a, b = randn(4, 4) + 3 * np.eye(4), randn(4)
    np.testing.assert_allclose(run(S.solve_lower_triangular, a, b), np.linalg.solve(np.tril(a), b))
    np.testing.assert_allclose(run(S.solve_upper_triangular, a, b), np.linalg.solve(np.triu(a), b))


@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_triangular_matches_scipy(dtype):
    a, b = randn(4, 4, dtype=dtype) + 3 * np.eye(4, dtype=dtype), randn(4, 2, dtype=dtype, seed=1)
    for trans in (0, 1, "N", "T"):
        for lower in (True, False):
            for unit in (False, True):
                got = run(lambda x, y: S.solve_triangular(x, y, trans, lower, unit), a, b)
                want = sl.solve_triangular(a, b, trans=trans, lower=lower, unit_diagonal=unit)
                close(got, want, "float32" if unit else dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cho_solve_matches_scipy(dtype):
    s, b = spd(4, dtype=dtype), randn(4, 2, dtype=dtype, seed=1)
    for lower in (True, False):
        c = sl.cholesky(s, lower=lower)
        close(run(lambda x, y: S.cho_solve((x, lower), y), c, b), sl.cho_solve((c, lower), b),
              dtype)


def test_solves_of_stacks():
    a, b, v = randn(2, 3, 3) + 3 * np.eye(3), randn(2, 3, 2, seed=1), randn(2, 3, seed=2)
    np.testing.assert_allclose(run(S.solve, a, b), np.linalg.solve(a, b))
    np.testing.assert_allclose(run(S.solve, a, v), np.linalg.solve(a, v[..., None])[..., 0])
    L = lower_tri(3, (2,))
    np.testing.assert_allclose(run(S.solve_lower_triangular, L, b), np.linalg.solve(L, b))
    np.testing.assert_allclose(run(lambda x, y: S.solve_triangular(x, y, lower=True), L, v),
                               np.linalg.solve(L, v[..., None])[..., 0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b_shape", [(4,), (4, 3)])
def test_solve_grads(dtype, b_shape):
    a, b = randn(4, 4, dtype=dtype) + 3 * np.eye(4, dtype=dtype), randn(*b_shape, dtype=dtype, seed=1)
    verify_grad(S.solve, [a, b], rng=rng())
    verify_grad(S.solve_lower_triangular, [lower_tri(4, dtype=dtype), b], rng=rng())
    verify_grad(S.solve_upper_triangular, [upper_tri(4, dtype=dtype), b], rng=rng())
    # symmetric: of a symmetric argument (scipy reads one triangle)
    verify_grad(lambda x, y: S.solve_symmetric(x + x.T, y), [a, b], rng=rng())


@pytest.mark.parametrize("trans", [0, 1])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("unit", [False, True])
def test_solve_triangular_grads(trans, lower, unit):
    a = lower_tri(4) if lower else upper_tri(4)
    for b in (randn(4, 2, seed=1), randn(4, seed=1)):
        verify_grad(lambda x, y: S.solve_triangular(x, y, trans, lower, unit), [a, b], rng=rng())


@pytest.mark.parametrize("lower", [True, False])
def test_cho_solve_grads(lower):
    c = np.ascontiguousarray(sl.cholesky(spd(4), lower=lower))
    for b in (randn(4, 2, seed=1), randn(4, seed=1)):
        verify_grad(lambda x, y: S.cho_solve((x, lower), y), [c, b], rng=rng())


def test_solve_grads_of_stacks():
    a = randn(2, 3, 3) + 3 * np.eye(3)
    verify_grad(S.solve, [a, randn(2, 3, 2, seed=1)], rng=rng())
    verify_grad(S.solve, [a, randn(2, 3, seed=1)], rng=rng())
    verify_grad(lambda x, y: S.solve_triangular(x, y, lower=True), [lower_tri(3, (2,)),
                                                                    randn(2, 3, seed=1)], rng=rng())


def test_solve_errors():
    with pytest.raises(ValueError, match="A_structure"):
        S.Solve("skew")
    with pytest.raises(ValueError, match="assume_a"):
        S.solve(T.dmatrix(), T.dvector(), assume_a="tridiagonal")
    with pytest.raises(ValueError, match="trans"):
        S.SolveTriangular(trans=2)
    with pytest.raises(ValueError, match=r"b = .* must have 1 dimensions .* or 2"):
        S.solve(T.dmatrix("A"), T.dtensor3("b"))
    with pytest.raises(ValueError, match=r"A = .* must be a matrix or a stack"):
        S.solve(T.dvector("A"), T.dvector("b"))
    A, b = T.dmatrix("A"), T.dvector("b")
    f = function([A, b], S.solve(A, b))
    with pytest.raises(ValueError, match=r"A of shape \(3, 3\) and b of shape \(4,\) do not fit"):
        f(np.eye(3), np.ones(4))
    with pytest.raises(ValueError, match=r"A must be square.*\(3, 4\)"):
        f(np.ones((3, 4)), np.ones(3))
    As, bs = T.dtensor3("A"), T.dmatrix("b")
    g = function([As, bs], S.solve(As, bs))
    with pytest.raises(ValueError, match="batch dimensions"):
        g(np.ones((2, 3, 3)), np.ones((3, 3)))
    with pytest.raises(sl.LinAlgError):
        f(np.ones((3, 3)), np.ones(3))


# ============================================================================ eigvalsh

@pytest.mark.parametrize("dtype", DTYPES)
def test_eigvalsh_matches_scipy(dtype):
    a, b = spd(5, dtype=dtype, seed=1), spd(5, dtype=dtype, seed=2)
    for lower in (True, False):
        close(run(lambda x: S.eigvalsh(x, None, lower), a), sl.eigvalsh(a, lower=lower), dtype)
        got = run(lambda x, y: S.eigvalsh(x, y, lower), a, b)
        close(got, sl.eigvalsh(a, b, lower=lower), "float32")


@pytest.mark.parametrize("dtype", DTYPES)
def test_eigvalsh_grad(dtype):
    # Theano's test: a, b symmetric through their arguments
    a, b = randn(5, 5, dtype=dtype, seed=1), spd(5, dtype=dtype, seed=2)
    verify_grad(lambda x: S.eigvalsh(x + x.T), [a], rng=rng())
    verify_grad(lambda x, y: S.eigvalsh(x + x.T, y), [a, b], rng=rng())
    verify_grad(lambda x, y: S.eigvalsh(x, y + y.T, lower=False), [a + a.T, b / 2], rng=rng())


def test_eigvalsh_grad_op_against_theano_formula():
    a, b, gw = spd(4, seed=1), spd(4, seed=2), randn(4, seed=3)
    w, v = sl.eigh(a, b)
    gA, gB = v @ np.diag(gw) @ v.T, -v @ np.diag(gw * w) @ v.T
    ins = [T.dmatrix(), T.dmatrix(), T.dvector()]
    got = function(ins, S.EigvalshGrad(True)(*ins))(a, b, gw)
    np.testing.assert_allclose(got[0], np.tril(gA) + np.triu(gA, 1).T)
    np.testing.assert_allclose(got[1], np.tril(gB) + np.triu(gB, 1).T)


def test_eigvalsh_errors():
    with pytest.raises(ValueError, match=r"a = .* must be a matrix \(2 dimensions\)"):
        S.eigvalsh(T.dtensor3("a"))
    a, b = T.dmatrix("a"), T.dmatrix("b")
    f = function([a, b], S.eigvalsh(a, b))
    with pytest.raises(ValueError, match=r"\(3, 3\) and b of shape \(2, 2\)"):
        f(np.eye(3), np.eye(2))


# ============================================================================ expm / kron

@pytest.mark.parametrize("dtype", DTYPES)
def test_expm_matches_scipy(dtype):
    a = randn(4, 4, dtype=dtype) / 2
    close(run(S.expm, a), sl.expm(a), dtype)
    stack = randn(3, 4, 4, dtype=dtype) / 2
    close(run(S.expm, stack), np.stack([sl.expm(m) for m in stack]), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_expm_grad(dtype):
    verify_grad(S.expm, [randn(4, 4, dtype=dtype) / 2], rng=rng())
    verify_grad(S.expm, [randn(2, 3, 3, dtype=dtype) / 2], rng=rng())


def test_expm_grad_matches_theano_eig_formula():
    """ExpmGrad (Frechet derivative) against Theano's eigendecomposition formula."""
    A, gA = randn(4, 4, seed=1) / 2, randn(4, 4, seed=2)
    w, V = np.linalg.eig(A)
    U = np.linalg.inv(V).T
    with np.errstate(invalid="ignore"):  # 0/0 on the diagonal, filled next
        X = np.subtract.outer(np.exp(w), np.exp(w)) / np.subtract.outer(w, w)
    np.fill_diagonal(X, np.exp(w))
    want = (U.dot(V.T.dot(gA).dot(U) * X).dot(V.T)).real
    x, g = T.dmatrix(), T.dmatrix()
    np.testing.assert_allclose(function([x, g], S.ExpmGrad()(x, g))(A, gA), want, rtol=1e-8,
                               atol=1e-10)


def _old_scipy_kron(a, b):
    """scipy.linalg.kron as Theano's tests knew it (removed from SciPy since)."""
    o = np.outer(a, b).reshape(a.shape + b.shape)
    return np.concatenate(np.concatenate(o, axis=1), axis=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kron_matches_theano_reference(dtype):
    for shp0 in [(2,), (2, 3), (2, 3, 4), (2, 3, 4, 5)]:
        a = randn(*shp0, dtype=dtype)
        for shp1 in [(6,), (6, 7), (6, 7, 8), (6, 7, 8, 9)]:
            if len(shp0) + len(shp1) == 2:
                continue
            b = randn(*shp1, dtype=dtype, seed=1)
            got = run(S.kron, a, b)
            if len(shp0) + len(shp1) == 3:
                want = _old_scipy_kron(a[np.newaxis, :], b).flatten()
            else:
                want = _old_scipy_kron(a, b)
            close(got, want, dtype)
    a, b = randn(2, 3, dtype=dtype), randn(6, 7, dtype=dtype)
    close(run(S.kron, a, b), np.kron(a, b), dtype)


def test_kron_grad_and_errors():
    verify_grad(S.kron, [randn(2, 3), randn(3, 2, seed=1)], rng=rng())
    with pytest.raises(TypeError, match="sum to 3 or more"):
        S.kron(T.dvector(), T.dvector())


def test_integer_and_complex_inputs():
    x = T.lmatrix("x")
    assert S.cholesky(x).dtype == "float64"
    np.testing.assert_allclose(function([x], S.cholesky(x))(np.array([[4, 2], [2, 5]])),
                               np.linalg.cholesky([[4.0, 2], [2, 5]]))
    with pytest.raises(TypeError, match="complex"):
        S.expm(T.matrix(dtype="complex128"))


def test_scipy_linalg_loads_on_first_use():
    code = ("import sys, symgpu.tensor.slinalg, symgpu.sandbox.linalg; "
            "assert 'scipy.linalg' not in sys.modules, 'loaded at import'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ============================================================================ sandbox.linalg

def test_psd_hint():
    x = T.dmatrix("x")
    p = SB.psd(x)
    assert SB.is_psd(p) and SB.is_symmetric(p)
    assert not SB.is_psd(x) and not SB.is_psd(p * 2)
    assert SB.hints(p) == {"psd": True, "symmetric": True}
    f = function([x], SB.psd(x) * 2)   # the hint is gone from the compiled graph
    assert not any(isinstance(n.op, SB.Hint) for n in f.maker.fgraph.toposort())
    np.testing.assert_array_equal(f(np.eye(2)), 2 * np.eye(2))
    verify_grad(lambda v: SB.psd(v) * 3, [randn(2, 2)], rng=rng())


def test_spectral_radius_bound():
    x = T.dmatrix("x")
    s = spd(5)
    radius = np.abs(np.linalg.eigvalsh(s)).max()
    prev = np.inf
    for k in (1, 2, 3, 5):
        bound = function([x], SB.spectral_radius_bound(x, k))(s)
        assert radius <= bound * (1 + 1e-12) <= prev
        prev = bound
    assert abs(bound - radius) / radius < 0.05
    with pytest.raises(TypeError, match="matrix"):
        SB.spectral_radius_bound(T.dvector(), 2)
    with pytest.raises(TypeError, match="integer"):
        SB.spectral_radius_bound(x, 2.0)
    with pytest.raises(ValueError, match="> 0"):
        SB.spectral_radius_bound(x, 0)


def test_sandbox_reexports():
    from symgpu.tensor import nlinalg as N
    assert SB.cholesky is S.cholesky and SB.matrix_inverse is N.matrix_inverse
    assert SB.det is N.det and SB.trace is N.trace and SB.eigvalsh is S.eigvalsh


def linalg_pickle_case():
    """(inputs, outputs, values) using every linalg op class (also a case for
    tests/test_pickle.py's table)."""
    from symgpu.tensor import nlinalg as N
    x, y = T.dmatrix("x"), T.dmatrix("y")
    s = spd(3)
    w, v = N.eigh(x)
    g = symgpu.grad(w.sum() + (v ** 2).sum() + S.eigvalsh(x, y).sum() + S.expm(x).sum(), x)
    outs = [N.matrix_inverse(x), N.pinv(x), N.det(x), *N.eig(x), w, v, *N.qr(x), N.qr(x, "r"),
            *N.svd(x), *N.lstsq()(x, y, -1), N.tensorinv(x, 1), N.tensorsolve(x, y[0]),
            S.cholesky(x), S.solve(x, y), S.solve_triangular(x, y, lower=True),
            S.cho_solve((S.cholesky(x), True), y), SB.psd(x) * 2, g]
    return [x, y], outs, [s, spd(3, seed=1)]


def test_compiled_linalg_functions_pickle():
    import pickle
    ins, outs, vals = linalg_pickle_case()
    for mode in ("FAST_RUN", "FAST_COMPILE"):
        f = function(ins, outs, mode=mode)
        g = pickle.loads(pickle.dumps(f, protocol=pickle.HIGHEST_PROTOCOL))
        for got, want in zip(g(*vals), f(*vals)):
            np.testing.assert_array_equal(got, want)
    ops = {type(n.op) for n in function(ins, outs).maker.fgraph.toposort()}
    assert {S.Cholesky, S.Solve, S.SolveTriangular, S.CholeskySolve, S.EigvalshGrad,
            S.ExpmGrad} <= ops
