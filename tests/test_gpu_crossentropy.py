"""GpuCrossentropyCategorical1Hot and its gradient op: placement on a virtual context (CPU),
nvcc compilation of their kernels (``nvcc``) and values against the CPU ops on a real GPU
(``gpu``)."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import compile_for_sm90, requires_gpu, requires_nvcc
from symgpu import config, function
from symgpu.gpu.ops.crossentropy import (GpuCrossentropyCategorical1Hot,
                                     GpuCrossentropyCategorical1HotGrad, crossentropy_source)
from symgpu.gpu.placement.rewriting import cpu_nodes, virtual_context
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.tensor.nnet import CrossentropyCategorical1Hot, CrossentropyCategorical1HotGrad

CPU_NAMES = {"CrossentropyCategorical1Hot", "CrossentropyCategorical1HotGrad", "Elemwise",
             "CAReduce", "Softmax", "AdvancedSubtensor"}
XENT_NAMES = {"CrossentropyCategorical1Hot", "CrossentropyCategorical1HotGrad"}


def _names(f):
    return {type(n.op).__name__ for n in f.maker.fgraph.toposort()}


def _normalised_sigmoid(x):
    s = T.nnet.sigmoid(x)
    return s / T.sum(s, axis=1, keepdims=True)


def _assert_whole_graph_on_gpu(f):
    """Both GPU ops present, no CPU crossentropy op, no float work on the host (host scalar
    arithmetic such as a mean's divisor is allowed, as by assert_no_cpu_op)."""
    names = _names(f)
    assert {"GpuCrossentropyCategorical1Hot", "GpuCrossentropyCategorical1HotGrad"} <= names
    assert not names & XENT_NAMES, names
    assert not cpu_nodes(f.maker.fgraph), cpu_nodes(f.maker.fgraph)


def _whole_graph(dtype="float32", label_dtype="int64"):
    """mean(categorical_crossentropy(sigmoid(x) / sum(...), y)) and its gradient wrt x."""
    x, y = T.matrix("x", dtype=dtype), T.vector("y", dtype=label_dtype)
    loss = T.mean(T.nnet.categorical_crossentropy(_normalised_sigmoid(x), y))
    return [x, y], [loss, T.grad(loss, x)]


# ============================================================================ CPU

@pytest.mark.parametrize("label_dtype", ["int32", "int64"])
def test_placement_on_virtual_context(label_dtype):
    with config.change_flags(floatX="float32", assert_no_cpu_op="raise"), virtual_context(None):
        p, y = T.matrix("p"), T.vector("y", dtype=label_dtype)
        g, gs = T.vector("g"), T.scalar("gs")
        cases = [
            ([p, y], T.nnet.categorical_crossentropy(p, y), GpuCrossentropyCategorical1Hot),
            ([p, y], T.nnet.categorical_crossentropy(p[:, ::2], y),
             GpuCrossentropyCategorical1Hot),
            ([p, y], T.nnet.categorical_crossentropy(p.T, y), GpuCrossentropyCategorical1Hot),
            ([g, p, y], CrossentropyCategorical1HotGrad()(g, p, y),
             GpuCrossentropyCategorical1HotGrad),
            ([gs, p, y], CrossentropyCategorical1HotGrad()(gs, p, y),
             GpuCrossentropyCategorical1HotGrad),
        ]
        for inputs, out, gpu_op in cases:
            f = function(inputs, out)
            ops = [n.op for n in f.maker.fgraph.toposort()]
            names = _names(f)
            assert not names & CPU_NAMES, names
            assert any(isinstance(op, gpu_op) for op in ops), names


def test_whole_graph_and_its_gradient_lift():
    """The users' grad() builds the CPU Grad op before lifting; both ops move."""
    with config.change_flags(floatX="float32", assert_no_cpu_op="raise"), virtual_context(None):
        inputs, outputs = _whole_graph()
        _assert_whole_graph_on_gpu(function(inputs, outputs))


def test_other_label_dtypes_and_float16_stay_on_cpu():
    with config.change_flags(floatX="float32"), virtual_context(None):
        p = T.matrix("p")
        for y in (T.vector("y", dtype="int8"), T.vector("y", dtype="uint16")):
            names = _names(function([p, y], T.nnet.categorical_crossentropy(p, y)))
            assert "CrossentropyCategorical1Hot" in names, names
            assert "GpuCrossentropyCategorical1Hot" not in names, names


def test_grad_of_the_gpu_op_is_the_gpu_grad_op():
    p = GpuArrayType("float32", (False, False), None)()
    y = GpuArrayType("int64", (False,), None)()
    out = GpuCrossentropyCategorical1Hot()(p, y)
    g = GpuArrayType("float32", (False,), None)()
    gp, gy = out.owner.op.grad([p, y], [g])
    assert gy is None
    assert isinstance(gp.owner.op, GpuCrossentropyCategorical1HotGrad)
    assert gp.type == p.type


def test_make_node_rejects_bad_types():
    p = GpuArrayType("float32", (False, False), None)()
    with pytest.raises(TypeError, match="GPU variable"):
        GpuCrossentropyCategorical1Hot()(T.matrix("p"), T.lvector("y"))
    with pytest.raises(TypeError, match="int32/int64 vector"):
        GpuCrossentropyCategorical1Hot()(p, GpuArrayType("float32", (False,), None)())
    with pytest.raises(TypeError, match=r"float matrix \(float16, bfloat16, float32, float64\)"):
        GpuCrossentropyCategorical1Hot()(GpuArrayType("int32", (False, False), None)(),
                                         GpuArrayType("int64", (False,), None)())
    with pytest.raises(TypeError, match="scalar or vector"):
        GpuCrossentropyCategorical1HotGrad()(p, p, GpuArrayType("int64", (False,), None)())


def test_both_ops_offer_their_module_to_the_prefetch():
    p = GpuArrayType("float64", (False, False), None)()
    y = GpuArrayType("int32", (False,), None)()
    g = GpuArrayType("float64", (), None)()
    for out in (GpuCrossentropyCategorical1Hot()(p, y),
                GpuCrossentropyCategorical1HotGrad()(g, p, y)):
        ((key, factory, options),) = out.owner.op.prefetch_sources(out.owner)
        assert factory is crossentropy_source and options == ()


@requires_nvcc
def test_kernels_compile(tmp_path):
    cubin = compile_for_sm90(crossentropy_source(), tmp_path)
    assert cubin
    for name in ("ce1hot_float32_int32", "ce1hot_float64_int64",
                 "ce1hot_grad_float32_float64_int32", "ce1hot_grad_float64_float64_int64",
                 "ce1hot_bfloat16_int64", "ce1hot_float16_int32",
                 "ce1hot_grad_bfloat16_float32_int64", "ce1hot_grad_float16_float16_int32"):
        assert name.encode() in cubin, name


# ============================================================================ GPU

RNG = np.random.default_rng(11)


def _cpu(op, *values):
    """The CPU op's own result on NumPy values (the reference)."""
    node = op.make_node(*[T.constant(v) for v in values])
    out = [[None]]
    op.perform(node, list(values), out)
    return out[0][0]


def _probs(shape, dtype):
    return RNG.uniform(0.05, 1.0, shape).astype(dtype)


def _labels(n, k, dtype):
    return RNG.integers(0, k, n).astype(dtype)


def _tol(dtype):
    return 1e-5 if dtype == "float32" else 1e-12


def _check(inputs, out, values, want, gpu_op):
    f = function(inputs, out, on_unused_input="ignore")
    ops = [n.op for n in f.maker.fgraph.toposort()]
    names = _names(f)
    assert not names & CPU_NAMES, names
    assert any(isinstance(op, gpu_op) for op in ops), names
    got = np.asarray(f(*values))
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (
        got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got, want, rtol=_tol(got.dtype.name), atol=_tol(got.dtype.name))
    return f


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("label_dtype", ["int32", "int64"])
def test_gpu_crossentropy(cuda, dtype, label_dtype):
    p, y = T.matrix("p", dtype=dtype), T.vector("y", dtype=label_dtype)
    op = CrossentropyCategorical1Hot()
    a = _probs((37, 10), dtype)
    lab = _labels(37, 10, label_dtype)
    lab[:2] = [0, 9]                                   # both ends of [0, k)
    _check([p, y], T.nnet.categorical_crossentropy(p, y), [a, lab], _cpu(op, a, lab),
           GpuCrossentropyCategorical1Hot)
    lab5 = _labels(37, 5, label_dtype)                 # strided p: every other column
    _check([p, y], T.nnet.categorical_crossentropy(p[:, ::2], y), [a, lab5],
           _cpu(op, a[:, ::2], lab5), GpuCrossentropyCategorical1Hot)
    b = _probs((10, 37), dtype)                        # transposed p
    _check([p, y], T.nnet.categorical_crossentropy(p.T, y), [b, lab], _cpu(op, b.T, lab),
           GpuCrossentropyCategorical1Hot)
    _check([p, y], T.nnet.categorical_crossentropy(p, y), [a[:0], lab[:0]],
           _cpu(op, a[:0], lab[:0]), GpuCrossentropyCategorical1Hot)   # no rows


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("label_dtype", ["int32", "int64"])
def test_gpu_crossentropy_grad(cuda, dtype, label_dtype):
    p, y = T.matrix("p", dtype=dtype), T.vector("y", dtype=label_dtype)
    gv, gs = T.vector("g", dtype=dtype), T.scalar("gs", dtype=dtype)
    g1 = T.tensor(dtype=dtype, shape=(1,), name="g1")
    op = CrossentropyCategorical1HotGrad()
    a = _probs((23, 7), dtype)
    lab = _labels(23, 7, label_dtype)
    gn = RNG.standard_normal(23).astype(dtype)
    one = RNG.standard_normal(1).astype(dtype)
    sc = np.asarray(-1.5, dtype=dtype)
    G = GpuCrossentropyCategorical1HotGrad
    _check([gv, p, y], op(gv, p, y), [gn, a, lab], _cpu(op, gn, a, lab), G)
    _check([gs, p, y], op(gs, p, y), [sc, a, lab], _cpu(op, sc, a, lab), G)    # scalar g
    _check([g1, p, y], op(g1, p, y), [one, a, lab], _cpu(op, one, a, lab), G)  # (1,) g
    _check([gv, p, y], op(gv, p, y), [one, a, lab], _cpu(op, one, a, lab), G)  # length 1 at run
    b = _probs((23, 14), dtype)                                                # strided p
    _check([gv, p, y], op(gv, p[:, ::2], y), [gn, b, lab], _cpu(op, gn, b[:, ::2], lab), G)
    c = _probs((7, 23), dtype)                                                 # transposed p
    _check([gv, p, y], op(gv, p.T, y), [gn, c, lab], _cpu(op, gn, c.T, lab), G)
    other = "float64" if dtype == "float32" else "float32"                     # g of the other
    go = T.vector("go", dtype=other)                                           # float dtype
    gno = gn.astype(other)
    _check([go, p, y], op(go, p, y), [gno, a, lab], _cpu(op, gno, a, lab), G)
    f = function([gv, p, y], op(gv, p, y))
    with pytest.raises(ValueError, match=r"shape \(3,\) does not broadcast"):
        f(gn[:3], a, lab)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpu_ops_on_strided_device_arrays(cuda, dtype):
    """The kernels read p and the labels through their strides (views, no copy)."""
    from symgpu.gpu.runtime.array import to_gpu
    p = GpuArrayType(dtype, (False, False), None)()
    y = GpuArrayType("int64", (False,), None)()
    g = GpuArrayType(dtype, (False,), None)()
    a = _probs((12, 9), dtype)
    lab = _labels(24, 5, "int64")
    pd, yd = to_gpu(a, cuda)[:, ::2], to_gpu(lab, cuda)[::2]
    assert not pd.is_c_contiguous and not yd.is_c_contiguous
    gn = RNG.standard_normal(12).astype(dtype)
    for gpu_op, cpu_op, ins, dev, host in [
            (GpuCrossentropyCategorical1Hot(), CrossentropyCategorical1Hot(), [p, y],
             [pd, yd], [a[:, ::2], lab[::2]]),
            (GpuCrossentropyCategorical1HotGrad(), CrossentropyCategorical1HotGrad(), [g, p, y],
             [to_gpu(gn, cuda), pd, yd], [gn, a[:, ::2], lab[::2]])]:
        node = gpu_op.make_node(*ins)
        out = [[None]]
        gpu_op.perform(node, dev, out)
        assert type(out[0][0]).__name__ == "GpuArray", "the result did not come from the GPU"
        np.testing.assert_allclose(np.asarray(out[0][0]), _cpu(cpu_op, *host),
                                   rtol=_tol(dtype), atol=_tol(dtype))


@requires_gpu
@pytest.mark.parametrize("label_dtype", ["int32", "int64"])
def test_gpu_labels_out_of_range(cuda, label_dtype):
    p, y, g = T.matrix("p"), T.vector("y", dtype=label_dtype), T.vector("g")
    a = _probs((4, 5), "float32")
    gn = np.ones(4, dtype="float32")
    fwd = function([p, y], T.nnet.categorical_crossentropy(p, y))
    grad = function([g, p, y], CrossentropyCategorical1HotGrad()(g, p, y))
    assert "GpuCrossentropyCategorical1Hot" in _names(fwd)
    assert "GpuCrossentropyCategorical1HotGrad" in _names(grad)
    for bad in (5, -1, 1000):                          # negative labels are errors, as on CPU
        lab = np.asarray([0, bad, 1, 4], dtype=label_dtype)
        pat = rf"labels must lie in \[0, 5\) for coding_dist of shape \(4, 5\).*got label {bad}"
        with pytest.raises(ValueError, match=pat):
            fwd(a, lab)
        with pytest.raises(ValueError, match=pat):
            grad(gn, a, lab)
    with pytest.raises(ValueError, match=r"3 labels for 4 rows"):
        fwd(a, np.asarray([0, 1, 2], dtype=label_dtype))
    lab = np.asarray([0, 4, 1, 4], dtype=label_dtype)  # the error buffer is fresh each call
    np.testing.assert_allclose(np.asarray(fwd(a, lab)),
                               _cpu(CrossentropyCategorical1Hot(), a, lab), rtol=1e-5)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("label_dtype", ["int32", "int64"])
def test_gpu_whole_graph_no_cpu_op(cuda, dtype, label_dtype):
    """mean(categorical_crossentropy(sigmoid(x) / sum(...), y)) and d/dx, all on the GPU,
    against the closed form: d/dx_ij = (s_ij (1 - s_ij) / S_i - [j == y_i] (1 - s_ij)) / n."""
    with config.change_flags(assert_no_cpu_op="raise"):
        inputs, outputs = _whole_graph(dtype, label_dtype)
        f = function(inputs, outputs)
    _assert_whole_graph_on_gpu(f)
    n, k = 29, 6
    xv = RNG.standard_normal((n, k)).astype(dtype)
    lab = _labels(n, k, label_dtype)
    loss, gx = (np.asarray(v) for v in f(xv, lab))
    x64 = xv.astype("float64")
    s = 1 / (1 + np.exp(-x64))
    S = s.sum(axis=1, keepdims=True)
    rows = np.arange(n)
    want_loss = np.mean(-np.log(s[rows, lab] / S[:, 0]))
    onehot = np.zeros((n, k))
    onehot[rows, lab] = 1
    want_gx = (s * (1 - s) / S - onehot * (1 - s)) / n
    tol = 1e-5 if dtype == "float32" else 1e-10
    assert loss.dtype == np.dtype(dtype) and gx.dtype == np.dtype(dtype)
    np.testing.assert_allclose(loss, want_loss, rtol=tol, atol=tol)
    np.testing.assert_allclose(gx, want_gx, rtol=tol * 10, atol=tol)
