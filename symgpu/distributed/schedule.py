"""Mismatched graphs across ranks, detected before the first collective runs.

Why: ranks that run different collectives (another order, shape or dtype) deadlock or
exchange garbage inside NCCL, with no error.  When a function with collectives is linked,
each rank hashes its schedule, the collective nodes in run order (op, dtype, dims), and the
ranks exchange it through the communicator's host channel (a small all-gather); on a
difference every collective node of that function raises, naming the differing rank and the
first differing collective.  The exchange runs once per rewritten graph (frames and copies of
one function reuse it), so all ranks exchange the same number of times.
"""
from __future__ import annotations

import hashlib
import json
import weakref
from typing import Any

from symgpu.config import config
from symgpu.distributed.communicator import (CollectiveMismatchError, Communicator,
                                             DistributedError, communicator)
from symgpu.graph.basic import Apply
from symgpu.graph.fg import FunctionGraph
from symgpu.link.vm import LINK_HOOKS

__all__ = ["collective_schedule", "schedule_digest", "compare_schedules", "check_schedule",
           "raise_schedule_error", "ShapeCheck"]

_CHECKED: "weakref.WeakKeyDictionary[FunctionGraph, bool]" = weakref.WeakKeyDictionary()
_ERRORS: "weakref.WeakKeyDictionary[Apply, Exception]" = weakref.WeakKeyDictionary()


def _is_collective(node: Apply) -> bool:
    return callable(getattr(node.op, "schedule_entry", None)) and \
        getattr(node.op, "group", None) is not None


def collective_schedule(nodes: list[Apply]) -> dict[str, list[str]]:
    """group -> the entries of its collective nodes, in the order given (run order)."""
    out: dict[str, list[str]] = {}
    for node in nodes:
        if _is_collective(node):
            kind = getattr(node.op, "collective_kind", type(node.op).__name__)
            out.setdefault(node.op.group, []).append(f"{kind}: {node.op.schedule_entry(node)}")
    return out


def schedule_digest(entries: list[str]) -> str:
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def compare_schedules(mine: list[str], theirs: list[list[str]], rank: int) -> str | None:
    """None when every rank's entries equal ``mine``; else the message naming the first
    differing rank and collective."""
    for r, other in enumerate(theirs):
        if r == rank or other == mine:
            continue
        i = next((k for k, (a, b) in enumerate(zip(mine, other)) if a != b),
                 min(len(mine), len(other)))
        a = mine[i] if i < len(mine) else "(none: this rank's schedule ends)"
        b = other[i] if i < len(other) else "(none: its schedule ends)"
        return (f"the ranks' compiled functions run different collectives: rank {r} differs "
                f"from rank {rank} first at collective #{i + 1}: rank {rank} runs {a}, rank "
                f"{r} runs {b} (rank {rank} has {len(mine)} collectives, rank {r} "
                f"{len(other)}); every rank must compile the same graph")
    return None


def check_schedule(fgraph: FunctionGraph, nodes: list[Apply]) -> None:
    """The link hook: exchange and compare the schedule of each group in ``nodes``; on a
    mismatch record the error for every collective node (their thunks raise it)."""
    if fgraph in _CHECKED:
        return
    groups = collective_schedule(nodes)
    _CHECKED[fgraph] = True
    if not groups:
        return
    for group, entries in sorted(groups.items()):
        try:
            comm = communicator(group)
        except DistributedError:
            continue      # no communicator: the nodes' thunks say so themselves
        if comm.world_size == 1:
            continue
        payload = json.dumps({"digest": schedule_digest(entries), "entries": entries}).encode()
        exc: Exception | None = None
        try:
            theirs = [json.loads(p.decode()) for p in comm.exchange(payload, "schedule check")]
        except DistributedError as failed:   # a dead peer: the thunks raise it, not a warning
            exc = failed
        else:
            if any(t["digest"] != theirs[comm.rank]["digest"] for t in theirs):
                msg = compare_schedules(entries, [t["entries"] for t in theirs], comm.rank)
                if msg is not None:
                    exc = CollectiveMismatchError(f"group {group!r}: {msg}")
        if exc is not None:
            for node in nodes:
                if _is_collective(node) and node.op.group == group:
                    _ERRORS[node] = exc


def raise_schedule_error(node: Apply) -> None:
    """Raise the mismatch recorded for ``node`` by the link hook, if any."""
    exc = _ERRORS.get(node)
    if exc is not None:
        raise exc


class ShapeCheck:
    """The run-time half of the check (``distributed.check_shapes``): the schedule compares
    op, dtype and dims, not shapes, and NCCL exchanges whatever counts each rank passes.  On
    the first call of a compiled function each of its device collectives (their thunks own a
    ShapeCheck) all-gathers its input's shape through the host channel, once; a rank whose
    element count differs makes every rank raise CollectiveMismatchError naming it and the
    collective.  Later calls cost nothing; so does a world of one rank or the flag off."""

    def __init__(self, comm: Communicator, node: Apply) -> None:
        self.comm, self.node = comm, node
        self.pending = bool(config.distributed.check_shapes) and comm.world_size > 1

    def __call__(self, shape: tuple) -> None:
        if not self.pending:
            return
        self.pending = False
        comm, node = self.comm, self.node
        count = int(_prod(shape))
        payload = json.dumps({"count": count, "shape": list(shape)}).encode()
        theirs = [json.loads(p.decode()) for p in comm.exchange(payload, "shape check")]
        for r, other in enumerate(theirs):
            if other["count"] != count:
                entry = node.op.schedule_entry(node) if _is_collective(node) else str(node.op)
                raise CollectiveMismatchError(
                    f"{node.op} (schedule entry: {entry}): rank {r} passes "
                    f"{other['count']} elements (shape {tuple(other['shape'])}), rank "
                    f"{comm.rank} passes {count} (shape {tuple(shape)}); NCCL needs the same "
                    f"count on every rank of the world of {comm.world_size} (checked on the "
                    f"first call: distributed.check_shapes)")


def _prod(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


LINK_HOOKS.append(check_schedule)
