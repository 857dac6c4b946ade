"""gpu_philox_advance_fusion (symgpu/gpu/ops/random_fusion.py): the state a fused Philox draw
leaves (GpuPhiloxAdvance's) written by the draw's own kernel, one launch less per stream and
step. The kernels run on the CPU emulator (tests/emulated_gpu.py) against the CPU generator;
the rewrite is read on a graph of GPU variables; the modules compile with nvcc."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_on_host import requires_gxx
from emulated_gpu import device_array, emulated_kernel_device, host_view
from gpu_helpers import compile_for_sm90, requires_nvcc, thunk_over
from symgpu.graph.fg import FunctionGraph
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.ops.random import GpuPhiloxAdvance, GpuPhiloxSample
from symgpu.gpu.ops.random_fusion import (GpuPhiloxElemwise, gpu_philox_advance_fusion,
                                          gpu_philox_fusion, render_philox_elemwise)
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.scalar.basic import SCALAR_OPS
from symgpu.tensor.random import philox
import symgpu.tensor as T

_STATE = np.asarray([0x12345678, 0x9ABCDEF0, 0xFFFFFFF0, 3], dtype=np.uint32)  # carries


def gvar(dtype: str, ndim: int):
    return GpuArrayType(dtype, (False,) * ndim, None)()


@pytest.fixture
def emu(monkeypatch, tmp_path):
    return emulated_kernel_device(monkeypatch, tmp_path)


def _node(dtype: str, advance: bool):
    sizes = [T.lscalar("n0"), T.lscalar("n1")]
    outs = GpuPhiloxElemwise(SCALAR_OPS["mul"], 1, "uniform", dtype, 2, advance=advance)(
        gvar("uint32", 1), *sizes, gvar(dtype, 2))
    return (outs[0] if isinstance(outs, list) else outs).owner


@requires_gxx
@pytest.mark.parametrize("dtype,shape,layout", [
    ("float32", (5, 37), "contig"), ("float32", (6, 41), "transposed"),
    ("float64", (3, 11), "contig"), ("float64", (9, 7), "transposed")])
def test_the_fused_kernel_writes_the_next_state(emu, dtype, shape, layout):
    x = np.random.default_rng(3).standard_normal(shape).astype(dtype)
    xd = device_array(emu, np.ascontiguousarray(x.T)).transpose() if layout == "transposed" \
        else device_array(emu, x)
    node = _node(dtype, advance=True)
    assert len(node.outputs) == 2 and "advance" in str(node.op)
    st = device_array(emu, _STATE)
    thunk, storage = thunk_over(node, [st, *map(np.int64, shape), xd])
    thunk()
    prod, nxt = (host_view(storage[o][0]) for o in node.outputs)
    np.testing.assert_array_equal(prod, x * philox.sample(_STATE, "uniform", dtype, shape))
    want = philox.advance(_STATE, philox.blocks(int(np.prod(shape)), dtype))
    np.testing.assert_array_equal(nxt, want)                  # the counter's carry included
    np.testing.assert_array_equal(host_view(st), _STATE)      # the state read is left alone


@requires_gxx
def test_an_empty_draw_leaves_the_state_where_it_was(emu, monkeypatch):
    from symgpu.gpu.runtime.array import GpuArray
    monkeypatch.setattr(GpuArray, "_copy_from_device",               # (the driver's copy)
                        lambda self, src: host_view(self).__setitem__(..., host_view(src)))
    node = _node("float32", advance=True)
    thunk, storage = thunk_over(node, [device_array(emu, _STATE), np.int64(0), np.int64(4),
                                       device_array(emu, np.zeros((0, 4), "float32"))])
    thunk()
    np.testing.assert_array_equal(host_view(storage[node.outputs[1]][0]), _STATE)


@requires_gxx
def test_the_fallback_path_advances_the_state_too(emu):
    # x of (3, n) against a (1, n) draw: the thunk falls back to draw + elementwise kernels
    x = np.random.default_rng(5).standard_normal((3, 8)).astype("float32")
    node = _node("float32", advance=True)
    thunk, storage = thunk_over(node, [device_array(emu, _STATE), np.int64(1), np.int64(8),
                                       device_array(emu, x)])
    thunk()
    prod, nxt = (host_view(storage[o][0]) for o in node.outputs)
    np.testing.assert_array_equal(prod, x * philox.sample(_STATE, "uniform", "float32", (1, 8)))
    np.testing.assert_array_equal(nxt, philox.advance(_STATE, philox.blocks(8, "float32")))


def test_the_pass_folds_the_advance_into_the_fused_draw():
    st, x = gvar("uint32", 1), gvar("float32", 2)
    n0, n1 = T.lscalar("n0"), T.lscalar("n1")
    draw = GpuPhiloxSample("uniform", "float32")(st, n0, n1)
    y = GpuElemwise(SCALAR_OPS["mul"])(x, draw)
    nxt = GpuPhiloxAdvance("float32")(st, n0, n1)
    other = GpuPhiloxAdvance("float32")(st, n1, n0)             # another size: left alone
    fg = FunctionGraph([st, x, n0, n1], [y, nxt, other], clone=False)
    assert gpu_philox_fusion(fg) == 1
    assert gpu_philox_advance_fusion(fg) == 1
    names = [type(n.op).__name__ for n in fg.toposort()]
    assert names.count("GpuPhiloxAdvance") == 1 and names.count("GpuPhiloxElemwise") == 1
    (fused,) = [n for n in fg.apply_nodes if type(n.op) is GpuPhiloxElemwise]
    assert fused.op.advance and fg.outputs[1] is fused.outputs[1]
    assert fg.outputs[0] is fused.outputs[0]
    assert gpu_philox_advance_fusion(fg) == 0                  # folded once


@requires_nvcc
def test_the_advancing_modules_compile(tmp_path):
    for dtype in ("float32", "float64"):
        src = render_philox_elemwise(SCALAR_OPS["mul"], [dtype, dtype], [False, False], 1,
                                     "uniform", 2, advance=True)
        assert "st_next[2]" in src and compile_for_sm90(src, tmp_path)
