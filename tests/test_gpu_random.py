"""Philox on the GPU: placement on a virtual context (CPU), nvcc compilation of the kernels
(``nvcc``), and the same numbers as the CPU for the same seed on a real GPU (``gpu``)."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import (compile_for_sm90, fake_gpu_array, fake_kernel_device, requires_gpu,
                         requires_nvcc, thunk_over)
from symgpu import config, function
from symgpu.gpu.ops.random import (GPU_RANDOM_DTYPES, GpuPhiloxAdvance, GpuPhiloxSample,
                               random_source, sample_kernel_name)
from symgpu.gpu.ops.random_fusion import GpuPhiloxElemwise, render_philox_elemwise
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.tensor.random import PhiloxSample, RandomStreams, philox


def _ops(f):
    return [n.op for n in f.maker.fgraph.toposort()]


# ============================================================================ CPU

def test_sample_moves_to_the_gpu_on_a_virtual_context():
    srng = RandomStreams(seed=1)          # made before: a host state, uploaded per call
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.matrix("x")
        f = function([x], x * srng.uniform(x.shape, low=-1.0, high=1.0))
        ops = _ops(f)
        assert any(isinstance(op, (GpuPhiloxSample, GpuPhiloxElemwise)) and op.dist == "uniform"
                   for op in ops)
        assert not any(isinstance(op, PhiloxSample) for op in ops)
        g = function([], srng.normal((4, 4), dtype="float64"))
        assert any(isinstance(op, GpuPhiloxSample) and op.dtype == "float64" for op in _ops(g))


def _dropout_graph(srng):
    x, b = T.matrix("x"), T.vector("b")
    h = T.nnet.relu(x + b)
    out = h * srng.binomial(h.shape, p=0.5, dtype="float32") * 2
    return [x, b], [out, T.grad(T.sum(out * x), x)]


def test_dropout_mask_is_generated_inside_the_fused_kernel():
    srng = RandomStreams(seed=1)
    with config.change_flags(floatX="float32"), virtual_context(None):
        f = function(*_dropout_graph(srng))
        ops = _ops(f)
        fused = [op for op in ops if isinstance(op, GpuPhiloxElemwise)]
        assert len(fused) == 1 and fused[0].dist == "uniform", ops
        assert not any(isinstance(op, (GpuPhiloxSample, PhiloxSample)) for op in ops), ops
        # a draw that is also an output is materialised once; its other readers still fuse
        u = srng.uniform((3, 4))
        g = function([], [u, u * 2.0 + 1.0])
        assert any(isinstance(op, GpuPhiloxSample) for op in _ops(g))
        assert any(isinstance(op, GpuPhiloxElemwise) for op in _ops(g))


def test_fusion_can_be_turned_off():
    from symgpu.compile.mode import Mode
    srng = RandomStreams(seed=1)
    with config.change_flags(floatX="float32"), virtual_context(None):
        f = function(*_dropout_graph(srng), mode=Mode(excluding=("gpu_philox_fusion",)))
        assert not any(isinstance(op, GpuPhiloxElemwise) for op in _ops(f))
        assert any(isinstance(op, GpuPhiloxSample) for op in _ops(f))


def test_a_gpu_state_is_advanced_on_the_device():
    from symgpu.compile.sharedvalue import Container
    from symgpu.gpu.placement.basic_ops import HostFromGpu
    from symgpu.gpu.placement.type import GpuArraySharedVariable
    from symgpu.tensor.random import PhiloxAdvance
    def compiled(**flags):
        with config.change_flags(floatX="float32", **flags), virtual_context(None):
            t = GpuArrayType("uint32", (False,), None)
            st = GpuArraySharedVariable(t, None, name="st", container=Container(t, None, "st"))
            st.default_update = PhiloxAdvance("float32")(st, 3, 4)
            return function([], PhiloxSample("uniform", "float32")(st, 3, 4) * 2.0).maker.fgraph
    # unfused (gpu_philox_advance_fusion off): a GpuPhiloxAdvance of its own
    fg = compiled(optimizer_excluding="gpu_philox_advance_fusion")
    (adv,) = [n for n in fg.toposort() if isinstance(n.op, GpuPhiloxAdvance)]
    assert adv.inputs[0] is fg.inputs[0] and fg.update_mapping == {1: 0}
    assert fg.outputs[1] is adv.outputs[0]
    # the state never visits the host: nothing reads it through HostFromGpu
    assert not any(isinstance(c.op, HostFromGpu) for c, _ in fg.clients[fg.inputs[0]])
    # the default passes: the fused draw's kernel writes the next state (no GpuPhiloxAdvance)
    fg = compiled()
    assert not any(isinstance(n.op, GpuPhiloxAdvance) for n in fg.apply_nodes)
    (fused,) = [n for n in fg.toposort() if isinstance(n.op, GpuPhiloxElemwise)]
    assert fused.op.advance and fused.inputs[0] is fg.inputs[0] and fg.update_mapping == {1: 0}
    assert fg.outputs[1] is fused.outputs[1]
    assert not any(isinstance(c.op, HostFromGpu) for c, _ in fg.clients[fg.inputs[0]])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_draws_are_made_on_the_gpu(dtype):
    """float16/bfloat16 draws have kernels of their own (float32 numbers rounded on the
    store, as the CPU's draw casts them): nothing of the draw stays on the host."""
    srng = RandomStreams(seed=1)
    with config.change_flags(floatX="float32"), virtual_context(None):
        f = function([], srng.normal((4,), dtype=dtype))
        ops = _ops(f)
        assert not any(isinstance(op, PhiloxSample) for op in ops)
        assert any(isinstance(op, GpuPhiloxSample) and op.dtype == dtype for op in ops)


def test_ops_types_and_errors():
    st = GpuArrayType("uint32", (False,), None)()
    n = T.lscalar("n")
    out = GpuPhiloxSample("normal", "float32")(st, n, 3)
    assert out.type == GpuArrayType("float32", (False, False), None)
    assert out.owner.op.grad(out.owner.inputs, [None]) == [None, None, None]
    assert GpuPhiloxAdvance("float32")(st, n).type == st.type
    with pytest.raises(ValueError, match="no kernel"):
        GpuPhiloxSample("normal", "int32")
    with pytest.raises(TypeError, match="uint32 vector"):
        GpuPhiloxSample("uniform", "float32")(GpuArrayType("int32", (False,), None)(), n)
    ((key, factory, options),) = out.owner.op.prefetch_sources(out.owner)
    assert factory is random_source and options == ()


def test_thunks_launch_with_the_state_pointer_and_the_size(monkeypatch):
    calls = []
    ctx = fake_kernel_device(monkeypatch, calls)
    st = GpuArrayType("uint32", (False,), None)()
    n = T.lscalar("n")
    out = GpuPhiloxSample("normal", "float32")(st, n, 3)
    state = fake_gpu_array(ctx, (4,), "uint32")
    thunk, storage = thunk_over(out.owner, [state, np.int64(11), np.int64(3)])
    assert thunk.capturable and thunk.launches
    thunk()
    (name, grid, block, args), = calls
    assert name == "sg_philox_normal_float32" and block == (256, 1, 1)
    assert args[0] == state.ptr and args[2] == 33
    res = storage[out][0]
    assert res.shape == (11, 3) and res.dtype == np.float32 and args[1] == res.ptr
    adv = GpuPhiloxAdvance("float64")(st, n).owner
    thunk, storage = thunk_over(adv, [state, np.int64(5)])
    thunk()
    name, grid, block, args = calls[-1]
    assert name == "sg_philox_advance" and args[0] == state.ptr and args[2] == 3
    assert storage[adv.outputs[0]][0].shape == (4,) and args[1] == storage[adv.outputs[0]][0].ptr
    with pytest.raises(ValueError, match="4 contiguous uint32"):
        thunk_over(adv, [fake_gpu_array(ctx, (3,), "uint32"), np.int64(5)])[0]()


def test_fused_thunk_launches_contiguous_and_strided(monkeypatch):
    from symgpu.scalar.basic import SCALAR_OPS
    calls = []
    ctx = fake_kernel_device(monkeypatch, calls)
    st = GpuArrayType("uint32", (False,), None)()
    x = GpuArrayType("float32", (False, False), None)()
    n0, n1 = T.lscalar("n0"), T.lscalar("n1")
    out = GpuPhiloxElemwise(SCALAR_OPS["mul"], 1, "normal", "float32", 2)(st, n0, n1, x)
    node = out.owner
    state = fake_gpu_array(ctx, (4,), "uint32")
    xv = fake_gpu_array(ctx, (5, 7))
    thunk, storage = thunk_over(node, [state, np.int64(5), np.int64(7), xv])
    assert thunk.capturable
    thunk()
    name, grid, block, args = calls[-1]
    res = storage[out][0]
    assert name == "sg_philox_ew_contig" and args == (state.ptr, 35, xv.ptr, res.ptr)
    assert res.shape == (5, 7) and res.dtype == np.float32
    xt = fake_gpu_array(ctx, (5, 7), strides=(4, 20))            # a transposed view
    thunk, storage = thunk_over(node, [state, np.int64(5), np.int64(7), xt])
    thunk()
    name, grid, block, args = calls[-1]
    assert name == "sg_philox_ew_strided"
    assert args[:6] == (state.ptr, 35, 5, 7, 1, 5) and args[6] == xt.ptr


def test_fused_thunk_falls_back_when_the_draw_is_broadcast_at_run_time(monkeypatch):
    from symgpu.scalar.basic import SCALAR_OPS
    calls = []
    ctx = fake_kernel_device(monkeypatch, calls)
    st = GpuArrayType("uint32", (False,), None)()
    x = GpuArrayType("float32", (False, False), None)()
    n0, n1 = T.lscalar("n0"), T.lscalar("n1")
    out = GpuPhiloxElemwise(SCALAR_OPS["add"], 0, "uniform", "float32", 2)(st, n0, n1, x)
    state = fake_gpu_array(ctx, (4,), "uint32")
    thunk, storage = thunk_over(out.owner, [state, np.int64(1), np.int64(7),
                                            fake_gpu_array(ctx, (5, 7))])
    thunk()
    names = [c[0] for c in calls]
    # the draws, then the elementwise kernel over them as a row vector (strides (0, 1)): the
    # row/column kernel, a scalar at a time (C = 7)
    assert names[0] == "sg_philox_uniform_float32" and names[1] == "sg_rowcol_32", names
    assert calls[-2][3][2] == 7                     # 7 numbers drawn, broadcast to (5, 7)
    assert storage[out][0].shape == (5, 7)


@requires_nvcc
def test_fused_kernels_compile(tmp_path):
    srng = RandomStreams(seed=1)
    with config.change_flags(floatX="float32"), virtual_context(None):
        f = function(*_dropout_graph(srng))
    (node,) = [n for n in f.maker.fgraph.toposort() if isinstance(n.op, GpuPhiloxElemwise)]
    source = node.op._source(node)()
    cubin = compile_for_sm90(source, tmp_path)
    assert b"sg_philox_ew_contig" in cubin and b"sg_philox_ew_strided" in cubin
    from symgpu.scalar.basic import SCALAR_OPS
    src64 = render_philox_elemwise(SCALAR_OPS["add"], ["float64", "float64"], [True, False],
                                   1, "normal", 3)
    assert b"sg_philox_ew_strided" in compile_for_sm90(src64, tmp_path / "b")


def test_contiguous_fused_kernel_moves_whole_blocks_when_aligned():
    from symgpu.scalar.basic import SCALAR_OPS
    src = render_philox_elemwise(SCALAR_OPS["mul"], ["float32", "float32"], [False, False], 1,
                                 "uniform", 2)
    contig = src[src.index("sg_philox_ew_contig"):src.index("sg_philox_ew_strided")]
    strided = src[src.index("sg_philox_ew_strided"):]
    assert "sg_rp_aligned<4>(in0) && sg_rp_aligned<4>(out0)" in contig
    assert "reinterpret_cast<const sg_rpack<float, 4> *>(in0 + i0)" in contig
    # strided: offsets once per Philox block, a block along the last dimension moved whole
    assert "xl + 4 <= d1" in strided and "const long long x = rem; o0 += x * s0_0;" in strided
    assert strided.count("sg_rdiv(rem, d1)") == 2 and "sg_rdiv(rem, d0)" not in strided
    assert " / d" not in strided                      # no 64-bit division of its own
    assert "if (s0_1 == 1 && sg_rp_aligned<4>(in0 + o0))" in strided
    assert "*reinterpret_cast<sg_rpack<float, 4> *>(out0 + i0) = q0;" in strided
    src64 = render_philox_elemwise(SCALAR_OPS["add"], ["float64", "float32"], [False, False], 0,
                                   "normal", 1)
    assert "sg_rpack<float, 2>" in src64 and "sg_rpack<double, 2> q0" in src64


@requires_nvcc
def test_kernels_compile(tmp_path):
    cubin = compile_for_sm90(random_source(), tmp_path)
    for dist in ("uniform", "normal"):
        for dtype in GPU_RANDOM_DTYPES:
            assert sample_kernel_name(dist, dtype).encode() in cubin
    assert b"sg_philox_advance" in cubin


# ============================================================================ GPU

def _reference(seed, stream, dist, dtype, shape, call):
    """What stream `stream` of RandomStreams(seed) draws at call `call` (NumPy Philox)."""
    state = RandomStreams(seed=seed)._initial_state(stream)
    state = philox.advance(state, call * philox.blocks(int(np.prod(shape)), dtype))
    return philox.sample(state, dist, dtype, shape)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cuda_graphs", [False, True])
@pytest.mark.parametrize("fold_advance", [True, False])
def test_same_numbers_as_the_cpu(cuda, dtype, cuda_graphs, fold_advance):
    def make(s):
        return [s.uniform((1001, 3), dtype=dtype), s.normal((7, 333), dtype=dtype),
                s.uniform((5,), low=2.0, high=4.0, dtype=dtype)]
    flags = {} if fold_advance else {"optimizer_excluding": "gpu_philox_advance_fusion"}
    with config.change_flags(**{"gpuarray.cuda_graphs": cuda_graphs}, **flags):
        srng = RandomStreams(seed=5)
        f = function([], make(srng))
        ops = _ops(f)
        assert sum(isinstance(op, (GpuPhiloxSample, GpuPhiloxElemwise)) for op in ops) == 3
        # by default (gpu_philox_advance_fusion) the fused third draw writes its next state
        folded = sum(isinstance(op, GpuPhiloxElemwise) and op.advance for op in ops)
        assert folded == (1 if fold_advance else 0)
        assert sum(isinstance(op, GpuPhiloxAdvance) for op in ops) == 3 - folded
        assert isinstance(srng.state_updates[0][0].type, GpuArrayType)
        for call in range(4):
            u, z, v = f()
            want_u = _reference(5, 0, "uniform", dtype, (1001, 3), call)
            want_z = _reference(5, 1, "normal", dtype, (7, 333), call)
            want_v = 2 + 2 * _reference(5, 2, "uniform", dtype, (5,), call)
            assert u.dtype == dtype and z.dtype == dtype
            np.testing.assert_array_equal(u, want_u)          # bitwise
            tol = 2e-5 if dtype == "float32" else 1e-12
            np.testing.assert_allclose(z, want_z, rtol=tol, atol=tol)
            np.testing.assert_allclose(v, want_v, rtol=1e-6 if dtype == "float32" else 1e-15)
        st = np.asarray(srng.state_updates[0][0].get_value())
        assert st.dtype == np.uint32 and int(st[2]) == 4 * -(-3003 // (4 if dtype == "float32" else 2))
        st = np.asarray(srng.state_updates[2][0].get_value())      # the folded one's, too
        assert int(st[2]) == 4 * -(-5 // (4 if dtype == "float32" else 2))


@requires_gpu
def test_dropout_on_the_gpu_matches_the_cpu(cuda):
    x = np.random.default_rng(0).standard_normal((64, 100)).astype("float32")

    def make(s):
        xv = T.constant(x)
        return xv * T.cast(s.binomial((64, 100), p=0.5, dtype="int8"), "float32") * 2.0
    srng = RandomStreams(seed=9)
    f = function([], make(srng))
    assert any(isinstance(op, GpuPhiloxElemwise) for op in _ops(f))     # generated in-kernel
    for call in range(3):
        keep = _reference(9, 0, "uniform", "float32", (64, 100), call) < 0.5
        np.testing.assert_array_equal(f(), x * keep.astype("float32") * 2.0)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_kernel_on_strided_and_broadcast_inputs(cuda, dtype):
    rng = np.random.default_rng(3)
    xv = rng.standard_normal((30, 20)).astype(dtype)
    bv = rng.standard_normal(30).astype(dtype)
    x, b = T.matrix("x", dtype=dtype), T.vector("b", dtype=dtype)
    srng = RandomStreams(seed=4)
    out = x.T * srng.normal((20, 30), dtype=dtype) + b
    f = function([x, b], out)
    assert any(isinstance(op, GpuPhiloxElemwise) for op in _ops(f)), _ops(f)
    tol = 1e-5 if dtype == "float32" else 1e-12
    for call in range(3):
        want = xv.T * _reference(4, 0, "normal", dtype, (20, 30), call) + bv
        got = f(xv, bv)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,transposed", [((64, 1024), False), ((33, 1001), False),
                                              ((40, 24), True), ((3, 2, 7), False)])
def test_fused_dropout_equals_the_unfused_kernels_bitwise(cuda, dtype, shape, transposed):
    """relu(x + b) * mask * 2 (the dropout MLP's fused kernel: a row-broadcast bias, three
    outputs; float32 draws of 4 elements per Philox block, float64 of 2) on rows of whole
    blocks, rows that blocks run across (1001, 7), a transposed x: the same bits as the
    draw kernel plus the plain elementwise kernel, and as NumPy."""
    from symgpu.compile.mode import Mode
    rng = np.random.default_rng(8)
    xv = rng.standard_normal(shape[::-1] if transposed else shape).astype(dtype)
    bv = rng.standard_normal(shape[-1]).astype(dtype)
    x = T.TensorType(dtype, (False,) * len(shape))("x")
    b = T.vector("b", dtype=dtype)
    xin = x.T if transposed else x

    def make(mode=None):
        srng = RandomStreams(seed=12)
        h = T.nnet.relu(xin + b)
        with config.change_flags(floatX=dtype):   # the uniforms binomial compares with p
            keep = srng.binomial(h.shape, p=0.5, dtype=dtype)
        out = h * keep * np.asarray(2.0, dtype=dtype)
        return function([x, b], [out, T.grad(T.sum(out * out), x)], mode=mode)
    fused = make()
    assert [op.dtype for op in _ops(fused) if isinstance(op, GpuPhiloxElemwise)] == [dtype]
    plain = make(Mode(excluding=("gpu_philox_fusion",)))
    assert not any(isinstance(op, GpuPhiloxElemwise) for op in _ops(plain))
    for call in range(3):
        got, want = fused(xv, bv), plain(xv, bv)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        keep = _reference(12, 0, "uniform", dtype, shape, call) < 0.5
        h = np.maximum((xv.T if transposed else xv) + bv, 0)
        np.testing.assert_array_equal(got[0], h * keep.astype(dtype) * np.asarray(2, dtype))


@requires_gpu
def test_dropout_mlp_step_replays_one_graph_per_call(cuda):
    """examples/mlp_dropout.py's training step on the device: one capture, then one replay
    per call, the masks drawn in the kernels and the generator states moved on every call."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "examples", "mlp_dropout.py")
    spec = importlib.util.spec_from_file_location("mlp_dropout_example", path)
    mlp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mlp)
    train, _, _ = mlp.build(64, on_device=True)
    assert sum(isinstance(op, GpuPhiloxElemwise) for op in _ops(train)) == 2, _ops(train)
    states = [v for v in train.maker.fgraph.inputs if v.name and v.name.startswith("philox")]
    assert len(states) == 2 and all(isinstance(s.type, GpuArrayType) for s in states)
    losses = [float(np.asarray(train().get())) for _ in range(6)]
    assert all(np.isfinite(losses)) and len(set(losses)) == 6, losses   # fresh masks
    st = train.vm.runner.stats()
    assert st["segments"] == 1 and st["plain"] == 1 and st["captures"] == 1, st
    assert st["replays"] == 4, st
    per_call = philox.blocks(64 * 1024, "float32")
    for s in states:
        assert int(np.asarray(s.get_value())[2]) == 6 * per_call


@requires_gpu
def test_fused_kernel_on_an_unaligned_view_and_an_odd_length(cuda):
    """x[1:] starts 4 bytes into x's buffer: the contiguous kernel's per-element path (the
    whole-block vector accesses need 16-byte alignment); 13 elements end in a part block."""
    xv = np.arange(14, dtype="float32")
    x = T.vector("x")
    y = x[1:]
    srng = RandomStreams(seed=6)
    f = function([x], y * srng.uniform(y.shape))
    assert any(isinstance(op, GpuPhiloxElemwise) for op in _ops(f)), _ops(f)
    for call in range(4):       # plain calls read the view, a replayed graph its own copy
        want = xv[1:] * _reference(6, 0, "uniform", "float32", (13,), call)
        np.testing.assert_array_equal(f(xv), want)
