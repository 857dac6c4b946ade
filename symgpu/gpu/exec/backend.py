"""The GPU package as a device backend of the compiler (symgpu/compile/devices.py): which
contexts are in use, whether the default one is, and which nodes a captured graph may hold."""
from __future__ import annotations

from typing import Any

from symgpu.compile.devices import register_backend
from symgpu.gpu.exec.graph_plan import node_capturable
from symgpu.gpu.placement.type import default_context_active
from symgpu.gpu.runtime import context as _context

__all__ = ["GPU_BACKEND"]


class _GpuBackend:
    def contexts_in_use(self) -> list[str | None]:
        return _context.context_names()

    def default_context_active(self) -> bool:
        return default_context_active()

    def node_capturable(self, node: Any, thunk: Any) -> bool:
        return node_capturable(node, thunk)


GPU_BACKEND = _GpuBackend()
register_backend(GPU_BACKEND)
