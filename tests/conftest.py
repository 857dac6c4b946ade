"""Test-session set-up: GPU tests skip, with the reason, where no GPU can be used."""
import sys

import pytest


def pytest_collection_modifyitems(config, items):
    multi_items = [item for item in items if "multigpu" in item.keywords]
    if multi_items:
        from symgpu.gpu.runtime.context import device_count, why_unavailable
        n = device_count()
        if n < 2:
            why = why_unavailable() or f"this machine has {n} CUDA device"
            reason = pytest.mark.skip(reason=f"needs two or more NVIDIA GPUs: {why}")
            for item in multi_items:
                item.add_marker(reason)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    from symgpu.gpu.runtime.context import gpu_available, why_unavailable
    if gpu_available():
        return
    reason = pytest.mark.skip(reason=f"needs a usable NVIDIA GPU: {why_unavailable()}")
    for item in gpu_items:
        item.add_marker(reason)


@pytest.fixture
def fast_thread_switching():
    """The interpreter's thread switch interval made tiny, so that threads interleave inside
    calls (with the default 5 ms, a race needs many thousands of calls to show)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


@pytest.fixture
def cuda():
    """The machine's GPU registered as the default context, with device=cuda (GPU tests)."""
    from gpu_helpers import real_default_gpu
    from symgpu.config import config
    with real_default_gpu() as ctx, config.change_flags(device="cuda", floatX="float32"):
        yield ctx


@pytest.fixture
def vgpu():
    """A virtual default GPU context (float32): graphs compile for the GPU, nothing runs."""
    from symgpu.config import config
    from symgpu.gpu.placement.rewriting import virtual_context
    with config.change_flags(floatX="float32"), virtual_context(None) as ctx:
        yield ctx


# ----------------------------------------------------------------------------- C kernels
@pytest.fixture
def spy(monkeypatch):
    """Records what the trampoline answered on every call of a C thunk built in the test:
    True (the C loop ran) or False (the thunk took its NumPy fallback)."""
    from symgpu.link import c_runtime
    calls = []

    def spied(real):
        def run(address, tags, *arrays):
            ok = real(address, tags, *arrays)
            calls.append(ok)
            return ok
        return run

    run, run_sized = spied(c_runtime.runner()), spied(c_runtime.sized_runner())
    monkeypatch.setattr(c_runtime, "runner", lambda: run)
    monkeypatch.setattr(c_runtime, "sized_runner", lambda: run_sized)
    return calls


@pytest.fixture
def private_compiledir(tmp_path, monkeypatch):
    """A fresh compiledir (mode 0700) and empty in-memory caches: every kernel compiles."""
    import symgpu
    from symgpu.link import cc
    from symgpu.tensor import c_elemwise
    tmp_path.chmod(0o700)
    monkeypatch.setattr(cc, "_libraries", {})
    monkeypatch.setattr(c_elemwise, "_failed", set())
    with symgpu.config.change_flags(compiledir=str(tmp_path)):
        yield tmp_path


@pytest.fixture
def gpt_step(monkeypatch):
    """A builder of benchmarks/half.py's mixed-precision GPT block step (``build(**flags)``:
    compiled for device=cuda under those flags, on whatever context the test gives)."""
    import os
    from symgpu import config as symgpu_config
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.syspath_prepend(os.path.join(root, "benchmarks"))
    import half_symgpu

    def build(**flags):
        with symgpu_config.change_flags(device="cuda", mixed_precision="bfloat16", **flags):
            step, _, _ = half_symgpu.gpt({})
        return step
    yield build
    sys.modules.pop("half_symgpu", None)
