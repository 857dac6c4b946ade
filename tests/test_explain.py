"""symgpu.explain: the per-call costs read off a compiled graph (transfers, syncs, CPU ops,
float64 work, CUDA-graph status)."""
from __future__ import annotations

import io

import numpy as np

import symgpu
import symgpu.tensor as T
from gpu_helpers import requires_gpu
from symgpu import config, function


def _report(f) -> tuple[object, str]:
    buf = io.StringIO()
    rep = symgpu.explain(f, file=buf)
    assert buf.getvalue().strip() == str(rep)
    return rep, str(rep)


def test_a_cpu_function_has_no_transfers_and_names_float64_work():
    x = T.dvector("x")
    rep, text = _report(function([x], T.exp(x) * 2))
    assert not rep.on_gpu and rep.syncs_per_call == 0
    assert "runs on the CPU" in text
    assert rep.float64 and "float64" in text
    f32 = T.fvector("y")
    assert _report(function([f32], T.exp(f32)))[0].float64 == []


def test_explain_returns_without_printing_when_asked():
    x = T.fvector("x")
    f = function([x], x + 1)
    assert symgpu.explain(f, file=None).on_gpu is False


def test_a_gpu_function_lists_its_transfers_syncs_and_cpu_ops(vgpu):
    x, w, m = T.fmatrix("x"), T.fmatrix("w"), T.bmatrix("m")
    h = T.exp(T.dot(x, w))
    f = function([x, w, m], (h[m] * 2).sum())      # an int8 index: no GPU gather for it
    rep, text = _report(f)
    assert rep.on_gpu and rep.contexts == [None]
    assert any("'x'" in u and "an input" in u for u in rep.uploads), rep.uploads
    assert rep.downloads, "the cost comes back to the host"
    assert any("AdvancedSubtensor" in c for c in rep.cpu_ops), rep.cpu_ops
    # the result's copy at the end, and the round trip through the CPU op in the middle
    assert "at the end" in rep.syncs[0]
    assert any("copied to the host for AdvancedSubtensor" in s for s in rep.syncs[1:]), rep.syncs
    assert "CUDA graphs:" in text
    # the host copy of the result is the only thing a call has to wait for
    g = function([x, w], T.dot(x, w))
    rep2, _ = _report(g)
    assert rep2.syncs_per_call == 1 and len(rep2.uploads) == 2


def test_outputs_left_on_the_device_need_no_sync(vgpu):
    x = T.fmatrix("x")
    f = function([x], symgpu.Out(T.exp(x).transfer(None), borrow=True))
    rep, text = _report(f)
    assert rep.downloads == [] and rep.syncs_per_call == 0
    assert "returns without waiting" in text


def test_cuda_graph_status_follows_the_flag(vgpu):
    x = T.fmatrix("x")
    with config.change_flags(**{"gpuarray__cuda_graphs": False}):
        f = function([x], T.exp(x))
        assert "off" in _report(f)[0].graphs[0]


@requires_gpu
def test_explain_on_the_gpu_names_the_graph_key(cuda):
    x = T.fmatrix("x")
    lr = T.fscalar("lr")
    w = symgpu.shared(np.ones((4, 4), "float32"), name="w")
    f = function([x, lr], T.sum(T.dot(x, w)), updates=[(w, w - lr * T.dot(x.T, x))])
    rep, text = _report(f)
    assert rep.on_gpu and any("'lr'" in g for g in rep.graphs), text
    f(np.ones((4, 4), "float32"), 0.1)


def test_the_profile_points_to_explain_when_calls_wait_more_than_once(vgpu):
    """The profiler's kinds line names symgpu.explain once a call waits twice or more."""
    from symgpu.compile.profiling import ProfileStats
    x, m = T.fmatrix("x"), T.bmatrix("m")
    f = function([x, m], T.exp(x)[m] * 2)          # a round trip through the CPU gather (int8)
    stats = ProfileStats(atexit_print=False)
    for node in f.maker.fgraph.apply_nodes:
        stats.apply_callcount[node] = 1
        stats.apply_time[node] = 1e-3
    buf = io.StringIO()
    stats.summary_kinds(buf)
    assert stats.host_waits() >= 2
    assert "symgpu.explain(f)" in buf.getvalue()
