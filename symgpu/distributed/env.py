"""The launchers' environment contract: who this process is in the world.

Why: symgpu has no launcher of its own; one process per GPU is started by ``torchrun``,
``mpirun`` or ``srun``, each of which says rank and world size in environment variables of its
own.  One table (``_CONTRACTS``) lists them, first match wins.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

__all__ = ["LaunchInfo", "launch_info", "LaunchError"]


class LaunchError(RuntimeError):
    """The environment describes no usable world (missing or contradicting variables)."""


@dataclass(frozen=True)
class LaunchInfo:
    """This process's place: rank, world size, rank and count on this machine, the
    rendezvous address (rank 0's host and port, where given) and which launcher said so."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    launcher: str = "none"
    #: torchrun's elastic agent serves a TCPStore on MASTER_PORT (TORCHELASTIC_* are set)
    agent_store: bool = False


#: launcher -> (rank, world size, local rank, local world size) variable names
_CONTRACTS: list[tuple[str, tuple[str, str, str, str]]] = [
    ("torchrun", ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")),
    ("openmpi", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE")),
    ("mpich", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")),
    ("slurm", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")),
]


def _int(env: Mapping[str, str], name: str, launcher: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(str(raw).split("(")[0].split(",")[0])   # SLURM_NTASKS_PER_NODE: "2(x3)"
    except ValueError:
        raise LaunchError(f"{launcher}: {name}={raw!r} is not an integer") from None


def launch_info(environ: Mapping[str, str] | None = None) -> LaunchInfo:
    """Read the first launcher contract present in ``environ`` (default ``os.environ``); no
    launcher: a world of one.  MASTER_ADDR/MASTER_PORT are read whatever the launcher (srun
    and mpirun users export them for the rendezvous)."""
    env = os.environ if environ is None else environ
    addr = env.get("MASTER_ADDR") or None
    port = _int(env, "MASTER_PORT", "rendezvous")
    for launcher, (r, w, lr, lw) in _CONTRACTS:
        rank, world = _int(env, r, launcher), _int(env, w, launcher)
        if rank is None or world is None:
            continue
        if world < 1 or not 0 <= rank < world:
            raise LaunchError(f"{launcher}: {r}={rank} is not a rank of a world of {w}={world}")
        local = _int(env, lr, launcher)
        local_world = _int(env, lw, launcher)
        if local is None:
            local = rank if world == (local_world or world) else 0
        if local_world is None:
            local_world = max(local + 1, 1)
        if not 0 <= local < max(local_world, local + 1):
            raise LaunchError(f"{launcher}: {lr}={local} is not below {lw}={local_world}")
        agent = launcher == "torchrun" and any(k.startswith("TORCHELASTIC_") for k in env)
        return LaunchInfo(rank, world, local, local_world, addr, port, launcher, agent)
    return LaunchInfo(master_addr=addr, master_port=port)
