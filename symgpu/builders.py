"""`OpFromGraph`: an op whose implementation is a graph (Theano's theano.compile.builders).

The op keeps its graph as an inner graph with inputs of its own (clones of the given inputs,
then one placeholder per shared variable the graph reads: shared variables become implicit
inputs of every node, so the outer function reads their current values and gradients flow to
them). With ``inline=False`` the inner graph is compiled once, with the mode's passes, as
scan.inner's `InnerFunction` and run by `perform`; with ``inline=True`` the pass
``inline_ofg_expansion`` (before every other pass) replaces each node by a copy of its graph,
so the outer function's rewrites see through it.

Gradients and R_op are themselves `OpFromGraph`s (built on first use, inlined when the op
is): by default the inner graph's gradient / forward derivative, or what ``grad_overrides``
/ ``lop_overrides`` / ``rop_overrides`` give (a callable, an OpFromGraph, a `NullType` or
`DisconnectedType` variable, or a list of those and ``'default'``, one per input for
gradients, one per output for R_op).

This module sits at the level of ifelse (above compile, gradient and scan): it needs the
gradient package and the inner-function machinery.
"""
from __future__ import annotations

import copy
import warnings
from typing import Any, Callable, Sequence

import numpy as np

import symgpu.tensor as T
from symgpu.config import config
from symgpu.gradient import DisconnectedType, NullType, NullTypeGradError, Rop, grad
from symgpu.graph.basic import Apply, Constant, Variable, ancestors, graph_inputs, io_toposort
from symgpu.graph.op import Op, ShapeError
from symgpu.graph.rewriting.db import optdb
from symgpu.graph.sharedvalue import SharedVariable
from symgpu.scalar.dtypes import is_float
from symgpu.scan.inner import InnerFunction, clone_with, inner_mode_pass
from symgpu.tensor.rewriting.shape_feature import infer_graph_shapes
from symgpu.tensor.type import TensorType

__all__ = ["OpFromGraph", "inline_ofg_expansion"]

#: what `**kwargs` may hold (Theano passes them to its inner function)
_KWARGS = ("mode", "on_unused_input")

_DEFAULT = "default"


def _is_default(v: Any) -> bool:
    """'default' (never compares a variable with a string: that would build a graph)."""
    return isinstance(v, str) and v == _DEFAULT


def _is_special(v: Any) -> bool:
    return isinstance(v, Variable) and isinstance(v.type, (NullType, DisconnectedType))


def _is_float(v: Variable) -> bool:
    return is_float(str(getattr(v.type, "dtype", "")))


def _override_key(ov: Any) -> Any:
    """A hashable stand-in for an override (callables by identity, ops by equality)."""
    if isinstance(ov, str):
        return ov
    if isinstance(ov, (list, tuple)):
        return tuple(_override_key(o) for o in ov)
    if isinstance(ov, Variable):
        return ("special", ov.type)
    return ("callable", ov)


def _graph_key(inputs: Sequence[Variable], outputs: Sequence[Variable]) -> tuple:
    """The structure of the graph inputs -> outputs: equal for copies of one graph."""
    index: dict[Variable, Any] = {v: ("in", k) for k, v in enumerate(inputs)}

    def ref(v: Variable) -> Any:
        if v in index:
            return index[v]
        if isinstance(v, Constant):
            return ("const", v.signature())
        raise ValueError(f"OpFromGraph: the inner graph reads {v}, which is not one of its "
                         "inputs")

    nodes = []
    for n, node in enumerate(io_toposort(set(inputs), list(outputs))):
        nodes.append((node.op, tuple(ref(v) for v in node.inputs),
                      tuple(o.type for o in node.outputs)))
        for j, o in enumerate(node.outputs):
            index[o] = ("node", n, j)
    return (tuple(v.type for v in inputs), tuple(nodes), tuple(ref(o) for o in outputs))


def _io_pattern(inputs: Sequence[Variable], outputs: Sequence[Variable]) -> list[list[bool]]:
    """[input][output]: whether a connected path (ops' connection_pattern) joins them."""
    deps: dict[Variable, frozenset] = {v: frozenset([k]) for k, v in enumerate(inputs)}
    for node in io_toposort(set(inputs), list(outputs)):
        pattern = node.op.connection_pattern(node)
        for j, o in enumerate(node.outputs):
            s: set = set()
            for i, v in enumerate(node.inputs):
                if pattern[i][j]:
                    s |= deps.get(v, frozenset())
            deps[o] = frozenset(s)
    return [[k in deps.get(o, frozenset()) for o in outputs] for k in range(len(inputs))]


class OpFromGraph(Op):
    """An op computing `outputs` from `inputs` (Theano's ``OpFromGraph``).

    ``OpFromGraph(inputs, outputs, inline=False, lop_overrides='default',
    grad_overrides='default', rop_overrides='default', connection_pattern=None, name=None,
    **kwargs)``; `kwargs`: ``mode`` (the inner function's mode; by default the outer
    function's) and ``on_unused_input`` ('raise', 'warn' or 'ignore', as `function`).
    Calling the op on variables (one per input) gives its outputs: one variable, or a list.
    """

    def __init__(self, inputs: Sequence[Variable], outputs: Sequence[Variable], inline: bool = False,
                 lop_overrides: Any = _DEFAULT, grad_overrides: Any = _DEFAULT,
                 rop_overrides: Any = _DEFAULT, connection_pattern: Any = None,
                 name: str | None = None, **kwargs: Any):
        bad = sorted(set(kwargs) - set(_KWARGS))
        if bad:
            extra = (" (updates and givens are not allowed in an OpFromGraph)"
                     if {"updates", "givens"} & set(bad) else "")
            raise TypeError(f"OpFromGraph got unexpected keyword argument(s) {bad}{extra}; it "
                            f"accepts {list(_KWARGS)}")
        if not isinstance(inputs, (list, tuple)):
            raise TypeError(f"OpFromGraph: inputs must be a list of variables, got {type(inputs)}")
        if not isinstance(outputs, (list, tuple)):
            raise TypeError(f"OpFromGraph: outputs must be a list of variables, got "
                            f"{type(outputs)}")
        if not outputs:
            raise ValueError("OpFromGraph: outputs is empty")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"OpFromGraph: name must be a string or None, got {name!r}")
        inputs = list(inputs)
        outputs = [self._as_output(o, k) for k, o in enumerate(outputs)]
        seen: set = set()
        for k, v in enumerate(inputs):
            if not isinstance(v, Variable):
                raise TypeError(f"OpFromGraph: inputs[{k}] must be a symbolic variable, got {v!r}")
            if isinstance(v, Constant):
                raise TypeError(f"OpFromGraph: inputs[{k}] ({v}) is a constant; a constant "
                                "belongs inside the graph")
            if isinstance(v, SharedVariable):
                raise TypeError(f"OpFromGraph: inputs[{k}] ({v}) is a shared variable; shared "
                                "variables the graph reads become inputs by themselves")
            if v in seen:
                raise ValueError(f"OpFromGraph: inputs[{k}] ({v}) is given twice")
            seen.add(v)
        on_unused = kwargs.get("on_unused_input", "raise")
        if on_unused not in ("raise", "warn", "ignore"):
            raise ValueError(f"OpFromGraph: on_unused_input must be 'raise', 'warn' or 'ignore', "
                             f"got {on_unused!r}")
        free = graph_inputs(outputs, blockers=inputs)
        shared = []
        for v in free:
            if v in seen or isinstance(v, Constant):
                continue
            if isinstance(v, SharedVariable):
                shared.append(v)
                continue
            raise ValueError(f"OpFromGraph: the outputs depend on {v} ({v.type}), which is "
                             "neither one of the inputs nor a shared variable; add it to the "
                             "inputs")
        used = set(ancestors(outputs, blockers=inputs))
        unused = [k for k, v in enumerate(inputs) if v not in used]
        if unused and on_unused != "ignore":
            msg = (f"OpFromGraph: input(s) {[str(inputs[k]) for k in unused]} (position(s) "
                   f"{unused}) are not used by the outputs; pass on_unused_input='ignore' "
                   "(or 'warn') to allow it")
            if on_unused == "raise":
                raise ValueError(msg)
            warnings.warn(msg, stacklevel=2)

        local_in = [v.type(v.name) for v in inputs]
        local_shared = [v.type(v.name) for v in shared]
        replace = dict(zip(inputs, local_in))
        replace.update(zip(shared, local_shared))
        local_out = clone_with(outputs, replace)
        self.local_inputs: list[Variable] = local_in + local_shared
        self.local_outputs: list[Variable] = local_out
        self.shared_inputs: list[Variable] = shared
        self.n_explicit = len(inputs)
        self.input_types = [v.type for v in inputs]
        self.output_types = [o.type for o in local_out]
        self.is_inline = bool(inline)
        self.kwargs = dict(kwargs)
        self.mode = kwargs.get("mode")
        self.name = name
        #: the user's variables -> the inner graph's (for overrides written with them)
        self._orig_map = replace
        if not _is_default(lop_overrides):
            if not _is_default(grad_overrides):
                raise ValueError("OpFromGraph: lop_overrides and grad_overrides are mutually "
                                 "exclusive")
            self.set_lop_overrides(lop_overrides)
        else:
            self.set_grad_overrides(grad_overrides)
        self.set_rop_overrides(rop_overrides)
        self._connection_pattern = self._check_pattern(connection_pattern)
        self.fn = InnerFunction(self.local_inputs, self.local_outputs, self.mode,
                                name=name or "OpFromGraph")

    # -- construction helpers ----------------------------------------------------------------
    @staticmethod
    def _as_output(o: Any, k: int) -> Variable:
        if isinstance(o, Variable):
            return o
        try:
            return T.as_tensor_variable(o)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"OpFromGraph: outputs[{k}] must be a symbolic variable, got "
                            f"{o!r}") from exc

    def _check_pattern(self, pattern: Any) -> tuple | None:
        if pattern is None:
            return None
        n_out = len(self.local_outputs)
        rows = list(pattern)
        if len(rows) not in (self.n_explicit, len(self.local_inputs)):
            raise ValueError(f"OpFromGraph: connection_pattern has {len(rows)} row(s); it needs "
                             f"one per input ({self.n_explicit})")
        out = []
        for k, row in enumerate(rows):
            row = list(row)
            if len(row) != n_out or not all(isinstance(b, (bool, np.bool_)) for b in row):
                raise ValueError(f"OpFromGraph: connection_pattern[{k}] must be {n_out} "
                                 f"bool(s) (one per output), got {row!r}")
            out.append(tuple(bool(b) for b in row))
        return tuple(out)

    def set_grad_overrides(self, grad_overrides: Any) -> None:
        """Replace the gradient overrides (see the class doc); callables get
        ``(inputs, output_grads)``."""
        self._lop_spec = grad_overrides
        self._lop_kind = "grad"
        self._lop_cache = None
        self._conn_cache = None
        self._key = None

    def set_lop_overrides(self, lop_overrides: Any) -> None:
        """Replace the gradient overrides with L_op overrides: callables get
        ``(inputs, outputs, output_grads)``."""
        self._lop_spec = lop_overrides
        self._lop_kind = "lop"
        self._lop_cache = None
        self._conn_cache = None
        self._key = None

    def set_rop_overrides(self, rop_overrides: Any) -> None:
        """Replace the R_op overrides; callables get ``(inputs, eval_points)``."""
        self._rop_spec = rop_overrides
        self._rop_cache = None
        self._key = None

    # -- identity ----------------------------------------------------------------------------
    def _identity(self) -> tuple:
        key = self.__dict__.get("_key")
        if key is None:
            mode = self.mode
            try:
                hash(mode)
            except TypeError:
                mode = ("id", id(mode))
            key = (_graph_key(self.local_inputs, self.local_outputs), tuple(self.shared_inputs),
                   self.n_explicit, self.is_inline, mode, self._lop_kind,
                   _override_key(self._lop_spec), _override_key(self._rop_spec),
                   self._connection_pattern)
            self._key = key
        return key

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(self) is not type(other):
            return False
        try:
            return self._identity() == other._identity()
        except TypeError:  # an unhashable part: equal only to itself
            return False

    def __hash__(self) -> int:
        try:
            return hash((type(self), self._identity()))
        except TypeError:  # an unhashable part (an op without hash): identity
            return id(self)

    def __str__(self) -> str:
        name = self.name if self.name is not None else type(self).__name__
        return f"{name}{{inline={self.is_inline}}}"

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for k in ("_orig_map", "_key", "_mode_copies", "_conn_cache", "_copy_out"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._orig_map = {}
        self._key = None
        self._conn_cache = None

    def _with_mode(self, mode: Any) -> "OpFromGraph":
        """A copy whose inner function compiles with `mode` (the outer function's)."""
        new = copy.copy(self)
        new.mode = mode
        new.kwargs = dict(self.kwargs, mode=mode)
        new._key = None
        new.__dict__.pop("_mode_copies", None)
        new.fn = InnerFunction(self.local_inputs, self.local_outputs, mode,
                               name=self.name or "OpFromGraph")
        return new

    # -- building ----------------------------------------------------------------------------
    def make_node(self, *inputs: Any) -> Apply:
        n_all = len(self.local_inputs)
        if len(inputs) == self.n_explicit:
            given = list(inputs) + list(self.shared_inputs)
        elif len(inputs) == n_all:   # rewrites rebuilding a node pass the shared ones too
            given = list(inputs)
        else:
            raise ValueError(f"{self}: expected {self.n_explicit} input(s), got {len(inputs)}")
        ins = []
        for k, (v, ph) in enumerate(zip(given, self.local_inputs)):
            t = ph.type
            if not isinstance(v, Variable):
                try:
                    v = T.as_tensor_variable(v)
                except (TypeError, ValueError) as exc:
                    raise TypeError(f"{self}: input {k} must be a variable of type {t}, got "
                                    f"{v!r}") from exc
                if isinstance(v, Constant) and getattr(v.type, "dtype", None) != getattr(t, "dtype", None):
                    v = T.cast(v, t.dtype)
            conv = v if v.type == t else t.convert_variable(v)
            if conv is None:
                raise TypeError(f"{self}: input {k} ({v}) has type {v.type}; expected {t}")
            ins.append(conv)
        return Apply(self, ins, [t() for t in self.output_types])

    def __call__(self, *inputs: Any, return_list: bool = False, **kwargs: Any):
        out = super().__call__(*inputs, **kwargs)
        if return_list and not isinstance(out, list):
            return [out]
        return out

    # -- running -----------------------------------------------------------------------------
    def prepare_node(self, node: Apply, storage_map: dict, compute_map: dict, impl: Any) -> None:
        """Compile the inner graph when the outer function is linked (once per op)."""
        self.fn.compile()

    def free(self) -> None:
        """Release the inner graph's intermediate storage (Theano's op.free; Function.free)."""
        self.fn.free()

    def _copied_outputs(self) -> list[bool]:
        """Per output: the compiled inner graph gives a value it does not own (a constant or
        an input), which is copied so the outer graph may overwrite it."""
        flags = self.__dict__.get("_copy_out")
        if flags is None:
            fg = self.fn.compiled_fgraph
            flags = [o.owner is None for o in fg.outputs]
            self._copy_out = flags
        return flags

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        results = self.fn(*inputs)
        copy_out = self._copied_outputs()
        held = [a for a in inputs if isinstance(a, np.ndarray)]
        for k, r in enumerate(results):
            r = np.asarray(r, dtype=node.outputs[k].type.dtype)
            if copy_out[k] or any(np.may_share_memory(r, a) for a in held):
                r = r.copy()  # no output aliases an input or another output (no view_map)
            held.append(r)
            output_storage[k][0] = r

    # -- shapes ------------------------------------------------------------------------------
    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: Sequence[Any]) -> list[tuple]:
        """The inner graph's shapes, from the inner ops' own rules, in terms of the outer
        inputs' shapes (and values, where a shape depends on them)."""
        known = {v: tuple(s) for v, s in zip(self.local_inputs, input_shapes) if s is not None}
        shapes = infer_graph_shapes(self.local_outputs, known)
        flat = [d for s in shapes for d in s]
        inner = set(self.local_inputs)
        need = [k for k, d in enumerate(flat) if any(a in inner for a in ancestors([d]))]
        if need:
            mapped = clone_with([flat[k] for k in need], dict(zip(self.local_inputs, node.inputs)))
            for k, d in zip(need, mapped):
                flat[k] = d
        out, pos = [], 0
        for s in shapes:
            out.append(tuple(flat[pos:pos + len(s)]))
            pos += len(s)
        return out

    # -- connections -------------------------------------------------------------------------
    def connection_pattern(self, node: Apply | None) -> list[list[bool]]:
        """Which outputs each input (shared ones last) is connected to: the given pattern, else
        the inner graph's paths, adjusted by gradient overrides (an input whose overridden
        gradient is disconnected is connected to nothing; one whose gradient reads an
        output's gradient is connected to that output)."""
        cached = self.__dict__.get("_conn_cache")
        if cached is not None:
            return [list(r) for r in cached]
        pattern = _io_pattern(self.local_inputs, self.local_outputs)
        if self._connection_pattern is not None:
            given = [list(r) for r in self._connection_pattern]
            pattern = given + pattern[len(given):]
        elif not _is_default(self._lop_spec):
            lop_op, specials, where = self._lop()
            n_in, n_out = len(self.local_inputs), len(self.local_outputs)
            grad_pattern = (_io_pattern(lop_op.local_inputs, lop_op.local_outputs)
                            if lop_op is not None else None)
            for i in range(n_in):
                sp = specials[i]
                if sp is not None and isinstance(sp, DisconnectedType):
                    pattern[i] = [False] * n_out
                elif sp is None and grad_pattern is not None:
                    col = where[i]
                    for o in range(n_out):
                        pattern[i][o] = pattern[i][o] or grad_pattern[n_in + n_out + o][col]
        self._conn_cache = tuple(tuple(r) for r in pattern)
        return [list(r) for r in pattern]

    # -- gradients ---------------------------------------------------------------------------
    def _callable_args_for(self, ov: Any) -> Callable:
        """An OpFromGraph used as an override, as a callable of (lists...) -> list."""
        def call(*lists: list) -> list:
            n_explicit_args = ov.n_explicit
            flat = [v for lst in lists for v in lst]
            if n_explicit_args != len(flat):
                # an override op written for the explicit inputs only (no shared ones)
                first = lists[0][:self.n_explicit]
                flat = [v for lst in (first, *lists[1:]) for v in lst]
            if n_explicit_args != len(flat):
                raise ValueError(f"{self}: the override {ov} takes {ov.n_explicit} input(s); "
                                 f"expected {len(lists[0]) + sum(map(len, lists[1:]))}")
            out = ov(*flat)
            return out if isinstance(out, list) else [out]
        return call

    def _user_grads(self, fn: Any, args: tuple, what: str) -> list:
        out = fn(*args)
        if isinstance(out, tuple):
            out = list(out)
        if not isinstance(out, list):
            raise TypeError(f"{self}: the {what} override must return a list, got {type(out)}")
        return out

    def _entry(self, g: Any, what: str) -> Any:
        """An override's result: a variable (inner graph), or a special type (None:
        disconnected)."""
        if g is None:
            return DisconnectedType()
        if isinstance(g, Variable):
            if isinstance(g.type, (NullType, DisconnectedType)):
                return g.type
            if self._orig_map and any(a in self._orig_map for a in ancestors([g])):
                return clone_with([g], self._orig_map)[0]
            return g
        try:
            return T.as_tensor_variable(g)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{self}: {what} returned {g!r}, not a variable") from exc

    def _default_grads(self, idx: list[int], out_grads: list[Variable]) -> list:
        wrt = [self.local_inputs[i] for i in idx]
        known: dict[Variable, Variable] = {}
        for o, g in zip(self.local_outputs, out_grads):
            if isinstance(o, Constant) or not _is_float(o):
                continue
            known[o] = known[o] + g if o in known else g
        if not known or not wrt:
            return [DisconnectedType() for _ in idx]

        def one(ws: list) -> list:
            return grad(None, ws, known_grads=known, disconnected_inputs="ignore",
                        return_disconnected="None")
        try:
            gs = one(wrt)
        except NullTypeGradError:
            gs = []
            for w in wrt:
                try:
                    gs.append(one([w])[0])
                except NullTypeGradError as exc:
                    gs.append(NullType(str(exc))())
        return [DisconnectedType() if g is None else (g.type if _is_special(g) else g)
                for g in gs]

    def _lop(self) -> tuple:
        """(gradient OpFromGraph or None, per input: None or the special type it gets,
        per input: its output index in the gradient op)."""
        if self._lop_cache is None:
            with config.change_flags(compute_test_value="off"):  # placeholders have none
                self._lop_cache = self._build_lop()
        return self._lop_cache

    def _build_lop(self) -> tuple:
        n_in = len(self.local_inputs)
        ins = list(self.local_inputs)
        outs = list(self.local_outputs)
        out_grads = [t() for t in self._grad_types()]
        args = (ins, out_grads) if self._lop_kind == "grad" else (ins, outs, out_grads)
        label = "grad_overrides" if self._lop_kind == "grad" else "lop_overrides"
        spec = self._lop_spec
        if isinstance(spec, OpFromGraph):
            spec = self._callable_args_for(spec)
        if isinstance(spec, str):
            if spec != _DEFAULT:
                raise ValueError(f"{self}: {label} must be 'default', a callable, an "
                                 f"OpFromGraph, a NullType/DisconnectedType variable or a "
                                 f"list of those, got {spec!r}")
            entries = self._default_grads(list(range(n_in)), out_grads)
        elif isinstance(spec, Variable):
            if not _is_special(spec):
                raise ValueError(f"{self}: a variable in {label} must be of NullType or "
                                 f"DisconnectedType, got {spec.type}")
            entries = [spec.type] * n_in
        elif isinstance(spec, (list, tuple)):
            spec = list(spec)
            if len(spec) == self.n_explicit and n_in > self.n_explicit:
                spec = spec + [_DEFAULT] * (n_in - self.n_explicit)  # shared: default
            if len(spec) != n_in:
                raise ValueError(f"{self}: {label} has {len(spec)} entries; it needs one per "
                                 f"input ({self.n_explicit})")
            defaults = [i for i, s in enumerate(spec) if isinstance(s, str) and s == _DEFAULT]
            dg = dict(zip(defaults, self._default_grads(defaults, out_grads)))
            entries = []
            for i, s in enumerate(spec):
                if i in dg:
                    entries.append(dg[i])
                elif isinstance(s, str):
                    raise ValueError(f"{self}: {label}[{i}] must be 'default', a callable or a "
                                     f"NullType/DisconnectedType variable, got {s!r}")
                elif isinstance(s, Variable):
                    if not _is_special(s):
                        raise ValueError(f"{self}: {label}[{i}] must be of NullType or "
                                         f"DisconnectedType, got {s.type}")
                    entries.append(s.type)
                elif isinstance(s, OpFromGraph):
                    entries.append(self._entry(self._callable_args_for(s)(*args)[0],
                                               f"{label}[{i}]"))
                elif callable(s):
                    g = s(*args)
                    if isinstance(g, (list, tuple)):
                        if len(g) != 1:
                            raise ValueError(f"{self}: {label}[{i}] must return one variable, "
                                             f"got {len(g)}")
                        g = g[0]
                    entries.append(self._entry(g, f"{label}[{i}]"))
                else:
                    raise TypeError(f"{self}: {label}[{i}] must be 'default', a callable or a "
                                    f"NullType/DisconnectedType variable, got {s!r}")
        elif callable(spec):
            got = self._user_grads(spec, args, label)
            if len(got) == self.n_explicit and n_in > self.n_explicit:
                got = got + [None] * (n_in - self.n_explicit)
                rest = self._default_grads(list(range(self.n_explicit, n_in)), out_grads)
            else:
                rest = []
            if len(got) != n_in:
                raise ValueError(f"{self}: the {label} callable returned {len(got)} gradient(s);"
                                 f" it must return one per input ({self.n_explicit})")
            entries = [self._entry(g, f"the {label} callable (gradient {i})")
                       for i, g in enumerate(got[:n_in - len(rest)])] + rest
        else:
            raise TypeError(f"{self}: {label} must be 'default', a callable, an OpFromGraph, a "
                            f"NullType/DisconnectedType variable or a list of those, got {spec!r}")
        return self._special_op(entries, ins + self._placeholders_for(outs, ins) + out_grads,
                                "grad" if self._lop_kind == "grad" else "lop")

    @staticmethod
    def _placeholders_for(outs: list[Variable], taken: list[Variable]) -> list[Variable]:
        """The outputs as inputs of a derived op: a fresh placeholder where one is a constant,
        an input or a repeat (never read then)."""
        seen = set(taken)
        res = []
        for o in outs:
            if isinstance(o, Constant) or o in seen:
                res.append(o.type())
            else:
                seen.add(o)
                res.append(o)
        return res

    def _special_op(self, entries: list, op_inputs: list[Variable], suffix: str) -> tuple:
        """(an OpFromGraph of the variable entries or None, per entry: None or its special
        type, per entry: its output index)."""
        specials, where, real = [], [], []
        for e in entries:
            if isinstance(e, Variable):
                specials.append(None)
                where.append(len(real))
                real.append(e)
            else:
                specials.append(e)
                where.append(None)
        op = None
        if real:
            op = OpFromGraph(op_inputs, real, inline=self.is_inline,
                             name=None if self.name is None else f"{self.name}_{suffix}",
                             mode=self.mode, on_unused_input="ignore")
        return op, specials, where

    def _grad_types(self) -> list:
        """The types of the output gradients: an integer output's is floatX (what `grad`
        gives an output no gradient reaches)."""
        return [TensorType(config.floatX, t.broadcastable)
                if isinstance(t, TensorType) and not is_float(str(t.dtype)) else t
                for t in self.output_types]

    def L_op(self, inputs: Sequence[Variable], outputs: Sequence[Variable],
             output_grads: Sequence[Variable]) -> list:
        op, specials, where = self._lop()
        if op is None:
            res = []
        else:
            gs = [T.cast(g, t.dtype) if isinstance(t, TensorType) and isinstance(g.type, TensorType)
                  and g.type.dtype != t.dtype else g
                  for g, t in zip(output_grads, self._grad_types())]
            res = op(*inputs, *outputs, *gs, return_list=True)
        return [res[w] if sp is None else sp() for sp, w in zip(specials, where)]

    def R_op(self, inputs: Sequence[Variable], eval_points: Sequence[Variable]) -> list:
        op, specials, where = self._rop()
        eps = [T.zeros_like(v) if e is None else e for v, e in zip(inputs, eval_points)]
        res = op(*inputs, *eps, return_list=True) if op is not None else []
        return [res[w] if sp is None else sp() for sp, w in zip(specials, where)]

    def _rop(self) -> tuple:
        """(R_op OpFromGraph or None, per output: None or the special type it gets, per
        output: its output index in the R_op op)."""
        if self._rop_cache is None:
            with config.change_flags(compute_test_value="off"):  # placeholders have none
                self._rop_cache = self._build_rop()
        return self._rop_cache

    def _build_rop(self) -> tuple:
        ins = list(self.local_inputs)
        outs = list(self.local_outputs)
        n_out = len(outs)
        evs = [t() for t in (v.type for v in ins)]
        spec = self._rop_spec
        if isinstance(spec, OpFromGraph):
            spec = self._callable_args_for(spec)

        def defaults(ks: list[int]) -> list:
            if not ks:
                return []
            fl = [k for k, v in enumerate(ins) if _is_float(v)]
            if not fl:
                return [T.zeros_like(outs[k]) for k in ks]
            r = Rop([outs[k] for k in ks], [ins[k] for k in fl], [evs[k] for k in fl],
                    disconnected_outputs="ignore")
            return list(r) if isinstance(r, (list, tuple)) else [r]

        def entry(e: Any, k: int, what: str) -> Any:
            if e is None or (isinstance(e, Variable) and isinstance(e.type, DisconnectedType)):
                return T.zeros_like(outs[k])   # as Theano: a disconnected R_op is zero
            if isinstance(e, Variable) and isinstance(e.type, NullType):
                return e.type
            return self._entry(e, what)

        if isinstance(spec, str):
            if spec != _DEFAULT:
                raise ValueError(f"{self}: rop_overrides must be 'default', a callable, an "
                                 f"OpFromGraph, a NullType/DisconnectedType variable or a list "
                                 f"of those, got {spec!r}")
            entries = defaults(list(range(n_out)))
        elif isinstance(spec, Variable):
            if not _is_special(spec):
                raise ValueError(f"{self}: a variable in rop_overrides must be of NullType or "
                                 f"DisconnectedType, got {spec.type}")
            entries = [entry(spec, k, "rop_overrides") for k in range(n_out)]
        elif isinstance(spec, (list, tuple)):
            spec = list(spec)
            if len(spec) != n_out:
                raise ValueError(f"{self}: rop_overrides has {len(spec)} entries; it needs one "
                                 f"per output ({n_out})")
            ks = [k for k, s in enumerate(spec) if isinstance(s, str) and s == _DEFAULT]
            dr = dict(zip(ks, defaults(ks)))
            entries = []
            for k, s in enumerate(spec):
                what = f"rop_overrides[{k}]"
                if k in dr:
                    entries.append(dr[k])
                elif isinstance(s, Variable):
                    if not _is_special(s):
                        raise ValueError(f"{self}: {what} must be of NullType or "
                                         f"DisconnectedType, got {s.type}")
                    entries.append(entry(s, k, what))
                elif isinstance(s, OpFromGraph):
                    entries.append(entry(self._callable_args_for(s)(ins, evs)[0], k, what))
                elif callable(s) and not isinstance(s, str):
                    r = s(ins, evs)
                    if isinstance(r, (list, tuple)):
                        if len(r) != 1:
                            raise ValueError(f"{self}: {what} must return one variable, got "
                                             f"{len(r)}")
                        r = r[0]
                    entries.append(entry(r, k, what))
                else:
                    raise TypeError(f"{self}: {what} must be 'default', a callable or a "
                                    f"NullType/DisconnectedType variable, got {s!r}")
        elif callable(spec):
            got = self._user_grads(spec, (ins, evs), "rop_overrides")
            if len(got) != n_out:
                raise ValueError(f"{self}: the rop_overrides callable returned {len(got)} "
                                 f"result(s); it must return one per output ({n_out})")
            entries = [entry(e, k, f"the rop_overrides callable (output {k})")
                       for k, e in enumerate(got)]
        else:
            raise TypeError(f"{self}: rop_overrides must be 'default', a callable, an "
                            f"OpFromGraph, a NullType/DisconnectedType variable or a list of "
                            f"those, got {spec!r}")
        return self._special_op(entries, ins + evs, "rop")


def _expand(node: Apply) -> list[Variable]:
    op = node.op
    return clone_with(op.local_outputs, dict(zip(op.local_inputs, node.inputs)))


def inline_ofg_expansion(fgraph: Any) -> None:
    """Replace every node of an ``inline=True`` OpFromGraph by a copy of its graph (nested
    ones too), so the passes after this one see through it."""
    while True:
        nodes = [n for n in fgraph.toposort()
                 if isinstance(n.op, OpFromGraph) and n.op.is_inline]
        if not nodes:
            return
        for node in nodes:
            if node in fgraph.apply_nodes:
                fgraph.replace_all(list(zip(node.outputs, _expand(node))),
                                   reason="inline_ofg_expansion")


# before every other pass (Theano: before the first merge and the first scan pass)
optdb.register("inline_ofg_expansion", inline_ofg_expansion, -0.01, "fast_run", "fast_compile")
# ops built without mode= compile their inner graphs with the outer function's mode
optdb.register("ofg_inner_mode_fast_run",
               inner_mode_pass(OpFromGraph, OpFromGraph._with_mode, "FAST_RUN"), 4.5, "fast_run")
optdb.register("ofg_inner_mode_fast_compile",
               inner_mode_pass(OpFromGraph, OpFromGraph._with_mode, "FAST_COMPILE"), 4.5,
               "fast_compile")
