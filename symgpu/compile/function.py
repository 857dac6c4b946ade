"""`function()`: compile a graph into a callable, and the Function it returns."""
from __future__ import annotations

import pickle
import threading
import time
import warnings
from typing import Any, Callable, Sequence

from symgpu.compile import devices
from symgpu.compile import frames as _frames
from symgpu.compile.frames import Layout, link_frame
from symgpu.compile.host_fallback import keep_source, recompile_on_host
from symgpu.compile.speculation import SpeculationFailed, allow_guards, without_rewrite
from symgpu.compile.io import In, Out
import symgpu.compile.debugmode  # noqa: F401  (registers mode='DebugMode')
from symgpu.compile.function_copy import copy_function
from symgpu.compile.mode import Mode, get_mode
from symgpu.compile.profiling import ProfileStats, _atexit_print_list, attach_profile
from symgpu.graph.sharedvalue import SharedVariable
from symgpu.graph.basic import (Constant, Scratchpad, Variable, VariableTag, ancestors,
                                clone_graph, graph_inputs, set_eval_compiler)
from symgpu.graph.fg import FunctionGraph
from symgpu.tensor.type import as_tensor_variable

__all__ = ["function", "Function", "FunctionMaker", "UnusedInputError", "clone_replace",
           "function_dump"]


class UnusedInputError(ValueError):
    """An explicit input does not influence any output or update."""


def clone_replace(outputs: Sequence[Variable], replace: dict[Variable, Variable]) -> list[Variable]:
    """Copies of `outputs` where each key of `replace` is replaced by its value."""
    if not replace:
        return list(outputs)
    keys = list(replace)
    blockers = [k for k in keys]
    frees = [v for v in graph_inputs(outputs, blockers) if v not in replace]
    memo = {k: replace[k] for k in keys}
    for v in frees:
        memo[v] = v
    _, outs, _ = clone_graph(frees + keys, list(outputs), memo=memo, copy_inputs=False)
    return outs


def _as_pairs(x: Any, what: str) -> list[tuple[Variable, Any]]:
    if x is None:
        return []
    if isinstance(x, dict):
        return list(x.items())
    try:
        pairs = [tuple(p) for p in x]
    except TypeError:
        raise TypeError(f"{what} must be a dict or a list of (variable, value) pairs") from None
    for p in pairs:
        if len(p) != 2:
            raise TypeError(f"{what} must be a dict or a list of (variable, value) pairs; got {p!r}")
    return pairs


def _to_variable_like(target: Variable, value: Any, what: str) -> Variable:
    """`value` as a variable of `target`'s type (converting constants and broadcast patterns)."""
    if not isinstance(value, Variable):
        value = as_tensor_variable(value, dtype=getattr(target.type, "dtype", None))
    converted = target.type.convert_variable(value)
    if converted is None:
        raise TypeError(
            f"{what}: {target} has type {target.type} but the new value {value} has type "
            f"{value.type}; cast the expression (e.g. T.cast(expr, '{getattr(target.type, 'dtype', '?')}'))")
    return converted


class FunctionMaker:
    """Holds what was compiled: the rewritten `fgraph`, the mode, the inputs (In), outputs
    (Out), the shared variables read (`shared_vars`, fgraph.inputs after the explicit ones)
    and the updates (`updates`: (shared variable, fgraph output index)), and the timings.
    It is what a pickled Function carries: loading re-links it (no rewriting)."""

    def __init__(self, fgraph: FunctionGraph, mode: Mode, inputs: list[In], outputs: list[Out],
                 rewrite_time: float, link_time: float, pass_times: dict[str, float],
                 shared_vars: list[SharedVariable] | None = None,
                 updates: list[tuple[SharedVariable, int]] | None = None,
                 single: bool = False, allow_input_downcast: bool | None = None):
        self.fgraph = fgraph
        self.mode = mode
        self.inputs = inputs
        self.outputs = outputs
        self.rewrite_time = rewrite_time
        self.link_time = link_time
        self.pass_times = pass_times
        self.shared_vars = list(shared_vars or [])
        self.updates = list(updates or [])
        self.single = single
        self.allow_input_downcast = allow_input_downcast
        #: the graph before rewriting, kept where a GPU may take part (host_fallback.py)
        self.source: tuple[list, list] | None = None

    def __reduce__(self):
        fg = self.fgraph
        state = {k: v for k, v in self.__dict__.items() if k != "fgraph"}
        return (_rebuild_maker, (fg.inputs, fg.outputs, dict(fg.update_mapping), state))


def _rebuild_maker(inputs: list, outputs: list, update_mapping: dict, state: dict) -> FunctionMaker:
    maker = FunctionMaker.__new__(FunctionMaker)
    maker.__dict__.update(state)
    maker.fgraph = FunctionGraph(inputs, outputs, clone=False, update_mapping=update_mapping)
    return maker


class Function:
    """A compiled graph. Call it with the inputs' values (positionally or by name).

    Calls from several threads are safe: each call runs in its own execution frame
    (symgpu/compile/frames.py) and the updates of one call are atomic (docs/threads.md)."""

    def __init__(self, maker: FunctionMaker, name: str | None,
                 share: dict[Variable, list] | None = None, guard: Sequence[Any] = ()):
        self.maker = maker
        self.name = name
        fg = maker.fgraph
        n_out = len(maker.outputs)
        ins = maker.inputs
        self._n_inputs = len(ins)
        graph_in = set(fg.inputs)
        updated_outputs = set(fg.outputs[n_out:])
        output_copy = [not o.borrow and (_aliases_an_input(v, graph_in) or v in updated_outputs)
                       for o, v in zip(maker.outputs, fg.outputs[:n_out])]
        n_explicit = len(ins)
        updates = []
        for s, j in maker.updates:
            k = maker.shared_vars.index(s)
            v = fg.outputs[j]
            updates.append((j, k, _aliases_an_input(v, graph_in)
                            and v is not fg.inputs[n_explicit + k]))
        self._layout = Layout(fg, maker.mode, n_explicit, n_out,
                              [sv.container for sv in maker.shared_vars], updates, output_copy,
                              maker.single, name)
        self._frame = link_frame(self._layout, share, guard, primary=True)
        self.vm = self._frame.vm
        self.fn = self.vm
        self._filters = [_input_filter(v, inp, i, name, maker.allow_input_downcast,
                                       _device_input_filter(v, fg))
                         for i, (v, inp) in enumerate(zip(fg.inputs, ins))]
        self._defaults = [self._filters[i](inp.value) if inp.has_default else _MISSING
                          for i, inp in enumerate(ins)]
        self._names = {inp.name: i for i, inp in enumerate(ins) if inp.name}
        self._spares: list = []
        self._link_lock = threading.Lock()
        self.profile = None
        self.trust_input = False  # sets _fast, the generated call for positional arguments

    # -- calling ----------------------------------------------------------------------------
    def _bind(self, args: tuple, kwargs: dict) -> list:
        if len(args) > self._n_inputs:
            raise TypeError(f"{self._label()} takes {self._n_inputs} argument(s), got {len(args)}")
        values = list(args) + [_MISSING] * (self._n_inputs - len(args))
        for key, value in kwargs.items():
            if key not in self._names:
                raise TypeError(f"{self._label()} has no input named {key!r}; named inputs: "
                                f"{', '.join(self._names) or 'none'}")
            pos = self._names[key]
            if values[pos] is not _MISSING:
                raise TypeError(f"{self._label()} got input {key!r} twice")
            values[pos] = value
        for i, v in enumerate(values):
            if v is _MISSING:
                if self._defaults[i] is _MISSING:
                    missing = [self.maker.inputs[j].name or f"#{j}" for j, w in enumerate(values)
                               if w is _MISSING and self._defaults[j] is _MISSING]
                    raise TypeError(f"{self._label()} is missing argument(s): {', '.join(map(str, missing))}")
                values[i] = self._defaults[i]
        return values

    def _label(self) -> str:
        return f"function {self.name!r}" if self.name else "the function"

    @property
    def trust_input(self) -> bool:
        """True: arguments are stored as given, unchecked (Theano's `trust_input`)."""
        return self._trust_input

    @trust_input.setter
    def trust_input(self, value: bool) -> None:
        self._trust_input = bool(value)
        self._fast = (self._frame.caller(None, self._call_spare_trusted) if value
                      else self._frame.caller(self._filters, self._call_spare))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != self._n_inputs:
            args = self._bind(args, kwargs)
        try:
            return self._fast(*args)
        except SpeculationFailed as exc:     # nothing was updated: recompile and call again
            self._respecialize(exc.rewrite)
            return self._fast(*args)         # once: a guard failing again there propagates

    def _respecialize(self, rewrite: str) -> None:
        """Compile this function again without `rewrite`, one of whose guards failed
        (compile/speculation.py), keeping its name, profile and input checking."""
        with self._link_lock:
            if getattr(self.maker, "source", None) is None:
                raise RuntimeError(f"{self._label()}: a guard of {rewrite!r} failed and this "
                                   "function (a copy with swapped or deleted updates) keeps no "
                                   "graph to compile again; compile it with "
                                   f"optimizer_excluding={rewrite}")
            if rewrite in self.maker.mode.excluding:
                return      # another thread's call compiled it again meanwhile
            maker = without_rewrite(self.maker, rewrite)
            trust, profile = self.trust_input, self.profile
            Function.__init__(self, maker, self.name)
            self.trust_input = trust
            if profile is not None:
                attach_profile(self, profile)

    # -- frames -----------------------------------------------------------------------------
    def _call_spare(self, *args: Any) -> Any:
        """A call made while a token of the primary frame's guard is gone: run in a spare
        frame, holding the locks of the values it updates (waiting for them while another
        thread holds them; at once where this thread does, in a callback)."""
        return self._in_spare(self._filters, args)

    def _call_spare_trusted(self, *args: Any) -> Any:
        return self._in_spare(None, args)

    def _in_spare(self, filters: list | None, args: tuple) -> Any:
        taken = []
        try:
            for lock in self._layout.locks:
                lock.acquire()
                taken.append(lock)
            frame = self._take_spare()
            try:
                return frame.caller(filters, None)(*args)
            finally:
                self._give_back(frame)
        finally:
            for lock in reversed(taken):
                lock.release()

    def _take_spare(self):
        try:
            return self._spares.pop()  # atomic: each spare goes to one call
        except IndexError:
            pass
        with self._link_lock:  # linking is not reentrant-safe for one graph
            frame = link_frame(self._layout)
        profiler = self.vm.profiler
        if profiler is not None:  # profile the spare frame into the same stats
            frame.vm.profiler = type(profiler)(profiler.stats, frame.vm)
        return frame

    def _give_back(self, frame) -> None:
        if len(self._spares) < _frames.SPARE_FRAMES:
            self._spares.append(frame)

    def free(self) -> None:
        """Theano's Function.free: empty the storage cells of every value this function
        computed (intermediates and the last outputs; not the inputs, shared values or
        constants), in each execution frame and in the inner graphs of its loops, branches
        and OpFromGraph nodes, so their memory can be returned (with allow_gc off they keep
        the last call's arrays). The function stays callable. Not while a call of it runs."""
        for frame in [self._frame, *self._spares]:
            frame.vm.clear_intermediates()
            for node in frame.vm.nodes:
                free = getattr(node.op, "free", None)
                if callable(free):
                    free()

    @property
    def n_frames(self) -> int:
        """Frames linked and kept (1 + spares): how many calls ran at once, up to a few."""
        return 1 + len(self._spares)

    # -- copying and pickling ---------------------------------------------------------------
    def copy(self, share_memory: bool = False, swap: dict | None = None,
             delete_updates: bool = False, name: str | None = None,
             profile: Any = None) -> "Function":
        """A new Function computing the same graph (Theano's `Function.copy`)."""
        return copy_function(self, share_memory, swap, delete_updates, name, profile)

    def __copy__(self) -> "Function":
        return self.copy()

    def __reduce__(self):
        p = self.profile
        profile = None
        if p is not None:
            profile = (p.message, any(q is p for q in _atexit_print_list), p.memory)
        return (_rebuild_function, (self.maker, self.name, self.trust_input, profile))

    def get_shared(self) -> list[SharedVariable]:
        """The shared variables this function reads or updates."""
        return list(self.maker.shared_vars)

    # -- introspection ----------------------------------------------------------------------
    def __repr__(self) -> str:
        return f"<symgpu.Function {self.name or ''} with {len(self.maker.fgraph.apply_nodes)} nodes>"


def _rebuild_function(maker: FunctionMaker, name: str | None, trust_input: bool,
                      profile: tuple | None) -> Function:
    """Unpickling: re-link the pickled (already rewritten) graph; the kernel caches make
    this fast. A function compiled for a GPU that is not in use here is compiled again for
    the host from the graph it was given (compile/host_fallback.py). A profiled function
    comes back profiled, into fresh statistics."""
    if _missing_contexts(maker):
        if getattr(maker, "source", None) is None:
            _check_contexts(maker, name)
        maker = recompile_on_host(maker)
    t0 = time.perf_counter()
    fn = Function(maker, name)
    maker.link_time = time.perf_counter() - t0
    fn.trust_input = trust_input
    stats = None
    if profile is not None:
        message, atexit_print, memory = profile
        stats = ProfileStats(atexit_print=atexit_print, message=message, memory=memory)
    attach_profile(fn, stats)
    return fn


def _missing_contexts(maker: FunctionMaker) -> list:
    """The GPU contexts `maker`'s graph was compiled for that are not in use here."""
    names = {v.type.context_name for v in maker.fgraph.variables
             if hasattr(v.type, "context_name") and hasattr(v.type, "value_from_pickle")}
    if not names:
        return []
    in_use = devices.contexts_in_use()
    return [n for n in names if n not in in_use
            and not (n is None and devices.default_context_active())]


def _check_contexts(maker: FunctionMaker, name: str | None) -> None:
    """Refuse to re-link a graph compiled for a GPU context that is not in use here (its
    shared values load as host values; the graph's GPU ops cannot run) when the graph it was
    compiled from was not kept."""
    missing = _missing_contexts(maker)
    if missing:
        where = ", ".join("the default GPU context" if n is None else f"GPU context {n!r}"
                          for n in missing)
        raise RuntimeError(
            f"cannot load {'function ' + repr(name) if name else 'a function'}: it was "
            f"compiled for {where}, which is not in use here. Shared variables pickled with it "
            "load as host values: pickle them on their own (or with symgpu.misc.pkl_utils) and "
            "compile the function again on this machine")


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def _device_input_filter(var: Variable, fgraph: FunctionGraph) -> Callable | None:
    """How a device array (a CUDA array, a torch tensor...) fed to host input `var` stays on
    the device, or None. Only when every reader of `var` can take it there: one op with
    `device_input_filter(host_type)` (GpuFromHost, whose filter returns None for values that
    are not device arrays) and ops that read only the shape."""
    taker = None
    for client, _ in fgraph.clients.get(var, []):
        if client == "output":
            return None
        if getattr(client.op, "device_input_filter", None) is None:
            if getattr(client.op, "reads_only_shape", False):
                continue
            return None
        if taker is not None and client.op != taker:
            return None
        taker = client.op
    return None if taker is None else taker.device_input_filter(var.type)


def _input_filter(var: Variable, inp: In, index: int, fname: str | None,
                  allow_input_downcast: bool | None,
                  device: Callable | None = None) -> Callable[[Any], Any]:
    """A fast check-and-convert for one argument, with errors that name the input.
    `device` (see `_device_input_filter`) takes device arrays fed to a host input."""
    ttype = var.type
    label = f"input {inp.name!r} (#{index})" if inp.name else f"input #{index}"
    where = f" of function {fname!r}" if fname else ""
    allow = inp.allow_downcast if inp.allow_downcast is not None else allow_input_downcast
    slow = ttype.filter
    fast = getattr(ttype, "make_fast_filter", None)
    accept = fast() if fast is not None else None
    scalars = getattr(ttype, "make_scalar_filter", None)
    scalar = scalars(allow) if scalars is not None and not inp.strict else None

    def check(value):
        if accept is not None and accept(value):
            return value
        if scalar is not None:
            arr = scalar(value)
            if arr is not None:
                return arr
        try:
            if device is not None:
                moved = device(value, inp.strict, allow)
                if moved is not None:
                    return moved
            return slow(value, strict=inp.strict, allow_downcast=allow)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"bad argument for {label}{where}, expected {ttype}: {exc}") from None

    # values it returns unchanged (generated calls test it first): a host array that needs
    # no conversion, or a device array the device filter takes as it is
    passes = getattr(device, "accept", None)
    if passes is not None:
        check.accept = passes if accept is None else \
            (lambda value: accept(value) or passes(value))
    else:
        check.accept = accept
    return check


def _aliases_an_input(var: Variable, inputs: set) -> bool:
    """Whether `var` may share memory with a graph input or a constant (views followed)."""
    seen = set()
    stack = [var]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in inputs or isinstance(v, Constant):
            return True
        node = v.owner
        if node is None:
            continue
        op = node.op
        for mapping in (getattr(op, "view_map", {}), getattr(op, "destroy_map", {})):
            for i in mapping.get(v.index, ()):
                stack.append(node.inputs[i])
    return False


def function(inputs: Sequence[Any] = (), outputs: Any = None, updates: Any = (), givens: Any = (),
             mode: Any = None, profile: Any = None, name: str | None = None,
             on_unused_input: str | None = "raise", allow_input_downcast: bool | None = None,
             no_default_updates: Any = False, accept_inplace: bool = False) -> Function:
    """Compile `outputs` as a function of `inputs`; see docs/api.md.

    `updates` assigns new values to shared variables after each call (all at once, only when
    the whole call succeeded); `givens` substitutes variables before compiling.
    """
    t_start = time.perf_counter()
    if isinstance(inputs, (Variable, In)):
        raise TypeError("function() takes a list of inputs; wrap a single input as [x]")
    ins = [i if isinstance(i, In) else In(i) if isinstance(i, Variable) else _bad_input(i)
           for i in inputs]
    seen = set()
    #: computed inputs -> the free variables standing for them: as in Theano, an input may be
    #: an intermediate result, whose value the call then gives (its own inputs are not needed)
    cut: dict[Variable, Variable] = {}
    for i, inp in enumerate(ins):
        v = inp.variable
        if isinstance(v, Constant):
            raise TypeError(f"input #{i} ({v}) is a constant; constants cannot be inputs")
        if isinstance(v, SharedVariable):
            raise TypeError(f"input #{i} ({v}) is a shared variable; shared variables are "
                            "implicit inputs: leave it out of the list (or use givens)")
        if v.owner is not None:
            cut[v] = v.type(v.name)
        if v in seen:
            raise ValueError(f"input {v} appears twice in the inputs list")
        seen.add(v)

    single = outputs is not None and not isinstance(outputs, (list, tuple))
    outs_list = [] if outputs is None else [outputs] if single else list(outputs)
    outs = []
    for o in outs_list:
        if isinstance(o, Out):
            outs.append(o)
        else:
            if not isinstance(o, Variable):
                o = as_tensor_variable(o)
            outs.append(Out(o))

    update_pairs = []
    for shared_var, value in _as_pairs(updates, "updates"):
        if not isinstance(shared_var, SharedVariable):
            raise TypeError(f"updates: {shared_var} is not a shared variable; only shared "
                            "variables can be updated")
        update_pairs.append((shared_var, _to_variable_like(shared_var, value, f"update of {shared_var}")))
    if len({id(s) for s, _ in update_pairs}) != len(update_pairs):
        raise ValueError("updates: a shared variable is updated twice")
    update_pairs += _default_updates([o.variable for o in outs] + [v for _, v in update_pairs],
                                     update_pairs, no_default_updates)

    given_pairs = {}
    for var, value in _as_pairs(givens, "givens"):
        if not isinstance(var, Variable):
            raise TypeError(f"givens: keys must be symbolic variables, got {var!r}")
        given_pairs[var] = _to_variable_like(var, value, f"givens for {var}")
    for var, free in cut.items():
        if var in given_pairs:
            raise ValueError(f"{var} is both an input and replaced by givens")
        given_pairs[var] = free

    targets = [o.variable for o in outs] + [v for _, v in update_pairs]
    targets = clone_replace(targets, given_pairs)
    out_vars, upd_vars = targets[: len(outs)], targets[len(outs):]

    used = set(ancestors(targets))
    policy = on_unused_input or "raise"
    for i, inp in enumerate(ins):
        if cut.get(inp.variable, inp.variable) not in used:
            msg = (f"input #{i} ({inp.variable}) of {name or 'the function'} is not used to "
                   "compute any output or update; pass on_unused_input='ignore' to allow it")
            if policy == "raise":
                raise UnusedInputError(msg)
            if policy == "warn":
                warnings.warn(msg, stacklevel=2)

    explicit = [cut.get(inp.variable, inp.variable) for inp in ins]
    shared_vars = [v for v in graph_inputs(targets) if isinstance(v, SharedVariable)
                   and v not in given_pairs]
    for s, _ in update_pairs:
        if s not in shared_vars:
            shared_vars.append(s)
    fg_inputs = explicit + shared_vars
    fgraph = FunctionGraph(fg_inputs, out_vars + upd_vars, clone=True)
    n_out = len(outs)
    fgraph.update_mapping = {n_out + k: len(explicit) + shared_vars.index(s)
                             for k, (s, _) in enumerate(update_pairs)}
    mode_obj = get_mode(mode)
    t0 = time.perf_counter()
    source = keep_source(fgraph)
    if source is not None:       # what a failed guard recompiles from (compile/speculation.py)
        allow_guards(fgraph)
    pass_times = mode_obj.rewrite(fgraph)
    t1 = time.perf_counter()

    maker = FunctionMaker(fgraph, mode_obj, ins, outs, t1 - t0, 0.0, pass_times, shared_vars,
                          [(s, n_out + k) for k, (s, _) in enumerate(update_pairs)], single,
                          allow_input_downcast)
    maker.source = source
    fn = Function(maker, name)
    maker.link_time = time.perf_counter() - t1
    maker.compile_time = time.perf_counter() - t_start
    attach_profile(fn, profile)
    return fn


def _default_updates(roots: list[Variable], explicit: list, skip_all: Any) -> list:
    """Theano's rule: each shared variable the graph reads that has a `default_update` is
    updated by it, unless `no_default_updates` is True or lists it, or `updates` names it.
    Default updates may read more such variables, so this repeats until none is new."""
    if skip_all is True:
        return []
    skip = {id(s) for s, _ in explicit} | {id(v) for v in (skip_all or ())}
    found, todo = [], roots
    while todo:
        todo = [v for v in graph_inputs(todo) if isinstance(v, SharedVariable) and id(v) not in skip
                and getattr(v, "default_update", None) is not None]
        skip.update(id(v) for v in todo)
        found += [(v, _to_variable_like(v, v.default_update, f"default_update of {v}")) for v in todo]
        todo = [u for _, u in found[len(found) - len(todo):]]
    return found


def function_dump(filename: Any, inputs: Sequence[Any], outputs: Any = None, mode: Any = None,
                  updates: Any = None, givens: Any = None, no_default_updates: Any = False,
                  accept_inplace: bool = False, name: str | None = None,
                  rebuild_strict: bool = True, allow_input_downcast: bool | None = None,
                  profile: Any = None, on_unused_input: str | None = None,
                  extra_tag_to_remove: Sequence[str] | None = None) -> None:
    """Pickle what `function` is given to `filename` (a path or a binary file), so that a
    compilation can be reproduced elsewhere::

        d = pickle.load(open(filename, "rb"))
        f = symgpu.function(**d)

    Variables' creation traces and test values (and the tag entries in
    `extra_tag_to_remove`) are left out of the pickle; the objects themselves are untouched.
    `rebuild_strict` is Theano's: symgpu's `function` always requires givens and updates to
    have (or convert to) the replaced variable's type, so only True is accepted, and it is
    not stored (function() has no such argument)."""
    if rebuild_strict is not True:
        raise ValueError("function_dump: rebuild_strict=False is not supported: symgpu's "
                         "function() requires givens and updates of the replaced types")
    d = dict(inputs=inputs, outputs=outputs, mode=mode, updates=updates, givens=givens,
             no_default_updates=no_default_updates, accept_inplace=accept_inplace, name=name,
             allow_input_downcast=allow_input_downcast, profile=profile,
             on_unused_input=on_unused_input)
    if hasattr(filename, "write"):
        _TagStripPickler(filename, extra_tag_to_remove).dump(d)
        return
    with open(filename, "wb") as f:
        _TagStripPickler(f, extra_tag_to_remove).dump(d)


class _TagStripPickler(pickle.Pickler):
    """Pickles tags without traces and test values (misc.pkl_utils.StripPickler does the
    same for whole models; it sits above this layer)."""

    def __init__(self, file: Any, extra: Sequence[str] | None):
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.strip = {"trace", "test_value", *(extra or ())}

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) in (Scratchpad, VariableTag) and not self.strip.isdisjoint(obj.__dict__):
            kept = {k: v for k, v in obj.__dict__.items() if k not in self.strip}
            if type(obj) is VariableTag:
                return (_variable_tag, (obj._type, kept))
            return (_scratchpad, (kept,))
        return NotImplemented


def _variable_tag(vtype: Any, state: dict) -> VariableTag:
    tag = VariableTag(vtype)
    tag.__dict__.update(state)
    return tag


def _scratchpad(state: dict) -> Scratchpad:
    pad = Scratchpad()
    pad.__dict__.update(state)
    return pad


def _bad_input(i: Any) -> In:
    raise TypeError(f"inputs must be symbolic variables or In(...), got {type(i).__name__}: {i!r}")


set_eval_compiler(function)  # Variable.eval compiles through function (graph sits below us)
