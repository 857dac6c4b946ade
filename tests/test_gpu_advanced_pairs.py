"""x[a, b] of a matrix and its set/inc on the GPU, GpuARange (symgpu/gpu/ops/advanced_pairs.py):
placement on a virtual context, nvcc compilation, values against NumPy on a real GPU."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from gpu_helpers import (assert_one_segment, check_on_gpu, compile_for_sm90, requires_gpu,
                         requires_nvcc, tutorial_minibatch_step)
from symgpu import config, function
from symgpu.gpu.ops.advanced_pairs import (GpuARange, GpuAdvancedIncSubtensor2,
                                       GpuAdvancedSubtensor2, pairs_source)
from symgpu.gpu.placement.rewriting import virtual_context

CPU_NAMES = {"AdvancedSubtensor", "AdvancedIncSubtensor", "ARange"}


def _ops(f) -> set[str]:
    return {type(n.op).__name__ for n in f.maker.fgraph.toposort()}


def _nll_graph():
    x, w, y = T.matrix("x"), T.matrix("w"), T.ivector("y")
    p = T.nnet.softmax(T.dot(x, w))
    nll = -T.mean(T.log(p)[T.arange(y.shape[0]), y])
    return [x, w, y], nll, symgpu.grad(nll, w)


def test_the_tutorials_nll_and_its_gradient_stay_on_the_gpu():
    with config.change_flags(floatX="float32"), virtual_context(None):
        inputs, nll, g = _nll_graph()
        for flags in ({"optimizer_excluding": "gpu_take_rows"}, {}):
            with config.change_flags(**flags):
                f = function(inputs, [nll, g])
            names = _ops(f)
            assert not names & CPU_NAMES, names
            # the gradient's scatter and what reads it are one GpuNLLGrad (nll_grad.py)
            if flags:
                assert {"GpuAdvancedSubtensor2", "GpuNLLGrad", "GpuARange"} <= names, names
            else:   # the default passes: the gather at arange rows is a GpuTakeRows
                assert {"GpuTakeRows", "GpuNLLGrad"} <= names, names
                assert not {"GpuAdvancedSubtensor2", "GpuARange"} & names, names
            report = symgpu.explain(f, file=None)
            assert report.syncs_per_call == 1, report.syncs     # only the results' copy


def test_broadcast_arange_indices_are_made_on_the_device():
    """A gather at ``y[arange(n)[:, None], arange(m)[None, :]]`` (scan_to_dnn_rnn's held
    states): both ranges become GpuARange under a GpuDimShuffle, not host ranges uploaded
    every call."""
    from symgpu.gpu.placement.basic_ops import GpuFromHost
    with config.change_flags(floatX="float32"), virtual_context(None):
        y = T.tensor3("y")
        t = T.arange(y.shape[0]).dimshuffle(0, "x")
        rows = T.arange(y.shape[1]).dimshuffle("x", 0)
        f = function([y], y[t, rows] * 2)
        nodes = f.maker.fgraph.toposort()
        names = _ops(f)
        assert "GpuARange" in names and not names & CPU_NAMES, names
        uploads = [n for n in nodes if isinstance(n.op, GpuFromHost) and
                   n.inputs[0].owner is not None and n.inputs[0].dtype.startswith("int")]
        assert not uploads, [str(n.inputs[0].owner.op) for n in uploads]


def test_the_minibatch_step_is_one_captured_segment():
    """The deep-learning tutorials' minibatch MLP step (data sliced by an index, the NLL's
    pairs gather): the mean's divisor is the gather's length, computed on the host from the
    index vectors' lengths before the launches, not read from the gather's output between
    kernels (which split the step into two segments on the H100). Compiled without
    gpu_take_rows and gpu_careduce_epilogue (both in fast_run; the default step is
    tests/test_gpu_take_rows.py's)."""
    f = tutorial_minibatch_step(optimizer_excluding="gpu_take_rows:gpu_careduce_epilogue")
    nodes = f.maker.fgraph.toposort()
    assert "GpuAdvancedSubtensor2" in {type(n.op).__name__ for n in nodes}
    assert not any(type(n.op).__name__ == "GpuCAReduce" and n.op.post_scalar_op is not None
                   for n in nodes)
    assert_one_segment(nodes)


def test_pair_forms_that_stay_on_the_cpu():
    with config.change_flags(floatX="float32"), virtual_context(None):
        x3, iv, jv, m = T.tensor3("x3"), T.lvector("iv"), T.lvector("jv"), T.lmatrix("m")
        f = function([x3, iv, jv], x3[iv, jv], on_unused_input="ignore")
        assert "GpuAdvancedSubtensor2" not in _ops(f)           # a 3-d array
        x = T.matrix("x")
        f = function([x, m, iv], x[m, iv], on_unused_input="ignore")
        assert "GpuAdvancedSubtensor2" not in _ops(f)           # a matrix index


def test_make_node_checks_its_inputs():
    with config.change_flags(floatX="float32"), virtual_context(None):
        from symgpu.gpu.placement.type import GpuArrayType
        gx = GpuArrayType("float32", (False, False))("gx")
        gv = GpuArrayType("float32", (False,))("gv")
        gi = GpuArrayType("int64", (False,))("gi")
        with pytest.raises(TypeError, match="must be a GPU"):
            GpuAdvancedSubtensor2()(gv, gi, gi)
        with pytest.raises(TypeError, match="second index"):
            GpuAdvancedSubtensor2()(gx, gi, gv)
        with pytest.raises(TypeError, match="scalar or vector"):
            GpuAdvancedIncSubtensor2()(gx, gx, gi, gi)
        with pytest.raises(TypeError, match="int32/int64 ranges"):
            GpuARange("float32")
        out = GpuAdvancedSubtensor2()(gx, gi, gi)
        assert out.type == GpuArrayType("float32", (False,))


@requires_nvcc
def test_kernels_compile(tmp_path):
    assert compile_for_sm90(pairs_source(), tmp_path)


# ============================================================================ GPU

RNG = np.random.default_rng(11)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("idx_dtypes", [("int64", "int32"), ("int32", "int64")])
def test_gpu_pair_gather_set_inc(cuda, dtype, idx_dtypes):
    x, y = T.matrix("x", dtype=dtype), T.vector("y", dtype=dtype)
    a, b = T.vector("a", dtype=idx_dtypes[0]), T.vector("b", dtype=idx_dtypes[1])
    xv = (RNG.standard_normal((5, 7)) * 10).astype(dtype)
    av = np.asarray([0, 4, -1, 2, 2, 0], dtype=idx_dtypes[0])
    bv = np.asarray([6, 0, -7, 3, 3, 0], dtype=idx_dtypes[1])
    yv = (RNG.standard_normal(6) * 10).astype(dtype)
    check_on_gpu([x, a, b], x[a, b], [xv, av, bv], xv[av, bv], CPU_NAMES)
    check_on_gpu([x, a, b], x[a, b], [xv[:, ::2], av, bv % 4], xv[:, ::2][av, bv % 4],
                 CPU_NAMES)                                                # strided x
    check_on_gpu([x, a, b], x[a, b], [xv, av[:1], bv], xv[av[:1], bv], CPU_NAMES)  # broadcast
    want = xv.copy()
    np.add.at(want, (av, bv), yv)
    check_on_gpu([x, y, a, b], T.inc_subtensor(x[a, b], y), [xv, yv, av, bv], want, CPU_NAMES,
                 1e-5 if dtype == "float32" else None)
    want = xv.copy()
    k = [0, 1, 3]                                                          # distinct pairs
    want[av[k], bv[k]] = yv[k]
    check_on_gpu([x, y, a, b], T.set_subtensor(x[a, b], y), [xv, yv[k], av[k], bv[k]],
                 want, CPU_NAMES)


@requires_gpu
def test_gpu_pair_index_out_of_bounds(cuda):
    x, a, b = T.matrix("x"), T.lvector("a"), T.lvector("b")
    f = function([x, a, b], x[a, b])
    xv = np.zeros((3, 4), "float32")
    with pytest.raises(IndexError, match=r"index 4 is out of bounds .*shape \(3, 4\)"):
        f(xv, np.asarray([0, 1]), np.asarray([1, 4]))
    with pytest.raises(IndexError, match=r"index -4 is out of bounds"):
        f(xv, np.asarray([-4, 1]), np.asarray([1, 1]))
    assert np.array_equal(f(xv, np.asarray([2]), np.asarray([-1])), [0])


@requires_gpu
@pytest.mark.parametrize("args", [(0, 10, 1), (3, 20, 4), (10, 0, -3), (5, 5, 1), (-7, 8, 5)])
def test_gpu_arange(cuda, args):
    start, stop, step = (T.lscalar(n) for n in ("start", "stop", "step"))
    v = T.vector("v")
    f = function([start, stop, step, v], v[T.arange(start, stop, step)], on_unused_input="ignore")
    assert "GpuARange" in _ops(f)
    vv = np.arange(40, dtype="float32") - 20
    np.testing.assert_array_equal(f(*args, vv), vv[np.arange(*args)])


@requires_gpu
def test_gpu_nll_step_matches_the_cpu(cuda):
    inputs, nll, g = _nll_graph()
    xv = RNG.standard_normal((16, 5)).astype("float32")
    wv = RNG.standard_normal((5, 3)).astype("float32")
    yv = RNG.integers(0, 3, 16).astype("int32")
    f = function(inputs, [nll, g])
    assert not _ops(f) & CPU_NAMES
    got = f(xv, wv, yv)
    z = xv @ wv
    logp = z - z.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    np.testing.assert_allclose(got[0], -logp[np.arange(16), yv].mean(), rtol=1e-5)
    onehot = np.eye(3, dtype="float32")[yv]
    np.testing.assert_allclose(got[1], xv.T @ (np.exp(logp) - onehot) / 16, rtol=1e-4,
                               atol=1e-6)


@requires_gpu
@pytest.mark.gpu
def test_gpu_gather_at_broadcast_device_ranges(cuda):
    """y[arange(n)[:, None], arange(m)[None, :]] with the ranges made on the device: NumPy's
    values, and no host range left."""
    y = T.tensor3("y", dtype="float32")
    t = T.arange(y.shape[0]).dimshuffle(0, "x")
    rows = T.arange(y.shape[1]).dimshuffle("x", 0)
    yv = np.random.default_rng(2).standard_normal((5, 3, 4)).astype("float32")
    n, m = np.arange(5)[:, None], np.arange(3)[None, :]
    f = check_on_gpu([y], y[t, rows] * 2, [yv], yv[n, m] * 2, CPU_NAMES)
    assert "GpuARange" in _ops(f)
