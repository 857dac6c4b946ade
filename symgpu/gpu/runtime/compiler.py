"""CUDA source -> cubin -> loaded module, with a persistent kernel cache of our own.

Why our own cache: PyCUDA's ``SourceModule`` runs nvcc's preprocessor on every start just to
compute its cache key (about 0.2 s a module).  Here a warm start reads a cubin from disk and
loads it with ``module_from_buffer``: no compiler run at all.

Two levels:

* in memory, :func:`get_kernel` (and :func:`get_prepared_kernel`, the same Function prepared
  for ``prepared_async_call``) is keyed on the *caller's* signature key (op, dtypes, ndim,
  contiguity ...) plus the device, so hot paths never build or hash kernel source;
* on disk, under ``config.compiledir``, entries are keyed on sha256 of (source, options, arch,
  nvcc version, symgpu version).  A cubin is written through a temp file and ``os.replace``;
  a sidecar holds its sha256, checked before loading; an entry that fails the check or does
  not load is recompiled.  A ``filelock.FileLock`` per entry makes concurrent processes compile
  a kernel once.  Nothing is pickled.  The directory must be private (mode 0700, ours).

Compiling needs only ``nvcc`` (CI compiles every kernel without a GPU); loading needs PyCUDA
and an active context.
"""
from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import json
import os
import shlex
import shutil
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any, Callable, Sequence

from symgpu.config import config
from symgpu.gpu.runtime import context as gpu_context
from symgpu.gpu.runtime.libcuda import driver_errors
from symgpu.link.diskcache import build_once, private_dir as _private_dir, run_compiler

__all__ = [
    "RENDER_ERRORS",
    "CompileError", "compile_to_cubin", "compile_module", "load_module", "get_kernel",
    "get_prepared_kernel", "cache_key", "nvcc_version", "kernel_cache_dir", "clear_memory_cache",
    "is_cached", "STATS", "compile_in_background", "PreparedKernel",
]

#: what asking a node for its kernels raises for a node that cannot have them: a dtype or
#: scalar op with no CUDA rendering, a context not registered here; its own thunk raises it
#: again with the node described.  Anything else is a bug and propagates (the link hook's
#: failure is then a RuntimeWarning from symgpu.link.vm); gpu/exec/prefetch.py asks
RENDER_ERRORS = (TypeError, ValueError, LookupError, NotImplementedError)

CACHE_FORMAT = 1  # bump when the on-disk layout changes


class CompileError(RuntimeError):
    """nvcc failed.  ``stderr`` holds its messages, ``source_path`` the kept ``.cu`` file."""

    def __init__(self, message: str, stderr: str = "", source_path: str | None = None,
                 command: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.stderr, self.source_path, self.command = stderr, source_path, list(command)


# --------------------------------------------------------------------------- helpers
# Thread safety: symgpu/gpu/exec/prefetch.py compiles a function's kernels from a thread pool, so
# every module-level dict below is written under ``_lock``, and one compile per digest runs
# at a time in this process (``_digest_lock``; the per-entry file lock does it across
# processes).
_lock = threading.RLock()
_nvcc_version: str | None = None
_cubin_memo: dict[str, tuple[str, bytes]] = {}          # digest -> (path, cubin)
_kernels: dict[tuple, Any] = {}                         # (key, options, flags, ctx) -> Function
_prepared: dict[tuple, tuple[str, Any]] = {}            # the same key -> (signature, Function)
_modules: dict[tuple[str, int], Any] = {}               # (digest, id(ctx)) -> module
_digest_locks: dict[str, threading.Lock] = {}           # digest -> held while compiling it
_in_flight: dict[str, concurrent.futures.Future] = {}   # digest -> its background compile
#: process-wide nvcc counters, 'runs', 'seconds' (summed over threads) and 'longest' (one
#: run): cold-compile benchmarks report them per phase (function(), first call)
STATS: Counter = Counter()


@functools.cache
def _nvcc_flags() -> Any:
    """The live record of ``nvcc.flags`` (its ``.value``: part of every in-memory kernel key)."""
    return config.live("nvcc.flags")


def _log(message: str) -> None:
    if config.compile_log:
        print(f"symgpu.gpu.runtime.compiler: {message}", file=sys.stderr)


def _symgpu_version() -> str:
    pkg = sys.modules.get("symgpu")
    version = getattr(pkg, "__version__", None)
    if version:
        return str(version)
    from importlib.metadata import PackageNotFoundError, version as dist_version
    try:
        return dist_version("symgpu")
    except PackageNotFoundError:  # not installed: a source checkout
        return "0+source"


def _nvcc() -> str:
    path = shutil.which("nvcc")
    if path is None:
        raise CompileError("nvcc was not found on PATH: install the CUDA toolkit or add its bin/ "
                           "directory to PATH to compile GPU kernels")
    return path


def nvcc_version() -> str:
    """``nvcc --version`` output (memoised per process); part of every disk-cache key."""
    global _nvcc_version
    if _nvcc_version is None:
        with _lock:   # once, even when a thread pool asks first
            if _nvcc_version is None:
                out = subprocess.run([_nvcc(), "--version"], capture_output=True, text=True,
                                     check=False)
                if out.returncode != 0:
                    raise CompileError(f"`nvcc --version` failed: {out.stderr.strip()}",
                                       out.stderr)
                _nvcc_version = out.stdout.strip()
    return _nvcc_version


def _all_options(options: Sequence[str]) -> list[str]:
    """Caller options followed by ``config.nvcc.flags`` (split like a shell would)."""
    return [*options, *shlex.split(config.nvcc.flags or "")]


def cache_key(source: str, options: Sequence[str] = (), arch: str = "sm_90") -> str:
    """sha256 hex digest naming a disk-cache entry (``options`` already include nvcc.flags)."""
    blob = json.dumps({"format": CACHE_FORMAT, "source": source, "options": list(options),
                       "arch": arch, "nvcc": nvcc_version(), "symgpu": _symgpu_version()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def kernel_cache_dir(root: str | None = None) -> str:
    """``<compiledir>/kernels`` (or ``<root>/kernels``), created and checked (0700, owned by
    us) on first use."""
    root = config.compiledir if root is None else root
    if not root:
        raise PermissionError("the compiledir flag is empty: set it to a private directory")
    _private_dir(root)
    return _private_dir(os.path.join(root, "kernels"))


def _entry_paths(digest: str, root: str | None = None) -> tuple[str, str, str]:
    sub = _private_dir(os.path.join(kernel_cache_dir(root), digest[:2]))
    base = os.path.join(sub, digest)
    return base + ".cubin", base + ".cubin.sha256", base + ".lock"


def _run_nvcc(source: str, options: Sequence[str], arch: str, digest: str) -> bytes:
    """Compile in a private temp dir; on failure keep the ``.cu`` and raise CompileError."""
    def failure(code: int, stderr: str, kept: str, cmd: Sequence[str]) -> CompileError:
        return CompileError(f"nvcc failed (exit {code}) compiling a kernel for {arch}; "
                            f"source kept at {kept}\ncommand: {shlex.join(cmd)}\n{stderr}",
                            stderr, kept, cmd)
    t0 = time.perf_counter()
    try:
        return run_compiler(kernel_cache_dir(), digest[:16], source, (".cu", ".cubin"),
                            lambda src, out: [_nvcc(), "-cubin", f"-arch={arch}", *options,
                                              "-o", out, src], failure)
    finally:
        took = time.perf_counter() - t0
        with _lock:
            STATS["runs"] += 1
            STATS["seconds"] += took
            STATS["longest"] = max(STATS["longest"], took)


def _digest_lock(digest: str) -> threading.Lock:
    """The in-process lock of one cache entry: threads compiling the same source wait for the
    first instead of polling its file lock."""
    with _lock:
        lock = _digest_locks.get(digest)
        if lock is None:
            lock = _digest_locks[digest] = threading.Lock()
    return lock


# --------------------------------------------------------------------------- public API
def compile_to_cubin(source: str, options: Sequence[str] = (),
                     arch: str = "sm_90") -> tuple[str, bytes, bool]:
    """Return ``(cubin_path, cubin_bytes, hit)`` for ``source``; needs nvcc, not PyCUDA.

    ``hit`` is True when the disk cache (or this process's memo of it) already had the entry.
    ``config.nvcc.flags`` is appended to ``options``.  Safe to call from several threads: a
    source is compiled once, the other callers get the result."""
    opts = _all_options(options)
    digest = cache_key(source, opts, arch)
    with _lock:
        flight = _in_flight.get(digest)
    if flight is not None:   # started by compile_in_background: its result, or our own error
        concurrent.futures.wait([flight])
    return _compile_digest(source, opts, arch, digest)


def _compile_digest(source: str, opts: list[str], arch: str, digest: str,
                    root: str | None = None) -> tuple[str, bytes, bool]:
    """compile_to_cubin once the digest is known: memory, then disk (under ``root``, default
    the compiledir flag's), then nvcc."""
    with _lock:
        memo = _cubin_memo.get(digest)
    if memo is not None:
        _log(f"hit (memory) {digest[:16]}")
        return memo[0], memo[1], True
    with _digest_lock(digest):
        with _lock:
            memo = _cubin_memo.get(digest)   # another thread may have just finished it
        if memo is not None:
            _log(f"hit (memory) {digest[:16]}")
            return memo[0], memo[1], True
        return _compile_entry(source, opts, arch, digest, root)


def compile_in_background(source: str, options: Sequence[str], arch: str,
                          executor: concurrent.futures.Executor) -> concurrent.futures.Future:
    """Start compiling ``source`` on ``executor`` and return at once (the link-time prefetch,
    symgpu/gpu/exec/prefetch.py).  A :func:`compile_to_cubin` of the same source meanwhile waits
    for it instead of running nvcc itself; if it failed, that call compiles again and raises
    the error for its node.  One future per source while it runs."""
    opts = _all_options(options)
    digest = cache_key(source, opts, arch)
    with _lock:
        flight = _in_flight.get(digest)
        if flight is None:
            # the compiledir of now: the flag may change before the thread gets to it
            flight = _in_flight[digest] = executor.submit(_compile_digest, source, opts, arch,
                                                          digest, config.compiledir)
    flight.add_done_callback(lambda done: _landed(digest, done))
    return flight


def _landed(digest: str, done: concurrent.futures.Future) -> None:
    with _lock:
        if _in_flight.get(digest) is done:
            del _in_flight[digest]


def _compile_entry(source: str, opts: list[str], arch: str, digest: str,
                   root: str | None = None) -> tuple[str, bytes, bool]:
    """compile_to_cubin's disk part: read the entry, else compile it under its file lock."""
    cubin_path, _, _ = _entry_paths(digest, root)

    data, hit, why = build_once(cubin_path, lambda: _run_nvcc(source, opts, arch, digest))
    _log(f"hit (disk) {digest[:16]}" if hit
         else f"miss ({why}) {digest[:16]}: compiled for {arch} with {opts}")
    with _lock:
        _cubin_memo[digest] = (cubin_path, data)
    return cubin_path, data, hit


def is_cached(source: str, options: Sequence[str] = (), arch: str = "sm_90") -> bool:
    """Whether :func:`compile_to_cubin` would find ``source`` without running nvcc (this
    process's memo, or a disk entry present; its checksum is checked only when loaded).

    The prefetch (symgpu/gpu/exec/prefetch.py) asks this to send only misses to its thread pool."""
    digest = cache_key(source, _all_options(options), arch)
    with _lock:
        if digest in _cubin_memo:
            return True
    cubin_path, sum_path, _ = _entry_paths(digest)
    return os.path.exists(cubin_path) and os.path.exists(sum_path)


def _forget(digest: str, cubin_path: str) -> None:
    """Drop a cache entry that failed to load so the next compile rebuilds it."""
    with _lock:
        _cubin_memo.pop(digest, None)
    for path in (cubin_path, cubin_path + ".sha256"):
        try:
            os.unlink(path)
        except OSError:
            pass


def load_module(cubin: bytes, context: Any = None) -> Any:
    """Load cubin bytes into ``context`` (default: the default GPU context) via PyCUDA."""
    ctx = context if context is not None else gpu_context.get_context(None)
    ctx.activate()
    import pycuda.driver as drv
    return drv.module_from_buffer(cubin)


def compile_module(source: str, options: Sequence[str] = (), arch: str | None = None,
                   context: Any = None) -> Any:
    """Compile (or fetch from cache) and load ``source``; returns a PyCUDA module.

    ``arch`` defaults to the context's (``sm_90`` on Hopper).  An entry that fails to load is
    recompiled once.  Use :func:`get_kernel` on hot paths: this hashes the source."""
    ctx = context if context is not None else gpu_context.get_context(None)
    arch = arch or ctx.arch
    digest = cache_key(source, _all_options(options), arch)
    with _lock:
        module = _modules.get((digest, id(ctx)))
    if module is not None:
        _log(f"hit (memory, loaded) {digest[:16]}")
        return module
    for attempt in (0, 1):
        path, cubin, _ = compile_to_cubin(source, options, arch)
        try:
            module = load_module(cubin, ctx)
            break
        except driver_errors() as exc:   # the driver refused the image (a damaged entry)
            if attempt:
                raise
            _log(f"entry {digest[:16]} did not load ({exc}); recompiling")
            _forget(digest, path)
    with _lock:
        _modules[(digest, id(ctx))] = module
    return module


def get_kernel(key: Any, source_factory: Callable[[], str], fn_name: str,
               options: Sequence[str] = (), context: Any = None,
               arch: str | None = None) -> Any:
    """The PyCUDA ``Function`` ``fn_name`` for the caller's hashable ``key`` on ``context``.

    ``source_factory`` is called only on a memory miss, so the hot path costs one dict lookup.
    ``key`` must determine the source (op signature, dtypes, ndim, contiguity ...).  ``arch``
    overrides the context's nvcc target (``sm_90a`` for modules with Hopper-only code); the
    key must then determine it too."""
    ctx = context
    if ctx is None:
        ctx = gpu_context.get_context(None)
    mkey = (key, fn_name, tuple(options), _nvcc_flags().value, id(ctx))
    fn = _kernels.get(mkey)
    if fn is not None:
        return fn
    module = compile_module(source_factory(), options, arch or ctx.arch, ctx)
    fn = module.get_function(fn_name)
    with _lock:
        _kernels[mkey] = fn
    return fn


def get_prepared_kernel(key: Any, source_factory: Callable[[], str], fn_name: str,
                        signature: str, options: Sequence[str] = (), context: Any = None,
                        arch: str | None = None) -> Any:
    """:func:`get_kernel`'s Function with ``.prepare(signature)`` done, for
    ``prepared_async_call`` (wrapped: :class:`PreparedKernel` launches with less Python per
    call).

    One memo for every module's prepared kernels, under get_kernel's key: a kernel is prepared
    once per (key, name, options, nvcc flags, context), a change of ``nvcc.flags`` gets the new
    build and :func:`clear_memory_cache` forgets it.  The Function is get_kernel's own object,
    so a kernel has one signature: asking for it with another raises ValueError."""
    if context is None:
        context = gpu_context.get_context(None)
    mkey = (key, fn_name, tuple(options), _nvcc_flags().value, id(context))
    got = _prepared.get(mkey)
    if got is None:
        fn = get_kernel(key, source_factory, fn_name, options, context, arch)
        with _lock:
            got = _prepared.get(mkey)   # another thread may have just prepared it
            if got is None:
                fn.prepare(signature)
                got = _prepared[mkey] = (signature, PreparedKernel(fn, signature))
    if got[0] != signature:
        raise ValueError(f"kernel {fn_name} of {key!r} is prepared as {got[0]!r}, "
                         f"not {signature!r}")
    return got[1]


class PreparedKernel:
    """A prepared PyCUDA Function (compiler.get_prepared_kernel's) whose
    ``prepared_async_call`` skips PyCUDA's per-call Python (about 5 us: the block-shape call,
    an import, the format parsed again, the texref loop): the arguments are packed by a
    ``struct.Struct`` made once (native alignment, as PyCUDA's packer) and go straight to
    ``Function._launch_kernel``, the call PyCUDA's ends in.  An argument only PyCUDA's
    packer takes goes its way; every other attribute is the Function's."""

    __slots__ = ("function", "prepared_async_call")

    def __init__(self, function: Any, signature: str) -> None:
        self.function = function
        launch_kernel = getattr(function, "_launch_kernel", None)
        if launch_kernel is None or getattr(function, "texrefs", None):
            return     # the Function's own prepared_async_call serves (through __getattr__)
        try:
            pack = struct.Struct(signature).pack
        except struct.error:
            return
        slow = function.prepared_async_call

        def prepared_async_call(grid: tuple, block: tuple, stream: Any, *args: Any) -> None:
            try:
                buf = pack(*args)
            except struct.error:
                slow(grid, block, stream, *args)
                return
            launch_kernel(grid, block, buf, 0, stream)
        self.prepared_async_call = prepared_async_call

    def __getattr__(self, name: str) -> Any:
        return getattr(self.function, name)


def clear_memory_cache() -> None:
    """Forget in-process caches (disk entries stay); tests use it to force disk lookups.
    Background compiles (compile_in_background) finish first."""
    with _lock:
        flights = list(_in_flight.values())
    concurrent.futures.wait(flights)
    with _lock:
        _cubin_memo.clear()
        _kernels.clear()
        _prepared.clear()
        _modules.clear()
