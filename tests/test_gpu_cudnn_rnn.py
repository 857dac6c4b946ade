"""RNNBlock (Theano's theano.gpuarray.dnn.RNNBlock): the host ops against a plain NumPy loop
and finite differences, the placement of the cuDNN ops, and (GPU) cuDNN against the host."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from gpu_helpers import on_the_cpu, requires_gpu
from rnn_helpers import rnn_case
from symgpu import function
from symgpu.gpu.ops import cudnn_rnn as crnn
from symgpu.gpu.placement.rewriting import cpu_nodes
from symgpu.gradient import verify_grad
from symgpu.tensor.nnet.rnn import DnnRNN, DnnRNNGrad, rnn_layout

MODES = ["rnn_relu", "rnn_tanh", "lstm", "gru"]


def _sig(v):
    return 1 / (1 + np.exp(-v))


def _reference(mode, block, w, x, h0, c0):
    """One unidirectional layer stack written from Theano's split_params views (x @ W)."""
    inp, hy, cy = x, [], []
    for layer in range(block.num_layers):
        p = block.split_params(w, layer, x.shape[1:])
        n = len(p) // 4
        Ws, bWs, Rs, bRs = p[0:2 * n:2], p[1:2 * n:2], p[2 * n::2], p[2 * n + 1::2]
        h, c, out = h0[layer], (c0[layer] if c0 is not None else None), []
        for t in range(inp.shape[0]):
            px = [inp[t] @ Wk + bk for Wk, bk in zip(Ws, bWs)]
            ph = [h @ Rk + bk for Rk, bk in zip(Rs, bRs)]
            if mode == "rnn_relu":
                h = np.maximum(px[0] + ph[0], 0)
            elif mode == "rnn_tanh":
                h = np.tanh(px[0] + ph[0])
            elif mode == "lstm":
                i, f = _sig(px[0] + ph[0]), _sig(px[1] + ph[1])
                g, o = np.tanh(px[2] + ph[2]), _sig(px[3] + ph[3])
                c = f * c + i * g
                h = o * np.tanh(c)
            else:
                r, z = _sig(px[0] + ph[0]), _sig(px[1] + ph[1])
                nn = np.tanh(px[2] + r * ph[2])
                h = (1 - z) * nn + z * h
            out.append(h)
        inp = np.stack(out)
        hy.append(h)
        cy.append(c)
    return inp, np.stack(hy), (np.stack(cy) if c0 is not None else None)


_case = rnn_case


def _symbolic(block, dtype, lstm):
    w, x, hx = T.vector("w", dtype=dtype), T.tensor3("x", dtype=dtype), T.tensor3("hx", dtype=dtype)
    cx = T.tensor3("cx", dtype=dtype) if lstm else None
    ins = [w, x, hx] + ([cx] if lstm else [])
    return ins, block.apply(w, x, hx, cx)


@pytest.mark.parametrize("mode", MODES)
def test_rnnblock_matches_a_numpy_loop(mode):
    rng = np.random.default_rng(0)
    block, w, x, hx, cx = _case(mode, "float64", rng)
    ins, outs = _symbolic(block, "float64", mode == "lstm")
    with on_the_cpu():
        got = function(ins, outs)(*[v for v in (w, x, hx, cx) if v is not None])
    want = _reference(mode, block, w, x, hx, cx)
    assert len(got) == (3 if mode == "lstm" else 2)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


def test_split_params_are_views_in_theanos_order():
    block = crnn.RNNBlock("float32", 3, 2, "gru")
    size = block.get_param_size([7, 5])
    assert size == rnn_layout("gru", 3, 2, 5).size == 3 * 3 * (5 + 3) + 6 * 3 + 3 * 3 * (3 + 3) + 6 * 3
    w = np.zeros(size, "float32")
    parts = block.split_params(w, 0, [7, 5])
    assert [p.shape for p in parts] == [(5, 3), (3,)] * 3 + [(3, 3), (3,)] * 3
    parts[0][:] = 1            # W_r, transposed view of cuDNN's (hidden, in) block
    assert w[:15].sum() == 15 and w[15:].sum() == 0
    parts[1][:] = 3            # bW_r of layer 0: the first bias, after every matrix
    assert (w[126:129] == 3).all() and w[15:].sum() == 9
    shared = symgpu.shared(w)
    block.split_params(shared, 1, [7, 5])[-1][:] = 2      # bR_n of layer 1: the last 3
    assert (shared.get_value()[-3:] == 2).all()
    with pytest.raises(ValueError, match="layer 2"):
        block.split_params(w, 2, [7, 5])


def test_rnnblock_rejects_bad_arguments():
    with pytest.raises(ValueError, match="rnn_mode"):
        crnn.RNNBlock("float32", 3, 1, "elman")
    with pytest.raises(ValueError, match="input_mode"):
        crnn.RNNBlock("float32", 3, 1, "lstm", input_mode="skip")
    block = crnn.RNNBlock("float64", 3, 1, "lstm")
    with pytest.raises(TypeError, match="cx"):
        block.apply(T.dvector(), T.dtensor3(), T.dtensor3())
    ins, outs = _symbolic(block, "float64", True)
    with on_the_cpu():
        f = function(ins, outs)
    with pytest.raises(ValueError, match="w of shape"):
        f(np.zeros(3), np.zeros((2, 1, 4)), np.zeros((1, 1, 3)), np.zeros((1, 1, 3)))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dirs", [1, 2])
def test_rnnblock_gradients_verify(mode, dirs):
    rng = np.random.default_rng(1)
    block, w, x, hx, cx = _case(mode, "float64", rng, t=3, b=2, i=3, h=2, dirs=dirs)
    pts = [v for v in (w, x, hx, cx) if v is not None]
    with on_the_cpu():
        verify_grad(lambda w, x, hx, *c: block.apply(w, x, hx, *c), pts,
                    rng=np.random.RandomState(2))


# ============================================================================ placement

def _training(mode, dirs=1):
    block = crnn.RNNBlock("float32", 4, 2, mode,
                          direction_mode="bidirectional" if dirs == 2 else "unidirectional")
    ins, outs = _symbolic(block, "float32", mode == "lstm")
    cost = (outs[0] ** 2).sum() + outs[1].sum() + (outs[2].sum() if mode == "lstm" else 0)
    return ins, outs, T.grad(cost, ins)


def _ops(f, cls):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, cls)]


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_training_graph_is_one_cudnn_forward_and_one_backward(vgpu, mode):
    ins, outs, grads = _training(mode)
    f = function(ins, outs + grads)
    assert len(_ops(f, crnn.GpuDnnRNNForward)) == 1       # merged: its reserve feeds backward
    (bwd,) = _ops(f, crnn.GpuDnnRNNBackward)
    (fwd,) = _ops(f, crnn.GpuDnnRNNForward)
    assert bwd.inputs[len(fwd.inputs) + 1] is fwd.outputs[-1]
    assert not _ops(f, DnnRNN) and not _ops(f, DnnRNNGrad)
    assert not cpu_nodes(f.maker.fgraph), cpu_nodes(f.maker.fgraph)


def test_float64_and_disabled_stay_on_the_host(vgpu, monkeypatch):
    block = crnn.RNNBlock("float64", 4, 1, "gru")
    ins, outs = _symbolic(block, "float64", False)
    f = function(ins, outs)
    assert _ops(f, DnnRNN) and not _ops(f, crnn.GpuDnnRNNForward)
    monkeypatch.setattr(crnn, "ENABLED", False)
    ins, outs, grads = _training("lstm")
    f = function(ins, outs + grads)
    assert _ops(f, DnnRNN) and _ops(f, DnnRNNGrad) and not _ops(f, crnn.GpuDnnRNNBackward)


def test_persistent_algorithm_only_where_cudnn_runs_it_both_ways(monkeypatch):
    """The small-hidden persistent kernel up to each cell's limit and batch 256, without
    per-row lengths, and never with PERSISTENT off; the standard algorithm everywhere else."""
    def algo(mode, h, lengths=False, batch=16):
        op = crnn.GpuDnnRNNForward(mode, "unidirectional", 1, h, lengths)
        return crnn.rnn_algorithm(op, batch)
    small, standard = crnn._ALGO_PERSIST_SMALL_H, crnn._ALGO_STANDARD
    assert [algo("lstm", h) for h in (4, 128, 129, 192)] == [small, small, standard, standard]
    assert [algo("gru", h) for h in (128, 129)] == [small, standard]
    assert [algo(m, 256) for m in ("rnn_tanh", "rnn_relu")] == [small, small]
    assert algo("rnn_tanh", 257) == standard
    assert algo("lstm", 64, lengths=True) == standard
    assert [algo("lstm", 128, batch=b) for b in (256, 257)] == [small, standard]
    monkeypatch.setattr(crnn, "PERSISTENT", False)
    assert algo("lstm", 64) == standard


# ============================================================================ on the GPU

@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dirs", [1, 2])
def test_gpu_rnnblock_matches_the_host(cuda, mode, dirs):
    rng = np.random.default_rng(3)
    _, w, x, hx, cx = _case(mode, "float32", rng, t=6, b=3, i=5, h=4, dirs=dirs)
    ins, outs, grads = _training(mode, dirs)
    vals = [v for v in (w, x, hx, cx) if v is not None]
    with on_the_cpu():
        want = function(ins, outs + grads)(*vals)
    f = function(ins, outs + grads)
    assert _ops(f, crnn.GpuDnnRNNForward) and _ops(f, crnn.GpuDnnRNNBackward)
    assert not _ops(f, DnnRNN) and not _ops(f, DnnRNNGrad)
    for _ in range(3):          # plain, captured, replayed
        got = f(*vals)
        for g, e in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), e, rtol=2e-4, atol=2e-4)


@requires_gpu
@pytest.mark.gpu
def test_gpu_lstm_weights_from_split_params(cuda):
    """Weights written through split_params of a host array reach cuDNN in its layout."""
    rng = np.random.default_rng(4)
    block, w, x, hx, cx = _case("lstm", "float32", rng, t=5, b=2, i=3, h=4, layers=3)
    for layer in range(3):
        for p in block.split_params(w, layer, [2, 3]):
            p[...] = rng.standard_normal(p.shape) * 0.3
    ins, outs = _symbolic(block, "float32", True)
    y, hy, cy = function(ins, outs)(w, x, hx, cx)
    want = _reference("lstm", block, w.astype("float64"), x, hx, cx)
    for g, e in zip((y, hy, cy), want):
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-4, atol=1e-4)


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_gpu_new_lengths_share_the_layer_plan_and_stay_right(cuda, mode, monkeypatch):
    """A new sequence length builds only its data descriptors (RNNPlan's `layer`): values and
    gradients at lengths 6, 3, 6 and 9 equal the host op's, and the layer's descriptors and
    weight check are made once."""
    made = []
    orig = crnn.RNNPlan._layer

    def counting(self, *a, **k):
        made.append(1)
        return orig(self, *a, **k)
    monkeypatch.setattr(crnn.RNNPlan, "_layer", counting)
    rng = np.random.default_rng(5)
    ins, outs, grads = _training(mode)
    f = function(ins, outs + grads)
    with on_the_cpu():
        ref = function(ins, outs + grads)
    for t in (6, 3, 6, 9):
        _, w, x, hx, cx = _case(mode, "float32", rng, t=t, b=3, i=5, h=4)
        vals = [v for v in (w, x, hx, cx) if v is not None]
        for g, e in zip(f(*vals), ref(*vals)):
            np.testing.assert_allclose(np.asarray(g), e, rtol=2e-4, atol=2e-4)
    assert len(made) == 2       # the forward node's and the backward node's, once each


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_reserve_outputs_and_gradients_equal_the_plain_ops(mode):
    """DnnRNN(reserve=True) also returns the reserve space (empty on the host) and its
    gradient DnnRNNGrad(reserve=True) takes y and that reserve: values and gradients are the
    plain ops' (the GPU's backward reads them instead of running the forward again)."""
    from symgpu.graph.op import ShapeError
    rng = np.random.default_rng(6)
    _, w, x, hx, cx = _case(mode, "float32", rng, t=5, b=2, i=3, h=4, layers=1)
    lstm = mode == "lstm"
    ws, xs, hs = T.vector(dtype="float32"), T.tensor3(dtype="float32"), T.tensor3(dtype="float32")
    cs = T.tensor3(dtype="float32") if lstm else None
    ins = [ws, xs, hs] + ([cs] if lstm else [])
    res = []
    for reserve in (False, True):
        op = DnnRNN(mode, "unidirectional", 1, 4, reserve=reserve)
        outs = op(*ins)
        assert len(outs) == 2 + int(lstm) + int(reserve)
        cost = (outs[0] ** 2).sum() + outs[1].sum()
        gs = T.grad(cost, ins)
        if reserve:
            assert outs[-1].dtype == "uint8"
            with pytest.raises(ShapeError):
                op.infer_shape(None, outs[0].owner, [(), (), ()])
            assert any(isinstance(n.op, DnnRNNGrad) and n.op.reserve
                       for n in symgpu.graph.basic.io_toposort(ins, gs))
        res.append(function(ins, list(outs[:2]) + gs)(*[v for v in (w, x, hx, cx)
                                                        if v is not None]))
    for a, b in zip(*res):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode,hidden", [("lstm", 128), ("lstm", 160), ("gru", 128),
                                         ("gru", 192), ("rnn_tanh", 256)])
def test_gpu_persistent_and_standard_plans_match_the_host(cuda, monkeypatch, mode, hidden):
    """Each side of the persistent kernel's limits (one layer, batch 16: the sizes the loop
    benchmark runs) trains as the host op does, on the algorithm rnn_algorithm named."""
    rng = np.random.default_rng(6)
    block, w, x, hx, cx = _case(mode, "float32", rng, t=9, b=16, i=32, h=hidden, layers=1,
                                scale=0.1)
    ins, outs = _symbolic(block, "float32", mode == "lstm")
    cost = (outs[0] ** 2).sum() + outs[1].sum() + (outs[2].sum() if mode == "lstm" else 0)
    grads = T.grad(cost, ins)
    vals = [v for v in (w, x, hx, cx) if v is not None]
    with on_the_cpu():
        want = function(ins, outs + grads)(*vals)
    made = []
    orig = crnn.RNNPlan._layer

    def recording(self, *a, **k):
        orig(self, *a, **k)
        made.append(self.algo)
    monkeypatch.setattr(crnn.RNNPlan, "_layer", recording)
    f = function(ins, outs + grads)
    for _ in range(3):
        got = f(*vals)
        for g, e in zip(got, want):     # float32 sums over 256 units: error by the scale
            assert np.max(np.abs(np.asarray(g) - e)) <= 5e-4 * (1 + np.max(np.abs(e)))
    (fwd,) = _ops(f, crnn.GpuDnnRNNForward)
    assert made == [crnn.rnn_algorithm(fwd.op, 16)] * 2      # the forward and backward plans
