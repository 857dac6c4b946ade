"""grad's semantics (disconnected inputs, constants, integer paths, dtypes, known_grads),
graph size and build-time linearity, Lop/Rop, jacobian and hessian."""
from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.graph.basic import Apply, io_toposort
from symgpu.graph.op import Op
from symgpu.gradient import (DisconnectedInputError, DisconnectedType, NullTypeGradError,
                             Lop, Rop, disconnected_grad, grad, grad_undefined, hessian,
                             jacobian, zero_grad)


def run(inputs, outputs, *values):
    return symgpu.function(inputs, outputs, on_unused_input="ignore")(*values)


def nodes_of(outputs):
    outs = outputs if isinstance(outputs, list) else [outputs]
    return io_toposort(set(), outs)


# --------------------------------------------------------------------------- API forms

def test_exports_and_return_forms():
    assert T.grad is symgpu.grad is grad
    x, y = T.dvector("x"), T.dscalar("y")
    c = (x * y).sum()
    assert isinstance(grad(c, x), symgpu.Variable)
    assert isinstance(grad(c, [x, y]), list) and len(grad(c, [x, y])) == 2
    assert isinstance(grad(c, (x, y)), tuple)
    gx, gy = run([x, y], grad(c, [x, y]), [1.0, 2.0], 3.0)
    np.testing.assert_allclose(gx, [3.0, 3.0])
    assert gy == pytest.approx(3.0)


def test_cost_must_be_a_scalar():
    x = T.dvector("x")
    with pytest.raises(TypeError, match="scalar"):
        grad(x * 2, x)
    with pytest.raises(TypeError, match="wrt"):
        grad((x * 2).sum(), [x, 3.0])
    # a non-scalar cost is fine when its gradient is given
    y = x * 2
    g = grad(y, x, known_grads={y: T.constant(np.array([1.0, 10.0]))})
    np.testing.assert_allclose(run([x], g, [5.0, 6.0]), [2.0, 20.0])


def test_gradient_names():
    x = T.dvector("x")
    c = (x ** 2).sum()
    c.name = "cost"
    assert grad(c, x).name == "(dcost/dx)"


# --------------------------------------------------------------------------- disconnected

def test_disconnected_inputs_policies():
    x, y = T.dvector("x"), T.dvector("y")
    c = (x ** 2).sum()
    with pytest.raises(DisconnectedInputError, match="wrt\\[1\\]"):
        grad(c, [x, y])
    with pytest.warns(UserWarning, match="does not depend"):
        gx, gy = grad(c, [x, y], disconnected_inputs="warn")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gx, gy = grad(c, [x, y], disconnected_inputs="ignore")
    np.testing.assert_array_equal(run([x, y], gy, [1.0, 2.0], [3.0, 4.0, 5.0]), [0, 0, 0])
    assert grad(c, [x, y], disconnected_inputs="ignore", return_disconnected="None")[1] is None
    d = grad(c, [x, y], disconnected_inputs="ignore", return_disconnected="Disconnected")[1]
    assert isinstance(d.type, DisconnectedType)
    with pytest.raises(ValueError, match="disconnected_inputs"):
        grad(c, x, disconnected_inputs="nope")
    with pytest.raises(ValueError, match="return_disconnected"):
        grad(c, x, return_disconnected="nope")


def test_integer_valued_paths_carry_no_gradient_but_are_connected():
    x = T.dvector("x")
    for c in [T.cast(T.gt(x, 0), "float64").sum(),
              T.cast(T.argmax(x), "float64"),
              T.cast(T.cast(x, "int64"), "float64").sum(),
              T.cast(T.floor_div(x, 1), "float64").sum(),
              T.cast(T.eq(x, 1), "float64").sum() + T.cast(x.shape[0], "float64")]:
        g = grad(c, x)  # connected: no DisconnectedInputError
        np.testing.assert_array_equal(run([x], g, [1.0, -2.0, 3.0]), [0.0, 0.0, 0.0])


def test_integer_wrt_gets_integer_zeros():
    x, i = T.dvector("x"), T.lvector("i")
    c = (x * i).sum()
    gx, gi = grad(c, [x, i])
    assert gi.dtype == "int64"
    vx, vi = run([x, i], [gx, gi], [1.0, 2.0], [3, 4])
    np.testing.assert_array_equal(vx, [3.0, 4.0])
    np.testing.assert_array_equal(vi, [0, 0])


def test_gradient_dtype_is_the_wrt_dtype():
    x = T.fvector("x")
    c = (T.cast(x, "float64") ** 2).sum()  # float64 cost
    g = grad(c, x)
    assert g.dtype == "float32"
    y = T.dvector("y")
    g2 = grad((T.cast(y, "float32") ** 2).sum(), y)
    assert g2.dtype == "float64"
    np.testing.assert_allclose(run([y], g2, [1.0, 2.0]), [2.0, 4.0])


# --------------------------------------------------------------------------- stopping gradients

def test_consider_constant():
    x = T.dvector("x")
    y = x ** 2
    c = (y * x).sum()  # d/dx = 3x^2, or x^2 with y held constant
    v = np.array([1.0, 2.0])
    np.testing.assert_allclose(run([x], grad(c, x), v), 3 * v ** 2)
    np.testing.assert_allclose(run([x], grad(c, x, consider_constant=[y]), v), v ** 2)
    # a consider_constant variable still gets its own gradient
    np.testing.assert_allclose(run([x], grad(c, y, consider_constant=[y]), v), v)
    with pytest.raises(DisconnectedInputError):
        grad(y.sum(), x, consider_constant=[y])
    with pytest.raises(TypeError):
        grad(c, x, consider_constant=[1.0])


def test_zero_grad_and_disconnected_grad():
    x = T.dvector("x")
    v = np.array([1.0, 2.0])
    y = x ** 2
    np.testing.assert_allclose(run([x], grad((zero_grad(y) * x).sum(), x), v), v ** 2)
    np.testing.assert_allclose(run([x], grad((disconnected_grad(y) * x).sum(), x), v), v ** 2)
    # alone: zero_grad keeps x connected (zeros); disconnected_grad cuts it (raises)
    np.testing.assert_array_equal(run([x], grad(zero_grad(y).sum(), x), v), [0.0, 0.0])
    with pytest.raises(DisconnectedInputError):
        grad(disconnected_grad(y).sum(), x)
    # identity forward, as a view (no copy at run time), and the caller still gets a copy
    f = symgpu.function([x], [zero_grad(x), disconnected_grad(x * 1)])
    a, b = f(v)
    np.testing.assert_array_equal(a, v)
    np.testing.assert_array_equal(b, v)
    assert a is not v
    ops = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert "ZeroGrad" not in ops and "DisconnectedGrad" not in ops  # removed by a rewrite
    op = zero_grad(x).owner.op
    assert op.view_map == {0: [0]}
    out = [[None]]
    op.perform(None, [v], out)
    assert out[0][0] is v


def test_null_gradient_is_an_error_only_where_it_is_needed():
    class Undiff(Op):
        __props__ = ()

        def make_node(self, x, k):
            x, k = T.as_tensor_variable(x), T.as_tensor_variable(k)
            return Apply(self, [x, k], [x.type()])

        def perform(self, node, inputs, out):
            out[0][0] = inputs[0] * inputs[1]

        def grad(self, inputs, output_grads):
            return [output_grads[0] * inputs[1], grad_undefined(self, 1, inputs[1], "k is a step")]

    x, k = T.dvector("x"), T.dscalar("k")
    c = Undiff()(x, k).sum()
    np.testing.assert_allclose(run([x, k], grad(c, x), [1.0, 2.0], 3.0), [3.0, 3.0])
    with pytest.raises(NullTypeGradError, match="k is a step"):
        grad(c, k)


def test_bad_gradient_shape_is_reported():
    class BadOp(Op):
        __props__ = ()

        def make_node(self, x):
            x = T.as_tensor_variable(x)
            return Apply(self, [x], [x.type()])

        def perform(self, node, inputs, out):
            out[0][0] = inputs[0]

        def grad(self, inputs, output_grads):
            return [output_grads[0].sum()]

    x = T.dvector("x")
    with pytest.raises(ValueError, match="BadOp.*dimension"):
        grad(BadOp()(x).sum(), x)


# --------------------------------------------------------------------------- graph shape

def test_wrt_intermediate_and_total_derivative():
    x = T.dvector("x")
    y = T.exp(x)
    c = (y * x).sum()
    gy, gx = grad(c, [y, x])
    v = np.array([0.5, 1.0])
    np.testing.assert_allclose(run([x], gy, v), v)
    np.testing.assert_allclose(run([x], gx, v), np.exp(v) * v + np.exp(v))


def test_gradient_reuses_forward_outputs():
    x = T.dvector("x")
    c = T.exp(x).sum() + T.sigmoid(x).sum()
    g = grad(c, x)
    ops = [str(n.op.scalar_op) for n in nodes_of(g) if hasattr(n.op, "scalar_op")]
    assert ops.count("exp") == 1 and ops.count("sigmoid") == 1


def test_fan_out_is_accumulated_with_one_add():
    x = T.dvector("x")
    y = x * 2
    c = (y + T.sin(y) + T.exp(y) + y * y).sum()
    g = grad(c, x)
    forward = set(nodes_of(c))
    adds = [n for n in nodes_of(g) if n not in forward and str(getattr(n.op, "scalar_op", "")) == "add"]
    # y's total gradient: one add of its five terms (y, sin, exp, y*y twice), not a chain
    assert len(adds) == 1 and len(adds[0].inputs) == 5
    v = np.array([0.1, 0.3])
    yv = 2 * v
    np.testing.assert_allclose(run([x], g, v), 2 * (1 + np.cos(yv) + np.exp(yv) + 2 * yv))


def _chain(n: int):
    x = T.dvector("x")
    y = x
    for k in range(n // 2):
        y = T.tanh(y) * 1.01 if k % 2 else T.sin(y) + y
    return x, y.sum()


def _build_time(n: int) -> float:
    best = float("inf")
    for _ in range(2):
        x, c = _chain(n)
        t0 = time.perf_counter()
        grad(c, x)
        best = min(best, time.perf_counter() - t0)
    return best


def test_grad_construction_is_linear_in_graph_size(monkeypatch):
    # creation traces cost a constant per node that grows with the caller's stack depth
    # (deep under pytest); they are not what this test measures
    import symgpu.graph.basic as basic
    monkeypatch.setattr(basic, "user_stack", lambda limit=8: [])
    _build_time(20)  # warm caches
    t_small, t_big = _build_time(200), _build_time(800)
    ratio = t_big / t_small
    # linear: ~4x; quadratic would be ~16x
    assert ratio < 9, f"grad of 800 nodes took {ratio:.1f}x the time of 200 nodes"
    x, c = _chain(200)
    n_forward = len(nodes_of(c))
    n_grad = len(nodes_of(grad(c, x)))
    assert n_grad < 6 * n_forward


# --------------------------------------------------------------------------- Lop / Rop

def _numeric_jacobian(f, x, eps=1e-6):
    x = np.array(x, dtype="float64")
    y0 = np.asarray(f(x))
    J = np.zeros(y0.shape + x.shape)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        J[(...,) + i] = (np.asarray(f(xp)) - np.asarray(f(xm))) / (2 * eps)
    return J


def test_lop():
    x = T.dvector("x")
    W = np.arange(6.0).reshape(2, 3) / 5
    y = T.tanh(T.dot(W, x))
    u = T.dvector("u")
    lop = Lop(y, x, u)
    xv, uv = np.array([0.1, -0.2, 0.3]), np.array([1.0, -2.0])
    J = _numeric_jacobian(lambda a: np.tanh(W @ a), xv)
    np.testing.assert_allclose(run([x, u], lop, xv, uv), uv @ J, rtol=1e-6)
    lops = Lop([y, x * 2], [x], [u, T.ones_like(x)])
    assert isinstance(lops, list)


@pytest.mark.parametrize("use_op_rop", [True, False])
def test_rop_matches_jacobian(use_op_rop):
    x = T.dvector("x")
    a = T.dvector("a")
    W = np.arange(12.0).reshape(4, 3) / 7
    y = T.sigmoid(T.dot(W, x) * a.dimshuffle("x", 0).sum() + T.exp(x).sum()) ** 2
    v = T.dvector("v")
    rop = Rop(y, x, v, use_op_rop=use_op_rop)
    xv, av, vv = np.array([0.1, -0.2, 0.3]), np.array([0.5, 0.25]), np.array([1.0, 2.0, -1.0])
    f = symgpu.function([x, a], y)
    J = _numeric_jacobian(lambda t: f(t, av), xv)
    np.testing.assert_allclose(run([x, a, v], rop, xv, av, vv), J @ vv, rtol=1e-6, atol=1e-8)


def test_rop_falls_back_to_double_lop_for_ops_without_r_op():
    x = T.dmatrix("x")
    v = T.dmatrix("v")
    y = T.exp(x).max(axis=1) * T.nnet.softmax(x)[:, 0]  # Max has no R_op
    rop = Rop(y, x, v)
    xv = np.array([[0.1, 0.5, -0.3], [1.0, -1.0, 0.2]])
    vv = np.array([[1.0, 0.0, 2.0], [0.5, -1.0, 1.0]])
    f = symgpu.function([x], y)
    J = _numeric_jacobian(f, xv)
    expected = np.tensordot(J, vv, axes=2)
    np.testing.assert_allclose(run([x, v], rop, xv, vv), expected, rtol=1e-6, atol=1e-8)


def test_rop_broadcasting_elemwise():
    a, b = T.dvector("a"), T.dmatrix("b")
    y = a.dimshuffle("x", 0) * b
    va = T.dvector("va")
    r = Rop(y, a, va)
    av, bv, vv = np.array([1.0, 2.0]), np.arange(6.0).reshape(3, 2), np.array([0.5, -1.0])
    np.testing.assert_allclose(run([a, b, va], r, av, bv, vv), vv[None, :] * bv)


def test_rop_disconnected_output():
    x, z = T.dvector("x"), T.dvector("z")
    with pytest.raises(DisconnectedInputError):
        Rop(z * 2, x, T.dvector("v"))
    r = Rop(z * 2, x, T.dvector("v"), disconnected_outputs="ignore")
    np.testing.assert_array_equal(run([z], r, [1.0, 2.0]), [0.0, 0.0])


# --------------------------------------------------------------------------- jacobian / hessian

def _mlp(xv, labels):
    """A small MLP loss as a function of flat parameters (so jacobian/hessian are matrices)."""
    theta = T.dvector("theta")
    w1 = theta[:8].reshape((2, 4))
    b1 = theta[8:12]
    w2 = theta[12:20].reshape((4, 2))
    h = T.tanh(T.dot(xv, w1) + b1)
    p = T.nnet.softmax(T.dot(h, w2))
    # one-hot targets: the integer-label crossentropy op has no second derivative
    per_example = T.nnet.categorical_crossentropy(p, np.eye(2)[labels])
    return theta, per_example, per_example.mean()


def test_jacobian_and_hessian_of_mlp_loss_agree_with_finite_differences():
    rng = np.random.default_rng(0)
    xv = rng.normal(size=(5, 2))
    labels = np.array([0, 1, 1, 0, 1])
    theta, per_example, loss = _mlp(xv, labels)
    tv = rng.normal(size=20) * 0.5
    f_per, f_loss = symgpu.function([theta], per_example), symgpu.function([theta], loss)
    f_grad = symgpu.function([theta], grad(loss, theta))

    J = run([theta], jacobian(per_example, theta), tv)
    assert J.shape == (5, 20)
    np.testing.assert_allclose(J, _numeric_jacobian(f_per, tv), rtol=1e-5, atol=1e-7)

    H = run([theta], hessian(loss, theta), tv)
    assert H.shape == (20, 20)
    np.testing.assert_allclose(H, H.T, atol=1e-10)
    np.testing.assert_allclose(H, _numeric_jacobian(f_grad, tv), rtol=1e-5, atol=1e-7)
    # and the gradient itself against finite differences of the loss
    np.testing.assert_allclose(f_grad(tv), _numeric_jacobian(f_loss, tv), rtol=1e-5, atol=1e-8)


def test_jacobian_forms():
    x = T.dvector("x")
    W = T.dmatrix("W")
    y = T.tanh(T.dot(W, x))
    jx, jw = jacobian(y, [x, W])
    xv, wv = np.array([0.1, 0.2, 0.3]), np.arange(6.0).reshape(2, 3) / 10
    f = symgpu.function([x, W], [jx, jw])
    a, b = f(xv, wv)
    assert a.shape == (2, 3) and b.shape == (2, 2, 3)
    np.testing.assert_allclose(a, _numeric_jacobian(lambda t: np.tanh(wv @ t), xv), rtol=1e-6)
    np.testing.assert_allclose(b, _numeric_jacobian(lambda t: np.tanh(t @ xv), wv), rtol=1e-6)
    # the length is only known at run time: other lengths work with the same function
    a4, _ = f(np.ones(4) / 4, np.ones((3, 4)))
    assert a4.shape == (3, 4)
    # matrix-valued expression: shape expr.shape + wrt.shape
    M = run([x], jacobian(T.outer(x, x), x), xv)
    assert M.shape == (3, 3, 3)
    np.testing.assert_allclose(M, _numeric_jacobian(lambda t: np.outer(t, t), xv), atol=1e-8)
    # scalar expression: the gradient
    g = jacobian((x ** 2).sum(), x)
    np.testing.assert_allclose(run([x], g, xv), 2 * xv)
    # empty expression
    assert run([x], jacobian(x[:0] * 2, x), xv).shape == (0, 3)


def test_jacobian_disconnected_and_hessian_of_linear_cost():
    x, z = T.dvector("x"), T.dvector("z")
    with pytest.raises(DisconnectedInputError):
        jacobian(z * 2, x)
    H = run([x], hessian((x * 3.0).sum(), x), np.array([1.0, 2.0]))
    np.testing.assert_array_equal(H, np.zeros((2, 2)))
    hx, hy = hessian((x ** 3).sum() + (z ** 2).sum() * x.sum(), [x, z])
    a, b = run([x, z], [hx, hy], np.array([1.0, 2.0]), np.array([3.0]))
    np.testing.assert_allclose(a, np.diag([6.0, 12.0]))
    np.testing.assert_allclose(b, [[2 * 3.0]])


def test_jacobian_of_shared_parameters():
    w = symgpu.shared(np.array([0.5, -0.5]), name="w")
    x = T.dmatrix("x")
    y = T.sigmoid(T.dot(x, w))
    xv = np.array([[1.0, 2.0], [3.0, -1.0], [0.0, 1.0]])
    J = run([x], jacobian(y, w), xv)
    s = 1 / (1 + np.exp(-xv @ w.get_value()))
    np.testing.assert_allclose(J, (s * (1 - s))[:, None] * xv)


def test_gradient_of_gpu_typed_variables_keeps_their_type():
    """With device=cuda, float32 shared variables are GPU-typed; their gradients are too,
    zero gradients included (built through the host form)."""
    gpu_type = pytest.importorskip("symgpu.gpu.placement.type")
    rewriting = pytest.importorskip("symgpu.gpu.placement.rewriting")
    with symgpu.config.change_flags(floatX="float32"), rewriting.virtual_context(None):
        w = gpu_type.GpuArrayType("float32", (False,), None)("w")
        x = T.matrix("x")
        g = grad((T.dot(x, w) ** 2).sum(), w)
        assert g.type == w.type
        g2 = grad((T.dot(x, w) ** 2).sum() + (w ** 2).sum(), w)  # a sum of GPU terms
        assert g2.type == w.type
        z = grad(T.cast(T.gt(w, 0), "float32").sum(), w)
        assert z.type == w.type


def test_numeric_grad_of_a_fortran_ordered_point():
    """Perturbations reach the function however the point is laid out (reshape(-1) of a
    Fortran-ordered array copies, and the numeric gradient was all zeros)."""
    from symgpu.gradient import numeric_grad
    a = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    (g,) = numeric_grad(lambda x: (x ** 2).sum(), [a])
    assert np.allclose(g, 2 * a, atol=1e-5)
