"""benchmarks/rnn.py's peers for the cell matrix, each written the way its own users write
it: PyTorch's cuDNN nn.LSTM/nn.GRU/nn.RNN, eager (masked rows through pack_padded_sequence)
and as one CUDA graph per step shape (masked rows through a gather of each row's last state),
torch.compile of one step in a Python loop over time, and JAX's lax.scan under jit (arrays
as arguments, parameters donated, lengths padded to a bucket). Every builder takes the
row's Spec, its initial weights and data (rnn_cells) and returns a contender dict, or
raises with the reason it cannot run (the caller prints it and goes on)."""
from __future__ import annotations

import time

import numpy as np
import rnn_cells as rc
from symgpu.tensor.nnet.pad_steps import bucket_length

#: a new length is padded up to its bucket (one CUDA graph or one trace per bucket): the
#: buckets symgpu pads to (symgpu.tensor.nnet.pad_steps.bucket_length, dnn_rnn_match.BUCKET),
#: so the peers run the same padded steps
BUCKET = 8


def _padded(spec, L: int) -> int:
    """The length a call of length L runs at: its bucket (at most the data's length)."""
    return min(bucket_length(L, BUCKET), spec.lmax) if spec.var else L


def _torch(device: str):
    import torch
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("PyTorch sees no GPU")
    return torch


def _sync(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def _torch_arrays(torch, device, arrays):
    return tuple(torch.from_numpy(a).to(device) for a in arrays)


def torch_loss(torch, spec, hs, h_last, y, y_last, m):
    return rc.loss_of(None, spec, hs, h_last, y, y_last, m)


# -- cuDNN ----------------------------------------------------------------------------------------

CUDNN_CELLS = {"lstm": "LSTM", "gru": "GRU", "elman": "RNN"}


def _cudnn_order(spec, a):
    """Our gate blocks in PyTorch's order: the LSTM tutorial's i, f, o, c -> i, f, g, o; the
    GRU is r, z, n in both."""
    if spec.cell != "lstm":
        return a
    H = spec.hidden
    blocks = [a[..., k * H:(k + 1) * H] for k in range(4)]
    return np.concatenate([blocks[0], blocks[1], blocks[3], blocks[2]], axis=-1)


def _cudnn_net(torch, spec, params, device):
    """nn.LSTM / nn.GRU / nn.RNN (tanh) holding the row's weights (cuDNN's gate order)."""
    if spec.cell not in CUDNN_CELLS:
        raise RuntimeError(f"no cuDNN kernel for a {spec.cell} cell")
    mod = getattr(torch.nn, CUDNN_CELLS[spec.cell])
    kw = {"nonlinearity": "tanh"} if spec.cell == "elman" else {}
    net = mod(spec.inp, spec.hidden, **kw).to(device)
    with torch.no_grad():
        net.weight_ih_l0.copy_(torch.from_numpy(_cudnn_order(spec, params["W"]).T.copy()))
        net.weight_hh_l0.copy_(torch.from_numpy(_cudnn_order(spec, params["U"]).T.copy()))
        net.bias_ih_l0.copy_(torch.from_numpy(_cudnn_order(spec, params["b"])))
        net.bias_hh_l0.zero_()
    return net


def _zero_states(torch, spec, device):
    z = torch.zeros(1, spec.batch, spec.hidden, device=device)
    return (z, z.clone()) if rc.n_states(spec.cell) == 2 else z


def cudnn(spec, params, arrays, device="cuda") -> dict:
    """nn.LSTM / nn.GRU / nn.RNN (tanh) in eager mode: cuDNN's fused kernels on the GPU.
    Masked rows go through pack_padded_sequence (lengths on the host, unsorted), so each row
    stops at its own end: h_n is each row's last state, the padded outputs are zero."""
    torch = _torch(device)
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    net = _cudnn_net(torch, spec, params, device)
    opt = torch.optim.SGD(net.parameters(), lr=float(rc.LR))
    x, y, y_last = _torch_arrays(torch, device, arrays)
    ns = rc.n_states(spec.cell)
    h0 = _zero_states(torch, spec, device)

    def call(L, mask, lens):
        opt.zero_grad(set_to_none=True)
        if spec.masked:
            m = torch.from_numpy(mask).to(device, non_blocking=True)
            packed = pack_padded_sequence(x[:L], torch.from_numpy(lens), enforce_sorted=False)
            out, hn = net(packed, h0)
            hs = pad_packed_sequence(out, total_length=L)[0] if spec.loss == "all" else None
        else:
            m = None
            hs, hn = net(x[:L], h0)
        h_last = (hn[0] if ns == 2 else hn)[0]
        loss = torch_loss(torch, spec, hs, h_last, y[:L], y_last, m)
        loss.backward()
        opt.step()
        _sync(torch, device)
        return loss
    prec = "tf32" if device == "cuda" and torch.backends.cudnn.allow_tf32 else "fp32"
    return {"name": f"PyTorch cuDNN nn.{CUDNN_CELLS[spec.cell]}, eager", "call": call,
            "precision": prec, "compile": 0.0}


def cudnn_graphed(spec, params, arrays, device="cuda") -> dict:
    """The same module as PyTorch's experts run a training step of fixed shapes: forward,
    backward and the SGD update captured as one CUDA graph (torch.cuda.graph) and replayed.
    pack_padded_sequence cannot be captured (its lengths live on the host), so a masked row
    runs to the padded length and each row's last state is gathered at its own length - 1 (a
    state does not depend on later steps: this equals the masked cell), and the all-states
    loss multiplies by the mask. A new length is padded up to its bucket (_padded: one graph
    per bucket, all captured before timing, as JAX's buckets are compiled)."""
    if device != "cuda":
        raise RuntimeError("a whole-step CUDA graph needs the GPU")
    torch = _torch(device)
    net = _cudnn_net(torch, spec, params, device)
    opt = torch.optim.SGD(net.parameters(), lr=float(rc.LR))
    x, y, y_last = _torch_arrays(torch, device, arrays)
    B = spec.batch
    h0 = _zero_states(torch, spec, device)
    use_mask = spec.masked or spec.var
    pad = lambda L: _padded(spec, L)  # noqa: E731
    last = torch.zeros(B, dtype=torch.long, device=device)       # the graphs' inputs
    mask = torch.zeros(spec.lmax, B, device=device)
    rows = torch.arange(B, device=device)
    graphs: dict = {}

    def step(Lb):
        opt.zero_grad(set_to_none=False)
        hs, _ = net(x[:Lb], h0)
        loss = torch_loss(torch, spec, hs, hs[last, rows], y[:Lb], y_last,
                          mask[:Lb] if use_mask else None)
        loss.backward()
        opt.step()
        return loss

    def capture(Lb):
        """Warm up on a side stream, capture, and put the weights back as they were. The
        last-state indices are zeroed first: the previous call's may be past this bucket's
        length (each call writes its own before the replay)."""
        last.zero_()
        saved = [p.detach().clone() for p in net.parameters()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step(Lb)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = step(Lb)
        with torch.no_grad():
            for p, v in zip(net.parameters(), saved):
                p.copy_(v)
        graphs[Lb] = (g, out)

    def call(L, m, lens):
        Lb = pad(L)
        if Lb not in graphs:
            capture(Lb)
        idx = (lens - 1) if spec.masked else np.full(B, L - 1)
        last.copy_(torch.from_numpy(np.ascontiguousarray(idx, dtype="int64")))
        if use_mask:
            mm = np.zeros((Lb, B), "float32")
            mm[:L] = 1.0 if m is None else m
            mask[:Lb].copy_(torch.from_numpy(mm))
        g, out = graphs[Lb]
        g.replay()
        _sync(torch, device)
        return out

    def warm_buckets():
        """Capture every bucket's graph before timing; returns the seconds."""
        t0 = time.perf_counter()
        lengths = range(spec.var_range[0], spec.var_range[1] + 1) if spec.var else [spec.fixed]
        for Lb in sorted({pad(L) for L in lengths}):
            if Lb not in graphs:
                capture(Lb)
        _sync(torch, device)
        return time.perf_counter() - t0
    prec = "tf32" if torch.backends.cudnn.allow_tf32 else "fp32"
    name = f"PyTorch cuDNN nn.{CUDNN_CELLS[spec.cell]}, whole step as a CUDA graph"
    if spec.var:
        name += ", buckets as symgpu's"
    return {"name": name, "call": call, "precision": prec, "compile": None,
            "warm": warm_buckets}


# -- torch.compile of the step ------------------------------------------------------------------

def torch_compiled(spec, params, arrays, device="cuda", compile_=True) -> dict:
    """The step (rnn_cells.make_step, PyTorch's names) under torch.compile (mode default):
    one compile serves every length since the step's shapes never change; Python runs the
    loop over time and autograd the backward (AOTAutograd compiles the step's backward too).
    The compile is paid on the first call (reported as compile); only warm calls are timed.
    The dropout draw is torch.rand inside the compiled step."""
    torch = _torch(device)
    T = rc.array_ns(torch, torch.sigmoid)
    cell = rc.make_step(spec.cell, spec.hidden, T)
    names = list(params)
    ps = [torch.from_numpy(params[k].copy()).to(device).requires_grad_() for k in names]
    x, y, y_last = _torch_arrays(torch, device, arrays)
    ns = rc.n_states(spec.cell)

    def step(x_t, m_t, states, *pv):
        drop = None
        if spec.cell == "droplstm":
            drop = (torch.rand_like(states[0]) < rc.KEEP).to(states[0].dtype) / rc.KEEP
        return cell(dict(zip(names, pv)), x_t, m_t, states, drop)
    fstep = torch.compile(step) if compile_ else step

    def call(L, mask, lens):
        m = torch.from_numpy(mask).to(device, non_blocking=True) if spec.masked else None
        states = tuple(torch.zeros(spec.batch, spec.hidden, device=device) for _ in range(ns))
        hs = []
        for t in range(L):
            states = fstep(x[t], None if m is None else m[t], states, *ps)
            hs.append(states[0])
        loss = torch_loss(torch, spec, torch.stack(hs) if spec.loss == "all" else None,
                          states[0], y[:L], y_last, m)
        grads = torch.autograd.grad(loss, ps)
        with torch.no_grad():
            torch._foreach_add_(ps, grads, alpha=-float(rc.LR))
        _sync(torch, device)
        return loss
    prec = "tf32" if device == "cuda" and torch.backends.cuda.matmul.allow_tf32 else "fp32"
    return {"name": "torch.compile step, Python loop" if compile_ else "PyTorch Python loop",
            "call": call, "precision": prec, "compile": None}


def torch_reference(spec, params, arrays, calls) -> list[float]:
    """The losses of the first calls in float64 PyTorch on the CPU (autograd, SGD): the
    second loss checks the gradient too."""
    import torch
    T = rc.array_ns(torch, torch.sigmoid)
    cell = rc.make_step(spec.cell, spec.hidden, T)
    ps = {k: torch.from_numpy(v.astype("float64")).requires_grad_() for k, v in params.items()}
    x, y, y_last = (torch.from_numpy(a.astype("float64")) for a in arrays)
    out = []
    for L, mask, _ in calls:
        m = torch.from_numpy(mask.astype("float64")) if mask is not None else None
        states = tuple(torch.zeros(spec.batch, spec.hidden, dtype=torch.float64)
                       for _ in range(rc.n_states(spec.cell)))
        hs = []
        for t in range(L):
            states = cell(ps, x[t], None if m is None else m[t], states, None)
            hs.append(states[0])
        loss = torch_loss(torch, spec, torch.stack(hs), states[0], y[:L], y_last, m)
        grads = torch.autograd.grad(loss, list(ps.values()))
        with torch.no_grad():
            for p, g in zip(ps.values(), grads):
                p -= float(rc.LR) * g
        out.append(float(loss.detach()))
    return out


# -- JAX ------------------------------------------------------------------------------------------

def jax_scan(spec, params, arrays, precision="default", device="cuda") -> dict:
    """lax.scan under jit, as JAX users write it: the parameters, data, mask and PRNG key
    are arguments (parameters and key donated: updated in place), the step is the same cell.
    A new length is padded up to its bucket (_padded) with the mask zero on the padding (so
    the state stays put and the loss ignores it): one trace per bucket, not per length;
    every bucket is compiled before timing (compile reports them all). Fixed, unmasked rows
    run without a mask. `precision` "default" (TF32 products on the GPU) or "highest"."""
    import jax
    import jax.numpy as jnp
    if device == "cuda" and jax.default_backend() != "gpu":
        raise RuntimeError(f"JAX's backend is {jax.default_backend()}, not gpu")
    T = rc.array_ns(jnp, jax.nn.sigmoid)
    cell = rc.make_step(spec.cell, spec.hidden, T)
    ns = rc.n_states(spec.cell)
    use_mask = spec.masked or spec.var
    x_np, y_np, yl_np = arrays
    pad = lambda L: _padded(spec, L)  # noqa: E731
    xs, ys = {}, {}
    lengths = range(spec.var_range[0], spec.var_range[1] + 1) if spec.var else [spec.fixed]
    for Lb in sorted({pad(L) for L in lengths}):
        xs[Lb], ys[Lb] = jnp.asarray(x_np[:Lb]), jnp.asarray(y_np[:Lb])
    y_last = jnp.asarray(yl_np)

    def loss_fn(p, x, y, m, key):
        def body(carry, inp):
            states, key = carry
            x_t, m_t = inp if use_mask else (inp, None)
            drop = None
            if spec.cell == "droplstm":
                key, sub = jax.random.split(key)
                drop = jax.random.bernoulli(sub, rc.KEEP, states[0].shape).astype(
                    jnp.float32) / rc.KEEP
            states = cell(p, x_t, m_t, states, drop)
            return (states, key), states[0]
        init = tuple(jnp.zeros((spec.batch, spec.hidden), jnp.float32) for _ in range(ns))
        (states, key), hs = jax.lax.scan(body, (init, key), (x, m) if use_mask else x)
        return rc.loss_of(T, spec, hs, states[0], y, y_last, m if use_mask else None), key

    def train(p, key, x, y, m):
        with jax.default_matmul_precision(precision):
            (loss, key), g = jax.value_and_grad(loss_fn, has_aux=True)(p, x, y, m, key)
        return jax.tree_util.tree_map(lambda a, b: a - rc.LR * b, p, g), key, loss
    jtrain = jax.jit(train, donate_argnums=(0, 1))
    state = {"p": {k: jnp.asarray(v) for k, v in params.items()},
             "key": jax.random.PRNGKey(rc.SEED)}

    def call(L, mask, lens):
        Lb = pad(L)
        m = None
        if use_mask:
            m = np.zeros((Lb, spec.batch), "float32")
            m[:L] = 1.0 if mask is None else mask
        state["p"], state["key"], loss = jtrain(state["p"], state["key"], xs[Lb], ys[Lb], m)
        loss.block_until_ready()
        return loss

    def warm_buckets():
        """Compile every bucket (a JAX user's compile-ahead); returns the seconds."""
        t0 = time.perf_counter()
        for Lb in xs:
            call(Lb, None if not spec.masked else np.ones((Lb, spec.batch), "float32"), None)
        return time.perf_counter() - t0
    name = "JAX lax.scan (jit)" + ("" if precision == "default" else f", {precision}")
    if spec.var:
        name += ", buckets as symgpu's"
    prec = "tf32" if precision == "default" and device == "cuda" else "fp32"
    return {"name": name, "call": call, "precision": prec, "compile": None,
            "warm": warm_buckets}
