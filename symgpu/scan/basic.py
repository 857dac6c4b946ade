"""`scan`: Theano's loop construct, building one `Scan` node from a Python step function."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import numpy as np

import symgpu.tensor as T
from symgpu.compile.sharedvalue import SharedVariable
from symgpu.graph.basic import Constant, Variable, ancestors, graph_inputs
from symgpu.scan.info import ScanInfo
from symgpu.scan.inner import clone_with, hoist_invariants
from symgpu.scan.op import Scan
from symgpu.tensor.shape import Unbroadcast
from symgpu.tensor.type import TensorType

__all__ = ["scan", "until", "ScanUpdates"]


class until:
    """Returned by a step function (alone or with outputs/updates): stop after the step where
    `condition` is true (that step's outputs are kept). Makes scan a while-loop."""

    def __init__(self, condition: Any):
        c = T.as_tensor_variable(condition)
        if c.ndim != 0:
            raise TypeError(f"until: the condition must be a scalar, got {c.type}")
        self.condition = c


class ScanUpdates(OrderedDict):
    """The updates scan returns: shared variable -> its value after the loop (pass them to
    `function(..., updates=...)`)."""

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(key, SharedVariable):
            raise TypeError(f"scan updates: {key} is not a shared variable")
        super().__setitem__(key, value)

    def __add__(self, other: Any) -> "ScanUpdates":
        out = ScanUpdates(self)
        out.update(other)
        return out


def _as_list(x: Any) -> list:
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]


def _is_update_list(x: Any) -> bool:
    return (isinstance(x, (list, tuple)) and len(x) > 0
            and all(isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], SharedVariable)
                    for p in x))


def _parse_return(rv: Any, name: str) -> tuple[list, list, Variable | None]:
    """(outputs, update pairs, condition) from what the step function returned."""
    if rv is None:
        return [], [], None
    if isinstance(rv, until):
        return [], [], rv.condition
    if isinstance(rv, dict):
        return [], list(rv.items()), None
    if not isinstance(rv, (list, tuple)):
        return [rv], [], None
    items = list(rv)
    structured = any(isinstance(x, (until, dict)) or _is_update_list(x) for x in items)
    if not structured:
        return items, [], None
    outputs, updates, cond = [], [], None
    for x in items:
        if isinstance(x, until):
            if cond is not None:
                raise ValueError(f"{name}: the step function returned two until conditions")
            cond = x.condition
        elif isinstance(x, dict):
            updates.extend(x.items())
        elif _is_update_list(x):
            updates.extend(tuple(p) for p in x)
        elif isinstance(x, (list, tuple)):
            outputs.extend(x)
        else:
            outputs.append(x)
    return outputs, updates, cond


def _constant_int(v: Any) -> int | None:
    if isinstance(v, (int,)) and not isinstance(v, bool):
        return v
    if isinstance(v, Constant):
        try:
            return int(v.data)
        except (TypeError, ValueError):
            return None
    if isinstance(v, np.integer):
        return int(v)
    return None


def _padleft(x: Variable) -> Variable:
    """x with a new leading axis of length 1."""
    return x.dimshuffle("x", *range(x.ndim))


def _inner_type(x: Variable) -> TensorType:
    return TensorType(x.type.dtype, x.type.broadcastable[1:])


def _parse_sequences(sequences: list, go_backwards: bool, name: str
                     ) -> tuple[list[Variable], list[Variable]]:
    """(outer slices, inner placeholders), one per (sequence, tap), Theano's cutting rule."""
    outers, inners = [], []
    for k, seq in enumerate(sequences):
        if isinstance(seq, dict):
            if "input" not in seq:
                raise ValueError(f"{name}: sequence {k} is a dict without an 'input' entry")
            x = seq["input"]
            taps = seq.get("taps", [0])
            taps = [0] if taps is None else list(taps) if isinstance(taps, (list, tuple)) else [taps]
        else:
            x, taps = seq, [0]
        x = T.as_tensor_variable(x)
        if x.ndim < 1:
            raise TypeError(f"{name}: sequence {k} ({x}) is a scalar ({x.type}); a sequence is "
                            "iterated over its first axis")
        if not taps or any(_constant_int(t) is None for t in taps) or len(set(taps)) != len(taps):
            raise ValueError(f"{name}: sequence {k} has taps {taps}; taps must be distinct "
                             "Python integers")
        lo, hi = min(min(taps), 0), max(max(taps), 0)
        for tap in taps:
            start = tap - lo
            nw = x[start:] if start == hi - lo else x[start:start - (hi - lo)]
            if go_backwards:
                nw = nw[::-1]
            outers.append(nw)
            ph = _inner_type(x)(f"{x.name or f'sequence{k}'}[t{tap:+d}]" if tap else
                                f"{x.name or f'sequence{k}'}[t]")
            inners.append(ph)
    return outers, inners


class _StateSpec:
    """An output with an initial value: its taps, placeholders and initial buffer."""

    def __init__(self, index: int, initial: Variable, taps: list[int], keep: bool, name: str,
                 multi: bool):
        self.index = index
        self.taps = taps
        self.keep = keep
        if not multi:
            self.inner_type = initial.type
            self.init_buffer = _padleft(initial)
        else:
            if initial.ndim < 1:
                raise TypeError(f"{name}: output {index} has taps {taps}, so its initial value "
                                f"must have a leading axis of length >= {-min(taps)}; got the "
                                f"scalar {initial} ({initial.type})")
            self.inner_type = _inner_type(initial)
            self.init_buffer = initial[:-min(taps)]
        self.label = initial.name or f"output{index}"
        self.placeholders = [self.inner_type(f"{self.label}[t{tap:+d}]") for tap in taps]

    def relax(self, broadcastable: tuple) -> None:
        """Forget the dims the step's result does not know to have length 1."""
        axes = tuple(ib and not ob for ib, ob in zip(self.inner_type.broadcastable, broadcastable))
        self.inner_type = TensorType(self.inner_type.dtype,
                                     tuple(ib and ob for ib, ob in
                                           zip(self.inner_type.broadcastable, broadcastable)))
        self.init_buffer = Unbroadcast((False,) + axes)(self.init_buffer)
        self.placeholders = [self.inner_type(f"{self.label}[t{tap:+d}]") for tap in self.taps]


def _parse_outputs_info(outputs_info: list, name: str, keep_last: bool) -> list[_StateSpec | None]:
    specs: list[_StateSpec | None] = []
    for i, oi in enumerate(outputs_info):
        if oi is None:
            specs.append(None)
            continue
        taps: Any = [-1]
        multi = False
        if isinstance(oi, dict):
            initial = oi.get("initial")
            if initial is None:
                if oi.get("taps"):
                    raise ValueError(f"{name}: output {i} has taps {oi['taps']} but no 'initial' "
                                     "value to start from")
                specs.append(None)
                continue
            if "taps" in oi:
                taps = oi["taps"]
                taps = list(taps) if isinstance(taps, (list, tuple)) else [taps]
                multi = True
        else:
            initial = oi
        initial = T.as_tensor_variable(initial)
        if not taps or any(_constant_int(t) is None or _constant_int(t) >= 0 for t in taps):
            raise ValueError(f"{name}: output {i} has taps {taps}; the taps of an output must be "
                             "negative integers (the past values a step reads)")
        if len(set(taps)) != len(taps):
            raise ValueError(f"{name}: output {i} has repeated taps {taps}")
        # an explicit taps list means the initial value carries a leading time axis
        # (Theano's mit_sot), unless it is [-1] with an initial of the output's own rank
        specs.append(_StateSpec(i, initial, [int(t) for t in taps], not keep_last, name,
                                multi and taps != [-1]))
    return specs


def scan(fn: Callable[..., Any], sequences: Any = None, outputs_info: Any = None,
         non_sequences: Any = None, n_steps: Any = None, truncate_gradient: int = -1,
         go_backwards: bool = False, mode: Any = None, name: str | None = None,
         strict: bool = False, return_list: bool = False) -> tuple[Any, ScanUpdates]:
    """Loop `fn` over `sequences` (Theano's scan); returns `(outputs, updates)`.

    `fn` receives, in order: the slice of every sequence at each of its taps, the past values
    of every output that has an initial value (`outputs_info`) at each of its taps, then the
    `non_sequences`. It returns its outputs, optionally with an updates dict for shared
    variables and an `until(condition)` that ends the loop. Variables from outside that `fn`
    uses (closures, shared variables) become implicit non-sequences.
    """
    outs, updates, _ = scan_impl(fn, sequences, outputs_info, non_sequences, n_steps,
                                 truncate_gradient, go_backwards, mode, name, strict)
    if len(outs) == 1 and not return_list:
        return outs[0], updates
    if not outs and not return_list:
        return None, updates
    return outs, updates


def scan_impl(fn: Callable[..., Any], sequences: Any, outputs_info: Any, non_sequences: Any,
              n_steps: Any, truncate_gradient: int, go_backwards: bool, mode: Any,
              name: str | None, strict: bool, keep_last: bool = False
              ) -> tuple[list[Any], ScanUpdates, Any]:
    """scan's work; `keep_last` (reduce/fold) keeps only the last value of each state and
    returns it instead of the whole history. Returns (outputs, updates, node)."""
    name = name or "scan"
    seqs = _as_list(sequences)
    n_given = n_steps
    n_const = _constant_int(n_steps) if n_steps is not None else None
    if n_const is not None and n_const < 0:
        go_backwards = not go_backwards
        n_steps = -n_const
    seq_outer, seq_inner = _parse_sequences(seqs, go_backwards, name)
    if n_steps is None:
        if not seq_outer:
            raise ValueError(f"{name}: no sequences and no n_steps: scan cannot tell how many "
                             "steps to run")
        n_var = seq_outer[0].shape[0]
        for s in seq_outer[1:]:
            n_var = T.minimum(n_var, s.shape[0])
    else:
        n_var = T.as_tensor_variable(n_steps)
        if n_var.ndim != 0 or not n_var.dtype.startswith(("int", "uint")):
            raise TypeError(f"{name}: n_steps must be an integer scalar, got {n_given!r}")
    n_var = T.cast(n_var, "int64") if n_var.dtype != "int64" else n_var

    info_list = outputs_info if isinstance(outputs_info, (list, tuple)) else \
        ([] if outputs_info is None else [outputs_info])
    specs = _parse_outputs_info(list(info_list), name, keep_last)

    # fn gets the non-sequences themselves (Theano does too: grad(y[i], v) inside a step must
    # see v); like any outer variable the step uses, they become inputs of the inner graph
    nonseq_args = [v if isinstance(v, Variable) else T.as_tensor_variable(v)
                   for v in _as_list(non_sequences)]

    for attempt in range(2):
        tap_args = [ph for s in specs if s is not None for ph in s.placeholders]
        rv = fn(*seq_inner, *tap_args, *nonseq_args)
        outputs, update_pairs, cond = _parse_return(rv, name)
        outputs = [o if isinstance(o, Variable) else T.as_tensor_variable(o) for o in outputs]
        if outputs_info is None:
            specs = [None] * len(outputs)
        elif len(outputs) != len(specs):
            raise ValueError(f"{name}: the step function returned {len(outputs)} output(s) but "
                             f"outputs_info has {len(specs)} entrie(s); give one entry per "
                             "output (None for an output that is not fed back)")
        # an initial value known to have length 1 where the step's result is not (e.g.
        # T.zeros((1, n)) fed to dot(h, W)): the state forgets that, and fn runs once more
        relaxed = [s for o, s in zip(outputs, specs) if s is not None and attempt == 0
                   and _relaxable(o, s.inner_type)]
        if not relaxed:
            break
        for s in relaxed:
            s.relax(outputs[s.index].type.broadcastable)

    update_pairs = _with_default_updates(
        outputs + ([cond] if cond is not None else []), update_pairs,
        [*seq_inner, *tap_args, *nonseq_args], name)

    state_specs = [s for s in specs if s is not None]
    state_outs, nitsot_outs, nitsot_index = [], [], []
    for i, (o, s) in enumerate(zip(outputs, specs)):
        if s is None:
            nitsot_outs.append(o)
            nitsot_index.append(i)
            continue
        state_outs.append(_fit_state(o, s.inner_type, f"{name}: output {i} ({o})"))

    # shared-variable updates become states read at tap -1 and kept only at their last value
    upd_shared, upd_phs, upd_outs = [], [], []
    for s, expr in update_pairs:
        if not isinstance(s, SharedVariable):
            raise TypeError(f"{name}: updates returned by the step function must be for shared "
                            f"variables; {s} is not one")
        if not isinstance(expr, Variable):
            expr = T.as_tensor_variable(expr, dtype=s.type.dtype)
        upd_shared.append(s)
        upd_phs.append(s.type(f"{s.name or 'shared'}[t-1]"))
        upd_outs.append(_fit_state(expr, s.type, f"{name}: the update of {s}"))
    all_outs = state_outs + upd_outs + nitsot_outs + ([cond] if cond is not None else [])
    if upd_shared:
        all_outs = clone_with(all_outs, dict(zip(upd_shared, upd_phs)))

    variant = seq_inner + tap_args + upd_phs
    all_outs, nonseq_pairs, closures = hoist_invariants(all_outs, variant, {}, nonseq_args)
    # strict=True is about shared variables (Theano's rule): other free variables the step
    # reads become non-sequences on their own, strict or not
    unpassed = [c for c in closures if isinstance(c, SharedVariable)]
    if strict and unpassed:
        raise ValueError(f"{name}: strict=True but the step function uses the shared "
                         f"variable(s) {', '.join(str(c) for c in unpassed)} without "
                         "receiving them as non-sequences (pass them in non_sequences)")

    n_user_states = len(state_specs)
    info = ScanInfo(
        n_seqs=len(seq_inner),
        state_taps=tuple(tuple(s.taps) for s in state_specs) + ((-1,),) * len(upd_shared),
        keep=tuple(s.keep for s in state_specs) + (False,) * len(upd_shared),
        n_nitsot=len(nitsot_outs), n_nonseqs=len(nonseq_pairs), as_while=cond is not None,
        truncate_gradient=int(truncate_gradient), name=name,
        state_names=tuple(str(outputs[s.index].name or "") for s in state_specs)
        + tuple(str(s) for s in upd_shared),
        nitsot_names=tuple(str(outputs[i].name or "") for i in nitsot_index))
    inner_inputs = seq_inner + tap_args + upd_phs + [ph for ph, _ in nonseq_pairs]
    op = Scan(inner_inputs, all_outs, info, mode)
    init_bufs = [s.init_buffer for s in state_specs] + \
[_padleft(s) for s in upd_shared]
    node_outs = op(n_var, *seq_outer, *init_bufs, *[ov for _, ov in nonseq_pairs])
    node_outs = node_outs if isinstance(node_outs, list) else [node_outs]

    results: list[Any] = [None] * len(outputs)
    for j, s in enumerate(state_specs):
        buf = node_outs[j]
        results[s.index] = buf[-1] if keep_last else buf[-min(s.taps):]
    for k, i in enumerate(nitsot_index):
        out = node_outs[len(info.state_taps) + k]
        results[i] = out[-1] if keep_last else out
    updates = ScanUpdates()
    for k, s in enumerate(upd_shared):
        updates[s] = node_outs[n_user_states + k][-1]
    node = node_outs[0].owner if node_outs else None
    if node is not None:
        # which outputs carry which shared variable: a loop around this one whose step does
        # not return these updates still threads the random streams through (see below)
        node.tag.shared_states = [(s, n_user_states + k) for k, s in enumerate(upd_shared)]
    return results, updates, node


def _with_default_updates(roots: list[Variable], pairs: list, step_inputs: list[Variable],
                          name: str) -> list:
    """The step's update pairs plus, Theano's rule, the `default_update` of every shared
    variable the step reads (directly, through a returned update or through another default
    update) that the step did not update itself: a random stream drawn in the step moves on at
    every step, and the loop returns its state after the last one."""
    pairs = [tuple(p) for p in pairs]
    done = {id(s) for s, _ in pairs}
    exprs = [e for _, e in pairs if isinstance(e, Variable)]
    # the free variables a step may read: its arguments and whatever its results read
    known = {id(v) for v in [*step_inputs, *graph_inputs([*roots, *exprs])]}
    todo = [*roots, *exprs]
    while todo:
        new = [v for v in graph_inputs(todo) if isinstance(v, SharedVariable)
               and id(v) not in done and getattr(v, "default_update", None) is not None]
        nested = _nested_threads(todo)
        todo = []
        for v in new:
            done.add(id(v))
            threads = nested.get(id(v), [])
            if len(threads) == 1:
                # an inner loop draws from this stream but the step dropped the updates
                # that loop returned: the stream moves on by that loop's draws, not by the
                # default update of one draw (which would repeat numbers, or read the inner
                # loop's variables)
                pairs.append((v, threads[0]))
                continue
            if len(threads) > 1:
                raise ValueError(
                    f"{name}: {len(threads)} inner loops of the step update {v}, and the step "
                    "returns none of their updates, so each would start from the same state; "
                    "chain them (start the second after the first's updates) and return the "
                    "updates of the last one from the step")
            upd = v.default_update
            if not isinstance(upd, Variable):
                upd = T.as_tensor_variable(upd, dtype=v.type.dtype)
            missing = [f for f in graph_inputs([upd]) if f.owner is None and id(f) not in known
                       and not isinstance(f, (SharedVariable, Constant))]
            if missing:
                raise ValueError(
                    f"{name}: the default update of {v} reads {', '.join(map(str, missing))}, "
                    "which the step function neither receives nor computes (a variable of "
                    "another loop?). When a step runs an inner scan, return the updates that "
                    "scan returned from the step: `out, upd = scan(...); return out, upd`")
            pairs.append((v, upd))
            todo.append(upd)
    return pairs


def _nested_threads(roots: list[Variable]) -> dict[int, list[Variable]]:
    """id(shared variable) -> the final values the loops in `roots`' graph give it (one per
    loop that threads it as a state, scan_impl's `tag.shared_states`)."""
    found: dict[int, list[Variable]] = {}
    seen: set[int] = set()
    for v in ancestors(roots):
        node = v.owner
        if node is None or id(node) in seen or not isinstance(node.op, Scan):
            continue
        seen.add(id(node))
        for s, j in getattr(node.tag, "shared_states", ()):
            found.setdefault(id(s), []).append(node.outputs[j][-1])
    return found


def _relaxable(o: Variable, inner_type: Any) -> bool:
    """Whether `o` differs from the state's type only by dims the state thinks have length 1."""
    ot = o.type
    return (getattr(ot, "dtype", None) == inner_type.dtype
            and getattr(ot, "ndim", None) == inner_type.ndim
            and any(ib and not ob for ib, ob in zip(inner_type.broadcastable, ot.broadcastable)))


def _fit_state(o: Variable, inner_type: Any, what: str) -> Variable:
    """`o` as a value of the state's type, or a TypeError naming the output."""
    ot = o.type
    if getattr(ot, "dtype", None) != inner_type.dtype or getattr(ot, "ndim", None) != inner_type.ndim:
        raise TypeError(
            f"{what}: the step returns {ot} but the output's initial value (outputs_info) is "
            f"{inner_type}; the step must return the dtype and number of dimensions of the "
            f"initial value (cast one of them, e.g. T.cast(..., '{inner_type.dtype}'))")
    conv = inner_type.convert_variable(o)
    if conv is None:
        raise TypeError(
            f"{what}: the step returns {ot} (broadcastable {ot.broadcastable}) but the initial "
            f"value is {inner_type} (broadcastable {inner_type.broadcastable}); make the "
            "broadcast patterns match (T.specify_broadcastable_as)")
    return conv
