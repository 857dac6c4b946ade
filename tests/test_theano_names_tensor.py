"""Theano's documented names made present by issue 31's names-tensor set: theano.tensor.opt,
theano.tensor.extra_ops, theano.tensor.nnet.abstract_conv, theano.gof.type,
theano.gof.params_type, theano.compile.ops, theano.tensor.raw_random,
theano.sandbox.rng_mrg and theano.tensor.io, each exercised for Theano's behaviour (reached
through Theano's paths, as code written for Theano reaches them)."""
from __future__ import annotations

import importlib
import pickle
import warnings

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import InconsistencyError


def theano(path: str):
    """Theano's module `path` (``theano.X``) through the path layer."""
    return importlib.import_module("symgpu" + path[len("theano"):])


def rng(seed=0):
    return np.random.default_rng(seed)


def op_types(f):
    return [type(n.op).__name__ for n in f.maker.fgraph.toposort()]


# ============================================================================ theano.gof.type

def test_generic_holds_any_object_and_is_a_singleton():
    gt = theano("theano.gof.type")
    assert gt.Generic() is gt.generic and gt.Generic() == gt.generic
    obj = {"a": [1, 2]}
    assert gt.generic.filter(obj) is obj and gt.generic.is_valid_value(object())
    v = gt.generic("g")
    assert v.type == gt.generic and str(gt.generic) == "Generic"
    assert pickle.loads(pickle.dumps(gt.generic)) == gt.generic


def test_singleton_type_subclasses_are_distinct_singletons():
    gt = theano("theano.gof.type")

    class A(gt.SingletonType):
        pass

    class B(A):
        pass
    assert A() is A() and B() is B() and A() != B() and hash(A()) == hash(type(A()))
    assert str(B()) == "B"


def test_pure_type_is_the_base_of_types():
    gt = theano("theano.gof.type")
    assert isinstance(T.dmatrix, gt.PureType) and isinstance(gt.generic, gt.PureType)
    assert T.dmatrix.is_valid_value(np.zeros((2, 2))) and not T.dmatrix.is_valid_value(1)


def test_enum_type_constants_aliases_and_filter():
    gt = theano("theano.gof.type")
    enum = gt.EnumType(CONSTANT_1=1, CONSTANT_2=2.5, CONSTANT_3=False, CONSTANT_4=True)
    assert (enum.CONSTANT_1, enum.CONSTANT_2, enum.CONSTANT_3, enum.CONSTANT_4) == (1, 2.5, 0, 1)
    assert enum.ctype == "double" and enum.cname == "double"
    e = gt.EnumType(A=("alpha", 1), B=("beta", 2), C=3, D=("delta", 4), ctype="size_t")
    assert e.fromalias("alpha") == 1 and e.fromalias("C") == 3 and e.has_alias("beta")
    assert e.get_aliases() == ("alpha", "beta", "delta")
    assert e.filter("delta", strict=False) == 4 and e.filter(3) == 3
    with pytest.raises(TypeError):
        e.filter(7)
    with pytest.raises((TypeError, KeyError)):
        e.filter("delta", strict=True)
    assert repr(e) == "EnumType<size_t>(A(alpha):1, B(beta):2, C:3, D(delta):4)"
    with pytest.raises(AttributeError):
        gt.EnumType(lower=1)
    with pytest.raises(TypeError):
        gt.EnumType(A="x")
    with pytest.raises(AttributeError):
        e.A = 5
    with pytest.raises(TypeError):
        e["A"] = 5
    same = gt.EnumType(A=("alpha", 1), B=("beta", 2), C=3, D=("delta", 4), ctype="size_t")
    assert same == e and hash(same) == hash(e) and e != gt.EnumType(A=1, B=2, C=3, D=4)
    assert pickle.loads(pickle.dumps(e)) == e
    v = e("mode")   # a variable of the type, as an op parameter
    assert v.type is e


def test_enum_list_and_c_enum_type_number_their_constants():
    gt = theano("theano.gof")   # Theano's gof package has them too
    enum = gt.EnumList("CONSTANT_1", "CONSTANT_2", ("CONSTANT_3", "three"))
    assert (enum.CONSTANT_1, enum.CONSTANT_2, enum.CONSTANT_3) == (0, 1, 2)
    assert enum.ctype == "int" and enum.fromalias("three") == 2
    with pytest.raises(TypeError):
        gt.EnumList("A", "A")
    c = gt.CEnumType("CUDNN_A", "CUDNN_B", ctype="long")
    assert isinstance(c, gt.EnumList) and c.CUDNN_B == 1 and c.ctype == "long"
    assert c != gt.EnumList("CUDNN_A", "CUDNN_B", ctype="long")   # types differ
    assert pickle.loads(pickle.dumps(c)) == c and pickle.loads(pickle.dumps(enum)) == enum


# ============================================================================ rng_mrg

def _mod_product(A, s, m):
    return np.array([sum(int(a) * int(x) for a, x in zip(row, s)) % m for row in A])


def test_dot_modulo_and_mult_mat_vect_jump_an_mrg_state():
    mrg = theano("theano.sandbox.rng_mrg")
    A1p72 = np.asarray([[1516919229, 758510237, 499121365],
                        [1884998244, 1516919229, 335398200],
                        [601897748, 1884998244, 358115744]], dtype="int64")
    A2p72 = np.asarray([[1228857673, 1496414766, 954677935],
                        [1133297478, 1407477216, 1496414766],
                        [2002613992, 1639496704, 1407477216]], dtype="int64")
    M1, M2 = 2147483647, 2147462579
    state = np.array([12345, 12345, 12345, 12345, 12345, 12345], dtype="int32")
    got = mrg.multMatVect(state, A1p72, M1, A2p72, M2)
    want = np.concatenate([_mod_product(A1p72, state[:3], M1),
                           _mod_product(A2p72, state[3:], M2)])
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    # the op itself, in a graph
    A, A2 = T.lmatrix("A"), T.lmatrix("A2")
    s, s2 = T.ivector("s"), T.ivector("s2")
    m, m2 = T.iscalar("m"), T.iscalar("m2")
    out = mrg.DotModulo()(A, s, m, A2, s2, m2)
    f = function([A, s, m, A2, s2, m2], [out, out.shape])
    r, shp = f(A1p72, state[:3], np.int32(M1), A2p72[:2], state[3:], np.int32(M2))
    np.testing.assert_array_equal(r, np.concatenate([want[:3], want[3:5]]))
    assert tuple(shp) == (5,)
    np.testing.assert_array_equal(mrg.matVecModM(A1p72, state[:3], M1), want[:3])
    with pytest.raises(TypeError, match="dimensions"):
        mrg.DotModulo()(s, s, m, A2, s2, m2)


def test_guess_n_streams():
    mrg = theano("theano.sandbox.rng_mrg")
    assert mrg.guess_n_streams((2, 3)) == 6
    assert mrg.guess_n_streams((10, 12)) == 20
    assert mrg.guess_n_streams([1000, 1000]) == 60 * 256
    assert mrg.guess_n_streams(T.lvector().shape) == 60 * 256
    with pytest.warns(UserWarning, match="guessing 60\\*256"):
        assert mrg.guess_n_streams(T.lvector().shape, warn=True) == 60 * 256


# ============================================================================ theano.tensor.opt

def test_assert_op_checks_at_run_time_and_passes_gradients():
    opt = theano("theano.tensor.opt")
    x = T.dvector("x")
    y = opt.assert_op(x, T.lt(x.size, 4))
    f = function([x], y * 2)
    np.testing.assert_array_equal(f(np.ones(3)), 2 * np.ones(3))
    with pytest.raises(AssertionError, match="Theano Assert failed!"):
        f(np.ones(5))
    g = function([x], T.grad((opt.Assert("bad")(x, T.lt(x.size, 4)) ** 2).sum(), x))
    np.testing.assert_allclose(g(np.array([1.0, 2.0])), [2.0, 4.0])
    with pytest.raises(TypeError, match="scalar"):
        opt.Assert()(x, x)
    assert opt.assert_ is opt.assert_op and opt.Assert("m") == opt.Assert("m")
    assert pickle.loads(pickle.dumps(opt.Assert("m"))) == opt.Assert("m")


def test_constant_true_assertions_are_removed():
    opt = theano("theano.tensor.opt")
    x = T.dvector("x")
    f = function([x], opt.assert_op(x, 1) * 2)
    assert "Assert" not in op_types(f)
    f2 = function([x], opt.assert_op(x, 1, T.gt(x.size, 1)) * 2)
    (node,) = [n for n in f2.maker.fgraph.toposort() if isinstance(n.op, opt.Assert)]
    assert len(node.inputs) == 2   # the constant condition dropped, the other kept
    with pytest.raises(AssertionError):
        f2(np.ones(1))


def test_broadcast_helpers():
    opt = theano("theano.tensor.opt")
    assert opt.encompasses_broadcastable((False, False), (True, False))
    assert not opt.encompasses_broadcastable((True, False), (False, False))
    assert not opt.encompasses_broadcastable((False,), (False, False))
    assert opt.encompasses_broadcastable((False, True, False), (True, False))
    x, m = T.dmatrix("x"), T.fmatrix("m")
    fg = FunctionGraph([x, m], [x * 2, m + 1], clone=False)
    tmpl = fg.outputs[0]
    b = opt.broadcast_like(3, tmpl, fg)
    assert b.type == tmpl.type
    np.testing.assert_array_equal(function([x], b)(np.zeros((2, 3))), np.full((2, 3), 3.0))
    b32 = opt.broadcast_like(T.dscalar("s"), tmpl, fg, dtype="float32")
    assert b32.dtype == "float32" and b32.broadcastable == (False, False)
    with pytest.raises(ValueError, match="not in the graph"):
        opt.broadcast_like(1, T.dmatrix(), fg)


def test_scalar_constants_and_dtype_predicates():
    opt = theano("theano.tensor.opt")
    x = T.dvector("x")
    c2 = T.constant(2.0)
    consts, orig, rest = opt.scalarconsts_rest([x, c2, T.cast(c2, "float32"), T.constant([1., 2.])])
    assert [float(c) for c in consts] == [2.0, 2.0] and orig[0] is c2 and rest[0] is x
    assert len(rest) == 2
    consts, orig, rest = opt.scalarconsts_rest([c2, T.cast(c2, "float32")],
                                               only_process_constants=True)
    assert len(consts) == 1 and len(rest) == 1
    assert opt.is_an_upcast("int8", "int32") and opt.is_an_upcast("float32", "float64")
    assert not opt.is_an_upcast("float64", "float32") and not opt.is_an_upcast("int64", "float32")
    assert opt.is_an_upcast("int32", "float64") and not opt.is_an_upcast("float32", "int64")
    from symgpu.scalar.basic import SCALAR_OPS
    neg, exp, log = SCALAR_OPS["neg"], SCALAR_OPS["exp"], SCALAR_OPS["log"]
    assert opt.is_inverse_pair(exp, log, (exp, log))
    assert opt.is_inverse_pair(log, exp, ("exp", "log"))
    assert not opt.is_inverse_pair(neg, log, ("exp", "log"))
    assert not opt.is_inverse_pair(exp, exp, ("exp", "log"))
    assert opt.is_inverse_pair(neg, neg, ("neg", "neg"))
    assert opt.is_inverse_pair(neg, exp, (type(neg), type(exp)))   # classes, as Theano's


def test_check_for_x_over_abs_x_and_clients():
    opt = theano("theano.tensor.opt")
    x, y = T.dvector("x"), T.dvector("y")
    ax = abs(x)
    num, den = opt.check_for_x_over_absX([x, y], [ax])
    assert den == [] and num[0] is y
    v = np.array([-2.0, 0.0, 3.0])
    np.testing.assert_array_equal(function([x], num[1])(v), np.sign(v))
    num, den = opt.check_for_x_over_absX([y], [ax])   # x is not a numerator: unchanged
    assert den == [ax] and num == [y]
    e = T.exp(x)
    a, b = e + 1, e * 2
    out = T.log(a) + b
    fg = FunctionGraph([x], [out, a], clone=False)
    clients = opt.get_clients(e.owner, fg)
    assert set(clients) == {a.owner, b.owner}
    assert set(opt.get_clients2(e.owner, fg)) == {out.owner, a.owner and T.log(a).owner} - {None} \
        or len(opt.get_clients2(e.owner, fg)) == 2
    assert opt.get_clients(a.owner, fg) != []


def test_rebroadcast_rewrites():
    opt = theano("theano.tensor.opt")
    x = T.dmatrix("x")
    useless = T.Rebroadcast((0, False))(x)
    assert opt.apply_rebroadcast_opt(useless) is x
    lifted = opt.apply_rebroadcast_opt(T.Rebroadcast((0, True))(T.exp(x)))
    assert type(lifted.owner.op).__name__ == "Elemwise"
    assert isinstance(lifted.owner.inputs[0].owner.op, T.Rebroadcast)
    assert lifted.broadcastable == (True, False)
    both = opt.apply_rebroadcast_opt(T.Rebroadcast((1, True))(T.Rebroadcast((0, True))(x)))
    assert both.owner.op == T.Rebroadcast((0, True), (1, True)) and both.owner.inputs[0] is x
    f = function([x], T.Rebroadcast((0, True))(T.exp(x)) * 2)
    np.testing.assert_allclose(f(np.ones((1, 3))), 2 * np.e * np.ones((1, 3)))
    with pytest.raises(Exception):
        f(np.ones((2, 3)))


def test_shape_feature_and_shape_optimizers():
    opt = theano("theano.tensor.opt")
    x, y = T.dmatrix("x"), T.dmatrix("y")
    z = T.exp(x) + y
    w = T.dot(z, x.T)
    fg = FunctionGraph([x, y], [w], clone=False)
    opt.ShapeOptimizer().apply(fg)
    sf = fg.shape_feature
    assert isinstance(sf, opt.ShapeFeature)
    shp = sf.shape_of[w]
    assert len(shp) == 2
    g = function([x, y], list(shp))
    xv, yv = np.ones((3, 4)), np.ones((3, 4))
    assert [int(v) for v in g(xv, yv)] == [3, 3]
    assert sf.same_shape(z, z) and sf.same_shape(w, w, 0, 0)
    assert not sf.same_shape(w, x)      # (3, 3) and (3, 4): nothing proves them equal
    v = T.dot(T.exp(x), y.T)            # rows of v are exp(x)'s rows, which are x's rows
    fg2 = FunctionGraph([x, y], [v], clone=False)
    sf2 = opt.ShapeFeature()
    fg2.attach_feature(sf2)
    assert sf2.same_shape(v, x, 0, 0) and sf2.same_shape(v, y, 1, 0)
    assert not sf2.same_shape(v, x, 1, 1)
    fg2.remove_feature(sf2)
    assert not hasattr(fg2, "shape_feature")
    assert int(function([x, y], sf.get_shape(w, 1), on_unused_input="ignore")(xv, yv)) == 3
    sf.set_shape(y, (3, 4))
    assert int(sf.get_shape(y, 1).data) == 4
    opt.ShapeOptimizer().apply(fg)      # a second time: keeps the one feature
    opt.UnShapeOptimizer().apply(fg)
    assert getattr(fg, "shape_feature", None) is None


def test_inplace_elemwise_optimizer():
    opt = theano("theano.tensor.opt")
    x = T.dvector("x")
    a = T.exp(x)
    out = T.log(a) * x
    fg = FunctionGraph([x], [out])
    assert opt.inplace_elemwise_optimizer.apply(fg) >= 1
    pats = [dict(n.op.inplace_pattern) for n in fg.toposort()]
    assert pats[0] == {} and all(p == {0: 0} for p in pats[1:])   # never into the input x
    assert opt.InplaceElemwiseOptimizer(T.Elemwise).op is T.Elemwise


def test_fusion_optimizer_with_local_elemwise_fusion():
    opt = theano("theano.tensor.opt")
    x, y = T.dvector("x"), T.dvector("y")
    out = T.exp(x) * T.log(y) + y
    fg = FunctionGraph([x, y], [out])
    n = opt.FusionOptimizer(opt.local_elemwise_fusion).apply(fg)
    assert n >= 1
    (node,) = fg.toposort()
    assert type(node.op.scalar_op).__name__ == "Composite"
    from symgpu.compile.function import function as fn
    f = fn([x, y], out)
    xv, yv = rng().random(4), rng(1).random(4) + 0.5
    np.testing.assert_allclose(f(xv, yv), np.exp(xv) * np.log(yv) + yv)
    # an input read twice is not fused (it would be computed twice)
    e = T.exp(x)
    fg2 = FunctionGraph([x], [e * x, e + x], clone=False)
    assert opt.FusionOptimizer(opt.local_elemwise_fusion).apply(fg2) == 0
    # the input cap
    capped = opt.local_elemwise_fusion_op(T.Elemwise, lambda node: 1)
    fg3 = FunctionGraph([x, y], [T.exp(x) * T.log(y)])
    assert opt.FusionOptimizer(capped).apply(fg3) == 0
    assert opt.elemwise_max_input_fct(None) >= 32


def test_local_add_mul_fusion():
    opt = theano("theano.tensor.opt")
    x, y, z, w = (T.dvector(n) for n in "xyzw")
    out = ((x + y) + z) * (w * x)
    fg = FunctionGraph([x, y, z, w], [out])
    assert opt.FusionOptimizer(opt.local_add_mul_fusion).apply(fg) >= 2
    names = sorted((n.op.scalar_op.name, len(n.inputs)) for n in fg.toposort())
    assert names == [("add", 3), ("mul", 3)]
    shared_sum = x + y
    fg2 = FunctionGraph([x, y, z], [shared_sum + z, shared_sum * 2], clone=False)
    assert opt.FusionOptimizer(opt.local_add_mul_fusion).apply(fg2) == 0


# ============================================================================ extra_ops

def test_cpu_contiguous_copies_only_strided_inputs():
    xo = theano("theano.tensor.extra_ops")
    x = T.dmatrix("x")
    f = function([x], xo.cpu_contiguous(x.T))
    v = rng().random((3, 4))
    out = f(v)
    assert out.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(out, v.T)
    g = function([x], T.grad((xo.CpuContiguous()(x) * x).sum(), x))
    np.testing.assert_allclose(g(v), 2 * v)


@pytest.mark.parametrize("flags", [(False, False, False), (True, True, False),
                                   (True, True, True), (False, True, True)])
def test_unique_matches_numpy(flags):
    xo = theano("theano.tensor.extra_ops")
    x = T.dmatrix("x")
    out = xo.Unique(*flags)(x)
    outs = out if isinstance(out, list) else [out]
    f = function([x], outs + [o.shape for o in outs])
    v = np.array([[1, 1, 1.0], [2, 3, 3.0]])
    got = f(v)
    want = np.unique(v, return_index=flags[0], return_inverse=flags[1], return_counts=flags[2])
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, np.reshape(w, g.shape))
    for g, s in zip(got, got[len(outs):]):
        assert tuple(s) == g.shape


def test_unique_along_an_axis():
    xo = theano("theano.tensor.extra_ops")
    x = T.dmatrix("x")
    u, inv = xo.Unique(return_inverse=True, axis=0)(x)
    v = np.array([[1.0, 2], [1, 2], [0, 5]])
    got_u, got_inv = function([x], [u, inv])(v)
    want_u, want_inv = np.unique(v, return_inverse=True, axis=0)
    np.testing.assert_array_equal(got_u, want_u)
    np.testing.assert_array_equal(got_inv, want_inv.reshape(-1))
    assert u.broadcastable == (False, False)
    with pytest.raises(ValueError, match="outside of input ndim"):
        xo.Unique(axis=2)(x)


def test_unravel_and_ravel_index():
    xo = theano("theano.tensor.extra_ops")
    idx = T.lvector("idx")
    coords = xo.unravel_index(idx, (3, 4, 5))
    assert len(coords) == 3
    f = function([idx], list(coords))
    v = np.array([0, 7, 59, 22])
    for g, w in zip(f(v), np.unravel_index(v, (3, 4, 5))):
        np.testing.assert_array_equal(g, w)
    fF = function([idx], list(xo.unravel_index(idx, (3, 4, 5), order="F")))
    for g, w in zip(fF(v), np.unravel_index(v, (3, 4, 5), order="F")):
        np.testing.assert_array_equal(g, w)
    (one,) = xo.unravel_index(idx, (60,))
    np.testing.assert_array_equal(function([idx], one)(v), v)
    d = T.lvector("d")
    with pytest.raises(ValueError, match="ndim"):
        xo.unravel_index(idx, d)
    assert len(xo.unravel_index(idx, d, ndim=2)) == 2
    with pytest.raises(TypeError, match="index"):
        xo.unravel_index(T.dvector(), (3, 4))
    a, b = T.lvector("a"), T.lvector("b")
    for mode in ("raise", "wrap", "clip"):
        r = xo.ravel_multi_index((a, b), (3, 4), mode=mode)
        av, bv = (np.array([0, 2, 1]), np.array([3, 1, 0])) if mode == "raise" \
            else (np.array([0, 5, -1]), np.array([7, 1, 0]))
        np.testing.assert_array_equal(function([a, b], r)(av, bv),
                                      np.ravel_multi_index((av, bv), (3, 4), mode=mode))
    with pytest.raises(ValueError):
        function([a, b], xo.ravel_multi_index([a, b], (3, 4)))(np.array([5]), np.array([0]))
    with pytest.raises(TypeError, match="tuple or a list"):
        xo.ravel_multi_index(a, (3, 4))


def test_compress_bartlett_and_fill_diagonal_offset():
    xo = theano("theano.tensor.extra_ops")
    c, x = T.lvector("c"), T.dmatrix("x")
    v = rng().random((3, 4))
    cond = np.array([1, 0, 1])
    np.testing.assert_array_equal(function([c, x], xo.compress(c, x, axis=0))(cond, v),
                                  np.compress(cond, v, axis=0))
    np.testing.assert_array_equal(function([c, x], xo.compress(c, x))(cond, v),
                                  np.compress(cond, v))
    m = T.lscalar("m")
    fb = function([m], [xo.bartlett(m), xo.bartlett(m).shape])
    for n in (5, 1, 0, -3):
        w, s = fb(n)
        np.testing.assert_allclose(w, np.bartlett(n))
        assert tuple(s) == np.bartlett(n).shape
    with pytest.raises(TypeError, match="integer"):
        xo.bartlett(T.dscalar())
    val, off = T.dscalar("val"), T.lscalar("off")
    f = function([x, val, off], xo.fill_diagonal_offset(x, val, off))
    for shape in ((3, 4), (5, 3)):
        a = rng(1).random(shape)
        for o in (-2, -1, 0, 1, 3):
            want = a.copy()
            i = np.arange(min(shape))
            r_, c_ = (i, i + o) if o >= 0 else (i - o, i)
            keep = (r_ < shape[0]) & (c_ < shape[1])
            want[r_[keep], c_[keep]] = 7.0
            np.testing.assert_array_equal(f(a, 7.0, o), want)
    with pytest.raises(TypeError, match="two"):
        xo.fill_diagonal_offset(T.dvector(), 1.0, 0)
    from symgpu.gradient import verify_grad
    for o in (-1, 0, 2):
        verify_grad(lambda a, s: xo.fill_diagonal_offset(a, s, o), [rng(2).random((4, 5)), 0.3],
                    rng=np.random.RandomState(0))


# ============================================================================ abstract_conv

def _upsampled_two_by_two(two_by_two, ratio):
    """Theano's reference (test_abstract_conv.get_upsampled_twobytwo_mat)."""
    kern = np.arange(ratio + 1)
    up_1D = two_by_two[:, :, :, :1] * kern[::-1] + two_by_two[:, :, :, 1:] * kern
    up_2D = up_1D[:, :, :1, :] * kern[::-1][:, np.newaxis] + up_1D[:, :, 1:, :] * kern[:, np.newaxis]
    for _ in range((ratio - 1) // 2):
        up_2D = np.concatenate([up_2D[:, :, :1, :], up_2D], axis=2)
        up_2D = np.concatenate([up_2D, up_2D[:, :, -1:, :]], axis=2)
        up_2D = np.concatenate([up_2D[:, :, :, :1], up_2D], axis=3)
        up_2D = np.concatenate([up_2D, up_2D[:, :, :, -1:]], axis=3)
    if ratio % 2 == 0:
        up_2D = np.concatenate([up_2D, up_2D[:, :, -1:, :]], axis=2)
        up_2D = np.concatenate([up_2D, up_2D[:, :, :, -1:]], axis=3)
    return up_2D / float(ratio) ** 2


def test_bilinear_upsampling_matches_theanos_reference():
    ac = theano("theano.tensor.nnet.abstract_conv")
    x = np.array([[[[1, 2], [3, 4]]]], dtype="float64")
    for ratio in (2, 3, 4, 5, 8):
        for one_d, bs in ((True, 1), (False, None)):
            up = ac.bilinear_upsampling(x, ratio=ratio, batch_size=bs, num_input_channels=bs,
                                        use_1D_kernel=one_d)
            np.testing.assert_allclose(function([], up)(), _upsampled_two_by_two(x, ratio),
                                       rtol=1e-6)
    v = T.dtensor4("v")
    val = rng().random((2, 3, 4, 5))
    a = function([v], ac.bilinear_upsampling(v, 3, use_1D_kernel=True))(val)
    b = function([v], ac.bilinear_upsampling(v, 3, use_1D_kernel=False))(val)
    assert a.shape == (2, 3, 12, 15)
    np.testing.assert_allclose(a, b, rtol=1e-6)
    with pytest.raises(ValueError, match="together"):
        ac.bilinear_upsampling(v, 2, frac_ratio=(3, 2))
    with pytest.raises(ValueError, match="No ratio"):
        ac.bilinear_upsampling(v)
    # fractional ratios take the 2-d kernel whatever use_1D_kernel says (Theano raised)
    frac = function([v], ac.bilinear_upsampling(v, frac_ratio=(3, 2)))(val)
    np.testing.assert_allclose(
        frac, function([v], ac.frac_bilinear_upsampling(v, frac_ratio=(3, 2)))(val))


def test_fractional_bilinear_upsampling():
    ac = theano("theano.tensor.nnet.abstract_conv")
    x = np.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]], [[9, 10], [11, 12]]], ndmin=4).astype("float64")
    up = ac.bilinear_upsampling(x, frac_ratio=((7, 4), (5, 3)), use_1D_kernel=False)
    want = np.array([[[[1., 1.2, 1.8, 2.], [1.28571429, 1.48571429, 2.08571429, 2.28571429],
                       [2.42857143, 2.62857143, 3.22857143, 3.42857143], [3., 3.2, 3.8, 4.]],
                      [[5., 5.2, 5.8, 6.], [5.28571429, 5.48571429, 6.08571429, 6.28571429],
                       [6.42857143, 6.62857143, 7.22857143, 7.42857143], [7., 7.2, 7.8, 8.]],
                      [[9., 9.2, 9.8, 10.], [9.28571429, 9.48571429, 10.08571429, 10.28571429],
                       [10.42857143, 10.62857143, 11.22857143, 11.42857143],
                       [11., 11.2, 11.8, 12.]]]])
    np.testing.assert_allclose(function([], up)(), want, rtol=1e-6)
    z = ac.frac_bilinear_upsampling(T.as_tensor_variable(rng().random((1, 1, 200, 200))), (24, 20))
    assert tuple(function([], z.shape)()) == (1, 1, 240, 240)
    with pytest.raises(ValueError, match="tuple"):
        ac.frac_bilinear_upsampling(T.dtensor4(), [3, 2])


def test_assert_conv_shape_and_assert_shape():
    ac = theano("theano.tensor.nnet.abstract_conv")
    n, c = T.lscalar("n"), T.lscalar("c")
    shp = ac.assert_conv_shape((n, 3, c, 4))
    assert shp[1] == 3 and shp[3] == 4
    f = function([n, c], list(shp))
    assert [int(v) for v in f(0, 2)] == [0, 3, 2, 4]
    with pytest.raises(AssertionError, match=r"dim\[0\] < 0"):
        f(-1, 2)
    with pytest.raises(AssertionError, match=r"dim\[2\] <= 0"):
        f(1, 0)
    with pytest.raises(ValueError, match=r"dim\[3\]: 0 <= 0"):
        ac.assert_conv_shape((1, 1, 2, 0))
    with pytest.raises(ValueError, match=r"dim\[1\]: -1 < 0"):
        ac.assert_conv_shape((1, -1, 2, 2))
    x = T.dmatrix("x")
    assert ac.assert_shape(x, (2, 3)) is x           # the flag is off by default
    with symgpu.config.change_flags({"conv.assert_shape": True}):
        y = ac.assert_shape(x, (2, None), msg="rows")
        assert ac.assert_shape(x, (None, None)) is x and ac.assert_shape(x, None) is x
    g = function([x], y * 1)
    assert g(np.ones((2, 5))).shape == (2, 5)
    with pytest.raises(AssertionError, match="rows"):
        g(np.ones((3, 5)))


# ============================================================================ tensor.io (MPI)

class FakeComm:
    """mpi4py's Isend/Irecv between ranks of one process: a mailbox per (dest, tag); a
    receive's request fills its buffer on wait()."""

    def __init__(self):
        self.box: dict = {}
        self.log: list = []

    class _Req:
        def __init__(self, done):
            self.done = done

        def wait(self):
            self.done()

    def Isend(self, buf, dest, tag):
        self.log.append(("Isend", dest, tag))
        return self._Req(lambda: self.box.setdefault((dest, tag), []).append(np.array(buf)))

    def Irecv(self, buf, source, tag):
        self.log.append(("Irecv", source, tag))

        def fill():
            buf[...] = self.box[(source, tag)].pop(0)
        return self._Req(fill)


@pytest.fixture
def fake_comm():
    io = theano("theano.tensor.io")
    from symgpu.tensor import mpi
    comm = FakeComm()
    mpi.set_comm(comm)
    yield comm
    mpi.set_comm(None)
    assert io.MPISend is mpi.MPISend


def test_mpi_send_then_receive(fake_comm):
    io = theano("theano.tensor.io")
    x = T.dmatrix("x")
    f_send = function([x], io.send(x * 2, 1, 11))
    assert f_send(np.ones((2, 3))) is True
    assert fake_comm.log == [("Isend", 1, 11)]
    y = io.recv((2, 3), "float64", 1, 11)
    assert y.type == T.dmatrix and y.owner.op.tag == 11
    f_recv = function([], y + 1)
    np.testing.assert_array_equal(f_recv(), 3 * np.ones((2, 3)))
    assert fake_comm.log[-1] == ("Irecv", 1, 11)
    # non-blocking halves: the request and the buffer / the sent value
    req, data = io.isend(x, 0, 3)
    assert isinstance(req.owner.op, io.MPISend) and data.type == x.type
    r, buf = io.irecv((4,), "int32", 0, 5)
    assert buf.type == T.ivector and str(r.owner.op).startswith("MPIRecv{source: 0, tag: 5")
    wait = io.MPIRecvWait(5)(r, buf)
    assert wait.owner.op.view_map == {0: [1]}
    from symgpu.tensor.rewriting.shape_feature import node_shapes
    (none, shp), = [node_shapes(r.owner)]
    assert none is None and [int(d.data) for d in shp] == [4]
    assert [int(d.data) for d in node_shapes(wait.owner, [None, shp])[0]] == [4]


def test_mpi_scheduling_keys(fake_comm):
    io = theano("theano.tensor.io")
    x = T.dvector("x")
    s = io.send(x, 1, 7)
    r, buf = io.irecv((3,), "float64", 1, 2)
    got = io.MPIRecvWait(2)(r, buf)
    nodes = [s.owner, s.owner.inputs[0].owner, r.owner, got.owner, T.exp(x).owner]
    order = sorted(nodes, key=lambda a: (io.mpi_send_wait_key(a), io.mpi_tag_key(a)))
    assert [type(n.op).__name__ for n in order] == ["MPIRecv", "MPISend", "Elemwise",
                                                    "MPIRecvWait", "MPISendWait"]
    assert io.mpi_tag_key(T.exp(x).owner) == 0 and io.mpi_tag_key(s.owner) == 7


def test_mpi_ops_need_mpi4py_or_a_communicator():
    from symgpu.tensor import mpi
    mpi.set_comm(None)
    try:
        import mpi4py  # noqa: F401
        pytest.skip("mpi4py is installed: COMM_WORLD is used")
    except ImportError:
        pass
    io = theano("theano.tensor.io")
    f = function([], io.recv((2,), "float64", 0, 1))
    with pytest.raises(ImportError, match="mpi4py"):
        f()


# ============================================================================ compile.ops

def test_output_guard_is_a_destroying_view():
    ops = theano("theano.compile.ops")
    x = T.dvector("x")
    y = T.exp(x)
    guarded = ops.OutputGuard()(y)
    assert guarded.owner.op.destroy_map == {0: [0]} and guarded.owner.op.view_map == {0: [0]}
    f = function([x], guarded)
    v = np.array([0.0, 1.0])
    np.testing.assert_allclose(f(v), np.exp(v))
    np.testing.assert_allclose(function([x], T.grad(ops.OutputGuard()(y).sum(), x))(v), np.exp(v))
    # it holds its input: an in-place op may not write into exp(x) as well
    fg = FunctionGraph([x], [ops.OutputGuard()(T.exp(x)), T.exp(x)], clone=False)
    from symgpu.graph.rewriting import attach_destroy_handler, why_not_destroyable
    attach_destroy_handler(fg)
    e = fg.outputs[0].owner.inputs[0]
    reader = T.log(e).owner
    assert why_not_destroyable(fg, e, reader) is not None
    v2 = np.array([3.0, 4.0])
    np.testing.assert_array_equal(function([x], ops.OutputGuard()(x))(v2), [3.0, 4.0])
    np.testing.assert_array_equal(v2, [3.0, 4.0])   # it never writes
