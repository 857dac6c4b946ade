"""Theano's `theano.tensor.opt` helpers and rewriter classes, on symgpu's rewrite machinery.

Why a module of its own: code written against Theano builds its own passes from these
(`FusionOptimizer(local_elemwise_fusion)`, `InplaceElemwiseOptimizer(T.Elemwise)`, a
ShapeFeature on a graph, the small predicates of its rewrites). Each is a thin layer over
what symgpu's passes use (`fused_replacement`, `inplace_elemwise_op`, the lazy shape
inference of shape_feature.py), with Theano's meaning. Theano's local optimizers take a node
and reach the graph through it; symgpu's node rewrites take `(fgraph, node)`, so the
node rewrites here do too, and the two client helpers take the graph as a second argument.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from symgpu.graph.basic import Apply, Constant, Variable, constant_behind
from symgpu.graph.fg import Feature, FunctionGraph
from symgpu.graph.rewriting import (GraphRewriter, NodeRewriter, apply_node_rewriter,
                                    attach_destroy_handler, copy_stack_trace, node_rewriter,
                                    register_canonicalize, register_specialize,
                                    replace_validate, InconsistencyError)
from symgpu.tensor.basic import alloc
from symgpu.tensor.checks import Assert, assert_op
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.extra_funcs import unbroadcast
from symgpu.tensor.grids import NotScalarConstantError, get_scalar_constant_value
from symgpu.tensor.math import cast
from symgpu.tensor.rewriting.elemwise import MAX_FUSED_INPUTS, _default_fusable, \
    fused_replacement
from symgpu.tensor.rewriting.inplace import inplace_elemwise_op
from symgpu.tensor.rewriting.shape_feature import inferred_shape, same_dim
from symgpu.tensor.rewriting.utils import ew, ew_name
from symgpu.tensor.shape import Shape_i, shape_tuple
from symgpu.tensor.shape_rules import as_dim
from symgpu.tensor.theano_basic import Rebroadcast
from symgpu.tensor.type import as_tensor_variable

__all__ = ["encompasses_broadcastable", "scalarconsts_rest", "broadcast_like", "is_an_upcast",
           "is_inverse_pair", "check_for_x_over_absX", "get_clients", "get_clients2",
           "apply_rebroadcast_opt", "local_useless_rebroadcast", "local_rebroadcast_lift",
           "local_remove_useless_assert", "Assert", "assert_op", "assert_",
           "ShapeFeature", "ShapeOptimizer", "UnShapeOptimizer",
           "InplaceElemwiseOptimizer", "inplace_elemwise_optimizer",
           "local_elemwise_fusion_op", "local_elemwise_fusion", "local_add_mul_fusion",
           "FusionOptimizer", "elemwise_max_input_fct"]

#: Theano's other name for assert_op
assert_ = assert_op


# ----------------------------------------------------------------------------- predicates

def encompasses_broadcastable(b1: Sequence[bool], b2: Sequence[bool]) -> bool:
    """True when a value of pattern `b2` broadcasts to the shape of one of pattern `b1` (and
    not the other way): b1 has at least b2's dims, and no trailing dim broadcastable in b1
    that b2 does not broadcast."""
    if len(b1) < len(b2):
        return False
    b1 = tuple(b1)[len(b1) - len(b2):]
    return not any(v1 and not v2 for v1, v2 in zip(b1, b2))


def scalarconsts_rest(inputs: Sequence[Variable], elemwise: bool = True,
                      only_process_constants: bool = False) -> tuple[list, list, list]:
    """Split `inputs` into (scalar constant values, the inputs holding them, the rest).

    A scalar constant is what `get_scalar_constant_value` fixes (through casts, dimshuffles
    and, with `elemwise`, elementwise ops of constants); with `only_process_constants` only
    a one-element Constant counts."""
    consts, origconsts, nonconsts = [], [], []
    for i in inputs:
        try:
            if only_process_constants:
                c = constant_behind(i) if isinstance(i, Variable) else None
                data = None if c is None else np.asarray(c.data)
                if data is None or data.size != 1:
                    raise NotScalarConstantError(f"{i} is not a one-element constant")
                v = data.reshape(())
            else:
                v = get_scalar_constant_value(i, elemwise=elemwise)
            consts.append(v)
            origconsts.append(i)
        except NotScalarConstantError:
            nonconsts.append(i)
    return consts, origconsts, nonconsts


def broadcast_like(value: Any, template: Variable, fgraph: FunctionGraph,
                   dtype: str | None = None) -> Variable:
    """`value` cast to `dtype` (default: the template's) and broadcast to `template`'s shape
    and broadcastable pattern; `template` must be in `fgraph` (its shape is read there,
    through the graph's ShapeFeature when one is attached)."""
    value = as_tensor_variable(value)
    if value.type == template.type:
        return value
    if template not in fgraph.variables:
        raise ValueError(f"broadcast_like: the template {template} ({template.type}) is not "
                         "in the graph")
    dtype = template.dtype if dtype is None else dtype
    value = cast(value, dtype)
    if value.type == template.type:
        return value
    feature = getattr(fgraph, "shape_feature", None)
    new_shape = feature.shape_of[template] if feature is not None else shape_tuple(template)
    rval = alloc(value, *new_shape)
    if rval.broadcastable != template.broadcastable:
        rval = unbroadcast(rval, *[i for i in range(rval.ndim) if rval.broadcastable[i]
                                   and not template.broadcastable[i]])
    if rval.type.broadcastable != template.broadcastable:
        raise TypeError(f"broadcast_like: {value.type} cannot take the pattern "
                        f"{template.broadcastable} of {template}")
    return rval


_CATEGORY = {
    "bool": (0, 0), "uint8": (1, 1), "uint16": (1, 2), "uint32": (1, 3), "uint64": (1, 4),
    "int8": (2, 1), "int16": (2, 2), "int32": (2, 3), "int64": (2, 4),
    "float16": (3, 1.5), "float32": (3, 2.5), "float64": (3, 3.5),
    "complex64": (4, 3), "complex128": (4, 4)}


def is_an_upcast(type1: str, type2: str) -> bool:
    """Whether converting dtype `type1` to `type2` is an upcast: not to a lower kind (bool <
    uint < int < float < complex) and to a strictly higher precision."""
    cat1, cat2 = _CATEGORY[str(type1)], _CATEGORY[str(type2)]
    return cat2[0] >= cat1[0] and cat2[1] > cat1[1]


def _is_op(op: Any, spec: Any) -> bool:
    if isinstance(spec, type):
        return isinstance(op, spec)
    if isinstance(spec, str):
        return getattr(op, "name", None) == spec
    return op == spec


def is_inverse_pair(node_op: Any, prev_op: Any, inv_pair: tuple[Any, Any]) -> bool:
    """Whether two consecutive scalar ops are the two of `inv_pair`, in either order.

    Theano's pair holds scalar-op classes; symgpu's scalar ops are rows of one table (one
    class), so a pair item may also be a scalar op or its table name (``("exp", "log")``)."""
    node_is_op0, node_is_op1 = _is_op(node_op, inv_pair[0]), _is_op(node_op, inv_pair[1])
    prev_is_op0, prev_is_op1 = _is_op(prev_op, inv_pair[0]), _is_op(prev_op, inv_pair[1])
    return (node_is_op0 and prev_is_op1) or (node_is_op1 and prev_is_op0)


def check_for_x_over_absX(numerators: list[Variable], denominators: list[Variable]
                          ) -> tuple[list[Variable], list[Variable]]:
    """x / abs(x) -> sgn(x) in a product's factor lists (real x only); the lists are changed
    in place and returned."""
    for den in list(denominators):
        if ew_name(den) == "abs" and den.owner.inputs[0] in numerators:
            x = den.owner.inputs[0]
            if not str(x.dtype).startswith("complex"):
                denominators.remove(den)
                numerators.remove(x)
                numerators.append(ew("sgn", x))
    return numerators, denominators


def get_clients(node: Apply, fgraph: FunctionGraph) -> list[Apply]:
    """The nodes of `fgraph` reading `node`'s first output (not the graph's outputs)."""
    return [c for c, _ in fgraph.clients.get(node.outputs[0], ()) if c != "output"]


def get_clients2(node: Apply, fgraph: FunctionGraph) -> list[Apply]:
    """The nodes of `fgraph` reading the outputs of the readers of `node`'s first output."""
    out = []
    for c in get_clients(node, fgraph):
        for var in c.outputs:
            out.extend(cc for cc, _ in fgraph.clients.get(var, ()) if cc != "output")
    return out


# ----------------------------------------------------------------------------- rebroadcast

@register_canonicalize
@register_specialize
@node_rewriter([Rebroadcast])
def local_useless_rebroadcast(fgraph: Any, node: Apply) -> list | None:
    """Drop a Rebroadcast that changes nothing; keep only the axes it does change."""
    x = node.inputs[0]
    if np.all(x.broadcastable == node.outputs[0].broadcastable):
        return [x]
    changed = [(a, b) for a, b in node.op.axis if x.broadcastable[a] != b]
    if len(changed) < len(node.op.axis):
        out = Rebroadcast(*changed)(x)
        copy_stack_trace(node.outputs[0], out)
        return [out]
    return None


@register_canonicalize
@register_specialize
@node_rewriter([Rebroadcast])
def local_rebroadcast_lift(fgraph: Any, node: Apply) -> list | None:
    """Rebroadcast(Elemwise(x)) -> Elemwise(Rebroadcast(x)) for a one-input elementwise op
    read only here; Rebroadcast(Rebroadcast(x)) -> one Rebroadcast."""
    inp = node.inputs[0]
    if inp.owner is None:
        return None
    if isinstance(inp.owner.op, Elemwise) and len(inp.owner.inputs) == 1:
        if fgraph is not None and len(fgraph.clients.get(inp, ())) != 1:
            return None
        rebroadcasted = Rebroadcast(*node.op.axis)(inp.owner.inputs[0])
        out = inp.owner.op(rebroadcasted)
        copy_stack_trace(node.outputs[0], out)
        return [out]
    if isinstance(inp.owner.op, Rebroadcast):
        axis = dict(inp.owner.op.axis)
        axis.update(node.op.axis)
        out = Rebroadcast(*axis.items())(inp.owner.inputs[0])
        copy_stack_trace(node.outputs[0], out)
        return [out]
    return None


def apply_rebroadcast_opt(rval: Variable) -> Variable:
    """`rval` after local_useless_rebroadcast and local_rebroadcast_lift, applied to its
    node until neither changes it (outside any graph)."""
    changed = True
    while changed and rval.owner is not None:
        changed = False
        for rw in (local_useless_rebroadcast, local_rebroadcast_lift):
            if rval.owner is None or not isinstance(rval.owner.op, Rebroadcast):
                break
            new = rw.transform(None, rval.owner)
            if new:
                rval, changed = new[0], True
    return rval


# ----------------------------------------------------------------------------- assertions

@register_specialize
@node_rewriter([Assert])
def local_remove_useless_assert(fgraph: Any, node: Apply) -> list | None:
    """Drop an Assert's conditions that are constant and true (and the Assert, if none is left)."""
    cond = []
    for c in node.inputs[1:]:
        try:
            if get_scalar_constant_value(c) == 0:
                cond.append(c)
        except NotScalarConstantError:
            cond.append(c)
    if not cond:
        return [node.inputs[0]]
    if len(cond) != len(node.inputs) - 1:
        return [node.op(node.inputs[0], *cond)]
    return None


# ----------------------------------------------------------------------------- shapes

class _ShapeOf(dict):
    """ShapeFeature.shape_of: a variable's symbolic shape, computed on first access."""

    def __init__(self, feature: "ShapeFeature"):
        super().__init__()
        self.feature = feature

    def __missing__(self, var: Variable) -> tuple:
        shape = self.feature.shape_tuple(var)
        self[var] = shape
        return shape


class ShapeFeature(Feature):
    """The symbolic shape of every variable of a graph, as Theano's ShapeFeature exposes it:
    `fgraph.shape_feature.shape_of[var]` is a tuple of int64 scalars. Shapes come from the
    ops' `infer_shape`, followed back through computed variables (a dim that reads a
    computed variable's shape is that variable's inferred dim); a variable without a rule
    has shape reads of itself. Computed on first use; `set_shape` overrides one."""

    def on_attach(self, fgraph: FunctionGraph) -> None:
        if getattr(fgraph, "shape_feature", None) is not None:
            raise ValueError("the graph already has a ShapeFeature")
        self.fgraph = fgraph
        self.shape_of = _ShapeOf(self)
        fgraph.shape_feature = self

    def on_detach(self, fgraph: FunctionGraph) -> None:
        self.shape_of.clear()
        if getattr(fgraph, "shape_feature", None) is self:
            del fgraph.shape_feature

    def on_change_input(self, fgraph: FunctionGraph, node: Any, i: int, r: Variable,
                        new_r: Variable, reason: str | None = None) -> None:
        self.shape_of.clear()   # shapes may build on the replaced variable

    def shape_tuple(self, var: Variable) -> tuple:
        """`var`'s shape: inferred where its op has a rule, else read from it."""
        shape = inferred_shape(self.fgraph, var) if var.owner is not None else None
        if shape is None:
            return shape_tuple(var)
        out = []
        for d in shape:
            node = d.owner
            if node is not None and isinstance(node.op, Shape_i) and \
                    node.inputs[0].owner is not None and node.inputs[0] is not var:
                d = self.shape_of[node.inputs[0]][node.op.i]
            out.append(d)
        return tuple(out)

    def get_shape(self, var: Variable, idx: int) -> Variable:
        """The length of dimension `idx` of `var`."""
        return self.shape_of[var][idx]

    def set_shape(self, var: Variable, shape: Sequence[Any]) -> None:
        """Record `var`'s shape (ints or int64 scalars)."""
        if len(shape) != var.ndim:
            raise ValueError(f"set_shape: {var} has {var.ndim} dims, got the shape {shape!r}")
        self.shape_of[var] = tuple(as_dim(s) for s in shape)

    def same_shape(self, x: Variable, y: Variable, dim_x: int | None = None,
                   dim_y: int | None = None) -> bool:
        """Whether x and y (or their dims dim_x and dim_y) provably have the same length(s)."""
        sx, sy = self.shape_of[x], self.shape_of[y]
        if dim_x is not None:
            sx = (sx[dim_x],)
        if dim_y is not None:
            sy = (sy[dim_y],)
        return len(sx) == len(sy) and all(same_dim(a, b) for a, b in zip(sx, sy))


class ShapeOptimizer(GraphRewriter):
    """Attaches a ShapeFeature to the graph (Theano's pass that made shapes available to
    the rewrites after it)."""

    def __init__(self) -> None:
        super().__init__(None, "ShapeOpt")

    def apply(self, fgraph: FunctionGraph) -> None:
        if getattr(fgraph, "shape_feature", None) is None:
            fgraph.attach_feature(ShapeFeature())


class UnShapeOptimizer(GraphRewriter):
    """Removes the graph's ShapeFeature (so later passes do not keep it up to date)."""

    def __init__(self) -> None:
        super().__init__(None, "UnShapeOpt")

    def apply(self, fgraph: FunctionGraph) -> None:
        feature = getattr(fgraph, "shape_feature", None)
        if feature is not None:
            fgraph.remove_feature(feature)


# ----------------------------------------------------------------------------- in place

class InplaceElemwiseOptimizer(GraphRewriter):
    """Makes every elementwise node of class `OP` in-place where the destroy handler allows
    (each output writes into an input of its type read by nothing else)."""

    def __init__(self, OP: type = Elemwise):
        super().__init__(None, "inplace_elemwise_optimizer")
        self.op = OP

    def apply(self, fgraph: FunctionGraph) -> int:
        attach_destroy_handler(fgraph)
        n = 0
        for node in fgraph.toposort():
            if node not in fgraph.apply_nodes or type(node.op) is not self.op:
                continue
            new_op = inplace_elemwise_op(fgraph, node)
            if new_op is None:
                continue
            try:
                new = new_op.make_node(*node.inputs).outputs
                replace_validate(fgraph, list(zip(node.outputs, new)), reason="inplace")
                n += 1
            except (InconsistencyError, TypeError):
                continue
        return n


inplace_elemwise_optimizer = InplaceElemwiseOptimizer(Elemwise)


# ----------------------------------------------------------------------------- fusion

def elemwise_max_input_fct(node: Apply) -> int:
    """The most inputs a fused node may take (the GPU kernel's parameter space)."""
    return MAX_FUSED_INPUTS


def local_elemwise_fusion_op(OP: type, max_input_fct: Callable[[Apply], int] = lambda n: 32,
                             maker: Callable | None = None) -> NodeRewriter:
    """A node rewrite fusing an `OP` node with the `OP` nodes computing its inputs that
    nothing else reads (and whose output has the node's broadcastable pattern) into one
    `maker(node, Composite)` node (default ``OP(Composite)``), with at most
    `max_input_fct(node)` inputs. FusionOptimizer repeats it to fuse whole chains."""
    make = maker or (lambda node, scalar_op: OP(scalar_op))

    def local_fuse(fgraph: FunctionGraph, node: Apply) -> list | None:
        if type(node.op) is not OP or not _default_fusable(node, OP) or len(node.outputs) != 1:
            return None
        bcast = node.outputs[0].type.broadcastable
        members = []
        for inp in dict.fromkeys(node.inputs):
            prod = inp.owner
            if prod is not None and len(prod.outputs) == 1 and _default_fusable(prod, OP) \
                    and inp.type.broadcastable == bcast \
                    and [c for c, _ in fgraph.clients.get(inp, ())] == [node] * \
                    node.inputs.count(inp):
                members.append(prod)
        if not members:
            return None
        pairs = fused_replacement(fgraph, members + [node], lambda comp: make(node, comp))
        if pairs is None or len(pairs) != 1 or pairs[0][0] is not node.outputs[0]:
            return None
        if len(pairs[0][1].owner.inputs) > max_input_fct(node):
            return None
        return [pairs[0][1]]

    return NodeRewriter(local_fuse, [OP], name=f"local_elemwise_fusion_{OP.__name__}")


#: the fusion node rewrite for Elemwise
local_elemwise_fusion = local_elemwise_fusion_op(Elemwise, elemwise_max_input_fct)


@node_rewriter([Elemwise])
def local_add_mul_fusion(fgraph: FunctionGraph, node: Apply) -> list | None:
    """add(add(a, b), c) -> add(a, b, c) (likewise mul) where the inner node is read only
    here: one n-ary node keeps a later Composite's inner graph small."""
    name = ew_name(node.outputs[0])
    if name not in ("add", "mul"):
        return None
    new_inp, fused = [], False
    for inp in node.inputs:
        if ew_name(inp) == name and len(fgraph.clients.get(inp, ())) == 1:
            new_inp.extend(inp.owner.inputs)
            fused = True
        else:
            new_inp.append(inp)
    if not fused:
        return None
    output = node.op(*new_inp)
    if output.type != node.outputs[0].type:
        return None
    return [output]


class FusionOptimizer(GraphRewriter):
    """Applies a fusion node rewrite (e.g. local_elemwise_fusion) to the graph, from the
    outputs back, until it changes nothing."""

    def __init__(self, local_optimizer: NodeRewriter):
        super().__init__(None, "FusionOptimizer")
        self.optimizer = local_optimizer

    def apply(self, fgraph: FunctionGraph) -> int:
        count, did_something = 0, True
        while did_something:
            did_something = False
            for node in reversed(fgraph.toposort()):
                if node in fgraph.apply_nodes and self.optimizer.tracks_op(node.op) and \
                        apply_node_rewriter(fgraph, node, self.optimizer):
                    did_something = True
                    count += 1
        return count
