"""Theano's `theano.sparse`: sparse matrices (scipy.sparse csr / csc values) in symbolic graphs.

`import symgpu.sparse as sparse` (importing symgpu does not load it, nor scipy.sparse). Layout:
`type` (SparseType, variables, constructors), `sharedvar` (shared sparse matrices),
`construct` (construction and conversion: CSM, CSMProperties, dense <-> sparse, casts,
transpose, sparse_grad, clean), `elemwise` (add, sub, mul, structured functions), `products`
(structured_dot, dot, true_dot), `reductions` (sp_sum), `joins` (hstack, vstack),
`scaling` (col_scale, row_scale), `variable` (the operators); Theano's sandbox beside them:
`convolution` (convolution and max pooling by sparse products), `sampling` (Poisson,
Binomial, Multinomial). Theano's `theano.sparse.basic` path gathers the package's names
(the path layer).
Everything runs on the host with scipy.sparse.
"""
from __future__ import annotations

from symgpu.sparse.type import *  # noqa: F401,F403
from symgpu.sparse.type import __all__ as _type_all
from symgpu.sparse.construct import *  # noqa: F401,F403
from symgpu.sparse.construct import __all__ as _basic_all
from symgpu.sparse.elemwise import *  # noqa: F401,F403
from symgpu.sparse.elemwise import __all__ as _elemwise_all
from symgpu.sparse.products import *  # noqa: F401,F403
from symgpu.sparse.products import __all__ as _products_all
from symgpu.sparse.reductions import *  # noqa: F401,F403
from symgpu.sparse.reductions import __all__ as _reductions_all
from symgpu.sparse.joins import *  # noqa: F401,F403
from symgpu.sparse.joins import __all__ as _joins_all
from symgpu.sparse.scaling import *  # noqa: F401,F403
from symgpu.sparse.scaling import __all__ as _scaling_all
from symgpu.sparse.sharedvar import *  # noqa: F401,F403
from symgpu.sparse.sharedvar import __all__ as _sharedvar_all
from symgpu.sparse.variable import install_operators

install_operators()

#: Theano's alias of sparse_constructor
shared_constructor = sparse_constructor  # noqa: F405

__all__ = (list(_type_all) + list(_basic_all) + list(_elemwise_all) + list(_products_all)
           + list(_reductions_all) + list(_joins_all) + list(_scaling_all)
           + list(_sharedvar_all) + ["shared_constructor"])
