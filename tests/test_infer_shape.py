"""Shape inference: every op's `infer_shape` against the computed shape (one table-driven test
that must cover every Op class in symgpu), and the shape rewrites (`x.shape` of a computed x
computes nothing), `specify_shape`, on the CPU and under a virtual GPU context.

Adding an op: one entry in CASES (host ops: `case(build, *values)`; GPU ops:
`gcase(gpu_build, host_twin_build, kinds, *values)`).
"""
from __future__ import annotations

import importlib
import pkgutil
import time
from typing import Any, Callable, NamedTuple

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function
from symgpu.graph.basic import Variable
from symgpu.graph.op import Op, ShapeError
from symgpu.gpu.placement.rewriting import virtual_context
from symgpu.tensor.rewriting.shape_feature import node_shapes, shape_tuple

rng = np.random.RandomState(42)


def r(*shape, dtype="float64"):
    return rng.uniform(-1, 1, size=shape).astype(dtype)


def i64(v):
    return np.asarray(v, dtype="int64")


def var_for(value: np.ndarray, bcast: tuple | None = None) -> Variable:
    """A host symbolic input for `value` (non-broadcastable unless `bcast` says)."""
    return T.tensor(dtype=str(value.dtype), shape=bcast if bcast is not None
                    else (False,) * value.ndim)


class Case(NamedTuple):
    build: Callable[..., Any]      # host vars (GPU vars where kinds says 'g') -> output(s)
    values: tuple                  # (value, broadcastable or None) per input
    twin: Callable[..., Any] | None = None   # GPU cases: the host expression of the same shape
    kinds: str = ""                # GPU cases: 'g' (GPU input) or 'h' (host input) per input


def case(build, *values) -> Case:
    return Case(build, tuple(v if isinstance(v, tuple) else (v, None) for v in values))


def _times():
    """mul of two float32 values, as a Composite (an epilogue has a fixed number of inputs)."""
    from symgpu.scalar.composite import CompositeBuilder
    b = CompositeBuilder()
    x, y = b.add_input("float32"), b.add_input("float32")
    return b.build(b.add_op(symgpu.scalar.basic.SCALAR_OPS["mul"], [x, y]))


def gcase(build, twin, kinds, *values) -> Case:
    return Case(build, tuple(v if isinstance(v, tuple) else (v, None) for v in values), twin, kinds)


def _ops():
    """Every module's classes (imports all of symgpu that exists here)."""
    from symgpu.gradient import DisconnectedGrad, JacobianOp, ZeroGrad
    from symgpu.tensor.basic import ARange, Alloc, Join, MakeVector, Reshape
    from symgpu.tensor.blas import Dot22, Gemm, Gemv, Ger
    from symgpu.tensor.math import Argmax, Dot, MatMul
    from symgpu.tensor.nnet import (CrossentropyCategorical1Hot, CrossentropyCategorical1HotGrad,
                                    LogSoftmax, Softmax)
    from symgpu.tensor.shape import (Shape, Shape_i, SpecifyBroadcastable, SpecifyShape,
                                     Unbroadcast)
    from symgpu.tensor.subtensor import (AdvancedIncSubtensor, AdvancedSubtensor, IncSubtensor,
                                         Subtensor)
    return locals()


O = _ops()
from symgpu.scalar.basic import SCALAR_OPS  # noqa: E402

G = {}
for _mod in ("placement.basic_ops", "ops.blas", "ops.subtensor", "ops.advanced", "ops.nnet", "ops.crossentropy", "ops.elemwise",
             "ops.kernel_op", "ops.softmax_rows", "ops.nll_grad", "ops.take_rows",
             "ops.guarded_updates"):
    G.update(vars(importlib.import_module(f"symgpu.gpu.{_mod}")))

ADD = symgpu.scalar.basic.SCALAR_OPS["add"]
MUL = symgpu.scalar.basic.SCALAR_OPS["mul"]
n3, n4 = i64(3), i64(4)

from symgpu.ifelse import IfElse, ifelse  # noqa: E402
from symgpu.printing import Print  # noqa: E402
from symgpu.scan.op import Scan  # noqa: E402
from symgpu.tensor.nnet import abstract_conv as _conv  # noqa: E402
from symgpu.tensor.random import ops as _rnd  # noqa: E402
from symgpu.tensor.signal import pool as _pool  # noqa: E402
for _mod in ("ops.conv", "ops.pooling", "ops.pooling_epilogue", "ops.advanced_pairs", "ops.random", "ops.random_fusion"):
    G.update(vars(importlib.import_module(f"symgpu.gpu.{_mod}")))
STATE = np.array([1, 2, 3, 4], dtype="uint32")
IMG, KERN, GY = r(2, 3, 7, 7), r(4, 3, 3, 3), r(2, 4, 3, 3)   # conv with subsample 2
PX, PZ = r(2, 3, 6, 6), r(2, 3, 3, 3)                          # 2x2 pooling

CASES: dict[type, list[Case]] = {
    # ---------------------------------------------------------------- host ops
    O["Shape"]: [case(lambda x: T.shape(x), r(2, 3))],
    O["Shape_i"]: [case(lambda x: O["Shape_i"](1)(x), r(2, 3))],
    O["SpecifyBroadcastable"]: [case(lambda x: O["SpecifyBroadcastable"]((True, False))(x), r(1, 3))],
    O["Unbroadcast"]: [case(lambda x: O["Unbroadcast"]((True, False))(x), (r(1, 3), (True, False)))],
    O["SpecifyShape"]: [case(lambda x, n: T.specify_shape(x, (3, n)), r(3, 4), n4),
                        case(lambda x: T.specify_shape(x, (None, 4)), r(3, 4))],
    T.DimShuffle: [case(lambda x: x.dimshuffle(1, "x", 0), r(2, 3)),
                   case(lambda x: x.dimshuffle(1), (r(1, 3), (True, False)))],
    T.Elemwise: [case(lambda x, y: x * y, r(2, 3), (r(1, 3), (True, False))),
                 case(lambda x, y, z: T.switch(x > 0, y, z), r(2, 3), (r(2, 1), (False, True)),
                      (r(1, 1), (True, True))),
                 case(lambda x: x ** 2, r(4, 5))],
    T.CAReduce: [case(lambda x: x.sum(axis=1), r(2, 3)), case(lambda x: x.max(), r(2, 3)),
                 case(lambda x: x.prod(axis=(0, 2)), r(2, 3, 4))],
    O["Argmax"]: [case(lambda x: T.argmax(x, axis=1), r(2, 3)), case(lambda x: T.argmax(x), r(2, 3))],
    O["Dot"]: [case(lambda x, y: O["Dot"]()(x, y), r(2, 3), r(3)),
               case(lambda x, y: O["Dot"]()(x, y), r(3), r(3, 4)),
               case(lambda x, y: O["Dot"]()(x, y), r(2, 3), r(3, 4)),
               case(lambda x, y: O["Dot"]()(x, y), r(3), r(3))],
    O["MatMul"]: [case(lambda x, y: T.matmul(x, y), r(1, 3, 4), r(5, 4, 2)),
                  case(lambda x, y: O["MatMul"]()(x, y), r(2, 1, 3, 4), r(5, 4, 2))],
    O["Softmax"]: [case(lambda x: T.nnet.softmax(x), r(2, 3))],
    O["LogSoftmax"]: [case(lambda x: T.nnet.log_softmax(x), r(2, 3))],
    O["CrossentropyCategorical1Hot"]: [
        case(lambda p, y: O["CrossentropyCategorical1Hot"]()(p, y), np.abs(r(3, 4)) + .1, i64([0, 3, 1]))],
    O["CrossentropyCategorical1HotGrad"]: [
        case(lambda g, p, y: O["CrossentropyCategorical1HotGrad"]()(g, p, y), r(3),
             np.abs(r(3, 4)) + .1, i64([0, 3, 1]))],
    O["MakeVector"]: [case(lambda a, b: O["MakeVector"]("int64")(a, b, a), n3, n4)],
    O["Reshape"]: [case(lambda x, n: T.reshape(x, (n, -1)), r(4, 6), i64(2)),
                   case(lambda x: T.reshape(x, (-1,)), r(4, 6)),
                   case(lambda x, s: T.reshape(x, s, ndim=2), r(4, 6), i64([3, -1])),
                   case(lambda x, a, b: T.reshape(x, (a, b, 2)), r(4, 6), i64(-1), i64(3))],
    O["Join"]: [case(lambda x, y: T.concatenate([x, y], axis=1), r(2, 3), r(2, 5)),
                case(lambda x, y: T.concatenate([x, y], axis=0), r(2, 3), (r(1, 3), (True, False)))],
    O["Alloc"]: [case(lambda v, n: T.alloc(v, n, 3), r(3), n4),
                 case(lambda v, n: T.alloc(v, n, 1, 3), (r(1, 3), (True, False)), n3)],
    O["ARange"]: [case(lambda a, b, c: T.arange(a, b, c), i64(2), i64(11), i64(3)),
                  case(lambda a, b, c: T.arange(a, b, c), i64(10), i64(1), i64(-4)),
                  case(lambda a, b, c: T.arange(a, b, c), i64(5), i64(1), i64(2)),
                  case(lambda a, b, c: T.arange(a, b, c), np.float64(0.5), np.float64(3.2),
                       np.float64(0.7))],
    O["Gemv"]: [case(lambda y, a, A, x, b: O["Gemv"]()(y, a, A, x, b), r(3), r(), r(3, 4), r(4), r())],
    O["Gemm"]: [case(lambda C, a, A, B, b: O["Gemm"]()(C, a, A, B, b), r(3, 2), r(), r(3, 4), r(4, 2), r())],
    O["Dot22"]: [case(lambda A, B: O["Dot22"]()(A, B), r(3, 4), r(4, 2))],
    O["Ger"]: [case(lambda A, a, x, y: O["Ger"]()(A, a, x, y), r(3, 4), r(), r(3), r(4))],
    O["Subtensor"]: [case(lambda x: x[1:, ::-2], r(5, 7)),
                     case(lambda x, a, b, s: x[a:b:s], r(9, 2), i64(-2), i64(1), i64(-3)),
                     case(lambda x, a, b, s: x[a:b:s, 1], r(9, 2), i64(1), i64(-1), i64(2)),
                     case(lambda x: x[-1], r(5, 7)),
                     case(lambda x: x[None, ..., 2], r(4, 5, 6)),
                     case(lambda x: x[::-1, -3:-1, 10:], r(4, 5, 6)),
                     case(lambda x, a: x[a:, :a], r(4, 5), i64(-7))],
    O["AdvancedSubtensor"]: [case(lambda x, i: x[i], r(5, 3), i64([0, 2, 2, 4])),
                             case(lambda x, i: x[i, 1:], r(5, 3), i64([[0, 2], [1, 1]])),
                             case(lambda x, i: x[:, i], r(5, 3, 2), i64([0, 2])),
                             case(lambda x, i, j: x[i, :, j], r(5, 3, 2), i64([0, 2]), i64([[1], [0]])),
                             case(lambda x, m: x[m], r(3, 4), r(3, 4) > 0),
                             case(lambda x, m: x[m, 1:], r(5, 3), r(5) > 0)],
    O["IncSubtensor"]: [case(lambda x, y: T.set_subtensor(x[1:], y), r(4, 3), r(3, 3))],
    O["AdvancedIncSubtensor"]: [case(lambda x, i, y: T.inc_subtensor(x[i], y), r(4, 3),
                                     i64([0, 0, 2]), r(3, 3))],
    O["ZeroGrad"]: [case(lambda x: O["ZeroGrad"]()(x), r(2, 3))],
    O["DisconnectedGrad"]: [case(lambda x: O["DisconnectedGrad"]()(x), r(2, 3))],
    O["JacobianOp"]: [case(lambda v: T.jacobian(T.exp(v) * 2, v), r(3)),
                      case(lambda m: T.jacobian(T.exp(m).sum(axis=0), m), r(2, 3))],
    Print: [case(lambda x: Print("shape test", attrs=())(x), r(2, 3))],
    _conv.Conv2d: [case(lambda x, w: _conv.conv2d(x, w, border_mode="half", subsample=(2, 1)),
                        r(2, 3, 7, 6), KERN),
                   case(lambda x, w: _conv.conv2d(x, w, subsample=(2, 2)), IMG, KERN)],
    _conv.Conv2dGradInputs: [case(lambda w, g, h: _conv.Conv2dGradInputs(subsample=(2, 2))(w, g, [h, h]),
                                  KERN, GY, i64(7))],
    _conv.Conv2dGradWeights: [case(lambda x, g, k: _conv.Conv2dGradWeights(subsample=(2, 2))(x, g, [k, k]),
                                   IMG, GY, i64(3))],
    _pool.Pool: [case(lambda x: _pool.pool_2d(x, ws=(2, 3), ignore_border=False), r(2, 3, 7, 6)),
                 case(lambda x: _pool.pool_2d(x, ws=(3, 3), stride=(2, 2), pad=(1, 1)), r(2, 3, 7, 6))],
    _pool.MaxPoolGrad: [case(lambda x, z, g: _pool.MaxPoolGrad(ws=(2, 2))(x, z, g), PX, PZ, PZ)],
    _pool.MaxPoolGradGrad: [case(lambda x, z, g: _pool.MaxPoolGradGrad(ws=(2, 2))(x, z, g), PX, PZ, PX)],
    _pool.AveragePoolGrad: [case(lambda x, g: _pool.AveragePoolGrad(ws=(2, 2), mode="average_inc_pad")(x, g),
                                 PX, PZ)],
    Scan: [case(lambda x: symgpu.scan(lambda v: v * 2, sequences=x)[0], r(5, 3)),
           case(lambda x, n: symgpu.scan(lambda v: v + 1, outputs_info=None, sequences=x,
                                         n_steps=n)[0], r(5, 3), n4)],
    IfElse: [case(lambda c, x, y: ifelse(c, x * 2, y + 1), i64(1), r(2, 3), r(2, 3)),
             case(lambda c, x, y: ifelse(c, x * 2, y + 1), i64(0), r(2, 3), r(2, 3))],
    _rnd.PhiloxSample: [case(lambda st, n: _rnd.PhiloxSample("normal", "float64")(st, n, 3), STATE, n4)],
    _rnd.PhiloxAdvance: [case(lambda st, n: _rnd.PhiloxAdvance("float64")(st, n, 3), STATE, n4)],
    _rnd.CategoricalFromUniform: [case(lambda p, u: _rnd.CategoricalFromUniform()(p, u),
                                       np.abs(r(4)) + .1, np.abs(r(2, 5)))],
    _rnd.MultinomialFromUniform: [case(lambda p, u: _rnd.MultinomialFromUniform()(p, u),
                                       np.abs(r(3, 4)) + .1, np.abs(r(5, 3)))],
    _rnd.ArgsortKeys: [case(lambda k: _rnd.ArgsortKeys(2)(k), r(3, 5)),
                       case(lambda k: _rnd.ArgsortKeys()(k), r(3, 5))],
    # ---------------------------------------------------------------- GPU ops (virtual context)
    G["GpuConv2d"]: [gcase(lambda x, w: G["GpuConv2d"](subsample=(2, 2))(x, w),
                           lambda x, w: _conv.conv2d(x, w, subsample=(2, 2)), "gg", IMG, KERN)],
    G["GpuConv2dGradInputs"]: [gcase(lambda w, g, h: G["GpuConv2dGradInputs"](subsample=(2, 2))(w, g, [h, h]),
                                     lambda w, g, h: _conv.Conv2dGradInputs(subsample=(2, 2))(w, g, [h, h]),
                                     "ggh", KERN, GY, i64(7))],
    G["GpuConv2dGradWeights"]: [gcase(lambda x, g, k: G["GpuConv2dGradWeights"](subsample=(2, 2))(x, g, [k, k]),
                                      lambda x, g, k: _conv.Conv2dGradWeights(subsample=(2, 2))(x, g, [k, k]),
                                      "ggh", IMG, GY, i64(3))],
    G["GpuPool"]: [gcase(lambda x: G["GpuPool"](ws=(2, 3), ignore_border=False)(x),
                         lambda x: _pool.pool_2d(x, ws=(2, 3), ignore_border=False), "g", r(2, 3, 7, 6))],
    G["GpuMaxPoolGrad"]: [gcase(lambda x, z, g: G["GpuMaxPoolGrad"](ws=(2, 2))(x, z, g),
                                lambda x, z, g: x, "ggg", PX, PZ, PZ)],
    G["GpuMaxPoolGradGrad"]: [gcase(lambda x, z, g: G["GpuMaxPoolGradGrad"](ws=(2, 2))(x, z, g),
                                    lambda x, z, g: z, "ggg", PX, PZ, PX)],
    G["GpuPoolGradEpilogue"]: [gcase(lambda x, z, g: G["GpuPoolGradEpilogue"](
                                         ws=(2, 2), scalar_op=SCALAR_OPS["mul"],
                                         roles=("g", "x"))(x, z, g),
                                     lambda x, z, g: x, "ggg", PX, PZ, PZ)],
    G["GpuAveragePoolGrad"]: [gcase(lambda x, g: G["GpuAveragePoolGrad"](ws=(2, 2), mode="average_inc_pad")(x, g),
                                    lambda x, g: x, "gg", PX, PZ)],
    G["GpuARange"]: [gcase(lambda a, b, c: G["GpuARange"]("int64")(a, b, c),
                           lambda a, b, c: T.arange(a, b, c), "hhh", i64(10), i64(1), i64(-4))],
    G["GpuAdvancedSubtensor2"]: [gcase(lambda x, a, b: G["GpuAdvancedSubtensor2"]()(x, a, b),
                                       lambda x, a, b: x[a, b], "ggg", r(4, 5), i64([0, 3, 1]), i64([2]))],
    G["GpuAdvancedIncSubtensor2"]: [gcase(lambda x, y, a, b: G["GpuAdvancedIncSubtensor2"]()(x, y, a, b),
                                          lambda x, y, a, b: x, "gggg", r(4, 5), r(3), i64([0, 3, 1]),
                                          i64([2, 0, 1]))],
    G["GpuPhiloxSample"]: [gcase(lambda st, n: G["GpuPhiloxSample"]("uniform", "float32")(st, n, 3),
                                 lambda st, n: _rnd.PhiloxSample("uniform", "float32")(st, n, 3),
                                 "gh", STATE, n4)],
    G["GpuPhiloxAdvance"]: [gcase(lambda st, n: G["GpuPhiloxAdvance"]("float32")(st, n, 3),
                                  lambda st, n: _rnd.PhiloxAdvance("float32")(st, n, 3), "gh", STATE, n4)],
    G["GpuPhiloxElemwise"]: [gcase(lambda st, n, y: G["GpuPhiloxElemwise"](ADD, 0, "uniform", "float32", 2)(st, n, 3, y),
                                   lambda st, n, y: _rnd.PhiloxSample("uniform", "float32")(st, n, 3) + y,
                                   "ghg", STATE, n4, r(4, 3, dtype="float32"))],
    G["GpuFromHost"]: [gcase(lambda x: G["GpuFromHost"](None)(x), lambda x: x, "h", r(2, 3))],
    G["HostFromGpu"]: [gcase(lambda x: G["HostFromGpu"]()(x), lambda x: x, "g", r(2, 3))],
    G["GpuToGpu"]: [gcase(lambda x: G["GpuToGpu"](None)(x), lambda x: x, "g", r(2, 3))],
    G["GpuContiguous"]: [gcase(lambda x: G["GpuContiguous"]()(x), lambda x: x, "g", r(2, 3))],
    G["GpuDimShuffle"]: [gcase(lambda x: G["GpuDimShuffle"]((False, False), (1, "x", 0))(x),
                               lambda x: x.dimshuffle(1, "x", 0), "g", r(2, 3))],
    G["GpuReshape"]: [gcase(lambda x, s: G["GpuReshape"](2)(x, s), lambda x, s: T.reshape(x, s, ndim=2),
                            "gh", r(4, 6), i64([3, -1]))],
    G["GpuSpecifyBroadcastable"]: [gcase(lambda x: G["GpuSpecifyBroadcastable"]((True, False))(x),
                                         lambda x: x, "g", r(1, 3))],
    G["GpuUnbroadcast"]: [gcase(lambda x: G["GpuUnbroadcast"]((True, False))(x), lambda x: x, "g",
                                (r(1, 3), (True, False)))],
    G["GpuShape"]: [gcase(lambda x: G["GpuShape"]()(x), lambda x: T.shape(x), "g", r(2, 3))],
    G["GpuShape_i"]: [gcase(lambda x: G["GpuShape_i"](0)(x), lambda x: x.shape[0], "g", r(2, 3))],
    G["GpuAlloc"]: [gcase(lambda v, n: G["GpuAlloc"](None)(v, n, 3), lambda v, n: T.alloc(v, n, 3),
                          "hh", r(), n4)],
    G["GpuAllocEmpty"]: [gcase(lambda n: G["GpuAllocEmpty"]("float32", None)(n, 3),
                               lambda n: T.zeros((n, 3)), "h", n4)],
    G["GpuGemm"]: [gcase(lambda C, a, A, B, b: G["GpuGemm"]()(C, a, A, B, b),
                         lambda C, a, A, B, b: b * C + a * T.dot(A, B), "ghggh",
                         r(3, 2, dtype="float32"), r(dtype="float32"), r(3, 4, dtype="float32"),
                         r(4, 2, dtype="float32"), r(dtype="float32"))],
    G["GpuDot22"]: [gcase(lambda A, B: G["GpuDot22"]()(A, B), lambda A, B: T.dot(A, B), "gg",
                          r(3, 4, dtype="float32"), r(4, 2, dtype="float32"))],
    G["GpuGemv"]: [gcase(lambda y, a, A, x, b: G["GpuGemv"]()(y, a, A, x, b),
                         lambda y, a, A, x, b: b * y + a * T.dot(A, x), "ghggh",
                         r(3, dtype="float32"), r(dtype="float32"), r(3, 4, dtype="float32"),
                         r(4, dtype="float32"), r(dtype="float32"))],
    G["GpuGer"]: [gcase(lambda A, a, x, y: G["GpuGer"]()(A, a, x, y),
                        lambda A, a, x, y: A + a * T.outer(x, y), "ghgg",
                        r(3, 4, dtype="float32"), r(dtype="float32"), r(3, dtype="float32"),
                        r(4, dtype="float32"))],
    G["GpuSubtensor"]: [gcase(lambda x, a: G["GpuSubtensor"]((symgpu.tensor.subtensor.Slice("$", None, -2), 1))(x, a),
                              lambda x, a: x[a::-2, 1], "gh", r(7, 3), i64(-2))],
    G["GpuIncSubtensor"]: [gcase(lambda x, y: G["GpuIncSubtensor"]((symgpu.tensor.subtensor.Slice(1, None, None),))(x, y),
                                 lambda x, y: T.set_subtensor(x[1:], y), "gg", r(4, 3), r(3, 3))],
    G["GpuJoin"]: [gcase(lambda x, y: G["GpuJoin"](1)(x, y), lambda x, y: T.concatenate([x, y], 1),
                         "gg", r(2, 3), r(2, 5))],
    G["GpuAdvancedSubtensor1"]: [gcase(lambda x, i: G["GpuAdvancedSubtensor1"]()(x, i),
                                       lambda x, i: x[i], "gg", r(5, 3), i64([0, 4, 4, 1]))],
    G["GpuAdvancedIncSubtensor1"]: [gcase(lambda x, y, i: G["GpuAdvancedIncSubtensor1"]()(x, y, i),
                                          lambda x, y, i: T.inc_subtensor(x[i], y), "ggg",
                                          r(5, 3), r(2, 3), i64([0, 4]))],
    G["GpuBatchedDot"]: [gcase(lambda x, y: G["GpuBatchedDot"]()(x, y), lambda x, y: T.matmul(x, y),
                               "gg", r(1, 3, 4, dtype="float32"), r(5, 4, 2, dtype="float32"))],
    G["GpuArgmax"]: [gcase(lambda x: G["GpuArgmax"](1)(x), lambda x: T.argmax(x, axis=1), "g",
                           r(2, 3, 4, dtype="float32"))],
    G["GpuCrossentropyCategorical1Hot"]: [
        gcase(lambda p, y: G["GpuCrossentropyCategorical1Hot"]()(p, y),
              lambda p, y: O["CrossentropyCategorical1Hot"]()(p, y), "gg",
              np.abs(r(3, 4)) + .1, i64([0, 3, 1]))],
    G["GpuCrossentropyCategorical1HotGrad"]: [
        gcase(lambda g, p, y: G["GpuCrossentropyCategorical1HotGrad"]()(g, p, y),
              lambda g, p, y: O["CrossentropyCategorical1HotGrad"]()(g, p, y), "ggg",
              r(3), np.abs(r(3, 4)) + .1, i64([0, 3, 1]))],
    G["GpuSoftmaxRows"]: [gcase(lambda x: G["GpuSoftmaxRows"](True)(x),
                                lambda x: T.nnet.log_softmax(x), "g", r(2, 3, 4))],
    G["GpuTakeRows"]: [gcase(lambda x, r, b: G["GpuTakeRows"]()(x, r, b),
                             lambda x, r, b: x[T.arange(r), b], "ghg", r(5, 3), i64(5),
                             i64([0, 2, 1, 0, 2])),
                       gcase(lambda x, r, b: G["GpuTakeRows"]()(x, r, b),
                             lambda x, r, b: x[T.arange(r), b], "ghg", r(5, 3), i64(1),
                             i64([0, 2, 1]))],
    G["GpuCheckVerdict"]: [gcase(lambda x: G["GpuCheckVerdict"]()(x), lambda x: x.sum(), "g",
                                 r(3))],
    G["GpuNLLGrad"]: [gcase(lambda v, m, n, y: G["GpuNLLGrad"]()(v, m, n, y),
                            lambda v, m, n, y: m, "gghg", r(3), r(3, 4), i64(3),
                            i64([0, 3, 1]))],
    G["GpuElemwise"]: [gcase(lambda x, y: G["GpuElemwise"](ADD)(x, y), lambda x, y: x + y, "gg",
                             r(2, 3, dtype="float32"), (r(1, 3, dtype="float32"), (True, False)))],
    G["GpuCAReduce"]: [gcase(lambda x: G["GpuCAReduce"](ADD, (1,))(x), lambda x: x.sum(axis=1),
                             "g", r(2, 3, 4, dtype="float32")),
                       gcase(lambda x, y: G["GpuCAReduce"](ADD, (0,), pre_scalar_op=MUL)(x, y),
                             lambda x, y: (x * y).sum(axis=0), "gg", r(2, 3, dtype="float32"),
                             (r(1, 3, dtype="float32"), (True, False))),
                       # an epilogue operand (b) does not take part in the reduction's shape
                       gcase(lambda x, b: G["GpuCAReduce"](ADD, (0,), post_scalar_op=_times())(x, b),
                             lambda x, b: x.sum(axis=0) * b, "gg", r(2, 3, dtype="float32"),
                             r(3, dtype="float32"))],
    G["ElemwiseKernelOp"]: [gcase(lambda x, y: G["ElemwiseKernelOp"]("o0 = i0 * i1", ["float32", "float32"])(x, y),
                                  lambda x, y: x * y, "gg", r(2, 3, dtype="float32"),
                                  (r(2, 1, dtype="float32"), (False, True)))],
}

# ---------------------------------------------------------------- extra_ops: cumulative sums,
# sorting, repetition, eye and diagonals, nonzero, bincount, searchsorted
from symgpu.tensor import extra_ops as _X  # noqa: E402

CASES.update({
    _X.CumOp: [case(lambda x: T.cumsum(x, axis=1), r(2, 3)), case(lambda x: T.cumprod(x), r(2, 3))],
    _X.Sort: [case(lambda x: T.sort(x, axis=0), r(3, 2))],
    _X.ArgSort: [case(lambda x: T.argsort(x), r(2, 3))],
    _X.PermuteAlongAxis: [case(lambda x, p: _X.PermuteAlongAxis(1)(x, p), r(2, 3),
                               i64([[2, 0, 1], [0, 1, 2]]))],
    _X.Repeat: [case(lambda x, n: T.repeat(x, n, axis=1), r(2, 3), n3),
                case(lambda x, k: T.repeat(x, k, axis=0), r(3, 2), i64([1, 0, 4]))],
    _X.RepeatGrad: [case(lambda g, k, x: _X.RepeatGrad(0)(g, k, x), r(5, 2), i64([1, 0, 4]),
                         r(3, 2))],
    _X.Eye: [case(lambda n, m: T.eye(n, m, 1), n3, n4)],
    _X.AllocDiag: [case(lambda v: T.diag(v, -2), r(3))],
    _X.ExtractDiag: [case(lambda x: T.diagonal(x, 1, 2, 0), r(2, 3, 4)),
                     case(lambda x: T.diag(x, -5), r(3, 4))],
    _X.ExtractDiagGrad: [case(lambda x, g: _X.ExtractDiagGrad(1, 0, 1)(x, g), r(3, 4), r(3))],
    _X.Nonzero: [case(lambda x: T.nonzero(x > 0, return_matrix=True), r(3, 4))],
    _X.BinCount: [case(lambda x: T.bincount(x, minlength=9), i64([0, 3, 3, 1]))],
    _X.SearchSorted: [case(lambda a, v: T.searchsorted(a, v), np.arange(5.0), r(2, 3))],
})


def _gpu_scan(x, n):
    """A GpuScan over the GPU sequence `x` (n steps of v * 2)."""
    from symgpu.gpu.ops.scan_op import GpuScan, gpu_inner_graph
    from symgpu.scan.op import ScanInfo
    v = T.scalar(dtype=x.dtype)
    ins, outs = gpu_inner_graph([v], [v * 2], [True], [True], None)
    return GpuScan(ins, outs, ScanInfo(1, (), (), 1, 0))(n, x)


def _gpu_ifelse(c, x, y):
    """A GpuIfElse choosing x * 2 or y + 1 (uploads of host x, y)."""
    from symgpu.gpu.placement.basic_ops import GpuFromHost
    from symgpu.gpu.ops.scan_ifelse import GpuIfElse
    from symgpu.gpu.ops.scan_op import gpu_inner_graph
    a, b = x.type(), y.type()
    t_in, t_out = gpu_inner_graph([a], [a * 2], [True], [True], None)
    e_in, e_out = gpu_inner_graph([b], [b + 1], [True], [True], None)
    return GpuIfElse(t_in, t_out, e_in, e_out)(c, GpuFromHost(None)(x), GpuFromHost(None)(y))


def _loop_cases() -> None:
    from symgpu.gpu.ops.scan_ifelse import GpuIfElse
    from symgpu.gpu.ops.scan_op import GpuScan
    CASES[GpuScan] = [gcase(_gpu_scan, lambda x, n: symgpu.scan(lambda v: v * 2, sequences=x,
                                                                 n_steps=n)[0],
                            "gh", r(5, dtype="float32"), i64(4))]
    CASES[GpuIfElse] = [gcase(_gpu_ifelse, lambda c, x, y: ifelse(c, x * 2, y + 1), "hhh",
                              i64(c), r(2, 3, dtype="float32"), r(2, 3, dtype="float32"))
                        for c in (0, 1)]


_loop_cases()


def all_op_classes() -> set[type]:
    """Leaf Op subclasses defined in symgpu's modules (bases that others extend are covered
    through their subclasses)."""
    for m in pkgutil.walk_packages(symgpu.__path__, "symgpu."):
        importlib.import_module(m.name)
    found, todo = set(), [Op]
    while todo:
        c = todo.pop()
        for s in c.__subclasses__():
            todo.append(s)
            if s.__module__.startswith("symgpu.") and "<locals>" not in s.__qualname__:
                found.add(s)
    return {c for c in found if not any(s in found for s in c.__subclasses__())}


@pytest.mark.filterwarnings("ignore::UserWarning")  # importing symgpu.misc.pycuda_init here
def test_the_table_covers_every_op_class():
    missing = sorted(f"{c.__module__}.{c.__qualname__}" for c in all_op_classes() - set(CASES))
    assert not missing, f"ops without an infer_shape case in CASES: {missing}"


def test_base_op_has_no_shape_rule():
    class NoShape(Op):
        def make_node(self, x):
            x = T.as_tensor_variable(x)
            return symgpu.Apply(self, [x], [x.type()])
    with pytest.raises(ShapeError, match="NoShape.*infer_shape"):
        node_shapes(NoShape()(T.matrix()).owner)


def _flat(shapes):
    return [e for s in shapes for e in s]


def _host_check(op_cls, c: Case):
    ins = [var_for(v, b) for v, b in c.values]
    vals = [v for v, _ in c.values]
    outs = c.build(*ins)
    outs = outs if isinstance(outs, list) else [outs]
    node = outs[0].owner
    assert type(node.op) is op_cls, f"the case builds {node.op}, not a {op_cls.__name__}"
    inferred = node_shapes(node)
    want = [np.shape(o) for o in function(ins, list(node.outputs), on_unused_input="ignore")(*vals)]
    flat = _flat(inferred)
    got = function(ins, flat, on_unused_input="ignore") if flat else (lambda *a: [])
    got = [int(g) for g in got(*vals)]
    assert got == [d for w in want for d in w], (str(node.op), got, want)
    if flat:  # the shape needs nothing of the op's own computation
        f = function(ins, flat, on_unused_input="ignore")
        assert not any(n.op == node.op and n.inputs == node.inputs
                       for n in f.maker.fgraph.toposort()), str(node.op)


def _gpu_check(op_cls, c: Case):
    from symgpu.gpu.placement.type import GpuArrayType
    hosts = [var_for(v, b) for v, b in c.values]
    vals = [v for v, _ in c.values]
    dims = []   # (scalar, value) for each GPU input's dims
    with symgpu.config.change_flags(floatX="float32"), virtual_context(None):
        gins, in_shapes = [], []
        for k, (h, (v, b)) in zip(c.kinds, zip(hosts, c.values)):
            if k == "g":
                g = GpuArrayType(str(v.dtype), h.broadcastable, None)()
                shp = []
                for d, bd in enumerate(h.broadcastable):
                    if bd:
                        shp.append(1)
                    else:
                        s = T.lscalar()
                        dims.append((s, v.shape[d]))
                        shp.append(s)
                gins.append(g)
                in_shapes.append(tuple(shp))
            else:
                gins.append(h)
                in_shapes.append(shape_tuple(h))
        out = c.build(*gins)
        node = out.owner
        assert type(node.op) is op_cls, f"the case builds {node.op}, not a {op_cls.__name__}"
        inferred = node_shapes(node, in_shapes)
    want = np.shape(function(hosts, c.twin(*hosts), on_unused_input="ignore")(*vals))
    flat = _flat(inferred[:1])
    ins = hosts + [s for s, _ in dims]
    got = function(ins, flat, on_unused_input="ignore")(*vals, *[i64(v) for _, v in dims]) if flat else []
    assert [int(g) for g in got] == list(want), (str(node.op), got, want)


@pytest.mark.parametrize("op_cls", sorted(CASES, key=lambda c: (c.__module__, c.__name__)),
                         ids=lambda c: c.__name__)
def test_inferred_shape_equals_computed_shape(op_cls):
    for c in CASES[op_cls]:
        (_gpu_check if c.twin is not None else _host_check)(op_cls, c)


# ----------------------------------------------------------------------------- rewrites

def op_names(f) -> list[str]:
    return [type(n.op).__name__ for n in f.maker.fgraph.toposort()]


def test_shape_of_a_computed_tensor_computes_nothing():
    x = T.matrix("x")
    f = function([x], (x ** 2).shape)
    assert op_names(f) == ["Shape_i", "Shape_i", "MakeVector"]
    assert not any(isinstance(n.op, T.Elemwise) for n in f.maker.fgraph.toposort())
    np.testing.assert_array_equal(f(r(2, 5)), [2, 5])


def test_one_dim_of_a_product():
    x, y = T.matrix("x"), T.matrix("y")
    f = function([x, y], (x * y).shape[0])
    assert op_names(f) == ["Shape_i"]
    assert f(r(3, 2), r(3, 2)) == 3


@pytest.mark.parametrize("expr, inputs, banned, want", [
    (lambda x, y: T.dot(x, y).shape, (r(3, 4), r(4, 5)), "Dot", (3, 5)),
    (lambda x, y: T.reshape(x + y, (2, -1)).shape, (r(3, 4), r(3, 4)), "Reshape", (2, 6)),
    (lambda x, y: T.exp(x)[1:, ::2].shape, (r(5, 7), r(1, 1)), "Subtensor", (4, 4)),
    (lambda x, y: T.concatenate([x, y], axis=1).shape, (r(3, 4), r(3, 2)), "Join", (3, 6)),
    (lambda x, y: T.exp(x).sum(axis=0).shape, (r(3, 4), r(3, 4)), "CAReduce", (4,)),
    (lambda x, y: T.nnet.softmax(T.dot(x, y)).shape, (r(3, 4), r(4, 2)), "Softmax", (3, 2)),
])
def test_shapes_of_ops_compute_nothing(expr, inputs, banned, want):
    x, y = T.matrix("x"), T.matrix("y")
    f = function([x, y], expr(x, y), on_unused_input="ignore")
    names = op_names(f)
    assert banned not in names, names
    for n in f.maker.fgraph.toposort():  # only integer arithmetic on lengths is left
        assert all(o.ndim == 0 or type(n.op).__name__ in ("MakeVector", "Unbroadcast")
                   for o in n.outputs), str(n.op)
        assert all(o.dtype.startswith("int") for o in n.outputs), str(n.op)
    assert not any(n in names for n in ("Dot", "Dot22", "Gemm", "Reshape", "Join", "CAReduce",
                                        "Softmax")), names
    np.testing.assert_array_equal(f(*inputs), want)


def test_slice_length_comes_from_its_bounds_even_when_the_slice_is_computed():
    """A view's length from its bounds costs a few host scalar operations, and then nothing
    on the host waits for the view (on the GPU the slice and its readers become one captured
    graph with the bounds as parameters: the minibatch pattern of the tutorials)."""
    x = T.matrix("x")
    i = T.lscalar("i")
    y = T.exp(x)[i:]
    f = function([x, i], [y, y.shape[0]])
    assert op_names(f).count("Shape_i") == 1
    shape_i = [n for n in f.maker.fgraph.toposort() if type(n.op).__name__ == "Shape_i"][0]
    assert shape_i.inputs[0] is f.maker.fgraph.inputs[0]      # x's length, not y's
    for start in (1, -1, 7, -9):
        v, n = f(r(4, 2), start)
        assert n == v.shape[0] == r(4, 2)[start:].shape[0]


def test_shape_of_alloc_and_useless_alloc():
    x = T.matrix("x")
    f = function([x], T.alloc(T.exp(x), x.shape[0], x.shape[1]))  # nothing to broadcast
    assert "Alloc" not in op_names(f)
    n = T.lscalar("n")
    f = function([x, n], T.zeros((n, 3)).shape, on_unused_input="ignore")
    assert "Alloc" not in op_names(f)
    np.testing.assert_array_equal(f(r(1, 1), 5), [5, 3])


def test_specify_shape():
    x, n = T.matrix("x"), T.lscalar("n")
    y = T.specify_shape(x, (3, n))
    f = function([x, n], [y * 2, (y * 2).shape])
    v, s = f(np.ones((3, 5)), 5)
    np.testing.assert_array_equal(s, [3, 5])
    with pytest.raises(AssertionError, match=r"should have the shape \(3, 4\).*has the shape \(3, 5\)"):
        f(np.ones((3, 5)), 4)
    g = function([x], T.specify_shape(x, (None, 2)).shape[1])
    assert op_names(g) == []  # the constant 2: x is not even read
    assert g(np.ones((7, 2))) == 2
    with pytest.raises(AssertionError, match=r"\(\?, 2\)"):
        function([x], T.specify_shape(x, (None, 2)) + 1)(np.ones((2, 3)))
    with pytest.raises(ValueError, match="has 2 dimensions but the shape"):
        T.specify_shape(x, (3,))
    with pytest.raises(ValueError, match="negative"):
        T.specify_shape(x, (-1, 2))
    with pytest.raises(TypeError, match="entry 0"):
        T.specify_shape(x, (T.scalar(), 2))
    assert T.specify_shape(x, (None, None)) is x
    assert T.specify_shape(x, (1, 2)).broadcastable == (True, False)


def test_specify_shape_gradient_and_symbolic_vector():
    x = T.matrix("x")
    s = T.lvector("s")
    y = T.specify_shape(x, T.stack([T.constant(2, dtype="int64"), s[0]]))
    g = T.grad((y ** 2).sum(), x)
    f = function([x, s], [g, y.shape])
    gv, sv = f(np.ones((2, 3)), np.array([3]))
    np.testing.assert_allclose(gv, 2 * np.ones((2, 3)))
    np.testing.assert_array_equal(sv, [2, 3])


def test_gpu_shape_of_computed_value_has_no_kernel_or_transfer():
    with symgpu.config.change_flags(floatX="float32"), virtual_context(None):
        x = T.matrix("x")
        f = function([x], (x ** 2).shape)
        names = op_names(f)
        assert not any(n.startswith("Gpu") or n in ("HostFromGpu", "GpuFromHost") for n in names), names
        from symgpu.gpu.placement.basic_ops import GpuShape, GpuShape_i
        from symgpu.gpu.ops.elemwise import GpuElemwise
        from symgpu.gpu.placement.type import GpuArrayType
        xg = GpuArrayType("float32", (False, False))("xg")
        e = GpuElemwise(symgpu.scalar.basic.SCALAR_OPS["exp"])(xg)
        from symgpu.gpu.ops.blas import GpuDot22
        f = function([xg], [GpuShape()(e), GpuShape_i(1)(GpuDot22()(e, e))])
        names = op_names(f)
        assert "GpuElemwise" not in names and not any("Dot" in n or "Gemm" in n for n in names), names
        assert "HostFromGpu" not in names and "GpuShape_i" in names


def test_shape_rewrites_keep_logreg_compile_fast():
    x, y = T.matrix("x"), T.vector("y")
    w = symgpu.shared(np.zeros(50), name="w")
    b = symgpu.shared(0.0, name="b")
    p = 1 / (1 + T.exp(-T.dot(x, w) - b))
    cost = (-y * T.log(p) - (1 - y) * T.log(1 - p)).mean() + 0.01 * (w ** 2).sum()
    gw, gb = T.grad(cost, [w, b])
    t0 = time.perf_counter()
    f = function([x, y], cost, updates={w: w - 0.1 * gw, b: b - 0.1 * gb})
    assert time.perf_counter() - t0 < 5.0
    assert np.isfinite(f(r(10, 50), (r(10) > 0).astype("float64")))


def test_useless_and_nested_specify_shape():
    x, n = T.matrix("x"), T.lscalar("n")
    f = function([x], T.specify_shape(T.exp(x), (x.shape[0], x.shape[1])))
    assert "SpecifyShape" not in op_names(f)
    f = function([x, n], T.specify_shape(T.specify_shape(x, (3, None)), (None, n)) * 2)
    nodes = [nd for nd in f.maker.fgraph.toposort() if type(nd.op).__name__ == "SpecifyShape"]
    assert len(nodes) == 1 and nodes[0].op.given == (True, True)
    np.testing.assert_array_equal(f(np.ones((3, 2)), 2), 2 * np.ones((3, 2)))
    with pytest.raises(AssertionError, match=r"\(3, 4\)"):
        f(np.ones((3, 2)), 4)


def test_specify_shape_stays_on_the_gpu():
    with symgpu.config.change_flags(floatX="float32", assert_no_cpu_op="raise"), \
            virtual_context(None):
        x, n = T.matrix("x"), T.lscalar("n")
        f = function([x, n], T.exp(T.specify_shape(T.exp(x), (2, n))) * 3)
        names = op_names(f)
        assert names.count("GpuFromHost") == 1 and names.count("HostFromGpu") == 1, names
        spec = [nd for nd in f.maker.fgraph.toposort() if type(nd.op).__name__ == "SpecifyShape"]
        assert len(spec) == 1 and type(spec[0].outputs[0].type).__name__ == "GpuArrayType"


@pytest.mark.parametrize("step_kind", ["none", "sym", 2, -3])
def test_slice_length_matches_python(step_kind):
    from symgpu.tensor.shape_rules import slice_length
    n, a, b, s = T.lscalar("n"), T.lscalar("a"), T.lscalar("b"), T.lscalar("s")
    step = {"none": None, "sym": s}.get(step_kind, step_kind)
    outs = [slice_length(start, stop, step, n) for start in (None, a) for stop in (None, b)]
    f = function([n, a, b, s], outs, on_unused_input="ignore")
    for nv in (0, 1, 5):
        for av in (-7, -2, 0, 1, 3, 9):
            for bv in (-6, -1, 0, 2, 4, 10):
                for sv in ((-4, -1, 1, 3) if step_kind == "sym" else (1,)):
                    py_step = sv if step_kind == "sym" else step
                    got = [int(g) for g in f(nv, av, bv, sv)]
                    want = [len(range(nv)[slice(st, sp, py_step)])
                            for st in (None, av) for sp in (None, bv)]
                    assert got == want, (nv, av, bv, py_step)


def test_arange_length_matches_numpy():
    from symgpu.tensor.shape_rules import arange_length
    a, b, c = T.lscalar("a"), T.lscalar("b"), T.lscalar("c")
    fa, fb, fc = T.dscalar("fa"), T.dscalar("fb"), T.dscalar("fc")
    f = function([a, b, c], arange_length(a, b, c))
    g = function([fa, fb, fc], arange_length(fa, fb, fc))
    for args in [(0, 10, 3), (10, 0, -3), (5, 5, 1), (5, 1, 2), (-4, 7, 11), (3, -8, -1)]:
        assert int(f(*args)) == len(np.arange(*args)), args
    for args in [(0.5, 3.2, 0.7), (3.0, -1.0, -0.5), (1.0, 1.0, 0.1), (0.0, 1.0, 0.25)]:
        assert int(g(*args)) == len(np.arange(*args)), args


def test_lengths_the_graph_already_has_replace_reads_of_computed_values():
    x, n = T.matrix("x"), T.lscalar("n")
    a = T.alloc(T.exp(x[0]), n, x.shape[1])
    f = function([x, n], [a * 2, a.shape, a.shape[0]])
    names = op_names(f)
    assert "Shape" not in names  # MakeVector(n, Shape_i{1}(x)): a's own shape is not read
    assert not any(nd.op.__class__.__name__ == "Shape_i" and nd.inputs[0].owner is not None
                   for nd in f.maker.fgraph.toposort())
    v, s, s0 = f(r(2, 3), 4)
    assert v.shape == (4, 3) and list(s) == [4, 3] and s0 == 4


def _an_input_or_its_upload(var) -> bool:
    """A graph input, or its GpuFromHost (a length read there is an input's length)."""
    from symgpu.gpu.placement.basic_ops import GpuFromHost
    owner = var.owner
    return owner is None or (type(owner.op) is GpuFromHost and owner.inputs[0].owner is None)


@pytest.mark.parametrize("where", ["host", "virtual_device"])
def test_benchmark_logreg_reads_lengths_of_inputs_only(where):
    """benchmarks/workloads.py's logistic regression: the mean's divisor is the length of the
    labels (or of their upload), not of the computed cross-entropy (the rewrite off: Shape_i
    of the Composite)."""
    import contextlib
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
    from workloads import build_logreg
    X, Y = r(40, 7, dtype="float32"), (r(40) > 0).astype("float32")
    ctx = virtual_context(None) if where == "virtual_device" else contextlib.nullcontext()
    with symgpu.config.change_flags(floatX="float32"), ctx:
        outs, ups = build_logreg(symgpu.shared, T, X, Y, r(7, dtype="float32"), np.float32(0))
        f = function([], outs, updates=ups)
        reads = [n for n in f.maker.fgraph.toposort() if "Shape" in type(n.op).__name__]
        assert reads and all(_an_input_or_its_upload(n.inputs[0]) for n in reads), \
            [str(n) for n in reads]
        with symgpu.config.change_flags(optimizer_excluding="local_shape_infer:gpu_shape_infer"):
            outs, ups = build_logreg(symgpu.shared, T, X, Y, r(7, dtype="float32"), np.float32(0))
            g = function([], outs, updates=ups)
        reads = [n for n in g.maker.fgraph.toposort() if "Shape" in type(n.op).__name__]
        assert any(n.inputs[0].owner is not None for n in reads), [str(n) for n in reads]


# ----------------------------------------------------------------------------- OpFromGraph
# (symgpu/builders.py; the table above is parametrized before this block runs, so its cases
# are checked by the test below with the same checks)
from symgpu.builders import OpFromGraph  # noqa: E402
from symgpu.gpu.ops.builders import GpuOpFromGraph  # noqa: E402


def _ofg_case(x, y):
    a, b = T.dmatrix(), T.dmatrix()
    return OpFromGraph([a, b], [a + b, T.dot(a, b.T), a[1:].sum(axis=0)])(x, y)


def _ofg_value_shape(x, n):
    a, k = T.dvector(), T.lscalar()
    return OpFromGraph([a, k], [T.alloc(a.sum(), k, 2) + 1])(x, n)


def _gpu_ofg(x, y):
    """A GpuOpFromGraph of GPU x and y: dot(x, y.T) on the device."""
    from symgpu.gpu.ops.scan_op import gpu_inner_graph
    a, b = T.matrix(), T.matrix()
    ins, outs = gpu_inner_graph([a, b], [T.dot(a, b.T)], [True, True], [True], None)
    return GpuOpFromGraph(ins, outs)(x, y)


def _ofg_cases() -> None:
    CASES[OpFromGraph] = [case(_ofg_case, r(3, 4), r(3, 4)), case(_ofg_value_shape, r(3), n4)]
    CASES[GpuOpFromGraph] = [gcase(_gpu_ofg, lambda x, y: T.dot(x, y.T), "gg",
                                   r(3, 4, dtype="float32"), r(5, 4, dtype="float32"))]


_ofg_cases()


@pytest.mark.parametrize("op_cls", [OpFromGraph, GpuOpFromGraph], ids=lambda c: c.__name__)
def test_opfromgraph_inferred_shape_equals_computed_shape(op_cls):
    for c in CASES[op_cls]:
        (_gpu_check if c.twin is not None else _host_check)(op_cls, c)

# ----------------------------------------------------------------------------- linear algebra
# symgpu.tensor.nlinalg, symgpu.tensor.slinalg, symgpu.sandbox.linalg (one case list per op
# class; test_linalg_inferred_shapes runs them, as the table's parametrisation is made above)
from symgpu.sandbox import linalg as _SB  # noqa: E402
from symgpu.tensor import nlinalg as _NL, slinalg as _SL  # noqa: E402


def _spd(*batch, n=3):
    a = rng.standard_normal(batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


_LINALG_CASES = {
    _NL.MatrixInverse: [case(_NL.matrix_inverse, _spd()), case(_NL.matrix_inverse, _spd(2))],
    _NL.MatrixPinv: [case(_NL.pinv, r(4, 3)), case(_NL.pinv, r(2, 3, 5))],
    _NL.Det: [case(_NL.det, _spd()), case(_NL.det, _spd(2, 2))],
    _NL.Eig: [case(_NL.eig, r(3, 3)), case(_NL.eig, r(2, 3, 3))],
    _NL.Eigh: [case(_NL.eigh, _spd()), case(lambda x: _NL.eigh(x, "U"), _spd(2))],
    _NL.EighGrad: [case(lambda x, w, v, gw, gv: _NL.EighGrad("L")(x, w, v, gw, gv), _spd(),
                        np.arange(3.0), r(3, 3), r(3), r(3, 3))],
    _NL.QRFull: [case(lambda x: _NL.qr(x, m), r(*s)) for m in ("reduced", "complete", "raw")
                 for s in ((5, 3), (3, 5))] + [case(_NL.qr, r(2, 4, 3))],
    _NL.QRIncomplete: [case(lambda x: _NL.qr(x, "r"), r(5, 3)), case(lambda x: _NL.qr(x, "r"),
                                                                    r(2, 3, 5))],
    _NL.SVD: [case(lambda x: _NL.svd(x, f, c), r(*s)) for f in (True, False) for c in (True, False)
              for s in ((5, 3), (3, 5), (2, 4, 3))],
    _NL.Lstsq: [case(lambda a, b: _NL.lstsq()(a, b, -1), r(6, 3), r(6)),
                case(lambda a, b: _NL.lstsq()(a, b, -1), r(3, 5), r(3, 2))],
    _NL.TensorInv: [case(lambda a: _NL.tensorinv(a, 2), np.eye(6).reshape(2, 3, 6)),
                    case(lambda a: _NL.tensorinv(a, 1), np.eye(6).reshape(6, 2, 3))],
    _NL.TensorSolve: [case(_NL.tensorsolve, np.eye(6).reshape(2, 3, 6), r(2, 3)),
                      case(lambda a, b: _NL.tensorsolve(a, b, (0,)),
                           np.moveaxis(np.eye(6).reshape(2, 3, 2, 3), 3, 0).copy(), r(2, 3))],
    _SL.Cholesky: [case(_SL.cholesky, _spd()), case(_SL.Cholesky(lower=False), _spd(2))],
    _SL.Solve: [case(_SL.solve, _spd(), r(3)), case(_SL.solve_lower_triangular, _spd(), r(3, 2)),
                case(_SL.solve, _spd(2), r(2, 3, 4)), case(_SL.solve, _spd(2), r(2, 3))],
    _SL.SolveTriangular: [case(_SL.solve_triangular, _spd(), r(3, 2)),
                          case(lambda a, b: _SL.solve_triangular(a, b, 1, True), _spd(2), r(2, 3))],
    _SL.CholeskySolve: [case(lambda c, b: _SL.cho_solve((c, True), b), np.linalg.cholesky(_spd()),
                             r(3, 4))],
    _SL.Eigvalsh: [case(_SL.eigvalsh, _spd()), case(_SL.eigvalsh, _spd(), _spd())],
    _SL.EigvalshGrad: [case(lambda a, b, g: _SL.EigvalshGrad()(a, b, g)[0], _spd(), _spd(), r(3)),
                       case(lambda a, g: _SL.EigvalshGrad()(a, g), _spd(), r(3))],
    _SL.Expm: [case(_SL.expm, r(3, 3)), case(_SL.expm, r(2, 3, 3))],
    _SL.ExpmGrad: [case(lambda a, g: _SL.ExpmGrad()(a, g), r(3, 3), r(3, 3))],
    _SB.Hint: [case(_SB.psd, _spd())],
}
CASES.update(_LINALG_CASES)


@pytest.mark.parametrize("op_cls", sorted(_LINALG_CASES, key=lambda c: (c.__module__, c.__name__)),
                         ids=lambda c: c.__name__)
def test_linalg_inferred_shapes(op_cls):
    for c in _LINALG_CASES[op_cls]:
        _host_check(op_cls, c)

# ---------------------------------------------------------------- fft, sort (topk), neighbours
# (symgpu.tensor.fft, symgpu.tensor.sort, symgpu.tensor.nnet.neighbours)
from symgpu.tensor import fft as _fft  # noqa: E402
_srt = importlib.import_module("symgpu.tensor.sort")  # T.sort: the function or this module
from symgpu.tensor.nnet import neighbours as _nb  # noqa: E402

CASES.update({
    _fft.RFFTOp: [case(lambda x: _fft.rfft_op(x), r(2, 7)), case(lambda x: _fft.rfft_op(x), r(2, 3, 4))],
    _fft.IRFFTOp: [case(lambda x: _fft.irfft_op(x), r(2, 5, 2)),
                   case(lambda x: _fft.irfft_op(x, T.stack([x.shape[1], 2 * x.shape[2] - 1])),
                        r(2, 3, 4, 2))],
    _srt.TopKOp: [case(lambda x, k: list(_srt.topk_and_argtopk(x, k, axis=0)), r(5, 3), i64(-2)),
                  case(lambda x: _srt.argtopk(x, 3), r(2, 4))],
    _nb.Images2Neibs: [case(lambda x: _nb.images2neibs(x, (2, 3), (1, 2), mode=m), r(2, 3, 6, 7))
                       for m in ("valid", "ignore_borders", "half")]
    + [case(lambda x: _nb.images2neibs(x, (3, 3), (2, 2), mode="wrap_centered"), r(1, 2, 5, 6)),
       case(lambda x: _nb.images2neibs(x, (2, 3), (1, 2), mode="full"), r(1, 2, 5, 7))],
    _nb.Images2NeibsGrad: [case(lambda g, x: _nb.Images2NeibsGrad("half")(g, x, (3, 3), (2, 2)),
                                r(2 * 3 * 3 * 4, 9), r(2, 3, 5, 7))],
})

_FFT_SORT_NEIBS = [_fft.RFFTOp, _fft.IRFFTOp, _srt.TopKOp, _nb.Images2Neibs, _nb.Images2NeibsGrad]


# test_inferred_shape_equals_computed_shape was parametrized before this block extended CASES
@pytest.mark.parametrize("op_cls", _FFT_SORT_NEIBS, ids=lambda c: c.__name__)
def test_inferred_shape_fft_sort_neighbours(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)

# ----------------------------------------------------------------------------- sparse
# symgpu.sparse (scipy.sparse values; the table's parametrisation is made above, so
# test_sparse_inferred_shapes checks these with the sparse inputs the cases declare)
import scipy.sparse as _ssp  # noqa: E402
import symgpu.sparse as _SP  # noqa: E402


class _Sp:
    """A sparse input value: the case builds a symbolic sparse matrix of its format."""

    def __init__(self, value):
        self.value = value


def _spv(m, n, fmt="csr", seed=0):
    a = _ssp.random(m, n, density=0.5, format=fmt, random_state=seed)
    a.data += 0.5
    return _Sp(a)


def _idx(*v):
    return np.asarray(v, dtype="int64")


_SPARSE_CASES = {
    _SP.CSM: [case(lambda x: _SP.CSM("csr")(*_SP.csm_properties(x)), _spv(3, 4)),
              case(lambda x: _SP.CSM("csc")(*_SP.csm_properties(x)), _spv(4, 2, "csc"))],
    _SP.CSMGrad: [case(lambda x, g: _SP.CSMGrad()(*_SP.csm_properties(x), g), _spv(3, 4),
                       _spv(3, 4, seed=1))],
    _SP.CSMProperties: [case(lambda x: _SP.csm_properties(x), _spv(3, 4)),
                        case(lambda x: _SP.csm_properties(x), _spv(3, 5, "csc"))],
    _SP.SparseShape_i: [case(lambda x: _SP.SparseShape_i(1)(x), _spv(3, 4))],
    _SP.SpNnz: [case(lambda x: _SP.SpNnz()(x), _spv(3, 4))],
    _SP.DenseFromSparse: [case(_SP.dense_from_sparse, _spv(3, 4, "csc"))],
    _SP.SparseFromDense: [case(_SP.csr_from_dense, r(3, 4)), case(_SP.csc_from_dense, r(2, 5))],
    _SP.Cast: [case(lambda x: _SP.cast(x, "float32"), _spv(3, 4))],
    _SP.Transpose: [case(_SP.transpose, _spv(3, 4)), case(_SP.transpose, _spv(2, 5, "csc"))],
    _SP.Neg: [case(_SP.neg, _spv(3, 4))],
    _SP.Remove0: [case(_SP.remove0, _spv(3, 4))],
    _SP.ConstructSparseFromList: [case(_SP.construct_sparse_from_list, r(5, 3), r(4, 3),
                                       _idx(0, 4, 4, 1))],
    _SP.SparseGradSubtensor1: [case(lambda x, i: _SP.SparseGradSubtensor1()(x, i), r(5, 3),
                                    _idx(0, 4, 4, 1))],
    _SP.AddSS: [case(_SP.add, _spv(3, 4), _spv(3, 4, seed=2))],
    _SP.AddSD: [case(_SP.add, _spv(3, 4), r(3, 4))],
    _SP.MulSS: [case(_SP.mul, _spv(3, 4), _spv(3, 4, seed=2))],
    _SP.MulSD: [case(_SP.mul, _spv(3, 4), r(3, 4)), case(_SP.mul, _spv(3, 4), r(4))],
    _SP.StructuredDot: [case(_SP.structured_dot, _spv(3, 4), r(4, 2)),
                        case(_SP.structured_dot, _spv(3, 4, "csc"), _spv(4, 5))],
    _SP.StructuredDotGrad: [case(lambda a, b, g: _SP.StructuredDotGrad()(a, b, g), _spv(3, 4),
                                 r(4, 2), r(3, 2))],
    _SP.Dot: [case(_SP.dot, _spv(3, 4), r(4, 2)), case(_SP.dot, _spv(3, 4), r(4)),
              case(_SP.dot, r(3), _spv(3, 4)), case(_SP.dot, _spv(3, 4), _spv(4, 5))],
    _SP.TrueDot: [case(_SP.true_dot, _spv(3, 4), _spv(4, 2, "csc")),
                  case(_SP.true_dot, _spv(3, 4), r(4, 6))],
    _SP.SpSum: [case(lambda x: _SP.sp_sum(x, a), _spv(3, 4)) for a in (None, 0, 1)],
}
CASES.update(_SPARSE_CASES)


def _sparse_check(op_cls, c: Case):
    ins, vals = [], []
    for v, b in c.values:
        if isinstance(v, _Sp):
            ins.append(_SP.matrix(v.value.format, dtype=str(v.value.dtype)))
            vals.append(v.value)
        else:
            ins.append(var_for(v, b))
            vals.append(v)
    outs = c.build(*ins)
    outs = outs if isinstance(outs, list) else [outs]
    node = outs[0].owner
    assert type(node.op) is op_cls, f"the case builds {node.op}, not a {op_cls.__name__}"
    want = [np.shape(o) for o in function(ins, list(node.outputs), on_unused_input="ignore")(*vals)]
    flat = _flat(node_shapes(node))
    f = function(ins, flat, on_unused_input="ignore") if flat else (lambda *a: [])
    assert [int(g) for g in f(*vals)] == [d for w in want for d in w], str(node.op)
    if flat:  # the shape needs nothing of the op's own computation
        assert not any(n.op == node.op and n.inputs == node.inputs
                       for n in f.maker.fgraph.toposort()), str(node.op)


@pytest.mark.parametrize("op_cls", sorted(_SPARSE_CASES, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_sparse_inferred_shapes(op_cls):
    for c in _SPARSE_CASES[op_cls]:
        _sparse_check(op_cls, c)

# ----------------------------------------------------------------------------- 3-d conv / pooling
# symgpu.tensor.nnet.abstract_conv's Conv3d ops and symgpu.tensor.signal.pool's 3-d pooling ops
# (test_conv3d_pool3d_inferred_shapes runs them, as the table's parametrisation is made above)
IMG3, KERN3, GY3 = r(2, 3, 7, 6, 5), r(4, 3, 3, 2, 3), r(2, 4, 3, 3, 2)  # subsample (2, 2, 1)
PX3, PZ3 = r(2, 5, 6, 4), r(2, 2, 3, 2)                                     # 2x2x2 pooling
_SUB3 = dict(subsample=(2, 2, 1))

_CONV3D_POOL3D_CASES = {
    _conv.Conv3d: [case(lambda x, w: _conv.conv3d(x, w, border_mode="half", subsample=(2, 1, 2)),
                        IMG3, KERN3),
                   case(lambda x, w: _conv.conv3d(x, w, **_SUB3), IMG3, KERN3),
                   case(lambda x, w: _conv.conv3d(x, w, border_mode=((1, 0), 2, 0),
                                                  filter_dilation=(1, 2, 1)), IMG3, KERN3)],
    _conv.Conv3dGradInputs: [case(lambda w, g, h: _conv.Conv3dGradInputs(**_SUB3)(w, g, [h, h, 4]),
                                  KERN3, GY3, i64(7))],
    _conv.Conv3dGradWeights: [case(lambda x, g, k: _conv.Conv3dGradWeights(**_SUB3)(x, g,
                                                                                    [k, 2, 4]),
                                   IMG3, GY3, i64(3))],
    _pool.Pool3d: [case(lambda x: _pool.pool_3d(x, ws=(2, 3, 2), ignore_border=False), PX3),
                   case(lambda x: _pool.pool_3d(x, ws=(3, 3, 2), stride=(2, 2, 1), pad=(1, 1, 0)),
                        r(2, 3, 7, 6, 5))],
    _pool.MaxPoolGrad3d: [case(lambda x, z, g: _pool.MaxPoolGrad3d(ws=(2, 2, 2))(x, z, g),
                               PX3, PZ3, PZ3)],
    _pool.MaxPoolGradGrad3d: [case(lambda x, z, g: _pool.MaxPoolGradGrad3d(ws=(2, 2, 2))(x, z, g),
                                   PX3, PZ3, PX3)],
    _pool.AveragePoolGrad3d: [case(lambda x, g: _pool.AveragePoolGrad3d(
        ws=(2, 2, 2), mode="average_exc_pad")(x, g), PX3, PZ3)],
}
CASES.update(_CONV3D_POOL3D_CASES)


@pytest.mark.parametrize("op_cls", sorted(_CONV3D_POOL3D_CASES, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_conv3d_pool3d_inferred_shapes(op_cls):
    for c in _CONV3D_POOL3D_CASES[op_cls]:
        _host_check(op_cls, c)

# ----------------------------------------------------------------------------- block sparse
# symgpu.tensor.nnet.blocksparse (test_blocksparse_inferred_shapes runs them, as the table's
# parametrisation is made above)
from symgpu.tensor.nnet import blocksparse as _bsp  # noqa: E402


def _bidx(n, *shape):
    return rng.randint(0, n, size=shape).astype("int32")


_BLOCKSPARSE_CASES = {
    _bsp.SparseBlockGemv: [case(_bsp.sparse_block_gemv, r(2, 3, 5), r(8, 7, 6, 5), r(2, 4, 6),
                                _bidx(8, 2, 4), _bidx(7, 2, 3)),
                           case(lambda W, h, i, b, o: _bsp.sparse_block_dot(W, h, i, b, o),
                                r(4, 3, 2, 5), r(1, 2, 2), _bidx(4, 1, 2), r(3, 5),
                                _bidx(3, 1, 3))],
    _bsp.SparseBlockOuter: [case(_bsp.sparse_block_outer, r(8, 7, 6, 5), r(2, 4, 6), r(2, 3, 5),
                                 _bidx(8, 2, 4), _bidx(7, 2, 3))],
}
CASES.update(_BLOCKSPARSE_CASES)


@pytest.mark.parametrize("op_cls", sorted(_BLOCKSPARSE_CASES, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_blocksparse_inferred_shapes(op_cls):
    for c in _BLOCKSPARSE_CASES[op_cls]:
        _host_check(op_cls, c)

# ----------------------------------------------------------------------------- typed lists
# symgpu.typed_list: a list has no shape (its type has no ndim), so the ops returning lists,
# and GetItem of one element (whose shape the list's type does not know), raise ShapeError
# and the shape rewrite leaves reads of them alone; Length, Index and Count give 0-d int64.
# (test_typed_list_inferred_shapes runs them; a list input is given as a Python list.)
import symgpu.typed_list as _tl  # noqa: E402

_TLV = [r(3), r(3), r(3)]
_TL_CASES = {
    _tl.GetItem: [case(lambda x, i: x[i], _TLV, i64(1)), case(lambda x: x[1:], _TLV)],
    _tl.Append: [case(lambda x, e: x.append(e), _TLV, r(3)),
                 case(lambda x, e: _tl.Append(inplace=True)(x, e), _TLV, r(3))],
    _tl.Extend: [case(lambda x: x.extend(x), _TLV)],
    _tl.Insert: [case(lambda x, e: x.insert(1, e), _TLV, r(3))],
    _tl.Remove: [case(lambda x: x.remove(x[0]), _TLV)],
    _tl.Reverse: [case(lambda x: x.reverse(), _TLV)],
    _tl.Index: [case(lambda x: x.ind(x[2]), _TLV)],
    _tl.Count: [case(lambda x: x.count(x[2]), _TLV)],
    _tl.Length: [case(lambda x: _tl.length(x), _TLV)],
    _tl.MakeList: [case(lambda a, b: _tl.make_list([a, b]), r(2, 3), r(2, 3))],
}
CASES.update(_TL_CASES)


def _tl_check(op_cls, c: Case):
    ins = [_tl.TypedListType(var_for(v[0]).type)() if isinstance(v, list) else var_for(v, b)
           for v, b in c.values]
    vals = [v for v, _ in c.values]
    node = c.build(*ins).owner
    assert type(node.op) is op_cls, f"the case builds {node.op}, not a {op_cls.__name__}"
    if not hasattr(node.outputs[0].type, "ndim") or op_cls is _tl.GetItem:
        with pytest.raises(ShapeError):
            node_shapes(node)
        return
    want = [np.shape(o) for o in function(ins, list(node.outputs))(*vals)]
    assert node_shapes(node) == want == [()], str(node.op)


@pytest.mark.parametrize("op_cls", sorted(_TL_CASES, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_typed_list_inferred_shapes(op_cls):
    for c in _TL_CASES[op_cls]:
        _tl_check(op_cls, c)

# ----------------------------------------------------------------------------- 3-d GPU conv / pooling
# symgpu.gpu.ops.conv's GpuConv3d* and symgpu.gpu.ops.pooling's 3-d ops, on a virtual context
# (test_gpu_conv3d_pool3d_inferred_shapes runs them)
_GPU3D_CASES = {
    G["GpuConv3d"]: [gcase(lambda x, w: G["GpuConv3d"](**_SUB3)(x, w),
                           lambda x, w: _conv.conv3d(x, w, **_SUB3), "gg", IMG3, KERN3),
                     gcase(lambda x, w: G["GpuConv3d"](border_mode=((1, 0), 2, 0))(x, w),
                           lambda x, w: _conv.conv3d(x, w, border_mode=((1, 0), 2, 0)), "gg",
                           IMG3, KERN3)],
    G["GpuConv3dGradInputs"]: [gcase(lambda w, g, h: G["GpuConv3dGradInputs"](**_SUB3)(w, g, [h, h, 4]),
                                     lambda w, g, h: _conv.Conv3dGradInputs(**_SUB3)(w, g, [h, h, 4]),
                                     "ggh", KERN3, GY3, i64(7))],
    G["GpuConv3dGradWeights"]: [gcase(lambda x, g, k: G["GpuConv3dGradWeights"](**_SUB3)(x, g, [k, 2, 4]),
                                      lambda x, g, k: _conv.Conv3dGradWeights(**_SUB3)(x, g, [k, 2, 4]),
                                      "ggh", IMG3, GY3, i64(3))],
    G["GpuPool3d"]: [gcase(lambda x: G["GpuPool3d"](ws=(2, 3, 2), ignore_border=False)(x),
                           lambda x: _pool.pool_3d(x, ws=(2, 3, 2), ignore_border=False), "g",
                           PX3)],
    G["GpuMaxPoolGrad3d"]: [gcase(lambda x, z, g: G["GpuMaxPoolGrad3d"](ws=(2, 2, 2))(x, z, g),
                                  lambda x, z, g: x, "ggg", PX3, PZ3, PZ3)],
    G["GpuMaxPoolGradGrad3d"]: [gcase(lambda x, z, g: G["GpuMaxPoolGradGrad3d"](ws=(2, 2, 2))(x, z, g),
                                      lambda x, z, g: z, "ggg", PX3, PZ3, PX3)],
    G["GpuAveragePoolGrad3d"]: [gcase(lambda x, g: G["GpuAveragePoolGrad3d"](
        ws=(2, 2, 2), mode="sum")(x, g), lambda x, g: x, "gg", PX3, PZ3)],
}
CASES.update(_GPU3D_CASES)


@pytest.mark.parametrize("op_cls", sorted(_GPU3D_CASES, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_gpu_conv3d_pool3d_inferred_shapes(op_cls):
    for c in _GPU3D_CASES[op_cls]:
        _gpu_check(op_cls, c)


# ----------------------------------------------------------------------------- CTC
# symgpu.tensor.nnet.ctc and its cuDNN twin (test_ctc_inferred_shapes runs them, as the
# table's parametrisation is made above); the GPU case checks the costs' shape
from symgpu.tensor.nnet import ctc as _ctc  # noqa: E402

_CTC_ACTS = r(5, 2, 4, dtype="float32")
_CTC_LABELS = np.array([[1, 2, -1], [3, -1, 3]], dtype="int32")
_CTC_LENGTHS = np.array([5, 4], dtype="int32")
_CTC_CASES = {
    _ctc.ConnectionistTemporalClassification: [
        case(_ctc.ctc, _CTC_ACTS, _CTC_LABELS, _CTC_LENGTHS),
        case(lambda a, l, n: _ctc.ConnectionistTemporalClassification(False)(a, l, n),
             _CTC_ACTS, _CTC_LABELS, _CTC_LENGTHS)],
}
_gctc = importlib.import_module("symgpu.gpu.ops.ctc")
_CTC_CASES[_gctc.GpuConnectionistTemporalClassification] = [
    gcase(lambda a, l, n: _gctc.GpuConnectionistTemporalClassification()(a, l, n), _ctc.ctc,
          "ggg", _CTC_ACTS, _CTC_LABELS, _CTC_LENGTHS)]
CASES.update(_CTC_CASES)


@pytest.mark.parametrize("op_cls", sorted(_CTC_CASES, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_ctc_inferred_shapes(op_cls):
    for c in _CTC_CASES[op_cls]:
        (_gpu_check if c.twin is not None else _host_check)(op_cls, c)



# ---------------------------------------------------------------- GPU linear algebra
# (symgpu/gpu/ops/linalg.py: each op's rule is its host twin's)
import symgpu.gpu.ops.linalg as _GL  # noqa: E402

_GPU_LINALG_CASES = {
    _GL.GpuCholesky: [gcase(lambda x: _GL.GpuCholesky()(x), _SL.cholesky, "g", _spd(2))],
    _GL.GpuSolve: [gcase(lambda a, b: _GL.GpuSolve()(a, b), _SL.solve, "gg", _spd(2), r(2, 3)),
                   gcase(lambda a, b: _GL.GpuSolve()(a, b), _SL.solve, "gg", _spd(), r(3, 4))],
    _GL.GpuSolveTriangular: [gcase(lambda a, b: _GL.GpuSolveTriangular(1, True)(a, b),
                                   _SL.solve_triangular, "gg", _spd(), r(3, 2))],
    _GL.GpuCholeskySolve: [gcase(lambda c, b: _GL.GpuCholeskySolve()(c, b),
                                 lambda c, b: _SL.cho_solve((c, True), b), "gg",
                                 np.linalg.cholesky(_spd()), r(3, 4))],
    _GL.GpuEigh: [gcase(lambda x: _GL.GpuEigh()(x)[0], lambda x: _NL.eigh(x)[0], "g", _spd(2))],
    _GL.GpuEigvalsh: [gcase(lambda x: _GL.GpuEigvalsh()(x), _SL.eigvalsh, "g", _spd())],
    _GL.GpuEighGrad: [gcase(lambda x, w, v, gw, gv: _GL.GpuEighGrad()(x, w, v, gw, gv),
                            lambda x, w, v, gw, gv: x, "ggggg", _spd(), np.arange(3.0),
                            r(3, 3), r(3), r(3, 3))],
    _GL.GpuMatrixInverse: [gcase(lambda x: _GL.GpuMatrixInverse()(x), _NL.matrix_inverse, "g",
                                 _spd(2))],
    _GL.GpuDet: [gcase(lambda x: _GL.GpuDet()(x), _NL.det, "g", _spd(2))],
}
CASES.update(_GPU_LINALG_CASES)


@pytest.mark.parametrize("op_cls", sorted(_GPU_LINALG_CASES, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_gpu_linalg_inferred_shapes(op_cls):
    for c in _GPU_LINALG_CASES[op_cls]:
        _gpu_check(op_cls, c)


# ----------------------------------------------------------------------------- GPU sparse
# symgpu.gpu.placement.sparse_type and symgpu.gpu.ops.sparse: GPU sparse values cannot be
# made without a GPU, so each op's rule is checked on given input shapes against the shape
# SciPy's product (or the transfer, transpose, structured gradient) has.
from symgpu.gpu.ops import sparse as _gsp  # noqa: E402
from symgpu.gpu.placement import sparse_type as _gst  # noqa: E402

_GSP = _gst.GpuSparseType("csr", "float32")
_GD = lambda: symgpu.gpu.GpuArrayType("float32", (False, False))()  # noqa: E731
_GPU_SPARSE_CASES = {
    _gsp.GpuSpMM: [(lambda: _gsp.GpuSpMM(False, True)(_GSP(), _GD()), [(5, 4), (4, 3)], (5, 3)),
                   (lambda: _gsp.GpuSpMM(True, True)(_GSP(), _GD()), [(5, 4), (5, 3)], (4, 3)),
                   (lambda: _gsp.GpuSpMM(False, False)(_GSP(), _GD()), [(5, 4), (2, 5)], (2, 4)),
                   (lambda: _gsp.GpuSpMM(True, False)(_GSP(), _GD()), [(5, 4), (2, 4)], (2, 5))],
    _gsp.GpuSparseTranspose: [(lambda: _gsp.GpuSparseTranspose()(_GSP()), [(5, 4)], (4, 5))],
    _gsp.GpuStructuredDotGrad: [(lambda: _gsp.GpuStructuredDotGrad()(_GSP(), _GD(), _GD()),
                                 [(5, 4), (4, 3), (5, 3)], (5, 4))],
    _gst.GpuSparseFromHost: [(lambda: _gst.GpuSparseFromHost()(_SP.csr_matrix(dtype="float32")),
                              [(5, 4)], (5, 4))],
    _gst.HostFromGpuSparse: [(lambda: _gst.HostFromGpuSparse()(_GSP()), [(5, 4)], (5, 4))],
}
CASES.update({k: [] for k in _GPU_SPARSE_CASES})


@pytest.mark.parametrize("op_cls", sorted(_GPU_SPARSE_CASES, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_gpu_sparse_inferred_shapes(op_cls):
    for build, in_shapes, want in _GPU_SPARSE_CASES[op_cls]:
        node = build().owner
        assert type(node.op) is op_cls
        got = node.op.infer_shape(None, node, [tuple(T.constant(np.int64(n)) for n in s)
                                               for s in in_shapes])
        assert [tuple(int(v.data) for v in got[0])] == [want], str(node.op)



# ---------------------------------------------------------------- GPU FFTs (symgpu.gpu.ops.fft)
from symgpu.gpu.ops import fft as _gfft  # noqa: E402

_GPU_FFT_CASES = {
    _gfft.GpuRFFT: [gcase(lambda x, s: _gfft.GpuRFFT()(x, s), lambda x, s: _fft.rfft_op(x, s),
                          "gh", r(2, 7), i64([7])),
                    gcase(lambda x, s: _gfft.GpuRFFT()(x, s), lambda x, s: _fft.rfft_op(x, s),
                          "gh", r(2, 3, 4), i64([3, 4]))],
    _gfft.GpuIRFFT: [gcase(lambda x, s: _gfft.GpuIRFFT()(x, s), lambda x, s: _fft.irfft_op(x, s),
                           "gh", r(2, 5, 2), i64([9])),
                     gcase(lambda x, s: _gfft.GpuIRFFT()(x, s), lambda x, s: _fft.irfft_op(x, s),
                           "gh", r(2, 3, 4, 2), i64([3, 6]))],
}
CASES.update(_GPU_FFT_CASES)


@pytest.mark.parametrize("op_cls", sorted(_GPU_FFT_CASES, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_inferred_shape_gpu_fft(op_cls):
    for c in _GPU_FFT_CASES[op_cls]:
        _gpu_check(op_cls, c)



# ---------------------------------------------------------------- sort / topk on the GPU
# (symgpu/gpu/ops/sort.py) and the host ScatterAlongAxis of topk's gradient
from symgpu.gpu.ops import sort as _gsort  # noqa: E402

_SORT_CASES = {
    _srt.ScatterAlongAxis: [case(lambda x, i, g: _srt.ScatterAlongAxis(1)(x, i, g), r(2, 4),
                                 i64([[3, 0], [1, 2]]), r(2, 2))],
    _gsort.GpuArgSort: [gcase(lambda x: _gsort.GpuArgSort(0)(x), lambda x: T.argsort(x, 0),
                              "g", r(3, 4))],
    _gsort.GpuTopK: [gcase(lambda x, k: _gsort.GpuTopK(0).make_node(x, k).outputs[0],
                           lambda x, k: _srt.topk_and_argtopk(x, k, axis=0)[0], "gh",
                           r(5, 3), i64(-2))],
    _gsort.GpuScatterAlongAxis: [gcase(lambda x, i, g: _gsort.GpuScatterAlongAxis(1)(x, i, g),
                                       lambda x, i, g: _srt.ScatterAlongAxis(1)(x, i, g),
                                       "ggg", r(2, 4), i64([[3, 0], [1, 2]]), r(2, 2))],
}
CASES.update(_SORT_CASES)


@pytest.mark.parametrize("op_cls", list(_SORT_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_gpu_sort(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


# ----------------------------------------------------------------------------- Theano's io, breakpoint
# symgpu.tensor.io's LoadFromDisk has no shape rule (its shape is the file's: ShapeError, and
# x.shape is read from the loaded array); symgpu.misc.breakpoint's PdbBreakpoint gives its
# monitored inputs' shapes (test_io_breakpoint_inferred_shapes runs them)
from symgpu.misc import breakpoint as _bp  # noqa: E402
from symgpu.tensor import io as _tio  # noqa: E402

_IO_BP_CASES = {
    _bp.PdbBreakpoint: [case(lambda c, x, m: _bp.PdbBreakpoint("b")(c, x, m), i64(0), r(3),
                             r(2, 4)),
                        case(lambda c, x: [_bp.PdbBreakpoint("b")(c, x)], i64(1), r(2, 1))],
    _tio.LoadFromDisk: [],  # run below: it needs a file
}
CASES.update(_IO_BP_CASES)


def test_io_breakpoint_inferred_shapes(tmp_path, monkeypatch):
    monkeypatch.setattr(_bp, "enter_debugger", lambda name, monitored: None)
    for c in _IO_BP_CASES[_bp.PdbBreakpoint]:
        _host_check(_bp.PdbBreakpoint, c)
    path = tmp_path / "a.npy"
    np.save(path, r(3, 1))
    x = _tio.load(str(path), "float64", (False, True))
    with pytest.raises(ShapeError):
        node_shapes(x.owner)
    assert tuple(function([], x.shape)()) == (3, 1)


# ---------------------------------------------------------------- Poisson draws (raw_random.poisson)
_POISSON_CASES = {
    _rnd.PoissonFromUniform: [case(lambda lam, u: _rnd.PoissonFromUniform()(lam, u),
                                   np.abs(r(2, 5)) * 3, np.abs(r(2, 5))),
                              case(lambda lam, u: _rnd.PoissonFromUniform("int32")(lam, u),
                                   np.float64(2.5), np.abs(r(4, 3)))],
}
CASES.update(_POISSON_CASES)


@pytest.mark.parametrize("op_cls", list(_POISSON_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_poisson(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


# ---------------------------------------------------------------- collectives (symgpu.distributed)
# host ops on the group "self" (a world of one, so they run here); the GPU twins' rules for a
# world of two against host expressions of the same shapes
import symgpu.distributed as _dist  # noqa: E402
from symgpu.gpu.ops import collectives as _coll  # noqa: E402

_COLLECTIVE_CASES = {
    _dist.AllReduce: [case(lambda x: _dist.AllReduce("avg", "self")(x), r(3, 2))],
    _dist.Broadcast: [case(lambda x: _dist.Broadcast(0, "self")(x), r(4))],
    _dist.AllGather: [case(lambda x: _dist.AllGather(1, "self")(x), r(2, 5))],
    _dist.ReduceScatter: [case(lambda x: _dist.ReduceScatter("sum", 1, "self")(x), r(4, 3))],
    _coll.GpuAllReduce: [gcase(lambda x: _coll.GpuAllReduce("sum", "self")(x), lambda x: x * 1,
                               "g", r(3, 2, dtype="float32"))],
    _coll.GpuBroadcast: [gcase(lambda x: _coll.GpuBroadcast(1, "self")(x), lambda x: x * 1,
                               "g", r(5, dtype="float32"))],
    _coll.GpuAllGather: [gcase(lambda x: _coll.GpuAllGather(2, "self")(x),
                               lambda x: T.concatenate([x, x]), "g", r(3, 2, dtype="float32"))],
    _coll.GpuReduceScatter: [gcase(lambda x: _coll.GpuReduceScatter("sum", 2, "self")(x),
                                   lambda x: x[:2], "g", r(4, 3, dtype="float32"))],
}
CASES.update(_COLLECTIVE_CASES)


@pytest.mark.parametrize("op_cls", list(_COLLECTIVE_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_collectives(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


# ---------------------------------------------------------------- the product with a bias/ReLU/GELU epilogue
from symgpu.gpu.ops.gemm_epilogue import GpuGemmEpilogue as _GpuGemmEpilogue  # noqa: E402

_EPILOGUE_CASES = {
    _GpuGemmEpilogue: [gcase(lambda A, B, b: _GpuGemmEpilogue("relu_bias")(A, B, b),
                             lambda A, B, b: T.nnet.relu(T.dot(A, B) + b), "ggg",
                             r(3, 4, dtype="float32"), r(4, 2, dtype="float32"),
                             r(2, dtype="float32")),
                       # (the first output's shape: the second's, the pre-activation's,
                       # is checked in test_gpu_gemm_epilogue_gelu.py)
                       gcase(lambda A, B, b: _GpuGemmEpilogue("gelu_aux_bias")(A, B, b)[0],
                             lambda A, B, b: T.dot(A, B) + b, "ggg",
                             r(3, 4, dtype="float32"), r(4, 2, dtype="float32"),
                             r(2, dtype="float32")),
                       gcase(lambda A, B, a: _GpuGemmEpilogue("dgelu")(A, B, a),
                             lambda A, B, a: T.dot(A, B) * a, "ggg",
                             r(3, 4, dtype="float32"), r(4, 2, dtype="float32"),
                             r(3, 2, dtype="float32"))],
}
CASES.update(_EPILOGUE_CASES)


@pytest.mark.parametrize("op_cls", list(_EPILOGUE_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_gemm_epilogue(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


# ---------------------------------------------------------------- fused attention
from symgpu.tensor.nnet import attention as _AT  # noqa: E402
from symgpu.gpu.ops import attention as _GAT  # noqa: E402
from symgpu.gpu.ops import attention_join as _GATJ  # noqa: E402

_f32 = lambda *s: r(*s, dtype="float32")  # noqa: E731
_ATTENTION_CASES = {
    _AT.Attention: [case(lambda q, k, v: _AT.Attention(True)(q, k, v), r(2, 3, 4), r(2, 5, 4),
                         r(2, 5, 6)),
                    case(lambda q, k, v, m: _AT.Attention(False, .5, True).make_node(
                        q, k, v, m).outputs[1], r(1, 2, 3, 4), r(1, 2, 5, 4), r(1, 2, 5, 4),
                        r(3, 5))],
    _AT.AttentionGrad: [case(lambda q, k, v, o, l, g: _AT.AttentionGrad()(q, k, v, o, l, g)[1],
                             r(2, 3, 4), r(2, 5, 4), r(2, 5, 4), r(2, 3, 4), r(2, 3),
                             r(2, 3, 4))],
    _GAT.GpuAttention: [gcase(lambda q, k, v: _GAT.GpuAttention(True)(q, k, v),
                              lambda q, k, v: _AT.Attention(True)(q, k, v), "ggg",
                              _f32(2, 3, 4), _f32(2, 5, 4), _f32(2, 5, 4))],
    _GAT.GpuAttentionGrad: [gcase(
        lambda q, k, v, o, l, g: _GAT.GpuAttentionGrad()(q, k, v, o, l, g)[0],
        lambda q, k, v, o, l, g: _AT.AttentionGrad()(q, k, v, o, l, g)[0], "gggggg",
        _f32(2, 3, 4), _f32(2, 5, 4), _f32(2, 5, 4), _f32(2, 3, 4), _f32(2, 3),
        _f32(2, 3, 4))],
}


def _attention_grad_join_twin(q, k, v, o, l, g, s0, s1, s2, after):
    grads = _AT.AttentionGrad()(q, k, v, o, l, g)
    merged = [x.dimshuffle(0, 2, 1, 3).reshape(s, ndim=3) for x, s in zip(grads, (s0, s1, s2))]
    return T.concatenate(merged + [after], axis=2)


_half = lambda *s: np.full(s, 0.5, "float32")  # noqa: E731  (the module's random draws untouched)
_ATTENTION_CASES[_GATJ.GpuAttentionGradJoin] = [gcase(
    lambda *ins: _GATJ.GpuAttentionGradJoin(after=1)(*ins), _attention_grad_join_twin,
    "gggggghhhg", *[_half(1, 2, 3, 4)] * 4, _half(1, 2, 3), _half(1, 2, 3, 4),
    *[np.array([1, 3, 8], "int64")] * 3, _half(1, 3, 5))]
CASES.update(_ATTENTION_CASES)


@pytest.mark.parametrize("op_cls", list(_ATTENTION_CASES), ids=lambda c: c.__name__)
def test_attention_inferred_shapes(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


# ---------------------------------------------------------------- GPU QR, SVD and SpMV
# (symgpu/gpu/ops/linalg.py, sparse.py: QR and SVD follow their host twins, the first
# output checked as _gpu_check does; SpMV is checked on given shapes, as the other GPU
# sparse ops)
def _qr_case(mode, v):
    return gcase(lambda x: _GL.GpuQR(mode)(x)[0], lambda x: _NL.qr(x, mode)[0], "g", v)


def _svd_case(full, v):
    return gcase(lambda x: _GL.GpuSVD(full)(x)[0], lambda x: _NL.svd(x, full)[0], "g", v)


_GPU_QR_SVD_CASES = {
    _GL.GpuQR: [_qr_case(mode, v) for mode in ("reduced", "complete", "raw")
                for v in (r(5, 3), r(2, 3, 5))]
    + [gcase(lambda x: _GL.GpuQR("r")(x), lambda x: _NL.qr(x, "r"), "g", r(2, 4, 6))],
    _GL.GpuSVD: [_svd_case(full, v) for full in (True, False)
                 for v in (r(5, 3), r(2, 3, 5))]
    + [gcase(lambda x: _GL.GpuSVD(True, False)(x), lambda x: _NL.svd(x, compute_uv=False),
             "g", r(2, 4, 6))],
}
CASES.update(_GPU_QR_SVD_CASES)


@pytest.mark.parametrize("op_cls", sorted(_GPU_QR_SVD_CASES, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_gpu_qr_svd_inferred_shapes(op_cls):
    for c in _GPU_QR_SVD_CASES[op_cls]:
        _gpu_check(op_cls, c)


_GV = lambda: symgpu.gpu.GpuArrayType("float32", (False,))()  # noqa: E731
_GPU_SPMV_CASES = [(lambda: _gsp.GpuSpMV(True)(_GSP(), _GV()), [(5, 4), (4,)], (5,)),
                   (lambda: _gsp.GpuSpMV(False)(_GSP(), _GV()), [(5, 4), (5,)], (4,))]
CASES.update({_gsp.GpuSpMV: []})


def test_gpu_spmv_inferred_shapes():
    for build, in_shapes, want in _GPU_SPMV_CASES:
        node = build().owner
        assert type(node.op) is _gsp.GpuSpMV
        got = node.op.infer_shape(None, node, [tuple(T.constant(np.int64(n)) for n in s)
                                               for s in in_shapes])
        assert [tuple(int(v.data) for v in got[0])] == [want], str(node.op)


# ---------------------------------------------------------------- Theano's compile.ops, gradient
# stops and symbolic-axis sorts (the path layer's names: issue 31)
from symgpu.compile.deepcopy import DeepCopyOp as _DeepCopyOp, deep_copy_op as _deep_copy_op  # noqa: E402
from symgpu.compile import python_ops as _pyops  # noqa: E402
from symgpu.gradient import stops as _stops  # noqa: E402
from symgpu.tensor import extra_ops as _xops  # noqa: E402
from symgpu.tensor import theano_basic as _tb  # noqa: E402


def _same_shape(fgraph, node, shapes):
    return [shapes[0]]


_THEANO_OPS_CASES = {
    _DeepCopyOp: [case(lambda x: _deep_copy_op(x), r(3, 2))],
    _pyops.FromFunctionOp: [case(lambda x: _pyops.as_op([T.dmatrix], [T.dmatrix],
                                                        infer_shape=_same_shape)(np.exp)(x),
                                 r(3, 2))],
    _pyops.ViewOp: [case(lambda x: _pyops.view_op(x), r(3, 2))],
    _pyops.OutputGuard: [case(lambda x: _pyops.OutputGuard()(x * 2), r(3, 2))],
    _pyops.Rebroadcast: [case(lambda x: _pyops.Rebroadcast((0, True))(x), r(1, 4))],
    _tb.TensorFromScalar: [case(lambda x: _tb.tensor_from_scalar(x), r())],
    _tb.ScalarFromTensor: [case(lambda x: _tb.scalar_from_tensor(x), r())],
    _tb.Default: [case(lambda x, d: _tb.Default()(x, d), r(3, 2), r(3, 2))],
    _tb.PermuteRowElements: [case(lambda x, p: _tb.PermuteRowElements()(x, p, 0), r(3, 4),
                                  i64([[1, 0, 3, 2], [0, 1, 2, 3], [3, 2, 1, 0]]))],
    _tb.Split: [case(lambda x, a, s: _tb.Split(2)(x, a, s)[0], r(5, 3), i64(0), i64([2, 3]))],
    _tb.AllocEmpty: [case(lambda a, b: _tb.AllocEmpty("float64")(a, b), i64(3), i64(4))],
    _stops.GradClip: [case(lambda x: _stops.grad_clip(x, -1.0, 1.0), r(3))],
    _stops.GradScale: [case(lambda x: _stops.grad_scale(x, 2.0), r(3, 2))],
    _stops.UndefinedGrad: [case(lambda x: _stops.undefined_grad(x), r(4))],
    _xops.SortOp: [case(lambda x, a: _xops.SortOp("quicksort")(x, a), r(3, 4), i64(1))],
    _xops.ArgSortOp: [case(lambda x, a: _xops.ArgSortOp("quicksort")(x, a), r(3, 4), i64(0))],
    _xops.TakeAlongAxis: [case(lambda v, p, a: _xops.TakeAlongAxis()(v, p, a), r(3, 4),
                               i64(np.argsort(r(3, 4), axis=1)), i64(1))],
}
CASES.update(_THEANO_OPS_CASES)


@pytest.mark.parametrize("op_cls", list(_THEANO_OPS_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_theano_compile_ops(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


# ----------------------------------------------------------------------------- issue 33 (names-lib)
# Theano's sparse extras and sandbox, CholeskyGrad, theano.gpuarray.linalg's op classes
from symgpu.sparse import convolution as _SPC  # noqa: E402
from symgpu.sparse import sampling as _SPR  # noqa: E402
from symgpu.gpu.ops import theano_linalg as _TGL  # noqa: E402


def _probs():
    return _Sp(_ssp.csr_matrix(np.array([[0.2, 0.8, 0.0], [0.0, 0.5, 0.5]])))


_NAMES_LIB_SPARSE_CASES = {
    _SP.EnsureSortedIndices: [case(_SP.ensure_sorted_indices, _spv(3, 4)),
                              case(_SP.EnsureSortedIndices(True), _spv(3, 4, "csc"))],
    _SP.HStack: [case(lambda x, y: _SP.hstack([x, y]), _spv(3, 4), _spv(3, 2, "csc"))],
    _SP.VStack: [case(lambda x, y: _SP.vstack([x, y], format="csr"), _spv(3, 4),
                      _spv(2, 4, "csc"))],
    _SP.ColScaleCSC: [case(_SP.col_scale, _spv(3, 4, "csc"), r(4))],
    _SP.RowScaleCSC: [case(lambda x, s: _SP.RowScaleCSC()(x, s), _spv(3, 4, "csc"), r(3))],
    _SPR.Poisson: [case(_SPR.poisson, _spv(3, 4))],
    # p a probability (r() draws from -1..1: which one depended on the cases before it)
    _SPR.Binomial: [case(_SPR.csr_dbinomial, i64(5), np.asarray(0.3), i64([3, 4]))],
    _SPR.Multinomial: [case(_SPR.multinomial, i64(4), _probs())],
}
CASES.update(_NAMES_LIB_SPARSE_CASES)


@pytest.mark.parametrize("op_cls", sorted(_NAMES_LIB_SPARSE_CASES, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_names_lib_sparse_inferred_shapes(op_cls):
    for c in _NAMES_LIB_SPARSE_CASES[op_cls]:
        _sparse_check(op_cls, c)


_NAMES_LIB_CASES = {
    _SPC.ConvolutionIndices: [case(lambda i, k: _SPC.convolution_indices(i, k)[0],
                                   i64([2, 5, 6]), i64([3, 2])),
                              case(lambda i, k: _SPC.ConvolutionIndices((2, 1), "full")(i, k)[0],
                                   i64([4, 5]), i64([2, 3]))],
    _SL.CholeskyGrad: [case(lambda x, l, d: _SL.CholeskyGrad()(x, l, d), _spd(),
                            np.linalg.cholesky(_spd()), r(3, 3))],
}
CASES.update(_NAMES_LIB_CASES)


@pytest.mark.parametrize("op_cls", sorted(_NAMES_LIB_CASES, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_names_lib_inferred_shapes(op_cls):
    for c in _NAMES_LIB_CASES[op_cls]:
        _host_check(op_cls, c)


_NAMES_LIB_GPU_CASES = {
    _TGL.GpuCusolverSolve: [gcase(lambda a, b: _TGL.GpuCusolverSolve(trans="T")(a, b),
                                  _SL.solve, "gg", _spd(), r(3, 4))],
    _TGL.GpuCublasTriangularSolve: [gcase(lambda a, b: _TGL.GpuCublasTriangularSolve()(a, b),
                                          _SL.solve_triangular, "gg", _spd(), r(3))],
    _TGL.GpuMagmaCholesky: [gcase(lambda x: _TGL.GpuMagmaCholesky()(x), _SL.cholesky, "g",
                                  _spd())],
    _TGL.GpuMagmaMatrixInverse: [gcase(lambda x: _TGL.GpuMagmaMatrixInverse()(x),
                                       _NL.matrix_inverse, "g", _spd())],
    _TGL.GpuMagmaSVD: [gcase(lambda x: _TGL.GpuMagmaSVD(full)(x)[0],
                             lambda x: _NL.svd(x, full)[1], "g", r(5, 3)) for full in (True, False)]
    + [gcase(lambda x: _TGL.GpuMagmaSVD(True, False)(x), lambda x: _NL.svd(x, compute_uv=False),
             "g", r(3, 5))],
    _TGL.GpuMagmaQR: [gcase(lambda x: _TGL.GpuMagmaQR()(x)[0], lambda x: _NL.qr(x)[1], "g",
                            r(5, 3)),
                      gcase(lambda x: _TGL.GpuMagmaQR(False)(x), lambda x: _NL.qr(x, "r"), "g",
                            r(3, 5))],
    _TGL.GpuMagmaEigh: [gcase(lambda x: _TGL.GpuMagmaEigh("U", c)(x) if not c else
                              _TGL.GpuMagmaEigh("U", c)(x)[0],
                              lambda x: _NL.eigh(x)[0], "g", _spd()) for c in (True, False)],
}
CASES.update(_NAMES_LIB_GPU_CASES)


@pytest.mark.parametrize("op_cls", sorted(_NAMES_LIB_GPU_CASES, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_names_lib_gpu_inferred_shapes(op_cls):
    for c in _NAMES_LIB_GPU_CASES[op_cls]:
        _gpu_check(op_cls, c)


# Theano's documented names, names-tensor's set (issue 31)
from symgpu.tensor import checks as _checks  # noqa: E402
from symgpu.tensor.random import mrg_math as _mrg  # noqa: E402
from symgpu.tensor import index_ops as _iops  # noqa: E402
from symgpu.tensor import mpi as _mpi  # noqa: E402

_NAMES_TENSOR_CASES = {
    _checks.Assert: [case(lambda x, n: _checks.Assert("m")(x, T.gt(n, 0)), r(3, 2), i64(1))],
    _mrg.DotModulo: [case(lambda A, s, A2, s2: _mrg.DotModulo()(A, s, np.int32(7), A2, s2,
                                                                np.int32(11)),
                          i64([[1, 2, 3], [4, 5, 6]]), np.array([1, 2, 3], dtype="int32"),
                          i64([[1, 2, 3]]), np.array([4, 5, 6], dtype="int32"))],
    _iops.CpuContiguous: [case(lambda x: _iops.cpu_contiguous(x.T), r(3, 2))],
    # Unique: the number of unique values is known once computed (ShapeError: x.shape is
    # read from the result; tests/test_theano_names_tensor.py checks those shapes)
    _iops.Unique: [],
    _iops.UnravelIndex: [case(lambda i, d: _iops.UnravelIndex(2)(i, d)[1], i64([[1, 5], [7, 0]]),
                              i64([3, 4]))],
    _iops.RavelMultiIndex: [case(lambda a, b, d: _iops.RavelMultiIndex()(a, b, d), i64([0, 2]),
                                 i64([1, 3]), i64([3, 4]))],
    _iops.Bartlett: [case(lambda m: _iops.bartlett(m), i64(6)), case(lambda m: _iops.bartlett(m), i64(-2))],
    # the MPI ops have request outputs (Generic, no shape): tests/test_theano_names_tensor.py
    # checks their shapes with a fake communicator
    _mpi.MPIRecv: [], _mpi.MPIRecvWait: [], _mpi.MPISend: [], _mpi.MPISendWait: [],
    _iops.FillDiagonalOffset: [case(lambda a, v, o: _iops.fill_diagonal_offset(a, v, o), r(3, 5),
                                    r(), i64(1))],
}
CASES.update(_NAMES_TENSOR_CASES)


@pytest.mark.parametrize("op_cls", list(_NAMES_TENSOR_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_theano_names_tensor(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


# --- names-gpu (issue 31): Theano's GpuEye, GpuTri, GpuSplit ---------------------------------
from symgpu.gpu.ops import constructors as _gcons  # noqa: E402

_NAMES_GPU_CASES = {
    _gcons.GpuEye: [gcase(lambda n, m, k: _gcons.GpuEye("float64")(n, m, k),
                          lambda n, m, k: T.eye(n, m, k, dtype="float64"), "hhh",
                          i64(3), i64(5), i64(1))],
    _gcons.GpuTri: [gcase(lambda n, m, k: _gcons.GpuTri("float64")(n, m, k),
                          lambda n, m, k: T.tri(n, m, k, dtype="float64"), "hhh",
                          i64(4), i64(2), i64(0))],
    _gcons.GpuSplit: [gcase(lambda x, a, s: _gcons.GpuSplit(2)(x, a, s)[0],
                            lambda x, a, s: _tb.Split(2)(x, a, s)[0], "ghh",
                            r(5, 3), i64(0), i64([2, 3]))],
}
CASES.update(_NAMES_GPU_CASES)


@pytest.mark.parametrize("op_cls", list(_NAMES_GPU_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_names_gpu(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


# ---------------------------------------------------------------- the join of a collective's stream (issue 35)
from symgpu.gpu.ops import comm_join as _cjoin  # noqa: E402

_COMM_JOIN_CASES = {
    _cjoin.GpuCommJoin: [gcase(lambda x: _cjoin.comm_join(_coll.GpuAllReduce("sum", "self")(x)),
                               lambda x: x * 1, "g", r(3, 2, dtype="float32"))],
}
CASES.update(_COMM_JOIN_CASES)


@pytest.mark.parametrize("op_cls", list(_COMM_JOIN_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_comm_join(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


# --- names-rest (issue 31): raw_random's RandomFunction (a NumPy RandomState input: its
# shapes are checked in tests/test_theano_names_rest.py, as the state has no shape) ----------
from symgpu.tensor.random import numpy_state as _nps  # noqa: E402

CASES.update({_nps.RandomFunction: []})


# pooling with graph-valued sizes (Theano's Pool with symbolic ws; Lasagne's spatial pyramid
# pooling): tools/theano_library_suite.py's helper
from symgpu.tensor.signal import pool_dynamic as _pdyn  # noqa: E402

_PX, _PZ = r(2, 3, 7, 6), r(2, 3, 4, 3)
_DYNAMIC_POOL_CASES = {
    _pdyn.DynamicPool: [
        case(lambda x, w, s, p: _pdyn.DynamicPool(2, False, "max")(x, w, s, p), _PX,
             i64([2, 3]), i64([2, 2]), i64([0, 0])),
        case(lambda x, w, s, p: _pdyn.DynamicPool(2, True, "average_exc_pad")(x, w, s, p), _PX,
             i64([3, 2]), i64([1, 2]), i64([1, 1])),
        case(lambda x, w, s, p: _pdyn.DynamicPool(3, False, "sum")(x, w, s, p), r(2, 5, 4, 3),
             i64([2, 3, 2]), i64([3, 1, 2]), i64([0, 0, 0]))],
    _pdyn.DynamicPoolGrad: [
        case(lambda x, z, g, w, s, p: _pdyn.DynamicPoolGrad(2, False, "max", "max_grad")(
            x, z, g, w, s, p), _PX, _PZ, _PZ, i64([2, 2]), i64([2, 2]), i64([0, 0])),
        case(lambda x, z, g, w, s, p: _pdyn.DynamicPoolGrad(2, False, "max", "max_grad_grad")(
            x, z, g, w, s, p), _PX, _PZ, _PX, i64([2, 2]), i64([2, 2]), i64([0, 0]))],
}
CASES.update(_DYNAMIC_POOL_CASES)


@pytest.mark.parametrize("op_cls", list(_DYNAMIC_POOL_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_dynamic_pool(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


# ---------------------------------------------------------------- images2neibs on the GPU (issue 33, helper neibs)
from symgpu.gpu.ops import neighbours as _gnb  # noqa: E402

_NEIBS_GPU_CASES = {
    _gnb.GpuImages2Neibs: [
        gcase(lambda x: _gnb.GpuImages2Neibs("half")(x, (3, 2), (1, 2)),
              lambda x: _nb.images2neibs(x, (3, 2), (1, 2), mode="half"), "g", r(2, 3, 6, 8)),
        gcase(lambda x: _gnb.GpuImages2Neibs("wrap_centered")(x, (3, 3), (2, 2)),
              lambda x: _nb.images2neibs(x, (3, 3), (2, 2), mode="wrap_centered"), "g",
              r(1, 2, 5, 6))],
    _gnb.GpuImages2NeibsGrad: [
        gcase(lambda g, x: _gnb.GpuImages2NeibsGrad("full")(g, x, (2, 3), (1, 2)),
              lambda g, x: _nb.Images2NeibsGrad("full")(g, x, (2, 3), (1, 2)), "gg",
              r(2 * 5 * 4, 6), r(1, 2, 4, 5))],
}
CASES.update(_NEIBS_GPU_CASES)


@pytest.mark.parametrize("op_cls", list(_NEIBS_GPU_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_neibs_gpu(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


# --- advidx (issue 31): Theano's general advanced indexing on the GPU and the fused 1-hot
# softmax cross-entropy ops (host and GPU) ---------------------------------------------------
from symgpu.gpu.ops import advanced_general as _agen, xent_softmax as _gxent  # noqa: E402
from symgpu.tensor.nnet import xent_softmax as _hxent  # noqa: E402
from symgpu.tensor.subtensor import SYM as _SYM, Slice as _Slice  # noqa: E402

_ADVIDX_IDX = (_SYM, _Slice(1, None, None), _SYM)
_ADVIDX_CASES = {
    _agen.GpuAdvancedSubtensor: [gcase(
        lambda x, a, b: _agen.GpuAdvancedSubtensor(_ADVIDX_IDX)(x, a, b),
        lambda x, a, b: x[a, 1:, b], "ggg", r(4, 5, 6), i64([0, 3, 1]), i64([[2], [0]]))],
    _agen.GpuAdvancedIncSubtensor: [gcase(
        lambda x, y, a, b: _agen.GpuAdvancedIncSubtensor(_ADVIDX_IDX)(x, y, a, b),
        lambda x, y, a, b: x, "gggg", r(4, 5, 6), r(4), i64([0, 3, 1]), i64([[2], [0]]))],
    _agen.GpuAdvancedBooleanSubtensor: [gcase(
        lambda x, m: _agen.GpuAdvancedBooleanSubtensor((_SYM,))(x, m),
        lambda x, m: x[m], "gh", r(4, 5, 6), np.arange(20).reshape(4, 5) % 3 == 0)],
    _agen.GpuAdvancedBooleanIncSubtensor: [gcase(
        lambda x, y, m: _agen.GpuAdvancedBooleanIncSubtensor((_SYM,), True)(x, y, m),
        lambda x, y, m: x, "ggh", r(4, 5, 6), r(6), np.arange(20).reshape(4, 5) % 3 == 0)],
    _gxent.GpuCrossentropySoftmaxArgmax1HotWithBias: [gcase(
        lambda x, b, y: _gxent.GpuCrossentropySoftmaxArgmax1HotWithBias()(x, b, y)[0],
        lambda x, b, y: (x + b)[:, 0], "ggg", r(3, 4), r(4), i64([0, 3, 1]))],
    _gxent.GpuCrossentropySoftmax1HotWithBiasDx: [gcase(
        lambda d, s, y: _gxent.GpuCrossentropySoftmax1HotWithBiasDx()(d, s, y),
        lambda d, s, y: s, "ggg", r(3), r(3, 4), i64([0, 3, 1]))],
    _hxent.CrossentropySoftmaxArgmax1HotWithBias: [case(
        lambda x, b, y: _hxent.CrossentropySoftmaxArgmax1HotWithBias()(x, b, y),
        r(3, 4), r(4), i64([0, 3, 1]))],
    _hxent.CrossentropySoftmax1HotWithBiasDx: [case(
        lambda d, s, y: _hxent.CrossentropySoftmax1HotWithBiasDx()(d, s, y),
        r(3), r(3, 4), i64([0, 3, 1]))],
}
CASES.update(_ADVIDX_CASES)


@pytest.mark.parametrize("op_cls", list(_ADVIDX_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_advidx(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


# --------------------------------------------------------- the 3-d pooling gradient's epilogue
from symgpu.gpu.ops.pooling_epilogue import GpuPoolGradEpilogue3d as _GpuPoolGradEpilogue3d  # noqa: E402

_EPI3_CASES = {
    _GpuPoolGradEpilogue3d: [gcase(
        lambda x, z, g, e: _GpuPoolGradEpilogue3d(ws=(2, 2, 2), scalar_op=SCALAR_OPS["mul"],
                                                  roles=("g", "e0"),
                                                  extra_dtypes=(str(PX3.dtype),))(x, z, g, e),
        lambda x, z, g, e: x, "gggg", PX3, PZ3, PZ3, PX3)],
}
CASES.update(_EPI3_CASES)


@pytest.mark.parametrize("op_cls", list(_EPI3_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_pool_epilogue3d(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


# ------------------------------------------- RNNBlock's ops and the row-reduction group (s20)
from symgpu.gpu.ops import cudnn_rnn as _crnn  # noqa: E402
from symgpu.gpu.ops.row_group import GpuRowReduceGroup as _RowGroup, RowMember as _Member  # noqa: E402
from symgpu.tensor.nnet import rnn as _rnn  # noqa: E402

_RW = r(_rnn.rnn_layout("lstm", 2, 1, 3).size)
_RX, _RH = r(4, 2, 3), r(1, 2, 2)
_LSTM = ("lstm", "unidirectional", 1, 2)
_S20_CASES = {
    _rnn.DnnRNN: [case(lambda w, x, h, c: _rnn.DnnRNN(*_LSTM)(w, x, h, c), _RW, _RX, _RH, _RH)],
    _rnn.DnnRNNGrad: [case(lambda w, x, h, c, dy, dh, dc: _rnn.DnnRNNGrad(*_LSTM)(
        w, x, h, c, dy, dh, dc), _RW, _RX, _RH, _RH, r(4, 2, 2), _RH, _RH)],
    # GpuDnnRNNForward: its reserve output's size is cuDNN's, known when the plan is made
    # (ShapeError: the shapes of its outputs are read from the computed arrays)
    _crnn.GpuDnnRNNForward: [],
    _crnn.GpuDnnRNNBackward: [gcase(
        lambda w, x, h, c, y, res, dy, dh, dc: _crnn.GpuDnnRNNBackward(*_LSTM)(
            w, x, h, c, y, res, dy, dh, dc)[0],
        lambda w, x, h, c, y, res, dy, dh, dc: x, "ggggggggg",
        *(v.astype("float32") for v in (_RW, _RX, _RH, _RH, r(4, 2, 2))),
        np.zeros(16, "uint8"), *(v.astype("float32") for v in (r(4, 2, 2), _RH, _RH)))],
    _RowGroup: [gcase(lambda x: _RowGroup([_Member("add", None, (0,)),
                                           _Member("maximum", None, (0,))], 1)(x)[0],
                      lambda x: x.sum(axis=-1), "g", r(3, 5).astype("float32"))],
}
CASES.update(_S20_CASES)

# scan_to_dnn_rnn's prefix test (s22): lengths per row and a scalar
from symgpu.gpu.ops.pad_steps import GpuPadSteps as _GpuPadSteps  # noqa: E402
from symgpu.scan.dnn_rnn_match import PrefixGuard as _PrefixGuard  # noqa: E402
from symgpu.tensor.nnet.pad_steps import PadSteps as _PadSteps  # noqa: E402
from symgpu.tensor.nnet.pad_steps import StepBucket as _StepBucket  # noqa: E402
from symgpu.gpu.ops.pad_steps import GpuPadPrefix as _GpuPadPrefix  # noqa: E402
from symgpu.scan.dnn_rnn_match import PrefixMask as _PrefixMask  # noqa: E402

_S22_CASES = {_PrefixMask: [case(lambda m, n: _PrefixMask()(m, n),
                                 np.array([[1, 1, 1], [1, 0, 1], [0, 0, 1]], "float32"),
                                 i64(2))],
              _PrefixGuard: [case(lambda m, n: _PrefixGuard()(m, n),
                                  np.array([[1, 1, 1], [1, 0, 1], [0, 0, 1]], "float32"),
                                  i64(2))],
              # PadSteps and its GPU op: the padded length depends on the lengths earlier
              # calls had (ShapeError: shapes after it are read from the padded value)
              _PadSteps: [], _GpuPadSteps: [],
              # the prefix pad takes its length as an input (StepBucket's): a shape rule
              _StepBucket: [case(lambda n: _StepBucket(4)(n)[0], i64(6))],
              _GpuPadPrefix: [gcase(lambda x, n, s, v: _GpuPadPrefix()(x, n, s, v),
                                    lambda x, n, s, v: T.alloc(np.float32(0), s, *x.shape[1:]),
                                    "ghhh", np.ones((5, 2, 3), "float32"), i64(3), i64(4),
                                    i64(1))]}
CASES.update(_S22_CASES)


@pytest.mark.parametrize("op_cls", list(_S22_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_s22(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


@pytest.mark.parametrize("op_cls", list(_S20_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_s20(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


def test_the_rnn_forward_says_why_its_shapes_are_not_inferred(vgpu):
    from symgpu.graph.op import ShapeError
    from symgpu.tensor.rewriting.shape_feature import node_shapes
    from symgpu.gpu.placement.type import GpuArrayType
    ins = [GpuArrayType("float32", (False,) * n, None)() for n in (1, 3, 3, 3)]
    node = _crnn.GpuDnnRNNForward(*_LSTM)(*ins)[0].owner
    with pytest.raises(ShapeError, match="reserve space"):
        node_shapes(node)


# the column group (s25): the map's written output; a member's column vector (the first output
# of a group without a map: the test infers the first output)
from symgpu.gpu.ops.col_group import ColMember as _ColMember, GpuColumnReduceGroup as _ColGroup  # noqa: E402,E501

_COL_GROUP = _ColGroup([_ColMember("add", None, (-1,)), _ColMember("maximum", None, (0,))],
                       symgpu.scalar.basic.SCALAR_OPS["tanh"], (0,), (True,))
_S25_CASES = {_ColGroup: [
    gcase(lambda x: _COL_GROUP(x)[0], lambda x: T.tanh(x), "g", r(2, 3, 5).astype("float32")),
    gcase(lambda x: _ColGroup([_ColMember("maximum", None, (0,))] * 2)(x)[0],
          lambda x: x.max(axis=(0, 1)), "g", r(2, 3, 5).astype("float32"))]}
CASES.update(_S25_CASES)


@pytest.mark.parametrize("op_cls", list(_S25_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_s25(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)


# the elementwise group (s26): its first member's output (the test infers the first output)
from symgpu.gpu.ops.elemwise import GpuElemwise as _GpuElemwise  # noqa: E402
from symgpu.gpu.ops.elemwise_group import GpuElemwiseGroup as _ElemwiseGroup  # noqa: E402

_EW_GROUP = _ElemwiseGroup([_GpuElemwise(SCALAR_OPS["tanh"]), _GpuElemwise(SCALAR_OPS["exp"])],
                           [(1, 1), (1, 1)])
_S26_CASES = {_ElemwiseGroup: [
    gcase(lambda x, y: _EW_GROUP(x, y)[0], lambda x, y: T.tanh(x), "gg",
          r(2, 3, 5).astype("float32"), r(4).astype("float32"))]}
CASES.update(_S26_CASES)


@pytest.mark.parametrize("op_cls", list(_S26_CASES), ids=lambda c: c.__name__)
def test_inferred_shape_s26(op_cls):
    test_inferred_shape_equals_computed_shape(op_cls)
