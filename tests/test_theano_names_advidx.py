"""Theano's theano.gpuarray.subtensor GpuAdvanced{,Boolean}{,Inc}Subtensor (general NumPy
advanced indexing on the GPU, symgpu/gpu/ops/advanced_general.py) and theano.gpuarray.nnet's
GpuCrossentropySoftmaxArgmax1HotWithBias / GpuCrossentropySoftmax1HotWithBiasDx with their
host ops (symgpu/tensor/nnet/xent_softmax.py): placement on a virtual GPU, the kernels
compiled by nvcc, their values against NumPy with the kernels run on the host
(tests/emulated_gpu.py), and on a real GPU (marked gpu)."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from cuda_on_host import requires_gxx
from gpu_helpers import compile_for_sm90, requires_nvcc
from symgpu import function
from symgpu.gpu.placement.type import GpuArrayType

HOST_INDEXING = {"AdvancedSubtensor", "AdvancedIncSubtensor"}


def _ops(f) -> list[str]:
    return [type(n.op).__name__ for n in f.maker.fgraph.toposort()]


# ----------------------------------------------------------------------------- the names

def test_theano_paths_name_the_gpu_indexing_classes():
    from symgpu.gpu.ops import advanced_general as ag
    import symgpu.gpuarray.subtensor as sub
    for name in ("GpuAdvancedSubtensor", "GpuAdvancedIncSubtensor",
                 "GpuAdvancedBooleanSubtensor", "GpuAdvancedBooleanIncSubtensor"):
        assert getattr(sub, name) is getattr(ag, name)


# ----------------------------------------------------------------------------- placement

def _index_graphs():
    x, a, b, mm = T.tensor3("x"), T.lvector("a"), T.imatrix("b"), T.matrix("mm")
    m = mm > 0
    return [x, a, b, mm], {
        "x[a, 1:, b]": (x[a, 1:, b], "GpuAdvancedSubtensor"),
        "x[:, a]": (x[:, a], "GpuAdvancedSubtensor"),
        "x[0, :, a]": (x[0, :, a], "GpuAdvancedSubtensor"),
        "x[None, a, ..., b]": (x[None, a, ..., b], "GpuAdvancedSubtensor"),
        "x[m]": (x[m], "GpuAdvancedBooleanSubtensor"),
        "inc x[a, :, b]": (T.inc_subtensor(x[a, :, b], 1.0), "GpuAdvancedIncSubtensor"),
        "set x[m]": (T.set_subtensor(x[m], 2.0), "GpuAdvancedBooleanIncSubtensor"),
    }


@pytest.mark.parametrize("case", list(_index_graphs()[1]))
def test_general_advanced_indexing_is_placed_on_the_gpu(vgpu, case):
    inputs, graphs = _index_graphs()
    out, op_name = graphs[case]
    f = function(inputs, out, on_unused_input="ignore")
    names = _ops(f)
    assert op_name in names, names
    assert not set(names) & HOST_INDEXING, names


def test_the_gradients_of_general_indexing_run_on_the_gpu(vgpu):
    inputs, _ = _index_graphs()
    x, a, b, mm = inputs
    for cost, want in ((T.sum(x[a, 1:, b] ** 2), "GpuAdvancedIncSubtensor"),
                       (T.sum(x[mm > 0] ** 2), "GpuAdvancedBooleanIncSubtensor")):
        f = function(inputs, symgpu.grad(cost, x), on_unused_input="ignore")
        names = _ops(f)
        assert want in names and not set(names) & HOST_INDEXING, names


def test_the_specialised_forms_keep_their_own_ops(vgpu):
    x, m, i, j = T.matrix("x"), T.tensor3("m"), T.lvector("i"), T.lvector("j")
    assert "GpuAdvancedSubtensor1" in _ops(function([m, i], m[i]))
    assert "GpuAdvancedSubtensor2" in _ops(function([x, i, j], x[i, j]))


def test_make_node_checks_its_inputs(vgpu):
    from symgpu.gpu.ops.advanced_general import GpuAdvancedSubtensor
    x = GpuArrayType("float32", (False, False))("x")
    op = T.matrix()[T.lvector(), T.lvector()].owner.op
    with pytest.raises(TypeError, match="GPU variable"):
        GpuAdvancedSubtensor(op.idx_list)(T.matrix("h"), T.lvector(), T.lvector())
    with pytest.raises(TypeError, match="int32/int64"):
        GpuAdvancedSubtensor(op.idx_list)(x, T.bvector(), T.lvector())
    with pytest.raises(TypeError, match="boolean twin"):
        GpuAdvancedSubtensor((T.matrix()[T.bmatrix() > 0].owner.op.idx_list))(
            x, T.matrix("mm") > 0)


# ----------------------------------------------------------------------------- nvcc

@requires_nvcc
def test_the_general_indexing_module_compiles_for_sm90(tmp_path):
    from symgpu.gpu.ops.advanced_general import advanced_general_source
    assert compile_for_sm90(advanced_general_source(), tmp_path)


# ----------------------------------------------------------------------------- emulated

@pytest.fixture
def emu(monkeypatch, tmp_path):
    from emulated_gpu import emulate_prepared_kernels, emulated_array_device
    from symgpu.gpu.ops import advanced_general
    ctx = emulated_array_device(monkeypatch, tmp_path)
    emulate_prepared_kernels(monkeypatch, tmp_path, advanced_general)
    return ctx


def _gpu_node(host_out, cls, value_inputs: int):
    """The GPU op's node for the host indexing node of ``host_out``: x (and the value) and
    integer index arrays as GPU variables, scalars and masks as host variables."""
    node = host_out.owner
    ins = []
    for k, v in enumerate(node.inputs):
        on_gpu = k < value_inputs or (v.ndim and v.dtype != "bool")
        ins.append(GpuArrayType(v.dtype, v.broadcastable, None)() if on_gpu else v.type())
    args = (node.op.idx_list, node.op.set_instead_of_inc) if value_inputs == 2 else \
        (node.op.idx_list,)
    return cls(*args)(*ins).owner


def _run(emu, node, values):
    from emulated_gpu import device_array, host_view
    args = []
    for k, (v, val) in enumerate(zip(node.inputs, values)):
        if isinstance(v.type, GpuArrayType):
            arr = device_array(emu, np.ascontiguousarray(val))
            args.append(arr)
        else:
            args.append(np.asarray(val, dtype=v.dtype))
    out = [None]
    node.op.perform(node, args, [out])
    return np.array(host_view(out[0]))


def _gather_cases(rng):
    """(host graph, values of its node's index inputs in order, NumPy's result)."""
    x = rng.standard_normal((4, 5, 6)).astype("float32")
    X, a, b, c, s = T.tensor3("x"), T.lvector("a"), T.imatrix("b"), T.lmatrix("c"), T.lscalar("s")
    av = np.array([3, -1, 0], dtype="int64")
    bv = np.array([[1, 5, -6]], dtype="int32")
    cv = np.array([[2], [0]], dtype="int64")
    return x, [
        (X[a, 1:, b], [av, bv], x[av, 1:, bv]),
        (X[:, a], [av], x[:, av]),
        (X[0, :, a], [av], x[0, :, av]),
        (X[None, a, ..., b], [av, bv], x[None, av, ..., bv]),
        (X[a, s:, ::-2], [av, 2], x[av, 2:, ::-2]),
        (X[:, c, b], [cv, bv], x[:, cv, bv]),                 # (2, 1) and (1, 3) broadcast
        (X[s, a, b], [1, av, bv], x[1, av, bv]),
        (X[a, :, -2], [av], x[av, :, -2]),
        (X[c, 1:3, None, b], [cv, bv], x[cv, 1:3, None, bv]),  # separated: block in front
    ]


@requires_gxx
@pytest.mark.parametrize("k", range(9))
def test_general_gather_matches_numpy(emu, k):
    from symgpu.gpu.ops.advanced_general import GpuAdvancedSubtensor
    x, cases = _gather_cases(np.random.default_rng(k))
    out, index_values, want = cases[k]
    node = _gpu_node(out, GpuAdvancedSubtensor, 1)
    got = _run(emu, node, [x] + index_values)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@requires_gxx
def test_general_gather_reads_x_through_its_strides_and_reports_a_bad_index(emu):
    from emulated_gpu import device_array, host_view
    from symgpu.gpu.ops.advanced_general import GpuAdvancedSubtensor
    from symgpu.gpu.runtime.device_checks import raise_device_errors
    x = np.arange(4 * 5 * 6, dtype="float64").reshape(4, 5, 6)
    X, a, b = T.dtensor3("x"), T.lvector("a"), T.ivector("b")
    node = _gpu_node(X[a, 1:, b], GpuAdvancedSubtensor, 1)
    xt = device_array(emu, np.ascontiguousarray(x.transpose(2, 1, 0))).transpose(2, 1, 0)
    av, bv = np.array([3, -4], dtype="int64"), np.array([5, 0], dtype="int32")
    out = [None]
    node.op.perform(node, [xt, device_array(emu, av), device_array(emu, bv)], [out])
    np.testing.assert_array_equal(host_view(out[0]), x[av, 1:, bv])
    raise_device_errors(emu)                        # nothing reported
    bad = np.array([3, 6], dtype="int32")
    node.op.perform(node, [xt, device_array(emu, av), device_array(emu, bad)], [out])
    with pytest.raises(IndexError, match="index 6 is out of bounds"):
        raise_device_errors(emu)
    with pytest.raises(IndexError, match="index 9 is out of bounds for axis 0 with size 4"):
        n2 = _gpu_node(X[9, :, b], GpuAdvancedSubtensor, 1)
        n2.op.perform(n2, [xt, np.asarray(9), device_array(emu, bv)], [out])
    with pytest.raises(IndexError, match="could not be broadcast"):
        node.op.perform(node, [xt, device_array(emu, np.zeros(3, "int64")),
                               device_array(emu, bv)], [out])


@requires_gxx
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("set_", [False, True])
def test_general_inc_and_set_match_numpy(emu, dtype, set_):
    """inc accumulates repeated indices (np.add.at); set writes (no repeats here: which
    repeated write lands is unspecified); the value broadcasts over the region."""
    from symgpu.gpu.ops.advanced_general import GpuAdvancedIncSubtensor
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 5, 6)) * 10).astype(dtype)
    X, Y, a, b = T.tensor3("x", dtype=dtype), T.matrix("y", dtype=dtype), T.lvector("a"), \
        T.ivector("b")
    av = np.array([3, 0, 3, -1] if not set_ else [3, 0, 1, 2], dtype="int64")
    bv = np.array([1, 2, 1, 5] if not set_ else [1, 2, 3, 5], dtype="int32")
    y = (rng.standard_normal((4, 3)) * 10).astype(dtype)
    fn = T.set_subtensor if set_ else T.inc_subtensor
    node = _gpu_node(fn(X[a, 1:4, b], Y), GpuAdvancedIncSubtensor, 2)
    got = _run(emu, node, [x, y, av, bv])
    want = x.copy()
    if set_:
        want[av, 1:4, bv] = y
    else:
        np.add.at(want, (av, slice(1, 4), bv), y)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # a value broadcast along the region's first dim (a row)
    Yr = T.row("yr", dtype=dtype)
    node = _gpu_node(fn(X[a, 1:4, b], Yr), GpuAdvancedIncSubtensor, 2)
    got = _run(emu, node, [x, y[:1], av, bv])
    want = x.copy()
    if set_:
        want[av, 1:4, bv] = y[:1]
    else:
        np.add.at(want, (av, slice(1, 4), bv), y[:1])
    np.testing.assert_allclose(got, want, rtol=1e-6)


@requires_gxx
def test_boolean_masks_gather_and_increment_as_numpy(emu):
    """Masks become their nonzero() arrays (Theano's check of their shape first), mixed
    with slices and other index arrays."""
    from symgpu.gpu.ops.advanced_general import (GpuAdvancedBooleanIncSubtensor,
                                                 GpuAdvancedBooleanSubtensor)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 5, 6)).astype("float32")
    X, M, M1, a = T.tensor3("x"), T.bmatrix("m") > 0, T.bvector("m1") > 0, T.lvector("a")
    m = rng.random((4, 5)) > 0.5
    m1 = rng.random(6) > 0.3
    a1 = np.array([-1], dtype="int64")
    for out, vals, want in ((X[M], [m], x[m]), (X[:, a, M1], [a1, m1], x[:, a1, m1]),
                            (X[1:, :, M1], [m1], x[1:, :, m1])):
        node = _gpu_node(out, GpuAdvancedBooleanSubtensor, 1)
        got = _run(emu, node, [x] + vals)
        np.testing.assert_array_equal(got, want)
    node = _gpu_node(T.inc_subtensor(X[M], 1.5), GpuAdvancedBooleanIncSubtensor, 2)
    want = x.copy()
    want[m] += 1.5
    np.testing.assert_allclose(_run(emu, node, [x, np.float32(1.5), m]), want, rtol=1e-6)
    node = _gpu_node(X[M], GpuAdvancedBooleanSubtensor, 1)
    with pytest.raises(IndexError, match="boolean index did not match"):
        _run(emu, node, [x, np.ones((4, 4), bool)])


# ----------------------------------------------------------------------------- 1-hot xent

def _softmax(r):
    e = np.exp(r - r.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_theano_paths_name_the_gpu_xent_classes():
    from symgpu.gpu.ops import xent_softmax as gx
    import symgpu.gpuarray.nnet as gnn
    import symgpu.tensor.nnet.nnet as nnet
    assert gnn.GpuCrossentropySoftmaxArgmax1HotWithBias is \
        gx.GpuCrossentropySoftmaxArgmax1HotWithBias
    assert gnn.GpuCrossentropySoftmax1HotWithBiasDx is gx.GpuCrossentropySoftmax1HotWithBiasDx
    assert nnet.CrossentropySoftmaxArgmax1HotWithBias is T.nnet.CrossentropySoftmaxArgmax1HotWithBias


def test_host_xent_softmax_argmax_matches_numpy_and_checks_labels():
    rng = np.random.default_rng(0)
    x, b, y = T.fmatrix("x"), T.fvector("b"), T.ivector("y")
    f = function([x, b, y], T.nnet.crossentropy_softmax_argmax_1hot_with_bias(x, b, y))
    xv = rng.standard_normal((6, 5)).astype("float32")
    bv = rng.standard_normal(5).astype("float32")
    yv = np.array([0, 4, 1, 2, 3, 4], dtype="int32")
    nll, sm, am = f(xv, bv, yv)
    r = (xv + bv).astype("float64")
    np.testing.assert_allclose(sm, _softmax(r), rtol=1e-5)
    np.testing.assert_allclose(nll, -np.log(_softmax(r)[np.arange(6), yv]), rtol=1e-5)
    np.testing.assert_array_equal(am, r.argmax(axis=1))
    assert (nll.dtype, sm.dtype, am.dtype) == ("float32", "float32", "int32")
    with pytest.raises(ValueError, match="out of bounds"):
        f(xv, bv, np.array([0, 5, 1, 2, 3, 4], dtype="int32"))
    # the functions Theano builds from it
    nll2, sm2 = function([x, y], T.nnet.crossentropy_softmax_1hot(x, y))(xv, yv)
    np.testing.assert_allclose(nll2, -np.log(_softmax(xv.astype("float64"))[np.arange(6), yv]),
                               rtol=1e-5)
    outs = function([x, b, y], T.nnet.crossentropy_softmax_max_and_argmax_1hot_with_bias(
        x, b, y))(xv, bv, yv)
    np.testing.assert_allclose(outs[2], _softmax(r).max(axis=1), rtol=1e-5)
    np.testing.assert_array_equal(outs[3], r.argmax(axis=1))


def test_host_xent_gradients_verify():
    from symgpu.gradient import verify_grad
    rng = np.random.default_rng(1)
    yv = np.array([0, 3, 1, 2, 3], dtype="int64")
    op = T.nnet.crossentropy_softmax_argmax_1hot_with_bias
    verify_grad(lambda x, b: op(x, b, yv)[0].sum() + (op(x, b, yv)[1] ** 2).sum(),
                [rng.standard_normal((5, 4)), rng.standard_normal(4)], rng=rng)
    sm = _softmax(rng.standard_normal((5, 4)))
    dx = T.nnet.crossentropy_softmax_1hot_with_bias_dx
    for dy in (rng.standard_normal(5), np.asarray(1.3), np.asarray([0.7])):
        verify_grad(lambda d, s: dx(d, s, yv), [dy, sm], rng=rng)
    d = T.dvector("d")
    got = function([d], dx(d, sm, yv))(np.arange(5.0))
    want = np.arange(5.0)[:, None] * sm
    want[np.arange(5), yv] -= np.arange(5.0)
    np.testing.assert_allclose(got, want)


def test_xent_ops_and_their_gradient_are_placed_on_the_gpu(vgpu):
    x, b, y = T.matrix("x"), T.vector("b"), T.ivector("y")
    nll, sm, am = T.nnet.crossentropy_softmax_argmax_1hot_with_bias(x, b, y)
    f = function([x, b, y], [nll.mean(), am, *symgpu.grad(nll.mean(), [x, b])])
    names = _ops(f)
    assert {"GpuCrossentropySoftmaxArgmax1HotWithBias",
            "GpuCrossentropySoftmax1HotWithBiasDx"} <= set(names), names
    assert not any(n.startswith("Crossentropy") for n in names), names


@requires_nvcc
def test_the_xent_module_compiles_for_sm90(tmp_path):
    from symgpu.gpu.ops.xent_softmax import xent_softmax_source
    assert compile_for_sm90(xent_softmax_source(), tmp_path)


@pytest.fixture
def xemu(monkeypatch, tmp_path):
    from emulated_gpu import emulate_prepared_kernels, emulated_array_device
    from symgpu.gpu.ops import xent_softmax
    ctx = emulated_array_device(monkeypatch, tmp_path)
    emulate_prepared_kernels(monkeypatch, tmp_path, xent_softmax)
    return ctx


@requires_gxx
@pytest.mark.parametrize("dtype,k", [("float32", 7), ("float64", 1500), ("float32", 40)])
def test_gpu_xent_forward_matches_the_host_op(xemu, dtype, k):
    """A warp per row (k <= 1024) or a block per row; x read transposed; a bad label is
    reported and raised at the next sync."""
    from emulated_gpu import device_array, host_view
    from symgpu.gpu.ops.xent_softmax import GpuCrossentropySoftmaxArgmax1HotWithBias as Op_
    from symgpu.gpu.runtime.device_checks import raise_device_errors
    rng = np.random.default_rng(k)
    n = 19
    xv = rng.standard_normal((n, k)).astype(dtype)
    xv[3, 5 % k] = xv[3].max() + 1      # a clear maximum
    bv = rng.standard_normal(k).astype(dtype)
    if k > 1:                           # a tie of x + b: the first one wins
        bv[1] = bv[0]
        xv[4, :2] = 10
    yv = rng.integers(0, k, n).astype("int64")
    node = Op_()(GpuArrayType(dtype, (False, False))(), GpuArrayType(dtype, (False,))(),
                 GpuArrayType("int64", (False,))())[0].owner
    xt = device_array(xemu, np.ascontiguousarray(xv.T)).transpose(1, 0)
    out = [[None], [None], [None]]
    node.op.perform(node, [xt, device_array(xemu, bv), device_array(xemu, yv)], out)
    host = T.nnet.crossentropy_softmax_argmax_1hot_with_bias
    xs, bs, ys = T.matrix(dtype=dtype), T.vector(dtype=dtype), T.lvector()
    want = function([xs, bs, ys], host(xs, bs, ys))(xv, bv, yv)
    got = [np.array(host_view(o[0])) for o in out]
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got[0], want[0], rtol=tol, atol=tol)
    np.testing.assert_allclose(got[1], want[1], rtol=tol, atol=tol)
    np.testing.assert_array_equal(got[2], want[2])
    raise_device_errors(xemu)
    bad = yv.copy()
    bad[7] = k
    node.op.perform(node, [xt, device_array(xemu, bv), device_array(xemu, bad)], out)
    with pytest.raises(ValueError, match=rf"labels must lie in \[0, {k}\).*got label {k}"):
        raise_device_errors(xemu)


@requires_gxx
@pytest.mark.parametrize("dy_shape", ["scalar", "one", "rows"])
def test_gpu_xent_dx_matches_the_host_op(xemu, dy_shape):
    from emulated_gpu import device_array, host_view
    from symgpu.gpu.ops.xent_softmax import GpuCrossentropySoftmax1HotWithBiasDx as Op_
    rng = np.random.default_rng(2)
    n, k = 300, 9
    sm = _softmax(rng.standard_normal((n, k))).astype("float32")
    yv = rng.integers(0, k, n).astype("int32")
    dy = {"scalar": rng.standard_normal(()), "one": rng.standard_normal(1),
          "rows": rng.standard_normal(n)}[dy_shape].astype("float32")
    node = Op_()(GpuArrayType("float32", (False,) * dy.ndim)(),
                 GpuArrayType("float32", (False, False))(),
                 GpuArrayType("int32", (False,))()).owner
    out = [None]
    node.op.perform(node, [device_array(xemu, dy), device_array(xemu, sm),
                           device_array(xemu, yv)], [out])
    d, s, yy = T.tensor(dtype="float32", shape=(False,) * dy.ndim), T.matrix(), T.ivector()
    want = function([d, s, yy], T.nnet.crossentropy_softmax_1hot_with_bias_dx(d, s, yy))(
        dy, sm, yv)
    np.testing.assert_allclose(np.array(host_view(out[0])), want, rtol=1e-6, atol=1e-7)


def test_gpu_ops_pickle_in_graphs(vgpu):
    import pickle
    x, a, b, y, bias = T.tensor3("x"), T.lvector("a"), T.imatrix("b"), T.ivector("y"), \
        T.vector("bias")
    m = T.matrix("m")
    outs = [x[a, 1:, b], T.inc_subtensor(x[a, :, b], 1.0), x[m > 0],
            T.set_subtensor(x[m > 0], 0.0),
            *T.nnet.crossentropy_softmax_argmax_1hot_with_bias(x[0], bias, y)]
    f = function([x, a, b, m, y, bias], outs + [symgpu.grad(outs[4].sum(), x)],
                 on_unused_input="ignore")
    names = sorted(_ops(f))
    g = pickle.loads(pickle.dumps(f))
    assert sorted(_ops(g)) == names
    for want in ("GpuAdvancedSubtensor", "GpuAdvancedIncSubtensor", "GpuAdvancedBooleanSubtensor",
                 "GpuAdvancedBooleanIncSubtensor", "GpuCrossentropySoftmaxArgmax1HotWithBias",
                 "GpuCrossentropySoftmax1HotWithBiasDx"):
        assert want in names, names


# ----------------------------------------------------------------------------- real GPU

def _assert_gpu_ran(f, op_names):
    names = set(_ops(f))
    assert set(op_names) <= names, names
    assert not names & (HOST_INDEXING | {"CrossentropySoftmaxArgmax1HotWithBias",
                                         "CrossentropySoftmax1HotWithBiasDx"}), names


@pytest.mark.gpu
def test_general_indexing_on_the_gpu(cuda):
    rng = np.random.default_rng(0)
    x, a, b, mm = T.tensor3("x"), T.lvector("a"), T.imatrix("b"), T.matrix("mm")
    xv = rng.standard_normal((4, 5, 6)).astype("float32")
    av = np.array([3, -1, 0, 3], dtype="int64")
    bv = np.array([[1, 5, -6, 1]], dtype="int32")
    mv = rng.standard_normal((4, 5)).astype("float32")
    outs = [x[a, 1:, b], x[None, a, ..., b], x[mm > 0], T.inc_subtensor(x[a, :, b], 1.5),
            T.set_subtensor(x[mm > 0], 2.0), symgpu.grad(T.sum(x[a, 1:, b] ** 2), x)]
    f = function([x, a, b, mm], outs)
    _assert_gpu_ran(f, ["GpuAdvancedSubtensor", "GpuAdvancedBooleanSubtensor",
                        "GpuAdvancedIncSubtensor", "GpuAdvancedBooleanIncSubtensor"])
    got = f(xv, av, bv, mv)
    inc = xv.copy()
    np.add.at(inc, (av[None, :], slice(None), bv), 1.5)
    st = xv.copy()
    st[mv > 0] = 2.0
    gx = np.zeros_like(xv)
    np.add.at(gx, (av[None, :], slice(1, None), bv), 2 * xv[av, 1:, bv])
    for g, w in zip(got, [xv[av, 1:, bv], xv[None, av, ..., bv], xv[mv > 0], inc, st, gx]):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_xent_softmax_ops_on_the_gpu(cuda):
    rng = np.random.default_rng(1)
    x, b, y = T.matrix("x"), T.vector("b"), T.ivector("y")
    nll, sm, am = T.nnet.crossentropy_softmax_argmax_1hot_with_bias(x, b, y)
    f = function([x, b, y], [nll, sm, am, *symgpu.grad(nll.mean(), [x, b])])
    _assert_gpu_ran(f, ["GpuCrossentropySoftmaxArgmax1HotWithBias",
                        "GpuCrossentropySoftmax1HotWithBiasDx"])
    xv = rng.standard_normal((33, 2000)).astype("float32")
    bv = rng.standard_normal(2000).astype("float32")
    yv = rng.integers(0, 2000, 33).astype("int32")
    got = f(xv, bv, yv)
    r = (xv + bv).astype("float64")
    p = _softmax(r)
    dx = p.copy()
    dx[np.arange(33), yv] -= 1
    dx /= 33
    for g, w in zip(got, [-np.log(p[np.arange(33), yv]), p, r.argmax(1), dx, dx.sum(0)]):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-6)
