"""scan_to_dnn_rnn's masked loops behind a guard (compile/speculation.py): where the function
can compile again, cuDNN runs with no branch around it; a mask that is no prefix mask makes
the function compile again without the rewrite and run that call, and every later one, as
the loop, its shared values untouched by the failed attempt."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from gpu_helpers import planned_steps, requires_gpu
from symgpu.compile import host_fallback
from symgpu.compile.mode import Mode
from symgpu.compile.speculation import SpeculationFailed
from symgpu.ifelse import IfElse
from symgpu.scan.dnn_rnn_match import PrefixGuard
from symgpu.tensor.nnet.pad_steps import PadSteps
from symgpu.tensor.nnet import rnn as rnn_mod
from symgpu.tensor.nnet.rnn import DnnRNN, DnnRNNGrad

sys.path.append(os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import rnn_cells as rc  # noqa: E402

B, IN, H, L = 3, 5, 4, 6


@pytest.fixture(autouse=True)
def _keep_flags():
    with symgpu.config.change_flags(floatX=symgpu.config.floatX):
        yield


@pytest.fixture
def recompilable(monkeypatch):
    """Functions keep the graph they were given, as they do where a GPU may take part
    (host_fallback.keep_source), so that rewrites may guard on the CPU too."""
    monkeypatch.setattr(host_fallback, "_gpu_may_be_involved", lambda fgraph: True)


@pytest.fixture
def forwards(monkeypatch):
    """The sequence length of every host DnnRNN forward run in the test (one a call: the
    backward reads the forward's y)."""
    seen = []
    orig = rnn_mod.DnnRNN.perform

    def recording(self, node, inputs, outputs):
        seen.append(inputs[1].shape[0])
        return orig(self, node, inputs, outputs)
    monkeypatch.setattr(rnn_mod.DnnRNN, "perform", recording)
    return seen


def _mode(on: bool) -> Mode:
    m = Mode(optimizer="fast_run")     # off: not even where a GPU may take part
    return m.including("scan_to_dnn_rnn") if on else m.excluding_tags("scan_to_dnn_rnn")


def _ops(fn, cls):
    return [n for n in fn.maker.fgraph.toposort() if isinstance(n.op, cls)]


def _bad(mask):
    bad = mask.copy()
    bad[1, 1], bad[-1, 0] = 0, 1            # a hole: no prefix
    return bad


@pytest.mark.parametrize("mask, n, lengths", [
    ([[1, 1, 1], [1, 0, 1], [0, 0, 1]], 3, [2, 1, 3]),
    ([[1, 1, 1], [1, 0, 1], [0, 1, 1]], 3, None),      # a hole in row 1
    ([[1, 0, 1], [1, 0, 1]], 2, None),                 # an empty row
    ([[1, 0.5], [1, 0]], 2, None),                     # not 0/1
    ([[1, 1], [1, 0], [0, 1]], 2, [2, 1]),             # only the first n steps
])
def test_guard_gives_the_lengths_or_raises_naming_its_rewrite(mask, n, lengths):
    m, k = T.matrix("m", dtype="float32"), T.iscalar("n")
    node = PrefixGuard()(m, k).owner
    out = [[None]]
    args = [np.asarray(mask, "float32"), np.int32(n)]
    if lengths is None:
        with pytest.raises(SpeculationFailed) as info:
            node.op.perform(node, args, out)
        assert info.value.rewrite == "scan_to_dnn_rnn"
    else:
        node.op.perform(node, args, out)
        np.testing.assert_array_equal(out[0][0], lengths)
        assert out[0][0].dtype == np.int32


@pytest.mark.parametrize("cell", ["lstm", "gru", "elman"])
@pytest.mark.parametrize("loss", ["last", "all"])
def test_masked_cells_train_alike_behind_the_guard(recompilable, forwards, cell, loss):
    """Three SGD steps with prefix masks run cuDNN (no branch in the graph); a mask with a
    hole recompiles the function without the rewrite and runs as the loop; losses and
    weights equal the loop's all along."""
    spec = rc.Spec(cell, True, loss, B, H, False, inp=IN, fixed=L)
    calls = rc.calls(spec, 4)
    bad = _bad(calls[0][1])
    res = {}
    for on in (False, True):
        call, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                                        mode=_mode(on))
        if on:
            assert _ops(fn, PrefixGuard) and not _ops(fn, IfElse)
            assert _ops(fn, DnnRNN) and _ops(fn, DnnRNNGrad)
        losses = [float(call(n, mk)) for n, mk, _ in calls[:3]]
        assert len(forwards) >= (3 if on else 0)
        losses.append(float(call(L, bad)))          # cuDNN may have run before the guard
        ran = len(forwards)
        losses.append(float(call(*calls[3][:2])))     # a prefix mask again: still the loop
        assert len(forwards) == ran
        if on:
            assert not _ops(fn, DnnRNN) and not _ops(fn, PrefixGuard)
            assert "scan_to_dnn_rnn" in fn.maker.mode.excluding
        res[on] = (losses, [np.asarray(v.get_value()) for v in fn.maker.fgraph.inputs
                            if hasattr(v, "get_value")])
    np.testing.assert_allclose(res[True][0], res[False][0], rtol=1e-5, atol=1e-6)
    for got, want in zip(res[True][1], res[False][1]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("cell, masked, loss", [("lstm", True, "last"), ("gru", True, "all"),
                                               ("lstm", False, "all"), ("elman", False, "last")])
def test_lengths_that_vary_run_cudnn_padded_to_a_bucket_and_train_alike(
        recompilable, monkeypatch, forwards, cell, masked, loss):
    """A new length every call: after the second length cuDNN runs over the sequence padded
    to a multiple of BUCKET (PadSteps), the states read up to the true length; losses and
    weights equal the loop's over calls of lengths 2..9."""
    from symgpu.scan import dnn_rnn_match
    monkeypatch.setattr(dnn_rnn_match, "BUCKET", 4)
    spec = rc.Spec(cell, masked, loss, B, H, True, inp=IN, var_range=(2, 9))
    calls = rc.calls(spec, 8)
    assert len({n for n, _, _ in calls}) > 2
    res = {}
    for on in (False, True):
        call, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                                        mode=_mode(on))
        if on:
            (pad,) = _ops(fn, PadSteps)
            assert pad.op.q == 4 and _ops(fn, DnnRNN)
        res[on] = ([float(call(n, mk)) for n, mk, _ in calls],
                   [np.asarray(v.get_value()) for v in fn.get_shared()])
    lengths = [n for n, _, _ in calls]
    first = lengths[0]
    varied = lengths.index(next(n for n in lengths if n != first))
    want = lengths[:varied] + [-(-n // 4) * 4 for n in lengths[varied:]]
    assert forwards == want

    np.testing.assert_allclose(res[True][0], res[False][0], rtol=1e-5, atol=1e-6)
    for got, ref in zip(res[True][1], res[False][1]):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)


def test_vgpu_the_pad_of_a_sliced_sequence_is_placed_on_the_gpu_with_its_readers(vgpu):
    """On a (virtual) GPU the pad of ``x[:L]`` (the whole sequence sliced by the length) is
    a GpuPadPrefix of the whole GPU sequence, its length and bucket host scalars (a graph
    parameter and a key part: test_gpu_pad_prefix.py), and no slice of it is left; the
    gather of each row's last state reads an uploaded lengths vector, its index arithmetic
    on the GPU."""
    from symgpu.gpu.ops.pad_steps import GpuPadPrefix
    from symgpu.gpu.ops.subtensor import GpuSubtensor
    from symgpu.gpu.placement.basic_ops import GpuFromHost
    from symgpu.gpu.placement.type import is_gpu_var
    from symgpu.tensor.basic import ARange
    from symgpu.tensor.elemwise import Elemwise
    from symgpu.tensor.nnet.pad_steps import StepBucket
    spec = rc.Spec("lstm", True, "last", B, H, True, inp=IN, var_range=(2, 9))
    _, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                                 mode=_mode(True))
    assert not _ops(fn, PadSteps) and not _ops(fn, ARange)
    (pad,) = _ops(fn, GpuPadPrefix)
    assert is_gpu_var(pad.inputs[0]) and pad.inputs[0].owner.inputs[0].name == "x"
    assert isinstance(pad.inputs[2].owner.op, StepBucket)
    assert not [n for n in _ops(fn, GpuSubtensor) if n.inputs[0] is pad.inputs[0]]
    uploads = [n.inputs[0] for n in _ops(fn, GpuFromHost)
               if n.inputs[0].owner is not None and n.inputs[0].ndim]   # (not scalars)
    assert [type(v.owner.op) for v in uploads if v.dtype.startswith("int")] == [PrefixGuard]
    assert not [n for n in _ops(fn, Elemwise) if n.outputs[0].ndim]   # no host vectors


def test_vgpu_the_pad_of_a_sequence_given_whole_stays_between_graphs(vgpu):
    """A sequence passed whole (its length its own) keeps GpuPadSteps, run between graphs
    (test_gpu_pad_steps_pads_on_the_device_outside_graphs)."""
    from symgpu.gpu.ops.pad_steps import GpuPadPrefix, GpuPadSteps
    from symgpu.gpu.placement.type import is_gpu_var
    x = T.tensor3("x")
    y, steps = PadSteps(4)(x * 2)      # (a value computed on the GPU)
    fn = symgpu.function([x], [y * 2, steps])
    (pad,) = _ops(fn, PadSteps)
    assert isinstance(pad.op, GpuPadSteps) and is_gpu_var(pad.inputs[0])
    assert not _ops(fn, GpuPadPrefix)


def test_a_failed_guard_keeps_the_functions_name_and_input_checks(recompilable):
    spec = rc.Spec("lstm", True, "last", B, H, False, inp=IN, fixed=L)
    (n, mask, _), = rc.calls(spec, 1)
    _, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                                 mode=_mode(True))
    name = fn.name
    fn(n, _bad(mask))
    assert fn.name == name and not fn.trust_input
    with pytest.raises(TypeError):
        fn(n, mask.astype("complex64"))


def test_without_a_kept_graph_the_masked_loop_takes_the_branch():
    """On the CPU a function keeps no source graph (nothing to fall back from): the rewrite
    uses the per-call branch there."""
    spec = rc.Spec("lstm", True, "last", B, H, False, inp=IN, fixed=L)
    _, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                                 mode=_mode(True))
    assert _ops(fn, IfElse) and not _ops(fn, PrefixGuard)


def test_vgpu_masked_step_is_one_piece_with_the_guard_on_the_host_mask(vgpu):
    """On a (virtual) GPU the guard reads the caller's host mask and the graph holds one
    cuDNN forward and one backward, no branch."""
    from symgpu.gpu.ops.cudnn_rnn import GpuDnnRNNBackward, GpuDnnRNNForward
    spec = rc.Spec("lstm", True, "last", B, H, False, inp=IN, fixed=L)
    _, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                                 mode=_mode(True))
    (guard,) = _ops(fn, PrefixGuard)
    assert guard.inputs[0].owner is None              # the function's input itself
    assert not _ops(fn, IfElse)
    assert len(_ops(fn, GpuDnnRNNForward)) == 1 and len(_ops(fn, GpuDnnRNNBackward)) == 1
    # the runner launches the forward (it reads no length) before the guard's numpy, and
    # the backward and the weights' updates after it
    where = {id(n): k for k, (_, step) in enumerate(planned_steps(fn.maker.fgraph.toposort()))
             for n in step}
    (fwd,), (bwd,) = _ops(fn, GpuDnnRNNForward), _ops(fn, GpuDnnRNNBackward)
    updates = [n for n in fn.maker.fgraph.toposort() if getattr(n.op, "destroy_map", None)]
    assert updates and where[id(fwd)] < where[id(guard)] < where[id(bwd)]
    assert all(where[id(n)] > where[id(guard)] for n in updates)


@requires_gpu
@pytest.mark.gpu
def test_gpu_masked_lstm_behind_the_guard_trains_alike(cuda):
    """On the GPU (cuDNN, captured segments): three prefix-mask steps, a mask with a hole
    (the function compiles again as the loop), one more step; losses equal the loop's."""
    from symgpu.gpu.ops.cudnn_rnn import GpuDnnRNNForward
    spec = rc.Spec("lstm", True, "last", B, H, False, inp=IN, fixed=L)
    calls = rc.calls(spec, 4)
    res = {}
    for on in (False, True):
        call, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                                        mode=_mode(on))
        assert bool(_ops(fn, GpuDnnRNNForward)) == on and not _ops(fn, IfElse)
        res[on] = [float(call(n, mk)) for n, mk, _ in calls[:3]]
        res[on] += [float(call(L, _bad(calls[0][1]))), float(call(*calls[3][:2]))]
        assert not _ops(fn, GpuDnnRNNForward)
    np.testing.assert_allclose(res[True], res[False], rtol=2e-4, atol=2e-5)


def test_a_copy_recompiles_too_and_a_swapped_copy_says_why_it_cannot(recompilable):
    spec = rc.Spec("lstm", True, "last", B, H, False, inp=IN, fixed=L)
    (n, mask, _), = rc.calls(spec, 1)
    _, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                                 mode=_mode(True))
    same = fn.copy()
    same(n, _bad(mask))
    assert not _ops(same, PrefixGuard) and _ops(fn, PrefixGuard)
    first = fn.get_shared()[0]
    swapped = fn.copy(swap={first: symgpu.shared(first.get_value(), name="twin")})
    with pytest.raises(RuntimeError, match="optimizer_excluding=scan_to_dnn_rnn"):
        swapped(n, _bad(mask))


def test_a_second_failed_guard_finds_the_function_compiled_again(recompilable):
    """Two calls in flight (two threads) that both failed the guard: the first compiles the
    function again, the second finds it done and runs its call there (no error)."""
    spec = rc.Spec("lstm", True, "last", B, H, False, inp=IN, fixed=L)
    (n, mask, _), = rc.calls(spec, 1)
    _, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                                 mode=_mode(True))
    fn._respecialize("scan_to_dnn_rnn")
    maker = fn.maker
    fn._respecialize("scan_to_dnn_rnn")          # the second thread's turn
    assert fn.maker is maker and not _ops(fn, PrefixGuard)
    assert np.isfinite(float(fn(n, _bad(mask))))


def test_the_pad_passes_a_length_that_needs_no_padding_through_uncopied():
    """PadSteps: the sequence itself while its length stays (and for a length that is a
    multiple of q once they vary), a padded copy otherwise."""
    x = T.dtensor3("x")
    node = PadSteps(4)(x)[0].owner
    assert node.op.view_map == {0: [0]}
    for n, copied in ((5, False), (5, False), (6, True), (8, False), (3, True)):
        v = np.ones((n, 2, 3))
        out = [[None], [None]]
        node.op.perform(node, [v], out)
        assert (out[0][0] is not v) == copied and out[0][0].shape[0] == int(out[1][0])
        np.testing.assert_array_equal(out[0][0][:n], v)


@requires_gpu
@pytest.mark.gpu
def test_gpu_pad_steps_pads_on_the_device_outside_graphs(cuda):
    """GpuPadSteps: the sequence unpadded while its length stays, then zero steps up to a
    multiple of q; its thunk is not marked capturable (the graphs after it are keyed by
    the bucket); the gradient slices back."""
    from symgpu.gpu.ops.pad_steps import GpuPadSteps
    x = symgpu.shared(np.zeros((1, 2, 3), "float32"), name="seq")
    y, steps = PadSteps(4)(x)
    g = T.grad((y * y).sum(), x)
    f = symgpu.function([], [y, steps, g])
    (node,) = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, GpuPadSteps)]
    storage = {v: [None] for v in node.inputs + node.outputs}
    thunk = node.op.make_thunk(node, storage, {}, [])
    assert not getattr(thunk, "capturable", False)
    seq = x.get_value(borrow=True, return_internal_type=True)
    storage[node.inputs[0]][0] = seq
    thunk()                                     # one length so far: the sequence itself
    assert storage[node.outputs[0]][0] is seq and int(storage[node.outputs[1]][0]) == 1
    rng = np.random.default_rng(0)
    for n, padded in ((5, 5), (5, 5), (6, 8), (3, 4), (9, 12)):
        v = rng.standard_normal((n, 2, 3)).astype("float32")
        x.set_value(v)
        got, k, dx = (np.asarray(a) for a in f())
        assert got.shape == (padded, 2, 3) and int(k) == padded
        np.testing.assert_array_equal(got[:n], v)
        assert not got[n:].any()
        np.testing.assert_allclose(dx, 2 * v, rtol=1e-6)


def test_padded_lengths_then_a_mask_with_a_hole_fall_back_to_the_loop(recompilable):
    """Lengths that vary (cuDNN padded to buckets), then a mask that is no prefix: the
    function compiles again as the loop (no pad, no cuDNN) and matches the loop's losses."""
    spec = rc.Spec("lstm", True, "last", B, H, True, inp=IN, var_range=(2, 9))
    calls = rc.calls(spec, 5)
    n = calls[-1][0]
    hole = np.ones((n, B), "float32")
    hole[0, 1] = 0                         # row 1 starts late: no prefix at any length
    res = {}
    for on in (False, True):
        call, _, fn = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                                        mode=_mode(on))
        res[on] = [float(call(k, mk)) for k, mk, _ in calls[:4]] + [float(call(n, hole))]
        if on:
            assert not _ops(fn, PadSteps) and not _ops(fn, DnnRNN)
    np.testing.assert_allclose(res[True], res[False], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cell, hidden, cudnn", [
    ("lstm", 128, True), ("lstm", 160, False), ("gru", 129, False),
    ("elman", 256, True), ("elman", 320, False)])
def test_vgpu_the_default_takes_hidden_sizes_of_cudnns_persistent_kernel(
        vgpu, cell, hidden, cudnn):
    """By default (no scan_to_dnn_rnn tag) a GPU function runs cuDNN for hidden sizes its
    persistent kernel takes (SMALL_H_LIMIT) and the loop above them, where the loop was
    faster on the H200; the opt-in tag runs cuDNN at any width."""
    from symgpu.gpu.ops.cudnn_rnn import GpuDnnRNNForward
    spec = rc.Spec(cell, False, "all", B, hidden, False, inp=IN, fixed=L)
    default = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec))[2]
    assert bool(_ops(default, GpuDnnRNNForward)) == cudnn
    opted = rc.build_symbolic(symgpu, T, spec, rc.init_params(spec), rc.data(spec),
                              mode=_mode(True))[2]
    assert _ops(opted, GpuDnnRNNForward)
