"""Neural-network helpers: softmax, log_softmax, relu, sigmoid, softplus and cross-entropies.

`Softmax` and `LogSoftmax` are Ops (not compositions of exp/sum) so that their CPU thunks can
subtract the maximum first (no overflow for large logits) and so that rewrites and the GPU
backend can recognise them; their gradients are ordinary graphs of elementwise ops and sums.
`CrossentropyCategorical1Hot` is the integer-label cross-entropy, an Op because it picks one
entry per row (-log p[i, y_i]) without building a one-hot matrix.
"""
from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import in_value_dtype, is_float, is_int, upgrade_to_float
from symgpu.tensor import basic as _b
from symgpu.tensor import math as _m
from symgpu.tensor.ranges import arange
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable

__all__ = ["Softmax", "LogSoftmax", "CrossentropyCategorical1Hot",
           "CrossentropyCategorical1HotGrad", "softmax", "log_softmax", "logsoftmax", "sigmoid",
           "softplus", "relu", "binary_crossentropy", "categorical_crossentropy",
           "crossentropy_categorical_1hot", "h_softmax"]

#: the elementwise logistic function and log(1+exp(x)) of the scalar table, re-exported here
#: because Theano users reach them as `T.nnet.sigmoid` / `T.nnet.softplus`
sigmoid = _m.sigmoid
softplus = _m.softplus


def _as_float_tensor(x: Any) -> TensorVariable:
    """`x` as a tensor of a float dtype (integers follow the scalar table's float rule)."""
    x = as_tensor_variable(x)
    if not is_float(x.dtype):
        x = _m.cast(x, upgrade_to_float(x.dtype))
    return x


def _norm_axis(axis: int | None, ndim: int, who: str) -> int | None:
    if ndim == 0:
        raise TypeError(f"{who} needs at least one dimension, got a scalar")
    if axis is None:
        return None
    if not -ndim <= axis < ndim:
        raise ValueError(f"{who}: axis {axis} is out of range for an input with {ndim} "
                         "dimensions")
    return int(axis) % ndim


class _SoftmaxBase(Op):
    """Shared make_node for the softmax family: one float input, same type out.
    `axis=None` normalises over all elements."""

    __props__ = ("axis",)

    def __init__(self, axis: int | None = -1):
        self.axis = None if axis is None else int(axis)

    def __str__(self) -> str:
        return f"{type(self).__name__}{{axis={self.axis}}}"

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        if not is_float(x.dtype):
            raise TypeError(f"{self} needs a float input, got {x.type}; use softmax(), which "
                            "casts integers")
        if x.ndim == 0:
            raise TypeError(f"{self} needs at least one dimension, got a scalar")
        if self.axis is not None and not 0 <= self.axis < x.ndim:
            raise ValueError(f"{self}: axis {self.axis} is out of range for {x.type}")
        return Apply(self, [x], [x.type()])

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def _sum(self, v: TensorVariable) -> TensorVariable:
        return _m.sum(v, axis=self.axis, keepdims=True)


class Softmax(_SoftmaxBase):
    """exp(x) / sum(exp(x)) along `axis`, computed as exp(x - max) to avoid overflow."""

    def perform(self, node, inputs, out):
        x = in_value_dtype(inputs[0])   # half: exp, sum and division in float32, one rounding
        e = np.exp(x - np.max(x, axis=self.axis, keepdims=True))
        e /= np.sum(e, axis=self.axis, keepdims=True)
        out[0][0] = np.asarray(e, dtype=node.outputs[0].dtype)

    def L_op(self, inputs, outputs, output_grads):
        # d softmax: J^T g = sm * (g - sum(g * sm)), reusing the forward output
        (sm,), (gz,) = outputs, output_grads
        return [sm * (gz - self._sum(gz * sm))]

    def grad(self, inputs, output_grads):
        return self.L_op(inputs, [self(inputs[0])], output_grads)

    def R_op(self, inputs, eval_points):
        # J v has the same form as J^T g (the Jacobian is symmetric)
        (x,), (ev,) = inputs, eval_points
        if ev is None:
            return [None]
        sm = self(x)
        return [sm * (ev - self._sum(ev * sm))]


class LogSoftmax(_SoftmaxBase):
    """x - logsumexp(x) along `axis`: exact where log(softmax(x)) would give -inf."""

    def perform(self, node, inputs, out):
        x = in_value_dtype(inputs[0])   # half: the log-sum-exp in float32, one rounding
        shifted = x - np.max(x, axis=self.axis, keepdims=True)
        res = shifted - np.log(np.sum(np.exp(shifted), axis=self.axis, keepdims=True))
        out[0][0] = np.asarray(res, dtype=node.outputs[0].dtype)

    def L_op(self, inputs, outputs, output_grads):
        # d log_softmax: J^T g = g - softmax * sum(g), reusing the forward output
        (out,), (gz,) = outputs, output_grads
        return [gz - _m.exp(out) * self._sum(gz)]

    def grad(self, inputs, output_grads):
        return self.L_op(inputs, [self(inputs[0])], output_grads)

    def R_op(self, inputs, eval_points):
        # J v = v - sum(softmax * v)
        (x,), (ev,) = inputs, eval_points
        if ev is None:
            return [None]
        sm = _m.exp(self(x))
        return [ev - self._sum(sm * ev)]


def _vector_as_row(x: TensorVariable, axis: int | None, who: str
                   ) -> tuple[TensorVariable, int | None]:
    """A vector is taken as a 1 x n row, as Theano 1.0's softmax and log-softmax do (Theano
    code relies on it, e.g. scan steps that return ``softmax(h_t)`` and index the
    stacked result ``s[:, 0, :]``); over all elements (axis None) it stays a vector. Returns
    the input and the normalised axis."""
    if x.ndim == 1 and axis is not None:
        _norm_axis(axis, 1, who)
        return x.dimshuffle("x", 0), 1
    return x, _norm_axis(axis, x.ndim, who)


def softmax(x: Any, axis: int | None = -1) -> TensorVariable:
    """Softmax along `axis` (the last by default; None = over all elements). A vector gives
    a 1 x n row, as in Theano 1.0 (`softmax(v)[0]` is the vector)."""
    x, axis = _vector_as_row(_as_float_tensor(x), axis, "softmax")
    return Softmax(axis)(x)


def log_softmax(x: Any, axis: int | None = -1) -> TensorVariable:
    """log(softmax(x)) along `axis`, computed stably (finite for any finite logits); a
    vector gives a 1 x n row, as softmax does."""
    x, axis = _vector_as_row(_as_float_tensor(x), axis, "log_softmax")
    return LogSoftmax(axis)(x)


logsoftmax = log_softmax


def relu(x: Any, alpha: Any = 0) -> TensorVariable:
    """Rectifier max(x, 0); with `alpha`, the leaky form (x if x >= 0 else alpha * x).

    Written as a switch (not 0.5*(x+|x|) as in Theano) so relu(-inf) is 0, NaN propagates and
    the gradient is exactly 1 or alpha. On NumPy values (neither argument a Variable) it is
    Theano's arithmetic done by NumPy, as Theano's relu is: a NumPy result, which test code
    compares with np.allclose."""
    if not isinstance(x, Variable) and not isinstance(alpha, Variable):
        if isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha == 0:
            return 0.5 * (x + abs(x))
        return 0.5 * (1 + alpha) * x + 0.5 * (1 - alpha) * abs(x)
    x = as_tensor_variable(x)
    if isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha == 0:
        return _m.switch(_m.lt(x, 0), 0, x)
    return _m.switch(_m.lt(x, 0), _m.mul(alpha, x), x)


def binary_crossentropy(output: Any, target: Any) -> TensorVariable:
    """Elementwise -(t*log(o) + (1-t)*log(1-o)) for probabilities `output` and targets in
    [0, 1] (Theano's definition; no reduction). Kept in exactly this form so that the
    stabilising rewrites recognise log(sigmoid(x)) and log(1 - sigmoid(x))."""
    o, t = _m.as_operands(output, target)
    return _m.neg(_m.add(_m.mul(t, _m.log(o)), _m.mul(_m.sub(1, t), _m.log(_m.sub(1, o)))))


class CrossentropyCategorical1Hot(Op):
    """-log(coding_dist[i, y_i]) per row: the cross-entropy against integer labels."""

    __props__ = ()

    def make_node(self, coding_dist: Any, true_one_of_n: Any) -> Apply:
        p = as_tensor_variable(coding_dist)
        y = as_tensor_variable(true_one_of_n)
        if p.ndim != 2 or not is_float(p.dtype):
            raise TypeError(f"{self}: coding_dist must be a float matrix, got {p.type}")
        if y.ndim != 1 or not is_int(y.dtype):
            raise TypeError(f"{self}: true labels must be an integer vector, got {y.type}")
        return Apply(self, [p, y], [TensorType(p.dtype, (p.broadcastable[0],))()])

    def perform(self, node, inputs, out):
        p, y = inputs
        _check_labels(p, y)
        picked = p[np.arange(p.shape[0]), y]
        with np.errstate(divide="ignore"):
            out[0][0] = np.asarray(-np.log(picked), dtype=node.outputs[0].dtype)

    def grad(self, inputs, output_grads):
        p, y = inputs
        (g,) = output_grads
        return [CrossentropyCategorical1HotGrad()(g, p, y), None]

    def infer_shape(self, fgraph, node, input_shapes):
        """One value per row of coding_dist (the GPU op's too)."""
        return [(input_shapes[0][0],)]


class CrossentropyCategorical1HotGrad(Op):
    """The gradient of CrossentropyCategorical1Hot w.r.t. coding_dist: -g_i / p[i, y_i] at
    (i, y_i), zero elsewhere."""

    __props__ = ()

    def make_node(self, g: Any, coding_dist: Any, true_one_of_n: Any) -> Apply:
        g, p, y = (as_tensor_variable(v) for v in (g, coding_dist, true_one_of_n))
        return Apply(self, [g, p, y], [p.type()])

    def infer_shape(self, fgraph, node, input_shapes):
        """coding_dist's shape (the GPU op's too)."""
        return [input_shapes[1]]

    def perform(self, node, inputs, out):
        g, p, y = inputs
        _check_labels(p, y)
        rows = np.arange(p.shape[0])
        res = np.zeros_like(p, dtype=node.outputs[0].dtype)
        with np.errstate(divide="ignore"):
            res[rows, y] = -np.broadcast_to(g, rows.shape) / p[rows, y]
        out[0][0] = res


def _check_labels(p: np.ndarray, y: np.ndarray) -> None:
    if y.shape[0] != p.shape[0]:
        raise ValueError(f"categorical_crossentropy: {y.shape[0]} labels for {p.shape[0]} rows "
                         f"(coding_dist shape {p.shape}, labels shape {y.shape})")
    if y.size and (y.min() < 0 or y.max() >= p.shape[1]):
        raise ValueError(f"categorical_crossentropy: labels must lie in [0, {p.shape[1]}) for "
                         f"coding_dist of shape {p.shape}; got values in [{y.min()}, {y.max()}]")


crossentropy_categorical_1hot = CrossentropyCategorical1Hot()


def categorical_crossentropy(coding_dist: Any, true_dist: Any) -> TensorVariable:
    """Cross-entropy of each row of `coding_dist` (probabilities) against `true_dist`.

    `true_dist` is either a distribution of the same shape (-sum(t * log(p)) over the last
    axis) or an integer vector of class indices (-log(p[i, y_i])), as in Theano."""
    p = as_tensor_variable(coding_dist)
    t = as_tensor_variable(true_dist)
    if t.ndim == p.ndim:
        return _m.neg(_m.sum(_m.mul(t, _m.log(p)), axis=p.ndim - 1))
    if t.ndim == p.ndim - 1:
        return crossentropy_categorical_1hot(p, t)
    raise TypeError(f"categorical_crossentropy: true_dist must have the same number of "
                    f"dimensions as coding_dist ({p.type}) or one fewer (integer labels); "
                    f"got {t.type}")


def h_softmax(x: Any, batch_size: Any, n_outputs: int, n_classes: int,
              n_outputs_per_class: int, W1: Any, b1: Any, W2: Any, b2: Any,
              target: Any = None) -> TensorVariable:
    """Theano's two-level hierarchical softmax.

    The outputs are split into `n_classes` classes of `n_outputs_per_class` outputs; p(output)
    = p(class | x) p(output | class, x), with p(class | x) = softmax(x W1 + b1) (W1:
    (n_in, n_classes), b1: (n_classes,)) and p(output | class, x) = softmax(x W2[c] + b2[c])
    (W2: (n_classes, n_in, n_outputs_per_class), b2: (n_classes, n_outputs_per_class)).
    Without `target`: every output's probability, (batch_size, n_outputs) (outputs past
    n_outputs in the last class are dropped). With `target` (integer indices, flattened):
    the probability of each row's target, (batch_size,), computing only the target's class."""
    x = as_tensor_variable(x)
    W1, b1, W2, b2 = (as_tensor_variable(v) for v in (W1, b1, W2, b2))
    class_probs = softmax(_m.add(_m.dot(x, W1), b1))
    if target is None:
        act = _m.add(_m.tensordot(x, W2, [[1], [1]]), b2)       # (batch, classes, per_class)
        out = softmax(_b.reshape(act, (-1, n_outputs_per_class)))
        out = _b.reshape(out, (batch_size, n_classes, -1))
        out = _m.mul(class_probs.dimshuffle(0, 1, "x"), out)
        return _b.reshape(out, (batch_size, -1))[:, :n_outputs]
    target = _b.flatten(as_tensor_variable(target))
    target_classes = _m.int_div(target, n_outputs_per_class)
    target_in_class = _m.mod(target, n_outputs_per_class)
    w = W2[target_classes]                                     # (batch, n_in, per_class)
    act = _m.add(_m.sum(_m.mul(x.dimshuffle(0, 1, "x"), w), axis=1), b2[target_classes])
    out = softmax(act)
    rows = arange(batch_size)
    return _m.mul(class_probs[rows, target_classes], out[rows, target_in_class])


# convolution: a submodule loaded on first use (PEP 562), so `import symgpu` does not load
# the convolution code a model without convolutions never runs
_CONV_NAMES = ("conv2d", "conv2d_grad_wrt_inputs", "conv2d_grad_wrt_weights", "conv2d_transpose", "conv3d", "conv3d_grad_wrt_inputs", "conv3d_grad_wrt_weights")
__all__ += list(_CONV_NAMES)


def __getattr__(name: str) -> Any:
    if name in _CONV_NAMES:
        # deferred: start-up: the convolution code loads when a model first uses it
        value = getattr(importlib.import_module("symgpu.tensor.nnet.abstract_conv"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
from symgpu.tensor.nnet.activations import (  # noqa: E402
    elu, gelu, hard_sigmoid, selu, sigmoid_binary_crossentropy, softsign, ultra_fast_sigmoid)
from symgpu.tensor.nnet import bn  # noqa: E402,F401

__all__ += ["elu", "selu", "gelu", "ultra_fast_sigmoid", "hard_sigmoid", "softsign",
            "sigmoid_binary_crossentropy"]
from symgpu.tensor.nnet.attention import (  # noqa: E402
    Attention, AttentionGrad, scaled_dot_product_attention)

__all__ += ["Attention", "AttentionGrad", "scaled_dot_product_attention"]
from symgpu.tensor.nnet.xent_softmax import (  # noqa: E402
    CrossentropySoftmax1HotWithBiasDx, CrossentropySoftmaxArgmax1HotWithBias,
    crossentropy_softmax_1hot, crossentropy_softmax_1hot_with_bias,
    crossentropy_softmax_1hot_with_bias_dx, crossentropy_softmax_argmax_1hot_with_bias,
    crossentropy_softmax_max_and_argmax_1hot, crossentropy_softmax_max_and_argmax_1hot_with_bias)

__all__ += ["CrossentropySoftmaxArgmax1HotWithBias", "CrossentropySoftmax1HotWithBiasDx",
            "crossentropy_softmax_argmax_1hot_with_bias",
            "crossentropy_softmax_1hot_with_bias_dx", "crossentropy_softmax_1hot_with_bias",
            "crossentropy_softmax_1hot", "crossentropy_softmax_max_and_argmax_1hot_with_bias",
            "crossentropy_softmax_max_and_argmax_1hot"]
