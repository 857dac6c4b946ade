"""nnet.gelu: GELU as jax.nn.gelu / torch.nn.functional.gelu take it (the tanh form, the
default, and the exact erf form), against NumPy and SciPy's erf, its gradient by
verify_grad, the dtype kept, and the tanh form folding into the products' epilogues on a
virtual GPU (gpu/ops/gelu_epilogue_rewrite.py) where the erf form stays elementwise."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.special import erf

import symgpu.tensor as T
from symgpu import config, function, shared
from symgpu.gpu.ops.gemm_epilogue import GpuGemmEpilogue
from symgpu.gradient_check import verify_grad
from symgpu.tensor import nnet

XV = np.array([-30.0, -5.0, -1.5, -0.3, -1e-9, 0.0, 0.7, 2.0, 9.0])


def _tanh_form(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("approximate", ["tanh", True])
def test_the_tanh_form(approximate):
    x = T.dvector()
    got = function([x], nnet.gelu(x, approximate))(XV)
    np.testing.assert_allclose(got, _tanh_form(XV), rtol=1e-14, atol=1e-300)


@pytest.mark.parametrize("approximate", ["none", False])
def test_the_erf_form(approximate):
    x = T.dvector()
    got = function([x], nnet.gelu(x, approximate))(XV)
    np.testing.assert_allclose(got, 0.5 * XV * (1 + erf(XV / np.sqrt(2))), rtol=1e-14,
                               atol=1e-300)


def test_the_default_is_the_tanh_form_and_forms_differ():
    x = T.dvector()
    default, exact = function([x], [nnet.gelu(x), nnet.gelu(x, "none")])(XV)
    np.testing.assert_allclose(default, _tanh_form(XV), rtol=1e-14)
    assert np.abs(default - exact).max() > 1e-4


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gradient(approximate):
    verify_grad(lambda x: nnet.gelu(x, approximate), [np.array([-2.5, -0.3, 0.4, 1.5, 3.0])])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_the_dtype_is_kept(dtype):
    x = T.TensorType(dtype, (False,))()
    for form in ("tanh", "none"):
        assert nnet.gelu(x, form).dtype == dtype


def test_integers_become_floats():
    assert nnet.gelu(T.ivector()).dtype == "float64"


def test_an_unknown_form_is_refused():
    with pytest.raises(ValueError, match="gelu: approximate must be 'tanh', 'none'"):
        nnet.gelu(T.dvector(), "erf")


def _mlp_epilogues(approximate):
    x, y = T.matrix("x"), T.matrix("y")
    rng = np.random.default_rng(0)
    W1 = shared(rng.standard_normal((6, 16)).astype("float32"), name="W1")
    b1 = shared(np.zeros(16, "float32"), name="b1")
    W2 = shared(rng.standard_normal((16, 4)).astype("float32"), name="W2")
    loss = T.mean(T.sqr(T.dot(nnet.gelu(T.dot(x, W1) + b1, approximate), W2) - y))
    with config.change_flags(mixed_precision="bfloat16"):
        f = function([x, y], T.grad(loss, [W1, b1, W2]))
    return sorted(n.op.epilogue for n in f.maker.fgraph.toposort()
                  if type(n.op) is GpuGemmEpilogue)


def test_the_tanh_form_runs_in_the_products_epilogues(vgpu):
    assert _mlp_epilogues("tanh") == ["dgelu", "gelu_aux_bias"]


def test_the_erf_form_stays_elementwise(vgpu):
    assert not any("gelu" in e for e in _mlp_epilogues("none"))
