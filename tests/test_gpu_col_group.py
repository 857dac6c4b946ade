"""GpuColumnReduceGroup (symgpu/gpu/ops/col_group.py): its kernel runs on the host emulator
against NumPy and against the GpuElemwise and GpuCAReduce nodes it replaces, over the layouts
a step gives it (contiguous, per-row and per-column operands, three leading dims, strided and
misaligned views, ragged widths, row tiles combined by the last block); its modules compile
with nvcc for sm_90."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_on_host import requires_gxx
from emulated_gpu import device_array, emulated_kernel_device, gpu_var, run_node
from gpu_helpers import requires_nvcc
from symgpu.gpu.ops.col_group import ColMember, GpuColumnReduceGroup
from symgpu.scalar.basic import Cast, SCALAR_OPS
from symgpu.scalar.composite import CompositeBuilder

S = SCALAR_OPS


@pytest.fixture
def emu(monkeypatch, tmp_path):
    import symgpu.gpu.ops.col_group as cg
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    monkeypatch.setattr(cg, "_context", lambda name: ctx)
    return ctx


def _gelu_grad(cast: bool = False):
    """(x, b, dy) -> dy * (1 - tanh(x + b)**2), x and dy bfloat16, b float32: the shape of
    the mixed-precision GPT block's GELU backward (``cast``: stored as bfloat16, the map's
    form; else float32, the bias gradient's pre-op)."""
    b = CompositeBuilder()
    x, bias, dy = b.add_input("bfloat16"), b.add_input("float32"), b.add_input("bfloat16")
    h = b.add_op(S["add"], [b.add_op(Cast("float32"), [x])[0], bias])[0]
    t = b.add_op(S["tanh"], [h])[0]
    one_minus = b.add_op(S["sub"], [b.add_constant(1.0, "float32"), b.add_op(S["sqr"], [t])[0]])
    d = b.add_op(S["mul"], [b.add_op(Cast("float32"), [dy])[0], one_minus[0]])
    return b.build(b.add_op(Cast("bfloat16"), d) if cast else d)


def _numpy_gelu_grad(x, bias, dy):
    t = np.tanh(x.astype("float64") + bias)
    return dy.astype("float64") * (1.0 - t * t)


def _gelu_group():
    return GpuColumnReduceGroup([ColMember("add", _gelu_grad(), (0, 1, 2), "float32")],
                                _gelu_grad(cast=True), (0, 1, 2), (True,))


def _gelu_inputs(emu, lead, cols, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(lead + (cols,)).astype("bfloat16")
    dy = rng.standard_normal(lead + (cols,)).astype("bfloat16")
    bias = rng.standard_normal((1,) * len(lead) + (cols,)).astype("float32")
    return (x, bias, dy), [device_array(emu, a) for a in (x, bias, dy)]


def _node(op, dtypes_bcasts):
    out = op(*[gpu_var(d, len(b), b) for d, b in dtypes_bcasts])
    return (out[0] if isinstance(out, list) else out).owner


@requires_gxx
@pytest.mark.parametrize("lead,cols,rows_per_lane", [
    ((8, 64), 256, 8),       # row tiles combined by the last block
    ((3, 5, 7), 136, 1),     # three leading dims, a ragged last tile
    ((40,), 130, 1000),      # one row tile: stored directly; a width that is not a multiple of 4
])
def test_map_and_bias_gradient_in_one_pass_match_numpy(emu, monkeypatch, lead, cols,
                                                      rows_per_lane):
    import symgpu.gpu.ops.col_group as cg
    monkeypatch.setattr(cg._ColGroupThunk, "rows_per_lane", lambda self, K, R: rows_per_lane)
    nd = len(lead) + 1
    node = _node(_gelu_group(), [("bfloat16", (False,) * nd),
                                 ("float32", (True,) * (nd - 1) + (False,)),
                                 ("bfloat16", (False,) * nd)])
    assert [o.dtype for o in node.outputs] == ["bfloat16", "float32"]
    (x, bias, dy), vals = _gelu_inputs(emu, lead, cols)
    (g, gsum), thunk, _ = run_node(node, vals)
    want = _numpy_gelu_grad(x, bias, dy)
    np.testing.assert_allclose(g.astype("float64"), want, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(gsum, want.reshape(-1, cols).sum(0), rtol=1e-4, atol=1e-3)
    grid, G = next(iter(thunk.col_group_thunk.plans.values()))[:2]
    assert (G > 1) == (rows_per_lane == 1 or lead == (8, 64))


def _ln_backward_map():
    """(dy bf16, x f32, mean per row, rstd per row, g per column) -> (dx f32, Cast{bf16}(dx)):
    a two-output map with per-row and per-column operands."""
    b = CompositeBuilder()
    dy, x, mu, rs, g = (b.add_input("bfloat16"), b.add_input("float32"), b.add_input("float32"),
                        b.add_input("float32"), b.add_input("float32"))
    xhat = b.add_op(S["mul"], [b.add_op(S["sub"], [x, mu])[0], rs])[0]
    v = b.add_op(S["mul"], [b.add_op(S["mul"], [b.add_op(Cast("float32"), [dy])[0], g])[0],
                            xhat])[0]
    return b.build([v, b.add_op(Cast("bfloat16"), [v])[0]])


def _gain_grad():
    """(dy, x, mean, rstd) -> dy * (x - mean) * rstd: a layer norm's gain gradient pre-op."""
    b = CompositeBuilder()
    dy, x, mu, rs = (b.add_input("bfloat16"), b.add_input("float32"), b.add_input("float32"),
                     b.add_input("float32"))
    xhat = b.add_op(S["mul"], [b.add_op(S["sub"], [x, mu])[0], rs])[0]
    return b.build(b.add_op(S["mul"], [b.add_op(Cast("float32"), [dy])[0], xhat]))


def _ln_arrays(rng, R, C):
    dy = rng.standard_normal((R, C)).astype("bfloat16")
    x = rng.standard_normal((R, C)).astype("float32")
    mu = rng.standard_normal((R, 1)).astype("float32")
    rs = rng.uniform(0.5, 2, (R, 1)).astype("float32")
    g = rng.standard_normal((1, C)).astype("float32")
    return dy, x, mu, rs, g


_LN_BCAST = [("bfloat16", (False, False)), ("float32", (False, False)),
             ("float32", (False, True)), ("float32", (False, True)), ("float32", (True, False))]


@requires_gxx
@pytest.mark.parametrize("kept", [(True, True), (False, True)])
@pytest.mark.parametrize("cols,view", [(96, None), (98, None), (96, "offset"),
                                       (96, "strided-rows")])
def test_two_output_map_members_on_its_outputs_and_inputs(emu, cols, view, kept):
    """Members reading a map output as stored (the float32 one; the bfloat16 one rounded),
    and one recomputing from the map's inputs, a max among them; a map output read only by
    the group is not written.  Layouts: aligned (one access of 4 columns), a ragged width,
    rows starting off the 16-byte grid and rows with a gap (the scalar path where the
    alignment fails)."""
    rng = np.random.default_rng(cols)
    R = 37
    width = cols + (1 if view == "offset" else 0) + (4 if view == "strided-rows" else 0)
    lo = 1 if view == "offset" else 0
    dy_all = rng.standard_normal((R, width)).astype("bfloat16")
    x_all = rng.standard_normal((R, width)).astype("float32")
    _, _, mu, rs, g = _ln_arrays(rng, R, cols)
    dy, x = dy_all[:, lo:lo + cols], x_all[:, lo:lo + cols]
    members = [ColMember("add", None, (-1,)), ColMember("add", None, (-2,), "float32"),
               ColMember("add", _gain_grad(), (0, 1, 2, 3)), ColMember("maximum", None, (-1,))]
    op = GpuColumnReduceGroup(members, _ln_backward_map(), (0, 1, 2, 3, 4), kept)
    node = _node(op, _LN_BCAST)
    assert len(node.outputs) == sum(kept) + 4
    vals = [device_array(emu, dy_all)[:, lo:lo + cols], device_array(emu, x_all)[:, lo:lo + cols],
            device_array(emu, mu), device_array(emu, rs), device_array(emu, g)]
    got, thunk, _ = run_node(node, vals)
    xhat = (x.astype("float64") - mu) * rs
    dx = dy.astype("float64") * g * xhat
    dx32 = dx.astype("float32")
    outs = got[:sum(kept)]
    if kept[0]:
        np.testing.assert_allclose(outs[0], dx32, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[-1].astype("float32"), dx32.astype("bfloat16").astype(
        "float32"), rtol=1e-2, atol=1e-6)
    s_dx, s_bf, s_gain, mx = got[sum(kept):]
    np.testing.assert_allclose(s_dx, dx32.astype("float64").sum(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(s_bf, dx32.astype("bfloat16").astype("float64").sum(0),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(s_gain, (dy.astype("float64") * xhat).sum(0), rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(mx, dx32.max(0), rtol=1e-6)
    if kept[0]:   # the max of the values written, exactly
        np.testing.assert_array_equal(mx, outs[0].max(0))
    # the bfloat16 member reads the values as stored
    np.testing.assert_allclose(s_bf, outs[-1].astype("float64").sum(0), rtol=1e-5, atol=1e-5)
    meta = next(iter(thunk.col_group_thunk.plans.values()))[-1]
    assert meta[-1] == int(view != "offset" and cols % 4 == 0)    # the vector path


@requires_gxx
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_sibling_sums_without_a_map(emu, dtype):
    """Column reductions sharing an operand, no map: sum, product and min of one operand, a
    sum of squares with a per-row operand; float64 takes 2 columns a thread."""
    rng = np.random.default_rng(7)
    x = (rng.integers(-3, 4, (3, 50, 40)) if dtype == "int32"
         else rng.uniform(0.5, 1.5, (3, 50, 40))).astype(dtype)
    w = rng.integers(1, 3, (3, 50, 1)).astype(dtype)
    b = CompositeBuilder()
    xi, wi = b.add_input(dtype), b.add_input(dtype)
    pre = b.build(b.add_op(S["mul"], [b.add_op(S["sqr"], [xi])[0], wi]))
    members = [ColMember("add", None, (0,)), ColMember("mul", None, (0,)),
               ColMember("minimum", None, (0,)), ColMember("add", pre, (0, 1))]
    node = _node(GpuColumnReduceGroup(members), [(dtype, (False,) * 3),
                                                  (dtype, (False, False, True))])
    s, p, mn, sq = run_node(node, [device_array(emu, x), device_array(emu, w)])[0]
    flat = x.reshape(-1, 40)
    tol = 1e-12 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(s, flat.sum(0, dtype="float64"), rtol=tol)
    np.testing.assert_allclose(p, flat.prod(0, dtype="float64"), rtol=max(tol, 1e-4))
    np.testing.assert_array_equal(mn, flat.min(0))
    np.testing.assert_allclose(sq, (x.astype("float64") ** 2 * w).reshape(-1, 40).sum(0),
                               rtol=tol)
    assert node.op.signature(node).cols_vector == (2 if dtype == "float64" else 4)


@requires_gxx
def test_the_group_equals_the_nodes_it_replaces(emu, monkeypatch):
    """The GELU backward's map and bias gradient run as GpuElemwise + GpuCAReduce on the
    emulator, and as the group: the map's output bit for bit, the sums to rounding."""
    import symgpu.gpu.ops.careduce as cr
    monkeypatch.setattr(cr, "_context", lambda name: emu)
    from symgpu.gpu.ops.careduce import GpuCAReduce
    from symgpu.gpu.ops.elemwise import GpuElemwise
    (x, bias, dy), vals = _gelu_inputs(emu, (4, 33), 512, seed=5)
    pats = [("bfloat16", (False,) * 3), ("float32", (True, True, False)),
            ("bfloat16", (False,) * 3)]
    group = _node(_gelu_group(), pats)
    (g_group, s_group), _, _ = run_node(group, vals)
    emap = _node(GpuElemwise(_gelu_grad(cast=True)), pats)
    red = _node(GpuCAReduce(S["add"], (0, 1), "float32", _gelu_grad()), pats)
    (g_sep,), _, _ = run_node(emap, vals)
    (s_sep,), _, _ = run_node(red, vals)
    np.testing.assert_array_equal(g_group, g_sep)
    np.testing.assert_allclose(s_group, s_sep, rtol=2e-6, atol=1e-5)


@requires_gxx
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sibling_reductions_of_the_operand_itself(emu, dtype):
    """No map and no pre-op (x.sum(0), x.max(0), x.min(0) of a half array: nothing to compute
    but the reductions, the first module the GPU suite found failing to render); sums
    accumulate in float32 and round once."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (3, 70, 36)).astype(dtype)
    members = [ColMember("add", None, (0,)), ColMember("maximum", None, (0,)),
               ColMember("minimum", None, (0,)), ColMember("add", None, (0,), "float32")]
    node = _node(GpuColumnReduceGroup(members), [(dtype, (False,) * 3)])
    assert [o.dtype for o in node.outputs] == [dtype, dtype, dtype, "float32"]
    s, mx, mn, s32 = run_node(node, [device_array(emu, x)])[0]
    flat = x.astype("float32").reshape(-1, 36)
    want = flat.astype("float64").sum(0)
    np.testing.assert_allclose(s32, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(s, s32.astype(dtype))        # the same sum, rounded once
    np.testing.assert_array_equal(mx, x.reshape(-1, 36).max(0))
    np.testing.assert_array_equal(mn, x.reshape(-1, 36).min(0))


def test_bad_members_and_operands_are_refused(vgpu):
    with pytest.raises(ValueError, match="reduces with and_"):
        GpuColumnReduceGroup([ColMember("and_", None, (0,))])
    with pytest.raises(ValueError, match="map outputs past"):
        GpuColumnReduceGroup([ColMember("add", None, (-2,))], _gelu_grad(True), (0, 1, 2),
                             (True,))
    with pytest.raises(TypeError, match="at least 2 dims"):
        GpuColumnReduceGroup([ColMember("add", None, (0,))])(gpu_var("float32", 1))
    # a member whose operands miss a dimension of the group's positions
    op = GpuColumnReduceGroup([ColMember("add", None, (1,))], S["add"], (0, 1), (True,))
    with pytest.raises(TypeError, match="member 0's operands must span every position"):
        op(gpu_var("float32", 2), gpu_var("float32", 2, (True, False)))


@requires_gxx
def test_operands_that_do_not_span_the_positions_at_run_time_are_named(emu):
    """A member summing dy alone where dy has one row at run time (declared full) would sum
    fewer positions than the map writes: refused, with the shapes."""
    op = GpuColumnReduceGroup([ColMember("add", None, (2,), "float32")], _gelu_grad(True),
                              (0, 1, 2), (True,))
    node = _node(op, [("bfloat16", (False,) * 2), ("float32", (True, False)),
                      ("bfloat16", (False,) * 2)])
    (x, bias, dy), vals = _gelu_inputs(emu, (6,), 64)
    vals[2] = device_array(emu, dy[:1])           # one row where 6 are declared
    from gpu_helpers import thunk_over
    thunk, _ = thunk_over(node, vals)
    with pytest.raises(ValueError, match=r"\(1, 64\).*\(6, 64\)"):
        thunk()


@requires_nvcc
def test_the_gpt_blocks_groups_compile_for_sm90_without_spilling(vgpu, tmp_path):
    """Every column group of the mixed-precision GPT block's step (benchmarks/half_symgpu.py)
    compiles for sm_90 within its register bound."""
    import os
    import shutil
    import subprocess
    import sys
    from symgpu import config
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "benchmarks"))
    try:
        import half_symgpu
        with config.change_flags(device="cuda", mixed_precision="bfloat16"):
            step, _, _ = half_symgpu.gpt({})
    finally:
        sys.path.remove(os.path.join(root, "benchmarks"))
        sys.modules.pop("half_symgpu", None)
    groups = [n for n in step.maker.fgraph.toposort() if type(n.op) is GpuColumnReduceGroup]
    assert len(groups) == 3, "the layer norms'; the GELU's gradient is a product's epilogue"
    for i, n in enumerate(groups):
        ((_, src),) = n.op.kernel_sources(n)
        path = tmp_path / f"g{i}.cu"
        path.write_text(src)
        log = subprocess.run([shutil.which("nvcc"), "-arch=sm_90", "-cubin", "-o",
                              str(tmp_path / f"g{i}.cubin"), "-Xptxas", "-v", str(path)],
                             capture_output=True, text=True, check=True).stderr
        props = log.split("Function properties for cg_cols\n")[1].splitlines()[0]
        assert " 0 bytes spill stores" in props, (str(n.op)[:200], props)


@requires_gxx
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_group_the_pass_builds_runs(emu, dtype):
    """The sibling group gpu_col_reduce_group makes of a sum, a kept-dims sum, a float32 sum
    and a max of one operand (tests/test_gpu_col_group_rewrite.py's GPU case, small), run on
    the emulator against NumPy."""
    import symgpu.tensor as T
    from symgpu import config, function
    from symgpu.gpu.placement.rewriting import virtual_context
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.tensor(dtype, (False,) * 3)
        f = function([x], [x.sum(axis=(0, 1)), x.astype("float32").sum(axis=(0, 1)),
                           x.max(axis=(0, 1))])
    (node,) = [n for n in f.maker.fgraph.toposort() if type(n.op) is GpuColumnReduceGroup]
    host = np.random.default_rng(1).uniform(-1, 1, (2, 37, 72)).astype(dtype)
    got = run_node(node, [device_array(emu, host)])[0]
    flat = host.astype("float64").reshape(-1, 72)
    tol = 1e-5 if dtype == "float32" else 1e-2
    ops = [m.reduce_op for m in node.op.members]     # (float32: the two sums are one)
    assert ops == (["add", "maximum"] if dtype == "float32" else ["add", "add", "maximum"])
    for g, op in zip(got, ops):
        want = flat.sum(0) if op == "add" else flat.max(0)
        np.testing.assert_allclose(np.asarray(g, "float64"), want, rtol=tol, atol=tol)


@requires_nvcc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_sibling_modules_without_pre_ops_compile_for_sm90(vgpu, tmp_path, dtype):
    from gpu_helpers import compile_for_sm90
    members = [ColMember("add", None, (0,)), ColMember("maximum", None, (0,))]
    node = _node(GpuColumnReduceGroup(members), [(dtype, (False,) * 2)])
    ((_, src),) = node.op.kernel_sources(node)
    assert "cg_all(" not in src
    assert compile_for_sm90(src, tmp_path)


@requires_gxx
def test_a_view_off_the_vector_grid_gets_its_own_plan(emu):
    """Two calls with arrays of one shape and strides, the second starting one element off
    the 16-byte grid (x[:, 1:97] against x[:, 0:96] of one (R, 100) array): the plans are kept
    apart, the second reads scalars (a vector plan reused would read misaligned)."""
    rng = np.random.default_rng(11)
    whole = rng.standard_normal((40, 100)).astype("float32")
    d = device_array(emu, whole)
    node = _node(GpuColumnReduceGroup([ColMember("add", None, (0,))], S["exp"], (0,), (True,)),
                 [("float32", (False, False))])
    from gpu_helpers import thunk_over
    first = d[:, 0:96]
    thunk, storage = thunk_over(node, [first])
    thunk()
    second = d[:, 1:97]
    assert (second.shape, second.strides) == (first.shape, first.strides)
    storage[node.inputs[0]][0] = second
    thunk()
    from emulated_gpu import host_view
    np.testing.assert_allclose(host_view(storage[node.outputs[1]][0]),
                               whole[:, 1:97].astype("float64").sum(0), rtol=1e-5)
    np.testing.assert_allclose(host_view(storage[node.outputs[0]][0]), np.exp(whole[:, 1:97]),
                               rtol=1e-6)
    vecs = sorted(meta[-1] for *_, meta in thunk.col_group_thunk.plans.values())
    assert vecs == [0, 1]


def test_small_groups_take_more_row_tiles():
    """Rows a lane: 12 where the column tiles and row tiles fill the GPU (the GPT block's
    (8192, 768) layer norm groups), fewer where they would leave multiprocessors idle (a
    (512, 1024) MLP layer's backward: 24 blocks at 12 rows a lane, 13 us on the H200; then 32
    row tiles, the most MAX_ROW_TILES allows)."""
    from symgpu.gpu.ops.col_group import _ColGroupThunk
    from symgpu.gpu.runtime.codegen import layout
    thunk = _ColGroupThunk.__new__(_ColGroupThunk)
    node = _node(_gelu_group(), [("bfloat16", (False, False)), ("float32", (True, False)),
                                 ("bfloat16", (False, False))])
    thunk.sig, thunk.sms = node.op.signature(node), 132
    assert thunk.sig.cols_vector == 8
    assert thunk.rows_per_lane(768, 8192) == 12
    rows = thunk.rows_per_lane(1024, 512)
    grid, G, _ = layout.cols_tile_grid(1024, 512, 8, 132, rows)
    assert rows == 2 and G == 32 and grid[0] * G >= 66
