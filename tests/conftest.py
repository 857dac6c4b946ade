"""Test-session set-up: GPU tests skip, with the reason, where no GPU can be used."""
import os

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
