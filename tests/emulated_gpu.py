"""GPU ops' own thunks run on the CPU: their planning, argument packing and kernels, with
device memory that is host memory and every launch run by tests/cuda_on_host.py.

``emulated_kernel_device(monkeypatch, directory)`` gives a fake context whose pool hands out
zeroed host buffers (a GpuArray's ``ptr`` is a host address) and makes ``load_kernels``
compile each module as host C++ (every kernel of it wrapped with ``EMU_KERNEL``): a thunk's
``launch(grid, block, *args)`` packs its arguments as it does for cuLaunchKernel and runs the
kernel there and then. ``device_array`` / ``host_view`` move values in and out.
``emulate_prepared_kernels(monkeypatch, directory, *modules)`` does the same for the ops that
launch through PyCUDA (``get_prepared_kernel`` as each of ``modules`` imported it): a
Function whose ``prepared_call`` / ``prepared_async_call`` run the kernel on the host. What is
not emulated: the driver (copies, memsets other than ``fill``), cuBLAS.
"""
from __future__ import annotations

import ctypes
import re
import struct
import subprocess
from typing import Any

import numpy as np

from cuda_on_host import PRELUDE, build, write_shims
from gpu_helpers import FakeCtx

_ALIGN = 256


class HostMemoryPool:
    """Zeroed host buffers handed out as pool blocks (kept alive until the pool goes)."""

    def __init__(self) -> None:
        self.buffers: dict[int, np.ndarray] = {}

    def allocate(self, nbytes: int):
        from symgpu.gpu.runtime.pool import Block, size_class
        size = size_class(max(nbytes, 1))
        raw = np.zeros(size + _ALIGN, dtype=np.uint8)
        ptr = raw.ctypes.data + (-raw.ctypes.data % _ALIGN)
        self.buffers[ptr] = raw
        return Block(ptr, size, None, None)


class EmulatedCtx(FakeCtx):
    """A context whose device memory is host memory (see the module docstring)."""

    name, stream = "emulated", None

    def __init__(self) -> None:
        from symgpu.gpu.runtime.device_checks import DeviceChecks, page_aligned
        self.pool = HostMemoryPool()
        pages: list[np.ndarray] = []

        def host_slots(n: int):
            """n zeroed report slots on a page of host memory (the mapped memory's stand-in:
            a kernel's report also sets its page's first word)."""
            raw = np.zeros((n + 256, 2), dtype=np.uint64)
            pages.append(raw)
            return page_aligned(raw, raw.ctypes.data, n)
        #: the checking kernels' report slots (device_checks.py), read by raise_device_errors
        self.device_checks = DeviceChecks(host_slots)

    def synchronize(self) -> None:
        pass


def host_view(a: Any) -> np.ndarray:
    """A NumPy view of GpuArray ``a``'s memory, in its layout (offsets and strides too)."""
    if a.size == 0:
        return np.empty(a.shape, a.dtype)
    lo = a.ptr + sum(min(0, (n - 1) * s) for n, s in zip(a.shape, a.strides))
    hi = a.ptr + sum(max(0, (n - 1) * s) for n, s in zip(a.shape, a.strides)) + a.itemsize
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * (hi - lo)).from_address(lo))
    return np.lib.stride_tricks.as_strided(raw[a.ptr - lo:].view(a.dtype), a.shape, a.strides)


def device_array(ctx: EmulatedCtx, values: np.ndarray) -> Any:
    """A new C-contiguous GpuArray on ``ctx`` holding ``values``."""
    from symgpu.gpu.runtime.array import GpuArray, c_strides
    values = np.asarray(values, order="C")   # (ascontiguousarray would make a 0-d array 1-d)
    a = GpuArray.__new__(GpuArray)
    block = ctx.pool.allocate(values.nbytes)
    a._set(ctx, block.ptr, values.shape, c_strides(values.shape, values.itemsize),
           values.dtype, block)
    host_view(a)[...] = values
    return a


class _EmulatedKernel:
    """``load_kernels``'s Kernel, launched on the host: its arguments packed with the kernel's
    format (``struct``, native alignment: the CUDA parameter buffer) and run there and then."""

    def __init__(self, lib: ctypes.CDLL, name: str, fmt: str) -> None:
        self.name, self.fmt = name, fmt
        self._struct = struct.Struct("@" + fmt)
        self._run = getattr(lib, f"run_{name}")
        self.launch = self.fast_launcher()

    def fast_launcher(self):
        def go(grid: tuple, block: tuple, *args: Any) -> None:
            buf = ctypes.create_string_buffer(self._struct.pack(*args), max(self._struct.size, 8))
            grid, block = tuple(grid) + (1, 1), tuple(block) + (1, 1)
            assert block[2] == 1, "3-d blocks are not emulated"
            self._run(*(ctypes.c_longlong(v) for v in (grid[0], grid[1], grid[2], block[0],
                                                       block[1])), buf)
        return go


def emulating_loader(directory) -> Any:
    """A ``load_kernels`` that builds each module once as host C++ with its kernels wrapped."""
    libs: dict[Any, ctypes.CDLL] = {}

    def load(context, key, source_factory, formats, options=()):
        lib = libs.get(key)
        if lib is None:
            sub = directory / f"m{len(libs)}"
            sub.mkdir()
            wraps = "\n".join(f"EMU_KERNEL({name})" for name in formats)
            lib = libs[key] = build(source_factory(), wraps, sub)
        return {n: _EmulatedKernel(lib, n, f) for n, f in formats.items()}
    return load


def emulated_kernel_device(monkeypatch, directory) -> EmulatedCtx:
    """An EmulatedCtx that GPU elementwise and reduction thunks are built against and run on;
    ``GpuArray.fill`` writes host memory for its arrays."""
    import symgpu.gpu.ops.careduce as gcareduce
    import symgpu.gpu.ops.elemwise as gelem
    import symgpu.gpu.runtime.codegen.launch as launch
    from symgpu.gpu.runtime.array import GpuArray
    ctx = EmulatedCtx()
    monkeypatch.setattr(launch, "load_kernels", emulating_loader(directory))
    for module in (gelem, gcareduce):     # the elementwise and reduction thunks
        monkeypatch.setattr(module, "_context", lambda name: ctx)
    real_fill = GpuArray.fill

    def fill(self, value):
        if self.context is not ctx:
            return real_fill(self, value)
        host_view(self)[...] = value
        return self
    monkeypatch.setattr(GpuArray, "fill", fill)
    return ctx


class _PreparedFunction:
    """PyCUDA's prepared Function, emulated: its calls run the kernel there and then."""

    def __init__(self, kernel: _EmulatedKernel) -> None:
        self.kernel = kernel

    def prepared_call(self, grid: tuple, block: tuple, *args: Any) -> None:
        self.kernel.launch(grid, block, *args)

    def prepared_async_call(self, grid: tuple, block: tuple, stream: Any, *args: Any) -> None:
        self.kernel.launch(grid, block, *args)


def _entry_points(source: str, directory) -> list[str]:
    """The names of ``source``'s kernels (extern "C" functions once its macros are expanded:
    __global__ is nothing on the host)."""
    cpp = directory / "entry_points.cpp"
    cpp.write_text(PRELUDE + "\n" + source)
    proc = subprocess.run(["g++", "-std=c++17", "-E", "-P", "-I", str(directory), str(cpp)],
                          capture_output=True, text=True, check=True)
    body = proc.stdout[proc.stdout.rfind("emu_call_impl"):]
    return list(dict.fromkeys(re.findall(r'extern "C"\s+void\s+(\w+)\s*\(', body)))


#: host builds of get_prepared_kernel's modules, by source (kept for the test session)
_PREPARED_LIBS: dict[str, ctypes.CDLL] = {}


def emulate_prepared_kernels(monkeypatch, directory, *modules: Any) -> None:
    """Make ``get_prepared_kernel``, as each of ``modules`` imported it, build its module as
    host C++ (every kernel wrapped; once per source in the session) and return a host-run
    Function."""
    def get_prepared_kernel(key, source_factory, fn_name, signature, options=(),
                            context=None):
        source = source_factory()
        lib = _PREPARED_LIBS.get(source)
        if lib is None:
            sub = directory / f"p{len(_PREPARED_LIBS)}"
            sub.mkdir()
            write_shims(sub)
            wraps = "\n".join(f"EMU_KERNEL({n})" for n in _entry_points(source, sub))
            lib = _PREPARED_LIBS[source] = build(source, wraps, sub)
        return _PreparedFunction(_EmulatedKernel(lib, fn_name, signature))
    for module in modules:
        monkeypatch.setattr(module, "get_prepared_kernel", get_prepared_kernel)


def emulated_array_device(monkeypatch, directory) -> EmulatedCtx:
    """``emulated_kernel_device`` whose GpuArrays also move values like real ones: ``set``,
    ``get`` and device-to-device copies read and write the host memory standing for the
    device (the driver's copies are all that is not emulated), so GpuArray's own operators,
    reductions and ``copy`` run their generated kernels for real."""
    from symgpu.gpu.runtime.array import GpuArray
    ctx = emulated_kernel_device(monkeypatch, directory)
    real_set, real_get = GpuArray.set, GpuArray.get
    real_copy_from = GpuArray._copy_from_device

    def set_(self, ary):
        if self.context is not ctx:
            return real_set(self, ary)
        src = ary.get() if isinstance(ary, GpuArray) else np.asarray(ary)
        if src.shape != self.shape:
            raise ValueError(f"cannot set a GpuArray of shape {self.shape} from shape "
                             f"{src.shape}")
        host_view(self)[...] = src.astype(self.dtype)
        return self

    def get(self, out=None):
        if self.context is not ctx:
            return real_get(self, out)
        value = np.array(host_view(self), order="C")   # (0-d stays 0-d)
        if out is None:
            return value
        out[...] = value
        return out

    def copy_from(self, src):
        if self.context is not ctx:
            return real_copy_from(self, src)
        host_view(self)[...] = host_view(src)

    monkeypatch.setattr(GpuArray, "set", set_)
    monkeypatch.setattr(GpuArray, "get", get)
    monkeypatch.setattr(GpuArray, "_copy_from_device", copy_from)
    return ctx


def gpu_var(dtype: str, ndim: int, bcast: tuple | None = None) -> Any:
    """A symbolic GPU array of `ndim` dimensions (none broadcastable unless `bcast` says)."""
    from symgpu.gpu.placement.type import GpuArrayType
    return GpuArrayType(dtype, bcast or (False,) * ndim, None)()


def run_node(node: Any, values: list) -> tuple[list[np.ndarray], Any, dict]:
    """Run `node`'s thunk over `values` (GpuArrays); returns copies of its outputs, the thunk
    and its storage map (to run it again or look at its cells)."""
    from gpu_helpers import thunk_over
    thunk, storage = thunk_over(node, values)
    thunk()
    return [host_view(storage[o][0]).copy() for o in node.outputs], thunk, storage


def record_launches(monkeypatch) -> list[str]:
    """The names of the kernels launched from now on, in order (to assert the path a thunk
    took): every kernel module loaded afterwards reports its launches into the list."""
    import symgpu.gpu.runtime.codegen.launch as launch
    names: list[str] = []
    load = launch.load_kernels

    def recording(*args, **kwargs):
        kernels = load(*args, **kwargs)
        for k in kernels.values():
            go = k.launch
            k.fast_launcher = (lambda go=go, name=k.name: lambda *a: (names.append(name),
                                                                      go(*a)))
        return kernels
    monkeypatch.setattr(launch, "load_kernels", recording)
    return names


def run_op_on(ctx: Any, op: Any, *values: np.ndarray) -> np.ndarray:
    """`op`'s own thunk over emulated device copies of the NumPy `values` (a node built on a
    virtual context): its output, copied to the host."""
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.gpu.placement.rewriting import virtual_context
    with virtual_context(None):
        node = op(*[GpuArrayType(str(v.dtype), (False,) * v.ndim, None)() for v in values]).owner
    cells = {v: [device_array(ctx, a)] for v, a in zip(node.inputs, values)}
    cells[node.outputs[0]] = [None]
    node.op.make_thunk(node, cells, {}, [])()
    return host_view(cells[node.outputs[0]][0]).copy()
