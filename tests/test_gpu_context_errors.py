"""Start-up failures of the GPU context (context.py) without a GPU: a fake ``pycuda.driver``
raises what the real one raises. The failures the code expects (no PyCUDA, driver errors, a
failed preallocation) become reasons and GpuUnavailableError; anything else is a bug and
propagates instead of silently turning into "no GPU"."""
from __future__ import annotations

import sys
import types

import pytest

from symgpu.gpu.runtime import context as gctx


class FakeDriverError(Exception):
    """pycuda.driver.Error: the base of LogicError, LaunchError, RuntimeError..."""


def fake_driver(init=None, count=1):
    drv = types.ModuleType("pycuda.driver")
    drv.Error = FakeDriverError
    drv.init = init or (lambda: None)
    drv.Device = types.SimpleNamespace(count=lambda: count)
    return drv


@pytest.fixture
def driver(monkeypatch):
    """Install a fake pycuda.driver and reset the probe around the test."""
    def install(drv):
        pkg = types.ModuleType("pycuda")
        pkg.driver = drv
        monkeypatch.setitem(sys.modules, "pycuda", pkg)
        monkeypatch.setitem(sys.modules, "pycuda.driver", drv)
    monkeypatch.setattr(gctx, "_probe", None)
    monkeypatch.setattr(gctx, "_default_error", None)
    monkeypatch.setattr(gctx, "_devices", {})
    return install


def test_probe_reports_missing_pycuda(monkeypatch):
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    ok, why = gctx._probe_gpu()
    assert not ok and why.startswith("PyCUDA cannot be imported (ModuleNotFoundError")


def test_probe_reports_a_driver_error(driver):
    def init():
        raise FakeDriverError("cuInit failed: no CUDA-capable device is detected")
    driver(fake_driver(init=init))
    ok, why = gctx._probe_gpu()
    assert not ok
    assert why == ("the CUDA driver cannot be initialised (FakeDriverError: cuInit failed: "
                   "no CUDA-capable device is detected)")
    assert gctx.why_unavailable() == why and not gctx.gpu_available()


def test_probe_reports_no_device(driver):
    driver(fake_driver(count=0))
    assert gctx._probe_gpu() == (False, "the CUDA driver reports no device")


def test_probe_lets_a_bug_through(driver):
    def init():
        raise AttributeError("a bug, not a missing GPU")
    driver(fake_driver(init=init))
    with pytest.raises(AttributeError, match="a bug"):
        gctx._probe_gpu()


def test_start_device_wraps_driver_errors_only(driver, monkeypatch):
    driver(fake_driver())

    def start_fails(exc):
        def _start(ordinal):
            raise exc
        monkeypatch.setattr(gctx.GpuContext, "_start", staticmethod(_start))

    start_fails(FakeDriverError("cuCtxCreate failed: out of memory"))
    with pytest.raises(gctx.GpuUnavailableError,
                       match=r"starting cuda0 failed \(FakeDriverError: cuCtxCreate failed"):
        gctx.start_device("cuda0")
    start_fails(MemoryError("preallocating 90% of 80 GiB failed"))
    with pytest.raises(gctx.GpuUnavailableError, match="preallocating"):
        gctx.start_device("cuda0")
    start_fails(KeyError("a bug"))
    with pytest.raises(KeyError, match="a bug"):
        gctx.start_device("cuda0")
    assert gctx._devices == {}


def test_thread_exit_pop_ignores_an_empty_stack(driver, monkeypatch):
    calls = []

    def pop_empty():
        calls.append("pop")
        raise FakeDriverError("cuCtxPopCurrent failed: invalid context")
    drv = fake_driver()
    drv.Context = types.SimpleNamespace(pop=pop_empty)
    driver(drv)
    raised = []
    monkeypatch.setattr(sys, "unraisablehook", raised.append)   # what __del__ would raise
    keeper = gctx._PopAtThreadExit()
    del keeper                                  # __del__ pops: no error, nothing was left
    assert calls == ["pop"] and raised == []
    drv.Context = types.SimpleNamespace(pop=lambda: [][0])    # a bug: reported, not hidden
    keeper = gctx._PopAtThreadExit()
    del keeper
    assert [type(u.exc_value) for u in raised] == [IndexError]
