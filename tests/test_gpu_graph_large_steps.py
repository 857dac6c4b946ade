"""CUDA graphs of training steps (issue 34's GPT step): a step whose GPU inputs (parameters,
optimizer moments, data) pass 64 MB is captured (the check's limit is a sixteenth of the
device's memory: ``graphs.verify_limit``), and a step with an op that gives other bits from
the same inputs (``deterministic = False``: fused attention's dq summed with float atomics)
is checked against the spread of two plain runs instead of being dropped for it.

Before, a GPT block's step (85 MB of parameters and AdamW moments) was never captured: every
call ran its ~150 launches plainly from Python (the host's gaps between kernels) and copied
its 37 updates back into their variables (37 device-to-device copies a step) instead of
writing them straight into their buffers under capture.

Driven by tests/graph_fakes.py's fake context, pool and driver (no GPU); the last test builds
the GPT step of benchmarks/half.py with GPU shared variables (an emulated context: values in
host memory) and checks the runner's rules would write all 37 updates in place.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import graph_fakes as fakes
from graph_fakes import FakeElemwise, FakeKernelOp, call, gvec, read, upload
from symgpu.config import config
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.gpu.exec import graphs
from symgpu.gpu.exec.graph_instance import results_differ


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    yield from fakes.use_fake_gpu(monkeypatch)


linked = fakes.linked


# ============================================================================ the limit

def test_the_verify_limit_follows_the_device_memory(monkeypatch):
    class Ctx:
        total_memory = 141 << 30
    assert graphs.verify_limit(Ctx()) == (141 << 30) // 16
    Ctx.total_memory = 256 << 20                   # a small device: the floor
    assert graphs.verify_limit(Ctx()) == 64 << 20
    assert graphs.verify_limit(object()) == 64 << 20
    monkeypatch.setattr(graphs, "VERIFY_LIMIT", 1000)
    assert graphs.verify_limit(Ctx()) == 1000


def _sgd_step(ctx, n):
    """w <- w - 0.5 * (w * x): a step whose inputs are n floats each."""
    w, x = gvec(), gvec()
    new = FakeElemwise("sgd", lambda a, b: a - 0.5 * (a * b))(w, x)
    wv = upload(ctx, np.linspace(1, 2, n))
    xv = upload(ctx, np.full(n, 0.5))
    vm, fg = linked([w, x], [new], [wv, xv], updates={0: 0})
    return vm, fg, new, w, wv


def _run_steps(vm, fg, new, w, wv, calls):
    for _ in range(calls):
        (r,) = call(vm, [new])
        vm.storage_map[w][0] = r          # Function's update: the new value is the input
    return read(vm.storage_map[w][0])


def test_a_step_with_inputs_past_64_mb_is_captured(monkeypatch):
    """The fake device has 1 GB, so its limit is 64 MB; on a device of 4 GB it is 256 MB: a
    step of 2 x 40 MB of inputs is captured there and replayed, its update written straight
    into its variable (no copy recorded)."""
    ctx = fakes.CTX_OBJ
    n = 10 << 20                               # 40 MB a vector, 80 MB of inputs
    vm, fg, new, w, wv = _sgd_step(ctx, n)
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphs.GraphCaptureWarning)
        _run_steps(vm, fg, new, w, wv, 4)
    st = vm.runner.stats()
    assert st["captures"] == 0 and st["plain"] == 4, st    # 1 GB device: over its limit
    monkeypatch.setattr(type(ctx), "total_memory", 4 << 30)
    vm, fg, new, w, wv = _sgd_step(ctx, n)
    got = _run_steps(vm, fg, new, w, wv, 5)
    st = vm.runner.stats()
    assert st["captures"] == 1 and st["replays"] == 3, st
    (seg,) = vm.runner.segments
    (g,) = [g for gs in seg.graphs.values() for g in gs]
    assert g.direct == (0,)                    # the update computed in the variable's buffer
    assert vm.storage_map[w][0].ptr == wv.ptr
    want = np.linspace(1, 2, n).astype("float32")
    for _ in range(5):
        want = want - np.float32(0.5) * (want * np.float32(0.5))
    np.testing.assert_allclose(got, want, rtol=1e-6)


# ============================================================================ nondeterminism

class Jitter(Op):
    """out = 2 * x plus ``size`` times +1, -1, +1, ... (one per launch, plain or replayed) in
    its last element: a float-atomics sum's other rounding; ``lie`` adds 1 to every
    element of launches recorded under capture (a graph reading the wrong memory).
    ``deterministic`` False, as GpuAttentionGrad's."""

    __props__ = ("size", "lie", "flagged")

    def __init__(self, size, lie=0.0, flagged=True):
        self.size, self.lie, self.flagged = size, lie, flagged
        self.deterministic = not flagged

    def make_node(self, x):
        return Apply(self, [x], [x.type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        from symgpu.gpu.ops.elemwise import new_array
        inp, out = storage_map[node.inputs[0]], storage_map[node.outputs[0]]
        drv, ctx = fakes.DRV, fakes.CTX_OBJ
        launches = [0]

        def thunk():
            x = inp[0]
            o = new_array(ctx, x.shape, np.dtype("float32"))
            n, xp, op_ = x.size, x.ptr, o.ptr
            lie = self.lie if drv.capturing else 0.0

            def k():
                v = 2 * fakes.MEM[xp][:n] + lie
                launches[0] += 1
                v[-1] += self.size * (1 if launches[0] % 2 else -1)
                fakes.MEM[op_][:n] = v
            drv.launch_kernel(k)
            out[0] = o
        thunk.capturable = True
        thunk.launches = True
        return thunk


def _jitter_function(op):
    ctx = fakes.CTX_OBJ
    x = gvec()
    y = FakeKernelOp("add1", lambda a: a + 1)(op(x))
    return linked([x], [y], [upload(ctx, np.arange(1, 65))]) + (y,)


def test_a_nondeterministic_step_is_captured_within_the_spread_of_plain_runs():
    vm, fg, y = _jitter_function(Jitter(1e-2))
    (seg,) = vm.runner.segments
    assert seg.nondeterministic
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphs.GraphCaptureWarning)
        for _ in range(6):
            (r,) = call(vm, [y])
            np.testing.assert_allclose(read(r)[:-1], 2 * np.arange(1, 64) + 1)
    st = vm.runner.stats()
    assert vm.runner.enabled and st["captures"] >= 1 and st["replays"] >= 3, st


def test_without_the_flag_the_same_jitter_drops_the_graph():
    vm, fg, y = _jitter_function(Jitter(1e-2, flagged=False))
    assert not vm.runner.segments[0].nondeterministic
    with pytest.warns(graphs.GraphCaptureWarning, match="differ from plain"):
        for _ in range(4):
            call(vm, [y])
    assert not vm.runner.enabled


def test_a_graph_beyond_the_spread_is_still_dropped():
    vm, fg, y = _jitter_function(Jitter(1e-3, lie=1.0))
    with pytest.warns(graphs.GraphCaptureWarning, match="plain runs differ by"):
        for _ in range(4):
            (r,) = call(vm, [y])
            np.testing.assert_allclose(read(r)[:-1], 2 * np.arange(1, 64) + 1)
    assert not vm.runner.enabled


def test_results_differ_with_a_spread():
    ref = [np.array([1.0, 2.0, 3.0], "float32")]
    other = [np.array([1.0, 2.0, 3.1], "float32")]
    assert results_differ(ref, other) is not None
    assert results_differ(ref, other, [np.array([1.0, 2.06, 3.0], "float32")]) is None
    assert "plain runs differ by" in results_differ(ref, other, [ref[0].copy()])
    nan = [np.array([1.0, np.nan, 3.1], "float32")]      # a NaN where plain runs had none
    assert results_differ(ref, nan, [np.array([1.0, 2.0, 4.0], "float32")]) is not None
    ints = [np.array([1, 2], "int32")]
    assert results_differ(ints, [np.array([1, 3], "int32")], ints) is not None
    # an optimizer's weights: two plain runs 2e-7 apart at most, the graph 5e-6 at one
    # element (an ulp of a near-zero gradient, amplified): close in norm, it agrees; a graph
    # off by that much everywhere does not
    w = np.random.default_rng(0).standard_normal(100_000).astype("float32")
    plain2, graph, wrong = w.copy(), w.copy(), w + np.float32(5e-3)
    plain2[7] += 2e-7
    graph[9] += 5e-6
    assert results_differ([w], [graph], [plain2]) is None
    assert "plain runs differ by" in results_differ([w], [wrong], [plain2])


def test_fused_attention_gradient_is_marked_nondeterministic():
    from symgpu.gpu.ops.attention import GpuAttention, GpuAttentionGrad
    assert GpuAttentionGrad.deterministic is False
    assert getattr(GpuAttention, "deterministic", True) is True


# ============================================================================ the GPT step

@pytest.fixture
def gpt_step(monkeypatch, tmp_path):
    """benchmarks/half.py's GPT block step (bf16 mixed precision, AdamW) with GPU shared
    variables: made on an emulated context (values in host memory), linked as on a virtual
    one (nothing runs), so its graph is the GPU machine's."""
    import os
    import sys
    import symgpu
    from emulated_gpu import emulated_array_device
    from symgpu.gpu.runtime import context as gctx
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.syspath_prepend(os.path.join(root, "benchmarks"))
    import half_symgpu
    ctx = emulated_array_device(monkeypatch, tmp_path)
    prev = gctx.get_context(None) if None in gctx.context_names() else None
    gctx.register_context(None, ctx)
    real_function = symgpu.function

    def function(*args, **kw):       # shared values are made; the function links virtually
        ctx.virtual = True
        try:
            return real_function(*args, **kw)
        finally:
            ctx.virtual = False
    monkeypatch.setattr(symgpu, "function", function)
    try:
        with config.change_flags(floatX="float32", device="cuda", mixed_precision="bfloat16"):
            step, _, _ = half_symgpu.gpt({})
        yield step
    finally:
        if prev is not None:
            gctx.register_context(None, prev)
        else:
            gctx.unregister_context(None)
        sys.modules.pop("half_symgpu", None)


def test_the_gpt_steps_updates_are_all_written_in_place_under_capture(gpt_step):
    """The runner's rules (graphs.Runner._segment, _direct_update) on the GPT step: one
    segment after the host's shape arithmetic, holding every update's node (GpuElemwise or
    an elementwise group: write_into), none read later, no device-checked op; the attention gradient in it (written
    into its join, GpuAttentionGradJoin; checked against two plain runs); its GPU inputs past
    64 MB and within an H200's limit."""
    from symgpu.compile.sharedvalue import SharedVariable
    from symgpu.gpu.exec.graph_plan import aliases, plan_steps, read_later, updates_last
    from symgpu.gpu.ops.attention_join import GpuAttentionGradJoin
    from symgpu.gpu.ops.elemwise import GpuElemwise
    from symgpu.gpu.ops.elemwise_group import GpuElemwiseGroup
    fg = gpt_step.maker.fgraph
    nodes = list(gpt_step.vm.nodes)
    names = [type(n.op).__name__ for n in nodes]
    capt = [nm.startswith("Gpu") and nm != "HostFromGpu" for nm in names]
    views = {"GpuShape_i", "GpuShape", "GpuDimShuffle", "GpuReshape"}
    steps = plan_steps(nodes, capt, [c and nm not in views for c, nm in zip(capt, names)],
                       [nm == "HostFromGpu" for nm in names])
    kinds = [k for k, _ in steps]
    assert kinds.count("segment") == 1 and kinds[-1] == "segment", kinds
    idx = steps[-1][1]
    updates = [(fg.outputs[o], fg.inputs[i]) for o, i in fg.update_mapping.items()]
    assert len(updates) == 37                    # t, and 12 parameters with 2 moments each
    assert not any(getattr(n.op, "device_checked", False) for n in nodes)
    grad = [nodes[i].op for i in idx if isinstance(nodes[i].op, GpuAttentionGradJoin)]
    assert len(grad) == 1 and grad[0].deterministic is False
    order = updates_last(nodes, idx, updates)
    for new, old in updates:   # (AdamW's updates as one group: gpu_elemwise_group)
        assert isinstance(new.owner.op, (GpuElemwise, GpuElemwiseGroup)), new.owner.op
        pos = next(p for p, i in enumerate(order) if nodes[i] is new.owner)
        assert not read_later(nodes, order, pos, old), new.owner.op
        assert not any(aliases(v, old) for v in fg.outputs if v is not new)
    gpu_bytes = sum(v.container.storage[0].nbytes for v in fg.inputs
                    if isinstance(v, SharedVariable))
    assert 64 << 20 < gpu_bytes < graphs.verify_limit(type("H200", (), {
        "total_memory": 141 << 30})())


def _comparable(name: str, value: np.ndarray) -> np.ndarray:
    """A GPT parameter's value without the key third of the qkv bias: adding one vector to
    every key adds the same number to a query's scores, which the softmax ignores, so that
    bias's gradient is zero in exact arithmetic and AdamW turns its rounding noise into whole
    steps (any difference between two runs, such as the order in which the attention's dQ
    atomics add, moves it elsewhere)."""
    if name == "b_qkv":
        d = value.shape[0] // 3
        return np.concatenate([value[:d], value[2 * d:]])
    return value


@pytest.mark.gpu
def test_gpu_gpt_step_replays_one_graph_with_its_updates_in_place(cuda, monkeypatch):
    """On the GPU: the GPT step is captured (its check over two plain runs passes), replays,
    writes its 37 updates into their variables (no copy back), and after 6 steps its
    parameters are as close to the same step run with graphs off (plain launches) as two plain
    runs are to each other (or within 1% by norm; the qkv bias's key third left out:
    _comparable)."""
    import os
    import warnings as _w
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.syspath_prepend(os.path.join(root, "benchmarks"))
    import half_symgpu
    monkeypatch.setattr(graphs, "_driver", None)   # the real driver, not the module's fake

    def run(graphs_on):
        with config.change_flags(mixed_precision="bfloat16",
                                 **{"gpuarray.cuda_graphs": graphs_on}):
            step, _, sync = half_symgpu.gpt({})
        for _ in range(6):
            step()
        sync()
        shared = [v for v in step.maker.fgraph.inputs if hasattr(v, "get_value")]
        return step, [_comparable(v.name, np.asarray(v.get_value(), "float64"))
                      for v in shared]
    with _w.catch_warnings():
        _w.simplefilter("error", graphs.GraphCaptureWarning)
        step, with_graphs = run(True)
    runner = step.vm.runner
    st = runner.stats()
    assert runner.enabled and st["captures"] >= 1 and st["replays"] >= 3, st
    (seg,) = [s for s in runner.segments if s.graphs]
    assert seg.nondeterministic and seg.verified >= 1
    direct = {len(g.direct) for gs in seg.graphs.values() for g in gs}
    assert direct == {37}, direct
    _, plain = run(False)
    _, plain_again = run(False)
    # The attention gradient sums with atomics, so two plain runs differ too, and Adam's
    # m / sqrt(v) turns a rounding-level change of a near-zero gradient into a whole step of
    # one element: compare whole parameters (relative norm), against the plain runs' spread.
    far = []
    for k, (a, b, c) in enumerate(zip(with_graphs, plain, plain_again)):
        scale = np.linalg.norm(b) + 1e-6
        off, spread = np.linalg.norm(a - b) / scale, np.linalg.norm(c - b) / scale
        if not off <= max(4 * spread, 1e-2):
            far.append((k, a.shape, off, spread))
    assert not far, far
