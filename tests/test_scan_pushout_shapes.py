"""scan_pushout_shapes: the lengths a loop body reads are computed before the loop.

CPU tests inspect the rewritten loops (no shape read left in the body where the length is
loop-invariant, one left where it is not) and check results and gradients against NumPy; the
virtual-GPU tests check that a layer-normalised LSTM step (mean and variance over the hidden
axis of gates sliced from one product) and its backward step compile to bodies of GPU ops
only: no host op, no upload, so the loop can be captured as one CUDA graph.  The GPU test
checks that it is on the device.
"""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import config, function
from symgpu.graph.basic import Constant
from symgpu.graph.devices import is_device_node
from symgpu.scan.op import Scan

EPS = 1e-5


def loops(f, cls=Scan):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, cls)]


def shape_reads(fg) -> list:
    return [n for n in fg.toposort() if getattr(n.op, "shape_read", None) is not None]


def body(node):
    node.op.inner.compile()
    return node.op.inner.compiled_fgraph


def _ln(z, g, b):
    mu = z.mean(axis=-1, keepdims=True)
    var = ((z - mu) ** 2).mean(axis=-1, keepdims=True)
    return (z - mu) / T.sqrt(var + EPS) * g + b


def _ln_np(z, g, b):
    mu = z.mean(-1, keepdims=True)
    var = ((z - mu) ** 2).mean(-1, keepdims=True)
    return (z - mu) / np.sqrt(var + EPS) * g + b


def lnlstm(x, W, U, g, b, H=3):
    """A layer-normalised LSTM over x (steps, batch, in): the gates sliced from one product,
    each normalised over the hidden axis (benchmarks/rnn_cells.py's lnlstm); its states h."""
    def step(xt, h, c, W, U, g, b):
        pre = T.dot(xt, W) + T.dot(h, U)
        a = [_ln(pre[:, k * H:(k + 1) * H], g[k * H:(k + 1) * H], b[k * H:(k + 1) * H])
             for k in range(4)]
        c = T.nnet.sigmoid(a[1]) * c + T.nnet.sigmoid(a[0]) * T.tanh(a[3])
        return T.nnet.sigmoid(a[2]) * T.tanh(c), c

    h0 = T.zeros((x.shape[1], H), dtype=x.dtype)
    (h, c), _ = symgpu.scan(step, sequences=x, outputs_info=[h0, h0],
                            non_sequences=[W, U, g, b])
    return h


def lnlstm_graph(H=3):
    ins = [T.tensor3("x"), T.matrix("W"), T.matrix("U"), T.vector("g"), T.vector("b")]
    return ins, lnlstm(*ins, H=H)


def lnlstm_np(x, W, U, g, b, H=3):
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    h = c = np.zeros((x.shape[1], H))
    hs = []
    for xt in x:
        pre = xt @ W + h @ U
        a = [_ln_np(pre[:, k * H:(k + 1) * H], g[k * H:(k + 1) * H], b[k * H:(k + 1) * H])
             for k in range(4)]
        c = sig(a[1]) * c + sig(a[0]) * np.tanh(a[3])
        h = sig(a[2]) * np.tanh(c)
        hs.append(h)
    return np.stack(hs)


def _values(rng, n=5, B=2, I=4, H=3, dtype="float64"):
    return [rng.randn(n, B, I).astype(dtype), (rng.randn(I, 4 * H) * .5).astype(dtype),
            (rng.randn(H, 4 * H) * .5).astype(dtype), (1 + .1 * rng.randn(4 * H)).astype(dtype),
            (.1 * rng.randn(4 * H)).astype(dtype)]


# ============================================================================ rewrites (CPU)

def test_a_mean_over_a_computed_value_reads_no_length_in_the_body():
    x, h0 = T.tensor3("x"), T.matrix("h0")
    W = T.matrix("W")
    h, _ = symgpu.scan(lambda xt, h, W: h + (T.dot(xt, W) - T.dot(xt, W).mean(axis=-1,
                                                                              keepdims=True)),
                       sequences=[x], outputs_info=[h0], non_sequences=[W])
    f = function([x, h0, W], h)
    (node,) = loops(f)
    assert not shape_reads(body(node)), [str(n) for n in shape_reads(body(node))]
    # the count became a non-sequence, computed from W's shape before the loop
    assert node.op.info.n_nonseqs >= 2
    rng = np.random.RandomState(0)
    xv, hv, Wv = rng.randn(4, 2, 3), rng.randn(2, 5), rng.randn(3, 5)
    want, hh = [], hv
    for t in range(4):
        p = xv[t] @ Wv
        hh = hh + p - p.mean(-1, keepdims=True)
        want.append(hh)
    np.testing.assert_allclose(f(xv, hv, Wv), np.stack(want), rtol=1e-10)


def test_lengths_of_sequences_and_states_come_from_the_outer_inputs():
    """A step's length (x[t].shape[1]) is the sequence's shape[2]; a state tap's is the
    initial value's without its first axis."""
    x, h0 = T.tensor3("x"), T.matrix("h0")
    h, _ = symgpu.scan(lambda xt, h: h * T.cast(xt.shape[1], "float64")
                       + T.cast(h.shape[0] * h.shape[1], "float64") + xt.sum(),
                       sequences=[x], outputs_info=[h0])
    f = function([x, h0], h)
    (node,) = loops(f)
    assert not shape_reads(body(node))
    xv, hv = np.ones((3, 2, 4)), np.zeros((2, 4))
    want, hh = [], hv
    for t in range(3):
        hh = hh * 4 + 8 + xv[t].sum()
        want.append(hh)
    np.testing.assert_allclose(f(xv, hv), np.stack(want))


def test_a_length_that_changes_per_step_stays_in_the_body():
    k = T.lvector("k")
    v = T.vector("v")
    s, _ = symgpu.scan(lambda kt, v: T.cast(v[:kt].shape[0], "float64") + v[:kt].sum(),
                       sequences=[k], non_sequences=[v])
    f = function([k, v], s)
    (node,) = loops(f)
    # the rewrite left the read of the per-step slice's length in the loop it built
    assert [n for n in shape_reads(node.op.inner.fgraph) if n.inputs[0].owner is not None]
    vv = np.arange(5.)
    np.testing.assert_allclose(f(np.array([1, 3, 5]), vv), [1 + 0, 3 + 3, 5 + 10])


def test_the_pass_can_be_excluded_and_gives_the_same_results():
    ins, h = lnlstm_graph()
    rng = np.random.RandomState(1)
    vals = _values(rng)
    f_on = function(ins, h)
    with config.change_flags(optimizer_excluding="scan_pushout_shapes"):
        f_off = function(ins, h)
    on = [body(n) for n in loops(f_on)]
    off = [body(n) for n in loops(f_off)]
    assert any(shape_reads(fg) for fg in off)
    assert not any(shape_reads(fg) for fg in on)
    want = lnlstm_np(*vals)
    np.testing.assert_allclose(f_on(*vals), want, rtol=1e-9)
    np.testing.assert_allclose(f_off(*vals), want, rtol=1e-9)


def test_layer_norm_lstm_gradient_loop_has_no_length_reads_and_verifies():
    ins, h = lnlstm_graph()
    cost = (h[-1] ** 2).sum()
    f = function(ins, symgpu.grad(cost, ins[1:]))
    nodes = loops(f)
    assert len(nodes) == 2
    for n in nodes:
        assert not shape_reads(body(n)), (n.op.info.name, [str(m) for m in shape_reads(body(n))])
    rng = np.random.RandomState(2)
    vals = _values(rng, n=3)
    x = T.constant(vals[0])
    symgpu.gradient.verify_grad(lambda W, U, g, b: (lnlstm(x, W, U, g, b)[-1] ** 2).sum(),
                                vals[1:], rng=2)


# ============================================================================ GPU placement

def host_ops_in_body(fg) -> list:
    """Nodes of a compiled GPU loop body that are not GPU work: host ops of any kind (shape
    arithmetic included) and uploads of anything but constants."""
    bad = []
    for n in fg.toposort():
        if getattr(n.op, "transfer", None) == "upload" and isinstance(n.inputs[0], Constant):
            continue
        if not is_device_node(n) or getattr(n.op, "transfer", None) is not None:
            bad.append(n)
    return bad


def test_layer_norm_lstm_loops_are_gpu_work_only(vgpu):
    """Forward and backward loop bodies of the layer-norm cell: GPU ops only, so a loop of
    known length is captured whole (gpu/exec/scan_graph.py's body_capturable)."""
    from symgpu.gpu.ops.scan_op import GpuScan
    ins, h = lnlstm_graph()
    cost = (h[-1] ** 2).sum()
    f = function(ins, [cost] + symgpu.grad(cost, ins[1:]))
    nodes = loops(f, GpuScan)
    assert len(nodes) == 2
    for n in nodes:
        fg = body(n)
        assert not host_ops_in_body(fg), (n.op.info.name, [str(m) for m in host_ops_in_body(fg)])
        # the reductions stay in the body, on the GPU (grouped: gpu_row_reduce_group)
        assert any(type(m.op).__name__ in ("GpuCAReduce", "GpuRowReduceGroup")
                   for m in fg.toposort())
    with config.change_flags(optimizer_excluding="scan_pushout_shapes"):
        f_off = function(ins, [cost] + symgpu.grad(cost, ins[1:]))
    assert any(host_ops_in_body(body(n)) for n in loops(f_off, GpuScan))


@pytest.mark.gpu
def test_layer_norm_lstm_loop_is_captured_on_the_gpu(cuda):
    from symgpu.gpu.exec import scan_graph
    ins, h = lnlstm_graph()
    cost = (h[-1] ** 2).sum()
    f = function(ins, [cost] + symgpu.grad(cost, ins[1:]))
    rng = np.random.RandomState(3)
    vals = _values(rng, n=6, dtype="float32")
    before = dict(scan_graph.STATS)
    outs = [f(*vals) for _ in range(4)]
    with config.change_flags(device="cpu", floatX="float64"):
        ins_c, h_c = lnlstm_graph()
        c_c = (h_c[-1] ** 2).sum()
        f_cpu = function(ins_c, [c_c] + symgpu.grad(c_c, ins_c[1:]))
        want = f_cpu(*[v.astype("float64") for v in vals])
    for got in outs:
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), b, rtol=2e-3, atol=1e-4)
    assert scan_graph.STATS["captures"] >= before.get("captures", 0) + 2
    assert scan_graph.STATS["replays"] > before.get("replays", 0)
    nodes = loops(f)
    assert len(nodes) == 2 and all(type(n.op).__name__ == "GpuScan" for n in nodes)
    assert all(type(n.outputs[0].type).__name__ == "GpuArrayType" for n in nodes)


# ============================================================================ per-step dims

def _rnn_step_with_gradient():
    """An Elman RNN's cost and weight gradients: the backward loop's per-step output is
    flattened after the loop for the weight products."""
    x, W, U = T.tensor3("x"), T.matrix("W"), T.matrix("U")
    h0 = T.zeros((x.shape[1], U.shape[0]))
    hs, _ = symgpu.scan(lambda xt, h, W, U: T.tanh(T.dot(xt, W) + T.dot(h, U)), sequences=[x],
                        outputs_info=[h0], non_sequences=[W, U])
    cost = T.sqr(hs[-1]).sum()
    return [x, W, U], [cost] + T.grad(cost, [W, U])


def test_a_gpu_loops_per_step_dims_come_from_the_inputs_lengths():
    """On a virtual GPU no loop's result is read for its lengths: the backward loop's per-step
    output (batch x hidden a step) has them from x and U (per_step_dims), the forward loop's
    history from n_steps (GpuScan.shape_from_inputs).  Before, they were read from the
    results: host steps between CUDA graphs every call."""
    from symgpu.gpu.ops.scan_op import GpuScan
    from symgpu.gpu.placement.rewriting import virtual_context
    with config.change_flags(floatX="float32"), virtual_context(None):
        ins, outs = _rnn_step_with_gradient()
        f = function(ins, outs)
    gpu_loops = loops(f, GpuScan)
    assert len(gpu_loops) == 2
    reads = [n for n in shape_reads(f.maker.fgraph) if n.inputs[0].owner in gpu_loops]
    assert not reads, reads


def test_per_step_dims_answer_from_lengths_and_non_sequences_only():
    """``x_t[:k]`` for a non-sequence k: the dim is k's value, known before the loop; a width
    that follows a per-step value (``x_t[:n_t]`` for a sequence n) cannot be known (None:
    the dim is read from the result, and the loop checks that every step gives one shape)."""
    from symgpu.scan.body_lengths import per_step_dims
    x, k, n = T.matrix("x"), T.lscalar("k"), T.lvector("n")
    ys, _ = symgpu.scan(lambda xt, k: T.tanh(xt[:k]), sequences=[x], non_sequences=[k])
    (dim,) = per_step_dims(ys.owner, 0)
    assert function([x, k], dim)(np.ones((4, 7)), 3) == 3
    zs, _ = symgpu.scan(lambda xt, nt: xt[:nt] * 2, sequences=[x, n])
    assert per_step_dims(zs.owner, 0) is None
    assert function([x, n], zs.shape[1])(np.ones((4, 7)), np.full(4, 2)) == 2
