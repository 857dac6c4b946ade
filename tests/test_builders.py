"""OpFromGraph (symgpu/builders.py), after Theano's theano/compile/tests/test_builders.py: every
case runs with the inner graph compiled (inline=False) and inlined (inline=True), against
NumPy values."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function, shared
from symgpu.builders import OpFromGraph
from symgpu.gradient import (DisconnectedType, NullType, NullTypeGradError, disconnected_grad,
                             verify_grad)
from symgpu.graph.fg import FunctionGraph
from symgpu.tensor.rewriting.shape_feature import node_shapes
from gpu_helpers import real_default_gpu, requires_gpu

INLINE = pytest.mark.parametrize("inline", [False, True], ids=["compiled", "inline"])


def ofg_nodes(fn):
    return [n for n in fn.maker.fgraph.toposort() if isinstance(n.op, OpFromGraph)]


def rand(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, size=shape)


@INLINE
def test_straightforward(inline):
    x, y, z = T.dmatrices("x", "y", "z")
    op = OpFromGraph([x, y, z], [x + y * z], inline=inline)
    fn = function([x, y, z], op(x, y, z) - op(y, z, x))
    xv, yv, zv = rand(2, 3, seed=1), rand(2, 3, seed=2), rand(2, 3, seed=3)
    want = (xv + yv * zv) - (yv + zv * xv)
    np.testing.assert_allclose(fn(xv, yv, zv), want)
    np.testing.assert_allclose(fn(xv, yv, zv), want)   # twice: the inner function is reused
    assert len(ofg_nodes(fn)) == (0 if inline else 2)


@INLINE
def test_size_changes(inline):
    x, y, z = T.dmatrices("x", "y", "z")
    op = OpFromGraph([x, y], [T.dot(x, y)], inline=inline)
    fn = function([x, y, z], op(x, op(y, z)))
    xv, yv, zv = np.ones((2, 3)), np.ones((3, 4)) * 3, np.ones((4, 5)) * 5
    res = fn(xv, yv, zv)
    assert res.shape == (2, 5) and np.all(res == 180.0)
    xv, yv, zv = rand(4, 2), rand(2, 6), rand(6, 3)
    np.testing.assert_allclose(fn(xv, yv, zv), xv @ (yv @ zv))


@INLINE
def test_grad(inline):
    x, y, z = T.dmatrices("x", "y", "z")
    op = OpFromGraph([x, y, z], [x + y * z], inline=inline)
    f = op(x, y, z)
    f = f - T.grad(T.sum(f), y)
    fn = function([x, y, z], f)
    xv, yv, zv = rand(2, 2, seed=1), rand(2, 2, seed=2), rand(2, 2, seed=3)
    np.testing.assert_allclose(fn(xv, yv, zv), xv + yv * zv - zv)


@INLINE
def test_grad_grad(inline):
    x, y, z = T.dmatrices("x", "y", "z")
    op = OpFromGraph([x, y, z], [x + y * z], inline=inline)
    f = op(x, y, z)
    f = f - T.grad(T.sum(f), y)
    f = f - T.grad(T.sum(f), y)
    fn = function([x, y, z], f)
    xv, yv, zv = rand(2, 2, seed=1), rand(2, 2, seed=2), rand(2, 2, seed=3)
    np.testing.assert_allclose(fn(xv, yv, zv), xv + yv * zv - 2 * zv)


@INLINE
def test_verify_grad_of_a_nonlinear_graph(inline):
    a, b = T.dvectors("a", "b")
    op = OpFromGraph([a, b], [T.tanh(a) * b, T.exp(a - b).sum()], inline=inline)

    def fun(u, v):
        p, q = op(u, v)
        return p * q
    verify_grad(fun, [rand(5, seed=4), rand(5, seed=5)], rng=np.random.default_rng(0))


@INLINE
def test_shared(inline):
    x, y, z = T.dmatrices("x", "y", "z")
    sv = rand(2, 2, seed=7)
    s = shared(sv.copy())
    op = OpFromGraph([x, y, z], [x + y * z + s], inline=inline)
    assert op.shared_inputs == [s]
    fn = function([x, y, z], op(x, y, z) - op(y, z, x))
    xv, yv, zv = np.ones((2, 2)), np.ones((2, 2)) * 3, np.ones((2, 2)) * 5
    np.testing.assert_allclose(fn(xv, yv, zv), 8.0)
    # the shared value is read at each call, not frozen into the op
    s.set_value(sv * 10)
    g = function([x, y, z], op(x, y, z))
    np.testing.assert_allclose(g(xv, yv, zv), 16.0 + sv * 10)


@INLINE
def test_shared_grad(inline):
    x, y, z = T.dmatrices("x", "y", "z")
    sv = rand(2, 2, seed=8)
    s = shared(sv)
    op = OpFromGraph([x, y, z], [x + y * z + s * s], inline=inline)
    f = op(x, y, z)
    fn = function([x, y, z], f - T.grad(T.sum(f), y))
    xv, yv, zv = np.ones((2, 2)), np.ones((2, 2)) * 3, np.ones((2, 2)) * 5
    np.testing.assert_allclose(fn(xv, yv, zv), 11.0 + sv * sv)
    # the gradient reaches the shared variable too
    f = op(x, y, z)
    fn = function([x, y, z], f - T.grad(T.sum(f), s))
    np.testing.assert_allclose(fn(xv, yv, zv), 16.0 + sv * sv - 2 * sv)


@INLINE
def test_grad_override(inline):
    x, y = T.dvectors("x", "y")

    def go(inps, gs):
        x, y = inps
        g, = gs
        return [g * y * 2, g * x * 1.5]

    dedz = T.dvector("dedz")
    op_mul_grad = OpFromGraph([x, y, dedz], go([x, y], [dedz]), inline=inline)
    op_mul = OpFromGraph([x, y], [x * y], grad_overrides=go, inline=inline)
    op_mul2 = OpFromGraph([x, y], [x * y], grad_overrides=op_mul_grad, inline=inline)

    # a single override: a callable or an OpFromGraph
    xx, yy = T.dvector("xx"), T.dvector("yy")
    xv, yv = rand(16, seed=1), rand(16, seed=2)
    for op in (op_mul, op_mul2):
        zz = T.sum(op(xx, yy))
        dx, dy = T.grad(zz, [xx, yy])
        dxv, dyv = function([xx, yy], [dx, dy])(xv, yv)
        np.testing.assert_allclose(dxv, yv * 2)
        np.testing.assert_allclose(dyv, xv * 1.5)

    # a list: one callable per input, the third one the default
    def go1(inps, gs):
        x, w, b = inps
        return gs[0] * w * 2

    def go2(inps, gs):
        x, w, b = inps
        return gs[0] * x * 1.5

    w, b = T.dvectors("w", "b")
    op_linear = OpFromGraph([x, w, b], [x * w + b], grad_overrides=[go1, go2, "default"],
                            inline=inline)
    xx, ww, bb = T.dvector("xx"), T.dvector("ww"), T.dvector("bb")
    zz = T.sum(op_linear(xx, ww, bb) * 3)
    dx, dw, db = T.grad(zz, [xx, ww, bb])
    xv, wv, bv = rand(16, seed=1), rand(16, seed=2), rand(16, seed=3)
    dxv, dwv, dbv = function([xx, ww, bb], [dx, dw, db])(xv, wv, bv)
    np.testing.assert_allclose(dxv, 3 * wv * 2)
    np.testing.assert_allclose(dwv, 3 * xv * 1.5)
    np.testing.assert_allclose(dbv, np.full(16, 3.0))

    # NullType and DisconnectedType entries
    op_linear2 = OpFromGraph([x, w, b], [x * w + b],
                             grad_overrides=[go1, NullType()(), DisconnectedType()()],
                             inline=inline)
    zz2 = T.sum(op_linear2(xx, ww, bb))
    dx2, db2 = T.grad(zz2, [xx, bb], return_disconnected="Disconnected",
                      disconnected_inputs="ignore")
    assert isinstance(dx2.type, T.TensorType) and dx2.ndim == 1
    assert isinstance(db2.type, DisconnectedType)
    np.testing.assert_allclose(function([xx, ww, bb], dx2, on_unused_input="ignore")(xv, wv, bv),
                               wv * 2)
    with pytest.raises(NullTypeGradError):
        T.grad(zz2, ww)
    assert op_linear2.connection_pattern(None) == [[True], [True], [False]]


@INLINE
def test_grad_override_with_the_users_variables_and_a_shared_variable(inline):
    """An override may be written with the variables the op was built from; a shared
    variable the graph reads keeps its default gradient."""
    x = T.dvector("x")
    sv = rand(4, seed=3)
    s = shared(sv)
    op = OpFromGraph([x], [x * s], grad_overrides=lambda inps, gs: [gs[0] * (x + 1)],
                     inline=inline)
    xx = T.dvector("xx")
    c = T.sum(op(xx))
    dx, ds = T.grad(c, [xx, s])
    xv = rand(4, seed=4)
    dxv, dsv = function([xx], [dx, ds])(xv)
    np.testing.assert_allclose(dxv, xv + 1)
    np.testing.assert_allclose(dsv, xv)


@INLINE
def test_lop_override(inline):
    x = T.dvector("x")
    y = 1.0 / (1.0 + T.exp(-x))

    def lop_ov(inps, outs, grads):
        y_, = outs
        dedy_, = grads
        return [2.0 * y_ * (1.0 - y_) * dedy_]

    y_, dedy = T.dvector(), T.dvector()
    op_lop_ov = OpFromGraph([x, y_, dedy], [2.0 * y_ * (1.0 - y_) * dedy], inline=inline,
                            on_unused_input="ignore")
    xx = T.dvector()
    xval = rand(32)
    sig = 1 / (1 + np.exp(-xval))
    for ov in (lop_ov, op_lop_ov):
        op = OpFromGraph([x], [y], lop_overrides=ov, inline=inline)
        g = T.grad(T.sum(op(xx)), xx)
        np.testing.assert_allclose(function([xx], g)(xval), 2 * sig * (1 - sig))


def test_lop_and_grad_overrides_are_exclusive():
    x = T.dvector("x")
    with pytest.raises(ValueError, match="mutually exclusive"):
        OpFromGraph([x], [x * 2], grad_overrides=lambda i, g: g, lop_overrides=lambda i, o, g: g)


@INLINE
def test_rop(inline):
    a, M = T.dvector(), T.dmatrix()
    op_matmul = OpFromGraph([a, M], [T.dot(a, M)], inline=inline)
    x, W, du = T.dvector(), T.dmatrix(), T.dvector()
    y = op_matmul(x, W)
    dv = T.Rop(y, x, du)
    fn = function([x, W, du], dv, on_unused_input="ignore")
    xval, Wval, duval = rand(16, seed=1), rand(16, 16, seed=2), rand(16, seed=3)
    np.testing.assert_allclose(fn(xval, Wval, duval), duval @ Wval)
    # both inputs moving
    dW = T.dmatrix()
    fn2 = function([x, W, du, dW], T.Rop(y, [x, W], [du, dW]))
    dWval = rand(16, 16, seed=4)
    np.testing.assert_allclose(fn2(xval, Wval, duval, dWval), duval @ Wval + xval @ dWval)


@INLINE
def test_rop_override(inline):
    x, y = T.dvectors("x", "y")

    def ro(inps, epts):
        x, y = inps
        u, v = epts
        return [u * y * 2.0 + x * v * 1.5]

    u, v = T.dvectors("u", "v")
    op_mul_rop = OpFromGraph([x, y, u, v], ro([x, y], [u, v]), inline=inline)
    op_mul = OpFromGraph([x, y], [x * y], rop_overrides=ro, inline=inline)
    op_mul2 = OpFromGraph([x, y], [x * y], rop_overrides=op_mul_rop, inline=inline)
    op_mul3 = OpFromGraph([x, y], [x * y], rop_overrides=[ro], inline=inline)
    xx, yy, du, dv = T.dvector("xx"), T.dvector("yy"), T.dvector("du"), T.dvector("dv")
    vals = rand(4, 32)
    for op in (op_mul, op_mul2, op_mul3):
        dw = T.Rop(op(xx, yy), [xx, yy], [du, dv])
        got = function([xx, yy, du, dv], dw)(*vals)
        np.testing.assert_allclose(got, vals[0] * vals[3] * 1.5 + vals[1] * vals[2] * 2.0)


@INLINE
def test_rop_override_list_with_default_and_disconnected(inline):
    x, y = T.dvectors("x", "y")
    op = OpFromGraph([x, y], [x * y, x + y],
                     rop_overrides=["default", DisconnectedType()()], inline=inline)
    xx, yy, du, dv = T.dvector("xx"), T.dvector("yy"), T.dvector("du"), T.dvector("dv")
    p, q = op(xx, yy)
    rp, rq = T.Rop([p, q], [xx, yy], [du, dv])
    vals = rand(4, 8)
    gp, gq = function([xx, yy, du, dv], [rp, rq])(*vals)
    np.testing.assert_allclose(gp, vals[2] * vals[1] + vals[0] * vals[3])
    np.testing.assert_allclose(gq, 0.0)   # as Theano: a disconnected R_op is zero


@INLINE
def test_connection_pattern_override(inline):
    x, y = T.dvectors("x", "y")

    def f1_back(inputs, output_gradients):
        return [output_gradients[0], DisconnectedType()()]

    op = OpFromGraph([x, y], [y + T.round(y)], grad_overrides=f1_back,
                     connection_pattern=[[True], [False]], on_unused_input="ignore",
                     inline=inline)
    c = op(x, y)
    g1 = T.grad(c.sum(), x)
    out = function([x, y], g1, on_unused_input="ignore")(np.ones(5), np.ones(5))
    np.testing.assert_allclose(out, np.ones(5))
    assert op.connection_pattern(None) == [[True], [False]]
    assert T.grad(c.sum(), y, disconnected_inputs="ignore",
                  return_disconnected="Disconnected").type == DisconnectedType()


@INLINE
def test_nested(inline):
    x, y = T.dvectors("x", "y")
    u, v = x + y, x - y
    op_ft = OpFromGraph([x, y], [u, v], inline=inline)
    op_ift = OpFromGraph([x, y], [u / 2, v / 2], inline=inline)
    xx, yy = T.dvector("xx"), T.dvector("yy")
    xx2, yy2 = op_ift(*op_ft(xx, yy))
    fn = function([xx, yy], [xx2, yy2])
    xv, yv = rand(16, seed=1), rand(16, seed=2)
    xv2, yv2 = fn(xv, yv)
    np.testing.assert_allclose(xv2, xv)
    np.testing.assert_allclose(yv2, yv)


@INLINE
def test_nested_inside_the_graph(inline):
    """An OpFromGraph in another one's graph: values, gradient and the second one inlined
    all the way down."""
    a = T.dvector("a")
    inner = OpFromGraph([a], [T.exp(a) * 2], inline=inline)
    b, c = T.dvectors("b", "c")
    outer = OpFromGraph([b, c], [inner(b) + c * inner(c)], inline=inline)
    xx, yy = T.dvector("xx"), T.dvector("yy")
    r = outer(xx, yy)
    xv, yv = rand(6, seed=1), rand(6, seed=2)
    fn = function([xx, yy], r)
    np.testing.assert_allclose(fn(xv, yv), 2 * np.exp(xv) + yv * 2 * np.exp(yv))
    assert len(ofg_nodes(fn)) == (0 if inline else 1)
    verify_grad(lambda p, q: outer(p, q), [xv, yv], rng=np.random.default_rng(0))


@INLINE
def test_connection_pattern(inline):
    x, y, z = T.dmatrices("x", "y", "z")
    op1 = OpFromGraph([x, y, z], [x * y, y * z], inline=inline)
    assert op1.connection_pattern(None) == [[True, False], [True, True], [False, True]]

    # inner ops with a partial connection pattern and several outputs
    m, n, p, q = T.dmatrices("m", "n", "p", "q")
    o1, o2 = op1(m, n, p)
    out1, out2 = op1(o1, q, o2)
    op2 = OpFromGraph([m, n, p, q], [out1, out2], inline=inline)
    assert op2.connection_pattern(None) == [[True, False], [True, True], [False, True],
                                            [True, True]]

    # a path cut by disconnected_grad, and a shared variable (an implicit last input)
    s = shared(rand(2, 2))
    op3 = OpFromGraph([x, y], [x + s, disconnected_grad(y) + x, s * 3], inline=inline)
    assert op3.connection_pattern(None) == [[True, True, False], [False, False, False],
                                            [True, False, True]]


def test_connection_pattern_is_checked():
    x, y = T.dvectors("x", "y")
    with pytest.raises(ValueError, match="connection_pattern has 1 row"):
        OpFromGraph([x, y], [x + y], connection_pattern=[[True]])
    with pytest.raises(ValueError, match=r"connection_pattern\[1\] must be 1 bool"):
        OpFromGraph([x, y], [x + y], connection_pattern=[[True], [True, False]])


def test_infer_shape():
    x, y = T.dmatrices("x", "y")
    op = OpFromGraph([x, y], [x + y, T.dot(x, y.T), x[1:].sum(axis=0)])
    q, p = T.dmatrices("q", "p")
    outs = op(q, p)
    node = outs[0].owner
    shapes = node_shapes(node)
    flat = [d for s in shapes for d in s]
    f = function([q, p], flat)
    assert not ofg_nodes(f)   # the shapes need nothing of the op's computation
    qv, pv = rand(3, 4), rand(3, 4)
    assert [int(v) for v in f(qv, pv)] == [3, 4, 3, 3, 4]
    # the outer function's shape reads go through the op too
    g = function([q, p], [o.shape for o in outs])
    assert not ofg_nodes(g)
    assert [tuple(v) for v in g(qv, pv)] == [(3, 4), (3, 3), (4,)]


def test_infer_shape_depending_on_an_input_value():
    x, n = T.dvector("x"), T.lscalar("n")
    op = OpFromGraph([x, n], [T.alloc(x.sum(), n, 2) + 1])
    xx, nn = T.dvector("xx"), T.lscalar("nn")
    out = op(xx, nn)
    f = function([xx, nn], out.shape)
    assert not ofg_nodes(f)
    assert tuple(f(rand(3), 5)) == (5, 2)


@INLINE
def test_equal_ops_merge(inline):
    def build():
        x, y = T.dvectors("x", "y")
        return OpFromGraph([x, y], [T.exp(x) * y + 2], inline=inline)
    a, b = build(), build()
    assert a == b and hash(a) == hash(b)
    x, y = T.dvectors("x", "y")
    assert a != OpFromGraph([x, y], [T.exp(x) * y + 3], inline=inline)
    assert a != OpFromGraph([x, y], [T.exp(x) * y + 2], inline=not inline)
    assert a != OpFromGraph([x, y], [T.exp(x) * y + 2], inline=inline,
                            grad_overrides=lambda i, g: [g[0], g[0]])
    xx, yy = T.dvector("xx"), T.dvector("yy")
    fn = function([xx, yy], a(xx, yy) * b(xx, yy))
    xv, yv = rand(4, seed=1), rand(4, seed=2)
    np.testing.assert_allclose(fn(xv, yv), (np.exp(xv) * yv + 2) ** 2)
    if not inline:
        assert len(ofg_nodes(fn)) == 1


@INLINE
def test_pickle_a_compiled_function(inline, tmp_path):
    x, y = T.dvectors("x", "y")
    s = shared(rand(5, seed=9), name="s")
    op = OpFromGraph([x, y], [x * y + s, T.tanh(x)], inline=inline)
    xx, yy = T.dvector("xx"), T.dvector("yy")
    p, q = op(xx, yy)
    fn = function([xx, yy], [p + q, T.grad((p * q).sum(), xx)])
    xv, yv = rand(5, seed=1), rand(5, seed=2)
    want = fn(xv, yv)
    again = pickle.loads(pickle.dumps(fn))
    for w, g in zip(want, again(xv, yv)):
        np.testing.assert_allclose(g, w)
    sv = s.get_value()
    np.testing.assert_allclose(want[0], xv * yv + sv + np.tanh(xv))


def test_outputs_never_alias_inputs_or_each_other():
    x = T.dvector("x")
    op = OpFromGraph([x], [x, x.dimshuffle("x", 0), x * 2, T.constant(np.arange(3.0))])
    xx = T.dvector("xx")
    a, b, c, d = op(xx)
    node = a.owner
    node.op.prepare_node(node, {}, {}, None)
    xv = rand(3)
    storage = [[None] for _ in range(4)]
    node.op.perform(node, [xv], storage)
    vals = [s[0] for s in storage]
    np.testing.assert_allclose(vals[0], xv)
    np.testing.assert_allclose(vals[1], xv[None])
    np.testing.assert_allclose(vals[3], np.arange(3.0))
    assert not any(np.may_share_memory(v, xv) for v in vals)
    # the outer graph may then overwrite them in place
    fn = function([xx], [a + 1, b * 3, c - 1, d + 0.5])
    outs = fn(xv)
    np.testing.assert_allclose(outs[0], xv + 1)
    np.testing.assert_allclose(outs[3], np.arange(3.0) + 0.5)
    np.testing.assert_allclose(fn(xv)[3], np.arange(3.0) + 0.5)


def test_integer_inputs_and_outputs():
    x, k = T.dvector("x"), T.lscalar("k")
    op = OpFromGraph([x, k], [x * k, T.argmax(x)])
    xx, kk = T.dvector("xx"), T.lscalar("kk")
    p, i = op(xx, kk)
    g = T.grad(p.sum(), xx)
    xv = rand(5)
    pv, iv, gv = function([xx, kk], [p, i, g])(xv, 3)
    np.testing.assert_allclose(pv, xv * 3)
    assert iv == np.argmax(xv)
    np.testing.assert_allclose(gv, np.full(5, 3.0))


def test_compute_test_value():
    with symgpu.config.change_flags(compute_test_value="raise"):
        x = T.dscalar("x")
        x.tag.test_value = np.array(2.0)
        op = OpFromGraph([x], [x ** 3])
        y = T.dscalar("y")
        y.tag.test_value = np.array(2.0)
        f = op(y)
        assert float(f.tag.test_value) == 8.0
        grad_f = T.grad(f, y)
        assert float(grad_f.tag.test_value) == 12.0


def test_inner_mode_follows_the_outer_function():
    x = T.dvector("x")
    op = OpFromGraph([x], [T.exp(x) + 1])
    xx = T.dvector("xx")
    for mode in ("FAST_RUN", "FAST_COMPILE"):
        fn = function([xx], op(xx), mode=mode)
        (node,) = ofg_nodes(fn)
        assert node.op.mode == mode and node.op.fn.mode == mode
        np.testing.assert_allclose(fn(np.zeros(2)), 2.0)
    # an explicit mode is kept
    op2 = OpFromGraph([x], [T.exp(x) + 1], mode="FAST_COMPILE")
    (node,) = ofg_nodes(function([xx], op2(xx)))
    assert node.op is op2


def test_inline_expansion_is_a_pass():
    x = T.dvector("x")
    op = OpFromGraph([x], [x * 2], inline=True)
    xx = T.dvector("xx")
    fg = FunctionGraph([xx], [op(op(xx))])
    from symgpu.builders import inline_ofg_expansion
    inline_ofg_expansion(fg)
    assert not any(isinstance(n.op, OpFromGraph) for n in fg.apply_nodes)
    fn = function([xx], op(op(xx)), mode=symgpu.Mode(optimizer=None))  # no pass: run by perform
    np.testing.assert_allclose(fn(np.ones(3)), 4.0)


def test_bad_input_is_named():
    x, y = T.dvectors("x", "y")
    w = T.dvector("w")
    with pytest.raises(ValueError, match="depend on w"):
        OpFromGraph([x], [x * w])
    with pytest.raises(ValueError, match=r"not used.*on_unused_input"):
        OpFromGraph([x, y], [x * 2])
    with pytest.raises(TypeError, match="inputs\\[1\\].*constant"):
        OpFromGraph([x, T.constant(1.0)], [x * 2])
    with pytest.raises(ValueError, match="inputs\\[1\\].*twice"):
        OpFromGraph([x, x], [x * 2])
    with pytest.raises(TypeError, match="outputs must be a list"):
        OpFromGraph([x], x * 2)
    with pytest.raises(TypeError, match="updates and givens"):
        OpFromGraph([x], [x * 2], updates=[])
    op = OpFromGraph([x, y], [x * y])
    with pytest.raises(ValueError, match="expected 2 input"):
        op(x)
    with pytest.raises(TypeError, match=r"input 1 .* has type .*expected"):
        op(x, T.dmatrix("m"))
    bad = OpFromGraph([x, y], [x * y], grad_overrides=[lambda i, g: g[0]])
    with pytest.raises(ValueError, match="grad_overrides has 1 entries"):
        T.grad(bad(x, y).sum(), x)
    bad = OpFromGraph([x, y], [x * y], grad_overrides="nope")
    with pytest.raises(ValueError, match="grad_overrides must be 'default'"):
        T.grad(bad(x, y).sum(), x)
    bad = OpFromGraph([x, y], [x * y], grad_overrides=lambda i, g: [g[0]] * 3)
    with pytest.raises(ValueError, match="returned 3 gradient"):
        T.grad(bad(x, y).sum(), x)


# ============================================================================ on the GPU

def _gpu_ofg_function():
    x, y = T.vectors("x", "y")
    op = OpFromGraph([x, y], [T.exp(x) * y + 1, (x * y).sum()])
    xx, yy = T.vector("xx"), T.vector("yy")
    p, q = op(xx, yy)
    return function([xx, yy], [p * 2, q])


def test_op_from_graph_becomes_a_gpu_op_from_graph(vgpu):
    from symgpu.gpu.ops.builders import GpuOpFromGraph
    from symgpu.gpu.placement.basic_ops import GpuFromHost, HostFromGpu
    from symgpu.gpu.placement.rewriting import cpu_nodes
    from symgpu.graph.basic import Constant
    f = _gpu_ofg_function()
    (node,) = ofg_nodes(f)
    assert isinstance(node.op, GpuOpFromGraph)
    assert all(v.type.context_name is None for v in node.outputs)   # GPU results
    node.op.fn.compile()
    fg = node.op.fn.compiled_fgraph
    assert not cpu_nodes(fg)
    assert not [n for n in fg.toposort() if isinstance(n.op, (GpuFromHost, HostFromGpu))
                and not isinstance(n.inputs[0], Constant)]


def test_gpu_op_from_graph_with_a_shared_variable_and_pickling(vgpu):
    import pickle
    from symgpu.gpu.ops.builders import GpuOpFromGraph
    x = T.vector("x")
    s = shared(np.ones(3, dtype="float32"))
    op = OpFromGraph([x], [x * s])
    xx = T.vector("xx")
    f = function([xx], op(xx) + 1)
    (node,) = ofg_nodes(f)
    assert isinstance(node.op, GpuOpFromGraph) and len(node.inputs) == 2
    clone = pickle.loads(pickle.dumps(node.op))
    assert isinstance(clone, GpuOpFromGraph) and clone == node.op


@requires_gpu
def test_gpu_op_from_graph_values_on_the_device():
    xv, yv = rand(7, seed=1).astype("float32"), rand(7, seed=2).astype("float32")
    with symgpu.config.change_flags(floatX="float32"), real_default_gpu():
        f = _gpu_ofg_function()
        p, q = f(xv, yv)
        # float32 on the device: the + 1 cancels digits where exp(x) * y is near -1
        np.testing.assert_allclose(np.asarray(p), (np.exp(xv) * yv + 1) * 2, rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(float(np.asarray(q)), (xv * yv).sum(), rtol=1e-5)
        x = T.vector("x")
        s = shared(np.arange(7, dtype="float32"))
        op = OpFromGraph([x], [x * s, x.T])
        xx = T.vector("xx")
        a, b = op(xx)
        g = function([xx], [a + 1, b * 2, T.grad((a * b).sum(), xx)])
        av, bv, gv = (np.asarray(v) for v in g(xv))
        np.testing.assert_allclose(av, xv * np.arange(7) + 1, rtol=1e-5)
        np.testing.assert_allclose(bv, xv * 2, rtol=1e-5)
        np.testing.assert_allclose(gv, 2 * xv * np.arange(7), rtol=1e-5)
