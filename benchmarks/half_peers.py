"""The peers of benchmarks/half.py: each workload's bf16 mixed-precision training step in
PyTorch and JAX, written as their users write it.

PyTorch: float32 parameters and optimiser, the forward under ``torch.autocast("cuda",
torch.bfloat16)`` (products and convolutions in bf16 on the tensor cores, reductions and the
loss in float32), as three contenders of which the report keeps the best: eager, the loss and
backward under ``torch.compile`` (default mode), and ``torch.compile(mode="max-autotune")``
of the whole step (forward, backward and optimiser fused and replayed as a CUDA graph).
JAX: float32 parameters cast to bf16 inside the jitted step (the policy of jmp / Flax's
``dtype=bfloat16``), the loss in float32, the whole step (grad and update) one ``jit`` with
the parameters and optimiser state donated.

Each builder returns contenders ``(name, step, sync)``; ``step()`` runs one training step.
"""
from __future__ import annotations

import numpy as np

#: also time torch.compile(mode="max-autotune") of the whole step (its compile takes minutes;
#: half.py --max-autotune)
MAX_AUTOTUNE = False

from half_models import (GPT, LENET_SHAPES, LR, LSTM, MLP, adamw_hyper, gpt_params,
                         lenet_data, lstm_data, mlp_data)

# ============================================================================ PyTorch


def _torch():
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return torch


def _torch_contenders(torch, params, loss_fn, opt_kind: str, compile_: bool) -> list:
    """Eager autocast, compiled loss, and the whole step compiled (max-autotune: CUDA graphs)."""
    sync = torch.cuda.synchronize
    if opt_kind == "adamw":
        b1, b2, eps, wd = adamw_hyper()
        opt = torch.optim.AdamW(params, lr=LR, betas=(b1, b2), eps=eps, weight_decay=wd,
                                fused=True)
    else:
        opt = torch.optim.SGD(params, lr=LR)

    def autocast_loss():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return loss_fn()

    def make(fn):
        def step():
            opt.zero_grad(set_to_none=True)
            fn().backward()
            opt.step()
        return step
    out = [("PyTorch eager autocast", make(autocast_loss), sync)]
    if compile_:
        out.append(("torch.compile autocast", make(torch.compile(autocast_loss)), sync))
    if compile_ and MAX_AUTOTUNE:
        @torch.compile(mode="max-autotune")
        def whole():
            opt.zero_grad(set_to_none=True)
            autocast_loss().backward()
            opt.step()
        out.append(("torch.compile step (max-autotune)", whole, sync))
    return out


def torch_mlp(compile_: bool = True) -> list:
    torch = _torch()
    import torch.nn.functional as F
    Ws, bs, X, labels = mlp_data()
    dev = "cuda"
    ps = [torch.tensor(a, device=dev, requires_grad=True) for a in Ws + bs]
    x, y = torch.tensor(X, device=dev), torch.tensor(labels, device=dev)
    n = len(Ws)

    def loss():
        h = x
        for k in range(n):
            h = h @ ps[k] + ps[n + k]
            if k < n - 1:
                h = torch.relu(h)
        return F.cross_entropy(h.float(), y)
    return _torch_contenders(torch, ps, loss, "sgd", compile_)


def torch_lenet(compile_: bool = True) -> list:
    torch = _torch()
    import torch.nn.functional as F
    x0, y0, params = lenet_data()
    dev = "cuda"
    ps = [torch.tensor(p, device=dev, requires_grad=True) for p in params]
    x, y = torch.tensor(x0, device=dev), torch.tensor(y0, device=dev)

    def loss():
        w1, b1, w2, b2, w3, b3, w4, b4 = ps
        h = F.max_pool2d(torch.tanh(F.conv2d(x, w1.flip(2, 3), b1)), 2)
        h = F.max_pool2d(torch.tanh(F.conv2d(h, w2.flip(2, 3), b2)), 2)
        h = torch.tanh(h.flatten(1) @ w3 + b3)
        return F.cross_entropy((h @ w4 + b4).float(), y)
    return _torch_contenders(torch, ps, loss, "sgd", compile_)


def torch_lstm(compile_: bool = True) -> list:
    """cuDNN's nn.LSTM under autocast (bf16 weights copies, float32 states inside cuDNN)."""
    torch = _torch()
    W, U, b, x0, y0 = lstm_data()
    dev = "cuda"
    net = torch.nn.LSTM(LSTM.inp, LSTM.hidden).to(dev)
    h = LSTM.hidden

    def order(a):   # ours: i f o c (rnn_cells); cuDNN: i f g o
        i, f, o, c = (a[..., k * h:(k + 1) * h] for k in range(4))
        return np.concatenate([i, f, c, o], axis=-1)
    with torch.no_grad():
        net.weight_ih_l0.copy_(torch.from_numpy(order(W).T.copy()))
        net.weight_hh_l0.copy_(torch.from_numpy(order(U).T.copy()))
        net.bias_ih_l0.copy_(torch.from_numpy(order(b)))
        net.bias_hh_l0.zero_()
    x, y = torch.tensor(x0, device=dev), torch.tensor(y0, device=dev)

    def loss():
        _, (hn, _) = net(x)
        return ((hn[0].float() - y) ** 2).mean()
    # nn.LSTM's cuDNN call does not trace into torch.compile usefully; eager is its best
    return _torch_contenders(torch, list(net.parameters()), loss, "sgd", False)


def torch_gpt(compile_: bool = True) -> list:
    """One pre-norm GPT block: LayerNorm, fused QKV, causal scaled_dot_product_attention
    (flash backend in bf16), output projection, LayerNorm, MLP 4x with GELU; AdamW (fused)."""
    torch = _torch()
    import torch.nn.functional as F
    P, x0, y0 = gpt_params()
    dev = "cuda"
    names = list(P)
    ps = {k: torch.tensor(v, device=dev, requires_grad=True) for k, v in P.items()}
    x, y = torch.tensor(x0, device=dev), torch.tensor(y0, device=dev)
    B, S, D, H = GPT.batch, GPT.seq, GPT.d_model, GPT.heads

    def loss():
        p = ps
        a = F.layer_norm(x, (D,), p["ln1_g"], p["ln1_b"])
        qkv = a @ p["w_qkv"] + p["b_qkv"]
        q, k, v = (t.reshape(B, S, H, D // H).transpose(1, 2) for t in qkv.split(D, dim=-1))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = o.transpose(1, 2).reshape(B, S, D)
        h = x + o @ p["w_o"] + p["b_o"]
        a = F.layer_norm(h, (D,), p["ln2_g"], p["ln2_b"])
        m = F.gelu(a @ p["w_fc"] + p["b_fc"], approximate="tanh") @ p["w_proj"] + p["b_proj"]
        out = h + m
        return ((out.float() - y) ** 2).mean()
    return _torch_contenders(torch, [ps[k] for k in names], loss, "adamw", compile_)


# ============================================================================ JAX


def _jax():
    import jax
    return jax


def _jax_contender(jax, loss, params: list, opt_kind: str, batch: tuple) -> list:
    """The whole step jitted, parameters and optimiser state donated; bf16 inside `loss`."""
    import jax.numpy as jnp
    if opt_kind == "adamw":
        b1, b2, eps, wd = adamw_hyper()

        def update(ps, st, t, g):
            m, v = st
            t = t + 1
            m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, g)]
            v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, g)]
            c1, c2 = 1 - b1 ** t, 1 - b2 ** t
            ps = [p * (1 - LR * wd) - LR * (mi / c1) / (jnp.sqrt(vi / c2) + eps)
                  for p, mi, vi in zip(ps, m, v)]
            return ps, (m, v), t
        state = ([jnp.zeros_like(p) for p in params], [jnp.zeros_like(p) for p in params])
    else:
        def update(ps, st, t, g):
            return [p - LR * gi for p, gi in zip(ps, g)], st, t
        state = ()

    def step_(ps, st, t, *data):
        g = jax.grad(loss)(ps, *data)
        return update(ps, st, t, g)
    step_jit = jax.jit(step_, donate_argnums=(0, 1))
    data = [jnp.asarray(a) for a in batch]
    box = {"ps": [jnp.asarray(p) for p in params], "st": state, "t": jnp.zeros((), "float32")}

    def step():
        box["ps"], box["st"], box["t"] = step_jit(box["ps"], box["st"], box["t"], *data)

    def sync():
        jax.block_until_ready(box["ps"])
    return [("JAX jit bf16", step, sync)]


def jax_mlp() -> list:
    jax = _jax()
    import jax.numpy as jnp
    Ws, bs, X, labels = mlp_data()
    n = len(Ws)
    bf = jnp.bfloat16

    def loss(ps, x, y):
        h = x.astype(bf)
        for k in range(n):
            h = h @ ps[k].astype(bf) + ps[n + k].astype(bf)
            if k < n - 1:
                h = jax.nn.relu(h)
        lp = jax.nn.log_softmax(h.astype(jnp.float32))
        return -jnp.mean(lp[jnp.arange(lp.shape[0]), y])
    return _jax_contender(jax, loss, Ws + bs, "sgd", (X, labels))


def jax_lenet() -> list:
    jax = _jax()
    import jax.numpy as jnp
    x0, y0, params = lenet_data()
    bf = jnp.bfloat16

    def conv(a, w):
        return jax.lax.conv_general_dilated(a, w[:, :, ::-1, ::-1].astype(bf), (1, 1), "VALID")

    def pool(a):
        # the init a Python scalar, as flax's max_pool: the GPU machine's JAX differentiates
        # reduce_window only with a constant init ("Linearization failed" for an array)
        return jax.lax.reduce_window(a, -jnp.inf, jax.lax.max,
                                     (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def loss(ps, xb, yb):
        w1, b1, w2, b2, w3, b3, w4, b4 = ps
        h = pool(jnp.tanh(conv(xb.astype(bf), w1) + b1.astype(bf)[:, None, None]))
        h = pool(jnp.tanh(conv(h, w2) + b2.astype(bf)[:, None, None]))
        h = jnp.tanh(h.reshape(h.shape[0], -1) @ w3.astype(bf) + b3.astype(bf))
        lg = (h @ w4.astype(bf) + b4.astype(bf)).astype(jnp.float32)
        return -jnp.mean(jax.nn.log_softmax(lg)[jnp.arange(lg.shape[0]), yb])
    return _jax_contender(jax, loss, list(params), "sgd", (x0, y0))


def jax_lstm() -> list:
    jax = _jax()
    import jax.numpy as jnp
    W, U, b, x0, y0 = lstm_data()
    bf = jnp.bfloat16
    h = LSTM.hidden

    def loss(ps, xs, y):
        W_, U_, b_ = (p.astype(bf) for p in ps)
        xw = (xs.astype(bf) @ W_ + b_)            # the input projection of every step at once

        def cell(carry, xw_t):
            hp, cp = carry
            z = (xw_t + hp.astype(bf) @ U_).astype(jnp.float32)
            i, f, o = (jax.nn.sigmoid(z[:, k * h:(k + 1) * h]) for k in range(3))
            c = f * cp + i * jnp.tanh(z[:, 3 * h:])
            return (o * jnp.tanh(c), c), None
        z0 = jnp.zeros((LSTM.batch, h), jnp.float32)
        (hn, _), _ = jax.lax.scan(cell, (z0, z0), xw)
        return jnp.mean((hn - y) ** 2)
    return _jax_contender(jax, loss, [W, U, b], "sgd", (x0, y0))


def jax_gpt() -> list:
    """Both of JAX's attention implementations: cuDNN's fused kernel and XLA's."""
    return _jax_gpt("cudnn") + _jax_gpt("xla")


def _jax_gpt(implementation: str) -> list:
    jax = _jax()
    import jax.numpy as jnp
    P, x0, y0 = gpt_params()
    names = list(P)
    B, S, D, H = GPT.batch, GPT.seq, GPT.d_model, GPT.heads
    bf = jnp.bfloat16

    def ln(a, g, b_):
        a32 = a.astype(jnp.float32)
        mu = a32.mean(-1, keepdims=True)
        var = ((a32 - mu) ** 2).mean(-1, keepdims=True)
        return ((a32 - mu) * jax.lax.rsqrt(var + 1e-5) * g + b_).astype(bf)

    def loss(ps, x, y):
        p = dict(zip(names, ps))
        c = {k: v.astype(bf) for k, v in p.items()}
        a = ln(x, p["ln1_g"], p["ln1_b"])
        qkv = a @ c["w_qkv"] + c["b_qkv"]
        q, k, v = (t.reshape(B, S, H, D // H) for t in jnp.split(qkv, 3, axis=-1))
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)
        o = o.reshape(B, S, D)
        hh = x.astype(bf) + o @ c["w_o"] + c["b_o"]
        a = ln(hh, p["ln2_g"], p["ln2_b"])
        m = jax.nn.gelu(a @ c["w_fc"] + c["b_fc"], approximate=True) @ c["w_proj"] + c["b_proj"]
        out = (hh + m).astype(jnp.float32)
        return jnp.mean((out - y) ** 2)
    out = _jax_contender(jax, loss, [P[k] for k in names], "adamw", (x0, y0))
    return [(f"JAX jit bf16 ({implementation} attention)", s, y_) for _, s, y_ in out]


TORCH = {"mlp": torch_mlp, "lenet": torch_lenet, "lstm": torch_lstm, "gpt": torch_gpt}
JAX = {"mlp": jax_mlp, "lenet": jax_lenet, "lstm": jax_lstm, "gpt": jax_gpt}
SHAPES_USED = (MLP, LENET_SHAPES, LSTM, GPT)
