"""The guarded update copies (device_checks.py) and the graph-parameter kernels
(graph_params.py) run on the CPU (tests/cuda_on_host.py, tests/emulated_gpu.py), driven by
their own Python code, against NumPy: that a failing call's copies never land, and that a
captured slice or arange reads its scalars from the parameter block."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu.tensor as T

from cuda_on_host import build, requires_gxx
from emulated_gpu import (device_array, emulate_prepared_kernels, emulated_kernel_device,
                          host_view)
from gpu_helpers import thunk_over
from symgpu.gpu.placement.type import GpuArrayType

pytestmark = requires_gxx


@pytest.fixture
def emu(monkeypatch, tmp_path):
    return emulated_kernel_device(monkeypatch, tmp_path)


def _record(monkeypatch, module) -> list[str]:
    """The names of the kernels `module` launches through get_prepared_kernel, in order."""
    names: list[str] = []
    get = module.get_prepared_kernel

    def recording(key, source_factory, fn_name, *args, **kwargs):
        fn = get(key, source_factory, fn_name, *args, **kwargs)
        go = fn.kernel.launch
        fn.kernel.launch = lambda *a: (names.append(fn_name), go(*a))
        return fn
    monkeypatch.setattr(module, "get_prepared_kernel", recording)
    return names


def _at(ctx, base, offset: int, n: int, dtype: str):
    """A 1-d GpuArray of n `dtype` items at byte `offset` into GpuArray `base`'s memory."""
    from symgpu.gpu.runtime.array import GpuArray
    a = GpuArray.__new__(GpuArray)
    dt = np.dtype(dtype)
    a._set(ctx, base.ptr + offset, (n,), (dt.itemsize,), dt, base)
    return a


# ----------------------------------------------------------------- guarded copies

@pytest.fixture
def guard(emu, monkeypatch, tmp_path):
    """device_checks with its guard kernels run on the host; yields (module, launched names)."""
    from symgpu.gpu.runtime import device_checks
    emulate_prepared_kernels(monkeypatch, tmp_path, device_checks)
    return device_checks, _record(monkeypatch, device_checks)


@pytest.fixture
def reporter(tmp_path):
    """report(slot address, bad value): report.cu's own code run as a one-thread kernel."""
    from symgpu.gpu.runtime.device_checks import REPORT_SOURCE
    sub = tmp_path / "report"
    sub.mkdir()
    src = REPORT_SOURCE + ('\nextern "C" __global__ void rep(unsigned long long *slot, '
                           'long long bad) { report(slot, bad); }\n')
    lib = build(src, "EMU_WRAP(run_rep, rep, (unsigned long long *s, long long v), (s, v))",
                sub)
    import ctypes
    return lambda slot, bad: lib.run_rep(1, 1, 1, ctypes.c_void_p(slot), ctypes.c_longlong(bad))


_SENTINEL = 0xCD

#: (byte offset into the destination arena, dtype, items): aligned small, one full chunk (the
#: four-loads path), two chunks and a tail, misaligned by 3 (bytes only), 8- not 16-aligned,
#: an odd float16 count, an empty copy (left out), the last one ending at the arena's end
_COPIES = [(0, "float32", 3), (64, "uint8", 16384), (16512, "float64", 4101),
           (49395, "uint8", 1001), (50408, "int64", 5), (50512, "float16", 37),
           (50600, "int32", 0), (50608, "int16", 1)]
_ARENA = 50610


def _guarded_setup(ctx, copies=_COPIES, seed=0):
    """(GpuArray arena of sentinels, [(dst view, src array, host src values)])."""
    rng = np.random.default_rng(seed)
    arena = device_array(ctx, np.full(_ARENA, _SENTINEL, dtype=np.uint8))
    pairs = []
    for off, dtype, n in copies:
        vals = (rng.standard_normal(n) * 1000).astype(dtype)
        pairs.append((_at(ctx, arena, off, n, dtype), device_array(ctx, vals), vals))
    return arena, pairs


def _landed(copies=_COPIES, pairs=None) -> np.ndarray:
    """The arena once every copy has landed."""
    want = np.full(_ARENA, _SENTINEL, dtype=np.uint8)
    for (off, _, _), (_, _, vals) in zip(copies, pairs):
        want[off:off + vals.nbytes] = vals.view(np.uint8)
    return want


def test_guarded_copies_of_many_sizes_land_in_one_launch(emu, guard):
    """Every kernel path (full chunks, tails, misaligned bytes) in one table: each copy lands
    exactly on its destination and no byte outside them is written."""
    dc, launched = guard
    emu.device_checks.new_slot(lambda bad: ValueError(bad))   # one report page, not reported
    arena, pairs = _guarded_setup(emu)
    g = dc.GuardedCopies(emu)
    assert all(g.add(dst, src) for dst, src, _ in pairs)
    g.launch()
    assert launched == ["guarded_copy_check", "guarded_copies"]
    np.testing.assert_array_equal(host_view(arena), _landed(pairs=pairs))
    g.launch()                                                # nothing pending: no launch
    assert len(launched) == 2


@pytest.mark.parametrize("chunk", [0, 1, 3])
def test_guarded_copies_do_not_land_once_a_check_reported(emu, guard, reporter, chunk):
    """A report in any of the four pages the check reads stops every copy of the call, and
    of later calls until raised; once raised (slots cleared) the copies land again."""
    from symgpu.gpu.runtime.device_checks import raise_device_errors
    dc, launched = guard
    slots = [emu.device_checks.new_slot(lambda bad: ValueError(f"bad {bad}"))
             for _ in range(4 * 255)]                         # four pages of 255 slots
    arena, pairs = _guarded_setup(emu)
    reporter(slots[chunk * 255 + 7], -5)
    for _ in range(2):                                        # this call and the next
        g = dc.GuardedCopies(emu)
        for dst, src, _ in pairs:
            g.add(dst, src)
        g.launch()
        np.testing.assert_array_equal(host_view(arena), np.full(_ARENA, _SENTINEL, np.uint8))
    assert launched.count("guarded_copies") == 2
    with pytest.raises(ValueError, match="bad -5"):
        raise_device_errors(emu)
    g = dc.GuardedCopies(emu)
    for dst, src, _ in pairs:
        g.add(dst, src)
    g.launch()
    np.testing.assert_array_equal(host_view(arena), _landed(pairs=pairs))


def test_guarded_copies_skipped_after_a_real_checking_kernel_reports(emu, guard, monkeypatch,
                                                                     tmp_path):
    """As the runner does it: a checking op (cross-entropy, a bad label) reports into its
    node's slot, then the call's guarded copy is queued: it does not land."""
    from symgpu.gpu.ops import crossentropy
    from symgpu.gpu.runtime.device_checks import raise_device_errors
    dc, _ = guard
    emulate_prepared_kernels(monkeypatch, tmp_path, crossentropy)
    p = device_array(emu, np.full((4, 3), 0.5, dtype="float32"))
    node = crossentropy.GpuCrossentropyCategorical1Hot()(
        GpuArrayType("float32", (False, False), None)(),
        GpuArrayType("int64", (False,), None)()).owner
    arena, pairs = _guarded_setup(emu, _COPIES[:1])
    for labels, lands in (([0, 1, 3, 2], False), ([0, 1, 2, 2], True)):
        node.op.perform(node, [p, device_array(emu, np.asarray(labels, "int64"))], [[None]])
        g = dc.GuardedCopies(emu)
        g.add(pairs[0][0], pairs[0][1])
        g.launch()
        want = _landed(_COPIES[:1], pairs) if lands else np.full(_ARENA, _SENTINEL, np.uint8)
        np.testing.assert_array_equal(host_view(arena), want)
        if not lands:
            with pytest.raises(ValueError, match="got label 3"):
                raise_device_errors(emu)


def test_guarded_copies_split_where_a_copy_reads_an_earlier_ones_output(emu, guard):
    """b <- a then c <- b: two launches, so c gets a's values (in one launch it could get b's
    old ones); more than 32 copies take a second launch; past the four report pages the
    check reads, add refuses (the runner then leaves the update alone)."""
    dc, launched = guard
    emu.device_checks.new_slot(lambda bad: ValueError(bad))
    a, b, c = (device_array(emu, np.arange(40, dtype="float64") * k) for k in (1, 2, 3))
    g = dc.GuardedCopies(emu)
    g.add(b, a)
    g.add(c, b)
    g.launch()
    assert launched == ["guarded_copy_check", "guarded_copies", "guarded_copies"]
    np.testing.assert_array_equal(host_view(c), np.arange(40))
    np.testing.assert_array_equal(host_view(b), np.arange(40))
    srcs = [device_array(emu, np.full(3, k, "int32")) for k in range(40)]
    dsts = [device_array(emu, np.zeros(3, "int32")) for _ in range(40)]
    del launched[:]
    g = dc.GuardedCopies(emu)
    for d, s in zip(dsts, srcs):
        g.add(d, s)
    g.launch()
    assert launched == ["guarded_copy_check", "guarded_copies", "guarded_copies"]
    np.testing.assert_array_equal([host_view(d) for d in dsts],
                                  np.repeat(np.arange(40), 3).reshape(40, 3))
    for _ in range(4 * 255):
        emu.device_checks.new_slot(lambda bad: ValueError(bad))
    assert not dc.GuardedCopies(emu).add(dsts[0], srcs[1])  # five pages: not guardable


# ----------------------------------------------------------------- graph parameters

@pytest.fixture
def params(emu, monkeypatch, tmp_path):
    """graph_params with its kernels run on the host, get_context giving the emulated one,
    and pool memory dirty (as a GPU's: an element left unwritten shows)."""
    from symgpu.gpu.runtime import graph_params
    from symgpu.gpu.runtime import context
    emulate_prepared_kernels(monkeypatch, tmp_path, graph_params)
    monkeypatch.setattr(context, "get_context", lambda name=None: emu)
    allocate = emu.pool.allocate

    def dirty(nbytes):
        block = allocate(nbytes)
        emu.pool.buffers[block.ptr][...] = 0xAB
        return block
    monkeypatch.setattr(emu.pool, "allocate", dirty)
    return graph_params, _record(monkeypatch, graph_params)


def _run_with_slot(ctx, thunk, raw: bytes | None = None):
    """Run `thunk` as a capture does: its param_values' bytes (or `raw`) written at byte 24
    of a parameter block on the device, the thunk reading them from there."""
    _, values = thunk.param_values()
    block = device_array(ctx, np.zeros(64, dtype=np.uint8))
    data = np.frombuffer(values if raw is None else raw, dtype=np.uint8)
    host_view(block)[24:24 + len(data)] = data
    thunk.param_slot = (block, 24)
    thunk()
    thunk.param_slot = None
    return thunk.outputs[0][0]


def _slice_node(idx_list, dtype: str, ndim: int):
    from symgpu.gpu.ops.subtensor import GpuSubtensor
    n_sym = sum(sum(p is not None for p in (e.start, e.stop, e.step)) if hasattr(e, "start")
                else 1 for e in idx_list)
    return GpuSubtensor(idx_list)(GpuArrayType(dtype, (False,) * ndim, None)(),
                                  *[T.lscalar() for _ in range(n_sym)]).owner


def _np_key(idx_list, values):
    it = iter(values)
    return tuple(slice(*[next(it) if p is not None else None
                         for p in (e.start, e.stop, e.step)]) if hasattr(e, "start")
                 else next(it) for e in idx_list)


def _slice_cases():
    from symgpu.tensor.subtensor import SYM, Slice
    rows = (Slice(SYM, SYM, None),)
    yield "rows float32", rows, np.arange(50 * 7, dtype="float32").reshape(50, 7), \
        [(3, 11), (-9, 50), (40, 90), (-80, 2), (7, 7), (30, 4), (0, 50)]
    yield "rows uint8 1-d", rows, np.arange(200, dtype="uint8"), [(5, 199), (-1, 300)]
    yield "steps int16", (Slice(SYM, SYM, SYM), SYM), \
        np.arange(9 * 5 * 4, dtype="int16").reshape(9, 5, 4), \
        [(1, 8, 3, 2), (8, 0, -2, -1), (-1, -20, -4, 0), (2, 2, 1, 3), (0, 9, 100, 4)]
    yield "scalar uint16", (SYM, SYM), np.arange(12, dtype="uint16").reshape(3, 4), \
        [(1, 2), (-1, -4)]
    yield "element float64", (SYM, Slice(SYM, None, SYM)), \
        np.arange(6 * 11, dtype="float64").reshape(6, 11) * 1.5, [(4, 10, 1), (-6, -3, -5),
                                                                   (2, 0, 4)]


@pytest.mark.parametrize("max_blocks", [4096, 1])
def test_dynamic_slice_copy_matches_numpy_slicing(emu, params, monkeypatch, max_blocks):
    """Slices of each item size (rows fast path, steps both ways, an integer index, one
    element left, empty results, bounds clamped as NumPy's): the copy read at the block's
    offset equals x[key]; one block (max_blocks 1) runs the grid-stride loop."""
    gp, launched = params
    monkeypatch.setattr(gp, "_MAX_BLOCKS", max_blocks)
    for name, idx_list, x, keys in _slice_cases():
        node = _slice_node(idx_list, str(x.dtype), x.ndim)
        xd = device_array(emu, x)
        for key in keys:
            del launched[:]
            thunk, _ = thunk_over(node, [xd, *map(np.int64, key)])
            got = host_view(_run_with_slot(emu, thunk))
            want = x[_np_key(idx_list, key)]
            assert got.shape == want.shape, (name, key)
            np.testing.assert_array_equal(got, want, err_msg=f"{name} {key}")
            kernel = f"dyn_slice_copy_{x.itemsize}"
            assert launched == ([kernel] if want.size else []), (name, key)


def test_dynamic_slice_reads_its_offset_from_the_parameter_block(emu, params):
    """A replayed graph keeps the launch's shape and strides and changes only the block: the
    rows copied are those the block's offset names, not the ones the launch was made for."""
    from symgpu.gpu.runtime.graph_params import pack_int64
    from symgpu.tensor.subtensor import SYM, Slice
    x = np.arange(30 * 4, dtype="int32").reshape(30, 4)
    node = _slice_node((Slice(SYM, SYM, None),), "int32", 2)
    thunk, _ = thunk_over(node, [device_array(emu, x), np.int64(2), np.int64(7)])
    for start in (0, 11, 25):
        got = host_view(_run_with_slot(emu, thunk, pack_int64(start * x.strides[0])))
        np.testing.assert_array_equal(got, x[start:start + 5])


def test_dynamic_slice_copy_refuses_odd_items_and_too_many_axes(emu, params):
    """No kernel for 3-byte items, none for nine axes left after merging: raised, not run."""
    gp, launched = params
    with pytest.raises(TypeError, match="3 bytes"):
        gp.dyn_slice_copy(emu, 0, 0, 0, (2,), (3,), (3,), 3)
    shape = (2,) * 9
    strides = tuple(2 ** (k + 1) * 4 for k in range(9))   # no two axes merge
    with pytest.raises(ValueError, match="at most 8"):
        gp.dyn_slice_copy(emu, 0, 0, 0, shape, strides, strides, 4)
    assert launched == []


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("max_blocks", [4096, 1])
def test_device_arange_matches_numpy(emu, params, monkeypatch, dtype, max_blocks):
    """start and step read from the block: np.arange's values and length (the host's rule)
    for steps either way, empty ranges, several blocks, and int64 values past int32."""
    from symgpu.gpu.ops.advanced_pairs import GpuARange
    gp, launched = params
    monkeypatch.setattr(gp, "_MAX_BLOCKS", max_blocks)
    node = GpuARange(dtype, None)(T.lscalar(), T.lscalar(), T.lscalar()).owner
    big = 2 ** 40 if dtype == "int64" else 2 ** 20
    for start, stop, step in [(0, 10, 1), (3, 700, 2), (-5, -600, -1), (7, 7, 1),
                              (9, 2, 3), (big, big + 3 * 333, 3), (-big, big, big // 5),
                              (1, 1000, 1000)]:
        del launched[:]
        thunk, _ = thunk_over(node, [np.int64(start), np.int64(stop), np.int64(step)])
        got = host_view(_run_with_slot(emu, thunk))
        want = np.arange(start, stop, step, dtype=dtype)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want, err_msg=str((start, stop, step)))
        assert launched == ([f"arange_dev_{dtype}"] if want.size else [])


def test_device_arange_reads_start_and_step_from_the_parameter_block(emu, params):
    """The length is the launch's (the graph's key); start and step are the block's."""
    from symgpu.gpu.runtime.graph_params import pack_int64
    from symgpu.gpu.ops.advanced_pairs import GpuARange
    node = GpuARange("int64", None)(T.lscalar(), T.lscalar(), T.lscalar()).owner
    thunk, _ = thunk_over(node, [np.int64(0), np.int64(300), np.int64(1)])
    for start, step in [(100, -3), (-7, 11)]:
        got = host_view(_run_with_slot(emu, thunk, pack_int64(start, step)))
        np.testing.assert_array_equal(got, start + step * np.arange(300))


@pytest.mark.parametrize("max_blocks", [4096, 1])
def test_table_copy_copies_what_its_table_names(emu, params, monkeypatch, max_blocks):
    """graph_params.table_copy (a chunked loop's staging and result copies, scan_graph.py):
    each entry's bytes land at its destination, 16-byte words or single bytes by alignment,
    an entry of length 0 is skipped, and nothing else is written; one block (max_blocks 1)
    runs the grid-stride loop."""
    gp, launched = params
    monkeypatch.setattr(gp, "_MAX_BLOCKS", max_blocks)
    src = np.arange(4096, dtype=np.uint8) * 7 % 251
    src_d = device_array(emu, src.astype(np.uint8))
    dst_d = device_array(emu, np.zeros(4096, dtype=np.uint8))
    host_view(dst_d)[...] = 0xAB
    cases = [(0, 0, 1024),      # aligned words
             (2048, 16, 496),   # aligned words elsewhere
             (1025, 3, 77),     # unaligned: bytes
             (3000, 600, 0)]    # empty: skipped
    flat = []
    for d_off, s_off, n in cases:
        flat += [dst_d.ptr + d_off, src_d.ptr + s_off, n]
    table = device_array(emu, np.frombuffer(gp.pack_table(flat), dtype=np.uint8).copy())
    gp.table_copy(emu, table.ptr, len(cases), max(n for *_, n in cases))
    want = np.full(4096, 0xAB, dtype=np.uint8)
    for d_off, s_off, n in cases:
        want[d_off:d_off + n] = src[s_off:s_off + n]
    np.testing.assert_array_equal(host_view(dst_d), want)
    assert launched == ["table_copy"]
    gp.table_copy(emu, table.ptr, 0, 0)      # no entries: no launch
    assert launched == ["table_copy"]
