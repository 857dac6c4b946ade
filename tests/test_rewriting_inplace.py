"""In-place rewrites under the destroy-handler policy, and DebugMode's checks."""
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function, shared
from symgpu.compile.debugmode import BadDestroyMap, BadOptimization, BadViewMap, DebugMode
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.graph.rewriting import node_rewriter, register_canonicalize
from symgpu.graph.rewriting.db import canonicalize
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.rewriting.utils import ELEMWISE, ew_name
from test_rewriting_helpers import raise_on_rewrite_errors  # noqa: F401

rng = np.random.RandomState(5)


def destroyers(f):
    return [n for n in f.maker.fgraph.toposort() if n.op.destroy_map]


def test_explicit_inputs_and_constants_are_never_overwritten():
    x = T.dvector("x")
    f = function([x], T.exp(x) * 2 + T.constant(np.ones(4)))
    assert not destroyers(f)
    xv = rng.randn(4)
    keep = xv.copy()
    f(xv)
    np.testing.assert_array_equal(xv, keep)


def test_shared_values_are_never_overwritten_even_when_updated():
    s = shared(rng.randn(4), name="s")
    before = s.get_value()
    f = function([], T.exp(s) + 1)
    f()
    np.testing.assert_array_equal(s.get_value(), before)
    w = shared(rng.randn(3), name="w")
    m = T.dmatrix("m")
    g = function([m], [], updates={w: w * 0.5 - T.dot(m, w)})
    assert all(w not in [n.inputs[i] for o, ins in n.op.destroy_map.items() for i in ins]
               for n in destroyers(g))
    for n in g.maker.fgraph.toposort():
        for ins in n.op.destroy_map.values():
            for i in ins:
                assert n.inputs[i] not in g.maker.fgraph.inputs


def test_a_call_that_raises_leaves_shared_variables_as_they_were():
    w = shared(np.arange(3.0), name="w")
    m, v = T.dmatrix("m"), T.dvector("v")
    new_w = w * 2 - T.dot(m, v)  # fails at run time for mismatched shapes
    f = function([m, v], [], updates={w: new_w})
    with pytest.raises(ValueError):
        f(np.ones((3, 2)), np.ones(5))
    np.testing.assert_array_equal(w.get_value(), [0.0, 1.0, 2.0])
    f(np.ones((3, 2)), np.ones(2))
    np.testing.assert_array_equal(w.get_value(), [-2.0, 0.0, 2.0])


def test_intermediates_are_overwritten():
    m, v, u = T.dmatrix("m"), T.dvector("v"), T.dvector("u")
    f = function([m, v, u], T.exp(T.dot(m, v)) + u)
    (node,) = destroyers(f)
    assert isinstance(node.op, Elemwise)
    victim = node.inputs[node.op.inplace_pattern[0][1]]
    assert victim.owner is not None and type(victim.owner.op).__name__ == "Gemv"
    mv, vv, uv = rng.randn(4, 3), rng.randn(3), rng.randn(4)
    np.testing.assert_allclose(f(mv, vv, uv), np.exp(mv @ vv) + uv)


def test_outputs_are_fresh_arrays_between_calls():
    m, v = T.dmatrix("m"), T.dvector("v")
    f = function([m, v], [T.dot(m, v), T.exp(T.dot(m, v))])
    a1, b1 = f(np.ones((2, 2)), np.ones(2))
    keep = a1.copy()
    f(np.ones((2, 2)) * 3, np.ones(2))
    np.testing.assert_array_equal(a1, keep)


# ----------------------------------------------------------------------------- DebugMode

class ScribbleOp(Op):
    """Doubles its input *in place* without declaring it: DebugMode must catch it."""
    __props__ = ()

    def make_node(self, x):
        x = T.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        inputs[0] *= 2
        out[0][0] = inputs[0].copy()


class AliasOp(Op):
    """Returns its input itself without a view_map."""
    __props__ = ()

    def make_node(self, x):
        x = T.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        out[0][0] = inputs[0]


def test_debugmode_passes_a_correct_graph_and_compares_outputs():
    x, y = T.dvector("x"), T.dvector("y")
    out = T.log(1 + T.exp(x)) * y - x / y
    f = function([x, y], out, mode="DebugMode")
    assert isinstance(f.maker.mode, DebugMode)
    xv, yv = rng.randn(5), rng.rand(5) + 1
    np.testing.assert_allclose(f(xv, yv), np.logaddexp(0, xv) * yv - xv / yv)


def test_debugmode_catches_undeclared_destruction():
    x = T.dvector("x")
    f = function([x], ScribbleOp()(T.exp(x)) + 1, mode="DebugMode")
    with pytest.raises(BadDestroyMap, match="ScribbleOp"):
        f(np.ones(3))


def test_debugmode_catches_undeclared_views():
    x = T.dvector("x")
    f = function([x], AliasOp()(T.exp(x)) * 2, mode="DebugMode")
    with pytest.raises(BadViewMap, match="AliasOp"):
        f(np.ones(3))


def test_debugmode_catches_a_wrong_rewrite_and_names_the_output():
    @node_rewriter([Elemwise])
    def wrong_exp_to_sin(fgraph, node):
        if ew_name(node.outputs[0]) == "exp":
            return [ELEMWISE["sin"](node.inputs[0])]
        return None

    register_canonicalize(wrong_exp_to_sin, "fast_run")
    try:
        x = T.dvector("x")
        named = T.exp(x) + 1
        named.name = "my_result"
        f = function([x], [x * 2, named], mode="DebugMode")
        with pytest.raises(BadOptimization, match=r"output #1 \(my_result\)"):
            f(np.array([0.5, 1.0]))
    finally:
        canonicalize.remove(wrong_exp_to_sin)
    f = function([x], [x * 2, named], mode="DebugMode")
    f(np.array([0.5, 1.0]))


def test_debugmode_accepts_stabilised_values():
    with symgpu.config.change_flags(floatX="float32"):
        z = T.vector("z")
        p = 1 / (1 + T.exp(-z))
        out = T.log(1 - p)  # the unrewritten float32 graph loses all precision for z > 9
        f = function([z], out, mode="DebugMode")
        v = f(np.array([-3.0, 0.0, 12.0, 16.0, 200.0], dtype="float32"))
        np.testing.assert_allclose(v, -np.logaddexp(0, [-3.0, 0.0, 12.0, 16.0, 200.0]), rtol=1e-5)


def test_debugmode_names_the_update_that_differs():
    @node_rewriter([Elemwise])
    def wrong_mul(fgraph, node):
        if ew_name(node.outputs[0]) == "mul" and len(node.inputs) == 2:
            return [ELEMWISE["add"](*node.inputs)]
        return None

    register_canonicalize(wrong_mul, "fast_run")
    try:
        w = shared(np.array([1.0, 2.0]), name="w")
        f = function([], [], updates={w: w * 3}, mode="DebugMode")
        with pytest.raises(BadOptimization, match="update of shared variable w"):
            f()
        np.testing.assert_array_equal(w.get_value(), [1.0, 2.0])
    finally:
        canonicalize.remove(wrong_mul)
