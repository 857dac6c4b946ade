"""GpuTakeRows and the pass gpu_take_rows (symgpu/gpu/ops/take_rows.py): ``x[arange(r), b]``
gathered without the arange. The kernel runs on the CPU emulator (tests/emulated_gpu.py)
against NumPy, the rewritten graphs are read on a virtual GPU context, the module is compiled
by nvcc."""
from __future__ import annotations

import numpy as np
import pytest

from cuda_on_host import requires_gxx
from emulated_gpu import device_array, emulate_prepared_kernels, emulated_kernel_device, host_view
from gpu_helpers import (assert_one_segment, compile_for_sm90, example_module, requires_nvcc,
                         tutorial_minibatch_step)
from symgpu import config
from symgpu.gpu.ops import take_rows as tr
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.gpu.placement.type import GpuArrayType

@pytest.fixture
def emu(monkeypatch, tmp_path):
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    from symgpu.gpu.ops import advanced_pairs
    emulate_prepared_kernels(monkeypatch, tmp_path, advanced_pairs)
    return ctx


def _on_host(ctx, a: np.ndarray):
    """A GpuArray over NumPy array ``a``'s memory in its own layout (strides kept)."""
    from symgpu.gpu.runtime.array import GpuArray
    g = GpuArray.__new__(GpuArray)
    g._set(ctx, a.ctypes.data, a.shape, a.strides, a.dtype, a)
    return g


def _take(ctx, x: np.ndarray, r: int, b: np.ndarray):
    node = tr.GpuTakeRows()(GpuArrayType(str(x.dtype), (False, False), None)(), np.int64(r),
                            GpuArrayType(str(b.dtype), (False,), None)()).owner
    out = [None]
    xs = device_array(ctx, x) if x.flags.c_contiguous else _on_host(ctx, x)
    node.op.perform(node, [xs, np.int64(r), device_array(ctx, b)], [out])
    return host_view(out[0]).copy()


@requires_gxx
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("idt", ["int32", "int64"])
def test_take_rows_is_the_gather_at_arange_rows(emu, dtype, idt):
    from symgpu.gpu.runtime.device_checks import raise_device_errors
    rng = np.random.default_rng(2)
    n, k = 300, 9
    x = (rng.standard_normal((n, k)) * 10).astype(dtype)
    b = rng.integers(-k, k, n).astype(idt)                     # negatives count from the end
    np.testing.assert_array_equal(_take(emu, x, n, b), x[np.arange(n), b])
    np.testing.assert_array_equal(_take(emu, x, 1, b), x[np.arange(1), b])      # rows broadcast
    np.testing.assert_array_equal(_take(emu, x, 7, b[:1]), x[np.arange(7), b[:1]])
    xt = np.ascontiguousarray(x.T).T                           # element strides (1, n)
    assert not xt.flags.c_contiguous
    np.testing.assert_array_equal(_take(emu, xt, n, b), x[np.arange(n), b])
    raise_device_errors(emu)                                   # nothing reported
    bad = b.copy()
    bad[260] = k
    got = _take(emu, x, n, bad)
    with pytest.raises(IndexError, match=f"index {k} is out of bounds"):
        raise_device_errors(emu)
    keep = np.arange(n) != 260
    np.testing.assert_array_equal(got[keep], x[np.arange(n), b][keep])


@requires_gxx
def test_take_rows_refuses_what_the_gather_refuses(emu):
    x = np.ones((5, 3), dtype="float32")
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        _take(emu, x, 6, np.zeros(6, dtype="int64"))            # more rows than x has
    with pytest.raises(ValueError, match="cannot be broadcast"):
        _take(emu, x, 4, np.zeros(3, dtype="int64"))
    assert _take(emu, x, 0, np.zeros(0, dtype="int64")).shape == (0,)


def _mlp_nodes(**flags):
    mlp_dropout = example_module("mlp_dropout")
    with config.change_flags(floatX="float32", device="cuda", **flags), virtual_context(None):
        train, _, _ = mlp_dropout.build(64, on_device=True, p_drop=0)
        return [type(n.op).__name__ for n in train.maker.fgraph.toposort()]


def test_the_tutorials_nll_gathers_without_an_arange_by_default():
    taken = _mlp_nodes()                                       # gpu_take_rows is in fast_run
    assert "GpuTakeRows" in taken and "GpuARange" not in taken
    assert "GpuAdvancedSubtensor2" not in taken
    plain = _mlp_nodes(optimizer_excluding="gpu_take_rows")
    assert "GpuARange" in plain and "GpuAdvancedSubtensor2" in plain
    assert "GpuTakeRows" not in plain and len(taken) == len(plain) - 1


@requires_nvcc
def test_the_pairs_module_with_the_rows_gathers_compiles(tmp_path):
    from symgpu.gpu.ops.advanced_pairs import pairs_source
    src = pairs_source()
    assert "pairs_rows_float32_int64" in src and compile_for_sm90(src, tmp_path)


def test_the_minibatch_step_stays_one_captured_segment_with_both_fusions():
    """The tutorials' minibatch step (tests/test_gpu_advanced_pairs.py) with gpu_take_rows and
    gpu_careduce_epilogue (both in fast_run): the mean's divisor still comes from shapes on the
    host, so the step is still one capturable segment."""
    f = tutorial_minibatch_step()
    nodes = f.maker.fgraph.toposort()
    names = {type(n.op).__name__ for n in nodes}
    assert "GpuTakeRows" in names and "GpuARange" not in names
    assert any(type(n.op).__name__ == "GpuCAReduce" and n.op.post_scalar_op is not None
               for n in nodes)
    assert_one_segment(nodes)
