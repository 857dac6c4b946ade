"""The recurrent cells of benchmarks/rnn.py, written once in the spelling Theano users write
(`T.dot`, `T.nnet.sigmoid`, gates sliced from one fused product as in the deeplearning.net
LSTM tutorial, the mask applied as ``m[:, None] * h + (1 - m)[:, None] * h_prev``), so that
symgpu, PyTensor, NumPy, PyTorch and JAX all run the same arithmetic: each passes its own
module as `T` (the shims below give the array libraries the few names Theano spells its way).

Row keys: ``{cell}-{masked|unmasked}-{last|all}-b{batch}-h{hidden}-{fixed|var}``. The loss is
the mean squared error of the last state (`h[-1]`: with a mask, each row's state at its own
end) or of every state (with a mask, over each row's own steps, as the tutorial's mean
pooling weighs them) against a fixed target; one call is forward, BPTT and SGD on every
weight."""
from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import time
import types
import warnings

import numpy as np

CELLS = ("elman", "lstm", "gru", "peephole", "lnlstm", "droplstm")
GATES = {"elman": 1, "lstm": 4, "gru": 3, "peephole": 4, "lnlstm": 4, "droplstm": 4}
IN = 128                      # input width of every row
FIXED = 50                    # "fixed length 50"
VAR = (10, 90)                # "a new length every call (uniform in 10..90, seeded)"
LR = np.float32(0.01)
KEEP = 0.9                    # dropout: probability of keeping a unit
EPS = 1e-5                    # layer norm epsilon
SEED = 1234


@dataclasses.dataclass(frozen=True)
class Spec:
    cell: str
    masked: bool
    loss: str                 # "last" or "all"
    batch: int
    hidden: int
    var: bool                 # a new length every call
    inp: int = IN
    fixed: int = FIXED
    var_range: tuple = VAR

    @property
    def key(self) -> str:
        return (f"{self.cell}-{'masked' if self.masked else 'unmasked'}-{self.loss}"
                f"-b{self.batch}-h{self.hidden}-{'var' if self.var else 'fixed'}")

    @property
    def lmax(self) -> int:
        return self.var_range[1] if self.var else self.fixed

    def shrunk(self) -> "Spec":
        """`--quick`: the same row at toy sizes (seconds on a CPU)."""
        return dataclasses.replace(self, batch=min(self.batch, 4), hidden=8, inp=6, fixed=5,
                                   var_range=(2, 9))


def all_specs() -> list[Spec]:
    """The issue's full cartesian product."""
    return [Spec(c, m, lo, b, h, v) for c, m, lo, b, h, v in itertools.product(
        CELLS, (True, False), ("last", "all"), (16, 64), (128, 512), (False, True))]


def parse_key(key: str) -> Spec:
    cell, mask, loss, b, h, length = key.split("-")
    assert cell in CELLS and mask in ("masked", "unmasked") and loss in ("last", "all") \
        and length in ("fixed", "var"), key
    return Spec(cell, mask == "masked", loss, int(b[1:]), int(h[1:]), length == "var")


def select(patterns: str) -> list[Spec]:
    """A comma list of row keys or glob patterns (`lstm-masked-*-b16-*`) over the full
    product; a full key outside it (another size) is taken as it stands."""
    out: list[Spec] = []
    specs = all_specs()
    for pat in (p.strip() for p in patterns.split(",") if p.strip()):
        hits = [s for s in specs if fnmatch.fnmatchcase(s.key, pat)]
        if not hits and not any(ch in pat for ch in "*?["):
            hits = [parse_key(pat)]
        if not hits:
            raise SystemExit(f"--subset: no row matches {pat!r}")
        out += [s for s in hits if s not in out]
    return out


# -- data, weights and per-call lengths: the same for every contender ---------------------------

def init_params(spec: Spec, seed: int = SEED) -> dict[str, np.ndarray]:
    rng = np.random.RandomState(seed)
    n, h = GATES[spec.cell] * spec.hidden, spec.hidden
    p = {"W": rng.randn(spec.inp, n) / np.sqrt(spec.inp),
         "U": rng.randn(h, n) / np.sqrt(h),
         "b": np.zeros(n)}
    if spec.cell in ("lstm", "peephole", "lnlstm", "droplstm"):
        p["b"][h:2 * h] = 1.0                    # forget-gate bias 1, the usual start
    if spec.cell == "peephole":
        for g in ("p_i", "p_f", "p_o"):
            p[g] = rng.uniform(-0.1, 0.1, h)
    if spec.cell == "lnlstm":
        p["ln_g"] = np.ones(n)
        del p["b"]
        p["ln_b"] = np.zeros(n)
        p["ln_b"][h:2 * h] = 1.0
    return {k: v.astype("float32") for k, v in p.items()}


def data(spec: Spec, seed: int = SEED + 1):
    """x (lmax, batch, in), the all-states target y (lmax, batch, hidden), the last-state
    target (batch, hidden)."""
    rng = np.random.RandomState(seed)
    x = rng.randn(spec.lmax, spec.batch, spec.inp).astype("float32")
    y = (rng.rand(spec.lmax, spec.batch, spec.hidden) - 0.5).astype("float32")
    return x, y, (rng.rand(spec.batch, spec.hidden) - 0.5).astype("float32")


def calls(spec: Spec, n: int, seed: int = SEED + 2) -> list[tuple]:
    """`n` calls' (length L, mask (L, batch) float32 or None, per-row lengths): L is 50, or
    uniform in 10..90 drawn anew per call; masked rows' lengths are uniform in L/2..L, one
    row at L."""
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(n):
        L = int(rng.randint(spec.var_range[0], spec.var_range[1] + 1)) if spec.var \
            else spec.fixed
        lens = np.full(spec.batch, L, dtype="int64")
        if spec.masked:
            lens = rng.randint((L + 1) // 2, L + 1, spec.batch).astype("int64")
            lens[0] = L
        mask = (np.arange(L)[:, None] < lens[None, :]).astype("float32") \
            if spec.masked else None
        out.append((L, mask, lens))
    return out


# -- the cells ----------------------------------------------------------------------------------

def _slice(x, k, n):
    """Gate k of a fused product (the LSTM tutorial's helper)."""
    if x.ndim == 1:
        return x[k * n:(k + 1) * n]
    return x[:, k * n:(k + 1) * n]


def _masked(m, new, old):
    return m[:, None] * new + (1. - m)[:, None] * old


def _ln(T, z, g, b):
    mu = z.mean(axis=-1, keepdims=True)
    var = ((z - mu) ** 2).mean(axis=-1, keepdims=True)
    return (z - mu) / T.sqrt(var + EPS) * g + b


def n_states(cell: str) -> int:
    return 1 if cell in ("elman", "gru") else 2


def make_step(cell: str, H: int, T):
    """step(p, x_t, m_t, states, drop) -> new states: `m_t` the (batch,) mask or None,
    `drop` the step's scaled keep mask (droplstm) or None."""
    sig = T.nnet.sigmoid

    def elman(p, x_t, m_t, states, drop):
        h_prev, = states
        h = T.tanh(T.dot(x_t, p["W"]) + T.dot(h_prev, p["U"]) + p["b"])
        return (h if m_t is None else _masked(m_t, h, h_prev),)

    def gru(p, x_t, m_t, states, drop):
        # PyTorch's (and Keras reset_after's) GRU: r multiplies (h U_n), after the product
        h_prev, = states
        xw = T.dot(x_t, p["W"]) + p["b"]
        hu = T.dot(h_prev, p["U"])
        r = sig(_slice(xw, 0, H) + _slice(hu, 0, H))
        z = sig(_slice(xw, 1, H) + _slice(hu, 1, H))
        n = T.tanh(_slice(xw, 2, H) + r * _slice(hu, 2, H))
        h = (1. - z) * n + z * h_prev
        return (h if m_t is None else _masked(m_t, h, h_prev),)

    def lstm(p, x_t, m_t, states, drop):
        # gates in the tutorial's order: i, f, o, then the candidate c
        h_prev, c_prev = states
        h_in = h_prev if drop is None else h_prev * drop
        pre = T.dot(x_t, p["W"]) + T.dot(h_in, p["U"])
        if cell == "lnlstm":
            a = [_ln(T, _slice(pre, k, H), _slice(p["ln_g"], k, H), _slice(p["ln_b"], k, H))
                 for k in range(4)]
        else:
            pre = pre + p["b"]
            a = [_slice(pre, k, H) for k in range(4)]
        if cell == "peephole":
            i = sig(a[0] + p["p_i"] * c_prev)
            f = sig(a[1] + p["p_f"] * c_prev)
        else:
            i, f = sig(a[0]), sig(a[1])
        c = f * c_prev + i * T.tanh(a[3])
        o = sig(a[2] + p["p_o"] * c) if cell == "peephole" else sig(a[2])
        h = o * T.tanh(c)
        if m_t is not None:
            c = _masked(m_t, c, c_prev)
            h = _masked(m_t, h, h_prev)
        return h, c

    return {"elman": elman, "gru": gru}.get(cell, lstm)


def loss_of(T, spec: Spec, hs, h_last, y, y_last, m):
    """The row's loss from the states `hs` (L, batch, hidden), the last `h_last`."""
    if spec.loss == "last":
        return ((h_last - y_last) ** 2).mean()
    if m is None:
        return ((hs - y) ** 2).mean()
    return (m[:, :, None] * (hs - y) ** 2).sum() / (m.sum() * spec.hidden)


# -- namespaces for the array libraries ---------------------------------------------------------

def numpy_ns():
    sig = lambda z: 1. / (1. + np.exp(-z))  # noqa: E731
    return types.SimpleNamespace(dot=np.dot, tanh=np.tanh, sqrt=np.sqrt,
                                 nnet=types.SimpleNamespace(sigmoid=sig))


def array_ns(mod, sigmoid, dot=None):
    """torch or jax.numpy with Theano's names."""
    return types.SimpleNamespace(dot=dot or mod.matmul, tanh=mod.tanh, sqrt=mod.sqrt,
                                 nnet=types.SimpleNamespace(sigmoid=sigmoid))


def theano_ns(T):
    """symgpu.tensor as it is; PyTensor has `sigmoid` at the top level, not under nnet."""
    if hasattr(T, "nnet") and hasattr(T.nnet, "sigmoid"):
        return T
    ns = types.SimpleNamespace(**{k: getattr(T, k) for k in dir(T) if not k.startswith("_")})
    ns.nnet = types.SimpleNamespace(sigmoid=T.sigmoid)
    return ns


def numpy_loss(spec: Spec, params: dict, x, y, y_last, call) -> float:
    """The first call's loss in float64 NumPy (deterministic cells)."""
    T = numpy_ns()
    L, mask, _ = call
    p = {k: v.astype("float64") for k, v in params.items()}
    step = make_step(spec.cell, spec.hidden, T)
    states = tuple(np.zeros((spec.batch, spec.hidden)) for _ in range(n_states(spec.cell)))
    hs = []
    for t in range(L):
        states = step(p, x[t].astype("float64"), None if mask is None else mask[t], states, None)
        hs.append(states[0])
    hs = np.stack(hs)
    return float(loss_of(T, spec, hs, hs[-1], y[:L], y_last, mask))


# -- symgpu and PyTensor: scan and its gradient -------------------------------------------------

def _keep_mask(lib, srng, shape):
    """The step's dropout draw, scaled: Theano's ``srng.binomial(size=..., p=keep)``."""
    if lib.__name__ == "pytensor":
        return lib.tensor.cast(srng.binomial(1, KEEP, size=shape), "float32") / KEEP
    return srng.binomial(size=shape, n=1, p=KEEP, dtype="float32") / KEEP


def _streams(lib, seed: int):
    if lib.__name__ == "pytensor":
        from pytensor.tensor.random.utils import RandomStream
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return RandomStream(seed)
    from symgpu.tensor.shared_randomstreams import RandomStreams
    return RandomStreams(seed=seed)


def build_symbolic(lib, T, spec: Spec, params0: dict, arrays: tuple, mode=None):
    """The training step as a Theano user writes it: the data in shared variables (on the
    GPU, on the device), the length L an int input (the sequence is `x[:L]`), the mask an
    input. Returns (call(L, mask) -> loss, compile seconds, function)."""
    T = theano_ns(T)
    lib.config.floatX = "float32"
    x0, y0, yl0 = arrays
    params = {k: lib.shared(v.copy(), name=k) for k, v in params0.items()}
    names = list(params)
    x_all, y_all = lib.shared(x0, name="x"), lib.shared(y0, name="y")
    y_last = lib.shared(yl0, name="y_last")
    L = T.iscalar("L")
    m = T.matrix("m", dtype="float32") if spec.masked else None
    H, ns = spec.hidden, n_states(spec.cell)
    cell = make_step(spec.cell, H, T)
    srng = _streams(lib, SEED + 3) if spec.cell == "droplstm" else None

    def step(*args):
        x_t, rest = args[0], list(args[1:])
        m_t = rest.pop(0) if spec.masked else None
        states, ps = tuple(rest[:ns]), rest[ns:]
        p = dict(zip(names, ps))
        drop = _keep_mask(lib, srng, states[0].shape) if srng is not None else None
        out = cell(p, x_t, m_t, states, drop)
        return out[0] if ns == 1 else list(out)

    seqs = [x_all[:L]] + ([m] if spec.masked else [])
    h0 = [T.zeros((spec.batch, H), dtype="float32") for _ in range(ns)]
    out, updates = lib.scan(step, sequences=seqs, outputs_info=h0 if ns > 1 else h0[0],
                            non_sequences=[params[k] for k in names])
    hs = out[0] if ns > 1 else out
    loss = loss_of(T, spec, hs, hs[-1], y_all[:L], y_last, m)
    grads = T.grad(loss, [params[k] for k in names])
    upd = dict(updates)
    upd.update((params[k], params[k] - LR * g) for k, g in zip(names, grads))
    t0 = time.perf_counter()
    kw = {} if mode is None else {"mode": mode}
    fn = lib.function([L] + ([m] if spec.masked else []), loss, updates=list(upd.items()),
                      name=f"rnn_{spec.cell}", **kw)
    compile_s = time.perf_counter() - t0
    if spec.masked:
        call = lambda L_, mask: fn(L_, mask)  # noqa: E731
    else:
        call = lambda L_, mask: fn(L_)  # noqa: E731
    return call, compile_s, fn
