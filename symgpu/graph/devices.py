"""Where a value lives and what moves it, read from what types and ops declare.

Backend-neutral: a device type declares ``context_name`` (the device context its values live
on), and a transfer op declares ``transfer`` ("upload", "download" or "device": host to
device, device to host, device to device). Layers below a backend (printing, the compiler)
classify nodes with these, never by class names.
"""
from __future__ import annotations

from typing import Any

__all__ = ["is_device_var", "is_device_node", "transfer_kind", "node_kind"]


def is_device_var(var: Any) -> bool:
    """Whether `var` lives on a device (its type names a context)."""
    return hasattr(var.type, "context_name")


def is_device_node(node: Any) -> bool:
    """Whether `node` reads or makes a device value (a device op, or a transfer)."""
    return any(is_device_var(v) for v in list(node.inputs) + list(node.outputs))


def transfer_kind(op: Any) -> str | None:
    """"upload", "download" or "device" for a transfer op, else None."""
    return getattr(op, "transfer", None)


def node_kind(node: Any) -> str:
    """'transfer', 'gpu' or 'cpu': a transfer op, a node on device values, or a host node."""
    if transfer_kind(node.op) is not None:
        return "transfer"
    return "gpu" if is_device_node(node) else "cpu"
