"""theano.gpuarray.dnn's functions and basic_ops' infer_context_name (issue 31), with
Theano's signatures. They build our convolution, pooling and batch-norm graphs, which the GPU
placement lifts to GpuConv2d/GpuPool/... (cuDNN where it loads, else our own kernels); like
Theano's, they need a GPU context."""
from __future__ import annotations

from typing import Any, Sequence

from symgpu.config import config
from symgpu.gpu.ops.softmax_rows import GpuSoftmaxRows
from symgpu.gpu.placement.basic_ops import HostFromGpu
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime import context as _ctx
from symgpu.graph.op_alias import op_alias
from symgpu.tensor.nnet import abstract_conv as _ac
from symgpu.tensor.nnet import bn as _bn
from symgpu.tensor.signal import pool as _pool
from symgpu.tensor.type import TensorVariable

__all__ = ["infer_context_name", "dnn_available", "dnn_present", "dnn_conv", "dnn_conv3d", "dnn_gradinput", "dnn_gradinput3d",
           "dnn_gradweight", "dnn_gradweight3d", "dnn_pool", "dnn_batch_normalization_train",
           "dnn_batch_normalization_test"]


def infer_context_name(*vars: Any) -> str | None:
    """The GPU context name of the first variable on (or just copied off) a GPU; None (the
    default context) when none is."""
    for v in vars:
        if isinstance(getattr(v, "type", None), GpuArrayType):
            return v.type.context_name
        owner = getattr(v, "owner", None)
        if owner is not None and isinstance(owner.op, HostFromGpu):
            return owner.inputs[0].type.context_name
    return None


def dnn_available(context_name: str | None = None) -> bool:
    """Whether the dnn functions can run on GPU context `context_name` (Theano's check that
    libraries call before building cuDNN layers): True when it is a started, real GPU (they
    run on cuDNN where it loads, else on symgpu's own kernels). When False, the reason is in
    ``dnn_available.msg``, as in Theano."""
    ctx = _ctx.context_in_use(context_name)
    if ctx is None:
        which = "default GPU context" if context_name is None else \
            f"GPU context {context_name!r}"
        dnn_available.msg = (f"no {which} in use (the device flag is {config.device!r}; "
                             f"set device=cuda)")
        return False
    dnn_available.msg = None
    return True


dnn_available.msg = None


def dnn_present() -> bool:
    """Theano's check that cuDNN can be used at all: here, that the default GPU context is
    in use (see dnn_available); the reason when not is in ``dnn_present.msg``."""
    ok = dnn_available(None)
    dnn_present.msg = dnn_available.msg
    return ok


dnn_present.msg = None


def _need_gpu(who: str, *vars: Any) -> None:
    name = infer_context_name(*vars)
    try:
        _ctx.get_context(name)
    except (_ctx.ContextNotFound, _ctx.GpuUnavailableError) as exc:
        raise RuntimeError(f"{who} runs on the GPU: no GPU context {name!r} ({exc}); register "
                           f"one (device=cuda) or use the tensor.nnet functions") from exc


def _flip(who: str, conv_mode: str) -> bool:
    if conv_mode not in ("conv", "cross"):
        raise ValueError(f"{who}: conv_mode must be 'conv' or 'cross', got {conv_mode!r}")
    return conv_mode == "conv"


def dnn_conv(img: Any, kerns: Any, border_mode: Any = "valid", subsample: Any = (1, 1),
             dilation: Any = (1, 1), conv_mode: str = "conv", direction_hint: Any = None,
             workmem: Any = None, algo: Any = None, precision: Any = None,
             num_groups: int = 1) -> TensorVariable:
    """Theano's cuDNN 2-d convolution: our conv2d, lifted to GpuConv2d (the algorithm and
    precision come from the dnn.conv.* flags)."""
    _need_gpu("dnn_conv", img, kerns)
    return _ac.conv2d(img, kerns, border_mode=border_mode, subsample=subsample,
                      filter_flip=_flip("dnn_conv", conv_mode), filter_dilation=dilation,
                      num_groups=num_groups)


def dnn_conv3d(img: Any, kerns: Any, border_mode: Any = "valid", subsample: Any = (1, 1, 1),
               dilation: Any = (1, 1, 1), conv_mode: str = "conv", direction_hint: Any = None,
               algo: Any = None, precision: Any = None, num_groups: int = 1) -> TensorVariable:
    """Theano's cuDNN 3-d convolution: our conv3d, lifted to GpuConv3d."""
    _need_gpu("dnn_conv3d", img, kerns)
    return _ac.conv3d(img, kerns, border_mode=border_mode, subsample=subsample,
                      filter_flip=_flip("dnn_conv3d", conv_mode), filter_dilation=dilation,
                      num_groups=num_groups)


def dnn_gradinput(kerns: Any, topgrad: Any, img_shp: Sequence[Any], border_mode: Any = "valid",
                  subsample: Any = (1, 1), dilation: Any = (1, 1), conv_mode: str = "conv",
                  precision: Any = None, algo: Any = None, num_groups: int = 1) -> TensorVariable:
    """The 2-d convolution's gradient wrt its input of shape `img_shp` (GpuConv2dGradInputs)."""
    _need_gpu("dnn_gradinput", kerns, topgrad)
    return _ac.conv2d_grad_wrt_inputs(topgrad, kerns, img_shp, None, border_mode, subsample,
                                      _flip("dnn_gradinput", conv_mode), dilation, num_groups)


def dnn_gradinput3d(kerns: Any, topgrad: Any, img_shp: Sequence[Any],
                    border_mode: Any = "valid", subsample: Any = (1, 1, 1),
                    dilation: Any = (1, 1, 1), conv_mode: str = "conv", precision: Any = None,
                    algo: Any = None, num_groups: int = 1) -> TensorVariable:
    """dnn_gradinput's 3-d form (GpuConv3dGradInputs)."""
    _need_gpu("dnn_gradinput3d", kerns, topgrad)
    return _ac.conv3d_grad_wrt_inputs(topgrad, kerns, img_shp, None, border_mode, subsample,
                                      _flip("dnn_gradinput3d", conv_mode), dilation, num_groups)


def dnn_gradweight(img: Any, topgrad: Any, kerns_shp: Sequence[Any], border_mode: Any = "valid",
                   subsample: Any = (1, 1), dilation: Any = (1, 1), conv_mode: str = "conv",
                   precision: Any = None, algo: Any = None,
                   num_groups: int = 1) -> TensorVariable:
    """The 2-d convolution's gradient wrt filters of shape `kerns_shp` (GpuConv2dGradWeights)."""
    _need_gpu("dnn_gradweight", img, topgrad)
    return _ac.conv2d_grad_wrt_weights(img, topgrad, kerns_shp, None, border_mode, subsample,
                                       _flip("dnn_gradweight", conv_mode), dilation, num_groups)


def dnn_gradweight3d(img: Any, topgrad: Any, kerns_shp: Sequence[Any],
                     border_mode: Any = "valid", subsample: Any = (1, 1, 1),
                     dilation: Any = (1, 1, 1), conv_mode: str = "conv", precision: Any = None,
                     algo: Any = None, num_groups: int = 1) -> TensorVariable:
    """dnn_gradweight's 3-d form (GpuConv3dGradWeights)."""
    _need_gpu("dnn_gradweight3d", img, topgrad)
    return _ac.conv3d_grad_wrt_weights(img, topgrad, kerns_shp, None, border_mode, subsample,
                                       _flip("dnn_gradweight3d", conv_mode), dilation,
                                       num_groups)


_POOL_MODES = {"max": "max", "average": "average_inc_pad", "average_inc_pad": "average_inc_pad",
               "average_exc_pad": "average_exc_pad", "sum": "sum"}


def dnn_pool(img: Any, ws: Sequence[int], stride: Sequence[int] | None = None,
             mode: str = "max", pad: Sequence[int] | None = None) -> TensorVariable:
    """Theano's cuDNN pooling over the last 2 or 3 axes (len(ws)); 'average' counts the
    padding, as cuDNN's does. Lifted to GpuPool / GpuPool3d."""
    _need_gpu("dnn_pool", img)
    if mode not in _POOL_MODES:
        raise ValueError(f"dnn_pool: mode must be one of {sorted(_POOL_MODES)}, got {mode!r}")
    nd = len(ws)
    if nd not in (2, 3):
        raise ValueError(f"dnn_pool: ws must have 2 or 3 entries, got {ws!r}")
    pool = _pool.pool_2d if nd == 2 else _pool.pool_3d
    return pool(img, ws, ignore_border=True, stride=stride,
                pad=(0,) * nd if pad is None else pad, mode=_POOL_MODES[mode])


def dnn_batch_normalization_train(inputs: Any, gamma: Any, beta: Any,
                                  mode: str = "per-activation", epsilon: float = 1e-4,
                                  running_average_factor: float = 0.1,
                                  running_mean: Any = None, running_var: Any = None) -> tuple:
    """Theano's cuDNN batch-norm training: (out, mean, invstd[, new running mean, var])."""
    _need_gpu("dnn_batch_normalization_train", inputs)
    return _bn.batch_normalization_train(inputs, gamma, beta, mode, epsilon,
                                         running_average_factor, running_mean, running_var)


def dnn_batch_normalization_test(inputs: Any, gamma: Any, beta: Any, mean: Any, var: Any,
                                 mode: str = "per-activation",
                                 epsilon: float = 1e-4) -> TensorVariable:
    """Theano's cuDNN batch-norm inference with given statistics."""
    _need_gpu("dnn_batch_normalization_test", inputs)
    return _bn.batch_normalization_test(inputs, gamma, beta, mean, var, mode, epsilon)


# theano.gpuarray.nnet's softmax classes: our one softmax kernel op (GpuSoftmaxRows) with and
# without a bias, built and recognised under Theano's names
def _softmax_alias(name: str, bias: bool) -> type:
    return op_alias(name, "symgpu.gpuarray.nnet", lambda: GpuSoftmaxRows(log=False, bias=bias),
                    lambda op: isinstance(op, GpuSoftmaxRows) and not op.log and op.bias == bias,
                    f"Theano's {name}(): our GpuSoftmaxRows(log=False, bias={bias}), "
                    f"applied to a GPU matrix{' and a bias vector' if bias else ''}")


GpuSoftmax = _softmax_alias("GpuSoftmax", False)
GpuSoftmaxWithBias = _softmax_alias("GpuSoftmaxWithBias", True)
__all__ += ["GpuSoftmax", "GpuSoftmaxWithBias"]
