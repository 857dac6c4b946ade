"""Elemwise (a scalar op over broadcast tensors), DimShuffle and CAReduce."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.graph.basic import Apply, Constant
from symgpu.graph.op import Op
from symgpu.graph.op_alias import op_alias
from symgpu.scalar.basic import SCALAR_OPS, ScalarOp
from symgpu.scalar.composite import Composite
from symgpu.scalar.dtypes import dtype_kind, is_float, value_dtype
from symgpu.tensor import shape_rules
from symgpu.tensor.c_elemwise import c_elemwise_thunk, c_sum_thunk
from symgpu.tensor.shape_rules import dimshuffle_shape, elemwise_shape, reduce_shape
from symgpu.tensor.type import TensorType, TensorVariable, as_tensor_variable

__all__ = ["Elemwise", "DimShuffle", "CAReduce", "broadcast_shape_of", "keepdims_order"]


#: the tensor language (the symgpu.tensor package) that gradients build with: the scalar
#: table's grad rules take it as their ``T``. The package sits above this module and installs
#: itself here when it loads (install_language).
_LANGUAGE: list[Any] = []


def install_language(namespace: Any) -> None:
    """Let gradients built here use `namespace` (symgpu.tensor) as their ``T``."""
    _LANGUAGE[:] = [namespace]


def _tensor_namespace() -> Any:
    return _LANGUAGE[0]


class DimShuffle(Op):
    """Reorder, drop (broadcastable only) and insert ('x') dimensions; a view of its input."""

    __props__ = ("input_broadcastable", "new_order", "inplace")
    view_map = {0: [0]}

    def __init__(self, input_broadcastable: Sequence[bool], new_order: Sequence[Any], inplace: bool = True):
        self.input_broadcastable = tuple(bool(b) for b in input_broadcastable)
        self.new_order = tuple(new_order)
        self.inplace = inplace
        nd = len(self.input_broadcastable)
        kept = [d for d in self.new_order if d != "x"]
        for d in kept:
            if not isinstance(d, (int, np.integer)) or not 0 <= d < nd:
                raise ValueError(f"dimshuffle pattern {self.new_order} names dimension {d!r}; "
                                 f"the input has {nd} dimensions")
        if len(set(kept)) != len(kept):
            raise ValueError(f"dimshuffle pattern {self.new_order} repeats a dimension")
        self.drop = [d for d in range(nd) if d not in kept]
        for d in self.drop:
            if not self.input_broadcastable[d]:
                raise ValueError(f"dimshuffle pattern {self.new_order} drops dimension {d}, "
                                 "which is not broadcastable (length not known to be 1)")
        self.shuffle = kept
        self.augment = [i for i, d in enumerate(self.new_order) if d == "x"]
        self.is_transpose_only = not self.augment and not self.drop

    def __str__(self) -> str:
        return f"{'Inplace' if self.inplace else ''}DimShuffle{{{','.join(str(d) for d in self.new_order)}}}"

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        if x.type.broadcastable != self.input_broadcastable:
            if len(x.broadcastable) != len(self.input_broadcastable) or any(
                    b and not xb for b, xb in zip(self.input_broadcastable, x.broadcastable)):
                raise TypeError(f"{self} expects an input with broadcastable pattern "
                                f"{self.input_broadcastable}, got {x.type}")
        bcast = tuple(True if d == "x" else x.broadcastable[d] for d in self.new_order)
        return Apply(self, [x], [TensorType(x.dtype, bcast)()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        """A closure for the common shapes: a transpose or a scalar made (1, 1, ...) cost
        far less than the generic perform path, and such nodes are in every function."""
        (cin,), (cout,) = [storage_map[v] for v in node.inputs], [storage_map[v] for v in node.outputs]
        nd = len(self.input_broadcastable)
        perm = tuple(self.shuffle + self.drop)
        if not self.augment and not self.drop and perm != tuple(range(nd)):
            def thunk():
                cout[0] = cin[0].transpose(perm)
        elif nd == 0:
            shape = (1,) * len(self.new_order)

            def thunk():
                cout[0] = cin[0].reshape(shape)
        else:
            return super().make_thunk(node, storage_map, compute_map, no_recycling, impl)
        return _closure_thunk(thunk, node, storage_map)

    def perform(self, node, inputs, out):
        x = inputs[0]
        res = x.transpose(self.shuffle + self.drop) if self.shuffle + self.drop != list(range(x.ndim)) else x
        shape = list(res.shape[: len(self.shuffle)])
        for i in self.augment:
            shape.insert(i, 1)
        out[0][0] = res.reshape(shape)

    def grad(self, inputs, output_grads):
        (x,), (gz,) = inputs, output_grads
        # put gz's kept dims back in input order; dropped (length-1) dims come back as 'x'
        grad_order = []
        for d in range(x.ndim):
            grad_order.append(self.new_order.index(d) if d in self.new_order else "x")
        gz_kept = gz
        if self.augment:
            gz_kept = gz.sum(axis=self.augment, keepdims=True)
        pattern = [p if p == "x" else p for p in grad_order]
        gx = DimShuffle(gz_kept.broadcastable, pattern)(gz_kept)
        return [gx]

    def R_op(self, inputs, eval_points):
        return [None if eval_points[0] is None else self(eval_points[0])]

    def infer_shape(self, fgraph, node, input_shapes):
        """The input's lengths reordered; 1 for each 'x' (GpuDimShuffle shares it)."""
        return [dimshuffle_shape(input_shapes[0], self.new_order)]


def broadcast_shape_of(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return np.broadcast_shapes(*shapes)


class Elemwise(Op):
    """A scalar op applied elementwise with NumPy broadcasting.

    `inplace_pattern` maps an output index to the input it overwrites.
    """

    __props__ = ("scalar_op", "inplace_pattern")
    c_kernel_kind = "elemwise"  # tensor.c_elemwise may run it as a compiled C loop

    def __init__(self, scalar_op: ScalarOp, inplace_pattern: dict[int, int] | None = None,
                 name: str | None = None):
        self.scalar_op = scalar_op
        self.inplace_pattern = tuple(sorted((inplace_pattern or {}).items()))
        self.destroy_map = {o: [i] for o, i in self.inplace_pattern}
        self.name = name
        impl = scalar_op.impl
        self._ufunc = impl if isinstance(impl, np.ufunc) and impl.nout == 1 else None
        # float-valued rows (exp, log, reciprocal...) must compute in the output dtype: NumPy
        # would compute exp(int8) in float16 (or reciprocal(int) in integers) and lose it all
        self._float_rule = getattr(getattr(scalar_op, "spec", None), "dtype_rule", None) == "float"

    def __str__(self) -> str:
        if self.name:
            return self.name
        if self.inplace_pattern:
            return f"Elemwise{{{self.scalar_op}}}{list(self.inplace_pattern)}"
        if isinstance(self.scalar_op, Composite):   # a fused graph: Theano's name
            return f"Elemwise{{{self.scalar_op}}}"
        return f"Elemwise{{{self.scalar_op},no_inplace}}"

    def make_node(self, *inputs: Any) -> Apply:
        inputs = [as_tensor_variable(i) for i in inputs]
        nd = max((i.ndim for i in inputs), default=0)
        padded = []
        for i in inputs:
            if i.ndim < nd:
                i = DimShuffle(i.broadcastable, ["x"] * (nd - i.ndim) + list(range(i.ndim)))(i)
            padded.append(i)
        bcast = tuple(all(p.broadcastable[d] for p in padded) for d in range(nd))
        in_dtypes = [p.dtype for p in padded]
        # scalar ops with several outputs (fused Composites) give one dtype per output
        out_dtypes = (list(self.scalar_op.output_dtypes(*in_dtypes))
                      if getattr(self.scalar_op, "nout", 1) != 1
                      else [self.scalar_op.output_dtype(*in_dtypes)])
        for o, i in self.inplace_pattern:
            inp = padded[i]
            if inp.dtype != out_dtypes[o] or inp.broadcastable != bcast:
                raise TypeError(f"{self}: input {i} ({inp.type}) cannot hold the output "
                                f"({out_dtypes[o]}, broadcastable {bcast}) in place")
        return Apply(self, padded, [TensorType(d, bcast)() for d in out_dtypes])

    def infer_shape(self, fgraph, node, input_shapes):
        """Each dim: the length of an input not broadcastable there (they must agree), else
        1. GpuElemwise and ElemwiseKernelOp share it."""
        shape = elemwise_shape([v.broadcastable for v in node.inputs], input_shapes)
        return [shape] * len(node.outputs)

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        # scalar ops that evaluate themselves (Composite: generated NumPy code) make the thunk
        hook = getattr(self.scalar_op, "make_elemwise_thunk", None)
        if hook is not None:
            thunk = hook(node, storage_map, compute_map)
        else:
            thunk = self._ufunc_thunk(node, storage_map)
            if thunk is None:
                thunk = super().make_thunk(node, storage_map, compute_map, no_recycling, impl)
        checks = runtime_broadcast_checks(node)
        if checks:
            thunk = _BroadcastCheckedThunk(thunk, node, [storage_map[v] for v in node.inputs],
                                           checks)
        # a compiled loop where it can run; it checks shapes itself, and takes `thunk`
        # (NumPy, with the broadcast checks and their errors) for any other call
        return c_elemwise_thunk(node, storage_map, thunk) or thunk

    def _ufunc_thunk(self, node, storage_map):
        """A closure for the plain case (one NumPy ufunc, its own arity, float inputs where
        the row needs them, not in place): no per-call dispatch beyond the ufunc itself."""
        ufunc = self._ufunc
        if (ufunc is None or self.inplace_pattern or len(node.inputs) != ufunc.nin
                or len(node.outputs) != 1 or getattr(self.scalar_op, "elemwise_perform", None)
                or (self._float_rule and any(dtype_kind(v.dtype) not in "fc"
                                             for v in node.inputs))):
            return None
        cells = _cells_with_scalar_constants(node, storage_map)
        cout = storage_map[node.outputs[0]]
        dtype = np.dtype(node.outputs[0].dtype)
        asarray = np.asarray
        if len(cells) == 1:
            (c0,) = cells

            def thunk():
                r = ufunc(c0[0])
                cout[0] = r if r.__class__ is np.ndarray and r.dtype == dtype else asarray(r, dtype)
        elif len(cells) == 2:
            c0, c1 = cells

            def thunk():
                r = ufunc(c0[0], c1[0])
                cout[0] = r if r.__class__ is np.ndarray and r.dtype == dtype else asarray(r, dtype)
        else:
            return None
        return _closure_thunk(thunk, node, storage_map)

    def perform(self, node, inputs, out):
        hook = getattr(self.scalar_op, "elemwise_perform", None)
        if hook is not None:
            return hook(node, inputs, out)
        dtype = node.outputs[0].type.dtype
        ufunc = self._ufunc
        if self._float_rule and any(dtype_kind(i.dtype) not in "fc" for i in inputs):
            inputs = [i if dtype_kind(i.dtype) in "fc" else i.astype(dtype) for i in inputs]
        if ufunc is not None and len(inputs) > ufunc.nin:
            # variadic rows (add, mul) fold left in the output dtype: a third positional
            # argument of a NumPy ufunc is its `out`, which silently overwrote an input
            acc = None
            for i in inputs:
                i = i if i.dtype == dtype else i.astype(dtype)
                acc = i if acc is None else ufunc(acc, i)
            if self.inplace_pattern:
                target = inputs[self.inplace_pattern[0][1]]
                target[...] = acc
                acc = target
            out[0][0] = np.asarray(acc, dtype=dtype)
            return
        if self.inplace_pattern:
            target = inputs[self.inplace_pattern[0][1]]
            if ufunc is not None:
                ufunc(*inputs, out=target)
            else:
                target[...] = self.scalar_op.impl(*inputs)
            out[0][0] = target
            return
        if ufunc is not None:
            result = ufunc(*inputs)
            if result.__class__ is not np.ndarray or result.dtype != dtype:
                result = np.asarray(result, dtype=dtype)
        else:
            # table rows that are not ufuncs (e.g. `second`) may not broadcast by themselves
            result = np.asarray(self.scalar_op.impl(*inputs), dtype=dtype)
            shape = np.broadcast_shapes(*[np.shape(i) for i in inputs])
            if result.shape != shape:
                result = np.array(np.broadcast_to(result, shape))
        out[0][0] = result

    def grad(self, inputs, output_grads):
        return self.L_op(inputs, [self(*inputs)], output_grads)

    def L_op(self, inputs, outputs, output_grads):
        # reuse the node's own output (exp, sigmoid, sqrt... grads use it): no recomputation
        T = _tensor_namespace()
        out = outputs[0]
        (gz,) = output_grads
        raw = self.scalar_op.grad(T, list(inputs), out, gz)
        grads = []
        for x, g in zip(inputs, raw):
            if g is None or not is_float(x.dtype):
                grads.append(None)
                continue
            g = as_tensor_variable(g)
            g = _sum_to_broadcast_pattern(g, x)
            if g.dtype != x.dtype:
                g = T.cast(g, x.dtype)
            grads.append(g)
        return grads

    def R_op(self, inputs, eval_points):
        T = _tensor_namespace()
        total = None
        out = self(*inputs)
        for i, ep in enumerate(eval_points):
            if ep is None:
                continue
            # the unreduced partial derivative: summing it to the input's broadcast pattern
            # (as grad does) would be wrong here, the tangent lives on the output's shape
            partial = self.scalar_op.grad(T, list(inputs), out, T.ones_like(out))[i]
            if partial is None or not is_float(inputs[i].dtype) or not is_float(out.dtype):
                continue
            term = partial * ep
            total = term if total is None else total + term
        if total is not None and total.dtype != out.dtype:
            total = T.cast(total, out.dtype)
        return [total]


def _cells_with_scalar_constants(node: Apply, storage_map: dict) -> list[list]:
    """The input cells of a ufunc thunk, where a one-element constant of the node's dtype
    (the `1` of `x + 1`, padded to x's ndim) becomes a cell of its own holding the value as
    a 0-d array: NumPy broadcasts a 0-d operand about 250 ns faster than a (1, ...) one, the
    same result (the other inputs have the node's ndim). Only when every input has the
    output's dtype (no promotion rule differs between the two) and one input stays."""
    cells = [storage_map[v] for v in node.inputs]
    dtype = node.outputs[0].dtype
    if any(v.dtype != dtype for v in node.inputs):
        return cells
    scalar = [isinstance(v, Constant) and isinstance(v.data, np.ndarray) and v.data.size == 1
              and all(v.broadcastable) for v in node.inputs]
    if all(scalar):
        return cells
    return [[v.data.reshape(())] if k else cell
            for v, k, cell in zip(node.inputs, scalar, cells)]


def _closure_thunk(fn, node, storage_map):
    """Give a closure the attributes the VM, profiler and DebugMode read from thunks."""
    fn.op, fn.node = node.op, node
    fn.inputs = [storage_map[v] for v in node.inputs]
    fn.outputs = [storage_map[v] for v in node.outputs]
    fn.lazy = False
    return fn


def runtime_broadcast_checks(node) -> list[tuple[int, list[int]]]:
    """(dim, inputs) pairs where two or more inputs are not known to have length 1: those
    lengths must agree at run time. Like Theano and PyTensor, a length-1 dimension whose type
    is not broadcastable is not stretched (its gradient would come back with the wrong shape);
    declare it broadcastable (T.row, T.col, specify_broadcastable_as) instead."""
    checks = []
    for d in range(node.outputs[0].ndim):
        idx = [i for i, v in enumerate(node.inputs) if not v.broadcastable[d]]
        if len(idx) > 1:
            checks.append((d, idx))
    return checks


class _BroadcastCheckedThunk:
    """Runs an Elemwise thunk after checking that no undeclared broadcasting happens."""

    lazy = False

    def __init__(self, thunk, node, cells, checks):
        self.thunk, self.node, self.op = thunk, node, node.op
        self.cells, self.checks = cells, checks
        self.inputs = getattr(thunk, "inputs", cells)
        self.outputs = getattr(thunk, "outputs", None)

    def __call__(self) -> None:
        cells = self.cells
        for d, idx in self.checks:
            n = cells[idx[0]][0].shape[d]
            for i in idx[1:]:
                m = cells[i][0].shape[d]
                if m != n and (m == 1 or n == 1):
                    shapes = [cells[j][0].shape for j in range(len(cells))]
                    raise ValueError(
                        f"{self.op}: input shapes {shapes} need broadcasting along dimension "
                        f"{d}, which the types do not allow (input {idx[0] if n == 1 else i} "
                        "has length 1 there but its type is not broadcastable); declare the "
                        "dimension broadcastable, e.g. T.row/T.col or "
                        "T.specify_broadcastable_as")
        self.thunk()


def _sum_to_broadcast_pattern(g: TensorVariable, x: TensorVariable) -> TensorVariable:
    """Sum a gradient over the dimensions where `x` was broadcast."""
    T = _tensor_namespace()
    if g.ndim > x.ndim:
        g = g.sum(axis=tuple(range(g.ndim - x.ndim)))
    axes = [d for d in range(x.ndim) if x.broadcastable[d] and not g.broadcastable[d]]
    if axes:
        g = g.sum(axis=tuple(axes), keepdims=True)
    if g.broadcastable != x.broadcastable:
        g = T.specify_broadcastable_as(g, x.type.clone(dtype=g.dtype))
    return g


# ----------------------------------------------------------------------------- reductions

_REDUCE_NAMES = {"add": "Sum", "mul": "Prod", "maximum": "Max", "minimum": "Min",
                 "and_": "All", "or_": "Any"}
_REDUCE_UFUNC = {"add": np.add, "mul": np.multiply, "maximum": np.maximum,
                 "minimum": np.minimum, "and_": np.logical_and, "or_": np.logical_or}


def reduce_output_dtype(op_name: str, dtype: str) -> str:
    """NumPy's accumulator rule: sum/prod of small ints and bools give int64/uint64."""
    if op_name in ("and_", "or_"):
        return "bool"
    if op_name in ("add", "mul"):
        if dtype == "bool" or dtype in ("int8", "int16", "int32"):
            return "int64"
        if dtype in ("uint8", "uint16", "uint32"):
            return "uint64"
    return dtype


def keepdims_order(ndim: int, axes: Sequence[int] | None) -> list:
    """The DimShuffle order that puts back, as length-1 dims, the ``axes`` a reduction over
    an ``ndim``-d input removed (None: all of them): NumPy's ``keepdims``."""
    removed = range(ndim) if axes is None else axes
    order: list = []
    for d in range(ndim):
        order.append("x" if d in removed else len(order) - order.count("x"))
    return order


class CAReduce(Op):
    """Reduce over `axis` (a tuple, or None for all) with a commutative associative op.

    Sums and products of the half dtypes (float16, bfloat16) accumulate in float32 and round
    once to `dtype`, whatever the graph says: the host agrees with the GPU's kernels."""

    __props__ = ("scalar_op", "axis", "dtype")
    c_kernel_kind = "reduce"  # tensor.c_elemwise may run a full float sum as a C loop

    def __init__(self, scalar_op: ScalarOp | str, axis: Sequence[int] | None = None, dtype: str | None = None):
        if isinstance(scalar_op, str):
            scalar_op = SCALAR_OPS[scalar_op]
        if scalar_op.name not in _REDUCE_UFUNC:
            raise ValueError(f"cannot reduce with {scalar_op}; use one of {', '.join(_REDUCE_UFUNC)}")
        self.scalar_op = scalar_op
        self.axis = None if axis is None else tuple(sorted(int(a) for a in axis))
        self.dtype = dtype
        self.ufunc = _REDUCE_UFUNC[scalar_op.name]

    def __str__(self) -> str:
        name = _REDUCE_NAMES[self.scalar_op.name]
        parts = []
        if self.axis is not None:
            parts.append(f"axis={list(self.axis)}")
        if self.dtype is not None:
            parts.append(f"acc_dtype={self.dtype}")
        return f"{name}{{{', '.join(parts)}}}" if parts else name

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        axis = tuple(range(x.ndim)) if self.axis is None else self.axis
        for a in axis:
            if not 0 <= a < x.ndim:
                raise ValueError(f"{self}: axis {a} is out of range for {x.type}")
        dtype = self.dtype or reduce_output_dtype(self.scalar_op.name, x.dtype)
        bcast = tuple(b for d, b in enumerate(x.broadcastable) if d not in axis)
        return Apply(self, [x], [TensorType(dtype, bcast)()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        """Sums and products: one ufunc.reduce call in a closure (no generic perform path)."""
        if self.scalar_op.name not in ("add", "mul"):
            return super().make_thunk(node, storage_map, compute_map, no_recycling, impl)
        (cin,), (cout,) = [storage_map[v] for v in node.inputs], [storage_map[v] for v in node.outputs]
        reduce, axis, dtype, asarray = self.ufunc.reduce, self.axis, node.outputs[0].dtype, np.asarray
        acc = value_dtype(dtype)
        if acc != dtype:
            # a half sum or product accumulates in float32 and rounds once (see perform)
            def thunk():
                cout[0] = asarray(reduce(cin[0], axis=axis, dtype=acc), dtype=dtype)
            return _closure_thunk(thunk, node, storage_map)

        def thunk():
            cout[0] = asarray(reduce(cin[0], axis=axis, dtype=dtype))
        thunk = _closure_thunk(thunk, node, storage_map)
        if self.scalar_op.name == "add":
            return c_sum_thunk(node, storage_map, thunk) or thunk
        return thunk

    def perform(self, node, inputs, out):
        (x,) = inputs
        axis = self.axis if self.axis is not None else None
        dtype = node.outputs[0].dtype
        name = self.scalar_op.name
        if name in ("add", "mul"):
            # half sums and products accumulate in float32 (value_dtype), as the GPU's do:
            # bfloat16's 8 bits lose a sum of more than a few hundred terms (20000 * 0.1
            # gave 32), and float16 overflows at 65504 in the middle of a product
            res = self.ufunc.reduce(x, axis=axis, dtype=value_dtype(dtype))
        elif name in ("maximum", "minimum"):
            if x.size == 0 and (axis is None or any(x.shape[a] == 0 for a in axis)):
                raise ValueError(f"{self}: cannot reduce an empty array of shape {x.shape}")
            res = self.ufunc.reduce(x, axis=axis)
        else:
            res = self.ufunc.reduce(x, axis=axis)
        out[0][0] = np.asarray(res, dtype=dtype)

    def grad(self, inputs, output_grads):
        return self.L_op(inputs, [self(*inputs)], output_grads)

    def infer_shape(self, fgraph, node, input_shapes):
        """The (broadcast) input shape without the reduced axes (GpuCAReduce's is the same
        over its reduction's inputs, which broadcast like an Elemwise's)."""
        shape = elemwise_shape([v.broadcastable for v in node.inputs], input_shapes)
        return [reduce_shape(shape, self.axis)]

    def L_op(self, inputs, outputs, output_grads):
        T = _tensor_namespace()
        (x,), (gz,) = inputs, output_grads
        if not is_float(x.dtype):
            return [None]
        axis = tuple(range(x.ndim)) if self.axis is None else self.axis
        pattern = keepdims_order(x.ndim, axis)
        gz_b = DimShuffle(gz.broadcastable, pattern)(gz)
        name = self.scalar_op.name
        if name == "add":
            g = T.second(x, gz_b)
        elif name in ("maximum", "minimum"):
            z = outputs[0]  # the node's own max/min, not a recomputed one
            z_b = DimShuffle(z.broadcastable, pattern)(z)
            g = gz_b * T.eq(x, z_b)
        elif name == "mul":
            g = T.prod_grad(x, axis, gz_b)
        else:
            return [None]
        return [T.cast(g, x.dtype) if g.dtype != x.dtype else g]

    def R_op(self, inputs, eval_points):
        if eval_points[0] is None:
            return [None]
        if self.scalar_op.name == "add":
            return [self(eval_points[0])]
        raise NotImplementedError(f"{self} has no R_op")


shape_rules.use_elementwise_op(Elemwise)  # dimension arithmetic builds Elemwise nodes


# ---------------------------------------------------------------- Theano's reduction classes
# theano.tensor.elemwise's Sum/Prod/All/CAReduceDtype: our reductions are all CAReduce (one op
# for rewrites and the GPU lifter); these names build and recognise the matching CAReduce.
def _reduction_alias(name: str, op_name: str | None, doc: str) -> type:
    def build(*args: Any, axis: Any = None, dtype: str | None = None,
              acc_dtype: str | None = None) -> CAReduce:
        if op_name is None:                      # CAReduceDtype(scalar_op, axis, dtype, ...)
            scalar_op, *rest = args
            args = tuple(rest)
        else:
            scalar_op = op_name
        if args:
            axis = args[0]
            if len(args) > 1:
                dtype = args[1]
        if isinstance(axis, (int, np.integer)):
            axis = (int(axis),)
        return CAReduce(scalar_op, axis, dtype)

    def accepts(op: Any) -> bool:
        return isinstance(op, CAReduce) and (op_name is None or op.scalar_op.name == op_name)

    return op_alias(name, __name__, build, accepts, doc)


Sum = _reduction_alias("Sum", "add", "Theano's Sum(axis=None, dtype=None, acc_dtype=None): "
                       "a CAReduce of add (sums of the half dtypes accumulate in float32)")
Prod = _reduction_alias("Prod", "mul", "Theano's Prod(axis=None, dtype=None, acc_dtype=None): "
                        "a CAReduce of mul")
All = _reduction_alias("All", "and_", "Theano's All(axis=None): a CAReduce of logical and")
CAReduceDtype = _reduction_alias("CAReduceDtype", None,
                                 "Theano's CAReduceDtype(scalar_op, axis=None, dtype=None, "
                                 "acc_dtype=None): a CAReduce with an output dtype")
__all__ += ["Sum", "Prod", "All", "CAReduceDtype"]
