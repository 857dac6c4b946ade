"""Seeded random expression graphs for differential testing (tests/test_random_graphs.py).

A graph is drawn as a small expression tree of plain tuples, then interpreted three ways:
as a symgpu graph, as NumPy code (the reference) and, when it is installed, as a PyTensor
graph. The tree mixes what the rewrites like to touch: dots of every rank (BLAS), scaled and
added terms (Gemm/Gemv folding), rows, columns and scalars broadcast against matrices,
transposes, reductions and fusable elementwise chains.

Tree nodes: ("in", name) | ("const", value) | ("unary", op, a) | ("binary", op, a, b) |
("dot", a, b) | ("T", a) | ("row", a) | ("col", a) | ("sum", axis, a).
"""
from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np

# one shape per input; (1, n) and (n, 1) inputs are rows and columns (broadcastable)
INPUT_SHAPES: dict[str, tuple] = {
    "s": (), "u": (3,), "v": (4,), "m": (3, 4), "n": (4, 3), "q": (4, 4), "r": (1, 4), "c": (3, 1),
}

UNARY: dict[str, tuple[Callable, Callable]] = {   # name -> (numpy, symgpu/pytensor attribute)
    "tanh": (np.tanh, "tanh"),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), "sigmoid"),
    "neg": (np.negative, "neg"),
    "sqr": (np.square, "sqr"),
    "sin": (np.sin, "sin"),
    "softplus": (lambda x: np.log1p(np.exp(x)), "softplus"),
    "exp": (np.exp, "exp"),
}
BINARY: dict[str, Callable] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply,
    "div": lambda a, b: a / (1.5 + np.tanh(b)),     # a denominator kept away from zero
}


def _inputs_of(shape: tuple) -> list[str]:
    return [k for k, s in INPUT_SHAPES.items() if s == shape]


def draw(rng: random.Random, shape: tuple, depth: int) -> tuple:
    """A random expression tree whose value has exactly `shape`."""
    leaves = _inputs_of(shape)
    if depth <= 0 or rng.random() < 0.15:
        if leaves and rng.random() < 0.85:
            return ("in", rng.choice(leaves))
        if shape == ():
            return ("const", round(rng.uniform(-2, 2), 2))
        if shape == (3, 3):                 # the one drawn shape no input has
            return ("dot", ("in", "m"), ("in", "n"))
        return ("unary", "tanh", ("in", rng.choice(leaves)))
    return _make(rng, shape, depth)


def _make(rng: random.Random, shape: tuple, depth: int) -> tuple:
    d = depth - 1
    choices = ["unary", "binary", "binary", "scaled", "dot", "dot"]
    if len(shape) == 2 and 1 not in shape:
        choices += ["T"]
    if len(shape) < 2:
        choices += ["sum"]
    if shape == (1, 4) or shape == (3, 1):
        choices = ["unary", "binary", "bcast", "dot", "dot", "dot"]
    kind = rng.choice(choices)
    if kind == "unary":
        return ("unary", rng.choice(list(UNARY)), draw(rng, shape, d))
    if kind in ("binary", "scaled"):
        a = draw(rng, shape, d)
        if kind == "scaled":
            b = ("const", round(rng.uniform(-1, 1), 2))
            op = "mul"
        else:
            b = draw(rng, _broadcast_part(rng, shape), d)
            op = rng.choice(list(BINARY))
        return ("binary", op, a, b) if rng.random() < 0.5 or op == "div" else ("binary", op, b, a)
    if kind == "bcast":
        return ("row", draw(rng, (4,), d)) if shape == (1, 4) else ("col", draw(rng, (3,), d))
    if kind == "T":
        return ("T", draw(rng, shape[::-1], d))
    if kind == "sum":
        k = rng.choice([3, 4])
        if shape == ():
            return ("sum", None, draw(rng, rng.choice([(k,), (3, 4)]), d))
        return ("sum", 1, draw(rng, (shape[0], k), d)) if shape[0] in (3, 4) and \
            (shape[0], k) != (3, 3) else ("sum", 0, draw(rng, (k, shape[0]), d)) \
            if (k, shape[0]) != (3, 3) else ("unary", "tanh", draw(rng, shape, d))
    # dot: pick an inner length that keeps every operand shape drawable
    return _dot(rng, shape, d)


def _broadcast_part(rng: random.Random, shape: tuple) -> tuple:
    """`shape` itself, a scalar, or (for a matrix) a row or column that broadcasts to it."""
    options = [shape, ()]
    if len(shape) == 2 and shape[1] == 4:
        options += [(1, 4), (1, 4)]
    if len(shape) == 2 and shape[0] == 3:
        options += [(3, 1)]
    return rng.choice(options)


def _dot(rng: random.Random, shape: tuple, d: int) -> tuple:
    ks = [3, 4]
    if shape == ():
        k = rng.choice(ks[1:])
        return ("dot", draw(rng, (k,), d), draw(rng, (k,), d))
    if len(shape) == 1:
        n = shape[0]
        if rng.random() < 0.5:
            k = 4 if n == 3 else rng.choice(ks)
            if (n, k) == (3, 3):
                k = 4
            return ("dot", draw(rng, (n, k), d), draw(rng, (k,), d))
        k = 4 if n == 3 else rng.choice([3, 4])
        if (k, n) == (3, 3):
            k = 4
        return ("dot", draw(rng, (k,), d), draw(rng, (k, n), d))
    m, n = shape
    if m == 1:       # a row: (1, k) @ (k, n)
        return ("dot", draw(rng, (1, 4), d), draw(rng, (4, n), d))
    if n == 1:       # a column: (m, k) @ (k, 1) has no drawable (k, 1) but (3, 1): m x 3
        return ("col", draw(rng, (m,), d))
    k = 4 if (m == 3 or n == 3) else rng.choice(ks)
    return ("dot", draw(rng, (m, k), d), draw(rng, (k, n), d))


def used_inputs(tree: tuple, out: set | None = None) -> set:
    out = set() if out is None else out
    if tree[0] == "in":
        out.add(tree[1])
    for child in tree[1:]:
        if isinstance(child, tuple):
            used_inputs(child, out)
    return out


def evaluate(tree: tuple, env: dict, lib: Any) -> Any:
    """Interpret `tree` with `lib` (the NUMPY, or a tensor module such as symgpu.tensor)."""
    kind = tree[0]
    if kind == "in":
        return env[tree[1]]
    if kind == "const":
        return tree[1] if lib is not np else np.float64(tree[1])
    args = [evaluate(t, env, lib) for t in tree[1:] if isinstance(t, tuple)]
    if kind == "unary":
        return UNARY[tree[1]][0](args[0]) if lib is np else _sym_unary(lib, tree[1])(args[0])
    if kind == "binary":
        a, b = args
        if lib is np:
            return BINARY[tree[1]](a, b)
        if tree[1] == "div":
            return a / (1.5 + lib.tanh(b))
        return {"add": a + b, "sub": a - b, "mul": a * b}[tree[1]]
    if kind == "dot":
        return np.dot(*args) if lib is np else lib.dot(*args)
    if kind == "T":
        return args[0].T
    if kind == "row":
        return args[0][None, :] if lib is np else args[0].dimshuffle("x", 0)
    if kind == "col":
        return args[0][:, None] if lib is np else args[0].dimshuffle(0, "x")
    if kind == "sum":
        return args[0].sum(axis=tree[1])
    raise ValueError(f"unknown tree node {kind!r}")


def _sym_unary(lib: Any, name: str) -> Callable:
    attr = UNARY[name][1]
    if hasattr(lib, attr):
        return getattr(lib, attr)
    return getattr(lib.nnet, attr) if hasattr(lib, "nnet") and hasattr(lib.nnet, attr) else \
        getattr(__import__(lib.__name__ + ".math", fromlist=[attr]), attr)


def numeric_grad(fn: Callable[[dict], float], env: dict, eps: float = 1e-6) -> dict:
    """Central differences of the scalar `fn(env)` with respect to every array in `env`."""
    grads = {}
    for name, value in env.items():
        g = np.zeros_like(value)
        flat, gflat = value.reshape(-1), g.reshape(-1)
        for i in range(flat.size):
            old = flat[i]
            flat[i] = old + eps
            hi = fn(env)
            flat[i] = old - eps
            lo = fn(env)
            flat[i] = old
            gflat[i] = (hi - lo) / (2 * eps)
        grads[name] = g
    return grads
