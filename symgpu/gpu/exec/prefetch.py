"""Compile a function's kernels in parallel before the linker makes its thunks (issue 7).

Why: each GPU node compiles (or fetches) its kernel modules while the linker makes its thunk,
so a cold compile ran nvcc once per module, one after another (the logistic-regression step:
three modules, about 1 s of nvcc each).  nvcc is a subprocess, so threads suffice.  Before
any thunk is made, a link hook (``symgpu.link.vm.LINK_HOOKS``) asks every op that generates
code for the modules its node will load and starts compiling the cache misses on background
threads, at most one nvcc per CPU, into the compile cache (``compiler.compile_in_background``),
each as soon as its node has rendered it.  The hook returns at once: the rest of linking (the
host compilers' hooks, loop bodies, thunks that load no kernel) overlaps with nvcc, and a
thunk that loads a module waits for that module only (``compiler.compile_to_cubin`` waits for
a compile in flight instead of starting its own).  A module only needed later (a graph
parameter's kernel at the first capture) may still be compiling when ``function()``
returns.  ``prefetch()`` (benchmarks, tests) waits for its batch.

The protocol, optional on any GPU op::

    op.prefetch_sources(node) -> [(key, source_factory, nvcc_options[, arch]), ...]

``key`` is the in-memory key the node's thunk uses for that module (``get_kernel`` /
``load_kernels``): the first request of a key in run order wins, as in those caches, and a
key this process already prefetched is not rendered again.  ``source_factory()`` renders the
source exactly as the thunk will.

Errors are not raised here: a module that fails to compile is left to the node, whose own
compile raises the usual ``CompileError`` (nvcc's message, the kept ``.cu``) for that node.
Nodes on virtual contexts are skipped (their thunks compile nothing).  No PyCUDA is imported.
"""
from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from typing import Any, Callable, Hashable, Iterable, Iterator, NamedTuple, Sequence

from symgpu.config import config
from symgpu.gpu.placement.basic_ops import maybe_strided
from symgpu.gpu.runtime import compiler, context as gpu_context
from symgpu.gpu.runtime.compiler import RENDER_ERRORS
from symgpu.graph.basic import Apply
from symgpu.link import vm

__all__ = ["KernelRequest", "PrefetchResult", "requests", "iter_requests", "compile_requests",
           "start_requests", "prefetch", "clear", "maybe_strided"]


class KernelRequest(NamedTuple):
    """One module a node will load: its thunk's key, its source, nvcc options and arch."""
    key: Hashable
    source: str
    options: tuple[str, ...]
    arch: str


class PrefetchResult(NamedTuple):
    """What a prefetch did: modules asked for, found cached, compiled, and the failures
    (left for the nodes to raise), with the workers used and the seconds spent."""
    requested: int
    cached: int
    compiled: int
    failed: list[tuple[KernelRequest, BaseException]]
    workers: int
    seconds: float


_lock = threading.Lock()
_seen: set[tuple] = set()     # (key, options, nvcc.flags, arch, compiledir) already in cache


def clear() -> None:
    """Forget which keys were prefetched (tests)."""
    with _lock:
        _seen.clear()


def _cpu_count() -> int:
    """CPUs this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _node_context(node: Apply) -> Any:
    """The GPU context of ``node``'s first GPU-typed output or input (None: no GPU type)."""
    for var in (*node.outputs, *node.inputs):
        name = getattr(var.type, "context_name", _NO_CONTEXT)
        if name is not _NO_CONTEXT:
            return gpu_context.get_context(name)
    return None


_NO_CONTEXT = object()


def _seen_key(key: Hashable, options: tuple[str, ...], arch: str) -> tuple:
    return (key, options, config.nvcc.flags, arch, config.compiledir)


def requests(nodes: Sequence[Apply], include_virtual: bool = False,
             skip_seen: bool = True) -> list[KernelRequest]:
    """The modules ``nodes`` will load, once per (key, options, arch), in run order.

    ``include_virtual`` also collects nodes on virtual contexts (benchmarks and tests
    render a device=cuda graph on a machine without a GPU); ``skip_seen`` leaves out keys
    this process already prefetched (without rendering them)."""
    return list(iter_requests(nodes, include_virtual, skip_seen))


def iter_requests(nodes: Sequence[Apply], include_virtual: bool = False,
                  skip_seen: bool = True) -> Iterator[KernelRequest]:
    """:func:`requests` one at a time, each as soon as its node has rendered it (so the
    link hook starts compiling the first modules while later nodes, such as a loop whose
    body is rewritten first, are still being asked)."""
    taken: set[tuple] = set()
    for node in nodes:
        ask: Callable[[Apply], Sequence[tuple]] | None = getattr(node.op, "prefetch_sources",
                                                                None)
        if ask is None:
            continue
        try:
            ctx = _node_context(node)
            if ctx is None or (ctx.virtual and not include_virtual):
                continue
            for key, factory, options, *target in ask(node):
                options = tuple(options)
                arch = (target[0] if target else None) or ctx.arch
                ident = (key, options, arch)
                if ident in taken:
                    continue
                taken.add(ident)
                if skip_seen:
                    with _lock:
                        if _seen_key(key, options, arch) in _seen:
                            continue
                yield KernelRequest(key, factory(), options, arch)
        except RENDER_ERRORS:  # the node's own thunk reports what is wrong with it
            continue




def compile_requests(reqs: Sequence[KernelRequest],
                     max_workers: int | None = None) -> PrefetchResult:
    """Compile the cache misses among ``reqs`` concurrently (``max_workers`` threads, default
    one per CPU); failures are returned, not raised."""
    t0 = time.perf_counter()
    misses, cached = [], 0
    for r in reqs:
        if compiler.is_cached(r.source, r.options, r.arch):
            cached += 1
            _remember(r)
        else:
            misses.append(r)
    failed: list[tuple[KernelRequest, BaseException]] = []
    workers = min(len(misses), max_workers or _cpu_count())
    if misses:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(workers, 1),
                                                   thread_name_prefix="symgpu-nvcc") as pool:
            futures = [(r, pool.submit(compiler.compile_to_cubin, r.source, r.options, r.arch))
                       for r in misses]
            for r, fut in futures:
                exc = fut.exception()
                if exc is None:
                    _remember(r)
                else:
                    failed.append((r, exc))
    result = PrefetchResult(len(reqs), cached, len(misses) - len(failed), failed, workers,
                            time.perf_counter() - t0)
    if misses:
        compiler._log(f"prefetch: {result.requested} modules, {cached} cached, compiled "
                      f"{result.compiled} on {workers} threads in {result.seconds:.2f} s"
                      + (f", {len(failed)} failed (left to their nodes)" if failed else ""))
    return result


_executor: concurrent.futures.ThreadPoolExecutor | None = None


def _background() -> concurrent.futures.ThreadPoolExecutor:
    """The process's nvcc threads for background compiles, one per CPU, made on first use."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=_cpu_count(), thread_name_prefix="symgpu-nvcc")
        return _executor


def start_requests(reqs: Iterable[KernelRequest]) -> PrefetchResult:
    """Start compiling the cache misses among ``reqs`` on the background nvcc threads, each
    as soon as the iterable yields it, and return without waiting: ``compiled`` counts the
    compiles started.  A thunk that needs one of them waits for it in
    ``compiler.compile_to_cubin``; a failure is compiled again there and raised for its
    node."""
    t0 = time.perf_counter()
    pool = _background()
    requested = cached = started = 0
    for r in reqs:
        requested += 1
        if compiler.is_cached(r.source, r.options, r.arch):
            cached += 1
        else:
            compiler.compile_in_background(r.source, r.options, r.arch, pool)
            started += 1
        _remember(r)
    result = PrefetchResult(requested, cached, started, [], min(started, _cpu_count()),
                            time.perf_counter() - t0)
    if started:
        compiler._log(f"prefetch: {requested} modules, {cached} cached, started {started} "
                      f"in the background ({result.workers} threads)")
    return result


def _remember(r: KernelRequest) -> None:
    with _lock:
        _seen.add(_seen_key(r.key, r.options, r.arch))


def prefetch(nodes: Sequence[Apply], include_virtual: bool = False,
             max_workers: int | None = None, wait: bool = True) -> PrefetchResult:
    """Compile, in parallel, every module ``nodes`` will load that the cache lacks; with
    ``wait`` False only start them (:func:`start_requests`, the background threads)."""
    if not wait:
        return start_requests(iter_requests(nodes, include_virtual))
    return compile_requests(requests(nodes, include_virtual), max_workers)


def _link_hook(fgraph: Any, nodes: list[Apply]) -> None:
    """``LINK_HOOKS`` entry: start compiling a GPU function's kernels; a no-op for other
    graphs.  It does not wait: linking goes on (the other hooks' host compilers, the loop
    bodies' links, thunks of nodes that load no kernel) while nvcc runs, and each thunk
    that loads a module waits for that one only."""
    if not any(hasattr(n.op, "prefetch_sources") for n in nodes):
        return
    try:
        prefetch(nodes, wait=False)
    except (OSError, ValueError, compiler.CompileError) as exc:
        # nvcc missing, the compiledir refused, bad nvcc.flags: the nodes will say so
        compiler._log(f"prefetch skipped ({type(exc).__name__}: {exc})")


def _register() -> None:
    hooks = getattr(vm, "LINK_HOOKS", None)
    if hooks is not None and _link_hook not in hooks:
        hooks.insert(0, _link_hook)   # first: nvcc starts before the host compilers' hooks


_register()
