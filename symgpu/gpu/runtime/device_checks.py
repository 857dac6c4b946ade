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
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from symgpu.config import config
from symgpu.gpu.runtime.codegen import template, text
from symgpu.gpu.runtime.compiler import get_prepared_kernel

__all__ = ["DeviceChecks", "DeviceChecked", "REPORT_SOURCE", "checks_of",
           "raise_device_errors", "is_device_check_error", "launch_checked", "GuardedCopies",
           "plan_copies", "copy_table"]

#: the device side of a slot: ``slot[1]`` gets the bad value, then ``slot[0]`` becomes 1, and
#: so does the first word of the slot's page (its chunk's "something was reported" word, which
#: guarded copies read: see GuardedCopies)
REPORT_SOURCE = text("report.cu")

_CHUNK = 256  # slots per mapped allocation: one 4 KiB page; slot 0 is the page's report word
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

_PAGE = 4096
#: the flag's live record: launch_checked runs for every checked launch
_SYNC_CHECKS = config.live("gpuarray.sync_checks")


def _mapped_zeros(n: int) -> tuple[np.ndarray, int]:
    """(n x 2 uint64 page-locked host array, its device address) through PyCUDA; the device
    address is a multiple of 4096 (see :func:`page_aligned`)."""
    import pycuda.driver as drv
    pad = _PAGE // 16
    arr = drv.pagelocked_zeros((n + pad, 2), np.uint64,
                               mem_flags=drv.host_alloc_flags.DEVICEMAP)
    return page_aligned(arr, int(arr.base.get_device_pointer()), n)


def page_aligned(arr: np.ndarray, ptr: int, n: int) -> tuple[np.ndarray, int]:
    """The n rows of ``arr`` (rows of two uint64, at device address ``ptr``, with 256 rows to
    spare) that start at a multiple of 4096, and their device address.

    Why: a kernel's report sets the word at its slot's address rounded down to 4096, which
    must be its chunk's report word, the one guarded copies read.  The driver does not
    promise page alignment for page-locked allocations; a chunk that was not aligned had its
    reports' page word land elsewhere, and a failing call's guarded update copy went through
    (the update of a call that raised was applied on the device)."""
    skip = (-ptr) % _PAGE
    if skip % 16:
        raise RuntimeError(f"a page-locked allocation at {ptr:#x} is not 16-byte aligned")
    rows = skip // 16
    return arr[rows:rows + n], ptr + skip


class DeviceChecks:
    """The slots of one context. `allocate(n)` gives (host array, device address) of n zeroed
    slots; tests pass a plain NumPy allocator."""

    def __init__(self, allocate: Callable[[int], tuple[np.ndarray, int]] = _mapped_zeros):
        self._allocate = allocate
        self._chunks: list[tuple[np.ndarray, int]] = []
        self._describe: list[Callable[[int], Exception]] = []
        self._lock = threading.Lock()

    def new_slot(self, describe: Callable[[int], Exception]) -> int:
        """A fresh slot for one node: returns the device address its kernel writes to;
        `describe(bad_value)` makes the exception raised when the slot is found set."""
        with self._lock:
            k = len(self._describe)
            chunk, offset = divmod(k, _CHUNK - 1)
            if chunk == len(self._chunks):
                host, base = self._allocate(_CHUNK)
                if base % _PAGE:
                    raise RuntimeError(f"device-check slots at {base:#x}: not on a 4096-byte "
                                       f"boundary, so reports would set another page's word")
                self._chunks.append((host, base))
            self._describe.append(describe)
            return self._chunks[chunk][1] + (offset + 1) * 16

    def report_words(self) -> list[int]:
        """The device addresses of every chunk's report word."""
        return [base for _, base in self._chunks]

    def raise_pending(self) -> None:
        """Raise the error of the first set slot (and clear every slot): call only when the
        stream has been synchronised, so every queued kernel has finished writing."""
        for c, (host, _) in enumerate(self._chunks):
            flags = host[1:, 0]
            if not host[0, 0] and not flags.any():
                continue
            hits = np.flatnonzero(flags)
            if not len(hits):
                host[0] = 0
                continue
            i = int(hits[0])
            bad = int(host[i + 1, 1:2].view(np.int64)[0])
            for other, _ in self._chunks:
                other[...] = 0
            exc = self._describe[c * (_CHUNK - 1) + i](bad)
            exc.device_check = True   # the call's own error, never a reason to change course
            raise exc


def is_device_check_error(exc: BaseException) -> bool:
    """Whether `exc` is a kernel's reported check (a user error to propagate as is, not a
    failure of the machinery that happened to synchronise, such as a graph's check)."""
    return getattr(exc, "device_check", False)


_lock = threading.Lock()


def checks_of(ctx: Any) -> DeviceChecks:
    """The DeviceChecks of a context (made on first use)."""
    checks = getattr(ctx, "device_checks", None)
    if checks is None:
        with _lock:
            checks = getattr(ctx, "device_checks", None)
            if checks is None:
                checks = ctx.device_checks = DeviceChecks()
    return checks


def raise_device_errors(ctx: Any) -> None:
    """After a synchronisation of `ctx`'s stream: raise what its kernels reported."""
    checks = getattr(ctx, "device_checks", None)
    if checks is not None:
        checks.raise_pending()


def _user_line(node: Any) -> str:
    trace = getattr(getattr(node, "tag", None), "trace", None) or []
    if not trace:
        return ""
    frame = trace[-1]
    return f' (the node was created at "{frame.filename}", line {frame.lineno}: {frame.line})'


def new_error_buffer(ctx: Any) -> Any:
    """A zeroed two-word device buffer a kernel's ``report`` (REPORT_SOURCE) writes
    (``config.gpuarray.sync_checks``: read back right after the launch)."""
    from symgpu.gpu.runtime.array import GpuArray
    return GpuArray((2,), "uint64", ctx).fill(0)


def read_error(err: Any) -> int | None:
    """The value a kernel reported into ``err`` (a stream sync), or None if none did."""
    flag, bad = err.get()
    if not flag:
        return None
    return int(np.asarray(bad, dtype=np.uint64).view(np.int64))


def launch_checked(node: Any, ctx: Any, fn: Any, grid: tuple, block: tuple, args: tuple,
                   describe: Callable[[int], Exception]) -> None:
    """Launch the prepared kernel `fn` with `args` and a report slot as its last argument.
    Deferred (default): the slot is `node`'s mapped slot, read at the next synchronisation;
    with ``config.gpuarray.sync_checks``: a fresh device buffer read back at once.
    `describe(bad)` makes the exception for a reported value (the launch's shapes go in it)."""
    if _SYNC_CHECKS.value:
        err = new_error_buffer(ctx)
        fn.prepared_async_call(grid, block, ctx.stream, *args, err.ptr)
        bad = read_error(err)
        if bad is not None:
            raise describe(bad)
        return
    slots = node.tag.__dict__.setdefault("device_check_slots", {})
    entry = slots.get(id(ctx))
    if entry is None:
        record: list = [describe]
        where = _user_line(node)

        def raise_for(bad: int, record: list = record) -> Exception:
            exc = record[0](bad)
            return type(exc)(f"{exc}{where}")
        entry = slots[id(ctx)] = (checks_of(ctx).new_slot(raise_for), record)
    entry[1][0] = describe   # this launch's shapes, for the message
    fn.prepared_async_call(grid, block, ctx.stream, *args, entry[0])


def checks_are_deferred() -> bool:
    """Whether checking ops report at the next synchronisation (then they can be captured
    into CUDA graphs: they take pool memory and queue work on the stream only)."""
    from symgpu.config import config
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
