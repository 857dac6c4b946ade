"""Uploads from the user's own registered host memory (symgpu/gpu/runtime/host_register.py).

CPU tests drive a HostRegistry with a stand-in driver that records registrations; GPU tests
(``pytest -m gpu``) check that functions fed the same array, modified in place between calls,
give NumPy's results and that its memory really was registered.
"""
from __future__ import annotations

import numpy as np

from gpu_helpers import requires_gpu
from symgpu.gpu.runtime.host_register import HostRegistry, root_of

MIN = 1024


class RecordingDriver:
    """Stands in for cuMemHostRegister/cuMemHostUnregister; ``refuse``: addresses to fail."""

    def __init__(self, refuse=()):
        self.calls: list[tuple] = []
        self.locked: dict[int, int] = {}
        self.refuse = set(refuse)

    def register(self, ptr, nbytes):
        self.calls.append(("register", ptr, nbytes))
        if ptr in self.refuse:
            return 712   # CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        assert ptr not in self.locked, "registered twice"
        self.locked[ptr] = nbytes
        return 0

    def unregister(self, ptr):
        self.calls.append(("unregister", ptr))
        assert ptr in self.locked, "unregistered memory that was not registered"
        del self.locked[ptr]
        return 0


def address(a):
    return a.__array_interface__["data"][0]


def registrations(driver):
    return [c for c in driver.calls if c[0] == "register"]


def test_a_repeated_array_is_registered_once_on_its_second_upload():
    drv = RecordingDriver()
    reg = HostRegistry(drv, min_bytes=MIN)
    x = np.ones((64, 64), np.float32)
    assert reg.is_registered(x) is False        # first sighting: pageable
    assert drv.calls == []
    for _ in range(5):
        assert reg.is_registered(x) is True
    assert drv.calls == [("register", address(x), x.nbytes)]
    assert reg.held_bytes == x.nbytes


def test_fresh_arrays_are_never_registered():
    drv = RecordingDriver()
    reg = HostRegistry(drv, min_bytes=MIN)
    keep = []
    for i in range(40):
        a = np.full((64, 64), i, np.float32)
        keep.append(a) if i % 2 else None      # some kept alive, some freed and reused
        assert reg.is_registered(a) is False
    assert drv.calls == []
    assert len(reg.seen) <= 32


def test_small_arrays_keep_the_plain_copy():
    drv = RecordingDriver()
    reg = HostRegistry(drv, min_bytes=MIN)
    small = np.ones(MIN // 4 - 1, np.float32)
    for _ in range(3):
        assert reg.is_registered(small) is False
    assert drv.calls == []


def test_slices_of_a_data_set_share_the_registration_of_its_root():
    drv = RecordingDriver()
    reg = HostRegistry(drv, min_bytes=MIN)
    data = np.arange(100 * 64, dtype=np.float32).reshape(100, 64)
    batches = [data[i * 10:(i + 1) * 10] for i in range(10)]
    assert root_of(batches[3]) is root_of(data)
    assert reg.is_registered(batches[0]) is False
    assert all(reg.is_registered(b) for b in batches[1:])
    assert registrations(drv) == [("register", address(data), data.nbytes)]  # one, whole


def test_eviction_past_the_byte_bound_unregisters_the_least_recently_used():
    drv = RecordingDriver()
    a, b, c = (np.ones((64, 64), np.float32) for _ in range(3))
    reg = HostRegistry(drv, min_bytes=MIN, max_bytes=2 * a.nbytes)
    for arr in (a, a, b, b):
        reg.is_registered(arr)
    assert reg.is_registered(a)               # a is now the most recently used
    reg.is_registered(c)
    assert reg.is_registered(c)                # c evicts b, not a
    assert ("unregister", address(b)) in drv.calls
    assert set(drv.locked) == {address(a), address(c)}
    assert reg.held_bytes == 2 * a.nbytes
    assert reg.is_registered(a)
    reg.release()
    assert drv.locked == {} and reg.held_bytes == 0 and not reg.held


def test_a_registered_array_is_kept_alive_until_released():
    import gc
    import weakref
    drv = RecordingDriver()
    reg = HostRegistry(drv, min_bytes=MIN)
    x = np.ones((64, 64), np.float32)
    reg.is_registered(x)
    reg.is_registered(x)
    ref = weakref.ref(x)
    del x
    gc.collect()
    assert ref() is not None                  # its memory stays locked: it may not be freed
    reg.release()
    gc.collect()
    assert ref() is None


def test_modifying_a_registered_array_in_place_keeps_one_registration():
    drv = RecordingDriver()
    reg = HostRegistry(drv, min_bytes=MIN)
    x = np.zeros((64, 64), np.float32)
    for i in range(4):
        x[...] = i                             # the batch refilled in place
        reg.is_registered(x)
    assert len(registrations(drv)) == 1


def test_memory_the_driver_refuses_keeps_the_pageable_path_without_retrying():
    x = np.ones((64, 64), np.float32)
    drv = RecordingDriver(refuse={address(x)})
    reg = HostRegistry(drv, min_bytes=MIN)
    for _ in range(4):
        assert reg.is_registered(x) is False
    assert len(registrations(drv)) == 1


def test_an_array_over_a_max_bound_is_never_registered():
    drv = RecordingDriver()
    reg = HostRegistry(drv, min_bytes=MIN, max_bytes=MIN)
    x = np.ones((64, 64), np.float32)
    for _ in range(3):
        assert reg.is_registered(x) is False
    assert drv.calls == []


# ============================================================================ GPU tests

@requires_gpu
def test_upload_of_a_repeated_array_is_registered_and_follows_in_place_changes(cuda):
    from symgpu.gpu.runtime.array import to_gpu
    from symgpu.gpu.runtime.host_register import registry_for
    x = np.random.default_rng(0).standard_normal((400, 784)).astype(np.float32)
    for i in range(4):
        x[0, :] = i
        np.testing.assert_array_equal(to_gpu(x, cuda).get(), x)
    assert (address(x), x.nbytes) in registry_for(cuda).held
    assert _memory_type(address(x)) == 1   # the driver sees page-locked host memory


@requires_gpu
def test_function_fed_one_array_modified_in_place_matches_numpy(cuda):
    import symgpu
    import symgpu.tensor as T
    from symgpu.gpu.runtime.host_register import registry_for
    rng = np.random.default_rng(1)
    X = rng.standard_normal((400, 784)).astype(np.float32)
    w = rng.standard_normal(784).astype(np.float32)
    x = T.fmatrix("x")
    ws = symgpu.shared(w, name="w")
    f = symgpu.function([x], [T.tanh(T.dot(x, ws)), x.sum(axis=0)])
    g = symgpu.function([x], T.exp(x[:3]) * 2)     # result left on the device
    for i in range(5):
        X[:, i] += 1.5                              # changed in place between calls
        p, s = f(X)
        np.testing.assert_allclose(p, np.tanh(X @ w), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(s, X.sum(axis=0), rtol=1e-4, atol=1e-3)
        expected = np.exp(X[:3]) * 2
        held = g(X)
        X[:3] = -7.0                                # right after the call: must not leak in
        np.testing.assert_allclose(np.asarray(held), expected, rtol=1e-5)
        X[:3] = rng.standard_normal((3, 784)).astype(np.float32)
    assert (address(X), X.nbytes) in registry_for(cuda).held



def _memory_type(ptr: int) -> int:
    """CU_POINTER_ATTRIBUTE_MEMORY_TYPE of ``ptr`` (1: host, i.e. page-locked host memory)."""
    import ctypes
    from symgpu.gpu.runtime.libcuda import cdll, declare
    fn = declare(cdll(), "cuPointerGetAttribute",
                 [ctypes.c_void_p, ctypes.c_int, ctypes.c_ulonglong])
    out = ctypes.c_uint(0)
    status = fn(ctypes.addressof(out), 2, ptr)   # CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    assert status == 0, status
    return out.value
