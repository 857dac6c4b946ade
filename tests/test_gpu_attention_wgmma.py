"""The Hopper attention kernels (attention_wgmma.cu: wgmma products, swizzled tiles) on the
GPU machine: which calls they take, and their values against float64 NumPy and against the
general kernels of the same call, over the shapes their tiling must handle: lengths that are
not a multiple of 64, more keys than queries and fewer, causal or not, head dims 64 and 128,
float16 and bfloat16.

Tolerances are test_gpu_attention's (inputs and P, dS rounded to the dtype, float32
accumulation); the two kernels' results agree to the same."""
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.tensor.nnet import scaled_dot_product_attention as sdpa
from symgpu.tensor.nnet.attention import attention_grad_reference, attention_reference

pytestmark = pytest.mark.gpu
TOL = {"float16": (1e-2, 3e-2), "bfloat16": (4e-2, 1e-1)}
RNG = np.random.default_rng(11)


@pytest.fixture
def launched(monkeypatch):
    """The names of the attention kernels launched (attention._kernel's lookups)."""
    from symgpu.gpu.ops import attention as A
    names = []
    real = A._kernel

    def spy(ctx, module, name, smem):
        names.append(name)
        return real(ctx, module, name, smem)
    monkeypatch.setattr(A, "_kernel", spy)
    return names


def _step(dtype, causal, scale=None, masked=False):
    q, k, v, do = (T.tensor(dtype=dtype, shape=(None,) * 4, name=n) for n in ("q", "k", "v", "do"))
    ins = [q, k, v]
    if masked:
        ins.append(T.tensor(dtype="float32", shape=(None,) * 2, name="m"))
    o = sdpa(q, k, v, attn_mask=ins[3] if masked else None, is_causal=causal, scale=scale)
    grads = T.grad(None, [q, k, v], known_grads={o: do})
    return symgpu.function(ins + [do], [o] + list(grads))


def _values(dtype, shape_q, shape_k):
    return [RNG.standard_normal(s).astype(dtype) for s in (shape_q, shape_k, shape_k, shape_q)]


def _check(got, vals, causal, dtype, scale=None):
    f64 = [x.astype("float64") for x in vals[:3]]
    ro, lse = attention_reference(*f64, None, scale, causal)
    rg = attention_grad_reference(*f64, None, ro, lse, vals[3].astype("float64"), None, scale,
                                  causal)
    to, tg = TOL[dtype]
    for a, b, t in zip(got, [ro] + list(rg), [to, tg, tg, tg]):
        a = np.asarray(a, "float64")
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=t * max(1.0, np.abs(b).max()), rtol=t)


CASES = [((2, 3, 200, 64), (2, 3, 200, 64), True),
         ((2, 3, 200, 64), (2, 3, 200, 64), False),
         ((1, 2, 100, 64), (1, 2, 300, 64), True),      # more keys than queries
         ((1, 2, 300, 64), (1, 2, 100, 64), True),      # fewer: rows past the keys' end
         ((1, 2, 257, 64), (1, 2, 257, 64), False),
         ((1, 2, 130, 128), (1, 2, 130, 128), True),
         ((1, 2, 64, 128), (1, 2, 190, 128), False)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape_q,shape_k,causal", CASES)
def test_wgmma_kernels_match_numpy(cuda, launched, dtype, shape_q, shape_k, causal):
    hd = shape_q[-1]
    vals = _values(dtype, shape_q, shape_k)
    _check(_step(dtype, causal)(*vals), vals, causal, dtype)
    assert f"attn_fwd_wg_{dtype}_{hd}" in launched and f"attn_bwd_wg_{dtype}_{hd}" in launched


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_wgmma_kernels_agree_with_the_general_ones(cuda, launched, monkeypatch, dtype):
    """The same call with the Hopper kernels switched off in the tiles table: the general
    (mma.sync) kernels run, and the results agree within the dtype's tolerance."""
    from symgpu.gpu.ops import attention as A
    shape = (2, 4, 333, 64)
    vals = _values(dtype, shape, shape)
    fast = [np.asarray(x, "float64") for x in _step(dtype, True)(*vals)]
    assert {f"attn_fwd_wg_{dtype}_64", f"attn_bwd_wg_{dtype}_64"} <= set(launched), launched
    key = (2, 64)
    monkeypatch.setitem(A._TILES, key, A._TILES[key]._replace(wg_fwd=0, wg_bwd=0))
    launched.clear()
    general = [np.asarray(x, "float64") for x in _step(dtype, True)(*vals)]
    assert launched and not any("_wg_" in n for n in launched), launched
    to, tg = TOL[dtype]
    for a, b, t in zip(fast, general, [to, tg, tg, tg]):
        np.testing.assert_allclose(a, b, atol=t * max(1.0, np.abs(b).max()), rtol=t)


def test_calls_the_wgmma_kernels_do_not_take_run_the_general_ones(cuda, launched):
    """A mask, a negative scale or a head dim under 64 (zero-padded tiles): the general
    kernels, with the right values."""
    vals = _values("float16", (1, 2, 80, 64), (1, 2, 80, 64))
    _check(_step("float16", True, scale=-0.1)(*vals), vals, True, "float16", scale=-0.1)
    vals40 = _values("float16", (1, 2, 80, 40), (1, 2, 80, 40))
    _check(_step("float16", False)(*vals40), vals40, False, "float16")
    mask = np.zeros((80, 80), "float32")
    got = _step("float16", False, masked=True)(*vals[:3], mask, vals[3])
    _check(got, vals, False, "float16")
    assert launched and not any("_wg_" in n for n in launched), launched
