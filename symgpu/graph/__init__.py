"""The backend-free graph core (no tensor or GPU code here)."""
from symgpu.graph.basic import (Apply, Constant, Scratchpad, Type, Variable, ancestors,
                                clone_graph, graph_inputs, io_toposort)
from symgpu.graph.fg import Feature, FunctionGraph, MissingInputError
from symgpu.graph.op import Op

__all__ = ["Apply", "Constant", "Scratchpad", "Type", "Variable", "ancestors", "clone_graph",
           "graph_inputs", "io_toposort", "Feature", "FunctionGraph", "MissingInputError", "Op"]
