"""The attention gradient written into the join its gradients feed
(symgpu/gpu/ops/attention_join.py): q, k and v sliced from one product, so the product's
gradient joins dq, dk and dv with their heads merged, plus zeros for the rest of it.

On a virtual GPU: the rewritten graphs (the join and its copies gone; spellings that do not
fit keep the join). On a GPU (``gpu``): the values against the same function compiled
without the pass, and the node's own fallback when the reshapes do not merge the heads."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import Mode, function
from symgpu.gpu.ops.attention_join import GpuAttentionGradJoin
from symgpu.tensor.nnet import scaled_dot_product_attention as sdpa
from symgpu.tensor.shared_randomstreams import RandomStreams

H, HD = 2, 8
D = H * HD


def _heads(t):
    return t.reshape((t.shape[0], t.shape[1], H, HD)).dimshuffle(0, 2, 1, 3)


def _block(order=(0, 1, 2), dtype="float32", dropout=0.0):
    """x -> qkv = x w -> causal attention over heads -> merged heads -> sum of squares; the
    gradient of w (the join of the three slices' gradients). ``order``: which slice is q, k
    and v; ``dropout``: on the probabilities (a RandomStreams draw)."""
    x = T.tensor3("x", dtype=dtype)
    w = T.matrix("w", dtype=dtype)
    qkv = T.dot(x, w)
    parts = [_heads(qkv[:, :, j * D:(j + 1) * D]) for j in range(3)]
    q, k, v = (parts[i] for i in order)
    if dropout:
        o = sdpa(q, k, v, is_causal=True, dropout_p=dropout, rng=RandomStreams(1))
    else:
        o = sdpa(q, k, v, is_causal=True)
    y = o.dimshuffle(0, 2, 1, 3).reshape((o.shape[0], o.shape[2], D))
    cost = T.sum(T.sqr(y))
    return [x, w], [cost, T.grad(cost, w)], q


def _names(f):
    return [type(n.op).__name__ for n in f.maker.fgraph.toposort()]


def test_the_slices_gradient_is_written_in_place_of_the_join(vgpu):
    ins, outs, _ = _block()
    f = function(ins, outs)
    names = _names(f)
    assert "GpuAttentionGradJoin" in names
    assert "GpuJoin" not in names and "GpuAttentionGrad" not in names
    (node,) = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, GpuAttentionGradJoin)]
    assert (node.op.before, node.op.after) == (0, 1)      # the zeros for qkv[:, :, 3D:]
    without = function(ins, outs, mode=Mode().excluding("gpu_attention_grad_join"))
    assert "GpuJoin" in _names(without) and "GpuAttentionGradJoin" not in _names(without)


def test_the_join_carries_a_dropout_and_its_generator_state(vgpu):
    """With dropout the joined gradient keeps the op's dropout and reads the same state as
    the forward (the kernels redraw the forward's uniforms)."""
    ins, outs, _ = _block(dropout=0.2)
    f = function(ins, outs)
    nodes = {type(n.op).__name__: n for n in f.maker.fgraph.toposort()}
    join, fwd = nodes["GpuAttentionGradJoin"], nodes["GpuAttention"]
    assert join.op.dropout == fwd.op.dropout and join.op.dropout.keep == pytest.approx(0.8)
    assert join.inputs[3] is fwd.inputs[3] and join.inputs[3].dtype == "uint32"


def test_gradients_joined_in_another_order_keep_the_join(vgpu):
    ins, outs, _ = _block(order=(1, 0, 2))       # k is the first slice: the join reads dk, dq, dv
    names = _names(function(ins, outs))
    assert "GpuJoin" in names and "GpuAttentionGrad" in names
    assert "GpuAttentionGradJoin" not in names


def test_a_gradient_read_elsewhere_keeps_the_join(vgpu):
    ins, (cost, gw), q = _block()
    dq = T.grad(cost, q)                       # dq is also an output of its own
    names = _names(function(ins, [gw, dq]))
    assert "GpuAttentionGradJoin" not in names and "GpuAttentionGrad" in names


def test_the_op_checks_its_inputs(vgpu):
    from symgpu.gpu.placement.type import GpuArrayType
    g4 = [GpuArrayType("float32", (False,) * 4, None)() for _ in range(6)]
    g4[4] = GpuArrayType("float32", (False,) * 3, None)()      # lse
    shp = [T.lvector() for _ in range(3)]
    with pytest.raises(TypeError, match="takes 10 inputs"):
        GpuAttentionGradJoin(after=1)(*g4, *shp)
    with pytest.raises(TypeError, match="int vectors"):
        GpuAttentionGradJoin()(*g4, *shp[:2], T.fvector())
    with pytest.raises(TypeError, match="3-d float32"):
        GpuAttentionGradJoin(after=1)(*g4, *shp, GpuArrayType("float32", (False,) * 2, None)())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_values_equal_the_join_of_the_gradients(cuda, dtype):
    from symgpu.gpu.placement.type import gpu_supports_dtype
    if not gpu_supports_dtype(dtype):
        pytest.skip(f"GPU placement does not take {dtype}")
    ins, outs, _ = _block(dtype=dtype)
    f = function(ins, outs)
    assert "GpuAttentionGradJoin" in _names(f)
    ref = function(ins, outs, mode=Mode().excluding("gpu_attention_grad_join"))
    assert "GpuJoin" in _names(ref)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 37, 16)).astype(dtype)
    w = (rng.standard_normal((16, 3 * D)) * 0.3).astype(dtype)
    got, want = f(x, w), ref(x, w)
    for a, b in zip(got, want):
        a, b = np.asarray(a, "float64"), np.asarray(b, "float64")
        assert a.shape == b.shape
        # the same kernels, one dq summed with float atomics in another order
        np.testing.assert_allclose(a, b, rtol=2e-2 if dtype == "bfloat16" else 1e-5,
                                   atol=1e-2 if dtype == "bfloat16" else 1e-5)


@pytest.mark.gpu
def test_reshapes_that_do_not_merge_the_heads_take_the_fallback(cuda):
    """The node built by hand with target shapes that split rows differently: it reshapes and
    joins as the graph says (equal to NumPy on the host op's gradients)."""
    from symgpu.gpu.placement.basic_ops import gpu_from_host
    from symgpu.tensor.nnet.attention import AttentionGrad, attention_reference
    B, S = 1, 6
    rng = np.random.default_rng(4)
    vals = [rng.standard_normal((B, H, S, HD)).astype("float32") for _ in range(4)]
    o, lse = attention_reference(*[v.astype("float64") for v in vals[:3]], None, None, True)
    vals = vals[:3] + [o.astype("float32"), lse.astype("float32"), vals[3]]
    hosts = [T.tensor(dtype="float32", shape=(None,) * v.ndim) for v in vals]
    target = T.as_tensor_variable(np.array([B, S * H // 2, 2 * HD], "int64"))
    node = GpuAttentionGradJoin()(*[gpu_from_host(h) for h in hosts], target, target, target)
    f = function(hosts, node)
    got = np.asarray(f(*vals))
    grads = function(hosts, AttentionGrad()(*hosts))(*vals)
    want = np.concatenate([np.asarray(g).transpose(0, 2, 1, 3).reshape(B, S * H // 2, 2 * HD)
                           for g in grads], axis=2)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert symgpu.config.device.startswith("cuda")
