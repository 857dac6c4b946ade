"""theano.tensor.io.load: an .npy file read when the function runs (LoadFromDisk), its dtype
and broadcastable pattern checked, mmap_mode None or 'c'."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import symgpu
from symgpu.tensor import io as tio


def _save(tmp_path, name, arr):
    path = tmp_path / name
    np.save(path, arr)
    return str(path)


def test_load_a_constant_path(tmp_path):
    arr = np.arange(5, dtype="int64")
    x = tio.load(_save(tmp_path, "a.npy", arr), "int64", (False,))
    assert x.dtype == "int64" and x.broadcastable == (False,)
    np.testing.assert_array_equal(symgpu.function([], x * 2)(), arr * 2)


def test_the_path_given_at_call_time(tmp_path):
    a = _save(tmp_path, "a.npy", np.ones((2, 1), dtype="float32"))
    b = _save(tmp_path, "b.npy", np.full((3, 1), 2, dtype="float32"))
    path = tio.PathType()("path")
    x = tio.load(path, "float32", (False, True))
    assert x.broadcastable == (False, True)
    f = symgpu.function([path], x.sum())
    assert f(a) == 2 and f(b) == 6
    assert f(tmp_path / "b.npy") == 6  # a PathLike is accepted


def test_wrong_dtype_names_the_path(tmp_path):
    p = _save(tmp_path, "f64.npy", np.zeros(3))
    f = symgpu.function([], tio.load(p, "float32", (False,)))
    with pytest.raises(TypeError, match="f64.npy.*float64.*expected float32"):
        f()


def test_broadcastable_pattern_is_checked(tmp_path):
    p = _save(tmp_path, "m.npy", np.zeros((2, 3)))
    with pytest.raises(ValueError, match="m.npy.*broadcastable"):
        symgpu.function([], tio.load(p, "float64", (False, True)))()
    with pytest.raises(ValueError, match="m.npy.*broadcastable"):
        symgpu.function([], tio.load(p, "float64", (False,)))()


def test_npz_is_refused(tmp_path):
    p = str(tmp_path / "z.npz")
    np.savez(p, a=np.zeros(2))
    with pytest.raises(ValueError, match=r"expected a \.npy file"):
        symgpu.function([], tio.load(p, "float64", (False,)))()


def test_mmap_mode(tmp_path):
    arr = np.arange(12.0).reshape(3, 4)
    p = _save(tmp_path, "m.npy", arr)
    node = tio.load(p, "float64", (False, False), mmap_mode="c").owner
    out = [[None]]
    node.op.perform(node, [p], out)
    assert isinstance(out[0][0], np.memmap) and out[0][0].mode == "c"
    f = symgpu.function([], tio.load(p, "float64", (False, False), mmap_mode="c")[1] * 3)
    np.testing.assert_array_equal(f(), arr[1] * 3)
    with pytest.raises(ValueError, match="mmap_mode"):
        tio.load(p, "float64", (False, False), mmap_mode="r+")


def test_bad_path_argument():
    with pytest.raises(TypeError, match="path"):
        tio.load(symgpu.tensor.scalar("s"), "float64", ())
    with pytest.raises(TypeError, match="file name"):
        tio.PathType().filter(3)


def test_op_props_and_pickle(tmp_path):
    op = tio.LoadFromDisk("float64", [False], "c")
    assert op == tio.LoadFromDisk(np.float64, (False,), "c") != tio.LoadFromDisk("float64", (True,))
    assert pickle.loads(pickle.dumps(op)) == op
    assert "float64" in str(op)


def test_the_theano_path_imports(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "theano", symgpu)
    import theano.tensor.io  # noqa: PLC0415
    assert theano.tensor.io.load is tio.load
