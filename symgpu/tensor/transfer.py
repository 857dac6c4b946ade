"""`transfer(var, target)`: move a symbolic value between the host and devices.

Why a registry: the tensor layer must not import any backend (backends register
themselves), yet `x.transfer(None)` has to reach the GPU backend. A backend
registers a handler here when it is imported (`symgpu.gpu` does so on `import symgpu`).
"""
from __future__ import annotations

from typing import Any, Callable

from symgpu.graph.basic import Variable
from symgpu.tensor.type import as_tensor_variable
from symgpu.tensor.type import TensorType

__all__ = ["transfer", "register_transfer", "TransferError"]

#: handlers tried newest first: (var, target) -> Variable, or None when not theirs
_HANDLERS: list[Callable[[Variable, Any], Variable | None]] = []


class TransferError(ValueError):
    """A transfer to a target nobody serves (unknown target, or no GPU backend loaded)."""


def register_transfer(handler: Callable[[Variable, Any], Variable | None]
                      ) -> Callable[[Variable, Any], Variable | None]:
    """Register `handler(var, target)`; it returns the moved variable or None to pass."""
    _HANDLERS.insert(0, handler)
    return handler


def transfer(var: Variable, target: Any) -> Variable:
    """`var` on `target`: 'cpu' = the host, None = the default GPU context, or a context name.

    `transfer('cpu')` of a host tensor is the tensor itself (no node is added)."""
    if not isinstance(var, Variable):
        var = as_tensor_variable(var)
    if target == "cpu":
        if isinstance(var.type, TensorType):
            return var
        to_host = getattr(var.type, "as_tensor", None)
        if to_host is not None:
            return to_host(var)
        raise TransferError(f"{var} ({var.type}) has no host form to transfer to 'cpu'")
    if target is not None and not isinstance(target, str):
        raise TransferError(f"transfer target must be 'cpu', None (the default GPU context) or "
                            f"a context name, not {target!r}")
    for handler in _HANDLERS:
        moved = handler(var, target)
        if moved is not None:
            return moved
    if not _HANDLERS:
        raise TransferError(f"cannot transfer {var} to {target!r}: no GPU backend is loaded "
                            "(import symgpu.gpu)")
    raise TransferError(f"no backend serves the transfer target {target!r}")
