"""Fused attention on the GPU (run with ``pytest -m gpu`` on the GPU machine): GpuAttention
and GpuAttentionGrad against NumPy in float32, float16 and bfloat16 (where placement takes
it), causal and masked, sequence lengths that are not a multiple of the 64-row tile, head
dims 64, 128 and a zero-padded 40.

Tolerances: float32 runs 3xTF32 products (float32's accuracy): 2e-4 on o, 1e-3 on the
gradients; float16 1e-2 / 3e-2 and bfloat16 4e-2 / 1e-1 (inputs and P, dS rounded to the
dtype, float32 accumulation), against float64 NumPy of the same rounded inputs."""
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.graph.basic import ancestors
from symgpu.gpu.placement.type import gpu_supports_dtype
from symgpu.tensor.nnet import scaled_dot_product_attention as sdpa
from symgpu.tensor.nnet.attention import (Attention, Dropout, attention_grad_reference,
                                          attention_reference, dropout_kept)
from symgpu.tensor.shared_randomstreams import RandomStreams

pytestmark = pytest.mark.gpu
TOL = {"float32": (2e-4, 1e-3), "float16": (1e-2, 3e-2), "bfloat16": (4e-2, 1e-1)}
RNG = np.random.default_rng(7)


def _case(dtype, shape_q, shape_k, causal, masked, scale=None, tol=None):
    if not gpu_supports_dtype(dtype):
        pytest.skip(f"GPU placement does not take {dtype} yet")
    nd = len(shape_q)
    q, k, v = (T.tensor(dtype=dtype, shape=(None,) * nd, name=n) for n in "qkv")
    ins = [q, k, v]
    mask = None
    if masked:
        m = T.tensor(dtype="float32", shape=(None,) * 2, name="m")
        ins.append(m)
        mask = (RNG.standard_normal((shape_q[-2], shape_k[-2])) * 2).astype("float32")
        mask[:, 3] = -np.inf
    o = sdpa(q, k, v, attn_mask=ins[3] if masked else None, is_causal=causal, scale=scale)
    do = T.tensor(dtype=dtype, shape=(None,) * nd, name="do")
    grads = T.grad(None, ins[:3], known_grads={o: do})
    f = symgpu.function(ins + [do], [o] + list(grads))
    names = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert "GpuAttention" in names and "GpuAttentionGrad" in names, names
    Q = RNG.standard_normal(shape_q).astype(dtype)
    K = RNG.standard_normal(shape_k).astype(dtype)
    V = RNG.standard_normal(shape_k).astype(dtype)
    DO = RNG.standard_normal(shape_q).astype(dtype)
    vals = [Q, K, V] + ([mask] if masked else []) + [DO]
    got = f(*vals)
    f64 = [x.astype("float64") for x in (Q, K, V)]
    ro, lse = attention_reference(*f64, None if mask is None else mask.astype("float64"),
                                  scale, causal)
    rg = attention_grad_reference(*f64, mask, ro, lse, DO.astype("float64"), None, scale,
                                  causal)
    to, tg = TOL[tol or dtype]
    for a, b, t in zip(got, [ro] + list(rg), [to, tg, tg, tg]):
        a = np.asarray(a, "float64")
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=t * max(1.0, np.abs(b).max()), rtol=t)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_attention_64(cuda, dtype, causal):
    _case(dtype, (2, 3, 200, 64), (2, 3, 200, 64), causal, False)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gpu_attention_masked_odd_lengths_3d(cuda, dtype):
    _case(dtype, (5, 77, 64), (5, 131, 64), False, True, scale=0.2)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gpu_attention_head_128_causal_odd(cuda, dtype):
    _case(dtype, (1, 2, 130, 128), (1, 2, 130, 128), True, False)


def test_gpu_attention_head_40_padded(cuda):
    _case("float16", (1, 2, 65, 40), (1, 2, 65, 40), True, True)


@pytest.mark.parametrize("dtype,d", [("float16", 36), ("float32", 34), ("float32", 36)])
def test_gpu_attention_rows_of_odd_sixteen_byte_chunks(cuda, dtype, d):
    """The backward's row kernels (Delta and dq's rounding) take 16-byte accesses only where
    every row starts aligned and d fills whole chunks: 36 halves and 34 floats do not, 36
    floats do."""
    _case(dtype, (2, 2, 45, d), (2, 2, 45, d), True, False)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_gpu_attention_rows_of_a_wider_array(cuda, dtype):
    """q, k, v, dO as views of (..., 68) arrays: rows 68 values apart (136 or 272 bytes, not
    whole 16-byte chunks for halves) take the scalar loads; the values still match."""
    if not gpu_supports_dtype(dtype):
        pytest.skip(f"GPU placement does not take {dtype} yet")
    shape = (1, 2, 70, 64)
    q, k, v, do = (T.tensor(dtype=dtype, shape=(None,) * 4, name=n) for n in ("q", "k", "v", "do"))
    o = sdpa(q, k, v, is_causal=True)
    grads = T.grad(None, [q, k, v], known_grads={o: do})
    f = symgpu.function([q, k, v, do], [o] + list(grads))
    names = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert "GpuAttention" in names and "GpuAttentionGrad" in names, names
    from symgpu.gpu import to_gpu
    wide = [RNG.standard_normal(shape[:-1] + (68,)).astype(dtype) for _ in range(4)]
    views = [to_gpu(w)[..., :64] for w in wide]
    assert views[0].strides[-2] == 68 * np.dtype(dtype).itemsize
    got = f(*views)
    f64 = [w[..., :64].astype("float64") for w in wide[:3]]
    ro, lse = attention_reference(*f64, None, None, True)
    rg = attention_grad_reference(*f64, None, ro, lse, wide[3][..., :64].astype("float64"),
                                  None, None, True)
    to, tg = TOL[dtype]
    for a, b, t in zip(got, [ro] + list(rg), [to, tg, tg, tg]):
        np.testing.assert_allclose(np.asarray(a, "float64"), b,
                                   atol=t * max(1.0, np.abs(b).max()), rtol=t)


def test_gpu_attention_float32_allow_tf32(cuda):
    """gpuarray.allow_tf32: one TF32 product per multiply (PyTorch's TF32 class of accuracy)."""
    from symgpu.config import config
    with config.change_flags(**{"gpuarray.allow_tf32": True}):
        TOL["float32tf"] = (3e-3, 1e-2)
        try:
            _case("float32", (1, 2, 150, 64), (1, 2, 150, 64), True, False, tol="float32tf")
        finally:
            del TOL["float32tf"]


@pytest.mark.parametrize("d", [64, 128])
def test_gpu_attention_float32_is_float32_accurate(cuda, d):
    """float32 splits each operand into a TF32 part (rounded with integer operations) and the
    rest (truncated by the tensor cores): three products stay in float32's class of error
    (4.5e-6 of the largest value measured on the H200), where one TF32 product (or a split
    gone wrong) errs by about 1e-3."""
    TOL["float32tight"] = (2e-5, 5e-5)
    try:
        _case("float32", (1, 2, 300, d), (1, 2, 300, d), True, False, tol="float32tight")
    finally:
        del TOL["float32tight"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpu_attention_outputs_are_stored_heads_merged(cuda, dtype):
    """o, dk and dv (and a half dq) are (B, H, S, d) arrays stored as (B, S, H, d): the heads'
    merge users write, ``dimshuffle(0, 2, 1, 3).reshape((B, S, H * d))``, is then a view
    (no strided copy); the values still match NumPy."""
    from symgpu.gpu.placement.basic_ops import gpu_from_host
    B, H, S, d = 2, 3, 70, 64
    q, k, v, do = (T.tensor(dtype=dtype, shape=(None,) * 4, name=n) for n in ("q", "k", "v", "do"))
    o = sdpa(q, k, v, is_causal=True)
    grads = T.grad(None, [q, k, v], known_grads={o: do})
    f = symgpu.function([q, k, v, do], [gpu_from_host(t) for t in [o] + list(grads)])
    names = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert "GpuAttention" in names and "GpuAttentionGrad" in names, names
    vals = [RNG.standard_normal((B, H, S, d)).astype(dtype) for _ in range(4)]
    got = f(*vals)
    isz = np.dtype(dtype).itemsize
    merged = (S * H * d * isz, d * isz, H * d * isz, isz)
    for name, a in zip(("o", "dq", "dk", "dv"), got):
        if name == "dq" and dtype == "float32":
            continue            # the kernels' float32 accumulator itself: C-contiguous
        assert a.strides == merged, (name, a.strides)
    f64 = [x.astype("float64") for x in vals[:3]]
    ro, lse = attention_reference(*f64, None, None, True)
    rg = attention_grad_reference(*f64, None, ro, lse, vals[3].astype("float64"), None, None,
                                  True)
    to, tg = TOL[dtype]
    for a, b, t in zip(got, [ro] + list(rg), [to, tg, tg, tg]):
        a = np.asarray(a.get(), "float64")
        np.testing.assert_allclose(a, b, atol=t * max(1.0, np.abs(b).max()), rtol=t)


@pytest.mark.parametrize("dtype,draw,causal", [("float32", "float32", True),
                                               ("float16", "float32", False),
                                               ("bfloat16", "bfloat16", True),
                                               ("float32", "float64", False)])
def test_gpu_attention_dropout_drops_what_the_host_drops(cuda, dtype, draw, causal):
    """The kernels compute each score's uniform as the host's draw lays it out: the GPU's o,
    dq, dk, dv equal the host's fused op with the same generator state (which equals the
    written-out graph: test_attention_dropout.py), within the dtype's tolerance."""
    if not gpu_supports_dtype(dtype):
        pytest.skip(f"GPU placement does not take {dtype} yet")
    drop = Dropout(0.8, 0.8, draw)
    state = np.array([5, 6, 7, 0], "uint32")
    q, k, v, do = (T.tensor(dtype=dtype, shape=(None,) * 4, name=n) for n in "qkvd")
    o = Attention(causal, None, False, drop)(q, k, v, T.constant(state))
    f = symgpu.function([q, k, v, do], [o] + T.grad(None, [q, k, v], known_grads={o: do}))
    names = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert "GpuAttention" in names and "GpuAttentionGrad" in names, names
    shape = (2, 3, 70, 64)
    Q, K, V, DO = (RNG.standard_normal(shape).astype(dtype) for _ in range(4))
    got = f(Q, K, V, DO)
    f64 = [x.astype("float64") for x in (Q, K, V)]
    kept = dropout_kept(state, shape[:-1] + (shape[-2],), drop)
    ro, lse = attention_reference(*f64, None, None, causal, kept, drop.div)
    rg = attention_grad_reference(*f64, None, ro, lse, DO.astype("float64"), None, None,
                                  causal, kept, drop.div)
    to, tg = TOL[dtype]
    for a, b, t in zip(got, [ro] + list(rg), [to, tg, tg, tg]):
        np.testing.assert_allclose(np.asarray(a, "float64"), b,
                                   atol=t * max(1.0, np.abs(b).max()), rtol=t)


def test_gpu_sdpa_dropout_step_uses_the_generator_as_the_host_does(cuda):
    """sdpa with dropout through the whole GPU pipeline (the rewrite, the lift, the state
    uploaded and advanced): each call's o equals the host op's from the state before it."""
    q, k, v = (T.tensor(dtype="float32", shape=(None,) * 4, name=n) for n in "qkv")
    o = sdpa(q, k, v, dropout_p=0.3, rng=RandomStreams(9), is_causal=True)
    f = symgpu.function([q, k, v], o)
    names = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert "GpuAttention" in names and "GpuPhiloxElemwise" not in names, names
    (state,) = [x for x in ancestors([o]) if hasattr(x, "get_value") and x.dtype == "uint32"]
    (node,) = [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "GpuAttention"]
    drop = node.op.dropout
    Q, K, V = (RNG.standard_normal((1, 2, 40, 64)).astype("float32") for _ in range(3))
    outs = []
    for _ in range(2):
        before = state.get_value().copy()
        got = np.asarray(f(Q, K, V), "float64")
        kept = dropout_kept(before, (1, 2, 40, 40), drop)
        want, _ = attention_reference(*(x.astype("float64") for x in (Q, K, V)), None, None,
                                      True, kept, drop.div)
        np.testing.assert_allclose(got, want, atol=2e-4 * max(1.0, np.abs(want).max()),
                                   rtol=2e-4)
        outs.append(got)
    assert not np.allclose(outs[0], outs[1])        # the generator moved on
    assert drop.keep == pytest.approx(0.7) and drop.div == pytest.approx(0.7)
