"""The CUDA-graph entry points of the driver API, through ctypes (PyCUDA has none): begin
and end a stream capture, instantiate, launch and destroy graphs.  Used by
symgpu/gpu/exec/graphs.py; loading it needs libcuda, nothing else.
"""
from __future__ import annotations

import ctypes
import functools
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from symgpu.gpu.runtime import graph_params, libcuda
from symgpu.gpu.runtime.array import get_many
from symgpu.gpu.runtime.gc_pause import pause_gc, resume_gc
from symgpu.link import c_runtime

__all__ = ["CudaGraphDriver"]

_CAPTURE_THREAD_LOCAL, _CAPTURE_RELAXED = 1, 2
_INSTANTIATE_AUTO_FREE_ON_LAUNCH = 1


class CudaGraphDriver:
    """The graph entry points of libcuda, through ctypes (handles are ``c_void_p``)."""

    def __init__(self) -> None:
        lib = libcuda.cdll()
        vp, P = ctypes.c_void_p, ctypes.POINTER
        sigs = {
            "cuStreamBeginCapture_v2": [vp, ctypes.c_int],
            "cuStreamEndCapture": [vp, P(vp)],
            "cuGraphInstantiateWithFlags": [P(vp), vp, ctypes.c_ulonglong],
            "cuGraphExecDestroy": [vp],
            "cuGraphDestroy": [vp],
            "cuThreadExchangeStreamCaptureMode": [P(ctypes.c_int)],
        }
        optional = {   # only for statistics and checks: absent, they are skipped
            "cuGraphGetNodes": [vp, vp, P(ctypes.c_size_t)],
            "cuStreamIsCapturing": [vp, P(ctypes.c_int)],
        }
        for name, args in sigs.items():
            libcuda.declare(lib, name, args)
        self.optional: dict[str, Any] = {}
        for name, args in optional.items():
            if hasattr(lib, name):
                self.optional[name] = libcuda.declare(lib, name, args)
        self.lib = lib
        # the replay call: PyDLL (the GIL stays held, no argument conversion: c_void_p in)
        self._launch = libcuda.declare(libcuda.pydll(), "cuGraphLaunch", None)
        self.error, self.check = libcuda.error_string, libcuda.check
        # a graph's parameter block (graph_params.py): pageable host memory, whose bytes the
        # driver has taken when the call returns; ordered on the stream before the launch
        self._htod = libcuda.declare(libcuda.pydll(), "cuMemcpyHtoDAsync_v2",
                                     [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t,
                                      ctypes.c_void_p])

    def begin(self, stream: int) -> None:
        """Begin capturing ``stream``, with Python's cyclic garbage collector paused until
        :meth:`end` (runtime/gc_pause.py says why)."""
        pause_gc()
        began = False
        try:
            self.check(self.lib.cuStreamBeginCapture_v2(ctypes.c_void_p(stream),
                                                         _CAPTURE_THREAD_LOCAL),
                       "cuStreamBeginCapture")
            began = True
        finally:
            if not began:
                resume_gc()

    def end(self, stream: int) -> tuple[Any, str | None]:
        """End the capture (always call it once begun): (graph or None, error or None)."""
        graph = ctypes.c_void_p()
        try:
            status = self.lib.cuStreamEndCapture(ctypes.c_void_p(stream), ctypes.byref(graph))
        finally:
            resume_gc()
        if status:
            if graph.value:
                self.lib.cuGraphDestroy(graph)
            return None, f"cuStreamEndCapture failed: {self.error(status)}"
        return graph, None

    def instantiate(self, graph: Any) -> Any:
        exe = ctypes.c_void_p()
        self.check(self.lib.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph,
                                                        _INSTANTIATE_AUTO_FREE_ON_LAUNCH),
                   "cuGraphInstantiateWithFlags")
        return exe

    def launcher(self, exe: Any, stream: int) -> Callable[[], int]:
        """A zero-argument replay call returning the CUresult (a partial: no Python frame
        of its own on the replay path): cuGraphLaunch through the C runtime's ``call_pp``
        where it can be built (a C call), else through ctypes (about 0.1 us more)."""
        call_pp = c_runtime.pointer_pair_caller()
        if call_pp is not None:
            address = ctypes.cast(self._launch, ctypes.c_void_p).value
            return functools.partial(call_pp, address, exe.value, stream)
        return functools.partial(self._launch, exe, ctypes.c_void_p(stream))

    def upload(self, ptr: int, data: bytes, stream: int) -> None:
        """Queue a copy of ``data`` to device address ``ptr`` on ``stream``."""
        status = self._htod(ptr, data, len(data), stream)
        if status:
            self.check(status, "cuMemcpyHtoDAsync (graph parameters)")

    @staticmethod
    def prepare_table(ctx: Any) -> None:
        """Load the table copy's kernel before a capture launches it (no module loads while
        a stream captures)."""
        graph_params.load_kernels(ctx, table=True)

    @staticmethod
    def copy_table(ctx: Any, table_ptr: int, entries: int, max_bytes: int) -> None:
        """Queue the copies a device table at ``table_ptr`` names when the launch runs
        (graph_params.table_copy): captured, one graph serves any pointers the table holds."""
        graph_params.table_copy(ctx, table_ptr, entries, max_bytes)

    def destroy(self, exe: Any, graph: Any) -> None:
        if exe is not None and exe.value:
            self.lib.cuGraphExecDestroy(exe)
        if graph is not None and graph.value:
            self.lib.cuGraphDestroy(graph)

    def node_count(self, graph: Any) -> int:
        """Nodes in a captured graph (-1 where the driver lacks cuGraphGetNodes)."""
        fn = self.optional.get("cuGraphGetNodes")
        if fn is None:
            return -1
        n = ctypes.c_size_t(0)
        self.check(fn(graph, None, ctypes.byref(n)), "cuGraphGetNodes")
        return int(n.value)

    def capturing(self, stream: int) -> bool:
        """Whether ``stream`` is capturing now (False where the driver cannot say)."""
        fn = self.optional.get("cuStreamIsCapturing")
        if fn is None:
            return False
        status = ctypes.c_int(0)
        self.check(fn(ctypes.c_void_p(stream), ctypes.byref(status)), "cuStreamIsCapturing")
        return status.value != 0

    @staticmethod
    def copy(dst: Any, src: Any) -> None:
        """``dst[...] = src`` on the stream (captured when the stream is capturing)."""
        dst._copy_from_device(src)

    @staticmethod
    def to_host(arrays: Sequence[Any]) -> list:
        """Host copies of GpuArrays (one sync)."""
        return get_many(arrays)

    @contextmanager
    def relaxed(self) -> Iterator[None]:
        """Let this thread make calls a capture forbids (cuMemAlloc from the pool)."""
        mode = ctypes.c_int(_CAPTURE_RELAXED)
        self.check(self.lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)),
                   "cuThreadExchangeStreamCaptureMode")
        try:
            yield
        finally:
            self.lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
