"""What the GPU kernel ops (GpuElemwise, GpuCAReduce and the ops built like them) share: their
context by name, their inputs as GPU variables padded to one rank, the thunk of a virtual
context (placement only), the mark of a thunk a CUDA graph may record, and (OneModule) the
sources of an op that launches one generated module.

Why apart: GpuElemwise (elemwise.py) and GpuCAReduce (careduce.py) both use them, and
elemwise.py serves GpuCAReduce under its old path, so they cannot live in either.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from symgpu.gpu.placement.basic_ops import GpuDimShuffle, as_gpuarray_variable
from symgpu.gpu.placement.type import is_gpu_var
from symgpu.gpu.runtime import context as gpu_context
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op

__all__ = ["_context", "_as_gpu", "_pad_inputs", "_virtual_thunk", "_capturable",
           "OneModule"]


def _context(name: str | None) -> Any:
    return gpu_context.get_context(name)


def _as_gpu(x: Any, context_name: Any) -> Variable:
    return as_gpuarray_variable(x, context_name)


def _pad_inputs(inputs: Sequence[Any]) -> tuple[list[Variable], Any]:
    """GPU variables on one context, padded to a common ndim with GpuDimShuffle."""
    ctx_name = next((x.type.context_name for x in inputs if is_gpu_var(x)), None)
    gins = [_as_gpu(x, ctx_name) for x in inputs]
    nd = max((x.ndim for x in gins), default=0)
    padded = []
    for x in gins:
        if x.ndim < nd:
            x = GpuDimShuffle(x.broadcastable, ["x"] * (nd - x.ndim) + list(range(x.ndim)))(x)
        padded.append(x)
    return padded, ctx_name


def _virtual_thunk(op: Op, ctx: Any) -> Callable[[], None]:
    def thunk() -> None:
        raise RuntimeError(f"{op} cannot run: context {ctx.name!r} is virtual (registered "
                           f"without a device); it only describes placement")
    return thunk


def _capturable(thunk: Callable[[], None]) -> Callable[[], None]:
    """Mark a thunk that only takes pool memory and launches on the context's stream, so
    symgpu/gpu/exec/graphs.py may record it into a CUDA graph (``launches``: it queues device work;
    ``capturable``: it never syncs, reads device memory on the host or copies from the host)."""
    thunk.capturable = True   # type: ignore[attr-defined]
    thunk.launches = True     # type: ignore[attr-defined]
    return thunk


class OneModule:
    """Mixin of an op whose node launches one generated module, keyed ``(MODULE,
    signature(node))`` and rendered by the class's ``render(sig, title)``: the sources CI
    compiles (``kernel_sources``) and the kernel prefetch compiles ahead (``prefetch_sources``).
    The row and column reduction groups are such ops."""

    MODULE = ""
    render: Callable[[Any, str], str]

    def kernel_sources(self, node: Apply) -> list[tuple[Any, str]]:
        """(key, source) of the node's one module (CI compiles it)."""
        sig = self.signature(node)   # type: ignore[attr-defined]
        return [((self.MODULE, sig), type(self).render(sig, str(self)))]

    def prefetch_sources(self, node: Apply) -> list[tuple[Any, Callable[[], str], tuple]]:
        """(key, source factory, options) of the module make_thunk loads."""
        sig = self.signature(node)   # type: ignore[attr-defined]
        return [((self.MODULE, sig), lambda: type(self).render(sig, str(self)), ())]
