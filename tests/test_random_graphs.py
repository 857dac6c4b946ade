"""Differential testing on seeded random graphs: every rewrite must keep a valid graph valid.

Each seed draws an expression (tests/random_graphs.py) mixing dots, scaled and added terms,
broadcast rows/columns/scalars, transposes and reductions; the compiled function's value and
its gradients (FAST_RUN, all rewrites) are compared with NumPy (values, central differences)
and, where PyTensor is installed, with PyTensor's. A failure prints the seed and the tree.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.tensor.type import TensorType

import random_graphs as rg
from gpu_helpers import requires_gpu

# a rewrite pair that undoes each other is a bug too (the passes stop and warn)
pytestmark = pytest.mark.filterwarnings("error:.*without reaching a fixed point:RuntimeWarning")

OUT_SHAPES = [(), (3,), (4,), (3, 4), (4, 3), (1, 4), (4, 4)]
SEEDS = range(120)


def _case(seed: int):
    rng = random.Random(seed)
    shape = rng.choice(OUT_SHAPES)
    tree = rg.draw(rng, shape, rng.choice([2, 3, 4]))
    names = sorted(rg.used_inputs(tree))
    values = np.random.default_rng(seed)
    env = {k: values.uniform(-1, 1, rg.INPUT_SHAPES[k]) for k in names}
    return shape, tree, names, env


def _symbolic_inputs(names, dtype="float64"):
    return {k: TensorType(dtype, tuple(d == 1 for d in rg.INPUT_SHAPES[k]))(k) for k in names}


def _weights(shape, seed):
    return np.random.default_rng(seed + 7).uniform(0.5, 1.5, shape)


def _check_case(seed: int, dtype: str = "float64", rtol: float = 1e-7, atol: float = 1e-9) -> None:
    shape, tree, names, env = _case(seed)
    sym = _symbolic_inputs(names, dtype)
    out = rg.evaluate(tree, sym, T)
    w = _weights(shape, seed)
    cost = (out * w.astype(dtype)).sum()
    grads = symgpu.grad(cost, [sym[k] for k in names]) if names else []
    f = symgpu.function([sym[k] for k in names], [out, *grads])
    args = [env[k].astype(dtype) for k in names]
    got = f(*args)
    expected = rg.evaluate(tree, env, np)
    where = f"seed {seed}: {tree}"
    assert np.shape(got[0]) == shape, where
    np.testing.assert_allclose(got[0], expected, rtol=rtol, atol=atol, err_msg=where)
    num = rg.numeric_grad(lambda e: float((rg.evaluate(tree, e, np) * w).sum()), dict(env))
    for k, g in zip(names, got[1:]):
        scale = max(1.0, float(np.abs(num[k]).max()))
        np.testing.assert_allclose(g, num[k], rtol=max(rtol, 1e-5), atol=max(atol, 1e-6) * scale,
                                   err_msg=f"d/d{k}, {where}")


@pytest.mark.parametrize("seed", SEEDS)
def test_random_graph_matches_numpy(seed):
    _check_case(seed)


def test_the_broadcast_product_found_by_random_testing():
    """dot(dot(v[None], m.T), m) * 0.1 + m: the (1, 4) product must not become Gemm's y."""
    v, m = T.dvector("v"), T.dmatrix("m")
    out = T.dot(T.dot(v.dimshuffle("x", 0), m.T), m) * 0.1 + m
    f = symgpu.function([v, m], out)
    vv, mm = np.arange(4.0), np.arange(12.0).reshape(3, 4) / 10
    np.testing.assert_allclose(f(vv, mm), (vv[None] @ mm.T) @ mm * 0.1 + mm)
    for node in f.maker.fgraph.apply_nodes:
        if type(node.op).__name__ in ("Gemm", "Gemv"):
            y, prod_a = node.inputs[0], node.inputs[2]
            assert y.broadcastable[0] or not prod_a.broadcastable[0], node


def test_gemm_refuses_an_accumulator_the_product_would_broadcast_into():
    from symgpu.tensor.blas import gemm_no_inplace
    row, m = T.drow("r"), T.dmatrix("m")
    with pytest.raises(TypeError, match="accumulator"):
        gemm_no_inplace(m, 0.1, row, m, 1.0)


def test_pytensor_agrees_on_random_graphs():
    pytensor = pytest.importorskip("pytensor")
    pt = pytest.importorskip("pytensor.tensor")
    for seed in range(20):
        shape, tree, names, env = _case(seed)
        sym = {k: pt.tensor(dtype="float64", shape=rg.INPUT_SHAPES[k], name=k) for k in names}
        out = rg.evaluate(tree, sym, pt)
        f = pytensor.function([sym[k] for k in names], out)
        theirs = f(*[env[k] for k in names])
        mine = symgpu.function(list(_symbolic_inputs(names).values()),
                               rg.evaluate(tree, _symbolic_inputs(names), T))
        sym2 = _symbolic_inputs(names)
        mine = symgpu.function([sym2[k] for k in names], rg.evaluate(tree, sym2, T))
        np.testing.assert_allclose(mine(*[env[k] for k in names]), theirs, rtol=1e-7,
                                   err_msg=f"seed {seed}: {tree}")


@requires_gpu
@pytest.mark.parametrize("seed", range(0, 60, 3))
def test_random_graph_matches_numpy_on_the_gpu(cuda, seed):
    _check_case(seed, dtype="float32", rtol=2e-3, atol=2e-3)
