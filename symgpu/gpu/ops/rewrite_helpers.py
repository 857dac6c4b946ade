"""Helpers for writing GPU graph rewrites (Theano's theano.gpuarray.opt_util, issue 31): dig
a constant scale or a producer node out through transfers and broadcasts, fold a scaling or an
addition into an op of the ``out = alpha * op(...) + beta * out_like`` form (GpuGemm, GpuGemv,
GpuGer), make such an op in place on a private GpuAllocEmpty, and pad/unpad dimensions around
ops that want a fixed rank.

Why here: they build on the GPU ops (GpuElemwise, GpuDimShuffle, transfers, GpuAllocEmpty,
GpuReshape) and return our NodeRewriters ``(fgraph, node) -> replacements``, so a rewrite made
with them registers like any other. Theano's rewrites read ``var.clients`` from the graph;
ours are given the graph, so `find_node` takes it (`fgraph`) when it must count clients.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from symgpu.gpu.ops.blas import GpuAllocEmpty
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.placement.basic_ops import GpuDimShuffle, GpuFromHost, GpuReshape, HostFromGpu
from symgpu.graph.basic import Apply, Constant, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.basic import NodeRewriter
from symgpu.scalar.basic import SCALAR_OPS
from symgpu.tensor import basic as _tb
from symgpu.tensor import math as _tm
from symgpu.tensor.elemwise import DimShuffle
from symgpu.tensor.grids import NotScalarConstantError, get_scalar_constant_value
from symgpu.tensor.type import constant

__all__ = ["grab_cpu_scalar", "find_node", "is_equal", "alpha_merge", "output_merge",
           "inplace_allocempty", "pad_dims", "unpad_dims"]


def grab_cpu_scalar(v: Variable, nd: int) -> Variable | None:
    """The 0-d host constant behind `v` (an `nd`-dim broadcast of one value, through
    dimshuffles and transfers), or None where `v` is not such a constant."""
    n = v.owner
    if n is not None:
        if isinstance(n.op, (GpuDimShuffle, DimShuffle)) and n.op.new_order == ("x",) * nd:
            return grab_cpu_scalar(n.inputs[0], n.inputs[0].ndim)
        if isinstance(n.op, (GpuFromHost, HostFromGpu)):
            return grab_cpu_scalar(n.inputs[0], nd)
        return None
    if isinstance(v, Constant) and tuple(v.type.broadcastable) == (True,) * nd:
        data = np.asarray(v.data)
        return constant(data.reshape(()), dtype=str(data.dtype))
    return None


def _single_client(fgraph: FunctionGraph | None, v: Variable, ignore_clients: bool) -> bool:
    if ignore_clients:
        return True
    if fgraph is None:
        raise ValueError(f"find_node: counting the clients of {v} needs the graph (pass "
                         f"fgraph=, or ignore_clients=True)")
    return len(fgraph.clients.get(v, [])) == 1


def find_node(v: Variable, cls: type | tuple, ignore_clients: bool = False,
              fgraph: FunctionGraph | None = None) -> Apply | None:
    """The node of op class `cls` that computes `v`, looking through a
    HostFromGpu -> GpuFromHost round trip; unless `ignore_clients`, only through variables
    with one client in `fgraph` (so a rewrite does not duplicate a shared computation)."""
    if v.owner is None or not _single_client(fgraph, v, ignore_clients):
        return None
    if isinstance(v.owner.op, cls):
        return v.owner
    inner = v.owner.inputs[0] if isinstance(v.owner.op, GpuFromHost) else None
    if inner is not None and inner.owner is not None and \
            isinstance(inner.owner.op, HostFromGpu) and \
            _single_client(fgraph, inner, ignore_clients):
        return find_node(inner.owner.inputs[0], cls, ignore_clients, fgraph)
    return None


def is_equal(var: Any, val: Any) -> bool:
    """True only when `var` is a constant (through broadcasts and casts) equal to `val`."""
    try:
        return bool(get_scalar_constant_value(var) == val)
    except NotScalarConstantError:
        return False


def _binary_gpu(node: Apply, scalar_name: str) -> bool:
    return isinstance(node.op, GpuElemwise) and node.op.scalar_op == SCALAR_OPS[scalar_name] \
        and len(node.inputs) == 2


def _operand_of(fgraph: FunctionGraph, node: Apply, cls: type) -> tuple[Apply, int] | None:
    """(the `cls` node computing one operand of binary `node`, the other operand's index)."""
    for here, other in ((0, 1), (1, 0)):
        targ = find_node(node.inputs[here], cls, fgraph=fgraph)
        if targ is not None:
            return targ, other
    return None


def alpha_merge(cls: type, alpha_in: int, beta_in: int) -> Callable[[Callable], NodeRewriter]:
    """Decorator: a rewrite of ``scalar * cls(..., alpha, ..., beta, ...)`` into
    ``maker(node, *inputs)`` with alpha and beta scaled by the constant (the op computes
    ``alpha * op(...) + beta * out_like``, as GpuGemm). `maker` gets the `cls` node and its new
    inputs; the rewrite (unregistered, named after `maker`) looks at GpuElemwise nodes."""
    def wrapper(maker: Callable[..., Any]) -> NodeRewriter:
        @functools.wraps(maker)
        def rewrite(fgraph: FunctionGraph, node: Apply) -> Any:
            if not _binary_gpu(node, "mul"):
                return None
            found = _operand_of(fgraph, node, cls)
            if found is None:
                return None
            targ, other = found
            lr = grab_cpu_scalar(node.inputs[other], nd=targ.outputs[0].ndim)
            if lr is None or lr.dtype != targ.outputs[0].dtype:
                return None
            inputs = list(targ.inputs)
            c = get_scalar_constant_value(lr)   # lr is a constant (grab_cpu_scalar)
            if c == 0:
                inputs[alpha_in] = inputs[beta_in] = lr
            elif c != 1:
                inputs[alpha_in] = lr * targ.inputs[alpha_in]
                inputs[beta_in] = lr * targ.inputs[beta_in]
            return maker(targ, *inputs)
        return NodeRewriter(rewrite, [GpuElemwise], name=maker.__name__)
    return wrapper


def output_merge(cls: type, alpha_in: int, beta_in: int,
                 out_in: int) -> Callable[[Callable], NodeRewriter]:
    """Decorator: a rewrite of ``W + cls(..., alpha, ..., beta=0, ..., out_like)`` into
    ``maker(node, *inputs)`` with out_like = W and beta = 1, so the op adds into W. Only
    where beta is a constant 0 and W has out_like's broadcast pattern (a broadcast W would
    need tiling)."""
    def wrapper(maker: Callable[..., Any]) -> NodeRewriter:
        @functools.wraps(maker)
        def rewrite(fgraph: FunctionGraph, node: Apply) -> Any:
            if not _binary_gpu(node, "add"):
                return None
            found = _operand_of(fgraph, node, cls)
            if found is None:
                return None
            targ, other = found
            W = node.inputs[other]
            if W.dtype != targ.outputs[0].dtype or not is_equal(targ.inputs[beta_in], 0.0):
                return None
            if tuple(W.broadcastable) != tuple(targ.inputs[out_in].broadcastable):
                return None
            inputs = list(targ.inputs)
            inputs[out_in] = W
            inputs[beta_in] = constant(np.asarray(1.0, dtype=inputs[beta_in].dtype))
            return maker(targ, *inputs)
        return NodeRewriter(rewrite, [GpuElemwise], name=maker.__name__)
    return wrapper


def inplace_allocempty(op: type, idx: int) -> Callable[[Callable], NodeRewriter]:
    """Decorator: an in-place rewrite of `op` nodes (not yet in place) whose input `idx` may
    come from a GpuAllocEmpty: one read by other nodes too is replaced by a fresh
    GpuAllocEmpty of its own, so the op can overwrite it. `maker(node, inputs)` returns the
    in-place node's outputs."""
    def wrapper(maker: Callable[..., Any]) -> NodeRewriter:
        @functools.wraps(maker)
        def rewrite(fgraph: FunctionGraph, node: Apply) -> Any:
            if type(node.op) is not op or node.op.inplace:
                return None
            inputs = list(node.inputs)
            alloc = inputs[idx]
            if alloc.owner is not None and isinstance(alloc.owner.op, GpuAllocEmpty) and \
                    len(fgraph.clients.get(alloc, [])) > 1:
                inputs[idx] = GpuAllocEmpty(alloc.owner.op.dtype,
                                            alloc.owner.op.context_name)(*alloc.owner.inputs)
            return maker(node, inputs)
        rewriter = NodeRewriter(rewrite, [op], name=maker.__name__)
        rewriter.tags.add("inplace")
        return rewriter
    return wrapper


def pad_dims(input: Variable, leftdims: int, rightdims: int) -> Variable:
    """`input` reshaped (GpuReshape) to exactly ``leftdims + rightdims`` dims, its last
    `rightdims` kept: 1s added on the left where it has fewer leading dims, its first leading
    dims multiplied together where it has more. E.g. (3, 5, 7) -> (1, 3, 5, 7) and
    (3, 5, 7, 9, 11) -> (15, 7, 9, 11) for (2, 2); `unpad_dims` undoes it."""
    if input.ndim < rightdims:
        raise ValueError(f"pad_dims: {input} has {input.ndim} dims, fewer than rightdims="
                         f"{rightdims}")
    if input.ndim == leftdims + rightdims:
        return input
    img_shape = input.shape[input.ndim - rightdims:]
    non_pool_ndim = input.ndim - rightdims
    if non_pool_ndim < leftdims:
        dummy = _tb.as_tensor_variable(np.ones(leftdims - non_pool_ndim, dtype="int64"))
        new_shape = _tb.join(0, dummy, input.shape[:non_pool_ndim], img_shape)
    else:
        batched_ndim = non_pool_ndim - leftdims + 1
        batch = _tm.prod(input.shape[:batched_ndim]).dimshuffle("x")
        new_shape = _tb.join(0, batch, input.shape[batched_ndim:non_pool_ndim], img_shape)
    return GpuReshape(leftdims + rightdims)(input, _tm.cast(new_shape, "int64"))


def unpad_dims(output: Variable, input: Variable, leftdims: int, rightdims: int) -> Variable:
    """`output` of an op applied to ``pad_dims(input, leftdims, rightdims)`` reshaped back to
    `input`'s leading dims followed by its own last `rightdims`."""
    if output.ndim == input.ndim:
        return output
    outshp = _tb.join(0, input.shape[:input.ndim - rightdims],
                      output.shape[output.ndim - rightdims:])
    return GpuReshape(input.ndim)(output, outshp)

