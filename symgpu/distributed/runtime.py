"""``init`` / ``finalize``: this process joins the world its launcher started.

Rendezvous (where NCCL's unique id and the schedule checks travel), by launcher:

- torchrun: its elastic agent already serves a torch TCPStore on MASTER_ADDR:MASTER_PORT and
  tells the workers (TORCHELASTIC_USE_AGENT_STORE); a server of ours on that port would
  collide, so symgpu is a client of that store (``TorchStore``; torch is importable wherever
  torchrun runs), its keys prefixed ``symgpu/``;
- mpirun/srun with mpi4py: MPI itself (allgather, bcast);
- otherwise (srun without MPI, processes started with the variables set by hand): rank 0
  serves symgpu's own small TCP store on MASTER_ADDR:MASTER_PORT, which nothing else uses.

Backends: ``nccl`` (registered by the GPU backend, symgpu/gpu/ops/collectives.py, when the
device is a GPU), else the host communicator of the rendezvous (``store`` / ``mpi``).
"""
from __future__ import annotations

import ctypes
import importlib.util
from typing import Any, Callable, Mapping

from symgpu.config import config
from symgpu.distributed.communicator import (Communicator, DistributedError, MpiCommunicator,
                                             SelfCommunicator, StoreCommunicator, communicator,
                                             set_communicator)
from symgpu.distributed.env import LaunchError, LaunchInfo, launch_info
from symgpu.distributed.store import TCPStore, TorchStore

__all__ = ["init", "finalize", "get_rank", "get_world_size", "get_local_rank",
           "is_initialized", "register_backend"]

#: name -> factory(info, host communicator, timeout) -> Communicator (GPU backends register)
_BACKENDS: dict[str, Callable[[LaunchInfo, Communicator, float], Communicator]] = {}
_STATE: dict[str, Any] = {"info": None, "comm": None}


def register_backend(name: str, factory: Callable[[LaunchInfo, Communicator, float],
                                                  Communicator]) -> None:
    """Make ``init(backend=name)`` build its communicator with ``factory(info, host, timeout)``,
    ``host`` being the rendezvous's host communicator (for ids and schedule checks)."""
    _BACKENDS[name] = factory


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def _choose_device(info: LaunchInfo) -> None:
    """device=cuda (or an unset device on a machine with a CUDA driver) -> cuda{LOCAL_RANK};
    a device the user named (cuda1, cpu) stays."""
    dev = str(config.device)
    if dev == "cuda" or (config.source("device") == "default" and not config.contexts
                         and _driver_present()):
        config.device = f"cuda{info.local_rank}"


def _host_communicator(info: LaunchInfo, timeout: float) -> Communicator:
    if info.world_size == 1:
        return SelfCommunicator(timeout)
    if info.launcher in ("openmpi", "mpich", "slurm") and \
            importlib.util.find_spec("mpi4py") is not None:
        return MpiCommunicator(timeout=timeout)
    if info.master_addr is None or info.master_port is None:
        raise LaunchError(f"{info.launcher}: a world of {info.world_size} needs MASTER_ADDR and "
                          f"MASTER_PORT (rank 0's host and a free port) for the rendezvous")
    if info.agent_store:
        store: Any = TorchStore(info.master_addr, info.master_port, info.world_size, timeout)
    else:
        store = TCPStore(info.master_addr, info.master_port, serve=info.rank == 0,
                         connect_timeout=timeout)
    return StoreCommunicator(store, info.rank, info.world_size, timeout)


def init(backend: str = "auto", timeout: float | None = None,
         environ: Mapping[str, str] | None = None,
         communicator: Communicator | None = None) -> Communicator:
    """Join the world the launcher started (torchrun, mpirun, srun; none: a world of one).

    Sets the device to ``cuda{LOCAL_RANK}`` unless the user named one, then builds the
    communicator: ``backend='auto'`` is NCCL on a GPU, the rendezvous's host communicator on
    the CPU; ``'nccl'``, ``'store'``, ``'mpi'`` force one.  ``communicator=`` installs one
    given (tests, fake worlds).  Call it before the GPU starts (before the first function or
    shared variable)."""
    if _STATE["comm"] is not None:
        raise DistributedError("symgpu.distributed.init() was called already: finalize() first")
    if communicator is not None:
        info = LaunchInfo(communicator.rank, communicator.world_size)
        comm = communicator
    else:
        info = launch_info(environ)
        t = float(config.distributed.timeout if timeout is None else timeout)
        if backend in ("auto", "nccl"):
            _choose_device(info)
        host = _host_communicator(info, t)
        if backend == "auto":
            backend = "nccl" if str(config.device).startswith("cuda") and "nccl" in _BACKENDS \
                else host.backend
        if backend == "nccl":
            if "nccl" not in _BACKENDS:
                raise DistributedError("the nccl backend needs the GPU backend: set device=cuda "
                                       f"(device is {config.device!r})")
            comm = _BACKENDS["nccl"](info, host, t)
        elif backend in ("store", "mpi", "self"):
            comm = host
        else:
            raise ValueError(f"unknown backend {backend!r}: auto, nccl, store, mpi")
    _STATE.update(info=info, comm=comm)
    set_communicator(comm)
    return comm


def finalize() -> None:
    """Leave the world: close the communicator (NCCL's, sockets) and forget it."""
    comm = _STATE["comm"]
    _STATE.update(info=None, comm=None)
    set_communicator(None)
    if comm is not None:
        comm.close()


def is_initialized() -> bool:
    return _STATE["comm"] is not None


def get_rank(group: str = "world") -> int:
    """This rank's place in ``group``: the process's, or the thread's in a local world
    (0 before init: a world of one)."""
    return _bound(group).rank


def get_world_size(group: str = "world") -> int:
    """The number of ranks of ``group`` (1 before init)."""
    return _bound(group).world_size


def _bound(group: str) -> Communicator:
    """The communicator of ``group`` bound in this thread or process; before init, the world
    is this process alone."""
    try:
        return communicator(group)
    except DistributedError:
        if group == "world":
            return _WORLD_OF_ONE
        raise


_WORLD_OF_ONE = SelfCommunicator()


def get_local_rank() -> int:
    """This process's rank on its machine (LOCAL_RANK ...): the GPU it uses."""
    info = _STATE["info"]
    return launch_info().local_rank if info is None else info.local_rank

