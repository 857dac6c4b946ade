"""GpuArray computes (symgpu/gpu/ops/array_math.py): operators, comparisons, in-place
operators, reductions, astype, NumPy's ufuncs, checked against NumPy.

Every test runs twice: on the host emulator (tests/emulated_gpu.py: the generated kernels,
compiled with g++, run on host memory) and, marked ``gpu``, on the real GPU (the ``cuda``
fixture), where the results are asserted to be GpuArrays of that device's context."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from emulated_gpu import device_array, emulated_array_device
from gpu_helpers import _GPU_SKIP
from symgpu.gpu.runtime.array import GpuArray, to_gpu
from symgpu.gpu.runtime.dtypes import BFLOAT16

_NO_GXX = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ here")


class Dev:
    """Uploads host arrays to the device under test and checks where results live."""

    def __init__(self, ctx, up):
        self.ctx, self._up = ctx, up

    def __call__(self, host):
        return self._up(np.asarray(host))

    def check(self, got, want, rtol=None):
        """``got`` is a GpuArray of this device equal to ``want`` (dtype and shape too)."""
        assert isinstance(got, GpuArray) and got.context is self.ctx, type(got)
        host, want = got.get(), np.asarray(want)
        assert host.dtype == want.dtype and host.shape == want.shape, (
            host.dtype, host.shape, want.dtype, want.shape)
        if host.dtype.kind == "f" or host.dtype == BFLOAT16:
            tol = rtol or {2: 1e-2, 4: 1e-5, 8: 1e-12}[host.dtype.itemsize]
            np.testing.assert_allclose(host.astype("float64"), want.astype("float64"),
                                       rtol=tol, atol=tol)
        else:
            np.testing.assert_array_equal(host, want)


@pytest.fixture(params=[pytest.param("emulated", marks=_NO_GXX),
                        pytest.param("cuda", marks=[pytest.mark.gpu, _GPU_SKIP])])
def dev(request, monkeypatch, tmp_path):
    if request.param == "emulated":
        ctx = emulated_array_device(monkeypatch, tmp_path)
        yield Dev(ctx, lambda h: device_array(ctx, h))
    else:
        ctx = request.getfixturevalue("cuda")
        assert not ctx.virtual and ctx.stream_handle
        yield Dev(ctx, lambda h: to_gpu(h, ctx))


def _data(shape, dtype, seed=0, low=-3.0, high=3.0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.dtype(bool):
        return rng.integers(0, 2, shape).astype(bool)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(1 if np.dtype(dtype).kind == "u" else -5, 6, shape).astype(dtype)
    return rng.uniform(low, high, shape).astype(dtype)


# ----------------------------------------------------------------------------- arithmetic

@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "float16"])
def test_binary_operators_broadcast_like_numpy(dev, dtype):
    a, b = _data((3, 4), dtype, 0), _data((4,), dtype, 1, 0.5, 2.0)
    if b.dtype.kind in "iu":
        b[b == 0] = 1
    ga, gb = dev(a), dev(b)
    dev.check(ga + gb, a + b)
    dev.check(ga - gb, a - b)
    dev.check(ga * gb, a * b)
    dev.check(ga / gb, a / b)
    dev.check(gb - ga, b - a)                      # reflected order, broadcast first operand
    dev.check(ga // gb, a // b)
    dev.check(ga % gb, a % b)
    dev.check(np.maximum(ga, gb), np.maximum(a, b))
    if dtype != "int32":
        dev.check(abs(gb) ** ga, np.abs(b) ** a, rtol=1e-2 if dtype == "float16" else 1e-5)


def test_scalars_follow_numpy_2_promotion(dev):
    f32, i32 = np.arange(6, dtype="float32"), np.arange(6, dtype="int32")
    i8, bl = np.arange(6, dtype="int8"), np.array([True, False, True])
    g32, gi, g8, gb = dev(f32), dev(i32), dev(i8), dev(bl)
    dev.check(g32 * 2.5, f32 * 2.5)                    # a Python float stays float32
    dev.check(2.5 - g32, 2.5 - f32)
    dev.check(gi + 1.5, i32 + 1.5)                     # int + float: float64
    dev.check(gi * 3, i32 * 3)                         # int32 stays int32
    dev.check(gb + 1, bl + 1)                          # bool + int: int64
    dev.check(g32 + np.float64(1.0), f32 + np.float64(1.0))   # a NumPy scalar is strong
    dev.check(np.float64(2.0) * g32, np.float64(2.0) * f32)   # through __array_ufunc__
    dev.check(g32 + np.array(3.0, "float32"), f32 + np.array(3.0, "float32"))
    dev.check(g8 < 300, i8 < 300)                      # a comparison takes any int
    with pytest.raises(OverflowError, match="300 out of bounds for int8"):
        g8 + 300
    with pytest.raises(TypeError, match="complex"):
        g32 + 1j


def test_comparisons_and_bitwise_give_numpy_dtypes(dev):
    a, b = _data((5, 3), "float32", 2), _data((5, 3), "float32", 3)
    ga, gb = dev(a), dev(b)
    for got, want in [(ga < gb, a < b), (ga <= gb, a <= b), (ga > 0, a > 0),
                      (ga >= gb, a >= b), (ga == ga, a == a), (ga != gb, a != b),
                      (0.5 < ga, 0.5 < a)]:
        dev.check(got, want)
        assert got.dtype == np.dtype(bool)
    m, n = _data((6,), "int32", 4), _data((6,), "int32", 5)
    gm, gn = dev(m), dev(n)
    dev.check(gm & gn, m & n)
    dev.check(gm | 3, m | 3)
    dev.check(gm ^ gn, m ^ n)
    dev.check(~gm, ~m)
    t = dev(a > 0)
    dev.check(~t, ~(a > 0))
    assert (ga == None) is False and (ga != "x") is True   # noqa: E711  (not operands)


def test_unary_operators_and_errors_numpy_gives(dev):
    a = _data((2, 3), "float32", 6)
    ga = dev(a)
    dev.check(-ga, -a)
    dev.check(abs(ga), np.abs(a))
    p = +ga
    dev.check(p, a)
    assert p.ptr != ga.ptr
    with pytest.raises(TypeError, match="boolean subtract/negative"):
        -dev(a > 0)
    with pytest.raises(ValueError, match="could not be broadcast|broadcast"):
        ga + dev(np.ones(4, "float32"))
    with pytest.raises(TypeError, match="unsupported operand"):
        ga + "text"


# ----------------------------------------------------------------------------- in place

def test_theano_user_story_adding_gradient_arrays(dev):
    """``g = f(0); g += f(1)`` where f returns GpuArrays (Theano code sums minibatch grads)."""
    grads = [_data((4, 3), "float32", k) for k in range(3)]
    g = dev(grads[0])
    ptr = g.ptr
    for k in (1, 2):
        g += dev(grads[k])
    assert g.ptr == ptr                                  # written into the same buffer
    dev.check(g, grads[0] + grads[1] + grads[2])
    g *= 0.5
    g -= 1
    g /= 2
    dev.check(g, ((grads[0] + grads[1] + grads[2]) * 0.5 - 1) / 2)


@pytest.fixture
def request_cleanup():
    todo = []
    yield todo
    for fn in todo:
        fn()


def test_theano_user_story_through_a_function_returning_gradients(dev, request_cleanup):
    """Under a GPU context, a function's gradient of a GPU shared variable is a GpuArray
    (its own buffer each call); ``g = f(0); g += f(1)`` adds on the device."""
    import symgpu
    import symgpu.tensor as T
    from symgpu.config import config
    from symgpu.gpu.placement.type import gpuarray_shared_constructor
    from symgpu.gpu.runtime.context import (context_names, get_context, register_context,
                                            registered_name, unregister_context)
    name = registered_name(dev.ctx)
    if name not in context_names() or get_context(name) is not dev.ctx:
        name = "array_math_story"
        register_context(name, dev.ctx)
        request_cleanup.append(lambda: unregister_context("array_math_story"))
    with config.change_flags(floatX="float32"):
        w = gpuarray_shared_constructor(np.arange(3, dtype="float32"), name="w", target=name)
        k = symgpu.shared(np.ones(3, dtype="float32") * 3, target=name)
        f = symgpu.function([], [T.grad((w * w * k).sum(), w), T.grad((w * k).sum(), w)])
    assert all(type(n.op).__name__.startswith("Gpu") for n in f.maker.fgraph.toposort())
    g, h = f()
    assert isinstance(g, GpuArray) and isinstance(h, GpuArray)
    g += f()[1]
    g += h
    dev.check(g, 6 * np.arange(3, dtype="float32") + 6)


def test_in_place_rules_cast_broadcast_and_overlap(dev):
    a = _data((3, 3), "float32", 7)
    ga = dev(a)
    ga += dev(np.arange(3, dtype="float64"))             # float64 result cast to float32
    want = a + np.arange(3)
    dev.check(ga, want.astype("float32"))
    gi = dev(np.arange(4, dtype="int32"))
    with pytest.raises(TypeError, match="same_kind"):
        gi += 1.5                                         # float64 into int32: NumPy refuses
    gi //= 2
    dev.check(gi, np.arange(4, dtype="int32") // 2)
    with pytest.raises(ValueError, match="non-broadcastable output"):
        dev(np.ones(3, "float32")).__iadd__(dev(np.ones((2, 3), "float32")))
    sq = _data((4, 4), "float32", 8)
    gs = dev(sq)
    gs += gs.T                                            # overlapping, another layout
    dev.check(gs, sq + sq.T)
    base = _data((4, 6), "float32", 9)
    gb = dev(base)
    view = gb[:, 1:5]                                     # a strided view, written through
    view += 10
    base[:, 1:5] += 10
    dev.check(gb, base)
    out = dev(np.zeros((4, 6), "float32"))
    np.add(gb, 1, out=out)
    dev.check(out, base + 1)
    np.multiply(out, 2, out=out)
    dev.check(out, (base + 1) * 2)


# ----------------------------------------------------------------------------- reductions

@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2), (0, 1, 2)])
def test_reductions_over_axes(dev, axis):
    a = _data((3, 4, 5), "float32", 10)
    ga = dev(a)
    dev.check(ga.sum(axis=axis), a.sum(axis=axis), rtol=1e-5)
    dev.check(ga.max(axis=axis), a.max(axis=axis))
    dev.check(ga.min(axis), a.min(axis))
    dev.check(ga.mean(axis=axis), a.mean(axis=axis), rtol=1e-5)
    dev.check(ga.sum(axis=axis, keepdims=True), a.sum(axis=axis, keepdims=True), rtol=1e-5)
    dev.check(ga.T.sum(axis=axis), a.T.sum(axis=axis), rtol=1e-5)    # strided input


def test_reduction_dtypes_and_edge_cases(dev):
    i = _data((4, 5), "int32", 11)
    gi = dev(i)
    dev.check(gi.sum(), i.sum())                   # int32 sums to int64, as NumPy
    dev.check(gi.sum(axis=0, dtype="float64"), i.sum(axis=0, dtype="float64"))
    dev.check(gi.mean(axis=1), i.mean(axis=1))     # integers' mean is float64
    dev.check(gi.prod(axis=0), i.prod(axis=0))
    h = _data((64,), "float16", 12, 0.0, 1.0)
    gh = dev(h)
    dev.check(gh.mean(), np.float16(h.astype("float32").mean()), rtol=2e-3)
    dev.check(gh.sum(), h.sum(), rtol=5e-3)
    b = dev(i > 0)
    dev.check(b.any(axis=0), (i > 0).any(axis=0))
    dev.check(b.all(), (i > 0).all())
    dev.check(gi.any(), i.any())
    empty = dev(np.zeros((0, 3), "float32"))
    dev.check(empty.sum(axis=0), np.zeros(3, "float32"))
    dev.check(empty.sum(axis=1), np.zeros(0, "float32"))
    with pytest.raises(ValueError, match="zero-size array to reduction operation maximum"):
        empty.max(axis=0)
    with pytest.warns(RuntimeWarning, match="Mean of empty slice"):
        assert np.isnan(empty.mean(axis=0).get()).all()
    with pytest.raises(np.exceptions.AxisError):
        gi.sum(axis=2)
    with pytest.raises(ValueError, match="duplicate"):
        gi.sum(axis=(0, 0))
    z = dev(np.array(4.0, "float32"))
    dev.check(z.sum(), np.float32(4.0))
    out = dev(np.zeros(5, "int64"))
    assert gi.sum(axis=0, out=out) is out
    dev.check(out, i.sum(axis=0))


def test_numpy_functions_run_on_the_device_or_say_why_not(dev):
    a = _data((3, 4), "float32", 13, 0.1, 2.0)
    ga = dev(a)
    dev.check(np.exp(ga), np.exp(a))
    dev.check(np.sqrt(ga), np.sqrt(a))
    dev.check(np.add(ga, ga), a + a)
    dev.check(np.sum(ga, axis=0), a.sum(axis=0))      # NumPy calls the methods
    dev.check(np.mean(ga), a.mean(), rtol=1e-5)
    dev.check(np.max(ga, axis=1), a.max(axis=1))
    np.testing.assert_allclose(np.dot(ga, np.asarray(ga).T), a @ a.T, rtol=1e-5)  # __array__
    np.testing.assert_allclose(np.asarray(ga), a)
    with pytest.raises(TypeError, match="does not combine with a NumPy array of shape"):
        a + ga                                         # never a silent download
    with pytest.raises(TypeError, match="does not combine with a NumPy array"):
        ga * a
    with pytest.raises(TypeError, match=r"numpy.add.reduce is not supported"):
        np.add.reduce(ga)
    with pytest.raises(TypeError, match="numpy.sinc|numpy.frexp|no GPU kernel"):
        np.frexp(ga)
    with pytest.raises(TypeError, match="not supported"):
        np.add(ga, ga, where=True)


# ----------------------------------------------------------------------------- methods

def test_reshape_of_strided_data_is_a_view_where_numpy_makes_one(dev):
    """A column block of a wider array (attention's q, k, v cut from one product) splits
    its last axis as a view; merging axes that are not contiguous with each other copies."""
    a = _data((4, 6, 12), "float32", 3)
    ga = dev(a)
    block = ga[:, :, 4:8]                                 # strides (288, 48, 4): not contiguous
    r = block.reshape(4, 6, 2, 2)
    assert r.ptr == block.ptr and r.strides == (288, 48, 8, 4)
    dev.check(r, a[:, :, 4:8].reshape(4, 6, 2, 2))
    merged = ga[:, 1:5].reshape(4, 48)                    # rows of one plane merge: a view
    assert merged.ptr == ga[:, 1:5].ptr
    dev.check(merged, a[:, 1:5].reshape(4, 48))
    copied = block.reshape(4, 24)            # rows 48 bytes apart, each 16 bytes long: a copy
    assert copied.ptr != block.ptr and copied.is_c_contiguous
    dev.check(copied, a[:, :, 4:8].reshape(4, 24))


def test_nocopy_strides_agrees_with_numpy():
    from symgpu.gpu.runtime.array import nocopy_strides
    rng = np.random.default_rng(1)
    for _ in range(500):
        shape = tuple(int(n) for n in rng.integers(1, 4, rng.integers(1, 4)))
        base = np.zeros(tuple(2 * n for n in shape), "float32")
        a = base[tuple(slice(int(rng.integers(0, 2)), None, int(rng.integers(1, 3)))
                       for _ in shape)]
        if rng.random() < 0.3:
            a = a.transpose(rng.permutation(a.ndim))
        new, rest = [], a.size
        for _ in range(int(rng.integers(0, 3))):
            k = int(rng.choice([d for d in range(1, rest + 1) if rest % d == 0]))
            new.append(k)
            rest //= k
        new = tuple(new + [rest])
        view = a.view()
        try:
            view.shape = new
            want = view.strides
        except AttributeError:
            want = None
        got = nocopy_strides(a.shape, a.strides, new)
        assert (got is None) == (want is None), (a.shape, a.strides, new, got, want)
        if got is not None:
            np.testing.assert_array_equal(
                np.lib.stride_tricks.as_strided(a, new, got), a.reshape(new))


def test_astype_copy_reshape_transpose_and_scalars(dev):
    a = _data((2, 6), "float32", 14)
    ga = dev(a)
    for dt in ["int32", "float64", "float16", "bool", "uint8"]:
        src = np.abs(a) if dt == "uint8" else a
        dev.check(dev(src).astype(dt), src.astype(dt))
    bf = ga.astype(BFLOAT16)
    assert bf.dtype == BFLOAT16
    np.testing.assert_allclose(bf.astype("float32").get(), a.astype(BFLOAT16).astype("float32"))
    dev.check((bf * 2).astype("float32"), (a.astype(BFLOAT16) * 2).astype("float32"),
              rtol=1e-2)
    assert ga.astype("float32", copy=False) is ga
    c = ga.copy()
    assert c.ptr != ga.ptr
    dev.check(c, a)
    r = ga.reshape(3, 4)
    assert r.ptr == ga.ptr                               # a view of contiguous data
    dev.check(r, a.reshape(3, 4))
    dev.check(ga.T, a.T)
    dev.check(ga.T.reshape(-1), a.T.reshape(-1))         # a copy for strided data
    dev.check(ga.T * 2, a.T * 2)
    one = dev(np.array([2.5], "float32"))
    assert float(one) == 2.5 and int(one) == 2 and bool(one)
    with pytest.raises(ValueError, match="ambiguous"):
        bool(ga)
    with pytest.raises(TypeError, match="one element"):
        float(ga)


def test_kernels_are_made_once_per_signature(dev):
    from symgpu.gpu.ops import array_math
    a, b = dev(np.ones((3, 3), "float32")), dev(np.ones((5, 2), "float32"))
    a + 1
    n = len(array_math._LAUNCHERS)
    for x in (a, b, a.T):
        x + 2.0
        x + 3.0
    assert len(array_math._LAUNCHERS) == n      # same dtypes and operand kinds: same node
    a.sum(axis=0)
    m = len(array_math._LAUNCHERS)
    a.T.sum(axis=0)
    assert len(array_math._LAUNCHERS) == m


def test_operands_on_two_contexts_are_refused(dev):
    from emulated_gpu import EmulatedCtx
    other = EmulatedCtx()
    a = dev(np.ones(3, "float32"))
    b = device_array(other, np.ones(3, "float32"))
    with pytest.raises(ValueError, match="different GPU contexts"):
        a + b


def test_byte_extent_spans_negative_and_broadcast_strides():
    from types import SimpleNamespace
    from symgpu.gpu.runtime.array import byte_extent
    view = lambda shape, strides: SimpleNamespace(ptr=1000, shape=shape,  # noqa: E731
                                                  strides=strides, itemsize=4)
    assert byte_extent(view((3, 4), (16, 4))) == (1000, 1048)
    assert byte_extent(view((3, 4), (-16, 4))) == (968, 1016)     # a reversed row order
    assert byte_extent(view((3, 4), (0, 4))) == (1000, 1016)       # a broadcast row
    assert byte_extent(view((), ())) == (1000, 1004)
