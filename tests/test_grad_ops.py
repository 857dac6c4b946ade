"""verify_grad (float64, random points) for the gradient of every differentiable op.

Points for non-smooth functions (abs, rounding, max, clip, mod...) are drawn away from kinks,
so the finite differences see a smooth function.
"""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.gradient import GradientError, verify_grad


def R(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def U(shape, lo=-2.0, hi=2.0, seed=0):
    return R(seed).uniform(lo, hi, size=shape)


def away_from_zero(shape, seed=0):
    r = R(seed)
    return r.uniform(0.3, 2.0, size=shape) * r.choice([-1.0, 1.0], size=shape)


def off_integer(shape, seed=0):
    r = R(seed)
    return r.integers(-3, 3, size=shape) + r.uniform(0.1, 0.4, size=shape)


def check(fun, *points, **kw):
    verify_grad(fun, [np.asarray(p, dtype="float64") for p in points], rng=R(99), **kw)


# --------------------------------------------------------------------------- elementwise

UNARY = [
    ("exp", T.exp, lambda s: U(s)),
    ("expm1", T.expm1, lambda s: U(s)),
    ("exp2", T.exp2, lambda s: U(s)),
    ("log", T.log, lambda s: U(s, 0.5, 3)),
    ("log2", T.log2, lambda s: U(s, 0.5, 3)),
    ("log10", T.log10, lambda s: U(s, 0.5, 3)),
    ("log1p", T.log1p, lambda s: U(s, -0.5, 2)),
    ("sqrt", T.sqrt, lambda s: U(s, 0.5, 3)),
    ("sqr", T.sqr, lambda s: U(s)),
    ("reciprocal", T.reciprocal, lambda s: away_from_zero(s)),
    ("abs", T.abs, lambda s: away_from_zero(s)),
    ("sign", T.sign, lambda s: away_from_zero(s)),
    ("neg", T.neg, lambda s: U(s)),
    ("tanh", T.tanh, lambda s: U(s)),
    ("sigmoid", T.sigmoid, lambda s: U(s, -4, 4)),
    ("softplus", T.softplus, lambda s: U(s, -4, 4)),
    ("sin", T.sin, lambda s: U(s)),
    ("cos", T.cos, lambda s: U(s)),
    ("tan", T.tan, lambda s: U(s, -1, 1)),
    ("arctan", T.arctan, lambda s: U(s)),
    ("sinh", T.sinh, lambda s: U(s)),
    ("cosh", T.cosh, lambda s: U(s)),
    ("erf", T.erf, lambda s: U(s)),
    ("floor", T.floor, lambda s: off_integer(s)),
    ("ceil", T.ceil, lambda s: off_integer(s)),
    ("round", T.round, lambda s: off_integer(s)),
    ("identity", T.identity, lambda s: U(s)),
    ("operator -x", lambda x: -x, lambda s: U(s)),
    ("abs()", lambda x: abs(x), lambda s: away_from_zero(s)),
]


@pytest.mark.parametrize("name,fn,gen", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, fn, gen):
    check(fn, gen((3, 4)))


def test_unary_on_scalar_and_3d():
    check(T.tanh, U(()))
    check(lambda x: T.exp(x) * T.sin(x), U((2, 3, 2)))


BINARY = [
    ("add", lambda a, b: a + b, lambda s: U(s), lambda s: U(s, seed=1)),
    ("sub", lambda a, b: a - b, lambda s: U(s), lambda s: U(s, seed=1)),
    ("mul", lambda a, b: a * b, lambda s: U(s), lambda s: U(s, seed=1)),
    ("true_div", lambda a, b: a / b, lambda s: U(s), lambda s: away_from_zero(s, 1)),
    ("pow", lambda a, b: a ** b, lambda s: U(s, 0.5, 2), lambda s: U(s, -2, 2, 1)),
    ("maximum", T.maximum, lambda s: U(s), lambda s: U(s, seed=1)),
    ("minimum", T.minimum, lambda s: U(s), lambda s: U(s, seed=1)),
    # a/b kept away from integers: mod jumps there
    ("mod", lambda a, b: a % b, lambda s: np.full(s, 1.7) + U(s, 0, 0.2, 3),
     lambda s: np.full(s, 1.0) + U(s, 0, 0.1, 4)),
]


@pytest.mark.parametrize("name,fn,ga,gb", BINARY, ids=[b[0] for b in BINARY])
def test_binary(name, fn, ga, gb):
    check(fn, ga((3, 4)), gb((3, 4)))


@pytest.mark.parametrize("name,fn,ga,gb", BINARY, ids=[b[0] for b in BINARY])
def test_binary_broadcasting(name, fn, ga, gb):
    # a row, a column and a scalar against a matrix: gradients summed back to each shape
    check(lambda a, b: fn(a.dimshuffle("x", 0), b), ga((4,)), gb((3, 4)))
    check(lambda a, b: fn(a, b.dimshuffle(0, "x")), ga((3, 4)), gb((3,)))
    check(lambda a, b: fn(a, b), ga(()), gb((3, 4)))
    check(lambda a, b: fn(a, b), ga((2, 3, 4)), gb((4,)))  # vector padded to 3 dims


def test_nary_add_mul_and_python_numbers():
    check(lambda a, b, c: T.add(a, b, c), U((3,)), U((3,), seed=1), U((3,), seed=2))
    check(lambda a, b, c: T.mul(a, b, c), U((3,)), U((3,), seed=1), U((3,), seed=2))
    check(lambda a: 2 * a + 1 - a / 3.0 + a ** 2, U((4,)))
    check(lambda a: 1 / (1 + T.exp(-a)), U((4,)))


def test_pow_with_zero_base_gives_finite_exponent_grad():
    x, y = T.dvectors("x", "y") if hasattr(T, "dvectors") else (T.dvector("x"), T.dvector("y"))
    gy = symgpu.grad((x ** y).sum(), y)
    out = symgpu.function([x, y], gy)(np.array([0.0, 2.0]), np.array([2.0, 3.0]))
    assert np.all(np.isfinite(out))
    assert out[1] == pytest.approx(8 * np.log(2))


def test_switch_where_and_clip():
    cond = np.array([[True, False, True, False]] * 3)
    check(lambda a, b: T.switch(cond, a, b), U((3, 4)), U((3, 4), seed=1))
    check(lambda a, b: T.where(cond[0], a, b), U((3, 4)), U((4,), seed=1))
    check(lambda a, b: T.switch(T.gt(a, 0), a * b, b), away_from_zero((3, 4)), U((3, 4), seed=1))
    x = np.array([-1.7, -0.4, 0.2, 0.6, 1.3, 2.5])
    check(lambda a: T.clip(a, -0.5, 1.0), x)
    check(lambda a, lo, hi: T.clip(a, lo, hi), x, np.array(-0.5), np.array(1.0))


def test_relu_in_elemwise_form():
    check(lambda a: T.maximum(a, 0), away_from_zero((3, 4)))


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_max_min_gradient_masks_at_ties_and_nans(name):
    """A tie sends the gradient to the first input, a NaN to neither (as masks of the output
    compared with each input would), and the gradient graph does not read the output: a
    ReLU's backward pass reads z, not max(z, 0)."""
    a, b = T.dvector("a"), T.dvector("b")
    out = getattr(T, name)(a, b)
    ga, gb = symgpu.grad(T.sum(out * np.arange(1.0, 6.0)), [a, b])
    f = symgpu.function([a, b], [ga, gb])
    av = np.array([1.0, 2.0, 3.0, np.nan, 0.5])
    bv = np.array([1.0, 0.0, 4.0, 1.0, np.nan])
    w = np.arange(1.0, 6.0)
    ref = getattr(np, name)(av, bv)
    want_a = np.where((ref == av), w, 0.0)
    want_b = np.where((ref == bv) & ~(ref == av), w, 0.0)
    got_a, got_b = f(av, bv)
    np.testing.assert_array_equal(got_a, want_a)
    np.testing.assert_array_equal(got_b, want_b)
    z = T.dmatrix("z")
    relu = T.maximum(z, 0)
    gz = symgpu.grad(T.sum(relu * 3.0), z)
    masks = [n for n in symgpu.graph.basic.io_toposort([z], [gz])
             if getattr(getattr(n.op, "scalar_op", None), "name", None) in ("ge", "eq")]
    assert masks and all(relu not in n.inputs for n in masks), [str(n) for n in masks]


def test_cast_between_floats():
    check(lambda a: T.cast(a, "float32"), U((3,)))
    # float32 inside a float64 function: the step and tolerance must suit float32
    check(lambda a: T.cast(T.cast(a, "float32") * 2, "float64"), U((3,)), eps=1e-3,
          abs_tol=1e-3, rel_tol=1e-3)
    x = T.fvector("x")
    g = symgpu.grad(T.cast(x, "float64").sum(), x)
    assert g.dtype == "float32"


# --------------------------------------------------------------------------- reductions

@pytest.mark.parametrize("axis", [None, 0, 1, 2, (0, 2), (1, 2), -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_sum_mean(axis, keepdims):
    x = U((2, 3, 4))
    check(lambda a: a.sum(axis=axis, keepdims=keepdims) ** 2, x)
    check(lambda a: a.mean(axis=axis, keepdims=keepdims) ** 2, x)


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1)])
def test_prod(axis):
    check(lambda a: a.prod(axis=axis), U((3, 4), 0.5, 1.5))


def test_prod_with_zeros():
    x = U((3, 4), 0.5, 1.5)
    x[0, 1] = 0.0  # one zero in row 0 and in column 1
    x[2, 0] = x[2, 3] = 0.0  # two zeros in row 2
    for axis in (None, 0, 1):
        check(lambda a: a.prod(axis=axis), x)
    xs = T.dmatrix("x")
    g = symgpu.function([xs], symgpu.grad(xs.prod(axis=1).sum(), xs))(x)
    expected = np.array([[np.prod(np.delete(row, j)) for j in range(4)] for row in x])
    np.testing.assert_allclose(g, expected)


@pytest.mark.parametrize("red", ["max", "min"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 1)])
def test_max_min(red, axis):
    x = R(3).permutation(12).reshape(3, 4) / 3.0  # distinct values: no ties
    check(lambda a: getattr(a, red)(axis=axis) ** 2, x)


def test_max_gradient_goes_to_the_argmax():
    x = T.dmatrix("x")
    g = symgpu.function([x], symgpu.grad(x.max(axis=1).sum(), x))
    v = np.array([[1.0, 5.0, 2.0], [7.0, 0.0, -1.0]])
    np.testing.assert_array_equal(g(v), [[0, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("ddof", [0, 1])
def test_var_std(axis, ddof):
    x = U((3, 4))
    check(lambda a: a.var(axis=axis, ddof=ddof), x)
    check(lambda a: a.std(axis=axis, ddof=ddof), x)


# --------------------------------------------------------------------------- linear algebra

def test_dot_all_forms():
    m, v = U((3, 4)), U((4,), seed=1)
    check(lambda a, b: T.dot(a, b), m, v)
    check(lambda a, b: T.dot(a, b), U((3,), seed=2), m)
    check(lambda a, b: T.dot(a, b), v, U((4,), seed=3))
    check(lambda a, b: T.dot(a, b), m, U((4, 2), seed=4))
    check(lambda a, b: a @ b, m, U((4, 2), seed=4))
    check(lambda a, b: T.dot(a, 2.0).sum() + T.dot(a, b), m, U((4, 2), seed=4))


def test_outer():
    check(T.outer, U((3,)), U((4,), seed=1))


def test_matmul_batched_and_broadcast():
    check(lambda a, b: a @ b, U((2, 3, 4)), U((2, 4, 2), seed=1))
    check(lambda a, b: a @ b, U((2, 3, 4)), U((4, 2), seed=1))
    check(lambda a, b: a @ b, U((3, 4)), U((2, 4, 2), seed=1))
    check(lambda a, b: a @ b, U((4,)), U((2, 4, 2), seed=1))
    check(lambda a, b: a @ b, U((2, 3, 4)), U((4,), seed=1))


def test_matmul_of_batches_broadcast_on_one_side():
    """The folded products (dims declared broadcast on one side only, math._folded_matmul)."""
    check(lambda a, b: a @ b.dimshuffle(0, "x", 1, 2), U((2, 3, 4, 5)), U((2, 5, 3), seed=1))
    check(lambda a, b: a.dimshuffle(0, "x", 1, 2) @ b.dimshuffle("x", 0, 1, 2),
          U((2, 4, 5)), U((3, 5, 2), seed=1))
    check(lambda a, b: a @ b, U((2, 3, 4, 5)), U((3, 5, 2), seed=1))


@pytest.mark.parametrize("axes", [1, 2, [[1], [0]], [[0, 2], [1, 0]]])
def test_tensordot(axes):
    a = U((3, 4, 2))
    b = {1: U((2, 5), seed=1), 2: U((4, 2, 3), seed=1)}.get(axes if isinstance(axes, int) else 0)
    if isinstance(axes, list):
        b = U((4, 5), seed=1) if axes == [[1], [0]] else U((2, 3, 5), seed=1)
    check(lambda x, y: T.tensordot(x, y, axes), a, b)


# --------------------------------------------------------------------------- shapes

def test_dimshuffle_transpose():
    x = U((2, 3, 4))
    check(lambda a: a.dimshuffle(2, 0, 1) * np.arange(24.0).reshape(4, 2, 3), x)
    check(lambda a: a.dimshuffle(0, "x", 1, 2, "x").sum(axis=(1, 4)), x)
    check(lambda a: a.T, U((3, 4)))
    check(lambda a: T.transpose(a, (1, 2, 0)), x)


def test_dimshuffle_dropping_broadcastable_dims():
    x = T.TensorType("float64", (False, True))("x")
    y = x.dimshuffle(0) * 3
    g = symgpu.grad(y.sum(), x)
    assert g.broadcastable == x.broadcastable
    np.testing.assert_array_equal(symgpu.function([x], g)(np.ones((3, 1))), np.full((3, 1), 3.0))


def test_reshape_flatten():
    x = U((2, 3, 4))
    check(lambda a: a.reshape((6, 4)) * np.arange(24.0).reshape(6, 4), x)
    check(lambda a: a.reshape((4, -1)), x)
    check(lambda a: T.reshape(a, (a.shape[0], -1)) ** 2, x)
    check(lambda a: a.flatten() ** 2, x)
    check(lambda a: a.flatten(2) ** 2, x)


def test_concatenate_stack():
    a, b = U((2, 3)), U((4, 3), seed=1)
    check(lambda x, y: T.concatenate([x, y], axis=0) ** 2, a, b)
    check(lambda x, y: T.concatenate([x, y.T], axis=1) ** 2, a, U((5, 2), seed=2))
    check(lambda x, y: T.concatenate([x, y, x], axis=0) ** 2, a, b)  # same input twice
    for axis in (0, 1, 2, -1):
        check(lambda x, y: T.stack([x, y], axis=axis) ** 2, a, U((2, 3), seed=3))
    check(lambda x, y: T.stack([x, y]) * np.arange(2.0), U(()), U((), seed=1))


# --------------------------------------------------------------------------- indexing

def test_basic_indexing():
    x = U((4, 5))
    check(lambda a: a[1] ** 2, x)
    check(lambda a: a[1:3] ** 2, x)
    check(lambda a: a[::-1, 1:] ** 2, x)
    check(lambda a: a[:, 2] ** 2, x)
    check(lambda a: a[-1, -2] ** 2, x)
    check(lambda a: a[None, 1:3, None] ** 2, x)
    check(lambda a: a[::2, ::3] * 2 + a[1:3].sum(), x)


def test_advanced_indexing_with_repeats():
    x = U((4, 5))
    idx = np.array([0, 2, 2, 3, 0])
    check(lambda a: a[idx] ** 2, x)
    check(lambda a: a[idx, 1:] ** 2, x)
    check(lambda a: a[:, [4, 4, 0]] ** 2, x)
    check(lambda a: a[[0, 1, 1], [2, 3, 3]] ** 2, x)
    v = T.dmatrix("v")
    g = symgpu.function([v], symgpu.grad(v[[1, 1, 1]].sum(), v))(x)
    assert g[1].tolist() == [3.0] * 5 and g.sum() == 15


def test_boolean_mask_indexing():
    x = U((4, 5))
    mask = x > 0
    check(lambda a: a[mask] ** 2, x)
    check(lambda a: a[T.gt(a, 0)] ** 2, x)


def test_set_and_inc_subtensor():
    x, y = U((4, 5)), U((2, 5), seed=1)
    check(lambda a, b: T.set_subtensor(a[1:3], b) ** 2, x, y)
    check(lambda a, b: T.inc_subtensor(a[1:3], b) ** 2, x, y)
    check(lambda a, b: T.set_subtensor(a[:, 1], b) ** 2, x, U((4,), seed=2))
    check(lambda a, b: T.inc_subtensor(a[1:3, 2], b) ** 2, x, U((), seed=2))  # broadcast value
    idx = np.array([0, 2, 2])
    check(lambda a, b: T.inc_subtensor(a[idx], b) ** 2, x, U((3, 5), seed=3))
    check(lambda a, b: T.set_subtensor(a[[0, 3]], b) ** 2, x, U((2, 5), seed=3))


# --------------------------------------------------------------------------- nnet

def test_softmax_log_softmax():
    x = U((3, 4))
    w = np.arange(12.0).reshape(3, 4)
    check(lambda a: T.nnet.softmax(a) * w, x)
    check(lambda a: T.nnet.softmax(a, axis=0) * w, x)
    check(lambda a: T.nnet.log_softmax(a) * w, x)
    check(lambda a: T.nnet.log_softmax(a, axis=0) * w, x)
    check(lambda a: T.nnet.softmax(a) * np.arange(4.0), U((4,)))


def test_crossentropies():
    check(lambda a, t: T.nnet.binary_crossentropy(T.nnet.sigmoid(a), t), U((3, 4)),
          U((3, 4), 0.1, 0.9, 1))
    labels = np.array([2, 0, 3])
    check(lambda a: T.nnet.categorical_crossentropy(T.nnet.softmax(a), labels), U((3, 4)))
    check(lambda a: T.nnet.categorical_crossentropy(T.nnet.softmax(a), np.eye(4)[labels]),
          U((3, 4)))
    check(lambda p: T.nnet.categorical_crossentropy(p, labels), U((3, 4), 0.2, 0.9))
    check(lambda a: T.nnet.relu(a) + T.nnet.relu(a, 0.1) * 2, away_from_zero((3, 4)))


def test_mlp_loss():
    w1, b1 = U((4, 5)), U((5,), seed=1)
    w2 = U((5, 3), seed=2)
    xv = U((6, 4), seed=3)
    labels = np.array([0, 2, 1, 1, 0, 2])

    def loss(w1_, b1_, w2_):
        h = T.tanh(T.dot(xv, w1_) + b1_)
        p = T.nnet.softmax(T.dot(h, w2_))
        return T.nnet.categorical_crossentropy(p, labels).mean() + 0.01 * (w1_ ** 2).sum()

    check(loss, w1, b1, w2)


# --------------------------------------------------------------------------- verify_grad itself

def test_verify_grad_reports_a_wrong_gradient():
    from symgpu.graph.basic import Apply
    from symgpu.graph.op import Op

    class BadDouble(Op):
        __props__ = ()

        def make_node(self, x):
            x = T.as_tensor_variable(x)
            return Apply(self, [x], [x.type()])

        def perform(self, node, inputs, out):
            out[0][0] = inputs[0] * 2

        def grad(self, inputs, output_grads):
            return [output_grads[0] * 3]  # wrong: should be 2

    with pytest.raises(GradientError) as info:
        verify_grad(BadDouble(), [U((2, 3))], rng=R(1))
    err = info.value
    assert err.arg == 0 and len(err.err_pos) == 2
    assert err.val1 == pytest.approx(1.5 * err.val2)
    text = str(err)
    for word in ("input 0", "analytic", "numeric", "abs error", "rel error"):
        assert word in text


def test_verify_grad_float32_tolerances_and_dtype_check():
    verify_grad(lambda a: T.exp(a) * a, [U((3,)).astype("float32")], rng=R(2))
    with pytest.raises(TypeError, match="floating-point"):
        verify_grad(lambda a: a * 2, [np.arange(3)])


def test_verify_grad_multiple_outputs():
    verify_grad(lambda a, b: [a * b, T.exp(a)], [U((3,)), U((3,), seed=1)], rng=R(3))
