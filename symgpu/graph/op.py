"""Op: what a node computes. Equality and hashing come from `__props__`."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from symgpu.config import config
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.test_value import compute_test_values

__all__ = ["Op", "Thunk", "PerformThunk", "ResolvedPerformThunk", "ShapeError"]


class ShapeError(Exception):
    """An op cannot say the shape of its outputs from its inputs' shapes (no `infer_shape`)."""


#: the flag table, read directly: Op.__call__ runs for every node a user builds
_flags = config._flags


class Op:
    """Base class of every operation.

    Subclasses implement `make_node(*inputs) -> Apply` and either `perform(node, inputs,
    output_storage)` (NumPy) or `make_thunk(node, storage_map, compute_map, no_recycling)`.
    `__props__` names the attributes that make two instances interchangeable; ops without it
    compare by identity unless they define `__eq__`/`__hash__`.
    """

    __props__: tuple[str, ...] | None = None
    #: output index -> list of input indices it overwrites (in-place ops)
    destroy_map: dict[int, list[int]] = {}
    #: output index -> list of input indices it is a view of
    view_map: dict[int, list[int]] = {}
    #: the default output returned by __call__ when several exist (None = all)
    default_output: int | None = None

    # -- identity ---------------------------------------------------------------------------
    def _props(self) -> tuple:
        return tuple(getattr(self, p) for p in self.__props__)

    def __eq__(self, other: object) -> bool:
        if self.__props__ is None:
            return self is other
        return type(self) is type(other) and self._props() == other._props()

    def __hash__(self) -> int:
        if self.__props__ is None:
            return id(self)
        return hash((type(self), self._props()))

    def __str__(self) -> str:
        if self.__props__:
            inner = ", ".join(f"{p}={getattr(self, p)}" for p in self.__props__)
            return f"{type(self).__name__}{{{inner}}}"
        return type(self).__name__

    def __repr__(self) -> str:
        return str(self)

    # -- building ---------------------------------------------------------------------------
    def make_node(self, *inputs: Any) -> Apply:
        raise TypeError(f"{type(self).__name__} must define make_node")

    def __call__(self, *inputs: Any, **kwargs: Any):
        node = self.make_node(*inputs, **kwargs)
        action = _flags["compute_test_value"].value
        if action != "off":  # Theano's test values: evaluate now, fail at the user's line
            compute_test_values(node, action, Op)
        if self.default_output is not None:
            return node.outputs[self.default_output]
        return node.outputs[0] if len(node.outputs) == 1 else list(node.outputs)

    # -- running ----------------------------------------------------------------------------
    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        raise TypeError(f"{type(self).__name__} has neither perform nor make_thunk")

    def prepare_node(self, node: Apply, storage_map: dict, compute_map: dict, impl: str | None) -> None:
        """Hook run once before thunks are made (e.g. to compile a kernel)."""

    def make_thunk(self, node: Apply, storage_map: dict, compute_map: dict,
                   no_recycling: Sequence[Variable], impl: str | None = None) -> Callable[[], None]:
        """A zero-argument callable that reads input cells and fills output cells.  An op with
        ``perform_args(node)`` (a tuple) has them resolved here, once, and passed to every
        ``perform`` call after its three arguments (ResolvedPerformThunk)."""
        resolve = getattr(self, "perform_args", None)
        if resolve is not None:
            return ResolvedPerformThunk(self, node, storage_map, compute_map, resolve(node))
        return PerformThunk(self, node, storage_map, compute_map)

    # -- differentiation and shapes ---------------------------------------------------------
    def grad(self, inputs: Sequence[Variable], output_grads: Sequence[Variable]) -> list[Variable]:
        raise NotImplementedError(f"{self} has no gradient")

    def L_op(self, inputs: Sequence[Variable], outputs: Sequence[Variable],
             output_grads: Sequence[Variable]) -> list[Variable]:
        return self.grad(inputs, output_grads)

    def R_op(self, inputs: Sequence[Variable], eval_points: Sequence[Variable]) -> list[Variable]:
        raise NotImplementedError(f"{self} has no R_op")

    def connection_pattern(self, node: Apply) -> list[list[bool]]:
        return [[True] * len(node.outputs) for _ in node.inputs]

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: Sequence[tuple]) -> list[tuple]:
        """One tuple of int64 scalar variables per output (its length per dimension), from
        `input_shapes[i]` (the same for input i). Ops override it; the shape rewrites use it to
        answer `x.shape` without computing `x` (symgpu/tensor/rewriting/shape_feature.py)."""
        raise ShapeError(f"{type(self).__name__} ({self}) does not implement infer_shape: the "
                         f"shape of its outputs cannot be derived from its inputs' shapes")


class Thunk:
    """A callable bound to storage cells. Subclasses set `inputs`/`outputs` (cell lists)."""

    lazy = False
    __slots__ = ("op", "node", "inputs", "outputs", "compute_outputs")

    def __call__(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class PerformThunk(Thunk):
    """Runs `op.perform` on the node's storage cells."""

    __slots__ = ("perform", "in_cells", "out_cells")

    def __init__(self, op: Op, node: Apply, storage_map: dict, compute_map: dict):
        self.op = op
        self.node = node
        self.inputs = [storage_map[v] for v in node.inputs]
        self.outputs = [storage_map[v] for v in node.outputs]
        self.perform = op.perform
        self.compute_outputs = [compute_map[v] for v in node.outputs] if compute_map else None

    def __call__(self) -> None:
        self.perform(self.node, [c[0] for c in self.inputs], self.outputs)


class ResolvedPerformThunk(PerformThunk):
    """Runs ``op.perform(node, inputs, outputs, *resolved)``: ``resolved`` are the arguments
    ``op.perform_args(node)`` derives from the node once, when the thunk is made (e.g. kernel
    names built from its variables' dtypes, which type filtering guarantees its run-time
    values have), so a call does not derive them again.  ``perform`` called without them
    (tests, test values) derives them itself."""

    __slots__ = ("resolved",)

    def __init__(self, op: Op, node: Apply, storage_map: dict, compute_map: dict,
                 resolved: tuple):
        super().__init__(op, node, storage_map, compute_map)
        self.resolved = resolved

    def __call__(self) -> None:
        self.perform(self.node, [c[0] for c in self.inputs], self.outputs, *self.resolved)
