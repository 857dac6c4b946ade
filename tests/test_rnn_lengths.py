"""Per-row lengths of DnnRNN / DnnRNNGrad (cuDNN's seqLengthArray): each row against the
same op run on that row alone, cut to its length; gradients by finite differences; the GPU
ops' placement (virtual GPU) and, on the GPU, cuDNN against the host."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import on_the_cpu, requires_gpu
from rnn_helpers import rnn_case
from symgpu import function
from symgpu.gpu.ops import cudnn_rnn as crnn
from symgpu.gradient import verify_grad
from symgpu.tensor.nnet.rnn import (DnnRNN, DnnRNNGrad, rnn_backward_numpy,
                                    rnn_forward_numpy)

MODES = ["rnn_relu", "rnn_tanh", "lstm", "gru"]


def _case(mode, dtype, rng, t=5, b=4, i=3, h=3, **kw):
    return rnn_case(mode, dtype, rng, t=t, b=b, i=i, h=h, scale=0.5, **kw)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dirs", [1, 2])
def test_each_row_is_its_own_shorter_sequence(mode, dirs):
    """y[:len, b], hy[:, b], cy[:, b] equal the full-length loop over x[:len, b] alone (the
    reverse direction starts at the row's own end); y is 0 past each row's end."""
    rng = np.random.default_rng(0)
    block, w, x, hx, cx = _case(mode, "float64", rng, dirs=dirs)
    lengths = np.array([5, 1, 3, 4], dtype="int64")
    args = (mode, 3, 2, dirs, w, x, hx, cx)
    y, hy, cy = rnn_forward_numpy(*args, lengths=lengths)
    for b, n in enumerate(lengths):
        row = (x[:n, b:b + 1], hx[:, b:b + 1], cx[:, b:b + 1] if cx is not None else None)
        ey, ehy, ecy = rnn_forward_numpy(mode, 3, 2, dirs, w, *row)
        np.testing.assert_allclose(y[:n, b], ey[:, 0], rtol=1e-12, atol=1e-12)
        assert (y[n:, b] == 0).all()
        np.testing.assert_allclose(hy[:, b], ehy[:, 0], rtol=1e-12, atol=1e-12)
        if cy is not None:
            np.testing.assert_allclose(cy[:, b], ecy[:, 0], rtol=1e-12, atol=1e-12)
    # full lengths: the unmasked loop
    full = rnn_forward_numpy(*args, lengths=np.full(4, 5, "int32"))
    for g, e in zip(full, rnn_forward_numpy(*args)):
        if e is not None:
            np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("mode", MODES)
def test_backward_ignores_the_padding_and_matches_each_row(mode):
    """dx is 0 past each row's end, dy there is ignored, and dw is the sum of the rows'
    own gradients."""
    rng = np.random.default_rng(1)
    block, w, x, hx, cx = _case(mode, "float64", rng, dirs=2)
    lengths = np.array([2, 5, 1, 4], dtype="int32")
    y, hy, cy = rnn_forward_numpy(mode, 3, 2, 2, w, x, hx, cx, lengths)
    dy = rng.standard_normal(y.shape)
    dhy = rng.standard_normal(hy.shape)
    dcy = rng.standard_normal(hy.shape) if cx is not None else None
    dx, dhx, dcx, dw = rnn_backward_numpy(mode, 3, 2, 2, w, x, hx, cx, dy, dhy, dcy, lengths)
    dw_sum = np.zeros_like(w)
    for b, n in enumerate(lengths):
        assert (dx[n:, b] == 0).all()
        sl = slice(b, b + 1)
        ex, ehx, ecx, ew = rnn_backward_numpy(
            mode, 3, 2, 2, w, x[:n, sl], hx[:, sl], cx[:, sl] if cx is not None else None,
            dy[:n, sl], dhy[:, sl], dcy[:, sl] if dcy is not None else None)
        np.testing.assert_allclose(dx[:n, b], ex[:, 0], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(dhx[:, b], ehx[:, 0], rtol=1e-10, atol=1e-12)
        if dcx is not None:
            np.testing.assert_allclose(dcx[:, b], ecx[:, 0], rtol=1e-10, atol=1e-12)
        dw_sum += ew
    np.testing.assert_allclose(dw, dw_sum, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dirs", [1, 2])
def test_gradients_with_lengths_verify(mode, dirs):
    rng = np.random.default_rng(2)
    block, w, x, hx, cx = _case(mode, "float64", rng, t=4, b=3, i=2, h=2, layers=2, dirs=dirs)
    lengths = T.constant(np.array([4, 2, 1], dtype="int32"))
    pts = [v for v in (w, x, hx, cx) if v is not None]
    with on_the_cpu():
        verify_grad(lambda w, x, hx, *c: block.apply(w, x, hx, *c, lengths=lengths), pts,
                    rng=np.random.RandomState(3))


def test_symbolic_lengths_int64_and_errors():
    rng = np.random.default_rng(4)
    block, w, x, hx, cx = _case("lstm", "float64", rng)
    ws, xs, hs, cs = T.dvector(), T.dtensor3(), T.dtensor3(), T.dtensor3()
    ln = T.lvector("lengths")
    outs = block.apply(ws, xs, hs, cs, lengths=ln)
    assert isinstance(outs[0].owner.op, DnnRNN) and outs[0].owner.op.with_lengths
    g = T.grad(outs[0].sum() + outs[2].sum(), [ws, xs])
    with on_the_cpu():
        f = function([ws, xs, hs, cs, ln], outs + g)
    assert [n.op.with_lengths for n in _ops(f, DnnRNNGrad)] == [True]
    lv = np.array([3, 5, 1, 2], dtype="int64")
    got = f(w, x, hx, cx, lv)
    want = rnn_forward_numpy("lstm", 3, 2, 1, w, x, hx, cx, lv)
    for a, e in zip(got[:3], want):
        np.testing.assert_allclose(a, e, rtol=1e-12)
    with pytest.raises(ValueError, match=r"DnnRNN.*\[1, 5\]"):
        f(w, x, hx, cx, np.array([3, 0, 1, 2]))
    with pytest.raises(ValueError, match=r"lengths of shape \(3,\)"):
        f(w, x, hx, cx, np.array([3, 5, 1]))
    with pytest.raises(TypeError, match="int32 or int64"):
        block.apply(ws, xs, hs, cs, lengths=T.dvector())
    with pytest.raises(TypeError, match="lengths"):
        DnnRNN("gru", "unidirectional", 1, 3, with_lengths=True)(ws, xs, hs)


# ============================================================================ placement

def _training(mode, lengths_var):
    block = crnn.RNNBlock("float32", 4, 2, mode)
    w, x, hx = T.fvector("w"), T.ftensor3("x"), T.ftensor3("hx")
    cx = T.ftensor3("cx") if mode == "lstm" else None
    ins = [w, x, hx] + ([cx] if cx is not None else [])
    outs = block.apply(w, x, hx, cx, lengths=lengths_var)
    cost = (outs[0] ** 2).sum() + outs[1].sum() + (outs[2].sum() if cx is not None else 0)
    return ins, outs, T.grad(cost, ins)


def _ops(f, cls):
    return [n for n in f.maker.fgraph.toposort() if isinstance(n.op, cls)]


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_vgpu_lengths_stay_on_the_host_of_the_cudnn_ops(vgpu, mode):
    """The GPU ops take the lengths as a host vector (cuDNN's seqLengthArray); a lengths
    vector computed on the GPU (a mask's sum) comes back through one transfer."""
    from symgpu.gpu.placement.type import is_gpu_var
    m = T.fmatrix("m")
    ln = T.cast(m.sum(0), "int32")
    ins, outs, grads = _training(mode, ln)
    f = function(ins + [m], outs + grads)
    (fwd,) = _ops(f, crnn.GpuDnnRNNForward)
    (bwd,) = _ops(f, crnn.GpuDnnRNNBackward)
    assert fwd.op.with_lengths and bwd.op.with_lengths
    li = 3 + int(mode == "lstm")
    assert not is_gpu_var(fwd.inputs[li]) and fwd.inputs[li] is bwd.inputs[li]
    assert bwd.inputs[len(fwd.inputs) + 1] is fwd.outputs[-1]
    assert not _ops(f, DnnRNN) and not _ops(f, DnnRNNGrad)


# ============================================================================ on the GPU

@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_gpu_lengths_match_the_host(cuda, mode):
    """cuDNN with per-row lengths (padded IO, fill 0) against the host loop: y, hy, cy and
    every gradient; new lengths per call (a plan per vector), repeated calls."""
    rng = np.random.default_rng(5)
    _, w, x, hx, cx = _case(mode, "float32", rng, t=6, b=3, i=5, h=4, layers=2)
    ln = T.ivector("lengths")
    ins, outs, grads = _training(mode, ln)
    vals = [v for v in (w, x, hx, cx) if v is not None]
    with on_the_cpu():
        ref = function(ins + [ln], outs + grads)
    f = function(ins + [ln], outs + grads)
    assert _ops(f, crnn.GpuDnnRNNForward) and _ops(f, crnn.GpuDnnRNNBackward)
    assert not _ops(f, DnnRNN) and not _ops(f, DnnRNNGrad)
    for lv in ([6, 2, 4], [1, 6, 3], [6, 2, 4], [6, 6, 6]):
        lv = np.array(lv, dtype="int32")
        want = ref(*vals, lv)
        got = f(*vals, lv)
        for g, e in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), e, rtol=2e-4, atol=2e-4)
