"""Theano's small ops of ``theano.compile.ops`` that symgpu has no other name for: an op made
from a Python function (`as_op`, `FromFunctionOp`), the identity view (`ViewOp`), and
`Rebroadcast`, which sets dimensions' broadcastable flags.

Why here: code written for Theano builds these by name (`@as_op(itypes=[T.dmatrix],
otypes=[T.dmatrix])` is the documented way to wrap NumPy code in a graph); the path table
(the path layer of the package's top) serves them at `theano.compile.ops`.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.tensor.type import as_tensor_variable

__all__ = ["FromFunctionOp", "as_op", "ViewOp", "view_op", "OutputGuard", "Rebroadcast"]


class FromFunctionOp(Op):
    """An op whose `perform` calls a Python function on the input values: `fn(*inputs)`
    returns the output (one output) or a sequence of outputs. Its inputs and outputs have
    the types `itypes` and `otypes`; `infer_shape(fgraph, node, input_shapes)`, when given,
    tells the output shapes without running `fn`. It has no gradient (Theano's neither)."""

    __props__ = ("fn", "itypes", "otypes", "infer_shape_fn")

    def __init__(self, fn: Callable, itypes: Sequence[Any], otypes: Sequence[Any],
                 infer_shape: Callable | None = None):
        self.fn = fn
        self.itypes = tuple(itypes)
        self.otypes = tuple(otypes)
        self.infer_shape_fn = infer_shape
        if infer_shape is not None:
            self.infer_shape = self._infer_shape

    def __str__(self) -> str:
        return f"FromFunctionOp{{{getattr(self.fn, '__name__', self.fn)}}}"

    def make_node(self, *inputs: Any) -> Apply:
        if len(inputs) != len(self.itypes):
            raise TypeError(f"{self} takes {len(self.itypes)} inputs, got {len(inputs)}")
        ins = []
        for k, (x, t) in enumerate(zip(inputs, self.itypes)):
            x = x if isinstance(x, Variable) else as_tensor_variable(x)
            if x.type != t:
                converted = t.convert_variable(x) if hasattr(t, "convert_variable") else None
                if converted is None:
                    raise TypeError(f"{self}: input {k} is {x.type}, expected {t}")
                x = converted
            ins.append(x)
        return Apply(self, ins, [t() for t in self.otypes])

    def perform(self, node, inputs, out):
        res = self.fn(*inputs)
        if len(self.otypes) == 1:
            res = [res]
        if len(res) != len(self.otypes):
            raise ValueError(f"{self}: the function returned {len(res)} outputs, the op "
                             f"declares {len(self.otypes)}")
        for cell, value, t in zip(out, res, self.otypes):
            cell[0] = t.filter(value) if hasattr(t, "filter") else value

    def _infer_shape(self, fgraph, node, input_shapes):
        return self.infer_shape_fn(fgraph, node, input_shapes)

    def __reduce__(self):
        return (FromFunctionOp, (self.fn, self.itypes, self.otypes, self.infer_shape_fn))


def as_op(itypes: Sequence[Any], otypes: Sequence[Any],
          infer_shape: Callable | None = None) -> Callable[[Callable], FromFunctionOp]:
    """Decorator: the Python function becomes a `FromFunctionOp` with these input and output
    types (`@as_op(itypes=[T.dmatrix], otypes=[T.dvector])`)."""
    itypes, otypes = list(itypes), list(otypes)
    if infer_shape is not None and not callable(infer_shape):
        raise TypeError("as_op: infer_shape must be callable (fgraph, node, input_shapes)")

    def make(fn: Callable) -> FromFunctionOp:
        return FromFunctionOp(fn, itypes, otypes, infer_shape)
    return make


class ViewOp(Op):
    """The identity, as a view of its input (Theano uses it to keep a variable distinct in
    a graph; its gradient passes through)."""

    __props__ = ()
    view_map = {0: [0]}

    def make_node(self, x: Any) -> Apply:
        x = x if isinstance(x, Variable) else as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        out[0][0] = inputs[0]

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        return [output_grads[0]]

    def R_op(self, inputs, eval_points):
        return [eval_points[0]]


#: Theano's instance (``theano.compile.view_op``)
view_op = ViewOp()


class OutputGuard(ViewOp):
    """A ViewOp declared as destroying its input (Theano put it on outputs so that no
    in-place op could overwrite them): the destroy handler then lets nothing else write
    into that input, and refuses it on a graph input, as any destroyer."""

    destroy_map = {0: [0]}


#: Theano's instance (``theano.compile.ops._output_guard``)
_output_guard = OutputGuard()


# Rebroadcast lives with the tensor language (T.Rebroadcast, as Theano's tensor namespace
# has it); theano.compile.ops serves it from here too
from symgpu.tensor.theano_basic import Rebroadcast  # noqa: E402
