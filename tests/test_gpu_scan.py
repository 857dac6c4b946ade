"""Loops and branches on the GPU: Scan -> GpuScan, IfElse -> GpuIfElse.

CPU tests compile for a virtual sm_90 context and inspect the lifted graphs: the loop is a
GpuScan whose compiled body reads and writes GPU values only (no transfer, no CPU op inside
the loop), the backward scan of a gradient too.  Tests marked ``gpu`` run the loops on the
device against the CPU's results (float32 tolerances), check that a loop of known length is
replayed as one CUDA graph, and run tests/test_scan.py and tests/test_scan_grad.py with
``device=cuda``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from gpu_helpers import real_default_gpu, requires_gpu
from symgpu import config, function
from symgpu.graph.basic import Constant
from symgpu.gpu.placement.basic_ops import GpuFromHost, HostFromGpu
from symgpu.gpu.placement.rewriting import cpu_nodes, virtual_context
from symgpu.gpu.ops.scan_ifelse import GpuIfElse
from symgpu.gpu.ops.scan_op import GpuScan
from symgpu.ifelse import IfElse, ifelse
from symgpu.scan.op import Scan

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def loops(f, cls=Scan):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, cls)]


def transfers_inside(fg) -> list:
    """Transfers in a compiled body, except uploads of constants (folded on a real device)."""
    return [n for n in fg.toposort() if isinstance(n.op, (GpuFromHost, HostFromGpu))
            and not (isinstance(n.op, GpuFromHost) and isinstance(n.inputs[0], Constant))]


def rnn_graph():
    x, h0 = T.matrix("x"), T.vector("h0")
    W = T.matrix("W")
    h, _ = symgpu.scan(lambda xt, h, W: T.tanh(T.dot(W, h) + xt), sequences=[x],
                       outputs_info=[h0], non_sequences=[W])
    return [x, h0, W], h


def assert_on_device(node):
    op = node.op
    op.inner.compile()
    fg = op.inner.compiled_fgraph
    found = transfers_inside(fg)
    if op.info.as_while:   # the condition is read on the host (the one sync of a step)
        found = [n for n in found if n.outputs[0] is not fg.outputs[-1]]
    assert not found, [str(n) for n in found]
    assert not cpu_nodes(fg), [str(n) for n in cpu_nodes(fg)]
    for v in fg.inputs[:op.info.n_seqs + op.info.n_taps]:
        assert type(v.type).__name__ == "GpuArrayType", v.type
    for v in fg.outputs[:op.info.n_states + op.info.n_nitsot]:
        assert type(v.type).__name__ == "GpuArrayType", v.type


# ============================================================================ placement (CPU)

def test_rnn_loop_becomes_a_gpu_scan_with_a_gpu_body(vgpu):
    ins, h = rnn_graph()
    f = function(ins, h[-1])
    (node,) = loops(f)
    assert isinstance(node.op, GpuScan)
    assert all(type(o.type).__name__ == "GpuArrayType" for o in node.outputs)
    assert_on_device(node)
    names = [type(n.op).__name__ for n in node.op.inner.compiled_fgraph.toposort()]
    assert "GpuGemv" in names, names


def test_backward_scan_lifts_the_same_way(vgpu):
    (x, h0, W), h = rnn_graph()
    cost = (h ** 2).sum()
    f = function([x, h0, W], symgpu.grad(cost, [W, h0, x]))
    nodes = loops(f)
    assert len(nodes) == 2 and all(isinstance(n.op, GpuScan) for n in nodes)
    for n in nodes:
        assert_on_device(n)


def test_backward_scan_accumulates_the_weight_gradients_in_place(vgpu):
    """The accumulators of BPTT (keep-last states the loop owns) are updated by in-place GEMMs:
    no copy of dW per step; the forward loop's kept state and the sequences stay untouched."""
    from symgpu.gpu.ops.scan_op import scratch_states
    x, y = T.tensor3("x"), T.tensor3("y")
    wx, wh, b = T.matrix("wx"), T.matrix("wh"), T.vector("b")
    h0 = T.zeros((4, 5), dtype="float32")
    h, _ = symgpu.scan(lambda xt, hp: T.tanh(T.dot(xt, wx) + T.dot(hp, wh) + b), sequences=x,
                       outputs_info=h0)
    with config.change_flags(optimizer_excluding="scan_pushout_acc"):
        f = function([x, y, wx, wh, b], symgpu.grad(((h - y) ** 2).mean(), [wx, wh, b]))
    fwd, bwd = sorted(loops(f, GpuScan), key=lambda n: n.op.info.name != "scan")
    assert scratch_states(fwd.op.info) == ()
    assert scratch_states(bwd.op.info) == (0, 1, 2, 3)
    bwd.op._compiled()
    fg = bwd.op.inner.compiled_fgraph
    gemms = [n for n in fg.toposort() if type(n.op).__name__ == "GpuGemm"]
    assert len(gemms) == 2 and all(n.op.destroy_map for n in gemms), [str(n) for n in gemms]
    taps = fg.inputs[bwd.op.info.n_seqs:bwd.op.info.n_seqs + bwd.op.info.n_taps]
    assert {n.inputs[0] for n in gemms} <= set(taps)
    assert bwd.op._scratch_copy == frozenset()
    copies = [n for n in fg.toposort() if "Copy" in type(n.op).__name__]
    assert not copies, [str(n) for n in copies]
    for v in fg.inputs[:bwd.op.info.n_seqs]:   # sequences are never overwritten
        assert not getattr(v.tag, "loop_scratch", False)


def test_bptt_step_on_the_gpu_is_the_recurrent_work_only(vgpu):
    """With scan_pushout_acc (default) the weight gradients are summed after the loop: the
    backward step is one elementwise kernel and one product with W_h.T."""
    x, y = T.tensor3("x"), T.tensor3("y")
    wx, wh, b = T.matrix("wx"), T.matrix("wh"), T.vector("b")
    h0 = T.zeros((4, 5), dtype="float32")
    h, _ = symgpu.scan(lambda xt, hp: T.tanh(T.dot(xt, wx) + T.dot(hp, wh) + b), sequences=x,
                       outputs_info=h0)
    f = function([x, y, wx, wh, b], symgpu.grad(((h - y) ** 2).mean(), [wx, wh, b]))
    (bwd,) = [n for n in loops(f, GpuScan) if n.op.info.name == "grad_of_scan"]
    assert_on_device(bwd)
    names = [type(n.op).__name__ for n in bwd.op.inner.compiled_fgraph.toposort()]
    launches = [nm for nm in names if nm not in ("GpuSubtensor", "GpuDimShuffle")]
    assert sorted(launches) == ["GpuDot22", "GpuElemwise"], names


def test_loop_bodies_kernels_join_the_outer_prefetch_batch(vgpu):
    """The kernel prefetch of the outer function asks each GpuScan for its body's modules
    (rewritten, not yet linked), so a cold compile runs one parallel nvcc batch, not one
    per loop body; linking the body later reuses that rewritten graph."""
    from symgpu.gpu.exec import prefetch
    from symgpu.gpu.ops.elemwise import GpuElemwise
    x, y = T.tensor3("x"), T.tensor3("y")
    wx, wh = T.matrix("wx"), T.matrix("wh")
    h, _ = symgpu.scan(lambda xt, hp: T.tanh(T.dot(xt, wx) + T.dot(hp, wh)), sequences=x,
                       outputs_info=T.zeros((4, 5), dtype="float32"))
    f = function([x, y, wx, wh], symgpu.grad(((h - y) ** 2).mean(), [wx, wh]))
    fresh = [GpuScan(n.op.inner_inputs, n.op.inner_outputs, n.op.info, n.op.mode,
                     n.op.context_name, n.op.scratch) for n in loops(f, GpuScan)]
    nodes = [op.make_node(*n.inputs) for op, n in zip(fresh, loops(f, GpuScan))]
    reqs = prefetch.requests(nodes, include_virtual=True, skip_seen=False)
    want = set()
    for op in fresh:
        assert op.inner.vm is None   # asked before linking
        for n in op.inner.rewritten().toposort():
            if isinstance(n.op, GpuElemwise):
                want.update(k for k, _, _ in n.op.prefetch_sources(n))
    assert want and want <= {r.key for r in reqs}
    rewritten = fresh[0].inner.rewritten()
    fresh[0]._compiled()
    assert fresh[0].inner.compiled_fgraph is rewritten


def test_strided_views_fed_to_copies_prefetch_the_copy_kernel(vgpu):
    """A cold compile of the BPTT + SGD step asks for the strided-copy module at link: the
    backward loop's inputs are reversed sequences and a transposed weight (the captured
    loop copies them into its own buffers), the weight gradients reshape reversed views;
    an increment of a region (GpuIncSubtensor) runs it too.  Nothing compiles on the first
    call."""
    from symgpu.gpu.exec import prefetch
    from symgpu.gpu.placement.basic_ops import GpuReshape
    from symgpu.gpu.ops.subtensor import GpuIncSubtensor
    x, y = T.tensor3("x"), T.tensor3("y")
    wx, wh = T.matrix("wx"), T.matrix("wh")
    h, _ = symgpu.scan(lambda xt, hp: T.tanh(T.dot(xt, wx) + T.dot(hp, wh)), sequences=x,
                       outputs_info=T.zeros((4, 5), dtype="float32"))
    f = function([x, y, wx, wh], symgpu.grad(((h - y) ** 2).mean(), [wx, wh]))
    nodes = f.maker.fgraph.toposort()
    copy = ("symgpu.strided_copy",)
    asked = {type(n.op).__name__ for n in nodes if n.op.__class__ in (GpuScan, GpuReshape,
                                                                       GpuIncSubtensor)
             and copy in [k for k, _, _ in n.op.prefetch_sources(n)]}
    assert asked == {"GpuScan", "GpuReshape"}, asked
    assert copy in [r.key for r in prefetch.requests(nodes, include_virtual=True,
                                                     skip_seen=False)]
    v = T.matrix("v")
    g = function([v, x], T.inc_subtensor(v[1:], x[0]))
    (inc,) = [n for n in g.maker.fgraph.toposort() if isinstance(n.op, GpuIncSubtensor)]
    assert [k for k, _, _ in inc.op.prefetch_sources(inc)] == [copy]


def test_maybe_strided_follows_views_to_a_step_or_a_transpose(vgpu):
    from symgpu.gpu.placement.basic_ops import GpuDimShuffle
    from symgpu.gpu.ops.elemwise import gpu_elemwise
    from symgpu.gpu.exec.prefetch import maybe_strided
    from symgpu.gpu.ops.subtensor import GpuSubtensor
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.tensor.subtensor import Slice

    def sl(x, *parts):
        return GpuSubtensor([Slice(*p) for p in parts])(x)

    def ds(x, *order):
        return GpuDimShuffle(x.broadcastable, order)(x)
    g = GpuArrayType("float32", (False,) * 3, None)("g")
    assert not maybe_strided(g)
    assert maybe_strided(sl(g, (None, None, -1)))
    assert maybe_strided(sl(sl(g, (1, None, None)), (None, None, 2)))
    assert maybe_strided(ds(g, 1, 0, 2))
    assert maybe_strided(ds(sl(sl(g, (None, None, -1)), (2, None, None)), 0, "x", 1, 2))
    assert not maybe_strided(sl(g, (1, None, None)))
    assert not maybe_strided(ds(sl(g, (2, 5, None)), 0, 1, "x", 2))
    # a computed value is a fresh contiguous array, whatever it was computed from
    assert not maybe_strided(gpu_elemwise("exp", sl(g, (None, None, -1))))


def test_taps_backwards_nitsot_and_until_place_on_the_gpu(vgpu):
    x = T.matrix("x")
    h0 = T.matrix("h0")
    outs, _ = symgpu.scan(lambda xt, a, b: [a + b * xt, (a * xt).sum()], sequences=x,
                          outputs_info=[dict(initial=h0, taps=[-2, -1]), None],
                          go_backwards=True)
    v0 = T.scalar("v0")
    powers, _ = symgpu.scan(lambda v: (v * 2, symgpu.scan_module.until(v * 2 > 100)),
                            outputs_info=v0, n_steps=50)
    f = function([x, h0, v0], outs + [powers])
    nodes = loops(f)
    assert len(nodes) == 2 and all(isinstance(n.op, GpuScan) for n in nodes)
    for n in nodes:
        assert_on_device(n)
    while_op = next(n.op for n in nodes if n.op.info.as_while)
    cond = while_op.inner.compiled_fgraph.outputs[-1]
    assert type(cond.type).__name__ == "TensorType"   # read on the host: one sync per step


def test_integer_non_sequences_stay_on_the_host(vgpu):
    x, k = T.matrix("x"), T.lscalar("k")
    out, _ = symgpu.scan(lambda xt, k: xt[:k] * 2, sequences=x,
                         non_sequences=k)
    f = function([x, k], out)
    (node,) = loops(f)
    assert isinstance(node.op, GpuScan)
    assert f.maker.fgraph.inputs[1] in node.inputs   # k itself, not an upload


def test_gpu_typed_values_inside_the_loop_stay_as_they_are(vgpu):
    """A GPU shared variable read in the body is a GPU-typed inner input (scan() makes it an
    implicit non-sequence of its own type): the lifted body takes it as it is."""
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.scan.op import ScanInfo
    Wg = GpuArrayType("float32", (False, False))("W")
    v, ph = T.vector("v"), Wg.type("W_inner")
    op = Scan([v, ph], [T.dot(v, HostFromGpu()(ph))], ScanInfo(1, (), (), 1, 1))
    x = T.matrix("x")
    out = op(x.shape[0], x, Wg)
    f = function([x, Wg], out)
    (node,) = loops(f)
    assert isinstance(node.op, GpuScan)
    assert_on_device(node)


def test_gpu_scan_is_cached_per_cpu_loop(vgpu):
    ins, h = rnn_graph()
    f1 = function(ins, h.sum())
    f2 = function(ins, h.sum() * 2)
    assert loops(f1)[0].op is loops(f2)[0].op


def test_no_gpu_context_keeps_the_host_scan():
    ins, h = rnn_graph()
    f = function(ins, h[-1])
    (node,) = loops(f)
    assert type(node.op) is Scan


def test_ifelse_becomes_a_gpu_ifelse(vgpu):
    a, y = T.scalar("a"), T.vector("y")
    f = function([a, y], ifelse(a > 0, T.exp(y), y * 2))
    (node,) = loops(f, IfElse)
    assert isinstance(node.op, GpuIfElse)
    for fn in (node.op.then_fn, node.op.else_fn):
        fn.compile()
        assert not transfers_inside(fn.compiled_fgraph)
        assert not cpu_nodes(fn.compiled_fgraph)


def test_lifted_loops_pickle(vgpu):
    import pickle
    ins, h = rnn_graph()
    f = function(ins, h[-1])
    op = loops(f)[0].op
    op.loop_graphs = object()   # what a real call leaves: never pickled
    clone = pickle.loads(pickle.dumps(op))
    assert isinstance(clone, GpuScan) and clone.loop_graphs is None


# ============================================================================ on the device

def _pair(build, *args, calls=1):
    """Results of `build()`'s function compiled for the host and for the GPU, `calls` times
    (shared variables are built afresh for each)."""
    results = []
    for gpu in (False, True):
        with config.change_flags(floatX="float32"):
            if gpu:
                with real_default_gpu():
                    ins, outs, upd = build()
                    f = function(ins, outs, updates=upd)
                    res = [f(*args) for _ in range(calls)]
                    assert any(isinstance(n.op, (GpuScan, GpuIfElse))
                               for n in f.maker.fgraph.toposort())
            else:
                ins, outs, upd = build()
                f = function(ins, outs, updates=upd)
                res = [f(*args) for _ in range(calls)]
        results.append(res)
    return results


def _close(a, b, rtol=2e-5, atol=2e-5):
    for ra, rb in zip(a, b):
        ra = ra if isinstance(ra, (list, tuple)) else [ra]
        rb = rb if isinstance(rb, (list, tuple)) else [rb]
        for u, v in zip(ra, rb):
            np.testing.assert_allclose(np.asarray(v), np.asarray(u), rtol=rtol, atol=atol)


def _f32(*shape, seed=0):
    return np.random.RandomState(seed).randn(*shape).astype("float32")


def _power():
    A, k = T.vector("A"), T.iscalar("k")
    r, u = symgpu.scan(lambda p, A: p * A, outputs_info=T.ones_like(A), non_sequences=A,
                       n_steps=k)
    return [A, k], r[-1], u


def _polynomial():
    c, x = T.vector("c"), T.scalar("x")
    comp, u = symgpu.scan(lambda ci, p, x: ci * x ** T.cast(p, "float32"), outputs_info=None,
                          sequences=[c, T.arange(1000)], non_sequences=x)
    return [c, x], comp.sum(), u


def _rnn_taps_backwards():
    x, h0 = T.tensor3("x"), T.tensor3("h0")
    W = T.matrix("W")
    outs, u = symgpu.scan(lambda xt, a, b, W: [T.tanh(T.dot(a + b, W) * .5 + xt), (xt * b).sum()],
                          sequences=x, outputs_info=[dict(initial=h0, taps=[-2, -1]), None],
                          non_sequences=W, go_backwards=True)
    return [x, h0, W], outs, u


def _until():
    v0 = T.scalar("v0")
    p, u = symgpu.scan(lambda v: (v * 2, symgpu.scan_module.until(v * 2 > 1000)),
                       outputs_info=v0, n_steps=100)
    return [v0], p, u


def _views():
    x = T.matrix("x")
    m, _ = symgpu.map(lambda r: T.exp(r).sum(), x)
    r, _ = symgpu.reduce(lambda r, acc: acc + r, x, T.zeros_like(x[0]))
    fl, _ = symgpu.foldl(lambda r, acc: acc * .5 + r, x, T.zeros_like(x[0]))
    fr, _ = symgpu.foldr(lambda r, acc: acc * .5 + r, x, T.zeros_like(x[0]))
    return [x], [m, r, fl, fr], None


def _shared_update():
    acc = symgpu.shared(np.zeros(3, "float32"), name="acc")
    x = T.matrix("x")
    out, u = symgpu.scan(lambda xt: {acc: acc + xt}, sequences=x)
    return [x], acc * 1, u


def _bptt():
    W = symgpu.shared(_f32(8, 8, seed=3) * .3, name="W")
    U = symgpu.shared(_f32(5, 8, seed=4) * .3, name="U")
    x, y = T.tensor3("x"), T.tensor3("y")
    h0 = T.zeros((4, 8), dtype="float32")
    h, _ = symgpu.scan(lambda xt, h: T.tanh(T.dot(xt, U) + T.dot(h, W)), sequences=x,
                       outputs_info=h0)
    loss = T.mean((h - y) ** 2)
    gW, gU = symgpu.grad(loss, [W, U])
    return [x, y], [loss, gW, gU], [(W, W - .1 * gW), (U, U - .1 * gU)]


def _truncated():
    W = T.matrix("W")
    x = T.tensor3("x")
    h, _ = symgpu.scan(lambda xt, h: T.tanh(xt + T.dot(h, W)), sequences=x,
                       outputs_info=T.zeros((4, 8), dtype="float32"), truncate_gradient=3)
    return [x, W], symgpu.grad(h.sum(), W), None


CASES = {
    "power": (_power, (np.arange(10, dtype="float32") * .3, 5)),
    "polynomial": (_polynomial, (np.array([1, 0, 2], "float32"), np.float32(3))),
    "rnn_taps_backwards": (_rnn_taps_backwards, (_f32(7, 3, 4), _f32(2, 3, 4, seed=1),
                                                 _f32(4, 4, seed=2))),
    "until": (_until, (np.float32(3),)),
    "map_reduce_foldl_foldr": (_views, (_f32(6, 5),)),
    "shared_update": (_shared_update, (_f32(4, 3),)),
    "bptt_sgd": (_bptt, (_f32(6, 4, 5), _f32(6, 4, 8, seed=5))),
    "truncate_gradient": (_truncated, (_f32(6, 4, 8), _f32(8, 8, seed=6) * .3)),
}


@requires_gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_loops_give_the_cpu_results(name):
    build, args = CASES[name]
    cpu, gpu = _pair(build, *args, calls=3)
    for a, b in zip(cpu, gpu):
        _close([a], [b])


@requires_gpu
def test_known_length_loop_replays_as_one_cuda_graph():
    from symgpu.gpu.exec import scan_graph
    before = dict(scan_graph.STATS)
    xs = [_f32(9, 4, 5, seed=s) for s in range(4)]
    with config.change_flags(floatX="float32"):
        ins_c, out_c, _ = _bptt_fwd()
        f_cpu = function(ins_c, out_c)
        with real_default_gpu():
            ins, out, _ = _bptt_fwd()
            f = function(ins, out)
            got = [np.asarray(f(x)) for x in xs]
    want = [f_cpu(x) for x in xs]
    _close(want, got)
    assert scan_graph.STATS["captures"] > before.get("captures", 0)
    assert scan_graph.STATS["replays"] > before.get("replays", 0)


def _bptt_fwd():
    x = T.tensor3("x")
    W = T.constant(_f32(5, 5, seed=9) * .3)
    h, _ = symgpu.scan(lambda xt, h: T.tanh(xt + T.dot(h, W)), sequences=x,
                       outputs_info=T.zeros((4, 5), dtype="float32"))
    return [x], h, None


#: a cold compile of a BPTT + SGD step in a fresh process: which threads ran nvcc while
#: function() linked, and whether any call (plain, capture, replay) ran it
COLD_STEP = r"""
import json, threading
import numpy as np
import symgpu, symgpu.tensor as T
from symgpu.gpu.runtime import compiler
runs = []
real = compiler._run_nvcc
def counting(*args):
    runs.append(threading.current_thread().name)
    return real(*args)
compiler._run_nvcc = counting
symgpu.config.floatX = "float32"
r = np.random.RandomState(0)
x = symgpu.shared(r.randn(7, 4, 6).astype("float32"))
y = symgpu.shared(r.randn(7, 4, 5).astype("float32"))
wx = symgpu.shared(r.randn(6, 5).astype("float32") * .3)
wh = symgpu.shared(r.randn(5, 5).astype("float32") * .3)
h, _ = symgpu.scan(lambda xt, hp: T.tanh(T.dot(xt, wx) + T.dot(hp, wh)), sequences=x,
                   outputs_info=T.zeros((4, 5), dtype="float32"))
loss = ((h - y) ** 2).mean()
gx, gh = symgpu.grad(loss, [wx, wh])
f = symgpu.function([], loss, updates=[(wx, wx - .1 * gx), (wh, wh - .1 * gh)])
at_link = list(runs)
del runs[:]
losses = [float(f()) for _ in range(4)]
print(json.dumps({"link": at_link, "calls": runs, "losses": losses}))
"""


@requires_gpu
def test_a_cold_bptt_step_compiles_every_kernel_at_link(tmp_path):
    """Empty compiledir, fresh process: function() starts compiling the kernels of the
    outer graph and of both loop bodies (the strided copies included) on the prefetch's
    nvcc threads; no call, plain, captured or replayed, runs nvcc in its own thread (one
    only needed at the first capture may still be finishing in the background then)."""
    env = dict(os.environ, SYMGPU_FLAGS=f"device=cuda,compiledir={tmp_path}",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", COLD_STEP], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["link"], got
    assert all(t.startswith("symgpu-nvcc") for t in got["link"] + got["calls"]), got
    assert got["losses"][-1] < got["losses"][0]


@requires_gpu
def test_ifelse_on_the_gpu_is_lazy_and_right():
    a, y = T.scalar("a"), T.vector("y")
    with config.change_flags(floatX="float32"), real_default_gpu():
        f = function([a, y], ifelse(a > 0, T.exp(y), y * 2))
        v = _f32(5)
        np.testing.assert_allclose(f(1, v), np.exp(v), rtol=1e-6)
        np.testing.assert_allclose(f(-1, v), v * 2, rtol=1e-6)


#: tests of the host suites that do not apply with device=cuda, and why
NOT_ON_THE_GPU = {
    "test_threads_and_pickling": "calls a GPU function from worker threads, which PyCUDA "
                                 "aborts on when the thread ends (a PyCUDA limitation)",
}


@requires_gpu
@pytest.mark.parametrize("module", ["tests/test_scan.py", "tests/test_scan_grad.py",
                                    "tests/test_ifelse.py"])
def test_the_loop_suites_pass_with_device_cuda(module):
    env = dict(os.environ, SYMGPU_FLAGS="device=cuda")
    skip = " and ".join(f"not {name}" for name in NOT_ON_THE_GPU)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-k", skip, module], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_a_lifted_host_loop_pickles_without_its_gpu_twin():
    import pickle
    ins, h = rnn_graph()
    with config.change_flags(floatX="float32"), virtual_context(None):
        f = function(ins, h.sum())
        assert loops(f, GpuScan)
    host_op = next(n.op for n in symgpu.graph.basic.io_toposort([], [h])
                   if isinstance(n.op, Scan))
    assert b"GpuScan" not in pickle.dumps(host_op)


def test_pushed_out_sequence_product_leaves_one_gemm_per_step(vgpu):
    x, h0 = T.tensor3("x"), T.matrix("h0")
    Wx, Wh = T.matrix("Wx"), T.matrix("Wh")
    h, _ = symgpu.scan(lambda xt, hp: T.tanh(T.dot(xt, Wx) + T.dot(hp, Wh)), sequences=x,
                       outputs_info=h0)
    with config.change_flags(optimizer_including="scan_pushout_seq_dot"):
        f = function([x, h0, Wx, Wh], h)
    (node,) = loops(f)
    assert isinstance(node.op, GpuScan)
    assert_on_device(node)
    names = [type(n.op).__name__ for n in node.op.inner.compiled_fgraph.toposort()]
    assert sum(nm in ("GpuGemm", "GpuDot22") for nm in names) == 1, names
