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

from math import gcd

from typing import Any, Sequence

import numpy as np

from symgpu.config import config
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.graph.op_alias import op_alias
from symgpu.scalar.dtypes import is_float, is_int, upcast
from symgpu.tensor import basic as _b
from symgpu.tensor import math as _m
from symgpu.tensor.basic import make_vector
from symgpu.tensor.nnet import conv_numpy as _cn
from symgpu.tensor.nnet.conv_helpers import assert_conv_shape, assert_shape  # noqa: F401 (Theano's names here)
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



# ------------------------------------------------------- Theano's other names of this module
# (issue 31): its op class names (aliases of our ops, built from Theano's constructor
# arguments), its shape arithmetic, and small convolution helpers built on conv2d
__all__ += ["BaseAbstractConv", "AbstractConv", "AbstractConv_gradInputs",
           "AbstractConv_gradWeights", "AbstractConv2d", "AbstractConv2d_gradInputs",
           "AbstractConv2d_gradWeights", "AbstractConv3d", "AbstractConv3d_gradInputs",
           "AbstractConv3d_gradWeights", "get_conv_shape_1axis", "get_conv_gradweights_shape",
           "get_conv_gradweights_shape_1axis", "get_conv_gradinputs_shape",
           "get_conv_gradinputs_shape_1axis", "check_conv_gradinputs_shape",
           "border_mode_to_pad", "bilinear_kernel_1D", "bilinear_kernel_2D", "separable_conv2d",
           "separable_conv3d", "causal_conv1d"]

_MODULE = "symgpu.tensor.nnet.abstract_conv"
_CLASSES = {(2, "fwd"): Conv2d, (2, "gi"): Conv2dGradInputs,
            (2, "gw"): Conv2dGradWeights, (3, "fwd"): Conv3d,
            (3, "gi"): Conv3dGradInputs, (3, "gw"): Conv3dGradWeights}


def _builder(nd: int | None, kind: str):
    """Theano's constructor: ([convdim,] imshp=None, kshp=None, border_mode='valid',
    subsample=(1,)*nd, filter_flip=True, filter_dilation=(1,)*nd, num_groups=1)."""
    def build(*args: Any, **kwargs: Any) -> Any:
        if nd is None:
            convdim, *rest = args if args else (kwargs.pop("convdim"),)
            args, dims = tuple(rest), int(convdim)
        else:
            dims = nd
        if (dims, kind) not in _CLASSES:
            raise ValueError(f"AbstractConv: convdim must be 2 or 3, got {dims}")
        names = ("imshp", "kshp", "border_mode", "subsample", "filter_flip", "filter_dilation",
                 "num_groups")
        given = dict(zip(names, args), **kwargs)
        if given.pop("unshared", False):
            raise ValueError("AbstractConv: unshared (locally connected) convolutions are not "
                             "supported; symgpu's convolutions share their filters")
        return _CLASSES[dims, kind](
            given.get("border_mode", "valid"), given.get("subsample"),
            given.get("filter_flip", True), given.get("filter_dilation"),
            given.get("num_groups", 1), given.get("imshp"), given.get("kshp"))
    return build


def _accepts(nd: int | None, kind: str):
    classes = tuple(c for (d, k), c in _CLASSES.items()
                    if k == kind and (nd is None or d == nd))
    return lambda op: isinstance(op, classes)


def _alias(name: str, nd: int | None, kind: str, what: str) -> type:
    sig = "(convdim, imshp, kshp, ...)" if nd is None else "(imshp, kshp, border_mode, ...)"
    return op_alias(name, _MODULE, _builder(nd, kind), _accepts(nd, kind),
                    f"Theano's {name}{sig}: our {what}; called as Theano's is")


AbstractConv2d = _alias("AbstractConv2d", 2, "fwd", "Conv2d, (input, filters)")
AbstractConv2d_gradInputs = _alias("AbstractConv2d_gradInputs", 2, "gi",
                                   "Conv2dGradInputs, (filters, output_grad, input_shape)")
AbstractConv2d_gradWeights = _alias("AbstractConv2d_gradWeights", 2, "gw",
                                    "Conv2dGradWeights, (input, output_grad, filter_shape)")
AbstractConv3d = _alias("AbstractConv3d", 3, "fwd", "Conv3d, (input, filters)")
AbstractConv3d_gradInputs = _alias("AbstractConv3d_gradInputs", 3, "gi",
                                   "Conv3dGradInputs, (filters, output_grad, input_shape)")
AbstractConv3d_gradWeights = _alias("AbstractConv3d_gradWeights", 3, "gw",
                                    "Conv3dGradWeights, (input, output_grad, filter_shape)")
AbstractConv = _alias("AbstractConv", None, "fwd", "Conv2d or Conv3d by convdim")
AbstractConv_gradInputs = _alias("AbstractConv_gradInputs", None, "gi",
                                 "Conv2dGradInputs or Conv3dGradInputs by convdim")
AbstractConv_gradWeights = _alias("AbstractConv_gradWeights", None, "gw",
                                  "Conv2dGradWeights or Conv3dGradWeights by convdim")


def _no_base(*args: Any, **kwargs: Any) -> Any:
    raise TypeError("BaseAbstractConv is the base of the convolution ops: build "
                    "AbstractConv2d/AbstractConv3d (or their gradients) instead")


BaseAbstractConv = op_alias("BaseAbstractConv", _MODULE, _no_base,
                            lambda op: isinstance(op, _ConvBase),
                            "Theano's base of the convolution ops: isinstance accepts every "
                            "convolution op of ours (forward and gradients, 2-d and 3-d)")


# ------------------------------------------------------------------------- shape arithmetic
def _pads_1axis(border_mode: Any, dil_kernel: int) -> tuple[int, int]:
    if border_mode == "half":
        return dil_kernel // 2, dil_kernel // 2
    if border_mode == "full":
        return dil_kernel - 1, dil_kernel - 1
    if border_mode == "valid":
        return 0, 0
    pads = tuple(border_mode) if isinstance(border_mode, (tuple, list)) else (border_mode,) * 2
    if len(pads) != 2 or min(pads) < 0:
        raise ValueError(f"border_mode must be 'valid', 'full', 'half', an int >= 0 or a pair "
                         f"of them; got {border_mode!r}")
    return int(pads[0]), int(pads[1])


def get_conv_shape_1axis(image_shape: Any, kernel_shape: Any, border_mode: Any,
                         subsample: Any, dilation: Any = 1) -> Any:
    """One axis of a convolution's output shape (None where any argument is None), as Theano."""
    if None in (image_shape, kernel_shape, border_mode, subsample, dilation):
        return None
    dil_kernel = (kernel_shape - 1) * dilation + 1
    lo, hi = _pads_1axis(border_mode, dil_kernel)
    return (image_shape + lo + hi - dil_kernel) // subsample + 1


def get_conv_gradweights_shape_1axis(image_shape: Any, top_shape: Any, border_mode: Any,
                                     subsample: Any, dilation: Any) -> Any:
    """One axis of the filters' shape from the input and output shapes; None where that is not
    determined (a None argument, subsampling, or 'half' padding), as Theano."""
    if None in (image_shape, top_shape, border_mode, subsample, dilation):
        return None
    if subsample != 1 or border_mode == "half":
        return None
    if border_mode == "full":
        kernel = top_shape - image_shape
    elif border_mode == "valid":
        kernel = image_shape - top_shape
    else:
        lo, hi = _pads_1axis(border_mode, 1)
        kernel = image_shape + lo + hi - top_shape
    if dilation > 1:
        kernel = kernel // dilation
    return kernel + 1


def get_conv_gradinputs_shape_1axis(kernel_shape: Any, top_shape: Any, border_mode: Any,
                                    subsample: Any, dilation: Any) -> Any:
    """One axis of the input's shape from the filters' and output's shapes; None where that is
    not determined (a None argument or subsampling), as Theano."""
    if None in (kernel_shape, top_shape, border_mode, subsample, dilation):
        return None
    if subsample != 1:
        return None
    dil_kernel = (kernel_shape - 1) * dilation + 1
    lo, hi = _pads_1axis(border_mode, dil_kernel)
    return top_shape + dil_kernel - 1 - lo - hi


def _per_axis(border_mode: Any, nd: int) -> list[Any]:
    if isinstance(border_mode, tuple):
        return list(border_mode)
    return [border_mode] * nd


def get_conv_gradweights_shape(image_shape: Sequence[Any], top_shape: Sequence[Any],
                               border_mode: Any, subsample: Sequence[int],
                               filter_dilation: Sequence[int] | None = None,
                               num_groups: int = 1) -> tuple:
    """The filters' shape (O, C/num_groups, *kernel) of a convolution from its input and output
    shapes (None entries where not determined)."""
    nd = len(subsample)
    dil = (1,) * nd if filter_dilation is None else tuple(filter_dilation)
    channels = image_shape[1] // num_groups if image_shape[1] is not None else None
    spatial = tuple(get_conv_gradweights_shape_1axis(image_shape[2 + i], top_shape[2 + i], b,
                                                     subsample[i], dil[i])
                    for i, b in enumerate(_per_axis(border_mode, nd)))
    return (top_shape[1], channels) + spatial


def get_conv_gradinputs_shape(kernel_shape: Sequence[Any], top_shape: Sequence[Any],
                              border_mode: Any, subsample: Sequence[int],
                              filter_dilation: Sequence[int] | None = None,
                              num_groups: int = 1) -> tuple:
    """The input's shape (N, C, *spatial) of a convolution from its filters' and output's
    shapes (None entries where not determined)."""
    nd = len(subsample)
    dil = (1,) * nd if filter_dilation is None else tuple(filter_dilation)
    channels = kernel_shape[1] * num_groups if kernel_shape[1] is not None else None
    spatial = tuple(get_conv_gradinputs_shape_1axis(kernel_shape[2 + i], top_shape[2 + i], b,
                                                    subsample[i], dil[i])
                    for i, b in enumerate(_per_axis(border_mode, nd)))
    return (top_shape[0], channels) + spatial


def check_conv_gradinputs_shape(image_shape: Sequence[Any], kernel_shape: Sequence[Any],
                                output_shape: Sequence[Any], border_mode: Any,
                                subsample: Sequence[int],
                                filter_dilation: Sequence[int] | None = None) -> bool:
    """Whether a convolution of `image_shape` by `kernel_shape` gives `output_shape` (None
    entries match anything): the check a transposed convolution's requested shape needs."""
    nd = len(subsample)
    if not len(image_shape) == len(kernel_shape) == len(output_shape) == nd + 2:
        return False
    dil = (1,) * nd if filter_dilation is None else tuple(filter_dilation)
    computed = (image_shape[0], kernel_shape[0]) + tuple(
        get_conv_shape_1axis(image_shape[2 + i], kernel_shape[2 + i], b, subsample[i], dil[i])
        for i, b in enumerate(_per_axis(border_mode, nd)))
    return all(g is None or c is None or int(g) == int(c)
               for g, c in zip(output_shape, computed))


def border_mode_to_pad(mode: Any, convdim: int, kshp: Sequence[int]) -> tuple:
    """((before, after), ...) per spatial axis for a border mode and (dilated) kernel shape."""
    if isinstance(mode, tuple):
        if len(mode) != convdim:
            raise ValueError(f"border_mode {mode!r} must have {convdim} entries")
        return tuple(_pads_1axis(m, 1) for m in mode)
    if isinstance(mode, (int, np.integer)) and not isinstance(mode, bool):
        return (_pads_1axis(int(mode), 1),) * convdim
    if mode not in ("valid", "full", "half"):
        raise ValueError(f"border_mode must be 'valid', 'full', 'half', an int or a tuple; "
                         f"got {mode!r}")
    return tuple(_pads_1axis(mode, int(kshp[i])) for i in range(convdim))


# ------------------------------------------------------------------------------ helpers
def bilinear_kernel_1D(ratio: int, normalize: bool = True) -> TensorVariable:
    """The 1-d bilinear upsampling kernel [1, 2, ..., ratio, ..., 2, 1] (/ ratio)."""
    half = _b.arange(1, ratio + 1, dtype=config.floatX)
    kern = _b.concatenate([half, half[-2::-1]])
    return kern / ratio if normalize else kern


def bilinear_kernel_2D(ratio: Any, normalize: bool = True) -> TensorVariable:
    """The 2-d bilinear upsampling kernel: the outer product of two 1-d ones (`ratio` an int,
    or (row ratio, column ratio))."""
    rv, rh = ratio if isinstance(ratio, tuple) else (ratio, ratio)
    return bilinear_kernel_1D(rv, normalize).dimshuffle(0, "x") * \
        bilinear_kernel_1D(rh, normalize).dimshuffle("x", 0)


def separable_conv2d(input: Any, depthwise_filters: Any, pointwise_filters: Any,
                     num_channels: int, input_shape: Any = None,
                     depthwise_filter_shape: Any = None, pointwise_filter_shape: Any = None,
                     border_mode: Any = "valid", subsample: Any = (1, 1),
                     filter_flip: bool = True, filter_dilation: Any = (1, 1)) -> TensorVariable:
    """A depthwise convolution (num_channels groups) followed by a 1x1 pointwise one."""
    depth = conv2d(input, depthwise_filters, input_shape, depthwise_filter_shape,
                       border_mode, subsample, filter_flip, filter_dilation, num_channels)
    return conv2d(depth, pointwise_filters, None, pointwise_filter_shape, "valid", (1, 1),
                      filter_flip, (1, 1))


def separable_conv3d(input: Any, depthwise_filters: Any, pointwise_filters: Any,
                     num_channels: int, input_shape: Any = None,
                     depthwise_filter_shape: Any = None, pointwise_filter_shape: Any = None,
                     border_mode: Any = "valid", subsample: Any = (1, 1, 1),
                     filter_flip: bool = True,
                     filter_dilation: Any = (1, 1, 1)) -> TensorVariable:
    """separable_conv2d's 3-d form."""
    depth = conv3d(input, depthwise_filters, input_shape, depthwise_filter_shape,
                       border_mode, subsample, filter_flip, filter_dilation, num_channels)
    return conv3d(depth, pointwise_filters, None, pointwise_filter_shape, "valid",
                      (1, 1, 1), filter_flip, (1, 1, 1))


def causal_conv1d(input: Any, filters: Any, filter_shape: Sequence[int], input_shape: Any = None,
                  subsample: int = 1, filter_flip: bool = True, filter_dilation: int = 1,
                  num_groups: int = 1, unshared: bool = False) -> TensorVariable:
    """A causal 1-d convolution of (N, C, L) by (O, C, k): output step t sees input steps
    <= t only (left padding of dilation * (k - 1)), as a 2-d one of width 1."""
    if unshared:
        raise ValueError("causal_conv1d: unshared (locally connected) convolutions are not "
                         "supported; symgpu's convolutions share their filters")
    input, filters = as_tensor_variable(input), as_tensor_variable(filters)
    left = filter_dilation * (filter_shape[2] - 1)
    out = conv2d(input.dimshuffle(0, 1, 2, "x"), filters.dimshuffle(0, 1, 2, "x"),
                     None if input_shape is None else tuple(input_shape) + (1,),
                     tuple(filter_shape) + (1,), ((left, 0), (0, 0)), (subsample, 1),
                     filter_flip, (filter_dilation, 1), num_groups)
    return out[:, :, :, 0]


# ----------------------------------------------------------------------------- bilinear upsampling
# a transposed convolution of the edge-padded input with the fixed bilinear kernel (Theano's
# construction): it runs wherever conv2d does (cuDNN on the GPU) and has its gradient

def _edge_padded(input: Any) -> tuple[TensorVariable, Any, Any]:
    """The (N*C, 1, H+2, W+2) stack of `input`'s maps with the first and last rows and
    columns repeated, and H, W."""
    row, col = input.shape[2], input.shape[3]
    up = input.reshape((-1, 1, row, col))
    mat = _b.concatenate((up[:, :, :1, :], up, up[:, :, -1:, :]), axis=2)
    mat = _b.concatenate((mat[:, :, :, :1], mat, mat[:, :, :, -1:]), axis=3)
    return mat, row, col


def frac_bilinear_upsampling(input: Any, frac_ratio: tuple) -> TensorVariable:
    """Bilinear upsampling of a (N, C, H, W) batch by a fractional ratio: `(p, q)` for both
    axes, or `((p_row, q_row), (p_col, q_col))`; each output axis is about size * p / q."""
    input = as_tensor_variable(input)
    if not isinstance(frac_ratio, tuple):
        raise ValueError(f"frac_ratio must be a tuple, got {frac_ratio!r}")
    if isinstance(frac_ratio[0], tuple):
        reduced = [tuple(np.array(fr) // gcd(*fr)) for fr in frac_ratio]
        ratio = (int(reduced[0][0]), int(reduced[1][0]))
        subsample = (int(reduced[0][1]), int(reduced[1][1]))
    else:
        p, q = np.array(frac_ratio) // gcd(*frac_ratio)
        ratio, subsample = (int(p), int(p)), (int(q), int(q))
    mat, row, col = _edge_padded(input)
    floatX = config.floatX
    double_pad = (2 * _b.as_tensor_variable([row, col]) - 1) * np.array(ratio) + 1
    pad = double_pad // 2
    kern = _m.cast(bilinear_kernel_2D(ratio=ratio), floatX).dimshuffle("x", "x", 0, 1)
    kw = kern.shape[3]
    pad_kern = _b.concatenate((_b.zeros((1, 1, pad[0], kw), dtype=floatX), kern,
                               _b.zeros((1, 1, double_pad[0] - pad[0], kw), dtype=floatX)),
                              axis=2)
    rows = pad_kern.shape[2]
    pad_kern = _b.concatenate((_b.zeros((1, 1, rows, pad[1]), dtype=floatX), pad_kern,
                               _b.zeros((1, 1, rows, double_pad[1] - pad[1]), dtype=floatX)),
                              axis=3)
    up = conv2d(pad_kern, _m.cast(mat, floatX), border_mode="valid", filter_dilation=ratio,
                subsample=subsample)
    return up.reshape((input.shape[0], input.shape[1], up.shape[2], up.shape[3]))


def bilinear_upsampling(input: Any, ratio: Any = None, frac_ratio: Any = None,
                        batch_size: int | None = None, num_input_channels: int | None = None,
                        use_1D_kernel: bool = True) -> TensorVariable:
    """Bilinear upsampling of a (N, C, H, W) batch by the integer `ratio` (result (N, C,
    H*ratio, W*ratio)), or by `frac_ratio` (see frac_bilinear_upsampling; always the 2-d kernel,
    where Theano asked for use_1D_kernel=False). The edges are repeated, so the first and last rows keep their
    values; `use_1D_kernel` upsamples rows then columns (same result as the 2-d kernel)."""
    if ratio and frac_ratio:
        raise ValueError("can't use ratio and frac_ratio together")
    if not (ratio or frac_ratio):
        raise ValueError("No ratio (or frac_ratio) provided")
    if frac_ratio:   # the 2-d kernel whatever use_1D_kernel says (Theano refused True; the
        return frac_bilinear_upsampling(input, frac_ratio=frac_ratio)   # result is the same)
    input = as_tensor_variable(input)
    try:
        up_bs = batch_size * num_input_channels
    except TypeError:
        up_bs = None
    mat, row, col = _edge_padded(input)
    pad = 2 * ratio - (ratio - 1) // 2 - 1
    if use_1D_kernel:
        kern = _m.cast(bilinear_kernel_1D(ratio=ratio, normalize=True), input.dtype)
        up_row = conv2d_grad_wrt_inputs(mat, kern.dimshuffle("x", "x", 0, "x"),
                                        input_shape=(up_bs, 1, row * ratio, col + 2),
                                        filter_shape=(1, 1, None, 1), border_mode=(pad, 0),
                                        subsample=(ratio, 1), filter_flip=True,
                                        filter_dilation=(1, 1))
        up = conv2d_grad_wrt_inputs(up_row, kern.dimshuffle("x", "x", "x", 0),
                                    input_shape=(up_bs, 1, row * ratio, col * ratio),
                                    filter_shape=(1, 1, 1, None), border_mode=(0, pad),
                                    subsample=(1, ratio), filter_flip=True,
                                    filter_dilation=(1, 1))
    else:
        kern = _m.cast(bilinear_kernel_2D(ratio=ratio, normalize=True), input.dtype)
        up = conv2d_grad_wrt_inputs(mat, kern.dimshuffle("x", "x", 0, 1),
                                    input_shape=(up_bs, 1, row * ratio, col * ratio),
                                    filter_shape=(1, 1, None, None), border_mode=(pad, pad),
                                    subsample=(ratio, ratio), filter_flip=True,
                                    filter_dilation=(1, 1))
    return up.reshape((input.shape[0], input.shape[1], row * ratio, col * ratio))
