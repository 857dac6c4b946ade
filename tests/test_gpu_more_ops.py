"""GpuSubtensor, GpuIncSubtensor, GpuJoin, the softmax family and GpuArgmax: placement on a
virtual context (CPU), nvcc compilation of their kernels (``nvcc``) and values against NumPy
on a real GPU (``gpu``)."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import check_on_gpu, compile_for_sm90, requires_gpu, requires_nvcc
from symgpu import config, function
from symgpu.gpu.ops.nnet import GpuArgmax, argmax_source
from symgpu.gpu.ops.softmax_rows import GpuSoftmaxRows
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.gpu.runtime.copykernel import STRIDED_COPY_SOURCE
from symgpu.gpu.ops.subtensor import GpuIncSubtensor, GpuJoin, GpuSubtensor

CPU_NAMES = {"Subtensor", "IncSubtensor", "Join", "Softmax", "LogSoftmax", "Argmax",
             "Elemwise", "CAReduce"}


def _graphs():
    x, y = T.matrix("x"), T.matrix("y")
    i = T.lscalar("i")
    v = T.vector("v")
    return [x, y, i, v], {
        "sub": (x[1:, i], GpuSubtensor),
        "sub_rev": (x[::-1, 2], GpuSubtensor),
        "sub_newaxis": (x[None, 0, ::2], GpuSubtensor),
        "set": (T.set_subtensor(x[1:3], y[0]), GpuIncSubtensor),
        "inc": (T.inc_subtensor(x[:, i], v), GpuIncSubtensor),
        "join": (T.concatenate([x, y], axis=1), GpuJoin),
        "softmax": (T.nnet.softmax(x), GpuSoftmaxRows),
        "log_softmax": (T.nnet.log_softmax(x, axis=0), None),
        "softmax_vector": (T.nnet.softmax(v), GpuSoftmaxRows),   # a 1 x n row, as Theano
        "argmax": (T.argmax(x, axis=1), GpuArgmax),
        "argmin_all": (T.argmin(x), GpuArgmax),
    }


@pytest.mark.parametrize("name", ["sub", "sub_rev", "sub_newaxis", "set", "inc", "join",
                                  "softmax", "log_softmax", "softmax_vector", "argmax",
                                  "argmin_all"])
def test_placement_on_virtual_context(name):
    with config.change_flags(floatX="float32", assert_no_cpu_op="raise"), virtual_context(None):
        inputs, graphs = _graphs()
        out, gpu_op = graphs[name]
        f = function(inputs, out, on_unused_input="ignore")
        ops = [n.op for n in f.maker.fgraph.toposort()]
        names = {type(op).__name__ for op in ops}
        assert not names & CPU_NAMES, names
        if gpu_op is not None:
            assert any(isinstance(op, gpu_op) for op in ops), names
        else:
            assert {"GpuCAReduce", "GpuElemwise"} <= names, names


def test_grad_of_subtensor_lifts():
    with config.change_flags(floatX="float32", assert_no_cpu_op="raise"), virtual_context(None):
        x = T.matrix("x")
        g = T.grad(T.sum(x[1:, 0] ** 2), x)
        f = function([x], g)
        names = {type(n.op).__name__ for n in f.maker.fgraph.toposort()}
        assert "GpuIncSubtensor" in names and not names & CPU_NAMES, names


def test_gpu_inc_subtensor_props_and_names_follow_the_host_op():
    from symgpu.tensor.subtensor import IncSubtensor, Slice
    idx = [Slice(1, None, None)]
    assert str(GpuIncSubtensor(idx, True)) == "Gpu" + str(IncSubtensor(idx, True))
    assert str(GpuIncSubtensor([0], False, True)) == "GpuIncSubtensor{0, inplace}"
    assert GpuIncSubtensor([0], False, True).destroy_map == {0: [0]}
    assert GpuIncSubtensor([0]) == GpuIncSubtensor([0]) != GpuIncSubtensor([0], True)


def test_int_index_stays_on_host():
    with config.change_flags(floatX="float32"), virtual_context(None):
        x, i = T.matrix("x"), T.lscalar("i")
        f = function([x, i], x[i])
        node = next(n for n in f.maker.fgraph.toposort() if isinstance(n.op, GpuSubtensor))
        assert type(node.inputs[1].type).__name__ == "TensorType"


@requires_nvcc
@pytest.mark.parametrize("source", [STRIDED_COPY_SOURCE, argmax_source()],
                         ids=["copy_and_inc", "argmax"])
def test_kernels_compile(source, tmp_path):
    cubin = compile_for_sm90(source, tmp_path)
    assert cubin


# ============================================================================ GPU

RNG = np.random.default_rng(42)


def _check(inputs, out, values, want, rtol=None):
    return check_on_gpu(inputs, out, values, want, CPU_NAMES, rtol)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpu_subtensor(cuda, dtype):
    x, i = T.matrix("x", dtype=dtype), T.lscalar("i")
    a = RNG.standard_normal((7, 5)).astype(dtype)
    _check([x, i], x[1:, i], [a, 3], a[1:, 3])
    _check([x, i], x[::-2, i], [a, -1], a[::-2, -1])
    _check([x, i], x[i, None, 1:4], [a, 2], a[2, None, 1:4])
    _check([x, i], x[i, i], [a, 4], a[4, 4])


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpu_inc_set_subtensor(cuda, dtype):
    x, y, v, i = T.matrix("x", dtype=dtype), T.matrix("y", dtype=dtype), \
        T.vector("v", dtype=dtype), T.lscalar("i")
    a = RNG.standard_normal((6, 5)).astype(dtype)
    b = RNG.standard_normal((2, 5)).astype(dtype)
    c = RNG.standard_normal(6).astype(dtype)
    want = a.copy(); want[1:3] = b
    _check([x, y], T.set_subtensor(x[1:3], y), [a, b], want)
    want = a.copy(); want[:, 2] += c
    _check([x, v, i], T.inc_subtensor(x[:, i], v), [a, c, 2], want)
    want = a.copy(); want[::-2, 1:] += 2.5
    _check([x], T.inc_subtensor(x[::-2, 1:], np.asarray(2.5, dtype=dtype)), [a], want)
    want = a.copy(); want[::-1, 0] = c
    _check([x, v], T.set_subtensor(x[::-1, 0], v), [a, c], want)
    _check([x, v], T.set_subtensor(x[::-1, 0], v), [a, c], want)  # reuse


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpu_join(cuda, dtype):
    x, y = T.matrix("x", dtype=dtype), T.matrix("y", dtype=dtype)
    a = RNG.standard_normal((3, 4)).astype(dtype)
    b = RNG.standard_normal((3, 2)).astype(dtype)
    _check([x, y], T.concatenate([x, y], axis=1), [a, b], np.concatenate([a, b], 1))
    c = RNG.standard_normal((4, 3)).astype(dtype)
    _check([x, y], T.concatenate([x, y.T, x], axis=0), [a, c], np.concatenate([a, c.T, a], 0))


def _np_softmax(a, axis):
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _np_log_softmax(a, axis):
    s = a - a.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("axis", [-1, 0, None])
def test_gpu_softmax(cuda, dtype, axis):
    x = T.matrix("x", dtype=dtype)
    a = (RNG.standard_normal((9, 33)) * 20).astype(dtype)
    _check([x], T.nnet.softmax(x, axis=axis), [a], _np_softmax(a, axis).astype(dtype),
           1e-4 if dtype == "float32" else None)
    _check([x], T.nnet.log_softmax(x, axis=axis), [a], _np_log_softmax(a, axis).astype(dtype),
           1e-4 if dtype == "float32" else None)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpu_argmax(cuda, dtype):
    x = T.tensor3("x", dtype=dtype)
    a = RNG.integers(-3, 4, (5, 700, 3)).astype(dtype)   # many ties: first index wins
    for axis in (0, 1, 2):
        _check([x], T.argmax(x, axis=axis), [a], np.argmax(a, axis=axis))
        _check([x], T.argmin(x, axis=axis), [a], np.argmin(a, axis=axis))
    _check([x], T.argmax(x), [a], np.asarray(np.argmax(a)))
    a[1, 5, 2] = np.nan
    _check([x], T.argmin(x), [a], np.asarray(np.argmin(a)))
