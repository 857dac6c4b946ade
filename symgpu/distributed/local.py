"""Data parallel over several GPUs driven by one process: rank r is the GPU context named
``contexts[r]`` (``contexts=dev0->cuda0;dev1->cuda1``) and runs in a thread of its own.

Why threads: NCCL lets one thread drive one GPU of a clique without group calls, and the
first collective of a communicator connects to its peers, blocking until they call too; one
thread per context keeps every rank's launches independent, as one process per GPU does.
The ranks' code is the multi-process code (``data_parallel``, ``broadcast_parameters``,
``get_rank()``), with the rank's context named where a value is placed (``target=``,
``.transfer``).  The ranks share an in-process store (NCCL's unique id, schedule checks);
on real GPUs each rank gets an NCCL communicator on its context, made in its thread.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from symgpu.config import config
from symgpu.distributed.communicator import Communicator, DistributedError, ThreadWorld
from symgpu.distributed.env import LaunchInfo
from symgpu.distributed.runtime import _BACKENDS

__all__ = ["LocalWorld", "local_world", "register_context_lookup"]


#: the name of the default device's rank (``shared``'s default ``target``)
DEFAULT = "default"


#: the GPU backend's context lookup (symgpu/gpu/ops/collectives.py registers it with the
#: nccl backend): name -> context (None: the default one, or None where there is none)
_LOOKUP: list[Callable[[str | None], Any]] = []


class LocalWorld(ThreadWorld):
    """A world of ``len(contexts)`` ranks in this process, rank r on context ``contexts[r]``.
    ``run(fn)`` calls ``fn(rank)`` in one thread per rank, that rank's context current and
    its communicator bound (``get_rank()``, collectives and ``data_parallel`` see it), and
    returns the results in rank order (the lowest rank's exception is re-raised)."""

    def __init__(self, contexts: Sequence[str], backend: str = "auto",
                 timeout: float | None = None) -> None:
        names = list(contexts)
        if not names:
            raise ValueError("local_world needs at least one context name")
        if len(set(names)) != len(names):
            raise ValueError(f"local_world: a context named twice in {names}")
        super().__init__(len(names), float(config.distributed.timeout if timeout is None
                                           else timeout))
        self.contexts = names
        self._ctx = [_context(name) for name in names]
        self.backend = _backend(backend, self._ctx)
        self._device: list[Communicator | None] = [None] * self.world_size
        self.closed = False
        if self.backend == "nccl":
            self._device = list(super().run(self._make_nccl))

    def context(self, rank: int) -> str:
        """The context name of ``rank`` (for ``target=`` and ``.transfer``)."""
        return self.contexts[rank]

    def communicator(self, rank: int) -> Communicator:
        return self._device[rank] or super().communicator(rank)

    def run(self, fn: Callable[[int], Any], ranks: Sequence[int] | None = None,
            group: str = "world") -> list[Any]:
        if self.closed:
            raise DistributedError("this local world was closed")

        def on_its_context(r: int) -> Any:
            ctx = self._ctx[r]
            if ctx is not None and not ctx.virtual:
                ctx.activate()
            return fn(r)
        return super().run(on_its_context, ranks, group)

    def close(self) -> None:
        """Tear the NCCL communicators down (each in its rank's thread: NCCL's teardown of a
        clique waits for every rank's) and forget the store."""
        if self.closed:
            return
        if any(c is not None for c in self._device):
            self.run(lambda r: self._device[r].close())
        self.closed = True

    def _make_nccl(self, rank: int) -> Communicator:
        ctx = self._ctx[rank]
        ctx.activate()
        info = LaunchInfo(rank, self.world_size, local_rank=rank,
                          local_world_size=self.world_size, launcher="local_world")
        return _BACKENDS["nccl"](info, super().communicator(rank), self.timeout, context=ctx)

    def __enter__(self) -> "LocalWorld":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def local_world(contexts: Sequence[str] | None = None, backend: str = "auto",
                timeout: float | None = None) -> LocalWorld:
    """A world of one rank per GPU context of this process (default: every name of the
    ``contexts`` flag, in its order; with none, a world of one on the default device, named
    ``'default'`` as ``shared(target=)`` names it, so the program also runs on the CPU).
    ``backend='auto'``: NCCL when every context is a real GPU, else the in-process host
    collectives ('store')."""
    if contexts is None:
        contexts = list(config.context_map()) or [DEFAULT]
    return LocalWorld(contexts, backend, timeout)


def register_context_lookup(lookup: Callable[[str | None], Any]) -> None:
    """How a local world finds its contexts (the GPU backend's; distributed imports no GPU)."""
    _LOOKUP[:] = [lookup]


def _context(name: str) -> Any:
    """The GPU context registered as ``name``; for ``'default'``, the default context, or
    None on the CPU (device=cpu, or no usable GPU)."""
    if name == DEFAULT:
        return None if str(config.device) == "cpu" or not _LOOKUP else _LOOKUP[0](None)
    if not _LOOKUP:
        raise DistributedError(f"local_world: no GPU context named {name!r}: the GPU backend "
                               f"is not loaded (name the contexts with the contexts flag, e.g. "
                               f"contexts={name}->cuda0)")
    return _LOOKUP[0](name)


def _backend(backend: str, contexts: list[Any]) -> str:
    real = all(c is not None and not c.virtual for c in contexts)
    if backend == "auto":
        return "nccl" if real and "nccl" in _BACKENDS else "store"
    if backend == "nccl":
        if "nccl" not in _BACKENDS or not real:
            raise DistributedError("local_world(backend='nccl') needs every context on a real "
                                   "GPU and the GPU backend loaded")
        return backend
    if backend == "store":
        return backend
    raise ValueError(f"unknown backend {backend!r}: auto, nccl, store")
