"""The backend-free graph core: Type, Variable, Constant, Apply and graph walks.

A graph is a bipartite DAG of Variables and Apply nodes. Nothing here knows about tensors or
devices; types give meaning to values, ops give meaning to nodes.
"""
from __future__ import annotations

import copy
import sys
import traceback
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Sequence

from symgpu.config import config

#: the compiler behind ``Variable.eval``: ``symgpu.compile.function`` installs its
#: ``function`` here (set_eval_compiler), since the graph layer sits below the compiler
_EVAL_COMPILER: list[Callable | None] = [None]


def set_eval_compiler(function: Callable) -> None:
    """Install the function compiler that ``Variable.eval`` uses (compile's ``function``)."""
    _EVAL_COMPILER[0] = function

__all__ = [
    "Type", "Variable", "Constant", "Apply", "Scratchpad", "VariableTag", "TestValueError",
    "ancestors", "graph_inputs", "io_toposort", "clone_graph", "user_stack", "constant_behind",
]

_PACKAGE_DIR = __file__.rsplit("/graph/", 1)[0]


def user_stack(limit: int = 8) -> list[traceback.FrameSummary]:
    """The caller's frames outside symgpu, innermost last: where the user built a node.

    Walks the frames directly and reads source lines lazily: every node records this, so
    it must cost microseconds (extract_stack read every line of the whole stack)."""
    user = []
    f = sys._getframe(1)
    while f is not None and len(user) < limit:
        code = f.f_code
        if not code.co_filename.startswith(_PACKAGE_DIR):
            user.append(traceback.FrameSummary(code.co_filename, f.f_lineno, code.co_name,
                                               lookup_line=False))
        f = f.f_back
    user.reverse()
    return user


class Scratchpad:
    """A free-form attribute bag (Theano's `tag`): test values, creation traces, notes."""

    def __repr__(self) -> str:
        return f"Scratchpad({self.__dict__})"


class TestValueError(ValueError):
    """A variable needed for test values has none (see config.compute_test_value)."""


class _TestValueSlot:
    """``tag.test_value``: stored in the tag's ``__dict__`` (so copying a tag copies it), but
    checked against the variable's type when set, so a wrong dtype or ndim fails at once."""

    def __get__(self, tag: "VariableTag | None", owner: type) -> Any:
        if tag is None:
            return self
        try:
            return tag.__dict__["test_value"]
        except KeyError:
            raise AttributeError("test_value") from None

    def __set__(self, tag: "VariableTag", value: Any) -> None:
        vtype = tag._type
        if vtype is not None:
            try:
                value = vtype.filter(value)
            except (TypeError, ValueError) as exc:
                shape = getattr(value, "shape", None)
                what = (f"shape {tuple(shape)}, dtype {getattr(value, 'dtype', '?')}"
                        if shape is not None else f"{type(value).__name__} {value!r}")
                raise TypeError(f"bad test value for a variable of type {vtype} ({what}): "
                                f"{exc}") from None
        tag.__dict__["test_value"] = value

    def __delete__(self, tag: "VariableTag") -> None:
        try:
            del tag.__dict__["test_value"]
        except KeyError:
            raise AttributeError("test_value") from None


class VariableTag(Scratchpad):
    """A Variable's tag: a Scratchpad whose ``test_value`` is checked against the type."""

    __slots__ = ("_type",)
    test_value = _TestValueSlot()

    def __init__(self, vtype: "Type | None" = None) -> None:
        self._type = vtype


class Type:
    """What values a Variable may hold; subclasses define `filter` and equality."""

    def filter(self, value: Any, strict: bool = False, allow_downcast: bool | None = None) -> Any:
        raise TypeError(f"{type(self).__name__} defines no filter")

    def is_valid_value(self, value: Any) -> bool:
        try:
            self.filter(value, strict=True)
            return True
        except (TypeError, ValueError):
            return False

    def values_eq(self, a: Any, b: Any) -> bool:
        return a == b

    def values_eq_approx(self, a: Any, b: Any) -> bool:
        return self.values_eq(a, b)

    def make_variable(self, name: str | None = None) -> "Variable":
        return self.variable_type(self, None, None, name)

    def make_constant(self, value: Any, name: str | None = None) -> "Constant":
        return self.constant_type(self, self.filter(value), name=name)

    def __call__(self, name: str | None = None) -> "Variable":
        return self.make_variable(name)

    def convert_variable(self, var: "Variable") -> "Variable | None":
        """Return `var` as a variable of this type, or None if it cannot be."""
        return var if var.type == self else None

    variable_type: type = None  # set below
    constant_type: type = None


class Variable:
    """An edge of the graph: the result of an Apply (`owner`) or a free input."""

    __array_priority__ = 1000
    #: callables told of each new variable (graph.traversal.nodes_constructed); usually none
    construction_observers: list = []

    def __init__(self, type: Type, owner: "Apply | None" = None, index: int | None = None,
                 name: str | None = None):
        self.type = type
        self.owner = owner
        self.index = index
        self.name = name
        self.tag = VariableTag(type)
        if owner is None:
            self.tag.trace = user_stack()
        for observer in Variable.construction_observers:
            observer(self)

    def clone(self) -> "Variable":
        """A new free variable of the same type and name (tag copied, owner dropped)."""
        cp = copy.copy(self)  # no __init__: cloning must not re-run creation side effects
        cp.owner = None
        cp.index = None
        cp.tag = VariableTag(cp.type)
        cp.tag.__dict__.update(self.tag.__dict__)
        cp.__dict__.pop("_eval_cache", None)
        return cp

    def auto_name(self) -> str:
        if self.name is not None:
            return self.name
        if self.owner is not None:
            op = self.owner.op
            if len(self.owner.outputs) == 1:
                return f"{op}.0"
            return f"{op}.{self.index}"
        return f"<{self.type}>"

    def __str__(self) -> str:
        return self.auto_name()

    def __repr__(self) -> str:
        """The name; with config.print_test_value, the test value on a second line (Theano)."""
        text = str(self)
        if _print_test_value():
            try:
                return f"{text}\n{self.get_test_value()!r}"
            except TestValueError:
                pass
        return text

    def get_test_value(self) -> Any:
        """The value used to compute test values: ``tag.test_value``, a constant's data or a
        shared variable's current value; TestValueError when there is none."""
        try:
            return self.tag.__dict__["test_value"]
        except KeyError:
            pass
        storage = getattr(getattr(self, "container", None), "storage", None)
        if storage is not None:  # a shared variable (graph/sharedvalue.py)
            return storage[0]
        raise TestValueError(f"{self} has no test value; set `{self.name or 'var'}.tag."
                             "test_value = <array>` (or config.compute_test_value='off')")

    def get_parents(self) -> list["Apply"]:
        return [self.owner] if self.owner is not None else []

    def eval(self, inputs_to_values: dict | None = None):
        """Compile (and cache) a function of this variable's free inputs and call it."""
        function = _EVAL_COMPILER[0]
        if function is None:
            raise RuntimeError("Variable.eval needs the compiler: import symgpu")
        inputs_to_values = inputs_to_values or {}
        keys = tuple(inputs_to_values)
        cache = self.__dict__.setdefault("_eval_cache", {})
        if keys not in cache:
            cache[keys] = function(list(keys), self, on_unused_input="ignore")
        return cache[keys](*[inputs_to_values[k] for k in keys])


class Constant(Variable):
    """A Variable with a fixed value; never an input of a compiled function."""

    def __init__(self, type: Type, data: Any, name: str | None = None):
        super().__init__(type, None, None, name)
        self.data = data

    def get_test_value(self) -> Any:
        return self.data

    def signature(self) -> tuple:
        """What makes two constants interchangeable (used by merge)."""
        return (self.type, _hashable(self.data))

    def auto_name(self) -> str:
        if self.name is not None:
            return self.name
        return f"{type(self).__name__}{{{self.data}}}"


def _print_test_value() -> bool:
    return bool(config.print_test_value)


def constant_behind(var: Variable) -> Constant | None:
    """The Constant whose value `var` holds: `var` itself, or the constant that ops marked
    `copies_value = True` (device transfers) carry unchanged. Rewrites see through such
    copies, e.g. to inline a constant uploaded to the GPU into a fused kernel."""
    while not isinstance(var, Constant):
        owner = var.owner
        if owner is None or not getattr(owner.op, "copies_value", False):
            return None
        var = owner.inputs[0]
    return var


def _hashable(data: Any) -> Any:
    try:
        hash(data)
        return data
    except TypeError:
        return id(data)


Type.variable_type = Variable
Type.constant_type = Constant


class Apply:
    """A node: an Op applied to input Variables, producing output Variables."""

    def __init__(self, op, inputs: Sequence[Variable], outputs: Sequence[Variable]):
        self.op = op
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.tag = Scratchpad()
        self.tag.trace = user_stack()
        for i, v in enumerate(self.inputs):
            if not isinstance(v, Variable):
                raise TypeError(f"{op}: input {i} is {type(v).__name__}, not a Variable")
        for i, out in enumerate(self.outputs):
            if out.owner is not None and out.owner is not self:
                raise ValueError(f"{op}: output {i} already belongs to another node")
            out.owner = self
            out.index = i
            out.tag.trace = self.tag.trace

    @property
    def out(self) -> Variable:
        if len(self.outputs) != 1:
            raise AttributeError(f"{self.op} has {len(self.outputs)} outputs")
        return self.outputs[0]

    @property
    def nin(self) -> int:
        return len(self.inputs)

    @property
    def nout(self) -> int:
        return len(self.outputs)

    def clone(self) -> "Apply":
        """A copy of this node over the same inputs, with fresh outputs."""
        cp = Apply(self.op, self.inputs, [o.clone() for o in self.outputs])
        cp.tag.__dict__.update(self.tag.__dict__)
        return cp

    def clone_with_new_inputs(self, inputs: Sequence[Variable], strict: bool = True) -> "Apply":
        """The same op over new inputs; re-runs make_node unless the types are unchanged."""
        if all(a.type == b.type for a, b in zip(inputs, self.inputs)) and len(inputs) == len(self.inputs):
            new = Apply(self.op, list(inputs), [o.clone() for o in self.outputs])
        else:
            new = self.op.make_node(*inputs)
        new.tag.__dict__.update(self.tag.__dict__)
        return new

    def __str__(self) -> str:
        return f"{self.op}({', '.join(str(i) for i in self.inputs)})"

    def __repr__(self) -> str:
        return str(self)


# ----------------------------------------------------------------------------- graph walks

def ancestors(outputs: Iterable[Variable], blockers: Iterable[Variable] = ()) -> list[Variable]:
    """Every variable the outputs depend on (outputs included), stopping at blockers."""
    blockers = set(blockers)
    seen: set[int] = set()
    result: list[Variable] = []
    stack = list(outputs)[::-1]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        result.append(v)
        if v.owner is not None and v not in blockers:
            stack.extend(reversed(v.owner.inputs))
    return result


def graph_inputs(outputs: Iterable[Variable], blockers: Iterable[Variable] = ()) -> list[Variable]:
    """The ownerless variables (and blockers) the outputs depend on, in first-seen order."""
    blockers = set(blockers)
    return [v for v in ancestors(outputs, blockers) if v.owner is None or v in blockers]


def io_toposort(inputs: Iterable[Variable], outputs: Iterable[Variable]) -> list[Apply]:
    """Apply nodes between inputs and outputs, each after the nodes it depends on."""
    stop = inputs if isinstance(inputs, (set, frozenset)) else set(inputs)
    order: list[Apply] = []
    done: set[Apply] = set()
    for out in outputs:
        if out.owner is None or out in stop or out.owner in done:
            continue
        stack: list[tuple[Apply, Iterator]] = [(out.owner, iter(out.owner.inputs))]
        visiting = {out.owner}
        while stack:
            node, it = stack[-1]
            for inp in it:
                parent = inp.owner
                if parent is not None and inp not in stop and parent not in done:
                    if parent in visiting:
                        raise ValueError(f"the graph has a cycle through {parent}")
                    visiting.add(parent)
                    stack.append((parent, iter(parent.inputs)))
                    break
            else:
                stack.pop()
                visiting.discard(node)
                done.add(node)
                order.append(node)
    return order


def clone_graph(inputs: Sequence[Variable], outputs: Sequence[Variable],
                memo: dict | None = None, copy_inputs: bool = True
                ) -> tuple[list[Variable], list[Variable], dict]:
    """Copy the subgraph between inputs and outputs; returns (inputs, outputs, memo)."""
    memo = {} if memo is None else memo
    for v in inputs:
        if v not in memo:
            memo[v] = v.clone() if copy_inputs else v
    for node in io_toposort(inputs, outputs):
        for v in node.inputs:
            if v not in memo:
                memo[v] = v.clone() if isinstance(v, Constant) or copy_inputs else v
        new_node = node.clone_with_new_inputs([memo[v] for v in node.inputs])
        memo[node] = new_node
        for old, new in zip(node.outputs, new_node.outputs):
            memo[old] = new
    for v in outputs:
        if v not in memo:
            memo[v] = v.clone() if copy_inputs else v
    return [memo[v] for v in inputs], [memo[v] for v in outputs], memo


def deque_bfs(start: Iterable[Any], expand) -> list[Any]:
    """Breadth-first walk; `expand(x)` gives x's neighbours."""
    seen, order, queue = set(), [], deque(start)
    while queue:
        x = queue.popleft()
        if x in seen:
            continue
        seen.add(x)
        order.append(x)
        queue.extend(expand(x) or ())
    return order
