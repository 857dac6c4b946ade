"""A dropout training step's random numbers under the CUDA-graph runner, without a GPU.

The Philox ops' thunks run against the fake context and driver of tests/graph_fakes.py, their
kernels simulated in NumPy (tests/philox_fakes.py), so these tests check what decides whether
a step replays one graph per call: the generator state keeps its buffer (the advance is
copied back into it), a replay reads the state on the device and draws fresh numbers, and
the numbers are those of plain launches and of NumPy's Philox.
"""
from __future__ import annotations

import numpy as np
import pytest

import graph_fakes as fakes
import philox_fakes as pf
from graph_fakes import CTX, FakeKernelOp, read, upload
from symgpu.config import config
from symgpu.graph.fg import FunctionGraph
from symgpu.gpu.placement.basic_ops import GpuShape_i
from symgpu.gpu.ops.random import GpuPhiloxAdvance, GpuPhiloxSample
from symgpu.gpu.ops.random_fusion import GpuPhiloxElemwise
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.link.vm import link
from symgpu.scalar.basic import SCALAR_OPS
from symgpu.tensor.random import philox

SEED_STATE = np.array([0x1234, 0xABCD, 7, 0], dtype=np.uint32)


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    import symgpu.gpu.runtime.codegen.launch as launch
    monkeypatch.setattr(launch, "load_kernels", pf.philox_loader)
    yield from fakes.use_fake_gpu(monkeypatch)


def _dropout_step(graphs_on: bool = True, fold_advance: bool = False):
    """w <- w - 0.5 * mask * 2 * (mask * (x + 1)) with the mask drawn twice from one state
    (forward and backward, as gpu_philox_fusion leaves a dropout layer), the state advanced
    by GpuPhiloxAdvance: the shape of the MLP step's random part (``fold_advance``: the
    advance folded into a fused draw by gpu_philox_advance_fusion)."""
    ctx = fakes.CTX_OBJ
    x = GpuArrayType("float32", (False,), CTX)("x")
    w = GpuArrayType("float32", (False,), CTX)("w")
    st = GpuArrayType("uint32", (False,), CTX)("state")
    n = GpuShape_i(0)(x)
    h = FakeKernelOp("add1", lambda a: a + 1)(x)
    fwd = GpuPhiloxElemwise(SCALAR_OPS["mul"], 1, "uniform", "float32", 1)(st, n, h)
    g = FakeKernelOp("mul2", lambda a: a * 2)(fwd)
    bwd = GpuPhiloxElemwise(SCALAR_OPS["mul"], 1, "uniform", "float32", 1)(st, n, g)
    w_new = FakeKernelOp("sgd", lambda w_, b: w_ - 0.5 * b)(w, bwd)
    st_new = GpuPhiloxAdvance("float32", CTX)(st, n)
    fg = FunctionGraph([x, w, st], [fwd, w_new, st_new], clone=False)
    fg.update_mapping = {1: 1, 2: 2}
    if fold_advance:
        from symgpu.gpu.ops.random_fusion import gpu_philox_advance_fusion
        assert gpu_philox_advance_fusion(fg) == 1
    xv = upload(ctx, np.arange(10, dtype="float32"))
    values = [xv, upload(ctx, np.ones(10, dtype="float32")), pf.upload_state(ctx, SEED_STATE)]
    storage = {v: [a] for v, a in zip(fg.inputs, values)}
    with config.change_flags(**{"gpuarray.cuda_graphs": graphs_on}):
        vm = link(fg, storage, allow_gc=True)
    return vm, fg


def _call(vm, fg):
    """One call as Function makes it: run, take the result, move the updates in."""
    vm()
    sm = vm.storage_map
    res = read(sm[fg.outputs[0]][0])
    for o, i in fg.update_mapping.items():
        sm[fg.inputs[i]][0] = sm[fg.outputs[o]][0]
    for v in fg.outputs:
        sm[v][0] = None
    return res


def _expected(calls: int) -> list[np.ndarray]:
    x = np.arange(10, dtype="float32")
    w = np.ones(10, dtype="float32")
    st = SEED_STATE
    out = []
    for _ in range(calls):
        u = philox.sample(st, "uniform", "float32", (10,))
        fwd = (x + 1) * u
        out.append((fwd, None))
        w = w - np.float32(0.5) * ((fwd * 2) * u)
        out[-1] = (fwd, w)
        st = philox.advance(st, philox.blocks(10, "float32"))
    return out


def test_the_step_is_one_segment_and_the_state_is_copied_back():
    vm, fg = _dropout_step()
    (seg,) = vm.runner.segments
    assert len(seg.items) == 7, [vm.nodes[i] for i, _, _ in seg.items]
    # w and the state keep their buffers: each update's cell is copied into its input's
    names = {id(c): v for v, c in vm.storage_map.items()}
    backs = {(names[id(cell)].owner.op.__class__.__name__, str(names[id(seg.in_cells[j])]))
             for cell, j in seg.copy_back}
    assert backs == {("FakeKernelOp", "w"), ("GpuPhiloxAdvance", "state")}, backs


@pytest.mark.parametrize("fold_advance", [False, True])
def test_the_step_captures_once_then_replays_drawing_fresh_numbers(fold_advance):
    vm, fg = _dropout_step(fold_advance=fold_advance)
    if fold_advance:   # the fused draw writes the next state: no advance launch is left
        assert "GpuPhiloxAdvance" not in {type(n.op).__name__ for n in vm.nodes}
    state_cell = vm.storage_map[fg.inputs[2]]
    ptr = state_cell[0].ptr
    want = _expected(12)
    for k in range(12):
        got = _call(vm, fg)
        np.testing.assert_array_equal(got, want[k][0], err_msg=f"call {k}")
        np.testing.assert_allclose(read(vm.storage_map[fg.inputs[1]][0]), want[k][1],
                                   rtol=1e-6, err_msg=f"call {k}")
        assert state_cell[0].ptr == ptr, f"call {k}: the state moved to another buffer"
        np.testing.assert_array_equal(
            pf.read_state(state_cell[0]),
            philox.advance(SEED_STATE, (k + 1) * philox.blocks(10, "float32")))
    st = vm.runner.stats()
    assert st["plain"] == 1 and st["captures"] == 1 and st["replays"] == 10, st
    assert st["graphs"] == 1, st


def test_replayed_numbers_equal_plain_launches():
    plain_vm, plain_fg = _dropout_step(graphs_on=False)
    vm, fg = _dropout_step()
    assert plain_vm.runner is None or not getattr(plain_vm.runner, "segments", None)
    for k in range(6):
        np.testing.assert_array_equal(_call(vm, fg), _call(plain_vm, plain_fg),
                                      err_msg=f"call {k}")
    assert vm.runner.stats()["replays"] == 4


def test_a_sample_materialised_in_memory_replays_too():
    """The unfused draw (GpuPhiloxSample, then a kernel reading it) behaves the same."""
    ctx = fakes.CTX_OBJ
    st = GpuArrayType("uint32", (False,), CTX)("state")
    x = GpuArrayType("float32", (False,), CTX)("x")
    n = GpuShape_i(0)(x)
    z = GpuPhiloxSample("normal", "float32", CTX)(st, n)
    y = FakeKernelOp("add", lambda a, b: a + b)(z, x)
    st_new = GpuPhiloxAdvance("float32", CTX)(st, n)
    fg = FunctionGraph([x, st], [y, st_new], clone=False)
    fg.update_mapping = {1: 1}
    xv = upload(ctx, np.zeros(6, dtype="float32"))
    storage = {x: [xv], st: [pf.upload_state(ctx, SEED_STATE)]}
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, storage, allow_gc=True)
    state = SEED_STATE
    for k in range(5):
        np.testing.assert_allclose(_call(vm, fg), philox.sample(state, "normal", "float32", (6,)),
                                   rtol=1e-6, err_msg=f"call {k}")
        state = philox.advance(state, philox.blocks(6, "float32"))
    assert vm.runner.stats()["replays"] == 3, vm.runner.stats()
