"""C source -> shared library for the CPU kernels, cached under ``<compiledir>/cpu``.

Why C on the CPU at all: NumPy runs a fused elementwise chain as one ufunc call and one
temporary per step, about half a microsecond each before any arithmetic. On the small
arrays of a training step that dispatch is most of the time; one compiled loop does the
whole chain in one pass, vectorised (glibc's libmvec gives SIMD exp/log/...).

The compiler is the ``cxx`` flag (default: ``cc`` on PATH; empty: no C, NumPy only).
Libraries are built for this machine's CPU (``-march=native``), so the cache key holds the
compiler's identity and the CPU's model and feature flags as well as the source. Disk
entries are the shared ``symgpu.link.diskcache`` entries (private directory, checksums,
one build across processes).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import threading
from functools import cache
from typing import Sequence

from symgpu.config import config
from symgpu.link.diskcache import build_once, cache_subdir, private_dir, run_compiler

__all__ = ["CCompileError", "compiler", "build_library", "is_built", "load_library",
           "kernel_address", "OPTIMIZE_FLAGS"]

CACHE_FORMAT = 1  # bump when the layout or the flags' meaning changes

#: IEEE-faithful optimisation: no errno (lets loops vectorise), no fused multiply-add (NumPy
#: rounds a*b and then +c), wrapping signed integers (NumPy's), `omp simd` loops
OPTIMIZE_FLAGS = ("-O3", "-march=native", "-fPIC", "-fno-math-errno", "-ffp-contract=off",
                  "-fwrapv", "-fno-strict-aliasing", "-fopenmp-simd")

_lock = threading.RLock()
_libraries: dict[str, ctypes.CDLL] = {}
_building: dict[str, threading.Lock] = {}


class CCompileError(RuntimeError):
    """The C compiler failed: ``stderr`` holds its messages, ``source_path`` the kept file."""

    def __init__(self, message: str, stderr: str = "", source_path: str | None = None) -> None:
        super().__init__(message)
        self.stderr, self.source_path = stderr, source_path


def compiler() -> str | None:
    """The C compiler's path, or None when the ``cxx`` flag is empty or names nothing."""
    name = config.cxx
    return shutil.which(name) if name else None


@cache
def _identity(cc: str) -> str:
    """What makes a built library valid here: compiler version and target, CPU features."""
    out = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
    target = subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True, check=False)
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpu = "".join(sorted({line for line in f
                                  if line.startswith(("model name", "flags", "Features"))}))
    except OSError:
        cpu = platform.processor()
    return "\n".join([out.stdout.splitlines()[0] if out.stdout else cc, target.stdout.strip(),
                      hashlib.sha256(cpu.encode()).hexdigest()])


@cache
def has_libmvec() -> bool:
    """glibc's vector math library (x86-64): SIMD exp, log, log1p... for `omp simd` loops."""
    return platform.machine() in ("x86_64", "AMD64") and ctypes.util.find_library("mvec") is not None


def _run(cc: str, source: str, flags: Sequence[str], libs: Sequence[str], digest: str) -> bytes:
    """Compile the shared library; on failure keep the source and raise CCompileError."""
    def failure(code: int, stderr: str, kept: str, cmd: Sequence[str]) -> CCompileError:
        return CCompileError(f"the C compiler failed (exit {code}); source kept at {kept}\n"
                             f"command: {shlex.join(cmd)}\n{stderr}", stderr, kept)
    # libraries after the source, or the linker drops them
    return run_compiler(cache_subdir("cpu"), digest[:16], source, (".c", ".so"),
                        lambda src, out: [cc, *flags, "-shared", "-o", out, src,
                                          *[f"-l{lib}" for lib in libs]], failure)


def _entry(cc: str, source: str, flags: Sequence[str], libs: Sequence[str]) -> tuple[str, str]:
    """(digest, library path) of a cache entry."""
    blob = json.dumps({"format": CACHE_FORMAT, "source": source, "flags": list(flags),
                       "libs": list(libs), "compiler": _identity(cc)}, sort_keys=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()
    return digest, os.path.join(cache_subdir("cpu"), digest[:2], digest + ".so")


def _digest_lock(digest: str) -> threading.Lock:
    """One build per entry at a time in this process (the file lock does it across them)."""
    with _lock:
        return _building.setdefault(digest, threading.Lock())


def build_library(source: str, flags: Sequence[str] = OPTIMIZE_FLAGS,
                  libs: Sequence[str] = ()) -> str:
    """The path of ``source`` built as a shared library (from the cache when it is there).
    Threads may build different sources at once (symgpu.tensor.c_elemwise.prefetch)."""
    cc = compiler()
    if cc is None:
        raise CCompileError("no C compiler: the cxx flag is empty or names no program on PATH")
    digest, path = _entry(cc, source, flags, libs)
    private_dir(os.path.dirname(path))
    with _digest_lock(digest):
        build_once(path, lambda: _run(cc, source, flags, libs, digest))
    return path


def is_built(source: str, flags: Sequence[str] = OPTIMIZE_FLAGS,
             libs: Sequence[str] = ()) -> bool:
    """Whether `build_library` would find ``source`` in the cache without compiling."""
    cc = compiler()
    if cc is None:
        return False
    _, path = _entry(cc, source, flags, libs)
    return os.path.exists(path) and os.path.exists(path + ".sha256")


def load_library(source: str, flags: Sequence[str] = OPTIMIZE_FLAGS,
                 libs: Sequence[str] = ()) -> ctypes.CDLL:
    """``source`` built and loaded (once per process)."""
    key = hashlib.sha256(json.dumps([source, list(flags), list(libs)]).encode()).hexdigest()
    with _lock:
        lib = _libraries.get(key)
    if lib is None:
        path = build_library(source, flags, libs)
        with _lock:
            lib = _libraries.setdefault(key, ctypes.CDLL(path))
    return lib


def kernel_address(source: str, symbol: str, flags: Sequence[str] = OPTIMIZE_FLAGS,
                   libs: Sequence[str] = ()) -> int:
    """The address of function ``symbol`` in ``source``'s library, for the C runtime."""
    lib = load_library(source, flags, libs)
    return ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value
