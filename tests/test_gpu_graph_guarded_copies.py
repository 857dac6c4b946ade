"""The runner's guarded copies back (device_checks.GuardedCopies, graph_segment's capture loop
and plain copy back) in a function with a device-checked op: each call queues one check and
one copy launch for all of its updates, in the graph and in plain calls, and a reported check
stops every one of them. Driven by the fake context, pool and driver of tests/graph_fakes.py
(FakeGuardedCopies runs the kernels' table over the fake memory)."""
from __future__ import annotations

import numpy as np
import pytest

import graph_fakes as fakes
from graph_fakes import FakeElemwise, gvec, read, upload
from test_gpu_graph_direct_updates import linked, sgd, steps


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    yield from fakes.use_fake_gpu(monkeypatch)


def three_updates(monkeypatch):
    """w_k <- w_k - 0.5 * checked(g) for three variables of 1, 5000 and 3 floats."""
    ctx = fakes.CTX_OBJ
    copies = fakes.FakeGuardedCopies().install(monkeypatch, ctx)
    ws = [gvec() for _ in range(3)]
    g = gvec()
    checked = FakeElemwise("idx", lambda a: a * 1, device_checked=True)(g)
    news = [sgd(w, checked) for w in ws]
    sizes = [1, 5000, 3]
    vm, fg = linked([*ws, g], news, [*[upload(ctx, np.zeros(n)) for n in sizes],
                                     upload(ctx, [2])], {0: 0, 1: 1, 2: 2})
    return vm, fg, ws, sizes, copies


def per_call(launches):
    """The launches split into calls (each call's copies start with a check)."""
    calls = []
    for name, capturing, table in launches:
        if name == "check":
            calls.append([])
        calls[-1].append((name, capturing, table))
    return calls


def test_each_call_queues_one_check_and_one_copy_for_all_its_updates(monkeypatch):
    vm, fg, ws, sizes, copies = three_updates(monkeypatch)
    assert vm.runner.device_checked and len(vm.runner.segments) == 1
    steps(vm, fg, 5)                                     # plain, capture, replays
    for w, n in zip(ws, sizes):
        np.testing.assert_allclose(read(vm.storage_map[w][0]), np.full(n, -5.0))
    calls = per_call(copies.launches)
    assert len(calls) == 2                               # the plain call, the capture
    targets = [vm.storage_map[w][0].ptr for w in ws]
    for call, capturing in zip(calls, (False, True)):
        (check, copy) = call
        assert check[:2] == ("check", capturing) and copy[:2] == ("copy", capturing)
        assert [d for d, _, _ in copy[2]] == targets      # in the runner's order
        assert [n for _, _, n in copy[2]] == [4 * n for n in sizes]
    st = vm.runner.stats()
    assert st["captures"] == 1 and st["replays"] == 3, st


def test_a_reported_check_stops_every_copy_of_the_call(monkeypatch):
    vm, fg, ws, sizes, copies = three_updates(monkeypatch)
    steps(vm, fg, 3)                                     # plain, capture, one replay
    before = [read(vm.storage_map[w][0]) for w in ws]
    copies.reported[0] = True                            # the call's index check fails
    steps(vm, fg, 1)
    for w, b in zip(ws, before):
        np.testing.assert_array_equal(read(vm.storage_map[w][0]), b)
    copies.reported[0] = False
    steps(vm, fg, 1)
    for w, b in zip(ws, before):
        np.testing.assert_allclose(read(vm.storage_map[w][0]), b - 1.0)
    assert vm.runner.stats()["replays"] == 3
