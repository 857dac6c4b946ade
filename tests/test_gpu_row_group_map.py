"""GpuRowReduceGroup's per-row applies and row map (symgpu/gpu/ops/row_group.py): a layer norm's
forward in one launch, its kernels run on the host emulator against NumPy (float32, float16 and
bfloat16 outputs, a warp and a block per row, gains broadcast over the rows, strided views);
its modules compile with nvcc for sm_90."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_on_host import requires_gxx
from emulated_gpu import device_array, emulated_kernel_device, gpu_var, run_node
from gpu_helpers import compile_for_sm90, requires_nvcc
from symgpu.gpu.ops.row_group import GpuRowReduceGroup, RowApply, RowMember
from symgpu.scalar.basic import SCALAR_OPS, Cast
from symgpu.scalar.composite import CompositeBuilder

EPS = 1e-5
ADD, SUB, MUL, DIV = (SCALAR_OPS[k] for k in ("add", "sub", "mul", "true_div"))


def _centred_sqr():
    """sqr(x - s / n), inputs (s, n, x): the variance's pre-op reading the row sum."""
    b = CompositeBuilder()
    s, n, x = b.add_input("float32"), b.add_input("float32"), b.add_input("float32")
    d = b.add_op(SUB, [x, b.add_op(DIV, [s, n])[0]])[0]
    return b.build(b.add_op(SCALAR_OPS["sqr"], [d]))


def _std(b, v, n):
    return b.add_op(SCALAR_OPS["sqrt"], [b.add_op(ADD, [b.add_constant(EPS, "float32"),
                                                         b.add_op(DIV, [v, n])[0]])[0]])[0]


def _std_and_var():
    """(sqrt(eps + v / n), its square), inputs (v, n): LN2's per-row node, two outputs."""
    b = CompositeBuilder()
    v, n = b.add_input("float32"), b.add_input("float32")
    sd = _std(b, v, n)
    return b.build([sd, b.add_op(MUL, [sd, sd])[0]])


def _normalise(out: str, std_given: bool):
    """Cast{out}((x - s / n) * g / std + b), inputs (x, s, n, g, std or v, b): LN1's map
    computes the std from the variance sum v, LN2's reads the per-row apply's."""
    b = CompositeBuilder()
    x, s, n, g, v, beta = (b.add_input("float32") for _ in range(6))
    sd = v if std_given else _std(b, v, n)
    c = b.add_op(MUL, [b.add_op(SUB, [x, b.add_op(DIV, [s, n])[0]])[0], g])[0]
    y = b.add_op(ADD, [b.add_op(DIV, [c, sd])[0], beta])[0]
    return b.build([y if out == "float32" else b.add_op(Cast(out), [y])[0]])


def layer_norm_group(out: str, std_apply: bool) -> GpuRowReduceGroup:
    """Row operands (x, n, g, b), x (R.., C), n one value, g and b one value a column; the row
    sum and the centred sum of squares; with ``std_apply`` a per-row apply (std, var) the map
    reads (LN2), else the map computes the std itself (LN1)."""
    members = [RowMember("add", None, (0,)), RowMember("add", _centred_sqr(), (-1, 1, 0))]
    per_row = [RowApply(_std_and_var(), (("res", 1), ("ex", 0)))] if std_apply else []
    sd = ("app", 0) if std_apply else ("res", 1)
    row_map = RowApply(_normalise(out, std_apply),
                       (("row", 0), ("res", 0), ("ex", 0), ("row", 2), sd, ("row", 3)))
    return GpuRowReduceGroup(members, 4, per_row, row_map)


@pytest.fixture
def emu(monkeypatch, tmp_path):
    import symgpu.gpu.ops.row_group as rg
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    monkeypatch.setattr(rg, "_context", lambda name: ctx)
    return ctx


def _want(x, g, b):
    x64 = x.astype("float64")
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    return (x64 - mu) / np.sqrt(var + EPS) * g + b, var


def _node(op, nd: int):
    bc = lambda last: (True,) * (nd - 1) + (last,)   # noqa: E731
    return op(gpu_var("float32", nd), gpu_var("float32", nd, (True,) * nd),
              gpu_var("float32", nd, bc(False)), gpu_var("float32", nd, bc(False)),
              gpu_var("float32", nd, (True,) * nd))[0].owner


#: (rtol, atol) of each output dtype against the float64 reference (its rounding on store)
TOL = {"float32": (2e-5, 2e-5), "float16": (2e-3, 4e-3), "bfloat16": (1e-2, 2e-2)}


@requires_gxx
@pytest.mark.parametrize("out", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("std_apply", [False, True], ids=["ln1", "ln2"])
@pytest.mark.parametrize("cols", [768, 2000, 770], ids=["warp", "block", "warp-scalar"])
def test_a_layer_norm_forward_in_one_launch(emu, out, std_apply, cols):
    rng = np.random.default_rng(cols)
    B, S = 3, 5
    x = (rng.standard_normal((B, S, cols)) * 2 + 1).astype("float32")
    g = rng.standard_normal((1, 1, cols)).astype("float32")
    b = rng.standard_normal((1, 1, cols)).astype("float32")
    n = np.full((1, 1, 1), cols, "float32")
    node = _node(layer_norm_group(out, std_apply), 3)
    vals = [device_array(emu, a) for a in (x, n, g, b, n)]
    got, thunk, _ = run_node(node, vals)
    want, var = _want(x, g, b)
    assert got[-1].dtype == np.dtype(out) and got[-1].shape == x.shape
    np.testing.assert_allclose(got[-1].astype("float64"), want, *TOL[out])
    # the members' outputs stay (the backward reads them); the per-row apply's too
    np.testing.assert_allclose(got[0], x.astype("float64").sum(-1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got[1] / cols, var[..., 0], rtol=1e-4)
    if std_apply:
        assert got[2].shape == (B, S, 1)
        np.testing.assert_allclose(got[2], np.sqrt(var + EPS), rtol=1e-5)
        np.testing.assert_allclose(got[3], var + EPS, rtol=1e-5)
    (plan,) = thunk.row_group_thunk.plans.values()
    assert plan[-1] == ("rg_block_rows" if cols > 1024 else "rg_warp_rows")
    assert plan[4][-1] == int(cols % 4 == 0)


@requires_gxx
@pytest.mark.parametrize("view", ["offset", "strided-rows", "transposed-rows"])
def test_views_and_strided_operands(emu, monkeypatch, view):
    """x a view (off the 16-byte grid, rows padded, the kept dims transposed), the gain a
    strided column of a matrix: the same values as NumPy, and 4 values a lane only where the
    layout allows (one value a lane gives the same)."""
    import symgpu.gpu.ops.row_group as rg
    rng = np.random.default_rng(11)
    C = 64
    whole = rng.standard_normal((6, 4, C + 8)).astype("float32")
    gb = rng.standard_normal((C, 2)).astype("float32")
    d = device_array(emu, whole)
    if view == "offset":
        xd, x = d[:, :, 1:C + 1], whole[:, :, 1:C + 1]
    elif view == "strided-rows":
        xd, x = d[:, :, :C], whole[:, :, :C]
    else:
        xd, x = d[:, :, :C].transpose(1, 0, 2), whole[:, :, :C].transpose(1, 0, 2)
    gd = device_array(emu, gb)
    g, b = gb[:, 0].reshape(1, 1, C), gb[:, 1].reshape(1, 1, C)
    gv = gd[:, 0].reshape((1, 1, C)) if hasattr(gd[:, 0], "reshape") else None
    if gv is None or gv.strides[-1] != 8:
        pytest.skip("the GpuArray view API differs")
    node = _node(layer_norm_group("float32", False), 3)
    n = device_array(emu, np.full((1, 1, 1), C, "float32"))
    vals = [xd, n, gv, device_array(emu, b), n]
    got, thunk, _ = run_node(node, vals)
    want, _ = _want(x, g, b)
    np.testing.assert_allclose(got[-1], want, rtol=1e-4, atol=1e-4)
    assert got[-1].flags.c_contiguous
    (plan,) = thunk.row_group_thunk.plans.values()
    assert plan[4][-1] == 0    # the gain's column is not unit-stride
    monkeypatch.setattr(rg._RowGroupThunk, "VEC", False)
    again, _, _ = run_node(node, vals)
    np.testing.assert_array_equal(again[-1], got[-1])


@requires_gxx
def test_a_two_dim_map_with_several_outputs_and_a_per_row_array(emu):
    """A (R, C) group, the map's two outputs (float32 and bfloat16) reading a per-row array
    that is no member's (a row operand of last dim 1) and the kept-shape epilogue operand."""
    rng = np.random.default_rng(5)
    R, C = 19, 96
    x = rng.standard_normal((R, C)).astype("float32")
    w = rng.standard_normal((R, 1)).astype("float32")
    e = rng.standard_normal(R).astype("float32")
    b = CompositeBuilder()
    xi, s, wi, ei = (b.add_input("float32") for _ in range(4))
    y = b.add_op(MUL, [b.add_op(SUB, [xi, s])[0], wi])[0]
    z = b.add_op(ADD, [y, ei])[0]
    row_map = RowApply(b.build([y, b.add_op(Cast("bfloat16"), [z])[0]]),
                       (("row", 0), ("res", 0), ("row", 1), ("ex", 0)))
    op = GpuRowReduceGroup([RowMember("maximum", None, (0,))], 2, (), row_map)
    node = op(gpu_var("float32", 2), gpu_var("float32", 2, (False, True)),
              gpu_var("float32", 1))[0].owner
    assert [o.dtype for o in node.outputs] == ["float32", "float32", "bfloat16"]
    got, _, _ = run_node(node, [device_array(emu, a) for a in (x, w, e)])
    yw = (x - x.max(-1, keepdims=True)) * w
    np.testing.assert_allclose(got[1], yw, rtol=1e-6)
    np.testing.assert_allclose(got[2].astype("float32"), yw + e[:, None], rtol=1e-2, atol=1e-2)


@requires_gxx
def test_errors_name_the_op_and_shapes(emu):
    node = _node(layer_norm_group("float32", False), 3)
    x = device_array(emu, np.ones((2, 3, 8), "float32"))
    n = device_array(emu, np.full((1, 1, 1), 8, "float32"))
    g = device_array(emu, np.ones((1, 1, 8), "float32"))
    with pytest.raises(ValueError, match=r"GpuRowReduceGroup.*\(1, 1, 9\)"):
        run_node(node, [x, n, g, device_array(emu, np.ones((1, 1, 9), "float32")), n])
    with pytest.raises(ValueError, match=r"GpuRowReduceGroup.*row map.*\(2, 3\)"):
        run_node(node, [x, n, device_array(emu, np.ones((4, 3, 8), "float32")), g, n])


def test_make_node_checks():
    members = [RowMember("add", None, (0,))]
    b = CompositeBuilder()
    v = b.add_input("float32")
    neg = b.build(b.add_op(SCALAR_OPS["neg"], [v]))
    with pytest.raises(ValueError, match="earlier per-row output"):
        GpuRowReduceGroup(members, 1, [RowApply(neg, (("app", 0),))])
    with pytest.raises(ValueError, match="takes 1 values, given 2"):
        GpuRowReduceGroup(members, 1, (), RowApply(neg, (("row", 0), ("res", 0))))
    op = GpuRowReduceGroup(members, 1, (), RowApply(neg, (("res", 0),)))
    with pytest.raises(TypeError, match="no operand along the row"):
        op(gpu_var("float32", 2))
    op = GpuRowReduceGroup(members, 2, [RowApply(neg, (("row", 1),))])
    with pytest.raises(TypeError, match="not one value per row"):
        op(gpu_var("float32", 2), gpu_var("float32", 2))


def test_a_group_without_applies_renders_the_source_it_did():
    """No per-row apply and no map: the module is the one GpuRowReduceGroup rendered before
    (no map fields, no extra pointers)."""
    from symgpu.gpu.placement.rewriting import virtual_context
    with virtual_context(None):
        op = GpuRowReduceGroup([RowMember("add", None, (0,)),
                                RowMember("add", _centred_sqr(), (-1, 1, 0))], 2)
        node = op(gpu_var("float32", 3), gpu_var("float32", 3, (True,) * 3))[0].owner
        (_, src), = op.kernel_sources(node)
    assert "CM" not in src and "mout" not in src and "aout" not in src and "${" not in src
    assert ("long long C[RG_NM];                  /* each member's row length */\n"
            "    long long vec;") in src


@requires_nvcc
@pytest.mark.parametrize("out", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("std_apply", [False, True], ids=["ln1", "ln2"])
def test_map_modules_compile_for_sm90(tmp_path, out, std_apply):
    from symgpu.gpu.placement.rewriting import virtual_context
    with virtual_context(None):
        node = _node(layer_norm_group(out, std_apply), 3)
        (_, src), = node.op.kernel_sources(node)
    assert "rg_map(" in src and ("rg_app0(" in src) == std_apply
    compile_for_sm90(src, tmp_path)
