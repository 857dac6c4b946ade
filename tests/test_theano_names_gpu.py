"""theano.gpuarray's documented names (issue 31, helper names-gpu), each exercised as Theano's:
rewrite helpers (opt_util) on graphs placed on a virtual GPU, the kernel-writing helpers
(kernel_codegen, fp16_help) compiled by nvcc and run on the GPU, and GPU ops checked against
NumPy (GPU tests marked `gpu`)."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from gpu_helpers import compile_for_sm90, requires_nvcc
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting.basic import apply_node_rewriter


def _ops(f_or_fgraph):
    fg = getattr(getattr(f_or_fgraph, "maker", None), "fgraph", f_or_fgraph)
    return [n.op for n in fg.toposort()]


# ----------------------------------------------------------------------------- opt_util

def _gemm_graph():
    """z, x, y on the GPU and ``GpuGemm(z, 1, x, y, 0)`` (a fresh dot of x and y)."""
    from symgpu.gpu.ops.blas import GpuGemm
    from symgpu.gpu.placement.type import GpuArrayType
    z, x, y = (GpuArrayType("float32", (False, False))(n) for n in "zxy")
    one, zero = (T.constant(np.float32(v)) for v in (1, 0))
    return (z, x, y), GpuGemm()(z, one, x, y, zero)


def _gpu_scalar(value, nd):
    """A float32 constant broadcast to `nd` dims, uploaded (as lifted graphs hold them)."""
    from symgpu.gpu.placement.basic_ops import gpu_from_host
    return gpu_from_host(T.constant(np.full((1,) * nd, value, dtype="float32")))


def test_grab_cpu_scalar_digs_through_transfers_and_broadcasts(vgpu):
    from symgpu.gpuarray.opt_util import grab_cpu_scalar
    from symgpu.gpu.placement.basic_ops import host_from_gpu
    got = grab_cpu_scalar(_gpu_scalar(3.0, 2), nd=2)
    assert got.ndim == 0 and float(got.data) == 3.0
    bcast = T.constant(np.float32(2.5)).dimshuffle("x", "x")
    assert float(grab_cpu_scalar(host_from_gpu(_gpu_scalar(1.0, 2)), 2).data) == 1.0
    assert float(grab_cpu_scalar(bcast, 2).data) == 2.5
    assert grab_cpu_scalar(T.fmatrix(), 2) is None                       # not a constant
    assert grab_cpu_scalar(T.constant(np.ones((2, 2), "float32")), 2) is None   # not one value


def test_find_node_looks_through_a_round_trip_and_counts_clients(vgpu):
    from symgpu.gpu.ops.blas import GpuGemm
    from symgpu.gpu.placement.basic_ops import gpu_from_host, host_from_gpu
    from symgpu.gpuarray.opt_util import find_node
    ins, g = _gemm_graph()
    back = gpu_from_host(host_from_gpu(g))
    fg = FunctionGraph(list(ins), [back * 2], clone=False)
    assert find_node(back, GpuGemm, fgraph=fg) is g.owner
    assert find_node(ins[0], GpuGemm, ignore_clients=True) is None     # a graph input
    fg2 = FunctionGraph(list(ins), [back * 2, g], clone=False)          # g read twice
    assert find_node(back, GpuGemm, fgraph=fg2) is None
    assert find_node(back, GpuGemm, ignore_clients=True) is g.owner
    with pytest.raises(ValueError, match="fgraph"):
        find_node(back, GpuGemm)


def test_is_equal_only_for_constants():
    from symgpu.gpuarray.opt_util import is_equal
    assert is_equal(T.constant(0.0), 0) and is_equal(T.constant(np.float32(2)), 2.0)
    assert not is_equal(T.constant(1.0), 0) and not is_equal(T.dscalar(), 0)


def _merged(rewriter, fg):
    node = fg.outputs[0].owner
    assert apply_node_rewriter(fg, node, rewriter)
    return fg.outputs[0].owner


@pytest.mark.parametrize("scale", [2.0, 0.0, 1.0])
def test_alpha_merge_folds_a_constant_scale_into_gemm(vgpu, scale):
    from symgpu.gpu.ops.blas import GpuGemm
    from symgpu.gpu.ops.elemwise import GpuElemwise
    from symgpu.gpuarray.opt_util import alpha_merge
    from symgpu.scalar.basic import SCALAR_OPS
    from symgpu.tensor.grids import get_scalar_constant_value

    @alpha_merge(GpuGemm, alpha_in=1, beta_in=4)
    def local_gemm_alpha(node, *inputs):
        return [GpuGemm(node.op.inplace)(*inputs)]

    assert local_gemm_alpha.name == "local_gemm_alpha"
    ins, g = _gemm_graph()
    out = GpuElemwise(SCALAR_OPS["mul"])(_gpu_scalar(scale, 2), g)
    fg = FunctionGraph(list(ins), [out], clone=False)
    new = _merged(local_gemm_alpha, fg)
    assert isinstance(new.op, GpuGemm) and new.inputs[2] is ins[1] and new.inputs[3] is ins[2]
    alpha, beta = (float(get_scalar_constant_value(new.inputs[i])) for i in (1, 4))
    assert (alpha, beta) == (scale, 0.0)     # 0 * alpha + scale * ... : alpha scaled, beta 0
    # a non-constant factor, or another op, is left alone
    other = GpuElemwise(SCALAR_OPS["mul"])(ins[0], g)
    fg2 = FunctionGraph(list(ins), [other], clone=False)
    assert not apply_node_rewriter(fg2, other.owner, local_gemm_alpha)


def test_output_merge_adds_into_gemm_when_beta_is_zero(vgpu):
    from symgpu.gpu.ops.blas import GpuGemm
    from symgpu.gpu.ops.elemwise import GpuElemwise
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.gpuarray.opt_util import output_merge
    from symgpu.scalar.basic import SCALAR_OPS
    from symgpu.tensor.grids import get_scalar_constant_value

    @output_merge(GpuGemm, alpha_in=1, beta_in=4, out_in=0)
    def local_gemm_output(node, *inputs):
        return [GpuGemm(node.op.inplace)(*inputs)]

    ins, g = _gemm_graph()
    w = GpuArrayType("float32", (False, False))("w")
    out = GpuElemwise(SCALAR_OPS["add"])(w, g)
    fg = FunctionGraph([*ins, w], [out], clone=False)
    new = _merged(local_gemm_output, fg)
    assert isinstance(new.op, GpuGemm) and new.inputs[0] is w
    assert float(get_scalar_constant_value(new.inputs[4])) == 1.0
    # a broadcast addend (a row) would need tiling: left alone
    row = GpuArrayType("float32", (True, False))("row")
    ins2, g2 = _gemm_graph()
    out2 = GpuElemwise(SCALAR_OPS["add"])(row, g2)
    fg2 = FunctionGraph([*ins2, row], [out2], clone=False)
    assert not apply_node_rewriter(fg2, out2.owner, local_gemm_output)


def test_inplace_allocempty_gives_the_op_its_own_buffer(vgpu):
    from symgpu.gpu.ops.blas import GpuAllocEmpty, GpuGemm
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.gpuarray.opt_util import inplace_allocempty

    @inplace_allocempty(GpuGemm, 0)
    def local_inplace_gemm(node, inputs):
        return [GpuGemm(inplace=True)(*inputs)]

    assert "inplace" in local_inplace_gemm.tags
    x, y = (GpuArrayType("float32", (False, False))(n) for n in "xy")
    buf = GpuAllocEmpty("float32")(T.constant(np.int64(3)), T.constant(np.int64(4)))
    one, zero = (T.constant(np.float32(v)) for v in (1, 0))
    g = GpuGemm()(buf, one, x, y, zero)
    fg = FunctionGraph([x, y], [g, buf], clone=False)    # buf also read elsewhere
    new = _merged(local_inplace_gemm, fg)
    assert new.op == GpuGemm(inplace=True)
    fresh = new.inputs[0]
    assert isinstance(fresh.owner.op, GpuAllocEmpty) and fresh is not buf
    assert not apply_node_rewriter(fg, new, local_inplace_gemm)        # already in place


@pytest.mark.parametrize("shape, left, right, padded", [
    ((3, 5, 7), 2, 2, (1, 3, 5, 7)), ((3, 5, 7, 9), 2, 2, (3, 5, 7, 9)),
    ((3, 5, 7, 9, 11), 2, 2, (15, 7, 9, 11)), ((3, 5, 7, 9), 2, 3, (1, 3, 5, 7, 9))])
def test_pad_dims_and_unpad_dims_on_the_virtual_gpu(vgpu, shape, left, right, padded):
    """The shapes of Theano's docstring, computed by the shape machinery of the placed graph."""
    from symgpu.gpu.placement.basic_ops import GpuReshape
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.gpuarray.opt_util import pad_dims, unpad_dims
    x = GpuArrayType("float32", (False,) * len(shape))("x")
    p = pad_dims(x, left, right)
    assert p.ndim == left + right
    if padded != shape:
        assert isinstance(p.owner.op, GpuReshape)
    f = symgpu.function([], [v for v in (p.shape, unpad_dims(p, x, left, right).shape)],
                        givens={x: _zeros_like_gpu(shape)})
    got_p, got_back = f()
    assert tuple(got_p) == padded and tuple(got_back) == shape


def _zeros_like_gpu(shape):
    """A GPU variable of `shape` known from the host (the shapes are computed without running
    a kernel: the vgpu context cannot run one)."""
    from symgpu.gpu.ops.blas import GpuAllocEmpty
    return GpuAllocEmpty("float32")(*(T.constant(np.int64(s)) for s in shape))


def test_pad_dims_needs_the_right_dims():
    from symgpu.gpuarray.opt_util import pad_dims
    with pytest.raises(ValueError, match="rightdims"):
        pad_dims(T.vector(), 2, 2)


# ----------------------------------------------------------------------------- kernel text

def test_nvcc_kernel_writes_one_kernel_with_flattened_statements():
    from symgpu.gpuarray.kernel_codegen import nvcc_kernel
    src = nvcc_kernel("kscale", ["float *x", "int n"],
                      ["int i = blockIdx.x * blockDim.x + threadIdx.x",
                       ["if (i < n) x[i] *= 2", "if (i == 0) x[0] += 0"]])
    assert 'extern "C" __global__ void kscale(float *x, int n)' in src
    assert "if (i < n) x[i] *= 2;\n" in src and src.rstrip().endswith("x[0] += 0;\n}")
    assert "sg_load" in src          # the common helpers come first, as in every module


def test_code_version_tags_a_function_and_wants_a_tuple():
    from symgpu.gpuarray.kernel_codegen import code_version

    @code_version((3, 1))
    def render():
        return "..."
    assert render.code_version == (3, 1) and render() == "..."
    with pytest.raises(TypeError, match="tuple"):
        code_version([3])


def test_fp16_help_names_the_work_dtype_and_conversions():
    from symgpu.gpuarray.fp16_help import load_w, work_dtype, write_w
    assert [work_dtype(d) for d in ("float16", "bfloat16", "float32", "int8")] == \
        ["float32", "float32", "float32", "int8"]
    assert (load_w("float16"), write_w("float16")) == ("__half2float", "__float2half_rn")
    assert (load_w("float64"), write_w("float64")) == ("", "")
    assert "%s(ival)" % load_w("float32") == "(ival)"


def _half_kernel(dtype):
    """A kernel (built with the helpers) that doubles an array of `dtype` in its work dtype."""
    from symgpu.gpu.runtime.codegen.types import storage_ctype, value_ctype
    from symgpu.gpuarray.fp16_help import load_w, work_dtype, write_w
    from symgpu.gpuarray.kernel_codegen import nvcc_kernel
    st, wt = storage_ctype(dtype), value_ctype(dtype)
    assert (work_dtype(dtype) == "float32") == (wt == "float")
    return nvcc_kernel(f"dbl_{dtype}", [f"{st} *x", "long long n"], [
        "long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x",
        "if (i >= n) return",
        f"{wt} v = {load_w(dtype)}(x[i])",
        f"x[i] = {write_w(dtype)}(v * 2)"])


@requires_nvcc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_kernel_helpers_compile_for_sm90(tmp_path, dtype):
    assert compile_for_sm90(_half_kernel(dtype), tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_kernel_helpers_run_on_the_gpu(cuda, dtype):
    from symgpu.gpu.runtime.array import GpuArray, to_gpu
    from symgpu.gpu.runtime.compiler import get_prepared_kernel
    host = np.arange(1000, dtype=dtype) / 8
    a = to_gpu(host, cuda)
    assert isinstance(a, GpuArray)
    fn = get_prepared_kernel(("test_names_gpu", dtype), lambda: _half_kernel(dtype),
                             f"dbl_{dtype}", "Pq", context=cuda)
    cuda.activate()
    fn.prepared_async_call((4, 1), (256, 1, 1), cuda.stream, a.ptr, host.size)
    np.testing.assert_array_equal(a.get(), host * 2)


# ----------------------------------------------------------------------------- type

def test_gpu_supported_says_which_dtypes_live_on_the_gpu():
    from symgpu.gpuarray.type import gpu_supported
    assert gpu_supported(np.zeros(2, "float32")) and gpu_supported(T.bmatrix())
    assert gpu_supported(np.zeros(2, "float16")) and gpu_supported(np.int64(3))
    assert not gpu_supported(np.zeros(2, "complex64"))
    assert not gpu_supported(T.zmatrix()) and not gpu_supported(np.array(["a"]))


# ----------------------------------------------------------------------------- elemwise

@pytest.mark.parametrize("name, fn", [("GpuErfinv", "erfinv"), ("GpuErfcinv", "erfcinv")])
def test_gpu_erfinv_names_the_scalar_op_of_the_lifted_kernel(vgpu, name, fn):
    import symgpu.gpuarray.elemwise as E
    from symgpu.gpu.ops.elemwise import GpuElemwise
    from symgpu.scalar.basic import SCALAR_OPS
    alias = getattr(E, name)
    x = T.fvector("x")
    f = symgpu.function([x], getattr(T, fn)(x))
    kernels = [op for op in _ops(f) if isinstance(op, GpuElemwise)]
    assert len(kernels) == 1 and isinstance(kernels[0].scalar_op, alias)
    assert alias(None, name=f"gpu_{fn}") is SCALAR_OPS[fn]
    assert not isinstance(SCALAR_OPS["erf"], alias)
    # the op builds kernels on the GPU: its CUDA row is the table's
    assert f"{fn}" in SCALAR_OPS[fn].spec.cuda


@pytest.mark.gpu
def test_gpu_erfinv_on_the_gpu_matches_scipy(cuda):
    import scipy.special
    from symgpu.gpu.ops.elemwise import GpuElemwise
    from symgpu.gpuarray.elemwise import GpuErfcinv, GpuErfinv
    from symgpu.scalar.composite import Composite
    x = T.fvector("x")
    f = symgpu.function([x], [T.erfinv(x), T.erfcinv(x + 1)])
    # fusion puts both into one kernel: look through a Composite at its steps
    on_gpu = []
    for op in _ops(f):
        if isinstance(op, GpuElemwise):
            s = op.scalar_op
            on_gpu += [o for o, _ in s.steps] if isinstance(s, Composite) else [s]
    assert any(isinstance(s, GpuErfinv) for s in on_gpu), on_gpu
    assert any(isinstance(s, GpuErfcinv) for s in on_gpu), on_gpu
    v = np.linspace(-0.99, 0.99, 101).astype("float32")
    a, b = f(v)
    np.testing.assert_allclose(a, scipy.special.erfinv(v), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(b, scipy.special.erfcinv(v + 1), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- dnn.version

def test_dnn_version_reports_the_loaded_cudnn_or_says_why_not(monkeypatch):
    from symgpu.gpu.ops import cudnn as C
    from symgpu.gpuarray.dnn import version

    class Loaded:
        version = 90100
    monkeypatch.setattr(C, "cudnn", lambda: Loaded())
    assert version() == 90100 and version(raises=False) == 90100

    def missing():
        raise C.CudnnError("libcudnn.so.9 not found")
    monkeypatch.setattr(C, "cudnn", missing)
    assert version(raises=False) == -1
    with pytest.raises(RuntimeError, match="libcudnn.so.9 not found"):
        version()


@pytest.mark.gpu
def test_dnn_version_on_the_gpu_machine(cuda):
    from symgpu.gpu.ops.cudnn import cudnn_available
    from symgpu.gpuarray.dnn import version
    assert cudnn_available(), "the GPU machine has cuDNN 9"
    assert version() >= 90000


# ----------------------------------------------------------------------------- blas: GpuCorrMM

def test_gpu_corr_mm_are_our_convolutions_without_the_flip(vgpu):
    import symgpu.gpuarray.blas as B
    from symgpu.gpu.ops import conv as C
    op = B.GpuCorrMM(border_mode="half", subsample=(2, 1))
    assert isinstance(op, C.GpuConv2d) and not op.filter_flip and op.subsample == (2, 1)
    assert isinstance(op, B.GpuCorrMM) and isinstance(op, B.BaseGpuCorrMM)
    assert not isinstance(op, B.GpuCorr3dMM) and not isinstance(op, B.BaseGpuCorr3dMM)
    assert not isinstance(C.GpuConv2d(filter_flip=True), B.GpuCorrMM)   # a convolution
    gw = B.GpuCorrMM_gradWeights(filter_dilation=(2, 2))
    assert isinstance(gw, C.GpuConv2dGradWeights) and isinstance(gw, B.BaseGpuCorrMM)
    assert not isinstance(gw, B.GpuCorrMM_gradInputs)
    gi3 = B.GpuCorr3dMM_gradInputs(num_groups=2)
    assert isinstance(gi3, C.GpuConv3dGradInputs) and isinstance(gi3, B.BaseGpuCorr3dMM)
    assert isinstance(B.GpuCorr3dMM(), B.GpuCorr3dMM) and \
        isinstance(B.GpuCorr3dMM_gradWeights(), C.GpuConv3dGradWeights)
    with pytest.raises(ValueError, match="unshared"):
        B.GpuCorrMM(unshared=True)
    with pytest.raises(TypeError, match="base class"):
        B.BaseGpuCorrMM()
    # a correlation the user writes is lifted to the op Theano's class names
    x, w = T.ftensor4("x"), T.ftensor4("w")
    f = symgpu.function([x, w], T.nnet.conv2d(x, w, filter_flip=False))
    assert any(isinstance(o, B.GpuCorrMM) for o in _ops(f))
    # applied to GPU variables it makes a GPU node of the correlation's shape
    from symgpu.gpu.placement.type import GpuArrayType
    gx, gk = (GpuArrayType("float32", (False,) * 4)(n) for n in "xk")
    out = op(gx, gk)
    assert isinstance(out.owner.op, B.GpuCorrMM) and out.ndim == 4


def _np_corr2d(x, w, pad=0, stride=1):
    """Valid 2-d cross-correlation (NCHW, OIHW) by loops over the filter taps."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, o, oh, ow), dtype=np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


@pytest.mark.gpu
def test_gpu_corr_mm_and_its_gradients_on_the_gpu(cuda):
    import symgpu.gpuarray.blas as B
    from symgpu.gpu.placement.basic_ops import gpu_from_host, host_from_gpu
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((2, 3, 9, 8)).astype("float32")
    wv = rng.standard_normal((4, 3, 3, 2)).astype("float32")
    x, w = T.ftensor4("x"), T.ftensor4("w")
    gx, gw = gpu_from_host(x), gpu_from_host(w)
    y = B.GpuCorrMM(border_mode=1, subsample=(2, 2))(gx, gw)
    f = symgpu.function([x, w], host_from_gpu(y))
    assert any(isinstance(o, B.GpuCorrMM) for o in _ops(f))
    want = _np_corr2d(xv.astype("float64"), wv.astype("float64"), pad=1, stride=2)
    np.testing.assert_allclose(f(xv, wv), want, rtol=1e-3, atol=1e-3)
    # the gradients as Theano builds them (shape = the input's / the filters' spatial shape)
    gy = T.ftensor4("gy")
    gyv = rng.standard_normal(want.shape).astype("float32")
    dw = B.GpuCorrMM_gradWeights(border_mode=1, subsample=(2, 2))(gx, gpu_from_host(gy),
                                                                   (3, 2))
    dx = B.GpuCorrMM_gradInputs(border_mode=1, subsample=(2, 2))(gw, gpu_from_host(gy),
                                                                  (9, 8))
    g = symgpu.function([x, w, gy], [host_from_gpu(dw), host_from_gpu(dx)])
    conv = T.nnet.conv2d(x, w, border_mode=1, subsample=(2, 2), filter_flip=False)
    ref = symgpu.function([x, w, gy], T.grad((conv * gy).sum(), [w, x]))
    got_w, got_x = g(xv, wv, gyv)
    want_w, want_x = ref(xv, wv, gyv)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(got_x, want_x, rtol=1e-3, atol=1e-3)


# ----------------------------------------------------------------------------- basic_ops

def test_eye_and_split_are_lifted_to_gpu_eye_and_gpu_split(vgpu):
    from symgpu.gpuarray.basic_ops import GpuEye, GpuSplit
    x, n = T.fmatrix("x"), T.iscalar("n")
    f = symgpu.function([x, n], [T.eye(n, 4, 1, dtype="float32") * 2,
                                 *(p * 2 for p in T.split(x, [1, 2], 2, axis=1))])
    ops = _ops(f)
    assert GpuEye("float32") in ops
    assert any(isinstance(o, GpuSplit) and o.len_splits == 2 for o in ops)
    assert not any(type(o).__name__ in ("Eye", "Split") for o in ops)


def test_gpu_eye_tri_split_build_gpu_nodes_with_theanos_signatures(vgpu):
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.gpuarray.basic_ops import GpuEye, GpuSplit, GpuTri
    e = GpuEye(dtype="int32")(3, 5, -1)
    t = GpuTri()(4, 4, 0)          # dtype floatX (float32 here)
    assert e.type == GpuArrayType("int32", (False, False)) and t.dtype == "float32"
    assert GpuEye() == GpuEye("float32", None) and GpuTri("int64") != GpuEye("int64")
    with pytest.raises(TypeError, match="integer scalar"):
        GpuTri()(T.fscalar(), 3, 0)
    with pytest.raises(TypeError, match="complex64"):
        GpuEye("complex64")
    g = GpuArrayType("float32", (False, True, False))("g")
    parts = GpuSplit(3)(g, 0, T.lvector())
    # the host Split's output types (no dim known broadcastable: a piece may be empty)
    assert len(parts) == 3 and all(p.type == g.type.clone(broadcastable=(False,) * 3)
                                   for p in parts)
    assert GpuSplit(3).view_map == {0: [0], 1: [0], 2: [0]}
    with pytest.raises(TypeError, match="GPU variable"):
        GpuSplit(2)(T.fmatrix(), 0, T.lvector())


@requires_nvcc
def test_gpu_eye_and_tri_kernels_compile_for_sm90(tmp_path):
    from symgpu.gpu.ops.constructors import BAND_DTYPES, constructors_source
    src = constructors_source()
    assert all(f"eye_{d}" in src and f"tri_{d}" in src for d in BAND_DTYPES)
    assert compile_for_sm90(src, tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "bool"])
def test_gpu_eye_and_tri_on_the_gpu(cuda, dtype):
    from symgpu.gpu.placement.basic_ops import host_from_gpu
    from symgpu.gpu.runtime.array import GpuArray
    from symgpu.gpuarray.basic_ops import GpuEye, GpuTri
    n, m, k = T.lscalars("n", "m", "k")
    e, t = GpuEye(dtype)(n, m, k), GpuTri(dtype)(n, m, k)
    f = symgpu.function([n, m, k], [e, t])
    assert GpuEye(dtype) in _ops(f) and GpuTri(dtype) in _ops(f)
    for shape in [(3, 5, 0), (5, 3, -1), (4, 4, 2), (0, 3, 0), (70, 90, 5)]:
        got_e, got_t = f(*shape)
        assert isinstance(got_e, GpuArray)
        np.testing.assert_array_equal(got_e.get(), np.eye(*shape, dtype=dtype))
        np.testing.assert_array_equal(got_t.get(), np.tri(*shape, dtype=dtype))
    with pytest.raises(ValueError, match="negative"):
        symgpu.function([n, m, k], host_from_gpu(e))(-1, 2, 0)


@pytest.mark.gpu
def test_gpu_split_on_the_gpu_gives_views_and_gradients(cuda):
    from symgpu.gpuarray.basic_ops import GpuSplit
    x = T.fmatrix("x")
    sizes = T.lvector("sizes")
    parts = T.split(x, sizes, 3, axis=1)
    f = symgpu.function([x, sizes], [p * 1 for p in parts])
    assert any(isinstance(o, GpuSplit) for o in _ops(f))
    v = np.arange(24, dtype="float32").reshape(3, 8)
    for got, want in zip(f(v, np.array([2, 5, 1])), np.split(v, [2, 7], axis=1)):
        np.testing.assert_array_equal(np.asarray(got), want)
    with pytest.raises(ValueError, match="add up"):
        f(v, np.array([2, 2, 2]))
    cost = (parts[0].sum() * 2 + (parts[2] ** 2).sum())
    g = symgpu.function([x, sizes], T.grad(cost, x))
    want = np.zeros_like(v)
    want[:, :2] = 2
    want[:, 7:] = 2 * v[:, 7:]
    np.testing.assert_allclose(np.asarray(g(v, np.array([2, 5, 1]))), want)


# ----------------------------------------------------------------------------- subtensor

def test_check_and_convert_boolean_masks_as_theano():
    from symgpu.gpuarray.subtensor import check_and_convert_boolean_masks
    x = np.zeros((3, 4, 5))
    mask = np.array([[True, False, True, False]] * 3)
    out = check_and_convert_boolean_masks(x, [mask, slice(None)])
    assert len(out) == 3 and out[2] == slice(None)
    np.testing.assert_array_equal(x[tuple(out)], x[mask, :])
    out = check_and_convert_boolean_masks(x, [np.newaxis, 1, np.array([0, 2]),
                                              np.array([True] * 5)])
    assert out[0] is np.newaxis and out[1] == 1 and len(out) == 4
    np.testing.assert_array_equal(out[3], np.arange(5))
    with pytest.raises(IndexError, match="dimension 1; dimension is 4 but corresponding "
                                         "boolean dimension is 3"):
        check_and_convert_boolean_masks(x, [slice(None), np.ones(3, bool)])


def test_gpu_split_gradient_is_a_gpu_join(vgpu):
    from symgpu.gpu.ops.subtensor import GpuJoin
    from symgpu.gpu.placement.basic_ops import host_from_gpu
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.gpuarray.basic_ops import GpuSplit
    g = GpuArrayType("float32", (False, False))("g")
    a, _ = GpuSplit(2)(g, 1, T.constant(np.array([1, 2])))
    dg = T.grad(host_from_gpu(a).sum() * 2, g)     # the second piece has no gradient
    assert dg.type == g.type
    f = symgpu.function([g], dg)
    assert any(isinstance(o, GpuJoin) for o in _ops(f))


# ----------------------------------------------------------------------------- elemwise limit

def test_max_inputs_to_gpu_elemwise_bounds_the_fused_kernels(vgpu):
    from functools import reduce
    from symgpu.gpu.ops.elemwise import GpuElemwise, KERNEL_PARAM_BYTES
    from symgpu.gpuarray.elemwise import max_inputs_to_GpuElemwise
    xs = [T.fmatrix(f"x{i}") for i in range(70)]
    f = symgpu.function(xs, reduce(lambda a, b: a * 2 + b, xs))
    kernels = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, GpuElemwise)]
    assert len(kernels) >= 2           # 70 inputs do not fit one kernel
    cap = max_inputs_to_GpuElemwise(kernels[0])
    assert cap == max_inputs_to_GpuElemwise(kernels[0].outputs) == 64
    assert all(len(n.inputs) <= max_inputs_to_GpuElemwise(n) for n in kernels)
    assert max(len(n.inputs) for n in kernels) > 32           # and the fusion fills them
    # the parameter space bounds it where operands are many-dimensional
    wide = [T.TensorType("float32", (False,) * 300)()]
    assert max_inputs_to_GpuElemwise(wide) == (KERNEL_PARAM_BYTES - 2 * 2408) // 2408
