"""NumPy kernels of 2-d convolution (NCHW data, OIHW filters): geometry, forward, and the two
gradients, all by im2col + BLAS.

The windows of the padded input are a strided view (no copy), copied once per group into an
(N, C*kh*kw, Ho*Wo) matrix; one batched GEMM `W (O, K) @ cols` then gives NCHW directly. On the
LeNet shapes this measured 1.5 ms against 5.3 (einsum) and 7.9 (tensordot) for the first
layer, and on par with tensordot for the second (see docs/convnets.md). Everything here takes resolved
geometry (explicit pads), so the Ops stay thin and the GPU fallback can reuse the arithmetic.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

Pads = tuple[tuple[int, int], tuple[int, int]]

__all__ = ["normalize_border_mode", "resolve_pads", "conv_out_size", "conv_output_shape",
           "conv_forward", "conv_grad_inputs", "conv_grad_weights", "conv_reference"]


def normalize_border_mode(border_mode: Any) -> str | Pads:
    """'valid' | 'full' | 'half' | int | (int, int) | ((top, bottom), (left, right)) ->
    the string or ((top, bottom), (left, right)) of non-negative ints (hashable, for __props__)."""
    if isinstance(border_mode, str):
        if border_mode not in ("valid", "full", "half"):
            raise ValueError(f"border_mode must be 'valid', 'full', 'half', an int or a pair; "
                             f"got {border_mode!r}")
        return border_mode
    if isinstance(border_mode, (int, np.integer)) and not isinstance(border_mode, bool):
        border_mode = (int(border_mode), int(border_mode))
    if isinstance(border_mode, (tuple, list)) and len(border_mode) == 2:
        pads = []
        for p in border_mode:
            if isinstance(p, (tuple, list)) and len(p) == 2:
                pads.append((int(p[0]), int(p[1])))
            elif isinstance(p, (int, np.integer)) and not isinstance(p, bool):
                pads.append((int(p), int(p)))
            else:
                break
        else:
            if min(min(p) for p in pads) < 0:
                raise ValueError(f"border_mode paddings must be >= 0, got {border_mode!r}")
            return (pads[0], pads[1])
    raise ValueError(f"border_mode must be 'valid', 'full', 'half', an int, a pair of ints or "
                     f"a pair of (before, after) pairs; got {border_mode!r}")


def normalize_pair(value: Any, what: str, minimum: int = 1) -> tuple[int, int]:
    """An int or a pair of ints >= `minimum` as a pair (subsample, filter_dilation, ws...)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value, value)
    try:
        pair = tuple(int(v) for v in value)
    except TypeError:
        pair = ()
    if len(pair) != 2 or min(pair) < minimum:
        raise ValueError(f"{what} must be a pair of ints >= {minimum}, got {value!r}")
    return pair  # type: ignore[return-value]


def _is_int(v: Any, n: int) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v == n


def dilated_size(k: Any, d: int) -> Any:
    """Extent of a k-tap filter with dilation d (works on ints and symbolic scalars; no
    operation for d == 1, so symbolic shapes stay short: they may be computed per call)."""
    return k if _is_int(d, 1) else (k - 1) * d + 1


def resolve_pads(border_mode: str | Pads, kshape: Sequence[Any], dilation: Sequence[int]) -> tuple:
    """Explicit ((top, bottom), (left, right)) paddings for a kernel of spatial shape `kshape`
    (ints, or symbolic scalars for shape inference)."""
    if not isinstance(border_mode, str):
        return border_mode
    pads = []
    for k, d in zip(kshape, dilation):
        dk = dilated_size(k, d)
        p = 0 if border_mode == "valid" else dk // 2 if border_mode == "half" else dk - 1
        pads.append((p, p))
    return tuple(pads)


def conv_out_size(i: Any, k: Any, pad: tuple, s: int, d: int) -> Any:
    """Output length of one axis: (i + pads - dilated k) // s + 1 (ints or symbolic; zero
    paddings and unit strides add no operation)."""
    span = i
    for p in pad:
        if not _is_int(p, 0):
            span = span + p
    span = span - dilated_size(k, d)
    return (span if _is_int(s, 1) else span // s) + 1


def conv_output_shape(ishape: Sequence[int], kshape: Sequence[int], border_mode: Any,
                      subsample: Sequence[int] = (1, 1),
                      dilation: Sequence[int] = (1, 1)) -> tuple[int, int, int, int]:
    """(N, O, Ho, Wo) of conv2d for input (N, C, H, W) and filters (O, C/g, kh, kw)."""
    pads = resolve_pads(normalize_border_mode(border_mode), kshape[2:], dilation)
    return (ishape[0], kshape[0]) + tuple(  # type: ignore[return-value]
        conv_out_size(ishape[2 + a], kshape[2 + a], pads[a], subsample[a], dilation[a])
        for a in range(2))


def _pad(x: np.ndarray, pads: Pads) -> np.ndarray:
    if not any(pads[0]) and not any(pads[1]):
        return x
    return np.pad(x, ((0, 0), (0, 0), pads[0], pads[1]))


def _windows(xp: np.ndarray, groups: int, kh: int, kw: int, ho: int, wo: int,
             s: Sequence[int], d: Sequence[int]) -> np.ndarray:
    """Read-only view (N, G, C/G, ho, wo, kh, kw) of the padded input's receptive fields."""
    n, c = xp.shape[:2]
    sn, sc, sh, sw = xp.strides
    cg = c // groups
    return as_strided(xp, (n, groups, cg, ho, wo, kh, kw),
                      (sn, sc * cg, sc, sh * s[0], sw * s[1], sh * d[0], sw * d[1]),
                      writeable=False)


def _check_groups(c: int, wshape: Sequence[int], groups: int, who: str) -> None:
    o, cg = wshape[0], wshape[1]
    if o % groups:
        raise ValueError(f"{who}: {o} filters are not divisible by num_groups={groups}")
    if c != cg * groups:
        raise ValueError(f"{who}: the input has {c} channels but the filters (shape "
                         f"{tuple(wshape)}) expect {cg} per group x num_groups={groups} = "
                         f"{cg * groups}")


def _out_hw(hw: Sequence[int], khw: Sequence[int], pads: Pads, s: Sequence[int],
            d: Sequence[int], who: str) -> tuple[int, int]:
    out = tuple(conv_out_size(hw[a], khw[a], pads[a], s[a], d[a]) for a in range(2))
    if min(out) < 1:
        raise ValueError(f"{who}: the filters (spatial {tuple(khw)}, dilation {tuple(d)}) do "
                         f"not fit in the input (spatial {tuple(hw)}, paddings {pads}): the "
                         f"output would be {out}")
    return out  # type: ignore[return-value]


def _im2col(xp: np.ndarray, g: int, groups: int, kh: int, kw: int, ho: int, wo: int,
            s: Sequence[int], d: Sequence[int]) -> np.ndarray:
    """Group g's receptive fields copied to a (N, Cg*kh*kw, ho*wo) matrix per image."""
    win = _windows(xp, groups, kh, kw, ho, wo, s, d)[:, g]
    n, cg = win.shape[:2]
    return np.ascontiguousarray(win.transpose(0, 1, 4, 5, 2, 3)).reshape(n, cg * kh * kw, ho * wo)


def _filter_matrix(w: np.ndarray, g: int, groups: int) -> np.ndarray:
    og = w.shape[0] // groups
    return np.ascontiguousarray(w[g * og:(g + 1) * og]).reshape(og, -1)


def conv_forward(x: np.ndarray, w: np.ndarray, pads: Pads, s: Sequence[int], d: Sequence[int],
                 flip: bool, groups: int, dtype: Any) -> np.ndarray:
    """y[n, o, i, j] = sum_{c, a, b} xpad[n, c, i*s + a*d, j*s + b*d] * w'[o, c, a, b], with
    w' = w flipped in both spatial axes when `flip` (true convolution)."""
    _check_groups(x.shape[1], w.shape, groups, "conv2d")
    kh, kw = w.shape[2:]
    ho, wo = _out_hw(x.shape[2:], (kh, kw), pads, s, d, "conv2d")
    if flip:
        w = w[:, :, ::-1, ::-1]
    xp = _pad(x, pads)
    n, og = x.shape[0], w.shape[0] // groups
    out = np.empty((n, w.shape[0], ho * wo), dtype=dtype)
    for g in range(groups):
        # (Og, K) @ (N, K, P): a batch of GEMMs whose result is already NCHW
        np.matmul(_filter_matrix(w, g, groups).astype(dtype, copy=False),
                  _im2col(xp, g, groups, kh, kw, ho, wo, s, d).astype(dtype, copy=False),
                  out=out[:, g * og:(g + 1) * og])
    return out.reshape(n, w.shape[0], ho, wo)


def conv_grad_weights(x: np.ndarray, gy: np.ndarray, khw: Sequence[int], pads: Pads,
                      s: Sequence[int], d: Sequence[int], flip: bool, groups: int,
                      dtype: Any) -> np.ndarray:
    """d(sum(y * gy)) / dw for y = conv_forward(x, w): gy correlated with the input windows."""
    n, c = x.shape[:2]
    o = gy.shape[1]
    kh, kw = (int(k) for k in khw)
    if c % groups or o % groups:
        raise ValueError(f"conv2d_grad_wrt_weights: {c} input channels and {o} output_grad "
                         f"channels must both be divisible by num_groups={groups}")
    ho, wo = _out_hw(x.shape[2:], (kh, kw), pads, s, d, "conv2d_grad_wrt_weights")
    if gy.shape[0] != n or tuple(gy.shape[2:]) != (ho, wo):
        raise ValueError(f"conv2d_grad_wrt_weights: output_grad has shape {gy.shape}, "
                         f"expected ({n}, {o}, {ho}, {wo}) for input {x.shape} and filter "
                         f"spatial shape {(kh, kw)}")
    xp = _pad(x, pads)
    og, cg = o // groups, c // groups
    dw = np.empty((o, cg, kh, kw), dtype=dtype)
    for g in range(groups):
        gyg = gy[:, g * og:(g + 1) * og].reshape(n, og, ho * wo)
        cols = _im2col(xp, g, groups, kh, kw, ho, wo, s, d)
        dw[g * og:(g + 1) * og] = np.tensordot(gyg, cols, axes=([0, 2], [0, 2])).reshape(
            og, cg, kh, kw)
    return dw[:, :, ::-1, ::-1].copy() if flip else dw


def conv_grad_inputs(w: np.ndarray, gy: np.ndarray, hw: Sequence[int], pads: Pads,
                     s: Sequence[int], d: Sequence[int], flip: bool, groups: int,
                     dtype: Any) -> np.ndarray:
    """d(sum(y * gy)) / dx for y = conv_forward(x, w) with x of spatial shape `hw`: the
    transposed convolution (one batched GEMM per group, then col2im by kh*kw strided adds)."""
    n, o, ho, wo = gy.shape
    if w.shape[0] != o:
        raise ValueError(f"conv2d_grad_wrt_inputs: output_grad has {o} channels but there are "
                         f"{w.shape[0]} filters (filters shape {w.shape})")
    if o % groups:
        raise ValueError(f"conv2d_grad_wrt_inputs: {o} filters are not divisible by "
                         f"num_groups={groups}")
    kh, kw = w.shape[2:]
    h, wd = (int(v) for v in hw)
    exp = _out_hw((h, wd), (kh, kw), pads, s, d, "conv2d_grad_wrt_inputs")
    if (ho, wo) != exp:
        raise ValueError(f"conv2d_grad_wrt_inputs: output_grad has spatial shape {(ho, wo)}, "
                         f"expected {exp} for an input of spatial shape {(h, wd)} and filters "
                         f"{w.shape}")
    if flip:
        w = w[:, :, ::-1, ::-1]
    og, cg = o // groups, w.shape[1]
    hp, wp = h + pads[0][0] + pads[0][1], wd + pads[1][0] + pads[1][1]
    dxp = np.zeros((n, cg * groups, hp, wp), dtype=dtype)
    for g in range(groups):
        # (K, Og) @ (N, Og, P) -> (N, Cg, kh, kw, ho, wo)
        cols = np.matmul(_filter_matrix(w, g, groups).T,
                         gy[:, g * og:(g + 1) * og].reshape(n, og, ho * wo)
                         ).reshape(n, cg, kh, kw, ho, wo)
        dst = dxp[:, g * cg:(g + 1) * cg]
        for a in range(kh):
            r0 = a * d[0]
            for b in range(kw):
                c0 = b * d[1]
                dst[:, :, r0:r0 + s[0] * (ho - 1) + 1:s[0],
                    c0:c0 + s[1] * (wo - 1) + 1:s[1]] += cols[:, :, a, b]
    return dxp[:, :, pads[0][0]:pads[0][0] + h, pads[1][0]:pads[1][0] + wd]


def conv_reference(x: np.ndarray, w: np.ndarray, border_mode: Any = "valid",
                   subsample: Sequence[int] = (1, 1), filter_flip: bool = True,
                   filter_dilation: Sequence[int] = (1, 1), num_groups: int = 1) -> np.ndarray:
    """Direct-loop definition of conv2d (slow; for tests and as the documentation of the sum)."""
    pads = resolve_pads(normalize_border_mode(border_mode), w.shape[2:], filter_dilation)
    s, d = subsample, filter_dilation
    xp = _pad(x, pads)
    n, c = x.shape[:2]
    o, cg, kh, kw = w.shape
    og = o // num_groups
    ho, wo = _out_hw(x.shape[2:], (kh, kw), pads, s, d, "conv_reference")
    wk = w[:, :, ::-1, ::-1] if filter_flip else w
    y = np.zeros((n, o, ho, wo), dtype=np.result_type(x, w))
    for oo in range(o):
        g = oo // og
        for i in range(ho):
            for j in range(wo):
                acc = 0.0
                for a in range(kh):
                    for b in range(kw):
                        patch = xp[:, g * cg:(g + 1) * cg, i * s[0] + a * d[0], j * s[1] + b * d[1]]
                        acc = acc + patch @ wk[oo, :, a, b]
                y[:, oo, i, j] = acc
    return y
