"""symgpu.tensor.fft (Theano's rfft/irfft with real and imaginary parts in a trailing axis of
length 2): values against numpy.fft, every normalisation, gradients with verify_grad, shapes
with infer_shape, and clear errors."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from symgpu import config, function
from symgpu.gradient import verify_grad
from symgpu.tensor import fft
from symgpu.tensor.rewriting.shape_feature import node_shapes

RNG = np.random.RandomState(7)


def as_complex(a):
    return a[..., 0] + 1j * a[..., 1]


def as_pairs(c, dtype="float64"):
    return np.stack([c.real, c.imag], axis=-1).astype(dtype)


def scale(norm, n, inverse):
    if norm == "ortho":
        return 1 / np.sqrt(n)
    if norm is None and inverse:
        return 1 / n
    return 1.0


@pytest.mark.parametrize("shape", [(1, 16), (3, 7), (2, 4, 6), (2, 3, 5), (2, 2, 3, 4)])
@pytest.mark.parametrize("norm", [None, "ortho", "no_norm"])
def test_rfft_matches_numpy(shape, norm):
    x = T.tensor(dtype="float64", shape=(False,) * len(shape))
    v = RNG.rand(*shape)
    got = function([x], fft.rfft(x, norm=norm))(v)
    axes = tuple(range(1, len(shape)))
    want = np.fft.rfftn(v, axes=axes) * scale(norm, np.prod(shape[1:]), False)
    assert got.shape == shape[:-1] + (shape[-1] // 2 + 1, 2)
    np.testing.assert_allclose(as_complex(got), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shape", [(1, 16), (3, 7), (2, 4, 6), (2, 3, 5)])
@pytest.mark.parametrize("norm", [None, "ortho", "no_norm"])
def test_irfft_matches_numpy(shape, norm):
    n = shape[-1]
    odd = n % 2 == 1
    spec = np.fft.rfftn(RNG.rand(*shape), axes=tuple(range(1, len(shape))))
    spec = spec + 0.3 * RNG.rand(*spec.shape)  # not the spectrum of a real signal
    m = T.tensor(dtype="float64", shape=(False,) * (len(shape) + 1))
    got = function([m], fft.irfft(m, norm=norm, is_odd=odd))(as_pairs(spec))
    want = np.fft.irfftn(spec, s=shape[1:], axes=tuple(range(1, len(shape))))
    want = want * np.prod(shape[1:]) * scale(norm, np.prod(shape[1:]), True)
    assert got.shape == shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("norm", [None, "ortho"])
@pytest.mark.parametrize("n", [8, 9])
def test_irfft_inverts_rfft(norm, n):
    x = T.dtensor3()
    v = RNG.rand(2, 5, n)
    back = fft.irfft(fft.rfft(x, norm=norm), norm=norm, is_odd=n % 2 == 1)
    np.testing.assert_allclose(function([x], back)(v), v, rtol=1e-10, atol=1e-12)


def test_float32_stays_float32():
    x = T.fmatrix()
    y = fft.rfft(x, norm="ortho")
    z = fft.irfft(y, norm="ortho")
    assert y.dtype == z.dtype == "float32"
    v = RNG.rand(3, 8).astype("float32")
    gy, gz = function([x], [y, z])(v)
    assert gy.dtype == gz.dtype == np.float32
    np.testing.assert_allclose(as_complex(gy), np.fft.rfft(v, norm="ortho"), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(gz, v, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 16), (2, 7), (2, 3, 5), (2, 4, 6)])
@pytest.mark.parametrize("norm", [None, "ortho", "no_norm"])
def test_rfft_gradient(shape, norm):
    verify_grad(lambda a: fft.rfft(a, norm=norm), [RNG.rand(*shape)],
                rng=np.random.default_rng(0))


@pytest.mark.parametrize("shape", [(1, 16), (2, 7), (2, 3, 5), (2, 4, 6)])
@pytest.mark.parametrize("norm", [None, "ortho", "no_norm"])
def test_irfft_gradient(shape, norm):
    odd = shape[-1] % 2 == 1
    spec_shape = shape[:-1] + (shape[-1] // 2 + 1, 2)
    verify_grad(lambda a: fft.irfft(a, norm=norm, is_odd=odd), [RNG.rand(*spec_shape)],
                rng=np.random.default_rng(0))


def test_gradients_are_theanos_formulas():
    """The ops' gradients are each other with the middle frequencies halved / doubled."""
    x = T.dmatrix()
    g = T.dtensor3()
    v, gv = RNG.rand(2, 6), RNG.rand(2, 4, 2)
    dx = function([x, g], T.grad((fft.rfft_op(x) * g).sum(), x))(v, gv)
    half = gv.copy()
    half[:, 1:3] *= 0.5
    np.testing.assert_allclose(dx, np.fft.irfft(as_complex(half), n=6) * 6, rtol=1e-10)
    m, gy = T.dtensor3(), T.dmatrix()
    y = fft.irfft_op(m)
    dm = function([m, gy], T.grad((y * gy).sum(), m))(gv, v)
    want = as_pairs(np.fft.rfft(v))
    want[:, 1:3] *= 2
    np.testing.assert_allclose(dm, want, rtol=1e-10)


@pytest.mark.parametrize("build, shape", [
    (lambda x: fft.rfft_op(x), (2, 7)),
    (lambda x: fft.rfft_op(x), (2, 3, 4)),
    (lambda x: fft.irfft_op(x), (2, 5, 2)),
    (lambda x: fft.irfft_op(x, T.stack([x.shape[1], 2 * x.shape[2] - 1])), (2, 3, 4, 2)),
])
def test_infer_shape(build, shape):
    x = T.tensor(dtype="float64", shape=(False,) * len(shape))
    out = build(x)
    dims = node_shapes(out.owner)[0]
    f = function([x], [out] + [T.cast(d, "int64") for d in dims])
    got = f(RNG.rand(*shape))
    assert tuple(int(d) for d in got[1:]) == got[0].shape


def test_errors_name_the_input():
    with pytest.raises(TypeError, match="float32 or float64.*int64"):
        fft.rfft(T.lmatrix())
    with pytest.raises(TypeError, match="at least 2 dimensions"):
        fft.rfft(T.dvector())
    with pytest.raises(TypeError, match="at least 3 dimensions"):
        fft.irfft(T.dmatrix())
    with pytest.raises(ValueError, match="norm"):
        fft.rfft(T.dmatrix(), norm="forward")
    with pytest.raises(ValueError, match="is_odd"):
        fft.irfft(T.dtensor3(), is_odd=1.5)
    with pytest.raises(TypeError, match="integer vector"):
        fft.rfft_op(T.dmatrix(), T.dvector())
    m = T.dtensor3()
    f = function([m], fft.irfft(m))
    with pytest.raises(ValueError, match=r"last axis.*\(2, 5, 3\)"):
        f(RNG.rand(2, 5, 3))
    x = T.dmatrix()
    g = function([x], fft.rfft_op(x, T.as_tensor_variable(np.array([4]))))
    with pytest.raises(ValueError, match=r"s=\(4,\).*\(6,\)"):
        g(RNG.rand(2, 6))


def test_cpu_and_floatx_float32_graph():
    with config.change_flags(floatX="float32"):
        x = T.matrix()
        assert fft.rfft(x).dtype == "float32"


def test_a_gpu_graph_runs_the_transforms_through_the_gpu_ops():
    """(symgpu/gpu/ops/fft.py lifts them; tests/test_gpu_fft.py tests them.) Transforms of
    more than 3 axes, which cuFFT has no plan for, stay on the host."""
    from symgpu.gpu.placement.rewriting import virtual_context
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.fmatrix("x")
        y = fft.irfft(fft.rfft(x * 2)) + 1
        f = function([x], [y, T.grad(y.sum(), x)])
        names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
        assert {"GpuRFFT", "GpuIRFFT"} <= names and not names & {"RFFTOp", "IRFFTOp"}, names
        x5 = T.tensor(dtype="float32", shape=(False,) * 5)
        g = function([x5], fft.irfft(fft.rfft(x5)))
        names = {type(n.op).__name__ for n in g.maker.fgraph.toposort()}
        assert {"RFFTOp", "IRFFTOp", "GpuFromHost", "HostFromGpu"} <= names, names


def test_functions_and_graphs_pickle():
    import pickle
    x = T.dmatrix("x")
    sp = fft.rfft(x, norm="ortho")
    outs = [sp, fft.irfft(sp, norm="ortho"), T.grad((sp ** 2).sum(), x)]
    v = RNG.rand(3, 6)
    f = function([x], outs)
    for got, want in zip(pickle.loads(pickle.dumps(f))(v), f(v)):
        np.testing.assert_array_equal(got, want)
    x2, outs2 = pickle.loads(pickle.dumps((x, outs)))
    for got, want in zip(function([x2], outs2)(v), f(v)):
        np.testing.assert_array_equal(got, want)
