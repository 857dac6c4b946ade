"""Cast motion for mixed precision: move the casts the policy inserts (to half before a
product, back to float32 after it) through the views and joins between them and the
elementwise kernels, so that each cast fuses into a kernel or cancels against its inverse
instead of running as a kernel of its own.

A transformer block written as users write it has reshapes, head splits (column slices and
transposes) and the joins of the backward pass between its products and their bias adds,
activations and layer norms.  Without motion, every product's ``cast(…, float32)`` and
every operand's ``cast(…, half)`` sits behind such a view and runs as a separate kernel
(on the H200's GPT block, 32 cast kernels and float32 copies of the reshapes, about 1 ms of
a 4 ms step).  The rules, each exact:

- a cast to half moves *up* through a view onto the elementwise kernel that computes the
  viewed value (it fuses there; the kernel writes half); through a slice only where every
  use of the sliced value is cast to half, so no more is cast than before;
- a cast to float32 of a half product moves *down* through views, joins and region writes
  into zeros, to the elementwise kernel that uses it (where it fuses) or to a cast back to
  half (where it cancels); the view or join then moves half the bytes;
- ``cast(cast(y, float32), half)`` of a half ``y`` is ``y``: float32 holds every half value;
- a fill of a slice, ``second(view(e), v)``, reads only e's shape: it is shaped like the
  input e is computed from (``shape_twin``), so that a float32 ``e`` a fused kernel
  would write only for the fill's sake (the GPT's ``qkv + b`` beside its half cast, sliced
  by its gradient's zero tail) is no longer written.
"""
from __future__ import annotations

from typing import Any

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.rewriting import node_rewriter
from symgpu.scalar.basic import Cast
from symgpu.scalar.dtypes import HALF_DTYPES
from symgpu.tensor.basic import Alloc, Join, Reshape
from symgpu.tensor.elemwise import DimShuffle, Elemwise
from symgpu.tensor.rewriting.shape_ops import shape_twin
from symgpu.tensor.rewriting.utils import ew_cast, scalar_constant
from symgpu.tensor.subtensor import IncSubtensor, Subtensor

__all__ = ["VIEWS", "CAST_MOTION", "local_half_cast_up", "local_float_cast_down",
           "local_float_cast_down_join", "local_float_cast_down_inc_zeros",
           "local_cast_round_trip", "local_fill_of_slice_shape_twin"]

#: ops whose first input is the value they present differently (the other inputs, shapes
#: and indices, stay): casts commute with them
VIEWS = (Reshape, DimShuffle, Subtensor)


def _cast_to(node: Apply | None) -> str | None:
    """The dtype an elementwise cast node casts to, or None for any other node."""
    if node is not None and isinstance(node.op, Elemwise) and \
            isinstance(node.op.scalar_op, Cast) and len(node.inputs) == 1:
        return node.outputs[0].dtype
    return None


def _is_view(node: Apply | None) -> bool:
    return node is not None and type(node.op) in VIEWS


def _producer(var: Variable) -> Apply | None:
    """The node that computes the values `var` shows, past any views."""
    node = var.owner
    while _is_view(node):
        node = node.inputs[0].owner
    return node


def _with_input(node: Apply, x: Variable) -> Variable:
    """`node`'s op applied to `x` in place of its first input."""
    return node.op.make_node(x, *node.inputs[1:]).outputs[0]


def _only_used_as(fgraph: Any, var: Variable, half: str) -> bool:
    """Every use of `var`'s values is a cast to `half`, directly or through a view used only
    that way (a `second(var, ...)` fill reads only the shape)."""
    for client, i in fgraph.clients[var]:
        if client == "output":
            return False
        if _cast_to(client) == half:
            continue
        if isinstance(client.op, Elemwise) and \
                getattr(client.op.scalar_op, "name", None) == "second" and i == 0:
            continue
        if _is_view(client) and i == 0 and _only_used_as(fgraph, client.outputs[0], half):
            continue
        return False
    return True


@node_rewriter([Elemwise])
def local_half_cast_up(fgraph, node):
    """cast(view(x), half) -> view(cast(x, half)) where an elementwise kernel computes x's
    values (the cast fuses into it)."""
    half = _cast_to(node)
    if half not in HALF_DTYPES:
        return False
    view = node.inputs[0].owner
    if not _is_view(view) or view.inputs[0].dtype != "float32":
        return False
    source = _producer(view.inputs[0])
    if source is None or not isinstance(source.op, Elemwise):
        return False
    if type(view.op) is Subtensor and not _only_used_as(fgraph, view.inputs[0], half):
        return False        # casting all of x for a part of it would cast more
    out = _with_input(view, ew_cast(view.inputs[0], half))
    return [out] if out.type == node.outputs[0].type else False


def _zeros(var: Variable) -> bool:
    """`var` is zeros: a zero constant, fill (`second`) or allocation."""
    node = var.owner
    if node is not None and type(node.op) is Alloc:
        var = node.inputs[0]
    return scalar_constant(var) == 0


def _float_cast_of_half(fgraph, var: Variable, views_may_share: bool = False
                        ) -> Variable | None:
    """y where `var` is cast(y, float32) of a half y, not computed by an elementwise kernel
    (there the cast is fused already), and used only once -- or, with `views_may_share`,
    only by views (each view then gets a cast of its own, fused where it is read)."""
    if _cast_to(var.owner) != "float32":
        return None
    clients = fgraph.clients[var]
    if len(clients) != 1 and not (views_may_share and
                                  all(c != "output" and _is_view(c) for c, _ in clients)):
        return None
    y = var.owner.inputs[0]
    if y.dtype not in HALF_DTYPES:
        return None
    source = _producer(y)
    if source is not None and isinstance(source.op, Elemwise):
        return None
    return y


@node_rewriter(list(VIEWS))
def local_float_cast_down(fgraph, node):
    """view(cast(y, float32)) -> cast(view(y), float32) for a half product y."""
    y = _float_cast_of_half(fgraph, node.inputs[0], views_may_share=True)
    if y is None:
        return False
    out = ew_cast(_with_input(node, y), "float32")
    return [out] if out.type == node.outputs[0].type else False


@node_rewriter([Join])
def local_float_cast_down_join(fgraph, node):
    """join(cast(y0, float32), cast(y1, float32), ...) -> cast(join(y0, y1, ...), float32)
    for half products of one dtype; zero pieces (a gradient's untouched columns) join as
    half zeros."""
    ys = [None if _zeros(v) else _float_cast_of_half(fgraph, v) for v in node.inputs]
    found = {y.dtype for y in ys if y is not None}
    if len(found) != 1 or any(y is None and not _zeros(v) for y, v in zip(ys, node.inputs)):
        return False
    half = found.pop()
    out = ew_cast(node.op(*[ew_cast(v, half) if y is None else y
                            for y, v in zip(ys, node.inputs)]), "float32")
    return [out] if out.type == node.outputs[0].type else False


@node_rewriter([IncSubtensor])
def local_float_cast_down_inc_zeros(fgraph, node):
    """inc_subtensor(zeros, cast(y, float32)[, idx]) -> cast(inc_subtensor(cast(zeros, half),
    y), float32): writing a half region into zeros is exact in half."""
    if len(node.inputs) < 2 or not _zeros(node.inputs[0]):
        return False
    y = _float_cast_of_half(fgraph, node.inputs[1])
    if y is None or node.inputs[0].dtype != "float32":
        return False
    zeros = ew_cast(node.inputs[0], y.dtype)
    out = ew_cast(node.op.make_node(zeros, y, *node.inputs[2:]).outputs[0], "float32")
    return [out] if out.type == node.outputs[0].type else False


@node_rewriter([Elemwise])
def local_cast_round_trip(fgraph, node):
    """cast(cast(y, float32), half) -> y for a half y (float32 holds every half value)."""
    half = _cast_to(node)
    inner = node.inputs[0].owner
    if half not in HALF_DTYPES or _cast_to(inner) != "float32":
        return False
    y = inner.inputs[0]
    return [y] if y.type == node.outputs[0].type else False


@node_rewriter([Elemwise])
def local_fill_of_slice_shape_twin(fgraph, node):
    """second(x[idx], v) -> second(t[idx], v) where t is x's shape twin (an input x is
    computed from elementwise with x's shape): the fill no longer keeps x's values alive."""
    if getattr(node.op.scalar_op, "name", None) != "second" or len(node.inputs) != 2:
        return False
    view = node.inputs[0].owner
    if view is None or type(view.op) is not Subtensor:
        return False
    twin = shape_twin(view.inputs[0])
    if twin is view.inputs[0]:
        return False
    out = node.op(_with_input(view, twin), node.inputs[1])
    return [out] if out.type == node.outputs[0].type else False


#: the rules, in the order the mixed-precision pass registers them
CAST_MOTION = (local_half_cast_up, local_float_cast_down, local_float_cast_down_join,
               local_float_cast_down_inc_zeros, local_cast_round_trip,
               local_fill_of_slice_shape_twin)
