"""scan_to_dnn_rnn (opt-in): a scan whose step is one unmasked Elman / LSTM / cuDNN-GRU layer
becomes DnnRNN, its gradient loop DnnRNNGrad; values and gradients equal the scan's; near
misses stay loops."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from gpu_helpers import requires_gpu
from symgpu import function
from symgpu.compile.mode import Mode
from symgpu.scan.dnn_rnn_match import match_rnn_step
from symgpu.scan.op import Scan
from symgpu.tensor.nnet.rnn import DnnRNN, DnnRNNGrad

sys.path.append(os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import rnn_cells as rc  # noqa: E402

B, IN, H, L = 3, 5, 4, 6
sig = T.nnet.sigmoid


@pytest.fixture(autouse=True)
def _keep_flags():
    """benchmarks/rnn_cells.build_symbolic sets floatX, as a script may: put it back for
    the tests that follow."""
    with symgpu.config.change_flags(floatX=symgpu.config.floatX):
        yield


def _mode(on: bool) -> Mode:
    m = Mode(optimizer="fast_run")     # off: not even where a GPU may take part
    return m.including("scan_to_dnn_rnn") if on else m.excluding_tags("scan_to_dnn_rnn")


def _sl(v, k):
    return v[:, k * H:(k + 1) * H]


# ---------------------------------------------------------------- step spellings (any order)

def lstm_step(order=(0, 1, 2, 3)):
    """The tutorial's LSTM with its gate blocks (i, f, o, candidate) at `order`'s slots."""
    def step(x_t, h_prev, c_prev, W, U, b):
        pre = b + T.dot(h_prev, U) + T.dot(x_t, W)
        i, f, o = sig(_sl(pre, order[0])), sig(_sl(pre, order[1])), sig(_sl(pre, order[2]))
        c = i * T.tanh(_sl(pre, order[3])) + c_prev * f
        return T.tanh(c) * o, c
    return step, 4, 2


def gru_step(xo=(0, 1, 2), ho=(0, 1, 2), classic=False):
    """PyTorch's GRU, blocks of W and U at independent slots (classic: Theano's r*h_prev)."""
    def step(x_t, h_prev, W, U, b):
        xw = T.dot(x_t, W) + b
        hu = T.dot(h_prev, U)
        r = sig(_sl(hu, ho[0]) + _sl(xw, xo[0]))
        z = sig(_sl(xw, xo[1]) + _sl(hu, ho[1]))
        if classic:
            n = T.tanh(_sl(xw, xo[2]) + T.dot(r * h_prev, U[:, ho[2] * H:(ho[2] + 1) * H]))
        else:
            n = T.tanh(_sl(xw, xo[2]) + r * _sl(hu, ho[2]))
        return z * h_prev + (1. - z) * n
    return step, 3, 1


def elman_step(act="tanh"):
    def step(x_t, h_prev, W, U, b):
        pre = T.dot(x_t, W) + T.dot(h_prev, U) + b
        return {"tanh": T.tanh, "relu": T.nnet.relu,
                "max": lambda v: T.maximum(v, 0.)}[act](pre)
    return step, 1, 1


def _params(n_gates, rng, inp=IN, prefix=""):
    return [symgpu.shared((rng.standard_normal(s) * 0.4).astype("float32"), name=prefix + nm)
            for nm, s in (("W", (inp, n_gates * H)), ("U", (H, n_gates * H)),
                          ("b", (n_gates * H,)))]


def _layer(spec, x, params, dtype="float32"):
    step, _, n_states = spec
    h0 = [T.zeros((B, H), dtype=dtype) for _ in range(n_states)]
    out, _ = symgpu.scan(step, sequences=[x], outputs_info=h0 if n_states > 1 else h0[0],
                         non_sequences=params)
    return out[0] if n_states > 1 else out


def _graph(specs, loss="last", dtype="float32", seed=0):
    """(x, loss, every weight) for stacked layers `specs`."""
    rng = np.random.default_rng(seed)
    x = T.tensor3("x", dtype=dtype)
    inp, weights = x, []
    for k, spec in enumerate(specs):
        ps = _params(spec[1], rng, IN if k == 0 else H, f"l{k}")
        if dtype != "float32":
            ps = [symgpu.shared(p.get_value().astype(dtype), name=p.name) for p in ps]
        weights += ps
        inp = _layer(spec, inp, ps, dtype)
    target = np.float32(0.3)
    cost = ((inp[-1] - target) ** 2).mean() if loss == "last" else ((inp - target) ** 2).mean()
    return x, cost, weights


def _ops(f, cls):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, cls)]


def _branch_ops(f, cls):
    """The ``cls`` nodes inside the function's IfElse branches (what cuDNN's branch runs)."""
    from symgpu.graph.basic import io_toposort
    from symgpu.ifelse import IfElse
    found = []
    for n in _ops(f, IfElse):
        for inner in (n.op.then_fn, n.op.else_fn):
            found += [a for a in io_toposort(inner.inputs, inner.outputs)
                      if isinstance(a.op, cls)]
    return found


def _compare(specs, loss="last"):
    xv = np.random.default_rng(9).standard_normal((L, B, IN)).astype("float32")
    got = {}
    for on in (False, True):
        x, cost, weights = _graph(specs, loss)
        f = function([x], [cost] + T.grad(cost, weights + [x]), mode=_mode(on))
        got[on] = f(xv)
        if on:
            assert len(_ops(f, DnnRNN)) == len(specs) and len(_ops(f, DnnRNNGrad)) == len(specs)
            assert not _ops(f, Scan)
        else:
            assert _ops(f, Scan) and not _ops(f, DnnRNN)
    for a, b in zip(got[False], got[True]):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("loss", ["last", "all"])
@pytest.mark.parametrize("order", [(0, 1, 2, 3), (3, 1, 0, 2), (2, 3, 1, 0)])
def test_lstm_matches_scan(order, loss):
    _compare([lstm_step(order)], loss)


@pytest.mark.parametrize("loss", ["last", "all"])
@pytest.mark.parametrize("xo,ho", [((0, 1, 2), (0, 1, 2)), ((2, 0, 1), (1, 2, 0))])
def test_gru_matches_scan(xo, ho, loss):
    _compare([gru_step(xo, ho)], loss)


@pytest.mark.parametrize("act", ["tanh", "relu", "max"])
def test_elman_matches_scan(act):
    _compare([elman_step(act)], "all")


def test_stacked_layers_become_two_cudnn_layers():
    _compare([lstm_step((1, 0, 3, 2)), gru_step((1, 2, 0))], "all")
    _compare([elman_step(), lstm_step()], "last")


def test_forward_only_and_cell_state_read_at_the_end():
    x, _, weights = _graph([])
    spec = lstm_step((2, 0, 1, 3))
    h0 = [T.zeros((B, H), dtype="float32")] * 2
    (hs, cs), _ = symgpu.scan(spec[0], sequences=[x], outputs_info=h0,
                              non_sequences=_params(4, np.random.default_rng(1)))
    xv = np.random.default_rng(2).standard_normal((L, B, IN)).astype("float32")
    res = {}
    for on in (False, True):
        f = function([x], [hs, cs[-1]], mode=_mode(on))
        assert bool(_ops(f, DnnRNN)) == on and bool(_ops(f, Scan)) != on
        res[on] = f(xv)
    for a, b in zip(res[False], res[True]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    # every cell state: cuDNN gives only the last one
    f = function([x], [hs, cs], mode=_mode(True))
    assert _ops(f, Scan) and not _ops(f, DnnRNN)


def test_benchmark_cells_compile_to_cudnn_and_train_alike():
    """benchmarks/rnn_cells.py's own training step (SGD updates), rewrite on and off."""
    for cell in ("lstm", "gru", "elman"):
        spec = rc.Spec(cell, False, "last", B, H, False, inp=IN, fixed=L)
        arrays = rc.data(spec)
        losses = {}
        for on in (False, True):
            call, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), arrays,
                                            mode=_mode(on))
            assert bool(_ops(fn, DnnRNNGrad)) == on and bool(_ops(fn, Scan)) != on
            losses[on] = [float(call(L, None)) for _ in range(3)]
        np.testing.assert_allclose(losses[True], losses[False], rtol=1e-5)


# ---------------------------------------------------------------- near misses stay loops

def _scan_node(cost):
    from symgpu.graph.basic import io_toposort
    nodes = [n for n in io_toposort([], [cost]) if isinstance(n.op, Scan)]
    assert len(nodes) == 1
    return nodes[0]


def _stays_a_loop(spec, dtype="float32"):
    x, cost, weights = _graph([spec], "all", dtype)
    assert match_rnn_step(_scan_node(cost)) is None
    f = function([x], [cost] + T.grad(cost, weights), mode=_mode(True))
    assert _ops(f, Scan) and not _ops(f, DnnRNN) and not _ops(f, DnnRNNGrad)


def test_classic_gru_is_not_cudnns():
    _stays_a_loop(gru_step(classic=True))


def test_lstm_with_relu_candidate_or_tanh_gate_stays():
    def relu_cand(x_t, h_prev, c_prev, W, U, b):
        pre = T.dot(x_t, W) + T.dot(h_prev, U) + b
        c = sig(_sl(pre, 1)) * c_prev + sig(_sl(pre, 0)) * T.nnet.relu(_sl(pre, 3))
        return sig(_sl(pre, 2)) * T.tanh(c), c

    def tanh_gate(x_t, h_prev, c_prev, W, U, b):
        pre = T.dot(x_t, W) + T.dot(h_prev, U) + b
        c = sig(_sl(pre, 1)) * c_prev + T.tanh(_sl(pre, 0)) * T.tanh(_sl(pre, 3))
        return sig(_sl(pre, 2)) * T.tanh(c), c
    _stays_a_loop((relu_cand, 4, 2))
    _stays_a_loop((tanh_gate, 4, 2))


def test_elman_with_sigmoid_or_overlapping_lstm_blocks_stays():
    def sig_elman(x_t, h_prev, W, U, b):
        return sig(T.dot(x_t, W) + T.dot(h_prev, U) + b)

    def overlap(x_t, h_prev, c_prev, W, U, b):
        pre = T.dot(x_t, W) + T.dot(h_prev, U) + b
        c = sig(_sl(pre, 1)) * c_prev + sig(_sl(pre, 0)) * T.tanh(_sl(pre, 1))
        return sig(_sl(pre, 2)) * T.tanh(c), c
    _stays_a_loop((sig_elman, 1, 1))
    _stays_a_loop((overlap, 4, 2))


def test_peephole_and_dropout_cells_stay():
    for cell, masked in (("peephole", False), ("peephole", True), ("droplstm", False)):
        spec = rc.Spec(cell, masked, "all", B, H, False, inp=IN, fixed=L)
        _, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                                     mode=_mode(True))
        assert _ops(fn, Scan) and not _ops(fn, DnnRNN), cell


def test_extra_output_stays():
    def step(x_t, h_prev, W, U, b):
        pre = T.dot(x_t, W) + T.dot(h_prev, U) + b
        return T.tanh(pre), pre
    x = T.tensor3("x", dtype="float32")
    ps = _params(1, np.random.default_rng(0))
    (hs, pres), _ = symgpu.scan(step, sequences=[x],
                                outputs_info=[T.zeros((B, H), dtype="float32"), None],
                                non_sequences=ps)
    assert match_rnn_step(hs.owner.inputs[0].owner if hs.owner.op.__class__ is not Scan
                          else hs.owner) is None
    f = function([x], [hs.sum() + pres.sum()], mode=_mode(True))
    assert _ops(f, Scan) and not _ops(f, DnnRNN)


def test_flag_off_leaves_the_loop():
    x, cost, weights = _graph([lstm_step()])
    f = function([x], [cost] + T.grad(cost, weights), mode=_mode(False))
    assert _ops(f, Scan) and not _ops(f, DnnRNN) and not _ops(f, DnnRNNGrad)


# ---------------------------------------------------------------- placement (virtual GPU)

@pytest.mark.parametrize("spec", [lstm_step((1, 2, 3, 0)), gru_step(), elman_step()])
def test_vgpu_graph_is_cudnn_forward_and_backward(vgpu, spec):
    from symgpu.gpu.ops import cudnn_rnn as crnn
    from symgpu.gpu.ops.scan_op import GpuScan
    x, cost, weights = _graph([spec], "all")
    f = function([x], [cost] + T.grad(cost, weights), mode=_mode(True))
    assert _ops(f, crnn.GpuDnnRNNForward) and _ops(f, crnn.GpuDnnRNNBackward)
    assert not _ops(f, GpuScan) and not _ops(f, Scan)
    assert not _ops(f, DnnRNN) and not _ops(f, DnnRNNGrad)


def test_vgpu_float64_stays_a_loop(vgpu):
    from symgpu.gpu.ops import cudnn_rnn as crnn
    x, cost, weights = _graph([lstm_step()], "all", dtype="float64")
    assert match_rnn_step(_scan_node(cost)) is None
    f = function([x], [cost] + T.grad(cost, weights), mode=_mode(True))
    assert _ops(f, Scan) and not _ops(f, crnn.GpuDnnRNNForward) and not _ops(f, DnnRNN)


# ---------------------------------------------------------------- on the GPU

@requires_gpu
@pytest.mark.gpu
def test_gpu_lstm_sgd_with_and_without_the_rewrite(cuda):
    """A user LSTM written with scan: the same loss and weights after 3 SGD steps, cuDNN's
    RNN (rewrite on) against the captured scan (off)."""
    from symgpu.gpu.ops import cudnn_rnn as crnn
    xv = np.random.default_rng(5).standard_normal((L, B, IN)).astype("float32")
    results = {}
    for on in (False, True):
        x, cost, weights = _graph([lstm_step((2, 0, 3, 1))], "all", seed=3)
        grads = T.grad(cost, weights)
        f = function([x], cost, updates=[(w, w - np.float32(0.1) * g)
                                         for w, g in zip(weights, grads)], mode=_mode(on))
        assert bool(_ops(f, crnn.GpuDnnRNNForward)) == on
        assert bool(_ops(f, crnn.GpuDnnRNNBackward)) == on
        losses = [float(np.asarray(f(xv))) for _ in range(3)]
        results[on] = (losses, [np.asarray(w.get_value()) for w in weights])
    np.testing.assert_allclose(results[True][0], results[False][0], rtol=2e-4, atol=2e-5)
    for a, b in zip(results[False][1], results[True][1]):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5)



def test_go_backwards_is_a_forward_layer_over_the_reversed_sequence():
    """scan(go_backwards=True) slices its sequence ``x[::-1]`` and runs forwards: cuDNN's
    layer over that sequence is the same computation, so it is matched (values and
    gradients as the loop's)."""
    xv = np.random.default_rng(4).standard_normal((L, B, IN)).astype("float32")
    got = {}
    for on in (False, True):
        x = T.tensor3("x", dtype="float32")
        ps = _params(4, np.random.default_rng(6))
        h0 = [T.zeros((B, H), dtype="float32")] * 2
        (hs, _), _ = symgpu.scan(lstm_step((3, 2, 1, 0))[0], sequences=[x], outputs_info=h0,
                                 non_sequences=ps, go_backwards=True)
        cost = (hs ** 2).mean()
        f = function([x], [cost] + T.grad(cost, ps + [x]), mode=_mode(on))
        assert bool(_ops(f, DnnRNNGrad)) == on and bool(_ops(f, Scan)) != on
        got[on] = f(xv)
    for a, b in zip(got[False], got[True]):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5)


def test_a_sequence_shorter_than_n_steps_still_fails():
    x = T.tensor3("x", dtype="float32")
    k = T.iscalar("k")
    h0 = T.zeros((B, H), dtype="float32")
    hs, _ = symgpu.scan(elman_step()[0], sequences=[x], outputs_info=h0, n_steps=k,
                        non_sequences=_params(1, np.random.default_rng(0)))
    f = function([x, k], hs, mode=_mode(True))
    assert _ops(f, DnnRNN) and not _ops(f, Scan)
    xv = np.zeros((L, B, IN), "float32")
    assert f(xv, L - 2).shape == (L - 2, B, H)
    with pytest.raises(AssertionError, match="shorter than n_steps"):
        f(xv, L + 1)


# ---------------------------------------------------------------- masked steps (prefix masks)

@pytest.mark.parametrize("cell", ["lstm", "gru", "elman"])
@pytest.mark.parametrize("loss", ["last", "all"])
def test_masked_cells_train_alike_through_the_branch(cell, loss):
    """rnn_cells' masked rows: prefix masks take cuDNN's branch (DnnRNN runs), a mask that is
    no prefix the loop's; 3 SGD steps then the non-prefix call, losses and weights equal."""
    from symgpu.ifelse import IfElse
    from symgpu.tensor.nnet import rnn as rnn_mod
    spec = rc.Spec(cell, True, loss, B, H, False, inp=IN, fixed=L)
    calls = rc.calls(spec, 3)
    bad = calls[0][1].copy()
    bad[1, 1], bad[-1, 0] = 0, 1            # a hole: no prefix
    runs = {"n": 0}
    orig = rnn_mod.DnnRNN.perform

    def counting(self, *a):
        runs["n"] += 1
        return orig(self, *a)
    res = {}
    for on in (False, True):
        rnn_mod.DnnRNN.perform = counting
        try:
            call, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec),
                                            rc.data(spec), mode=_mode(on))
            assert bool(_ops(fn, IfElse)) == on
            losses = [float(call(n, mk)) for n, mk, _ in calls]
            before = runs["n"]
            losses.append(float(call(L, bad)))
            assert runs["n"] == before           # the loop's branch: no DnnRNN
        finally:
            rnn_mod.DnnRNN.perform = orig
        res[on] = (losses, [np.asarray(v.get_value()) for v in fn.maker.fgraph.inputs
                            if hasattr(v, "get_value")])
    assert runs["n"] >= 3                       # cuDNN's branch ran for the prefix masks
    np.testing.assert_allclose(res[True][0], res[False][0], rtol=1e-5, atol=1e-6)
    for got, want in zip(res[True][1], res[False][1]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    # the last cell state is not read: cuDNN runs unmasked, the states gathered per row
    call, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                                    mode=_mode(True))
    forwards = _branch_ops(fn, DnnRNN)
    assert forwards and all(not n.op.with_lengths for n in forwards)


def test_the_rewrite_on_by_flag_does_not_repeat_inside_its_own_fallback_branch():
    """With ``optimizer_including=scan_to_dnn_rnn`` as a flag, every mode (the branches'
    too) includes the rewrite: the loop copied into the branch for non-prefix masks is
    marked and stays a loop (before: each branch's compile rewrote its copy again, without
    end, a RecursionError on the GPU machine's benchmark)."""
    import symgpu.ifelse  # noqa: F401  (installs the lazy branch the masked rewrite needs)
    spec = rc.Spec("lstm", True, "last", B, H, False, inp=IN, fixed=L)
    calls = rc.calls(spec, 2)
    bad = calls[0][1].copy()
    bad[1, 1], bad[-1, 0] = 0, 1
    res = {}
    for on in (False, True):
        flags = {"optimizer_including": "scan_to_dnn_rnn"} if on else {}
        with symgpu.config.change_flags(**flags):
            call, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec),
                                            rc.data(spec))
            res[on] = [float(call(n, mk)) for n, mk, _ in calls] + [float(call(L, bad))]
    np.testing.assert_allclose(res[True], res[False], rtol=1e-5, atol=1e-6)
    fallbacks = [n for n in _branch_ops(fn, Scan) if n.op.grad_of is None]
    assert fallbacks and all(n.op.info.keep_as_loop for n in fallbacks)
    assert all(match_rnn_step(n) is None for n in fallbacks)


@pytest.mark.parametrize("mask, n, lengths, ok", [
    ([[1, 1, 1], [1, 0, 1], [0, 0, 1]], 3, [2, 1, 3], 1),      # a prefix per row
    ([[1, 1, 1], [1, 0, 1], [0, 1, 1]], 3, [2, 2, 3], 0),      # a hole in row 1
    ([[1, 0, 1], [1, 0, 1]], 2, [2, 0, 2], 0),                 # an empty row: cuDNN refuses
    ([[1, 0.5], [1, 0]], 2, [2, 0], 0),                         # not 0/1
    ([[1, 1], [1, 0], [0, 1]], 2, [2, 1], 1),                   # only the first n steps
])
def test_prefix_mask_lengths_and_condition(mask, n, lengths, ok):
    from symgpu.scan.dnn_rnn_match import PrefixMask
    m, k = T.matrix("m", dtype="float32"), T.iscalar("n")
    f = symgpu.function([m, k], list(PrefixMask()(m, k)))
    got_len, got_ok = f(np.asarray(mask, "float32"), n)
    np.testing.assert_array_equal(got_len, lengths)
    assert int(got_ok) == ok and got_len.dtype == np.int32


def test_vgpu_masked_branches_hold_cudnn_alone_and_the_mask_is_checked_on_the_host(
        vgpu, monkeypatch):
    """(The branch, what a function that cannot compile again gets: GUARD off here; the
    guard: test_scan_dnn_rnn_guard.py.) The prefix test reads the caller's host mask (no read-back from the GPU, which would
    wait for it every call); cuDNN's branches hold no loop and no nested branch (work the
    graph computes anyway stays outside them); the backward branch gives only the
    gradients that are read."""
    from symgpu.gpu.placement.basic_ops import HostFromGpu
    from symgpu.ifelse import IfElse
    from symgpu.scan import dnn_rnn_match
    from symgpu.scan.dnn_rnn_match import PrefixMask
    monkeypatch.setattr(dnn_rnn_match, "GUARD", False)
    spec = rc.Spec("lstm", True, "last", B, H, False, inp=IN, fixed=L)
    _, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                                 mode=_mode(True))
    from symgpu.gpu.placement.rewriting import cpu_nodes
    checks = _ops(fn, PrefixMask)
    assert len(checks) == 1 and checks[0].inputs[0].owner is None      # the input itself
    assert checks[0] not in cpu_nodes(fn.maker.fgraph)    # a check, not float work on the host
    branches = _ops(fn, IfElse)
    assert len(branches) == 2
    assert all(n.inputs[0] is checks[0].outputs[1] for n in branches)
    from symgpu.gpu.ops.cudnn_rnn import GpuDnnRNNBackward, GpuDnnRNNForward
    kinds = []
    for n in branches:
        inner = n.op.then_fn.rewritten().toposort()     # as the branch compiles
        assert not any(isinstance(a.op, (Scan, IfElse, PrefixMask, HostFromGpu)) for a in inner)
        kinds += [type(a.op) for a in inner if isinstance(a.op, (GpuDnnRNNForward,
                                                                 GpuDnnRNNBackward))]
    # cuDNN's forward runs once: the backward branch takes y and the reserve space from
    # the forward branch's outputs
    assert sorted(k.__name__ for k in kinds) == ["GpuDnnRNNBackward", "GpuDnnRNNForward"]
    forward = next(n for n in branches if n.outputs[-1].dtype == "uint8")
    assert len(forward.outputs) == 3                       # h, then cuDNN's y and reserve
    backward = next(n for n in branches if n is not forward)
    assert len(backward.outputs) == 3                      # dW, dU, db: what SGD reads
    assert forward.outputs[-1] in backward.inputs


def test_a_masked_lstm_whose_last_cell_state_is_read_runs_cudnn_with_lengths():
    from symgpu.tensor.nnet import rnn as rnn_mod

    def step(x_t, m_t, h_prev, c_prev, W, U, b):
        h, c = lstm_step()[0](x_t, h_prev, c_prev, W, U, b)
        return rc._masked(m_t, h, h_prev), rc._masked(m_t, c, c_prev)
    x, mk = T.tensor3("x", dtype="float32"), T.matrix("m", dtype="float32")
    (hs, cs), _ = symgpu.scan(step, sequences=[x, mk],
                              outputs_info=[T.zeros((B, H), dtype="float32")] * 2,
                              non_sequences=_params(4, np.random.default_rng(0)))
    rng = np.random.default_rng(3)
    xv = rng.standard_normal((L, B, IN)).astype("float32")
    lengths = rng.integers(1, L + 1, B)
    mv = (np.arange(L)[:, None] < lengths[None, :]).astype("float32")
    got = {}
    for on in (False, True):
        f = function([x, mk], [hs[-1], cs[-1]], mode=_mode(on))
        if on:
            assert {n.op.with_lengths for n in _branch_ops(f, rnn_mod.DnnRNN)} == {True}
        got[on] = f(xv, mv)
    for a, b in zip(got[True], got[False]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spelling", ["switch", "lerp"])
def test_masked_spellings_match(spelling):
    from symgpu.scan.dnn_rnn_match import match_rnn_step as match

    def step(x_t, m_t, h_prev, W, U, b):
        new = T.tanh(T.dot(x_t, W) + T.dot(h_prev, U) + b)
        mm = m_t.dimshuffle(0, "x")
        return T.switch(mm, new, h_prev) if spelling == "switch" else h_prev + mm * (new - h_prev)
    x, mk = T.tensor3("x", dtype="float32"), T.matrix("m", dtype="float32")
    hs, _ = symgpu.scan(step, sequences=[x, mk], outputs_info=T.zeros((B, H), dtype="float32"),
                        non_sequences=_params(1, np.random.default_rng(0)))
    m = match(_scan_node(hs.sum()))
    assert m is not None and m.masked


def test_mask_on_one_state_only_stays_a_loop():
    def step(x_t, m_t, h_prev, c_prev, W, U, b):
        h, c = lstm_step()[0](x_t, h_prev, c_prev, W, U, b)
        return rc._masked(m_t, h, h_prev), c          # c not masked: no cuDNN layer
    x, mk = T.tensor3("x", dtype="float32"), T.matrix("m", dtype="float32")
    (hs, _), _ = symgpu.scan(step, sequences=[x, mk],
                             outputs_info=[T.zeros((B, H), dtype="float32")] * 2,
                             non_sequences=_params(4, np.random.default_rng(0)))
    assert match_rnn_step(_scan_node(hs.sum())) is None


def test_vgpu_masked_graph_branches_on_the_mask(vgpu, monkeypatch):
    """On a (virtual) GPU with GUARD off the masked loop compiles to branches on the prefix
    test; no host DnnRNN/DnnRNNGrad is left outside them (what runs inside the branch: see
    the report)."""
    from symgpu.ifelse import IfElse
    from symgpu.scan import dnn_rnn_match
    monkeypatch.setattr(dnn_rnn_match, "GUARD", False)
    spec = rc.Spec("lstm", True, "last", B, H, False, inp=IN, fixed=L)
    _, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                                 mode=_mode(True))
    assert _ops(fn, IfElse)
    assert not _ops(fn, DnnRNN) and not _ops(fn, DnnRNNGrad)
