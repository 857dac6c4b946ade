"""Elementwise fusion and the Composite scalar op (NumPy kernels, CUDA rendering, printing)."""
import numpy as np
import pytest

import symgpu.tensor as T
from symgpu import function
from symgpu.compile.mode import Mode
from symgpu.graph.basic import io_toposort
from symgpu.scalar.basic import SCALAR_OPS as S
from symgpu.scalar.composite import Composite, CompositeBuilder
from symgpu.tensor.elemwise import Elemwise
from test_rewriting_helpers import op_names, raise_on_rewrite_errors, same_values  # noqa: F401

rng = np.random.RandomState(3)
NOFUSE = Mode("FAST_RUN").excluding_tags("fusion")


def composites(f):
    return [n for n in f.maker.fgraph.toposort()
            if isinstance(n.op, Elemwise) and isinstance(n.op.scalar_op, Composite)]


def build(in_dtypes, prog, outs, consts=()):
    b = CompositeBuilder()
    refs = [b.add_input(d) for d in in_dtypes]
    for v, d in consts:
        refs.append(b.add_constant(v, d))
    for name, args in prog:
        refs.append(b.add_op(S[name], [refs[a] for a in args])[0])
    return b.build([refs[o] for o in outs])


def test_composite_str_matches_the_seed_style():
    c = build(["float32"] * 3, [("softplus", [1]), ("mul", [0, 3]), ("sub", [4, 2])], [5])
    assert str(c) == "Composite{((i0 * softplus(i1)) - i2)}"
    # Theano's names: binary arithmetic infix, and a fused Elemwise without ",no_inplace"
    assert str(Elemwise(c)) == "Elemwise{Composite{((i0 * softplus(i1)) - i2)}}"
    neg = build(["float64"] * 2, [("neg", [0]), ("true_div", [2, 1])], [3])
    assert str(neg) == "Composite{((-i0) / i1)}"
    assert c.nin == 3 and c.nout == 1 and c.output_dtype("float32", "float32", "float32") == "float32"


def test_composite_equality_and_hash():
    a = build(["float64"] * 2, [("add", [0, 1]), ("exp", [2])], [3])
    b = build(["float64"] * 2, [("add", [0, 1]), ("exp", [2])], [3])
    c = build(["float64"] * 2, [("add", [0, 1]), ("sin", [2])], [3])
    assert a == b and hash(a) == hash(b) and a != c
    assert Elemwise(a) == Elemwise(b)


def test_composite_impl_several_outputs_and_dtypes():
    c = build(["float32", "float32"], [("sigmoid", [0]), ("gt", [3, 2]), ("sub", [3, 1])], [4, 5],
              consts=[(0.5, "float32")])
    assert c.out_dtypes == ("bool", "float32")
    x = rng.randn(7).astype("float32")
    y = rng.rand(7).astype("float32")
    gt, d = c.impl(x, y)
    s = 1 / (1 + np.exp(-x))
    np.testing.assert_array_equal(gt, s > 0.5)
    np.testing.assert_allclose(d, s - y, rtol=1e-6)


def test_composite_cuda_expression_and_lines():
    c = build(["float32"] * 2, [("exp", [0]), ("mul", [2, 1])], [3])
    assert c.cuda("float32", ["a", "b"]) == "(expf(a) * b)"
    d = build(["float64"] * 2, [("exp", [0]), ("mul", [2, 1]), ("lt", [2, 3])], [3, 4])
    lines = d.cuda_lines(["a", "b"], ["o0", "o1"])
    assert lines[0] == "const double t0 = exp(a);"
    assert lines[-2:] == ["o0 = t1;", "o1 = t2;"]
    with pytest.raises(TypeError, match="cuda_lines"):
        d.cuda("float64", ["a", "b"])


def test_composite_inner_graph_for_renderers():
    c = build(["float32"], [("exp", [0]), ("neg", [1])], [2])
    (out,) = c.outputs
    assert out.owner.op is S["neg"] and out.dtype == "float32"
    assert [n.op.name for n in io_toposort(c.inputs, c.outputs)] == ["exp", "neg"]


def test_fusion_makes_one_node_and_keeps_values():
    x, y, z = T.dvector("x"), T.dvector("y"), T.dvector("z")
    out = T.tanh(x * y + z) * T.exp(-z) - T.sqrt(T.abs(x))
    f = same_values([x, y, z], out, rng.randn(6), rng.randn(6), rng.randn(6))
    assert len(f.maker.fgraph.toposort()) == 1 and len(composites(f)) == 1
    assert len(function([x, y, z], out, mode=NOFUSE).maker.fgraph.toposort()) > 4


def test_fusion_exports_values_used_elsewhere_as_extra_outputs():
    x, y = T.dvector("x"), T.dvector("y")
    t = T.exp(x) * y
    out1 = t + 1
    out2 = T.dot(t, y)  # t is needed outside the elementwise group
    f = same_values([x, y], [out1, out2], rng.randn(4), rng.randn(4))
    (c,) = composites(f)
    assert len(c.outputs) == 2


def test_fusion_joins_siblings_reading_the_same_input():
    x = T.dvector("x")
    f = same_values([x], [T.exp(x) * 2, T.sin(x) + 1], rng.randn(5))
    assert len(f.maker.fgraph.toposort()) == 1


def test_fusion_never_makes_a_cycle():
    x = T.dvector("x")
    a = T.exp(x)
    s = a.sum()  # a -> sum -> (a * s): fusing a with the last mul would need s inside
    out = a * s + 1
    f = same_values([x], out, rng.randn(5))
    order = f.maker.fgraph.toposort()
    assert len(order) == len(set(order))


def test_fusion_with_broadcasting_and_scalars():
    m, r, s = T.dmatrix("m"), T.drow("r"), T.dscalar("s")
    out = T.exp(m * r + s) - s * 2
    same_values([m, r, s], out, rng.randn(3, 4), rng.randn(1, 4), 0.7)
    a, b = T.dscalar("a"), T.dscalar("b")
    f = same_values([a, b], T.exp(a * b) + a / b, 0.3, 2.0)
    assert isinstance(f(0.3, 2.0), np.ndarray)


def test_fusion_with_integers_bools_and_casts():
    i, x = T.ivector("i"), T.fvector("x")
    out = T.switch(T.gt(i, 2), T.cast(i, "float32") * x, -x) + T.exp(i)
    iv = np.arange(6, dtype="int32")
    xv = rng.randn(6).astype("float32")
    f = function([i, x], out)
    ref = function([i, x], out, mode="FAST_COMPILE")
    np.testing.assert_allclose(f(iv, xv), ref(iv, xv), rtol=1e-6)
    assert f(iv, xv).dtype == ref(iv, xv).dtype


def test_fused_variadic_add_with_repeated_terms():
    x = T.dvector("x")
    y = x * 2
    out = (y + T.sin(y) + T.exp(y) + y * y).sum()
    from symgpu import grad
    g = grad(out, x)
    v = np.array([0.1, 0.3])
    yv = 2 * v
    np.testing.assert_allclose(function([x], g)(v), 2 * (1 + np.cos(yv) + np.exp(yv) + 2 * yv))


def test_kernel_reuses_buffers():
    c = build(["float64"] * 2, [("mul", [0, 1]), ("exp", [2]), ("add", [3, 0]), ("sin", [4])], [5])
    fn = c._kernel(((False,), (False,)), (False,), ())
    src = fn.source
    # one array is allocated; exp, add and sin write into it (positional `out`)
    assert "f1(t2, t2)" in src and "f2(t3, i0, t3)" in src and "f3(t4, t4)" in src
    x, y = rng.randn(5), rng.randn(5)
    np.testing.assert_allclose(fn(x, y)[0], np.sin(np.exp(x * y) + x))
    assert not np.shares_memory(fn(x, y)[0], x)


def test_inplace_composite_overwrites_only_an_intermediate():
    x, y = T.dvector("x"), T.dvector("y")
    mm = T.dmatrix("mm")
    out = T.exp(T.dot(mm, x) * 2 + 1) - y
    f = function([mm, x, y], out)
    (c,) = composites(f)
    assert c.op.inplace_pattern  # writes into the Gemv result, not into x or y
    xv, yv, mv = rng.randn(3), rng.randn(4), rng.randn(4, 3)
    x0, y0, m0 = xv.copy(), yv.copy(), mv.copy()
    np.testing.assert_allclose(f(mv, xv, yv), np.exp(mv @ xv * 2 + 1) - yv)
    np.testing.assert_array_equal(xv, x0)
    np.testing.assert_array_equal(yv, y0)
    np.testing.assert_array_equal(mv, m0)


def test_softplus_pair_shares_work_and_is_exact():
    x = T.dvector("x")
    out = T.softplus(x) * 2 + T.softplus(-x)
    v = np.array([-800.0, -30.0, -1.0, 0.0, 1e-9, 2.0, 40.0, 800.0])
    f = function([x], out)
    ref = 2 * np.logaddexp(0, v) + np.logaddexp(0, -v)
    np.testing.assert_allclose(f(v), ref, rtol=1e-15)
    (c,) = composites(f)
    from symgpu.scalar.composite import _lowered
    lowered = _lowered(c.op.scalar_op)
    assert [op.name for op, _ in lowered.steps].count("log1p") == 1  # shared by both


def test_deep_chains_fuse_without_recursion():
    x = T.dvector("x")
    out = x
    for i in range(600):
        out = T.tanh(out * 1.01 + 0.1) if i % 2 else T.exp(-out * 0.5) - 0.25
    f = function([x], out)
    assert len(f.maker.fgraph.toposort()) == 1
    v = np.linspace(-1, 1, 5)
    np.testing.assert_allclose(f(v), function([x], out, mode="FAST_COMPILE")(v))


def test_successive_fusions_do_not_close_a_cycle():
    # two groups joined only through another group: the second fusion must see the first
    from symgpu import grad, shared
    X, Y = T.dmatrix("X"), T.lvector("Y")
    W1, b1 = shared(rng.randn(6, 7) * 0.1), shared(np.zeros(7))
    W2, b2 = shared(rng.randn(7, 3) * 0.1), shared(np.zeros(3))
    h = T.tanh(T.dot(X, W1) + b1)
    p = T.nnet.softmax(T.dot(h, W2) + b2)
    loss = T.nnet.categorical_crossentropy(p, Y).mean()
    params = [W1, b1, W2, b2]
    step = function([X, Y], loss, updates=[(q, q - 0.1 * g) for q, g in zip(params, grad(loss, params))])
    Xv, Yv = rng.randn(16, 6), rng.randint(0, 3, 16)
    losses = [step(Xv, Yv) for _ in range(50)]
    assert losses[-1] < losses[0]


def test_readers_of_a_broadcastable_value_with_different_shapes_are_not_fused():
    """`a - s` and `b - s` with s of shape (1, 1): a and b may differ in shape, so one fused
    node (one iteration space, which the GPU kernel needs) would be wrong."""
    import numpy as np
    from symgpu import function, grad, shared
    a = shared(np.ones((3, 4)), name="a")
    b = shared(np.ones((5, 2)), name="b")
    x = T.dmatrix("x")
    cost = (a.sum() + b.sum()) * x.sum()
    ga, gb = grad(cost, [a, b])
    f = function([x], cost, updates=[(a, a - 0.01 * ga), (b, b - 0.01 * gb)])
    for node in f.maker.fgraph.toposort():
        if isinstance(node.op, Elemwise):
            shapes = {v.broadcastable for v in node.inputs if v.ndim == 2}
            assert not ({a.type.broadcastable} <= shapes and len(
                [v for v in node.inputs if v.name in ("a", "b")]) == 2), node
    f(np.ones((2, 2)))
    np.testing.assert_allclose(a.get_value(), 1 - 0.01 * 4 * np.ones((3, 4)))
    np.testing.assert_allclose(b.get_value(), 1 - 0.01 * 4 * np.ones((5, 2)))
