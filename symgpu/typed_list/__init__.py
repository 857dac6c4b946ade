"""Typed lists (Theano's ``theano.typed_list``): symbolic Python lists whose elements all
have one type, with list ops (see docs/api.md, "symgpu.typed_list").

    import symgpu.typed_list as tl
    x = tl.TypedListType(T.dvector)()
    f = symgpu.function([x], x.append(T.ones(3)))

Not imported by ``import symgpu``.
"""
from symgpu.typed_list import rewriting
from symgpu.typed_list.basic import *  # noqa: F401,F403
from symgpu.typed_list.basic import __all__ as _basic_all
from symgpu.typed_list.type import TypedListType

__all__ = ["TypedListType", "rewriting"] + list(_basic_all)
