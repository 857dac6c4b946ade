"""Theano's class names for GPU ops symgpu has under other classes (issue 31, helper
names-gpu), as op aliases (symgpu.graph.op_alias): calling one builds our op from Theano's
constructor arguments, ``isinstance`` accepts our op where it is the one Theano's class names.

- theano.gpuarray.elemwise's GpuErfinv / GpuErfcinv: the scalar ops of the table, whose CUDA
  rows (``erfinv``/``erfcinv``) GpuElemwise renders.
- theano.gpuarray.blas's correlation ops (GpuCorrMM, GpuCorr3dMM and their gradients): a
  correlation is a convolution without the filter flip, so they are our GpuConv2d/GpuConv3d
  ops with ``filter_flip=False`` (cuDNN where it loads, our im2col + cuBLAS otherwise: Theano
  picked the GEMM algorithm by the op, we pick it per run; the results are the same).
"""
from __future__ import annotations

from typing import Any, Callable

from symgpu.gpu.ops import conv as _conv
from symgpu.graph.op_alias import op_alias
from symgpu.scalar.basic import SCALAR_OPS

__all__ = ["GpuErfinv", "GpuErfcinv", "BaseGpuCorrMM", "GpuCorrMM", "GpuCorrMM_gradWeights",
           "GpuCorrMM_gradInputs", "BaseGpuCorr3dMM", "GpuCorr3dMM",
           "GpuCorr3dMM_gradWeights", "GpuCorr3dMM_gradInputs"]

_ELEMWISE = "symgpu.gpuarray.elemwise"
_BLAS = "symgpu.gpuarray.blas"


def _scalar_alias(name: str, row: str) -> type:
    def build(output_types_preference: Any = None, name: str | None = None) -> Any:
        return SCALAR_OPS[row]
    return op_alias(name, _ELEMWISE, build, lambda op: op == SCALAR_OPS[row],
                    f"Theano's {name}(output_types_preference, name): the scalar op "
                    f"`{row}` of symgpu's table (its CUDA row is what GpuElemwise renders).")


GpuErfinv = _scalar_alias("GpuErfinv", "erfinv")
GpuErfcinv = _scalar_alias("GpuErfcinv", "erfcinv")


def _corr_build(name: str, cls: type, nd: int) -> Callable[..., Any]:
    def build(border_mode: Any = "valid", subsample: Any = (1,) * nd,
              filter_dilation: Any = (1,) * nd, num_groups: int = 1,
              unshared: bool = False) -> Any:
        if unshared:
            raise ValueError(f"{name}: unshared (locally connected) filters are not a "
                             f"convolution symgpu has; use unshared=False")
        return cls(border_mode=border_mode, subsample=subsample, filter_flip=False,
                   filter_dilation=filter_dilation, num_groups=num_groups)
    return build


def _corr_accepts(classes: tuple, nd: int) -> Callable[[Any], bool]:
    return lambda op: isinstance(op, classes) and op.nd == nd and not op.filter_flip


def _corr_alias(name: str, cls: type, nd: int, role: str) -> type:
    return op_alias(name, _BLAS, _corr_build(name, cls, nd), _corr_accepts((cls,), nd),
                    f"Theano's {name}(border_mode, subsample, filter_dilation, num_groups): "
                    f"the {nd}-d correlation's {role}, our {cls.__name__} with "
                    f"filter_flip=False.")


def _base_alias(name: str, classes: tuple, nd: int, ops: str) -> type:
    def build(*args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{name} is the base class of {ops}: build one of those")
    return op_alias(name, _BLAS, build, _corr_accepts(classes, nd),
                    f"Theano's base class of {ops}: isinstance accepts any of them.")


GpuCorrMM = _corr_alias("GpuCorrMM", _conv.GpuConv2d, 2, "forward pass")
GpuCorrMM_gradWeights = _corr_alias("GpuCorrMM_gradWeights", _conv.GpuConv2dGradWeights, 2,
                                    "gradient wrt the filters (img, topgrad, shape)")
GpuCorrMM_gradInputs = _corr_alias("GpuCorrMM_gradInputs", _conv.GpuConv2dGradInputs, 2,
                                   "gradient wrt the input (kern, topgrad, shape)")
GpuCorr3dMM = _corr_alias("GpuCorr3dMM", _conv.GpuConv3d, 3, "forward pass")
GpuCorr3dMM_gradWeights = _corr_alias("GpuCorr3dMM_gradWeights", _conv.GpuConv3dGradWeights,
                                      3, "gradient wrt the filters (img, topgrad, shape)")
GpuCorr3dMM_gradInputs = _corr_alias("GpuCorr3dMM_gradInputs", _conv.GpuConv3dGradInputs, 3,
                                     "gradient wrt the input (kern, topgrad, shape)")
BaseGpuCorrMM = _base_alias(
    "BaseGpuCorrMM", (_conv.GpuConv2d, _conv.GpuConv2dGradWeights, _conv.GpuConv2dGradInputs),
    2, "GpuCorrMM, GpuCorrMM_gradWeights and GpuCorrMM_gradInputs")
BaseGpuCorr3dMM = _base_alias(
    "BaseGpuCorr3dMM", (_conv.GpuConv3d, _conv.GpuConv3dGradWeights,
                        _conv.GpuConv3dGradInputs),
    3, "GpuCorr3dMM, GpuCorr3dMM_gradWeights and GpuCorr3dMM_gradInputs")
