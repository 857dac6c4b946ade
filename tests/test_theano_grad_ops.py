"""Theano's theano.gradient names added for issue 31: grad_clip, grad_scale, undefined_grad,
subgraph_grad, format_as; checked against NumPy and against plain `grad`."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import gradient as G


def test_grad_clip_clips_the_gradient_only():
    x = T.dvector("x")
    y = G.grad_clip(x, -1.0, 2.0)
    g = G.grad(T.sum((3 * y) ** 2), x)      # d/dy = 18 y, clipped, then times 1
    f = symgpu.function([x], [y, g])
    v = np.array([-1.0, 0.01, 0.05, 1.0])
    out, grad = f(v)
    np.testing.assert_allclose(out, v)
    np.testing.assert_allclose(grad, np.clip(18 * v, -1.0, 2.0) * 1)
    assert not any(isinstance(n.op, G.GradClip) for n in f.maker.fgraph.apply_nodes)
    with pytest.raises(ValueError, match="upper bound"):
        G.grad_clip(x, 1.0, -1.0)


def test_grad_scale_scales_the_gradient():
    x = T.dvector("x")
    g = G.grad(T.sum(G.grad_scale(x, 0.5) ** 2), x)
    v = np.array([1.0, -2.0])
    np.testing.assert_allclose(symgpu.function([x], g)(v), 0.5 * 2 * v)
    np.testing.assert_allclose(symgpu.function([x], G.grad_scale(x, 3) * 2)(v), 2 * v)


def test_undefined_grad_raises_through_grad():
    x = T.dvector("x")
    y = G.undefined_grad(x)
    np.testing.assert_allclose(symgpu.function([x], y + 1)(np.ones(2)), 2 * np.ones(2))
    with pytest.raises(G.NullTypeGradError):
        G.grad(T.sum(y ** 2), x)


def test_subgraph_grad_chains_to_the_full_gradient():
    x = T.dvector("x")
    w1, w2 = T.dvector("w1"), T.dvector("w2")
    h = T.tanh(x * w1)
    cost = T.sum((h * w2) ** 2)
    # block 2: from the cost to h; block 1: from h's gradient to x
    (g_w2,), (g_h,) = G.subgraph_grad([w2], [h], cost=cost)
    (g_w1,), (g_x,) = G.subgraph_grad([w1], [x], start={h: g_h})
    full = G.grad(cost, [w1, w2, x])
    f = symgpu.function([x, w1, w2], [g_w1, g_w2, g_x] + full)
    rng = np.random.default_rng(0)
    vals = f(*(rng.standard_normal(3) for _ in range(3)))
    for a, b in zip(vals[:3], vals[3:]):
        np.testing.assert_allclose(a, b)
    wrt, end, from_start, from_cost = G.subgraph_grad([w1], [x], start={h: g_h}, cost=T.sum(x),
                                                      details=True)
    assert from_start is not None and len(from_cost) == 2
    with pytest.raises(ValueError, match="cost, start"):
        G.subgraph_grad([w1], [x])


def test_format_as():
    assert G.format_as(True, False, 1) == [1] and G.format_as(False, True, [1, 2]) == (1, 2)
    assert G.format_as(False, False, [7]) == 7 and G.format_as(False, False, 7) == 7
    assert G.format_as(True, False, (1, 2)) == [1, 2]
    with pytest.raises(ValueError):
        G.format_as(True, True, 1)
    with pytest.raises(ValueError):
        G.format_as(False, False, [1, 2])
