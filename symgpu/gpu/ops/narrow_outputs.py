"""gpu_narrow_bool_outputs: a kernel output that is a comparison cast to a float (a dropout
mask, ``cast(u < p, 'float32')``) is stored as the bool and cast by each reader.

Why: the fused dropout kernel (GpuPhiloxElemwise) writes its mask for the backward pass to
read, as the graph's float32: 4 bytes an element where the value is one bit of information.
Stored as a bool, the mask costs a quarter of the memory traffic twice (written forward, read
backward): 3 MB less per 512x1024 layer. The readers, elementwise kernels, cast it back as
they load it (0.0 or 1.0, exactly the stored values). Taken when every reader of the output
is an elementwise kernel and the output is not a function output or an update.
In the default passes (``fast_run``); ``optimizer_excluding=gpu_narrow_bool_outputs`` turns
it off.
"""
from __future__ import annotations

from typing import Any

from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.ops.random_fusion import GpuPhiloxElemwise
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import sweep, try_replace
from symgpu.graph.rewriting.basic import same_typed_outputs
from symgpu.graph.rewriting.db import optdb
from symgpu.scalar.basic import Cast
from symgpu.scalar.composite import Composite, CompositeBuilder
from symgpu.scalar.dtypes import is_float

__all__ = ["gpu_narrow_bool_outputs", "narrow_bool_outputs"]


def _producers() -> tuple[type, ...]:
    return (GpuElemwise, GpuPhiloxElemwise)


def _cast_of_bool(comp: Composite, k: int) -> tuple[int, Cast] | None:
    """(the slot of the bool, the cast) when output k of `comp` is a float cast of a bool
    the Composite computes."""
    slot = comp.out_slots[k]
    op, args = comp.steps[slot - comp.first_step]
    if not isinstance(op, Cast) or not is_float(op.dtype) or len(args) != 1:
        return None
    (a,) = args
    if a < comp.first_step or comp.slot_dtypes[a] != "bool" or a in comp.out_slots:
        return None
    return a, op


def _with_outputs(comp: Composite, outputs: list[int]) -> Composite:
    return Composite(comp.in_dtypes, comp.constants, comp.steps, outputs)


def _reader_casting(reader: Apply, renamed: dict[Variable, Variable],
                    casts: dict[Variable, Cast]) -> list[Variable] | None:
    """`reader`'s outputs over the rebuilt producer's outputs (`renamed`: old -> new), those
    of `casts` (old -> its cast) narrowed to bools and cast back as they are read; None
    where that kernel cannot be made with the reader's output types."""
    ins = [renamed.get(v, v) for v in reader.inputs]
    ext: list[Variable] = []
    for v in ins:
        if not any(v is e for e in ext):
            ext.append(v)
    b = CompositeBuilder()
    refs = {id(v): b.add_input(v.dtype) for v in ext}
    args = []
    for old, new in zip(reader.inputs, ins):
        cast = casts.get(old)
        args.append(b.add_op(cast, [refs[id(new)]])[0] if cast is not None else refs[id(new)])
    comp = b.build(b.add_op(reader.op.scalar_op, args))
    return same_typed_outputs(reader, lambda: GpuElemwise(comp).make_node(*ext).outputs)


def _rebuilt(node: Apply, comp: Composite) -> list[Variable]:
    op = node.op
    if type(op) is GpuElemwise:
        return GpuElemwise(comp).make_node(*node.inputs).outputs
    return type(op)(comp, op.sample_pos, op.dist, op.dtype, op.ndim,
                    op.advance).make_node(*node.inputs).outputs


def _narrowing(fgraph: FunctionGraph, node: Apply) -> list[tuple[Variable, Variable]] | None:
    """The replacements storing each float-cast bool output of `node` as the bool (its
    readers rewritten to cast it), else None."""
    op = node.op
    comp = getattr(op, "scalar_op", None)
    if type(op) not in _producers() or not isinstance(comp, Composite) or \
            getattr(op, "inplace_pattern", None):
        return None
    outputs = list(comp.out_slots)
    narrowed: dict[int, Cast] = {}
    for k in range(comp.nout):
        found = _cast_of_bool(comp, k)
        out = node.outputs[k]
        if found is None or out in fgraph.outputs:   # (update values are outputs too)
            continue
        readers = fgraph.clients.get(out, [])
        if not readers or not all(isinstance(r, Apply) and type(r.op) is GpuElemwise and
                                  not r.op.inplace_pattern for r, _ in readers):
            continue
        outputs[k] = found[0]
        narrowed[k] = found[1]
    if not narrowed:
        return None
    new_outs = _rebuilt(node, _with_outputs(comp, outputs))
    renamed = dict(zip(node.outputs, new_outs))
    casts = {node.outputs[k]: cast for k, cast in narrowed.items()}
    pairs = [(o, n) for k, (o, n) in enumerate(zip(node.outputs, new_outs)) if k not in narrowed]
    readers = {r: None for k in narrowed for r, _ in fgraph.clients.get(node.outputs[k], [])}
    for reader in readers:   # (one rewrite each, also for a reader of several outputs)
        new = _reader_casting(reader, renamed, casts)
        if new is None:
            return None
        pairs = list(zip(reader.outputs, new)) + pairs
    return pairs


def narrow_bool_outputs(fgraph: FunctionGraph, node: Apply) -> bool:
    """Store each float-cast bool output of `node` as the bool (all its readers rewritten to
    cast it); True when something changed."""
    pairs = _narrowing(fgraph, node)
    return pairs is not None and try_replace(fgraph, pairs, "gpu_narrow_bool_outputs")


def gpu_narrow_bool_outputs(fgraph: FunctionGraph) -> int:
    """Apply `_narrowing` to every elementwise (and fused Philox) node; returns how many
    nodes changed."""
    return sweep(fgraph, _narrowing, "gpu_narrow_bool_outputs")


# after gpu_philox_fusion (62) and its advance (62.5), before gpu_inplace (76)
optdb.register("gpu_narrow_bool_outputs", gpu_narrow_bool_outputs, 63, "fast_run", "gpu")
