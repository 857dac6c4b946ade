"""Mixed precision (passes `mixed_bfloat16` and `mixed_float16`, position 15): the matrix
products, convolutions and fused attention of a float32 graph take half inputs; everything
else stays float32.

The user writes the float32 program (training step, gradients and updates included); with the
`mixed_precision` flag set (or a mode including one of the two tags) `function()` rewrites
each product whose float operands are float32 into

    cast(product(cast(a, half), cast(b, half)), float32)

so the product reads and writes half values (tensor cores on the GPU) while what consumes it
-- bias adds, activations, reductions, softmax and cross-entropies, the loss, the updates of
the float32 shared variables (the master weights) -- sees float32, as under PyTorch's
autocast. Float64 products are left alone (autocast does the same): float64 is a deliberate
choice of precision.

Casts cost nothing extra where fusion applies: the cast back after a product and the cast to
half before the next one join the elementwise kernel between them (bias, activation), so that
kernel reads half and writes half, computing in float32 inside (half values are always
computed in float32: `scalar.dtypes.value_dtype`). A cast whose operand is a transpose (the
backward products read `W.T`, `x.T`) is moved before the transpose, so the forward and
backward products of one weight share one cast of it (merged at position 48). Where views
(reshapes, head splits), joins or region writes stand between a cast and its kernel, the
cast-motion rules (`cast_motion.py`, in the same pass) move it through them.

It runs after canonicalize/stabilize/specialize, so the stable forms (log-softmax,
cross-entropies) are already in place and stay float32, and before `blas` (20): a float32
update `w - lr * cast(gw_half)` is no longer foldable into a half Gemm, which keeps the master
weights' arithmetic in float32; hand-built Gemm/Gemv/Ger/Dot22 nodes are rewritten as the
product in half plus their scaling and accumulation in float32.
"""
from __future__ import annotations

from typing import Any, Callable

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.rewriting import RewriteGroup, node_rewriter, optdb
from symgpu.graph.rewriting.db import POSITIONS
from symgpu.tensor.blas import Dot22, Gemm, Gemv, Ger
from symgpu.tensor.elemwise import DimShuffle
from symgpu.tensor.math import Dot, MatMul, dot
from symgpu.tensor.nnet.attention import Attention, AttentionGrad
from symgpu.tensor.rewriting.cast_motion import CAST_MOTION
from symgpu.tensor.nnet.abstract_conv import (Conv2d, Conv2dGradInputs, Conv2dGradWeights,
                                              Conv3d, Conv3dGradInputs, Conv3dGradWeights)
from symgpu.tensor.rewriting.utils import ew_cast
from symgpu.tensor.type import TensorVariable

__all__ = ["POLICIES", "POSITION", "PRODUCTS", "BLAS_PRODUCTS", "policy_tag",
           "check_one_policy", "half_operand", "product_in_half", "PASSES"]

#: the `mixed_precision` flag's values -> the tag (and pass name) of their pass; the names
#: are Keras' policy names (`mixed_bfloat16`, `mixed_float16`)
POLICIES = {"bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
#: between specialize (3) and blas (20): see the module docstring
POSITION = POSITIONS["mixed_precision"]

def _attention_grad_operands(op: AttentionGrad) -> tuple[int, ...]:
    """q, k, v, o and dO of an AttentionGrad (the mask, the dropout's generator state, lse
    and dlse stay as they are)."""
    n = 3 + op.has_mask + (op.dropout is not None)
    return (0, 1, 2, n, n + 2)


#: product op class -> the positions of its operands (the inputs cast to half), or a function
#: of the op giving them; the other inputs (a convolution's shape, attention's mask and
#: row log-sum-exp) are left alone. Fused attention is a product too: the attention rewrite
#: (position 0.5) has already replaced the matmuls it was written with.
PRODUCTS: dict[type, tuple[int, ...] | Callable[[Any], tuple[int, ...]]] = {
    Dot: (0, 1), MatMul: (0, 1),
    Conv2d: (0, 1), Conv2dGradInputs: (0, 1), Conv2dGradWeights: (0, 1),
    Conv3d: (0, 1), Conv3dGradInputs: (0, 1), Conv3dGradWeights: (0, 1),
    Attention: (0, 1, 2), AttentionGrad: _attention_grad_operands,
}


def _half_dot(a: TensorVariable, b: TensorVariable, half: str) -> TensorVariable:
    """dot(a, b) of the half forms of float32 `a` and `b`, cast back to float32."""
    return ew_cast(dot(half_operand(a, half), half_operand(b, half)), "float32")


def _gemm_in_half(inputs: list, half: str) -> TensorVariable:
    C, alpha, A, B, beta = inputs           # Gemv's (y, alpha, A, x, beta) too
    return beta * C + alpha * _half_dot(A, B, half)


def _dot22_in_half(inputs: list, half: str) -> TensorVariable:
    return _half_dot(inputs[0], inputs[1], half)    # Dot22 is float32/float64 only: a Dot


def _ger_in_half(inputs: list, half: str) -> TensorVariable:
    A, alpha, x, y = inputs
    return A + alpha * _half_dot(x.dimshuffle(0, "x"), y.dimshuffle("x", 0), half)


#: BLAS op class -> (the positions of the product's operands, its value with the product in
#: half and the accumulator and scalings in float32)
BLAS_PRODUCTS: dict[type, tuple[tuple[int, ...], Callable[[list, str], TensorVariable]]] = {
    Gemm: ((2, 3), _gemm_in_half), Gemv: ((2, 3), _gemm_in_half), Ger: ((2, 3), _ger_in_half),
    Dot22: ((0, 1), _dot22_in_half),
}


def policy_tag(dtype: str) -> str:
    """The pass tag of the `mixed_precision` flag's value `dtype` ('' for 'off')."""
    return POLICIES.get(dtype, "")


def check_one_policy(include: tuple[str, ...]) -> None:
    """Refuse a mode that would run both policies: which half dtype it means is ambiguous."""
    both = [t for t in POLICIES.values() if t in include]
    if len(both) > 1:
        raise ValueError(f"mixed precision: the mode includes both {' and '.join(both)}; "
                         "choose one (the mixed_precision flag adds the tag of its value)")


def half_operand(var: TensorVariable, half: str) -> TensorVariable:
    """`var` as `half`: transposes and broadcast patterns (DimShuffle) are applied after the
    cast, so `W` and `W.T` read one cast of `W`."""
    node = var.owner
    if node is not None and type(node.op) is DimShuffle and node.inputs[0].dtype == "float32":
        return node.op(half_operand(node.inputs[0], half))
    return ew_cast(var, half)


def _operands_qualify(node: Apply, positions: tuple[int, ...], half: str) -> bool:
    """Every operand float32 or already `half`, at least one float32, and the output float
    (integer or float64 products are not this policy's)."""
    dtypes = [node.inputs[i].dtype for i in positions]
    return ("float32" in dtypes and all(d in ("float32", half) for d in dtypes)
            and node.outputs[0].dtype == "float32")


def product_in_half(node: Apply, half: str) -> list[Variable] | None:
    """The replacement of a product node under the `half` policy: its float32 operands cast to
    `half`, the product computed there, its result cast back to the node's dtype; None where
    the node is not a float32 product."""
    op_type = type(node.op)
    if op_type in PRODUCTS:
        positions = PRODUCTS[op_type]
        if callable(positions):
            positions = positions(node.op)
        if not _operands_qualify(node, positions, half):
            return None
        inputs = [half_operand(v, half) if i in positions else v
                  for i, v in enumerate(node.inputs)]
        news = node.op.make_node(*inputs).outputs
    elif op_type in BLAS_PRODUCTS:
        positions, build = BLAS_PRODUCTS[op_type]
        if not _operands_qualify(node, positions, half):
            return None
        news = [build(list(node.inputs), half)]
    else:
        return None
    replacements = []
    for new, out in zip(news, node.outputs):
        new = ew_cast(new, out.dtype) if new.dtype != out.dtype else new
        if new.type != out.type:
            new = out.type.convert_variable(new)
        if new is None:
            return None
        replacements.append(new)
    return replacements


def _make_rewrite(half: str) -> RewriteGroup:
    """The pass of one policy: one node rewrite over the product ops, in a group tagged with
    the policy's name (selected only by that tag, never by fast_run)."""
    tag = POLICIES[half]

    def rewrite(fgraph, node):
        return product_in_half(node, half)
    rewrite.__name__ = f"local_products_in_{half}"
    rewrite.__doc__ = (f"A float32 product (dot, matmul, convolution and its gradients, fused "
                       f"attention and its gradient, "
                       f"hand-built BLAS ops) reads {half} operands; its result is cast back "
                       "to float32.")
    group = RewriteGroup(tag)
    group.register(node_rewriter(list(PRODUCTS) + list(BLAS_PRODUCTS))(rewrite),
                   tag, "mixed_precision")
    for motion in CAST_MOTION:        # the casts it inserts move to where they fuse or cancel
        group.register(motion, tag, "mixed_precision", "cast_motion")
    optdb.register(tag, group, POSITION, "mixed_precision")
    return group


#: the two passes, by half dtype (selected by tag: the flag's or a mode's `including`)
PASSES = {half: _make_rewrite(half) for half in POLICIES}
