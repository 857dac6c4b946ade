"""The plain path's precomputed shortcuts (issue 18) give what the general routines give:
GpuDimShuffle's view plan and GpuSubtensor's row slice against GpuArray's transpose and
basic indexing, the memset words of ``fill``, ``dtype_name`` and ``c_strides``, and the
GEMM thunk's memo of cuBLASLt problems by layout.  CPU only (fake contexts)."""
from __future__ import annotations

import itertools
import sys
import types

import numpy as np
import pytest

from gpu_helpers import FakeCtx, fake_gpu_array
from symgpu.gpu.placement.basic_ops import GpuDimShuffle
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime.array import c_strides, dtype_name


def _same_view(a, b):
    assert (a.ptr, a.shape, a.strides, a.dtype, a.context) == \
        (b.ptr, b.shape, b.strides, b.dtype, b.context)
    assert a.base is b.base


def _general_c_strides(shape, itemsize):
    out, acc = [], itemsize
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def test_c_strides_and_dtype_name_match_the_general_forms():
    for shape in [(), (0,), (1,), (7,), (0, 3), (3, 0), (1, 1), (4, 5), (2, 0, 3), (2, 3, 4, 5)]:
        for itemsize in (1, 2, 4, 8):
            assert c_strides(shape, itemsize) == _general_c_strides(shape, itemsize)
    for dt in ("bool", "int8", "uint16", "int32", "int64", "float16", "float32", "float64"):
        assert dtype_name(np.dtype(dt)) == np.dtype(dt).name == dtype_name(np.dtype(dt))


_PATTERNS = [((False,), ("x", 0)), ((False,), (0, "x")), ((False, False), (1, 0)),
             ((False, False), ("x", 1, "x", 0)), ((False, True), (0,)), ((True, False), (1,)),
             ((True, True), ()), ((True, False, False), (2, "x", 1)), ((False,) * 3, (2, 0, 1)),
             ((), ("x", "x")), ((), ())]


@pytest.mark.parametrize("bcast,order", _PATTERNS)
def test_dimshuffle_plan_gives_the_general_view(bcast, order):
    ctx = FakeCtx()
    op = GpuDimShuffle(bcast, order)
    node = op(GpuArrayType("float32", bcast, None)()).owner
    shapes = [tuple(1 if b else n for b in bcast) for n in (0, 1, 3)]
    for shape in shapes:
        for strides in (None, tuple(reversed(c_strides(shape[::-1], 4))) if shape else None):
            x = fake_gpu_array(ctx, shape, strides=strides)
            out = [[None]]
            op.perform(node, [x], out)
            want = op.general_view(x)
            if not order and not bcast:
                assert out[0][0] is x is want
            else:
                _same_view(out[0][0], want)


def test_dimshuffle_of_an_input_that_breaks_the_plan_takes_the_general_path():
    """A dropped dim that is not 1 at run time, or a wrong rank: the general routines' view
    or error, exactly."""
    ctx = FakeCtx()
    op = GpuDimShuffle((False, True), (0,))
    node = op(GpuArrayType("float32", (False, True), None)()).owner
    x = fake_gpu_array(ctx, (3, 2))
    out = [[None]]
    op.perform(node, [x], out)
    _same_view(out[0][0], x.transpose((0, 1))[(slice(None), 0)])
    with pytest.raises(IndexError, match="out of bounds"):
        op.perform(node, [fake_gpu_array(ctx, (3, 0))], out)
    with pytest.raises(IndexError, match="too many indices"):
        op.perform(node, [fake_gpu_array(ctx, (3,))], out)
    op = GpuDimShuffle((False, False), (1, 0))
    node = op(GpuArrayType("float32", (False, False), None)()).owner
    with pytest.raises(ValueError, match="not a permutation"):
        op.perform(node, [fake_gpu_array(ctx, (3,))], out)


def test_subtensor_rows_fast_path_gives_the_general_view():
    import symgpu.tensor as T
    from symgpu.gpu.ops.subtensor import GpuSubtensor
    from symgpu.tensor.subtensor import SYM, Slice
    ctx = FakeCtx()
    op = GpuSubtensor((Slice(SYM, SYM, None),))
    for bcast in ((False,), (False, False), (False, True, False)):
        node = op(GpuArrayType("float32", bcast, None)(), T.lscalar(), T.lscalar()).owner
        shape = tuple(1 if b else 5 for b in bcast)
        x = fake_gpu_array(ctx, shape)
        for a, b in itertools.product((-7, -5, -2, 0, 1, 3, 5, 9), repeat=2):
            a_, b_ = np.asarray(a, "int64"), np.asarray(b, "int64")
            storage = {node.inputs[0]: [x], node.inputs[1]: [a_], node.inputs[2]: [b_],
                       node.outputs[0]: [None]}
            thunk = op.make_thunk(node, storage, {}, [])
            thunk()
            want = [[None]]
            op.perform(node, [x, a_, b_], want)
            _same_view(storage[node.outputs[0]][0], want[0][0])
            assert thunk.param_values()[0] == (want[0][0].shape, want[0][0].strides)


@pytest.fixture
def memsets(monkeypatch):
    """Record the driver memsets (PyCUDA stubbed: no device here)."""
    calls = []
    drv = types.ModuleType("pycuda.driver")
    for name in ("memset_d8_async", "memset_d16_async", "memset_d32_async"):
        setattr(drv, name, lambda ptr, word, n, stream, name=name: calls.append(
            (name.split("_")[1][1:], ptr, word, n)))
    pkg = types.ModuleType("pycuda")
    pkg.driver = drv
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", drv)
    ctx = FakeCtx()
    ctx.stream = None
    return ctx, calls


@pytest.mark.parametrize("dtype,value", [("bool", True), ("uint8", 200), ("int16", -3),
                                         ("float16", 1.5), ("float32", -0.25),
                                         ("int32", 7), ("float64", 2.0), ("int64", -1),
                                         ("int64", 5), ("float64", 0.0)])
def test_fill_memsets_the_elements_bytes(memsets, dtype, value):
    ctx, calls = memsets
    a = fake_gpu_array(ctx, (1,), dtype)
    a.fill(value)
    raw = np.array(value, dtype=dtype).reshape(1)
    if raw.itemsize < 8:
        want = int(raw.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[raw.itemsize])[0])
        assert calls == [(str(8 * raw.itemsize), a.ptr, want, 1)]
    else:
        lo, hi = (int(w) for w in raw.view(np.uint32))
        assert calls == ([("32", a.ptr, lo, 2)] if lo == hi else
                         [("32", a.ptr, lo, 1), ("32", a.ptr + 4, hi, 1)])


def test_scalar_upload_memsets_the_value(memsets, monkeypatch):
    from symgpu.gpu.placement import basic_ops
    from symgpu.gpu.placement.basic_ops import GpuFromHost
    from symgpu.tensor.type import TensorType
    ctx, calls = memsets
    monkeypatch.setattr(basic_ops, "_get_context", lambda name: ctx)
    for dtype, bcast, value in (("float32", (), 0.5), ("int64", (True,), 128),
                                ("float64", (True, True), -3.5)):
        node = GpuFromHost(None)(TensorType(dtype, bcast)()).owner
        storage = {node.inputs[0]: [np.asarray(value, dtype).reshape((1,) * len(bcast))],
                   node.outputs[0]: [None]}
        thunk = node.op.make_thunk(node, storage, {}, [])
        del calls[:]
        thunk()
        out = storage[node.outputs[0]][0]
        assert out.shape == (1,) * len(bcast) and out.dtype == np.dtype(dtype)
        assert out.strides == c_strides(out.shape, out.dtype.itemsize)
        ref = fake_gpu_array(ctx, (1,), dtype)
        got = list(calls)
        del calls[:]
        ref.fill(value)
        assert [c[:1] + c[2:] for c in got] == [c[:1] + c[2:] for c in calls]
