"""Pooling whose window, stride and padding are graph values (Theano's Pool takes `ws`,
`stride` and `pad` as inputs, so `pool_2d(x, ws=T.ivector())` builds): `DynamicPool` and
its gradients `DynamicPoolGrad` (roles 'max_grad', 'average_grad', 'max_grad_grad').

`pool_2d`/`pool_3d` build these only when a size is not a constant (Lasagne's spatial
pyramid pooling derives its windows from the input's symbolic shape); with constant sizes
they build `Pool` & co., whose sizes are Op parameters that the GPU kernels take as they are.
These ops run on the host (NumPy, the same kernels as Pool's, pool_numpy.py); on a GPU they
run between transfers.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.tensor import basic as _b
from symgpu.tensor import math as _m
from symgpu.tensor.signal import pool_numpy as _pn
from symgpu.tensor.type import TensorVariable, as_tensor_variable

__all__ = ["DynamicPool", "DynamicPoolGrad", "is_symbolic_size", "dynamic_pool"]

_ROLES = ("max_grad", "average_grad", "max_grad_grad")


def is_symbolic_size(v: Any) -> bool:
    """Whether a pooling size argument (an int, a sequence, a vector) holds a graph value."""
    if isinstance(v, Variable):
        return True
    if isinstance(v, (list, tuple)):
        return any(isinstance(e, Variable) for e in v)
    return False


def _size_vector(v: Any, what: str, nd: int, who: str) -> TensorVariable:
    """An int64 vector of `nd` sizes from an int, a sequence of ints and scalars, or a vector."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        v = (int(v),) * nd
    if isinstance(v, (list, tuple)):
        if len(v) != nd:
            raise ValueError(f"{who}: {what} must have {nd} entries, got {v!r}")
        v = _b.stack([as_tensor_variable(e) for e in v])
    v = as_tensor_variable(v)
    if v.ndim != 1 or not v.dtype.startswith(("int", "uint")):
        raise TypeError(f"{who}: {what} must be a vector of integers (or {nd} ints / integer "
                        f"scalars), got {v.type}")
    return _m.cast(v, "int64") if v.dtype != "int64" else v


class _DynamicBase(Op):
    """The parameters that stay Op parameters (`nd`, ignore_border, mode); the sizes are the
    node's last three inputs."""

    __props__ = ("nd", "ignore_border", "mode")

    def __init__(self, nd: int, ignore_border: bool = True, mode: str = "max"):
        if nd not in (2, 3):
            raise ValueError(f"{type(self).__name__}: nd must be 2 or 3, got {nd!r}")
        if mode == "average":   # Theano's older spelling
            mode = "average_inc_pad"
        if mode not in _pn.MODES:
            raise ValueError(f"pool_{nd}d: mode must be one of {_pn.MODES}, got {mode!r}")
        self.nd, self.ignore_border, self.mode = nd, bool(ignore_border), mode

    def _tensor(self, x: Any, what: str) -> TensorVariable:
        x = as_tensor_variable(x)
        if x.ndim < self.nd:
            raise TypeError(f"{self}: {what} needs at least {self.nd} dimensions (pooling acts "
                            f"on the last {self.nd}), got {x.type}")
        return x

    def _sizes(self, ws: Any, stride: Any, pad: Any) -> list[TensorVariable]:
        who = f"pool_{self.nd}d"
        return [_size_vector(v, what, self.nd, who)
                for v, what in ((ws, "ws"), (stride, "stride"), (pad, "pad"))]

    def _values(self, node: Apply, ws: Any, st: Any, pad: Any) -> tuple[tuple, tuple, tuple]:
        """The sizes as ints, checked as Pool checks its parameters (at run time here)."""
        ws, st, pad = (tuple(int(i) for i in np.asarray(v).reshape(-1)) for v in (ws, st, pad))
        if not len(ws) == len(st) == len(pad) == self.nd:
            raise ValueError(f"{self}: ws, stride and pad must have {self.nd} entries each, "
                             f"got ws={ws}, stride={st}, pad={pad}")
        if min(ws) < 1 or min(st) < 1 or min(pad) < 0:
            raise ValueError(f"{self}: ws and stride must be >= 1 and pad >= 0, got ws={ws}, "
                             f"stride={st}, pad={pad}")
        if any(pad) and not self.ignore_border:
            raise ValueError(f"{self}: padding works only with ignore_border=True (pad={pad})")
        if any(p >= w for p, w in zip(pad, ws)):
            raise ValueError(f"{self}: pad {pad} must be smaller than the window {ws}")
        return ws, st, pad

    def __str__(self) -> str:
        return f"{type(self).__name__}{{{self.nd}d, {self.mode}, " \
               f"ignore_border={self.ignore_border}}}"

    def _size_grads(self, inputs: list) -> list:
        return [None, None, None]   # sizes are integers: no gradient flows to them


class DynamicPool(_DynamicBase):
    """(x, ws, stride, pad) -> max, sum or average over windows of x's last `nd` axes."""

    def make_node(self, x: Any, ws: Any, stride: Any, pad: Any) -> Apply:
        x = self._tensor(x, "input")
        bc = x.broadcastable[:x.ndim - self.nd] + (False,) * self.nd
        return Apply(self, [x, *self._sizes(ws, stride, pad)],
                     [x.type.clone(broadcastable=bc)()])

    def perform(self, node, inputs, out):
        x, ws, st, pad = inputs
        ws, st, pad = self._values(node, ws, st, pad)
        out[0][0] = _pn.pool_forward(x, ws, st, pad, self.ignore_border, self.mode)

    def infer_shape(self, fgraph, node, input_shapes):
        _x, ws, st, pad = node.inputs
        shape = tuple(input_shapes[0])
        lead = len(shape) - self.nd
        out = []
        for a in range(self.nd):
            v = shape[lead + a] + 2 * pad[a]
            if self.ignore_border:
                out.append(_m.maximum((v - ws[a]) // st[a] + 1, 0))
            else:   # Theano's rule for partial windows at the far edge
                out.append(_m.switch(_m.ge(st[a], ws[a]), (v - 1) // st[a] + 1,
                                     _m.maximum((v - (1 + ws[a] - st[a])) // st[a], 0) + 1))
        return [shape[:lead] + tuple(out)]

    def L_op(self, inputs, outputs, output_grads):
        x, ws, st, pad = inputs
        (gz,) = output_grads
        if self.mode == "max":
            gx = DynamicPoolGrad(self.nd, self.ignore_border, self.mode, "max_grad")(
                x, outputs[0], gz, ws, st, pad)
        else:
            gx = DynamicPoolGrad(self.nd, self.ignore_border, self.mode, "average_grad")(
                x, gz, gz, ws, st, pad)
        return [gx] + self._size_grads(inputs)

    def grad(self, inputs, output_grads):
        return self.L_op(inputs, [self(*inputs)], output_grads)


class DynamicPoolGrad(_DynamicBase):
    """The gradients of DynamicPool, one class for the three roles (inputs a, b, c, ws,
    stride, pad): 'max_grad' (x, maxout, gz) -> gx; 'average_grad' (x, gz, gz) -> gx (the
    second gz keeps one signature); 'max_grad_grad' (x, maxout, ggx) -> ggz."""

    __props__ = ("nd", "ignore_border", "mode", "role")

    def __init__(self, nd: int, ignore_border: bool = True, mode: str = "max",
                 role: str = "max_grad"):
        super().__init__(nd, ignore_border, mode)
        if role not in _ROLES:
            raise ValueError(f"DynamicPoolGrad: role must be one of {_ROLES}, got {role!r}")
        if (role == "average_grad") == (self.mode == "max"):
            raise ValueError(f"DynamicPoolGrad: role {role!r} does not go with mode "
                             f"{self.mode!r}")
        self.role = role

    def __str__(self) -> str:
        return super().__str__()[:-1] + f", {self.role}}}"

    def make_node(self, a: Any, b: Any, c: Any, ws: Any, stride: Any, pad: Any) -> Apply:
        a, b, c = (self._tensor(v, w) for v, w in ((a, "x"), (b, "second input"),
                                                  (c, "gradient")))
        out = b.type() if self.role == "max_grad_grad" else a.type()
        return Apply(self, [a, b, c, *self._sizes(ws, stride, pad)], [out])

    def perform(self, node, inputs, out):
        a, b, c, ws, st, pad = inputs
        ws, st, pad = self._values(node, ws, st, pad)
        if self.role == "max_grad":
            r = _pn.max_pool_grad(a, b, c, ws, st, pad, self.ignore_border)
        elif self.role == "max_grad_grad":
            r = _pn.max_pool_grad_grad(a, b, c, ws, st, pad, self.ignore_border)
        else:
            r = _pn.average_pool_grad(a.shape, c, ws, st, pad, self.ignore_border, self.mode,
                                      node.outputs[0].dtype)
        out[0][0] = r

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[1 if self.role == "max_grad_grad" else 0])]

    def grad(self, inputs, output_grads):
        a, b, c, ws, st, pad = inputs
        (g,) = output_grads
        sizes = (ws, st, pad)
        if self.role == "max_grad":      # linear in gz: the adjoint is max_grad_grad
            gc = DynamicPoolGrad(self.nd, self.ignore_border, "max", "max_grad_grad")(
                a, b, g, *sizes)
            return [_m.zeros_like(a), _m.zeros_like(b), gc] + self._size_grads(inputs)
        if self.role == "max_grad_grad":  # linear in ggx: the adjoint is max_grad
            gc = DynamicPoolGrad(self.nd, self.ignore_border, "max", "max_grad")(
                a, b, g, *sizes)
            return [_m.zeros_like(a), _m.zeros_like(b), gc] + self._size_grads(inputs)
        # average_grad is linear in gz (its third input) and independent of x's values: the
        # adjoint is the pooling itself
        gc = DynamicPool(self.nd, self.ignore_border, self.mode)(g, *sizes)
        return [_m.zeros_like(a), _m.zeros_like(b), gc] + self._size_grads(inputs)


def dynamic_pool(input: Any, nd: int, ws: Any, stride: Any, pad: Any, ignore_border: bool,
                 mode: str) -> TensorVariable:
    """pool_2d/pool_3d with graph-valued sizes: stride defaults to ws, pad to zeros."""
    stride = ws if stride is None else stride
    pad = (0,) * nd if pad is None else pad
    return DynamicPool(nd, ignore_border, mode)(input, ws, stride, pad)
