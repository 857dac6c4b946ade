"""Shared variables (Theano's ``theano.compile.sharedvalue``): they live in
symgpu/graph/sharedvalue.py, below the tensor language that subclasses them."""
from symgpu.graph.sharedvalue import (Container, SharedVariable, register_shared_constructor,
                                      shared, shared_constructor, update_locks)

__all__ = ["SharedVariable", "shared", "register_shared_constructor", "shared_constructor",
           "Container", "update_locks"]
