"""Theano's `theano.tensor.fft`: real-input fast Fourier transforms over batches.

symgpu has no complex dtype, so (as in Theano) a transform's complex values are stored as a
trailing dimension of length 2: `[..., 0]` the real parts, `[..., 1]` the imaginary parts.
The first dimension is the batch: `rfft` of an (m, ..., n) array transforms each of the m
arrays of shape (..., n) (NumPy's `rfftn` over every axis but the first) and gives
(m, ..., n//2 + 1, 2); `irfft` is the inverse.

`RFFTOp` and `IRFFTOp` are unnormalised (no 1/n anywhere); the functions `rfft` and `irfft`
apply the normalisation (`norm` None, 'ortho' or 'no_norm') as graph arithmetic. Their
gradients are Theano's: each op's gradient is the other op with the non-redundant middle
frequencies halved (rfft) or doubled (irfft).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import is_float, is_int
from symgpu.tensor.basic import stack
from symgpu.tensor.math import cast, prod, sqrt
from symgpu.tensor.shape_rules import as_dim, s_add, s_floordiv
from symgpu.tensor.subtensor import set_subtensor
from symgpu.tensor.type import (TensorType, TensorVariable, as_tensor_variable,
                                computes_half_in_float32)

__all__ = ["RFFTOp", "IRFFTOp", "rfft_op", "irfft_op", "rfft", "irfft"]

_NORMS = (None, "ortho", "no_norm")
_COMPLEX = {"float32": np.complex64, "float64": np.complex128}


def _scipy_fft():
    import scipy.fft  # not a symgpu module: loads on first use
    return scipy.fft


def _float_input(a: Any, what: str, min_ndim: int, layout: str) -> TensorVariable:
    a = as_tensor_variable(a)
    if not is_float(a.dtype):
        raise TypeError(f"{what}: the input must be float32 or float64, got {a} ({a.type})")
    if a.ndim < min_ndim:
        raise TypeError(f"{what}: the input must have at least {min_ndim} dimensions "
                        f"({layout}), got {a} with {a.ndim} ({a.type})")
    return a


def _shape_vector(s: Any, what: str) -> TensorVariable:
    s = as_tensor_variable(s)
    if s.ndim != 1 or not is_int(s.dtype):
        raise TypeError(f"{what}: the transform shape s must be an integer vector, "
                        f"got {s} ({s.type})")
    return s


def _middle(g: TensorVariable, n: Any) -> tuple:
    """The index of the frequencies 1 .. ceil(n/2)-1 along g's second-to-last axis: those
    that stand for two frequencies of a real signal of length n (all but 0 and, n even, n/2)."""
    return (slice(None),) * (g.ndim - 2) + (slice(1, n // 2 + n % 2), slice(None))


class RFFTOp(Op):
    """Unnormalised real-input FFT of every axis but the first: an (m, ..., n) float array
    becomes (m, ..., n//2 + 1, 2) (real and imaginary parts), in the input's dtype.

    `s`, the transform's shape, defaults to `a.shape[1:]`; it must equal it (NumPy's cropping
    and zero-padding through `s` is not supported: the gradient assumes the full transform).
    """

    __props__ = ()

    def make_node(self, a: Any, s: Any = None) -> Apply:
        a = _float_input(a, "RFFTOp", 2, "the first is the batch")
        s = _shape_vector(a.shape[1:] if s is None else s, "RFFTOp")
        return Apply(self, [a, s], [TensorType(a.dtype, (False,) * (a.ndim + 1))()])

    @computes_half_in_float32
    def perform(self, node, inputs, output_storage):
        a, s = inputs
        s = tuple(int(v) for v in s)
        if s != a.shape[1:]:
            raise ValueError(f"RFFTOp: the transform shape s={s} must be the input's "
                             f"shape after the batch axis, {a.shape[1:]} (input shape "
                             f"{a.shape}, dtype {a.dtype})")
        # SciPy's pocketfft keeps float32 in single precision (NumPy's rfftn computes in
        # double and would need a cast), and its C-contiguous complex result already is the
        # (..., 2) layout: a view, no stacking of real and imaginary parts
        f = _scipy_fft().rfftn(a, axes=tuple(range(1, a.ndim)))
        if f.dtype != _COMPLEX[a.dtype.name]:
            f = f.astype(_COMPLEX[a.dtype.name])
        output_storage[0][0] = f.view(a.dtype).reshape(f.shape + (2,))

    def infer_shape(self, fgraph, node, input_shapes):
        shp = tuple(input_shapes[0])
        return [shp[:-1] + (s_add(s_floordiv(shp[-1], 2), 1), as_dim(2))]

    def connection_pattern(self, node):
        return [[True], [False]]

    def grad(self, inputs, output_grads):
        (gout,), s = output_grads, inputs[1]
        # the middle frequencies appear twice in the inverse transform (they stand for their
        # negative twins too): halve them so that irfft_op is the adjoint
        idx = _middle(gout, s[-1])
        gout = set_subtensor(gout[idx], gout[idx] * 0.5)
        return [irfft_op(gout, s), None]


class IRFFTOp(Op):
    """Unnormalised inverse of RFFTOp: an (m, ..., k, 2) array of half spectra becomes the
    (m, ..., n) real signals (n = 2(k-1) by default, `s[-1]` when given: 2(k-1) or
    2(k-1) + 1), in the input's dtype. Imaginary parts that a real signal cannot have (of
    frequency 0, and n/2 for even n) are ignored, as by NumPy's `irfftn`.

    `s` defaults to `a.shape[1:-2] + (2 * (a.shape[-2] - 1),)`; `s[:-1]` must equal
    `a.shape[1:-2]` and `s[-1] // 2 + 1` must equal `a.shape[-2]`.
    """

    __props__ = ()

    def make_node(self, a: Any, s: Any = None) -> Apply:
        a = _float_input(a, "IRFFTOp", 3, "the first is the batch, the last real/imaginary")
        if s is None:
            dims = [a.shape[i] for i in range(1, a.ndim - 2)] + [(a.shape[-2] - 1) * 2]
            s = stack(dims)
        s = _shape_vector(s, "IRFFTOp")
        return Apply(self, [a, s], [TensorType(a.dtype, (False,) * (a.ndim - 1))()])

    @computes_half_in_float32
    def perform(self, node, inputs, output_storage):
        a, s = inputs
        s = tuple(int(v) for v in s)
        if a.shape[-1] != 2:
            raise ValueError(f"IRFFTOp: the input's last axis must hold the real and imaginary "
                             f"parts (length 2), got shape {a.shape} (dtype {a.dtype})")
        if len(s) != a.ndim - 2 or s[:-1] != a.shape[1:-2] or s[-1] // 2 + 1 != a.shape[-2] \
                or s[-1] < 1:
            raise ValueError(f"IRFFTOp: the output shape s={s} does not fit the input of shape "
                             f"{a.shape} (dtype {a.dtype}): s must be {a.shape[1:-2]} followed "
                             f"by {2 * (a.shape[-2] - 1)} or {2 * (a.shape[-2] - 1) + 1}")
        # the pairs viewed as complex values (a copy only when the pairs are not adjacent)
        c = np.ascontiguousarray(a).view(_COMPLEX[a.dtype.name])[..., 0]
        out = _scipy_fft().irfftn(c, s=s, axes=tuple(range(1, a.ndim - 1)), norm="forward")
        output_storage[0][0] = out if out.dtype == a.dtype else out.astype(a.dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        shp = tuple(input_shapes[0])
        return [shp[:-2] + (as_dim(node.inputs[1][-1]),)]

    def connection_pattern(self, node):
        return [[True], [False]]

    def grad(self, inputs, output_grads):
        (gout,), s = output_grads, inputs[1]
        gf = rfft_op(gout, s)
        # the middle frequencies stand for both a frequency and its negative twin: double them
        idx = _middle(gf, s[-1])
        return [set_subtensor(gf[idx], gf[idx] * 2), None]


rfft_op = RFFTOp()
irfft_op = IRFFTOp()


def _check_norm(norm: Any, what: str) -> None:
    if norm not in _NORMS:
        raise ValueError(f"{what}: norm must be None, 'ortho' or 'no_norm', got {norm!r}")


def rfft(inp: Any, norm: str | None = None) -> TensorVariable:
    """The FFT of the real (m, ..., n) array `inp` over every axis but the first (the batch):
    an (m, ..., n//2 + 1, 2) array of real and imaginary parts.

    `norm`: None (NumPy's default: the forward transform is not scaled), 'ortho' (divided by
    sqrt of the transform's size: unitary) or 'no_norm' (not scaled)."""
    _check_norm(norm, "rfft")
    inp = _float_input(inp, "rfft", 2, "the first is the batch")
    s = inp.shape[1:]
    out = rfft_op(inp, s)
    if norm == "ortho":
        out = out / sqrt(cast(prod(s), inp.dtype))
    return out


def irfft(inp: Any, norm: str | None = None, is_odd: bool = False) -> TensorVariable:
    """The inverse of `rfft`: an (m, ..., k, 2) array of half spectra (real and imaginary
    parts) gives the (m, ..., n) real signals, n = 2(k-1), or 2(k-1) + 1 with `is_odd=True`.

    `norm`: None (NumPy's default: divided by the transform's size), 'ortho' (by its square
    root) or 'no_norm' (not scaled)."""
    if is_odd not in (True, False):
        raise ValueError(f"irfft: is_odd must be True or False, got {is_odd!r}")
    _check_norm(norm, "irfft")
    inp = _float_input(inp, "irfft", 3, "the first is the batch, the last real/imaginary")
    dims = [inp.shape[i] for i in range(1, inp.ndim - 2)]
    dims.append((inp.shape[-2] - 1) * 2 + (1 if is_odd else 0))
    s = stack(dims)
    out = irfft_op(inp, s)
    if norm is None:
        out = out / cast(prod(s), inp.dtype)
    elif norm == "ortho":
        out = out / sqrt(cast(prod(s), inp.dtype))
    return out
