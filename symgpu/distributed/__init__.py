"""Data-parallel training across processes (one per GPU) started by torchrun, mpirun or srun,
or across the GPU contexts of one process (``local_world``): collectives as graph ops (NCCL on
the GPU), gradient buckets, launcher environments and fault detection.
docs/multiple_gpus.md, "Data parallel", is the guide.
"""
from __future__ import annotations

from typing import Any

from symgpu.distributed.communicator import (CollectiveMismatchError, Communicator,
                                             DistributedError, DistributedTimeoutError,
                                             MpiCommunicator, SelfCommunicator,
                                             StoreCommunicator, ThreadWorld, communicator,
                                             set_communicator, use_communicator)
from symgpu.distributed.data_parallel import (DEFAULT_BUCKET_BYTES, broadcast_function,
                                              broadcast_parameters, data_parallel, plan_buckets)
from symgpu.distributed.env import LaunchError, LaunchInfo, launch_info
from symgpu.distributed.local import LocalWorld, local_world
from symgpu.distributed.ops import (AllGather, AllReduce, Broadcast, ReduceScatter,
                                    all_gather, all_reduce, broadcast, reduce_scatter)
from symgpu.distributed.runtime import (finalize, get_local_rank, get_rank, get_world_size,
                                        init, is_initialized, register_backend)
from symgpu.distributed.store import MemoryStore, TCPStore, TorchStore

__all__ = ["init", "finalize", "get_rank", "get_world_size", "get_local_rank", "local_rank",
           "is_initialized", "register_backend", "all_reduce", "broadcast", "all_gather",
           "reduce_scatter", "AllReduce", "Broadcast", "AllGather", "ReduceScatter",
           "data_parallel", "broadcast_parameters", "broadcast_function", "plan_buckets",
           "DEFAULT_BUCKET_BYTES",
           "Communicator", "StoreCommunicator", "SelfCommunicator", "MpiCommunicator",
           "ThreadWorld", "LocalWorld", "local_world", "communicator", "set_communicator",
           "use_communicator",
           "DistributedError", "DistributedTimeoutError", "CollectiveMismatchError",
           "LaunchError", "LaunchInfo", "launch_info", "MemoryStore", "TCPStore", "TorchStore"]


def __getattr__(name: str) -> Any:
    if name == "local_rank":      # read when asked: init() may have run since the import
        return get_local_rank()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
