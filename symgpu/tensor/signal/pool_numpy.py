"""NumPy kernels of N-d pooling over the last nd axes (nd = len(ws): 2 for pool_2d, 3 for
pool_3d), with Theano's Pool semantics.

Every output window is a strided view of the input padded once: for 'max' the padding (and
the tail that partial windows reach when ignore_border=False) holds -inf so it never wins;
for the sums it holds 0, and the averages divide by a per-position count that is the product
of one count per axis ('average_inc_pad' counts padding, 'average_exc_pad' does not). The
gradients scatter back with one strided add per window offset (prod(ws) adds).
"""
from __future__ import annotations

import functools
import itertools
from typing import Any, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from symgpu.scalar.dtypes import HALF_DTYPES, dtype_kind

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


def _geometry(shape: Sequence[int], ws, st, pad, ignore_border) -> tuple[tuple, tuple]:
    """(output lengths, padded-buffer lengths) of the last len(ws) axes."""
    nd = len(ws)
    sp = tuple(shape[len(shape) - nd:])
    outs = tuple(pool_out_len(sp[a], ws[a], st[a], pad[a], ignore_border) for a in range(nd))
    # the padded buffer must hold every window, also the partial ones at the far edge
    bufs = tuple(max(sp[a] + 2 * pad[a], (outs[a] - 1) * st[a] + ws[a] if outs[a] else 0)
                 for a in range(nd))
    return outs, bufs


def _acc(dtype: Any) -> Any:
    """The accumulator dtype of window sums: float32 for the half dtypes (as the GPU's
    kernels), None (NumPy's own choice) for the others."""
    return np.float32 if np.dtype(dtype).name in HALF_DTYPES else None


def _fill_value(dtype: np.dtype, mode: str) -> Any:
    if mode != "max":
        return 0
    return -np.inf if dtype_kind(dtype) == "f" else np.iinfo(dtype).min


def _padded(x: np.ndarray, bufs: tuple, pad, fill) -> np.ndarray:
    """x as (L, *bufs): its leading axes flattened, the pooled axes padded to `bufs`."""
    nd = len(bufs)
    sp = x.shape[x.ndim - nd:]
    xl = x.reshape((-1,) + sp)
    if tuple(bufs) == tuple(sp):
        return xl
    buf = np.full((xl.shape[0],) + tuple(bufs), fill, dtype=x.dtype)
    buf[(slice(None),) + tuple(slice(p, p + v) for p, v in zip(pad, sp))] = xl
    return buf


def _windows(xp: np.ndarray, outs: tuple, ws, st) -> np.ndarray:
    """Read-only view (L, *outs, *ws) of the windows of the padded (L, *bufs) buffer."""
    strides = xp.strides[1:]
    return as_strided(xp, (xp.shape[0],) + tuple(outs) + tuple(ws),
                      (xp.strides[0],) + tuple(sd * s for sd, s in zip(strides, st))
                      + tuple(strides), writeable=False)


def _counts(n_out: int, length: int, ws: int, st: int, pad: int, inc_pad: bool) -> np.ndarray:
    start = np.arange(n_out) * st
    if inc_pad:
        return np.minimum(start + ws, length + 2 * pad) - start
    return np.minimum(start + ws, length + pad) - np.maximum(start, pad)


def _divisor(shape, outs, ws, st, pad, mode) -> np.ndarray:
    """The per-position count of an average: the outer product of one count per axis."""
    nd = len(ws)
    sp = shape[len(shape) - nd:]
    inc = mode == "average_inc_pad"
    counts = [_counts(outs[a], sp[a], ws[a], st[a], pad[a], inc) for a in range(nd)]
    return functools.reduce(np.multiply.outer, counts)


def _win_axes(nd: int) -> tuple[int, ...]:
    return tuple(range(1 + nd, 1 + 2 * nd))


def pool_forward(x: np.ndarray, ws, st, pad, ignore_border: bool, mode: str) -> np.ndarray:
    """Pool the last len(ws) axes of `x`."""
    nd = len(ws)
    outs, bufs = _geometry(x.shape, ws, st, pad, ignore_border)
    lead = x.shape[:x.ndim - nd]
    if min(outs) == 0 or x.size == 0:
        return np.zeros(lead + outs, dtype=x.dtype)
    xp = _padded(x, bufs, pad, _fill_value(x.dtype, mode))
    win = _windows(xp, outs, ws, st)
    if mode == "max":
        out = win.max(axis=_win_axes(nd))
    else:
        out = win.sum(axis=_win_axes(nd), dtype=_acc(x.dtype))
        if mode != "sum":
            out = out / _divisor(x.shape, outs, ws, st, pad, mode)
    return np.asarray(out, dtype=x.dtype).reshape(lead + outs)


def _scatter(shape, dtype, outs, bufs, ws, st, pad, contrib) -> np.ndarray:
    """Sum contrib(offsets) (an (L, *outs) array for window offset `offsets`) back onto the
    input."""
    nd = len(ws)
    lead, sp = tuple(shape[:len(shape) - nd]), tuple(shape[len(shape) - nd:])
    gxp = np.zeros((int(np.prod(lead, dtype=np.int64)),) + tuple(bufs),
                   dtype=_acc(dtype) or dtype)
    for offs in itertools.product(*(range(w) for w in ws)):
        region = tuple(slice(a, a + s * (o - 1) + 1, s) for a, s, o in zip(offs, st, outs))
        gxp[(slice(None),) + region] += contrib(offs)
    crop = tuple(slice(p, p + v) for p, v in zip(pad, sp))
    return gxp[(slice(None),) + crop].reshape(shape).astype(dtype, copy=False)


def _check_out(x, gz, outs, nd, who):
    want = x.shape[:x.ndim - nd] + tuple(outs)
    if tuple(gz.shape) != want:
        raise ValueError(f"{who}: the output gradient has shape {gz.shape}, expected "
                         f"{want} for an input of shape {x.shape}")


def max_pool_grad(x: np.ndarray, maxout: np.ndarray, gz: np.ndarray, ws, st, pad,
                  ignore_border: bool) -> np.ndarray:
    """Theano's MaxPoolGrad: each window's gradient goes to every element equal to its max."""
    nd = len(ws)
    outs, bufs = _geometry(x.shape, ws, st, pad, ignore_border)
    _check_out(x, gz, outs, nd, "MaxPoolGrad")
    if min(outs) == 0 or x.size == 0:
        return np.zeros_like(x)
    xp = _padded(x, bufs, pad, _fill_value(x.dtype, "max"))
    win = _windows(xp, outs, ws, st)
    lead = win.shape[:1 + nd]
    m = maxout.reshape(lead)
    g = gz.reshape(lead).astype(x.dtype, copy=False)
    every = (slice(None),) * (1 + nd)
    return _scatter(x.shape, x.dtype, outs, bufs, ws, st, pad,
                    lambda offs: np.where(win[every + offs] == m, g, 0))


def max_pool_grad_grad(x: np.ndarray, maxout: np.ndarray, ggx: np.ndarray, ws, st, pad,
                       ignore_border: bool) -> np.ndarray:
    """The adjoint of max_pool_grad in gz: each window sums ggx over its max elements."""
    nd = len(ws)
    outs, bufs = _geometry(x.shape, ws, st, pad, ignore_border)
    lead = x.shape[:x.ndim - nd]
    if min(outs) == 0 or x.size == 0:
        return np.zeros(lead + outs, dtype=x.dtype)
    win = _windows(_padded(x, bufs, pad, _fill_value(x.dtype, "max")), outs, ws, st)
    gwin = _windows(_padded(ggx.astype(x.dtype, copy=False), bufs, pad, 0), outs, ws, st)
    m = maxout.reshape(win.shape[:1 + nd])[(...,) + (None,) * nd]
    out = np.where(win == m, gwin, 0).sum(axis=_win_axes(nd), dtype=_acc(x.dtype))
    return np.asarray(out, dtype=x.dtype).reshape(lead + outs)


def average_pool_grad(xshape: Sequence[int], gz: np.ndarray, ws, st, pad, ignore_border: bool,
                      mode: str, dtype: Any) -> np.ndarray:
    """Theano's AveragePoolGrad (also for 'sum'): each window spreads gz / count over itself."""
    nd = len(ws)
    xshape = tuple(int(s) for s in xshape)
    outs, bufs = _geometry(xshape, ws, st, pad, ignore_border)
    want = xshape[:len(xshape) - nd] + outs
    if tuple(gz.shape) != want:
        raise ValueError(f"AveragePoolGrad: the output gradient has shape {gz.shape}, expected "
                         f"{want} for an input of shape {xshape}")
    if min(outs) == 0 or int(np.prod(xshape)) == 0:
        return np.zeros(xshape, dtype=dtype)
    g = gz.reshape((-1,) + outs).astype(dtype, copy=False)
    if mode != "sum":
        g = g / _divisor(xshape, outs, ws, st, pad, mode)
    return _scatter(xshape, dtype, outs, bufs, ws, st, pad, lambda offs: g)


def pool_reference(x: np.ndarray, ws, ignore_border=True, stride=None, pad=None,
                   mode="max") -> np.ndarray:
    """Theano's Pool.perform loop, window by window, over the last len(ws) axes (slow; the
    tests' reference). pad defaults to zeros."""
    nd = len(ws)
    st = stride or ws
    pad = (0,) * nd if pad is None else pad
    sp = x.shape[x.ndim - nd:]
    lead = x.shape[:x.ndim - nd]
    outs = tuple(pool_out_len(sp[a], ws[a], st[a], pad[a], ignore_border) for a in range(nd))
    padded = tuple(v + 2 * p for v, p in zip(sp, pad))
    y = np.zeros(lead + padded, dtype=x.dtype)
    y[(...,) + tuple(slice(p, p + v) for p, v in zip(pad, sp))] = x
    out = np.zeros(lead + outs, dtype=x.dtype)
    axes = tuple(range(-nd, 0))
    for pos in itertools.product(*(range(o) for o in outs)):
        region = []
        for a in range(nd):
            lo, hi = pos[a] * st[a], min(pos[a] * st[a] + ws[a], padded[a])
            if mode != "average_inc_pad":
                lo, hi = max(lo, pad[a]), min(hi, sp[a] + pad[a])
            region.append(slice(lo, hi))
        win = y[(...,) + tuple(region)]
        if mode == "max":
            out[(...,) + pos] = win.max(axis=axes)
        elif mode == "sum":
            out[(...,) + pos] = win.sum(axis=axes)
        else:
            out[(...,) + pos] = win.mean(axis=axes)
    return out
