"""What the compiler knows of device backends: only what they declare and register.

The compiler sits below the GPU package (symgpu/gpu), so it never imports it. A device
backend registers itself here when it loads (``register_backend``); its types and transfer
ops declare what symgpu/graph/devices.py reads (``context_name``, ``transfer``). With no
backend loaded (a CPU-only run), no device context is in use.
"""
from __future__ import annotations

from typing import Any, Protocol

from symgpu.graph.devices import is_device_node, is_device_var, transfer_kind

__all__ = ["DeviceBackend", "register_backend", "contexts_in_use", "default_context_active",
           "node_capturable", "is_device_var", "is_device_node", "transfer_kind"]


class DeviceBackend(Protocol):
    """What a backend answers for the compiler (the GPU package's: gpu/exec/backend.py)."""

    def contexts_in_use(self) -> list[str | None]:
        """Names of the device contexts in use here (None is the default one)."""

    def default_context_active(self) -> bool:
        """Whether the default context is in use, starting it from the flags if they ask."""

    def node_capturable(self, node: Any, thunk: Any) -> bool:
        """Whether `node`'s thunk may run inside a captured device graph."""


_BACKENDS: list[DeviceBackend] = []


def register_backend(backend: DeviceBackend) -> None:
    """Make `backend` known to the compiler (once; a backend registers when it loads)."""
    if backend not in _BACKENDS:
        _BACKENDS.append(backend)


def contexts_in_use() -> list[str | None]:
    return [n for b in _BACKENDS for n in b.contexts_in_use()]


def default_context_active() -> bool:
    return any(b.default_context_active() for b in _BACKENDS)


def node_capturable(node: Any, thunk: Any) -> bool:
    return any(b.node_capturable(node, thunk) for b in _BACKENDS)
