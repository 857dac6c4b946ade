"""Gradients through scan (a backward scan): verify_grad for every feature, truncate_gradient,
shared variables, Lop/Rop/jacobian/hessian, and the RNN's BPTT against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.gradient import verify_grad
from symgpu.scan.op import Scan

RNG = np.random.default_rng(42)


def rand(*shape, scale=1.0):
    return RNG.normal(size=shape) * scale


def test_grad_rnn_wrt_sequence_initial_state_and_weights():
    def f(x, h0, W):
        out, _ = symgpu.scan(lambda xt, h, W: T.tanh(T.dot(h, W) + xt), sequences=x,
                             outputs_info=h0, non_sequences=W)
        return out
    verify_grad(f, [rand(5, 3), rand(3), rand(3, 3, scale=0.5)])


def test_grad_sequence_taps_and_multi_tap_outputs():
    def f(x, y0, a):
        out, _ = symgpu.scan(lambda x_m1, x_p1, y2, y1, a: a * y1 + 0.5 * y2 * x_m1 + x_p1,
                             sequences={"input": x, "taps": [-1, 1]},
                             outputs_info={"initial": y0, "taps": [-2, -1]}, non_sequences=a)
        return out
    verify_grad(f, [rand(7), rand(2), np.array(0.7)])


def test_grad_go_backwards():
    def f(x, h0):
        out, _ = symgpu.scan(lambda xt, h: h * 0.9 + xt ** 2, sequences=x, outputs_info=h0,
                             go_backwards=True)
        return out
    verify_grad(f, [rand(4, 2), rand(2)])


def test_grad_nitsot_outputs_and_closures():
    def f(x, W):
        Wt = W.T * 2  # a closure, hoisted out of the loop
        out, _ = symgpu.scan(lambda row: T.sin(T.dot(Wt, row)), sequences=x)
        return out
    verify_grad(f, [rand(4, 3), rand(3, 3)])


def test_grad_several_outputs_mixed():
    def f(x, s0):
        (s, d), _ = symgpu.scan(lambda a, s: [s * T.cos(a) + a, a * s], sequences=x,
                                outputs_info=[s0, None])
        return [s, d]
    verify_grad(f, [rand(5, 2), rand(2)])


def test_grad_of_only_last_value_and_n_steps():
    def f(h0, W):
        out, _ = symgpu.scan(lambda h, W: T.tanh(T.dot(W, h)), outputs_info=h0,
                             non_sequences=W, n_steps=4)
        return out[-1]
    verify_grad(f, [rand(3), rand(3, 3)])


def test_grad_until_loop():
    def f(x, h0):
        out, _ = symgpu.scan(lambda a, h: (h * 1.5 + a, symgpu.scan.until(T.sum(a) > 100)),
                             sequences=x, outputs_info=h0)
        return out
    verify_grad(f, [np.abs(rand(5, 2)), rand(2)])
    # the loop stops early: the gradient of the unvisited entries is zero
    x, h0 = T.dmatrix("x"), T.dvector("h0")
    out, _ = symgpu.scan(lambda a, h: (h + a, symgpu.scan.until(T.sum(h + a) > 3)),
                         sequences=x, outputs_info=h0)
    g = symgpu.function([x, h0], T.grad(out.sum(), x))(np.ones((6, 1)), np.zeros(1))
    np.testing.assert_allclose(g[:, 0], [4, 3, 2, 1, 0, 0])  # 4 steps ran


def test_grad_shared_variable_used_inside():
    W = symgpu.shared(rand(3, 3, scale=0.5), name="W")
    x = T.dmatrix("x")
    out, _ = symgpu.scan(lambda row, h: T.tanh(T.dot(W, h) + row), sequences=x,
                         outputs_info=T.zeros((3,), dtype="float64"))
    cost = (out ** 2).sum()
    gW = symgpu.function([x], T.grad(cost, W))
    xv = rand(4, 3)

    def numeric(Wv):
        h = np.zeros(3)
        total = 0.0
        for row in xv:
            h = np.tanh(Wv @ h + row)
            total += (h ** 2).sum()
        return total
    w0 = W.get_value()
    num = np.zeros_like(w0)
    eps = 1e-6
    for i in np.ndindex(w0.shape):
        d = np.zeros_like(w0)
        d[i] = eps
        num[i] = (numeric(w0 + d) - numeric(w0 - d)) / (2 * eps)
    np.testing.assert_allclose(gW(xv), num, rtol=1e-5, atol=1e-8)


def test_grad_through_shared_update_state():
    s = symgpu.shared(np.array([0.5, -0.2]), name="acc")
    x = T.dmatrix("x")
    out, updates = symgpu.scan(lambda row: (s * row, {s: s * 0.5 + row}), sequences=x)
    g = symgpu.function([x], T.grad(out.sum(), x))
    xv = rand(3, 2)
    # s_t = 0.5 s_{t-1} + x_{t-1}; out_t = s_{t-1} * x_t; d out.sum / d x
    def total(xv):
        sv = np.array([0.5, -0.2])
        tot = 0.0
        for row in xv:
            tot += (sv * row).sum()
            sv = sv * 0.5 + row
        return tot
    num = np.zeros_like(xv)
    for i in np.ndindex(xv.shape):
        d = np.zeros_like(xv)
        d[i] = 1e-6
        num[i] = (total(xv + d) - total(xv - d)) / 2e-6
    np.testing.assert_allclose(g(xv), num, rtol=1e-6)


def test_truncate_gradient():
    x, h0, W = T.dmatrix("x"), T.dvector("h0"), T.dmatrix("W")
    out, _ = symgpu.scan(lambda xt, h, W: T.tanh(T.dot(h, W) + xt), sequences=x,
                         outputs_info=h0, non_sequences=W, truncate_gradient=2)
    gx, gh = symgpu.function([x, h0, W], T.grad(out[-1].sum(), [x, h0]))(
        rand(5, 3), rand(3), rand(3, 3, scale=0.5))
    assert np.all(gx[:3] == 0) and np.all(gx[3:] != 0)
    assert np.all(gh == 0)
    # with enough steps it equals the full gradient
    out2, _ = symgpu.scan(lambda xt, h, W: T.tanh(T.dot(h, W) + xt), sequences=x,
                          outputs_info=h0, non_sequences=W, truncate_gradient=10)
    out3, _ = symgpu.scan(lambda xt, h, W: T.tanh(T.dot(h, W) + xt), sequences=x,
                          outputs_info=h0, non_sequences=W)
    vals = [rand(5, 3), rand(3), rand(3, 3, scale=0.5)]
    a = symgpu.function([x, h0, W], T.grad(out2.sum(), [x, h0, W]))(*vals)
    b = symgpu.function([x, h0, W], T.grad(out3.sum(), [x, h0, W]))(*vals)
    for u, v in zip(a, b):
        np.testing.assert_allclose(u, v, rtol=1e-12)


def _poly(v):
    h = 1.0
    for x in v:
        h = h * x + x * x
    return h


def test_hessian_and_jacobian_of_scan():
    v = T.dvector("v")
    out, _ = symgpu.scan(lambda xt, h: h * xt + xt ** 2, sequences=v,
                         outputs_info=T.constant(1.0, dtype="float64"))
    vv = np.array([0.5, 1.5, -0.3])
    H = symgpu.function([v], T.hessian(out[-1], v))(vv)
    eps = 1e-4
    num = np.zeros((3, 3))
    for i in range(3):
        for j in range(3):
            ei, ej = np.eye(3)[i] * eps, np.eye(3)[j] * eps
            num[i, j] = (_poly(vv + ei + ej) - _poly(vv + ei - ej) - _poly(vv - ei + ej)
                         + _poly(vv - ei - ej)) / (4 * eps * eps)
    np.testing.assert_allclose(H, num, atol=1e-5)
    J = symgpu.function([v], T.jacobian(out, v))(vv)
    assert J.shape == (3, 3)
    np.testing.assert_allclose(J[-1], [num_grad for num_grad in _num_grad(vv)], rtol=1e-6)


def _num_grad(vv):
    g = []
    for i in range(len(vv)):
        e = np.eye(len(vv))[i] * 1e-6
        g.append((_poly(vv + e) - _poly(vv - e)) / 2e-6)
    return g


def test_lop_and_rop_of_scan():
    v, u = T.dvector("v"), T.dvector("u")
    out, _ = symgpu.scan(lambda xt, h: h * xt + xt ** 2, sequences=v,
                         outputs_info=T.constant(1.0, dtype="float64"))
    vv, uv = np.array([0.5, 1.5, -0.3]), np.array([1.0, 2.0, 3.0])
    J = symgpu.function([v], T.jacobian(out, v))(vv)
    rop = symgpu.function([v, u], T.Rop(out, v, u))(vv, uv)
    lop = symgpu.function([v, u], T.Lop(out, v, u))(vv, uv)
    np.testing.assert_allclose(rop, J @ uv, rtol=1e-10)
    np.testing.assert_allclose(lop, uv @ J, rtol=1e-10)


def test_grad_of_map_and_reduce():
    def f(x, w):
        sq, _ = symgpu.map(lambda a, w: T.tanh(a * w), sequences=x, non_sequences=w)
        tot, _ = symgpu.reduce(lambda a, acc: acc * 0.5 + a ** 2, sequences=x,
                               outputs_info=T.zeros_like(w))
        return [sq, tot]
    verify_grad(f, [rand(4, 2), rand(2)])


def test_rnn_bptt_matches_numpy():
    seq, batch, nin, nh = 6, 4, 3, 5
    xv, yv = rand(seq, batch, nin), rand(seq, batch, nh)
    wx0, wh0, b0 = rand(nin, nh, scale=0.5), rand(nh, nh, scale=0.5), rand(nh)
    x, y = T.dtensor3("x"), T.dtensor3("y")
    wx, wh, b = T.dmatrix("wx"), T.dmatrix("wh"), T.dvector("b")
    h, _ = symgpu.scan(lambda x_t, h, wx, wh, b: T.tanh(T.dot(x_t, wx) + T.dot(h, wh) + b),
                       sequences=x, outputs_info=T.zeros((batch, nh), dtype="float64"),
                       non_sequences=[wx, wh, b])
    loss = T.mean((h - y) ** 2)
    f = symgpu.function([x, y, wx, wh, b], [loss] + T.grad(loss, [wx, wh, b]))
    got = f(xv, yv, wx0, wh0, b0)
    hs = np.zeros((seq + 1, batch, nh))
    for t in range(seq):
        hs[t + 1] = np.tanh(xv[t] @ wx0 + hs[t] @ wh0 + b0)
    diff = hs[1:] - yv
    dh = 2 * diff / diff.size
    gwx, gwh, gb = np.zeros_like(wx0), np.zeros_like(wh0), np.zeros_like(b0)
    carry = np.zeros((batch, nh))
    for t in range(seq - 1, -1, -1):
        g = (dh[t] + carry) * (1 - hs[t + 1] ** 2)
        gwx += xv[t].T @ g
        gwh += hs[t].T @ g
        gb += g.sum(0)
        carry = g @ wh0.T
    np.testing.assert_allclose(got[0], (diff ** 2).mean(), rtol=1e-12)
    for a, e in zip(got[1:], [gwx, gwh, gb]):
        np.testing.assert_allclose(a, e, rtol=1e-10)


def test_backward_loop_reuses_forward_outputs():
    """tanh's gradient reads the forward output: the backward body takes it as a sequence
    instead of recomputing the step."""
    x, h0, W = T.dmatrix("x"), T.dvector("h0"), T.dmatrix("W")
    out, _ = symgpu.scan(lambda xt, h, W: T.tanh(T.dot(h, W) + xt), sequences=x,
                         outputs_info=h0, non_sequences=W)
    f = symgpu.function([x, h0, W], T.grad(out.sum(), W))
    scans = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, Scan)]
    back = [n for n in scans if n.op.info.name.startswith("grad_of")]
    assert len(back) == 1
    inner = back[0].op.fgraph.toposort()
    assert not any("tanh" in str(n.op) for n in inner), [str(n.op) for n in inner]


def test_hessian_wrt_non_sequence_and_float32_grad():
    """Second order through the backward loop's running sums (kept at their last value only,
    so their gradient re-runs that loop with its history)."""
    w, x = T.dvector("w"), T.dmatrix("x")
    out, _ = symgpu.scan(lambda a, h, w: T.tanh(h * w + a), sequences=x,
                         outputs_info=T.zeros((2,), dtype="float64"), non_sequences=w)
    H = symgpu.function([x, w], T.hessian((out ** 2).sum(), w))
    xv, wv = rand(4, 2), rand(2)

    def c(wv):
        h, t = np.zeros(2), 0.0
        for a in xv:
            h = np.tanh(h * wv + a)
            t += (h ** 2).sum()
        return t
    e = 1e-4
    num = np.zeros((2, 2))
    for i in range(2):
        for j in range(2):
            ei, ej = np.eye(2)[i] * e, np.eye(2)[j] * e
            num[i, j] = (c(wv + ei + ej) - c(wv + ei - ej) - c(wv - ei + ej)
                         + c(wv - ei - ej)) / (4 * e * e)
    np.testing.assert_allclose(H(xv, wv), num, atol=1e-6)

    def f(x, h0, W):
        o, _ = symgpu.scan(lambda a, h, W: T.tanh(T.dot(h, W) + a), sequences=x,
                           outputs_info=h0, non_sequences=W)
        return o
    verify_grad(f, [rand(5, 3).astype("float32"), rand(3).astype("float32"),
                    rand(3, 3, scale=0.5).astype("float32")])


def test_backward_loop_reads_the_states_adjoint_without_a_zero_filled_buffer():
    """The gradient of what scan() returns for a state (its buffer without the L initial
    values) is read by the backward loop directly: no zero-filled copy of the O(steps)
    buffer with the adjoint written in at [L:] is left in the compiled graph (L = 1 and
    L = 2 taps). A loop whose last value only is returned (reduce) takes the general path.
    All three gradients are checked numerically."""
    from symgpu.tensor.subtensor import IncSubtensor, Slice

    def rnn(x, h0, W):
        return symgpu.scan(lambda xt, h, W: T.tanh(T.dot(h, W) + xt), sequences=x,
                           outputs_info=h0, non_sequences=W)[0]

    def two_taps(x, h0, W):
        return symgpu.scan(lambda xt, h2, h1, W: T.tanh(T.dot(h1, W) + 0.5 * h2 + xt),
                           sequences=x, outputs_info=dict(initial=h0, taps=[-2, -1]),
                           non_sequences=W)[0]

    def last(x, h0, W):
        return symgpu.reduce(lambda xt, h, W: T.tanh(T.dot(h, W) + xt), sequences=x,
                             outputs_info=h0, non_sequences=W)[0]
    W = rand(3, 3, scale=0.5)
    for build, h0, L in ((rnn, rand(3), 1), (two_taps, rand(2, 3), 2), (last, rand(3), None)):
        x, h0v, Wv = T.dmatrix("x"), T.TensorType("float64", (False,) * h0.ndim)("h0"), \
            T.dmatrix("W")
        loss = ((build(x, h0v, Wv) - 0.3) ** 2).sum()
        f = symgpu.function([x, h0v, Wv], symgpu.grad(loss, [x, h0v, Wv]))
        if L is not None:
            filled = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, IncSubtensor)
                      and n.op.idx_list == (Slice(L, None, None),)]
            assert filled == [], filled
        verify_grad(lambda x, h0, W, build=build: ((build(x, h0, W) - 0.3) ** 2).sum(),
                    [rand(6, 3), h0, W])


def test_lstm_gradient_body_keeps_constants_inside_and_writes_gates_once():
    """The backward body of an LSTM written the usual way (gates sliced from one product):
    expressions of constants (a gradient's zero fills, ``1 - m``'s one) stay inside the body,
    where rewrites see them, instead of becoming loop inputs; the gate gradients are joined
    and written into the product's gradient once (local_add_of_slice_writes)."""
    from symgpu.graph.basic import Constant
    from symgpu.tensor.subtensor import IncSubtensorProps   # host or GPU (device=cuda runs)
    H = 3
    x, m, h0 = T.dtensor3("x"), T.dmatrix("m"), T.dmatrix("h0")
    W = symgpu.shared(rand(2, 4 * H, scale=0.5))
    U = symgpu.shared(rand(H, 4 * H, scale=0.5))

    def step(m_, x_, h_, c_):
        pre = T.dot(x_, W) + T.dot(h_, U)
        i, f, o = (T.nnet.sigmoid(pre[:, k * H:(k + 1) * H]) for k in range(3))
        c = f * c_ + i * T.tanh(pre[:, 3 * H:])
        c = m_[:, None] * c + (1. - m_)[:, None] * c_
        h = o * T.tanh(c)
        return m_[:, None] * h + (1. - m_)[:, None] * h_, c
    (hs, _), _ = symgpu.scan(step, sequences=[m, x], outputs_info=[h0, h0])
    cost = (hs[-1] ** 2).sum()
    fn = symgpu.function([x, m, h0], T.grad(cost, [W, U]))
    back = [n for n in fn.maker.fgraph.toposort()
            if isinstance(n.op, Scan) and n.op.info.name == "grad_of_scan"]
    assert len(back) == 1
    assert not any(isinstance(v, Constant) for v in back[0].inputs[1:])
    body = back[0].op.inner.rewritten()
    # written once: the join of the gates is the product's gradient (no zeroed array, no
    # region write: local_write_into_zeros_to_join)
    assert not any(isinstance(n.op, IncSubtensorProps) for n in body.apply_nodes)
    assert sum("Join" in type(n.op).__name__ for n in body.apply_nodes) == 1
    # the forward loop saves the sum of its two products (one loop: the gradient's copy
    # merged with the user's); the backward step does only its recurrent product, not a
    # recomputation, and reads one array per step, not two it adds again
    products = {"Dot", "Dot22", "Gemm", "Gemv", "GpuDot22", "GpuGemm", "GpuGemv"}
    assert sum(type(n.op).__name__ in products for n in body.apply_nodes) == 1
    loops = [n for n in fn.maker.fgraph.toposort() if isinstance(n.op, Scan)]
    assert len(loops) == 2
    fwd = next(n for n in loops if n is not back[0])
    assert fwd.op.info.n_nitsot == 1 and "saved" in fwd.op.info.nitsot_names[0]

    def numeric(xv, mv, h0v):
        def run(Wv, Uv):
            h, c = h0v, h0v
            sig = lambda a: 1 / (1 + np.exp(-a))  # noqa: E731
            for t in range(xv.shape[0]):
                pre = xv[t] @ Wv + h @ Uv
                i, f, o = (sig(pre[:, k * H:(k + 1) * H]) for k in range(3))
                cn = f * c + i * np.tanh(pre[:, 3 * H:])
                cn = mv[t][:, None] * cn + (1 - mv[t])[:, None] * c
                hn = o * np.tanh(cn)
                h, c = mv[t][:, None] * hn + (1 - mv[t])[:, None] * h, cn
            return (h ** 2).sum()
        return run
    xv, mv, h0v = rand(4, 2, 2), np.ones((4, 2)), rand(2, H)
    mv[3, 1] = 0
    gW, gU = fn(xv, mv, h0v)
    run, eps = numeric(xv, mv, h0v), 1e-6
    Wv, Uv = W.get_value(), U.get_value()
    for (r, c) in [(0, 0), (1, 7), (0, 11)]:
        d = np.zeros_like(Wv)
        d[r, c] = eps
        np.testing.assert_allclose(gW[r, c], (run(Wv + d, Uv) - run(Wv - d, Uv)) / (2 * eps),
                                   rtol=1e-5, atol=1e-8)
    for (r, c) in [(0, 0), (2, 5), (1, 11)]:
        d = np.zeros_like(Uv)
        d[r, c] = eps
        np.testing.assert_allclose(gU[r, c], (run(Wv, Uv + d) - run(Wv, Uv - d)) / (2 * eps),
                                   rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("n,every,padding", [(12, 4, True), (13, 4, True), (12, 5, True),
                                             (12, 4, False), (3, 10, True)])
def test_scan_checkpoints_values_and_gradients_are_scans(n, every, padding):
    """Theano's scan_checkpoints: the states after each block of `every` steps, and the same
    gradients as the plain loop (the blocks' steps recomputed from each block's first state);
    an outer loop over inner loops."""
    x, h0, W = T.dmatrix("x"), T.dvector("h0"), T.dmatrix("W")

    def step(xt, h, W):
        return T.tanh(T.dot(h, W) + xt)
    outs, _ = symgpu.scan_checkpoints(step, sequences=[x], outputs_info=[h0],
                                      non_sequences=[W], save_every_N=every, padding=padding)
    ref, _ = symgpu.scan(step, sequences=[x], outputs_info=[h0], non_sequences=[W])
    f = symgpu.function([x, h0, W], [outs] + T.grad(outs[-1].sum(), [x, h0, W]))
    rf = symgpu.function([x, h0, W], [ref] + T.grad(ref[-1].sum(), [x, h0, W]))
    xv, hv, Wv = rand(n, 3), rand(3), rand(3, 3, scale=0.5)
    got, want = f(xv, hv, Wv), rf(xv, hv, Wv)
    last_of_block = [min((b + 1) * every, n) - 1 for b in range(-(-n // every))]
    np.testing.assert_allclose(got[0], want[0][last_of_block], rtol=1e-12)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    bodies = [nd.op.inner.rewritten() for nd in f.maker.fgraph.toposort()
              if isinstance(nd.op, Scan)]
    assert any(isinstance(m.op, Scan) for body in bodies for m in body.apply_nodes)


def test_scan_checkpoints_rejects_taps_and_bad_blocks():
    x, h0 = T.dmatrix("x"), T.dmatrix("h0")
    with pytest.raises(ValueError, match="taps"):
        symgpu.scan_checkpoints(lambda a, b, c: a + b, sequences=[x],
                                outputs_info=[dict(initial=h0, taps=[-2, -1])])
    with pytest.raises(ValueError, match="save_every_N"):
        symgpu.scan_checkpoints(lambda a, b: a + b, sequences=[x], outputs_info=[x[0]],
                                save_every_N=0)
