"""Theano's `theano.compile.ops` names with no other symgpu name: `as_op` / `FromFunctionOp`,
`ViewOp` / `view_op`, `Rebroadcast` (symgpu/compile/python_ops.py), at Theano's path."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.compile.python_ops import FromFunctionOp, Rebroadcast, ViewOp, as_op, view_op


def _numpy_dot(a, b):
    return np.dot(a, b)


def _dot_shape(fgraph, node, shapes):
    return [(shapes[0][0], shapes[1][1])]


def test_as_op_wraps_numpy_code_with_declared_types_and_shapes():
    op = as_op(itypes=[T.dmatrix, T.dmatrix], otypes=[T.dmatrix],
               infer_shape=_dot_shape)(_numpy_dot)
    assert isinstance(op, FromFunctionOp)
    a, b = T.dmatrix("a"), T.dmatrix("b")
    out = op(a, b)
    av, bv = np.arange(6.0).reshape(2, 3), np.ones((3, 4))
    f = symgpu.function([a, b], [out * 2, out.shape])
    got, shape = f(av, bv)
    np.testing.assert_allclose(got, 2 * av @ bv)
    assert tuple(shape) == (2, 4)
    assert "FromFunctionOp{_numpy_dot}" in str(out.owner.op)
    assert pickle.loads(pickle.dumps(op)) == op          # by reference to the function


def test_as_op_checks_its_inputs_and_outputs():
    two = as_op([T.dvector], [T.dvector, T.dvector])(lambda x: (x, 2 * x))
    x = T.dvector("x")
    y, z = two(x)
    np.testing.assert_allclose(symgpu.function([x], z)(np.ones(3)), 2 * np.ones(3))
    with pytest.raises(TypeError, match="takes 1 inputs"):
        two(x, x)
    with pytest.raises(TypeError, match="expected"):
        two(T.imatrix("m"))
    bad = as_op([T.dvector], [T.dvector, T.dvector])(lambda x: (x,))
    with pytest.raises(ValueError, match="returned 1 outputs"):
        symgpu.function([x], bad(x)[0])(np.ones(2))


def test_view_op_is_the_identity_and_passes_the_gradient():
    x = T.dvector("x")
    y = view_op(x)
    assert isinstance(y.owner.op, ViewOp) and y.owner.op.view_map == {0: [0]}
    g = symgpu.grad((view_op(x) ** 2).sum(), x)
    f = symgpu.function([x], [y * 1, g])
    v = np.array([1.0, -2.0, 3.0])
    out, gv = f(v)
    np.testing.assert_allclose(out, v)
    np.testing.assert_allclose(gv, 2 * v)


def test_rebroadcast_sets_flags_checks_lengths_and_its_gradient_restores_them():
    x = T.dmatrix("x")
    y = Rebroadcast((0, True))(x)
    assert y.broadcastable == (True, False)
    assert str(y.owner.op) == "Rebroadcast{(0, True)}"
    f = symgpu.function([x], (y + T.ones((3, 4))).sum())
    assert f(np.ones((1, 4))) == 2 * 12
    with pytest.raises(ValueError, match="broadcastable"):
        f(np.ones((2, 4)))
    row = T.row("r", dtype="float64")
    z = Rebroadcast((0, False))(row)
    assert z.broadcastable == (False, False)
    g = symgpu.grad(z.sum(), row)
    assert g.broadcastable == row.broadcastable
    np.testing.assert_allclose(symgpu.function([row], g)(np.ones((1, 3))), np.ones((1, 3)))
    with pytest.raises(TypeError, match="pairs"):
        Rebroadcast(0)


def test_theano_path_serves_them():
    import symgpu.compile.ops as ops
    assert ops.as_op is as_op and ops.ViewOp is ViewOp and ops.Rebroadcast is Rebroadcast
    assert ops.FromFunctionOp is FromFunctionOp and ops.view_op is view_op
