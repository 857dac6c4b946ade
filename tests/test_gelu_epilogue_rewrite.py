"""A layer's GELU and its gradient inside the products that feed them (gpu/ops/
gelu_epilogue_rewrite.py): ``gelu(dot(x, W) + b)`` -> GpuGemmEpilogue{gelu_aux_bias} and, in
the gradient, ``g * gelu'(z)`` of a product g -> GpuGemmEpilogue{dgelu} reading the aux.

Recognised by evaluating the elementwise region (gpu/ops/elemwise_region.py), so the
spellings users write fold alike and other functions (GELU's erf form, a wrong constant) do
not.  On the CPU: the rewritten graphs (vgpu).  On a GPU (``pytest -m gpu``): a bf16
mixed-precision MLP's loss and gradients against the same step with the pass excluded.
"""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import requires_gpu
from symgpu import config, function, shared
from symgpu.gpu.ops.blas import GpuDot22
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.ops.elemwise_region import region
from symgpu.gpu.ops.gelu_epilogue_rewrite import gelu_tanh, gelu_tanh_grad
from symgpu.gpu.ops.gemm_epilogue import GpuGemmEpilogue
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.scalar.basic import SCALAR_OPS

K0, K1 = np.float32(np.sqrt(2 / np.pi)), np.float32(0.044715)

SPELLINGS = {
    "0.5 a (1 + tanh)": lambda a: 0.5 * a * (1 + T.tanh(K0 * (a + K1 * a ** 3))),
    "a * a * a": lambda a: 0.5 * a * (1 + T.tanh(K0 * (a + K1 * a * a * a))),
    "distributed": lambda a: 0.5 * a + 0.5 * a * T.tanh(K0 * a + K0 * K1 * a ** 3),
    "sigmoid": lambda a: a * T.nnet.sigmoid(np.float32(2) * K0 * (a + K1 * a ** 3)),
}
OTHERS = {
    "erf form": lambda a: 0.5 * a * (1 + T.erf(a / np.float32(np.sqrt(2)))),
    "another constant": lambda a: 0.5 * a * (1 + T.tanh(K0 * (a + np.float32(0.0447) * a ** 3))),
    "tanh(a)": lambda a: 0.5 * a * (1 + T.tanh(a)),
}


def _epilogues(f) -> list[str]:
    return sorted(n.op.epilogue for n in f.maker.fgraph.toposort()
                  if type(n.op) is GpuGemmEpilogue)


def _has_tanh(f) -> bool:
    return any("tanh" in str(n.op) or "sigmoid" in str(n.op)
               for n in f.maker.fgraph.toposort())


def _mlp(gelu, nd=2, sizes=(6, 8, 16, 4)):
    """(x, y, params, loss) of ``dot(gelu(dot(x, W1) + b1), W2) + b2`` against y."""
    batch, d_in, hidden, d_out = sizes
    rng = np.random.default_rng(0)
    x = T.matrix("x") if nd == 2 else T.tensor3("x")
    y = T.matrix("y") if nd == 2 else T.tensor3("y")
    W1 = shared(rng.standard_normal((d_in, hidden)).astype("float32") * 0.5, name="W1")
    b1 = shared(rng.standard_normal(hidden).astype("float32") * 0.5, name="b1")
    W2 = shared(rng.standard_normal((hidden, d_out)).astype("float32") * 0.3, name="W2")
    b2 = shared(np.zeros(d_out, "float32"), name="b2")
    out = T.dot(gelu(T.dot(x, W1) + b1), W2) + b2
    loss = T.mean(T.sqr(out - y))
    return x, y, [W1, b1, W2, b2], loss


def _train_fn(gelu, nd=2, **flags):
    x, y, params, loss = _mlp(gelu, nd)
    grads = T.grad(loss, params)
    with config.change_flags(**flags):
        return function([x, y], [loss] + grads)


# ============================================================================ the evaluator

def test_a_region_evaluates_as_its_graph_computes(vgpu):
    a = GpuArrayType("float32", (False,), None)()
    mul, tanh = (GpuElemwise(SCALAR_OPS[k]) for k in ("mul", "tanh"))
    r = mul(a, tanh(mul(a, a)))
    reg = region(r)
    assert reg.leaves == [a] and len(reg.nodes) == 3
    z = np.linspace(-2, 2, 9).astype("float32")
    (got,) = reg.evaluate({a: z})
    np.testing.assert_allclose(got, z * np.tanh(z * z), rtol=1e-6)
    assert reg.depends_on(r, a)
    sq = r.owner.inputs[1].owner.inputs[0]              # a * a
    assert reg.depends_on(r, a, besides=sq), "r also reads a directly"
    t = r.owner.inputs[1]
    assert not reg.depends_on(t, a, besides=sq), "tanh(a * a) reads a only through a * a"


def test_the_reference_derivative_is_gelus():
    z = np.linspace(-5, 5, 101)
    h = 1e-6
    np.testing.assert_allclose(gelu_tanh_grad(z), (gelu_tanh(z + h) - gelu_tanh(z - h)) / (2 * h),
                               rtol=1e-6, atol=1e-9)


# ============================================================================ the rewrite

@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_spellings_of_gelu_fold_forward_and_backward(vgpu, spelling, dtype):
    f = _train_fn(SPELLINGS[spelling], mixed_precision=dtype)
    assert _epilogues(f) == ["dgelu", "gelu_aux_bias"], _epilogues(f)
    assert not _has_tanh(f), "the GELU and its derivative live in the epilogues"
    (fwd,) = [n for n in f.maker.fgraph.toposort()
              if type(n.op) is GpuGemmEpilogue and n.op.epilogue == "gelu_aux_bias"]
    assert fwd.inputs[2].dtype == dtype, "the float32 bias rounded to the product's dtype"


@pytest.mark.parametrize("other", sorted(OTHERS))
def test_other_functions_are_left_alone(vgpu, other):
    f = _train_fn(OTHERS[other], mixed_precision="bfloat16")
    assert "gelu_aux_bias" not in _epilogues(f) and "dgelu" not in _epilogues(f)


def test_a_3d_activation_folds_through_its_reshapes(vgpu):
    """The GPT block's MLP: (batch, sequence, features) activations."""
    f = _train_fn(SPELLINGS["0.5 a (1 + tanh)"], nd=3, mixed_precision="bfloat16")
    assert _epilogues(f) == ["dgelu", "gelu_aux_bias"]
    assert not _has_tanh(f)


def test_inference_folds_the_forward(vgpu):
    x, y, params, loss = _mlp(SPELLINGS["0.5 a (1 + tanh)"])
    with config.change_flags(mixed_precision="bfloat16"):
        f = function([x, y], loss)
    assert _epilogues(f) == ["gelu_bias"], "no gradient reads the pre-activation: no aux"
    assert not _has_tanh(f)


def test_a_product_read_elsewhere_is_left_alone(vgpu):
    """The pre-activation's product also returned: it must still be written."""
    x, y, params, loss = _mlp(SPELLINGS["0.5 a (1 + tanh)"])
    W1 = params[0]
    with config.change_flags(mixed_precision="bfloat16"):
        f = function([x, y], [loss, T.dot(x, W1).sum()])
    assert not any("gelu" in e for e in _epilogues(f))


def test_float32_folds_only_when_the_flag_says_all(vgpu):
    gelu = SPELLINGS["0.5 a (1 + tanh)"]
    assert not any("gelu" in e for e in _epilogues(_train_fn(gelu)))
    f = _train_fn(gelu, **{"gpuarray.gemm_epilogue": "all"})
    assert _epilogues(f) == ["bias", "dgelu", "gelu_aux_bias"], "the output layer's bias too"
    assert not _has_tanh(f)


def test_excluding_the_pass_keeps_the_elementwise_gelu(vgpu):
    f = _train_fn(SPELLINGS["0.5 a (1 + tanh)"], mixed_precision="bfloat16",
                  optimizer_excluding="gpu_gelu_epilogue")
    assert not any("gelu" in e for e in _epilogues(f))
    assert _has_tanh(f)
    assert [n for n in f.maker.fgraph.toposort() if type(n.op) is GpuDot22]


# ============================================================================ on a GPU

@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("nd", [2, 3])
def test_values_and_gradients_against_the_elementwise_gelu(cuda, nd):
    """bf16 mixed precision: the epilogues' loss and gradients against the same step with
    the pass excluded (which rounds the product before the bias, the epilogue the sum):
    within bf16's resolution of the values involved."""
    sizes = (64, 48, 256, 32)
    gelu = SPELLINGS["0.5 a (1 + tanh)"]
    rng = np.random.default_rng(1)
    shape_x = (sizes[0], sizes[1]) if nd == 2 else (4, sizes[0] // 4, sizes[1])
    shape_y = shape_x[:-1] + (sizes[3],)
    xv = rng.standard_normal(shape_x).astype("float32")
    yv = rng.standard_normal(shape_y).astype("float32")
    got = {}
    for name, flags in (("fused", {}), ("apart", {"optimizer_excluding": "gpu_gelu_epilogue"})):
        x, y, params, loss = _mlp(gelu, nd, sizes)
        with config.change_flags(mixed_precision="bfloat16", **flags):
            f = function([x, y], [loss] + T.grad(loss, params))
        eps = _epilogues(f)
        if name == "fused":
            assert eps == ["dgelu", "gelu_aux_bias"], eps
            assert not cuda.virtual, "the product ran on the GPU"
        got[name] = [np.asarray(v, "float32") for v in f(xv, yv)]
    for a, b in zip(got["fused"], got["apart"]):
        scale = float(np.abs(b).max()) or 1.0
        np.testing.assert_allclose(a, b, rtol=0, atol=0.02 * scale)


def test_the_gpt_blocks_step_stays_one_captured_segment(vgpu, gpt_step):
    """benchmarks/half_symgpu.py's GPT block: its MLP's GELU and gradient in the epilogues,
    and no host node between them reading a GPU value's shape (the first version reshaped
    aux to the product's shape, read mid-step: on the H200 the step split in two graphs
    with 11 strided copies staging the second's inputs, 2.0 ms a step against 1.17)."""
    from gpu_helpers import assert_one_segment
    f = gpt_step()
    assert _epilogues(f) == ["bias", "dgelu", "gelu_aux_bias"]
    assert not _has_tanh(f)
    assert_one_segment(f.maker.fgraph.toposort())
