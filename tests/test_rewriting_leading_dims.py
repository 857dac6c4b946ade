"""sink_leading_dims: an elementwise node whose inputs all carry a leading length-1 axis added
by DimShuffles computes without it (and adds it to its result), so fusion and the Gemm
rewrite reach it: checked against NumPy, on the rewritten host graph, and on a (virtual) GPU
scan gradient's step."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.config import config
from symgpu.tensor.elemwise import DimShuffle, Elemwise

sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "benchmarks"))      # appended: benchmarks/random.py is no stdlib
import rnn_cells as rc  # noqa: E402

rng = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _keep_flags():
    """rnn_cells.build_symbolic sets floatX, as a script may: put it back afterwards."""
    with config.change_flags(floatX=config.floatX):
        yield


def _elemwise_nodes(f):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, Elemwise)]


def test_the_leading_axis_moves_to_the_result_and_the_work_fuses():
    a, m = T.matrix("a"), T.vector("m")
    y = T.exp(a)
    z = y.dimshuffle("x", 0, 1) * 2 + (1 - m.dimshuffle("x", 0, "x")) * 3
    f = function([a, m], [y * 3, z])
    av, mv = rng.standard_normal((4, 5)), rng.standard_normal(4)
    got = f(av, mv)
    np.testing.assert_allclose(got[0], np.exp(av) * 3)
    np.testing.assert_allclose(got[1], (np.exp(av) * 2 + (1 - mv[:, None]) * 3)[None])
    assert len(_elemwise_nodes(f)) == 1            # one kernel for both results
    last = f.maker.fgraph.outputs[1].owner
    assert isinstance(last.op, DimShuffle) and last.op.new_order[0] == "x"


def test_it_reaches_the_gemm_of_a_state_adjoint():
    """adj(1, B, H) = g(...)[None] + dot(d, U.T)[None]: without the leading axis the add is
    the Gemm's accumulation."""
    d, U, g = T.matrix("d"), T.matrix("U"), T.matrix("g")
    out = T.tanh(g).dimshuffle("x", 0, 1) + T.dot(d, U.T).dimshuffle("x", 0, 1)
    f = function([d, U, g], out)
    dv, Uv, gv = (rng.standard_normal(s) for s in ((3, 4), (5, 4), (3, 5)))
    np.testing.assert_allclose(f(dv, Uv, gv), (np.tanh(gv) + dv @ Uv.T)[None], rtol=1e-6)
    names = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert any("Gemm" in n for n in names) and "Dot22" not in names, names


def test_nothing_changes_without_an_added_axis_or_with_a_real_one():
    a, b = T.tensor3("a"), T.tensor3("b")
    f = function([a, b], a * b + 1)                   # no DimShuffle: stays as it is
    assert not [n for n in f.maker.fgraph.toposort() if isinstance(n.op, DimShuffle)]
    av = rng.standard_normal((3, 2, 2))
    x = T.matrix("x")
    g = function([x, a], x.dimshuffle("x", 0, 1) * a)   # a's axis 0 is not length 1
    np.testing.assert_allclose(g(av[0], av), av[0][None] * av)


def test_a_constant_input_loses_the_axis_itself_and_stays_a_literal():
    a = T.matrix("a")
    c = T.constant(np.full((1, 1, 1), 2.0))
    f = function([a], T.exp(a).dimshuffle("x", 0, 1) * c)
    av = rng.standard_normal((2, 3))
    np.testing.assert_allclose(f(av), (np.exp(av) * 2)[None])
    assert len(_elemwise_nodes(f)) == 1
    assert not any(isinstance(v, symgpu.graph.basic.Constant) and v.ndim == 2
                   for n in _elemwise_nodes(f) for v in n.inputs)   # inlined, not an array


@pytest.mark.parametrize("cell", ["lstm", "gru", "elman", "peephole", "droplstm"])
def test_masked_cells_train_the_same_with_and_without_the_rewrite(cell):
    spec = rc.Spec(cell, True, "last", 3, 4, False, inp=5, fixed=6)
    calls = rc.calls(spec, 3)
    res = {}
    for off in (False, True):
        flags = {"optimizer_excluding": "sink_leading_dims"} if off else {}
        with config.change_flags(**flags):
            call, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec),
                                            rc.data(spec))
            res[off] = [float(call(n, mk)) for n, mk, _ in calls]
    np.testing.assert_allclose(res[False], res[True], rtol=1e-5, atol=1e-7)


def test_vgpu_masked_lstm_backward_step_is_three_launches(vgpu):
    """The gate kernel, the join of the gate gradients, and the Gemm that accumulates the
    state's adjoint (before: a separate add and the cell state's adjoint kernel)."""
    from symgpu.compile.mode import get_mode
    spec = rc.Spec("lstm", True, "last", 16, 128, False)
    loop = get_mode(None).excluding_tags("scan_to_dnn_rnn")      # the loop, not cuDNN
    _, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                                 mode=loop)
    loops = [n for n in fn.maker.fgraph.toposort() if getattr(n.op, "inner", None) is not None]
    body = loops[-1].op.inner.rewritten().toposort()
    work = [type(n.op).__name__ for n in body if type(n.op).__name__ in
            ("GpuElemwise", "GpuElemwiseGroup", "GpuGemm", "GpuDot22", "GpuJoin")]
    empty = [n for n in body if type(n.op).__name__ == "GpuElemwise" and
             "second" in str(n.op)]                    # the zero block of pre[:, 4H:] (empty)
    # (a group: the gate kernel with that zero block, the body's two sinks: one launch)
    assert len(work) - len(empty) == 3, work
    assert "GpuGemm" in work and "GpuDot22" not in work


def test_a_scalars_arithmetic_stays_in_the_kernel_that_reads_it():
    """a * (exp(s)[None, None, None] * 2): the scalar part has no real axis to lose;
    rewritten, it became a kernel of its own behind a DimShuffle (the GPT step's mean
    divisor did)."""
    a, s = T.tensor3("a"), T.scalar("s")
    f = function([a, s], a * (T.exp(s).dimshuffle("x", "x", "x") * 2))
    av = rng.standard_normal((2, 3, 4))
    np.testing.assert_allclose(f(av, 0.5), av * np.exp(0.5) * 2)
    assert len(_elemwise_nodes(f)) == 1
