"""gpu_gemm_fold (symgpu/gpu/ops/gemm_fold.py): ``z + s * dot(x, y)`` made of GPU ops (as the
gradients of a graph on GPU variables are, out of reach of the host's blas pass) becomes one
GpuGemm, checked on the rewritten graphs of a virtual context (values on a GPU are in
test_gpu_blaslt.py's SGD test)."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import virtual_context
from symgpu import config, function
from symgpu.gpu.ops.blas import GpuDot22, GpuGemm
from symgpu.gpu.placement.type import GpuArrayType

CTX = "gemm-fold-virtual"
_virtual = virtual_context(CTX)


def gmat(name, bcast=(False, False)):
    return GpuArrayType("float32", bcast, CTX)(name)


def nodes_of(*outputs, **flags):
    with config.change_flags(**flags):
        f = function([v for v in ALL if v is not None], list(outputs),
                     on_unused_input="ignore")
    return f.maker.fgraph.toposort()


ALL: list = []


@pytest.fixture(autouse=True)
def inputs():
    ALL[:] = [gmat("W"), gmat("X"), gmat("D"), gmat("b", (True, False))]
    yield ALL


def product(X, D):
    """dot(X.T, D) as a GPU op from the start (what T.grad of a GPU graph makes)."""
    return GpuDot22()(X.T, D)


def gemms(nodes):
    return [n for n in nodes if isinstance(n.op, GpuGemm)]


def scalars(node):
    return [float(np.asarray(getattr(v, "data", None))) for v in (node.inputs[1], node.inputs[4])]


def test_an_sgd_update_becomes_one_gemm_reading_w():
    W, X, D, _ = ALL
    nodes = nodes_of(W - np.float32(0.01) * product(X, D))
    (g,) = gemms(nodes)
    assert not any(isinstance(n.op, GpuDot22) for n in nodes)
    assert g.inputs[0].name == "W" and not g.op.inplace, "W is read as C, never overwritten"
    assert scalars(g) == pytest.approx([-0.01, 1.0])


@pytest.mark.parametrize("build,alpha,beta", [
    (lambda W, P: W + P * np.float32(0.5), 0.5, 1.0),
    (lambda W, P: W - P, -1.0, 1.0),
    (lambda W, P: np.float32(2.0) * P - W, 2.0, -1.0),
    (lambda W, P: P + W, 1.0, 1.0),
])
def test_sums_and_differences_with_a_constant_scale(build, alpha, beta):
    W, X, D, _ = ALL
    (g,) = gemms(nodes_of(build(W, product(X, D))))
    assert scalars(g) == pytest.approx([alpha, beta])


def test_no_fold_when_the_product_has_another_reader_a_broadcast_z_or_the_flag_off():
    W, X, D, b = ALL
    P = product(X, D)
    assert not gemms(nodes_of(W - np.float32(0.01) * P, T.exp(P)))
    assert not gemms(nodes_of(GpuDot22()(X, W) + b))     # the bias row: dot then a fused add
    assert not gemms(nodes_of(W - np.float32(0.01) * P, **{"gpuarray.cublaslt": False}))
