"""Large uploads go through a pinned buffer and an asynchronous copy (gpu/array.py
``_staged_upload``): the buffer stays out of the pinned pool until the event recorded after
its copy has completed.  Checked with a stand-in pycuda.driver on the CPU, and on a GPU
(uploads of a host array rewritten between calls arrive intact)."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from symgpu.gpu import array as garray
from symgpu.gpu.pool import PinnedPool
from tests.gpu_helpers import requires_gpu


class _FakeEvent:
    def __init__(self, flags=0):
        self.done = False
        self.records = 0

    def record(self, stream=None):
        self.done = False
        self.records += 1

    def query(self):
        return self.done


class _Ctx:
    stream = "stream"

    def __init__(self, pool):
        self.pinned = pool


@pytest.fixture
def fake_driver(monkeypatch):
    copies = []
    fake = types.ModuleType("pycuda.driver")
    fake.Event = _FakeEvent
    fake.event_flags = types.SimpleNamespace(DISABLE_TIMING=2)

    def memcpy_htod_async(ptr, buf, stream):
        copies.append((ptr, bytes(buf), buf.__array_interface__["data"][0], stream))
    fake.memcpy_htod_async = memcpy_htod_async
    pkg = types.ModuleType("pycuda")
    pkg.driver = fake
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", fake)
    return copies


def test_upload_is_staged_and_its_buffer_held_until_the_copy_completes(fake_driver):
    pool = PinnedPool(alloc=lambda n: np.zeros(n, np.uint8))
    ctx = _Ctx(pool)
    host = np.arange(400 * 784, dtype="float32").reshape(400, 784)
    assert garray._staged_upload(ctx, 1234, host)
    ((ptr, data, buf_addr, stream),) = fake_driver
    assert ptr == 1234 and stream == "stream" and data == host.tobytes()
    flights = ctx._sg_uploads
    assert len(flights.pending) == 1 and pool.bytes_leased >= host.nbytes
    # the copy has not run yet: a second upload must not reuse the first buffer
    host2 = host + 1
    assert garray._staged_upload(ctx, 1234, host2)
    assert fake_driver[1][2] != buf_addr and fake_driver[1][1] == host2.tobytes()
    assert len(flights.pending) == 2
    # both copies done: the next upload gives them back and reuses a buffer and an event
    for event, _ in flights.pending:
        event.done = True
    used = {id(event) for event, _ in flights.pending}
    assert garray._staged_upload(ctx, 99, host)
    assert len(flights.pending) == 1 and len(flights.idle) == 1
    assert {id(flights.pending[0][0]), id(flights.idle[0])} == used   # no new event
    assert pool.n_reused >= 1 and fake_driver[2][2] in (buf_addr, fake_driver[1][2])


def test_upload_falls_back_when_the_pinned_pool_lends_nothing(fake_driver):
    pool = PinnedPool(alloc=lambda n: np.zeros(n, np.uint8), lease_limit=1024)
    ctx = _Ctx(pool)
    assert not garray._staged_upload(ctx, 1, np.zeros(4096, "float32"))
    assert not garray._staged_upload(types.SimpleNamespace(pinned=None), 1,
                                     np.zeros(4096, "float32"))
    assert fake_driver == [] and pool.n_refused == 1


@requires_gpu
def test_staged_uploads_arrive_intact_while_the_host_array_changes():
    from tests.gpu_helpers import real_default_gpu
    with real_default_gpu() as ctx:
        host = np.zeros((400, 784), "float32")
        assert host.nbytes >= garray.UPLOAD_STAGING_MIN
        uploads = []
        for k in range(12):
            host[:] = k                      # rewritten right after each upload is queued
            uploads.append(garray.to_gpu(host, ctx))
        assert getattr(ctx, "_sg_uploads", None) is not None
        assert ctx.pinned.stats()["n_leases"] >= 12   # the staged path was taken
        for k, g in enumerate(uploads):
            np.testing.assert_array_equal(g.get(), np.full((400, 784), k, "float32"))
