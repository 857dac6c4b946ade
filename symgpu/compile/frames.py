"""Execution frames: the storage cells and thunks that one call of a Function runs in.

A compiled function's thunks close over storage cells (one per variable), so two calls that
ran over the same cells at once would overwrite each other's inputs and intermediates. Each
call therefore holds a frame (its cells, and the VM whose thunks are bound to them) for its
duration. A function links one frame when it is compiled, guarded by the tokens of one or
more `TokenLock`s (graph/token_lock.py): its call path takes them without blocking (a
list pop each, tens of nanoseconds), and only when one is gone (another thread is inside, or
a callback re-enters the function) does the call go the contended way: it waits for the
locks of the values it updates, then runs in a spare frame from a small pool, linking a new
one on demand (the kernel caches make a re-link cheap).

Shared values a function only reads are read into the frame's own cells at the start of a
call (one consistent state per call). The shared variables a function updates are locked for
the call (reading their values in place, running, writing the updates): values updated
together share one lock (`sharedvalue.update_locks`), taken in one global order
(`TokenLock.order`) so that two functions updating overlapping sets cannot deadlock; see
docs/threads.md. Those locks are also the primary frame's guard: a function that updates
values holds its frame exactly while it holds their locks, with no token of its own.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from symgpu.graph.sharedvalue import update_locks
from symgpu.graph.token_lock import HELD_NAME, TokenLock
from symgpu.graph.basic import Variable
from symgpu.graph.fg import FunctionGraph
from symgpu.link.vm import VM, straight_line

__all__ = ["Layout", "Frame", "link_frame", "SPARE_FRAMES"]

#: spare frames a function keeps for concurrent calls (more are linked on demand and dropped
#: after their call); an idle frame holds little memory (its cells are emptied after each
#: call, unless allow_gc is off), and a call that finds none spare pays a re-link
SPARE_FRAMES = 8


class Layout:
    """What every frame of one function is linked from: the graph, the mode and the roles of
    its inputs and outputs (shared by the function's frames, and by its copies' frames)."""

    def __init__(self, fgraph: FunctionGraph, mode: Any, n_explicit: int, n_out: int,
                 containers: Sequence[Any], updates: Sequence[tuple[int, int, bool]],
                 output_copy: Sequence[bool], single: bool, name: str | None):
        self.fgraph = fgraph
        self.mode = mode
        self.n_explicit = n_explicit
        self.n_out = n_out
        #: the Container of each shared input (fgraph.inputs[n_explicit:], same order)
        self.containers = list(containers)
        #: (fgraph output index, shared input position, copy the value) per update
        self.updates = list(updates)
        self.output_copy = list(output_copy)
        self.single = single
        self.name = name
        updated = {k for _, k, _ in self.updates}
        #: locks of the updated shared values, in the global order (no deadlock); values
        #: updated together share one (sharedvalue.update_locks)
        self.locks = update_locks([self.containers[k] for k in sorted(updated)])
        self.updated_positions = updated


class Frame:
    """One set of cells and the VM bound to them; `caller` gives the code of one call."""

    def __init__(self, layout: Layout, vm: Any, storage_map: dict[Variable, list],
                 guard: tuple[TokenLock, ...] | None, private: TokenLock | None = None):
        self.layout = layout
        self.vm = vm
        self.storage_map = storage_map
        fg = layout.fgraph
        n_in = layout.n_explicit
        self.input_cells = [storage_map[v] for v in fg.inputs[:n_in]]
        self.shared_cells = [storage_map[v] for v in fg.inputs[n_in:]]
        self.output_cells = [storage_map[v] for v in fg.outputs[: layout.n_out]]
        #: a primary frame's guard: the locks whose tokens a call takes without blocking, in
        #: their order (None for spares, which the pool hands to one call at a time)
        self.guard = guard
        #: the guard's lock that is the frame's own token (a function updating nothing),
        #: which nobody waits for
        self.private = private
        self._calls: dict[bool, Callable] = {}

    def caller(self, filters: Sequence[Callable] | None, contended: Callable | None) -> Callable:
        """The generated call for this frame (`filters` None: trusted inputs)."""
        key = filters is None
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = _generate(self, filters, contended)
        return call


def link_frame(layout: Layout, share: dict[Variable, list] | None = None,
               guard: Sequence[TokenLock] = (), primary: bool = False) -> Frame:
    """Link a new frame: fresh cells for every variable (those in `share` reused, for
    `Function.copy(share_memory=True)`, with the guard of the frame they come from), thunks
    bound to them by the mode's linker. A primary frame is guarded by the locks of the values
    its function updates and `guard`, or else by a private token."""
    fg = layout.fgraph
    storage_map: dict[Variable, list] = dict(share or {})
    n_in = layout.n_explicit
    for i, var in enumerate(fg.inputs):
        k = i - n_in
        # an updated shared value is read in place (every frame, under its lock, so one call
        # at a time): a GPU runner may then copy an update back into its buffer, by the rules
        # of gpu/exec/graph_segment.py (pool memory never lent by borrow=True); others go into the
        # frame's own cell, once per call
        storage_map[var] = (layout.containers[k].storage if k in layout.updated_positions
                            else [None])
    vm = layout.mode.link(fg, storage_map)  # DebugMode links a checking VM
    if not primary:
        return Frame(layout, vm, vm.storage_map, None)
    locks: dict[int, TokenLock] = {lk.order: lk for lk in (*layout.locks, *guard)}
    private = None
    if not locks:
        private = TokenLock()
        locks[private.order] = private
    return Frame(layout, vm, vm.storage_map, tuple(locks[k] for k in sorted(locks)), private)


def _copied(ns: dict, var: Variable, name: str) -> str:
    """The expression copying the value `name` of output `var`: ``.copy()`` (arrays), or its
    Type's `copy_value` where the Type has one (values without a copy method, such as a
    NumPy RandomState)."""
    copy_value = getattr(var.type, "copy_value", None)
    if copy_value is None:
        return f"{name}.copy()"
    ns[f"copy_{name}"] = copy_value
    return f"copy_{name}({name})"


def _generate(frame: Frame, filters: Sequence[Callable] | None,
              contended: Callable | None) -> Callable:
    """Straight-line code for one call over this frame's cells (a loop over lists costs a
    few tenths of a microsecond more): take the guard's tokens, filter the arguments into the
    input cells, read the shared values, run, write the updates, empty the cells of results,
    give the tokens back. A spare frame's code takes no token: its caller holds the locks."""
    layout, vm = frame.layout, frame.vm
    fg = layout.fgraph
    ns: dict[str, Any] = {}
    vm.route(ns)  # `plain`: no profiler or runner is set (else `run` is the VM)
    n = layout.n_explicit
    args = ", ".join(f"a{i}" for i in range(n))
    lines = [f"def call({args}):"]
    ind = "    "
    give: list[str] = []   # gives the tokens back, the last taken first
    for m, lock in enumerate(frame.guard or ()):
        ns[f"T{m}"], ns[f"G{m}"] = lock.take, lock.give
        back = [f"G{m}(None)"]
        if lock is not frame.private:  # others may wait for an update lock
            ns[f"W{m}"], ns[f"K{m}"] = lock.waiting, lock.wake
            back.append(f"if W{m}: K{m}()")
        ns["other"] = contended
        # a token gone: give back those taken, and go the contended way (it waits for the
        # update locks, or sees that this thread holds them, and takes a spare frame)
        lines += [f"{ind}try:", f"{ind}    T{m}()", f"{ind}except IndexError:"]
        lines += [f"{ind}    {b}" for b in give] + [f"{ind}    return other({args})"]
        give = back + give
    held = tuple(lk for lk in frame.guard or () if lk is not frame.private)
    if held:   # (a private token is never acquired: nothing looks for it up the stack)
        ns["HELD"] = held
        lines.append(f"{ind}{HELD_NAME} = HELD  # for a callback's look up the stack")
    lines.append(f"{ind}try:")
    ind += "    "
    for i, cell in enumerate(frame.input_cells):
        ns[f"c{i}"] = cell
        if filters is None:
            lines.append(f"{ind}c{i}[0] = a{i}")
            continue
        ns[f"f{i}"] = filters[i]
        accept = getattr(filters[i], "accept", None)
        if accept is None:
            lines.append(f"{ind}c{i}[0] = f{i}(a{i})")
        else:  # the filter's no-conversion test called here: one Python call less
            ns[f"p{i}"] = accept
            lines.append(f"{ind}c{i}[0] = a{i} if p{i}(a{i}) else f{i}(a{i})")
    updated = layout.updated_positions
    for k, (cell, container) in enumerate(zip(frame.shared_cells, layout.containers)):
        ns[f"h{k}"], ns[f"H{k}"] = cell, container.storage
        if k not in updated:
            lines.append(f"{ind}h{k}[0] = H{k}[0]")
    if type(vm).__call__ is VM.__call__:  # the thunks run here, without a call of run()
        lines += [f"{ind}if plain:"] + straight_line(vm, ns, ind + "    ")
        lines += [f"{ind}else:", f"{ind}    run()"]
    else:  # a checking VM (DebugMode): always its own __call__
        lines.append(f"{ind}run()")
    for j, cell in enumerate(frame.output_cells):
        ns[f"o{j}"] = cell
        lines.append(f"{ind}r{j} = o{j}[0]")
    # read every new value before writing any: updates are simultaneous
    for u, (out_index, _, _) in enumerate(layout.updates):
        ns[f"u{u}"] = frame.storage_map[fg.outputs[out_index]]
        lines.append(f"{ind}v{u} = u{u}[0]")
    for u, (out_index, k, copy) in enumerate(layout.updates):
        lines.append(f"{ind}H{k}[0] = {_copied(ns, fg.outputs[out_index], f'v{u}')}" if copy
                     else f"{ind}H{k}[0] = v{u}")
    # empty the cells of computed results (no later call writes into an array the caller
    # holds) and of shared values (an old value is not kept alive after an update)
    clear = []
    seen = set()
    for v in fg.outputs:
        cell = frame.storage_map[v]
        if v.owner is not None and id(cell) not in seen:
            seen.add(id(cell))
            clear.append(cell)
    clear += [c for k, c in enumerate(frame.shared_cells) if k not in updated]
    tail = []
    for z, cell in enumerate(clear):
        ns[f"z{z}"] = cell
        tail.append(f"z{z}[0] = None")
    lines.append("    finally:")
    lines += [f"        {t}" for t in tail + give or ["pass"]]
    results = [_copied(ns, fg.outputs[j], f"r{j}") if c else f"r{j}"
               for j, c in enumerate(layout.output_copy)]
    lines.append(f"    return {results[0]}" if layout.single else f"    return [{', '.join(results)}]")
    exec(compile("\n".join(lines), f"<symgpu Function {layout.name or ''}>", "exec"), ns)
    return ns["call"]
