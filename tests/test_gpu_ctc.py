"""The CTC loss on the GPU (symgpu/gpu/ops/ctc.py, runtime/codegen/ctc.cu): placement of a
CTC training step on a virtual context, the thunk run on the CPU with its kernels emulated
(tests/emulated_gpu.py) and a fake cuDNN that checks what it is given and answers with the
host op's values, nvcc compiling the kernels, and on a real GPU the host op's costs and
gradients."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from emulated_gpu import (device_array, emulate_prepared_kernels, emulated_kernel_device,
                          host_view)
from gpu_helpers import compile_for_sm90, on_the_cpu, requires_gpu, requires_nvcc
from symgpu import config, function
from symgpu.gpu.ops import ctc as gctc
from symgpu.gpu.placement.rewriting import cpu_nodes, virtual_context
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.tensor.nnet.ctc import ConnectionistTemporalClassification, ctc, ctc_cost_and_grad

GPU_OP = gctc.GpuConnectionistTemporalClassification


def _ctc_nodes(f, cls):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, cls)]


def _training_step():
    """A linear layer's activations (time, batch, alphabet) trained on the CTC loss."""
    x = T.tensor3("x")
    labels, lengths = T.imatrix("labels"), T.ivector("lengths")
    W = symgpu.shared(np.zeros((6, 5), "float32"), name="W")
    t, b = x.shape[0], x.shape[1]
    acts = T.dot(x.reshape((t * b, 6)), W).reshape((t, b, 5))
    cost = ctc(acts, labels, lengths).mean()
    return [x, labels, lengths], cost, W


# ============================================================================ placement

def test_ctc_training_step_is_placed_on_the_gpu():
    with config.change_flags(floatX="float32"), virtual_context(None):
        ins, cost, W = _training_step()
        f = function(ins, cost, updates=[(W, W - 0.1 * T.grad(cost, W))])
        nodes = _ctc_nodes(f, GPU_OP)
        assert [n.op.compute_grad for n in nodes] == [True]
        assert not _ctc_nodes(f, ConnectionistTemporalClassification)
        assert not cpu_nodes(f.maker.fgraph), cpu_nodes(f.maker.fgraph)
        fwd = function(ins, cost)
        assert [n.op.compute_grad for n in _ctc_nodes(fwd, GPU_OP)] == [False]


def test_float64_and_disabled_ctc_stay_on_the_host(monkeypatch):
    with config.change_flags(floatX="float32"), virtual_context(None):
        a, lab, ln = T.dtensor3(), T.imatrix(), T.ivector()
        f = function([a, lab, ln], ctc(a, lab, ln))
        assert _ctc_nodes(f, ConnectionistTemporalClassification) and not _ctc_nodes(f, GPU_OP)
        monkeypatch.setattr(gctc, "ENABLED", False)
        a = T.ftensor3()
        f = function([a, lab, ln], ctc(a, lab, ln))
        assert _ctc_nodes(f, ConnectionistTemporalClassification) and not _ctc_nodes(f, GPU_OP)


def test_gpu_op_types_and_gradient_graph():
    with virtual_context(None):
        g = GpuArrayType("float32", (False,) * 3, None)()
        cost = gctc.gpu_ctc(g, T.imatrix(), T.ivector())
        assert isinstance(cost.owner.op, GPU_OP) and len(cost.owner.outputs) == 2
        assert cost.owner.inputs[1].type.context_name is None    # labels on the device
        gx = T.grad(cost.sum(), g)
        assert gx.type == g.type
        with pytest.raises(TypeError, match="float32 activations"):
            gctc.gpu_ctc(GpuArrayType("float64", (False,) * 3, None)(), T.imatrix(), T.ivector())
        with pytest.raises(TypeError, match="labels must be an int32 matrix"):
            gctc.gpu_ctc(g, T.lmatrix(), T.ivector())


# ============================================================================ emulated thunk

class _FakeCudnnLib:
    """cuDNN's CTC entry points as Python: records what the op passes, and answers
    cudnnCTCLoss_v8 with the host op's values for what it was given (packed labels),
    leaving the gradient's steps past each input length as garbage (the fix-up zeroes them)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.next = 100
        self.dims: dict[int, tuple] = {}
        self.workspace = 1000

    def _create(self, ref) -> int:
        self.next += 1
        ref._obj.value = self.next
        return 0

    cudnnCreateCTCLossDescriptor = cudnnCreateTensorDescriptor = _create

    def cudnnDestroyCTCLossDescriptor(self, ptr) -> int:
        return 0

    cudnnDestroyTensorDescriptor = cudnnDestroyCTCLossDescriptor

    def cudnnSetCTCLossDescriptor_v9(self, desc, comp, norm, grad_mode, max_label) -> int:
        self.calls.append(("desc", comp.value, norm.value, grad_mode.value, max_label.value))
        return 0

    def cudnnSetTensorNdDescriptor(self, desc, dtype, nb, dims, strides) -> int:
        self.dims[desc.value] = tuple(dims[:nb.value])
        self.calls.append(("tensor", dtype.value, tuple(dims[:3]), tuple(strides[:3])))
        return 0

    def cudnnGetCTCLossWorkspaceSize_v8(self, handle, algo, ctc_desc, probs, grads, size) -> int:
        self.calls.append(("workspace", algo.value))
        size._obj.value = self.workspace
        return 0

    def cudnnCTCLoss_v8(self, handle, algo, ctc_desc, probs_desc, probs, labels, lab_len,
                        in_len, costs, grads_desc, grads, ws_size, ws) -> int:
        t, b, a = self.dims[probs_desc.value]
        ints = lambda p, n: np.ctypeslib.as_array((ctypes.c_int32 * max(n, 1)).from_address(p))[:n]
        floats = lambda p, shape: np.ctypeslib.as_array(
            (ctypes.c_float * int(np.prod(shape))).from_address(p)).reshape(shape)
        ll, il = ints(lab_len.value, b).copy(), ints(in_len.value, b).copy()
        packed = ints(labels.value, int(ll.sum())).copy() if ll.sum() else np.zeros(0, np.int32)
        self.calls.append(("loss", algo.value, ws_size.value, ws.value is not None,
                           packed.tolist(), ll.tolist(), il.tolist()))
        assert (il >= 1).all() and (il <= t).all() and (ll <= il).all()
        width = max(int(ll.max()), 1)
        padded = np.full((b, width), -1, np.int32)
        offsets = np.concatenate([[0], np.cumsum(ll)])
        for i in range(b):
            padded[i, :ll[i]] = packed[offsets[i]:offsets[i + 1]]
        acts = floats(probs.value, (t, b, a)).copy()
        c, g = ctc_cost_and_grad(acts, padded, il)
        floats(costs.value, (b,))[...] = c
        out = floats(grads.value, (t, b, a))
        out[...] = 7.0                              # steps past an input length: garbage
        keep = np.arange(t)[:, None] < il[None, :]
        out[keep] = g[keep]
        # what cuDNN 9 was seen to give an empty label (H200): cost 0, a zero gradient
        floats(costs.value, (b,))[ll == 0] = 0.0
        out[:, ll == 0] = 0.0
        return 0


class _FakeCudnn:
    """The cudnn() object's surface CtcPlan uses: lib, call, handle."""

    def __init__(self) -> None:
        self.lib = _FakeCudnnLib()

    def call(self, name: str, *args) -> None:
        assert getattr(self.lib, name)(*args) == 0, name

    def handle(self, ctx):
        return ctypes.c_void_p(42)


@pytest.fixture
def emu_ctc(monkeypatch, tmp_path):
    ctx = emulated_kernel_device(monkeypatch, tmp_path)
    emulate_prepared_kernels(monkeypatch, tmp_path, gctc)
    fake = _FakeCudnn()
    monkeypatch.setattr(gctc, "_context", lambda name: ctx)
    monkeypatch.setattr(gctc, "cudnn", lambda: fake)
    return ctx, fake.lib


def _run_emulated(ctx, acts, labels, lengths, compute_grad=True):
    with virtual_context(None):
        node = GPU_OP(compute_grad).make_node(GpuArrayType("float32", (False,) * 3, None)(),
                                              GpuArrayType("int32", (False,) * 2, None)(),
                                              GpuArrayType("int32", (False,), None)())
    storage = {v: [device_array(ctx, x)] for v, x in zip(node.inputs, (acts, labels, lengths))}
    storage.update({v: [None] for v in node.outputs})
    node.op.make_thunk(node, storage, {}, [])()
    return [host_view(storage[o][0]).copy() for o in node.outputs]


def _case(rng, t_max=6, nb=7, na=5, width=4):
    acts = rng.standard_normal((t_max, nb, na)).astype("float32")
    labels = np.full((nb, width), -1, np.int32)
    lengths = rng.integers(1, t_max + 1, nb).astype(np.int32)
    for b in range(nb):
        n = int(rng.integers(0, width + 1))
        slots = np.sort(rng.choice(width, size=n, replace=False))
        labels[b, slots] = rng.integers(1, na, n)
    labels[:4] = -1
    labels[0, :4], lengths[0] = [2, -1, 2, 3], 4   # a repeat: needs 4 steps
    labels[1, :4], lengths[1] = [1, 1, 1, -1], 4   # infeasible: +inf, zero gradient
    lengths[2] = 0                                 # neither input nor label: cost 0
    labels[3, 0], lengths[3] = 3, 0                # a label but no input: +inf
    if nb > 5:
        labels[4], lengths[4] = -1, max(1, t_max // 2)  # no label, some input: blanks only
    return acts, labels, lengths


def test_emulated_thunk_matches_the_host_op_and_packs_labels(emu_ctc):
    ctx, lib = emu_ctc
    acts, labels, lengths = _case(np.random.default_rng(4))
    cost, grad = _run_emulated(ctx, acts, labels, lengths)
    want_cost, want_grad = ctc_cost_and_grad(acts, labels, lengths)
    np.testing.assert_allclose(cost, want_cost, rtol=1e-5)
    assert np.isinf(cost[1]) and np.isinf(cost[3]) and cost[2] == 0
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)
    t, b, a = acts.shape
    assert ("desc", 0, gctc.NORM_SOFTMAX, gctc.ZERO_OOB_GRADIENTS, 4) in lib.calls
    assert ("tensor", 0, (t, b, a), (b * a, a, 1)) in lib.calls
    assert ("workspace", gctc.ALGO_DETERMINISTIC) in lib.calls
    loss = [c for c in lib.calls if c[0] == "loss"]
    assert len(loss) == 1
    _, algo, ws_size, ws_given, packed, ll, il = loss[0]
    assert algo == gctc.ALGO_DETERMINISTIC and ws_size == lib.workspace and ws_given
    feasible = [i for i in range(b) if np.isfinite(want_cost[i])]
    assert ll[:4] == [3, 0, 0, 0]
    assert packed == [int(v) for i in feasible for v in labels[i] if v >= 0]
    assert il[1:4] == [4, 1, 1] and il[4:] == lengths[4:].tolist()


def test_emulated_thunk_without_gradient_and_a_batch_over_one_block(emu_ctc):
    ctx, lib = emu_ctc
    rng = np.random.default_rng(5)
    acts, labels, lengths = _case(rng, t_max=5, nb=300, na=4, width=4)   # scan: two chunks
    (cost,) = _run_emulated(ctx, acts, labels, lengths, compute_grad=False)
    np.testing.assert_allclose(cost, ctc_cost_and_grad(acts, labels, lengths, False)[0],
                               rtol=1e-5)
    packed = [c for c in lib.calls if c[0] == "loss"][0][4]
    want = ctc_cost_and_grad(acts, labels, lengths, False)[0]
    ok = [i for i in range(300) if np.isfinite(want[i])]
    assert packed == [int(v) for i in ok for v in labels[i] if v >= 0]


@pytest.mark.parametrize("change, match", [
    (lambda lab, ln: lab.__setitem__((5, 1), 5), r"batch element 5 has a label outside \[1, 5\): 5"),
    (lambda lab, ln: lab.__setitem__((6, 0), 0), r"batch element 6 has a label outside \[1, 5\): 0"),
    (lambda lab, ln: ln.__setitem__(4, 7), r"batch element 4 has an input length outside \[0, 6\]: 7"),
])
def test_emulated_bad_inputs_raise_at_the_next_sync(emu_ctc, change, match):
    from symgpu.gpu.runtime.device_checks import raise_device_errors
    ctx, _ = emu_ctc
    acts, labels, lengths = _case(np.random.default_rng(6))
    change(labels, lengths)
    _run_emulated(ctx, acts, labels, lengths)
    with pytest.raises(ValueError, match=match):
        raise_device_errors(ctx)
    raise_device_errors(ctx)                         # cleared once raised


def test_emulated_more_labels_than_cudnn_takes(emu_ctc):
    from symgpu.gpu.runtime.device_checks import raise_device_errors
    ctx, lib = emu_ctc
    n = gctc.MAX_LABELS + 1
    acts = np.zeros((2 * n, 2, 3), np.float32)
    labels = np.full((2, n + 4), -1, np.int32)
    labels[0, :n] = np.tile([1, 2], n)[:n]
    labels[1, :2] = [1, 2]
    lengths = np.array([2 * n, 3], np.int32)
    _run_emulated(ctx, acts, labels, lengths)
    desc = [c for c in lib.calls if c[0] == "desc"][0]
    assert desc[4] == gctc.MAX_LABELS
    with pytest.raises(ValueError, match=rf"batch element 0 has more than {gctc.MAX_LABELS} "
                                         rf"labels.*ENABLED = False.*: {n}"):
        raise_device_errors(ctx)


def test_emulated_empty_batch_and_empty_time(emu_ctc):
    ctx, lib = emu_ctc
    cost, grad = _run_emulated(ctx, np.zeros((3, 0, 4), np.float32), np.zeros((0, 2), np.int32),
                               np.zeros(0, np.int32))
    assert cost.shape == (0,) and grad.shape == (3, 0, 4)
    cost, grad = _run_emulated(ctx, np.zeros((0, 2, 4), np.float32),
                               np.array([[-1, -1], [1, -1]], np.int32), np.zeros(2, np.int32))
    assert cost.tolist() == [0.0, np.inf] and grad.shape == (0, 2, 4)
    assert not [c for c in lib.calls if c[0] == "loss"]     # cuDNN is not asked


@requires_nvcc
def test_ctc_kernels_compile_for_sm90(tmp_path):
    assert compile_for_sm90(gctc.ctc_source(), tmp_path)


# ============================================================================ real GPU

def _compiled(compute_grad=True):
    a, lab, ln, w = T.ftensor3("acts"), T.imatrix("labels"), T.ivector("lengths"), T.fvector("w")
    cost = ctc(a, lab, ln)
    outs = [cost, T.grad((cost * w).sum(), a)] if compute_grad else [cost]
    return [a, lab, ln, w], outs


@requires_gpu
@pytest.mark.parametrize("shape", [(6, 7, 5, 4), (50, 300, 20, 12), (1, 3, 2, 1)])
def test_gpu_ctc_matches_the_host_op(cuda, shape):
    t, b, a, width = shape
    rng = np.random.default_rng(sum(shape))
    acts, labels, lengths = _case(rng, t, b, a, width) if b >= 7 else (
        rng.standard_normal((t, b, a)).astype("float32"),
        np.array([[1], [-1], [1]], np.int32), np.array([1, 1, 0], np.int32))
    w = rng.uniform(0.5, 1.5, b).astype("float32")
    ins, outs = _compiled()
    with on_the_cpu():
        want = function(ins, outs)(acts, labels, lengths, w)
    f = function(ins, outs)
    assert _ctc_nodes(f, GPU_OP) and not _ctc_nodes(f, ConnectionistTemporalClassification)
    for _ in range(3):          # plain, captured, replayed
        cost, grad = f(acts, labels, lengths, w)
        np.testing.assert_allclose(cost, want[0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(grad, want[1], rtol=1e-3, atol=1e-4)


@requires_gpu
def test_gpu_ctc_training_step_runs_on_the_gpu(cuda):
    rng = np.random.default_rng(8)
    ins, cost, W = _training_step()
    W.set_value(rng.standard_normal((6, 5)).astype("float32"))
    f = function(ins, cost, updates=[(W, W - 0.1 * T.grad(cost, W))])
    assert _ctc_nodes(f, GPU_OP) and not cpu_nodes(f.maker.fgraph)
    acts, labels, lengths = _case(rng, 8, 9, 5, 4)
    lengths[:] = 8                                   # all feasible: finite costs
    x = rng.standard_normal((8, 9, 6)).astype("float32")
    losses = [float(f(x, labels, lengths)) for _ in range(20)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


@requires_gpu
def test_gpu_ctc_bad_label_raises(cuda):
    ins, outs = _compiled()
    f = function(ins, outs)
    acts, labels, lengths = _case(np.random.default_rng(2))
    labels[5, 0] = 9
    with pytest.raises(ValueError, match=r"batch element 5 has a label outside \[1, 5\): 9"):
        f(acts, labels, lengths, np.ones(7, np.float32))


@requires_gpu
def test_gpu_ctc_forward_only(cuda):
    ins, outs = _compiled(False)
    f = function(ins[:3], outs)
    assert [n.op.compute_grad for n in _ctc_nodes(f, GPU_OP)] == [False]
    acts, labels, lengths = _case(np.random.default_rng(3))
    (got,) = f(acts, labels, lengths)
    np.testing.assert_allclose(got, ctc_cost_and_grad(acts, labels, lengths, False)[0],
                               rtol=1e-4)


