"""Communicators: what a collective op calls.  A communicator is one rank's end of a world;
its host collectives take and return NumPy arrays.

Why one base: every host collective is an all-gather or a broadcast of bytes followed by NumPy
arithmetic in rank order (so every rank computes bit-identical results), so a transport only
provides ``_gather_bytes`` and ``_broadcast_bytes``: a key-value store (``StoreCommunicator``:
TCP, torchrun's store, or one process's ``MemoryStore`` for the fake worlds of threads the
tests use), or MPI (``MpiCommunicator``).  Correct, not fast: on GPUs NCCL does the work
(symgpu/gpu/ops/collectives.py registers its communicator as the backend ``nccl``).

Which communicator a graph's collectives use is a *group* name resolved when the function is
linked: the thread's binding (``use_communicator``), else the process's (``init`` /
``set_communicator``); the group ``"self"`` is always a world of one rank.
"""
from __future__ import annotations

import contextlib
import io
import threading
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from symgpu.config import config
from symgpu.distributed.store import MemoryStore, Store, StoreTimeout

__all__ = ["Communicator", "StoreCommunicator", "SelfCommunicator", "MpiCommunicator",
           "ThreadWorld", "DistributedError", "DistributedTimeoutError",
           "CollectiveMismatchError", "REDUCE_OPS", "communicator", "set_communicator",
           "use_communicator", "reduce_arrays"]

#: reduce op name -> NumPy reduction over the stacked parts (axis 0, rank order)
REDUCE_OPS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "sum": lambda s: s.sum(axis=0, dtype=s.dtype),
    "prod": lambda s: s.prod(axis=0, dtype=s.dtype),
    "max": lambda s: s.max(axis=0),
    "min": lambda s: s.min(axis=0),
    "avg": lambda s: (s.sum(axis=0, dtype=s.dtype) / s.dtype.type(len(s))).astype(s.dtype),
}


class DistributedError(RuntimeError):
    """A collective or the rendezvous failed (a peer died, an NCCL error, bad arguments)."""


class DistributedTimeoutError(DistributedError, TimeoutError):
    """A peer did not answer within ``distributed.timeout`` seconds."""


class CollectiveMismatchError(DistributedError):
    """The ranks' compiled functions would run different collectives."""


def reduce_arrays(parts: Sequence[np.ndarray], op: str) -> np.ndarray:
    """The reduction of the ranks' arrays in rank order (what every host collective computes)."""
    if op not in REDUCE_OPS:
        raise ValueError(f"unknown reduce op {op!r}; expected one of {sorted(REDUCE_OPS)}")
    return np.array(REDUCE_OPS[op](np.stack(parts)), order="C")   # 0-d stays 0-d


def _pack(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(x, order="C"),
            allow_pickle=False)
    return buf.getvalue()


def _unpack(b: bytes) -> np.ndarray:
    return np.load(io.BytesIO(b), allow_pickle=False)


class Communicator:
    """One rank's end of a world of ``world_size`` ranks.  Host collectives (NumPy in and out):
    ``all_reduce``, ``broadcast``, ``all_gather`` (along axis 0), ``reduce_scatter`` (axis 0
    split into world_size equal parts), ``barrier``, and ``exchange`` (every rank's bytes)."""

    rank: int = 0
    world_size: int = 1
    #: the backend's name ("store", "mpi", "self", "nccl")
    backend = "self"
    #: whether GPU collective ops may run on it (symgpu/gpu/ops/collectives.py)
    supports_device = False

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = float(config.distributed.timeout if timeout is None else timeout)
        self.seq = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank} of {self.world_size}>"

    # -- transport (overridden)
    def _gather_bytes(self, payload: bytes, what: str) -> list[bytes]:
        return [payload]

    def _broadcast_bytes(self, payload: bytes | None, root: int, what: str) -> bytes:
        assert payload is not None
        return payload

    # -- collectives
    def _next(self, kind: str, x: np.ndarray | None) -> str:
        self.seq += 1
        desc = "" if x is None else f" of shape {tuple(x.shape)} ({x.dtype})"
        return f"collective #{self.seq} ({kind}{desc}) on rank {self.rank} of {self.world_size}"

    def _parts(self, x: np.ndarray, what: str) -> list[np.ndarray]:
        parts = [_unpack(b) for b in self._gather_bytes(_pack(x), what)]
        for r, p in enumerate(parts):
            if p.shape != x.shape or p.dtype != x.dtype:
                raise CollectiveMismatchError(
                    f"{what}: rank {r} gave shape {p.shape} ({p.dtype}), rank {self.rank} "
                    f"shape {x.shape} ({x.dtype}); every rank must pass the same shape and dtype")
        return parts

    def all_reduce(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        """The reduction (``op`` in REDUCE_OPS) of every rank's ``x``, on every rank."""
        x = np.asarray(x)
        return reduce_arrays(self._parts(x, self._next(f"all_reduce {op}", x)), op)

    def broadcast(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        """Rank ``root``'s ``x`` on every rank (the others' ``x`` give shape and dtype)."""
        x = np.asarray(x)
        what = self._next(f"broadcast from {root}", x)
        self._check_root(root)
        out = _unpack(self._broadcast_bytes(_pack(x) if self.rank == root else None, root,
                                            what))
        if out.shape != x.shape or out.dtype != x.dtype:
            raise CollectiveMismatchError(f"{what}: the root sent shape {out.shape} "
                                          f"({out.dtype}), this rank expects {x.shape} ({x.dtype})")
        return out

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        """Every rank's ``x`` concatenated along axis 0 in rank order."""
        x = np.asarray(x)
        if x.ndim == 0:
            raise ValueError("all_gather needs at least one dimension to concatenate along")
        return np.concatenate(self._parts(x, self._next("all_gather", x)), axis=0)

    def reduce_scatter(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        """Part ``rank`` of the reduction, axis 0 split into world_size equal parts."""
        x = np.asarray(x)
        what = self._next(f"reduce_scatter {op}", x)
        if x.ndim == 0 or x.shape[0] % self.world_size:
            raise ValueError(f"{what}: the first dimension ({x.shape}) must split into "
                             f"{self.world_size} equal parts")
        full = reduce_arrays(self._parts(x, what), op)
        n = x.shape[0] // self.world_size
        return np.ascontiguousarray(full[self.rank * n:(self.rank + 1) * n])

    def exchange(self, payload: bytes, what: str = "exchange") -> list[bytes]:
        """Every rank's ``payload`` in rank order (small messages: schedules, ids)."""
        return self._gather_bytes(bytes(payload), self._next(what, None))

    def barrier(self) -> None:
        """Return once every rank has called it."""
        self._gather_bytes(b"", self._next("barrier", None))

    def _check_root(self, root: int) -> None:
        if not 0 <= root < self.world_size:
            raise ValueError(f"root {root} is not a rank of a world of {self.world_size}")

    def close(self) -> None:
        """Release what the communicator holds (sockets, NCCL's communicator)."""


class SelfCommunicator(Communicator):
    """A world of one rank (MPI's COMM_SELF): every collective is the identity."""

    backend = "self"


class StoreCommunicator(Communicator):
    """Host collectives through a key-value store: each rank sets its part under
    ``<prefix>/<seq>/<rank>`` and reads the others' (waiting up to ``timeout``).  When a rank
    completes a gathering collective, every rank has reached it, so every part set before it
    has been read: the rank deletes its own older parts then."""

    backend = "store"

    def __init__(self, store: Store, rank: int, world_size: int, timeout: float | None = None,
                 prefix: str = "c") -> None:
        super().__init__(timeout)
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not a rank of a world of {world_size}")
        self.store, self.rank, self.world_size, self.prefix = store, rank, world_size, prefix
        self._mine: list[str] = []

    def _key(self, r: int) -> str:
        return f"{self.prefix}/{self.seq}/{r}"

    def _wait(self, r: int, what: str) -> bytes:
        try:
            return self.store.get(self._key(r), self.timeout)
        except StoreTimeout as exc:
            raise DistributedTimeoutError(
                f"{what}: rank {r} did not answer within {self.timeout:g} s "
                f"(distributed.timeout): it died, hangs, or runs a different program ({exc})"
            ) from exc

    def _forget_older(self) -> None:
        for key in self._mine:
            self.store.delete(key)
        self._mine.clear()

    def _gather_bytes(self, payload: bytes, what: str) -> list[bytes]:
        mine = self._key(self.rank)
        self.store.set(mine, payload)
        out = [payload if r == self.rank else self._wait(r, what)
               for r in range(self.world_size)]
        self._forget_older()
        self._mine.append(mine)
        return out

    def _broadcast_bytes(self, payload: bytes | None, root: int, what: str) -> bytes:
        if self.rank == root:
            assert payload is not None
            self.store.set(self._key(root), payload)
            self._mine.append(self._key(root))
            return payload
        return self._wait(root, what)

    def close(self) -> None:
        self.store.close()


class MpiCommunicator(Communicator):
    """Host collectives through mpi4py (``mpirun``/``srun`` with MPI): lowercase (object)
    allgather and bcast of the packed bytes.  MPI has no timeout: a dead peer makes MPI abort
    the job (its own fault handling)."""

    backend = "mpi"

    def __init__(self, comm: Any = None, timeout: float | None = None) -> None:
        super().__init__(timeout)
        if comm is None:
            from mpi4py import MPI  # deferred: mpi4py is optional (mpirun without torch)
            comm = MPI.COMM_WORLD
        self.comm = comm
        self.rank, self.world_size = int(comm.Get_rank()), int(comm.Get_size())

    def _gather_bytes(self, payload: bytes, what: str) -> list[bytes]:
        return [bytes(b) for b in self.comm.allgather(payload)]

    def _broadcast_bytes(self, payload: bytes | None, root: int, what: str) -> bytes:
        return bytes(self.comm.bcast(payload, root=root))


class ThreadWorld:
    """A fake world of ``world_size`` ranks in one process (each rank a thread), sharing a
    MemoryStore: ``world.communicator(r)`` is rank r's end.  A rank that never calls makes the
    others time out, as a dead process would."""

    def __init__(self, world_size: int, timeout: float | None = None) -> None:
        self.world_size = int(world_size)
        self.store = MemoryStore()
        self.timeout = timeout
        self._comms = [StoreCommunicator(self.store, r, self.world_size, timeout)
                       for r in range(self.world_size)]

    def communicator(self, rank: int) -> StoreCommunicator:
        return self._comms[rank]

    def run(self, fn: Callable[[int], Any], ranks: Sequence[int] | None = None,
            group: str = "world") -> list[Any]:
        """``fn(rank)`` in one thread per rank (each bound to its communicator for
        ``group``); the results in rank order, or the first rank's exception re-raised."""
        ranks = list(range(self.world_size)) if ranks is None else list(ranks)
        results: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}

        def body(r: int) -> None:
            try:
                with use_communicator(self.communicator(r), group):
                    results[r] = fn(r)
            except BaseException as exc:   # re-raised in the caller's thread below
                errors[r] = exc
        threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}") for r in ranks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[min(errors)]
        return [results[r] for r in ranks]


# ----------------------------------------------------------------------------- groups
_GLOBAL: dict[str, Communicator] = {}
_LOCAL = threading.local()
_SELF = SelfCommunicator()


def set_communicator(comm: Communicator | None, group: str = "world") -> None:
    """Make ``comm`` the process's communicator of ``group`` (None: forget it)."""
    if comm is None:
        _GLOBAL.pop(group, None)
    else:
        _GLOBAL[group] = comm


@contextlib.contextmanager
def use_communicator(comm: Communicator, group: str = "world") -> Iterator[Communicator]:
    """Bind ``comm`` to ``group`` in this thread only (fake worlds of threads)."""
    table = getattr(_LOCAL, "table", None)
    if table is None:
        table = _LOCAL.table = {}
    old = table.get(group)
    table[group] = comm
    try:
        yield comm
    finally:
        if old is None:
            table.pop(group, None)
        else:
            table[group] = old


def communicator(group: str = "world") -> Communicator:
    """The communicator of ``group`` in this thread; DistributedError if there is none."""
    comm = getattr(_LOCAL, "table", {}).get(group) or _GLOBAL.get(group)
    if comm is not None:
        return comm
    if group == "self":
        return _SELF
    raise DistributedError(f"no communicator for the group {group!r}: call "
                           f"symgpu.distributed.init() first (known groups: "
                           f"{sorted(set(_GLOBAL) | {'self'})})")
