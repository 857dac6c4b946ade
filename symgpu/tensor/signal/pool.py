"""N-d pooling with Theano's semantics: `pool_2d` and `pool_3d`, the 2-d Ops `Pool`,
`MaxPoolGrad`, `AveragePoolGrad` (and `MaxPoolGradGrad` for second derivatives) and their 3-d
twins `Pool3d`, `MaxPoolGrad3d`, `AveragePoolGrad3d`, `MaxPoolGradGrad3d`.

Pooling acts on the last `nd` axes (2 or 3) of an input of nd or more dimensions. Window size,
stride and padding are Op parameters (Python ints), so the GPU backend can hand them to its
kernels as they are. The code of each role is written once for any `nd` (a class attribute);
the 2-d and 3-d Ops are distinct classes (the GPU backend lifts the 2-d ones).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.tensor import math as _m
from symgpu.tensor.signal import pool_dynamic as _pd
from symgpu.tensor.signal import pool_numpy as _pn
from symgpu.tensor.type import TensorVariable, as_tensor_variable

__all__ = ["Pool", "MaxPoolGrad", "AveragePoolGrad", "MaxPoolGradGrad", "pool_2d",
           "max_pool_2d_same_size",
           "pool_output_shape", "Pool3d", "MaxPoolGrad3d", "AveragePoolGrad3d",
           "MaxPoolGradGrad3d", "pool_3d"]

_AXES = {2: "two", 3: "three"}


def _ints(v: Any, what: str, minimum: int, nd: int) -> tuple[int, ...]:
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        v = (v,) * nd
    try:
        tup = tuple(int(i) for i in v)
    except (TypeError, ValueError):
        tup = ()
    if len(tup) != nd or min(tup) < minimum:
        kind = "a pair" if nd == 2 else f"{nd}"
        raise ValueError(f"pool_{nd}d: {what} must be {kind} of ints >= {minimum}, got {v!r}")
    return tup


class _PoolBase(Op):
    """The parameters every pooling Op carries; `nd` (a class attribute) is the number of
    pooled (trailing) axes. pad defaults to zeros."""

    nd = 2
    __props__ = ("ws", "stride", "pad", "ignore_border", "mode")
    #: the output shape is host arithmetic on the input's shape: shape reads of the output
    #: are rewritten to it (tensor/rewriting/shape_feature.py), see _ConvBase
    shape_from_inputs = True

    def __init__(self, ws: Any, stride: Any = None, pad: Any = None,
                 ignore_border: bool = True, mode: str = "max"):
        nd = self.nd
        who = f"pool_{nd}d"
        self.ws = _ints(ws, "ws", 1, nd)
        self.stride = self.ws if stride is None else _ints(stride, "stride", 1, nd)
        self.pad = _ints(0 if pad is None else pad, "pad", 0, nd)
        self.ignore_border = bool(ignore_border)
        if mode == "average":  # Theano's older spelling
            mode = "average_inc_pad"
        if mode not in _pn.MODES:
            raise ValueError(f"{who}: mode must be one of {_pn.MODES}, got {mode!r}")
        self.mode = mode
        if any(self.pad) and not self.ignore_border:
            raise ValueError(f"{who}: padding works only with ignore_border=True "
                             f"(pad={self.pad})")
        if any(p >= w for p, w in zip(self.pad, self.ws)):
            raise ValueError(f"{who}: pad {self.pad} must be smaller than the window {self.ws}")

    def __str__(self) -> str:
        return (f"{type(self).__name__}{{{self.mode}, ws={self.ws}, stride={self.stride}, "
                f"pad={self.pad}, ignore_border={self.ignore_border}}}")

    def params(self) -> dict:
        return dict(ws=self.ws, stride=self.stride, pad=self.pad,
                    ignore_border=self.ignore_border, mode=self.mode)

    def _input(self, x: Any, what: str = "input") -> TensorVariable:
        x = as_tensor_variable(x)
        if x.ndim < self.nd:
            raise TypeError(f"{self}: {what} needs at least {self.nd} dimensions (pooling acts "
                            f"on the last {_AXES[self.nd]}), got {x.type}")
        return x

    def out_shape(self, shape: tuple) -> tuple:
        """Output shape for an input shape of ints or symbolic scalars."""
        nd = self.nd
        lead = len(shape) - nd
        symbolic = any(isinstance(s, TensorVariable) for s in shape[lead:])
        mx = (lambda a, b: _m.maximum(a, b)) if symbolic else max
        return tuple(shape[:lead]) + tuple(
            _pn.pool_out_len(shape[lead + a], self.ws[a], self.stride[a], self.pad[a],
                             self.ignore_border, mx) for a in range(nd))

    def _sibling(self, role: str) -> type:
        """The Op class of `role` ('pool', 'max_grad', 'max_grad_grad', 'average_grad') and
        this op's nd."""
        return _FAMILIES[self.nd][role]


class _PoolOp(_PoolBase):
    """Max, sum or average over windows of the last nd axes."""

    def make_node(self, x: Any) -> Apply:
        x = self._input(x)
        bc = x.broadcastable[:x.ndim - self.nd] + (False,) * self.nd
        return Apply(self, [x], [x.type.clone(broadcastable=bc)()])

    def perform(self, node, inputs, out):
        out[0][0] = _pn.pool_forward(inputs[0], self.ws, self.stride, self.pad,
                                     self.ignore_border, self.mode)

    def infer_shape(self, fgraph, node, input_shapes):
        return [self.out_shape(tuple(input_shapes[0]))]

    def L_op(self, inputs, outputs, output_grads):
        (x,), (z,), (gz,) = inputs, outputs, output_grads
        if self.mode == "max":
            return [self._sibling("max_grad")(**self.params())(x, z, gz)]
        return [self._sibling("average_grad")(**self.params())(x, gz)]

    def grad(self, inputs, output_grads):
        return self.L_op(inputs, [self(inputs[0])], output_grads)


class _MaxPoolGradOp(_PoolBase):
    """(x, maxout, gz) -> gx: each window's gz goes to the elements equal to its maximum."""

    def make_node(self, x: Any, maxout: Any, gz: Any) -> Apply:
        x = self._input(x)
        maxout, gz = self._input(maxout, "maxout"), self._input(gz, "output gradient")
        if self.mode != "max":
            raise ValueError(f"{self}: {type(self).__name__} is for mode='max'")
        if not (x.ndim == maxout.ndim == gz.ndim):
            raise TypeError(f"{self}: x, maxout and gz must have the same number of dimensions, "
                            f"got {x.type}, {maxout.type}, {gz.type}")
        return Apply(self, [x, maxout, gz], [x.type()])

    def perform(self, node, inputs, out):
        x, maxout, gz = inputs
        out[0][0] = _pn.max_pool_grad(x, maxout, gz, self.ws, self.stride, self.pad,
                                      self.ignore_border)

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]

    def grad(self, inputs, output_grads):
        x, maxout, gz = inputs
        (ggx,) = output_grads
        return [_m.zeros_like(x), _m.zeros_like(maxout),
                self._sibling("max_grad_grad")(**self.params())(x, maxout, ggx)]


class _MaxPoolGradGradOp(_PoolBase):
    """(x, maxout, ggx) -> ggz: the adjoint of MaxPoolGrad in gz (for second derivatives)."""

    def make_node(self, x: Any, maxout: Any, ggx: Any) -> Apply:
        x, maxout, ggx = self._input(x), self._input(maxout, "maxout"), self._input(ggx, "ggx")
        return Apply(self, [x, maxout, ggx], [maxout.type()])

    def perform(self, node, inputs, out):
        x, maxout, ggx = inputs
        out[0][0] = _pn.max_pool_grad_grad(x, maxout, ggx, self.ws, self.stride, self.pad,
                                           self.ignore_border)

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[1])]

    def grad(self, inputs, output_grads):
        x, maxout, ggx = inputs
        (g,) = output_grads
        return [_m.zeros_like(x), _m.zeros_like(maxout),
                self._sibling("max_grad")(**self.params())(x, maxout, g)]


class _AveragePoolGradOp(_PoolBase):
    """(x, gz) -> gx for 'sum' and the averages: each window spreads gz / its count."""

    def make_node(self, x: Any, gz: Any) -> Apply:
        x, gz = self._input(x), self._input(gz, "output gradient")
        if self.mode == "max":
            raise ValueError(f"{self}: {type(self).__name__} is not for mode='max'")
        return Apply(self, [x, gz], [x.type()])

    def perform(self, node, inputs, out):
        x, gz = inputs
        out[0][0] = _pn.average_pool_grad(x.shape, gz, self.ws, self.stride, self.pad,
                                          self.ignore_border, self.mode, node.outputs[0].dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]

    def grad(self, inputs, output_grads):
        x, gz = inputs
        (ggx,) = output_grads
        # gx is linear in gz (and independent of x's values): the adjoint is the pooling itself
        return [_m.zeros_like(x), self._sibling("pool")(**self.params())(ggx)]


class Pool(_PoolOp):
    """Max, sum or average over windows of the last two axes."""

    nd = 2


class MaxPoolGrad(_MaxPoolGradOp):
    """(x, maxout, gz) -> gx of 2-d max pooling: each window's gz goes to the elements equal
    to its maximum."""

    nd = 2


class MaxPoolGradGrad(_MaxPoolGradGradOp):
    """(x, maxout, ggx) -> ggz: the adjoint of MaxPoolGrad in gz (for second derivatives)."""

    nd = 2


class AveragePoolGrad(_AveragePoolGradOp):
    """(x, gz) -> gx of 2-d 'sum' and average pooling: each window spreads gz / its count."""

    nd = 2


class Pool3d(_PoolOp):
    """Max, sum or average over windows of the last three axes (Theano's Pool(ndim=3))."""

    nd = 3


class MaxPoolGrad3d(_MaxPoolGradOp):
    """(x, maxout, gz) -> gx of 3-d max pooling (Theano's MaxPoolGrad(ndim=3))."""

    nd = 3


class MaxPoolGradGrad3d(_MaxPoolGradGradOp):
    """(x, maxout, ggx) -> ggz: the adjoint of MaxPoolGrad3d in gz."""

    nd = 3


class AveragePoolGrad3d(_AveragePoolGradOp):
    """(x, gz) -> gx of 3-d 'sum' and average pooling (Theano's AveragePoolGrad(ndim=3))."""

    nd = 3


_FAMILIES: dict[int, dict[str, type]] = {
    2: {"pool": Pool, "max_grad": MaxPoolGrad, "max_grad_grad": MaxPoolGradGrad,
        "average_grad": AveragePoolGrad},
    3: {"pool": Pool3d, "max_grad": MaxPoolGrad3d, "max_grad_grad": MaxPoolGradGrad3d,
        "average_grad": AveragePoolGrad3d},
}


def _old_names(who: str, ws: Any, stride: Any, pad: Any, ds: Any, st: Any,
               padding: Any) -> tuple:
    """ws, stride, pad with Theano's older names ds, st, padding folded in."""
    for old, new, value, current in (("ds", "ws", ds, ws), ("st", "stride", st, stride),
                                     ("padding", "pad", padding, None)):
        if value is not None and current is not None:
            raise ValueError(f"{who}: give {new} or its old name {old}, not both")
    ws = ds if ds is not None else ws
    stride = st if st is not None else stride
    pad = padding if padding is not None else pad
    if ws is None:
        raise ValueError(f"{who}: ws (the window size) is required")
    return ws, stride, pad


def pool_2d(input: Any, ws: Any = None, ignore_border: bool = True, stride: Any = None,
            pad: Any = (0, 0), mode: str = "max", ds: Any = None, st: Any = None,
            padding: Any = None) -> TensorVariable:
    """Pool the last two axes of `input` with windows `ws` (Theano's pool_2d).

    stride defaults to ws; pad (< ws) pads both sides of each axis and needs
    ignore_border=True. ignore_border=False keeps the partial windows at the far edges. Modes:
    'max', 'sum', 'average_inc_pad' (padding counts in the divisor), 'average_exc_pad'.
    `ds`, `st` and `padding` are Theano's older names of `ws`, `stride` and `pad`. Sizes that
    are graph values (an integer vector, or scalars among the ints) build a DynamicPool (a host
    op, pool_dynamic.py), as Theano's Pool takes them as inputs."""
    ws, stride, pad = _old_names("pool_2d", ws, stride, pad, ds, st, padding)
    if any(_pd.is_symbolic_size(v) for v in (ws, stride, pad)):
        return _pd.dynamic_pool(input, 2, ws, stride, pad, ignore_border, mode)
    return Pool(ws, stride, pad, ignore_border, mode)(input)


def pool_output_shape(imgshape: tuple, ws: Any, ignore_border: bool = True, stride: Any = None,
                      pad: Any = None, ndim: int | None = None) -> tuple:
    """The output shape of pool_2d (or pool_3d: ndim=3, or ws of three entries) for an input
    shape of ints (Theano's Pool.out_shape); pad defaults to zeros."""
    if ndim is None:
        ndim = 2 if isinstance(ws, (int, np.integer)) else len(tuple(ws))
    if ndim not in _FAMILIES:
        raise ValueError(f"pool_output_shape: ndim must be 2 or 3, got {ndim!r}")
    return _FAMILIES[ndim]["pool"](ws, stride, pad, ignore_border, "max").out_shape(
        tuple(imgshape))


def pool_3d(input: Any, ws: Any = None, ignore_border: bool = True, stride: Any = None,
            pad: Any = (0, 0, 0), mode: str = "max", ds: Any = None, st: Any = None,
            padding: Any = None) -> TensorVariable:
    """Pool the last three axes of `input` with windows `ws` (Theano's pool_3d).

    stride defaults to ws; pad (< ws) pads both sides of each axis and needs
    ignore_border=True. ignore_border=False keeps the partial windows at the far edges. Modes:
    'max', 'sum', 'average_inc_pad' (padding counts in the divisor), 'average_exc_pad'.
    `ds`, `st` and `padding` are Theano's older names of `ws`, `stride` and `pad`."""
    ws, stride, pad = _old_names("pool_3d", ws, stride, pad, ds, st, padding)
    if any(_pd.is_symbolic_size(v) for v in (ws, stride, pad)):
        return _pd.dynamic_pool(input, 3, ws, stride, pad, ignore_border, mode)
    return Pool3d(ws, stride, pad, ignore_border, mode)(input)


def max_pool_2d_same_size(input: Any, patch_size: Any) -> TensorVariable:
    """Theano's: `input` with every element that is not the maximum of its (non-overlapping)
    `patch_size` window set to 0, the same shape as `input`."""
    x = as_tensor_variable(input)
    maxout = pool_2d(x, patch_size, ignore_border=True)
    return MaxPoolGrad(patch_size, ignore_border=True)(x, maxout, maxout)
