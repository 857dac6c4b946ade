"""Theano's graph-walking functions (theano.gof.graph) over symgpu's Apply and Variable: the
variables, orphans, nodes and inputs between inputs and outputs, copies of a subgraph, a
topological sort by a dependency function, a structural comparison of two graphs, and the
text form of a graph. symgpu's own passes use graph.basic (ancestors, io_toposort,
clone_graph); these keep Theano's signatures and results for code written against them."""
from __future__ import annotations

import abc
import contextlib
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Sequence

from symgpu.graph.basic import Apply, Constant, Variable, ancestors, io_toposort

__all__ = ["Node", "as_string", "clone", "clone_get_equiv", "equal_computations",
           "general_toposort", "inputs", "io_connection_pattern", "is_in_ancestors",
           "is_same_graph", "list_of_nodes",
           "nodes_constructed", "op_as_string", "ops", "orphans", "stack_search", "variables",
           "variables_and_orphans", "view_roots", "sharing_memory"]


class Node(abc.ABC):
    """Theano's common base of Apply and Variable (a node of the bipartite graph): here an
    abstract class both are registered with, so `isinstance(x, Node)` holds for either."""

    @abc.abstractmethod
    def get_parents(self) -> list:
        """The nodes this one hangs from: an Apply's inputs, a Variable's owner."""


Node.register(Apply)
Node.register(Variable)


def stack_search(start: Iterable[Any], expand: Callable[[Any], Iterable[Any] | None],
                 mode: str = "bfs", build_inv: bool = False) -> Any:
    """Everything reachable from `start` through `expand` (each once, in visiting order:
    breadth-first for mode 'bfs', depth-first for 'dfs'); with `build_inv`, also the
    inverse map {reached: [those whose expansion gave it]}."""
    if mode not in ("bfs", "dfs"):
        raise ValueError(f"stack_search: mode must be 'bfs' or 'dfs', not {mode!r}")
    todo = deque(start)
    pop = todo.popleft if mode == "bfs" else todo.pop
    seen: set[int] = set()
    order: list[Any] = []
    inverse: dict[Any, list[Any]] = {}
    while todo:
        x = pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        order.append(x)
        more = expand(x)
        if more:
            more = list(more)
            todo.extend(more)
            if build_inv:
                for y in more:
                    inverse.setdefault(y, []).append(x)
    return (order, inverse) if build_inv else order


def inputs(variable_list: Iterable[Variable],
           blockers: Iterable[Variable] | None = None) -> list[Variable]:
    """The ownerless variables the given ones are computed from (the walk stops at
    `blockers`), in Theano's depth-first order: the last of `variable_list` is walked first,
    each node's inputs left to right (Lasagne's `collect_shared_vars` passes its expressions
    reversed to list parameters in their order)."""
    stop = set(blockers or ())

    def expand(v: Variable) -> list[Variable] | None:
        if v.owner is not None and v not in stop:
            return list(v.owner.inputs)[::-1]
        return None

    return [v for v in stack_search(deque(variable_list), expand, "dfs") if v.owner is None]


def variables_and_orphans(i: Iterable[Variable], o: Iterable[Variable]
                          ) -> tuple[list[Variable], list[Variable]]:
    """(every variable between inputs `i` and outputs `o`, the ownerless ones not in `i`)."""
    i = list(i)
    stop = set(i)

    def expand(v: Variable) -> list[Variable] | None:
        if v.owner is not None and v not in stop:
            return list(v.owner.inputs)[::-1]
        return None

    found = stack_search(deque(o), expand, "dfs")
    return found, [v for v in found if v.owner is None and v not in stop]


def variables(i: Iterable[Variable], o: Iterable[Variable]) -> list[Variable]:
    """Every variable between inputs `i` and outputs `o` (both included)."""
    return variables_and_orphans(i, o)[0]


def orphans(i: Iterable[Variable], o: Iterable[Variable]) -> list[Variable]:
    """The ownerless variables `o` needs that are not among the inputs `i` (constants...)."""
    return variables_and_orphans(i, o)[1]


def ops(i: Iterable[Variable], o: Iterable[Variable]) -> set[Apply]:
    """The Apply nodes between inputs `i` and outputs `o`."""
    i = set(i)
    return {v.owner for v in variables(i, o) if v not in i and v.owner is not None}


def list_of_nodes(inputs: Iterable[Variable], outputs: Iterable[Variable]) -> list[Apply]:
    """The Apply nodes between `inputs` and `outputs`, breadth-first from the outputs."""
    stop = set(inputs)
    return stack_search([o.owner for o in outputs if o.owner is not None],
                        lambda node: [v.owner for v in node.inputs
                                      if v.owner is not None and v not in stop])


def clone_get_equiv(inputs: Sequence[Variable], outputs: Sequence[Variable],
                    copy_inputs: bool = True, copy_orphans: bool = True,
                    memo: dict | None = None) -> dict:
    """{original: copy} for every variable and Apply node between `inputs` and `outputs`;
    inputs are copied when `copy_inputs`, other ownerless variables when `copy_orphans`
    (otherwise the copy uses the original); entries already in `memo` are kept."""
    memo = {} if memo is None else memo
    for v in inputs:
        if v not in memo:
            memo[v] = v.clone() if copy_inputs else v
    for node in io_toposort(inputs, outputs):
        for v in node.inputs:
            if v not in memo:
                memo[v] = v.clone() if copy_orphans else v
        new = node.clone_with_new_inputs([memo[v] for v in node.inputs])
        memo[node] = new
        memo.update(zip(node.outputs, new.outputs))
    for v in outputs:
        if v not in memo:
            memo[v] = v.clone() if copy_orphans else v
    return memo


def clone(i: Sequence[Variable], o: Sequence[Variable], copy_inputs: bool = True,
          copy_orphans: bool | None = None) -> tuple[list[Variable], list[Variable]]:
    """(copied inputs, copied outputs) of the subgraph between `i` and `o`; `copy_orphans`
    defaults to `copy_inputs` (Theano's rule)."""
    if copy_orphans is None:
        copy_orphans = copy_inputs
    equiv = clone_get_equiv(i, o, copy_inputs, copy_orphans)
    return [equiv[v] for v in i], [equiv[v] for v in o]


def general_toposort(outputs: Iterable[Any], deps: Callable[[Any], Iterable[Any]] | None,
                     debug_print: bool = False, compute_deps_cache: Callable | None = None,
                     deps_cache: dict | None = None, clients: dict | None = None) -> list[Any]:
    """Everything reachable from `outputs` through `deps(x)` (what x depends on), each after
    its dependencies; ValueError on a cycle. `clients`, if given, is filled with
    {x: [those that depend on x]}; `compute_deps_cache` stands in for `deps`."""
    deps = deps if deps is not None else compute_deps_cache
    if deps is None:
        raise TypeError("general_toposort: give deps (or compute_deps_cache)")
    cache = {} if deps_cache is None else deps_cache

    def needs(x: Any) -> list[Any]:
        if x not in cache:
            cache[x] = list(deps(x) or ())
        return cache[x]

    order: list[Any] = []
    state: dict[Any, int] = {}
    for root in outputs:
        if root in state:
            continue
        state[root] = 1
        stack: list[tuple[Any, Iterator]] = [(root, iter(needs(root)))]
        while stack:
            x, it = stack[-1]
            for d in it:
                if clients is not None:
                    clients.setdefault(d, []).append(x)
                if state.get(d) == 1:
                    raise ValueError(f"general_toposort: a cycle through {d!r}")
                if d not in state:
                    state[d] = 1
                    stack.append((d, iter(needs(d))))
                    break
            else:
                stack.pop()
                state[x] = 2
                order.append(x)
    if debug_print:
        print("general_toposort:", order)
    return order


def is_in_ancestors(l_apply: Apply, f_apply: Apply) -> bool:
    """Whether node `f_apply` is `l_apply` or one of the nodes it is computed from."""
    return f_apply is l_apply or any(v.owner is f_apply for v in ancestors(l_apply.inputs))


def io_connection_pattern(inputs: Sequence[Variable], outputs: Sequence[Variable]
                          ) -> list[list[bool]]:
    """[[does output j depend on input i] for each output j] for each input i, through the
    ops' own connection patterns (an output disconnected from an op's input does not
    depend on it)."""
    inputs = list(inputs)
    reach: dict[Variable, set[int]] = {v: {k} for k, v in enumerate(inputs)}
    for node in io_toposort(inputs, outputs):
        pattern = node.op.connection_pattern(node)
        for j, out in enumerate(node.outputs):
            reach[out] = set().union(*[reach.get(v, set())
                                       for k, v in enumerate(node.inputs) if pattern[k][j]])
    return [[k in reach.get(out, set()) for out in outputs] for k in range(len(inputs))]


def _same(a: Variable, b: Variable, equal: dict[Variable, Variable]) -> bool:
    if a is b or equal.get(a) is b or equal.get(b) is a:
        return True
    if isinstance(a, Constant) and isinstance(b, Constant):
        return a.type == b.type and a.signature() == b.signature()
    if a.owner is None or b.owner is None:
        return False
    na, nb = a.owner, b.owner
    return (a.index == b.index and na.op == nb.op and len(na.inputs) == len(nb.inputs)
            and all(_same(x, y, equal) for x, y in zip(na.inputs, nb.inputs)))


def is_same_graph(var1: Variable, var2: Variable, givens: dict | None = None) -> bool:
    """Whether `var1` and `var2` compute the same thing: equal ops over the same inputs (equal
    constants count as the same); `givens` {a: b} pairs count as the same variable."""
    return _same(var1, var2, dict(givens or {}))


def equal_computations(xs: Sequence[Variable], ys: Sequence[Variable],
                       in_xs: Sequence[Variable] | None = None,
                       in_ys: Sequence[Variable] | None = None) -> bool:
    """Whether each `xs[k]` computes what `ys[k]` does: equal ops over the same (or equal
    constant) inputs, `in_xs[i]` and `in_ys[i]` counting as the same variable when their
    types agree (Theano's scan_utils.equal_computations, which tests of graph-building
    code use to compare an expression with the one expected)."""
    xs, ys = list(xs), list(ys)
    if len(xs) != len(ys):
        raise ValueError(f"equal_computations: {len(xs)} graphs to compare with {len(ys)}")
    in_xs, in_ys = list(in_xs or ()), list(in_ys or ())
    if len(in_xs) != len(in_ys) or any(a.type != b.type for a, b in zip(in_xs, in_ys)):
        return False
    equal = dict(zip(in_xs, in_ys))
    for x, y in zip(xs, ys):
        if (x.owner is None) != (y.owner is None):
            return False
        if x not in equal and x.type != y.type:
            return False
        if not _same(x, y, equal):
            return False
    return True


def view_roots(r: Variable) -> list[Variable]:
    """The variables `r` is a view of, following the ops' view_map back to what is not a
    view (r itself when it is none)."""
    node = r.owner
    if node is None:
        return [r]
    view_map = getattr(node.op, "view_map", None) or {}
    k = node.outputs.index(r)
    if k not in view_map:
        return [r]
    return [root for i in view_map[k] for root in view_roots(node.inputs[i])]


def sharing_memory(start: Iterable[Variable]) -> set:
    """``start`` and every variable one of them may share memory with, walking back
    through views and in-place ops (their view_map and destroy_map)."""
    out: set = set()
    stack = list(start)
    while stack:
        v = stack.pop()
        if v in out:
            continue
        out.add(v)
        if v.owner is None:
            continue
        op = v.owner.op
        for mapping in (getattr(op, "view_map", None) or {},
                        getattr(op, "destroy_map", None) or {}):
            for i in mapping.get(v.index, ()):
                stack.append(v.owner.inputs[i])
    return out


def default_leaf_formatter(r: Variable) -> str:
    return str(r)


def default_node_formatter(node: Apply, argstrings: list[str]) -> str:
    return f"{node.op}({', '.join(argstrings)})"


def as_string(i: Sequence[Variable], o: Sequence[Variable],
              leaf_formatter: Callable[[Variable], str] = default_leaf_formatter,
              node_formatter: Callable[[Apply, list[str]], str] = default_node_formatter
              ) -> list[str]:
    """Each output of the subgraph between `i` and `o` as text: `op(args)`; a node used more
    than once is written `*k -> op(...)` the first time and `*k` afterwards (`::n` names
    output n of a multi-output node)."""
    i = set(i)
    orph = set(orphans(i, o))
    multi: list[Apply] = []
    seen: set[Apply] = set()
    for out in o:
        node = out.owner
        if node in seen and node not in multi:
            multi.append(node)
        seen.add(node)
    for node in ops(i, o):
        for v in node.inputs:
            if v in i or v in orph or v.owner is None:
                continue
            if v.owner in seen and v.owner not in multi:
                multi.append(v.owner)
            seen.add(v.owner)
    done: set[Apply] = set()

    def describe(r: Variable) -> str:
        if r.owner is None or r in i or r in orph:
            return leaf_formatter(r)
        node = r.owner
        idx = "" if len(node.outputs) == 1 else f"::{node.outputs.index(r)}"
        if node in done:
            return f"*{multi.index(node) + 1}{idx}"
        done.add(node)
        s = node_formatter(node, [describe(v) for v in node.inputs])
        return f"*{multi.index(node) + 1} -> {s}" if node in multi else s

    return [describe(out) for out in o]


def op_as_string(i: Sequence[Variable], op: Apply,
                 leaf_formatter: Callable[[Variable], str] = default_leaf_formatter,
                 node_formatter: Callable[[Apply, list[str]], str] = default_node_formatter
                 ) -> str:
    """Apply node `op` as text, its inputs written by `as_string` down to `i`."""
    return node_formatter(op, as_string(i, op.inputs, leaf_formatter, node_formatter))


@contextlib.contextmanager
def nodes_constructed() -> Iterator[list[Variable]]:
    """A list that collects the variables made while the block runs (Theano's
    construction observer)."""
    made: list[Variable] = []
    Variable.construction_observers.append(made.append)
    try:
        yield made
    finally:
        Variable.construction_observers.remove(made.append)
