"""symgpu's side of benchmarks/half.py: each workload's training step written as a float32
program (float32 shared parameters, the user's own spelling), compiled with the mixed-precision
policy given by ``compile_kw`` (see half.py), so the rewrites put the products in bfloat16.

Each builder returns ``(step, sync, loss_fn)``: ``step()`` runs one training step (updates of
shared variables, no outputs), ``loss_fn()`` the current loss (host float, for convergence).
"""
from __future__ import annotations

import numpy as np

from half_models import GPT, LR, LSTM, adamw_hyper, gpt_params, lenet_data, lstm_data, mlp_data


def _lib():
    import symgpu
    import symgpu.tensor as T
    return symgpu, T


def _sync():
    """The default GPU context's synchronize (a no-op where the step ran on the CPU)."""
    import symgpu
    if not str(symgpu.config.device).startswith("cuda"):
        return lambda: None
    from symgpu.gpu.runtime.context import get_context
    return get_context(None).synchronize


def _compile(symgpu, loss, updates, compile_kw: dict):
    step = symgpu.function([], [], updates=updates, **compile_kw)
    loss_fn = symgpu.function([], loss, **compile_kw)
    return step, (lambda: float(loss_fn()))


def _sgd(T, loss, params):
    return [(p, p - np.float32(LR) * g) for p, g in zip(params, T.grad(loss, params))]


def _adamw(symgpu, T, loss, params):
    """AdamW as users write it: float32 moments, bias correction from a step counter."""
    b1, b2, eps, wd = (np.float32(v) for v in adamw_hyper())
    lr = np.float32(LR)
    t = symgpu.shared(np.float32(0), name="t")
    t1 = t + 1
    updates = [(t, t1)]
    c1, c2 = 1 - b1 ** t1, 1 - b2 ** t1
    for p, g in zip(params, T.grad(loss, params)):
        z = np.zeros(p.get_value(borrow=True).shape, "float32")
        m, v = symgpu.shared(z), symgpu.shared(z.copy())
        m1 = b1 * m + (1 - b1) * g
        v1 = b2 * v + (1 - b2) * g * g
        updates += [(m, m1), (v, v1),
                    (p, p * (1 - lr * wd) - lr * (m1 / c1) / (T.sqrt(v1 / c2) + eps))]
    return updates


def _xent(T, logits, labels):
    lp = T.nnet.logsoftmax(logits)
    return -T.mean(lp[T.arange(labels.shape[0]), labels])


def mlp(compile_kw: dict):
    symgpu, T = _lib()
    Ws, bs, X, labels = mlp_data()
    sW = [symgpu.shared(W) for W in Ws]
    sb = [symgpu.shared(b) for b in bs]
    x, y = symgpu.shared(X, name="x"), symgpu.shared(labels, name="y")
    h = x
    for k in range(len(sW)):
        h = T.dot(h, sW[k]) + sb[k]
        if k < len(sW) - 1:
            h = T.maximum(h, 0)
    loss = _xent(T, h, y)
    return _compile(symgpu, loss, _sgd(T, loss, sW + sb), compile_kw) + (_sync(),)


def lenet(compile_kw: dict):
    symgpu, T = _lib()
    from symgpu.tensor.nnet import conv2d
    from symgpu.tensor.signal.pool import pool_2d
    x0, y0, params = lenet_data()
    x, y = symgpu.shared(x0, name="x"), symgpu.shared(y0, name="y")
    ps = [symgpu.shared(p.copy()) for p in params]
    w1, b1, w2, b2, w3, b3, w4, b4 = ps
    h = pool_2d(T.tanh(conv2d(x, w1) + b1.dimshuffle("x", 0, "x", "x")), (2, 2),
                ignore_border=True)
    h = pool_2d(T.tanh(conv2d(h, w2) + b2.dimshuffle("x", 0, "x", "x")), (2, 2),
                ignore_border=True)
    h = T.tanh(T.dot(h.flatten(2), w3) + b3)
    loss = _xent(T, T.dot(h, w4) + b4, y)
    return _compile(symgpu, loss, _sgd(T, loss, ps), compile_kw) + (_sync(),)


def lstm(compile_kw: dict):
    """The LSTM as the deeplearning.net tutorial writes it: gates sliced from one product."""
    symgpu, T = _lib()
    W0, U0, b0, x0, y0 = lstm_data()
    W, U, b = (symgpu.shared(a, name=n) for a, n in ((W0, "W"), (U0, "U"), (b0, "b")))
    x, y = symgpu.shared(x0, name="x"), symgpu.shared(y0, name="y")
    n = LSTM.hidden

    def step(x_t, h_prev, c_prev):
        z = T.dot(x_t, W) + T.dot(h_prev, U) + b
        i = T.nnet.sigmoid(z[:, :n])
        f = T.nnet.sigmoid(z[:, n:2 * n])
        o = T.nnet.sigmoid(z[:, 2 * n:3 * n])
        c = f * c_prev + i * T.tanh(z[:, 3 * n:])
        return o * T.tanh(c), c
    z0 = T.zeros((LSTM.batch, n), dtype="float32")
    (hs, _), _ = symgpu.scan(step, sequences=x, outputs_info=[z0, z0])
    loss = T.mean((hs[-1] - y) ** 2)
    return _compile(symgpu, loss, _sgd(T, loss, [W, U, b]), compile_kw) + (_sync(),)


def _layer_norm(T, a, g, b, eps=1e-5):
    mu = a.mean(axis=-1, keepdims=True)
    var = T.sqr(a - mu).mean(axis=-1, keepdims=True)
    return (a - mu) / T.sqrt(var + eps) * g + b


def _gelu_tanh(T, a):
    return 0.5 * a * (1 + T.tanh(np.float32(np.sqrt(2 / np.pi)) * (a + np.float32(0.044715) * a ** 3)))


def gpt(compile_kw: dict):
    """One pre-norm block; attention spelled as users write it (scores scaled, a causal mask
    added, softmax over the last axis), for the attention rewrite to recognise."""
    symgpu, T = _lib()
    P0, x0, y0 = gpt_params()
    P = {k: symgpu.shared(v, name=k) for k, v in P0.items()}
    x, y = symgpu.shared(x0, name="x"), symgpu.shared(y0, name="y")
    B, S, D, H = GPT.batch, GPT.seq, GPT.d_model, GPT.heads
    hd = D // H
    causal = np.where(np.tril(np.ones((S, S), bool)), 0, -np.inf).astype("float32")
    a = _layer_norm(T, x, P["ln1_g"], P["ln1_b"])
    qkv = T.dot(a, P["w_qkv"]) + P["b_qkv"]

    def heads(t):
        return t.reshape((B, S, H, hd)).dimshuffle(0, 2, 1, 3)
    q, k, v = (heads(qkv[:, :, j * D:(j + 1) * D]) for j in range(3))
    scores = T.matmul(q, k.dimshuffle(0, 1, 3, 2)) * np.float32(1 / np.sqrt(hd)) + causal
    o = T.matmul(T.nnet.softmax(scores, axis=-1), v)
    o = o.dimshuffle(0, 2, 1, 3).reshape((B, S, D))
    h = x + T.dot(o, P["w_o"]) + P["b_o"]
    a = _layer_norm(T, h, P["ln2_g"], P["ln2_b"])
    m = T.dot(_gelu_tanh(T, T.dot(a, P["w_fc"]) + P["b_fc"]), P["w_proj"]) + P["b_proj"]
    loss = T.mean(T.sqr(h + m - y))
    return _compile(symgpu, loss, _adamw(symgpu, T, loss, list(P.values())),
                    compile_kw) + (_sync(),)


BUILDERS = {"mlp": mlp, "lenet": lenet, "lstm": lstm, "gpt": gpt}
