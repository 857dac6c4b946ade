"""The C kernels' machinery (symgpu.link.cc, symgpu.link.c_runtime,
symgpu.tensor.c_elemwise): the switches that turn C off, the trampoline's refusals, the disk
cache, compile failures, and machines without a compiler or Python's headers."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from c_kernel_helpers import (RNG, assert_close, assert_same, c_thunks, composite,
                              fake_launch_library, fake_launch_record, fused_thunks,
                              link_composite)
import symgpu
import symgpu.tensor as T
from symgpu.link import c_runtime, cc
from symgpu.scalar import ccode
from symgpu.tensor import c_elemwise
from symgpu.tensor.elemwise import Elemwise

if c_runtime.runner() is None:
    pytest.skip(f"C kernels cannot be used here: {c_runtime.unavailable_reason()}",
                allow_module_level=True)


# ----------------------------------------------------------------------------- switches

def test_fast_compile_makes_no_c_thunks():
    comp = composite(["float32", "float32"], [("exp", [0]), ("mul", [2, 1])], [3])
    x, y = T.vector("x", dtype="float32"), T.vector("y", dtype="float32")
    out = Elemwise(comp)(x, y)
    fast = symgpu.function([x, y], out, mode="FAST_COMPILE")
    assert fused_thunks(fast) and not c_thunks(fast)
    run = symgpu.function([x, y], out, mode="FAST_RUN")
    assert c_thunks(run)
    a, b = RNG.randn(5).astype("float32"), RNG.randn(5).astype("float32")
    assert_same(fast(a, b), np.exp(a) * b)
    assert_close(run(a, b), np.exp(a) * b, cancel=True)


def test_allow_c_kernels_false_around_link():
    comp = composite(["float32", "float32"], [("exp", [0]), ("mul", [2, 1])], [3])
    a, b = RNG.randn(5).astype("float32"), RNG.randn(5).astype("float32")
    assert c_elemwise.c_kernels_enabled()
    with c_elemwise.allow_c_kernels(False):
        assert not c_elemwise.c_kernels_enabled()
        vm, (cell,) = link_composite(comp, [a, b])
    assert c_elemwise.c_kernels_enabled()
    assert not getattr(vm.thunks[0], "c_kernel", None)
    vm()
    assert_same(cell[0], np.exp(a) * b)
    vm_c, _ = link_composite(comp, [a, b])
    assert vm_c.thunks[0].c_kernel


def test_allow_c_kernels_false_around_function():
    x, y = T.vector("x", dtype="float32"), T.vector("y", dtype="float32")
    with c_elemwise.allow_c_kernels(False):
        f = symgpu.function([x, y], T.exp(x) * y + 2)
    assert fused_thunks(f)
    assert not c_thunks(f)


# ----------------------------------------------------------------------------- the trampoline

@pytest.fixture(scope="module")
def axpy_address():
    """A kernel computing i0 * i1 + 1 over a full float64 i0 and a scalar i1."""
    comp = composite(["float64", "float64"], [("mul", [0, 1]), ("add", [2, 3])], [4],
                     [(1.0, "float64")])
    return cc.kernel_address(ccode.elemwise_source(comp, "fs"), ccode.SYMBOL, libs=("m",))


TAGS = b"f8s8w8"


def _refused(address, tags, a, s, out):
    before = np.array(out, copy=True)
    assert c_runtime.runner()(address, tags, a, s, out) is False
    np.testing.assert_array_equal(out, before)


def test_sized_trampoline_and_broadcast_kernel_checks():
    """run_sized hands shapes to the kernel, which declines any shape its patterns forbid;
    the trampoline itself refuses strided arrays, wrong item sizes and over 4 dimensions."""
    comp = composite(["float64", "float64"], [("mul", [0, 1]), ("add", [2, 3])], [4],
                     [(1.0, "float64")])
    address = cc.kernel_address(ccode.broadcast_source(comp, ((False, False), (True, False))),
                                ccode.SYMBOL, libs=("m",))
    run = c_runtime.sized_runner()
    a, row = RNG.randn(3, 4), RNG.randn(1, 4)
    out = np.zeros((3, 4))
    assert run(address, b"f8f8w8", a, row, out) is True
    np.testing.assert_array_equal(out, a * row + 1)
    for args in [(a, RNG.randn(3, 4), np.zeros((3, 4))),      # a full row: not the pattern
                 (a, RNG.randn(1, 5), np.zeros((3, 4))),      # wrong length
                 (a, row, np.zeros((3, 5))),                  # output of another shape
                 (a[:, ::2], row[:, :2], np.zeros((3, 2))),   # strided
                 (a.reshape(3, 4, 1, 1, 1), row, np.zeros((3, 4)))]:  # 5 dimensions
        before = args[-1].copy()
        assert run(address, b"f8f8w8", *args) is False
        np.testing.assert_array_equal(args[-1], before)
    assert run(address, b"f4f8w8", a, row, out) is False       # item size


def test_trampoline_runs_good_arrays(axpy_address):
    run = c_runtime.runner()
    a = RNG.randn(5)
    for s in (np.array([2.5]), np.array(2.5), np.array([[2.5]])):
        out = np.full(5, -7.0)
        assert run(axpy_address, TAGS, a, s, out) is True
        assert_same(out, a * 2.5 + 1)
    big = RNG.randn(100_000)  # released GIL path
    out = np.empty_like(big)
    assert run(axpy_address, TAGS, big, np.array([-1.5]), out) is True
    assert_same(out, big * -1.5 + 1)
    empty = np.empty(0)
    assert run(axpy_address, TAGS, empty, np.array([1.0]), np.empty(0)) is True
    m = RNG.randn(3, 4)
    out = np.empty((3, 4))
    assert run(axpy_address, TAGS, m, np.array([3.0]), out) is True
    assert_same(out, m * 3 + 1)


def test_trampoline_refusals_leave_the_output_untouched(axpy_address):
    a, s, out = RNG.randn(6), np.array([2.0]), np.full(6, -7.0)
    _refused(axpy_address, TAGS, a.astype("float32"), s, out)       # itemsize 4, tag says 8
    _refused(axpy_address, TAGS, a, s.astype("float32"), out)
    _refused(axpy_address, TAGS, a, s, out.astype("float32"))
    _refused(axpy_address, TAGS, RNG.randn(12)[::2], s, out)         # not C-contiguous
    _refused(axpy_address, TAGS, a, s, np.full(12, -7.0)[::2])
    _refused(axpy_address, TAGS, np.asfortranarray(RNG.randn(2, 3)), s, np.full((2, 3), -7.0))
    _refused(axpy_address, TAGS, a[:5], s, out)                      # shapes differ
    _refused(axpy_address, TAGS, a.reshape(2, 3), s, out)            # ndims differ
    _refused(axpy_address, TAGS, a.reshape(2, 3), s, out.reshape(3, 2))
    _refused(axpy_address, TAGS, a, np.array([2.0, 3.0]), out)       # scalar of 2 elements
    _refused(axpy_address, TAGS, a, np.empty(0), out)
    _refused(axpy_address, TAGS, list(a), s, out)                    # not a buffer
    frozen = np.full(6, -7.0)
    frozen.flags.writeable = False
    _refused(axpy_address, TAGS, a, s, frozen)                       # read-only output
    run = c_runtime.runner()
    with pytest.raises(ValueError):
        run(axpy_address, b"f8s8", a, s, out)
    with pytest.raises(TypeError):
        run(axpy_address)


def test_pointer_pair_caller_calls_a_c_function_with_two_pointers():
    """call_pp, the CUDA-graph replay's way to cuGraphLaunch, checked on libc's strcmp:
    the pointers reach the function and its int status comes back."""
    import ctypes
    call_pp = c_runtime.pointer_pair_caller()
    strcmp = ctypes.cast(ctypes.CDLL(None).strcmp, ctypes.c_void_p).value
    same, other = ctypes.create_string_buffer(b"graph"), ctypes.create_string_buffer(b"graph")
    later = ctypes.create_string_buffer(b"grape")
    at = ctypes.addressof
    assert call_pp(strcmp, at(same), at(other)) == 0
    assert call_pp(strcmp, at(same), at(later)) > 0
    assert call_pp(strcmp, at(later), at(same)) < 0
    with pytest.raises(TypeError, match=r"call_pp\(address, first, second\)"):
        call_pp(strcmp, at(same))
    with pytest.raises(ValueError, match="address is 0"):
        call_pp(0, at(same), at(other))
    with pytest.raises(TypeError):
        call_pp(strcmp, "graph", at(other))


def test_kernel_launcher_hands_cuLaunchKernel_its_arguments_and_one_parameter_buffer():
    """launch_kernel, each plain GPU launch's way to cuLaunchKernel, checked on a stand-in
    with cuLaunchKernel's signature: the handle, dimensions, stream and the packed
    parameters (as the extra buffer) arrive; the status comes back; bad calls are refused."""
    import struct
    launch = c_runtime.kernel_launcher()
    lib, address = fake_launch_library()
    params = struct.pack("@qPP", 230400, 0x7000, 0x8000)
    assert launch(address, 0x1234, 225, 2, 3, 256, 1, 1, 48, 0x99, params) == 0
    got, passed = fake_launch_record(lib, len(params))
    assert got == [0x1234, 225, 2, 3, 256, 1, 1, 48, 0x99, 0, 1 + 20 + 0, len(params)]
    assert passed == params
    assert launch(address, 0x1234, 999, 1, 1, 1, 1, 1, 0, 0, b"") == 700   # the status
    with pytest.raises(TypeError, match="params: bytes"):
        launch(address, 0x1234, 1, 1, 1, 1, 1, 1, 0, 0, bytearray(params))
    with pytest.raises(ValueError, match="null"):
        launch(address, 0, 1, 1, 1, 1, 1, 1, 0, 0, params)
    with pytest.raises(OverflowError):
        launch(address, 0x1234, 1 << 32, 1, 1, 1, 1, 1, 0, 0, params)
    with pytest.raises(OverflowError):
        launch(address, 0x1234, -1, 1, 1, 1, 1, 1, 0, 0, params)


# ----------------------------------------------------------------------------- compiling

def test_disk_cache_is_reused_without_the_compiler(private_compiledir, monkeypatch):
    src = "int symgpu_test_probe(void) { return 4242; }\n"
    path = cc.build_library(src)
    assert os.path.commonpath([path, str(private_compiledir / "cpu")]) == \
        str(private_compiledir / "cpu")
    assert os.path.exists(path) and os.path.exists(path + ".sha256")

    def no_compiler(*args, **kwargs):
        raise AssertionError("the C compiler was invoked")

    monkeypatch.setattr(cc, "_run", no_compiler)
    monkeypatch.setattr(cc, "_libraries", {})
    lib = cc.load_library(src)
    assert lib.symgpu_test_probe() == 4242
    assert cc.build_library(src) == path
    # the patch is live: other source, or a damaged entry, goes to the compiler
    with pytest.raises(AssertionError, match="compiler was invoked"):
        cc.build_library(src + "/* another */\n")
    damaged = path + ".new"
    with open(damaged, "wb") as fh:
        fh.write(b"not a library")
    os.replace(damaged, path)  # a new inode: the loaded library's mapping stays valid
    with pytest.raises(AssertionError, match="compiler was invoked"):
        cc.build_library(src)


def _broken_source(monkeypatch):
    real = ccode.elemwise_source
    monkeypatch.setattr(ccode, "elemwise_source",
                        lambda c, kinds: real(c, kinds) + "\n#error deliberately broken\n")


def _failing_run(monkeypatch):
    def run(cc_path, source, flags, libs, digest):
        raise cc.CCompileError("the C compiler failed (test)", "test", None)
    monkeypatch.setattr(cc, "_run", run)


@pytest.mark.parametrize("breakage", [_broken_source, _failing_run])
def test_compile_failure_falls_back_with_a_warning(breakage, private_compiledir, monkeypatch):
    breakage(monkeypatch)
    x, y = T.vector("x", dtype="float64"), T.vector("y", dtype="float64")
    out = T.cosh(x) * y - 3
    with pytest.warns(RuntimeWarning, match="did not compile") as record:
        f = symgpu.function([x, y], out)
    ((node, thunk),) = fused_thunks(f)
    assert not getattr(thunk, "c_kernel", None)
    messages = [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]
    assert any(str(node.op.scalar_op) in m for m in messages), messages
    a, b = RNG.randn(7), RNG.randn(7)
    assert_close(f(a, b), np.cosh(a) * b - 3, cancel=True)
    if breakage is _broken_source:
        failed = private_compiledir / "cpu" / "failed"
        assert failed.is_dir() and any(p.suffix == ".c" for p in failed.iterdir())
    if breakage is _failing_run:
        with warnings.catch_warnings():  # warned once per failure, not per function
            warnings.simplefilter("error", RuntimeWarning)
            g = symgpu.function([x, y], out)
        assert not c_thunks(g)


def test_a_compile_failure_warns_once(private_compiledir, monkeypatch):
    _broken_source(monkeypatch)
    x, y = T.vector("x", dtype="float64"), T.vector("y", dtype="float64")
    out = T.cosh(x) * y - 3
    with pytest.warns(RuntimeWarning, match="did not compile"):
        symgpu.function([x, y], out)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        symgpu.function([x, y], out)


@pytest.mark.parametrize("cxx", ["", "no-such-compiler-symgpu"])
def test_without_a_compiler_everything_runs_on_numpy(cxx, tmp_path):
    """cxx empty or naming no program: no compile is attempted, no warning, NumPy results."""
    import subprocess
    import sys
    tmp_path.chmod(0o700)
    code = ("import warnings; warnings.simplefilter('error')\n"
            "import numpy as np, symgpu, symgpu.tensor as T\n"
            "from symgpu.tensor import c_elemwise\n"
            "x = T.dvector('x')\n"
            "f = symgpu.function([x], [T.exp(x) * 2 + 1, (x * x).sum()])\n"
            "a = np.arange(5.0)\n"
            "r = f(a)\n"
            "assert np.allclose(r[0], np.exp(a) * 2 + 1) and np.isclose(r[1], 30.0)\n"
            "assert not c_elemwise.c_kernels_enabled()\n"
            "assert not any(getattr(t, 'c_kernel', None) for t in f.vm.thunks)\n"
            "print('ok')\n")
    env = dict(os.environ, SYMGPU_FLAGS=f"cxx={cxx},compiledir={tmp_path}",
               PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert not (tmp_path / "cpu").exists()  # nothing was compiled


def test_a_compiler_without_python_headers_warns_once_and_numpy_works(monkeypatch):
    monkeypatch.setattr(c_runtime, "_python_include", lambda: "/nonexistent-include")
    c_runtime._load.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="C kernels are off .*Python.h"):
            assert c_runtime.runner() is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert c_runtime.runner() is None and not c_elemwise.c_kernels_enabled()
            x = T.dvector("x")
            f = symgpu.function([x], T.exp(x) * 2 + 1)
        assert not c_thunks(f)
        np.testing.assert_allclose(f(np.arange(3.0)), np.exp(np.arange(3.0)) * 2 + 1)
    finally:
        c_runtime._load.cache_clear()
    monkeypatch.undo()
    assert c_runtime.runner() is not None
