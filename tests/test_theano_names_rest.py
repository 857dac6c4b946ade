"""Behaviour of the last Theano names issue 31 made present (helper names-rest): gof.params_type,
raw_random's NumPy RandomState op, tensor.opt's merge_two_slices and Canonizer, and the GPU op
names of gpuarray.dnn / nnet / subtensor / neighbours. Each is reached through Theano's path
(``import theano`` aliased to symgpu) and checked against NumPy or Theano's documented
behaviour."""
from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest

import symgpu
from symgpu import tensor as T
from symgpu.compile.function import function


def S(dtype: str) -> T.TensorType:
    """A 0-d tensor type (Theano's ``Scalar`` fields of a ParamsType)."""
    return T.TensorType(dtype, ())


@pytest.fixture(scope="module")
def theano():
    saved = sys.modules.get("theano")
    sys.modules["theano"] = symgpu
    import theano as th
    yield th
    if saved is None:
        sys.modules.pop("theano", None)
    else:
        sys.modules["theano"] = saved


# ----------------------------------------------------------------------- gof.params_type

def test_params_type_bundles_typed_fields(theano):
    from theano.gof.params_type import Params, ParamsType
    from theano.gof import ParamsType as P2
    assert P2 is ParamsType
    pt = ParamsType(b=T.TensorType("float64", (False, False)), a=S("int32"))
    assert pt.fields == ("a", "b") and pt.length == 2
    assert pt.get_type("a") == S("int32") and pt.get_field(S("int32")) == "a"
    assert pt.has_type(S("int32")) and not pt.has_type(S("float32"))

    class Holder:
        a = 10
        b = [[1, 2, 3], [4, 5, 6]]

    p = pt.get_params(Holder(), a=7)            # kwargs win over the object's attributes
    assert isinstance(p, Params) and p.a == 7 and p["a"] == 7
    np.testing.assert_array_equal(p.b, [[1, 2, 3], [4, 5, 6]])
    assert isinstance(p.b, np.ndarray) and p.b.dtype == np.float64   # filtered by its Type
    q = Params(pt, a=np.asarray(7, dtype="int32"), b=np.array([[1., 2, 3], [4, 5, 6]]))
    assert p == q and hash(p) == hash(q) and {p: 1}[q] == 1
    assert p != Params(pt, a=np.asarray(8, dtype="int32"), b=p.b)
    with pytest.raises(TypeError, match="immutable"):
        p.a = 3
    with pytest.raises(TypeError, match="immutable"):
        p["a"] = 3
    with pytest.raises(AttributeError, match="c"):
        p.c
    with pytest.raises(TypeError, match='"b" not in Params'):
        Params(pt, a=1)
    assert pt.filter(q, strict=True) is q
    with pytest.raises(TypeError, match="strict"):
        pt.filter(Holder(), strict=True)
    r = pt.filter(Holder())
    assert isinstance(r, Params) and r.a == 10
    assert pt.values_eq(p, q) and pt.values_eq_approx(p, q)
    p2 = pickle.loads(pickle.dumps(p))
    assert p2 == p and pickle.loads(pickle.dumps(pt)) == pt
    ext = pt.extended(c=S("float64"))
    assert ext.fields == ("a", "b", "c") and ext != pt and pt.name != ext.name
    assert pt == ParamsType(a=S("int32"), b=T.TensorType("float64", (False, False)))


def test_params_type_checks_its_fields_and_reads_enums(theano):
    from theano.gof import EnumList, EnumType
    from theano.gof.params_type import ParamsType
    with pytest.raises(ValueError, match="empty"):
        ParamsType()
    with pytest.raises(AttributeError, match="identifier"):
        ParamsType(**{"1x": S("int32")})
    with pytest.raises(SyntaxError, match="keyword"):
        ParamsType(int=S("int32"))
    with pytest.raises(TypeError, match="Type"):
        ParamsType(a=3)
    w = ParamsType(scalar=S("int32"), letters=EnumType(A=("alpha", 1), B=2, C=3),
                   digits=EnumList(("ZERO", "nothing"), "ONE", "TWO"))
    assert w.C == 3 and w.TWO == 2 and w.get_enum("C") == 3
    assert w.enum_from_alias("alpha") == 1 and w.enum_from_alias("nothing") == 0
    assert w.enum_from_alias("C") == 3
    with pytest.raises(AttributeError):
        w.alpha
    with pytest.raises(AttributeError, match="common constants names"):
        ParamsType(e1=EnumList("A", "B"), e2=EnumType(A=0, C=5))
    assert pickle.loads(pickle.dumps(w)).TWO == 2


# ----------------------------------------------------------------------- raw_random

def test_random_function_draws_numpy_numbers(theano):
    from theano.tensor.raw_random import RandomFunction, RandomStateType, random_state_type
    r = random_state_type()
    assert isinstance(r.type, RandomStateType) and str(r.type) == "RandomStateType"
    shape = T.lvector("shape")
    new_r, sample = RandomFunction("uniform", T.dmatrix().type)(r, shape, 2.0, 5.0)
    f = function([r, shape], [new_r, sample])
    rs = np.random.RandomState(123)
    r1, x1 = f(rs, np.array([3, 4]))
    np.testing.assert_array_equal(x1, np.random.RandomState(123).uniform(2.0, 5.0, (3, 4)))
    # not in place: the given state did not move, the returned one did
    assert random_state_type.values_eq(rs, np.random.RandomState(123))
    assert not random_state_type.values_eq(r1, rs)
    ref = np.random.RandomState(123)
    ref.uniform(size=(3, 4))
    assert random_state_type.values_eq(r1, ref)
    _, x2 = f(r1, np.array([2, 2]))
    np.testing.assert_array_equal(x2, ref.uniform(2.0, 5.0, (2, 2)))
    with pytest.raises(ValueError, match="shape mismatch"):
        f(rs, np.array([3]))


def test_random_function_in_place_ndim_added_and_checks(theano):
    from theano.tensor.raw_random import RandomFunction, random_state_type
    r = random_state_type()
    op = RandomFunction("multinomial", T.lmatrix().type, inplace=True, ndim_added=1)
    assert op.destroy_map == {0: [0]} and str(op) == "RandomFunction{multinomial}"
    new_r, draw = op(r, [4], 10, [0.2, 0.3, 0.5])
    f = function([r], [new_r, draw])
    rs = np.random.RandomState(7)
    r1, x = f(rs)
    np.testing.assert_array_equal(x, np.random.RandomState(7).multinomial(10, [0.2, 0.3, 0.5], (4,)))
    assert r1 is rs or random_state_type.values_eq(r1, rs)
    # an empty shape: NumPy's size from the arguments (Theano's "automatic shape")
    n_r, s = RandomFunction("normal", T.dvector().type)(r, [], T.dvector("m"), 1.0)
    g = function([r, s.owner.inputs[2]], s)
    np.testing.assert_array_equal(g(np.random.RandomState(3), np.array([0., 10., 20.])),
                                  np.random.RandomState(3).normal([0., 10., 20.], 1.0))
    with pytest.raises(TypeError, match="RandomStateType"):
        RandomFunction("normal", T.dvector().type)(T.dvector(), [3])
    with pytest.raises(TypeError, match="int32/int64"):
        RandomFunction("normal", T.dvector().type)(r, T.dvector())
    with pytest.raises(ValueError, match="no method"):
        RandomFunction("nosuch", T.dvector().type)
    with pytest.raises(TypeError, match="RandomState"):
        random_state_type.filter(np.random.default_rng(0))
    assert random_state_type.get_size(None) > 624 * 4
    assert random_state_type.may_share_memory(rs, rs) and not random_state_type.may_share_memory(rs, r1 if r1 is not rs else np.random.RandomState(1))


def test_random_function_shape_pickle_and_grad(theano):
    from theano.tensor.raw_random import RandomFunction, random_state_type
    from symgpu.tensor.rewriting.shape_feature import node_shapes
    r, shp = random_state_type(), T.lvector("shp")
    op = RandomFunction("binomial", T.lmatrix().type)
    new_r, x = op(r, shp, 5, 0.5)
    shapes = node_shapes(x.owner)
    assert shapes[0] is None
    f = function([shp], list(shapes[1]))
    assert [int(v) for v in f(np.array([2, 6]))] == [2, 6]
    op2 = pickle.loads(pickle.dumps(op))
    assert op2 == op and hash(op2) == hash(op)
    g = function([r, shp], op2(r, shp, 5, 0.5)[1])
    np.testing.assert_array_equal(g(np.random.RandomState(1), np.array([2, 3])),
                                  np.random.RandomState(1).binomial(5, 0.5, (2, 3)))
    y = RandomFunction("normal", T.dvector().type)(r, [3], T.dscalar("mu"), 1.0)[1]
    gm = symgpu.gradient.grad(y.sum(), y.owner.inputs[2], disconnected_inputs="ignore")
    assert gm is not None


# ----------------------------------------------------------------------- gpuarray.dnn classes

def _np_softmax(x, axes):
    e = np.exp(x - x.max(axis=axes, keepdims=True))
    return e / e.sum(axis=axes, keepdims=True)


@pytest.mark.parametrize("algo", ["fast", "accurate", "log"])
@pytest.mark.parametrize("mode, axes", [("instance", (1, 2, 3)), ("channel", (1,))])
def test_gpu_dnn_softmax_computes_cudnn_softmax(theano, algo, mode, axes):
    from theano.gpuarray.dnn import GpuDnnSoftmax
    x = T.dtensor4("x")
    f = function([x], GpuDnnSoftmax(algo, mode)(x))    # the host graph, as lifted on a GPU
    v = np.random.RandomState(0).standard_normal((2, 3, 4, 5))
    want = _np_softmax(v, axes)
    np.testing.assert_allclose(f(v), np.log(want) if algo == "log" else want, rtol=1e-12)


def test_gpu_dnn_softmax_checks_and_lifts_to_our_kernel(theano, vgpu):
    from theano.gpuarray.dnn import GpuDnnSoftmax, GpuDnnSoftmaxBase
    from symgpu.gpu.ops.softmax_rows import GpuSoftmaxRows
    with pytest.raises(ValueError, match="algo"):
        GpuDnnSoftmax("exact", "channel")
    with pytest.raises(ValueError, match="mode"):
        GpuDnnSoftmax("fast", "pixel")
    with pytest.raises(TypeError, match="4-d"):
        GpuDnnSoftmax("fast", "channel")(T.matrix())
    with pytest.raises(TypeError, match="base class"):
        GpuDnnSoftmaxBase()
    for algo in ("accurate", "log"):
        x = T.tensor4("x")
        f = function([x], GpuDnnSoftmax(algo, "channel")(x))
        ops = [n.op for n in f.maker.fgraph.toposort()]
        kernels = [op for op in ops if isinstance(op, GpuDnnSoftmax)]
        assert len(kernels) == 1 and isinstance(kernels[0], GpuSoftmaxRows)
        assert isinstance(kernels[0], GpuDnnSoftmaxBase) and kernels[0].log == (algo == "log")
    assert not isinstance(GpuSoftmaxRows(bias=True), GpuDnnSoftmax)
    assert not isinstance(T.nnet.Softmax(-1), GpuDnnSoftmax)


@pytest.mark.parametrize("mode, ws, stride, pad", [
    ("max", (2, 2), (2, 2), (0, 0)), ("max", (3, 2), (1, 2), (1, 1)),
    ("average_inc_pad", (2, 3), (1, 1), (1, 0)), ("average_exc_pad", (2, 2), None, None),
    ("average", (2, 2), (1, 1), (1, 1)), ("max", (2, 2, 2), (1, 2, 1), (0, 1, 0))])
def test_gpu_dnn_pool_grad_is_the_pooling_gradient(theano, mode, ws, stride, pad):
    from theano.gpuarray.dnn import GpuDnnPoolGrad
    from symgpu.tensor.signal.pool import pool_2d, pool_3d
    nd = len(ws)
    x = T.dtensor5("x") if nd == 3 else T.dtensor4("x")
    pool = pool_2d if nd == 2 else pool_3d
    cu_mode = "average_inc_pad" if mode == "average" else mode
    out = pool(x, ws, ignore_border=True, stride=stride, pad=(0,) * nd if pad is None else pad,
               mode=cu_mode)
    gz = out.type("gz")
    want = T.grad(None, x, known_grads={out: gz})
    got = GpuDnnPoolGrad(mode)(x, out, gz, ws, stride, pad)
    f = function([x, gz], [got, want])
    v = np.random.RandomState(1).standard_normal((2, 2, 5, 6) + ((4,) if nd == 3 else ()))
    g = np.random.RandomState(2).standard_normal(function([x], out.shape)(v))
    a, b = f(v, g)
    np.testing.assert_allclose(a, b, rtol=1e-12)
    assert np.abs(a).sum() > 0


def test_gpu_dnn_pool_grad_checks_and_lifts(theano, vgpu):
    from theano.gpuarray.dnn import GpuDnnPool, GpuDnnPoolBase, GpuDnnPoolGrad
    from symgpu.gpu.ops.pooling import GpuAveragePoolGrad, GpuMaxPoolGrad
    from symgpu.tensor.signal.pool import pool_2d
    with pytest.raises(ValueError, match="mode"):
        GpuDnnPoolGrad("median")
    with pytest.raises(TypeError, match="base class"):
        GpuDnnPoolBase("max")
    x, gz = T.tensor4("x"), T.tensor4("gz")
    with pytest.raises(TypeError, match="constant"):
        GpuDnnPoolGrad("max")(x, x, gz, T.lvector("ws"))
    with pytest.raises(ValueError, match="2 or 3"):
        GpuDnnPoolGrad("max")(x, x, gz, (2,))
    for mode, cls in (("max", GpuMaxPoolGrad), ("average_exc_pad", GpuAveragePoolGrad)):
        out = pool_2d(x, (2, 2), ignore_border=True, mode=mode)
        f = function([x, gz], GpuDnnPoolGrad(mode)(x, out, gz, T.constant([2, 2]), (2, 2),
                                                   (0, 0)))
        ops = [n.op for n in f.maker.fgraph.toposort()]
        grads = [op for op in ops if isinstance(op, GpuDnnPoolGrad)]
        assert len(grads) == 1 and isinstance(grads[0], cls) and grads[0].mode == mode
        assert isinstance(grads[0], GpuDnnPoolBase)
        assert any(isinstance(op, GpuDnnPool) and isinstance(op, GpuDnnPoolBase) for op in ops) \
            == (mode == "max")
    assert not isinstance(GpuMaxPoolGrad((2, 2), ignore_border=False), GpuDnnPoolGrad)


@pytest.mark.gpu
def test_gpu_dnn_softmax_and_pool_grad_run_on_the_gpu(theano, cuda):
    from theano.gpuarray.dnn import GpuDnnPoolGrad, GpuDnnSoftmax
    from symgpu.gpu.runtime.array import GpuArray
    from symgpu.tensor.signal.pool import pool_2d
    x = T.ftensor4("x")
    v = np.random.RandomState(3).standard_normal((2, 3, 4, 5)).astype("float32")
    for algo, mode, axes in (("accurate", "channel", (1,)), ("log", "instance", (1, 2, 3))):
        f = function([x], symgpu.Out(GpuDnnSoftmax(algo, mode)(x).transfer(None), borrow=True))
        assert any(isinstance(n.op, GpuDnnSoftmax) for n in f.maker.fgraph.toposort())
        got = f(v)
        assert isinstance(got, GpuArray)
        want = _np_softmax(v.astype("float64"), axes)
        np.testing.assert_allclose(np.asarray(got.get()), np.log(want) if algo == "log" else want,
                                   rtol=1e-4, atol=1e-6)
    out = pool_2d(x, (2, 2), ignore_border=True, mode="max")
    gz = out.type("gz")
    g = function([x, gz], GpuDnnPoolGrad("max")(x, out, gz, (2, 2), (2, 2), (0, 0)))
    assert any(isinstance(n.op, GpuDnnPoolGrad) for n in g.maker.fgraph.toposort())
    gv = np.random.RandomState(4).standard_normal((2, 3, 2, 2)).astype("float32")
    win = v[:, :, :4, :4].reshape(2, 3, 2, 2, 2, 2).transpose(0, 1, 2, 4, 3, 5)
    hit = win == win.max(axis=(4, 5), keepdims=True)     # the max of each 2x2 window
    want = np.zeros_like(v)
    want[:, :, :4, :4] = (hit * gv[:, :, :, :, None, None]).transpose(0, 1, 2, 4, 3, 5) \
        .reshape(2, 3, 4, 4)
    np.testing.assert_allclose(g(v, gv), want, rtol=1e-6)


# ----------------------------------------------------------------------- tensor.opt slices

def test_merge_two_slices_composes_any_two_slices(theano):
    from theano.tensor.opt import merge_two_slices
    x = T.dvector("x")
    a, b, c, d, e, f = (T.lscalar(k) for k in "abcdef")
    s1, s2 = slice(a, b, c), slice(d, e, f)
    merged = merge_two_slices(s1, x.shape[0], s2, x[s1].shape[0])
    assert isinstance(merged, slice)
    run = function([x, a, b, c, d, e, f], x[merged])
    rng = np.random.RandomState(0)
    vals, steps = [-7, -3, -1, 0, 1, 2, 5, 9], [-3, -2, -1, 1, 2, 3]
    for n in (0, 1, 4, 7):
        v = np.arange(n, dtype=float)
        for _ in range(150):
            a_, b_, d_, e_ = (int(k) for k in rng.choice(vals, 4))
            c_, f_ = (int(k) for k in rng.choice(steps, 2))
            np.testing.assert_array_equal(run(v, a_, b_, c_, d_, e_, f_),
                                          v[a_:b_:c_][d_:e_:f_])


def test_merge_two_slices_with_an_index_and_constant_bounds(theano):
    from theano.tensor.opt import merge_two_slices
    from symgpu.tensor.rewriting.slices import get_canonical_form_slice
    x, i = T.dvector("x"), T.lscalar("i")
    s1 = slice(None, None, -2)
    run = function([x, i], x[merge_two_slices(s1, x.shape[0], i, x[s1].shape[0])])
    v = np.arange(7.0)
    for k in (-4, -1, 0, 3):
        assert run(v, k) == v[::-2][k]
    for k in (-5, 4):          # out of range of the sliced axis: out of range of x
        with pytest.raises(IndexError):
            run(v, k)
    with pytest.raises(ValueError, match="not an index"):
        merge_two_slices(3, 7, slice(1, 2), 1)
    canon, direction = get_canonical_form_slice(slice(-2, None, -3), 8)
    got = function([], [canon.start, canon.stop])()
    assert (int(got[0]), int(got[1]), canon.step, direction) == (0, 7, 3, -1)
    assert list(np.arange(8)[int(got[0]):int(got[1]):3][::-1]) == list(np.arange(8)[-2::-3])


# ----------------------------------------------------------------------- tensor.opt Canonizer

def _canonize(c, ins, out):
    from symgpu.graph.fg import FunctionGraph
    from symgpu.graph.rewriting import apply_node_rewriter
    fg = FunctionGraph(ins, [out], clone=False)
    changed = True
    while changed:
        changed = False
        for node in reversed(fg.toposort()):
            if node in fg.apply_nodes and c.tracks_op(node.op) and \
                    apply_node_rewriter(fg, node, c):
                changed = True
    return fg.outputs[0]


def test_canonizer_does_what_theanos_docstring_lists(theano):
    from theano.tensor.opt import Canonizer
    from symgpu.printing import pprint
    mul_c = Canonizer(T.mul, T.true_div, T.inv, lambda n, d: np.prod(n) / np.prod(d))
    add_c = Canonizer(T.add, T.sub, T.neg, lambda n, d: sum(n) - sum(d))
    x, y, z, a, b, c, d = (T.dscalar(n) for n in "xyzabcd")
    ins = [x, y, z, a, b, c, d]
    vals = [1.5, -2.0, 3.0, 0.5, 4.0, -1.25, 2.5]
    for c_, expr, want in [
            (mul_c, x / x, "TensorConstant{1.0}"), (mul_c, (x * y) / x, "y"),
            (mul_c, x / y / x, "reciprocal(y)"), (mul_c, x / y / z, "(x / (y * z))"),
            (mul_c, x / (y / z), "((x * z) / y)"), (mul_c, (a / b) * (b / c) * (c / d), "(a / d)"),
            (mul_c, (2.0 * x) / (4.0 * y), "((TensorConstant{0.5} * x) / y)"),
            (mul_c, 2 * x / 2, "x"), (mul_c, x * y * z, "(x * y * z)"),
            (add_c, (x + y) - x, "y"), (add_c, x - (y - z), "((x + z) - y)")]:
        before = function(ins, expr, on_unused_input="ignore", mode="FAST_COMPILE")(*vals)
        new = _canonize(c_, ins, expr)
        assert pprint(new) == want, (pprint(expr), pprint(new))
        after = function(ins, new, on_unused_input="ignore", mode="FAST_COMPILE")(*vals)
        np.testing.assert_allclose(after, before, rtol=1e-12)
        assert _canonize(c_, ins, new) is new          # a canonical tree stays as it is


def test_canonizer_parts_and_types(theano):
    from theano.tensor.opt import Canonizer
    from symgpu.printing import pprint
    calc = lambda n, d: np.prod(n) / np.prod(d)   # noqa: E731
    mul_c = Canonizer(T.mul, T.true_div, T.inv, calc)
    x, y, z = T.dscalars("x", "y", "z")
    num, den = mul_c.get_num_denum(x / (y * T.inv(z)))
    assert num == [x, z] and den == [y]
    assert mul_c.simplify_factors([x, y, x], [x, z]) == ([y, x], [z])
    assert pprint(mul_c.merge_num_denum([], [y])) == "reciprocal(y)"
    assert pprint(Canonizer(T.mul, T.true_div, T.inv, calc, use_reciprocal=False)
                  .merge_num_denum([], [y])) == "(TensorConstant{1.0} / y)"
    assert mul_c.get_constant(T.constant(3.0)) == 3.0 and mul_c.get_constant(x) is None
    seen = []
    mul_c.add_simplifier(lambda n, d, t: (seen.append(len(n)) or (n, d)), "spy")
    m, v = T.dmatrix("m"), T.dvector("v")
    out = _canonize(mul_c, [m, v], (m * v) / m)          # v, filled to m's shape
    assert out.type == T.dmatrix().type and seen
    mv = np.arange(6.0).reshape(2, 3) + 1
    np.testing.assert_array_equal(function([m, v], out)(mv, np.array([1.0, 2, 3])),
                                  np.tile([1.0, 2, 3], (2, 1)))
    with pytest.raises(TypeError, match="op node"):
        Canonizer(lambda a, b: a, T.true_div, T.inv, calc)
