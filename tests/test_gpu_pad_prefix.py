"""A sequence sliced by its length and padded to a bucket (scan_to_dnn_rnn's ``x[:L]``,
issue 32) is padded inside the CUDA graph that reads it: GpuPadPrefix reads the whole
sequence with the length as a graph parameter and the bucket in the key (StepBucket, a host
op before the graph), so one graph per bucket serves every length in it and no copy runs
before the graph; integer index arithmetic that only GPU ops read is done on the GPU
(index_uploads.py).  CPU tests check the host op, the rewrites (virtual GPU) and the
parameter protocol (fake context); GPU tests check values against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

import graph_fakes as fakes
import symgpu
import symgpu.tensor as T
from gpu_helpers import compile_for_sm90, requires_gpu, requires_nvcc, thunk_over
from symgpu.config import config
from symgpu.gpu.ops.pad_steps import GpuPadPrefix, GpuPadSteps
from symgpu.gpu.ops.subtensor import GpuSubtensor
from symgpu.gpu.placement.basic_ops import GpuFromHost
from symgpu.tensor.basic import ARange
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.nnet.pad_steps import PadSteps, StepBucket
from symgpu.tensor.type import TensorType

LENGTHS = (5, 5, 6, 8, 3, 7, 9, 12, 2, 6, 6, 6)


def _padded(lengths, q):
    """StepBuckets' lengths for a run of calls: the length itself until one differs."""
    first = lengths[0]
    out, varied = [], False
    for n in lengths:
        varied = varied or n != first
        out.append((-(-n // q) * q if varied else n, varied))
    return out


def _nodes(fn, cls):
    return [n for n in fn.maker.fgraph.toposort() if isinstance(n.op, cls)]


def test_step_bucket_is_the_length_until_lengths_vary_then_its_bucket():
    n = T.lscalar("n")
    f = symgpu.function([n], list(StepBucket(4)(n)))
    for k, (steps, varied) in zip(LENGTHS, _padded(LENGTHS, 4)):
        got = f(k)
        assert (int(got[0]), bool(got[1])) == (steps, varied)
    with pytest.raises(ValueError, match="negative length"):
        f(-1)
    with pytest.raises(ValueError, match="bucket size"):
        StepBucket(0)


def test_buckets_are_multiples_of_q_then_eight_an_octave():
    from symgpu.tensor.nnet.pad_steps import bucket_length
    padded = [bucket_length(n, 8) for n in range(1, 1025)]
    assert padded == sorted(padded) and all(p >= n for n, p in enumerate(padded, 1))
    assert all(p % 8 == 0 and p - n < 8 for n, p in enumerate(padded[:127], 1))
    assert max(p / n for n, p in enumerate(padded, 1) if n >= 64) <= 1.125
    for lo in (128, 256, 512):      # eight buckets an octave past 64
        assert len({bucket_length(n, 8) for n in range(lo + 1, 2 * lo + 1)}) == 8
    lengths = range(10, 91)
    assert len({bucket_length(n, 8) for n in lengths}) == 11
    assert sum(bucket_length(n, 8) for n in lengths) / len(lengths) < 53.6   # 7% padding


def test_vgpu_nested_prefix_slices_become_one_pad_of_the_whole_sequence(vgpu):
    x = T.tensor3("x")
    a, b = T.lscalar("a"), T.lscalar("b")
    y, steps = PadSteps(4)((x * 2)[:a][:b])
    fn = symgpu.function([x, a, b], [y + 1, steps])
    (pad,) = _nodes(fn, GpuPadPrefix)
    assert not _nodes(fn, GpuPadSteps) and not _nodes(fn, GpuSubtensor)
    # the pad reads x * 2 itself (the GPU product), its length the slices' arithmetic
    assert fn.maker.fgraph.inputs[0] in [v for u in pad.inputs[0].owner.inputs
                                        for v in ([u] + (u.owner.inputs if u.owner else []))]
    assert isinstance(pad.inputs[2].owner.op, StepBucket)


def _last_states(y, mask):
    """``y[min(t, len - 1), rows]``, each row's length from a mask on the host (PrefixGuard:
    no GPU op reads a mask): scan_to_dnn_rnn's gather of each row's state at its end."""
    from symgpu.scan.dnn_rnn_match import PrefixGuard
    lens = PrefixGuard()(mask, mask.shape[0])
    t = T.arange(y.shape[0]).dimshuffle(0, "x")
    rows = T.arange(y.shape[1]).dimshuffle("x", 0)
    last = (lens - 1).dimshuffle("x", 0)
    return y[T.maximum(T.minimum(t, last), 0), rows], lens, last


def test_vgpu_a_gathers_index_arithmetic_runs_on_the_gpu(vgpu):
    """The ranges are made on the GPU and the index arithmetic runs there; only the lengths
    are uploaded (without gpu_index_math, the index matrix made on the host)."""
    y, m = T.tensor3("y"), T.matrix("m")
    for on in (True, False):
        with config.change_flags(optimizer_excluding="" if on else "gpu_index_math"):
            fn = symgpu.function([y, m], _last_states(y * 2, m)[0])
        host_vectors = [n for n in _nodes(fn, Elemwise) if n.outputs[0].ndim]
        ups = [type(n.inputs[0].owner.op).__name__ for n in _nodes(fn, GpuFromHost)
               if n.inputs[0].dtype.startswith("int")]
        assert bool(host_vectors) != on and bool(_nodes(fn, ARange)) != on
        assert ups == (["PrefixGuard"] if on else ["Elemwise"]), (on, ups)


def test_vgpu_host_index_arithmetic_read_on_the_host_too_stays_there(vgpu):
    """An index the host also returns keeps its host computation (no second one)."""
    y, m = T.tensor3("y"), T.matrix("m")
    states, _, last = _last_states(y * 2, m)
    fn = symgpu.function([y, m], [states, last])
    assert [n for n in _nodes(fn, Elemwise) if n.outputs[0].ndim]


@pytest.fixture
def fake_ctx(monkeypatch):
    yield from fakes.use_fake_gpu(monkeypatch)


def _pad_node():
    from symgpu.gpu.placement.type import GpuArrayType
    x = GpuArrayType("float32", (False,), fakes.CTX)()
    ints = [TensorType("int64", ())() for _ in range(3)]
    return GpuPadPrefix().make_node(x, *ints)


def test_the_pad_keys_its_graph_by_bucket_and_passes_the_length_as_a_parameter(fake_ctx):
    x = fakes.upload(fakes.CTX_OBJ, np.arange(10))
    node = _pad_node()
    thunk, storage = thunk_over(node, [x, np.int64(6), np.int64(8), np.int8(1)])
    assert thunk.param_nbytes == 8 and thunk.capturable and thunk.launches
    key, raw = thunk.param_values()
    assert key == (8, True) and np.frombuffer(raw, np.int64).tolist() == [6]
    thunk, storage = thunk_over(node, [x, np.int64(6), np.int64(6), np.int8(0)])
    assert thunk.param_values()[0] == (6, False)
    thunk()                                         # lengths never varied: a view, no copy
    out = storage[node.outputs[0]][0]
    assert out.ptr == x.ptr and out.shape == (6,)
    for n, steps, varied in ((11, 12, 1), (6, 5, 1), (6, 8, 0)):
        thunk, _ = thunk_over(node, [x, np.int64(n), np.int64(steps), np.int8(varied)])
        with pytest.raises(ValueError, match="GpuPadPrefix"):
            thunk.param_values()


@requires_nvcc
def test_the_pad_kernels_compile_for_sm90(tmp_path):
    from symgpu.gpu.runtime.graph_params import PARAMS_SOURCE
    cubin = compile_for_sm90(PARAMS_SOURCE, tmp_path)
    for k in (1, 2, 4, 8):
        assert f"pad_prefix_{k}".encode() in cubin


# ============================================================================ on the GPU

@pytest.fixture
def graphs_on(cuda):
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        yield cuda


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["rows", "strided"])
def test_gpu_a_sliced_sequence_pads_inside_one_graph_per_bucket(graphs_on, layout):
    """Values against NumPy over lengths that vary; with contiguous rows, one capture per
    bucket (the length a parameter) and every call after a capture a replay; rows the
    kernel cannot read (a transposed sequence) run plainly and stay exact."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((12, 2, 3)).astype("float32")
    shared = symgpu.shared(X if layout == "rows" else np.ascontiguousarray(X.transpose(2, 1, 0)))
    x = shared if layout == "rows" else shared.dimshuffle(2, 1, 0)
    L = T.lscalar("L")
    y, steps = PadSteps(4)(x[:L])
    f = symgpu.function([L], [(y * 2).sum(axis=2), steps])
    assert _nodes(f, GpuPadPrefix) and not _nodes(f, GpuPadSteps)
    calls = list(LENGTHS) + [6, 7, 8, 5, 11, 12, 10, 9] * 2
    for n, (padded, _) in zip(calls, _padded(calls, 4)):
        got, k = f(n)
        want = np.zeros((padded, 2), "float32")
        want[:n] = (X[:n] * 2).sum(axis=2)
        assert int(k) == padded
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    st = f.vm.runner.stats()
    if layout == "rows":
        buckets = {p for p, v in _padded(calls, 4) if v}
        assert st["captures"] <= len(buckets) + 2 and st["replays"] >= len(calls) // 2, st


@requires_gpu
@pytest.mark.gpu
def test_gpu_index_arithmetic_on_the_gpu_gathers_each_rows_last_state(graphs_on):
    rng = np.random.default_rng(1)
    Y = rng.standard_normal((6, 4, 3)).astype("float32")
    y, m = symgpu.shared(Y), T.matrix("m")
    f = symgpu.function([m], _last_states(y, m)[0] * 2)
    assert not _nodes(f, ARange) and not [n for n in _nodes(f, Elemwise) if n.outputs[0].ndim]
    for k in range(6):
        ln = rng.integers(1, 7, size=4)
        mask = (np.arange(6)[:, None] < ln[None, :]).astype("float32")
        ix = np.maximum(np.minimum(np.arange(6)[:, None], ln[None, :] - 1), 0)
        np.testing.assert_array_equal(np.asarray(f(mask)), Y[ix, np.arange(4)[None, :]] * 2)
