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


def test_guarded_copies_queued_back_to_back_read_the_reports_once(monkeypatch):
    """The runner's update copies at the end of a call: the first launches the check kernel
    (one thread reads every chunk's report word into the module's device word), the others
    only their copy kernel, which reads that word (on the H100 each read of the mapped report
    words cost about a microsecond)."""
    from symgpu.gpu.runtime import device_checks as dc

    launches = []

    class Kernel:
        def __init__(self, name):
            self.name = name

        def prepared_async_call(self, grid, block, stream, *args):
            launches.append(self.name)

    class Ctx:
        stream = None

    class Arr:
        def __init__(self, ptr):
            self.ptr, self.nbytes = ptr, 4096

    ctx = Ctx()
    ctx.device_checks = DeviceChecks(_host_allocator([]))
    ctx.device_checks.new_slot(lambda bad: IndexError(bad))
    monkeypatch.setitem(dc._copy_kernels, id(ctx), (Kernel("check"), Kernel("copy")))
    for k in range(3):
        assert dc.guarded_copy(ctx, Arr(1 << 32), Arr(2 << 32), check=k == 0)
    assert launches == ["check", "copy", "copy", "copy"]
