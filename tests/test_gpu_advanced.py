"""GpuAdvancedSubtensor1, GpuAdvancedIncSubtensor1 and GpuBatchedDot: placement on a virtual
context (CPU), nvcc compilation of the gather/scatter kernels (``nvcc``) and values against
NumPy on a real GPU (``gpu``)."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import check_on_gpu, compile_for_sm90, requires_gpu, requires_nvcc
from symgpu import config, function
from symgpu.gpu.ops.advanced import (GpuAdvancedIncSubtensor1, GpuAdvancedSubtensor1,
                                 GpuBatchedDot, advanced_source)
from symgpu.gpu.placement.rewriting import virtual_context

CPU_NAMES = {"AdvancedSubtensor", "AdvancedIncSubtensor", "MatMul"}


def _graphs():
    x, y = T.matrix("x"), T.matrix("y")
    x3 = T.tensor3("x3")
    a3, b3 = T.tensor3("a3"), T.tensor3("b3")
    iv = T.lvector("iv")
    i32 = T.ivector("i32")
    v = T.vector("v")
    return [x, y, x3, a3, b3, iv, i32, v], {
        "gather": (x[iv], GpuAdvancedSubtensor1),
        "gather_int32": (x3[i32], GpuAdvancedSubtensor1),
        "gather_slices": (x3[iv, :, :], GpuAdvancedSubtensor1),
        "gather_const": (x[[0, 2, -1]], GpuAdvancedSubtensor1),
        "gather_vector": (v[iv], GpuAdvancedSubtensor1),
        "inc": (T.inc_subtensor(x[iv], y), GpuAdvancedIncSubtensor1),
        "set": (T.set_subtensor(x[iv], y), GpuAdvancedIncSubtensor1),
        "inc_bcast": (T.inc_subtensor(x[iv], v), GpuAdvancedIncSubtensor1),
        "batched": (T.matmul(a3, b3), GpuBatchedDot),
    }


@pytest.mark.parametrize("name", ["gather", "gather_int32", "gather_slices", "gather_const",
                                  "gather_vector", "inc", "set", "inc_bcast", "batched"])
def test_placement_on_virtual_context(name):
    with config.change_flags(floatX="float32", assert_no_cpu_op="raise"), virtual_context(None):
        inputs, graphs = _graphs()
        out, gpu_op = graphs[name]
        f = function(inputs, out, on_unused_input="ignore")
        ops = [n.op for n in f.maker.fgraph.toposort()]
        names = {type(op).__name__ for op in ops}
        assert not names & CPU_NAMES, names
        assert any(isinstance(op, gpu_op) for op in ops), names


def _names(out, inputs):
    f = function(inputs, out, on_unused_input="ignore")
    return {type(n.op).__name__ for n in f.maker.fgraph.toposort()}


def test_other_advanced_forms_take_the_general_ops():
    """Forms advanced.py and advanced_pairs.py do not take go to advanced_general.py's ops;
    index arrays of other integer dtypes stay on the CPU."""
    with config.change_flags(floatX="float32"), virtual_context(None):
        x, iv, jv = T.matrix("x"), T.lvector("iv"), T.lvector("jv")
        m, bv = T.lmatrix("m"), T.bvector("bv")
        assert "GpuAdvancedSubtensor" in _names(x[:, iv], [x, iv])       # not axis 0
        assert "GpuAdvancedSubtensor2" in _names(x[iv, jv], [x, iv, jv])  # advanced_pairs.py
        assert "GpuAdvancedSubtensor" in _names(x[m], [x, m])            # matrix index
        assert "GpuAdvancedSubtensor" in _names(x[iv, 1:], [x, iv])      # partial slice
        assert "GpuAdvancedIncSubtensor" in _names(T.inc_subtensor(x[:, iv], x[:, iv]), [x, iv])
        assert "AdvancedSubtensor" in _names(x[bv], [x, bv])             # an int8 index


#: (x's shape and declared broadcast dims, y's): batch dims broadcast on one side only
FOLDED = [((2, 3, 5, 4), (0, 0, 0, 0), (2, 1, 4, 6), (0, 1, 0, 0)),    # keys shared by heads
          ((2, 1, 5, 4), (0, 1, 0, 0), (1, 3, 4, 6), (1, 0, 0, 0)),    # outer over batches
          ((3, 5, 4), (0, 0, 0), (1, 4, 6), (1, 0, 0)),
          ((2, 3, 5, 4), (0, 0, 0, 0), (3, 4, 6), (0, 0, 0)),          # y one rank lower
          ((2, 1, 3, 5, 4), (0, 1, 0, 0, 0), (1, 7, 3, 4, 6), (1, 0, 0, 0, 0))]


def _declared(shape, bcast, dtype, name):
    return T.TensorType(dtype, tuple(bool(b) for b in bcast))(name)


@pytest.mark.parametrize("xs,xb,ys,yb", FOLDED)
def test_matmul_with_batch_broadcasting_lifts(xs, xb, ys, yb):
    """Batch dims declared broadcast on one side only: one product of stacks with the same
    batch dims (a GEMM or a GpuBatchedDot), nothing on the host (MatMul ran there before)."""
    with config.change_flags(floatX="float32", assert_no_cpu_op="raise"), virtual_context(None):
        x, y = _declared(xs, xb, "float32", "x"), _declared(ys, yb, "float32", "y")
        names = _names(T.matmul(x, y), [x, y])
        assert "MatMul" not in names, names
        assert names & {"GpuBatchedDot", "GpuGemm", "GpuDot22"}, names


@pytest.mark.parametrize("ndim", [4, 5])
def test_matmul_of_stacks_with_more_dims_lifts(ndim):
    """(batch, heads, m, k) @ (batch, heads, k, n) and more: one GpuBatchedDot over the
    leading dims (before, a 4-d matmul in a GPU graph ran on the host)."""
    with config.change_flags(floatX="float32", assert_no_cpu_op="raise"), virtual_context(None):
        a, b = (T.tensor(dtype="float32", shape=(None,) * ndim, name=n) for n in "ab")
        f = function([a, b], T.matmul(a, b.swapaxes(-1, -2)))
        nodes = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, GpuBatchedDot)]
        assert len(nodes) == 1 and nodes[0].outputs[0].ndim == ndim
        assert "MatMul" not in {type(n.op).__name__ for n in f.maker.fgraph.toposort()}


def test_grad_of_gather_lifts():
    with config.change_flags(floatX="float32", assert_no_cpu_op="raise"), virtual_context(None):
        x, iv = T.matrix("x"), T.lvector("iv")
        g = T.grad(T.sum(x[iv] ** 2), x)
        names = _names(g, [x, iv])
        assert "GpuAdvancedIncSubtensor1" in names and not names & CPU_NAMES, names


@requires_nvcc
def test_kernels_compile(tmp_path):
    cubin = compile_for_sm90(advanced_source(), tmp_path)
    assert cubin


# ============================================================================ GPU

RNG = np.random.default_rng(7)


def _check(inputs, out, values, want, rtol=None):
    return check_on_gpu(inputs, out, values, want, CPU_NAMES, rtol)


def _values(shape, dtype):
    if dtype.startswith("float"):
        return RNG.standard_normal(shape).astype(dtype)
    return RNG.integers(-50, 50, shape).astype(dtype)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("idx_dtype", ["int32", "int64"])
def test_gpu_gather(cuda, dtype, idx_dtype):
    x3 = T.tensor3("x3", dtype=dtype)
    v = T.vector("v", dtype=dtype)
    iv = T.vector("iv", dtype=idx_dtype)
    a = _values((6, 4, 3), dtype)
    idx = np.asarray([0, -1, 3, 3, -6, 5, 0], dtype=idx_dtype)
    _check([x3, iv], x3[iv], [a, idx], a[idx])
    _check([x3, iv], x3[iv], [a[:, ::2, :], idx], a[:, ::2, :][idx])   # strided x
    _check([x3, iv], x3[iv], [a, idx[:0]], a[idx[:0]])                # empty index
    b = _values(9, dtype)
    _check([v, iv], v[iv], [b, idx], b[idx])


@requires_gpu
def test_gpu_gather_out_of_bounds(cuda):
    x, iv = T.matrix("x"), T.lvector("iv")
    f = function([x, iv], x[iv])
    a = RNG.standard_normal((5, 3)).astype("float32")
    with pytest.raises(IndexError, match=r"index 7 .*size 5"):
        f(a, np.asarray([0, 7, 1]))
    with pytest.raises(IndexError, match=r"index -6 .*size 5"):
        f(a, np.asarray([-6]))
    np.testing.assert_array_equal(np.asarray(f(a, np.asarray([4, -5]))), a[[4, -5]])


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_gpu_inc_repeated_indices(cuda, dtype):
    x, y = T.matrix("x", dtype=dtype), T.matrix("y", dtype=dtype)
    v = T.vector("v", dtype=dtype)
    iv = T.lvector("iv")
    a = _values((5, 4), dtype)
    idx = np.asarray([1, 3, 1, -1, 1, 0, 4], dtype="int64")
    b = _values((len(idx), 4), dtype)
    want = a.copy()
    np.add.at(want, idx, b)
    before = a.copy()
    f = _check([x, y, iv], T.inc_subtensor(x[iv], y), [a, b, idx], want)
    np.testing.assert_array_equal(a, before)   # x is copied, never written
    c = _values(4, dtype)
    want = a.copy()
    np.add.at(want, idx, c)
    _check([x, v, iv], T.inc_subtensor(x[iv], v), [a, c, idx], want)   # y broadcast
    # many repeats of one row: the atomics must not lose updates
    big = np.zeros(1000, dtype="int64")
    ones = np.ones((1000, 4), dtype=dtype)
    want = a.copy()
    np.add.at(want, big, ones)
    _check([x, y, iv], T.inc_subtensor(x[iv], y), [a, ones, big], want,
           1e-4 if dtype == "float32" else None)
    with pytest.raises(IndexError, match=r"index 5 .*size 5"):
        f(a, b, np.asarray([0, 1, 2, 3, 4, 5, 0]))


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_gpu_set(cuda, dtype):
    x, y = T.matrix("x", dtype=dtype), T.matrix("y", dtype=dtype)
    iv = T.ivector("iv")
    a = _values((6, 3), dtype)
    idx = np.asarray([4, -6, 2], dtype="int32")
    b = _values((3, 3), dtype)
    want = a.copy()
    want[idx] = b
    _check([x, y, iv], T.set_subtensor(x[iv], y), [a, b, idx], want)
    # repeated indices: one of the written rows lands (which one is unspecified)
    f = function([x, y, iv], T.set_subtensor(x[iv], y))
    rep = np.asarray([2, 2], dtype="int32")
    rows = np.stack([np.full(3, 1), np.full(3, 2)]).astype(dtype)
    got = np.asarray(f(a, rows, rep))
    assert any(np.array_equal(got[2], r) for r in rows)
    np.testing.assert_array_equal(np.delete(got, 2, 0), np.delete(a, 2, 0))


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpu_batched_dot(cuda, dtype):
    a3, b3 = T.tensor3("a3", dtype=dtype), T.tensor3("b3", dtype=dtype)
    a = RNG.standard_normal((4, 5, 3)).astype(dtype)
    b = RNG.standard_normal((4, 3, 6)).astype(dtype)
    tol = 1e-4 if dtype == "float32" else None
    _check([a3, b3], T.matmul(a3, b3), [a, b], np.matmul(a, b), tol)
    at = np.ascontiguousarray(a.transpose(0, 2, 1)).transpose(0, 2, 1)   # F-order matrices
    _check([a3, b3], T.matmul(a3, b3), [at, b], np.matmul(a, b), tol)
    _check([a3, b3], T.matmul(a3, b3), [a[:, :, :], b[:, :, ::2]], np.matmul(a, b[:, :, ::2]),
           tol)
    f = function([a3, b3], T.matmul(a3, b3))
    with pytest.raises(ValueError, match="not aligned"):
        f(a, a)


@requires_gpu
@pytest.mark.parametrize("xs,xb,ys,yb", FOLDED)
def test_gpu_matmul_with_batch_broadcasting(cuda, xs, xb, ys, yb):
    x, y = _declared(xs, xb, "float32", "x"), _declared(ys, yb, "float32", "y")
    a = RNG.standard_normal(xs).astype("float32")
    b = RNG.standard_normal(ys).astype("float32")
    _check([x, y], T.matmul(x, y), [a, b], np.matmul(a, b), 1e-4)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpu_batched_dot_of_4d_stacks(cuda, dtype):
    """The leading dims as one batch: contiguous, a heads-swapped view (copied), one side's
    leading dims all 1 (read with stride 0), and leading dims that do not match (an error)."""
    a4, b4 = (T.tensor(dtype=dtype, shape=(None,) * 4, name=n) for n in "ab")
    out = T.matmul(a4, b4)
    names = {type(n.op).__name__ for n in function([a4, b4], out).maker.fgraph.toposort()}
    assert "GpuBatchedDot" in names and "MatMul" not in names, names
    tol = 1e-4 if dtype == "float32" else None
    a = RNG.standard_normal((2, 3, 5, 4)).astype(dtype)
    b = RNG.standard_normal((2, 3, 4, 6)).astype(dtype)
    _check([a4, b4], out, [a, b], np.matmul(a, b), tol)
    a_swapped = RNG.standard_normal((3, 2, 5, 4)).astype(dtype).transpose(1, 0, 2, 3)
    _check([a4, b4], out, [a_swapped, b], np.matmul(a_swapped, b), tol)
    one = RNG.standard_normal((1, 1, 4, 6)).astype(dtype)
    _check([a4, b4], out, [a, one], np.matmul(a, one), tol)
    f = function([a4, b4], out)
    with pytest.raises(ValueError, match="leading dims"):
        f(a, RNG.standard_normal((3, 2, 4, 6)).astype(dtype))
