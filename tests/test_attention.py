"""Fused attention on the host: the Attention/AttentionGrad ops against NumPy, their gradients
(verify_grad), the fuse_attention rewrite per spelling (graph inspected, values checked, the
fused gradient equal to the unfused one), placement on a virtual GPU, and the CUDA kernels
compiled for sm_90."""
import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.compile.mode import get_mode
from symgpu.gradient import verify_grad
from symgpu.tensor.nnet import scaled_dot_product_attention as sdpa
from symgpu.tensor.nnet.attention import Attention, AttentionGrad

from gpu_helpers import compile_for_sm90, requires_nvcc

RNG = np.random.default_rng(1234)
UNFUSED = get_mode("FAST_RUN").excluding("fuse_attention")


def naive(q, k, v, mask=None, scale=None, causal=False):
    """softmax(q k^T scale + mask) v written the plain way, in float64."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = s + mask
    if causal:
        s = np.where(np.tri(s.shape[-2], s.shape[-1], dtype=bool), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def randn(*shape, dtype="float64"):
    return RNG.standard_normal(shape).astype(dtype)


def op_names(f):
    return [type(n.op).__name__ for n in f.maker.fgraph.toposort()]


# ============================================================================ the ops

@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_numpy(dtype, causal):
    q, k, v = (T.tensor4(n, dtype=dtype) for n in "qkv")
    f = symgpu.function([q, k, v], sdpa(q, k, v, is_causal=causal))
    Q, K, V = randn(2, 3, 7, 8, dtype=dtype), randn(2, 3, 9, 8, dtype=dtype), \
        randn(2, 3, 9, 8, dtype=dtype)
    got = f(Q, K, V)
    assert got.dtype == dtype and got.shape == (2, 3, 7, 8)
    tol = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3}[dtype]
    np.testing.assert_allclose(got.astype("float64"), naive(Q, K, V, causal=causal),
                               atol=tol, rtol=tol * 10)


def test_attention_mask_3d_and_fully_masked_rows():
    q, k, v = T.tensor3s("q", "k", "v")
    m = T.matrix("m")
    o = sdpa(q, k, v, attn_mask=m, scale=0.3)
    f = symgpu.function([q, k, v, m], o)
    Q, K, V = randn(4, 5, 6), randn(4, 5, 6), randn(4, 5, 6)
    M = randn(5, 5)
    np.testing.assert_allclose(f(Q, K, V, M), naive(Q, K, V, M, 0.3), atol=1e-12)
    M[2] = -np.inf                             # row 2 sees nothing: zeros, not NaN
    got = f(Q, K, V, M)
    assert np.all(got[:, 2] == 0) and np.all(np.isfinite(got))
    np.testing.assert_allclose(np.delete(got, 2, 1), np.delete(naive(Q, K, V, M, .3), 2, 1),
                               atol=1e-12)


def test_boolean_mask_and_str_and_shapes():
    q, k, v = T.tensor4s("q", "k", "v")
    keep = T.tensor4("keep", dtype="bool")
    o = sdpa(q, k, v, attn_mask=keep, is_causal=True, scale=0.5)
    assert str(o.owner.op) == "Attention{causal,scale=0.5,mask}"
    assert str(Attention()) == "Attention{scale=1/sqrt(d)}"
    f = symgpu.function([q, k, v, keep], [o, o.shape])
    Q, K, V = randn(1, 2, 4, 3), randn(1, 2, 4, 3), randn(1, 2, 4, 3)
    B = RNG.random((1, 1, 4, 4)) > 0.3
    B[..., 0] = True
    got, shape = f(Q, K, V, B)
    np.testing.assert_allclose(got, naive(Q, K, V, np.where(B, 0, -np.inf), .5, True),
                               atol=1e-12)
    assert tuple(shape) == (1, 2, 4, 3)


def test_shape_errors_name_the_op():
    q, k, v = T.tensor3s("q", "k", "v")
    f = symgpu.function([q, k, v], sdpa(q, k, v))
    with pytest.raises(ValueError, match="Attention"):
        f(randn(2, 3, 4), randn(2, 3, 5), randn(2, 3, 5))
    with pytest.raises(TypeError, match="same number of dimensions"):
        Attention()(q, k, T.tensor4())


@pytest.mark.parametrize("causal", [False, True])
def test_verify_grad(causal):
    pts = [randn(2, 4, 3), randn(2, 5, 3), randn(2, 5, 3)]
    verify_grad(lambda a, b, c: sdpa(a, b, c, is_causal=causal), pts)
    verify_grad(lambda a, b, c, m: sdpa(a, b, c, attn_mask=m, is_causal=causal, scale=.4),
                pts + [randn(4, 5)])


def test_verify_grad_float32_4d():
    pts = [randn(1, 2, 4, 3, dtype="float32") for _ in range(3)]
    verify_grad(lambda a, b, c: sdpa(a, b, c, is_causal=True), pts)


def test_gradient_through_lse():
    """The saved log-sum-exp is an output too: its gradient joins dS (has_dlse)."""
    def fn(a, b, c):
        node = Attention(False, None, False).make_node(a, b, c)
        return node.outputs[0].sum() + (node.outputs[1] ** 2).sum()
    verify_grad(fn, [randn(2, 4, 3), randn(2, 5, 3), randn(2, 5, 3)])
    a, b, c = T.tensor3s("a", "b", "c")
    node = Attention().make_node(a, b, c)
    g = T.grad((node.outputs[1] ** 2).sum() + node.outputs[0].sum(), a)
    assert any(isinstance(n.op, AttentionGrad) and n.op.has_dlse
               for n in symgpu.graph.basic.io_toposort([a, b, c], [g]))


# ============================================================================ the rewrite

def _softmax_written(x, use_max=True):
    if use_max:
        x = x - T.max(x, axis=-1, keepdims=True)
    e = T.exp(x)
    return e / T.sum(e, axis=-1, keepdims=True)


S = 6
TRI = np.tril(np.ones((S, S), bool))
q4, k4, v4 = T.tensor4s("q", "k", "v")
q3, k3, v3 = T.tensor3s("q", "k", "v")
SPELLINGS = {
    # name: (output, inputs, scale, causal, mask)
    "softmax_matmul_scale_on_scores":
        (lambda: T.nnet.softmax(T.matmul(q4, k4.dimshuffle(0, 1, 3, 2)) * 0.5, axis=-1) @ v4,
         "4", 0.5, False),
    "scale_on_q_swapaxes":
        (lambda: T.nnet.softmax((q4 * 0.5) @ k4.swapaxes(-1, -2)) @ v4, "4", 0.5, False),
    "exp_over_sum_div_sqrt_transpose":
        (lambda: _softmax_written((q4 @ k4.transpose(0, 1, 3, 2)) / np.sqrt(4.0)) @ v4,
         "4", 0.5, False),
    "exp_over_sum_without_max":
        (lambda: _softmax_written(q4 @ k4.swapaxes(-1, -2), False) @ v4, "4", 1.0, False),
    "batched_dot_3d":
        (lambda: T.batched_dot(T.nnet.softmax(T.batched_dot(q3, k3.dimshuffle(0, 2, 1)) * .5),
                               v3), "3", 0.5, False),
    "causal_additive_constant":
        (lambda: T.nnet.softmax(q4 @ k4.swapaxes(-1, -2) * .5 +
                                np.where(TRI, 0, -np.inf).astype("float64")) @ v4,
         "4", 0.5, True),
    "causal_additive_minus_1e9":
        (lambda: T.nnet.softmax(0.5 * (q4 @ k4.swapaxes(-1, -2)) +
                                np.where(TRI, 0, -1e9)) @ v4, "4", 0.5, True),
    "causal_switch_constant":
        (lambda: T.nnet.softmax(T.switch(TRI, q4 @ k4.swapaxes(-1, -2) * .5, -np.inf)) @ v4,
         "4", 0.5, True),
    "causal_switch_tril_ones":
        (lambda: T.nnet.softmax(T.switch(T.eq(T.tril(T.ones((q4.shape[2], k4.shape[2]))), 0),
                                         -1e9, q4 @ k4.swapaxes(-1, -2) * .5)) @ v4,
         "4", 0.5, True),
    "causal_switch_tri":
        (lambda: _softmax_written(T.switch(T.tri(q4.shape[2], k4.shape[2], 0, "bool"),
                                           q4 @ k4.swapaxes(-1, -2) / 2.0, -np.inf)) @ v4,
         "4", 0.5, True),
    "additive_mask_variable":
        (lambda: T.nnet.softmax(q4 @ k4.swapaxes(-1, -2) * .5 + MASK) @ v4, "4m", 0.5, False),
    "switch_mask_variable":
        (lambda: T.nnet.softmax(T.switch(KEEP, q4 @ k4.swapaxes(-1, -2) * .5, -1e9)) @ v4,
         "4b", 0.5, False),
}
MASK = T.matrix("mask")
KEEP = T.tensor(dtype="bool", shape=(None, 1, None, None), name="keep")


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_rewrite_fuses_spelling_and_its_gradient(name):
    build, kind, scale, causal = SPELLINGS[name]
    o = build()
    ins = [q3, k3, v3] if kind == "3" else [q4, k4, v4]
    shape = (4, S, 4) if kind == "3" else (2, 2, S, 4)
    vals = [randn(*shape) for _ in ins]
    mask = None
    if kind == "4m":
        ins, mask = ins + [MASK], randn(S, S)
        vals.append(mask)
    if kind == "4b":
        keep = RNG.random((2, 1, S, S)) > 0.4
        keep[..., 0] = True
        ins, mask = ins + [KEEP], np.where(keep, 0, -1e9)
        vals.append(keep)
    f = symgpu.function(ins, o)
    names = op_names(f)
    assert "Attention" in names and "Softmax" not in names and "MatMul" not in names, names
    (node,) = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, Attention)]
    assert node.op.causal == causal and node.op.scale == pytest.approx(scale)
    np.testing.assert_allclose(f(*vals), naive(*vals[:3], mask, scale, causal), atol=1e-10)

    grads = T.grad((o ** 2).sum(), ins[:3])
    fused = symgpu.function(ins, grads)
    unfused = symgpu.function(ins, grads, mode=UNFUSED)
    fnames, unames = op_names(fused), op_names(unfused)
    assert "AttentionGrad" in fnames and "Softmax" not in fnames and "MatMul" not in fnames, \
        fnames
    assert "Attention" not in unames and "AttentionGrad" not in unames
    for a, b in zip(fused(*vals), unfused(*vals)):
        np.testing.assert_allclose(a, b, atol=1e-9)


def test_rewrite_fuses_forward_only_graph_and_leaves_other_readers():
    p = T.nnet.softmax(q4 @ k4.swapaxes(-1, -2))
    f = symgpu.function([q4, k4, v4], [p @ v4, p])       # the probabilities are wanted too
    assert "Attention" in op_names(f)
    Q, K, V = (randn(1, 2, S, 3) for _ in range(3))
    o, probs = f(Q, K, V)
    np.testing.assert_allclose(o, naive(Q, K, V, scale=1.0), atol=1e-10)
    np.testing.assert_allclose(probs @ V, o, atol=1e-10)


def test_rewrite_leaves_non_attention_alone():
    """(Dropout on the probabilities is fused: tests/test_attention_dropout.py.)"""
    # softmax over the wrong axis, or a product with a non-transposed k: not attention
    for o in (T.nnet.softmax(q4 @ k4.swapaxes(-1, -2), axis=2) @ v4,
              T.nnet.softmax(q4 @ k4) @ v4):
        assert "Attention" not in op_names(symgpu.function([q4, k4, v4], o))


# ============================================================================ placement

@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_attention_lifts_to_the_gpu(vgpu, dtype):
    q, k, v = (T.tensor4(n, dtype=dtype) for n in "qkv")
    o = T.nnet.softmax(q @ k.swapaxes(-1, -2) * np.asarray(.125, dtype) +
                       np.where(np.tri(8, dtype=bool), 0, -np.inf).astype(dtype)) @ v
    g = T.grad(o.sum(), [q, k, v])
    f = symgpu.function([q, k, v], [o] + g)
    names = op_names(f)
    assert "GpuAttention" in names and "GpuAttentionGrad" in names, names
    assert "Attention" not in names and "AttentionGrad" not in names
    node = next(n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "GpuAttention")
    assert node.op.causal and node.op.scale == 0.125


def test_float64_attention_stays_on_the_host(vgpu):
    q, k, v = (T.tensor4(n, dtype="float64") for n in "qkv")
    f = symgpu.function([q, k, v], sdpa(q, k, v))
    assert "Attention" in op_names(f) and "GpuAttention" not in op_names(f)


# ============================================================================ kernels

@requires_nvcc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("hd", [64, 128])
def test_attention_kernels_compile_for_sm90(tmp_path, dtype, hd):
    from symgpu.gpu.ops.attention import attention_source
    cubin = compile_for_sm90(attention_source(dtype, hd), tmp_path)
    for name in (f"attn_fwd_{dtype}_{hd}", f"attn_bwd_{dtype}_{hd}", f"attn_bwd_pre_{dtype}",
                 f"attn_bwd_dq_{dtype}"):
        assert name.encode() in cubin


@requires_nvcc
def test_attention_fast_tf32_module_compiles_for_sm90(tmp_path):
    """gpuarray.allow_tf32: the float32 module built with one TF32 product per multiply."""
    from symgpu.gpu.ops.attention import attention_source
    src = attention_source("float32", 64, True)
    assert "#define AT_FAST_TF32" in src
    assert "#define AT_FAST_TF32" not in attention_source("float32", 64)
    assert b"attn_bwd_float32_64" in compile_for_sm90(src, tmp_path)


def test_attention_tiles_fit_shared_memory():
    """Every instance's tiles fit the H200's 227 KB of shared memory per block, and a
    16-bit head dim 64 instance leaves room for two blocks per SM."""
    from symgpu.gpu.ops import attention as A
    for dtype in A.ATTENTION_DTYPES:
        for hd in A.HEAD_DIMS:
            assert max(A._fwd_smem(dtype, hd), A._bwd_smem(dtype, hd)) <= 227 * 1024
            t = A._tiles(dtype, hd)
            assert A._fwd_rows(dtype, hd) == 16 * t.fwd_warps * t.fwd_tiles
            assert t.bwd_stages in (1, 2) and t.fwd_keys % 16 == 0 and t.fwd_keys <= 128
            if A._wgmma_tiles(dtype, hd):    # the Hopper kernels' (attention_wgmma.cu)
                assert max(A._wg_fwd_smem(dtype, hd), A._wg_bwd_smem(dtype, hd)) <= 227 * 1024
                assert t.wg_bwd_queries in (1, t.wg_bwd) and t.wg_keys in (64, 128)
    assert 2 * A._bwd_smem("float16", 64) <= 227 * 1024


def test_sixteen_byte_rows_need_every_lead_stride_in_whole_chunks():
    """The kernels' 16-byte paths (cp.async tiles, the row kernels) need every row to start
    aligned: the data and the batch, head and row strides in whole 16-byte chunks. A row
    stride of 68 halves (q sliced from a wider array) takes the scalar path."""
    from types import SimpleNamespace
    from symgpu.gpu.ops.attention import _aligned
    a = SimpleNamespace(ptr=4096)
    assert _aligned([a], [(2 * 64 * 64, 64 * 64, 64)], 2)
    assert not _aligned([a], [(2 * 64 * 68, 64 * 68, 68)], 2)      # the row stride
    assert not _aligned([a], [(2 * 64 * 64 + 4, 64 * 64, 64)], 2)  # the batch stride
    assert not _aligned([SimpleNamespace(ptr=4098)], [(0, 0, 64)], 2)
    assert _aligned([a], [(0, 0, 68)], 4) and not _aligned([a], [(0, 0, 66)], 4)


def test_graph_check_tolerates_one_ulp_in_16_bit_outputs():
    """A new CUDA graph is checked against plain launches: float32 atomics (attention's dq)
    summed in another order may round a float16 result one unit the other way; a real
    difference is still caught."""
    from symgpu.gpu.exec.graph_instance import results_differ
    a = np.linspace(0.1, 4, 50).astype("float16")
    b = a.copy()
    b[7] = np.nextafter(b[7], np.float16(10))
    assert results_differ([a], [b]) is None
    b[9] *= np.float16(1.01)
    assert "output 0" in results_differ([a], [b])
    f = np.linspace(0.1, 4, 50).astype("float32")
    assert results_differ([f], [f * np.float32(1 + 1e-3)]) is not None


@requires_nvcc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("hd", [64, 128])
def test_hopper_attention_module_compiles_for_sm90a_without_serialized_products(tmp_path,
                                                                                 dtype, hd):
    """On Hopper the 16-bit module also holds the wgmma kernels, built for sm_90a; ptxas
    must keep their products asynchronous (its C7512 warning: too few registers, the
    products serialized, the kernels' point lost)."""
    import subprocess
    from symgpu.gpu.ops.attention import attention_source
    from symgpu.gpu.runtime.compiler import _nvcc
    src = attention_source(dtype, hd, hopper=True)
    cubin = compile_for_sm90(src, tmp_path, "sm_90a")
    for name in (f"attn_fwd_wg_{dtype}_{hd}", f"attn_bwd_wg_{dtype}_{hd}",
                 f"attn_fwd_{dtype}_{hd}", f"attn_bwd_pre_{dtype}"):
        assert name.encode() in cubin
    cu = tmp_path / "m.cu"
    cu.write_text(src)
    run = subprocess.run([_nvcc(), "-cubin", "-arch=sm_90a", "-O3", "-Xptxas", "-v", str(cu),
                          "-o", str(tmp_path / "m.cubin")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    log = run.stdout + run.stderr
    assert "attn_fwd_wg" in log and "serialized" not in log, log[-3000:]
    other = attention_source(dtype, hd)                        # other GPUs: no sm_90a code
    assert "wgmma.mma_async" not in other and "attn_fwd_wg_" not in other


def test_wgmma_kernels_take_only_the_calls_they_were_written_for():
    """16-bit, no mask, a positive scale, d equal to the head dim with aligned rows, a
    Hopper context: anything else runs the general kernels."""
    from types import SimpleNamespace
    from symgpu.gpu.ops.attention import _arch, _wgmma_runs
    hopper, other = SimpleNamespace(arch="sm_90"), SimpleNamespace(arch="sm_80")
    bf16 = _arch(hopper, "bfloat16", 64)
    assert bf16 == "sm_90a" and _arch(hopper, "float16", 128) == "sm_90a"
    assert _arch(other, "bfloat16", 64) is None and _arch(hopper, "float32", 64) is None
    assert _wgmma_runs(bf16, 2, True, None, 0.125)
    assert not _wgmma_runs(None, 2, True, None, 0.125)              # not Hopper, or float32
    assert not _wgmma_runs(bf16, 0, True, None, 0.125)              # tiles: off
    assert not _wgmma_runs(bf16, 2, False, None, 0.125)             # d < hd, strides
    assert not _wgmma_runs(bf16, 2, True, object(), 0.125)          # a mask
    assert not _wgmma_runs(bf16, 2, True, None, -0.125)
    assert not _wgmma_runs(bf16, 2, True, None, float("nan"))


def test_attention_prefetch_names_the_modules_nvcc_target():
    """The link-time prefetch compiles the module the node will load: on a Hopper context
    the sm_90a build of the 16-bit module, the context's own target for float32."""
    from symgpu.config import config
    from symgpu.gpu.exec import prefetch
    from symgpu.gpu.placement.rewriting import virtual_context
    with config.change_flags(floatX="float32"), virtual_context(None):
        for dtype, arch in (("bfloat16", "sm_90a"), ("float32", "sm_90")):
            q, k, v = (T.tensor(dtype=dtype, shape=(None,) * 4, name=n) for n in "qkv")
            f = symgpu.function([q, k, v], sdpa(q, k, v, is_causal=True).transfer(None))
            nodes = [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "GpuAttention"]
            assert nodes
            reqs = prefetch.requests(nodes, include_virtual=True, skip_seen=False)
            assert [r.arch for r in reqs] == [arch]
            assert ("attn_fwd_wg_" in reqs[0].source) == (arch == "sm_90a")


def test_launch_plan_picks_the_kernel_the_call_can_take(monkeypatch):
    """_launch_plan: the Hopper kernel, its grid unit and threads where _wgmma_runs holds, the
    general kernel's otherwise (the kernel lookup stubbed: no GPU here)."""
    from types import SimpleNamespace
    from symgpu.gpu.ops import attention as A
    asked = []

    def get_kernel(key, source, name, options=(), context=None, arch=None):
        asked.append((name, arch))
        return SimpleNamespace()

    class AllSeen(set):     # the shared-memory attributes: no driver to set them on
        def __contains__(self, key):
            return True
    monkeypatch.setattr(A, "get_kernel", get_kernel)
    monkeypatch.setattr(A, "_big_smem", AllSeen())
    hopper, other = SimpleNamespace(arch="sm_90"), SimpleNamespace(arch="sm_80")
    t = A._tiles("bfloat16", 64)
    run = A._launch_plan(hopper, "bfloat16", 64, "bwd", True, None, 0.125)
    assert asked[-1] == ("attn_bwd_wg_bfloat16_64", "sm_90a")
    assert (run.per_block, run.threads, run.smem) == (64 * t.wg_bwd, 128 * t.wg_bwd,
                                                      A._wg_bwd_smem("bfloat16", 64))
    run = A._launch_plan(hopper, "bfloat16", 64, "fwd", True, object(), 0.125)
    assert asked[-1] == ("attn_fwd_bfloat16_64", "sm_90a")      # masked: the general kernel
    assert (run.per_block, run.smem) == (A._fwd_rows("bfloat16", 64), A._fwd_smem("bfloat16", 64))
    A._launch_plan(other, "bfloat16", 64, "fwd", True, None, 0.125)
    assert asked[-1] == ("attn_fwd_bfloat16_64", None)          # not Hopper: its own target
    A._launch_plan(hopper, "float32", 64, "bwd", True, None, 0.125)
    assert asked[-1] == ("attn_bwd_float32_64", None)
    for step in ("fwd", "bwd"):                                  # a dropout: its own kernels
        run = A._launch_plan(hopper, "bfloat16", 64, step, True, None, 0.125, drop=True)
        assert asked[-1] == (f"attn_{step}_drop_bfloat16_64", "sm_90a")
        assert run.threads == (32 * t.fwd_warps if step == "fwd" else A._THREADS)


def test_attention_grid_puts_every_head_first_block_first():
    """The kernels' grid is (batch * heads, row blocks): the hardware starts blocks in x-first
    order, so every head's block 0 (under a causal mask the longest: the forward's last query
    block, the backward's first key block) starts before any block 1; and a grid past 65535
    row blocks is a clear error, not a failed launch."""
    from symgpu.gpu.ops import attention as A
    assert A._grid(1024, 128, 96) == (96, 8, 1)
    assert A._grid(1000, 64, 70000) == (70000, 16, 1)     # batch * heads past 65535: fine
    with pytest.raises(ValueError, match="65535"):
        A._grid(65536 * 64 + 1, 64, 2)
