"""The in-place pass of typed lists (Theano's ``typed_list_inplace_opt``): Append, Extend,
Insert, Remove and Reverse change their input list instead of copying it, where the destroy
handler allows it (the list is an intermediate read by nothing else). Runs after the tensor
in-place pass (position 75.5), with the tags ``fast_run`` and ``inplace``."""
from __future__ import annotations

from symgpu.graph.rewriting.inplace import register_first_input_inplace
from symgpu.typed_list.basic import Append, Extend, Insert, Remove, Reverse

__all__ = ["typed_list_inplace"]

_MUTATING = (Append, Extend, Insert, Remove, Reverse)


#: Append, Extend, Insert, Remove and Reverse change their input list in place where allowed
TYPED_LIST_INPLACE = register_first_input_inplace("typed_list_inplace", 75.5, _MUTATING)
typed_list_inplace = TYPED_LIST_INPLACE.apply
