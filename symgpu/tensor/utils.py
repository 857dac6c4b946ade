"""Theano's `theano.tensor.utils`: `hash_from_ndarray` (a digest of an array's data, shape,
strides and dtype) and `shape_of_variables` (every variable's numeric shape in a function
graph, from its inputs' shapes, through the shapes the ops infer)."""
from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

import numpy as np

from symgpu.graph.basic import Constant, Variable, graph_inputs, io_toposort
from symgpu.tensor.basic import MakeVector
from symgpu.tensor.rewriting.shape_feature import infer_graph_shapes
from symgpu.tensor.type import TensorType

__all__ = ["hash_from_code", "hash_from_ndarray", "shape_of_variables"]


def hash_from_code(msg: str | bytes | np.ndarray) -> str:
    """The SHA-256 hex digest of `msg` (a str is UTF-8 encoded; an array gives its buffer)."""
    if isinstance(msg, str):
        msg = msg.encode()
    return hashlib.sha256(msg).hexdigest()


def hash_from_ndarray(data: np.ndarray) -> str:
    """A digest of `data` that tells apart arrays with the same buffer but another shape,
    strides or dtype (zeros of (1, 0) and (2, 0), a transposed view, uint32 vs int32 zeros),
    while a view and its C-contiguous copy hash alike -- as Theano."""
    data = np.asarray(data)
    if not data.flags["C_CONTIGUOUS"]:
        data = np.ascontiguousarray(data)
    return hash_from_code(hash_from_code(data) + hash_from_code(str(data.shape))
                          + hash_from_code(str(data.strides)) + hash_from_code(str(data.dtype)))


def shape_of_variables(fgraph: Any, input_shapes: Mapping[Variable, Sequence[int]]
                       ) -> dict[Variable, tuple[int, ...]]:
    """{variable: shape} for every tensor variable of `fgraph`, given the shape of each of its
    inputs. Shapes come from the ops' infer_shape, so nothing is computed but the shape
    arithmetic; a shape that depends on an input's values (not only its shape) cannot be
    answered (ValueError). Unlike Theano's, `fgraph` is not modified."""
    if any(v not in fgraph.inputs for v in input_shapes):
        raise ValueError("shape_of_variables: input_shapes keys aren't in fgraph.inputs; "
                         "FunctionGraph clones the graph it receives by default: build it "
                         "with clone=False, or key input_shapes by fgraph.inputs")
    dims: dict[Variable, tuple] = {}  # each input's dims as fresh int64 scalars
    values: dict[Variable, int] = {}
    for inp in fgraph.inputs:
        if not isinstance(inp.type, TensorType):
            continue
        if inp not in input_shapes:
            raise ValueError(f"shape_of_variables: no shape given for the input {inp}")
        shp = tuple(int(s) for s in input_shapes[inp])
        if len(shp) != inp.type.ndim:
            raise ValueError(f"shape_of_variables: the shape {shp} given for {inp} has "
                             f"{len(shp)} entries, the variable {inp.type.ndim} dimensions")
        dims[inp] = tuple(TensorType("int64", ())(f"{inp}.shape[{d}]") for d in range(len(shp)))
        values.update(zip(dims[inp], shp))
    nodes = io_toposort(list(fgraph.inputs), list(fgraph.outputs))
    variables = list(fgraph.inputs) + [o for n in nodes for o in n.outputs] + \
        [i for n in nodes for i in n.inputs if i.owner is None and i not in fgraph.inputs]
    variables = [v for v in dict.fromkeys(variables) if isinstance(v.type, TensorType)]
    shapes = infer_graph_shapes(variables, dims)
    flat = [d for s in shapes for d in s]
    if not flat:
        return {v: () for v in variables}
    free = {v for v in graph_inputs(flat) if not isinstance(v, Constant)} - set(values)
    if free:
        raise ValueError(f"shape_of_variables: some shapes depend on values, not only on the "
                         f"inputs' shapes (they read {sorted(map(str, free))})")
    numbers = MakeVector("int64")(*flat).eval({k: np.int64(v) for k, v in values.items()})
    it = iter(int(n) for n in numbers)
    return {v: tuple(next(it) for _ in s) for v, s in zip(variables, shapes)}

