"""gpu_careduce_epilogue: an elementwise op of a reduction's result computed in the reduction's
own launch (``GpuCAReduce``'s ``post_scalar_op``).

Why: a bias's SGD update, ``b - lr * d.sum(0)``, is a column reduction followed by an
elementwise kernel over its few hundred results; the second launch costs more than its
arithmetic (about 2 us of a CUDA graph's timeline on an H100, three times per step in an MLP
with three layers). The reduction stores each kept position's result through the epilogue
instead: the reduced value rounded to its dtype, then the elementwise op with the other
operands' values at that position (the same arithmetic as the two kernels).

Taken when the reduction's result is read by that elementwise node alone (and is no output of
the function), the node has one output of the result's broadcast pattern, and each other
operand is one value or of that pattern; float reductions only (add, mul, maximum, minimum).

In the default passes (``fast_run``): measured on an H200 (an MLP's SGD step 222.2 ->
215.5 us, with gpu_take_rows); ``optimizer_excluding=gpu_careduce_epilogue`` turns it off.
"""
from __future__ import annotations

from typing import Any

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import sweep
from symgpu.graph.rewriting.db import optdb
from symgpu.gpu.ops.careduce import GpuCAReduce
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.runtime.codegen.scalar import supports_scalar_op
from symgpu.scalar.composite import CompositeBuilder
from symgpu.scalar.dtypes import is_float

__all__ = ["local_careduce_epilogue", "gpu_careduce_epilogue"]

_FLOAT_REDUCTIONS = ("add", "mul", "maximum", "minimum")


def _fusable_reduction(fgraph: FunctionGraph, var: Variable) -> bool:
    node = var.owner
    return (node is not None and type(node.op) is GpuCAReduce
            and node.op.post_scalar_op is None
            and node.op.scalar_op.name in _FLOAT_REDUCTIONS and is_float(var.dtype)
            and len(fgraph.clients.get(var, [])) == 1 and var not in fgraph.outputs)


def _epilogue(op: Any, j: int, dtypes: list[str]) -> Any:
    """``op`` as a Composite whose input 0 is its input ``j`` (the reduced value), then the
    others in their order."""
    b = CompositeBuilder()
    refs = [b.add_input(dtypes[j])]
    refs += [b.add_input(d) for k, d in enumerate(dtypes) if k != j]
    args = [refs[0] if k == j else refs[k + 1 if k < j else k] for k in range(len(dtypes))]
    return b.build(b.add_op(op, args))


def local_careduce_epilogue(fgraph: FunctionGraph, node: Apply) -> list[Variable] | None:
    """GpuElemwise(f)(.., GpuCAReduce(x), ..) -> GpuCAReduce(post=f)(x, ..): see the module
    docstring for when."""
    op = node.op
    if type(op) is not GpuElemwise or op.inplace_pattern or len(node.outputs) != 1:
        return None
    out = node.outputs[0]
    found = [j for j, v in enumerate(node.inputs) if _fusable_reduction(fgraph, v)]
    if len(found) != 1 or node.inputs.count(node.inputs[found[0]]) != 1:
        return None
    j = found[0]
    red = node.inputs[j]
    if red.broadcastable != out.broadcastable:
        return None
    others = [v for k, v in enumerate(node.inputs) if k != j]
    if any(not all(v.broadcastable) and v.broadcastable != out.broadcastable for v in others):
        return None
    dtypes = [v.dtype for v in node.inputs]
    if not supports_scalar_op(op.scalar_op, dtypes):
        return None
    rop = red.owner.op
    post = _epilogue(op.scalar_op, j, dtypes)
    new = GpuCAReduce(rop.scalar_op, rop.axis, rop.dtype, rop.pre_scalar_op, post)(
        *red.owner.inputs, *others)
    if new.type != out.type:
        return None
    return [new]


def gpu_careduce_epilogue(fgraph: FunctionGraph) -> int:
    """Apply `local_careduce_epilogue` everywhere (one sweep); returns how many fused."""
    return sweep(fgraph, local_careduce_epilogue, "gpu_careduce_epilogue")


# after the pre-op fusion (60): a reduction may have both
optdb.register("gpu_careduce_epilogue", gpu_careduce_epilogue, 60.5, "fast_run", "gpu")
