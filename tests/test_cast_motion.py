"""Cast motion (symgpu/tensor/rewriting/cast_motion.py): under a mixed-precision policy the
casts around products move through reshapes, head splits, joins and region writes into
zeros, so they fuse into elementwise kernels or cancel, and the results are bit for bit
those of the graph without the motion (every rule is exact)."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import Mode, function
from symgpu.graph.rewriting import settings
from symgpu.mixed_precision import autocast
from symgpu.scalar.basic import Cast
from symgpu.tensor.basic import Join, Reshape
from symgpu.tensor.elemwise import DimShuffle, Elemwise
from symgpu.tensor.rewriting.cast_motion import (local_cast_round_trip,
                                                  local_float_cast_down_inc_zeros)
from symgpu.tensor.subtensor import IncSubtensor, Subtensor


@pytest.fixture(autouse=True)
def rewrites_raise(monkeypatch):
    monkeypatch.setattr(settings, "on_error", "raise")


def _lone_casts(f):
    return [n for n in f.maker.fgraph.toposort()
            if type(n.op) is Elemwise and isinstance(n.op.scalar_op, Cast)]


def _root(var):
    """The variable a chain of views starts from."""
    while var.owner is not None and type(var.owner.op) in (Reshape, DimShuffle, Subtensor):
        var = var.owner.inputs[0]
    return var


def _block(rng, B=2, S=6, D=8, H=2):
    """A pre-activation transformer-style block on (B, S, D) data: a fused qkv product cut
    into heads (reshape, column slices, transposes), scores, an MLP with tanh, the loss and
    its gradients (the backward pass joins the three head gradients)."""
    x = T.ftensor3("x")

    def w(a, b):
        return symgpu.shared((rng.standard_normal((a, b)) * 0.3).astype("float32"))
    wqkv, wo, w1 = w(D, 3 * D), w(D, D), w(D, 2 * D)
    b1 = symgpu.shared(np.zeros(2 * D, "float32"))
    qkv = T.dot(x, wqkv)
    hd = D // H

    def heads(t):
        return t.reshape((B, S, H, hd)).dimshuffle(0, 2, 1, 3)
    q, k, v = (heads(qkv[:, :, j * D:(j + 1) * D]) for j in range(3))
    p = T.nnet.softmax(T.matmul(q, k.dimshuffle(0, 1, 3, 2)) * np.float32(0.5), axis=-1)
    o = T.matmul(p, v).dimshuffle(0, 2, 1, 3).reshape((B, S, D))
    h = x + T.dot(o, wo)
    m = T.tanh(T.dot(h, w1) + b1)
    loss = T.mean(T.sqr(m))
    params = [wqkv, wo, w1, b1]
    return x, loss, params, T.grad(loss, params)


def _step(half, seed, **kw):
    """A training step (SGD) of the block under the `half` policy: (f, params)."""
    x, loss, params, grads = _block(np.random.default_rng(seed))
    with autocast(half):
        f = function([x], loss, updates=[(p, p - np.float32(0.1) * g)
                                         for p, g in zip(params, grads)], **kw)
    return f, params


def test_only_the_weights_and_the_data_keep_lone_casts():
    f, _ = _step("bfloat16", 0)
    for n in _lone_casts(f):
        src = _root(n.inputs[0])
        assert src.owner is None, (n, src.owner)       # a shared weight or the input
    g, _ = _step("bfloat16", 0, mode=Mode().excluding("cast_motion"))
    assert len(_lone_casts(g)) > len(_lone_casts(f)) + 4


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_the_results_are_bit_for_bit_those_without_motion(half):
    data = np.random.default_rng(2).standard_normal((2, 6, 8)).astype("float32")
    f, moved = _step(half, 1)
    g, kept = _step(half, 1, mode=Mode().excluding("cast_motion"))
    for _ in range(2):
        np.testing.assert_array_equal(f(data), g(data))
    for a, b in zip(moved, kept):
        np.testing.assert_array_equal(a.get_value(), b.get_value())


def test_a_half_products_cast_moves_down_through_a_reshape_into_the_bias_add():
    x, w = T.ftensor3("x"), T.fmatrix("w")
    b = T.fvector("b")
    y = T.tanh(T.dot(x, w) + b)            # dot of a 3-d x: reshape, product, reshape back
    with autocast("bfloat16"):
        f = function([x, w, b], y)
    fg = f.maker.fgraph
    for n in fg.toposort():
        if type(n.op) is Reshape and n.inputs[0].owner is not None and \
                n.inputs[0].owner.op.__class__.__name__ in ("Dot", "Dot22"):
            assert n.outputs[0].dtype == "bfloat16"     # the product's half output reshaped
    assert not any(n.inputs[0].dtype == "bfloat16" and n.inputs[0].owner is not None
                   and n.inputs[0].owner.op.__class__.__name__ in ("Dot", "Dot22")
                   for n in _lone_casts(f))
    rng = np.random.default_rng(3)
    args = (rng.standard_normal((2, 3, 4)).astype("float32"),
            rng.standard_normal((4, 5)).astype("float32"), np.ones(5, "float32"))
    want = np.tanh(args[0] @ args[1] + args[2])
    np.testing.assert_allclose(f(*args), want, rtol=3e-2, atol=3e-2)


def test_a_join_of_cast_products_is_one_cast_of_the_join():
    a, b, c, d = (T.fmatrix(n) for n in "abcd")
    j = T.concatenate([T.dot(a, b), T.dot(c, d)], axis=1)
    y = T.dot(j, T.fmatrix("e"))             # the join read by another product
    with autocast("bfloat16"):
        f = function([a, b, c, d, y.owner.inputs[1]], y)
    joins = [n for n in f.maker.fgraph.toposort() if type(n.op) is Join]
    assert joins and all(n.outputs[0].dtype == "bfloat16" for n in joins)
    # the join's half values reach the next product without a round trip through float32
    assert not [n for n in _lone_casts(f) if n.inputs[0].owner is not None
                and type(n.inputs[0].owner.op) is Join]


def test_the_round_trip_and_the_zeros_rules_on_their_own():
    h = T.tensor("bfloat16", (False, False), "h")
    back = T.cast(T.cast(h, "float32"), "bfloat16")
    assert local_cast_round_trip.transform(None, back.owner) == [h]
    z = T.zeros((4, 6), "float32")
    y = T.inc_subtensor(z[:, 2:5], T.cast(h, "float32"))
    fg = symgpu.graph.fg.FunctionGraph([h], [y], clone=False)
    out = local_float_cast_down_inc_zeros.transform(fg, y.owner)
    assert out and out[0].owner.inputs[0].owner is not None
    inner = out[0].owner.inputs[0].owner
    assert type(inner.op) is IncSubtensor and inner.outputs[0].dtype == "bfloat16"
    f = function([h], out[0])
    data = np.arange(12, dtype="float32").reshape(4, 3).astype("bfloat16")
    want = np.zeros((4, 6), "float32")
    want[:, 2:5] = data.astype("float32")
    np.testing.assert_array_equal(f(data), want)
