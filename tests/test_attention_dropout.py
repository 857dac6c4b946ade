"""Dropout on attention's probabilities (issue 34): the fused ops' dropout (the same Philox
draw as the written-out ``p * binomial(...) / keep``, element for element), the rewrite per
spelling (graph inspected; values and gradients equal to the unfused graph's over calls that
advance the generator), near misses left alone, verify_grad, and placement on a virtual
GPU (the kernels' values: test_gpu_attention.py)."""
import collections
import pickle
import re

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.compile.mode import get_mode
from symgpu.gradient import verify_grad
from symgpu.tensor.nnet import scaled_dot_product_attention as sdpa
from symgpu.config import config
from symgpu.gpu.ops import attention as A
from symgpu.tensor.nnet.attention import (Attention, AttentionGrad, Dropout, dropout_draw,
                                          dropout_kept)
from symgpu.tensor.shared_randomstreams import RandomStreams

RNG = np.random.default_rng(77)
UNFUSED = get_mode("FAST_RUN").excluding("fuse_attention")
q, k, v, do = T.tensor4s("q", "k", "v", "do")
QKV = [RNG.standard_normal((2, 3, 7, 4)) for _ in range(3)]
STATE = np.array([11, 22, 0, 0], "uint32")


def op_names(f):
    return [type(n.op).__name__ for n in f.maker.fgraph.toposort()]


def _spelled(kind, rng):
    """Attention with dropout (keep 0.75) written as users write it."""
    if kind == "sdpa":
        return sdpa(q, k, v, dropout_p=0.25, rng=rng, scale=0.5, is_causal=True)
    causal = np.where(np.tri(7, dtype=bool), 0, -np.inf)
    p = T.nnet.softmax((q @ k.swapaxes(-1, -2)) * 0.5 + causal)
    kept = rng.binomial(size=p.shape, n=1, p=0.75, dtype="float64")
    return {"p_kept_div": lambda: (p * kept / 0.75) @ v,
            "kept_first": lambda: (kept * (p / 0.75)) @ v,
            "times_inverse": lambda: (p * kept * (1 / 0.75)) @ v,
            "bool_uniform": lambda: (p * (rng.uniform(size=p.shape) < 0.75) / 0.75) @ v}[kind]()


@pytest.mark.parametrize("kind", ["sdpa", "p_kept_div", "kept_first", "times_inverse",
                                  "bool_uniform"])
def test_rewrite_fuses_dropout_and_drops_what_the_written_graph_drops(kind):
    results = []
    # sdpa builds the fused op itself: its reference is a written-out spelling of the same draw
    for spelling, mode in ((kind, None), ("p_kept_div" if kind == "sdpa" else kind, UNFUSED)):
        o = _spelled(spelling, RandomStreams(3))
        f = symgpu.function([q, k, v], [o] + T.grad((o ** 2).sum(), [q, k, v]), mode=mode)
        results.append((op_names(f), [f(*QKV) for _ in range(2)]))
    (fused_names, fused), (plain_names, plain) = results
    assert "Attention" in fused_names and "AttentionGrad" in fused_names, fused_names
    assert "Softmax" not in fused_names and "PhiloxSample" not in fused_names, fused_names
    assert "Attention" not in plain_names
    (node,) = [n for n in symgpu.function([q, k, v], _spelled(kind, RandomStreams(3)))
               .maker.fgraph.toposort() if isinstance(n.op, Attention)]
    assert node.op.dropout.keep == 0.75 and node.op.dropout.div == pytest.approx(0.75)
    assert node.op.causal and node.op.scale == 0.5
    for call_f, call_p in zip(fused, plain):
        for a, b in zip(call_f, call_p):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert not np.allclose(fused[0][0], fused[1][0])      # the generator moved on


def test_dropout_near_misses_stay_written_out():
    """A mask drawn per key only (it broadcasts over the queries: not one draw of the
    probabilities' shape) and a keep probability that is not a constant stay as written."""
    rng = RandomStreams(5)
    p = T.nnet.softmax(q @ k.swapaxes(-1, -2))
    keep = T.scalar("keep")
    per_key = rng.binomial(size=(p.shape[0], p.shape[1], 1, p.shape[3]), n=1, p=0.5,
                           dtype="float64")
    per_key = T.patternbroadcast(per_key, (False, False, True, False))
    symbolic = T.cast(rng.uniform(size=p.shape) < keep, "float64")
    for o, ins in (((p * per_key / 0.5) @ v, [q, k, v]),
                   ((p * symbolic / keep) @ v, [q, k, v, keep])):
        assert "Attention" not in op_names(symgpu.function(ins, o))


@pytest.mark.parametrize("draw", ["float32", "float64"])
def test_kept_elements_are_what_binomial_draws(draw):
    """dropout_draw finds a binomial's state, keep and draw dtype, and dropout_kept keeps what
    the compiled binomial draws from that state, element for element (a keep of 0.6, not
    exact in float32)."""
    shape = (2, 3, 5, 6)
    with config.change_flags(floatX=draw):       # the uniform's dtype follows floatX
        kept = RandomStreams(21).binomial(size=shape, n=1, p=0.6, dtype="int8")
    state, keep, dtype = dropout_draw(kept)
    assert dtype == draw and keep == float(np.asarray(0.6, draw))
    f = symgpu.function([], kept)
    for _ in range(2):                           # the second call from the advanced state
        before = state.get_value().copy()
        np.testing.assert_array_equal(f().astype(bool),
                                      dropout_kept(before, shape, Dropout(keep, keep, dtype)))


@pytest.mark.parametrize("causal", [False, True])
def test_dropout_attention_verify_grad(causal):
    op = Attention(causal, 0.5, False, Dropout(0.7, 0.7, "float64"))
    state = T.constant(STATE)
    verify_grad(lambda a, b, c: op(a, b, c, state), [x[:1, :2, :5] for x in QKV],
                rng=np.random.default_rng(2))


def test_dropout_attention_verify_grad_of_a_learned_mask():
    """The mask's gradient (a graph: mask_grad) drops what the op drops."""
    op = Attention(True, 0.5, True, Dropout(0.7, 0.7, "float64"))
    state = T.constant(STATE)
    verify_grad(lambda a, b, c, m: op(a, b, c, m, state),
                [x[:1, :2, :5] for x in QKV] + [RNG.standard_normal((5, 5))],
                rng=np.random.default_rng(3))


def test_dropout_ops_compare_pickle_and_say_their_keep():
    a = Attention(True, None, False, (0.9, 0.9, "float32"))
    assert a == Attention(True, None, False, Dropout(0.9, 0.9, "float32"))
    assert a != Attention(True, None, False) and hash(a) != hash(Attention(True))
    assert pickle.loads(pickle.dumps(a)) == a and "keep=0.9" in str(a)
    g = AttentionGrad(True, None, False, False, a.dropout)
    assert pickle.loads(pickle.dumps(g)) == g
    with pytest.raises(ValueError, match="keep"):
        Attention(dropout=(1.5, 1.0, "float32"))
    with pytest.raises(TypeError, match="generator state"):
        a(q, k, v)


def test_dropout_attention_lifts_to_the_gpu_kernels(vgpu):
    """A graph compiled for a GPU runs the dropout's attention in the fused kernels (which
    draw the same uniforms): GpuAttention and GpuAttentionGrad with the op's dropout, the
    generator state on the GPU, no draw of the scores' shape left."""
    rng = RandomStreams(3)
    qf, kf, vf = (T.tensor4(n, dtype="float32") for n in "qkv")
    o = sdpa(qf, kf, vf, dropout_p=0.1, rng=rng, is_causal=True)
    f = symgpu.function([qf, kf, vf], [o] + T.grad(o.sum(), [qf, kf, vf]))
    names = collections.Counter(op_names(f))
    assert not names["Attention"] and not names["AttentionGrad"], names
    assert not names["GpuPhiloxElemwise"] and not names["PhiloxSample"], names
    fused = [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ in
             ("GpuAttention", "GpuAttentionGrad", "GpuAttentionGradJoin")]
    assert len(fused) == 2 and all(n.op.dropout.keep == pytest.approx(0.9) for n in fused)
    for n in fused:
        state = n.inputs[3]
        assert state.dtype == "uint32" and type(state.type).__name__ == "GpuArrayType"


def test_mixed_precision_casts_the_operands_of_dropout_attention_not_its_state():
    """On the host, mixed precision casts q, k, v, o and dO of the fused ops to half and
    leaves the generator state (and lse) alone; the step still drops what it drew."""
    qf, kf, vf = (T.tensor4(n, dtype="float32") for n in "qkv")
    with config.change_flags(mixed_precision="bfloat16", floatX="float32"):
        o = sdpa(qf, kf, vf, dropout_p=0.2, rng=RandomStreams(4))
        f = symgpu.function([qf, kf, vf], [o] + T.grad(o.sum(), [qf, kf, vf]))
    nodes = [n for n in f.maker.fgraph.toposort()
             if isinstance(n.op, (Attention, AttentionGrad))]
    assert len(nodes) == 2
    for n in nodes:
        state = n.inputs[3]
        assert state.dtype == "uint32" and n.inputs[0].dtype == "bfloat16", n.inputs
    got = f(*(x.astype("float32") for x in QKV))
    assert all(np.all(np.isfinite(g)) for g in got)


def test_kernel_draw_codes_follow_the_host_table():
    """attention.cu's AT_DRAW_* codes are the host's (DROPOUT_DRAWS' order, 1 up): the kernel
    reads the draw dtype by that number."""
    src = A.attention_source("bfloat16", 64)
    names = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16"}
    for dtype, code in A._DRAWS.items():
        assert re.search(rf"#define AT_DRAW_{names[dtype]} {code}\b", src), (dtype, code)
