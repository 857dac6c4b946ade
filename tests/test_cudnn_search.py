"""cuDNN's algorithm search (symgpu/gpu/ops/cudnn.py ``ConvDescs.time_algorithms``) on a
stand-in library: every usable candidate of the heuristics is run once untimed, then timed,
and the fastest is kept with its workspace; tensor-op candidates are skipped for FMA-only
descriptors, oversized workspaces and failing runs are skipped, and the choice is kept per
geometry. The GPU test of the same (values against the CPU with timed algorithms) is
tests/test_gpu_conv.py::test_gpu_conv_timed_and_heuristic_algorithms_agree."""
from __future__ import annotations

import ctypes
import threading

import pytest

from symgpu.gpu.ops import cudnn as gcudnn

#: algo -> (math type, workspace bytes, seconds a run takes, status of a run)
CANDIDATES = {0: (0, 0, 5e-3, 0), 1: (0, 4096, 1e-3, 0), 3: (1, 0, 1e-4, 0),
              5: (0, 1 << 30, 1e-5, 0), 6: (0, 0, 1e-6, 9)}


class _Lib:
    """libcudnn's part ConvDescs uses: the heuristic query answers CANDIDATES (worst first),
    the convolution call records the algorithm it ran and answers its status."""

    def __init__(self):
        self.calls, self.ran, self.next = [], [], 100

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def fn(*args):
            self.calls.append(name)
            if name.startswith("cudnnCreate"):
                self.next += 1
                args[0]._obj.value = self.next
            elif name.endswith("Algorithm_v7"):
                args[-2]._obj.value = len(CANDIDATES)
                for slot, (algo, (math, _, _, _)) in zip(args[-1], CANDIDATES.items()):
                    slot.algo, slot.status, slot.mathType = algo, 0, math
            elif name.endswith("WorkspaceSize"):
                args[-1]._obj.value = CANDIDATES[args[-2]][1]
            elif name.startswith("cudnnConvolutionBackwardFilter"):
                algo = args[7]
                self.ran.append(algo)
                return CANDIDATES[algo][3]
            return 0
        return fn


def _plan(math: int) -> gcudnn.ConvDescs:
    lib = gcudnn._Cudnn.__new__(gcudnn._Cudnn)
    lib.lib, lib.path, lib.version = _Lib(), "fake", 91900
    lib.handles, lib.lock = {}, threading.Lock()
    ctx = type("Ctx", (), {"stream_handle": 0xabc, "activate": lambda self: self})()
    return gcudnn.ConvDescs(lib, ctx, "bwd_filter", "float32", (2, 1, 6, 6), (4, 1, 3, 3),
                            (2, 4, 4, 4), (0, 0), (1, 1), (1, 1), False, 1, math)


def _timer(plan, timed):
    def timer(run, n):
        before = len(plan.lib.lib.ran)
        for _ in range(n):
            run()
        algos = set(plan.lib.lib.ran[before:])
        assert len(algos) == 1
        (algo,) = algos
        timed.append((algo, n))
        return CANDIDATES[algo][2]
    return timer


@pytest.mark.parametrize("math, want", [(gcudnn.FMA_MATH, 1), (gcudnn.DEFAULT_MATH, 3)])
def test_the_fastest_usable_candidate_is_kept(monkeypatch, math, want):
    monkeypatch.setattr(gcudnn, "_TIMED", {})
    plan = _plan(math)
    assert plan.algo == 0 and plan.workspace == 0          # the heuristic's first
    timed = []
    plan.time_algorithms(1, 2, 3, 4, 1 << 20, timer=_timer(plan, timed))
    # 5: its workspace does not fit; 6: its run fails; 3: tensor ops, FMA only
    tried = [0, 1] if math == gcudnn.FMA_MATH else [0, 1, 3]
    assert timed == [(a, gcudnn.SEARCH_RUNS) for a in tried]
    # each tried candidate ran once untimed before its timed runs, and 6 once (failing)
    assert plan.lib.lib.ran == sum(([a] * (1 + gcudnn.SEARCH_RUNS) for a in tried), []) + [6]
    assert plan.algo == want and plan.timed
    assert plan.workspace == CANDIDATES[want][1]
    assert plan.math == (gcudnn.FMA_MATH if math == gcudnn.FMA_MATH else CANDIDATES[want][0])
    # the choice is kept per geometry: a second plan of the same shape runs nothing
    again = _plan(math)
    again.lib = plan.lib
    again.geometry = plan.geometry
    ran = len(plan.lib.lib.ran)
    again.time_algorithms(1, 2, 3, 4, 1 << 20, timer=_timer(again, []))
    assert again.algo == want and len(plan.lib.lib.ran) == ran


def test_no_candidate_runs_keeps_the_heuristic_choice(monkeypatch):
    monkeypatch.setattr(gcudnn, "_TIMED", {})
    plan = _plan(gcudnn.FMA_MATH)
    plan.time_algorithms(1, 2, 3, 4, 0, timer=_timer(plan, []))    # no workspace at all
    assert (plan.algo, plan.workspace, plan.timed) == (0, 0, True)
    assert plan.lib.lib.ran == [0] * (1 + gcudnn.SEARCH_RUNS) + [6]


def test_the_default_search_is_timed():
    from symgpu.gpu.ops import conv
    assert conv.ALGO_SEARCH == "time"


# ------------------------------------------------------------ symgpu's own algorithms

def _own(plan, name, seconds, workspace=512):
    """An OwnAlgorithm recorded in the stand-in's runs like a cuDNN algorithm (``name``),
    taking ``seconds`` by the timer _own_timer builds."""
    def run(a, b, out, ws):
        plan.lib.lib.ran.append((name, a, b, out, ws))
    SECONDS[name] = seconds
    return gcudnn.OwnAlgorithm(name, workspace, run)


SECONDS: dict = {}


def _own_timer(plan):
    def timer(run, n):
        before = len(plan.lib.lib.ran)
        for _ in range(n):
            run()
        (algo,) = {r if isinstance(r, int) else r[0] for r in plan.lib.lib.ran[before:]}
        return CANDIDATES[algo][2] if isinstance(algo, int) else SECONDS[algo]
    return timer


def test_an_own_algorithm_faster_than_cudnn_is_kept_and_runs(monkeypatch):
    monkeypatch.setattr(gcudnn, "_TIMED", {})
    plan = _plan(gcudnn.FMA_MATH)
    plan.add_own(_own(plan, "direct", 1e-7, workspace=2 << 20))
    assert plan.search_workspace >= 2 << 20
    plan.time_algorithms(1, 2, 3, 4, 4 << 20, timer=_own_timer(plan))
    # run once untimed and SEARCH_RUNS times, after cuDNN's candidates, on the search's buffers
    assert plan.lib.lib.ran[-1 - gcudnn.SEARCH_RUNS:] == [("direct", 1, 2, 3, 4)] * (
        1 + gcudnn.SEARCH_RUNS)
    assert 0 in plan.lib.lib.ran and 1 in plan.lib.lib.ran
    assert plan.own_choice.name == "direct" and plan.workspace == 2 << 20
    ran = len(plan.lib.lib.ran)
    plan.run(7, 8, 9, 10)
    assert plan.lib.lib.ran[ran:] == [("direct", 7, 8, 9, 10)]     # no cuDNN call
    # shared per geometry: another plan of the geometry with the algorithm takes it unrun;
    # one without it keeps cuDNN's heuristic choice
    again, bare = _plan(gcudnn.FMA_MATH), _plan(gcudnn.FMA_MATH)
    for p in (again, bare):
        p.lib, p.geometry = plan.lib, plan.geometry
    again.add_own(_own(again, "direct", 1e-7, workspace=2 << 20))
    again.time_algorithms(1, 2, 3, 4, 4 << 20, timer=_own_timer(again))
    bare.time_algorithms(1, 2, 3, 4, 4 << 20, timer=_own_timer(bare))
    assert len(plan.lib.lib.ran) == ran + 1
    assert again.own_choice is not None and again.workspace == 2 << 20
    assert bare.own_choice is None and (bare.algo, bare.workspace) == (0, 0)


@pytest.mark.parametrize("seconds, ws_size", [(1.0, 4 << 20), (1e-9, 1 << 10)])
def test_cudnn_is_kept_where_the_own_algorithm_is_slower_or_does_not_fit(monkeypatch, seconds,
                                                                         ws_size):
    monkeypatch.setattr(gcudnn, "_TIMED", {})
    plan = _plan(gcudnn.FMA_MATH)
    plan.add_own(_own(plan, "direct", seconds, workspace=2 << 10))
    plan.time_algorithms(1, 2, 3, 4, ws_size, timer=_own_timer(plan))
    tried = any(isinstance(r, tuple) for r in plan.lib.lib.ran)
    assert tried is (ws_size >= 2 << 10)
    assert plan.own_choice is None and plan.algo == (1 if ws_size >= 4096 else 0)
    ran = len(plan.lib.lib.ran)
    plan.run(7, 8, 9, 10)
    assert plan.lib.lib.ran[ran:] == [plan.algo]


@pytest.mark.parametrize("cls, xshape, wshape, yshape, offered", [
    # the 3-D CNN's first layer: 27 taps per filter
    ("GpuConv3dGradWeights", (8, 1, 32, 32, 32), (16, 1, 3, 3, 3), (8, 16, 30, 30, 30), True),
    # its second: 432 taps
    ("GpuConv3dGradWeights", (8, 16, 15, 15, 15), (32, 16, 3, 3, 3), (8, 32, 13, 13, 13),
     False),
    ("GpuConv2dGradWeights", (4, 3, 12, 12), (8, 3, 3, 3), (4, 8, 10, 10), True),
    ("GpuConv3d", (8, 1, 32, 32, 32), (16, 1, 3, 3, 3), (8, 16, 30, 30, 30), False)])
def test_the_conv_ops_offer_the_direct_filter_gradient(monkeypatch, cls, xshape, wshape,
                                                       yshape, offered):
    import numpy as np

    from symgpu.gpu.ops import conv as gconv
    from test_gpu_conv3d import _fake_binding     # its stand-in answers the N-d shape query
    lib = _fake_binding()
    monkeypatch.setattr(gconv, "cudnn", lambda: lib)
    op = getattr(gconv, cls)()
    ctx = type("Ctx", (), {"stream_handle": 0xabc, "activate": lambda self: self})()
    plan = op._plan(ctx, "cudnn", {}, np.dtype("float32"), xshape, wshape, yshape,
                    op.pads(wshape[2:]))
    assert [a.name for a in plan.own] == (["direct"] if offered else [])
