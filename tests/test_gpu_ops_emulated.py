"""GPU elementwise and reduction ops run end to end on the CPU (tests/emulated_gpu.py): the
thunk plans the launch, packs the arguments and launches the kernels it generated, which run
as host code thread by thread; the values are checked against NumPy. This covers what the
recording fakes of test_gpu_codegen.py cannot (the kernels' results) on every path a thunk
picks: vector, scalar (misaligned) and strided elementwise kernels, broadcasting, fused
composites, and the reduction strategies (one block per output, split columns with a finish
launch, one-launch column blocks, row reductions, a whole-array reduction whose last block
sums the partials)."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_on_host import requires_gxx
from emulated_gpu import device_array, emulated_kernel_device, gpu_var, host_view, run_node
from gpu_helpers import thunk_over
from symgpu.gpu.ops.elemwise import GpuCAReduce, GpuElemwise
from symgpu.scalar.basic import SCALAR_OPS
from symgpu.scalar.composite import CompositeBuilder

pytestmark = requires_gxx


@pytest.fixture
def emu(monkeypatch, tmp_path):
    return emulated_kernel_device(monkeypatch, tmp_path)


gvar = gpu_var


run = run_node


def test_elementwise_kernels_on_every_path(emu):
    rng = np.random.default_rng(0)
    host = rng.standard_normal((60, 33)).astype("float32")
    x = gvar("float32", 2)
    node = GpuElemwise(SCALAR_OPS["exp"])(x).owner
    a = device_array(emu, host)
    (got,), thunk, storage = run(node, [a])
    np.testing.assert_allclose(got, np.exp(host), rtol=1e-6)             # vector kernel
    b = device_array(emu, np.concatenate([[0.0], host.ravel()]).astype("float32"))
    from symgpu.gpu.runtime.array import GpuArray, c_strides
    mis = GpuArray.__new__(GpuArray)                                     # 4 bytes off 16
    mis._set(emu, b.ptr + 4, host.shape, c_strides(host.shape, 4), np.dtype("float32"), b)
    storage[node.inputs[0]][0] = mis
    thunk()
    np.testing.assert_allclose(host_view(storage[node.outputs[0]][0]), np.exp(host), rtol=1e-6)
    t = device_array(emu, np.ascontiguousarray(host.T)).transpose()     # strided kernel
    storage[node.inputs[0]][0] = t
    thunk()
    np.testing.assert_allclose(host_view(storage[node.outputs[0]][0]), np.exp(host), rtol=1e-6)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("in_flight", [256, 96, 64, 32])
def test_vector_kernel_loops_four_vectors_then_one_then_the_tail(emu, monkeypatch, in_place,
                                                                 in_flight):
    """sg_contig_vec over more vectors than its grid has threads: each thread's loop takes
    SG_VEC_DEPTH vectors at a time (4, 3, 2, 1 for a float32 exp's 32 bytes a vector under
    these byte budgets), then one, and the last elements go through the scalar tail (one
    multiprocessor assumed: a grid of VEC_BLOCKS_PER_SM blocks). In place, an element
    computed twice would be exp(exp(x))."""
    from symgpu.gpu.ops import elemwise as gpu_elemwise
    from symgpu.gpu.runtime.codegen import elemwise as codegen_elemwise, launch
    monkeypatch.setattr(launch, "sm_count", lambda ctx: 1)
    monkeypatch.setattr(codegen_elemwise, "VEC_BYTES_IN_FLIGHT", in_flight)
    step = gpu_elemwise.VEC_BLOCKS_PER_SM * gpu_elemwise.BLOCK       # vectors per grid pass
    n = 4 * (4 * step * 2 + step + 5) + 3
    host = np.random.default_rng(7).standard_normal(n).astype("float32")
    x = gvar("float32", 1)
    op = GpuElemwise(SCALAR_OPS["exp"], {0: 0} if in_place else None)
    node = op(x).owner
    assert op.signature(node).vec_depth == {256: 4, 96: 3, 64: 2, 32: 1}[in_flight]
    (got,), thunk, storage = run(node, [device_array(emu, host)])
    np.testing.assert_allclose(got, np.exp(host), rtol=1e-6)


def test_broadcast_and_a_fused_composite_with_two_outputs(emu):
    rng = np.random.default_rng(1)
    m = rng.standard_normal((7, 5, 9)).astype("float32")
    row = rng.standard_normal((1, 1, 9)).astype("float32")
    node = GpuElemwise(SCALAR_OPS["add"])(gvar("float32", 3),
                                          gvar("float32", 3, (True, True, False))).owner
    (got,), _, _ = run(node, [device_array(emu, m), device_array(emu, row)])
    np.testing.assert_allclose(got, m + row, rtol=1e-6)
    # the logistic regression's fused kernel: sigmoid(z) > 0.5 and the cross-entropy
    b = CompositeBuilder()
    z, y = b.add_input("float32"), b.add_input("float32")
    s = b.add_op(SCALAR_OPS["sigmoid"], [z])[0]
    pred = b.add_op(SCALAR_OPS["gt"], [s, b.add_constant(0.5, "float32")])[0]
    xent = b.add_op(SCALAR_OPS["sub"], [b.add_op(SCALAR_OPS["softplus"], [z])[0],
                                        b.add_op(SCALAR_OPS["mul"], [y, z])[0]])[0]
    comp = b.build([pred, xent])
    zs = (rng.standard_normal(1000) * 3).astype("float32")
    ys = rng.integers(0, 2, 1000).astype("float32")
    node = GpuElemwise(comp)(gvar("float32", 1), gvar("float32", 1))[0].owner
    (p, xe), _, _ = run(node, [device_array(emu, zs), device_array(emu, ys)])
    np.testing.assert_array_equal(p, 1 / (1 + np.exp(-zs.astype("float64"))) > 0.5)
    np.testing.assert_allclose(xe, np.logaddexp(0, zs.astype("float64")) - ys * zs, rtol=2e-6,
                               atol=2e-6)


@pytest.mark.parametrize("op,axis,shape", [
    ("add", (0,), (20000, 16)),       # tall columns: split rows, then a finish launch
    ("add", (0,), (512, 96)),         # short columns: one-launch column blocks
    ("maximum", (1,), (300, 64)),     # rows
    ("add", (1,), (5, 3000)),         # long rows
    ("add", None, (70001,)),          # everything: partials summed by the last block
    ("minimum", (0, 2), (6, 40, 50)), # two axes
])
def test_reductions_match_numpy_on_every_strategy(emu, op, axis, shape):
    rng = np.random.default_rng(len(shape) * 7 + shape[-1])
    host = rng.standard_normal(shape).astype("float32")
    ax = tuple(range(len(shape))) if axis is None else axis
    node = GpuCAReduce(SCALAR_OPS[op], ax)(gvar("float32", len(shape))).owner
    (got,), thunk, storage = run(node, [device_array(emu, host)])
    want = {"add": np.sum, "maximum": np.max, "minimum": np.min}[op](
        host.astype("float64"), axis=ax)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)
    thunk()   # again: the one-pass counters were reset by the last block
    np.testing.assert_allclose(host_view(storage[node.outputs[0]][0]), want, rtol=1e-5,
                               atol=1e-3)


def _bias_update(lr: float = 0.02):
    """The SGD update of a bias as the GPU fusion leaves it: sub(b, mul(lr, db)), db first."""
    b = CompositeBuilder()
    db, bias = b.add_input("float32"), b.add_input("float32")
    scaled = b.add_op(SCALAR_OPS["mul"], [b.add_constant(lr, "float32"), db])[0]
    return b.build(b.add_op(SCALAR_OPS["sub"], [bias, scaled]))


@pytest.mark.parametrize("axis,shape", [
    ((0,), (512, 96)),         # one-launch column blocks
    ((0,), (20000, 16)),       # split columns: the epilogue in the finish launch
    ((1,), (300, 64)),         # rows
    ((1,), (7, 9000)),         # split rows, one pass: the last block's epilogue
])
def test_a_reductions_epilogue_matches_the_two_kernels(emu, axis, shape):
    from symgpu.scalar.composite import Composite
    rng = np.random.default_rng(shape[0])
    d = rng.standard_normal(shape).astype("float32")
    kept = shape[1 - axis[0]]
    bias = rng.standard_normal(kept).astype("float32")
    post = _bias_update()
    assert isinstance(post, Composite)
    node = GpuCAReduce(SCALAR_OPS["add"], axis, None, None, post)(
        gvar("float32", 2), gvar("float32", 1)).owner
    assert "post=" in str(node.op) and node.outputs[0].dtype == "float32"
    (got,), thunk, storage = run(node, [device_array(emu, d), device_array(emu, bias)])
    db = d.sum(axis=axis[0], dtype="float64").astype("float32")     # the reduction's store
    want = bias - np.float32(0.02) * db
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for wrong in (bias[:-1], bias[:1]):   # the wrong length (one value is no broadcast here)
        storage[node.inputs[1]][0] = device_array(emu, wrong)
        with pytest.raises(ValueError, match="epilogue operand of shape"):
            thunk()


def test_a_full_reductions_epilogue_with_a_scalar_operand(emu):
    # mean = sum / n, the count one value on the device (as the loss of a classifier)
    x = np.random.default_rng(4).standard_normal(70001).astype("float32")
    b = CompositeBuilder()
    s, n = b.add_input("float32"), b.add_input("float32")
    post = b.build(b.add_op(SCALAR_OPS["true_div"], [s, n]))
    node = GpuCAReduce(SCALAR_OPS["add"], None, None, None, post)(
        gvar("float32", 1), gvar("float32", 0)).owner
    (got,), _, _ = run(node, [device_array(emu, x), device_array(emu, np.float32(x.size))])
    assert got.shape == ()
    np.testing.assert_allclose(got, x.sum(dtype="float64") / x.size, rtol=1e-5)


def test_an_epilogue_casts_an_integer_operand(emu):
    # the count as the batch's int64 length, cast in the epilogue (gpu_producer_copies copies
    # a mean divisor's cast into the reduction that reads it)
    from symgpu.scalar.basic import Cast
    x = np.random.default_rng(5).standard_normal((513,)).astype("float32")
    b = CompositeBuilder()
    s, n = b.add_input("float32"), b.add_input("int64")
    post = b.build(b.add_op(SCALAR_OPS["true_div"], [s, b.add_op(Cast("float32"), [n])[0]]))
    node = GpuCAReduce(SCALAR_OPS["add"], None, None, None, post)(
        gvar("float32", 1), gvar("int64", 0)).owner
    (got,), _, _ = run(node, [device_array(emu, x), device_array(emu, np.int64(x.size))])
    np.testing.assert_allclose(got, x.sum(dtype="float64") / x.size, rtol=1e-5)


def test_an_epilogue_computes_an_update_in_its_variables_buffer(emu):
    # graph_segment's direct updates: b - lr * d.sum(0) written over b itself
    rng = np.random.default_rng(9)
    d = rng.standard_normal((2000, 40)).astype("float32")
    bias = rng.standard_normal(40).astype("float32")
    node = GpuCAReduce(SCALAR_OPS["add"], (0,), None, None, _bias_update())(
        gvar("float32", 2), gvar("float32", 1)).owner
    b_dev = device_array(emu, bias)
    thunk, storage = thunk_over(node, [device_array(emu, d), b_dev])
    assert thunk.write_into == [None]
    thunk.write_into[0] = b_dev
    thunk()
    assert storage[node.outputs[0]][0] is b_dev
    want = bias - np.float32(0.02) * d.sum(axis=0, dtype="float64").astype("float32")
    np.testing.assert_allclose(host_view(b_dev), want, rtol=1e-5, atol=1e-5)
    plain = GpuCAReduce(SCALAR_OPS["add"], (0,))(gvar("float32", 2)).owner
    assert not hasattr(thunk_over(plain, [device_array(emu, d)])[0], "write_into")


# ----------------------------------------------------------------- half dtypes (issue 34)

#: tolerances of half results against NumPy in float64 then rounded: the kernels compute in
#: float32 and round once (half an ulp: 2^-11 relative for float16, 2^-8 for bfloat16)
_HALF_RTOL = {"float16": 1e-3, "bfloat16": 8e-3}


def _rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """NumPy's float64 answer rounded to `dtype`, as float64 (what a kernel stores)."""
    return values.astype(dtype).astype("float64")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_elementwise_chain_on_every_path(emu, dtype):
    """exp(x) * y + 1 fused, with x and y stored in a half dtype: the vector kernel (4 halves
    an 8-byte access), a pointer 2 bytes off (the scalar kernel) and a transposed input (the
    strided kernel); computed in float32, rounded once on the store."""
    rng = np.random.default_rng(9)
    b = CompositeBuilder()
    x, y = b.add_input(dtype), b.add_input(dtype)
    e = b.add_op(SCALAR_OPS["mul"], [b.add_op(SCALAR_OPS["exp"], [x])[0], y])[0]
    comp = b.build(b.add_op(SCALAR_OPS["add"], [e, b.add_constant(1.0, dtype)]))
    hx = rng.uniform(-2, 2, (40, 33)).astype(dtype)
    hy = rng.uniform(-2, 2, (40, 33)).astype(dtype)
    want = _rounded(np.exp(hx.astype("float64")) * hy.astype("float64") + 1, dtype)
    node = GpuElemwise(comp)(gvar(dtype, 2), gvar(dtype, 2)).owner
    (got,), thunk, storage = run(node, [device_array(emu, hx), device_array(emu, hy)])
    assert got.dtype == dtype
    np.testing.assert_allclose(got.astype("float64"), want, rtol=_HALF_RTOL[dtype], atol=1e-6)
    from symgpu.gpu.runtime.array import GpuArray, c_strides
    raw = device_array(emu, np.concatenate([np.zeros(1, dtype), hx.ravel()]))
    mis = GpuArray.__new__(GpuArray)
    mis._set(emu, raw.ptr + 2, hx.shape, c_strides(hx.shape, 2), np.dtype(dtype), raw)
    storage[node.inputs[0]][0] = mis
    thunk()
    np.testing.assert_allclose(host_view(storage[node.outputs[0]][0]).astype("float64"), want,
                               rtol=_HALF_RTOL[dtype], atol=1e-6)
    storage[node.inputs[0]][0] = device_array(emu, np.ascontiguousarray(hx.T)).transpose()
    thunk()
    np.testing.assert_allclose(host_view(storage[node.outputs[0]][0]).astype("float64"), want,
                               rtol=_HALF_RTOL[dtype], atol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op,axis,shape", [
    ("add", (0,), (20000, 16)),       # tall columns: split rows, then a finish launch
    ("add", (0,), (512, 96)),         # one-launch column blocks
    ("maximum", (1,), (300, 64)),     # rows
    ("add", (1,), (5, 3000)),         # long rows (16-byte vector loads: 8 halves)
    ("add", None, (30001,)),          # everything: partials summed by the last block
])
def test_half_reductions_accumulate_in_float32(emu, dtype, op, axis, shape):
    """Sums of ones: a half accumulator stalls (float16 at 2048, bfloat16 at 256: 256 + 1
    rounds back to 256), float32 counts on; the result is the exact count rounded once to the
    dtype (bit for bit)."""
    rng = np.random.default_rng(shape[-1])
    host = np.ones(shape, dtype) if op == "add" else rng.standard_normal(shape).astype(dtype)
    ax = tuple(range(len(shape))) if axis is None else axis
    node = GpuCAReduce(SCALAR_OPS[op], ax)(gvar(dtype, len(shape))).owner
    (got,), thunk, storage = run(node, [device_array(emu, host)])
    exact = {"add": np.sum, "maximum": np.max}[op](host.astype("float64"), axis=ax)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.astype("float64"), _rounded(exact, dtype))
    thunk()   # again: the one-pass counters were reset by the last block
    np.testing.assert_array_equal(host_view(storage[node.outputs[0]][0]).astype("float64"),
                                  _rounded(exact, dtype))
