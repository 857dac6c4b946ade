"""Test-session set-up: GPU tests skip, with the reason, where no GPU can be used."""
import pytest


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    from symgpu.gpu.context import gpu_available, why_unavailable
    if gpu_available():
        return
    reason = pytest.mark.skip(reason=f"needs a usable NVIDIA GPU: {why_unavailable()}")
    for item in gpu_items:
        item.add_marker(reason)


@pytest.fixture
def cuda():
    """The machine's GPU registered as the default context, with device=cuda (GPU tests)."""
    from symgpu.config import config
    from symgpu.gpu import context as gctx
    ctx = gctx.start_device("cuda0")
    assert not ctx.virtual, "GPU tests must run on a real device"
    prev = gctx.get_context(None) if None in gctx.context_names() else None
    gctx.register_context(None, ctx)
    try:
        with config.change_flags(device="cuda", floatX="float32"):
            yield ctx
    finally:
        if prev is not None:
            gctx.register_context(None, prev)
        else:
            gctx.unregister_context(None)
