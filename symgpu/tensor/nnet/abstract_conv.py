"""N-d convolution Ops with Theano's abstract_conv semantics: `conv2d` and `conv3d` and their
two gradients each, `conv{2,3}d_grad_wrt_inputs` (the transposed convolution) and
`conv{2,3}d_grad_wrt_weights`.

The Ops of one dimensionality share one geometry (`_ConvBase.__props__`) and their gradients
are written in terms of each other, so any order of derivative stays inside these three Ops;
the code of each role is written once for any number of spatial axes (`_ConvBase.nd`) and the
2-d and 3-d Ops are its two instances (distinct classes: the GPU backend lifts the 2-d ones to
cuDNN). The CPU work is in `conv_numpy` (im2col + BLAS).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import is_float, is_int, upcast
from symgpu.tensor import math as _m
from symgpu.tensor.basic import make_vector
from symgpu.tensor.nnet import conv_numpy as _cn
from symgpu.tensor.shape import shape_i
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable

__all__ = ["Conv2d", "Conv2dGradInputs", "Conv2dGradWeights", "conv2d",
           "conv2d_grad_wrt_inputs", "conv2d_grad_wrt_weights", "conv2d_transpose",
           "get_conv_output_shape", "Conv3d", "Conv3dGradInputs", "Conv3dGradWeights", "conv3d",
           "conv3d_grad_wrt_inputs", "conv3d_grad_wrt_weights"]

_LAYOUT = {2: ("N, C, H, W", "O, C/g, kh, kw"), 3: ("N, C, D, H, W", "O, C/g, kd, kh, kw")}


def _hint(shape: Any, what: str, nd: int = 2) -> tuple | None:
    """An (nd+2)-entry shape hint of ints/None (symbolic entries count as unknown)."""
    if shape is None:
        return None
    shape = tuple(shape)
    if len(shape) != nd + 2:
        raise ValueError(f"{what} must have {nd + 2} entries ({_LAYOUT[nd][0]} or "
                         f"{_LAYOUT[nd][1]}), got {shape!r}")
    return tuple(int(s) if isinstance(s, (int, np.integer)) else None for s in shape)


class _ConvBase(Op):
    """The geometry every conv Op carries; `imshp`/`kshp` are the user's optional shape hints,
    checked against the runtime shapes. `nd` (a class attribute) is the number of spatial axes;
    subsample and filter_dilation default to ones."""

    nd = 2
    __props__ = ("border_mode", "subsample", "filter_flip", "filter_dilation", "num_groups",
                 "imshp", "kshp")
    #: the output shape is host arithmetic on the inputs' shapes (and the shape input): shape
    #: reads of the output are rewritten to it, so nothing on the host waits for the
    #: convolution (tensor/rewriting/shape_feature.py; one CUDA graph on the GPU)
    shape_from_inputs = True

    def __init__(self, border_mode: Any = "valid", subsample: Any = None,
                 filter_flip: bool = True, filter_dilation: Any = None, num_groups: int = 1,
                 imshp: Any = None, kshp: Any = None):
        nd = self.nd
        self.border_mode = _cn.normalize_border_mode(border_mode, nd)
        self.subsample = _cn.normalize_tuple(1 if subsample is None else subsample,
                                             "subsample", nd)
        self.filter_flip = bool(filter_flip)
        self.filter_dilation = _cn.normalize_tuple(1 if filter_dilation is None
                                                   else filter_dilation, "filter_dilation", nd)
        if not isinstance(num_groups, (int, np.integer)) or num_groups < 1:
            raise ValueError(f"num_groups must be a positive int, got {num_groups!r}")
        self.num_groups = int(num_groups)
        self.imshp = _hint(imshp, "input_shape", nd)
        self.kshp = _hint(kshp, "filter_shape", nd)

    def __str__(self) -> str:
        return (f"{type(self).__name__}{{{self.border_mode}, {self.subsample}, "
                f"flip={self.filter_flip}, dilation={self.filter_dilation}, "
                f"groups={self.num_groups}}}")

    def geometry(self) -> dict:
        """The props that define the computation (hints left out), for building sibling Ops."""
        return dict(border_mode=self.border_mode, subsample=self.subsample,
                    filter_flip=self.filter_flip, filter_dilation=self.filter_dilation,
                    num_groups=self.num_groups, imshp=self.imshp, kshp=self.kshp)

    def pads(self, kshape: Sequence[Any]) -> tuple:
        return _cn.resolve_pads(self.border_mode, kshape, self.filter_dilation)

    def _check_hint(self, hint: tuple | None, actual: Sequence[int], what: str) -> None:
        if hint is None:
            return
        for h, a in zip(hint, actual):
            if h is not None and h != a:
                raise ValueError(f"{self}: {what} was declared as {hint} but the runtime value "
                                 f"has shape {tuple(actual)}")

    def _float_in(self, v: Any, what: str, who: Any) -> TensorVariable:
        v = as_tensor_variable(v)
        if v.ndim != self.nd + 2 or not is_float(v.dtype):
            raise TypeError(f"{who}: {what} must be a {self.nd + 2}-d float tensor "
                            f"({_LAYOUT[self.nd][0]} layout), got {v.type}")
        return v

    def _shape2(self, shape: Any, who: Any) -> TensorVariable:
        """The spatial-shape input (nd entries: 2 for the 2-d Ops, whence the name)."""
        nd = self.nd
        if isinstance(shape, (tuple, list)):
            if len(shape) != nd:
                raise ValueError(f"{who}: the spatial shape needs {nd} entries, got {shape!r}")
            shape = make_vector(*shape, dtype="int64")
        shape = as_tensor_variable(shape)
        if shape.ndim != 1 or not is_int(shape.dtype):
            raise TypeError(f"{who}: the spatial shape must be an int vector of length {nd}, "
                            f"got {shape.type}")
        return shape

    def out_hw(self, hw: Sequence[Any], khw: Sequence[Any]) -> list[Any]:
        """Output spatial lengths (ints or symbolic scalars)."""
        pads = self.pads(khw)
        return [_cn.conv_out_size(hw[a], khw[a], pads[a], self.subsample[a],
                                  self.filter_dilation[a]) for a in range(self.nd)]

    def _sibling(self, role: str) -> type:
        """The Op class of `role` ('fwd', 'grad_inputs', 'grad_weights') and this op's nd."""
        return _FAMILIES[self.nd][role]

    def _spatial_of(self, v: TensorVariable) -> list[TensorVariable]:
        return [shape_i(v, 2 + a) for a in range(self.nd)]


class _ConvForward(_ConvBase):
    """conv(input, filters): input (N, C, *spatial), filters (O, C/num_groups, *kernel) ->
    (N, O, *out)."""

    def make_node(self, img: Any, kern: Any) -> Apply:
        img, kern = self._float_in(img, "input", self), self._float_in(kern, "filters", self)
        dtype = upcast(img.dtype, kern.dtype)
        out = TensorType(dtype, (img.broadcastable[0], kern.broadcastable[0])
                         + (False,) * self.nd)()
        return Apply(self, [img, kern], [out])

    def perform(self, node, inputs, out):
        x, w = inputs
        self._check_hint(self.imshp, x.shape, "input_shape")
        self._check_hint(self.kshp, w.shape, "filter_shape")
        out[0][0] = _cn.conv_forward(x, w, self.pads(w.shape[2:]), self.subsample,
                                     self.filter_dilation, self.filter_flip, self.num_groups,
                                     node.outputs[0].dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        ishp, kshp = input_shapes
        return [(ishp[0], kshp[0], *self.out_hw(ishp[2:], kshp[2:]))]

    def grad(self, inputs, output_grads):
        img, kern = inputs
        (gy,) = output_grads
        geo = self.geometry()
        gx = self._sibling("grad_inputs")(**geo)(kern, gy, self._spatial_of(img))
        gw = self._sibling("grad_weights")(**geo)(img, gy, self._spatial_of(kern))
        return [_m.cast(gx, img.dtype), _m.cast(gw, kern.dtype)]


class _ConvGradInputs(_ConvBase):
    """(filters, output_grad, input spatial shape) -> d conv / d input: the transposed
    convolution. The spatial shape is needed because subsampling loses it."""

    def make_node(self, kern: Any, topgrad: Any, shape: Any) -> Apply:
        kern = self._float_in(kern, "filters", self)
        topgrad = self._float_in(topgrad, "output_grad", self)
        shape = self._shape2(shape, self)
        dtype = upcast(kern.dtype, topgrad.dtype)
        out = TensorType(dtype, (topgrad.broadcastable[0], kern.broadcastable[1])
                         + (False,) * self.nd)()
        return Apply(self, [kern, topgrad, shape], [out])

    def perform(self, node, inputs, out):
        w, gy, hw = inputs
        self._check_hint(self.kshp, w.shape, "filter_shape")
        res = _cn.conv_grad_inputs(w, gy, hw, self.pads(w.shape[2:]), self.subsample,
                                   self.filter_dilation, self.filter_flip, self.num_groups,
                                   node.outputs[0].dtype)
        self._check_hint(self.imshp, res.shape, "input_shape")
        out[0][0] = res

    def infer_shape(self, fgraph, node, input_shapes):
        kern, gy, shape = node.inputs
        kshp, gshp, _ = input_shapes
        return [(gshp[0], kshp[1] * self.num_groups,
                 *(_as_i64(shape[a]) for a in range(self.nd)))]

    def grad(self, inputs, output_grads):
        kern, topgrad, shape = inputs
        (g,) = output_grads
        geo = self.geometry()
        # <dx, g> = <conv(g, w), gy>: linear in both w and gy
        gw = self._sibling("grad_weights")(**geo)(g, topgrad, self._spatial_of(kern))
        gtop = self._sibling("fwd")(**geo)(g, kern)
        return [_m.cast(gw, kern.dtype), _m.cast(gtop, topgrad.dtype), None]


class _ConvGradWeights(_ConvBase):
    """(input, output_grad, filter spatial shape) -> d conv / d filters."""

    def make_node(self, img: Any, topgrad: Any, shape: Any) -> Apply:
        img = self._float_in(img, "input", self)
        topgrad = self._float_in(topgrad, "output_grad", self)
        shape = self._shape2(shape, self)
        dtype = upcast(img.dtype, topgrad.dtype)
        out = TensorType(dtype, (topgrad.broadcastable[1],) + (False,) * (self.nd + 1))()
        return Apply(self, [img, topgrad, shape], [out])

    def perform(self, node, inputs, out):
        x, gy, khw = inputs
        self._check_hint(self.imshp, x.shape, "input_shape")
        khw = tuple(int(k) for k in khw)
        res = _cn.conv_grad_weights(x, gy, khw, self.pads(khw), self.subsample,
                                    self.filter_dilation, self.filter_flip, self.num_groups,
                                    node.outputs[0].dtype)
        self._check_hint(self.kshp, res.shape, "filter_shape")
        out[0][0] = res

    def infer_shape(self, fgraph, node, input_shapes):
        img, gy, shape = node.inputs
        ishp, gshp, _ = input_shapes
        return [(gshp[1], ishp[1] // self.num_groups,
                 *(_as_i64(shape[a]) for a in range(self.nd)))]

    def grad(self, inputs, output_grads):
        img, topgrad, shape = inputs
        (g,) = output_grads
        geo = self.geometry()
        # <dw, g> = <conv(x, g), gy>
        gx = self._sibling("grad_inputs")(**geo)(g, topgrad, self._spatial_of(img))
        gtop = self._sibling("fwd")(**geo)(img, g)
        return [_m.cast(gx, img.dtype), _m.cast(gtop, topgrad.dtype), None]


class Conv2d(_ConvForward):
    """conv2d(input, filters): input (N, C, H, W), filters (O, C/num_groups, kh, kw) ->
    (N, O, Ho, Wo)."""

    nd = 2


class Conv2dGradInputs(_ConvGradInputs):
    """(filters, output_grad, input spatial shape (H, W)) -> d conv2d / d input: the
    transposed convolution."""

    nd = 2


class Conv2dGradWeights(_ConvGradWeights):
    """(input, output_grad, filter spatial shape (kh, kw)) -> d conv2d / d filters."""

    nd = 2


class Conv3d(_ConvForward):
    """conv3d(input, filters): input (N, C, D, H, W), filters (O, C/num_groups, kd, kh, kw)
    -> (N, O, Do, Ho, Wo) (Theano's AbstractConv3d)."""

    nd = 3


class Conv3dGradInputs(_ConvGradInputs):
    """(filters, output_grad, input spatial shape (D, H, W)) -> d conv3d / d input
    (Theano's AbstractConv3d_gradInputs)."""

    nd = 3


class Conv3dGradWeights(_ConvGradWeights):
    """(input, output_grad, filter spatial shape (kd, kh, kw)) -> d conv3d / d filters
    (Theano's AbstractConv3d_gradWeights)."""

    nd = 3


_FAMILIES: dict[int, dict[str, type]] = {
    2: {"fwd": Conv2d, "grad_inputs": Conv2dGradInputs, "grad_weights": Conv2dGradWeights},
    3: {"fwd": Conv3d, "grad_inputs": Conv3dGradInputs, "grad_weights": Conv3dGradWeights},
}


def _as_i64(v: Any) -> TensorVariable:
    return _m.cast(v, "int64")


def _spatial(shape: Any, what: str, nd: int = 2) -> list[Any]:
    """The last nd entries of an (nd+2)-entry shape (ints or symbolic scalars), which must be
    given."""
    if shape is None or len(shape) != nd + 2:
        raise ValueError(f"{what} must be a {nd + 2}-entry shape whose last {nd} entries are "
                         f"given, got {shape!r}")
    hw = list(shape[2:])
    if any(v is None for v in hw):
        raise ValueError(f"{what}: the spatial entries must be given, got {shape!r}")
    return hw


def conv2d(input: Any, filters: Any, input_shape: Any = None, filter_shape: Any = None,
           border_mode: Any = "valid", subsample: Any = (1, 1), filter_flip: bool = True,
           filter_dilation: Any = (1, 1), num_groups: int = 1, *,
           image_shape: Any = None) -> TensorVariable:
    """Theano's 2-d convolution of a (N, C, H, W) batch with (O, C/num_groups, kh, kw) filters.

    border_mode: 'valid' (no padding), 'full' (pad kh-1), 'half' (pad kh//2: same size for odd
    kernels), an int, (int, int) or ((top, bottom), (left, right)). filter_flip=True flips the
    filters (true convolution); False computes the cross-correlation most frameworks call
    convolution. input_shape / filter_shape are optional hints, checked at run time
    (`image_shape` is Theano's older name of input_shape)."""
    if image_shape is not None:
        if input_shape is not None:
            raise ValueError("conv2d: give input_shape or its old name image_shape, not both")
        input_shape = image_shape
    op = Conv2d(border_mode, subsample, filter_flip, filter_dilation, num_groups,
                input_shape, filter_shape)
    return op(input, filters)


def conv2d_grad_wrt_inputs(output_grad: Any, filters: Any, input_shape: Any,
                           filter_shape: Any = None, border_mode: Any = "valid",
                           subsample: Any = (1, 1), filter_flip: bool = True,
                           filter_dilation: Any = (1, 1), num_groups: int = 1) -> TensorVariable:
    """The gradient of conv2d with respect to its input (= the transposed convolution of
    `output_grad` with `filters`). `input_shape` (N, C, H, W): H and W must be given (ints or
    symbolic scalars), the others may be None."""
    hw = _spatial(input_shape, "input_shape")
    op = Conv2dGradInputs(border_mode, subsample, filter_flip, filter_dilation, num_groups,
                          input_shape, filter_shape)
    return op(filters, output_grad, hw)


def conv2d_grad_wrt_weights(input: Any, output_grad: Any, filter_shape: Any,
                            input_shape: Any = None, border_mode: Any = "valid",
                            subsample: Any = (1, 1), filter_flip: bool = True,
                            filter_dilation: Any = (1, 1), num_groups: int = 1) -> TensorVariable:
    """The gradient of conv2d with respect to its filters. `filter_shape` (O, C/g, kh, kw):
    kh and kw must be given, the others may be None."""
    khw = _spatial(filter_shape, "filter_shape")
    op = Conv2dGradWeights(border_mode, subsample, filter_flip, filter_dilation, num_groups,
                           input_shape, filter_shape)
    return op(input, output_grad, khw)


def conv2d_transpose(input: Any, filters: Any, output_shape: Any, filter_shape: Any = None,
                     border_mode: Any = "valid", input_dilation: Any = (1, 1),
                     filter_flip: bool = True, filter_dilation: Any = (1, 1),
                     num_groups: int = 1) -> TensorVariable:
    """Transposed convolution ("deconvolution") as in Theano: the gradient of the conv2d that
    would map `output_shape` to `input`'s shape, with `input_dilation` as its subsample."""
    return conv2d_grad_wrt_inputs(input, filters, output_shape, filter_shape, border_mode,
                                  input_dilation, filter_flip, filter_dilation, num_groups)


def get_conv_output_shape(image_shape: Sequence[int], kernel_shape: Sequence[int],
                          border_mode: Any, subsample: Sequence[int],
                          filter_dilation: Sequence[int] | None = None) -> tuple:
    """(N, O, Ho, Wo) -- or (N, O, Do, Ho, Wo) for 5-entry shapes -- for the given shapes
    (Theano's helper of the same name); filter_dilation defaults to ones."""
    nd = len(image_shape) - 2
    return _cn.conv_output_shape(image_shape, kernel_shape, border_mode,
                                 _cn.normalize_tuple(subsample, "subsample", nd),
                                 _cn.normalize_tuple(1 if filter_dilation is None
                                                     else filter_dilation, "filter_dilation",
                                                     nd))


def conv3d(input: Any, filters: Any, input_shape: Any = None, filter_shape: Any = None,
           border_mode: Any = "valid", subsample: Any = (1, 1, 1), filter_flip: bool = True,
           filter_dilation: Any = (1, 1, 1), num_groups: int = 1) -> TensorVariable:
    """Theano's 3-d convolution of a (N, C, D, H, W) batch with (O, C/num_groups, kd, kh, kw)
    filters -> (N, O, Do, Ho, Wo).

    border_mode: 'valid' (no padding), 'full' (pad k-1 on each axis), 'half' (pad k//2), an int,
    three ints, or three (before, after) pairs. filter_flip=True flips the filters in all three
    spatial axes (true convolution); False computes the cross-correlation. subsample and
    filter_dilation: an int or three. input_shape / filter_shape are optional 5-entry hints
    (ints or None), checked at run time."""
    op = Conv3d(border_mode, subsample, filter_flip, filter_dilation, num_groups,
                input_shape, filter_shape)
    return op(input, filters)


def conv3d_grad_wrt_inputs(output_grad: Any, filters: Any, input_shape: Any,
                           filter_shape: Any = None, border_mode: Any = "valid",
                           subsample: Any = (1, 1, 1), filter_flip: bool = True,
                           filter_dilation: Any = (1, 1, 1),
                           num_groups: int = 1) -> TensorVariable:
    """The gradient of conv3d with respect to its input (= the transposed 3-d convolution of
    `output_grad` with `filters`). `input_shape` (N, C, D, H, W): D, H and W must be given
    (ints or symbolic scalars), the others may be None."""
    dhw = _spatial(input_shape, "input_shape", 3)
    op = Conv3dGradInputs(border_mode, subsample, filter_flip, filter_dilation, num_groups,
                          input_shape, filter_shape)
    return op(filters, output_grad, dhw)


def conv3d_grad_wrt_weights(input: Any, output_grad: Any, filter_shape: Any,
                            input_shape: Any = None, border_mode: Any = "valid",
                            subsample: Any = (1, 1, 1), filter_flip: bool = True,
                            filter_dilation: Any = (1, 1, 1),
                            num_groups: int = 1) -> TensorVariable:
    """The gradient of conv3d with respect to its filters. `filter_shape` (O, C/g, kd, kh, kw):
    kd, kh and kw must be given, the others may be None."""
    k = _spatial(filter_shape, "filter_shape", 3)
    op = Conv3dGradWeights(border_mode, subsample, filter_flip, filter_dilation, num_groups,
                           input_shape, filter_shape)
    return op(input, output_grad, k)


# Theano's other names of this module (op class aliases, shape arithmetic, helpers): defined
# beside it to keep this file about the ops; imported last, as they build on the above
from symgpu.tensor.nnet.abstract_conv_theano import *  # noqa: E402,F401,F403
from symgpu.tensor.nnet import abstract_conv_theano as _theano  # noqa: E402

__all__ += _theano.__all__
