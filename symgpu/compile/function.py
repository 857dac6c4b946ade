"""`function()`: compile a graph into a callable, and the Function it returns."""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Sequence

from symgpu.compile.io import In, Out
from symgpu.compile.mode import Mode, get_mode
from symgpu.compile.sharedvalue import SharedVariable
from symgpu.graph.basic import Constant, Variable, ancestors, clone_graph, graph_inputs
from symgpu.graph.fg import FunctionGraph
from symgpu.link.vm import VM

__all__ = ["function", "Function", "FunctionMaker", "UnusedInputError", "clone_replace"]


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
        from symgpu.tensor.type import as_tensor_variable
        value = as_tensor_variable(value, dtype=getattr(target.type, "dtype", None))
    converted = target.type.convert_variable(value)
    if converted is None:
        raise TypeError(
            f"{what}: {target} has type {target.type} but the new value {value} has type "
            f"{value.type}; cast the expression (e.g. T.cast(expr, '{getattr(target.type, 'dtype', '?')}'))")
    return converted


class FunctionMaker:
    """Holds what was compiled: the rewritten `fgraph`, the mode and the timings."""

    def __init__(self, fgraph: FunctionGraph, mode: Mode, inputs: list[In], outputs: list[Out],
                 rewrite_time: float, link_time: float, pass_times: dict[str, float]):
        self.fgraph = fgraph
        self.mode = mode
        self.inputs = inputs
        self.outputs = outputs
        self.rewrite_time = rewrite_time
        self.link_time = link_time
        self.pass_times = pass_times


class Function:
    """A compiled graph. Call it with the inputs' values (positionally or by name)."""

    def __init__(self, maker: FunctionMaker, vm: VM, input_cells: list[list], filters: list[Callable],
                 defaults: list[Any], names: dict[str, int], output_cells: list[list],
                 output_copy: list[bool], updates: list[tuple[list, list, bool]],
                 single_output: bool, name: str | None):
        self.maker = maker
        self.vm = vm
        self.fn = vm
        self.name = name
        self._input_cells = input_cells
        self._filters = filters
        self._defaults = defaults
        self._names = names
        self._n_inputs = len(input_cells)
        self._output_cells = output_cells
        self._output_copy = output_copy
        # cells of computed outputs are emptied after each call so no later call can write
        # into an array the caller holds; input, shared and constant cells keep their values
        fg = maker.fgraph
        self._clear_after_call = [vm.storage_map[v] for v in fg.outputs[: len(output_cells)]
                                  if v.owner is not None]
        self._clear_updates = [vm.storage_map[v] for v in fg.outputs[len(output_cells):]
                               if v.owner is not None]
        self._any_copy = any(output_copy)
        self._updates = updates
        self._single = single_output
        self.profile = None
        self.trust_input = False
        self._fast = _fast_call(self)

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

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs and len(args) == self._n_inputs and not self.trust_input:
            return self._fast(*args)
        if kwargs or len(args) != self._n_inputs:
            args = self._bind(args, kwargs)
        cells = self._input_cells
        if not self.trust_input:
            filters = self._filters
            for i, value in enumerate(args):
                cells[i][0] = filters[i](value)
        else:
            for i, value in enumerate(args):
                cells[i][0] = value
        self.vm()
        results = [cell[0] for cell in self._output_cells]
        if self._updates:
            # read every new value before writing any: updates are simultaneous
            values = [cell[0] for _, cell, _ in self._updates]
            for (container, _, copy), value in zip(self._updates, values):
                container[0] = value.copy() if copy else value
            for cell in self._clear_updates:
                cell[0] = None
        if self._any_copy:
            results = [r.copy() if c else r for r, c in zip(results, self._output_copy)]
        for cell in self._clear_after_call:
            cell[0] = None
        if self._single:
            return results[0]
        return results

    # -- introspection ----------------------------------------------------------------------
    def __repr__(self) -> str:
        return f"<symgpu.Function {self.name or ''} with {len(self.maker.fgraph.apply_nodes)} nodes>"


def _fast_call(fn: Function) -> Callable:
    """`Function.__call__` for all inputs given positionally, as straight-line code written
    for this function's inputs, outputs and updates (the general path loops over lists)."""
    vm = fn.vm
    ns: dict[str, Any] = {"vm": vm, "run": vm.run_thunks}
    n = fn._n_inputs
    args = ", ".join(f"a{i}" for i in range(n))
    lines = [f"def call({args}):"]
    for i, (cell, filt) in enumerate(zip(fn._input_cells, fn._filters)):
        ns[f"c{i}"], ns[f"f{i}"] = cell, filt
        lines.append(f"    c{i}[0] = f{i}(a{i})")
    if type(vm).__call__ is VM.__call__:  # not a checking VM (DebugMode): skip its dispatch
        lines += ["    if vm.profiler is None and vm.runner is None:", "        run()",
                  "    else:", "        vm()"]
    else:
        lines.append("    vm()")
    for j, cell in enumerate(fn._output_cells):
        ns[f"o{j}"] = cell
        lines.append(f"    r{j} = o{j}[0]")
    # read every new value before writing any: updates are simultaneous
    for k, (_, cell, _) in enumerate(fn._updates):
        ns[f"u{k}"] = cell
        lines.append(f"    v{k} = u{k}[0]")
    for k, (container, _, copy) in enumerate(fn._updates):
        ns[f"s{k}"] = container
        lines.append(f"    s{k}[0] = v{k}.copy()" if copy else f"    s{k}[0] = v{k}")
    for k, cell in enumerate(fn._clear_updates + fn._clear_after_call):
        ns[f"z{k}"] = cell
        lines.append(f"    z{k}[0] = None")
    results = [f"r{j}.copy()" if c else f"r{j}" for j, c in enumerate(fn._output_copy)]
    lines.append(f"    return {results[0]}" if fn._single else f"    return [{', '.join(results)}]")
    exec(compile("\n".join(lines), f"<symgpu Function {fn.name or ''}>", "exec"), ns)
    return ns["call"]


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def _device_input_filter(var: Variable, fgraph: FunctionGraph) -> Callable | None:
    """How a device array (a CUDA array, a torch tensor...) fed to host input `var` stays on
    the device, or None. Only when every reader of `var` can take it there: one op with
    `filter_device_input(value, host_type, strict, allow_downcast)` (GpuFromHost, which
    returns None for values that are not device arrays) and ops that read only the shape."""
    taker = None
    for client, _ in fgraph.clients.get(var, []):
        if client == "output":
            return None
        hook = getattr(client.op, "filter_device_input", None)
        if hook is None:
            if getattr(client.op, "reads_only_shape", False):
                continue
            return None
        if taker is not None and client.op != taker.__self__:
            return None
        taker = hook
    if taker is None:
        return None
    host_type = var.type
    return lambda value, strict, allow: taker(value, host_type, strict, allow)


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

    def check(value):
        if accept is not None and accept(value):
            return value
        try:
            if device is not None:
                moved = device(value, inp.strict, allow)
                if moved is not None:
                    return moved
            return slow(value, strict=inp.strict, allow_downcast=allow)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"bad argument for {label}{where}, expected {ttype}: {exc}") from None

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
    """Compile `outputs` as a function of `inputs`; see SPEC.md "Compiling and running".

    `updates` assigns new values to shared variables after each call (all at once, only when
    the whole call succeeded); `givens` substitutes variables before compiling.
    """
    t_start = time.perf_counter()
    if isinstance(inputs, (Variable, In)):
        raise TypeError("function() takes a list of inputs; wrap a single input as [x]")
    ins = [i if isinstance(i, In) else In(i) if isinstance(i, Variable) else _bad_input(i)
           for i in inputs]
    seen = set()
    for i, inp in enumerate(ins):
        v = inp.variable
        if isinstance(v, Constant):
            raise TypeError(f"input #{i} ({v}) is a constant; constants cannot be inputs")
        if isinstance(v, SharedVariable):
            raise TypeError(f"input #{i} ({v}) is a shared variable; shared variables are "
                            "implicit inputs: leave it out of the list (or use givens)")
        if v.owner is not None:
            raise TypeError(f"input #{i} ({v}) is computed by {v.owner.op}; inputs must be free "
                            "variables (use givens to substitute a computed value)")
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
                from symgpu.tensor.type import as_tensor_variable
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

    targets = [o.variable for o in outs] + [v for _, v in update_pairs]
    targets = clone_replace(targets, given_pairs)
    out_vars, upd_vars = targets[: len(outs)], targets[len(outs):]

    used = set(ancestors(targets))
    policy = on_unused_input or "raise"
    for i, inp in enumerate(ins):
        if inp.variable not in used:
            msg = (f"input #{i} ({inp.variable}) of {name or 'the function'} is not used to "
                   "compute any output or update; pass on_unused_input='ignore' to allow it")
            if policy == "raise":
                raise UnusedInputError(msg)
            if policy == "warn":
                warnings.warn(msg, stacklevel=2)

    explicit = [inp.variable for inp in ins]
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
    pass_times = mode_obj.rewrite(fgraph)
    t1 = time.perf_counter()

    storage_map = {}
    input_cells = []
    for var in fgraph.inputs[: len(explicit)]:
        cell = [None]
        storage_map[var] = cell
        input_cells.append(cell)
    for var, sv in zip(fgraph.inputs[len(explicit):], shared_vars):
        storage_map[var] = sv.container.storage
    vm = mode_obj.link(fgraph, storage_map)  # DebugMode links a checking VM
    t2 = time.perf_counter()

    graph_in = set(fgraph.inputs)
    output_cells = [storage_map[v] for v in fgraph.outputs[:n_out]]
    updated_outputs = set(fgraph.outputs[n_out:])
    output_copy = [not o.borrow and (_aliases_an_input(v, graph_in) or v in updated_outputs)
                   for o, v in zip(outs, fgraph.outputs[:n_out])]
    update_cells = []
    for k, (s, _) in enumerate(update_pairs):
        v = fgraph.outputs[n_out + k]
        update_cells.append((s.container.storage, storage_map[v], _aliases_an_input(v, graph_in)
                             and v is not fgraph.inputs[fgraph.update_mapping[n_out + k]]))
    filters = [_input_filter(v, inp, i, name, allow_input_downcast,
                             _device_input_filter(v, fgraph))
               for i, (v, inp) in enumerate(zip(fgraph.inputs, ins))]
    defaults = []
    for i, inp in enumerate(ins):
        defaults.append(filters[i](inp.value) if inp.has_default else _MISSING)
    names = {inp.name: i for i, inp in enumerate(ins) if inp.name}
    maker = FunctionMaker(fgraph, mode_obj, ins, outs, t1 - t0, t2 - t1, pass_times)
    maker.compile_time = time.perf_counter() - t_start
    fn = Function(maker, vm, input_cells, filters, defaults, names, output_cells, output_copy,
                  update_cells, single, name)
    _attach_profile(fn, profile)
    return fn


def _attach_profile(fn: Function, profile: Any) -> None:
    """Hook for the profiler (symgpu.compile.profiling registers itself here)."""
    for hook in PROFILE_HOOKS:
        hook(fn, profile)


#: callables (fn, profile_arg) run on every new Function; the profiler registers one
PROFILE_HOOKS: list[Callable[[Function, Any], None]] = []


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


def _bad_input(i: Any) -> In:
    raise TypeError(f"inputs must be symbolic variables or In(...), got {type(i).__name__}: {i!r}")
