"""2-d pooling with Theano's semantics: `pool_2d` and the Ops `Pool`, `MaxPoolGrad`,
`AveragePoolGrad` (and `MaxPoolGradGrad` for second derivatives).

Pooling acts on the last two axes of an input of 2 or more dimensions. Window size, stride and
padding are Op parameters (Python ints), so the GPU backend can hand them to cuDNN as they are.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.tensor import math as _m
from symgpu.tensor.signal import pool_numpy as _pn
from symgpu.tensor.type import TensorVariable, as_tensor_variable

__all__ = ["Pool", "MaxPoolGrad", "AveragePoolGrad", "MaxPoolGradGrad", "pool_2d",
           "pool_output_shape"]


def _pair(v: Any, what: str, minimum: int) -> tuple[int, int]:
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        v = (v, v)
    try:
        pair = tuple(int(i) for i in v)
    except (TypeError, ValueError):
        pair = ()
    if len(pair) != 2 or min(pair) < minimum:
        raise ValueError(f"pool_2d: {what} must be a pair of ints >= {minimum}, got {v!r}")
    return pair  # type: ignore[return-value]


class _PoolBase(Op):
    """The parameters every pooling Op carries."""

    __props__ = ("ws", "stride", "pad", "ignore_border", "mode")
    #: the output shape is host arithmetic on the input's shape: shape reads of the output
    #: are rewritten to it (tensor/rewriting/shape_feature.py), see _ConvBase
    shape_from_inputs = True

    def __init__(self, ws: Any, stride: Any = None, pad: Any = (0, 0),
                 ignore_border: bool = True, mode: str = "max"):
        self.ws = _pair(ws, "ws", 1)
        self.stride = self.ws if stride is None else _pair(stride, "stride", 1)
        self.pad = _pair(pad, "pad", 0)
        self.ignore_border = bool(ignore_border)
        if mode == "average":  # Theano's older spelling
            mode = "average_inc_pad"
        if mode not in _pn.MODES:
            raise ValueError(f"pool_2d: mode must be one of {_pn.MODES}, got {mode!r}")
        self.mode = mode
        if self.pad != (0, 0) and not self.ignore_border:
            raise ValueError("pool_2d: padding works only with ignore_border=True "
                             f"(pad={self.pad})")
        if self.pad[0] >= self.ws[0] or self.pad[1] >= self.ws[1]:
            raise ValueError(f"pool_2d: pad {self.pad} must be smaller than the window {self.ws}")

    def __str__(self) -> str:
        return (f"{type(self).__name__}{{{self.mode}, ws={self.ws}, stride={self.stride}, "
                f"pad={self.pad}, ignore_border={self.ignore_border}}}")

    def params(self) -> dict:
        return dict(ws=self.ws, stride=self.stride, pad=self.pad,
                    ignore_border=self.ignore_border, mode=self.mode)

    def _input(self, x: Any, what: str = "input") -> TensorVariable:
        x = as_tensor_variable(x)
        if x.ndim < 2:
            raise TypeError(f"{self}: {what} needs at least 2 dimensions (pooling acts on the "
                            f"last two), got {x.type}")
        return x

    def out_shape(self, shape: tuple) -> tuple:
        """Output shape for an input shape of ints or symbolic scalars."""
        symbolic = any(isinstance(s, TensorVariable) for s in shape[-2:])
        mx = (lambda a, b: _m.maximum(a, b)) if symbolic else max
        return tuple(shape[:-2]) + tuple(
            _pn.pool_out_len(shape[-2 + a], self.ws[a], self.stride[a], self.pad[a],
                             self.ignore_border, mx) for a in range(2))


class Pool(_PoolBase):
    """Max, sum or average over windows of the last two axes."""

    def make_node(self, x: Any) -> Apply:
        x = self._input(x)
        bc = x.broadcastable[:-2] + (False, False)
        return Apply(self, [x], [x.type.clone(broadcastable=bc)()])

    def perform(self, node, inputs, out):
        out[0][0] = _pn.pool_forward(inputs[0], self.ws, self.stride, self.pad,
                                     self.ignore_border, self.mode)

    def infer_shape(self, fgraph, node, input_shapes):
        return [self.out_shape(tuple(input_shapes[0]))]

    def L_op(self, inputs, outputs, output_grads):
        (x,), (z,), (gz,) = inputs, outputs, output_grads
        if self.mode == "max":
            return [MaxPoolGrad(**self.params())(x, z, gz)]
        return [AveragePoolGrad(**self.params())(x, gz)]

    def grad(self, inputs, output_grads):
        return self.L_op(inputs, [self(inputs[0])], output_grads)


class MaxPoolGrad(_PoolBase):
    """(x, maxout, gz) -> gx: each window's gz goes to the elements equal to its maximum."""

    def make_node(self, x: Any, maxout: Any, gz: Any) -> Apply:
        x = self._input(x)
        maxout, gz = self._input(maxout, "maxout"), self._input(gz, "output gradient")
        if self.mode != "max":
            raise ValueError(f"{self}: MaxPoolGrad is for mode='max'")
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
                MaxPoolGradGrad(**self.params())(x, maxout, ggx)]


class MaxPoolGradGrad(_PoolBase):
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
        return [_m.zeros_like(x), _m.zeros_like(maxout), MaxPoolGrad(**self.params())(x, maxout, g)]


class AveragePoolGrad(_PoolBase):
    """(x, gz) -> gx for 'sum' and the averages: each window spreads gz / its count."""

    def make_node(self, x: Any, gz: Any) -> Apply:
        x, gz = self._input(x), self._input(gz, "output gradient")
        if self.mode == "max":
            raise ValueError(f"{self}: AveragePoolGrad is not for mode='max'")
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
        return [_m.zeros_like(x), Pool(**self.params())(ggx)]


def pool_2d(input: Any, ws: Any = None, ignore_border: bool = True, stride: Any = None,
            pad: Any = (0, 0), mode: str = "max", ds: Any = None, st: Any = None,
            padding: Any = None) -> TensorVariable:
    """Pool the last two axes of `input` with windows `ws` (Theano's pool_2d).

    stride defaults to ws; pad (< ws) pads both sides of each axis and needs
    ignore_border=True. ignore_border=False keeps the partial windows at the far edges. Modes:
    'max', 'sum', 'average_inc_pad' (padding counts in the divisor), 'average_exc_pad'.
    `ds`, `st` and `padding` are Theano's older names of `ws`, `stride` and `pad`."""
    for old, new, value, current in (("ds", "ws", ds, ws), ("st", "stride", st, stride),
                                     ("padding", "pad", padding, None)):
        if value is not None and current is not None:
            raise ValueError(f"pool_2d: give {new} or its old name {old}, not both")
    ws = ds if ds is not None else ws
    stride = st if st is not None else stride
    pad = padding if padding is not None else pad
    if ws is None:
        raise ValueError("pool_2d: ws (the window size) is required")
    return Pool(ws, stride, pad, ignore_border, mode)(input)


def pool_output_shape(imgshape: tuple, ws: Any, ignore_border: bool = True, stride: Any = None,
                      pad: Any = (0, 0)) -> tuple:
    """The output shape of pool_2d for an input shape of ints (Theano's Pool.out_shape)."""
    return Pool(ws, stride, pad, ignore_border, "max").out_shape(tuple(imgshape))
