"""A worker thread that activates a GPU context pops it when it ends (PyCUDA aborts a process
whose thread ends with a context on its stack), checked with a stand-in pycuda.driver."""
from __future__ import annotations

import gc
import sys
import threading
import types

from symgpu.gpu.runtime.context import GpuContext


class _FakeDriverContext:
    pops = 0

    @classmethod
    def pop(cls):
        cls.pops += 1


def test_a_worker_thread_pops_its_context_when_it_ends(monkeypatch):
    fake = types.ModuleType("pycuda.driver")
    fake.Context = _FakeDriverContext
    pkg = types.ModuleType("pycuda")
    pkg.driver = fake
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", fake)
    pushes = []

    class PyCtx:
        def push(self):
            pushes.append(threading.get_ident())
    a = GpuContext("a", "cuda0", virtual=False)
    b = GpuContext("b", "cuda0", virtual=False)
    a.pycuda_context = b.pycuda_context = PyCtx()
    _FakeDriverContext.pops = 0

    def work():
        a.activate()
        a.activate()     # already current: nothing
        b.activate()     # pop a, push b: still one context on this thread's stack
    t = threading.Thread(target=work)
    t.start()
    t.join()
    gc.collect()
    assert len(pushes) == 2
    assert _FakeDriverContext.pops == 2      # the switch, then the thread's end
