"""jacobian and hessian, the derivative matrices: one reverse-mode pass per element of an
expression (`JacobianOp`)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

import symgpu.tensor as T
from symgpu.compile.function import clone_replace, function
from symgpu.gradient.core import as_var_list, grad, grad_not_implemented, restore_form
from symgpu.graph.basic import Apply, Constant, Variable, io_toposort
from symgpu.graph.op import Op
from symgpu.tensor.rewriting.shape_feature import infer_graph_shapes
from symgpu.tensor.type import TensorType

__all__ = ["jacobian", "hessian", "JacobianOp"]


class JacobianOp(Op):
    """The Jacobian of `expression` wrt variables, one row per element of the expression.

    Why an op: a Jacobian needs one vector-Jacobian product per element of the expression,
    and its length is only known at run time (TensorType has no static shapes). The op holds
    the VJP graph g(e) = Lop(expression, wrt, e) with its seed `e` as an inner input; every
    e-independent value that graph needs (the forward pass and the parts of the backward pass
    that do not depend on e) is an ordinary input of the op, computed once by the outer graph.
    At run time the op compiles the e-dependent part once and runs it with e = each one-hot
    seed in turn (a Python loop, Scan's job without Scan). Rows are exact reverse-mode
    gradients, so J agrees with `grad` to rounding.
    """

    def __init__(self, inner_inputs: list[Variable], inner_outputs: list[Variable],
                 expr_ndim: int, mode: Any = None):
        self.inner_inputs = inner_inputs
        self.inner_outputs = inner_outputs
        self.expr_ndim = expr_ndim
        self.mode = mode
        self._fn = None

    def __str__(self) -> str:
        return f"Jacobian{{{len(self.inner_outputs)} wrt}}"

    def make_node(self, expression: Variable, *frontier: Variable) -> Apply:
        outs = [TensorType(g.dtype, expression.broadcastable + g.broadcastable)()
                for g in self.inner_outputs]
        return Apply(self, [expression, *frontier], outs)

    def infer_shape(self, fgraph, node, input_shapes):
        """expression's shape + the shape of each inner gradient, inferred through the inner
        graph with the seed shaped as the expression and the frontier as the op's inputs."""
        known = {inner: shp for inner, shp in zip(self.inner_inputs, input_shapes)}
        inner = infer_graph_shapes(self.inner_outputs, known)
        flat = [e for s in inner for e in s]
        if flat:  # a shape that reads an inner input's value reads the outer one's
            flat = clone_replace(flat, dict(zip(self.inner_inputs, node.inputs)))
        out, k = [], 0
        for s in inner:
            out.append(tuple(input_shapes[0]) + tuple(flat[k:k + len(s)]))
            k += len(s)
        return out

    def _compiled(self):
        if self._fn is None:
            self._fn = function(self.inner_inputs, self.inner_outputs, mode=self.mode,
                                on_unused_input="ignore", name="jacobian row")
        return self._fn

    def perform(self, node, inputs, out):
        fn = self._compiled()
        expr, frontier = inputs[0], inputs[1:]
        seed = np.zeros(expr.shape, dtype=self.inner_inputs[0].type.dtype)
        n = seed.size
        rows = None
        flat = seed.reshape(-1)
        for i in range(max(n, 1)):
            if n:
                flat[i] = 1
            res = fn(seed, *frontier)
            if n:
                flat[i] = 0
            if rows is None:
                rows = [np.empty((n,) + np.shape(r), dtype=o.dtype)
                        for r, o in zip(res, node.outputs)]
            if n:
                for buf, r in zip(rows, res):
                    buf[i] = r
        for k, buf in enumerate(rows):
            out[k][0] = buf.reshape(expr.shape + buf.shape[1:])

    def grad(self, inputs, output_grads):
        return [grad_not_implemented(self, i, x, "A Jacobian is not differentiable again "
                                     "(jacobian/hessian results are final values).")
                for i, x in enumerate(inputs)]


def jacobian(expression: Variable, wrt: Any, consider_constant: Sequence[Variable] | None = None,
             disconnected_inputs: str = "raise") -> Any:
    """d expression / d wrt for a tensor expression: shape `expression.shape + wrt.shape`
    (for a vector expression, row i is grad(expression[i], wrt), Theano's layout). `wrt` is a
    variable or a list (then a list of Jacobians). A scalar expression gives `grad`.

    Built by `JacobianOp`: one reverse-mode pass per element of the expression, looped at run
    time, so the length need not be known when the graph is built and the forward pass is
    computed once. The result itself cannot be differentiated again.
    """
    if not isinstance(expression, Variable):
        expression = T.as_tensor_variable(expression)
    wrt_list, kind = as_var_list(wrt, "wrt")
    if expression.ndim == 0:
        gs = grad(expression, wrt_list, consider_constant=consider_constant,
                  disconnected_inputs=disconnected_inputs)
        return restore_form(gs, kind)
    e = expression.type("jacobian_seed")
    gs = grad(None, wrt_list, consider_constant=consider_constant,
              disconnected_inputs=disconnected_inputs, known_grads={expression: e})
    # split the VJP graph into what depends on the seed (inner) and what does not (frontier)
    order = io_toposort(set(), gs)
    dep = _depends_on_any(order, [e])
    frontier: list[Variable] = []
    seen: set[Variable] = set()

    def add(v: Variable) -> None:
        if v not in dep and v not in seen and not isinstance(v, Constant):
            seen.add(v)
            frontier.append(v)

    for node in order:
        if any(o in dep for o in node.outputs):
            for v in node.inputs:
                add(v)
    for g in gs:
        add(g)
    inner_frontier = [v.type(v.name) for v in frontier]
    e_in = e.type("jacobian_seed")
    inner_outs = clone_replace(gs, {e: e_in, **dict(zip(frontier, inner_frontier))})
    op = JacobianOp([e_in] + inner_frontier, inner_outs, expression.ndim)
    outs = op(expression, *frontier)
    outs = outs if isinstance(outs, list) else [outs]
    return restore_form(outs, kind)


def _depends_on_any(order: list[Apply], sources: Sequence[Variable]) -> set[Variable]:
    """Variables computed from `sources` by any path (connection patterns ignored)."""
    dep = set(sources)
    for node in order:
        if any(v in dep for v in node.inputs):
            dep.update(node.outputs)
    return dep


def hessian(cost: Variable, wrt: Any, consider_constant: Sequence[Variable] | None = None,
            disconnected_inputs: str = "raise") -> Any:
    """The Hessian of a scalar cost: for each `wrt` w, jacobian(grad(cost, w), w), of shape
    `w.shape + w.shape`. The second differentiation treats a gradient that does not depend on
    w (a cost linear in w) as a zero Hessian rather than an error."""
    wrt_list, kind = as_var_list(wrt, "wrt")
    out = []
    for w in wrt_list:
        g = grad(cost, w, consider_constant=consider_constant,
                 disconnected_inputs=disconnected_inputs)
        out.append(jacobian(g, w, consider_constant=consider_constant,
                            disconnected_inputs="ignore"))
    return restore_form(out, kind)
