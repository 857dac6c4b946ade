"""Test values: run each node on sample inputs as the graph is built (Theano's
``compute_test_value``), so that a shape or dtype mistake fails at the user's own line, long
before ``function()`` compiles anything.

`Op.__call__` calls `compute_test_values(node, action, Op)` when ``config.compute_test_value`` is
not ``'off'``. Inputs give their values through `Variable.get_test_value` (``tag.test_value``,
a constant's data, a shared variable's value). The node is evaluated by a thunk made
for this one node (the op's ``make_thunk``, as the compiled function runs it), or by the op's
``perform`` where the op makes no thunk of its own.
"""
from __future__ import annotations

import sys
import warnings
from typing import Any

from symgpu.graph.basic import Apply, TestValueError, Variable

__all__ = ["compute_test_values", "TestValueError"]


def _value_summary(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is None:
        return f"{type(value).__name__} {value!r}"
    return f"shape {tuple(shape)} {getattr(value, 'dtype', '')}".rstrip()


def _where(node: Apply) -> str:
    trace = getattr(node.tag, "trace", None) or []
    if not trace:
        return "The node has no recorded creation trace."
    lines = ["The node was created at (the last frames of your code):"]
    for frame in trace[-3:]:
        lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}')
        if frame.line:
            lines.append(f"    {frame.line}")
    return "\n".join(lines)


def _user_stacklevel() -> int:
    """The `warnings.warn` stacklevel of the first caller outside symgpu (the user's line)."""
    package = __file__.rsplit("/graph/", 1)[0]
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(package):
        level, frame = level + 1, frame.f_back
    return level


def _missing(node: Apply, i: int, var: Variable, action: str) -> None:
    """An input without a test value: ignore, warn, raise or start pdb, as `action` says."""
    if action == "ignore":
        return
    message = (f"{node.op}: input {i} ({var}, {var.type}) has no test value, so the outputs "
               f"of {node} get none; set `{var.name or 'var'}.tag.test_value = <array>` "
               f"(config.compute_test_value={action!r})\n{_where(node)}")
    if action == "warn":
        warnings.warn(message, UserWarning, stacklevel=_user_stacklevel())
        return
    if action == "pdb":
        import pdb
        print(message)
        pdb.set_trace()
        return
    raise TestValueError(message)


def _evaluate(node: Apply, values: list[Any], base: type) -> list[Any]:
    """The op's own thunk where it makes one (it is what the compiled function runs, with
    its run-time checks, e.g. Elemwise's undeclared-broadcast check), else ``perform``
    (`base` is the Op class, whose make_thunk calls perform)."""
    op = node.op
    if type(op).make_thunk is base.make_thunk and type(op).perform is not base.perform:
        storage: list[list] = [[None] for _ in node.outputs]
        op.perform(node, list(values), storage)
        return [cell[0] for cell in storage]
    storage_map = {v: [val] for v, val in zip(node.inputs, values)}
    for v in node.outputs:
        storage_map[v] = [None]
    compute_map = {v: [v.owner is not node] for v in storage_map}
    op.prepare_node(node, storage_map, compute_map, None)
    op.make_thunk(node, storage_map, compute_map, [])()
    return [storage_map[v][0] for v in node.outputs]


def compute_test_values(node: Apply, action: str, base: type) -> None:
    """Give `node`'s outputs test values computed from its inputs' (see module doc);
    `base` is the Op class (graph.op passes it: this module sits below it).

    A failure re-raises the op's exception (same class where possible) with the node, the
    inputs' shapes and dtypes and the user's line that built it."""
    values = []
    for i, var in enumerate(node.inputs):
        try:
            values.append(var.get_test_value())
        except TestValueError:
            _missing(node, i, var, action)
            return
    destroyed = {i for idx in getattr(node.op, "destroy_map", {}).values() for i in idx}
    for i in destroyed:  # an in-place op must not overwrite its inputs' test values
        if hasattr(values[i], "copy"):
            values[i] = values[i].copy()
    try:
        results = _evaluate(node, values, base)
    except Exception as exc:  # any op error: re-raised below with the node and inputs
        message = (f"{exc}\nTest value computation failed (config.compute_test_value="
                   f"{action!r}) for the node: {node}\n"
                   "Inputs types: [" + ", ".join(str(v.type) for v in node.inputs) + "]\n"
                   "Inputs test values: [" + ", ".join(_value_summary(v) for v in values)
                   + "]\n" + _where(node))
        try:
            new = type(exc)(message)
        except Exception:  # exception classes with unusual constructors
            new = RuntimeError(message)
        new.node = node
        raise new.with_traceback(None) from exc
    for out, value in zip(node.outputs, results):
        try:
            out.tag.test_value = value
        except TypeError as exc:
            raise TypeError(f"{node.op} computed a test value that does not fit its output "
                            f"{out.index} ({out.type}): {exc}\n{_where(node)}") from None
