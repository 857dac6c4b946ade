"""symgpu.tensor.signal.pool.pool_3d (Theano's pool_3d) against a direct loop over windows
written here (every combination of window, stride, padding, ignore_border and mode), its
gradients by verify_grad (each mode), second derivatives, infer_shape and the errors."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.gradient import verify_grad
from symgpu.graph.basic import io_toposort
from symgpu.tensor.signal.pool import (AveragePoolGrad3d, MaxPoolGrad3d, MaxPoolGradGrad3d,
                                       Pool, Pool3d, pool_2d, pool_3d, pool_output_shape)

RNG = np.random.default_rng(13)
MODES = ("max", "sum", "average_inc_pad", "average_exc_pad")
COMBOS = [c for c in itertools.product([(2, 2, 2), (3, 2, 1), (1, 3, 2)],
                                       [None, (1, 1, 1), (2, 3, 1), (3, 1, 2)],
                                       [(0, 0, 0), (1, 1, 0), (0, 1, 1)], [True, False], MODES)
          if (c[2] == (0, 0, 0) or c[3]) and all(p < w for p, w in zip(c[2], c[0]))]


def _out_len(v, ws, st, pad, ignore_border):
    """Theano's Pool.out_shape for one axis."""
    if ignore_border:
        return max((v + 2 * pad - ws) // st + 1, 0)
    if st >= ws:
        return (v - 1) // st + 1
    return max(0, (v - 1 - ws + st) // st) + 1


def ref_pool3d(x, ws, ignore_border=True, stride=None, pad=(0, 0, 0), mode="max"):
    """Theano's Pool.perform, one window at a time: the window is cut at the padded input's
    end; 'max', 'sum' and 'average_exc_pad' see only the real elements, 'average_inc_pad'
    divides by the window's size within the padded input."""
    st = stride or ws
    sp = x.shape[-3:]
    outs = [_out_len(sp[a], ws[a], st[a], pad[a], ignore_border) for a in range(3)]
    padded = [sp[a] + 2 * pad[a] for a in range(3)]
    xp = np.zeros(x.shape[:-3] + tuple(padded), dtype=x.dtype)
    xp[..., pad[0]:pad[0] + sp[0], pad[1]:pad[1] + sp[1], pad[2]:pad[2] + sp[2]] = x
    out = np.zeros(x.shape[:-3] + tuple(outs), dtype=x.dtype)
    for pos in np.ndindex(*outs):
        lo = [pos[a] * st[a] for a in range(3)]
        hi = [min(lo[a] + ws[a], padded[a]) for a in range(3)]
        if mode != "average_inc_pad":
            lo = [max(lo[a], pad[a]) for a in range(3)]
            hi = [min(hi[a], pad[a] + sp[a]) for a in range(3)]
        win = xp[..., lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]].reshape(x.shape[:-3] + (-1,))
        if mode == "max":
            out[(...,) + pos] = win.max(axis=-1)
        elif mode == "sum":
            out[(...,) + pos] = win.sum(axis=-1)
        else:
            out[(...,) + pos] = win.mean(axis=-1)
    return out


def test_reference_loop_on_a_hand_computed_case():
    x = np.arange(27.0).reshape(3, 3, 3)
    np.testing.assert_array_equal(ref_pool3d(x, (2, 2, 2)), [[[13.0]]])
    np.testing.assert_array_equal(ref_pool3d(x, (2, 2, 2), False)[:, :, :].ravel()[-1], 26.0)
    # padded corner window: 'inc_pad' divides by 8, 'exc_pad' by the single real element
    np.testing.assert_array_equal(ref_pool3d(x, (2, 2, 2), pad=(1, 1, 1),
                                             mode="average_inc_pad")[0, 0, 0], 0.0)
    assert ref_pool3d(x + 1, (2, 2, 2), pad=(1, 1, 1), mode="average_inc_pad")[0, 0, 0] == 1 / 8
    assert ref_pool3d(x + 1, (2, 2, 2), pad=(1, 1, 1), mode="average_exc_pad")[0, 0, 0] == 1


@pytest.mark.parametrize("ws,stride,pad,ignore_border,mode", COMBOS)
def test_pool_3d_matches_theano_loop(ws, stride, pad, ignore_border, mode):
    x = T.dtensor5("x")
    gz = T.dtensor5("gz")
    y = pool_3d(x, ws, ignore_border=ignore_border, stride=stride, pad=pad, mode=mode)
    gx = symgpu.grad((y * gz).sum(), x)
    f = function([x, gz], [y, gx])
    xv = RNG.normal(size=(2, 2, 5, 6, 4))
    ref = ref_pool3d(xv, ws, ignore_border, stride, pad, mode)
    gzv = RNG.normal(size=ref.shape)
    out, gxv = f(xv, gzv)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    assert out.shape == pool_output_shape(xv.shape, ws, ignore_border, stride, pad)
    if mode != "max":  # linear: the gradient is the adjoint
        np.testing.assert_allclose((xv * gxv).sum(), (ref * gzv).sum(), rtol=1e-10)
    else:  # each window's gradient lands on its (unique) maximum
        st = stride or ws
        expect = np.zeros_like(xv)
        for pos in np.ndindex(*ref.shape[2:]):
            for lead in np.ndindex(*xv.shape[:2]):
                lo = [max(pos[a] * st[a] - pad[a], 0) for a in range(3)]
                hi = [min(pos[a] * st[a] - pad[a] + ws[a], xv.shape[2 + a]) for a in range(3)]
                region = xv[lead][lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]]
                k = np.unravel_index(np.argmax(region), region.shape)
                expect[lead + tuple(lo[a] + k[a] for a in range(3))] += gzv[lead + pos]
        np.testing.assert_allclose(gxv, expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kw", [dict(ws=(2, 2, 2)),
                                dict(ws=(3, 2, 2), stride=(2, 1, 1), ignore_border=False),
                                dict(ws=(3, 2, 3), stride=(2, 2, 1), pad=(1, 1, 2))])
def test_verify_grad(mode, kw):
    # distinct values far apart: finite differences never change which element is the max
    x = RNG.permutation(2 * 4 * 5 * 3).reshape(2, 4, 5, 3) * 0.1
    verify_grad(lambda a: pool_3d(a, mode=mode, **kw), [x], rng=np.random.default_rng(0))


@pytest.mark.parametrize("mode", ["max", "average_exc_pad", "sum"])
def test_second_derivative(mode):
    x = RNG.permutation(60).reshape(1, 3, 5, 4) * 0.1

    def g_of(a):
        return symgpu.grad((pool_3d(a, (2, 3, 2), stride=(1, 2, 1), mode=mode) ** 2).sum(), a)
    verify_grad(g_of, [x], rng=np.random.default_rng(0))
    if mode == "max":
        a = T.dtensor4()
        ops = {type(n.op) for n in io_toposort([a], [symgpu.grad(g_of(a).sum(), a)])}
        assert MaxPoolGradGrad3d in ops and Pool not in ops


def test_max_ties_follow_theano():
    """Theano's MaxPoolGrad gives a window's gradient to every element equal to its max."""
    x = T.dtensor3()
    g = symgpu.grad(pool_3d(x, (2, 2, 2)).sum(), x)
    xv = np.zeros((2, 2, 2))
    xv[0, 0, 0] = xv[1, 1, 0] = 1.0
    np.testing.assert_array_equal(function([x], g)(xv), xv)


@pytest.mark.parametrize("shape", [(4, 5, 3), (2, 4, 5, 3), (2, 1, 2, 4, 5, 3)])
def test_any_rank_of_three_or_more(shape):
    x = T.tensor(dtype="float64", shape=(None,) * len(shape))
    xv = RNG.normal(size=shape)
    out = function([x], pool_3d(x, (2, 3, 2), ignore_border=False))(xv)
    np.testing.assert_allclose(out, ref_pool3d(xv, (2, 3, 2), False))


def test_float32_and_int():
    x = T.ftensor5()
    xv = RNG.normal(size=(1, 2, 4, 4, 4)).astype("float32")
    out = function([x], pool_3d(x, (2, 2, 2), mode="average_inc_pad"))(xv)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref_pool3d(xv, (2, 2, 2), mode="average_inc_pad"),
                               rtol=1e-6)
    i = T.itensor5()
    iv = RNG.integers(-50, 50, size=(1, 1, 4, 5, 3)).astype("int32")
    np.testing.assert_array_equal(function([i], pool_3d(i, (2, 2, 2), ignore_border=False))(iv),
                                  ref_pool3d(iv, (2, 2, 2), False))


def test_window_larger_than_input():
    x = T.dtensor5()
    xv = RNG.normal(size=(1, 1, 2, 2, 2))
    assert function([x], pool_3d(x, (3, 3, 3)))(xv).shape == (1, 1, 0, 0, 0)
    np.testing.assert_allclose(function([x], pool_3d(x, (3, 3, 3), ignore_border=False))(xv),
                               xv.max().reshape(1, 1, 1, 1, 1))


def test_infer_shape():
    x = T.dtensor5()
    xv = RNG.normal(size=(2, 3, 9, 7, 6))
    for kw in [dict(ws=(2, 2, 2)), dict(ws=(3, 2, 2), stride=(2, 1, 3), ignore_border=False),
               dict(ws=(3, 3, 2), pad=(1, 2, 1), stride=(2, 2, 1), mode="average_exc_pad")]:
        y = pool_3d(x, **kw)
        gx = symgpu.grad(y.sum(), x)
        ref = ref_pool3d(xv, kw["ws"], kw.get("ignore_border", True), kw.get("stride"),
                         kw.get("pad", (0, 0, 0)))
        for v, want in ((y, ref.shape), (gx, xv.shape)):
            node = v.owner
            assert isinstance(node.op, (Pool3d, MaxPoolGrad3d, AveragePoolGrad3d))
            shapes = [tuple(T.shape_i(i, k) for k in range(i.ndim)) for i in node.inputs]
            (s,) = node.op.infer_shape(None, node, shapes)
            got = function([x], list(s), on_unused_input="ignore")(xv)
            assert tuple(int(k) for k in got) == want


def test_errors():
    x = T.dtensor5()
    with pytest.raises(ValueError, match="mode"):
        pool_3d(x, (2, 2, 2), mode="min")
    with pytest.raises(ValueError, match="ignore_border=True"):
        pool_3d(x, (2, 2, 2), ignore_border=False, pad=(1, 1, 0))
    with pytest.raises(ValueError, match="smaller than the window"):
        pool_3d(x, (2, 2, 2), pad=(0, 0, 2))
    with pytest.raises(ValueError, match="ws"):
        pool_3d(x, (2, 2))
    with pytest.raises(ValueError, match="stride"):
        pool_3d(x, (2, 2, 2), stride=(1, 0, 1))
    with pytest.raises(ValueError, match="required"):
        pool_3d(x)
    with pytest.raises(TypeError, match="at least 3 dimensions"):
        pool_3d(T.dmatrix(), (2, 2, 2))


def test_theano_older_parameter_names():
    x = T.dtensor5()
    xv = RNG.normal(size=(1, 1, 6, 7, 5))
    old = pool_3d(x, ds=(3, 2, 2), st=(2, 2, 1), padding=(1, 1, 1), mode="average_inc_pad")
    new = pool_3d(x, ws=(3, 2, 2), stride=(2, 2, 1), pad=(1, 1, 1), mode="average_inc_pad")
    a, b = function([x], [old, new])(xv)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="not both"):
        pool_3d(x, ws=(2, 2, 2), ds=(2, 2, 2))


def test_2d_ops_stay_2d():
    """pool_2d's Ops are not pool_3d's (the GPU backend lifts the 2-d ones by type)."""
    y2 = pool_2d(T.dtensor4(), (2, 2))
    y3 = pool_3d(T.dtensor5(), (2, 2, 2))
    assert type(y2.owner.op) is Pool and not isinstance(y3.owner.op, Pool)
    assert pool_output_shape((1, 5, 7), (2, 2)) == (1, 2, 3)
    assert pool_output_shape((1, 5, 7, 9), (2, 3, 4), ignore_border=False) == (1, 3, 3, 3)
    assert pool_output_shape((5, 7, 9), 2, ndim=3, stride=(1, 2, 3)) == (4, 3, 3)
