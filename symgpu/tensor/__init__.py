"""The tensor language: symbolic n-dimensional arrays and the operations on them."""
from symgpu.tensor.type import (Float64Warning, TensorConstant, TensorType, TensorVariable,
                                as_tensor_variable, col, constant, matrix, row, scalar, tensor, vector,
                                tensor3, tensor4)
import sys

from symgpu.tensor import elemwise as _elemwise
from symgpu.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from symgpu.tensor.math import *  # noqa: F401,F403  (elementwise, reductions, dot)
from symgpu.tensor.math import (abs, all, any, argmax, argmin, cast, dot, matmul, max, mean,
                                min, outer, prod, std, sum, tensordot, var)
from symgpu.tensor.shape import (Shape, Shape_i, dimshuffle, shape, shape_i,
                                 specify_broadcastable_as, transpose)
from symgpu.tensor.basic import *  # noqa: F401,F403
from symgpu.tensor.shape import SpecifyShape
from symgpu.tensor.basic import specify_shape
from symgpu.tensor.sharedvar import TensorSharedVariable
# Theano's `T._shared`: the host tensor constructor (a tensor shared variable whatever the
# device, as Theano's tests use it)
from symgpu.tensor.sharedvar import tensor_constructor as _shared  # noqa: F401
from symgpu.tensor.extra_ops import *  # noqa: F401,F403  (cumsum, sort, repeat, diag, eye...)
from symgpu.tensor.extra_funcs import *  # noqa: F401,F403  (round modes, tile, roll, norm...)
from symgpu.tensor.grids import *  # noqa: F401,F403  (mgrid, ogrid, get_scalar_constant_value)
from symgpu.tensor import typed_constructors as _typed
from symgpu.tensor import nnet
from symgpu.tensor import nlinalg  # T.nlinalg.*, as Theano's tensor namespace has it
from symgpu.tensor import xlogx  # T.xlogx.xlogy0: Theano's tensor package imports the module
# Theano's T.sort ... T.topk: importing the module binds T.sort to it, the names rebind after
from symgpu.tensor.sort import argsort, argtopk, sort, topk, topk_and_argtopk  # noqa: E402

from symgpu.tensor.variable import install_operators as _install_operators  # noqa: E402
# Theano's operator mixin of TensorVariable, TensorConstant and TensorSharedVariable
from symgpu.tensor.type import _tensor_py_operators  # noqa: E402,F401

_install_operators()
_elemwise.install_language(sys.modules[__name__])  # gradients of Elemwise build with T
globals().update(_typed.CONSTRUCTORS)
globals().update(_typed.PLURALS)
import symgpu.tensor.rewriting  # noqa: E402,F401  (registers the tensor rewrite passes)
# T.shared_randomstreams.RandomStreams, as Theano's tensor package imports it
from symgpu.tensor import shared_randomstreams  # noqa: E402,F401
# Theano's tensor.basic names symgpu had under no name (test_basic.py's imports)
from symgpu.tensor.theano_basic import *  # noqa: E402,F401,F403
from symgpu.tensor import inplace  # noqa: E402,F401  (T.inplace.exp_inplace ...)
import symgpu.scalar as scal  # noqa: E402,F401  (Theano's T.scal: the scalar package)

