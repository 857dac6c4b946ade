"""scan collects the updates of the random streams and shared variables its step uses and
returns them as updates of the outer graph (Theano's contract): the deeplearning.net RBM's
CD-k Gibbs chain, a persistent chain, dropout inside a step, nested loops, go_backwards and
n_steps without sequences, and the gradient through such a loop.

Values are checked against NumPy re-implementations that draw the same numbers: the Philox
layout is documented (docs/random.md), so `philox.sample` on a stream's state before the call
gives exactly the draws the compiled graph makes."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

import symgpu as theano
import symgpu.tensor as T
from symgpu.tensor.random import philox
from symgpu.tensor.shared_randomstreams import RandomStreams

floatX = theano.config.floatX
TOL = dict(rtol=1e-5, atol=1e-6) if floatX == "float64" else dict(rtol=1e-4, atol=1e-5)


class NpStream:
    """A NumPy copy of one Philox stream: the same draws as the graph's, in the same order."""

    def __init__(self, state_var):
        self.state = np.array(state_var.get_value(), copy=True)

    def uniform(self, shape, dtype=floatX):
        u = philox.sample(self.state, "uniform", dtype, tuple(shape))
        self.state = philox.advance(self.state, philox.blocks(int(np.prod(shape)), dtype))
        return u

    def normal(self, shape, dtype=floatX):
        z = philox.sample(self.state, "normal", dtype, tuple(shape))
        self.state = philox.advance(self.state, philox.blocks(int(np.prod(shape)), dtype))
        return z

    def binomial(self, p):
        return (self.uniform(p.shape) < p).astype(floatX)


class _stream_at(NpStream):
    """A NumPy stream starting at a given state value."""

    def __init__(self, state):
        self.state = np.array(state, copy=True)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# ------------------------------------------------------------------ deeplearning.net's RBM

class RBM:
    """deeplearning.net's rbm.py, written for Theano, run unchanged on symgpu."""

    def __init__(self, input, n_visible=6, n_hidden=4, seed=1234):
        np_rng = np.random.RandomState(seed)
        self.theano_rng = RandomStreams(np_rng.randint(2 ** 30))
        W = np.asarray(np_rng.uniform(-0.8, 0.8, (n_visible, n_hidden)), dtype=floatX)
        self.W = theano.shared(W, name="W")
        self.hbias = theano.shared(np.asarray(np_rng.uniform(-0.2, 0.2, n_hidden), dtype=floatX),
                                   name="hbias")
        self.vbias = theano.shared(np.asarray(np_rng.uniform(-0.2, 0.2, n_visible), dtype=floatX),
                                   name="vbias")
        self.input = input
        self.params = [self.W, self.hbias, self.vbias]

    def free_energy(self, v_sample):
        wx_b = T.dot(v_sample, self.W) + self.hbias
        vbias_term = T.dot(v_sample, self.vbias)
        hidden_term = T.sum(T.log(1 + T.exp(wx_b)), axis=1)
        return -hidden_term - vbias_term

    def propup(self, vis):
        pre_sigmoid_activation = T.dot(vis, self.W) + self.hbias
        return [pre_sigmoid_activation, T.nnet.sigmoid(pre_sigmoid_activation)]

    def sample_h_given_v(self, v0_sample):
        pre_sigmoid_h1, h1_mean = self.propup(v0_sample)
        h1_sample = self.theano_rng.binomial(size=h1_mean.shape, n=1, p=h1_mean, dtype=floatX)
        return [pre_sigmoid_h1, h1_mean, h1_sample]

    def propdown(self, hid):
        pre_sigmoid_activation = T.dot(hid, self.W.T) + self.vbias
        return [pre_sigmoid_activation, T.nnet.sigmoid(pre_sigmoid_activation)]

    def sample_v_given_h(self, h0_sample):
        pre_sigmoid_v1, v1_mean = self.propdown(h0_sample)
        v1_sample = self.theano_rng.binomial(size=v1_mean.shape, n=1, p=v1_mean, dtype=floatX)
        return [pre_sigmoid_v1, v1_mean, v1_sample]

    def gibbs_hvh(self, h0_sample):
        pre_sigmoid_v1, v1_mean, v1_sample = self.sample_v_given_h(h0_sample)
        pre_sigmoid_h1, h1_mean, h1_sample = self.sample_h_given_v(v1_sample)
        return [pre_sigmoid_v1, v1_mean, v1_sample, pre_sigmoid_h1, h1_mean, h1_sample]

    def gibbs_vhv(self, v0_sample):
        pre_sigmoid_h1, h1_mean, h1_sample = self.sample_h_given_v(v0_sample)
        pre_sigmoid_v1, v1_mean, v1_sample = self.sample_v_given_h(h1_sample)
        return [pre_sigmoid_h1, h1_mean, h1_sample, pre_sigmoid_v1, v1_mean, v1_sample]

    def get_cost_updates(self, lr=0.1, persistent=None, k=1):
        pre_sigmoid_ph, ph_mean, ph_sample = self.sample_h_given_v(self.input)
        chain_start = ph_sample if persistent is None else persistent
        ([pre_sigmoid_nvs, nv_means, nv_samples, pre_sigmoid_nhs, nh_means, nh_samples],
         updates) = theano.scan(self.gibbs_hvh,
                                outputs_info=[None, None, None, None, None, chain_start],
                                n_steps=k, name="gibbs_hvh")
        chain_end = nv_samples[-1]
        cost = T.mean(self.free_energy(self.input)) - T.mean(self.free_energy(chain_end))
        gparams = T.grad(cost, self.params, consider_constant=[chain_end])
        for gparam, param in zip(gparams, self.params):
            updates[param] = param - gparam * T.cast(lr, dtype=floatX)
        if persistent:
            updates[persistent] = nh_samples[-1]
        return cost, updates, nv_samples


def np_cd_step(x, W, hb, vb, streams, k, lr, persistent=None):
    """One CD-k (or PCD-k) update in NumPy with the streams' draws: (cost, W, hb, vb, the
    chain's visible samples per step, the chain's last hidden sample)."""
    s_in, s_v, s_h = streams
    ph_mean = sigmoid(x @ W + hb)
    # PCD starts from the persistent chain: the graph never reads the first draw, so its
    # stream is not advanced
    h = s_in.binomial(ph_mean) if persistent is None else persistent
    vs = []
    for _ in range(k):
        v = s_v.binomial(sigmoid(h @ W.T + vb))
        h = s_h.binomial(sigmoid(v @ W + hb))
        vs.append(v)
    v = vs[-1]

    def free_energy(s):
        return -np.log(1 + np.exp(s @ W + hb)).sum(axis=1) - s @ vb

    cost = free_energy(x).mean() - free_energy(v).mean()
    n = x.shape[0]
    gW = (-x.T @ sigmoid(x @ W + hb) + v.T @ sigmoid(v @ W + hb)) / n
    ghb = (-sigmoid(x @ W + hb).sum(0) + sigmoid(v @ W + hb).sum(0)) / n
    gvb = (-x.sum(0) + v.sum(0)) / n
    return cost, W - lr * gW, hb - lr * ghb, vb - lr * gvb, np.stack(vs), h


def _data(n=5, nv=6, seed=0):
    return (np.random.RandomState(seed).rand(n, nv) > 0.5).astype(floatX)


@pytest.mark.parametrize("k", [1, 3])
def test_rbm_cd_k_updates_match_numpy(k):
    x = T.matrix("x")
    rbm = RBM(x)
    cost, updates, nv_samples = rbm.get_cost_updates(lr=0.1, k=k)
    states = [s for s, _ in rbm.theano_rng.state_updates]
    assert len(states) == 3
    # the two streams drawn in the step are updated by the loop; the one drawn before it is
    # left to its default update
    assert list(updates.keys()) == [states[1], states[2], *rbm.params]
    train = theano.function([x], [cost, nv_samples], updates=updates)
    data = _data()
    for _call in range(2):
        streams = [NpStream(s) for s in states]
        W, hb, vb = (p.get_value() for p in rbm.params)
        want_cost, W1, hb1, vb1, want_vs, _ = np_cd_step(data, W, hb, vb, streams, k, 0.1)
        got_cost, got_vs = train(data)
        np.testing.assert_array_equal(got_vs, want_vs)
        np.testing.assert_allclose(got_cost, want_cost, **TOL)
        np.testing.assert_allclose(rbm.W.get_value(), W1, **TOL)
        np.testing.assert_allclose(rbm.hbias.get_value(), hb1, **TOL)
        np.testing.assert_allclose(rbm.vbias.get_value(), vb1, **TOL)
        # every stream moved on by exactly the draws made: once before the loop, k times in it
        for s, ns in zip(states, streams):
            np.testing.assert_array_equal(s.get_value(), ns.state)
    blocks = philox.blocks(data.size, floatX)
    assert int(states[1].get_value()[2]) == 2 * k * blocks


def test_rbm_chain_draws_differ_between_steps():
    x = T.matrix("x")
    rbm = RBM(x, n_visible=40, n_hidden=30)
    _, updates, nv_samples = rbm.get_cost_updates(k=4)
    f = theano.function([x], nv_samples, updates=updates)
    vs = f(_data(8, 40))
    assert vs.shape == (4, 8, 40)
    for t in range(1, 4):
        assert not np.array_equal(vs[t], vs[t - 1])


def test_rbm_persistent_chain_over_several_calls():
    x = T.matrix("x")
    rbm = RBM(x)
    batch, n_hidden = 5, 4
    persistent = theano.shared(np.zeros((batch, n_hidden), dtype=floatX), borrow=True,
                               name="persistent_chain")
    cost, updates, _ = rbm.get_cost_updates(lr=0.05, persistent=persistent, k=2)
    assert persistent in updates
    train = theano.function([x], cost, updates=updates, name="train_rbm")
    states = [s for s, _ in rbm.theano_rng.state_updates]
    streams = [NpStream(s) for s in states]
    W, hb, vb = (p.get_value() for p in rbm.params)
    chain = persistent.get_value()
    data = _data(batch)
    chains = []
    for _call in range(3):
        want_cost, W, hb, vb, _, chain = np_cd_step(data, W, hb, vb, streams, 2, 0.05,
                                                    persistent=chain)
        np.testing.assert_allclose(train(data), want_cost, **TOL)
        np.testing.assert_array_equal(persistent.get_value(), chain)
        np.testing.assert_allclose(rbm.W.get_value(), W, **TOL)
        chains.append(chain)
    for s, ns in zip(states, streams):
        np.testing.assert_array_equal(s.get_value(), ns.state)
    assert int(states[0].get_value()[2]) == 0
    assert not all(np.array_equal(chains[0], c) for c in chains[1:])


def test_rbm_sampling_chain_gibbs_vhv():
    """The sampling part of rbm.py: a persistent visible chain advanced by gibbs_vhv with
    `n_steps` and no sequences; only the last step's samples are read."""
    x = T.matrix("x")
    rbm = RBM(x)
    pv = theano.shared(_data(3), name="persistent_vis_chain")
    ([presig_hids, hid_mfs, hid_samples, presig_vis, vis_mfs, vis_samples], updates) = \
        theano.scan(rbm.gibbs_vhv, outputs_info=[None, None, None, None, None, pv], n_steps=5,
                    name="gibbs_vhv")
    updates.update({pv: vis_samples[-1]})
    sample_fn = theano.function([], [vis_mfs[-1], vis_samples[-1]], updates=updates,
                                name="sample_fn")
    states = [s for s, _ in rbm.theano_rng.state_updates]
    streams = [NpStream(s) for s in states]
    W, hb, vb = (p.get_value() for p in rbm.params)
    v = pv.get_value()
    for _call in range(2):
        for _ in range(5):
            h = streams[0].binomial(sigmoid(v @ W + hb))
            v_mean = sigmoid(h @ W.T + vb)
            v = streams[1].binomial(v_mean)
        got_mean, got_v = sample_fn()
        np.testing.assert_allclose(got_mean, v_mean, **TOL)
        np.testing.assert_array_equal(got_v, v)
        np.testing.assert_array_equal(pv.get_value(), v)


# ------------------------------------------------------------------ the updates scan returns

def test_returned_updates_are_an_ordered_dict_of_final_states():
    srng = RandomStreams(seed=7)
    counter = theano.shared(np.asarray(0, dtype="int64"), name="counter")

    def step(acc):
        z = srng.normal((3,))
        return acc + z, {counter: counter + 1}

    acc, updates = theano.scan(step, outputs_info=T.zeros((3,), dtype=floatX), n_steps=4)
    state = srng.state_updates[0][0]
    assert isinstance(updates, OrderedDict)
    assert list(updates.keys()) == [counter, state]       # the step's own first
    for k, v in updates.items():
        assert v.type.dtype == k.type.dtype and v.type.ndim == k.type.ndim
    assert state.type.dtype == "uint32"
    both = updates + OrderedDict()
    assert isinstance(both, OrderedDict) and list(both.keys()) == list(updates.keys())
    f = theano.function([], acc, updates=updates)
    ns = NpStream(state)
    want = np.cumsum([ns.normal((3,)) for _ in range(4)], axis=0)
    np.testing.assert_allclose(f(), want, **TOL)
    assert int(counter.get_value()) == 4
    np.testing.assert_array_equal(state.get_value(), ns.state)


def test_explicit_update_from_the_step_wins_over_default_update():
    srng = RandomStreams(seed=3)
    holder = []

    def step():
        u = srng.uniform((2,))
        holder.append(u)
        # keep drawing the same numbers: the step's own update of the state wins
        return u, {u.rng: u.rng}

    us, updates = theano.scan(step, n_steps=3)
    rng = holder[0].rng
    f = theano.function([], us, updates=updates)
    ns = NpStream(rng)
    got = f()
    want = ns.uniform((2,))
    for t in range(3):
        np.testing.assert_array_equal(got[t], want)


def test_two_calls_advance_the_random_state():
    srng = RandomStreams(seed=11)
    xs = T.matrix("xs")
    out, updates = theano.scan(lambda x: x + srng.uniform(x.shape), sequences=xs)
    f = theano.function([xs], out, updates=updates)
    data = np.zeros((3, 5), dtype=floatX)
    state = srng.state_updates[0][0]
    ns = NpStream(state)
    a = f(data)
    b = f(data)
    assert not np.array_equal(a, b)
    for t in range(3):
        assert not np.array_equal(a[t], a[(t + 1) % 3])
    np.testing.assert_array_equal(a, np.stack([ns.uniform((5,)) for _ in range(3)]))
    np.testing.assert_array_equal(b, np.stack([ns.uniform((5,)) for _ in range(3)]))
    np.testing.assert_array_equal(state.get_value(), ns.state)


def test_without_the_loops_updates_the_state_stays():
    """Not passing the loop's updates to function: the stream is not advanced by the loop
    (its draws of a fixed size fall back to the stream's default update, one draw a call)."""
    srng = RandomStreams(seed=5)
    out, updates = theano.scan(lambda: srng.uniform((4,)), n_steps=3)
    state = srng.state_updates[0][0]
    g = theano.function([], out, no_default_updates=True)
    a, b = g(), g()
    np.testing.assert_array_equal(a, b)
    ns = NpStream(state)
    np.testing.assert_array_equal(a, np.stack([ns.uniform((4,)) for _ in range(3)]))


# ------------------------------------------------------------------ dropout inside a step

def _np_dropout_rnn(xs, h0, W, U, ns, p):
    h, hs = h0, []
    for x in xs:
        mask = (ns.uniform(h0.shape) < p).astype(floatX)
        h = np.tanh(x @ W + h @ U) * mask / p
        hs.append(h)
    return np.stack(hs)


def test_dropout_mask_inside_a_step_and_its_gradient():
    srng = RandomStreams(seed=42)
    xs = T.matrix("xs")
    h0 = T.vector("h0")
    W = theano.shared(np.random.RandomState(1).randn(3, 4).astype(floatX) * 0.5, name="W")
    U = theano.shared(np.random.RandomState(2).randn(4, 4).astype(floatX) * 0.5, name="U")
    p = 0.7

    def step(x, h):
        mask = srng.binomial(size=(4,), n=1, p=p, dtype=floatX)
        return T.tanh(T.dot(x, W) + T.dot(h, U)) * mask / p

    hs, updates = theano.scan(step, sequences=xs, outputs_info=h0)
    cost = (hs ** 2).sum()
    gW, gU = T.grad(cost, [W, U])
    f = theano.function([xs, h0], [hs, cost, gW, gU], updates=updates)
    state = srng.state_updates[0][0]
    rs = np.random.RandomState(3)
    xv, h0v = rs.randn(6, 3).astype(floatX), rs.randn(4).astype(floatX)
    start = np.array(state.get_value(), copy=True)

    got_hs, got_cost, got_gW, got_gU = f(xv, h0v)
    want_hs = _np_dropout_rnn(xv, h0v, W.get_value(), U.get_value(), _stream_at(start), p)
    np.testing.assert_allclose(got_hs, want_hs, **TOL)
    masks = (got_hs != 0)
    assert not all(np.array_equal(masks[0], m) for m in masks[1:])   # a new mask every step
    assert 0 < masks.mean() < 1
    # the gradient, with the same masks, against central differences of the NumPy loop
    if floatX == "float64":
        for shared_var, g in ((W, got_gW), (U, got_gU)):
            base = shared_var.get_value()
            num = np.zeros_like(base)
            for idx in np.ndindex(*base.shape):
                vals = []
                for d in (1e-6, -1e-6):
                    pert = base.copy()
                    pert[idx] += d
                    Wv = pert if shared_var is W else W.get_value()
                    Uv = pert if shared_var is U else U.get_value()
                    vals.append((_np_dropout_rnn(xv, h0v, Wv, Uv, _stream_at(start), p) ** 2).sum())
                num[idx] = (vals[0] - vals[1]) / 2e-6
            np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-7)
    # the state moved on by the six masks
    np.testing.assert_array_equal(state.get_value(),
                                  philox.advance(start, 6 * philox.blocks(4, floatX)))


# ------------------------------------------------------------------ loop shapes

def test_go_backwards_draws_in_step_order():
    srng = RandomStreams(seed=9)
    xs = T.matrix("xs")
    out, updates = theano.scan(lambda x: x + srng.normal(x.shape), sequences=xs,
                               go_backwards=True)
    f = theano.function([xs], out, updates=updates)
    data = np.arange(12, dtype=floatX).reshape(4, 3)
    ns = NpStream(srng.state_updates[0][0])
    want = data[::-1] + np.stack([ns.normal((3,)) for _ in range(4)])
    np.testing.assert_allclose(f(data), want, **TOL)


@pytest.mark.parametrize("n_steps, backwards", [(4, False), (4, True), (-4, False)])
def test_n_steps_without_sequences(n_steps, backwards):
    srng = RandomStreams(seed=13)
    out, updates = theano.scan(lambda: srng.uniform((2, 3)), n_steps=n_steps,
                               go_backwards=backwards)
    f = theano.function([], out, updates=updates)
    state = srng.state_updates[0][0]
    ns = NpStream(state)
    for _call in range(2):
        np.testing.assert_array_equal(f(), np.stack([ns.uniform((2, 3)) for _ in range(4)]))
    np.testing.assert_array_equal(state.get_value(), ns.state)


def test_symbolic_n_steps_from_a_shared_start():
    srng = RandomStreams(seed=17)
    n = T.iscalar("n")
    walker = theano.shared(np.zeros(3, dtype=floatX), name="walker")
    pos, updates = theano.scan(lambda w: w + srng.normal((3,)), outputs_info=walker, n_steps=n)
    updates[walker] = pos[-1]
    f = theano.function([n], pos, updates=updates)
    ns = NpStream(srng.state_updates[0][0])
    w = np.zeros(3, dtype=floatX)
    for steps in (2, 5):
        want = w + np.cumsum([ns.normal((3,)) for _ in range(steps)], axis=0)
        np.testing.assert_allclose(f(steps), want, **TOL)
        w = want[-1]
        np.testing.assert_allclose(walker.get_value(), w, **TOL)


def test_nested_scans_thread_the_state_through_both_loops():
    srng = RandomStreams(seed=21)

    def inner_step(acc):
        return acc + srng.uniform((2,))

    def outer_step(start):
        accs, upd = theano.scan(inner_step, outputs_info=start, n_steps=3, name="inner")
        return accs[-1], upd

    out, updates = theano.scan(outer_step, outputs_info=T.zeros((2,), dtype=floatX),
                               n_steps=4, name="outer")
    state = srng.state_updates[0][0]
    assert list(updates.keys()) == [state]
    f = theano.function([], out, updates=updates)
    ns = NpStream(state)
    for _call in range(2):
        draws = np.stack([ns.uniform((2,)) for _ in range(12)])
        want = np.cumsum(draws, axis=0)[2::3]
        np.testing.assert_allclose(f(), want, **TOL)
    np.testing.assert_array_equal(state.get_value(), ns.state)


def test_nested_scan_whose_updates_the_step_drops_still_threads_the_stream():
    """A step that runs an inner scan and drops the updates it returned (code that Theano
    ran, repeating its draws): the stream still moves on by the inner loop's draws."""
    srng = RandomStreams(seed=23)

    def outer_step(h):
        hs, _upd = theano.scan(lambda a: a * srng.uniform(a.shape), outputs_info=h, n_steps=2)
        return hs[-1]

    out, updates = theano.scan(outer_step, outputs_info=T.ones((2,), dtype=floatX), n_steps=3)
    state = srng.state_updates[0][0]
    assert list(updates.keys()) == [state]
    f = theano.function([], out, updates=updates)
    ns = NpStream(state)
    want = np.cumprod(np.stack([ns.uniform((2,)) for _ in range(6)]), axis=0)[1::2]
    np.testing.assert_allclose(f(), want, **TOL)
    np.testing.assert_array_equal(state.get_value(), ns.state)


def test_two_inner_scans_on_one_stream_without_returned_updates_is_an_error():
    srng = RandomStreams(seed=29)

    def outer_step(h):
        a, _ = theano.scan(lambda x: x + srng.uniform((2,)), outputs_info=h, n_steps=2)
        b, _ = theano.scan(lambda x: x - srng.uniform((2,)), outputs_info=a[-1], n_steps=2)
        return b[-1]

    # two draws, two streams: each inner loop threads its own, so this is fine
    out, updates = theano.scan(outer_step, outputs_info=T.zeros((2,), dtype=floatX), n_steps=2)
    assert len(updates) == 2
    rv = srng.uniform((2,))

    def shared_stream_step(h):
        a, _ = theano.scan(lambda x: x + rv, outputs_info=h, n_steps=2)
        b, _ = theano.scan(lambda x: x - rv, outputs_info=a[-1], n_steps=2)
        return b[-1]

    with pytest.raises(ValueError, match="inner loops of the step update"):
        theano.scan(shared_stream_step, outputs_info=T.zeros((2,), dtype=floatX), n_steps=2)
