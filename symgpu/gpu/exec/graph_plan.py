"""Planning whole-function CUDA graphs (symgpu/gpu/exec/graphs.py): which nodes a capture may
record, in which order the nodes run, how a segment's inputs make its key, and which cells
die where.  Pure functions of the graph: no PyCUDA, no device; tested on the CPU.
"""
from __future__ import annotations

import heapq
from typing import Any, Callable, Sequence

import numpy as np

from symgpu.gpu.placement.basic_ops import HostFromGpu
from symgpu.gpu.placement.type import is_gpu_var as _is_gpu_var
from symgpu.graph.basic import Constant
from symgpu.graph.traversal import sharing_memory

__all__ = ["node_capturable", "node_launches", "overlaps_launches", "schedule", "plan_steps",
           "make_keyer", "make_fetcher", "Unkeyable", "HOST_KEY_LIMIT", "aliases", "dead_cells",
           "escaping", "mark_reusable_outputs", "overwritten", "read_later", "updates_last",
           "tail_safe", "parameter_nodes"]

#: elements of a host value a key may hold (larger host inputs: the segment runs plainly)
HOST_KEY_LIMIT = 64


class Unkeyable(Exception):
    """A segment input whose value cannot be part of a graph key (a large host array...)."""


def _flag(node: Any, thunk: Any, name: str) -> bool:
    value = getattr(thunk, name, None)
    if value is None:
        value = getattr(node.op, name, False)
    return bool(value)


def node_capturable(node: Any, thunk: Any) -> bool:
    """Whether ``node``'s thunk may run inside a stream capture: it (or its op) says so, and
    every host-typed input is a small value a key can hold (one element, or a short vector)."""
    if not _flag(node, thunk, "capturable"):
        return False
    for v in node.inputs:
        if _is_gpu_var(v):
            continue
        bcast = getattr(getattr(v, "type", None), "broadcastable", None)
        if bcast is None or (len(bcast) > 1 and not all(bcast)):
            return False
    return True


def node_launches(node: Any, thunk: Any) -> bool:
    """Whether the thunk queues device work (a segment is worth a graph only with one)."""
    return _flag(node, thunk, "launches")


def overlaps_launches(node: Any) -> bool:
    """Whether ``node`` is host work that may run while the GPU works (its op's
    ``overlaps_launches``: a check of a host input, such as scan_to_dnn_rnn's PrefixGuard):
    the launches that do not need its result go first, so that its host time overlaps
    theirs instead of delaying the first launch.  Writes in place wait for it (a check that
    raises leaves every buffer as it was)."""
    return bool(getattr(node.op, "overlaps_launches", False))


def _wait_for_checks(nodes: Sequence[Any], parents: list[set[int]],
                     children: list[list[int]], checks: list[int]) -> None:
    """Make every node that writes in place (a destroy_map) a child of each check in
    ``checks`` it is not an ancestor of: no update runs before a check that may raise."""
    for d in checks:
        above, todo = set(), list(parents[d])
        while todo:
            p = todo.pop()
            if p not in above:
                above.add(p)
                todo.extend(parents[p])
        for w, node in enumerate(nodes):
            if w != d and w not in above and d not in parents[w] and \
                    getattr(node.op, "destroy_map", None):
                parents[w].add(d)
                children[d].append(w)


def schedule(nodes: Sequence[Any], capturable: Sequence[bool],
             launches: Sequence[bool], contexts: Sequence[int] | None = None) -> list[int]:
    """A topological order (indices into ``nodes``, themselves in topological order) that
    groups capturable nodes: ready host work with no launching node before it first (with
    the capturable nodes it reads), then capturable nodes (non-launching ones, such as views,
    before launching ones), then the remaining nodes as late as possible.  Ties keep the
    original order.  Host checks that overlap launches (``overlaps_launches``) run after
    the capturable nodes that do not need them, before the rest.

    ``contexts`` (a function on several GPUs: each node's device ordinal, -1 for host
    nodes) groups the ready capturable nodes of one device together, so that each device's
    work makes long segments (one CUDA graph each) and every launch on every device comes
    before the host work that waits for results (copies to the host run last)."""
    n = len(nodes)
    index = {node: i for i, node in enumerate(nodes)}
    parents: list[set[int]] = []
    children: list[list[int]] = [[] for _ in range(n)]
    for i, node in enumerate(nodes):
        ps = {index[v.owner] for v in node.inputs if v.owner is not None and v.owner in index}
        parents.append(ps)
        for p in ps:
            children[p].append(i)
    checks = [i for i in range(n) if not capturable[i] and overlaps_launches(nodes[i])]
    if checks:
        _wait_for_checks(nodes, parents, children, checks)
    after_launch = [False] * n      # some launching node is an ancestor
    for i in range(n):
        after_launch[i] = any(after_launch[p] or launches[p] for p in parents[i])
    # capturable nodes that the host work at the head needs (shape reads of GPU values):
    # they run with it, so other views wait and join the segment, where a replay skips them
    head = [not capturable[i] and not after_launch[i] for i in range(n)]
    feeds_head = [False] * n
    for i in reversed(range(n)):
        feeds_head[i] = any(head[c] or feeds_head[c] for c in children[i])

    group = list(contexts) if contexts is not None else [0] * n

    overlapping = set(checks)

    def rank(i: int) -> tuple[int, int, int]:
        if not capturable[i]:
            if after_launch[i]:
                return (4, 0, i)
            return (3 if i in overlapping else 0, 0, i)
        if feeds_head[i]:
            return (0, 0, i)
        return (1 if not launches[i] else 2, group[i], i)

    waiting = [len(ps) for ps in parents]
    ready = [rank(i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)[-1]
        order.append(i)
        for c in children[i]:
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, rank(c))
    if len(order) != n:  # pragma: no cover - nodes were not in topological order
        return list(range(n))
    return order


def plan_steps(nodes: Sequence[Any], capturable: Sequence[bool], launches: Sequence[bool],
               batchable: Sequence[bool], contexts: Sequence[int] | None = None
               ) -> list[tuple[str, list[int]]]:
    """The runner's steps in order: ``('segment', [i...])`` for a run of capturable nodes
    with a launch, ``('batch', [i...])`` for adjacent batchable (HostFromGpu) nodes,
    ``('plain', [i])`` for everything else.  With ``contexts`` (each node's device ordinal,
    -1 for a node touching no device value) a segment holds one device's nodes: a CUDA
    graph is captured on one context's stream."""
    order = schedule(nodes, capturable, launches, contexts)
    steps: list[tuple[str, list[int]]] = []
    run: list[int] = []
    device = [-1]     # the device of the run's nodes (-1: none yet)

    def flush_run() -> None:
        if run:
            if any(launches[i] for i in run):
                steps.append(("segment", list(run)))
            else:
                steps.extend(("plain", [i]) for i in run)
            run.clear()
        device[0] = -1

    for i in order:
        if capturable[i]:
            d = contexts[i] if contexts is not None else -1
            if d != -1:
                if device[0] != -1 and d != device[0]:
                    flush_run()
                device[0] = d
            run.append(i)
            continue
        flush_run()
        if batchable[i] and steps and steps[-1][0] in ("batch", "plain") and \
                all(batchable[j] for j in steps[-1][1]):
            kind, idx = steps.pop()
            steps.append(("batch", idx + [i]))
        else:
            steps.append(("plain", [i]))
    flush_run()
    return steps


# ============================================================================ keys

def _host_key(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        if v.size > HOST_KEY_LIMIT:
            raise Unkeyable(f"a host array of {v.size} elements")
        return (v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, (bool, int, float, np.generic)):
        return (type(v), v)
    if v is None:
        return None
    raise Unkeyable(f"a host value of type {type(v).__name__}")


#: GPU-only segments of up to this many inputs fetch and key them in straight-line code
#: (one call instead of a list comprehension and a key call: issue 19's one-kernel call)
_UNROLLED_KEYS = 8


def make_fetcher(cells: Sequence[list], is_gpu: Sequence[bool],
                 params: Sequence[bool] | None = None,
                 by_pointer: Sequence[bool] | None = None,
                 memoised: Sequence[bool] | None = None) -> Callable[[], tuple]:
    """``fetch()``: ``(values, key)``, the values now in ``cells`` and their
    :func:`make_keyer` key (GPU-only inputs: shapes and strides, flat), in one call.  Raises
    as the key does; the caller then reads the cells itself."""
    n = len(cells)
    gpu_only = all(is_gpu) and not any(by_pointer or ())
    if not gpu_only or not 0 < n <= _UNROLLED_KEYS:
        key = make_keyer(is_gpu, params, by_pointer, memoised)

        def fetch() -> tuple:
            vals = [c[0] for c in cells]
            return vals, key(vals)
        return fetch
    ns: dict[str, Any] = {f"c{i}": cell for i, cell in enumerate(cells)}
    names = [f"v{i}" for i in range(n)]
    lines = ["def fetch():"] + [f"    {v} = c{i}[0]" for i, v in enumerate(names)]
    lines.append(f"    return [{', '.join(names)}], "
                 f"({', '.join(f'{v}.shape, {v}.strides' for v in names)})")
    exec("\n".join(lines), ns)
    return ns["fetch"]


def make_keyer(is_gpu: Sequence[bool], params: Sequence[bool] | None = None,
               by_pointer: Sequence[bool] | None = None,
               memoised: Sequence[bool] | None = None) -> Callable[[list], tuple]:
    """``key(values)``: the tuple a graph of a segment is looked up by.  GPU values give
    their shape and strides (a graph reads an input where it was captured, or from a static
    buffer of its own that the input is copied into: graph_segment.Segment, so the input's
    pointer is not part of the key), except those marked in ``by_pointer`` (inputs the graph
    writes in place that kept moving: their pointer too).  Host values give their dtype,
    shape and bytes (scalars: type and value), except those marked in ``params``: parameters
    of the graph (graph_params.py), whose values are written into its parameter block instead
    and only count through the key parts of the nodes reading them.  Host values marked in
    ``memoised`` are outputs of the runner's shape memo (shape_memo.py), which nothing else
    writes and which a call with an earlier call's shapes restores as the same objects: the
    key part of the last one is kept with it and computed again only for another (the GPT step's
    21 reshape targets: a ``tobytes`` each, every call).  Raises :class:`Unkeyable` (or
    AttributeError for a value of the wrong kind)."""
    gpu = tuple(bool(g) for g in is_gpu)
    skip = tuple(bool(p) for p in params) if params is not None else (False,) * len(gpu)
    ptr = tuple(bool(p) for p in by_pointer) if by_pointer is not None else (False,) * len(gpu)
    memo = tuple(bool(m) for m in memoised) if memoised is not None else (False,) * len(gpu)
    if all(gpu) and not any(ptr):
        def key_gpu(vals: list) -> tuple:
            return tuple([(v.shape, v.strides) for v in vals])
        return key_gpu
    # 0: GPU by layout, 1: host by value, 2: parameter (left out), 3: GPU by pointer too,
    # 4: host by value, a memo output (its key part kept with the object)
    kinds = tuple((3 if q else 0) if g else (2 if p else (4 if m else 1))
                  for g, p, q, m in zip(gpu, skip, ptr, memo))
    if 4 not in kinds:    # (without the positions: a microsecond less a call at 60 inputs)
        def key(vals: list) -> tuple:
            return tuple([(v.shape, v.strides) if k == 0 else
                          (_host_key(v) if k == 1 else
                           (None if k == 2 else (v.ptr, v.shape, v.strides)))
                          for v, k in zip(vals, kinds)])
        return key
    kept: dict[int, tuple] = {}     # position -> (the memo's object, its key part)

    def memo_part(j: int, v: Any) -> Any:
        last = kept.get(j)
        if last is not None and last[0] is v:
            return last[1]
        part = _host_key(v)
        kept[j] = (v, part)
        return part

    def key_memo(vals: list) -> tuple:
        return tuple([(v.shape, v.strides) if k == 0 else
                      (_host_key(v) if k == 1 else
                       (None if k == 2 else
                        ((v.ptr, v.shape, v.strides) if k == 3 else memo_part(j, v))))
                      for j, (v, k) in enumerate(zip(vals, kinds))])
    return key_memo


def aliases(var: Any, target: Any) -> bool:
    """Whether ``var`` may share memory with ``target`` (through views and in-place ops)."""
    seen: set = set()
    stack = [var]
    while stack:
        v = stack.pop()
        if v is target:
            return True
        if v in seen or v.owner is None:
            continue
        seen.add(v)
        op = v.owner.op
        for mapping in (getattr(op, "view_map", None) or {},
                        getattr(op, "destroy_map", None) or {}):
            for i in mapping.get(v.index, ()):
                stack.append(v.owner.inputs[i])
    return False


def read_later(nodes: Sequence[Any], idx: Sequence[int], pos: int, target: Any) -> bool:
    """Whether a node of ``idx`` (a segment's nodes in run order) after position ``pos``
    reads ``target``'s memory: the variable itself or anything that may share memory with
    it (:func:`aliases`).  An update written straight into its variable's buffer at ``pos``
    must have no such reader (graph_segment: direct updates)."""
    return any(aliases(v, target) for i in idx[pos + 1:] for v in nodes[i].inputs)


def updates_last(nodes: Sequence[Any], idx: Sequence[int],
                 updates: Sequence[tuple[Any, Any]]) -> list[int]:
    """``idx`` with each update node that runs before a reader of the variable it updates
    moved to the end (in their order), so its new value may be written straight into the
    variable's buffer (graph_segment: direct updates).  Only sinks move (no node reads any
    of their outputs: they are read as the function's update values only), so the order
    stays topological."""
    read = {v for n in nodes for v in n.inputs}
    where = {nodes[i]: i for i in idx}
    moved: list[int] = []
    for new, old in updates:
        i = where.get(new.owner)
        if i is None or i in moved or any(v in read for v in new.owner.outputs):
            continue
        order = [k for k in idx if k not in moved]
        if read_later(nodes, order, order.index(i), old):
            moved.append(i)
    if not moved:
        return list(idx)
    moved.sort(key=list(idx).index)
    return [k for k in idx if k not in moved] + moved


def escaping(fgraph: Any) -> set:
    """The variables whose memory may leave a call of ``fgraph``: its outputs and every
    variable one of them may share memory with through views and in-place ops (the reverse
    of :func:`aliases`, for all outputs at once).  A buffer outside this set is the call's
    own: nothing holds it after the call, so it may be reused or overwritten by the next."""
    return sharing_memory(fgraph.outputs)


def overwritten(fgraph: Any) -> set:
    """The variables whose memory some node of ``fgraph`` overwrites: the inputs in-place
    ops destroy, and what those view."""
    return sharing_memory([node.inputs[i] for node in fgraph.apply_nodes
                            for ins in (getattr(node.op, "destroy_map", None) or {}).values()
                            for i in ins])


def mark_reusable_outputs(vm: Any) -> None:
    """A VM hook: tell each thunk with a ``reuse_outputs`` list (one flag per output) which
    of its outputs it may compute into the buffer its cell still holds from the previous call
    (without garbage collection): those that never leave a call (:func:`escaping`).  The
    flags start False (a fresh buffer each call), so a VM without this hook stays correct.

    Uploads' thunks with a ``may_borrow`` flag (placement/basic_ops.py) learn here whether
    a device array fed to their host input may serve as their output as it is: when that
    output never leaves the call and nothing overwrites it (it starts False: a copy)."""
    esc = over = None
    for node, thunk in zip(vm.nodes, vm.thunks):
        flags = getattr(thunk, "reuse_outputs", None)
        borrow = hasattr(thunk, "may_borrow")
        if flags is None and not borrow:
            continue
        if esc is None:
            esc = escaping(vm.fgraph)
        if borrow:
            if over is None:
                over = overwritten(vm.fgraph)
            thunk.may_borrow = node.outputs[0] not in esc and node.outputs[0] not in over
            continue
        for j, v in enumerate(node.outputs[:len(flags)]):
            flags[j] = v not in esc


def dead_cells(nodes: list, order: list[int], gc_after: list | None, sm: dict) -> list[list]:
    """Cells to empty after each position of ``order``: the VM's collectable cells, each
    after its last reader in the new order (none without garbage collection)."""
    if gc_after is None:
        return [[] for _ in order]
    collectable = {id(c) for d in gc_after for c in d}
    last: dict[Any, int] = {}
    for pos, i in enumerate(order):
        for v in nodes[i].inputs:
            last[v] = pos
        for v in nodes[i].outputs:
            last.setdefault(v, pos)
    dead: list[list] = [[] for _ in order]
    done: set[int] = set()
    for v, pos in last.items():
        cell = sm.get(v)
        if cell is not None and id(cell) in collectable and id(cell) not in done:
            done.add(id(cell))
            dead[pos].append(cell)
    return dead


def tail_safe(steps: list[tuple[str, list[int]]], s_no: int, nodes: list) -> bool:
    """Whether updates of segment step ``s_no`` may be written into their variables' buffers:
    nothing that can fail runs after the segment (the call then cannot raise after the shared
    variable changed): the steps left are copies to the host at most (a check they raise
    stops the copy itself: device_checks.GuardedCopies)."""
    return all(k == "batch" or (k == "plain" and all(
        isinstance(nodes[i].op, HostFromGpu) for i in ix)) for k, ix in steps[s_no + 1:])


def parameter_nodes(idx: list[int], nodes: list, thunks: list, inputs: list,
                    fixed: set | frozenset = frozenset()) -> tuple[list, list[bool], list[bool]]:
    """A segment's parameter nodes, which of its inputs are parameters, and which of the
    parameter nodes read an array the segment computes (graph_params.py).

    A node takes part when its thunk speaks the protocol (``param_nbytes``) and each of its
    inputs is a segment input or a constant (its values are known before the segment runs),
    but for the input its thunk names ``param_layout_input``: its parameters read that one's
    layout alone, so it may be computed inside the segment (the last state of a loop padded
    to a bucket, ``buffer[n]`` of the bucket's buffer).  A host input is a parameter (left
    out of the key) when every node of the segment that reads it takes part; otherwise its
    value stays in the key.  A node whose host inputs are all ``fixed`` (computed from
    shapes alone: the shape memo's values, determined by the key) is left out: keyed by
    value it costs no graph more, and a slice stays a view instead of a copy."""
    known = set(inputs)
    active = set()
    inner = set()
    for i in idx:
        t = thunks[i]
        if not getattr(t, "param_nbytes", None):
            continue
        lay = getattr(t, "param_layout_input", None)
        ins = nodes[i].inputs
        if all(v in fixed or isinstance(v, Constant) for v in ins if not _is_gpu_var(v)):
            continue
        if all(v in known or isinstance(v, Constant) or k == lay for k, v in enumerate(ins)):
            active.add(i)
            if lay is not None and ins[lay] not in known and \
                    not isinstance(ins[lay], Constant):
                inner.add(i)
    readers: dict = {}
    for i in idx:
        for v in nodes[i].inputs:
            readers.setdefault(v, set()).add(i)
    mask = [not _is_gpu_var(v) and bool(readers.get(v)) and readers[v] <= active
            for v in inputs]
    return ([thunks[i] for i in idx if i in active], mask,
            [i in inner for i in idx if i in active])
