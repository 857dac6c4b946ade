"""Device-side checks (symgpu/gpu/runtime/device_checks.py): slots read at synchronisations, the
error of the first set slot raised with the node's line, slots cleared after."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T
from gpu_helpers import requires_gpu, requires_nvcc
from symgpu import config, function
from symgpu.gpu.runtime.device_checks import DeviceChecks, REPORT_SOURCE, launch_checked


def _host_allocator(chunks: list):
    def allocate(n):
        arr = np.zeros((n, 2), np.uint64)
        chunks.append(arr)
        return arr, (1 << 40) + (len(chunks) - 1) * (1 << 20)
    return allocate


def test_slots_raise_the_first_reported_value_then_clear():
    chunks = []
    checks = DeviceChecks(_host_allocator(chunks))
    a = checks.new_slot(lambda bad: IndexError(f"a got {bad}"))
    b = checks.new_slot(lambda bad: ValueError(f"b got {bad}"))
    assert (a, b) == ((1 << 40) + 16, (1 << 40) + 32)   # two words per slot; the page's
    checks.raise_pending()                               # first is its report word
    chunks[0][2] = (1, np.uint64(2**64 - 3))             # slot b reports -3
    chunks[0][0, 0] = 1
    with pytest.raises(ValueError, match="b got -3"):
        checks.raise_pending()
    checks.raise_pending()                           # cleared
    assert not chunks[0].any()


def test_slots_grow_in_chunks_without_moving():
    chunks = []
    checks = DeviceChecks(_host_allocator(chunks))
    ptrs = [checks.new_slot(lambda bad: IndexError()) for _ in range(300)]
    assert len(chunks) == 2 and ptrs[0] == (1 << 40) + 16 and len(set(ptrs)) == 300
    assert checks.report_words() == [1 << 40, (1 << 40) + (1 << 20)]
    chunks[1][300 - 255, 0] = 1                        # the last slot: row 45 of page 2
    with pytest.raises(IndexError):
        checks.raise_pending()
    chunks[0][0, 0] = 1                                # a report word alone: cleared, no error
    checks.raise_pending()
    assert not chunks[0].any()


class _FakeKernel:
    def __init__(self):
        self.calls = []

    def prepared_async_call(self, grid, block, stream, *args):
        self.calls.append(args)


class _FakeContext:
    stream = None


def test_launch_checked_gives_each_node_one_slot_and_names_its_line():
    x = T.fvector("x")
    node = (x * 2).owner
    ctx, fn = _FakeContext(), _FakeKernel()
    chunks = []
    ctx.device_checks = DeviceChecks(_host_allocator(chunks))
    for n in (3, 4):
        launch_checked(node, ctx, fn, (1, 1), (32, 1, 1), (n,),
                       lambda bad, n=n: IndexError(f"index {bad} of {n}"))
    assert fn.calls[0][-1] == fn.calls[1][-1] == (1 << 40) + 16   # one slot, last argument
    chunks[0][1] = (1, 7)
    with pytest.raises(IndexError, match=r"index 7 of 4 \(the node was created at .*test_device_checks"):
        ctx.device_checks.raise_pending()


@requires_nvcc
def test_the_report_function_compiles_in_the_kernels(tmp_path):
    from gpu_helpers import compile_for_sm90
    from symgpu.gpu.ops.advanced import advanced_source
    from symgpu.gpu.ops.crossentropy import crossentropy_source
    from symgpu.gpu.runtime.device_checks import GUARDED_COPY_SOURCE
    assert REPORT_SOURCE in advanced_source() and REPORT_SOURCE in crossentropy_source()
    assert compile_for_sm90(GUARDED_COPY_SOURCE, tmp_path)
    assert compile_for_sm90(advanced_source(), tmp_path)
    assert compile_for_sm90(crossentropy_source(), tmp_path)


@requires_gpu
def test_a_bad_index_fails_the_call_that_reads_its_result(cuda):
    x = T.fmatrix("x")
    i = T.lvector("i")
    w = __import__("symgpu").shared(np.zeros(3, "float32"), name="w")
    f = function([x, i], x[i].sum(), updates=[(w, w + 1)])
    xs = np.arange(12, dtype="float32").reshape(4, 3)
    assert f(xs, np.array([0, 3])) == xs[[0, 3]].sum()
    with pytest.raises(IndexError, match="index 9 is out of bounds"):
        f(xs, np.array([1, 9]))
    assert np.array_equal(w.get_value(), np.ones(3)), "the failed call changed nothing"
    assert f(xs, np.array([-1])) == xs[-1].sum()     # and the slot was cleared


@requires_gpu
def test_sync_checks_raise_at_the_node(cuda):
    x = T.fmatrix("x")
    i = T.lvector("i")
    with config.change_flags(**{"gpuarray__sync_checks": True}):
        f = function([x, i], x[i].sum())
        with pytest.raises(IndexError, match="index 9 is out of bounds"):
            f(np.zeros((4, 3), "float32"), np.array([9]))


@requires_gpu
def test_a_failed_call_with_cuda_graphs_leaves_updates_unapplied(cuda):
    """The update is copied back into w's buffer inside the graph; a bad index of the same
    call must stop that copy (guarded_copy), not only raise."""
    import symgpu
    x, i = T.fmatrix("x"), T.lvector("i")
    w = symgpu.shared(np.zeros((4, 3), "float32"), name="w")
    f = function([x, i], x[i].sum(), updates=[(w, w + x)])
    xs = np.ones((4, 3), "float32")
    for _ in range(4):                   # plain, capture, replays
        f(xs, np.array([0, 1]))
    assert f.vm.runner is not None and f.vm.runner.device_checked
    before = w.get_value()
    with pytest.raises(IndexError, match="index 7"):
        f(xs, np.array([7]))
    np.testing.assert_array_equal(w.get_value(), before)
    f(xs, np.array([0]))
    np.testing.assert_array_equal(w.get_value(), before + 1)


def test_chunks_start_on_a_page_so_reports_set_their_chunks_word():
    """A report sets the word at its slot's address rounded down to 4096: the chunk's first
    word only when the chunk starts on a page.  page_aligned picks the aligned rows of a
    padded allocation; an allocator that gives an unaligned chunk is refused."""
    from symgpu.gpu.runtime.device_checks import page_aligned
    buf = np.zeros((256 + 256, 2), np.uint64)
    for ptr in ((1 << 40), (1 << 40) + 16, (1 << 40) + 4096 - 256, (1 << 40) + 4080):
        rows, base = page_aligned(buf, ptr, 256)
        assert base % 4096 == 0 and rows.shape == (256, 2)
        assert base - ptr == 16 * (rows.__array_interface__["data"][0]
                                   - buf.__array_interface__["data"][0]) // 16
        slot = base + 255 * 16                       # the chunk's last slot
        assert slot & ~4095 == base
    with pytest.raises(RuntimeError, match="16-byte"):
        page_aligned(buf, (1 << 40) + 8, 256)
    checks = DeviceChecks(lambda n: (np.zeros((n, 2), np.uint64), (1 << 40) + 256))
    with pytest.raises(RuntimeError, match="4096"):
        checks.new_slot(lambda bad: IndexError())


class _Launches:
    """Fake (check, copy) kernels of the guarded-copy module: record each launch."""

    def __init__(self):
        self.calls = []
        test = self

        class Kernel:
            def __init__(self, name):
                self.name = name

            def prepared_async_call(self, grid, block, stream, *args):
                test.calls.append((self.name, grid, block, args))
        self.kernels = (Kernel("check"), Kernel("copy"))


class _Arr:
    def __init__(self, ptr, nbytes=4096):
        self.ptr, self.nbytes = ptr, nbytes


def _guarded_context(monkeypatch, chunks=1):
    from symgpu.gpu.runtime import device_checks as dc

    class Ctx:
        stream = "the stream"
    ctx, fake = Ctx(), _Launches()
    ctx.device_checks = DeviceChecks(_host_allocator([]))
    for _ in range(chunks * 255):
        ctx.device_checks.new_slot(lambda bad: IndexError(bad))
    monkeypatch.setattr(dc, "_guard_kernels", lambda c: fake.kernels)
    return ctx, fake


def _decoded(args):
    """(grid blocks, [(dst, src, nbytes)]) of a guarded_copies launch's table."""
    from symgpu.gpu.runtime.device_checks import _COPY_TABLE as K
    count, first = args[0], args[1:K + 2]
    rows = list(zip(args[K + 2:2 * K + 2], args[2 * K + 2:3 * K + 2], args[3 * K + 2:]))
    assert all(r == (0, 0, 0) for r in rows[count:]), "padding rows copy nothing"
    return first[count], first[:count + 1], rows[:count]


def test_a_calls_guarded_copies_are_one_check_and_one_copy_launch(monkeypatch):
    """The runner's update copies of one call: the check kernel (one thread reads every
    chunk's report word into the module's device word; on the H100 each read of the mapped
    words cost about a microsecond), then ONE copy kernel for all of them, its table the
    copies in the order added, thread blocks split across them by size."""
    from symgpu.gpu.runtime.device_checks import GuardedCopies
    ctx, fake = _guarded_context(monkeypatch)
    g = GuardedCopies(ctx)
    big, small = 4 << 20, 40
    assert g.add(_Arr(1 << 32, big), _Arr(2 << 32, big))
    assert g.add(_Arr(3 << 32, small), _Arr(4 << 32, small))
    assert g.add(_Arr(5 << 32, 16), _Arr(6 << 32, 16))
    assert fake.calls == []                          # nothing queued before launch()
    g.launch()
    assert [c[0] for c in fake.calls] == ["check", "copy"]
    name, grid, block, words = fake.calls[0]
    assert grid == (1, 1) and words == (1 << 40, 0, 0, 0)     # the one chunk's report word
    name, grid, block, table = fake.calls[1]
    blocks, first, rows = _decoded(table)
    assert rows == [(1 << 32, 2 << 32, big), (3 << 32, 4 << 32, small), (5 << 32, 6 << 32, 16)]
    assert first == (0, 256, 257, 258) and grid == (258, 1) and block == (256, 1, 1)
    g.launch()                                       # nothing added since: nothing queued
    assert len(fake.calls) == 2


def test_guarded_copies_are_refused_past_the_report_pages_the_check_reads(monkeypatch):
    from symgpu.gpu.runtime.device_checks import _MAX_GUARDED_CHUNKS, GuardedCopies
    ctx, fake = _guarded_context(monkeypatch, chunks=_MAX_GUARDED_CHUNKS + 1)
    g = GuardedCopies(ctx)
    assert not g.add(_Arr(1 << 32), _Arr(2 << 32))
    g.launch()
    assert fake.calls == []


def test_plan_copies_keeps_order_where_copies_touch():
    """Copies of one launch run at once: a copy that reads or writes what an earlier copy of
    the launch writes, or writes what it reads, starts the next launch (launches run in
    order); a full table too.  Copies that only read the same memory share a launch."""
    from symgpu.gpu.runtime.device_checks import plan_copies
    a, b, c, d = 1 << 32, 2 << 32, 3 << 32, 4 << 32
    assert plan_copies([(a, b, 64), (c, d, 64), (d + 64, b, 8)]) == \
        [[(a, b, 64), (c, d, 64), (d + 64, b, 8)]]
    # writes what the first one reads (b), then reads what the second one writes (b)
    assert plan_copies([(a, b, 64), (b + 32, c, 64), (d, b + 60, 4)]) == \
        [[(a, b, 64)], [(b + 32, c, 64)], [(d, b + 60, 4)]]
    assert plan_copies([(a, b, 64), (a + 63, c, 1)]) == [[(a, b, 64)], [(a + 63, c, 1)]]
    assert plan_copies([(a, b, 0), (c, d, 8)]) == [[(c, d, 8)]]            # empty: left out
    many = [(a + 64 * k, b + 64 * k, 64) for k in range(5)]
    assert plan_copies(many, limit=2) == [many[:2], many[2:4], many[4:]]
    assert plan_copies([]) == []


def test_the_copy_table_gives_each_copy_its_chunks():
    """Each copy gets ceil(bytes / chunk) blocks starting at its ``first`` entry; the kernel
    finds its copy as the last entry whose first block is <= its own, and copies bytes
    [(block - first) * chunk, min(+chunk, nbytes)): together exactly each copy's bytes."""
    from symgpu.gpu.runtime.device_checks import _COPY_CHUNK, _COPY_TABLE, copy_table
    sizes = [1, _COPY_CHUNK, _COPY_CHUNK + 1, 3 * _COPY_CHUNK - 5, 12]
    copies = [((k + 1) << 32, (k + 10) << 32, n) for k, n in enumerate(sizes)]
    blocks, table = copy_table(copies)
    total, first, rows = _decoded(table)
    assert blocks == total == 1 + 1 + 2 + 3 + 1 and rows == copies
    covered = {k: 0 for k in range(len(copies))}
    for blk in range(blocks):
        e = max(k for k in range(len(copies)) if first[k] <= blk)
        begin = (blk - first[e]) * _COPY_CHUNK
        covered[e] += max(0, min(begin + _COPY_CHUNK, sizes[e]) - begin)
    assert [covered[k] for k in range(len(sizes))] == sizes
    with pytest.raises(ValueError, match="copies for a table"):
        copy_table(copies * _COPY_TABLE)


@requires_nvcc
def test_guarded_copy_kernels_compile(tmp_path):
    from gpu_helpers import compile_for_sm90
    from symgpu.gpu.runtime.device_checks import GUARDED_COPY_SOURCE
    cubin = compile_for_sm90(GUARDED_COPY_SOURCE, tmp_path)
    assert b"guarded_copies" in cubin and b"guarded_copy_check" in cubin


@requires_gpu
def test_a_failed_call_leaves_every_batched_update_unapplied(cuda):
    """Several updates of different sizes (a tiny one, one of an odd byte count, one of many
    chunks) copied back by one guarded launch inside the graph: a bad index of the call stops
    all of them; the next good call applies all of them, byte for byte."""
    import symgpu
    x, i = T.fmatrix("x"), T.lvector("i")
    shapes = [(3,), (7, 5), (1100, 1001)]
    ws = [symgpu.shared(np.zeros(s, "float32"), name=f"w{k}") for k, s in enumerate(shapes)]
    f = function([x, i], x[i].sum(), updates=[(w, w + x[i].sum()) for w in ws])
    xs = np.ones((4, 3), "float32")
    for _ in range(4):                   # plain, capture, replays
        f(xs, np.array([0, 1]))
    runner = f.vm.runner
    assert runner is not None and runner.device_checked and runner.stats()["replays"] >= 1
    before = [w.get_value() for w in ws]
    assert all(np.all(b == 24) for b in before)
    with pytest.raises(IndexError, match="index 7"):
        f(xs, np.array([7]))
    for w, b in zip(ws, before):
        np.testing.assert_array_equal(w.get_value(), b)
    f(xs, np.array([0]))
    for w, b in zip(ws, before):
        np.testing.assert_array_equal(w.get_value(), b + 3)
