"""Driver failures and bugs are told apart (issue 19: broad excepts narrowed so that a bug
fails loudly instead of becoming a slow path). On the CPU, with stand-ins for the driver:
what a failing driver call raises (libcuda.DriverError; pycuda.driver.Error on the GPU
machine), the fallbacks that take it, and the bugs they no longer swallow."""
from __future__ import annotations

import numpy as np
import pytest

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.gpu.exec import prefetch
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime import compiler, libcuda, pool
from symgpu.gpu.runtime.libcuda import DriverError, driver_errors


def test_ctypes_driver_calls_raise_driver_errors(monkeypatch):
    monkeypatch.setattr(libcuda, "error_string", lambda status: f"code {status} explained")
    with pytest.raises(DriverError, match="^cuGraphLaunch failed: code 700 explained$") as info:
        libcuda.check(700, "cuGraphLaunch")
    assert info.value.status == 700
    assert isinstance(info.value, RuntimeError)  # callers that caught RuntimeError still do
    assert DriverError in driver_errors()


def test_pycuda_errors_count_once_pycuda_is_imported(monkeypatch):
    import sys
    import types
    monkeypatch.delitem(sys.modules, "pycuda.driver", raising=False)
    assert driver_errors() == (DriverError,)  # no PyCUDA call ran: none of its errors flies

    class FakePycudaError(Exception):
        """pycuda.driver.Error: the base of LogicError, LaunchError, MemoryError..."""
    monkeypatch.setitem(sys.modules, "pycuda.driver",
                        types.SimpleNamespace(Error=FakePycudaError))
    assert driver_errors() == (DriverError, FakePycudaError)


@pytest.mark.gpu
def test_pycuda_errors_are_driver_errors():
    import pycuda.driver as drv
    assert drv.Error in driver_errors()
    assert issubclass(drv.LogicError, driver_errors()) and issubclass(drv.LaunchError,
                                                                      driver_errors())


# ---------------------------------------------------------------------------- pool clean-up
class _Ctx:
    device = "cuda0"

    def mem_info(self):
        return 1 << 30, 1 << 30


class _Alloc:
    def __init__(self, ptr, fail=None):
        self.ptr, self.fail, self.freed = ptr, fail, False

    def __int__(self):
        return self.ptr

    def free(self):
        if self.fail is not None:
            raise self.fail
        self.freed = True


class _Pool(pool.DevicePool):
    """No pooling (-1): a released block is freed on the device at once."""

    fail = None

    def _device_alloc(self, nbytes):
        self.n_device_allocs += 1
        return _Alloc(1 << 40, self.fail)


def test_a_block_freed_on_a_failed_context_is_dropped_quietly():
    p = _Pool(_Ctx(), -1)
    p.fail = DriverError("cuMemFree failed: an illegal memory access was encountered", 700)
    block = p.allocate(1000)
    block.__del__()   # as the collector calls it; the driver error means nothing to free
    assert p.bytes_in_use == 0


def test_a_bug_freeing_a_block_is_not_swallowed():
    p = _Pool(_Ctx(), -1)
    p.fail = TypeError("free() takes no arguments")
    block = p.allocate(1000)
    with pytest.raises(TypeError, match="free"):
        block.__del__()


def test_blocks_collected_at_interpreter_exit_are_left_to_the_driver():
    p = _Pool(_Ctx(), 0.0)
    block = p.allocate(1000)
    block.__del__(_finalizing=lambda: True)
    assert p.bytes_in_use == 1024 and p.bytes_cached == 0  # not given back: the process ends
    block.__del__()  # already let go: nothing more happens
    assert p.bytes_in_use == 1024


# ------------------------------------------------------------------------------- prefetch
CTX = "driver-errors-virt"


class _Kernels(Op):
    """A GPU node whose `prefetch_sources` raises `error` (None: one module)."""

    __props__ = ("tag",)

    def __init__(self, tag, error=None):
        self.tag, self.error = tag, error

    def make_node(self, x):
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        out[0][0] = inputs[0]

    def prefetch_sources(self, node):
        if self.error is not None:
            raise self.error
        return [(("driver-errors", self.tag), lambda: f"// {self.tag}\n", ())]


def _nodes(*ops):
    x = GpuArrayType("float32", (False,), CTX)()
    return [op.make_node(x) for op in ops]


def test_nodes_that_cannot_render_are_left_to_their_thunks():
    with virtual_context(CTX):
        nodes = _nodes(_Kernels("a"), _Kernels("b", TypeError("no CUDA rendering for complex")),
                       _Kernels("c", KeyError("sm_20")), _Kernels("d"))
        reqs = prefetch.requests(nodes, include_virtual=True, skip_seen=False)
    assert [r.key for r in reqs] == [("driver-errors", "a"), ("driver-errors", "d")]


def test_a_bug_in_prefetch_sources_propagates():
    with virtual_context(CTX):
        nodes = _nodes(_Kernels("a"), _Kernels("b", AttributeError("no attribute 'sig'")))
        with pytest.raises(AttributeError, match="sig"):
            prefetch.requests(nodes, include_virtual=True, skip_seen=False)


def test_the_link_hook_logs_a_missing_compiler_and_lets_bugs_through(monkeypatch):
    logged = []
    monkeypatch.setattr(compiler, "_log", logged.append)

    def missing(*a, **k):
        raise compiler.CompileError("nvcc was not found on PATH")
    monkeypatch.setattr(prefetch, "prefetch", missing)
    prefetch._link_hook(None, [_Kernels("a").make_node(GpuArrayType("float32", (False,),
                                                                     CTX)())])
    assert logged and "nvcc was not found" in logged[0]

    def bug(*a, **k):
        raise NameError("name 'reqs' is not defined")
    monkeypatch.setattr(prefetch, "prefetch", bug)
    with pytest.raises(NameError):  # symgpu.link.vm turns it into a RuntimeWarning
        prefetch._link_hook(None, [_Kernels("a").make_node(GpuArrayType("float32", (False,),
                                                                         CTX)())])


# ------------------------------------------------------------------- module load retries
def _fake_compiles(monkeypatch, load):
    compiles = []
    monkeypatch.setattr(compiler, "nvcc_version", lambda: "nvcc (stand-in)")
    monkeypatch.setattr(compiler, "compile_to_cubin",
                        lambda source, options, arch: compiles.append(source)
                        or ("/nonexistent/entry.cubin", b"cubin", False))
    monkeypatch.setattr(compiler, "load_module", load)
    compiler.clear_memory_cache()
    return compiles


class _LoadCtx:
    arch = "sm_90"


def test_an_entry_the_driver_refuses_is_compiled_again(monkeypatch):
    loads = []

    def load(cubin, ctx):
        loads.append(cubin)
        if len(loads) == 1:
            raise DriverError("cuModuleLoadData failed: device kernel image is invalid", 200)
        return "module"
    compiles = _fake_compiles(monkeypatch, load)
    assert compiler.compile_module("// k\n", context=_LoadCtx()) == "module"
    assert len(compiles) == 2 and len(loads) == 2


def test_a_bug_loading_a_module_is_not_taken_for_a_damaged_entry(monkeypatch):
    def load(cubin, ctx):
        raise TypeError("module_from_buffer() argument 1 must be bytes")
    compiles = _fake_compiles(monkeypatch, load)
    with pytest.raises(TypeError, match="must be bytes"):
        compiler.compile_module("// k2\n", context=_LoadCtx())
    assert len(compiles) == 1
