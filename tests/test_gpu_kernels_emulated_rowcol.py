"""The row/column-broadcast elementwise kernels (issue 34: elemwise.cu's sg_rowcol_vec_<w>
and sg_rowcol_<w>) run on the CPU (tests/emulated_gpu.py) against NumPy: a bias (a row
vector, strides (0, 1) after collapsing), a layer norm's per-row statistics (column vectors,
(1, 0)), both in one kernel, in place, every float dtype, C % 4 != 0 and misaligned views (the
scalar kernel), R = 1 and C = 1, the grid-stride stepping of (row, column) and the 64-bit
variants.  Each test asserts which kernel ran, so a layout silently falling back to the
strided kernel fails."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_on_host import requires_gxx
from emulated_gpu import (device_array, emulated_kernel_device, gpu_var, host_view,
                          record_launches, run_node)
from gpu_helpers import requires_nvcc, thunk_over
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.runtime.codegen import layout
from symgpu.scalar.basic import Cast, SCALAR_OPS
from symgpu.scalar.composite import CompositeBuilder

pytestmark = requires_gxx

FLOATS = ["float16", "bfloat16", "float32", "float64"]
S = SCALAR_OPS


@pytest.fixture
def emu(monkeypatch, tmp_path):
    return emulated_kernel_device(monkeypatch, tmp_path)


@pytest.fixture
def launched(emu, monkeypatch):
    """The names of the kernels launched, in order."""
    return record_launches(monkeypatch)


gvar = gpu_var


run = run_node


def shifted(emu, host: np.ndarray, elements: int = 1):
    """A C-contiguous GpuArray holding `host` that starts `elements` items past an aligned
    address (a view into a larger buffer)."""
    from symgpu.gpu.runtime.array import GpuArray, c_strides
    raw = device_array(emu, np.concatenate([np.zeros(elements, host.dtype), host.ravel()]))
    a = GpuArray.__new__(GpuArray)
    a._set(emu, raw.ptr + elements * host.itemsize, host.shape,
           c_strides(host.shape, host.itemsize), host.dtype, raw)
    return a


def f64(a: np.ndarray) -> np.ndarray:
    return a.astype("float64")


def ref(dtype: str, fn, *arrays: np.ndarray) -> np.ndarray:
    """fn over the arrays in the kernel's value type (float32 for the half dtypes), rounded
    once to `dtype`: what the kernel computes."""
    vt = "float64" if dtype == "float64" else "float32"
    return fn(*[a.astype(vt) for a in arrays]).astype(dtype)


def layer_norm_like(dtype: str, affine: bool):
    """(x, mean, rstd[, g, b]) -> (x - mean) * rstd [* g + b]"""
    b = CompositeBuilder()
    x, m, r = (b.add_input(dtype) for _ in range(3))
    out = b.add_op(S["mul"], [b.add_op(S["sub"], [x, m])[0], r])[0]
    if affine:
        g, bias = b.add_input(dtype), b.add_input(dtype)
        out = b.add_op(S["add"], [b.add_op(S["mul"], [out, g])[0], bias])[0]
    return b.build([out])


# ----------------------------------------------------------------------------- the layout

def test_row_col_reads_rows_columns_and_single_values():
    # 2-d: x C-contiguous, a row vector, a column vector, one value; the output
    assert layout.row_col([6, 8], [[8, 1], [0, 1], [1, 0], [0, 0], [8, 1]], 1) == \
        (6, 8, [8, 0, 1, 0, 8], [1, 1, 0, 0, 1])
    # 1-d: R = 1; stride 0 is one value
    assert layout.row_col([10], [[1], [0], [1]], 1) == (1, 10, [10, 0, 10], [1, 0, 1])
    assert layout.row_col([6, 8], [[1, 6], [8, 1]], 1) is None          # a transposed input
    assert layout.row_col([6, 8], [[16, 1], [8, 1]], 1) is None         # a strided row
    assert layout.row_col([6, 8], [[8, 1], [0, 1]], 1) is None          # output broadcast
    assert layout.row_col([10], [[2], [1]], 1) is None
    assert layout.row_col([2, 3, 4], [[12, 4, 1], [12, 4, 1]], 1) is None


# ----------------------------------------------------------------------------- values

@pytest.mark.parametrize("dtype", FLOATS)
def test_bias_add_runs_the_vector_kernel(emu, launched, dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5, 16)).astype(dtype)
    bias = rng.standard_normal((1, 1, 16)).astype(dtype)
    node = GpuElemwise(S["add"])(gvar(dtype, 3), gvar(dtype, 3, (True, True, False))).owner
    (got,), _, _ = run(node, [device_array(emu, x), device_array(emu, bias)])
    assert launched[-1] == "sg_rowcol_vec_32"
    assert got.dtype == dtype
    np.testing.assert_array_equal(f64(got), f64(ref(dtype, np.add, x, bias)))


@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_norm_columns_run_the_vector_kernel(emu, launched, dtype):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 7, 12)).astype(dtype)
    mean = rng.standard_normal((2, 7, 1)).astype(dtype)
    rstd = rng.uniform(0.5, 2, (2, 7, 1)).astype(dtype)
    col = (False, False, True)
    node = GpuElemwise(layer_norm_like(dtype, False))(gvar(dtype, 3), gvar(dtype, 3, col),
                                                      gvar(dtype, 3, col)).owner
    (got,), _, _ = run(node, [device_array(emu, a) for a in (x, mean, rstd)])
    assert launched[-1] == "sg_rowcol_vec_32"
    np.testing.assert_array_equal(f64(got), f64(ref(dtype, lambda a, m, r: (a - m) * r,
                                                     x, mean, rstd)))


_TOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-6, "float64": 1e-14}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(4, 6, 20), (3, 5, 9)])       # C % 4: 0, then 1
def test_rows_and_columns_in_one_kernel(emu, launched, dtype, shape):
    """(x - mean) * rstd * g + b: two column vectors and two row vectors; C = 9 takes the
    scalar kernel."""
    rng = np.random.default_rng(3)
    B, T, C = shape
    x = rng.standard_normal(shape).astype(dtype)
    mean, rstd = (rng.uniform(0.5, 2, (B, T, 1)).astype(dtype) for _ in range(2))
    g, b = (rng.standard_normal((1, 1, C)).astype(dtype) for _ in range(2))
    col, row = (False, False, True), (True, True, False)
    node = GpuElemwise(layer_norm_like(dtype, True))(
        gvar(dtype, 3), gvar(dtype, 3, col), gvar(dtype, 3, col), gvar(dtype, 3, row),
        gvar(dtype, 3, row)).owner
    (got,), _, _ = run(node, [device_array(emu, a) for a in (x, mean, rstd, g, b)])
    assert launched[-1] == ("sg_rowcol_vec_32" if C % 4 == 0 else "sg_rowcol_32")
    want = (f64(x) - f64(mean)) * f64(rstd) * f64(g) + f64(b)
    np.testing.assert_allclose(f64(got), want, rtol=_TOL[dtype], atol=_TOL[dtype])


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_in_place_bias_add_writes_its_input(emu, launched, dtype):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 24)).astype(dtype)
    bias = rng.standard_normal((1, 24)).astype(dtype)
    xd = device_array(emu, x)
    node = GpuElemwise(S["add"], {0: 0})(gvar(dtype, 2), gvar(dtype, 2, (True, False))).owner
    thunk, storage = thunk_over(node, [xd, device_array(emu, bias)])
    thunk()
    assert launched[-1] == "sg_rowcol_vec_32"
    assert storage[node.outputs[0]][0] is xd
    np.testing.assert_array_equal(f64(host_view(xd)), f64(ref(dtype, np.add, x, bias)))
    # an in-place input that is not C-contiguous: the strided kernel, still right
    xt = device_array(emu, np.ascontiguousarray(x.T)).transpose()
    thunk, storage = thunk_over(node, [xt, device_array(emu, bias)])
    thunk()
    assert launched[-1].startswith("sg_strided_2")
    np.testing.assert_array_equal(f64(host_view(storage[node.outputs[0]][0])),
                                  f64(ref(dtype, np.add, x, bias)))


@pytest.mark.parametrize("dtype", FLOATS)
def test_misaligned_views_take_the_scalar_kernel(emu, launched, dtype):
    """A C-contiguous input or a row vector one element off its vector alignment: the scalar
    kernel; a column vector one element off still vectorises (it is read a value at a
    time)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((5, 8)).astype(dtype)
    bias = rng.standard_normal((1, 8)).astype(dtype)
    col = rng.standard_normal((5, 1)).astype(dtype)
    node = GpuElemwise(S["add"])(gvar(dtype, 2), gvar(dtype, 2, (True, False))).owner
    want = f64(ref(dtype, np.add, x, bias))
    for xd, bd in ((shifted(emu, x), device_array(emu, bias)),
                   (device_array(emu, x), shifted(emu, bias, 3))):
        (got,), _, _ = run(node, [xd, bd])
        assert launched[-1] == "sg_rowcol_32"
        np.testing.assert_array_equal(f64(got), want)
    node = GpuElemwise(S["sub"])(gvar(dtype, 2), gvar(dtype, 2, (False, True))).owner
    (got,), _, _ = run(node, [device_array(emu, x), shifted(emu, col)])
    assert launched[-1] == "sg_rowcol_vec_32"
    np.testing.assert_array_equal(f64(got), f64(ref(dtype, np.subtract, x, col)))


@pytest.mark.parametrize("shape,other,kernel", [
    ((1, 12), (1, 1), "sg_rowcol_vec_32"),   # R = 1: one value over the row (1-d, stride 0)
    ((1, 10), (1, 1), "sg_rowcol_32"),
    ((12, 1), (1, 1), "sg_rowcol_vec_32"),   # C = 1: collapses to (1, 12) likewise
    ((12, 1), (12, 1), "sg_contig_vec"),     # no broadcast: the contiguous kernel
    ((1, 1), (1, 1), "sg_contig_vec"),       # one element (the vector kernel's tail)
])
def test_one_row_or_one_column(emu, launched, shape, other, kernel):
    """Operands whose type does not say broadcastable but whose length-1 dims broadcast at
    run time."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal(shape).astype("float32")
    y = rng.standard_normal(other).astype("float32")
    node = GpuElemwise(S["mul"])(gvar("float32", 2), gvar("float32", 2)).owner
    (got,), _, _ = run(node, [device_array(emu, x), device_array(emu, y)])
    assert launched[-1] == kernel
    np.testing.assert_array_equal(got, x * y)


def test_scalar_inputs_mixed_dtypes_and_two_outputs(emu, launched):
    """A fused kernel with a scalar operand (read once, not indexed), a float16 input beside
    float32 rows and columns, and a bool output next to a float32 one (vectors of 4 and 16
    bytes)."""
    b = CompositeBuilder()
    x, k, row, col = (b.add_input(d) for d in ("float16", "float32", "float32", "float32"))
    y = b.add_op(S["add"], [b.add_op(S["mul"], [x, k])[0], b.add_op(S["mul"], [row, col])[0]])[0]
    comp = b.build([b.add_op(S["gt"], [y, b.add_constant(0.0, "float32")])[0], y])
    rng = np.random.default_rng(7)
    hx = rng.standard_normal((9, 16)).astype("float16")
    hk = np.asarray([[1.5]], "float32")
    hrow = rng.standard_normal((1, 16)).astype("float32")
    hcol = rng.standard_normal((9, 1)).astype("float32")
    node = GpuElemwise(comp)(gvar("float16", 2), gvar("float32", 2, (True, True)),
                             gvar("float32", 2, (True, False)),
                             gvar("float32", 2, (False, True)))[0].owner
    (pos, got), _, _ = run(node, [device_array(emu, a) for a in (hx, hk, hrow, hcol)])
    assert launched[-1] == "sg_rowcol_vec_32"
    want = hx.astype("float32") * hk + hrow * hcol
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(pos, got > 0)


def test_a_broadcast_view_through_the_one_input_thunk(emu, launched):
    """One input whose rows are one row (strides (0, 4)): the hoisted one-input thunk runs
    the row/column kernel too."""
    from symgpu.gpu.runtime.array import GpuArray
    h = np.random.default_rng(8).standard_normal(8).astype("float32")
    base = device_array(emu, h)
    v = GpuArray.__new__(GpuArray)
    v._set(emu, base.ptr, (5, 8), (0, 4), np.dtype("float32"), base)
    node = GpuElemwise(S["exp"])(gvar("float32", 2)).owner
    (got,), _, _ = run(node, [v])
    assert launched[-1] == "sg_rowcol_vec_32"
    np.testing.assert_allclose(got, np.exp(np.broadcast_to(h, (5, 8))), rtol=1e-6)


# ----------------------------------------------------------------------------- stepping

@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("C, in_flight", [(96, (256, 64)), (96, (1000, 1000)),
                                          (96, (300, 1000)), (96, (96, 64)), (95, (256, 64))])
def test_threads_step_through_rows(emu, launched, monkeypatch, wide, C, in_flight):
    """One block of 256 threads over more vectors (elements) than it has threads: each
    thread steps its (row, column) by the grid's stride (10 rows and 16 vectors for C = 96:
    the loop of SG_VEC_DEPTH vectors, then one at a time; 2 rows and 66 columns for C = 95),
    in 32- and 64-bit index arithmetic.  The affine layer norm's five float32 operands and
    output take 96 bytes and 24 values a vector: 2 vectors in flight by default, 4, 3 or 1
    under other budgets."""
    from symgpu.gpu.ops import elemwise as gelem
    from symgpu.gpu.runtime.codegen import elemwise as codegen_elemwise, launch
    monkeypatch.setattr(launch, "sm_count", lambda ctx: 1)
    monkeypatch.setattr(codegen_elemwise, "VEC_BYTES_IN_FLIGHT", in_flight[0])
    monkeypatch.setattr(codegen_elemwise, "VEC_VALUES_IN_FLIGHT", in_flight[1])
    monkeypatch.setattr(gelem, "VEC_BLOCKS_PER_SM", 1)
    if wide:
        monkeypatch.setattr(layout, "fits_32bit", lambda *a: False)
    rng = np.random.default_rng(9)
    R = 50
    x = rng.standard_normal((R, C)).astype("float32")
    mean = rng.standard_normal((R, 1)).astype("float32")
    rstd = rng.uniform(0.5, 2, (R, 1)).astype("float32")
    g, b = (rng.standard_normal((1, C)).astype("float32") for _ in range(2))
    col, row = (False, True), (True, False)
    node = GpuElemwise(layer_norm_like("float32", True), {0: 0})(
        gvar("float32", 2), gvar("float32", 2, col), gvar("float32", 2, col),
        gvar("float32", 2, row), gvar("float32", 2, row)).owner
    assert node.op.signature(node).vec_depth == {256: 2, 1000: 4, 300: 3, 96: 1}[in_flight[0]]
    xd = device_array(emu, x)
    (got,), _, _ = run(node, [xd] + [device_array(emu, a) for a in (mean, rstd, g, b)])
    kind = "sg_rowcol_vec" if C % 4 == 0 else "sg_rowcol"
    assert launched[-1] == f"{kind}_{64 if wide else 32}"
    want = (f64(x) - mean) * rstd * g + b        # (in place: an element computed twice fails)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- nvcc

@requires_nvcc
def test_row_col_kernels_compile_for_sm_90(tmp_path):
    """The bfloat16 affine layer norm's module (rows, columns, in place) and a float64 bias
    add with a bool output: every row/column kernel is in the cubin."""
    from symgpu.config import config
    from symgpu.gpu.runtime import compiler
    from symgpu.gpu.runtime.codegen.elemwise import kernel_names
    nodes = [GpuElemwise(layer_norm_like("bfloat16", True), {0: 0})(
        gvar("bfloat16", 3), gvar("bfloat16", 3, (False, False, True)),
        gvar("bfloat16", 3, (False, False, True)), gvar("bfloat16", 3, (True, True, False)),
        gvar("bfloat16", 3, (True, True, False))).owner,
        GpuElemwise(S["gt"])(gvar("float64", 2), gvar("float64", 2, (True, False))).owner]
    compiler.clear_memory_cache()
    try:
        with config.change_flags(compiledir=str(tmp_path), compile_log=False,
                                 **{"nvcc.flags": ""}):
            for node in nodes:
                ((_, sig), src), = node.op.kernel_sources(node)
                _, cubin, _ = compiler.compile_to_cubin(src, (), "sm_90")
                for name in kernel_names(sig):
                    assert name.encode() + b"\0" in cubin, name
                assert b"sg_rowcol_vec_32\0" in cubin and b"sg_rowcol_64\0" in cubin
    finally:
        compiler.clear_memory_cache()


def layer_norm_backward_like():
    """The GPT step's layer-norm backward as the fusion makes it (i1, i5 one value each):
    i8 + i3 * (i2 - i0 / i1) / (i4 * i5) + i9 + (i6 + i7) / i5, float32 and its bfloat16
    rounding: eight float32 operands and two outputs a position."""
    b = CompositeBuilder()
    i = [b.add_input("float32") for _ in range(10)]

    def op(name, *args):
        return b.add_op(S[name], list(args))[0]
    centred = op("sub", i[2], op("true_div", i[0], i[1]))
    out = op("add", op("add", op("add", i[8], op("true_div", op("mul", i[3], centred),
                                                   op("mul", i[4], i[5]))), i[9]),
             op("true_div", op("add", i[6], i[7]), i[5]))
    return b.build([out, b.add_op(Cast("bfloat16"), [out])[0]])


@requires_nvcc
def test_vector_kernels_of_long_operand_lists_do_not_spill(tmp_path):
    """The vector kernels run within 64 registers (SG_VEC_BOUNDS); fewer vectors in flight
    for long operand lists (vec_depth) keep them out of local memory: four vectors of the
    layer norm's backward operands spilled, and took 168 registers unbounded."""
    import shutil
    import subprocess
    col, row = (False, False, True), (True, True, False)
    nodes = [GpuElemwise(layer_norm_like("bfloat16", True))(
        gvar("bfloat16", 3), gvar("bfloat16", 3, col), gvar("bfloat16", 3, col),
        gvar("bfloat16", 3, row), gvar("bfloat16", 3, row)).owner,
        GpuElemwise(layer_norm_backward_like())(*[
            gvar("float32", 3, col if k in (0, 3, 4, 6, 7) else (True,) * 3 if k in (1, 5)
                 else (False,) * 3) for k in range(10)])[0].owner]
    for n, node in enumerate(nodes):
        ((_, sig), src), = node.op.kernel_sources(node)
        assert sig.vec_depth == (2, 1)[n]
        path = tmp_path / f"m{n}.cu"
        path.write_text(src)
        log = subprocess.run([shutil.which("nvcc"), "-arch=sm_90", "-cubin", "-o",
                              str(tmp_path / f"m{n}.cubin"), "-Xptxas", "-v", str(path)],
                             capture_output=True, text=True, check=True).stderr
        # (sg_rowcol_vec_64, for arrays past 2**31 elements, keeps 64-bit strides of every
        # operand: the backward's twenty take 84 bytes of local memory)
        for kernel in ("sg_contig_vec", "sg_rowcol_vec_32"):
            props = log.split(f"Function properties for {kernel}\n")[1].splitlines()[0]
            assert " 0 bytes spill stores" in props, (kernel, props)


# ----------------------------------------------------------------------------- from function()

def test_the_fused_layer_norm_of_a_compiled_function_takes_the_vector_kernel(emu, launched):
    """function() on a virtual GPU fuses (x - mean) * rstd * g + b into one GpuElemwise over
    x, two (B, S, 1) statistics and two vectors dimshuffled to (1, 1, C); its thunk, run on
    the emulator, launches sg_rowcol_vec_32."""
    import symgpu.tensor as T
    from symgpu import config, function
    from symgpu.gpu.placement.rewriting import virtual_context
    dtype = "bfloat16"
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.tensor(dtype, broadcastable=(False, False, False), name="x")
        m, r = (T.tensor(dtype, broadcastable=(False, False, True)) for _ in range(2))
        g, b = (T.tensor(dtype, broadcastable=(False,)) for _ in range(2))
        f = function([x, m, r, g, b], (x - m) * r * g + b)
    (node,) = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, GpuElemwise)]
    assert [i.broadcastable for i in node.inputs] == [
        (False,) * 3, (False, False, True), (False, False, True), (True, True, False),
        (True, True, False)]
    rng = np.random.default_rng(10)
    hx = rng.standard_normal((2, 3, 40)).astype(dtype)
    hm, hr = (rng.uniform(0.5, 2, (2, 3, 1)).astype(dtype) for _ in range(2))
    hg, hb = (rng.standard_normal((1, 1, 40)).astype(dtype) for _ in range(2))
    (got,), _, _ = run(node, [device_array(emu, a) for a in (hx, hm, hr, hg, hb)])
    assert launched[-1] == "sg_rowcol_vec_32"
    want = (f64(hx) - f64(hm)) * f64(hr) * f64(hg) + f64(hb)
    np.testing.assert_allclose(f64(got), want, rtol=_TOL[dtype], atol=_TOL[dtype])
