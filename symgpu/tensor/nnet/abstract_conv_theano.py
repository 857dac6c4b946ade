"""theano.tensor.nnet.abstract_conv's other documented names (issue 31): its op class names
(aliases of our Conv2d/Conv3d ops, built from Theano's constructor arguments), its shape
arithmetic, and its small convolution helpers built on our conv2d. Re-exported by
symgpu.tensor.nnet.abstract_conv (Theano's module)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.config import config
from symgpu.graph.op_alias import op_alias
from symgpu.tensor import basic as _b
from symgpu.tensor.nnet import abstract_conv as _ac
from symgpu.tensor.type import TensorVariable, as_tensor_variable

__all__ = ["BaseAbstractConv", "AbstractConv", "AbstractConv_gradInputs",
           "AbstractConv_gradWeights", "AbstractConv2d", "AbstractConv2d_gradInputs",
           "AbstractConv2d_gradWeights", "AbstractConv3d", "AbstractConv3d_gradInputs",
           "AbstractConv3d_gradWeights", "get_conv_shape_1axis", "get_conv_gradweights_shape",
           "get_conv_gradweights_shape_1axis", "get_conv_gradinputs_shape",
           "get_conv_gradinputs_shape_1axis", "check_conv_gradinputs_shape",
           "border_mode_to_pad", "bilinear_kernel_1D", "bilinear_kernel_2D", "separable_conv2d",
           "separable_conv3d", "causal_conv1d"]

_MODULE = "symgpu.tensor.nnet.abstract_conv"
_CLASSES = {(2, "fwd"): _ac.Conv2d, (2, "gi"): _ac.Conv2dGradInputs,
            (2, "gw"): _ac.Conv2dGradWeights, (3, "fwd"): _ac.Conv3d,
            (3, "gi"): _ac.Conv3dGradInputs, (3, "gw"): _ac.Conv3dGradWeights}


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
                            lambda op: isinstance(op, _ac._ConvBase),
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


def bilinear_kernel_2D(ratio: int, normalize: bool = True) -> TensorVariable:
    """The 2-d bilinear upsampling kernel: the outer product of two 1-d ones."""
    k = bilinear_kernel_1D(ratio, normalize)
    return k.dimshuffle(0, "x") * k.dimshuffle("x", 0)


def separable_conv2d(input: Any, depthwise_filters: Any, pointwise_filters: Any,
                     num_channels: int, input_shape: Any = None,
                     depthwise_filter_shape: Any = None, pointwise_filter_shape: Any = None,
                     border_mode: Any = "valid", subsample: Any = (1, 1),
                     filter_flip: bool = True, filter_dilation: Any = (1, 1)) -> TensorVariable:
    """A depthwise convolution (num_channels groups) followed by a 1x1 pointwise one."""
    depth = _ac.conv2d(input, depthwise_filters, input_shape, depthwise_filter_shape,
                       border_mode, subsample, filter_flip, filter_dilation, num_channels)
    return _ac.conv2d(depth, pointwise_filters, None, pointwise_filter_shape, "valid", (1, 1),
                      filter_flip, (1, 1))


def separable_conv3d(input: Any, depthwise_filters: Any, pointwise_filters: Any,
                     num_channels: int, input_shape: Any = None,
                     depthwise_filter_shape: Any = None, pointwise_filter_shape: Any = None,
                     border_mode: Any = "valid", subsample: Any = (1, 1, 1),
                     filter_flip: bool = True,
                     filter_dilation: Any = (1, 1, 1)) -> TensorVariable:
    """separable_conv2d's 3-d form."""
    depth = _ac.conv3d(input, depthwise_filters, input_shape, depthwise_filter_shape,
                       border_mode, subsample, filter_flip, filter_dilation, num_channels)
    return _ac.conv3d(depth, pointwise_filters, None, pointwise_filter_shape, "valid",
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
    out = _ac.conv2d(input.dimshuffle(0, 1, 2, "x"), filters.dimshuffle(0, 1, 2, "x"),
                     None if input_shape is None else tuple(input_shape) + (1,),
                     tuple(filter_shape) + (1,), ((left, 0), (0, 0)), (subsample, 1),
                     filter_flip, (filter_dilation, 1), num_groups)
    return out[:, :, :, 0]
