"""scan_pushout_acc: sums a loop accumulates in a keep-last state (BPTT's weight gradients) are
computed after the loop from per-step factors; results match the loop that accumulates."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import config
from symgpu.scan.op import Scan

ON = "scan_pushout_acc"


def loops(f):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, Scan)]


def both(ins, outs):
    with config.change_flags(floatX="float32", optimizer_excluding=ON):
        f0 = symgpu.function(ins, outs)
    with config.change_flags(floatX="float32", optimizer_including=ON):
        f1 = symgpu.function(ins, outs)
    return f0, f1


def rand(*shape, seed=0, scale=1.0):
    return (np.random.RandomState(seed).randn(*shape) * scale).astype("float32")


def rnn_grads(go_backwards=False):
    x, y = T.tensor3("x"), T.tensor3("y")
    wx, wh, b = T.matrix("wx"), T.matrix("wh"), T.vector("b")
    h0 = T.zeros((4, 5), dtype="float32")
    h, _ = symgpu.scan(lambda xt, hp: T.tanh(T.dot(xt, wx) + T.dot(hp, wh) + b), sequences=x,
                       outputs_info=h0, go_backwards=go_backwards)
    return [x, y, wx, wh, b], T.grad(((h - y) ** 2).mean(), [wx, wh, b])


@pytest.mark.parametrize("go_backwards", [False, True])
def test_bptt_accumulators_leave_the_loop_and_the_gradients_agree(go_backwards):
    with config.change_flags(floatX="float32"):
        ins, grads = rnn_grads(go_backwards)
    f0, f1 = both(ins, grads)
    args = [rand(7, 4, 3), rand(7, 4, 5, seed=1), rand(3, 5, seed=2), rand(5, 5, seed=3, scale=.5),
            rand(5, seed=4)]
    for a, b in zip(f0(*args), f1(*args)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
    (bwd0,) = [n for n in loops(f0) if n.op.info.name == "grad_of_scan"]
    (bwd1,) = [n for n in loops(f1) if n.op.info.name == "grad_of_scan"]
    # the three accumulators (dW_x, dW_h, db) became one per-step output: the step's gradient
    assert bwd0.op.info.n_states == 4 and bwd1.op.info.n_states == 1
    assert bwd1.op.info.n_nitsot == bwd0.op.info.n_nitsot + 1
    names = [type(n.op).__name__ for n in bwd1.op.inner.fgraph.toposort()]
    assert names.count("Dot") == 1 and "CAReduce" not in names and "Sum" not in names, names
    # zero initial values (zeros_like(W)) are not added, and the totals are read directly,
    # not through a one-value window: the SGD update is one GEMM on W
    readers = [n for n in f1.maker.fgraph.toposort()
               if any(i.owner is bwd1 for i in n.inputs)]
    assert {type(n.op).__name__ for n in readers} <= {"Reshape", "Shape_i", "CAReduce"}, readers

    def windows_read(f):
        return [n for n in f.maker.fgraph.toposort()
                if type(n.op).__name__ == "Subtensor" and n.op.idx_list == (0,)]
    assert windows_read(f0) and not windows_read(f1), [str(n) for n in windows_read(f1)]
    assert not any(type(n.op).__name__ == "Subtensor" and n.op.idx_list == (0,)
                   for n in readers), [str(n) for n in readers]


def accumulate(term_fn, n_steps=6):
    """acc <- acc + term(x[t], acc) from a nonzero start, read at [-1] only."""
    x, w, a0 = T.ftensor3("x"), T.fmatrix("w"), T.fmatrix("a0")
    out, _ = symgpu.scan(lambda xt, acc, w: acc + term_fn(xt, acc, w), sequences=x,
                         outputs_info=a0, non_sequences=[w], n_steps=n_steps)
    return [x, w, a0], out[-1]


def run_both(ins, out, args):
    f0, f1 = both(ins, [out])
    r0, r1 = f0(*args)[0], f1(*args)[0]
    np.testing.assert_allclose(r1, r0, rtol=1e-4, atol=1e-5)
    return f0, f1


def test_a_user_accumulator_of_products_and_of_row_sums():
    ins, out = accumulate(lambda xt, acc, w: T.dot(xt.T, T.tanh(T.dot(xt, w))))
    args = [rand(8, 4, 3), rand(3, 3, seed=1), rand(3, 3, seed=2)]
    f0, f1 = run_both(ins, out, args)
    assert loops(f0)[0].op.info.n_states == 1 and loops(f1)[0].op.info.n_states == 0
    x, a0 = T.ftensor3("x"), T.frow("a0")
    s, _ = symgpu.scan(lambda xt, acc: acc + T.exp(xt).sum(axis=0).dimshuffle("x", 0),
                       sequences=x, outputs_info=a0)
    f0, f1 = run_both([x, a0], s[-1], [rand(5, 4, 3), rand(1, 3, seed=2)])
    assert loops(f1)[0].op.info.n_states == 0


def test_an_accumulator_read_by_its_own_term_stays_in_the_loop():
    ins, out = accumulate(lambda xt, acc, w: T.dot(xt.T, T.dot(xt, acc + w)) * np.float32(0.1))
    args = [rand(6, 4, 3), rand(3, 3, seed=1), rand(3, 3, seed=2)]
    f0, f1 = run_both(ins, out, args)
    assert loops(f1)[0].op.info.n_states == 1


def test_a_whole_history_read_keeps_the_state():
    x, w, a0 = T.ftensor3("x"), T.fmatrix("w"), T.fmatrix("a0")
    out, _ = symgpu.scan(lambda xt, acc, w: acc + T.dot(xt.T, T.dot(xt, w)), sequences=x,
                         outputs_info=a0, non_sequences=[w])
    f0, f1 = run_both([x, w, a0], out, [rand(5, 4, 3), rand(3, 3, seed=1), rand(3, 3, seed=2)])
    assert loops(f1)[0].op.info.n_states == 1
