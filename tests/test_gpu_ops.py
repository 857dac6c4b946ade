"""GpuElemwise, GpuCAReduce and the cuBLAS ops against NumPy on a real GPU (``pytest -m gpu``).

Ops are run through the VM directly (``run``): a FunctionGraph of GPU nodes linked and called,
so these tests check kernels and thunks whatever state the rewrite pipeline is in; a few
tests at the end go through ``function()`` and the placement pass.  Everything here skips,
with the reason, where no GPU can be used, and asserts a real device ran it where one can.
"""
from __future__ import annotations

import numpy as np
import pytest

from symgpu.config import config
from symgpu.gpu.runtime.context import gpu_available, why_unavailable
from symgpu.graph.fg import FunctionGraph
from symgpu.link.vm import link
from symgpu.scalar.basic import SCALAR_OPS as S, Cast
from symgpu.scalar.composite import CompositeBuilder

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not gpu_available(), reason=f"needs a usable NVIDIA GPU: {why_unavailable() or 'unknown'}")]
CTX = "gpu-ops-test"
RNG = np.random.default_rng(1234)


@pytest.fixture(scope="module", autouse=True)
def ctx():
    from symgpu.gpu.runtime import context as gctx
    c = gctx.start_device("cuda0")
    assert not c.virtual and c.stream_handle, "these tests must run on a real GPU"
    gctx.register_context(CTX, c)
    yield c
    gctx.unregister_context(CTX)


def gvar(dtype, ndim_or_bcast=1):
    from symgpu.gpu.placement.type import GpuArrayType
    bcast = (False,) * ndim_or_bcast if isinstance(ndim_or_bcast, int) else ndim_or_bcast
    return GpuArrayType(dtype, bcast, CTX)()


def dev(a):
    from symgpu.gpu.runtime.array import to_gpu
    from symgpu.gpu.runtime.context import get_context
    return to_gpu(np.asarray(a), get_context(CTX))


def run(outputs, inputs, values, allow_gc=True, calls=1):
    """Link the GPU graph inputs -> outputs and call it; returns host copies of outputs."""
    outputs = outputs if isinstance(outputs, list) else [outputs]
    fg = FunctionGraph(inputs, outputs, clone=False)
    storage = {v: [x if hasattr(x, "gpudata") else dev(x)] for v, x in zip(inputs, values)}
    vm = link(fg, storage, allow_gc=allow_gc)
    for _ in range(calls):
        vm()
    res = [storage[o][0] for o in fg.outputs]
    for r in res:
        assert type(r).__name__ == "GpuArray", f"{r!r} did not come from the GPU"
    return [np.asarray(r) for r in res]


def rand(shape, dtype="float32", low=-3, high=3):
    if dtype == "bool":
        return RNG.random(shape) > 0.5
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return RNG.integers(max(info.min, -100), min(info.max, 100), shape).astype(dtype)
    return RNG.uniform(low, high, shape).astype(dtype)


def close(got, want, dtype=None):
    dtype = np.dtype(dtype or want.dtype)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype,
                                                                 want.shape, want.dtype)
    if dtype.kind == "f":
        tol = {2: 2e-3, 4: 1e-5, 8: 1e-12}[dtype.itemsize]
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


def close_sum(got, host, axis):
    """A float32 sum against the exact one: the error bound of float32 summation is
    proportional to the sum of magnitudes, not to the (possibly cancelling) result."""
    want = np.sum(host.astype("float64"), axis=axis)
    scale = np.sum(np.abs(host.astype("float64")), axis=axis)
    assert got.shape == want.shape and got.dtype == host.dtype
    assert np.all(np.abs(got - want) <= 1e-6 * scale + 1e-6), np.max(np.abs(got - want) / scale)


def elemwise(op, *xs, **kw):
    from symgpu.gpu.ops.elemwise import GpuElemwise
    return GpuElemwise(op, **kw)(*xs)


# ============================================================================ elementwise
def test_exp_contiguous_vectorised_and_misaligned():
    x = gvar("float32")
    data = rand(230400)
    (got,) = run(elemwise(S["exp"], x), [x], [data])
    close(got, np.exp(data))
    base = dev(rand(1001))
    (got,) = run(elemwise(S["exp"], x), [x], [base[1:]])           # 4-byte aligned only
    close(got, np.exp(np.asarray(base)[1:]))


@pytest.mark.parametrize("shape_a,shape_b", [
    ((64, 33), (1, 33)), ((64, 33), (64, 1)), ((5, 6, 7), (1, 6, 1)), ((5, 6, 7), (1, 1, 1)),
    ((1000,), (1000,))])
def test_add_broadcasting(shape_a, shape_b):
    a = gvar("float32", tuple(n == 1 for n in shape_a))
    b = gvar("float32", tuple(n == 1 for n in shape_b))
    da, db = rand(shape_a), rand(shape_b)
    (got,) = run(elemwise(S["add"], a, b), [a, b], [da, db])
    close(got, da + db)


def test_strided_inputs_transposed_sliced_and_both():
    a, b = gvar("float32", 2), gvar("float32", 2)
    big = rand((70, 90))
    ga = dev(big)
    views = [(ga.T[:, :50], big.T[:, :50]), (ga[::2, 1::3], big[::2, 1::3])]
    for view, host in views:
        other = rand(host.shape)
        (got,) = run(elemwise(S["mul"], a, b), [a, b], [view, other])
        close(got, host * other)


def test_64bit_index_kernels(monkeypatch):
    from symgpu.gpu.runtime.codegen import layout
    monkeypatch.setattr(layout, "fits_32bit", lambda *a: False)
    a = gvar("float64", 2)
    host = rand((40, 30), "float64")
    (got,) = run(elemwise(S["sin"], a), [a], [dev(host).T])
    close(got, np.sin(host.T))


@pytest.mark.parametrize("dtype", ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                   "uint32", "uint64", "float16", "float32", "float64"])
def test_every_dtype_add_mul_max_and_cast(dtype):
    a, b = gvar(dtype, 2), gvar(dtype, 2)
    da, db = rand((33, 65), dtype), rand((33, 65), dtype)
    outs = [elemwise(S["add"], a, b), elemwise(S["mul"], a, b), elemwise(S["maximum"], a, b),
            elemwise(Cast("float32"), a), elemwise(Cast("bool"), a)]
    got = run(outs, [a, b], [da, db])
    want = [np.add(da, db), np.multiply(da, db), np.maximum(da, db), da.astype("float32"),
            da.astype(bool)]
    for g, w in zip(got, want):
        close(g, w)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("name", ["exp", "log1p", "tanh", "sigmoid", "softplus", "sqrt", "erf"])
def test_float_functions(dtype, name):
    a = gvar(dtype, 1)
    data = rand(4099, dtype, 0.01, 4)
    (got,) = run(elemwise(S[name], a), [a], [data])
    with np.errstate(all="ignore"):
        want = np.asarray(S[name].impl(data), dtype=dtype)
    close(got, want)


def test_integer_division_modulo_and_mixed_dtypes():
    a, b = gvar("int32"), gvar("int32")
    da = np.array([7, -7, 7, -7, 0, 5, -1], "int32")
    db = np.array([2, 2, -2, -2, 3, 0, 0], "int32")
    got = run([elemwise(S["int_div"], a, b), elemwise(S["mod"], a, b)], [a, b], [da, db])
    with np.errstate(all="ignore"):
        close(got[0], np.floor_divide(da, db))
        close(got[1], np.mod(da, db))
    i, f = gvar("int32"), gvar("float32")
    di, df = rand(100, "int32"), rand(100, "float32")
    (got,) = run(elemwise(S["add"], i, f), [i, f], [di, df])
    close(got, di + df)                               # NumPy: int32 + float32 -> float64
    c, h, d = gvar("bool"), gvar("float16"), gvar("float64")
    dc, dh, dd = rand(100, "bool"), rand(100, "float16"), rand(100, "float64")
    (got,) = run(elemwise(S["switch"], c, h, d), [c, h, d], [dc, dh, dd])
    close(got, np.where(dc, dh, dd))


def test_int8_wraps_like_numpy():
    a = gvar("int8")
    data = np.array([100, 127, -128], "int8")
    (got,) = run(elemwise(S["add"], a, a), [a], [data])
    close(got, data + data)


def test_composite_with_two_outputs():
    b = CompositeBuilder()
    x, y = b.add_input("float16"), b.add_input("int32")
    half = b.add_constant(0.5, "float32")
    t = b.add_op(S["tanh"], [b.add_op(S["mul"], [x, half])[0]])[0]
    s = b.add_op(S["add"], [t, y])[0]
    flag = b.add_op(S["gt"], [s, half])[0]
    comp = b.build([s, flag])
    gx, gy = gvar("float16", 2), gvar("int32", (True, False))
    dx, dy = rand((17, 40), "float16"), rand((1, 40), "int32")
    outs = elemwise(comp, gx, gy)
    got = run(outs, [gx, gy], [dx, dy])
    want = comp.impl(dx, dy)
    # tanh runs in float (value type of float16) on both sides: agree to float32 rounding
    np.testing.assert_allclose(got[0], np.asarray(want[0]), rtol=1e-6, atol=1e-6)
    assert (got[1] != np.asarray(want[1])).mean() < 0.01   # float16 rounding at the threshold


def test_inplace_writes_into_its_input():
    a, b = gvar("float32", 2), gvar("float32", 2)
    da, db = rand((30, 40)), rand((30, 40))
    ga = dev(da)
    out = elemwise(S["add"], a, b, inplace_pattern={0: 0})
    fg = FunctionGraph([a, b], [out], clone=False)
    storage = {a: [ga], b: [dev(db)]}
    link(fg, storage)()
    assert storage[out][0] is ga
    close(np.asarray(ga), da + db)


def test_only_buffers_that_never_leave_a_call_are_reused():
    """Without garbage collection, an intermediate computes into last call's buffer; a
    function output gets a fresh one each call (the caller may keep it)."""
    a = gvar("float32")
    t = elemwise(S["exp"], a)
    out = elemwise(S["neg"], t)
    fg = FunctionGraph([a], [out], clone=False)
    storage = {a: [dev(rand(1000))]}
    with config.change_flags(**{"gpuarray.cuda_graphs": False}):
        vm = link(fg, storage, allow_gc=False)
    vm()
    first_t = storage[t][0].ptr
    held = storage[out][0]
    vm()
    assert storage[t][0].ptr == first_t                # an intermediate: reused
    assert storage[out][0] is not held and storage[out][0].ptr != held.ptr
    close(np.asarray(held), -np.exp(np.asarray(storage[a][0])))


def test_empty_arrays():
    a = gvar("float32", 2)
    (got,) = run(elemwise(S["exp"], a), [a], [np.zeros((0, 5), "float32")])
    assert got.shape == (0, 5)


# ============================================================================ reductions
def careduce(op, axis, *xs, pre=None, dtype=None):
    from symgpu.gpu.ops.elemwise import GpuCAReduce
    return GpuCAReduce(op, axis, dtype, pre)(*xs)


NP_REDUCE = {"add": np.sum, "mul": np.prod, "maximum": np.max, "minimum": np.min,
             "and_": np.all, "or_": np.any}


@pytest.mark.parametrize("axis", [None, (0,), (2,), (0, 1), (1, 2), (1,), (0, 2)])
@pytest.mark.parametrize("layout_", ["c", "transposed", "sliced"])
def test_sum_max_every_axis_pattern_and_layout(axis, layout_):
    host = rand((30, 41, 52), "float32")
    g = dev(host)
    if layout_ == "transposed":
        g, host = g.transpose(2, 0, 1), host.transpose(2, 0, 1)
    elif layout_ == "sliced":
        g, host = g[::2, :, 1::2], host[::2, :, 1::2]
    x = gvar("float32", 3)
    got = run([careduce("add", axis, x), careduce("maximum", axis, x)], [x], [g])
    close_sum(got[0], host, axis)
    close(got[1], np.max(host, axis=axis))


@pytest.mark.parametrize("op,dtype", [("add", "int8"), ("add", "float16"), ("add", "uint32"),
                                      ("mul", "float64"), ("maximum", "uint8"),
                                      ("minimum", "int64"), ("and_", "bool"), ("or_", "bool")])
def test_reductions_by_dtype(op, dtype):
    from symgpu.tensor.elemwise import reduce_output_dtype
    host = rand((300, 70), dtype) if op != "mul" else rand((300, 70), dtype, 0.9, 1.1)
    x = gvar(dtype, 2)
    out_dtype = reduce_output_dtype(op, dtype)
    for axis in (None, (0,), (1,)):
        (got,) = run(careduce(op, axis, x), [x], [host])
        want = np.asarray(NP_REDUCE[op](host, axis=axis, **(
            {"dtype": out_dtype} if op in ("add", "mul") else {})), dtype=out_dtype)
        if dtype == "float16":
            np.testing.assert_allclose(got, want, rtol=2e-2, atol=0.5)
        else:
            close(got, want)


def test_large_sum_is_split_over_blocks_and_accurate():
    host = rand(1 << 24, "float32", 0, 1)
    x = gvar("float32")
    (got,) = run(careduce("add", None, x), [x], [host])
    assert abs(float(got) - host.astype("float64").sum()) / host.size < 1e-6


def test_max_propagates_nan_and_empty_rules():
    host = rand((10, 20))
    host[3, 7] = np.nan
    x = gvar("float32", 2)
    (got,) = run(careduce("maximum", (1,), x), [x], [host])
    close(got, np.max(host, axis=1))
    (got,) = run(careduce("add", (1,), x), [x], [np.zeros((4, 0), "float32")])
    close(got, np.zeros(4, "float32"))
    with pytest.raises(ValueError, match="empty"):
        run(careduce("maximum", (1,), x), [x], [np.zeros((4, 0), "float32")])


def test_fused_pre_op_reductions():
    x, row = gvar("float32", 2), gvar("float32", (True, False))
    dx, drow = rand((64, 300)), rand((1, 300))
    c = gvar("float32", ())
    outs = [careduce("add", None, x, pre=S["sqr"]),
            careduce("add", (1,), x, row, pre=S["sub"]),
            careduce("or_", None, x, c, pre=S["gt"])]
    got = run(outs, [x, row, c], [dx, drow, np.asarray(2.9, "float32")])
    np.testing.assert_allclose(got[0], np.sum(dx.astype("float64") ** 2), rtol=1e-5)
    close(got[1], np.sum(dx - drow, axis=1))
    close(got[2], np.asarray(np.any(dx > 2.9)))


def test_reduce_0d():
    x = gvar("float32", ())
    (got,) = run(careduce("add", None, x), [x], [np.asarray(2.5, "float32")])
    close(got, np.asarray(2.5, "float32"))


# ============================================================================ BLAS
def blas_ops():
    from symgpu.gpu.ops import blas
    return blas


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("order", ["cc", "cf", "fc", "ff", "sliced"])
def test_dot22_layouts(dtype, order):
    b = blas_ops()
    ha, hb = rand((67, 45), dtype), rand((45, 33), dtype)
    ga, gb = dev(ha), dev(hb)
    if order[0] == "f":
        ga = dev(np.ascontiguousarray(ha.T)).T
    if order[1] == "f":
        gb = dev(np.ascontiguousarray(hb.T)).T
    if order == "sliced":
        ga = dev(rand((67, 90), dtype))[:, ::2]
        ha = np.asarray(ga)
    x, y = gvar(dtype, 2), gvar(dtype, 2)
    (got,) = run(b.GpuDot22()(x, y), [x, y], [ga, gb])
    np.testing.assert_allclose(got, ha @ hb, rtol=1e-4 if dtype == "float32" else 1e-10,
                               atol=1e-4 if dtype == "float32" else 1e-10)


@pytest.mark.parametrize("inplace", [False, True])
def test_gemm_host_and_device_scalars(inplace):
    b = blas_ops()
    from symgpu.tensor.type import TensorType
    hz, hx, hy = rand((20, 30)), rand((20, 10)), rand((10, 30))
    z, x, y = gvar("float32", 2), gvar("float32", 2), gvar("float32", 2)
    alpha_h, beta_d = TensorType("float32", ())(), gvar("float32", ())
    out = b.GpuGemm(inplace)(z, alpha_h, x, y, beta_d)
    fg = FunctionGraph([z, alpha_h, x, y, beta_d], [out], clone=False)
    gz = dev(hz)
    storage = {z: [gz], alpha_h: [np.asarray(0.5, "float32")], x: [dev(hx)], y: [dev(hy)],
               beta_d: [dev(np.asarray(-2.0, "float32"))]}
    link(fg, storage)()
    res = storage[out][0]
    np.testing.assert_allclose(np.asarray(res), -2.0 * hz + 0.5 * hx @ hy, rtol=1e-4, atol=1e-4)
    assert (res is gz) == inplace


@pytest.mark.parametrize("layout_", ["c", "f", "strided_x"])
def test_gemv_and_matvec(layout_):
    b = blas_ops()
    hA, hx, hy = rand((50, 40)), rand(40), rand(50)
    gA = dev(hA) if layout_ != "f" else dev(np.ascontiguousarray(hA.T)).T
    gx = dev(hx) if layout_ != "strided_x" else dev(np.repeat(hx, 3))[::3]
    y, A, x = gvar("float32"), gvar("float32", 2), gvar("float32")
    out = b.GpuGemv(False)(y, 1.5, A, x, 0.25)
    (got,) = run(out, [y, A, x], [hy, gA, gx])
    np.testing.assert_allclose(got, 0.25 * hy + 1.5 * hA @ hx, rtol=1e-4, atol=1e-4)
    (got,) = run(b.gpu_matvec(A, x), [A, x], [gA, gx])
    np.testing.assert_allclose(got, hA @ hx, rtol=1e-4, atol=1e-4)


def test_gemv_and_gemm_broadcast_y_like_the_cpu_ops():
    b = blas_ops()
    hA, hx = rand((20, 7)), rand(7)
    y, A, x = gvar("float32", (True,)), gvar("float32", 2), gvar("float32")
    out = b.GpuGemv(False)(y, 2.0, A, x, 0.5)
    assert out.broadcastable == (False,)
    (got,) = run(out, [y, A, x], [np.asarray([3.0], "float32"), hA, hx])
    np.testing.assert_allclose(got, 1.5 + 2.0 * hA @ hx, rtol=1e-5, atol=1e-5)
    z, B = gvar("float32", (True, False)), gvar("float32", 2)
    hz, hB = rand((1, 5)), rand((7, 5))
    out = b.GpuGemm(False)(z, 1.0, A, B, -1.0)
    (got,) = run(out, [z, A, B], [hz, hA, hB])
    np.testing.assert_allclose(got, hA @ hB - hz, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="in place"):
        b.GpuGemv(True)(y, 2.0, A, x, 0.5)


def test_gemv_inplace_update_and_empty_dims():
    b = blas_ops()
    hA, hx, hw = rand((50, 40)), rand(50), rand(40)
    w, A, x = gvar("float32"), gvar("float32", 2), gvar("float32")
    from symgpu.gpu.placement.basic_ops import GpuDimShuffle
    out = b.GpuGemv(True)(w, -0.1, GpuDimShuffle((False, False), (1, 0))(A), x, 1.0)
    fg = FunctionGraph([w, A, x], [out], clone=False)
    gw = dev(hw)
    storage = {w: [gw], A: [dev(hA)], x: [dev(hx)]}
    link(fg, storage)()
    assert storage[out][0] is gw
    np.testing.assert_allclose(np.asarray(gw), hw - 0.1 * hA.T @ hx, rtol=1e-4, atol=1e-4)
    y, A0, x0 = gvar("float32"), gvar("float32", 2), gvar("float32")
    (got,) = run(b.GpuGemv(False)(y, 1.0, A0, x0, 0.5), [y, A0, x0],
                 [np.ones(3, "float32"), np.zeros((3, 0), "float32"), np.zeros(0, "float32")])
    close(got, np.full(3, 0.5, "float32"))


# ============================================================================ through function()
def test_lifted_graph_runs_gpu_ops():
    import symgpu.tensor as T
    from symgpu import function, shared
    from symgpu.gpu.runtime.array import GpuArray
    xs = shared(rand((64, 32)), target=CTX)
    v = shared(rand(32), target=CTX)
    f = function([], [T.exp(xs).transfer(CTX), T.sum(xs ** 2, axis=1).transfer(CTX),
                      T.dot(xs, v).transfer(CTX), T.dot(xs.T, xs).transfer(CTX)])
    kinds = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
    assert "Elemwise" not in kinds and "GpuElemwise" in kinds, kinds
    assert kinds & {"GpuGemv"} and kinds & {"GpuDot22", "GpuGemm"}, kinds
    res = f()
    assert all(isinstance(r, GpuArray) for r in res)
    hx, hv = xs.get_value(), v.get_value()
    close(np.asarray(res[0]), np.exp(hx))
    np.testing.assert_allclose(np.asarray(res[1]), np.sum(hx ** 2, axis=1), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(res[2]), hx @ hv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(res[3]), hx.T @ hx, rtol=1e-4, atol=1e-4)
