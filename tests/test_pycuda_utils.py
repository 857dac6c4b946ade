"""symgpu.misc.pycuda_utils (GpuArray <-> PyCUDA GPUArray) and custom ops with PyCUDA kernels.

CPU tests (CI): the modules import without PyCUDA, wrong inputs fail with errors that say
what to do, the VM calls ``make_thunk`` the way the tutorial's op expects, and an op with GPU
outputs counts as a GPU op for ``assert_no_cpu_op``.  Tests marked ``gpu`` need a GPU and
PyCUDA (``pytest -m gpu`` on the GPU machine) and assert that a real device ran them.
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from gpu_helpers import real_default_gpu, requires_gpu
from symgpu.config import config
from symgpu.gpu.runtime import context as gctx
from symgpu.gpu.runtime.array import GpuArray
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable, gpu_contiguous
from symgpu.misc.pycuda_utils import from_gpuarray, to_gpuarray

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, flags: str = "device=cpu") -> subprocess.CompletedProcess:
    env = dict(os.environ, SYMGPU_FLAGS=flags,
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


def virtual_array(shape=(4, 6), dtype="float32") -> GpuArray:
    """A GpuArray on a device-less (virtual, unregistered) context: enough to test argument
    checks on the CPU; nothing may touch its memory."""
    ctx = gctx.GpuContext("pycuda-utils-virtual", "cuda0")
    return GpuArray._from_pointer(ctx, 0x10000, shape, np.dtype(dtype), None, None)


# ============================================================================ CPU tests

def test_modules_import_without_pycuda():
    r = run_python("""
        import sys; sys.modules['pycuda'] = None  # as if PyCUDA were not installed
        import symgpu.misc, symgpu.misc.pycuda_utils as pu
        from symgpu.misc.pycuda_utils import to_gpuarray, from_gpuarray
        import numpy as np
        from symgpu.gpu.runtime.array import GpuArray
        from symgpu.gpu.runtime.context import GpuContext
        x = GpuArray._from_pointer(GpuContext('v', 'cuda0'), 4096, (3,), np.dtype('float32'),
                                   None, None)
        try:
            to_gpuarray(x)
        except ImportError as exc:
            print('IMPORTERROR', exc)
        print('PYCUDA LOADED', 'pycuda.driver' in sys.modules)
    """)
    assert r.returncode == 0, r.stderr
    assert "IMPORTERROR symgpu.misc.pycuda_utils needs PyCUDA" in r.stdout
    assert "pip install pycuda" in r.stdout
    assert "PYCUDA LOADED False" in r.stdout


def test_to_gpuarray_rejects_wrong_inputs():
    with pytest.raises(TypeError, match="expects a symgpu GpuArray.*to_gpu"):
        to_gpuarray(np.ones(3, "float32"))
    strided = virtual_array()[:, ::2]
    assert not strided.is_c_contiguous
    with pytest.raises(ValueError, match=r"not C-contiguous.*copyif=True"):
        to_gpuarray(strided)
    transposed = virtual_array().T
    with pytest.raises(ValueError, match=r"strides \(4, 24\)"):
        to_gpuarray(transposed)


def test_from_gpuarray_rejects_wrong_inputs():
    with pytest.raises(TypeError, match="host data.*to_gpu"):
        from_gpuarray(np.ones(3))
    with pytest.raises(TypeError, match="already a symgpu GpuArray"):
        from_gpuarray(virtual_array())


def test_pycuda_init_warns_without_a_gpu():
    r = run_python("""
        import sys, warnings; sys.modules['pycuda'] = None
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            import symgpu.misc.pycuda_init as pi
        print('AVAILABLE', pi.pycuda_available, pi.context)
        print('WARNED', any('PyCUDA cannot use a GPU' in str(x.message) for x in w))
    """)
    assert r.returncode == 0, r.stderr
    assert "AVAILABLE False None" in r.stdout and "WARNED True" in r.stdout


class StrictThunkOp(symgpu.Op):
    """make_thunk with exactly the tutorial's four positional parameters (no impl=)."""

    calls: list = []

    def make_node(self, x):
        x = T.as_tensor_variable(x)
        return symgpu.Apply(self, [x], [x.type()])

    def make_thunk(self, node, storage_map, _, _2):
        StrictThunkOp.calls.append((_, _2))
        inputs = [storage_map[v] for v in node.inputs]
        outputs = [storage_map[v] for v in node.outputs]

        def thunk():
            outputs[0][0] = inputs[0][0] * 2
        thunk.lazy = False
        return thunk


def test_vm_calls_make_thunk_with_four_positional_arguments():
    x = T.dvector()
    f = symgpu.function([x], StrictThunkOp()(x))
    np.testing.assert_array_equal(f(np.arange(3.0)), [0.0, 2.0, 4.0])
    compute_map, no_recycling = StrictThunkOp.calls[-1]
    assert isinstance(compute_map, dict) and list(no_recycling) == []


class GraphOnlyDoubleOp(symgpu.Op):
    """The tutorial's PyCUDADoubleOp's graph side (make_node), for CPU placement checks."""

    __props__ = ()

    def make_node(self, inp):
        inp = gpu_contiguous(as_gpuarray_variable(inp))
        assert inp.dtype == "float32"
        return symgpu.Apply(self, [inp], [inp.type()])


def test_custom_op_with_gpu_outputs_counts_as_gpu_op():
    from symgpu.compile.mode import get_mode
    from symgpu.gpu.placement.rewriting import cpu_nodes, virtual_context
    from symgpu.graph.fg import FunctionGraph
    x = T.fmatrix("x")
    with virtual_context(None), config.change_flags(assert_no_cpu_op="raise"):
        fg = FunctionGraph([x], [GraphOnlyDoubleOp()(x)], clone=True)
        get_mode(None).rewrite(fg)  # raises CpuOpError if a node stayed on the CPU
        assert cpu_nodes(fg) == []
        ops = [type(n.op).__name__ for n in fg.toposort()]
        assert ops[-1] == "GraphOnlyDoubleOp" and "GpuFromHost" in ops, ops


# ============================================================================ GPU tests

@pytest.fixture(scope="module")
def gpu():
    """The machine's GPU as symgpu's default context, made current for PyCUDA."""
    with real_default_gpu() as ctx:
        import symgpu.misc.pycuda_init as pycuda_init
        assert pycuda_init.pycuda_available and pycuda_init.context is ctx
        yield ctx


@requires_gpu
def test_to_gpuarray_shares_memory_both_ways(gpu):
    import pycuda.driver as drv
    import pycuda.gpuarray as pga
    from symgpu.gpu.runtime.array import to_gpu
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = to_gpu(host, gpu)
    g = to_gpuarray(x)
    assert isinstance(g, pga.GPUArray) and g.shape == (3, 4) and g.dtype == np.float32
    assert int(g.gpudata) == x.ptr and g.base is x
    np.testing.assert_array_equal(g.get(), host)      # PyCUDA reads what symgpu wrote
    g.fill(7.0)                                       # PyCUDA writes, symgpu sees it
    np.testing.assert_array_equal(x.get(), np.full((3, 4), 7, np.float32))
    x.fill(3.0)                                       # symgpu writes, PyCUDA sees it
    np.testing.assert_array_equal(g.get(), np.full((3, 4), 3, np.float32))
    np.testing.assert_array_equal((g * 2).get(), np.full((3, 4), 6, np.float32))
    out = pga.empty_like(g)
    drv.memcpy_dtod(out.gpudata, g.gpudata, g.nbytes)  # the holder converts to a pointer
    np.testing.assert_array_equal(out.get(), np.full((3, 4), 3, np.float32))
    # a view PyCUDA makes still shares x's memory
    row = g[1]
    assert int(row.gpudata) == x.ptr + 16
    np.testing.assert_array_equal(row.get(), np.full(4, 3, np.float32))
    # booleans and integers convert too
    xi = to_gpu(np.arange(5, dtype=np.int64), gpu)
    np.testing.assert_array_equal(to_gpuarray(xi).get(), np.arange(5))


@requires_gpu
def test_to_gpuarray_strided_and_copyif(gpu):
    from symgpu.gpu.runtime.array import to_gpu
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = to_gpu(host, gpu)
    with pytest.raises(ValueError, match="copyif=True"):
        to_gpuarray(x[:, ::2])
    with pytest.raises(ValueError, match="copyif=True"):
        to_gpuarray(x.T)
    c = to_gpuarray(x.T, copyif=True)
    assert c.shape == (6, 4) and int(c.gpudata) != x.ptr
    np.testing.assert_array_equal(c.get(), host.T)
    c.fill(0)                                          # a copy: x is untouched
    np.testing.assert_array_equal(x.get(), host)
    # a contiguous slice shares memory (offset pointer)
    s = to_gpuarray(x[1:3])
    assert int(s.gpudata) == x.ptr + 6 * 4
    np.testing.assert_array_equal(s.get(), host[1:3])
    assert to_gpuarray(x[:0]).size == 0


@requires_gpu
def test_to_gpuarray_keeps_memory_alive(gpu):
    from symgpu.gpu.runtime.array import empty, to_gpu
    x = to_gpu(np.full(4096, 5, np.float32), gpu)
    ptr = x.ptr
    g = to_gpuarray(x)
    del x
    gc.collect()
    junk = [empty((4096,), "float32", gpu).fill(-1) for _ in range(8)]  # would reuse the block
    assert all(j.ptr != ptr for j in junk)
    np.testing.assert_array_equal(g.get(), np.full(4096, 5, np.float32))
    view = g[10:20]
    del g
    gc.collect()
    junk += [empty((4096,), "float32", gpu).fill(-2) for _ in range(8)]
    assert all(j.ptr != ptr for j in junk)
    np.testing.assert_array_equal(view.get(), np.full(10, 5, np.float32))


@requires_gpu
def test_from_gpuarray_shares_memory_and_lifetime(gpu):
    import pycuda.gpuarray as pga
    host = np.arange(24, dtype=np.float64).reshape(4, 6)
    p = pga.to_gpu(host)
    y = from_gpuarray(p)
    assert isinstance(y, GpuArray) and y.context is gpu and y.ptr == int(p.gpudata)
    np.testing.assert_array_equal(y.get(), host)
    y.fill(2.0)                                       # symgpu writes, PyCUDA sees it
    np.testing.assert_array_equal(p.get(), np.full((4, 6), 2.0))
    p.set(host)                                       # PyCUDA writes, symgpu sees it
    np.testing.assert_array_equal(y.get(), host)
    # strided PyCUDA views keep their strides
    p.set(host)
    v = from_gpuarray(p[:, ::2])
    assert v.shape == (4, 3) and v.strides == (48, 16) and v.ptr == int(p.gpudata)
    np.testing.assert_array_equal(v.get(), host[:, ::2])
    t = from_gpuarray(p.T if hasattr(p, "T") else p.transpose())
    np.testing.assert_array_equal(t.get(), host.T)
    # the PyCUDA array stays allocated while symgpu holds it
    addr = int(p.gpudata)
    del p
    gc.collect()
    junk = [pga.to_gpu(np.full(24, -1.0)) for _ in range(8)]
    assert all(int(j.gpudata) != addr for j in junk)
    np.testing.assert_array_equal(y.get(), host)
    np.testing.assert_array_equal(v.get(), host[:, ::2])


@requires_gpu
def test_round_trip_is_the_same_memory(gpu):
    from symgpu.gpu.runtime.array import to_gpu
    x = to_gpu(np.arange(10, dtype=np.float32), gpu)
    back = from_gpuarray(to_gpuarray(x))
    assert back.ptr == x.ptr
    back.fill(1)
    np.testing.assert_array_equal(x.get(), np.ones(10, np.float32))


@requires_gpu
def test_ordering_on_a_pycuda_stream(gpu):
    import pycuda.driver as drv
    from symgpu.gpu.runtime.array import to_gpu
    n = 1 << 22
    x = to_gpu(np.zeros(n, np.float32), gpu)
    s = drv.Stream()
    g = to_gpuarray(x, stream=s)              # s waits for symgpu's queued upload
    host = drv.pagelocked_empty(n, np.float32)
    host[:] = 4
    g.set_async(host, stream=s)
    y = from_gpuarray(g, stream=s)            # symgpu's stream waits for s
    assert float(y.get().sum()) == 4.0 * n


# -- the tutorial's "Theano + PyCUDA" op, ported

def _pycuda_double_op_class():
    from symgpu.misc import pycuda_init  # noqa: F401  (the tutorial's theano.misc.pycuda_init)
    from pycuda.compiler import SourceModule
    import symgpu.gpu as cuda

    class PyCUDADoubleOp(symgpu.Op):
        def __eq__(self, other):
            return type(self) == type(other)

        def __hash__(self):
            return hash(type(self))

        def __str__(self):
            return self.__class__.__name__

        def make_node(self, inp):
            inp = cuda.placement.basic_ops.gpu_contiguous(
                cuda.placement.basic_ops.as_gpuarray_variable(inp))
            assert inp.dtype == "float32"
            return symgpu.Apply(self, [inp], [inp.type()])

        def make_thunk(self, node, storage_map, _, _2):
            mod = SourceModule("""
    __global__ void my_fct(float * i0, float * o0, int size) {
    int i = blockIdx.x*blockDim.x + threadIdx.x;
    if(i<size){
        o0[i] = i0[i]*2;
    }
  }""")
            pycuda_fct = mod.get_function("my_fct")
            inputs = [storage_map[v] for v in node.inputs]
            outputs = [storage_map[v] for v in node.outputs]

            def thunk():
                z = outputs[0]
                if z[0] is None or z[0].shape != inputs[0][0].shape:
                    z[0] = cuda.zeros(inputs[0][0].shape)
                grid = (int(np.ceil(inputs[0][0].size / 512.)), 1)
                pycuda_fct(inputs[0][0], z[0], np.intc(inputs[0][0].size),
                           block=(512, 1, 1), grid=grid)
            thunk.lazy = False
            return thunk

    return PyCUDADoubleOp


@requires_gpu
def test_ported_pycuda_double_op(gpu):
    from symgpu.gpu.placement.basic_ops import TRANSFER_COUNTS, reset_transfer_counts
    from symgpu.gpu.placement.rewriting import cpu_nodes
    PyCUDADoubleOp = _pycuda_double_op_class()
    x = T.fmatrix()
    with config.change_flags(assert_no_cpu_op="raise"):
        f = symgpu.function([x], PyCUDADoubleOp()(x))
    assert cpu_nodes(f.maker.fgraph) == []
    xv = np.ones((4, 5), dtype="float32")
    assert np.allclose(f(xv), xv * 2)
    out = f(xv)
    assert isinstance(out, GpuArray) and out.context is gpu
    np.testing.assert_array_equal(np.asarray(out), xv * 2)
    big = np.random.RandomState(0).rand(300, 700).astype("float32")  # several blocks
    reset_transfer_counts()
    np.testing.assert_array_equal(np.asarray(f(big)), big * 2)
    assert TRANSFER_COUNTS["host_to_gpu"] == 1
    # the exercise's follow-up: the same op on a GPU input, strided (gpu_contiguous copies)
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.gpu.runtime.array import to_gpu
    g = GpuArrayType("float32", (False, False))("g")
    fg = symgpu.function([g], PyCUDADoubleOp()(g))
    np.testing.assert_array_equal(np.asarray(fg(to_gpu(big, gpu).T)), big.T * 2)
