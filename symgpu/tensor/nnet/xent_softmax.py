"""Theano's fused classifier ops: CrossentropySoftmaxArgmax1HotWithBias (the row-wise NLL of
softmax(x + b) against integer labels, the softmax itself and the row-wise argmax of x + b, in
one op) and its gradient at x, CrossentropySoftmax1HotWithBiasDx, with Theano's functions
that build them.

Why ops of their own (symgpu's own graphs write these as softmax, log and indexing, which its
rewrites fuse): Theano code names them, and on the GPU each is one kernel
(symgpu/gpu/ops/xent_softmax.py) instead of a softmax, a gather and an argmax. The values are
Theano's: the softmax and NLL of x + b shifted by the row max, the argmax of x + b (the first
maximum), labels checked to lie in [0, k).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import is_float, is_int
from symgpu.tensor import math as _m
from symgpu.tensor.extra_funcs import max_and_argmax
from symgpu.tensor.ranges import arange
from symgpu.tensor.subtensor import inc_subtensor
from symgpu.tensor.type import TensorType, as_tensor_variable

__all__ = ["CrossentropySoftmaxArgmax1HotWithBias", "CrossentropySoftmax1HotWithBiasDx",
           "crossentropy_softmax_argmax_1hot_with_bias", "crossentropy_softmax_1hot_with_bias_dx",
           "crossentropy_softmax_1hot_with_bias", "crossentropy_softmax_1hot",
           "crossentropy_softmax_max_and_argmax_1hot_with_bias",
           "crossentropy_softmax_max_and_argmax_1hot"]


def check_xent_labels(who: Any, k: int, y_idx: np.ndarray) -> None:
    """Theano's check: every label lies in [0, k) (no counting from the end)."""
    if y_idx.size and (y_idx.min() < 0 or y_idx.max() >= k):
        bad = y_idx.min() if y_idx.min() < 0 else y_idx.max()
        raise ValueError(f"{who}: y_i value out of bounds: labels must lie in [0, {k}), got "
                         f"{bad}")


class CrossentropySoftmaxArgmax1HotWithBias(Op):
    """(nll, sm, am) of a float matrix x, a bias vector b (one per column) and integer labels
    y_idx (one per row): sm = softmax(x + b) by rows, nll[i] = -log(sm[i, y_idx[i]]) computed
    as -(x + b)[i, y] + max + log(sum exp), am[i] = argmax((x + b)[i]) (Theano's op)."""

    __props__ = ()

    def __str__(self) -> str:
        return "CrossentropySoftmaxArgmax1HotWithBias"

    def make_node(self, x: Any, b: Any, y_idx: Any) -> Apply:
        x, b, y_idx = (as_tensor_variable(v) for v in (x, b, y_idx))
        if x.ndim != 2 or not is_float(x.dtype):
            raise TypeError(f"{self}: x must be a float matrix, got {x.type}")
        if b.ndim != 1 or not is_float(b.dtype):
            raise TypeError(f"{self}: b must be a float vector, got {b.type}")
        if y_idx.ndim != 1 or not is_int(y_idx.dtype):
            raise TypeError(f"{self}: y_idx must be an integer vector, got {y_idx.type}")
        if b.dtype != x.dtype:
            b = _m.cast(b, x.dtype)
        nll = TensorType(x.dtype, y_idx.broadcastable)()
        return Apply(self, [x, b, y_idx], [nll, x.type(), y_idx.type()])

    def infer_shape(self, fgraph, node, input_shapes):
        """nll: one per row of x; sm: x's shape; am: y_idx's."""
        x_shp, _, idx_shp = input_shapes
        return [(x_shp[0],), x_shp, idx_shp]

    def perform(self, node, inputs, out):
        x, b, y_idx = inputs
        if b.shape[0] != x.shape[1]:
            raise ValueError(f"{self}: b has {b.shape[0]} entries for the {x.shape[1]} "
                             f"columns of x (shape {x.shape})")
        if y_idx.shape[0] != x.shape[0]:
            raise ValueError(f"{self}: y_idx has {y_idx.shape[0]} labels for the "
                             f"{x.shape[0]} rows of x (shape {x.shape})")
        if x.shape[1] == 0 and x.shape[0]:
            raise ValueError(f"{self}: x of shape {x.shape} has no columns to take a softmax of")
        check_xent_labels(self, x.shape[1], y_idx)
        row = x + b
        am = np.argmax(row, axis=1) if x.shape[0] else np.zeros(0, dtype=np.int64)
        rows = np.arange(x.shape[0])
        m = row[rows, am][:, None]
        e = np.exp(row - m)
        s = e.sum(axis=1, keepdims=True)
        dtype = node.outputs[0].dtype
        out[0][0] = np.asarray(-row[rows, y_idx] + m[:, 0] + np.log(s[:, 0]), dtype=dtype)
        out[1][0] = np.asarray(e / s, dtype=dtype)
        out[2][0] = np.asarray(am, dtype=node.outputs[2].dtype)

    def L_op(self, inputs, outputs, output_grads):
        """Theano's: the NLL's term through CrossentropySoftmax1HotWithBiasDx, the softmax's
        as softmax's gradient, the argmax's zero; b's is x's summed over the rows."""
        x, b, y_idx = inputs
        _, sm, _ = outputs
        g_nll, g_sm, _ = output_grads
        dx = crossentropy_softmax_1hot_with_bias_dx(g_nll, sm, y_idx)
        dx = dx + sm * (g_sm - _m.sum(g_sm * sm, axis=1, keepdims=True))
        return [dx, _m.sum(dx, axis=0), None]

    def grad(self, inputs, output_grads):
        return self.L_op(inputs, self(*inputs), output_grads)


class CrossentropySoftmax1HotWithBiasDx(Op):
    """The gradient of CrossentropySoftmaxArgmax1HotWithBias's NLL at x: dx[i] =
    dy_i * sm[i] with dy_i subtracted at (i, y_idx[i]); dy a scalar or a vector (of one
    value, or one per row) (Theano's op)."""

    __props__ = ()

    def __str__(self) -> str:
        return "CrossentropySoftmax1HotWithBiasDx"

    def make_node(self, dy: Any, sm: Any, y_idx: Any) -> Apply:
        dy, sm, y_idx = (as_tensor_variable(v) for v in (dy, sm, y_idx))
        if dy.ndim > 1 or not is_float(dy.dtype):
            raise TypeError(f"{self}: dy must be a float scalar or vector, got {dy.type}")
        if sm.ndim != 2 or not is_float(sm.dtype):
            raise TypeError(f"{self}: sm must be a float matrix, got {sm.type}")
        if y_idx.ndim != 1 or not is_int(y_idx.dtype):
            raise TypeError(f"{self}: y_idx must be an integer vector, got {y_idx.type}")
        return Apply(self, [dy, sm, y_idx], [sm.type()])

    def infer_shape(self, fgraph, node, input_shapes):
        """sm's shape."""
        return [input_shapes[1]]

    def perform(self, node, inputs, out):
        dy, sm, y_idx = inputs
        n, k = sm.shape
        if y_idx.shape[0] != n:
            raise ValueError(f"{self}: y_idx has {y_idx.shape[0]} labels for the {n} rows of "
                             f"sm (shape {sm.shape})")
        dy = np.asarray(dy)
        if dy.ndim == 1 and dy.shape[0] not in (1, n):
            raise ValueError(f"{self}: dy of shape {dy.shape} for the {n} rows of sm")
        check_xent_labels(self, k, y_idx)
        dy_rows = np.broadcast_to(dy.reshape(-1)[:1] if dy.size == 1 else dy, (n,))
        dx = dy_rows[:, None] * sm
        dx[np.arange(n), y_idx] -= dy_rows
        out[0][0] = np.asarray(dx, dtype=node.outputs[0].dtype)

    def grad(self, inputs, output_grads):
        """Theano's grads at dy and sm (none at y_idx): dy's is the sum over each row of
        g * (sm - onehot(y)), gathered per value dy has."""
        dy, sm, y_idx = inputs
        (g,) = output_grads
        n = sm.shape[0]
        rows = arange(n)
        g_rows = _m.sum(g * inc_subtensor(sm[rows, y_idx], -1), axis=1)
        if dy.ndim == 0:
            return [_m.cast(_m.sum(g_rows), dy.dtype), _m.cast(dy * g, sm.dtype), None]
        pick = rows * _m.cast(_m.gt(dy.shape[0], 1), "int64")   # row i reads dy[i * incr]
        g_sm = dy[pick].dimshuffle(0, "x") * g
        g_dy = inc_subtensor(_m.zeros_like(dy)[pick], _m.cast(g_rows, dy.dtype))
        return [g_dy, _m.cast(g_sm, sm.dtype), None]


crossentropy_softmax_argmax_1hot_with_bias = CrossentropySoftmaxArgmax1HotWithBias()
crossentropy_softmax_1hot_with_bias_dx = CrossentropySoftmax1HotWithBiasDx()


def crossentropy_softmax_1hot_with_bias(x: Any, b: Any, y_idx: Any) -> list:
    """(nll, softmax) of x + b against integer labels (Theano's function)."""
    return crossentropy_softmax_argmax_1hot_with_bias(x, b, y_idx)[0:2]


def crossentropy_softmax_1hot(x: Any, y_idx: Any) -> list:
    """(nll, softmax) of x against integer labels: the bias-free form (a zero bias)."""
    x = as_tensor_variable(x)
    return crossentropy_softmax_1hot_with_bias(x, _m.zeros_like(x[0, :]), y_idx)


def crossentropy_softmax_max_and_argmax_1hot_with_bias(x: Any, b: Any, y_idx: Any) -> tuple:
    """(nll, softmax, max probability, argmax) of x + b per row (Theano's function)."""
    xent, sm = crossentropy_softmax_1hot_with_bias(x, b, y_idx)
    max_pr, argmax = max_and_argmax(sm, axis=-1)
    return xent, sm, max_pr, argmax


def crossentropy_softmax_max_and_argmax_1hot(x: Any, y_idx: Any) -> tuple:
    """The bias-free form of crossentropy_softmax_max_and_argmax_1hot_with_bias."""
    x = as_tensor_variable(x)
    return crossentropy_softmax_max_and_argmax_1hot_with_bias(x, _m.zeros_like(x[0, :]), y_idx)
