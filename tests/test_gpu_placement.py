"""Placement: GpuArrayType, transfer ops, transfer(), the graph-to-GPU pass, transfer
cancelling, assert_no_cpu_op and GPU shared variables.

CPU tests compile for a *virtual* GPU context (no device) and inspect the rewritten graphs;
they never call a function that would touch device memory. Tests marked ``gpu`` run on the
GPU machine and check values against NumPy and that shared variables stay on the device.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from gpu_helpers import requires_gpu
from symgpu import Out, config, function, shared
from symgpu.graph.basic import Apply, Constant
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.gpu.runtime import context as gctx
from symgpu.gpu.placement.basic_ops import (GpuAlloc, GpuContiguous, GpuDimShuffle, GpuFromHost,
                                  GpuReshape, GpuShape, GpuShape_i, GpuToGpu, HostFromGpu,
                                  TRANSFER_COUNTS, as_gpuarray_variable, gpu_contiguous,
                                  gpu_from_host, host_from_gpu, reset_transfer_counts)
from symgpu.gpu.placement.rewriting import (CpuOpError, CpuOpWarning, cut_gpu_transfers, lifters_for,
                                  local_cut_gpu_transfers, register_lifter, unregister_lifter,
                                  virtual_context)
from symgpu.gpu.placement.type import (GpuArraySharedVariable, GpuArrayType, GpuArrayVariable, is_gpu_var)
from symgpu.printing import debugprint
from symgpu.tensor.sharedvar import TensorSharedVariable
from symgpu.tensor.transfer import TransferError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dprint(obj) -> list[str]:
    buf = io.StringIO()
    debugprint(obj, file=buf)
    return buf.getvalue().splitlines()


def op_names(f) -> list[str]:
    return [type(n.op).__name__ for n in f.maker.fgraph.toposort()]


@pytest.fixture
def f32():
    with config.change_flags(floatX="float32"):
        yield


@pytest.fixture
def vgpu(f32):
    """A virtual default GPU context: graphs compile for the GPU but cannot run."""
    with virtual_context(None) as ctx:
        yield ctx


class GpuTestElemwise(Op):
    """Stand-in GPU elementwise op, used only where no real Elemwise lifter is registered."""

    __props__ = ("scalar_op",)

    def __init__(self, scalar_op):
        self.scalar_op = scalar_op

    def make_node(self, *inputs):
        ctx = inputs[0].type.context_name
        inputs = [as_gpuarray_variable(i, ctx) for i in inputs]
        bcast = tuple(all(i.broadcastable[d] for i in inputs) for d in range(inputs[0].ndim))
        return Apply(self, inputs, [inputs[0].type.clone(broadcastable=bcast)()])


@pytest.fixture
def elemwise_lifter():
    """The real Elemwise lifter if the kernels registered one, else a test-local one."""
    if lifters_for(T.exp(T.vector()).owner.op):
        yield None
        return

    @register_lifter(T.Elemwise)
    def lift(op, node, ctx, inputs):
        if any(i.ndim != node.outputs[0].ndim for i in inputs):
            return None
        return [GpuTestElemwise(op.scalar_op)(*inputs)]

    yield lift
    unregister_lifter(lift)


class HostOnly(Op):
    """A float op with no GPU implementation."""

    __props__ = ()

    def make_node(self, x):
        x = T.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        out[0][0] = inputs[0] + 1


# ============================================================================ types

def test_gpuarray_type_identity_and_str():
    t = GpuArrayType("float32", (False, False), "dev1")
    assert str(t) == "GpuArrayType<dev1>(float32, (False, False))"
    assert t == GpuArrayType("float32", (False, False), "dev1")
    assert hash(t) == hash(GpuArrayType("float32", (False, False), "dev1"))
    assert t != GpuArrayType("float32", (False, False), None)
    assert t != GpuArrayType("float64", (False, False), "dev1")
    assert t != T.fmatrix().type
    assert t.tensor_type() == T.fmatrix().type
    assert t.clone(broadcastable=(True, False)).context_name == "dev1"
    v = t("w")
    assert isinstance(v, GpuArrayVariable) and (v.dtype, v.ndim) == ("float32", 2)
    assert str(GpuArrayType("float32", (False,))()) == "<GpuArrayType<None>(float32, (False,))>"
    with pytest.raises(TypeError, match="complex"):
        GpuArrayType("complex64", ())


def test_convert_variable_inserts_transfers(f32):
    t = GpuArrayType("float32", (False, False), "dev0")
    a = T.fmatrix()
    up = t.convert_variable(a)
    assert up.type == t and isinstance(up.owner.op, GpuFromHost)
    other = GpuArrayType("float32", (False, False), "dev1")()
    moved = t.convert_variable(other)
    assert moved.type == t and isinstance(moved.owner.op, GpuToGpu)
    assert t.convert_variable(T.dmatrix()) is None
    assert t.convert_variable(T.fvector()) is None
    row = GpuArrayType("float32", (True, False), "dev0")()
    assert t.convert_variable(row).type == t  # a known-1 dim may stand for any length
    # tensor functions accept GPU variables through their host form
    g = GpuArrayType("float32", (False,), None)("g")
    y = g * 2
    assert isinstance(y, T.TensorVariable)
    assert any(isinstance(n.owner.op, HostFromGpu) for n in y.owner.inputs if n.owner)
    assert isinstance(T.as_tensor_variable(g).owner.op, HostFromGpu)
    # a host tensor type accepts a GPU replacement through HostFromGpu
    assert T.fvector().type.convert_variable(g) is not None


def test_op_strings_and_classes():
    assert str(GpuFromHost(None)) == "GpuFromHost<None>"
    assert str(HostFromGpu()) == "HostFromGpu(gpuarray)"
    assert str(GpuToGpu("dev1")) == "GpuToGpu<dev1>"
    assert str(GpuDimShuffle((False, False), (1, 0))) == "GpuDimShuffle{1,0}"
    for cls in (GpuFromHost, GpuToGpu, GpuContiguous, GpuDimShuffle, GpuReshape, GpuShape,
                GpuShape_i, GpuAlloc):
        assert cls.__name__.startswith("Gpu")
        assert not issubclass(cls, (T.Elemwise, T.DimShuffle, T.Shape, T.Shape_i))
    assert GpuFromHost(None) == GpuFromHost(None) and GpuFromHost(None) != GpuFromHost("d")


# ============================================================================ transfer()

def test_seed_transfer_none_debugprint(vgpu):
    a = T.matrix()
    b = a.transfer(None)
    assert dprint(b) == ["GpuFromHost<None> [id A] ''", " |<TensorType(float32, matrix)> [id B]"]
    assert b.type == GpuArrayType("float32", (False, False), None)


def test_seed_transfer_cpu_is_the_variable_itself(f32):
    a = T.matrix()
    b = a.transfer("cpu")
    assert b is a
    assert dprint(b) == ["<TensorType(float32, matrix)> [id A]"]


def test_transfer_errors_are_clear(f32):
    a = T.matrix()
    with pytest.raises(TransferError, match="device flag is 'cpu'"):
        a.transfer(None)
    with pytest.raises(TransferError, match="no GPU context named 'nodev'"):
        a.transfer("nodev")
    with pytest.raises(TransferError, match="target"):
        a.transfer(3)


def test_transfer_between_places(vgpu):
    with virtual_context("dev1", device="cuda1"):
        a = T.matrix()
        g = a.transfer(None)
        assert g.transfer(None) is g
        h = g.transfer("dev1")
        assert isinstance(h.owner.op, GpuToGpu) and h.type.context_name == "dev1"
        back = h.transfer("cpu")
        assert isinstance(back.owner.op, HostFromGpu) and back.type == a.type
        assert as_gpuarray_variable(g.transfer("cpu"), None) is g
        assert host_from_gpu(a) is a
        assert isinstance(gpu_from_host(a).owner.op, GpuFromHost)
        c = gpu_contiguous(g)
        assert isinstance(c.owner.op, GpuContiguous) and gpu_contiguous(c) is c


# ============================================================================ the GPU pass

def test_seed_square_runs_on_gpu_with_transfers(vgpu, elemwise_lifter):
    a = T.matrix("a")
    sq = function([a], a ** 2)
    names = op_names(sq)
    assert names[0] == "GpuFromHost" and names[-1] == "HostFromGpu"
    assert not any(isinstance(n.op, T.Elemwise) for n in sq.maker.fgraph.toposort())
    lines = dprint(sq)
    assert lines[0] == f"HostFromGpu(gpuarray) [id A] ''   {len(names) - 1}"
    i = next(i for i, line in enumerate(lines) if line.strip().startswith("|GpuFromHost<None>"))
    assert lines[i + 1].strip().startswith("|a [id")


def test_seed_explicit_gpu_output_has_no_host_from_gpu(vgpu, elemwise_lifter):
    a = T.matrix("a")
    sq = function([a], (a ** 2).transfer(None))
    names = op_names(sq)
    assert "HostFromGpu" not in names and names[0] == "GpuFromHost"
    assert is_gpu_var(sq.maker.fgraph.outputs[0])
    f = function([a], a.transfer(None))
    assert dprint(f) == ["GpuFromHost<None> [id A] ''   0", " |a [id B]"]


def test_no_gpu_context_leaves_graph_on_cpu(f32):
    a = T.matrix("a")
    f = function([a], T.exp(a) * 2)
    assert not any(n.startswith("Gpu") or n == "HostFromGpu" for n in op_names(f))


def test_transfers_cancel(vgpu):
    a = T.matrix("a")
    f = function([a], a.transfer(None).transfer("cpu") * 2)
    assert op_names(f) == op_names(function([a], a * 2))
    g = GpuArrayType("float32", (False, False))("g")
    f2 = function([g], g.transfer("cpu").transfer(None))
    assert op_names(f2) == [] and f2.maker.fgraph.outputs[0] is f2.maker.fgraph.inputs[0]
    f3 = function([a], a.transfer(None).transfer("cpu"))
    assert op_names(f3) == []


def test_local_cut_rewrite_cases(vgpu):
    with virtual_context("dev1", device="cuda1"):
        a = T.matrix("a")
        g = GpuArrayType("float32", (False, False))("g")
        hg = HostFromGpu()(g)
        assert local_cut_gpu_transfers(None, GpuFromHost(None)(hg).owner) == [g]
        moved = local_cut_gpu_transfers(None, GpuFromHost("dev1")(hg).owner)[0]
        assert isinstance(moved.owner.op, GpuToGpu) and moved.owner.inputs[0] is g
        assert local_cut_gpu_transfers(None, HostFromGpu()(GpuFromHost(None)(a)).owner) == [a]
        assert local_cut_gpu_transfers(None, GpuToGpu(None)(g).owner) == [g]
        up = local_cut_gpu_transfers(None, GpuToGpu("dev1")(GpuFromHost(None)(a)).owner)[0]
        assert up.owner.op == GpuFromHost("dev1") and up.owner.inputs[0] is a
        assert local_cut_gpu_transfers(None, GpuFromHost(None)(a).owner) is None
        fg = FunctionGraph([a], [HostFromGpu()(GpuToGpu("dev1")(GpuFromHost(None)(a)))])
        cut_gpu_transfers(fg)
        assert fg.outputs[0] is fg.inputs[0]


def test_gpu_to_gpu_graph(vgpu):
    with virtual_context("dev1", device="cuda1"):
        a = T.matrix("a")
        f = function([a], a.transfer(None).transfer("dev1"))
        assert [str(n.op) for n in f.maker.fgraph.toposort()] == ["GpuFromHost<dev1>"]
        g = GpuArrayType("float32", (False, False))("g")
        f2 = function([g], g.transfer("dev1"))
        assert [str(n.op) for n in f2.maker.fgraph.toposort()] == ["GpuToGpu<dev1>"]


def test_cpu_op_stays_with_transfers_around(vgpu, elemwise_lifter):
    a = T.matrix("a")
    f = function([a], T.exp(HostOnly()(a)))
    nodes = f.maker.fgraph.toposort()
    names = [type(n.op).__name__ for n in nodes]
    assert names[0] == "HostOnly" and nodes[0].inputs[0] is f.maker.fgraph.inputs[0]
    assert names[1] == "GpuFromHost" and names[-1] == "HostFromGpu"
    g = GpuArrayType("float32", (False, False))("g")
    f2 = function([g], HostOnly()(g))  # a GPU input feeding a host-only op comes back first
    assert op_names(f2) == ["HostFromGpu", "HostOnly"]


def test_gpu_inputs_lift_without_a_default_context(f32, elemwise_lifter):
    with virtual_context("dev0"):
        g = GpuArrayType("float32", (False,), "dev0")("g")
        x = T.fvector("x")
        f = function([g, x], T.exp(g) + x)
        names = op_names(f)
        assert names[-1] == "HostFromGpu" and "GpuFromHost" in names
        assert all(n.outputs[0].type.context_name == "dev0"
                   for n in f.maker.fgraph.toposort() if is_gpu_var(n.outputs[0]))
        f2 = function([x], T.exp(x))  # no GPU input, no default context: stays on the host
        assert op_names(f2) == ["Elemwise"]


def test_view_and_shape_lifters(vgpu, elemwise_lifter):
    a = T.matrix("a")
    f = function([a], T.exp(a).T)
    assert "GpuDimShuffle" in op_names(f)
    f = function([a], T.exp(a).shape)  # the shape rewrites: nothing computed, nothing moved
    assert op_names(f) == ["Shape_i", "Shape_i", "MakeVector"]
    f = function([a], [T.exp(a).transfer(None), T.exp(a).shape])  # exp is computed anyway
    names = op_names(f)
    assert "GpuShape" in names and "HostFromGpu" not in names
    f = function([a], a.shape)  # a host input's shape needs no upload
    assert "GpuFromHost" not in op_names(f)
    f = function([a], T.exp(a).reshape((-1,)))
    names = op_names(f)
    assert "GpuReshape" in names and names[-1] == "HostFromGpu"
    assert not any(isinstance(n.op, T.Elemwise) for n in f.maker.fgraph.toposort())


def test_alloc_lifted_eagerly(vgpu):
    n = T.lscalar("n")
    f = function([n], T.zeros((n, 3)))
    assert op_names(f) == ["GpuAlloc", "HostFromGpu"]
    alloc = f.maker.fgraph.toposort()[0]
    assert not is_gpu_var(alloc.inputs[0]) and alloc.inputs[0].ndim == 0  # filled by memset
    v = T.fvector("v")
    f = function([n, v], T.alloc(v, n, v.shape[0]))
    names = op_names(f)
    assert "GpuAlloc" in names and "GpuFromHost" in names and names[-1] == "HostFromGpu"
    with config.change_flags(optimizer_excluding="gpu"):
        assert "GpuAlloc" not in op_names(function([n], T.zeros((n, 3))))


def test_assert_no_cpu_op(vgpu, elemwise_lifter):
    a = T.matrix("a")
    with config.change_flags(assert_no_cpu_op="raise"):
        with pytest.raises(CpuOpError, match="HostOnly") as info:
            function([a], T.exp(HostOnly()(a)))
        assert [type(n.op).__name__ for n in info.value.nodes] == ["HostOnly"]
        assert "test_gpu_placement.py" in str(info.value)  # the user's line
        function([a], T.exp(a))  # all on the GPU: fine
    with config.change_flags(assert_no_cpu_op="warn"):
        with pytest.warns(CpuOpWarning, match="HostOnly"):
            function([a], HostOnly()(a) * 2)
    with config.change_flags(assert_no_cpu_op="ignore"), warnings.catch_warnings():
        warnings.simplefilter("error")
        function([a], HostOnly()(a))


def test_lifter_registry_by_type_and_order(vgpu):
    """Lifters are found along the op's MRO by type (newest registration first for a class,
    the op's own class before its bases); a class name is refused."""
    calls = []

    class HostOnlyChild(HostOnly):
        pass

    @register_lifter(HostOnly)
    def first(op, node, ctx, inputs):
        calls.append("first")
        return None

    @register_lifter(HostOnly)
    def second(op, node, ctx, inputs):
        calls.append("second")
        assert is_gpu_var(inputs[0]) and not inputs.was_on_gpu[0]
        assert inputs.host(0).type == node.inputs[0].type
        return None

    @register_lifter(HostOnlyChild)
    def child(op, node, ctx, inputs):
        calls.append("child")
        return None

    try:
        a = T.matrix("a")
        function([a], HostOnly()(a))
        assert calls == ["second", "first"]  # newest first
        calls.clear()
        function([a], HostOnlyChild()(a))
        assert calls == ["child", "second", "first"]  # the op's own class first
        with pytest.raises(TypeError, match="op classes"):
            register_lifter("HostOnly")
    finally:
        for fn in (first, second, child):
            unregister_lifter(fn)
    assert lifters_for(HostOnly()) == []


def test_gpu_pass_can_be_excluded(vgpu, elemwise_lifter):
    a = T.matrix("a")
    with config.change_flags(optimizer_excluding="gpu"):
        f = function([a], T.exp(a))
    assert op_names(f) == ["Elemwise"]


def test_grad_through_transfers(vgpu):
    a = T.matrix("a")
    cost = (a.transfer(None).transfer("cpu") ** 2).sum()
    ga = symgpu.grad(cost, a)
    assert ga.type == a.type
    g = GpuArrayType("float32", (False, False))("g")
    gg = symgpu.grad((g * 3).sum(), g)
    assert is_gpu_var(gg) and gg.type == g.type


# ============================================================================ shared

def test_shared_stays_on_host_without_a_usable_context(vgpu):
    x = shared(np.ones((2, 2), "float32"))  # a virtual context holds no values
    assert isinstance(x, TensorSharedVariable)
    state = shared(0)
    assert repr(state) == "<TensorType(int64, scalar)>"
    state.set_value(1)
    assert state.get_value() == 1
    with pytest.raises(TypeError, match="dev9"):
        shared(np.ones(2, "float32"), target="dev9")
    assert isinstance(shared(np.ones(2, "float32"), target="cpu"), TensorSharedVariable)


# ============================================================================ fallback

HIDE_PYCUDA = "import sys; sys.modules['pycuda'] = None  # as if PyCUDA were not installed\n"


def run_python(code: str, flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SYMGPU_FLAGS=flags,
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", HIDE_PYCUDA + textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


FALLBACK_PROGRAM = """
    import warnings
    warnings.simplefilter("always")
    import numpy, symgpu
    import symgpu.tensor as T
    x = symgpu.shared(numpy.ones(3, "float32"))
    f = symgpu.function([], T.exp(x) * 2)
    print("TYPE", type(x).__name__)
    print("OPS", [type(n.op).__name__ for n in f.maker.fgraph.toposort()])
    print("RESULT", f())
"""


def test_device_cuda_without_gpu_warns_and_runs_on_cpu():
    r = run_python(FALLBACK_PROGRAM, "device=cuda,floatX=float32")
    assert r.returncode == 0, r.stderr
    assert "TYPE TensorSharedVariable" in r.stdout
    assert "Gpu" not in r.stdout.split("OPS")[1].split("\n")[0]
    assert "RESULT [5.43656" in r.stdout
    assert r.stderr.count("running on the CPU") == 1  # warned once, saying why
    assert "PyCUDA cannot be imported" in r.stderr


def test_force_device_without_gpu_raises():
    r = run_python(FALLBACK_PROGRAM, "device=cuda,force_device=True,floatX=float32")
    assert r.returncode != 0
    assert "GpuUnavailableError" in r.stderr and "force_device" in r.stderr
    assert "TYPE" not in r.stdout


# ============================================================================ GPU

@pytest.fixture
def real_gpu(f32):
    """The machine's GPU registered as the default context (and as 'dev1') for the test."""
    ctx = gctx.start_device("cuda0")
    assert not ctx.virtual
    names = gctx.context_names()
    prev = {n: gctx.get_context(n) for n in (None, "dev1") if n in names}
    gctx.register_context(None, ctx)
    gctx.register_context("dev1", ctx)
    reset_transfer_counts()
    try:
        yield ctx
    finally:
        for n in (None, "dev1"):
            if n in prev:
                gctx.register_context(n, prev[n])
            else:
                gctx.unregister_context(n)


@requires_gpu
def test_gpu_shared_variable_lives_on_device(real_gpu):
    from symgpu.gpu.runtime.array import GpuArray
    host = np.arange(6, dtype="float32").reshape(2, 3)
    x = shared(host, name="x")
    assert isinstance(x, GpuArraySharedVariable)
    assert str(x.type) == "GpuArrayType<None>(float32, (False, False))"
    v = x.get_value()
    assert isinstance(v, np.ndarray) and np.array_equal(v, host)
    v[0, 0] = 99  # a copy: the shared value does not change
    assert x.get_value()[0, 0] == 0
    internal = x.get_value(borrow=True, return_internal_type=True)
    assert isinstance(internal, GpuArray) and internal.context is real_gpu
    assert isinstance(shared(0), TensorSharedVariable)
    assert isinstance(shared(host, target="cpu"), TensorSharedVariable)
    assert isinstance(shared(host, target="dev1"), GpuArraySharedVariable)
    # float scalars live on the device too, and read back as the host path's values
    for spelling in (0.5, np.float32(0.5), np.asarray(0.5, dtype="float32")):
        b = shared(spelling)
        assert isinstance(b, GpuArraySharedVariable), spelling
        host_twin = shared(spelling, target="cpu")
        assert b.dtype == host_twin.dtype and b.broadcastable == ()
        got, want = b.get_value(), host_twin.get_value()
        assert type(got) is type(want) and got.shape == want.shape and got == want
        b.set_value(1.5)
        assert b.get_value() == 1.5
        b.set_value(np.float32(2.5))
        assert b.get_value() == 2.5
    # set_value uploads; a bad value changes nothing
    x.set_value(host * 2)
    assert np.array_equal(x.get_value(), host * 2)
    with pytest.raises(TypeError):
        x.set_value(np.ones((2, 3, 1), "float32"))
    with pytest.raises(TypeError):
        x.set_value(np.ones((2, 3), "complex64"))
    assert np.array_equal(x.get_value(), host * 2)


@requires_gpu
def test_gpu_shared_update_without_transfers(real_gpu):
    from symgpu.gpu.runtime.array import GpuArray
    host = np.arange(6, dtype="float32").reshape(2, 3)
    x = shared(host.copy(), name="x")
    # a pure view update (transpose twice) and a device-resident output
    f = function([], Out(x.T.transfer(None), borrow=True), updates=[(x, x.T.T)])
    assert not any(isinstance(n.op, T.Elemwise) for n in f.maker.fgraph.toposort())
    reset_transfer_counts()
    for _ in range(3):
        r = f()
    assert TRANSFER_COUNTS["host_to_gpu"] == 0 and TRANSFER_COUNTS["gpu_to_host"] == 0
    assert isinstance(r, GpuArray) and np.array_equal(np.asarray(r), host.T)
    assert np.array_equal(x.get_value(), host)


@requires_gpu
def test_gpu_elemwise_update_stays_on_device(real_gpu):
    if not lifters_for(T.exp(T.fvector()).owner.op):
        pytest.skip("no GPU Elemwise lifter is registered yet (kernels)")
    host = np.linspace(-1, 1, 12, dtype="float32").reshape(3, 4)
    x = shared(host.copy(), name="x")
    f = function([], T.exp(x), updates=[(x, x * 2)])
    assert not any(isinstance(n.op, T.Elemwise) for n in f.maker.fgraph.toposort())
    reset_transfer_counts()
    outs = [f() for _ in range(3)]
    # the shared value never moves; at most scalar constants are uploaded (until folded)
    assert TRANSFER_COUNTS["host_to_gpu_bytes"] <= 3 * 8 and TRANSFER_COUNTS["gpu_to_host"] == 3
    for k, out in enumerate(outs):
        np.testing.assert_allclose(out, np.exp(host * 2 ** k), rtol=1e-6)
    np.testing.assert_allclose(x.get_value(), host * 8)


@requires_gpu
def test_gpu_transfers_every_direction(real_gpu):
    from symgpu.gpu.runtime.array import GpuArray, to_gpu
    a = T.matrix("a")
    data = np.random.RandomState(0).rand(3, 5).astype("float32")
    b = a.transfer(None)
    r = b.eval({a: data})
    assert isinstance(r, GpuArray) and np.array_equal(np.asarray(r), data)
    assert repr(r).startswith("gpuarray.array(")
    assert TRANSFER_COUNTS["host_to_gpu"] >= 1
    g = GpuArrayType("float32", (False, False))("g")
    f = function([g], [g.transfer("cpu"), g.transfer("dev1"), gpu_contiguous(g.T),
                       GpuShape()(g), GpuDimShuffle((False, False), ("x", 1, 0))(g)])
    host, same, cont, shp, ds = f(to_gpu(data, real_gpu))
    assert isinstance(host, np.ndarray) and np.array_equal(host, data)
    assert isinstance(same, GpuArray) and np.array_equal(np.asarray(same), data)
    assert cont.is_c_contiguous and np.array_equal(np.asarray(cont), data.T)
    assert list(shp) == [3, 5]
    assert ds.shape == (1, 5, 3) and np.array_equal(np.asarray(ds), data.T[None])
    # ndarray and foreign CUDA arrays as GPU inputs (wrapped without a copy)
    assert np.array_equal(function([g], g.transfer("cpu"))(data), data)
    try:
        import torch
    except ImportError:
        return
    t = torch.arange(15, dtype=torch.float32, device="cuda").reshape(3, 5)
    out = function([g], g.transfer("cpu"))(t)
    assert np.array_equal(out, np.arange(15, dtype="float32").reshape(3, 5))
    s = shared(t, target=None)
    t += 1  # shared() copied it
    assert np.array_equal(s.get_value(), np.arange(15, dtype="float32").reshape(3, 5))


@requires_gpu
def test_gpu_alloc_and_reshape(real_gpu):
    from symgpu.gpu.runtime.array import to_gpu
    n = T.lscalar("n")
    v = GpuArrayType("float32", (False,))("v")
    f = function([n, v], [GpuAlloc(None)(T.constant(np.float32(1.5)), n, 3).transfer("cpu"),
                          GpuAlloc(None)(v, n, 3).transfer("cpu"),
                          GpuReshape(2)(v, T.constant(np.array([3, 1]))).transfer("cpu")])
    filled, bcast, resh = f(4, to_gpu(np.array([1, 2, 3], "float32"), real_gpu))
    assert np.array_equal(filled, np.full((4, 3), 1.5, "float32"))
    assert np.array_equal(bcast, np.tile(np.array([1, 2, 3], "float32"), (4, 1)))
    assert np.array_equal(resh, np.array([[1], [2], [3]], "float32"))


def test_operator_on_a_named_context_transfer_runs_there():
    """`a.transfer('dev0') * 2` must run on dev0 even with no default context: the
    HostFromGpu(GpuFromHost) pair that the GPU variable's operator builds is read by the
    lifting pass before anything cancels it."""
    a = T.fmatrix("a")
    with virtual_context("dev0"):
        f = function([a], a.transfer("dev0") * 2)
    ops = [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
    assert "GpuElemwise" in ops and "Elemwise" not in ops
    assert any(isinstance(n.op, GpuFromHost) and n.op.context_name == "dev0"
               for n in f.maker.fgraph.toposort())


def test_assert_no_cpu_op_ignores_host_shape_arithmetic():
    x = T.fvector("x")
    y = T.fmatrix("y")
    with virtual_context(None), config.change_flags(assert_no_cpu_op="raise"):
        function([x], x.mean())  # Shape_i and the cast of the count stay on the host
        idx = T.bvector("idx")
        with pytest.raises(CpuOpError, match="AdvancedSubtensor"):
            function([y, idx], y[:, idx])  # a gather by an int8 index stays on the host


def test_constants_are_inlined_into_gpu_kernels_and_never_overwritten(vgpu):
    """Constants a GPU kernel reads become literals of its Composite (even a lone node's:
    `maximum(h, 0)`), so no per-call upload is left, and no in-place op may take a copy of a
    constant as its output buffer (it could then never be uploaded once). By default the
    sum's scaling is the reduction's epilogue (gpu_careduce_epilogue), its constant a literal
    there; without that pass, of the scaling's own kernel."""
    from symgpu.gpu.ops.elemwise import GpuCAReduce, GpuElemwise
    x, w = T.matrix("x"), T.matrix("w")
    h = T.maximum(T.dot(x, w), 0)
    s = h.sum() * (-1.0 / 512)

    def compiled(**flags):
        with config.change_flags(**flags):
            f = function([x, w], [gpu_from_host(h), gpu_from_host(s)])
        topo = f.maker.fgraph.toposort()
        ups = [n for n in topo if isinstance(n.op, GpuFromHost)
               and isinstance(n.inputs[0], Constant)]
        assert not ups, dprint(f)
        return topo
    for flags in ({"optimizer_excluding": "gpu_careduce_epilogue"}, {}):
        topo = compiled(**flags)
        texts = [str(n.op) for n in topo if isinstance(n.op, GpuElemwise)]
        assert any("maximum(i0, 0.0)" in t for t in texts), texts
        epilogues = [str(n.op) for n in topo
                     if isinstance(n.op, GpuCAReduce) and n.op.post_scalar_op is not None]
        if flags:
            assert any("-0.001953125" in t for t in texts), texts
            assert not epilogues, epilogues
        else:
            assert not any("-0.001953125" in t for t in texts), texts
            assert len(epilogues) == 1 and "-0.001953125" in epilogues[0], epilogues


def test_a_copy_of_a_constant_is_not_destroyable():
    from symgpu.graph.rewriting import why_not_destroyable
    from symgpu.graph.basic import constant_behind
    c = T.constant(np.float32(2.0))
    up = GpuFromHost(None)(c)
    assert constant_behind(up) is c and constant_behind(T.vector()) is None
    fg = FunctionGraph([], [host_from_gpu(up)], clone=False)
    reader = fg.clients[up][0][0]
    assert why_not_destroyable(fg, up, reader) == "a constant"


def test_a_bias_is_added_by_the_next_kernel_not_by_the_blas_call(vgpu):
    """dot(x, w) + b on the GPU: the product alone, its add fused into the kernel that reads
    it (here the ReLU), where a BLAS call on a broadcast C would first copy b into the whole
    output; a full-size accumulator keeps the one GpuGemm."""
    from symgpu.gpu.ops.blas import GpuDot22, GpuGemm
    from symgpu.gpu.ops.elemwise import GpuElemwise
    x, w, z = T.matrix("x"), T.matrix("w"), T.matrix("z")
    b = T.vector("b")
    f = function([x, w, b], gpu_from_host(T.maximum(T.dot(x, w) + b, 0)))
    topo = f.maker.fgraph.toposort()
    assert not any(isinstance(n.op, GpuGemm) for n in topo), dprint(f)
    assert any(isinstance(n.op, GpuDot22) for n in topo)
    relu = [n for n in topo if isinstance(n.op, GpuElemwise)]
    assert len(relu) == 1 and "(i0 + i1)" in str(relu[0].op), dprint(f)
    h = function([x, w, z], gpu_from_host(z - 0.1 * T.dot(x, w)))
    assert any(isinstance(n.op, GpuGemm) for n in h.maker.fgraph.toposort()), dprint(h)
