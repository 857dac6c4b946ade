"""Theano's theano.tensor names that tensor/tests/test_basic.py imports (issue 31):
symgpu/tensor/theano_basic.py, symgpu/tensor/inplace.py, T.scal, T.opt."""
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.gradient_check import verify_grad


def _f(ins, outs):
    return symgpu.function(ins, outs)


def test_tensor_from_scalar_and_back_are_0d_copies():
    s = T.dscalar()
    t = T.tensor_from_scalar(s)
    assert t.owner.op is T.tensor_from_scalar and isinstance(t.owner.op, T.TensorFromScalar)
    u = T.scalar_from_tensor(t)
    assert isinstance(u.owner.op, T.ScalarFromTensor)
    assert _f([s], u)(2.5) == 2.5
    assert _f([s], T.grad(T.tensor_from_scalar(s) * 3, s))(1.0) == 3.0
    with pytest.raises(TypeError, match="must be a scalar"):
        T.tensor_from_scalar(T.dvector())


def test_default_picks_x_unless_none():
    x, y = T.dscalar(), T.dscalar()
    z = T.default(x, y)
    node = z.owner
    assert node.op.perform(node, [np.array(1.0), np.array(2.0)], [[None]]) is None
    out = [[None]]
    node.op.perform(node, [None, np.array(2.0)], out)
    assert out[0][0] == 2.0
    assert _f([x, y], z)(1.0, 2.0) == 1.0
    assert _f([x], T.default(x, 3.8))(4.0) == 4.0


def test_permute_row_elements_and_inverse():
    rng = np.random.default_rng(0)
    x = T.dmatrix()
    p = T.ivector()
    xv = rng.standard_normal((3, 5))
    pv = rng.permutation(5).astype("int32")
    assert np.array_equal(_f([x, p], T.permute_row_elements(x, p))(xv, pv), xv[:, pv])
    inv = _f([p], T.inverse_permutation(p))(pv)
    assert np.array_equal(inv, np.argsort(pv)) and inv.dtype == np.int32
    back = T.permute_row_elements(T.permute_row_elements(x, p), p, inverse=True)
    assert np.allclose(_f([x, p], back)(xv, pv), xv)
    pm = T.imatrix()
    pmv = np.stack([rng.permutation(5) for _ in range(3)]).astype("int32")
    v = T.dvector()
    got = _f([v, pm], T.permute_row_elements(v, pm))(xv[0], pmv)
    assert np.array_equal(got, xv[0][pmv])
    with pytest.raises(ValueError, match="not permutations"):
        _f([x, p], T.permute_row_elements(x, p))(xv, np.zeros(5, "int32"))
    verify_grad(lambda a: T.permute_row_elements(a, pv), [xv], rng=np.random.RandomState(1))
    assert isinstance(T.permute_row_elements(x, p).owner.op, T.PermuteRowElements)


def test_split_op_and_gradient():
    x = T.dmatrix()
    sp = T.lvector()
    a, b = T.Split(2)(x, 1, sp)
    xv = np.arange(12.).reshape(3, 4)
    ra, rb = _f([x, sp], [a, b])(xv, np.array([1, 3]))
    assert np.array_equal(ra, xv[:, :1]) and np.array_equal(rb, xv[:, 1:])
    with pytest.raises(ValueError, match="do not add up"):
        _f([x, sp], [a, b])(xv, np.array([1, 1]))
    parts = T.split(x, [2, 1], 2, axis=0)
    assert isinstance(parts[0].owner.op, T.Split)
    verify_grad(lambda m: T.split(m, [2, 1], 2)[1] * 2, [xv], rng=np.random.RandomState(0))


def test_alloc_empty_shape_dtype_not_folded():
    f = _f([], T.AllocEmpty("float32")(2, 3))
    out = f()
    assert out.shape == (2, 3) and out.dtype == np.float32
    assert len(f.maker.fgraph.apply_nodes) == 1


def test_rebroadcast_is_one_class_at_both_paths():
    from symgpu.compile.python_ops import Rebroadcast
    assert T.Rebroadcast is Rebroadcast
    y = T.Rebroadcast((0, True))(T.dmatrix())
    assert y.broadcastable == (True, False)


def test_none_const_and_extract_constant():
    assert T.NoneConst.data is None and str(T.NoneConst.type) == "none"
    with pytest.raises(TypeError):
        T.NoneConst.type.filter(3)
    x = T.dmatrix()
    v, i = T.MaxAndArgmax(T.NoneConst.clone())(x)
    xv = np.array([[1.0, 5.0], [7.0, 2.0]])
    got = _f([x], [v, i])(xv)
    assert got[0] == 7.0 and got[1] == 2
    c = T.constant(3)
    d = T.extract_constant(c)
    d.data += 1
    assert T.extract_constant(c).data == 3
    assert c.data == 3 and d is not c
    x = T.dvector()
    assert T.extract_constant(x) is x
    assert T.extract_constant(T.constant(2.0) * 3).data == 6.0


def test_function_class_names_build_our_graphs():
    x = T.dmatrix()
    xv = np.arange(6.).reshape(2, 3)
    mx, am = T.MaxAndArgmax(1)(x)
    r = _f([x], [mx, am])(xv)
    assert np.array_equal(r[0], xv.max(1)) and np.array_equal(r[1], xv.argmax(1))
    assert np.allclose(_f([x], T.Mean(None)(x))(xv), xv.mean())
    reps = T.ivector()
    v = T.dvector()
    assert np.array_equal(_f([v, reps], T.Tile(1)(v, reps))(xv[0], np.array([2], "int32")),
                          np.tile(xv[0], 2))
    assert np.array_equal(_f([], T.Tri("float64")(3, 4, 1))(), np.tri(3, 4, 1))
    a = T.ivector()
    got = _f([a, x], T.Choose("raise")(a, x))(np.array([1, 0, 1], "int32"), xv)
    assert np.array_equal(got, np.choose([1, 0, 1], xv))
    assert not isinstance(T.dot(x, x.T).owner.op, T.Mean)


def test_small_aliases():
    assert T.Tensor is T.TensorType
    x = T.dvector()
    y = T.tensor_copy(x)
    assert y.owner.inputs[0] is x
    assert np.array_equal(_f([x], T.power(x, 3))(np.array([2.0])), [8.0])
    import symgpu.scalar
    assert T.scal is symgpu.scalar
    assert T.opt.MakeVector is T.MakeVector


def test_inplace_functions_overwrite_their_first_input():
    from symgpu.tensor import inplace
    x = T.dvector()
    y = inplace.exp_inplace(x)
    assert y.owner.op.destroy_map == {0: [0]}
    assert np.allclose(_f([x], y)(np.array([0.0, 1.0])), [1.0, np.e])
    a, b = T.dvector(), T.dvector()
    assert np.array_equal(_f([a, b], inplace.add_inplace(a, b))(np.ones(2), np.ones(2)), [2, 2])
    assert np.array_equal(_f([a], inplace.abs__inplace(a))(np.array([-1.0])), [1.0])
    with pytest.raises(TypeError, match="in place"):
        inplace.true_div_inplace(T.ivector(), T.ivector())


def test_ceil_intdiv():
    a, b = T.ivector(), T.ivector()
    av = np.array([7, -7, 6, 1], "int32")
    bv = np.array([2, 2, 3, -2], "int32")
    got = _f([a, b], T.ceil_intdiv(a, b))(av, bv)
    assert np.array_equal(got, (av // bv) + ((av % bv) != 0)) and got.dtype == np.int32
