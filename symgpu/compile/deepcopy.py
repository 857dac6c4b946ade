"""Theano's ``theano.compile.ops.DeepCopyOp``: an op whose output is a copy of its input.

Theano's compiler inserts a DeepCopyOp node above each output of a function that is an input
or a constant, so that the caller never receives (and then mutates) the input's own storage.
symgpu's `Function` makes that copy itself when it returns such an output (the output_copy
list of its layout), and its compiled graphs do not contain the node; `debugprint` of a
function shows the copy as Theano's DeepCopyOp line (symgpu/printing.py). So code written for
Theano that filters DeepCopyOp nodes out of ``f.maker.fgraph.toposort()`` sees the same nodes
it would see in Theano, less the copies. The op itself is a real op for graphs that want an
explicit copy: its output never shares memory with its input, for any type of value.
"""
from __future__ import annotations

import copy
from typing import Any

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.tensor.type import as_tensor_variable

__all__ = ["DeepCopyOp", "deep_copy_op"]


class DeepCopyOp(Op):
    """out = a copy of x (``x.copy()`` where the value has one, else ``copy.deepcopy``), of
    x's type; the gradient passes through unchanged."""

    __props__ = ()

    def make_node(self, x: Any) -> Apply:
        if not isinstance(x, Variable):
            x = as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        (x,) = inputs
        # .copy() first: a 0-d ndarray stays an ndarray (deepcopy too, but slower), and
        # device arrays copy on their device
        out[0][0] = x.copy() if hasattr(x, "copy") else copy.deepcopy(x)

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        return [output_grads[0]]

    def R_op(self, inputs, eval_points):
        return [eval_points[0]]


#: Theano's instance (``theano.compile.deep_copy_op``)
deep_copy_op = DeepCopyOp()
