"""Canonicalize: each rewrite changes the graph as expected and leaves the values unchanged."""
import numpy as np
import pytest

import symgpu.tensor as T
from symgpu.graph.basic import Constant
from test_rewriting_helpers import op_names, raise_on_rewrite_errors, rewritten, same_values  # noqa: F401

rng = np.random.RandomState(42)
V = rng.rand(5) + 0.5
W = rng.rand(5) + 0.5
M = rng.rand(3, 4) + 0.5


@pytest.fixture
def xy():
    return T.dvector("x"), T.dvector("y")


def test_constant_folding(xy):
    x, _ = xy
    out = x + T.exp(T.constant(np.arange(3.0))).sum()
    f = rewritten([x], out)
    assert op_names(f) == ["add"]
    same_values([x], out, V)


def test_mul_by_one_and_add_zero(xy):
    x, _ = xy
    for out in (x * 1, 1 * x, x + 0, 0 + x, x / 1, x - 0, (x * 1 + 0) / 1):
        f = rewritten([x], out)
        assert f.maker.fgraph.outputs[0].owner is None or op_names(f) == [], op_names(f)
        np.testing.assert_allclose(f(V), V)


def test_x_minus_x_and_x_over_x(xy):
    x, y = xy
    f = rewritten([x, y], (x - x) + y)
    assert "sub" not in op_names(f)
    np.testing.assert_allclose(f(V, W), W)
    f = rewritten([x, y], y * x / x)
    assert "true_div" not in op_names(f) and "mul" not in op_names(f)
    np.testing.assert_allclose(f(V, W), W)


def test_double_negation(xy):
    x, _ = xy
    f = rewritten([x], -(-x))
    assert op_names(f) == []
    f = rewritten([x], T.exp(-(-(-x))))
    assert op_names(f).count("neg") == 1
    same_values([x], T.exp(-(-(-x))), V)


def test_flatten_and_collect_constants(xy):
    x, y = xy
    out = ((x * 2) * y) * 3
    f = rewritten([x, y], out)
    assert op_names(f) == ["mul"]
    (node,) = f.maker.fgraph.toposort()
    assert len(node.inputs) == 3
    consts = [i for i in node.inputs if isinstance(i, Constant)]
    assert len(consts) == 1 and float(consts[0].data.ravel()[0]) == 6.0
    same_values([x, y], out, V, W)
    out = (x + 1) + (y + 2) - 3
    f = rewritten([x, y], out)
    assert op_names(f) == ["add"] and len(f.maker.fgraph.toposort()[0].inputs) == 2
    same_values([x, y], out, V, W)


def test_cancellation_through_a_tree(xy):
    x, y = xy
    s = 1 - x
    out = (y / s) * x * s
    f = rewritten([x, y], out)
    assert "sub" not in op_names(f) and "true_div" not in op_names(f)
    same_values([x, y], out, V, W)


def test_constant_sign_goes_into_the_constant(xy):
    x, y = xy
    out = -(x * 2) * y
    f = rewritten([x, y], out)
    assert op_names(f) == ["mul"]
    same_values([x, y], out, V, W)


def test_useless_cast_and_cast_of_cast(xy):
    x = T.fvector("x")
    out = T.cast(T.cast(x, "float64"), "float32")
    f = rewritten([x], out)
    assert op_names(f) == []
    i = T.ivector("i")
    out = T.cast(T.cast(i, "int64"), "float64")
    f = rewritten([i], out)
    assert op_names(f) == ["Cast{float64}"]
    np.testing.assert_array_equal(f(np.arange(3, dtype="int32")), [0.0, 1.0, 2.0])


def test_dimshuffle_merge_and_useless(xy):
    m = T.dmatrix("m")
    out = m.T.T
    f = rewritten([m], out)
    assert op_names(f) == []
    out = m.dimshuffle(1, 0).dimshuffle("x", 1, 0)
    f = rewritten([m], out)
    assert op_names(f) == ["DimShuffle"]
    assert f.maker.fgraph.toposort()[0].op.new_order == ("x", 0, 1)
    same_values([m], out, M)


def test_dimshuffle_of_constant_is_folded(xy):
    c = T.constant(np.arange(6.0).reshape(2, 3))
    m = T.dmatrix("m")
    out = m + c.T
    f = rewritten([m], out)
    assert op_names(f) == ["add"]
    same_values([m], out, np.ones((3, 2)))


def test_dimshuffle_lifted_through_elemwise(xy):
    x, y = xy
    out = (x * y).dimshuffle(0, "x") + T.dmatrix("m")
    m = out.owner.inputs[1]
    f = rewritten([x, y, m], out)
    names = op_names(f)
    assert names.count("DimShuffle") == 2 and names[-1] in ("add", "mul")
    same_values([x, y, m], out, V, W, np.ones((5, 3)))


def test_fill_sinks_and_disappears(xy):
    x, y = xy
    out = T.second(x, y) * y  # x only gives the shape, and y already has it
    f = rewritten([x, y], out)
    assert op_names(f) == ["mul"]
    same_values([x, y], out, V, W)
    s = T.dscalar("s")
    out = T.second(x, s) * 2  # the fill must stay: it gives the shape
    f = rewritten([x, s], out)
    assert "second" in op_names(f)
    np.testing.assert_allclose(f(V, 3.0), np.full(5, 6.0))


def test_shape_i_lifted_to_the_inputs(xy):
    x, y = xy
    out = T.shape_i(T.exp(x) * y, 0)
    f = rewritten([x, y], out)
    assert op_names(f) == ["Shape_i"]
    assert f.maker.fgraph.toposort()[0].inputs[0] in f.maker.fgraph.inputs
    assert f(V, W) == 5
    m = T.dmatrix("m")
    f = rewritten([m], T.shape_i(m.T.sum(axis=1), 0))
    assert op_names(f) == ["Shape_i"] and f(M) == 4
    r = T.row("r")
    f = rewritten([r], T.shape_i(r, 0))
    assert op_names(f) == [] and f(np.ones((1, 3))) == 1


def test_shape_subscript_becomes_shape_i(xy):
    m = T.dmatrix("m")
    out = m.shape[1] * 2
    f = rewritten([m], out)
    assert "Shape_i" in op_names(f) and "Shape" not in op_names(f)
    assert f(M) == 8


def test_shape_of_known_shape(xy):
    n = T.lscalar("n")
    a = T.alloc(0.0, n, 3)
    f = rewritten([n], T.shape(a))
    assert "Alloc" not in op_names(f)
    np.testing.assert_array_equal(f(4), [4, 3])
    f = rewritten([n], T.shape_i(a, 0) + 1)
    assert "Alloc" not in op_names(f) and f(4) == 5


def test_useless_reshape_and_reshape_of_reshape(xy):
    m = T.dmatrix("m")
    out = m.reshape((m.shape[0], m.shape[1])) * 2
    f = rewritten([m], out)
    assert "Reshape" not in op_names(f)
    same_values([m], out, M)
    out = m.reshape((12,)).reshape((4, 3))
    f = rewritten([m], out)
    assert op_names(f).count("Reshape") == 1
    same_values([m], out, M)


def test_useless_subtensor_and_alloc(xy):
    m = T.dmatrix("m")
    out = m[:, 0:] * 2
    f = rewritten([m], out)
    assert "Subtensor" not in op_names(f)
    same_values([m], out, M)
    out = T.alloc(m, m.shape[0], m.shape[1]) + 1
    f = rewritten([m], out)
    assert "Alloc" not in op_names(f)
    same_values([m], out, M)


def test_sum_over_broadcastable_dims_is_a_dimshuffle(xy):
    x, _ = xy
    out = x.dimshuffle("x", 0).sum(axis=0)
    f = rewritten([x], out)
    assert "Sum" not in op_names(f) and "CAReduce" not in op_names(f)
    same_values([x], out, V)


def test_pow_one_and_zero(xy):
    x, _ = xy
    f = rewritten([x], x ** 1)
    assert op_names(f) == []
    f = rewritten([x], x ** 0)
    assert "pow" not in op_names(f)
    np.testing.assert_allclose(f(V), np.ones(5))


def test_integer_arithmetic_is_left_alone():
    i = T.lvector("i")
    out = (i * 2) // 2 - i
    f = rewritten([i], out)
    np.testing.assert_array_equal(f(np.arange(4)), np.zeros(4))


def test_canonical_forms_are_idempotent(xy):
    x, y = xy
    out = T.exp(-(x * 2 - y / 3) * (1 - y) / (1 - y) + x - x + 0.5)
    f = rewritten([x, y], out)
    again = rewritten(f.maker.fgraph.inputs, f.maker.fgraph.outputs)
    assert op_names(again) == op_names(f)
    same_values([x, y], out, V, W)


def test_gradient_of_gates_sliced_from_one_product_is_one_region_write():
    """An LSTM's gates are slices of one fused product; their gradients are joined and
    written once (local_add_of_slice_writes), not each into its own zeroed array and added."""
    import symgpu
    from symgpu.tensor.subtensor import IncSubtensor
    x = T.dmatrix("x")
    h = 2
    gates = [T.nnet.sigmoid(x[:, 0:h]), T.tanh(x[:, h:2 * h]), T.exp(x[:, 2 * h:3 * h])]
    cost = sum(T.sum(g * (k + 1)) for k, g in enumerate(gates))
    f = symgpu.function([x], T.grad(cost, x))
    # joined, and the write into the zeroed gradient is that join itself (specialize's
    # local_write_into_zeros_to_join: the zero tail a fill of a slice, no length computed)
    incs = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, IncSubtensor)]
    assert not incs and op_names(f).count("Join") == 1
    for cols in (6, 5, 8):          # whole, clipped by NumPy's slicing, and a zero tail
        v = rng.rand(3, cols)
        s = 1 / (1 + np.exp(-v[:, 0:2]))
        ref = np.zeros_like(v)
        parts = [s * (1 - s), 2 * (1 - np.tanh(v[:, 2:4]) ** 2), 3 * np.exp(v[:, 4:6])]
        at = 0
        for p in parts:
            ref[:, at:at + p.shape[1]] = p
            at += p.shape[1]
        np.testing.assert_allclose(f(v), ref, rtol=1e-12)
    # slices with a gap between them are left alone (a join would misplace the second)
    g = T.grad(T.sum(T.exp(x[:, 0:2])) + T.sum(T.exp(x[:, 3:5])), x)
    f = symgpu.function([x], g)
    assert op_names(f).count("Join") == 2
    v = rng.rand(3, 6)
    ref = np.zeros_like(v)
    ref[:, 0:2], ref[:, 3:5] = np.exp(v[:, 0:2]), np.exp(v[:, 3:5])
    np.testing.assert_allclose(f(v), ref, rtol=1e-12)
