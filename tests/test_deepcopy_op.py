"""Theano's DeepCopyOp (theano.compile.ops): a real op whose output never aliases its input."""

import numpy as np

import symgpu
import symgpu.tensor as T
from symgpu.compile import DeepCopyOp, deep_copy_op
from symgpu.gradient_check import verify_grad


def test_paths_are_theanos():
    import symgpu.compile.ops as ops
    assert ops.DeepCopyOp is DeepCopyOp and ops.deep_copy_op is deep_copy_op
    assert isinstance(deep_copy_op, DeepCopyOp) and DeepCopyOp() == deep_copy_op
    assert hash(DeepCopyOp()) == hash(deep_copy_op)


def test_output_is_a_copy_of_the_input():
    x = T.dvector("x")
    f = symgpu.function([x], [deep_copy_op(x), deep_copy_op(x * 2)])
    a = np.arange(4.0)
    r = f(a)
    np.testing.assert_array_equal(r[0], a)
    np.testing.assert_array_equal(r[1], a * 2)
    assert not np.shares_memory(r[0], a)
    assert [type(n.op) for n in f.maker.fgraph.toposort()].count(DeepCopyOp) == 2


def test_zero_d_and_non_array_values():
    node = deep_copy_op(T.dscalar()).owner
    out = [[None]]
    v = np.array(3.0)
    node.op.perform(node, [v], out)
    assert isinstance(out[0][0], np.ndarray) and out[0][0].ndim == 0 and out[0][0] is not v
    node.op.perform(node, [[1, [2]]], out)   # no .copy(): deepcopy
    assert out[0][0] == [1, [2]]


def test_shape_and_gradient():
    x = T.dmatrix("x")
    y = deep_copy_op(x)
    assert y.type == x.type
    f = symgpu.function([x], y.shape)
    assert not any(isinstance(n.op, DeepCopyOp) for n in f.maker.fgraph.toposort())
    np.testing.assert_array_equal(f(np.zeros((2, 5))), [2, 5])
    verify_grad(lambda v: deep_copy_op(v) * v, [np.random.RandomState(0).rand(3, 2)])


def test_compiled_graphs_have_no_copy_node_but_debugprint_shows_it():
    # Theano's tests filter DeepCopyOp nodes out of the toposort: symgpu's Function copies
    # an output that is an input itself, so the graph is empty and the value still a copy
    x = T.dvector("x")
    f = symgpu.function([x], x)
    assert not any(isinstance(n.op, DeepCopyOp) for n in f.maker.fgraph.toposort())
    a = np.arange(3.0)
    assert not np.shares_memory(f(a), a)
    assert symgpu.printing.debugprint(f, file="str").startswith("DeepCopyOp")
