"""Loading generated modules and launching their kernels with the least Python per call.

Why not ``prepared_async_call``: it costs about 5.4 us of Python per launch (argument checks,
an import, the texref loop, then PyCUDA's own launch).  Here a kernel is a ``Kernel`` whose
argument layout is fixed when the thunk is made, and ``fast_launcher()`` returns a closure
that only packs the arguments (``struct``, native alignment = the CUDA parameter layout) and
launches on the context's stream.  Three launchers exist:

* ``"c"`` (default): ``cuLaunchKernel`` through the C runtime's ``launch_kernel``
  (symgpu/link/c_runtime.py: the packed parameters handed over as one buffer, a few integer
  conversions); the module loaded with ``cuModuleLoadData`` for the function handles.  Where
  the C runtime cannot be built (no compiler or no Python headers) it is ``"pycuda"``;
* ``"pycuda"``: PyCUDA's ``Function._launch_kernel(grid, block, buffer, 0, stream)``, the
  call ``prepared_async_call`` ends in, without its per-call checks;
* ``"ctypes"``: ``cuLaunchKernel`` through ``ctypes.PyDLL`` (the GIL stays held, so the
  preallocated parameter buffer cannot be repacked by another thread mid-launch).

Measured on the H200 host (one launch of exp over 230,400 floats): 3.96 us with "pycuda",
4.40 us with "ctypes" (ctypes converts eleven arguments per call); most of either is the
driver's own cuLaunchKernel.  ``benchmarks/gpu_kernels.py`` times the three.

Modules come from the runtime's compile cache (``compile_to_cubin``: nvcc only on a miss) and
are kept per (key, context) in memory, so the hot path never hashes source text.
"""
from __future__ import annotations

import ctypes
import functools
import struct
import threading
from typing import Any, Callable, Sequence

from symgpu.config import config
from symgpu.gpu.runtime import compiler, libcuda
from symgpu.gpu.runtime.compiler import PreparedKernel
from symgpu.link import c_runtime

__all__ = ["Kernel", "PreparedKernel", "load_kernels", "BACKEND", "sm_count", "clear_cache"]

#: "c" (cuLaunchKernel through the C runtime; "pycuda" where it cannot be built),
#: "pycuda" (Function._launch_kernel) or "ctypes" (cuLaunchKernel through ctypes)
BACKEND = "c"

_CU_LAUNCH_PARAM_END = 0
_CU_LAUNCH_PARAM_BUFFER_POINTER = 1
_CU_LAUNCH_PARAM_BUFFER_SIZE = 2

_lock = threading.RLock()
_modules: dict[tuple, dict[str, "Kernel"]] = {}
_keepalive: list[Any] = []


class _Driver:
    """The few driver entry points this module calls, on the libcuda PyCUDA already loaded."""

    def __init__(self) -> None:
        lib = libcuda.pydll()
        self.launch = libcuda.declare(lib, "cuLaunchKernel", None)   # the fastest call path
        self.load = libcuda.declare(lib, "cuModuleLoadData",
                                    [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p])
        self.get = libcuda.declare(lib, "cuModuleGetFunction",
                                   [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                    ctypes.c_char_p])
        self.check = libcuda.check
        #: cuLaunchKernel's address, for the C runtime's launch_kernel
        self.launch_address = ctypes.cast(self.launch, ctypes.c_void_p).value


@functools.cache
def _drv() -> _Driver:
    return _Driver()


def _backend() -> str:
    """BACKEND as it runs here: "c" is "pycuda" where the C runtime cannot be built."""
    if BACKEND == "c":
        return "c" if c_runtime.kernel_launcher() is not None else "pycuda"
    return BACKEND


class Kernel:
    """One kernel with a fixed argument format (``struct`` syntax, native alignment, which is
    the CUDA parameter layout).  ``kernel.launch(grid, block, *args)`` queues it on the
    context's stream; ``grid`` and ``block`` are 3-tuples."""

    def __init__(self, name: str, fmt: str, fn_handle: int | None, pycuda_fn: Any,
                 context: Any, launch_kernel: Callable[..., int] | None = None) -> None:
        self.name, self.fmt = name, fmt
        self._struct = struct.Struct("@" + fmt)
        self._buf = ctypes.create_string_buffer(max(self._struct.size, 8))
        self._size = ctypes.c_size_t(self._struct.size)
        self._extra = (ctypes.c_void_p * 5)(_CU_LAUNCH_PARAM_BUFFER_POINTER,
                                            ctypes.addressof(self._buf),
                                            _CU_LAUNCH_PARAM_BUFFER_SIZE,
                                            ctypes.addressof(self._size),
                                            _CU_LAUNCH_PARAM_END)
        self._fn = ctypes.c_void_p(fn_handle) if fn_handle else None
        self._stream_obj = context.stream
        self._stream = ctypes.c_void_p(int(context.stream_handle or 0))
        self._py = pycuda_fn
        #: the C runtime's launch_kernel (the "c" backend), or None
        self._c = launch_kernel if self._fn is not None else None

    def launch(self, grid: tuple, block: tuple, *args: Any) -> None:
        """Queue the kernel once (a hot path keeps ``fast_launcher()``'s closure instead)."""
        self.fast_launcher()(grid, block, *args)

    def fast_launcher(self) -> Callable[..., None]:
        """``launch(grid, block, *args)`` as a closure with every attribute lookup hoisted
        out, through the backend the kernel was loaded for: the C runtime's launch_kernel,
        ctypes' cuLaunchKernel (a function handle, no C runtime) or PyCUDA's."""
        if self._c is not None:
            c_launch, address, fn = self._c, _drv().launch_address, self._fn.value
            stream, pack, name = self._stream.value or 0, self._struct.pack, self.name

            def go_c(grid: tuple, block: tuple, *args: Any) -> None:
                status = c_launch(address, fn, grid[0], grid[1], grid[2], block[0], block[1],
                                  block[2], 0, stream, pack(*args))
                if status:
                    _drv().check(status, f"launching kernel {name} (grid {grid}, "
                                 f"block {block})")
            return go_c
        if self._fn is None:
            pack, launch_kernel, stream = self._struct.pack, self._py._launch_kernel, \
                self._stream_obj

            def go_pycuda(grid: tuple, block: tuple, *args: Any) -> None:
                launch_kernel(grid, block, pack(*args), 0, stream)
            return go_pycuda
        pack_into, buf, fn, stream, extra = (self._struct.pack_into, self._buf, self._fn,
                                             self._stream, self._extra)
        launch, name = _drv().launch, self.name

        def go(grid: tuple, block: tuple, *args: Any) -> None:
            pack_into(buf, 0, *args)
            status = launch(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0,
                            stream, None, extra)
            if status:
                _drv().check(status, f"launching kernel {name} (grid {grid}, block {block})")
        return go


def load_kernels(context: Any, key: Any, source_factory: Callable[[], str],
                 formats: dict[str, str], options: Sequence[str] = ()) -> dict[str, Kernel]:
    """The kernels ``formats`` (name -> argument format) of the module that ``key`` names,
    compiled on first use through the runtime's cache and loaded once per context."""
    backend = _backend()
    mkey = (key, tuple(options), config.nvcc.flags, id(context), backend)
    with _lock:
        got = _modules.get(mkey)
    if got is not None and all(n in got for n in formats):
        return got
    context.activate()
    kernels: dict[str, Kernel] = {}
    if backend in ("c", "ctypes"):
        launch_kernel = c_runtime.kernel_launcher() if backend == "c" else None
        source = source_factory()
        _, cubin, _ = compiler.compile_to_cubin(source, options, context.arch)
        drv = _drv()
        module = ctypes.c_void_p()
        drv.check(drv.load(ctypes.byref(module), cubin), "cuModuleLoadData")
        _keepalive.append(module)
        for name, fmt in formats.items():
            fn = ctypes.c_void_p()
            drv.check(drv.get(ctypes.byref(fn), module, name.encode()),
                      f"cuModuleGetFunction({name})")
            kernels[name] = Kernel(name, fmt, fn.value, None, context, launch_kernel)
    else:
        rendered: list[str] = []

        def source_once() -> str:
            # each kernel's memory miss asks for the source: render the module once, not
            # once per kernel (the warm path's cost is mostly rendering and hashing)
            if not rendered:
                rendered.append(source_factory())
            return rendered[0]
        for name, fmt in formats.items():
            # each kernel under a key of its own that names it (the module itself is loaded
            # once: get_kernel's memo holds one Function per key and name)
            fn = compiler.get_kernel((key, name), source_once, name, options, context)
            kernels[name] = Kernel(name, fmt, None, fn, context)
    with _lock:
        _modules[mkey] = kernels
    return kernels


def sm_count(context: Any) -> int:
    """Multiprocessors of the context's device (132 on an H100 SXM; assumed for virtual ones)."""
    dev = getattr(context, "pycuda_device", None)
    if dev is None:
        return 132
    cached = getattr(context, "_sg_sm_count", None)
    if cached is None:
        import pycuda.driver as drv
        cached = int(dev.get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT))
        try:
            context._sg_sm_count = cached
        except AttributeError:
            pass
    return cached


def clear_cache() -> None:
    """Forget loaded modules (tests)."""
    with _lock:
        _modules.clear()
