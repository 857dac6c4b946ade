"""The rewrite machinery: node rewrites, graph rewrites, the equilibrium driver, merge,
the destroy handler and the pass database (see db.py for positions and tags)."""
from symgpu.graph.rewriting.basic import (GraphRewriter, InconsistencyError, NodeRewriter,
                                          WalkingRewriter, apply_node_rewriter, check_stack_trace,
                                          copy_stack_trace,
                                          graph_rewriter, in2out, node_rewriter, out2in,
                                          replace_validate, same_typed_outputs, settings,
                                          sweep, try_replace)
from symgpu.graph.rewriting.db import (POSITIONS, PassDB, RewriteGroup, canonicalize, optdb,
                                       register_canonicalize, register_specialize,
                                       register_stabilize, specialize, stabilize)
from symgpu.graph.rewriting.destroy import DestroyHandler, attach_destroy_handler, why_not_destroyable
from symgpu.graph.rewriting.equilibrium import ChangeTracker, EquilibriumRewriter
from symgpu.graph.rewriting.merge import MergeRewriter

__all__ = [
    "GraphRewriter", "InconsistencyError", "NodeRewriter", "WalkingRewriter",
    "apply_node_rewriter", "check_stack_trace", "copy_stack_trace", "graph_rewriter", "in2out", "node_rewriter",
    "out2in", "replace_validate", "same_typed_outputs", "settings", "sweep", "try_replace",
    "POSITIONS", "PassDB",
    "RewriteGroup",
    "canonicalize", "optdb", "register_canonicalize", "register_specialize", "register_stabilize",
    "specialize", "stabilize", "DestroyHandler", "attach_destroy_handler", "why_not_destroyable",
    "ChangeTracker", "EquilibriumRewriter", "MergeRewriter",
]
