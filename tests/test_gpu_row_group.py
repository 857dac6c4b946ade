"""GpuRowReduceGroup (symgpu/gpu/ops/row_group.py): its kernels run on the host emulator
against NumPy and against the separate GpuCAReduce nodes it replaces; its modules compile
with nvcc for sm_90."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_on_host import requires_gxx
from emulated_gpu import device_array, emulated_kernel_device, gpu_var, host_view, run_node
from gpu_helpers import compile_for_sm90, requires_nvcc
from symgpu.gpu.ops.careduce import GpuCAReduce
from symgpu.gpu.ops.row_group import GpuRowReduceGroup, RowMember
from symgpu.scalar.basic import SCALAR_OPS
from symgpu.scalar.composite import CompositeBuilder


def _centred_sqr(dtype: str, mean_dtype: str | None = None):
    """sqr(x - s / n) with inputs (s, n, x): a variance's pre-op reading the row sum."""
    b = CompositeBuilder()
    s, n, x = b.add_input(mean_dtype or dtype), b.add_input(dtype), b.add_input(dtype)
    d = b.add_op(SCALAR_OPS["sub"], [x, b.add_op(SCALAR_OPS["true_div"], [s, n])[0]])[0]
    return b.build(b.add_op(SCALAR_OPS["sqr"], [d]))


def _scaled(dtype: str):
    """-(r / c): an epilogue with one operand."""
    b = CompositeBuilder()
    r, c = b.add_input(dtype), b.add_input(dtype)
    return b.build(b.add_op(SCALAR_OPS["neg"], [b.add_op(SCALAR_OPS["true_div"], [r, c])[0]]))


@pytest.fixture
def emu(monkeypatch, tmp_path):
    import symgpu.gpu.ops.row_group as rg
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    monkeypatch.setattr(rg, "_context", lambda name: ctx)
    return ctx


def _layer_norm_group(dtype: str, acc: str | None = None):
    """Members: the row sum of x, the sum of squares about the mean (chained), the row max."""
    mean_dtype = acc or dtype
    return GpuRowReduceGroup([RowMember("add", None, (0,), dtype=acc),
                              RowMember("add", _centred_sqr(dtype, mean_dtype), (-1, 1, 0),
                                        dtype=acc),
                              RowMember("maximum", None, (0,))], 2)


@requires_gxx
@pytest.mark.parametrize("dtype,rows,cols", [("float32", 37, 100), ("float64", 9, 33),
                                             ("float32", 5, 2000),    # a block per row
                                             ("float16", 12, 64)])
def test_siblings_and_a_chain_match_numpy(emu, dtype, rows, cols):
    rng = np.random.default_rng(rows + cols)
    x = (rng.standard_normal((rows, cols)) + 3).astype(dtype)
    n = np.full((1, 1), cols, dtype)
    acc = "float32" if dtype == "float16" else None
    op = _layer_norm_group(dtype, acc)
    node = op(gpu_var(dtype, 2), gpu_var(dtype, 2, (True, True)))[0].owner
    assert [o.dtype for o in node.outputs] == [acc or dtype, acc or dtype, dtype]
    (s, v, mx), thunk, storage = run_node(node, [device_array(emu, x), device_array(emu, n)])
    x64 = x.astype("float64")
    s_want = x64.sum(-1)
    # the chain reads the stored sum (its dtype's rounding), as the separate node would
    mean = s_want.astype(acc or dtype).astype("float64") / cols
    tol = {"float64": 1e-12, "float32": 2e-5, "float16": 2e-5}[dtype]
    np.testing.assert_allclose(s, s_want, rtol=tol)
    np.testing.assert_allclose(v, ((x64 - mean[:, None]) ** 2).sum(-1), rtol=max(tol, 1e-4)
                               if dtype == "float16" else tol)
    np.testing.assert_array_equal(mx, x.max(-1))
    kernel = thunk.row_group_thunk.plans[next(iter(thunk.row_group_thunk.plans))][-1]
    assert kernel == ("rg_block_rows" if cols > 1024 else "rg_warp_rows")


@requires_gxx
def test_strided_column_slices_and_broadcast_operands(emu):
    # four gates' column slices of one (R, 4H) matrix; a per-row and a per-column operand
    rng = np.random.default_rng(3)
    z = rng.standard_normal((16, 4 * 24)).astype("float32")
    col = rng.standard_normal((1, 24)).astype("float32")
    rowv = rng.standard_normal((16, 1)).astype("float32")
    b = CompositeBuilder()
    x, c, r = b.add_input("float32"), b.add_input("float32"), b.add_input("float32")
    pre = b.build(b.add_op(SCALAR_OPS["mul"], [b.add_op(SCALAR_OPS["add"], [x, c])[0], r]))
    members = [RowMember("add", None, (k,)) for k in range(4)]
    members += [RowMember("add", pre, (0, 4, 5), _scaled("float32"), (0,)),
                RowMember("minimum", None, (3,))]
    op = GpuRowReduceGroup(members, 6)
    ins = [gpu_var("float32", 2) for _ in range(4)] + [gpu_var("float32", 2, (True, False)),
                                                       gpu_var("float32", 2, (False, True)),
                                                       gpu_var("float32", 0)]
    node = op(*ins)[0].owner
    zd = device_array(emu, z)
    slices = [zd[:, k * 24:(k + 1) * 24] for k in range(4)]
    assert not slices[1].is_c_contiguous
    vals = slices + [device_array(emu, col), device_array(emu, rowv),
                     device_array(emu, np.float32(3.0))]
    got, _, _ = run_node(node, vals)
    for k in range(4):
        np.testing.assert_allclose(got[k], z[:, k * 24:(k + 1) * 24].sum(-1), rtol=1e-5,
                                   atol=1e-5)
    want = -(((z[:, :24] + col) * rowv).sum(-1)) / 3.0
    np.testing.assert_allclose(got[4], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[5], z[:, 72:].min(-1))


def _ln_backward_group():
    """A layer norm's backward rows, mixed precision: sum(dy * (x - mean)) with dy bfloat16,
    x float32 and the mean one value per row; sum(dy * g) with the gain g a row vector."""
    b = CompositeBuilder()
    dy, x, mu = b.add_input("bfloat16"), b.add_input("float32"), b.add_input("float32")
    dyf = b.add_op(SCALAR_OPS["mul"], [dy, b.add_op(SCALAR_OPS["sub"], [x, mu])[0]])
    pre0 = b.build(dyf)
    b = CompositeBuilder()
    dy, g = b.add_input("bfloat16"), b.add_input("float32")
    pre1 = b.build(b.add_op(SCALAR_OPS["mul"], [dy, g]))
    return GpuRowReduceGroup([RowMember("add", pre0, (0, 1, 2), dtype="float32"),
                              RowMember("add", pre1, (0, 3), dtype="float32")], 4)


@requires_gxx
@pytest.mark.parametrize("cols,view,vec", [(768, None, 1), (2000, None, 1), (770, None, 0),
                                           (768, "offset", 0), (768, "strided-rows", 1)])
def test_four_values_a_lane_where_rows_allow(emu, monkeypatch, cols, view, vec):
    """rg_load4 (4 adjacent values a lane, one 16- or 8-byte load) where every operand along
    the row is unit-stride and each row starts aligned to 4 values and the length is a
    multiple of 4; the same values as one value a lane (VEC off) and as NumPy."""
    import symgpu.gpu.ops.row_group as rg
    rng = np.random.default_rng(cols)
    R = 24
    width = cols + (1 if view == "offset" else 0) + (4 if view == "strided-rows" else 0)
    x_all = rng.standard_normal((R, width)).astype("float32")
    dy_all = rng.standard_normal((R, width)).astype("bfloat16")
    mu = rng.standard_normal((R, 1)).astype("float32")
    g = rng.standard_normal((1, cols)).astype("float32")
    lo = 1 if view == "offset" else 0
    xd, dyd = device_array(emu, x_all)[:, lo:lo + cols], device_array(emu, dy_all)[:, lo:lo + cols]
    x, dy = x_all[:, lo:lo + cols], dy_all[:, lo:lo + cols]
    node = _ln_backward_group()(gpu_var("bfloat16", 2), gpu_var("float32", 2),
                                gpu_var("float32", 2, (False, True)),
                                gpu_var("float32", 2, (True, False)))[0].owner
    vals = [dyd, xd, device_array(emu, mu), device_array(emu, g)]
    got, thunk, _ = run_node(node, vals)
    (plan,) = thunk.row_group_thunk.plans.values()
    assert plan[4][-1] == vec
    dy64 = dy.astype("float64")
    np.testing.assert_allclose(got[0], (dy64 * (x - mu)).sum(-1), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got[1], (dy64 * g).sum(-1), rtol=1e-4, atol=1e-3)
    monkeypatch.setattr(rg._RowGroupThunk, "VEC", False)
    scalar, thunk, _ = run_node(node, vals)
    assert next(iter(thunk.row_group_thunk.plans.values()))[4][-1] == 0
    for a, b in zip(got, scalar):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


@requires_gxx
def test_outputs_equal_the_separate_reductions(emu):
    # a 3-d operand (two kept dims) with a per-row epilogue operand of the kept shape
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 5, 40)).astype("float32")
    n = np.full((1, 1, 1), 40, "float32")
    w = rng.standard_normal((3, 5)).astype("float32")
    post = _scaled("float32")
    op = GpuRowReduceGroup([RowMember("add", None, (0,)),
                            RowMember("add", _centred_sqr("float32"), (-1, 1, 0), post, (0,))], 2)
    node = op(gpu_var("float32", 3), gpu_var("float32", 3, (True, True, True)),
              gpu_var("float32", 2))[0].owner
    got, _, _ = run_node(node, [device_array(emu, x), device_array(emu, n), device_array(emu, w)])
    s_node = GpuCAReduce(SCALAR_OPS["add"], (2,))(gpu_var("float32", 3)).owner
    (s,), _, _ = run_node(s_node, [device_array(emu, x)])
    v_node = GpuCAReduce(SCALAR_OPS["add"], (2,), None, _centred_sqr("float32"), post)(
        gpu_var("float32", 3, (False, False, True)), gpu_var("float32", 3, (True, True, True)),
        gpu_var("float32", 3), gpu_var("float32", 2)).owner
    (v,), _, _ = run_node(v_node, [device_array(emu, s[:, :, None]), device_array(emu, n),
                                   device_array(emu, x), device_array(emu, w)])
    np.testing.assert_allclose(got[0], s, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[1], v, rtol=1e-5, atol=1e-6)


@requires_gxx
def test_errors_name_the_op_and_shapes(emu):
    op = GpuRowReduceGroup([RowMember("add", None, (0,)), RowMember("maximum", None, (1,))], 2)
    node = op(gpu_var("float32", 2), gpu_var("float32", 2))[0].owner
    a = device_array(emu, np.ones((4, 8), "float32"))
    with pytest.raises(ValueError, match=r"GpuRowReduceGroup.*rows differ.*\(4, 8\), \(5, 8\)"):
        run_node(node, [a, device_array(emu, np.ones((5, 8), "float32"))])
    with pytest.raises(ValueError, match="empty row"):
        run_node(node, [device_array(emu, np.ones((4, 0), "float32"))] * 2)


def test_make_node_checks():
    with pytest.raises(ValueError, match="earlier members"):
        GpuRowReduceGroup([RowMember("add", None, (-1,))], 1)
    with pytest.raises(ValueError, match="use one of"):
        GpuRowReduceGroup([RowMember("and_", None, (0,))], 1)
    op = GpuRowReduceGroup([RowMember("add", None, (0,))], 1)
    with pytest.raises(TypeError, match="at least 2 dims"):
        op(gpu_var("float32", 1))


@requires_nvcc
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_group_modules_compile_for_sm90(tmp_path, dtype):
    from symgpu.gpu.placement.rewriting import virtual_context
    acc = "float32" if dtype == "float16" else None
    with virtual_context(None):
        op = GpuRowReduceGroup([RowMember("add", None, (0,), dtype=acc),
                                RowMember("add", _centred_sqr(dtype, acc or dtype), (-1, 1, 0),
                                          _scaled(acc or dtype), (0,), dtype=acc),
                                RowMember("maximum", None, (0,)),
                                RowMember("minimum", None, (0,))], 2)
        node = op(gpu_var(dtype, 3), gpu_var(dtype, 3, (True, True, True)),
                  gpu_var(acc or dtype, 0))[0].owner
        (key, src), = op.kernel_sources(node)
    assert 'extern "C" __global__' in src and "rg_warp_rows" in src and "rg_block_rows" in src
    compile_for_sm90(src, tmp_path)


@requires_nvcc
def test_the_mixed_precision_group_compiles_for_sm90(tmp_path):
    """rg_v4 of bfloat16 (8-byte loads) beside float32 (16-byte loads) in one module."""
    from symgpu.gpu.placement.rewriting import virtual_context
    with virtual_context(None):
        op = _ln_backward_group()
        node = op(gpu_var("bfloat16", 2), gpu_var("float32", 2),
                  gpu_var("float32", 2, (False, True)), gpu_var("float32", 2, (True, False)))[0].owner
        (key, src), = op.kernel_sources(node)
    assert "rg_v4<__nv_bfloat16>" in src and "rg_v4<float>" in src
    compile_for_sm90(src, tmp_path)


@requires_gxx
def test_a_view_off_the_vector_grid_gets_its_own_plan(emu):
    """One node called on x[:, 0:64] then on x[:, 1:65] of one (R, 72) array (one shape, one
    stride, the second off the 16-byte grid): two plans, the second reading one value a lane
    (a 4-wide plan reused by shape alone would have read misaligned vectors)."""
    from gpu_helpers import thunk_over
    from emulated_gpu import host_view
    rng = np.random.default_rng(12)
    whole = rng.standard_normal((24, 72)).astype("float32")
    d = device_array(emu, whole)
    node = GpuRowReduceGroup([RowMember("add", None, (0,)), RowMember("maximum", None, (0,))],
                             1)(gpu_var("float32", 2))[0].owner
    first, second = d[:, 0:64], d[:, 1:65]
    assert (second.shape, second.strides) == (first.shape, first.strides)
    thunk, storage = thunk_over(node, [first])
    thunk()
    storage[node.inputs[0]][0] = second
    thunk()
    np.testing.assert_allclose(host_view(storage[node.outputs[0]][0]),
                               whole[:, 1:65].sum(-1), rtol=1e-5)
    np.testing.assert_array_equal(host_view(storage[node.outputs[1]][0]), whole[:, 1:65].max(-1))
    assert sorted(p[4][-1] for p in thunk.row_group_thunk.plans.values()) == [0, 1]
