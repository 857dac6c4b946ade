"""Kernel generation (symgpu/gpu/runtime/codegen): layout planning and rendering on the CPU, and every
module the generator emits for a representative set of graphs compiled with nvcc for sm_90
(``nvcc`` marker; no GPU needed).  GPU results are checked in test_gpu_ops.py."""
from __future__ import annotations

import concurrent.futures
import re

import numpy as np
import pytest

from gpu_helpers import (fake_gpu_array, fake_kernel_device, gpu_vector_maker,
                         requires_nvcc, thunk_over, virtual_context)
from symgpu.config import config
from symgpu.gpu.runtime import compiler
from symgpu.gpu.ops.blas import GpuAllocEmpty, GpuDot22, GpuGemm, GpuGemv, _colmajor
from symgpu.gpu.runtime.codegen import layout
from symgpu.gpu.runtime.codegen.elemwise import ElemwiseSignature, kernel_names, render_elemwise
from symgpu.gpu.runtime.codegen.reduce import KERNELS, ReduceSignature, render_reduce
from symgpu.gpu.runtime.codegen.scalar import ScalarRenderer, render_apply_function, supports_scalar_op
from symgpu.gpu.runtime.codegen.types import SUPPORTED, literal
from symgpu.gpu.ops.elemwise import GpuCAReduce, GpuElemwise
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.scalar.basic import SCALAR_OPS, SCALAR_TABLE, Cast
from symgpu.scalar.composite import CompositeBuilder

CTX = "codegen-test"


virtual_ctx = virtual_context(CTX)
gvar = gpu_vector_maker(CTX)


# ============================================================================ layout (CPU)
def test_broadcast_shapes_and_error_names_every_shape():
    assert layout.broadcast_shapes([(3, 1), (1, 4), (3, 4)]) == (3, 4)
    with pytest.raises(ValueError, match=r"\(3, 2\).*\(3, 4\)"):
        layout.broadcast_shapes([(3, 2), (3, 4)], "GpuElemwise{add}")


def test_collapse_merges_contiguous_dims_and_drops_ones():
    # C-contiguous (2, 3, 4) floats and a broadcast row: the first collapses fully
    shape, strides = layout.collapse([2, 3, 4], [[12, 4, 1]])
    assert shape == [24] and strides == [[1]]
    shape, strides = layout.collapse([2, 3, 4], [[12, 4, 1], [0, 0, 1]])
    assert shape == [6, 4] and strides == [[4, 1], [0, 1]]
    shape, strides = layout.collapse([5, 1, 7], [[7, 99, 1]])
    assert shape == [35] and strides == [[1]]
    shape, strides = layout.collapse([1, 1], [[3, 1], [0, 0]])
    assert shape == [1] and strides == [[0], [0]]
    # a transpose does not merge
    shape, strides = layout.collapse([3, 4], [[1, 3]])
    assert shape == [3, 4] and strides == [[1, 3]]


def test_element_strides_zero_where_broadcast():
    assert layout.element_strides((1, 4), (16, 4), 4, (3, 4)) == [0, 1]
    assert layout.element_strides((3, 1), (4, 4), 4, (3, 4)) == [1, 0]
    with pytest.raises(ValueError):
        layout.element_strides((3,), (6,), 4, (3,))


def test_fits_32bit():
    assert layout.fits_32bit(1000, 256 * 1056, [10, 100], [[100, 1]])
    assert not layout.fits_32bit(2 ** 32 - 10, 256, [2 ** 32 - 10], [[1]])
    assert not layout.fits_32bit(10, 256, [3, 5], [[2 ** 31, 1]])


@pytest.mark.parametrize("shape,axes,strategy,knd,rnd", [
    ((1000, 512), (1,), "rows", 1, 1),          # trailing axis of C order: threads along rows
    ((1000, 512), (0,), "cols", 1, 1),          # leading axis: threads along kept columns
    ((1 << 20,), (0,), "rows", 1, 1),           # everything
    ((8, 9, 10), (1,), "cols", 2, 1),           # middle axis: kept dims 0 and 2 do not merge
    ((8, 9, 10), (0, 2), "rows", 1, 2),
    ((8, 9, 10), (1, 2), "rows", 1, 1),
])
def test_plan_reduction_strategies(shape, axes, strategy, knd, rnd):
    strides = [list(layout_c(shape))]
    p = layout.plan_reduction(shape, strides, axes, 132)
    assert (p.strategy, p.knd, p.rnd) == (strategy, knd, rnd)
    assert p.K * p.R == int(np.prod(shape))
    assert p.G >= 1 and p.chunk * p.G >= p.R
    assert len(p.meta()) == p.knd + p.rnd + 1 * (p.knd + p.rnd)


def layout_c(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def test_plan_reduction_splits_long_rows_over_blocks():
    p = layout.plan_reduction((1 << 26,), [[1]], (0,), 132)
    assert p.K == 1 and p.G > 100 and p.grid[1] == p.G and p.block == (256, 1, 1)
    p = layout.plan_reduction((100000, 1000), [[1000, 1]], (1,), 132)
    assert p.G == 1                               # enough rows to fill the GPU


def test_outputs_reused_from_the_previous_call_are_those_that_never_leave_it():
    """Buffer reuse without reference counts: a node may compute into the array its cell
    still holds only when neither its output nor a view of it is a function output."""
    import symgpu.tensor as T
    from symgpu.graph.fg import FunctionGraph
    from symgpu.gpu.exec.graph_plan import escaping, mark_reusable_outputs
    x = T.vector("x")
    t = x + 1
    v = t.dimshuffle("x", 0)          # a view of t: t leaves the call through it
    u = x * 2
    w = u.sum()
    fg = FunctionGraph([x], [v, w], clone=False)
    esc = escaping(fg)
    assert v in esc and t in esc and w in esc and u not in esc and x not in esc

    class Thunk:
        def __init__(self, n):
            self.reuse_outputs = [False] * n

    class VM:
        nodes = [t.owner, v.owner, u.owner, w.owner]
        thunks = [Thunk(1), Thunk(1), Thunk(1), Thunk(1)]
        fgraph = fg
    mark_reusable_outputs(VM)
    assert [th.reuse_outputs[0] for th in VM.thunks] == [False, False, True, False]


def test_blas_layouts():
    class M:
        def __init__(self, shape, strides, itemsize=4):
            self.shape, self.strides, self.dtype = shape, strides, np.dtype(f"f{itemsize}")
    assert _colmajor(M((3, 5), (20, 4))) == (0, 5)      # C order: A^T column-major, ld 5
    assert _colmajor(M((3, 5), (4, 12))) == (1, 3)      # F order: A itself, ld 3
    assert _colmajor(M((3, 5), (40, 4))) == (0, 10)     # a row slice keeps its row stride
    assert _colmajor(M((3, 5), (40, 8))) is None        # both strided: copy first
    assert _colmajor(M((1, 5), (0, 4))) == (0, 5)       # length-1 dims take any stride


# ============================================================================ rendering (CPU)
def test_half_literals_are_the_values_the_dtype_holds():
    assert literal(0.1, "bfloat16") == "0.10009765625f"
    assert literal(0.1, "float16") == "0.0999755859375f"
    assert literal(np.inf, "bfloat16") == "__int_as_float(0x7f800000)"
    assert literal(1e6, "float16") == "__int_as_float(0x7f800000)"   # past 65504: inf


def test_literals_are_exact_and_nan_inf_safe():
    assert literal(0.1, "float32") == "0.10000000149011612f"
    assert literal(0.1, "float64") == "0.1"
    assert literal(float("inf"), "float32") == "__int_as_float(0x7f800000)"
    assert "0x7ff8" in literal(float("nan"), "float64")
    assert literal(-(2 ** 63), "int64") == "(-9223372036854775807LL - 1)"
    assert literal(True, "bool") == "true"


def test_operands_are_converted_like_numpy():
    r = ScalarRenderer()
    (name, dtype), = r.apply(SCALAR_OPS["add"], ["int32", "float32"], ["a", "b"])
    assert dtype == "float64" and "((double)(a))" in r.lines[-1] and "((double)(b))" in r.lines[-1]
    r = ScalarRenderer()
    (_, dtype), = r.apply(SCALAR_OPS["lt"], ["int8", "float32"], ["a", "b"])
    assert dtype == "bool" and "((float)(a))" in r.lines[-1]
    r = ScalarRenderer()
    (_, dtype), = r.apply(SCALAR_OPS["add"], ["int8", "int8"], ["a", "b"])
    assert dtype == "int8" and r.lines[-1].startswith("const signed char")  # wraps like NumPy
    r = ScalarRenderer()
    r.apply(SCALAR_OPS["exp"], ["float16"], ["a"])
    assert r.lines[-1].startswith("const float") and "expf" in r.lines[-1]
    r = ScalarRenderer()
    r.apply(SCALAR_OPS["switch"], ["bool", "float32", "float64"], ["c", "a", "b"])
    assert "(c) ?" in r.lines[-1].replace("((c))", "(c)")


def test_supports_scalar_op():
    assert supports_scalar_op(SCALAR_OPS["exp"], ["float32"])
    assert not supports_scalar_op(SCALAR_OPS["exp"], ["complex64"])


def _composite():
    b = CompositeBuilder()
    x, y = b.add_input("float16"), b.add_input("int32")
    half = b.add_constant(0.5, "float32")
    t = b.add_op(SCALAR_OPS["tanh"], [b.add_op(SCALAR_OPS["mul"], [x, half])[0]])[0]
    s = b.add_op(SCALAR_OPS["add"], [t, y])[0]
    flag = b.add_op(SCALAR_OPS["gt"], [s, half])[0]
    return b.build([s, flag])


def test_composite_renders_typed_temporaries_and_several_outputs():
    comp = _composite()
    src, outs = render_apply_function(comp, ["float16", "int32"])
    assert outs == ["float64", "bool"]
    assert "double &r0, bool &r1" in src and "tanhf" in src and "0.5f" in src


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_values_compute_in_float_and_round_on_store_or_explicit_cast(dtype):
    """Issue 34: half operands are loaded into float, computed in float and rounded once by
    the store; a cast to a half dtype in the middle of a chain rounds where it stands."""
    storage = {"float16": "__half", "bfloat16": "__nv_bfloat16"}[dtype]
    to_half = {"float16": "__float2half_rn", "bfloat16": "__float2bfloat16_rn"}[dtype]
    b = CompositeBuilder()
    x = b.add_input("float32")
    r = b.add_op(Cast(dtype), [x])[0]
    y = b.add_op(SCALAR_OPS["mul"], [r, r])[0]
    src, outs = render_apply_function(b.build([y]), ["float32"])
    assert outs == [dtype] and "float &r0" in src
    assert src.count(to_half) == 1                  # the cast, not the product
    module = render_elemwise(ElemwiseSignature(SCALAR_OPS["exp"], (dtype,), (False,), 2))
    assert f"const {storage} *in0" in module and f"{storage} *out0" in module
    assert "sg_load(p.in0[i])" in module and "sg_store(p.out0[i], r0)" in module
    assert f"sg_vec4<{storage}>" in module          # 4 halves: one 8-byte access
    red = render_reduce(ReduceSignature("add", None, (dtype,), dtype, 1, 1))
    assert "typedef float acc_t;   /* float32 */" in red and f"typedef {storage} out_t" in red


def test_elemwise_module_has_every_kernel_and_extern_c():
    sig = ElemwiseSignature(SCALAR_OPS["exp"], ("float32",), (False,), 3)
    src = render_elemwise(sig)
    for name in kernel_names(sig):
        assert f" {name}" in src
    assert src.count('extern "C"') >= 3 and "#include <cuda_fp16.h>" in src


def test_gpu_ops_print_like_theano():
    x = gvar("float32")
    assert str(GpuElemwise(SCALAR_OPS["exp"])(x).owner.op) == "GpuElemwise{exp,no_inplace}"
    assert str(GpuElemwise(SCALAR_OPS["add"], {0: 0})(x, x).owner.op) == \
        "GpuElemwise{add}[(0, 0)]"
    m = gvar("float32", (False, False))
    r = GpuCAReduce(SCALAR_OPS["add"], (1,), None, SCALAR_OPS["sqr"])(m)
    assert str(r.owner.op) == "GpuCAReduce{pre=sqr,red=add}{1}"
    assert r.type == GpuArrayType("float32", (False,), CTX)
    assert str(GpuGemv(True)) == "GpuGemv{inplace}" and str(GpuDot22()) == "GpuDot22"


def test_gpu_elemwise_pads_and_broadcasts_types():
    m, row = gvar("float32", (False, False)), gvar("float64", (True, False))
    out = GpuElemwise(SCALAR_OPS["add"])(m, row)
    assert out.type == GpuArrayType("float64", (False, False), CTX)
    v = gvar("float32")
    out = GpuElemwise(SCALAR_OPS["mul"])(m, v)
    assert out.ndim == 2 and type(out.owner.inputs[1].owner.op).__name__ == "GpuDimShuffle"
    with pytest.raises(TypeError, match="in place"):
        GpuElemwise(SCALAR_OPS["add"], {0: 0})(row, m)


def test_blas_nodes_type_check():
    m, v = gvar("float32", (False, False)), gvar("float32")
    assert GpuDot22()(m, m).type == m.type
    assert GpuGemv(False)(v, 1.0, m, v, 0.0).type == v.type
    assert GpuGemm(True)(m, 1.0, m, m, 1.0).owner.op.destroy_map == {0: [0]}
    with pytest.raises(TypeError):
        GpuDot22()(m, gvar("float64", (False, False)))
    assert GpuAllocEmpty("float32", CTX)(3).type.ndim == 1


# ============================================================================ nvcc (sm_90)
def _every_row_composite(dtype: str):
    """One Composite whose outputs are every table row (and casts) that accepts ``dtype``:
    compiling it checks all CUDA templates of that kind at once."""
    b = CompositeBuilder()
    args = [b.add_input(dtype) for _ in range(3)]
    cond = b.add_input("bool")
    outs = []
    for spec in SCALAR_TABLE:
        if spec.cuda is None:  # host-only rows (psi, chi2sf): no CUDA template to check
            continue
        op = SCALAR_OPS[spec.name]
        n = 2 if spec.nin < 0 else spec.nin
        ins = [cond] + args[:2] if spec.name == "switch" else args[:n]
        try:
            op.output_dtype(*[dtype if i is not cond else "bool" for i in ins])
        except (TypeError, ValueError):
            continue
        outs += b.add_op(op, ins)
    for target in ("bool", "int8", "uint16", "int64", "float16", "bfloat16", "float32",
                   "float64"):
        outs += b.add_op(Cast(target), args[:1])
    return b.build(outs), [dtype] * 3 + ["bool"]


def _nodes():
    """GPU nodes whose kernels CI compiles: elementwise (layouts, dtypes, a Composite from
    fusion, in-place) and reductions over each axis pattern, with and without a pre-op."""
    S = SCALAR_OPS
    nodes = []
    mat = lambda d: gvar(d, (False, False))
    nodes.append(GpuElemwise(S["exp"])(gvar("float32")).owner)
    nodes.append(GpuElemwise(S["add"])(mat("float32"), gvar("float32", (True, False))).owner)
    nodes.append(GpuElemwise(S["mul"])(gvar("float32", (False, False, False)),
                                       gvar("float32", ())).owner)
    nodes.append(GpuElemwise(S["add"], {0: 0})(mat("float32"), mat("float32")).owner)
    nodes.append(GpuElemwise(_composite())(mat("float16"), gvar("int32", (True, False)))[0].owner)
    comp, in_dtypes = _every_row_composite("float32")
    nodes.append(GpuElemwise(comp)(*[gvar(d) for d in in_dtypes])[0].owner)
    nodes.append(GpuElemwise(S["add"])(gvar("int32"), gvar("float32")).owner)
    nodes.append(GpuElemwise(S["switch"])(gvar("bool"), gvar("float16"), gvar("float64")).owner)
    x3 = lambda d: gvar(d, (False, False, False))
    for axes in (None, (0,), (2,), (0, 1), (1, 2), (1,), (0, 2)):
        nodes.append(GpuCAReduce(S["add"], axes)(x3("float32")).owner)
    nodes.append(GpuCAReduce(S["add"], None, None, S["sqr"])(x3("float32")).owner)
    nodes.append(GpuCAReduce(S["add"], (1,), None, S["sub"])(mat("float64"),
                                                             gvar("float32", (True, False))).owner)
    nodes.append(GpuCAReduce(S["add"], (0,))(mat("int8")).owner)
    nodes.append(GpuCAReduce(S["add"], (1,))(mat("float16")).owner)
    nodes.append(GpuCAReduce(S["mul"], (0,))(mat("float64")).owner)
    nodes.append(GpuCAReduce(S["maximum"], (1,))(mat("uint8")).owner)
    nodes.append(GpuCAReduce(S["minimum"], None)(mat("float32")).owner)
    nodes.append(GpuCAReduce(S["maximum"], (0,))(mat("int64")).owner)
    nodes.append(GpuCAReduce(S["and_"], (1,))(mat("bool")).owner)
    nodes.append(GpuCAReduce(S["or_"], None, None, S["gt"])(mat("float32"), gvar("float32", ())
                                                            ).owner)
    nodes.append(GpuCAReduce(S["add"], None)(gvar("float32", ())).owner)
    # bfloat16 (and float16 beside it): vector and strided elementwise kernels, a mixed
    # bfloat16 + float16 add (float32), reductions accumulating in float32 with a pre-op
    bf = lambda shape=(False, False): gvar("bfloat16", shape)
    nodes.append(GpuElemwise(S["exp"])(bf()).owner)
    nodes.append(GpuElemwise(S["mul"])(bf(), gvar("bfloat16", (True, False))).owner)
    nodes.append(GpuElemwise(S["add"])(bf(), mat("float16")).owner)
    nodes.append(GpuElemwise(Cast("bfloat16"))(mat("float32")).owner)
    comp, in_dtypes = _every_row_composite("bfloat16")
    nodes.append(GpuElemwise(comp)(*[gvar(d) for d in in_dtypes])[0].owner)
    for axes in (None, (0,), (1,)):
        nodes.append(GpuCAReduce(S["add"], axes)(bf()).owner)
    nodes.append(GpuCAReduce(S["maximum"], (1,))(bf()).owner)
    nodes.append(GpuCAReduce(S["add"], (1,), None, S["sqr"])(bf()).owner)
    nodes.append(GpuCAReduce(S["mul"], (0,))(mat("float16")).owner)
    return nodes


def _sources():
    seen, out = set(), []
    for node in _nodes():
        for key, src in node.op.kernel_sources(node):
            if key not in seen:
                seen.add(key)
                out.append((str(node.op), src))
    return out


@pytest.fixture(scope="module")
def cachedir(tmp_path_factory):
    root = tmp_path_factory.mktemp("codegen-cache")
    compiler.clear_memory_cache()
    with config.change_flags(compiledir=str(root), compile_log=False, **{"nvcc.flags": ""}):
        yield root
    compiler.clear_memory_cache()


@requires_nvcc
def test_every_generated_module_compiles_for_sm_90(cachedir):
    sources = _sources()
    assert len(sources) >= 20

    def build(item):
        label, src = item
        try:
            compiler.compile_to_cubin(src, (), "sm_90")
        except compiler.CompileError as exc:
            return f"{label}: {exc}"
        return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        failures = [f for f in pool.map(build, sources) if f]
    assert not failures, "\n\n".join(failures[:3])


@requires_nvcc
def test_every_table_row_renders_for_every_dtype(cachedir):
    """One translation unit with, per dtype, the rendered function of a Composite made of
    every row that accepts it, called from one kernel (faster than a module per dtype)."""
    from symgpu.gpu.runtime.codegen import common_source
    from symgpu.gpu.runtime.codegen.types import storage_ctype, value_ctype
    parts = [common_source()]
    for dtype in SUPPORTED:
        comp, in_dtypes = _every_row_composite(dtype)
        name = f"apply_{dtype}"
        src, outs = render_apply_function(comp, in_dtypes, name=name)
        parts.append(src)
        params = ", ".join(f"const {storage_ctype(d)} *in{i}" for i, d in enumerate(in_dtypes))
        decl = "\n".join(f"    {value_ctype(d)} r{j};"
                          for j, d in enumerate(outs))
        args = ", ".join([f"sg_load(in{i}[0])" for i in range(len(in_dtypes))]
                         + [f"r{j}" for j in range(len(outs))])
        stores = "\n".join(f"    sg_store(out{j}[0], r{j});" for j in range(len(outs)))
        outp = ", ".join(f"{storage_ctype(d)} *out{j}" for j, d in enumerate(outs))
        parts.append(f'extern "C" __global__ void k_{dtype}({params}, {outp})\n{{\n{decl}\n'
                     f'    {name}({args});\n{stores}\n}}\n')
    compiler.compile_to_cubin("\n".join(parts), (), "sm_90")


@requires_nvcc
def test_fast_math_flag_reaches_nvcc(cachedir):
    sig = ElemwiseSignature(SCALAR_OPS["exp"], ("float32",), (False,), 1)
    src = render_elemwise(sig)
    _, plain, _ = compiler.compile_to_cubin(src, (), "sm_90")
    with config.change_flags(**{"nvcc.flags": "--use_fast_math"}):
        _, fast, hit = compiler.compile_to_cubin(src, (), "sm_90")
    assert not hit and fast != plain


@requires_nvcc
def test_reduction_module_names_every_kernel(cachedir):
    sig = ReduceSignature("add", SCALAR_OPS["sqr"], ("float32",), "float32", 1, 1)
    src = render_reduce(sig)
    for name in KERNELS + ("sg_finish",):
        assert re.search(rf'extern "C" __global__ void {name}\(', src)
    assert "__shfl_down_sync" in src and "volatile " not in src.split("*/", 1)[1]


# ============================================================================ thunks (fake device)
@pytest.fixture
def fake_device(monkeypatch):
    """Thunks built against a context whose kernels record their launches."""
    calls = []
    return fake_kernel_device(monkeypatch, calls), calls



def test_elemwise_thunk_picks_vector_scalar_and_strided_kernels(fake_device):
    ctx, calls = fake_device
    x = gvar("float32", (False, False))
    node = GpuElemwise(SCALAR_OPS["exp"])(x).owner
    a = fake_gpu_array(ctx, (100, 30))
    thunk, storage = thunk_over(node, [a])
    thunk()
    name, grid, block, args = calls[-1]
    assert name == "sg_contig_vec" and args[0] == 3000 and block == (256, 1, 1)
    out = storage[node.outputs[0]][0]
    assert out.shape == (100, 30) and out.dtype == np.float32
    thunk()
    assert storage[node.outputs[0]][0] is not out      # reuse not allowed: a new one each call
    thunk.reuse_outputs[0] = True                      # (graph_plan.mark_reusable_outputs)
    out_id = id(storage[node.outputs[0]][0])
    thunk()
    assert id(storage[node.outputs[0]][0]) == out_id   # the output never leaves a call: reused
    storage[node.inputs[0]][0] = fake_gpu_array(ctx, (100, 30), ptr=a.ptr + 4)
    thunk()
    assert calls[-1][0] == "sg_contig"                             # misaligned: scalar loop
    storage[node.inputs[0]][0] = fake_gpu_array(ctx, (30, 100)).transpose()
    thunk()
    name, grid, block, args = calls[-1]
    assert name == "sg_strided_2_32" and args[:3] == (3000, 100, 30)


def test_contiguous_elemwise_grids_cover_the_array_and_strided_ones_one_wave(fake_device):
    """A thread per element (per 4-wide vector) for contiguous layouts, whatever the number
    of SMs; strided kernels keep a one-wave grid-stride grid (8 blocks of 256 per SM)."""
    from symgpu.gpu.runtime.codegen.launch import sm_count
    ctx, calls = fake_device
    x = gvar("float32", (False, False))
    node = GpuElemwise(SCALAR_OPS["tanh"])(x).owner
    n = 4096 * 1030
    a = fake_gpu_array(ctx, (4096, 1030))
    thunk, storage = thunk_over(node, [a])
    thunk()
    name, grid, block, args = calls[-1]
    wave = 8 * sm_count(ctx)
    assert name == "sg_contig_vec" and grid == (-(-n // 1024), 1, 1) and grid[0] > wave
    assert grid[0] * block[0] * 4 >= n > (grid[0] - 1) * block[0] * 4
    storage[node.inputs[0]][0] = fake_gpu_array(ctx, (4096, 1030), ptr=a.ptr + 4)
    thunk()
    name, grid, block, _ = calls[-1]
    assert name == "sg_contig" and grid == (-(-n // 256), 1, 1)
    storage[node.inputs[0]][0] = fake_gpu_array(ctx, (1030, 4096)).transpose()
    thunk()
    name, grid, _, _ = calls[-1]
    assert name.startswith("sg_strided_2") and grid == (wave, 1, 1)


def test_elemwise_thunk_broadcast_collapses_and_inplace(fake_device):
    ctx, calls = fake_device
    m, row = gvar("float32", (False, False, False)), gvar("float32", (True, True, False))
    node = GpuElemwise(SCALAR_OPS["add"])(m, row).owner
    thunk, storage = thunk_over(node, [fake_gpu_array(ctx, (4, 5, 6)), fake_gpu_array(ctx, (1, 1, 6))])
    thunk()
    name, _, _, args = calls[-1]
    # dims 0 and 1 merge for every operand: (20, 6); a row vector (strides (0, 1)) over a
    # C-contiguous input: the row/column kernel, a scalar at a time (C % 4 != 0), with
    # R, C, then rows strides (6, 0, 6) and column strides (1, 1, 1) of x, row, out
    assert name == "sg_rowcol_32" and args[:8] == (20, 6, 6, 0, 6, 1, 1, 1)
    m_t = fake_gpu_array(ctx, (6, 5, 4)).transpose()     # no longer rows: the strided kernel
    thunk, storage = thunk_over(node, [m_t, fake_gpu_array(ctx, (1, 1, 6))])
    thunk()
    name, _, _, args = calls[-1]
    assert name == "sg_strided_3_32" and args[:4] == (120, 4, 5, 6)
    node = GpuElemwise(SCALAR_OPS["mul"], {0: 0})(m, gvar("float32", (False,) * 3)).owner
    a = fake_gpu_array(ctx, (4, 5, 6))
    thunk, storage = thunk_over(node, [a, fake_gpu_array(ctx, (4, 5, 6))])
    thunk()
    assert storage[node.outputs[0]][0] is a and calls[-1][3][-1] == a.ptr


def test_reduce_thunk_plans_and_splits(fake_device):
    ctx, calls = fake_device
    x = gvar("float32", (False, False))
    node = GpuCAReduce(SCALAR_OPS["add"], (0,))(x).owner
    thunk, storage = thunk_over(node, [fake_gpu_array(ctx, (100000, 64))])
    thunk()
    names = [c[0] for c in calls]
    assert names[-2:] == ["sg_cols_partial", "sg_finish"]          # 64 tall columns: split rows
    assert storage[node.outputs[0]][0].shape == (64,)
    calls.clear()
    node = GpuCAReduce(SCALAR_OPS["maximum"], (1,))(x).owner
    thunk, storage = thunk_over(node, [fake_gpu_array(ctx, (100000, 64))])
    thunk()
    assert [c[0] for c in calls] == ["sg_rows_final"]
    node = GpuCAReduce(SCALAR_OPS["maximum"], (1,))(x).owner
    thunk, storage = thunk_over(node, [fake_gpu_array(ctx, (3, 0))])
    with pytest.raises(ValueError, match="empty"):
        thunk()


def test_the_c_backend_launches_through_the_c_runtime(monkeypatch):
    """A Kernel of the "c" backend (the default where the C runtime builds) hands
    cuLaunchKernel (here a stand-in of its signature) the function handle, the dimensions,
    the context's stream and its arguments packed in the CUDA layout, both through
    ``launch`` and ``fast_launcher()``; a failed status is raised with the kernel named."""
    import struct
    from c_kernel_helpers import fake_launch_library, fake_launch_record
    from symgpu.gpu.runtime.codegen import launch
    from symgpu.link import c_runtime
    if c_runtime.kernel_launcher() is None:
        pytest.skip(f"no C runtime here: {c_runtime.unavailable_reason()}")
    lib, address = fake_launch_library()

    class Driver:
        launch_address = address

        @staticmethod
        def check(status, what):
            raise RuntimeError(f"{what}: status {status}")
    monkeypatch.setattr(launch, "_drv", lambda: Driver)

    class Ctx:
        stream, stream_handle = object(), 0x5151
    assert launch._backend() == "c"
    k = launch.Kernel("sg_contig_vec", "qPP", 0x1234, None, Ctx(), c_runtime.kernel_launcher())
    packed = struct.pack("@qPP", 230400, 0x7000, 0x8000)
    for go in (k.launch, k.fast_launcher()):
        go((225, 1, 1), (256, 1, 1), 230400, 0x7000, 0x8000)
        got, passed = fake_launch_record(lib, len(packed))
        assert got[:10] == [0x1234, 225, 1, 1, 256, 1, 1, 0, 0x5151, 0] and passed == packed
        with pytest.raises(RuntimeError, match=r"launching kernel sg_contig_vec \(grid "
                                               r"\(999, 1, 1\).*status 700"):
            go((999, 1, 1), (256, 1, 1), 1, 2, 3)
    monkeypatch.setattr(launch, "BACKEND", "pycuda")
    assert launch._backend() == "pycuda"
    monkeypatch.setattr(launch, "BACKEND", "c")           # no C runtime: PyCUDA launches
    monkeypatch.setattr(c_runtime, "kernel_launcher", lambda: None)
    assert launch._backend() == "pycuda"


def test_each_kernel_of_a_module_is_fetched_under_its_own_key(monkeypatch):
    """Two kernels of one module are fetched under keys of their own, each naming its kernel
    (a key shared by two names would be one memo entry per name in get_kernel, but a caller
    keyed on the key alone would silently run the first)."""
    from symgpu.gpu.runtime import compiler as comp
    from symgpu.gpu.runtime.codegen import launch
    seen = {}

    def fake_get_kernel(key, source_factory, fn_name, options=(), context=None):
        assert key not in seen or seen[key] == fn_name, (key, fn_name)
        seen[key] = fn_name
        return object()

    class Ctx:
        stream, stream_handle = None, 0

        def activate(self):
            return self
    monkeypatch.setattr(comp, "get_kernel", fake_get_kernel)
    monkeypatch.setattr(launch, "BACKEND", "pycuda")
    launch.clear_cache()
    ks = launch.load_kernels(Ctx(), ("test", 1), lambda: "", {"a": "q", "b": "qP"})
    launch.clear_cache()
    assert sorted(ks) == ["a", "b"] and sorted(seen.values()) == ["a", "b"]
