"""CUDA source -> host shared library (``nvcc -shared``) -> ``ctypes.CDLL``, cached.

Why: NVIDIA's device-wide algorithms (CUB's radix and segmented sorts) are templates whose
host side chooses the kernels and launches them; they cannot be a cubin launched from Python.
A small ``.so`` with ``extern "C"`` entry points wraps them; it uses the CUDA runtime, which
works on the device's primary context, the one symgpu's driver-API contexts are.

Entries live in the private disk cache of compiler.py (``<compiledir>/kernels``), keyed on
sha256 of (source, options, arch, nvcc version, symgpu version) like cubins, written through
``link/diskcache.build_once`` (file lock, checksum sidecar).  Compiling needs only nvcc; a
library is loaded once per process (ctypes keeps it mapped).
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import os
import shlex
import threading
from typing import Sequence

from symgpu.config import config
from symgpu.gpu.runtime import compiler
from symgpu.link.diskcache import build_once, private_dir, run_compiler

__all__ = ["compile_shared_library", "shared_library_path", "load_shared_library",
           "shared_library_in_background"]

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}
_paths: dict[str, str] = {}
_in_flight: dict[str, concurrent.futures.Future] = {}


def _digest(source: str, options: Sequence[str], arch: str) -> str:
    return compiler.cache_key(source, ["-shared", *options], arch)


def _build(source: str, options: Sequence[str], arch: str, digest: str, root: str) -> bytes:
    def failure(code: int, stderr: str, kept: str, cmd: Sequence[str]) -> Exception:
        return compiler.CompileError(
            f"nvcc failed (exit {code}) building a shared library for {arch}; source kept "
            f"at {kept}\ncommand: {shlex.join(cmd)}\n{stderr}", stderr, kept, cmd)
    return run_compiler(root, digest[:16], source, (".cu", ".so"),
                        lambda src, out: [compiler._nvcc(), "-shared", "-Xcompiler", "-fPIC",
                                          f"-arch={arch}", *options, "-o", out, src], failure)


def compile_shared_library(source: str, options: Sequence[str] = (),
                           arch: str = "sm_90", root: str | None = None) -> str:
    """The path of the cached shared library built from ``source`` (nvcc runs on a miss);
    needs nvcc, not a GPU. ``config.nvcc.flags`` is not added: the flags are for kernels."""
    opts = list(options)
    digest = _digest(source, opts, arch)
    with _lock:
        path = _paths.get(digest)
    if path is not None:
        return path
    cache = compiler.kernel_cache_dir(root)
    path = os.path.join(private_dir(os.path.join(cache, digest[:2])), digest + ".so")
    build_once(path, lambda: _build(source, opts, arch, digest, cache))
    with _lock:
        _paths[digest] = path
    return path


def shared_library_path(source: str, options: Sequence[str] = (), arch: str = "sm_90") -> str:
    """compile_shared_library, waiting first for a background build of the same source."""
    digest = _digest(source, list(options), arch)
    with _lock:
        flight = _in_flight.get(digest)
    if flight is not None:
        concurrent.futures.wait([flight])
    return compile_shared_library(source, options, arch)


def load_shared_library(source: str, options: Sequence[str] = (),
                        arch: str = "sm_90") -> ctypes.CDLL:
    """The loaded library (built or read from the cache on first use; one per process)."""
    path = shared_library_path(source, options, arch)
    with _lock:
        lib = _loaded.get(path)
        if lib is None:
            lib = _loaded[path] = ctypes.CDLL(path)
    return lib


def shared_library_in_background(source: str, options: Sequence[str], arch: str,
                                 executor: concurrent.futures.Executor
                                 ) -> concurrent.futures.Future:
    """Start building the library on ``executor`` (the link-time prefetch); a later load of
    the same source waits for it."""
    digest = _digest(source, list(options), arch)
    with _lock:
        flight = _in_flight.get(digest)
        if flight is None:
            flight = _in_flight[digest] = executor.submit(
                compile_shared_library, source, options, arch, config.compiledir)

    def landed(done: concurrent.futures.Future) -> None:
        with _lock:
            if _in_flight.get(digest) is done:
                del _in_flight[digest]
    flight.add_done_callback(landed)
    return flight
