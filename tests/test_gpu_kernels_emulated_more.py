"""More of symgpu's GPU kernels run on the CPU (tests/cuda_on_host.py, tests/emulated_gpu.py)
against NumPy, so their indexing, tails and error reports are checked without a GPU."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T

from cuda_on_host import requires_gxx
from emulated_gpu import (device_array, emulate_prepared_kernels, emulated_kernel_device,
                          gpu_var, host_view, record_launches)
from gpu_helpers import thunk_over
from symgpu.scalar.basic import SCALAR_OPS
from symgpu.scalar.composite import CompositeBuilder
from symgpu.tensor.random import philox

pytestmark = requires_gxx


@pytest.fixture
def emu(monkeypatch, tmp_path):
    return emulated_kernel_device(monkeypatch, tmp_path)


def on_host(ctx, a: np.ndarray):
    """A GpuArray over NumPy array `a`'s own memory, in its layout (no copy; `a` must live)."""
    from symgpu.gpu.runtime.array import GpuArray
    g = GpuArray.__new__(GpuArray)
    g._set(ctx, a.ctypes.data, a.shape, a.strides, a.dtype, a)
    return g


gvar = gpu_var


@pytest.fixture
def launched(emu, monkeypatch):
    """The names of the kernels launched, in order."""
    return record_launches(monkeypatch)


# ----------------------------------------------------------------- Philox draws fused

_STATE = np.asarray([0x12345678, 0x9ABCDEF0, 0xFFFFFFF0, 3], dtype=np.uint32)  # carries


def _dropout(dtype: str, keep: float = 0.5):
    """(x, u) -> (switch(u < keep, x / keep, 0), u, x * u): dropout as the fusion leaves it,
    with the draw itself and a product that reads every x (dropout hides half the reads)."""
    b = CompositeBuilder()
    x, u = b.add_input(dtype), b.add_input(dtype)
    hit = b.add_op(SCALAR_OPS["lt"], [u, b.add_constant(keep, dtype)])[0]
    scaled = b.add_op(SCALAR_OPS["true_div"], [x, b.add_constant(keep, dtype)])[0]
    out = b.add_op(SCALAR_OPS["switch"], [hit, scaled, b.add_constant(0, dtype)])[0]
    return b.build([out, b.add_op(SCALAR_OPS["identity"], [u])[0],
                    b.add_op(SCALAR_OPS["mul"], [x, u])[0]])


def _fused(scalar_op, pos: int, dist: str, dtype: str, others: list):
    """The GpuPhiloxElemwise node over `others` (host arrays; one value: a 0-stride scalar)."""
    from symgpu.gpu.ops.random_fusion import GpuPhiloxElemwise
    nd = others[0].ndim
    sizes = [T.lscalar(f"n{k}") for k in range(nd)]
    ins = [gvar(str(a.dtype), nd, tuple(n == 1 for n in a.shape)) for a in others]
    out = GpuPhiloxElemwise(scalar_op, pos, dist, dtype, nd)(gvar("uint32", 1), *sizes, *ins)
    return (out[0] if isinstance(out, list) else out).owner


def _draw(dist: str, dtype: str, shape: tuple) -> np.ndarray:
    return philox.sample(_STATE, dist, dtype, shape)


@pytest.mark.parametrize("dtype,shape,layout", [
    ("float32", (5, 37), "contig"),        # 185: a part Philox block at the end
    ("float32", (6, 41), "transposed"),    # the strided kernel, blocks across row ends
    ("float32", (7, 16), "misaligned"),    # contiguous, a pointer 4 bytes off: per element
    ("float32", (8, 12), "row"),           # a row broadcast (strides (0, 1)), aligned rows
    ("float64", (3, 11), "contig"),
    ("float64", (9, 7), "transposed"),
    ("float16", (5, 37), "contig"),        # half draws: float32 numbers rounded on the store
    ("bfloat16", (6, 41), "transposed"),
    ("bfloat16", (7, 16), "misaligned"),   # 2 bytes off
    ("float16", (8, 12), "row"),
])
def test_fused_dropout_draws_the_cpu_generators_uniforms(emu, launched, dtype, shape, layout):
    rng = np.random.default_rng(shape[0] * shape[1])
    x = rng.standard_normal(shape).astype(dtype)
    if layout == "row":
        x = x[:1]
    node = _fused(_dropout(dtype), 1, "uniform", dtype, [x])
    if layout == "transposed":
        xd = device_array(emu, np.ascontiguousarray(x.T)).transpose()
    elif layout == "misaligned":
        from symgpu.gpu.runtime.array import GpuArray, c_strides
        raw = device_array(emu, np.concatenate([np.zeros(1, dtype), x.ravel()]))
        xd = GpuArray.__new__(GpuArray)
        xd._set(emu, raw.ptr + x.itemsize, x.shape, c_strides(x.shape, x.itemsize), x.dtype,
                raw)
    else:
        xd = device_array(emu, x)
    thunk, storage = thunk_over(node, [device_array(emu, _STATE), *map(np.int64, shape), xd])
    thunk()
    out, mask, prod = (host_view(storage[o][0]) for o in node.outputs)
    u = _draw("uniform", dtype, shape)
    np.testing.assert_array_equal(mask, u)                          # bit for bit
    np.testing.assert_array_equal(prod, x * u)
    np.testing.assert_array_equal(out, np.where(u < 0.5, x / x.dtype.type(0.5), 0))
    assert 0.3 < (u < 0.5).mean() < 0.7
    kind = "contig" if layout in ("contig", "misaligned") else "strided"
    assert launched == [f"sg_philox_ew_{kind}"]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_fused_normal_draw_first_with_a_scalar_operand(emu, launched, dtype):
    """Draw at position 0, a one-value operand hoisted out of the loop, a normal draw (float64
    exact; float32 within the emulated sine's error, as the GPU's __sincosf; the half types
    computed in float32 and rounded once where NumPy rounds the product too: an ulp)."""
    b = CompositeBuilder()
    z, x, s = b.add_input(dtype), b.add_input(dtype), b.add_input(dtype)
    op = b.build(b.add_op(SCALAR_OPS["add"], [x, b.add_op(SCALAR_OPS["mul"], [s, z])[0]]))
    shape = (3, 5, 7)
    x = np.random.default_rng(2).standard_normal(shape).astype(dtype)
    s = np.full((1, 1, 1), 0.25, dtype=dtype)
    node = _fused(op, 0, "normal", dtype, [x, s])
    thunk, storage = thunk_over(node, [device_array(emu, _STATE), *map(np.int64, shape),
                                       device_array(emu, x), device_array(emu, s)])
    thunk()
    got = host_view(storage[node.outputs[0]][0])
    want = x + s * _draw("normal", dtype, shape)
    if dtype == "float64":
        np.testing.assert_array_equal(got, want)
    else:
        tol = {"float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
        np.testing.assert_allclose(got.astype("float64"), want.astype("float64"), rtol=tol,
                                   atol=tol)
    assert launched == ["sg_philox_ew_contig"]


def test_fused_draw_falls_back_when_broadcast_at_run_time(emu, launched):
    """A draw of (1, n) read against x of (3, n): the draw kernel, then the plain elementwise
    kernel (the draw's one row broadcast); an empty draw launches nothing."""
    x = np.random.default_rng(3).standard_normal((3, 10)).astype("float32")
    node = _fused(SCALAR_OPS["mul"], 1, "uniform", "float32", [x])
    st = device_array(emu, _STATE)
    thunk, storage = thunk_over(node, [st, np.int64(1), np.int64(10), device_array(emu, x)])
    thunk()
    got = host_view(storage[node.outputs[0]][0])
    np.testing.assert_array_equal(got, x * _draw("uniform", "float32", (1, 10)))
    assert launched[0] == "sg_philox_uniform_float32" and len(launched) == 2
    thunk, storage = thunk_over(node, [st, np.int64(0), np.int64(10),
                                       device_array(emu, x[:0])])
    del launched[:]
    thunk()
    assert host_view(storage[node.outputs[0]][0]).shape == (0, 10) and launched == []


# ----------------------------------------------------------------- strided copy and inc

@pytest.fixture
def copyk(emu, monkeypatch, tmp_path):
    """symgpu.gpu.runtime.copykernel with its PyCUDA launches run on the host."""
    from symgpu.gpu.runtime import copykernel
    emulate_prepared_kernels(monkeypatch, tmp_path, copykernel)
    return copykernel


def _layouts(dtype: str):
    """(name, source view, the destination array, the view of it written)."""
    rng = np.random.default_rng(7)
    big = (rng.standard_normal((6, 9, 10)) * 50).astype(dtype)
    out = np.full((10, 12, 11), 77, dtype=dtype)
    yield "transposed", big.transpose(2, 0, 1), out, lambda a: a[:10, :6, :9]
    yield "negative", big[::-1, ::-2, 3:], out, lambda a: a[1:7, ::-2, 2:9][:, :5]
    yield "broadcast", np.broadcast_to(big[2, :, 4:5], (4, 9, 3)), out, \
        lambda a: a[2:6, 1:10, ::-4]
    yield "scalar", big[1, 2, 3:4].reshape(()), out, lambda a: a[5, 5, 5:6].reshape(())
    yield "contiguous", big, out, lambda a: a.reshape(-1)[7:547].reshape(6, 9, 10)
    eight = np.arange(2 ** 8, dtype="float64").astype(dtype).reshape((2,) * 8)
    yield "eight axes", eight.transpose(7, 6, 5, 4, 3, 2, 1, 0)[..., ::-1], \
        np.full((2,) * 8 + (3,), 77, dtype=dtype), lambda a: a[..., 1]


@pytest.mark.parametrize("dtype", ["uint8", "float16", "float32", "int64"])
def test_strided_copy_matches_numpy_assignment(emu, copyk, dtype):
    """Every item size, any layout (transposed, negative, broadcast, 0-d, merged to one axis,
    eight axes left after merging): the view gets the source, nothing else is written."""
    for name, src, out, view in _layouts(dtype):
        dst, want = view(out), out.copy()
        view(want)[...] = src
        copyk.strided_copy(emu, src.ctypes.data, dst.ctypes.data, src.shape, src.strides,
                           dst.strides, src.itemsize)
        np.testing.assert_array_equal(out, want, err_msg=name)
    nine = np.zeros((2,) * 9, dtype=dtype).transpose(8, 7, 6, 5, 4, 3, 2, 1, 0)
    with pytest.raises(ValueError, match="at most 8"):
        copyk.strided_copy(emu, nine.ctypes.data, nine.ctypes.data, nine.shape, nine.strides,
                           nine.strides, nine.itemsize)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint16", "int32", "uint64",
                                   "float16", "bfloat16"])
def test_strided_inc_matches_numpy_add(emu, copyk, dtype):
    """dst[...] += src for each dtype's own kernel (wrapping integers as NumPy's do; the half
    types add in float32 and round once, as NumPy's half addition: the same bits)."""
    for name, src, out, view in _layouts(dtype):
        want = out.copy()
        view(want)[...] += src
        copyk.strided_inc(on_host(emu, view(out)), on_host(emu, src))
        np.testing.assert_array_equal(out, want, err_msg=name)


# ----------------------------------------------------------------- cross-entropy

@pytest.fixture
def xent(emu, monkeypatch, tmp_path):
    """symgpu.gpu.ops.crossentropy with its kernels run on the host."""
    from symgpu.gpu.ops import crossentropy
    emulate_prepared_kernels(monkeypatch, tmp_path, crossentropy)
    return crossentropy


def _probs(rng, n: int, k: int, dtype: str) -> np.ndarray:
    """Positive rows of n x k, transposed in memory (element strides (1, n))."""
    return np.ascontiguousarray(rng.uniform(0.05, 1.0, (k, n)).astype(dtype)).T


def _labels(rng, n: int, k: int, idt: str) -> np.ndarray:
    """n labels in [0, k) read with a stride of 2."""
    return rng.integers(0, k, 2 * n).astype(idt)[::2]


#: the cross-entropy's tolerance per dtype: the half types are computed in float32 and
#: rounded once (half an ulp: 2^-11 relative for float16, 2^-8 for bfloat16, with margin)
_XENT_RTOL = {"float32": 1e-6, "float64": 1e-14, "float16": 1e-3, "bfloat16": 8e-3}


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("idt", ["int32", "int64"])
def test_crossentropy_forward_matches_numpy_and_reports_a_bad_label(emu, xent, dtype, idt):
    """-log p[i, y_i] read through p's and y's strides; a label of k or -1 (no counting from
    the end, as the CPU op) is reported and raised at the next sync, naming the label."""
    from symgpu.gpu.runtime.device_checks import raise_device_errors
    rng = np.random.default_rng(11)
    n, k = 300, 7                                   # two blocks of 256 threads
    p, y = _probs(rng, n, k, dtype), _labels(rng, n, k, idt)
    node = xent.GpuCrossentropyCategorical1Hot()(gvar(dtype, 2), gvar(idt, 1)).owner

    def run(y):
        out = [None]
        node.op.perform(node, [on_host(emu, p), on_host(emu, y)], [out])
        return host_view(out[0])

    got = run(y)
    assert got.dtype == dtype
    got = got.astype("float64")
    want = -np.log(p[np.arange(n), y].astype("float64"))
    np.testing.assert_allclose(got, want, rtol=_XENT_RTOL[dtype])
    raise_device_errors(emu)                        # nothing reported
    for bad in (k, -1):
        y_bad = y.copy()
        y_bad[257] = bad
        got = run(y_bad)
        with pytest.raises(ValueError, match=rf"in \[0, {k}\).*got label {bad}"):
            raise_device_errors(emu)
        keep = np.arange(n) != 257                  # the bad row is left unwritten
        np.testing.assert_allclose(got[keep].astype("float64"), want[keep],
                                   rtol=_XENT_RTOL[dtype])
        raise_device_errors(emu)                    # cleared once raised


@pytest.mark.parametrize("dtype,g_dtype", [("float32", "float32"), ("float32", "float64"),
                                           ("float64", "float32"), ("float64", "float64"),
                                           ("float16", "float16"), ("float16", "float32"),
                                           ("bfloat16", "bfloat16"), ("bfloat16", "float16")])
@pytest.mark.parametrize("g_shape", ["scalar", "one", "rows"])
def test_crossentropy_grad_matches_numpy(emu, xent, monkeypatch, dtype, g_dtype, g_shape):
    """-g_i / p[i, y_i] at (i, y_i), 0 elsewhere (every element written: the output starts
    as garbage), the quotient in the wider dtype; g a scalar, one value or one per row.
    Half dtypes divide in float32 and round once, as NumPy's (and ml_dtypes') half ufuncs
    do: the same bits."""
    from symgpu.gpu.runtime.device_checks import raise_device_errors
    rng = np.random.default_rng(12)
    n, k = 45, 13
    p, y = _probs(rng, n, k, dtype), _labels(rng, n, k, "int64")
    g = {"scalar": rng.standard_normal(()), "one": rng.standard_normal(1),
         "rows": rng.standard_normal(2 * n)[::-2]}[g_shape].astype(g_dtype)
    node = xent.GpuCrossentropyCategorical1HotGrad()(
        gvar(g_dtype, g.ndim), gvar(dtype, 2), gvar("int64", 1)).owner
    allocate = emu.pool.allocate

    def dirty(nbytes):                              # pool memory is not zeroed on a GPU
        block = allocate(nbytes)
        emu.pool.buffers[block.ptr][...] = 0xAB
        return block
    monkeypatch.setattr(emu.pool, "allocate", dirty)
    out = [None]
    node.op.perform(node, [on_host(emu, g), on_host(emu, p), on_host(emu, y)], [out])
    got = host_view(out[0])
    gb = np.broadcast_to(g, (n,))
    want = np.zeros((n, k), dtype=dtype)
    wide = "float64" if "float64" in (dtype, g_dtype) else "float32"
    want[np.arange(n), y] = (-gb.astype(wide) / p[np.arange(n), y].astype(wide)).astype(dtype)
    assert got.dtype == dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
    raise_device_errors(emu)
    y[::7] = k + 2                                  # several bad labels: one is reported
    node.op.perform(node, [on_host(emu, g), on_host(emu, p), on_host(emu, y)], [out])
    with pytest.raises(ValueError, match=rf"got label {k + 2}"):
        raise_device_errors(emu)


# ----------------------------------------------------------------- argmax / argmin

@pytest.fixture
def argk(emu, monkeypatch, tmp_path):
    """GpuArgmax's kernels (and the strided copy that lays a reduced axis last) on the host."""
    from symgpu.gpu.ops import nnet
    from symgpu.gpu.runtime import copykernel
    emulate_prepared_kernels(monkeypatch, tmp_path, nnet, copykernel)
    return nnet.GpuArgmax


def _ties(rng, shape: tuple, dtype: str) -> np.ndarray:
    """Few distinct values (ties in every row), NaNs in float rows: one late in a row (past
    the first 256, another thread's part), one row all NaN, one row NaN twice."""
    info = np.iinfo(dtype) if dtype[0] in "iu" else None
    x = rng.integers(0, 6, shape).astype(dtype)
    if info is not None:
        x = (x.astype("float64") * (info.max // 6) + info.min * (info.min < 0) // 2).astype(dtype)
    else:
        x2 = x.reshape(-1, shape[-1])
        x2[0, -1] = x2[1, 3] = x2[1, shape[-1] // 2] = np.nan
        x2[2] = np.nan
    return x


@pytest.mark.parametrize("dtype,shape", [("float32", (7, 300)), ("float64", (5, 3, 41)),
                                         ("float16", (3, 290)), ("bfloat16", (4, 2, 33)),
                                         ("int8", (6, 513)), ("uint64", (4, 260)),
                                         ("int32", (9, 1))])
@pytest.mark.parametrize("kind", ["max", "min"])
def test_argmax_resolves_ties_and_nans_to_the_first_index(emu, argk, dtype, shape, kind):
    """Every axis (the last in place, others laid last by the strided copy) and the flattened
    array: NumPy's index, ties and NaNs resolved to the first."""
    x = _ties(np.random.default_rng(len(shape) + shape[-1]), shape, dtype)
    ref = np.argmax if kind == "max" else np.argmin
    for axis in [*range(x.ndim), None]:
        node = argk(axis, kind)(gvar(dtype, x.ndim)).owner
        out = [None]
        node.op.perform(node, [device_array(emu, x)], [out])
        got = host_view(out[0])
        np.testing.assert_array_equal(got, ref(x, axis=axis), err_msg=f"axis {axis}")
        assert got.dtype == np.int64
