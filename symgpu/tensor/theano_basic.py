"""Theano's ``theano.tensor.basic`` names that symgpu had under no name (issue 31): the 0-d
conversions (`tensor_from_scalar`...), `default`, row permutations, `Split`, `AllocEmpty`,
`Rebroadcast`, `NoneConst`, `extract_constant`, and Theano's class names for what our
functions build from several ops (`MaxAndArgmax`, `Mean`, `Tile`, `Tri`, `Choose`).

Why: Theano's code and tests import these from ``theano.tensor``; each behaves as Theano's.
Scalars are 0-d tensors here (no separate scalar graph type), so the scalar/tensor
conversions are 0-d copies."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from symgpu.graph.basic import Apply, Constant, Type
from symgpu.graph.op import Op
from symgpu.graph.op_alias import op_alias
from symgpu.tensor.basic import _as_int_scalar, choose, join
from symgpu.tensor.elemwise import _sum_to_broadcast_pattern
from symgpu.tensor.extra_funcs import max_and_argmax, tile, tri
from symgpu.tensor.ranges import arange
from symgpu.tensor.grids import NotScalarConstantError, get_scalar_constant_value
from symgpu.tensor.math import cast, eq, identity, int_div, mean, neq, pow, switch
from symgpu.tensor.type import (TensorConstant, TensorType, TensorVariable, as_tensor_variable,
                                check_declared_broadcastable, constant)

__all__ = ["TensorFromScalar", "tensor_from_scalar", "ScalarFromTensor", "scalar_from_tensor",
           "Default", "default", "PermuteRowElements", "permute_row_elements",
           "inverse_permutation", "Tensor", "tensor_copy", "power", "Split", "split",
           "AllocEmpty", "Rebroadcast", "NoneTypeT", "NoneConst", "extract_constant",
           "MaxAndArgmax", "Mean", "Tile", "Tri", "Choose", "ceil_intdiv"]

_MODULE = "symgpu.tensor"
Tensor = TensorType           # Theano's old name of TensorType
tensor_copy = identity        # Theano's Elemwise{identity}: a new array with x's values
power = pow                   # Theano's numpy-named power


class _ZeroDimCopy(Op):
    """A 0-d tensor in, the same value out (Theano's scalar <-> 0-d tensor conversions)."""

    __props__ = ()

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        if x.ndim != 0:
            raise TypeError(f"{type(self).__name__}: {x} ({x.type}) must be a scalar "
                            f"(0 dimensions), it has {x.ndim}")
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        out[0][0] = np.array(inputs[0], copy=True)

    def infer_shape(self, fgraph, node, input_shapes):
        return [()]

    def grad(self, inputs, output_grads):
        return [output_grads[0]]

    def R_op(self, inputs, eval_points):
        return [eval_points[0]]


class TensorFromScalar(_ZeroDimCopy):
    """Theano's scalar -> 0-d tensor conversion (scalars are 0-d tensors here: a copy)."""


class ScalarFromTensor(_ZeroDimCopy):
    """Theano's 0-d tensor -> scalar conversion (scalars are 0-d tensors here: a copy)."""


tensor_from_scalar = TensorFromScalar()
scalar_from_tensor = ScalarFromTensor()


class Default(Op):
    """`default(x, d)`: x's value, or d's where x's value is None at run time."""

    __props__ = ()

    def make_node(self, x: Any, default: Any) -> Apply:
        x = as_tensor_variable(x)
        default = as_tensor_variable(default)
        if default.ndim != x.ndim:
            raise TypeError(f"default: {default} ({default.type}) must have the "
                            f"{x.ndim} dimensions of {x} ({x.type})")
        return Apply(self, [x, default], [x.type()])

    def perform(self, node, inputs, out):
        x, d = inputs
        value = d if x is None else x
        out[0][0] = np.array(value, dtype=node.outputs[0].dtype, copy=True)

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]


def default(x: Any, default: Any) -> TensorVariable:
    """Theano's `default`: `x`, or `default` where x is None when the function runs."""
    return Default()(x, default)


class PermuteRowElements(Op):
    """Theano's `PermuteRowElements()(x, y, inverse)`: out[..., i] = x[..., y[..., i]]
    (inverse: out[..., y[..., i]] = x[..., i]); the leading dimensions of x and of the
    integer permutations y broadcast together."""

    __props__ = ()

    def make_node(self, x: Any, y: Any, inverse: Any) -> Apply:
        x, y, inverse = (as_tensor_variable(v) for v in (x, y, inverse))
        if not y.dtype.startswith(("int", "uint")) or y.ndim < 1:
            raise TypeError(f"permute_row_elements: the permutation {y} ({y.type}) must be "
                            "an integer tensor of 1 dimension or more")
        if x.ndim < 1 or inverse.ndim != 0:
            raise TypeError(f"permute_row_elements: x {x} ({x.type}) needs a dimension and "
                            f"inverse ({inverse.type}) must be a scalar")
        nd = max(x.ndim, y.ndim)
        xb = (True,) * (nd - x.ndim) + tuple(x.broadcastable)
        yb = (True,) * (nd - y.ndim) + tuple(y.broadcastable)
        bcast = tuple(a and b for a, b in zip(xb[:-1], yb[:-1])) + (xb[-1] and yb[-1],)
        return Apply(self, [x, y, inverse], [TensorType(x.dtype, bcast)()])

    def perform(self, node, inputs, out):
        x, y, inverse = inputs
        n = y.shape[-1]
        if x.shape[-1] != n and x.shape[-1] != 1:
            raise ValueError(f"permute_row_elements: rows of x (shape {x.shape}) and "
                             f"permutations (shape {y.shape}) differ in length")
        if not (np.sort(y, axis=-1) == np.arange(n)).all():
            raise ValueError(f"permute_row_elements: {y.tolist()} holds rows that are not "
                             f"permutations of range({n})")
        nd = node.outputs[0].ndim
        x = x.reshape((1,) * (nd - x.ndim) + x.shape)
        y = y.reshape((1,) * (nd - y.ndim) + y.shape)
        lead = np.broadcast_shapes(x.shape[:-1], y.shape[:-1])
        xs = np.broadcast_to(x, lead + (n,))
        ys = np.broadcast_to(y, lead + (n,))
        if int(inverse):
            res = np.empty(lead + (n,), dtype=x.dtype)
            np.put_along_axis(res, ys, xs, axis=-1)
        else:
            res = np.take_along_axis(xs, ys, axis=-1)
        out[0][0] = np.ascontiguousarray(res)

    def infer_shape(self, fgraph, node, input_shapes):
        nd = node.outputs[0].ndim
        xs, ys = ([1] * (nd - len(s)) + list(s) for s in input_shapes[:2])
        xv, yv = (node.inputs[i] for i in (0, 1))
        xb = (True,) * (nd - xv.ndim) + tuple(xv.broadcastable)
        return [tuple(y if b else x for x, y, b in zip(xs[:-1], ys[:-1], xb[:-1])) + (ys[-1],)]

    def grad(self, inputs, output_grads):
        x, y, inverse = inputs
        gx = permute_row_elements(output_grads[0], y, 1 - inverse)
        return [_sum_to_broadcast_pattern(gx, x), None, None]


def permute_row_elements(x: Any, y: Any, inverse: Any = 0) -> TensorVariable:
    """Each row of `x` permuted by the matching row of `y` (Theano's; see the op)."""
    return PermuteRowElements()(x, y, constant(int(inverse), dtype="int8")
                                if isinstance(inverse, (bool, int, np.integer)) else inverse)


def inverse_permutation(perm: Any) -> TensorVariable:
    """The inverse of each permutation in the last dimension of `perm` (integers)."""
    perm = as_tensor_variable(perm)
    return permute_row_elements(arange(perm.shape[-1], dtype=perm.dtype), perm, 1)


class Split(Op):
    """Theano's `Split(len_splits)(x, axis, splits)`: `x` cut along `axis` into
    `len_splits` pieces of the lengths in the integer vector `splits`."""

    __props__ = ("len_splits",)

    def __init__(self, len_splits: int):
        self.len_splits = int(len_splits)

    def make_node(self, x: Any, axis: Any, splits: Any) -> Apply:
        x, axis, splits = (as_tensor_variable(v) for v in (x, axis, splits))
        if axis.ndim != 0 or not axis.dtype.startswith(("int", "uint")):
            raise TypeError(f"Split: axis {axis} ({axis.type}) must be an integer scalar")
        if splits.ndim != 1 or not splits.dtype.startswith(("int", "uint")):
            raise TypeError(f"Split: splits {splits} ({splits.type}) must be an integer vector")
        if x.ndim < 1:
            raise TypeError(f"Split: {x} ({x.type}) has no dimension to split")
        return Apply(self, [x, axis, splits],
                     [TensorType(x.dtype, (False,) * x.ndim)() for _ in range(self.len_splits)])

    def perform(self, node, inputs, out):
        x, axis, splits = inputs
        axis = int(axis)
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"Split: axis {axis} is out of range for shape {x.shape}")
        if len(splits) != self.len_splits:
            raise ValueError(f"Split: {len(splits)} split lengths for len_splits="
                             f"{self.len_splits}")
        if (np.asarray(splits) < 0).any() or int(np.sum(splits)) != x.shape[axis]:
            raise ValueError(f"Split: lengths {list(splits)} do not add up to {x.shape[axis]}, "
                             f"the length of axis {axis} of shape {x.shape}")
        for o, piece in zip(out, np.split(x, np.cumsum(splits)[:-1], axis=axis)):
            o[0] = piece.copy()

    def infer_shape(self, fgraph, node, input_shapes):
        x, axis, splits = node.inputs
        nd = x.ndim
        shp = input_shapes[0]
        ax = switch(axis < 0, axis + nd, axis)
        return [tuple(switch(eq(ax, d), splits[i], shp[d]) for d in range(nd))
                for i in range(self.len_splits)]

    def grad(self, inputs, output_grads):
        x, axis, splits = inputs
        try:
            ax = int(get_scalar_constant_value(axis))
        except NotScalarConstantError:
            raise NotImplementedError(f"Split: the gradient needs a constant axis, got {axis}")
        outs = self(x, axis, splits)
        outs = outs if isinstance(outs, list) else [outs]
        gs = [g if g is not None else o.zeros_like() for g, o in zip(output_grads, outs)]
        return [join(ax, *gs), None, None]


def split(x: Any, splits_size: Any, n_splits: int, axis: Any = 0) -> list[TensorVariable]:
    """Theano's `split`: `x` cut along `axis` into `n_splits` pieces of `splits_size` lengths."""
    outs = Split(n_splits)(x, axis, splits_size)
    return outs if isinstance(outs, list) else [outs]


class AllocEmpty(Op):
    """Theano's `AllocEmpty(dtype)(*shape)`: an uninitialised array of that shape (its
    values are whatever memory held: never folded into a constant)."""

    __props__ = ("dtype",)
    _no_constant_folding = True

    def __init__(self, dtype: str):
        self.dtype = str(np.dtype(dtype))

    def make_node(self, *shape: Any) -> Apply:
        dims = [_as_int_scalar(s, "AllocEmpty dimension") for s in shape]
        bcast = []
        for d in dims:
            try:
                bcast.append(int(get_scalar_constant_value(d)) == 1)
            except NotScalarConstantError:
                bcast.append(False)
        return Apply(self, dims, [TensorType(self.dtype, tuple(bcast))()])

    def perform(self, node, inputs, out):
        out[0][0] = np.empty(tuple(int(s) for s in inputs), dtype=self.dtype)

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(node.inputs)]

    def connection_pattern(self, node):
        return [[False] for _ in node.inputs]


class Rebroadcast(Op):
    """`Rebroadcast((axis, flag), ...)(x)`: `x` with those dimensions' broadcastable flags set
    (True: checked at run time to have length 1), as a view."""

    __props__ = ("axis",)
    view_map = {0: [0]}

    def __init__(self, *axis: tuple[int, bool]):
        pairs = []
        for item in axis:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise TypeError(f"Rebroadcast takes (axis, bool) pairs, got {item!r}")
            pairs.append((int(item[0]), bool(item[1])))
        self.axis = tuple(sorted(dict(pairs).items()))

    def __str__(self) -> str:
        return "Rebroadcast{" + ", ".join(f"({a}, {b})" for a, b in self.axis) + "}"

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        bcast = list(x.broadcastable)
        for a, b in self.axis:
            if not -x.ndim <= a < x.ndim:
                raise ValueError(f"{self}: axis {a} is out of range for {x.type}")
            bcast[a] = b
        return Apply(self, [x], [TensorType(x.dtype, tuple(bcast))()])

    def perform(self, node, inputs, out):
        (x,) = inputs
        want = tuple(b and not xb for b, xb in zip(node.outputs[0].broadcastable,
                                                    node.inputs[0].broadcastable))
        out[0][0] = check_declared_broadcastable(x, want)

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(1 if b else s for b, s in zip(node.outputs[0].broadcastable,
                                                    input_shapes[0]))]

    def grad(self, inputs, output_grads):
        (x,) = inputs
        back = Rebroadcast(*[(a, x.broadcastable[a]) for a, _ in self.axis])
        return [back(output_grads[0])]


class NoneTypeT(Type):
    """The type whose only value is None (Theano's, for NoneConst: an absent argument)."""

    def filter(self, value: Any, strict: bool = False, allow_downcast: bool | None = None) -> Any:
        if value is not None:
            raise TypeError(f"NoneTypeT holds only None, got {value!r}")
        return None

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __str__(self) -> str:
        return "none"


NoneConst = Constant(NoneTypeT(), None, name="NoneConst")


def _none(v: Any) -> Any:
    """None for NoneConst (or a clone of it), v otherwise."""
    return None if isinstance(v, Constant) and isinstance(v.type, NoneTypeT) else v


def extract_constant(x: Any, elemwise: bool = True, only_process_constants: bool = False) -> Any:
    """Theano's: a new constant holding `x`'s value where it is a known scalar constant
    (a copy: changing it leaves `x` alone), else `x` itself."""
    try:
        value = get_scalar_constant_value(x, elemwise=elemwise)
    except NotScalarConstantError:
        return x
    value = np.array(value, copy=True)
    # a new constant, not the shared one constant() hands out: callers may change its data
    return TensorConstant(TensorType(value.dtype.name, ()), value)


def ceil_intdiv(a: Any, b: Any) -> TensorVariable:
    """Theano's: ceil(a / b) by integer arithmetic (a // b, plus 1 where a % b is not 0)."""
    div = int_div(a, b)
    return div + cast(neq(a % b, 0), div.dtype)


def _builder(name: str, make: Callable[..., Callable[..., Any]], doc: str) -> type:
    """A Theano class name for a concept our functions build from several ops: calling the
    class gives the function with Theano's constructor arguments bound; no single op of
    ours is it, so isinstance is false for every op."""
    return op_alias(name, _MODULE, make, lambda op: False, doc)


MaxAndArgmax = _builder(
    "MaxAndArgmax", lambda axis=None: (lambda x: max_and_argmax(x, _none(axis))),
    "Theano's MaxAndArgmax(axis)(x): [max, argmax] of x along axis (a Max reduction and an "
    "Argmax op here)")
Mean = _builder("Mean", lambda axis=None: (lambda x: mean(x, axis)),
                "Theano's Mean(axis)(x): the mean of x (a sum divided by the count here)")
Tile = _builder("Tile", lambda ndim: (lambda x, reps: tile(x, reps, ndim)),
                "Theano's Tile(ndim)(x, reps): np.tile (built from alloc and reshape here)")
Tri = _builder("Tri", lambda dtype=None: (lambda N, M=None, k=0: tri(N, M, k, dtype)),
               "Theano's Tri(dtype)(N, M, k): np.tri (a comparison of two ranges here)")
Choose = _builder("Choose", lambda mode="raise": (lambda a, choices: choose(a, choices, mode)),
                  "Theano's Choose(mode)(a, choices): np.choose (advanced indexing here)")
