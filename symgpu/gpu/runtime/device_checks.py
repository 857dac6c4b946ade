"""Device-side checks that cost no synchronisation: bad indices and labels reported at the next
point where the host waits for the GPU anyway.

Why: a kernel that checks its indices used to read its error flag back right after its launch,
one stream sync per call, which also kept the op out of CUDA graphs and stopped the host from
running ahead of the GPU. Now each checking node owns a *slot*: two words of page-locked host
memory mapped into the device's address space (zero-copy). Its kernel stores a bad value there
with plain stores (no atomics on host memory: any one of several bad values may be the one
kept). The host looks at the slots of a context right after every synchronisation of its stream
(a copy to the host, ``get_value``, ``synchronize()``) and raises the error of the first slot
set, naming the op and the user's line that created it. A call whose results come back to the
host therefore fails in that same call, before its updates are applied; a call whose results
all stay on the device reports the error at the next synchronisation, as CUDA errors do in
PyTorch. ``config.gpuarray.sync_checks`` (or the ``sync_checks`` argument) restores a check
right after each launch, for debugging.

A report also sets the first word of its slot's page (each chunk of slots starts on a page:
``page_aligned``). The graph runner copies an update back into its shared variable's buffer
inside a call (so the variable stays where the graph reads it); in a function with checking ops
those copies are ``GuardedCopies``: one thread reads the page words into a device word, and the
copy kernel (one launch for all of a call's copies) does nothing once it is set, so a call that
is about to fail leaves its shared variables untouched. Until the error is raised (at the next
synchronisation), later calls' copies are skipped too. Where the graph selects each update's
old value by the same verdict itself (symgpu/gpu/ops/guarded_updates.py, the default), the
runner needs no guarded copy: updates are written into their buffers as without checks.

Slots are never moved or freed while their context lives: a captured CUDA graph keeps the
device address of the slot its kernel writes.

The slots themselves (``DeviceChecks``, ``checks_of``, ``raise_device_errors``) live in
check_slots.py, below the context and GpuArray that raise their reports after each
synchronisation; this module, which launches the checking kernels, re-exports them.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from symgpu.config import config
from symgpu.gpu.runtime.array import GpuArray
from symgpu.gpu.runtime.check_slots import (DeviceChecks, checks_of, is_device_check_error,
                                            page_aligned, raise_device_errors)
from symgpu.gpu.runtime.codegen import template, text
from symgpu.gpu.runtime.compiler import get_prepared_kernel

__all__ = ["DeviceChecks", "DeviceChecked", "REPORT_SOURCE", "checks_of",
           "raise_device_errors", "is_device_check_error", "launch_checked", "GuardedCopies",
           "plan_copies", "copy_table", "page_aligned"]

#: the device side of a slot: ``slot[1]`` gets the bad value, then ``slot[0]`` becomes 1, and
#: so does the first word of the slot's page (its chunk's "something was reported" word, which
#: guarded copies read: see GuardedCopies)
REPORT_SOURCE = text("report.cu")

_MAX_GUARDED_CHUNKS = 4

#: copies that do not happen once a check has reported: an update copied back into its shared
#: variable's buffer inside a call must not land when that call is about to fail. The report
#: words live in mapped host memory, and on the H100 each read of them from a kernel cost
#: about a microsecond, one after the other: read by every block of a copy (a 4 MiB weight
#: has 1024), they made a dropout MLP step's eight copies take 2 ms instead of a few us. So
#: one thread reads them once per call into the module's own device word, which the copy's
#: blocks then read (two launches on the stream, in order: nothing runs between them).
_COPY_TABLE = 32        # copies per launch (the table is the kernel's parameter: 1040 bytes)
_COPY_CHUNK = 16384     # bytes per thread block: 256 threads x 4 x 16 bytes
GUARDED_COPY_SOURCE = template("guarded_copy.cu").substitute(table=_COPY_TABLE,
                                                             chunk=_COPY_CHUNK)
_TABLE_FORMAT = "q" * (2 + _COPY_TABLE) + "Q" * (2 * _COPY_TABLE) + "q" * _COPY_TABLE
_GUARDED_COPY_KEY = ("symgpu.guarded_copy",)

#: the flag's live record: launch_checked runs for every checked launch
_SYNC_CHECKS = config.live("gpuarray.sync_checks")


def _user_line(node: Any) -> str:
    trace = getattr(getattr(node, "tag", None), "trace", None) or []
    if not trace:
        return ""
    frame = trace[-1]
    return f' (the node was created at "{frame.filename}", line {frame.lineno}: {frame.line})'


def new_error_buffer(ctx: Any) -> Any:
    """A zeroed two-word device buffer a kernel's ``report`` (REPORT_SOURCE) writes
    (``config.gpuarray.sync_checks``: read back right after the launch)."""
    return GpuArray((2,), "uint64", ctx).fill(0)


def read_error(err: Any) -> int | None:
    """The value a kernel reported into ``err`` (a stream sync), or None if none did."""
    flag, bad = err.get()
    if not flag:
        return None
    return int(np.asarray(bad, dtype=np.uint64).view(np.int64))


def launch_checked(node: Any, ctx: Any, fn: Any, grid: tuple, block: tuple, args: tuple,
                   describe: Callable[[int], Exception], stream: Any = None) -> None:
    """Launch the prepared kernel `fn` with `args` and a report slot as its last argument.
    Deferred (default): the slot is `node`'s mapped slot, read at the next synchronisation;
    with ``config.gpuarray.sync_checks``: a fresh device buffer read back at once.
    `describe(bad)` makes the exception for a reported value (the launch's shapes go in it).
    `stream`: another stream of the context (PyCUDA's object; a collective's communication
    stream, joined back before the synchronisation that reads the slot), deferred checks
    only; None: the context's stream."""
    if _SYNC_CHECKS.value:
        err = new_error_buffer(ctx)
        fn.prepared_async_call(grid, block, ctx.stream, *args, err.ptr)
        bad = read_error(err)
        if bad is not None:
            raise describe(bad)
        return
    slots = node.tag.__dict__.get("device_check_slots")
    if slots is None:
        slots = node.tag.__dict__["device_check_slots"] = _NodeSlots()
    entry = slots.get(id(ctx))
    if entry is None:
        record: list = [describe]
        where = _user_line(node)

        def raise_for(bad: int, record: list = record) -> Exception:
            exc = record[0](bad)
            return type(exc)(f"{exc}{where}")
        entry = slots[id(ctx)] = (checks_of(ctx).new_slot(raise_for), record)
    entry[1][0] = describe   # this launch's shapes, for the message
    fn.prepared_async_call(grid, block, ctx.stream if stream is None else stream, *args,
                           entry[0])


class _NodeSlots(dict):
    """A node's report slots by context (``launch_checked``): run-time state of this process
    (mapped memory, closures over the last launch), so a pickle or a deep copy of the graph
    holding the node carries an empty one; the copy's launches take their own slots."""

    def __reduce__(self):
        return (_NodeSlots, ())

    def __copy__(self) -> "_NodeSlots":
        return _NodeSlots()

    def __deepcopy__(self, memo: dict) -> "_NodeSlots":
        return _NodeSlots()


def checks_are_deferred() -> bool:
    """Whether checking ops report at the next synchronisation (then they can be captured
    into CUDA graphs: they take pool memory and queue work on the stream only)."""
    return not config.gpuarray.sync_checks


def sync_check_reason() -> str | None:
    """Why a checking op makes the host wait (for symgpu.explain), or None when it does not."""
    return None if checks_are_deferred() else \
        "reads its check flag back after the launch (gpuarray.sync_checks=True)"


def _guarded_copy_source() -> str:
    return GUARDED_COPY_SOURCE


def _padded(words: list[int]) -> list[int]:
    """Report words as a check kernel takes them: _MAX_GUARDED_CHUNKS, null ones after."""
    return words + [0] * (_MAX_GUARDED_CHUNKS - len(words))


def verdict_sources() -> list[tuple[Any, Callable[[], str], tuple]]:
    """The module `queue_verdict` launches from, as ops' ``prefetch_sources`` give it."""
    return [(_GUARDED_COPY_KEY, _guarded_copy_source, ())]


def queue_verdict(ctx: Any, out_ptr: int) -> None:
    """Queue on ctx's stream what sets the int32 at ``out_ptr`` to 1 once any check of the
    context has reported, else 0 (GpuCheckVerdict): a one-thread launch per four report
    words, so any number of pages, with no synchronisation (the launches may be captured)."""
    fn = get_prepared_kernel(_GUARDED_COPY_KEY, _guarded_copy_source, "guard_verdict",
                             "PPPPPi", context=ctx)
    words = checks_of(ctx).report_words()
    for k in range(0, max(len(words), 1), _MAX_GUARDED_CHUNKS):
        fn.prepared_async_call((1, 1), (32, 1, 1), ctx.stream,
                               *_padded(words[k:k + _MAX_GUARDED_CHUNKS]), out_ptr, int(k == 0))


def _guard_kernels(ctx: Any) -> tuple[Any, Any]:
    """(check, copy) of ctx's one guarded-copy module (one module: one verdict word; both
    come from the module the compiler loaded once for ctx)."""
    return (get_prepared_kernel(_GUARDED_COPY_KEY, _guarded_copy_source, "guarded_copy_check",
                                "PPPP", context=ctx),
            get_prepared_kernel(_GUARDED_COPY_KEY, _guarded_copy_source, "guarded_copies",
                                _TABLE_FORMAT, context=ctx))


Copy = tuple[int, int, int]   # (destination address, source address, bytes)


def _overlap(a: int, an: int, b: int, bn: int) -> bool:
    return a < b + bn and b < a + an


def plan_copies(copies: list[Copy], limit: int = _COPY_TABLE) -> list[list[Copy]]:
    """The launches that make `copies` in their order: one for all of them unless a copy
    touches memory an earlier copy of the launch writes, or writes memory it reads (the
    copies of one launch run at once; launches run one after the other), or more than
    `limit` copies are left. Empty copies are left out."""
    launches: list[list[Copy]] = []
    current: list[Copy] = []
    for dst, src, n in copies:
        if n <= 0:
            continue
        clash = any(_overlap(dst, n, d, m) or _overlap(src, n, d, m) or _overlap(dst, n, s, m)
                    for d, s, m in current)
        if current and (clash or len(current) == limit):
            launches.append(current)
            current = []
        current.append((dst, src, n))
    if current:
        launches.append(current)
    return launches


def copy_table(copies: list[Copy]) -> tuple[int, tuple[int, ...]]:
    """(thread blocks, the kernel's table as arguments) of one launch of `guarded_copies`:
    each copy gets ceil(bytes / chunk) blocks, so the blocks are split across the copies by
    size and a 4 MiB weight streams as 256 blocks of four 16-byte loads per thread."""
    if not 0 < len(copies) <= _COPY_TABLE:
        raise ValueError(f"guarded_copies: {len(copies)} copies for a table of {_COPY_TABLE}")
    first, total = [], 0
    for _, _, n in copies:
        first.append(total)
        total += -(-n // _COPY_CHUNK)
    pad = _COPY_TABLE - len(copies)
    first += [total] * (pad + 1)
    return total, (len(copies), *first, *[d for d, _, _ in copies], *[0] * pad,
                   *[s for _, s, _ in copies], *[0] * pad, *[n for _, _, n in copies],
                   *[0] * pad)


class GuardedCopies:
    """One call's update copies (``dst[...] = src``, same layout, contiguous) that do not
    land once any check of the context has reported: `add` them in order, then `launch`
    queues the check kernel (one thread reads the report words) and one copy kernel for all
    of them (more only where `plan_copies` must split), instead of a launch per buffer,
    most of them tiny. `add` is False (nothing will be copied) when the context has more
    report pages than the check kernel reads."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        words = checks_of(ctx).report_words()
        self.words = words if len(words) <= _MAX_GUARDED_CHUNKS else None
        self.pending: list[Copy] = []

    def add(self, dst: Any, src: Any) -> bool:
        if self.words is None:
            return False
        self.pending.append((int(dst.ptr), int(src.ptr), int(dst.nbytes)))
        return True

    def launch(self) -> None:
        """Queue the copies added so far on the context's stream (nothing when none were)."""
        launches = plan_copies(self.pending)
        self.pending = []
        if not launches:
            return
        check_fn, copy = _guard_kernels(self.ctx)
        stream = self.ctx.stream
        check_fn.prepared_async_call((1, 1), (32, 1, 1), stream, *_padded(self.words))
        for copies in launches:
            blocks, table = copy_table(copies)
            copy.prepared_async_call((blocks, 1), (256, 1, 1), stream, *table)


class DeviceChecked:
    """Mixin of ops whose kernels check their inputs through launch_checked: capturable
    unless checks are synchronous, and counted by the runner (guarded copies) and explain."""

    capturable = property(lambda self: checks_are_deferred())   # graphs.py
    launches = True
    device_checked = True   # reports at the next sync: copies back into shared variables guarded
    host_sync = property(lambda self: sync_check_reason())         # symgpu.explain
