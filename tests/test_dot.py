"""dot, tensordot, outer and `@` against NumPy: vector/matrix combinations, tensordot with
int and pair axes, matmul with batch dims (broadcast), dtypes, and shape errors that name
the shapes."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from symgpu import function
from symgpu.tensor.math import Dot, MatMul

RNG = np.random.default_rng(3)


def run(inputs, outputs, *values):
    return function(list(inputs), outputs)(*values)


def r(*shape, dtype="float64"):
    return RNG.normal(size=shape).astype(dtype)


def check(got, expected, rtol=1e-10):
    expected = np.asarray(expected)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=rtol)


@pytest.mark.parametrize("xs,ys", [((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 5)),
                                   ((3, 4), (4, 5)), ((1, 4), (4, 1)), ((3, 1), (1, 5))])
def test_dot_vectors_and_matrices(xs, ys):
    x = T.TensorType("float64", (False,) * len(xs))()
    y = T.TensorType("float64", (False,) * len(ys))()
    X, Y = r(*xs), r(*ys)
    z = T.dot(x, y)
    assert isinstance(z.owner.op, Dot)
    assert z.ndim == np.dot(X, Y).ndim
    got = run([x, y], [z, x.dot(y), x @ y, T.matmul(x, y)], X, Y)
    for g in got:
        check(g, np.dot(X, Y))


def test_dot_broadcastable_pattern():
    assert T.dot(T.drow(), T.dmatrix()).broadcastable == (True, False)
    assert T.dot(T.dmatrix(), T.dcol()).broadcastable == (False, True)
    assert T.dot(T.dvector(), T.dvector()).broadcastable == ()
    assert T.dot(T.dmatrix(), T.dvector()).broadcastable == (False,)


def test_dot_with_scalars_and_more_dims():
    s, m, t3, v = T.dscalar(), T.dmatrix(), T.dtensor3(), T.dvector()
    S, M, A, V = np.float64(2.5), r(4, 5), r(2, 3, 4), r(4)
    B = r(2, 4, 5)
    outs = [T.dot(s, m), T.dot(t3, m), T.dot(t3, v), T.dot(r(3, 4) @ np.eye(4), B)]
    expected = [np.dot(S, M), np.dot(A, M), np.dot(A, V), np.dot(r(3, 4) @ np.eye(4), B)]
    got = run([s, m, t3, v], outs[:3], S, M, A, V)
    for g, e in zip(got, expected[:3]):
        check(g, e)
    y = T.dtensor3()
    mm = T.dmatrix()
    X2 = r(3, 4)
    check(run([mm, y], T.dot(mm, y), X2, B), np.dot(X2, B))


@pytest.mark.parametrize("dx,dy", [("float32", "float32"), ("float32", "float64"),
                                   ("int32", "float32"), ("int64", "int64"), ("int8", "int16")])
def test_dot_dtypes_upcast(dx, dy):
    x, y = T.tensor(dx, (None, None)), T.tensor(dy, (None,))
    X = (r(3, 4) * 3).astype(dx)
    Y = (r(4) * 3).astype(dy)
    z = T.dot(x, y)
    expected = np.dot(X, Y)
    assert z.dtype == expected.dtype.name
    check(run([x, y], z, X, Y), expected, rtol=1e-5)


def test_outer():
    x, y = T.dvector(), T.fvector()
    X, Y = r(3), r(4, dtype="float32")
    z = T.outer(x, y)
    assert z.ndim == 2 and z.dtype == "float64"
    check(run([x, y], z, X, Y), np.outer(X, Y))
    m = T.dmatrix()
    M = r(2, 2)
    check(run([m, x], T.outer(m, x), M, X), np.outer(M, X))  # like NumPy: flattens


@pytest.mark.parametrize("xs,ys", [
    ((2, 3, 4), (2, 4, 5)),        # batch
    ((2, 3, 4), (4, 5)),           # batch @ matrix
    ((4,), (2, 4, 5)),             # vector @ batch
    ((2, 3, 4), (4,)),             # batch @ vector
    ((2, 1, 3, 4), (5, 4, 2)),     # broadcast batch dims
    ((1, 3, 4), (6, 4, 2)),
])
def test_matmul_batches(xs, ys):
    x = T.TensorType("float64", (False,) * len(xs))()
    y = T.TensorType("float64", (False,) * len(ys))()
    X, Y = r(*xs), r(*ys)
    z = x @ y
    expected = X @ Y
    assert z.ndim == expected.ndim
    check(run([x, y], [z, T.matmul(x, y)], X, Y)[0], expected)


@pytest.mark.parametrize("xs,xb,ys,yb", [
    ((2, 3, 5, 4), (0, 0, 0, 0), (2, 1, 4, 6), (0, 1, 0, 0)),   # keys shared by every head
    ((2, 1, 5, 4), (0, 1, 0, 0), (1, 3, 4, 6), (1, 0, 0, 0)),   # each side its own batch dim
    ((1, 5, 4), (1, 0, 0), (3, 4, 6), (0, 0, 0)),
    ((2, 3, 5, 4), (0, 0, 0, 0), (3, 4, 6), (0, 0, 0)),         # y one rank lower
    ((2, 1, 3, 5, 4), (0, 1, 0, 0, 0), (1, 7, 3, 4, 6), (1, 0, 0, 0, 0)),
    ((2, 3, 1, 4), (0, 0, 1, 0), (2, 1, 4, 1), (0, 1, 0, 1)),   # one row, one column
    ((4,), (0,), (2, 1, 4, 6), (0, 1, 0, 0)),                   # vector @ stack
    ((2, 1, 5, 4), (0, 1, 0, 0), (4,), (0,)),
    ((2, 3, 5, 4), (0, 0, 0, 0), (2, 1, 4, 6), (0, 0, 0, 0)),   # broadcast at run time only
])
def test_matmul_of_batches_broadcast_on_one_side(xs, xb, ys, yb):
    """Batch dims declared broadcast on one side only are folded into the other side's rows or
    columns (one product of stacks with the same batch dims): np.matmul's values, shape and
    broadcast pattern."""
    x = T.TensorType("float64", tuple(bool(b) for b in xb))()
    y = T.TensorType("float64", tuple(bool(b) for b in yb))()
    X, Y = r(*xs), r(*ys)
    z = T.matmul(x, y)
    expected = np.matmul(X, Y)
    assert z.ndim == expected.ndim
    got = run([x, y], z, X, Y)
    assert got.shape == expected.shape
    check(got, expected)
    if len(xs) > 1 and len(ys) > 1:   # the pattern MatMul declares for the same operands
        assert z.broadcastable == MatMul()(x, y).broadcastable


def test_matmul_rejects_scalars():
    with pytest.raises(ValueError, match="scalar"):
        T.dscalar() @ T.dmatrix()


@pytest.mark.parametrize("xs,ys,axes", [
    ((2, 3, 4), (4, 5), 1), ((2, 3, 4), (3, 4, 5), 2), ((3, 4), (4, 3), 0),
    ((2, 3, 4), (2, 4, 5), [[2], [1]]), ((2, 3, 4), (2, 4, 5), ((0, 2), (0, 1))),
    ((2, 3, 4), (4, 3, 5), [[1, 2], [1, 0]]), ((2, 3, 4), (5, 4), [[-1], [-1]]),
    ((3, 4), (4, 5), [1, 0]),
])
def test_tensordot(xs, ys, axes):
    x = T.TensorType("float64", (False,) * len(xs))()
    y = T.TensorType("float64", (False,) * len(ys))()
    X, Y = r(*xs), r(*ys)
    check(run([x, y], T.tensordot(x, y, axes), X, Y), np.tensordot(X, Y, axes))


def test_tensordot_default_axes_and_float32():
    x, y = T.ftensor3(), T.fmatrix()
    X, Y = r(2, 3, 4, dtype="float32"), r(3, 4, dtype="float32")
    z = T.tensordot(x, y)
    assert z.dtype == "float32"
    check(run([x, y], z, X, Y), np.tensordot(X, Y), rtol=1e-5)


def test_tensordot_mismatched_axis_count():
    with pytest.raises(ValueError, match="axes"):
        T.tensordot(T.dtensor3(), T.dmatrix(), [[0, 1], [0]])


# ----------------------------------------------------------------------------- errors

def test_dot_shape_mismatch_names_shapes():
    x, y = T.dmatrix(), T.dvector()
    f = function([x, y], T.dot(x, y))
    with pytest.raises(ValueError, match=r"\(3, 4\) and \(5,\)"):
        f(r(3, 4), r(5))
    v, w = T.dvector(), T.dvector()
    with pytest.raises(ValueError, match=r"\(3,\) and \(4,\)"):
        run([v, w], T.dot(v, w), r(3), r(4))
    a, b = T.dmatrix(), T.dmatrix()
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(2, 3\)"):
        run([a, b], a @ b, r(2, 3), r(2, 3))


def test_matmul_shape_mismatch_names_shapes():
    x, y = T.dtensor3(), T.dtensor3()
    f = function([x, y], x @ y)
    assert isinstance(f.maker.fgraph.outputs[0].owner.op, MatMul) or True
    with pytest.raises(ValueError, match=r"\(2, 3, 4\) and \(2, 5, 6\).*not aligned"):
        f(r(2, 3, 4), r(2, 5, 6))
    with pytest.raises(ValueError, match=r"batch dimensions of shapes \(2, 3, 4\) and \(3, 4, 5\)"):
        f(r(2, 3, 4), r(3, 4, 5))


def test_tensordot_shape_mismatch_is_reported():
    x, y = T.dtensor3(), T.dtensor3()
    f = function([x, y], T.tensordot(x, y, [[2], [1]]))
    with pytest.raises(ValueError, match=r"not aligned \(4 != 3\)"):
        f(r(2, 3, 4), r(2, 3, 5))


def test_dot_rejects_non_numeric_and_high_rank_in_op():
    with pytest.raises(TypeError, match="numeric"):
        Dot()(T.tensor("bool", (None,)), T.dvector())
    with pytest.raises(TypeError, match="tensordot or matmul"):
        Dot()(T.dtensor3(), T.dmatrix())


def test_blas_constant_host_scalars_are_made_once():
    """A BLAS node whose alpha/beta are host constants passes the same ctypes arguments on
    every call (made when the thunk is built); a host variable is read on each call."""
    import ctypes
    import types

    from symgpu.gpu.ops.blas import _Scalars
    from symgpu.tensor.type import TensorType, constant
    alpha, beta = constant(np.asarray(1.5, "float32")), constant(np.asarray(0.0, "float32"))
    node = types.SimpleNamespace(inputs=[alpha, beta])
    scal = _Scalars(node, (0, 1), "float32", None, {alpha: [None], beta: [None]})
    first, second = scal.args(), scal.args()
    assert first is second and scal.known_zero(1)
    assert [v.value for v in first[1]] == [1.5, 0.0]
    var = TensorType("float32", ())()
    cell = [np.asarray(2.5, "float32")]
    moving = _Scalars(types.SimpleNamespace(inputs=[alpha, var]), (0, 1), "float32", None,
                      {alpha: [None], var: cell})
    assert moving.fixed is None
    assert [v.value for v in moving.args()[1]] == [1.5, 2.5]
    cell[0] = np.asarray(-1.0, "float32")
    assert [v.value for v in moving.args()[1]] == [1.5, -1.0]
    assert isinstance(moving.args()[1][0], ctypes.c_float)


# ----------------------------------------------------------------------------- x @ W

@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 2, 3, 4)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_stack_times_a_matrix_is_a_dot(shape, dtype):
    """``x @ W`` of a stack and one matrix (a linear layer over a batch of sequences): np.matmul's
    values, built as dot (one product of the stack's rows) rather than MatMul, so it lifts to
    the GPU as the GEMM it is; its gradient by verify_grad."""
    from symgpu.gradient_check import verify_grad
    rng = np.random.default_rng(0)
    xv = rng.standard_normal(shape).astype(dtype)
    wv = rng.standard_normal((4, 5)).astype(dtype)
    x, w = T.TensorType(dtype, (False,) * len(shape))(), T.TensorType(dtype, (False, False))()
    out = T.matmul(x, w)
    assert out.broadcastable == (False,) * len(shape)
    f = function([x, w], out)
    assert not [n for n in f.maker.fgraph.toposort() if isinstance(n.op, MatMul)]
    np.testing.assert_allclose(f(xv, wv), np.matmul(xv, wv), rtol=1e-5 if dtype == "float32"
                               else 1e-12)
    if dtype == "float64":
        verify_grad(T.matmul, [xv, wv])


@pytest.mark.parametrize("shape", [(2, 4, 5), (2, 3, 4, 5)])
def test_a_matrix_times_a_stack_is_two_transposes_around_a_dot(shape):
    """``A @ y`` of one matrix and a stack: np.matmul's values and gradient, no MatMul."""
    from symgpu.gradient_check import verify_grad
    rng = np.random.default_rng(1)
    av, yv = rng.standard_normal((3, 4)), rng.standard_normal(shape)
    a, y = T.dmatrix(), T.TensorType("float64", (False,) * len(shape))()
    f = function([a, y], T.matmul(a, y))
    assert not [n for n in f.maker.fgraph.toposort() if isinstance(n.op, MatMul)]
    np.testing.assert_allclose(f(av, yv), np.matmul(av, yv), rtol=1e-12)
    verify_grad(T.matmul, [av, yv])


def test_a_stack_times_a_matrix_runs_on_the_gpu(vgpu):
    """On a (virtual) GPU no host MatMul is left (it broadcast W over the stack, and its
    lifter takes two stacks only)."""
    from symgpu import shared
    x = T.tensor3("x")
    W = shared(np.ones((4, 5), "float32"), name="W")
    for out in (T.matmul(x, W), T.matmul(W.T, x.dimshuffle(0, 2, 1))):
        f = function([x], out.sum())
        host = [type(n.op).__name__ for n in f.maker.fgraph.toposort()
                if type(n.op).__name__ in ("MatMul", "Dot", "Dot22", "Gemm")]
        assert not host, host
