"""The peers of benchmarks/library_gpu.py (PyTorch, CuPy, JAX), each written as its experts
would: device arrays made once, outside the timing; the calls that skip a host round trip
(PyTorch's ``*_ex`` linear algebra, which does not sync to check ``info``); JAX jitted with
the arrays as arguments (no closed-over constants) and ``block_until_ready``.

Each builder takes a row kind and its host data (dict of NumPy arrays, from library_gpu.py)
and returns a list of ``Contender``: ``step()`` makes one call and returns its result on the
device, ``sync()`` waits for the device, ``host(result)`` copies a result to NumPy (float32;
complex results as a trailing axis of 2, symgpu's layout) for the correctness check.
A kind a peer does not offer raises ``Skip`` with the reason.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

LR = 0.01


class Contender(NamedTuple):
    name: str
    step: Callable
    sync: Callable
    host: Callable
    note: str = ""


class Skip(Exception):
    """A peer that does not offer a row (the message says why)."""


def _holder_sync(block: Callable) -> tuple[Callable, Callable]:
    """(wrap, sync) for peers whose sync needs the last result (JAX): ``wrap(fn)`` is a step
    that keeps fn's result, ``sync()`` waits for it."""
    last: list = [None]

    def wrap(fn):
        def step():
            last[0] = fn()
            return last[0]
        return step
    return wrap, lambda: block(last[0])


# ============================================================================ PyTorch

def torch_contenders(kind: str, data: dict, gpu: bool) -> list[Contender]:
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False    # full float32 everywhere (symgpu's
    torch.backends.cudnn.allow_tf32 = False          # default; JAX at precision HIGHEST)
    dev = torch.device("cuda" if gpu else "cpu")
    sync = torch.cuda.synchronize if gpu else (lambda: None)

    def dev_t(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev)

    def host(r):
        return r.detach().cpu().numpy()
    if kind == "cnn":
        return torch_cnn(data, gpu)
    if kind == "cholesky":
        A = dev_t(data["A"])
        # cholesky_ex: no host sync to check info (linalg.cholesky syncs to raise)
        return [Contender("PyTorch", lambda: torch.linalg.cholesky_ex(A).L, sync, host)]
    if kind == "solve":
        A, B = dev_t(data["A"]), dev_t(data["B"])
        return [Contender("PyTorch", lambda: torch.linalg.solve_ex(A, B).result, sync, host)]
    if kind == "eigh":
        A = dev_t(data["A"])
        return [Contender("PyTorch", lambda: torch.linalg.eigh(A), sync,
                          lambda r: (host(r[0]), host(r[1])))]
    if kind == "spmm":
        import warnings
        with warnings.catch_warnings():     # "sparse CSR support is in beta"
            warnings.simplefilter("ignore", UserWarning)
            S = torch.sparse_csr_tensor(dev_t(data["indptr"]), dev_t(data["indices"]),
                                        dev_t(data["values"]), size=data["shape"])
        D = dev_t(data["D"])
        return [Contender("PyTorch", lambda: torch.sparse.mm(S, D), sync, host)]
    if kind == "rfft":
        x = dev_t(data["x"])
        return [Contender("PyTorch", lambda: torch.fft.rfft(x), sync,
                          lambda r: torch.view_as_real(r).cpu().numpy())]
    if kind == "sort":
        x = dev_t(data["x"])
        return [Contender("PyTorch", lambda: torch.sort(x).values, sync, host,
                          "torch.sort also makes the indices (no values-only sort)")]
    if kind == "topk":
        x = dev_t(data["x"])
        k = data["k"]
        return [Contender("PyTorch", lambda: torch.topk(x, k).values, sync, host,
                          "torch.topk also makes the indices")]
    raise Skip(f"no PyTorch row {kind!r}")


def _torch_cnn_loss(F):
    def loss_fn(ps, x, y):
        w1, b1, w2, b2, w3, b3 = ps
        h = F.max_pool3d(F.relu(F.conv3d(x, w1, b1)), 2)
        h = F.max_pool3d(F.relu(F.conv3d(h, w2, b2)), 2)
        return F.cross_entropy(h.flatten(1) @ w3 + b3, y)
    return loss_fn


def torch_cnn(data: dict, gpu: bool) -> list[Contender]:
    """Eager, torch.compile (the loss and its backward compiled; SGD foreach) and, on the GPU,
    the whole step captured in one CUDA graph (PyTorch's documented whole-network capture);
    each with its own copy of the parameters. cudnn.benchmark on."""
    import torch
    import torch.nn.functional as F
    dev = torch.device("cuda" if gpu else "cpu")
    torch.backends.cudnn.benchmark = True
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    x = torch.from_numpy(data["x"]).to(dev)
    y = torch.from_numpy(data["labels"].astype(np.int64)).to(dev)
    loss_fn = _torch_cnn_loss(F)

    def fresh():
        ps = [torch.from_numpy(p.copy()).to(dev).requires_grad_(True) for p in data["params"]]
        return ps, torch.optim.SGD(ps, lr=LR, foreach=True)

    def host(r):
        return np.asarray(r.detach().cpu().numpy(), dtype="float32")
    out = []

    def make_step(fn):
        ps, opt = fresh()

        def step():
            opt.zero_grad(set_to_none=True)
            loss = fn(ps, x, y)
            loss.backward()
            opt.step()
            return loss
        return step
    out.append(Contender("PyTorch eager", make_step(loss_fn), sync, host))
    mode = data.get("torch_compile_mode") or "default"
    if mode != "off":
        compiled = torch.compile(loss_fn, mode=None if mode == "default" else mode)
        out.append(Contender("torch.compile", make_step(compiled), sync, host,
                             f"mode={mode}"))
    if gpu:
        out.append(Contender("PyTorch CUDA graph", _torch_graph_step(loss_fn, fresh, x, y),
                             sync, host))
    return out


def _torch_graph_step(loss_fn, fresh, x, y) -> Callable:
    """The whole step (forward, backward, SGD) replayed from one CUDA graph, as in PyTorch's
    'whole network capture' example: warm up on a side stream, capture, replay."""
    import torch
    ps, opt = fresh()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_fn(ps, x, y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_fn(ps, x, y)
        static_loss.backward()
        opt.step()

    def step():
        graph.replay()
        return static_loss
    return step


# ============================================================================ CuPy

def cupy_contenders(kind: str, data: dict, gpu: bool) -> list[Contender]:
    if not gpu:
        raise Skip("CuPy needs a GPU")
    import cupy
    sync = cupy.cuda.Device().synchronize

    def host(r):
        return cupy.asnumpy(r)
    if kind == "cholesky":
        A = cupy.asarray(data["A"])
        return [Contender("CuPy", lambda: cupy.linalg.cholesky(A), sync, host)]
    if kind == "solve":
        A, B = cupy.asarray(data["A"]), cupy.asarray(data["B"])
        return [Contender("CuPy", lambda: cupy.linalg.solve(A, B), sync, host)]
    if kind == "eigh":
        A = cupy.asarray(data["A"])
        return [Contender("CuPy", lambda: cupy.linalg.eigh(A), sync,
                          lambda r: (host(r[0]), host(r[1])))]
    if kind == "spmm":
        import cupyx.scipy.sparse as csp
        S = csp.csr_matrix((cupy.asarray(data["values"]), cupy.asarray(data["indices"]),
                            cupy.asarray(data["indptr"])), shape=data["shape"])
        D = cupy.asarray(data["D"])
        return [Contender("CuPy", lambda: S @ D, sync, host)]
    if kind == "rfft":
        x = cupy.asarray(data["x"])
        return [Contender("CuPy", lambda: cupy.fft.rfft(x, axis=-1), sync,
                          lambda r: np.stack([host(r.real), host(r.imag)], -1))]
    if kind == "sort":
        x = cupy.asarray(data["x"])
        return [Contender("CuPy", lambda: cupy.sort(x), sync, host)]
    if kind == "topk":
        raise Skip("CuPy has no top-k (cupy.partition selects by a full sort-like pass and "
                   "then needs a sort of the k: not what a CuPy user would time as top-k)")
    if kind == "cnn":
        raise Skip("CuPy has no autograd or 3-D convolution layers (not a training library)")
    raise Skip(f"no CuPy row {kind!r}")


# ============================================================================ JAX

def jax_contenders(kind: str, data: dict, gpu: bool) -> list[Contender]:
    """Jitted functions of device arrays passed as arguments. Donation: no library row
    replaces an input by its output, so only the CNN step donates (its parameters)."""
    import jax
    import jax.numpy as jnp
    platform = jax.devices()[0].platform
    if gpu and platform != "gpu":
        raise Skip(f"JAX found no GPU (its default device is {jax.devices()[0]})")
    wrap, sync = _holder_sync(jax.block_until_ready)

    def host(r):
        return np.asarray(r)
    put = jax.device_put
    if kind == "cnn":
        return jax_cnn(data)
    if kind == "cholesky":
        f, A = jax.jit(jnp.linalg.cholesky), put(data["A"])
        return [Contender("JAX", wrap(lambda: f(A)), sync, host)]
    if kind == "solve":
        f, A, B = jax.jit(jnp.linalg.solve), put(data["A"]), put(data["B"])
        return [Contender("JAX", wrap(lambda: f(A, B)), sync, host)]
    if kind == "eigh":
        f, A = jax.jit(jnp.linalg.eigh), put(data["A"])
        return [Contender("JAX", wrap(lambda: tuple(f(A))), sync,
                          lambda r: (host(r[0]), host(r[1])))]
    if kind == "spmm":
        from jax.experimental import sparse as jsparse
        try:      # BCSR @ dense lowers to cuSPARSE only with this documented flag
            jax.config.update("jax_bcoo_cusparse_lowering", True)
        except Exception as exc:  # noqa: BLE001
            raise Skip(f"jax_bcoo_cusparse_lowering is gone ({exc}); its default lowering "
                       "is not cuSPARSE, not a fair expert choice") from exc
        S = jsparse.BCSR((put(data["values"]), put(data["indices"]), put(data["indptr"])),
                         shape=data["shape"])
        f, D = jax.jit(lambda s, d: s @ d), put(data["D"])
        return [Contender("JAX", wrap(lambda: f(S, D)), sync, host,
                          "jax.experimental.sparse BCSR (cuSPARSE lowering)")]
    if kind == "rfft":
        f, x = jax.jit(jnp.fft.rfft), put(data["x"])
        return [Contender("JAX", wrap(lambda: f(x)), sync,
                          lambda r: np.stack([np.asarray(r.real), np.asarray(r.imag)], -1))]
    if kind == "sort":
        f, x = jax.jit(jnp.sort), put(data["x"])
        return [Contender("JAX", wrap(lambda: f(x)), sync, host)]
    if kind == "topk":
        k = data["k"]
        f, x = jax.jit(lambda v: jax.lax.top_k(v, k)[0]), put(data["x"])
        return [Contender("JAX", wrap(lambda: f(x)), sync, host,
                          "lax.top_k also makes the indices (dropped inside the jit)")]
    raise Skip(f"no JAX row {kind!r}")


def jax_cnn(data: dict) -> list[Contender]:
    """The step jitted with the parameters as arguments and donated (the new ones replace
    them), the batch as arguments; precision HIGHEST (full float32, as the others)."""
    import jax
    import jax.numpy as jnp
    hi = jax.lax.Precision.HIGHEST
    dn = ("NCDHW", "OIDHW", "NCDHW")

    def conv(a, w, b):
        out = jax.lax.conv_general_dilated(a, w, (1, 1, 1), "VALID", dimension_numbers=dn,
                                           precision=hi)
        return out + b[None, :, None, None, None]

    def pool(a):
        return jax.lax.reduce_window(a, -jnp.inf, jax.lax.max, (1, 1, 2, 2, 2),
                                     (1, 1, 2, 2, 2), "VALID")

    def loss(ps, x, y):
        w1, b1, w2, b2, w3, b3 = ps
        h = pool(jax.nn.relu(conv(x, w1, b1)))
        h = pool(jax.nn.relu(conv(h, w2, b2)))
        logits = jnp.matmul(h.reshape(h.shape[0], -1), w3, precision=hi) + b3
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    def train(ps, x, y):
        val, gs = jax.value_and_grad(loss)(ps, x, y)
        return [p - LR * g for p, g in zip(ps, gs)], val
    jstep = jax.jit(train, donate_argnums=(0,))
    state = [[jax.device_put(p.copy()) for p in data["params"]], None]
    x, y = jax.device_put(data["x"]), jax.device_put(data["labels"].astype(np.int32))

    def step():
        state[0], state[1] = jstep(state[0], x, y)
        return state[1]
    return [Contender("JAX", step, lambda: state[1].block_until_ready(),
                      lambda r: np.asarray(r, dtype="float32"))]


BUILDERS = {"torch": torch_contenders, "cupy": cupy_contenders, "jax": jax_contenders}
