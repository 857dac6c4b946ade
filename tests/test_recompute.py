"""Recompute instead of store (symgpu/tensor/rewriting/recompute.py): after fusion, an output
of a fused kernel that only elementwise kernels read is recomputed in them from the
producer's inputs where that moves fewer bytes (a GELU's intermediates in a training step).

The pass is generic over the elementwise class: the GPU runs it over GpuElemwise (position
49.55, checked on a virtual GPU); its values are checked here over the CPU's Elemwise."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import Mode, function
from symgpu.graph.fg import FunctionGraph
from symgpu.scalar.composite import Composite
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.rewriting.recompute import recompute_exported_values


def _gelu(a):
    return 0.5 * a * (1 + T.tanh(np.float32(0.79788456) * (a + np.float32(0.044715) * a ** 3)))


def _gelu_step():
    """A two-layer MLP's loss and gradients with a GELU between half-precision products:
    the backward GELU kernel (after the second product's gradient) reads the forward
    kernel's intermediates."""
    x, w, v = T.fmatrix("x"), T.fmatrix("w"), T.fmatrix("v")
    b = T.fvector("b")

    def half_dot(a, c):
        return T.cast(T.dot(T.cast(a, "bfloat16"), T.cast(c, "bfloat16")), "float32")
    u = half_dot(x, w) + b
    loss = T.sum(T.sqr(half_dot(_gelu(u), v)))
    return [x, w, b, v], [loss] + T.grad(loss, [w, b])


def _fused(outputs_of):
    return [n for n in outputs_of if isinstance(getattr(n.op, "scalar_op", None), Composite)]


def test_the_forward_kernel_stores_only_what_the_backward_cannot_recompute_cheaply():
    ins, outs = _gelu_step()
    f = function(ins, outs, mode=Mode().excluding("inplace"))
    fg = f.maker.fgraph.clone()
    before = {n: len(n.outputs) for n in _fused(fg.toposort())}
    assert max(before.values()) >= 2              # the forward kernel exports intermediates
    count = recompute_exported_values(fg, Elemwise, Elemwise)
    assert count >= 1
    after = _fused(fg.toposort())
    exported = sum(len(n.outputs) for n in after)
    assert exported < sum(before.values())
    # no full-size float32 intermediate passes between two fused kernels any more, except
    # what a non-elementwise reader (the sums, the product's gradient) needs
    for n in after:
        for o in n.outputs:
            readers = [c for c, _ in fg.clients[o] if c != "output"]
            if readers and all(isinstance(getattr(c.op, "scalar_op", None), Composite)
                               for c in readers):
                assert o.dtype != "float32" or not o.type.broadcastable == (False, False), (n, o)


def test_the_rewritten_graph_computes_the_same_values():
    ins, outs = _gelu_step()
    f = function(ins, outs, mode=Mode().excluding("inplace"))
    fg = f.maker.fgraph.clone()
    assert recompute_exported_values(fg, Elemwise, Elemwise) >= 1
    g = function(fg.inputs, fg.outputs, mode=Mode().excluding("fusion"))
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((6, 5)).astype("float32"),
            rng.standard_normal((5, 7)).astype("float32"),
            rng.standard_normal(7).astype("float32"),
            rng.standard_normal((7, 3)).astype("float32")]
    for got, want in zip(g(*args), f(*args)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_values_read_by_a_reduction_or_the_caller_are_still_stored():
    x = T.fmatrix("x")
    y = T.exp(x) + 1
    z = T.tanh(y) * 2
    f = function([x], [z, T.sum(y, axis=0), y * 3],   # y: a reduction and the caller
                 mode=Mode().excluding("inplace"))
    fg = f.maker.fgraph.clone()
    recompute_exported_values(fg, Elemwise, Elemwise)
    nodes = _fused(fg.toposort())
    assert any(len(n.outputs) >= 2 for n in nodes) or len(nodes) == 1


def test_a_larger_program_than_the_limit_is_stored(monkeypatch):
    from symgpu.tensor.rewriting import recompute
    monkeypatch.setattr(recompute, "MAX_STEPS", 1)
    ins, outs = _gelu_step()
    fg = function(ins, outs, mode=Mode().excluding("inplace")).maker.fgraph.clone()
    assert recompute_exported_values(fg, Elemwise, Elemwise) == 0


def test_the_gpu_pass_recomputes_a_gelus_intermediates(vgpu):
    from symgpu.gpu.ops.elemwise import GpuElemwise
    ins, outs = _gelu_step()
    # the GELU as elementwise kernels (gpu_gelu_epilogue would put it in the products)
    f = function(ins, outs, mode=Mode().excluding("gpu_gelu_epilogue"))
    kernels = [n for n in f.maker.fgraph.toposort() if type(n.op) is GpuElemwise]
    assert kernels
    gelu_fwd = [n for n in kernels if "tanh" in str(n.op) and n.outputs[0].dtype == "float32"
                and len(n.outputs) >= 3]
    assert not gelu_fwd, [str(n.op)[:120] for n in gelu_fwd]
    without = function(ins, outs, mode=Mode().excluding("gpu_recompute", "gpu_gelu_epilogue"))
    stored = [n for n in without.maker.fgraph.toposort()
              if type(n.op) is GpuElemwise and len(n.outputs) >= 2 and "tanh" in str(n.op)]
    assert stored                                 # without the pass they are exported
