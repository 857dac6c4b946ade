"""GPU functions called from several threads (docs/threads.md: one call at a time per
context) and what callers may keep (graph ownership without reference counts), on a GPU.
The CPU side of the same machinery is tested with fakes in test_gpu_graph_runner.py and
test_gpu_context_threads.py."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np

from gpu_helpers import requires_gpu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@requires_gpu
def test_gpu_calls_from_eight_threads_are_right_and_lose_no_update(cuda):
    import symgpu
    import symgpu.tensor as T
    x = symgpu.shared(np.arange(1000, dtype="float32"))
    w = symgpu.shared(np.zeros(4, "float32"))
    f = symgpu.function([], T.exp(x * np.float32(0.001)) * 2)
    g = symgpu.function([], w.sum(), updates=[(w, w + 1)])
    want = np.exp(np.arange(1000, dtype="float32") * np.float32(0.001)) * 2
    errors: list = []

    def work() -> None:
        try:
            for _ in range(200):
                np.testing.assert_allclose(f(), want, rtol=1e-5)
                g()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    np.testing.assert_array_equal(w.get_value(), np.full(4, 1600, "float32"))


@requires_gpu
def test_a_worker_thread_that_called_a_gpu_function_ends_cleanly(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""
        import threading
        import numpy as np
        import symgpu, symgpu.tensor as T
        x = symgpu.shared(np.ones(8, "float32"))
        f = symgpu.function([], T.exp(x))
        out = []
        t = threading.Thread(target=lambda: out.append(f()))
        t.start()
        t.join()
        assert np.allclose(out[0], np.e)
        print("worker done")
    """))
    env = dict(os.environ, PYTHONPATH=REPO, SYMGPU_FLAGS="device=cuda,floatX=float32")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "worker done" in proc.stdout, proc.stderr[-2000:]


@requires_gpu
def test_gpu_inputs_passed_per_call_replay_one_graph(cuda):
    """GPU arrays passed as inputs, a new one per call: staged into the graph's own buffers,
    so the calls replay (keys hold shapes, not pointers), and the values follow the inputs."""
    import symgpu
    import symgpu.tensor as T
    from symgpu.gpu.runtime.array import to_gpu
    from symgpu.gpu.placement.type import GpuArrayType
    xg = GpuArrayType("float32", (False,), None)("x")
    f = symgpu.function([xg], (T.exp(xg) * 2).sum())
    rng = np.random.default_rng(4)
    for _ in range(12):
        h = rng.random(5000).astype("float32")
        got = f(to_gpu(h, cuda))
        np.testing.assert_allclose(got, (np.exp(h.astype("float64")) * 2).sum(), rtol=1e-4)
    st = f.vm.runner.stats()
    assert st["replays"] >= 8 and st["captures"] <= 2, st


@requires_gpu
def test_gpu_results_kept_by_the_caller_are_never_overwritten(cuda):
    import symgpu
    import symgpu.tensor as T
    from symgpu import Out
    from symgpu.gpu.placement.basic_ops import gpu_from_host
    x = symgpu.shared(np.zeros(1000, "float32"))
    f = symgpu.function([], Out(gpu_from_host(x + 1), borrow=True), updates=[(x, x + 1)])
    kept = [f() for _ in range(10)]
    views = [k[:3] for k in kept]
    del kept
    for _ in range(10):
        f()
    for i, v in enumerate(views):
        np.testing.assert_array_equal(v.get(), np.full(3, i + 1, "float32"))
    np.testing.assert_array_equal(x.get_value()[:3], np.full(3, 20, "float32"))
