"""NumPy kernels of 2-d pooling over the last two axes, with Theano's Pool semantics.

Every output window is a strided view of the input padded once: for 'max' the padding (and
the tail that partial windows reach when ignore_border=False) holds -inf so it never wins;
for the sums it holds 0, and the averages divide by a per-position count that is the product
of one count per axis ('average_inc_pad' counts padding, 'average_exc_pad' does not). The
gradients scatter back with one strided add per window offset (ws[0]*ws[1] adds).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

MODES = ("max", "sum", "average_inc_pad", "average_exc_pad")

__all__ = ["MODES", "pool_out_len", "pool_forward", "max_pool_grad", "average_pool_grad",
           "max_pool_grad_grad", "pool_reference"]


def pool_out_len(v: Any, ws: int, st: int, pad: int, ignore_border: bool,
                 maximum: Any = max) -> Any:
    """Output length of one axis of length `v` (int, or a symbolic scalar with `maximum` the
    symbolic max), as Theano's Pool.out_shape."""
    if pad:    # no operation for what changes nothing: symbolic shapes stay short
        v = v + 2 * pad
    div = (lambda a: a) if st == 1 else (lambda a: a // st)
    if ignore_border:
        return maximum(div(v - ws) + 1, 0)
    if st >= ws:
        return div(v - 1) + 1
    return maximum(div(v - (1 + ws - st)), 0) + 1


def _geometry(shape: Sequence[int], ws, st, pad, ignore_border):
    h, w = shape[-2:]
    ho = pool_out_len(h, ws[0], st[0], pad[0], ignore_border)
    wo = pool_out_len(w, ws[1], st[1], pad[1], ignore_border)
    # the padded buffer must hold every window, also the partial ones at the far edge
    hb = max(h + 2 * pad[0], (ho - 1) * st[0] + ws[0] if ho else 0)
    wb = max(w + 2 * pad[1], (wo - 1) * st[1] + ws[1] if wo else 0)
    return ho, wo, hb, wb


def _fill_value(dtype: np.dtype, mode: str) -> Any:
    if mode != "max":
        return 0
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _padded(x: np.ndarray, hb: int, wb: int, pad, fill) -> np.ndarray:
    x3 = x.reshape((-1,) + x.shape[-2:])
    h, w = x.shape[-2:]
    if (hb, wb) == (h, w):
        return x3
    buf = np.full((x3.shape[0], hb, wb), fill, dtype=x.dtype)
    buf[:, pad[0]:pad[0] + h, pad[1]:pad[1] + w] = x3
    return buf


def _windows(xp: np.ndarray, ho: int, wo: int, ws, st) -> np.ndarray:
    sl, sh, sw = xp.strides
    return as_strided(xp, (xp.shape[0], ho, wo, ws[0], ws[1]),
                      (sl, sh * st[0], sw * st[1], sh, sw), writeable=False)


def _counts(n_out: int, length: int, ws: int, st: int, pad: int, inc_pad: bool) -> np.ndarray:
    start = np.arange(n_out) * st
    if inc_pad:
        return np.minimum(start + ws, length + 2 * pad) - start
    return np.minimum(start + ws, length + pad) - np.maximum(start, pad)


def _divisor(shape, ho, wo, ws, st, pad, mode) -> np.ndarray:
    inc = mode == "average_inc_pad"
    ch = _counts(ho, shape[-2], ws[0], st[0], pad[0], inc)
    cw = _counts(wo, shape[-1], ws[1], st[1], pad[1], inc)
    return np.outer(ch, cw)


def pool_forward(x: np.ndarray, ws, st, pad, ignore_border: bool, mode: str) -> np.ndarray:
    """Pool the last two axes of `x`."""
    ho, wo, hb, wb = _geometry(x.shape, ws, st, pad, ignore_border)
    lead = x.shape[:-2]
    if ho == 0 or wo == 0 or x.size == 0:
        return np.zeros(lead + (ho, wo), dtype=x.dtype)
    xp = _padded(x, hb, wb, pad, _fill_value(x.dtype, mode))
    win = _windows(xp, ho, wo, ws, st)
    if mode == "max":
        out = win.max(axis=(3, 4))
    else:
        out = win.sum(axis=(3, 4))
        if mode != "sum":
            out = out / _divisor(x.shape, ho, wo, ws, st, pad, mode)
    return np.asarray(out, dtype=x.dtype).reshape(lead + (ho, wo))


def _scatter(shape, dtype, ho, wo, hb, wb, ws, st, pad, contrib) -> np.ndarray:
    """Sum contrib(a, b) (an (L, ho, wo) array for window offset (a, b)) back onto the input."""
    gxp = np.zeros((int(np.prod(shape[:-2], dtype=np.int64)), hb, wb), dtype=dtype)
    for a in range(ws[0]):
        for b in range(ws[1]):
            gxp[:, a:a + st[0] * (ho - 1) + 1:st[0], b:b + st[1] * (wo - 1) + 1:st[1]] += \
                contrib(a, b)
    h, w = shape[-2:]
    return gxp[:, pad[0]:pad[0] + h, pad[1]:pad[1] + w].reshape(shape)


def max_pool_grad(x: np.ndarray, maxout: np.ndarray, gz: np.ndarray, ws, st, pad,
                  ignore_border: bool) -> np.ndarray:
    """Theano's MaxPoolGrad: each window's gradient goes to every element equal to its max."""
    ho, wo, hb, wb = _geometry(x.shape, ws, st, pad, ignore_border)
    _check_out(x, gz, ho, wo, "MaxPoolGrad")
    if ho == 0 or wo == 0 or x.size == 0:
        return np.zeros_like(x)
    xp = _padded(x, hb, wb, pad, _fill_value(x.dtype, "max"))
    win = _windows(xp, ho, wo, ws, st)
    m3 = maxout.reshape(win.shape[:3])
    g3 = gz.reshape(win.shape[:3]).astype(x.dtype, copy=False)
    return _scatter(x.shape, x.dtype, ho, wo, hb, wb, ws, st, pad,
                    lambda a, b: np.where(win[:, :, :, a, b] == m3, g3, 0))


def max_pool_grad_grad(x: np.ndarray, maxout: np.ndarray, ggx: np.ndarray, ws, st, pad,
                       ignore_border: bool) -> np.ndarray:
    """The adjoint of max_pool_grad in gz: each window sums ggx over its max elements."""
    ho, wo, hb, wb = _geometry(x.shape, ws, st, pad, ignore_border)
    if ho == 0 or wo == 0 or x.size == 0:
        return np.zeros(x.shape[:-2] + (ho, wo), dtype=x.dtype)
    win = _windows(_padded(x, hb, wb, pad, _fill_value(x.dtype, "max")), ho, wo, ws, st)
    gwin = _windows(_padded(ggx.astype(x.dtype, copy=False), hb, wb, pad, 0), ho, wo, ws, st)
    m3 = maxout.reshape(win.shape[:3])
    out = np.where(win == m3[..., None, None], gwin, 0).sum(axis=(3, 4))
    return np.asarray(out, dtype=x.dtype).reshape(x.shape[:-2] + (ho, wo))


def average_pool_grad(xshape: Sequence[int], gz: np.ndarray, ws, st, pad, ignore_border: bool,
                      mode: str, dtype: Any) -> np.ndarray:
    """Theano's AveragePoolGrad (also for 'sum'): each window spreads gz / count over itself."""
    xshape = tuple(int(s) for s in xshape)
    ho, wo, hb, wb = _geometry(xshape, ws, st, pad, ignore_border)
    if tuple(gz.shape) != xshape[:-2] + (ho, wo):
        raise ValueError(f"AveragePoolGrad: the output gradient has shape {gz.shape}, expected "
                         f"{xshape[:-2] + (ho, wo)} for an input of shape {xshape}")
    if ho == 0 or wo == 0 or int(np.prod(xshape)) == 0:
        return np.zeros(xshape, dtype=dtype)
    g3 = gz.reshape((-1, ho, wo)).astype(dtype, copy=False)
    if mode != "sum":
        g3 = g3 / _divisor(xshape, ho, wo, ws, st, pad, mode)
    return _scatter(xshape, dtype, ho, wo, hb, wb, ws, st, pad, lambda a, b: g3)


def _check_out(x, gz, ho, wo, who):
    if tuple(gz.shape) != x.shape[:-2] + (ho, wo):
        raise ValueError(f"{who}: the output gradient has shape {gz.shape}, expected "
                         f"{x.shape[:-2] + (ho, wo)} for an input of shape {x.shape}")


def pool_reference(x: np.ndarray, ws, ignore_border=True, stride=None, pad=(0, 0),
                   mode="max") -> np.ndarray:
    """Theano's Pool.perform loop, window by window (slow; the tests' reference)."""
    st = stride or ws
    h, w = x.shape[-2:]
    ho = pool_out_len(h, ws[0], st[0], pad[0], ignore_border)
    wo = pool_out_len(w, ws[1], st[1], pad[1], ignore_border)
    hp, wp = h + 2 * pad[0], w + 2 * pad[1]
    y = np.zeros(x.shape[:-2] + (hp, wp), dtype=x.dtype)
    y[..., pad[0]:pad[0] + h, pad[1]:pad[1] + w] = x
    out = np.zeros(x.shape[:-2] + (ho, wo), dtype=x.dtype)
    for i in range(ho):
        for j in range(wo):
            r0, r1 = i * st[0], min(i * st[0] + ws[0], hp)
            c0, c1 = j * st[1], min(j * st[1] + ws[1], wp)
            if mode != "average_inc_pad":
                r0, r1 = max(r0, pad[0]), min(r1, h + pad[0])
                c0, c1 = max(c0, pad[1]), min(c1, w + pad[1])
            region = y[..., r0:r1, c0:c1]
            if mode == "max":
                out[..., i, j] = region.max(axis=(-2, -1))
            elif mode == "sum":
                out[..., i, j] = region.sum(axis=(-2, -1))
            else:
                out[..., i, j] = region.mean(axis=(-2, -1))
    return out
