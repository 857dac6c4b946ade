"""Theano's special functions (erfc, erfinv, erfcinv, gamma, gammaln, psi, tri_gamma, chi2sf),
batched_tensordot and choose: values against scipy.special/NumPy, gradients, CUDA forms."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.special as sps

import symgpu
import symgpu.tensor as T
from gpu_helpers import requires_nvcc
from symgpu.gradient import verify_grad
from symgpu.gpu.runtime.codegen.scalar import render_apply_function, supports_scalar_op
from symgpu.scalar import ccode
from symgpu.scalar.basic import SCALAR_OPS

UNARY = {  # name: (scipy reference, sample domain)
    "erfc": (sps.erfc, (-3, 3)),
    "erfinv": (sps.erfinv, (-0.95, 0.95)),
    "erfcinv": (sps.erfcinv, (0.05, 1.95)),
    "gamma": (sps.gamma, (0.2, 5)),
    "gammaln": (sps.gammaln, (0.2, 20)),
    "psi": (sps.psi, (0.2, 20)),
    "tri_gamma": (lambda x: sps.polygamma(1, x), (0.2, 20)),
}
RTOL = {"float32": 2e-6, "float64": 1e-14}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_values_match_scipy(name, dtype):
    ref, (lo, hi) = UNARY[name]
    x = T.vector("x", dtype=dtype)
    f = symgpu.function([x], getattr(T, name)(x))
    v = np.random.RandomState(0).uniform(lo, hi, 50).astype(dtype)
    got = f(v)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, np.asarray(ref(v)).astype(dtype), rtol=RTOL[dtype])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_chi2sf_matches_scipy_stats(dtype):
    import scipy.stats
    x, k = T.vector("x", dtype=dtype), T.vector("k", dtype=dtype)
    f = symgpu.function([x, k], T.chi2sf(x, k))
    xv = np.linspace(0.1, 10, 20).astype(dtype)
    kv = np.arange(1, 21).astype(dtype)
    got = f(xv, kv)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, scipy.stats.chi2.sf(xv, kv).astype(dtype),
                               rtol=max(RTOL[dtype], 1e-12))


def test_integer_inputs_give_floats():
    assert T.gammaln(T.bvector()).dtype == "float32"
    assert T.erfinv(T.ivector()).dtype == "float64"
    assert T.chi2sf(T.fvector(), 3).dtype == "float32"


@pytest.mark.parametrize("name", ["erfc", "erfinv", "erfcinv", "gamma", "gammaln", "psi"])
def test_gradients(name):
    lo, hi = UNARY[name][1]
    v = np.random.RandomState(1).uniform(lo, hi, 6)
    verify_grad(getattr(T, name), [v], rng=np.random.RandomState(2))


@pytest.mark.parametrize("name", ["tri_gamma", "chi2sf"])
def test_gradient_not_implemented_as_in_theano(name):
    x = T.dvector("x")
    out = T.tri_gamma(x) if name == "tri_gamma" else T.chi2sf(x, 2.0)
    with pytest.raises(NotImplementedError):
        T.grad(out.sum(), x)


def test_cuda_forms_and_host_only_rows():
    for name in ["erfc", "erfinv", "erfcinv", "gamma", "gammaln"]:
        assert supports_scalar_op(SCALAR_OPS[name], ["float32"]), name
    for name, n in [("psi", 1), ("tri_gamma", 1), ("chi2sf", 2)]:
        assert not supports_scalar_op(SCALAR_OPS[name], ["float32"] * n), name
        with pytest.raises(NotImplementedError):
            SCALAR_OPS[name].cuda("float32", ["a"] * n)


def test_c_kernels_leave_special_rows_to_numpy():
    from symgpu.scalar.composite import CompositeBuilder
    for name in ["erfc", "erfinv", "erfcinv", "gamma", "gammaln", "psi"]:
        b = CompositeBuilder()
        x = b.add_input("float64")
        (y,) = b.add_op(SCALAR_OPS[name], [x])
        (z,) = b.add_op(SCALAR_OPS["exp"], [y])
        assert not ccode.supports(b.build([z])), name


@requires_nvcc
def test_cuda_expressions_compile(tmp_path):
    from gpu_helpers import compile_for_sm90
    from symgpu.gpu.runtime.codegen import common_source
    parts = [common_source()]
    for name in ["erfc", "erfinv", "erfcinv", "gamma", "gammaln"]:
        for dtype in ["float16", "float32", "float64"]:
            fn = f"apply_{name}_{dtype}"
            src, _ = render_apply_function(SCALAR_OPS[name], [dtype], name=fn)
            parts.append(src)
    assert compile_for_sm90("\n".join(parts), tmp_path)


def test_import_symgpu_does_not_import_scipy():
    code = ("import sys, symgpu, symgpu.tensor as T; x = T.dvector(); T.grad(T.psi(x).sum(), x); "
            "assert 'scipy' not in sys.modules, 'scipy imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------- batched_tensordot
@pytest.mark.parametrize("xs,ys,axes,want_axes", [
    ((2, 3, 4), (2, 4, 5), 1, [[1], [0]]),
    ((2, 3, 4), (2, 3, 4, 5), 2, [[0, 1], [0, 1]]),
    ((2, 3, 4), (2, 4, 5, 3), [[1, 2], [3, 1]], [[0, 1], [2, 0]]),
    ((3, 4), (3, 4), [[1], [1]], [[0], [0]]),
])
def test_batched_tensordot(xs, ys, axes, want_axes):
    rng = np.random.RandomState(3)
    xv, yv = rng.rand(*xs), rng.rand(*ys)
    x, y = T.tensor("float64", shape=(None,) * len(xs)), T.tensor("float64", shape=(None,) * len(ys))
    f = symgpu.function([x, y], T.batched_tensordot(x, y, axes))
    want = np.stack([np.tensordot(xv[i], yv[i], want_axes) for i in range(xs[0])])
    np.testing.assert_allclose(f(xv, yv), want, rtol=1e-12)
    verify_grad(lambda a, b: T.batched_tensordot(a, b, axes), [xv, yv], rng=rng)


def test_batched_tensordot_refuses_the_batch_axis():
    with pytest.raises(ValueError):
        T.batched_tensordot(T.dtensor3(), T.dtensor3(), [[0], [1]])


# ----------------------------------------------------------------------------- choose
@pytest.mark.parametrize("mode", ["raise", "wrap", "clip"])
def test_choose_tensor_of_choices(mode):
    rng = np.random.RandomState(4)
    a, c = T.imatrix("a"), T.dtensor3("c")
    f = symgpu.function([a, c], T.choose(a, c, mode=mode))
    lo, hi = (0, 3) if mode == "raise" else (-4, 7)
    av = rng.randint(lo, hi, (4, 5)).astype("int32")
    cv = rng.rand(3, 4, 5)
    np.testing.assert_array_equal(f(av, cv), np.choose(av, cv, mode=mode))


def test_choose_list_broadcasts_like_numpy():
    a, x, y = T.icol("a"), T.drow("x"), T.dscalar("y")
    f = symgpu.function([a, x, y], T.choose(a, [x, y]))
    av, xv = np.int32([[0], [1], [0]]), np.arange(4.0)[None]
    got = f(av, xv, 7.0)
    np.testing.assert_array_equal(got, np.choose(av, [xv, 7.0]))
    assert got.shape == (3, 4)


def test_choose_raise_mode_refuses_out_of_range():
    a, c = T.ivector("a"), T.dmatrix("c")
    f = symgpu.function([a, c], T.choose(a, c))
    for bad in (3, -1):
        with pytest.raises(IndexError):
            f(np.int32([0, bad]), np.ones((3, 2)))


def test_choose_gradient_and_shape():
    rng = np.random.RandomState(5)
    av = rng.randint(0, 3, (4, 5)).astype("int32")
    verify_grad(lambda c: T.choose(av, c), [rng.rand(3, 4, 5)], rng=rng)
    a, c = T.imatrix("a"), T.dtensor3("c")
    f = symgpu.function([a, c], T.choose(a, c).shape)
    assert tuple(f(av, rng.rand(3, 4, 5))) == (4, 5)
    with pytest.raises(ValueError):
        T.choose(a, c, mode="bogus")
