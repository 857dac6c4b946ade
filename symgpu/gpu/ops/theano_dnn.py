"""theano.gpuarray.dnn's functions and basic_ops' infer_context_name (issue 31), with
Theano's signatures. They build our convolution, pooling and batch-norm graphs, which the GPU
placement lifts to GpuConv2d/GpuPool/... (cuDNN where it loads, else our own kernels); like
Theano's, they need a GPU context."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from symgpu.config import config
from symgpu.gpu.ops.pooling import GpuAveragePoolGrad, GpuMaxPoolGrad, GpuPool
from symgpu.gpu.ops.softmax_rows import GpuSoftmaxRows
from symgpu.gpu.placement.basic_ops import HostFromGpu
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime import context as _ctx
from symgpu.graph.op_alias import op_alias
from symgpu.tensor import nnet as _nnet
from symgpu.tensor.grids import NotScalarConstantError, get_scalar_constant_value
from symgpu.tensor.nnet import abstract_conv as _ac
from symgpu.tensor.nnet import bn as _bn
from symgpu.tensor.signal import pool as _pool
from symgpu.tensor.type import TensorVariable, as_tensor_variable

__all__ = ["infer_context_name", "dnn_available", "dnn_present", "dnn_conv", "dnn_conv3d",
           "dnn_gradinput", "dnn_gradinput3d", "dnn_gradweight", "dnn_gradweight3d", "dnn_pool",
           "dnn_batch_normalization_train", "dnn_batch_normalization_test"]


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


# theano.gpuarray.dnn's softmax and pooling-gradient op classes. Theano's take their window
# (pooling) or layout (softmax) at application, ours at construction: calling the class gives
# a builder, applied to Theano's inputs, that makes our host graph, which the GPU placement
# lifts to GpuSoftmaxRows / GpuMaxPoolGrad / GpuAveragePoolGrad; isinstance accepts those.
_DNN = "symgpu.gpuarray.dnn"
_SOFTMAX_ALGOS = ("fast", "accurate", "log")
_SOFTMAX_MODES = ("instance", "channel")


class _DnnSoftmaxBuilder:
    """GpuDnnSoftmax(algo, mode) applied to a 4-d (b, c, h, w) tensor."""

    def __init__(self, algo: str, mode: str):
        if algo not in _SOFTMAX_ALGOS:
            raise ValueError(f"GpuDnnSoftmax: algo must be one of {_SOFTMAX_ALGOS}, got "
                             f"{algo!r}")
        if mode not in _SOFTMAX_MODES:
            raise ValueError(f"GpuDnnSoftmax: mode must be one of {_SOFTMAX_MODES}, got "
                             f"{mode!r}")
        self.algo, self.mode = algo, mode

    def __repr__(self) -> str:
        return f"GpuDnnSoftmax(algo={self.algo!r}, mode={self.mode!r})"

    def __call__(self, x: Any) -> TensorVariable:
        x = as_tensor_variable(x)
        if x.ndim != 4:
            raise TypeError(f"{self}: the input must be a 4-d (b, c, h, w) tensor, got "
                            f"{x.type}")
        rows = _nnet.log_softmax if self.algo == "log" else _nnet.softmax
        if self.mode == "instance":   # one distribution per image, over c, h and w
            return rows(x.reshape((x.shape[0], -1)), axis=-1).reshape(x.shape)
        # one distribution per pixel, over the channels: the channel axis last, one launch
        return rows(x.dimshuffle(0, 2, 3, 1), axis=-1).dimshuffle(0, 3, 1, 2)


def _is_softmax_kernel(op: Any) -> bool:
    return isinstance(op, GpuSoftmaxRows) and not op.bias


GpuDnnSoftmax = op_alias(
    "GpuDnnSoftmax", _DNN, _DnnSoftmaxBuilder, _is_softmax_kernel,
    "Theano's cuDNN softmax GpuDnnSoftmax(algo, mode) applied to a 4-d tensor: softmax "
    "('fast', 'accurate') or log-softmax ('log') over (c, h, w) per image ('instance') or over "
    "c per pixel ('channel'); lifted to our row kernel GpuSoftmaxRows, which isinstance "
    "accepts.")


def _softmax_base(*args: Any, **kwargs: Any) -> Any:
    raise TypeError("GpuDnnSoftmaxBase is the base class of GpuDnnSoftmax: build that")


GpuDnnSoftmaxBase = op_alias(
    "GpuDnnSoftmaxBase", _DNN, _softmax_base, _is_softmax_kernel,
    "The base class of Theano's cuDNN softmax ops: isinstance accepts our GPU softmax kernel "
    "op (GpuSoftmaxRows without a bias).")


def _constant_ints(who: str, what: str, v: Any, nd: int | None) -> tuple[int, ...]:
    if isinstance(v, (tuple, list)):
        items = list(v)
    else:
        var = as_tensor_variable(v)
        data = getattr(var, "data", None)
        if data is None:
            raise TypeError(f"{who}: {what} must be constant (symgpu's pooling ops fix their "
                            f"window when built), got the symbolic {var}")
        items = list(np.atleast_1d(data))
    try:
        out = tuple(int(get_scalar_constant_value(i)) for i in items)
    except NotScalarConstantError as exc:
        raise TypeError(f"{who}: {what} must be constant, got {v!r}") from exc
    if nd is not None and len(out) != nd:
        raise ValueError(f"{who}: {what} has {len(out)} entries, ws has {nd}")
    return out


class _DnnPoolGradBuilder:
    """GpuDnnPoolGrad(mode) applied to (inp, out, out_grad, ws, stride, pad)."""

    def __init__(self, mode: str = "max"):
        if mode not in _POOL_MODES:
            raise ValueError(f"GpuDnnPoolGrad: mode must be one of {sorted(_POOL_MODES)}, "
                             f"got {mode!r}")
        self.mode = _POOL_MODES[mode]

    def __repr__(self) -> str:
        return f"GpuDnnPoolGrad(mode={self.mode!r})"

    def __call__(self, inp: Any, out: Any, out_grad: Any, ws: Any, stride: Any = None,
                 pad: Any = None) -> TensorVariable:
        who = repr(self)
        ws_ = _constant_ints(who, "ws", ws, None)
        if len(ws_) not in (2, 3):
            raise ValueError(f"{who}: ws must have 2 or 3 entries, got {ws_}")
        nd = len(ws_)
        stride_ = ws_ if stride is None else _constant_ints(who, "stride", stride, nd)
        pad_ = (0,) * nd if pad is None else _constant_ints(who, "pad", pad, nd)
        if self.mode == "max":
            cls = _pool.MaxPoolGrad if nd == 2 else _pool.MaxPoolGrad3d
            return cls(ws_, stride_, pad_, True, "max")(inp, out, out_grad)
        cls = _pool.AveragePoolGrad if nd == 2 else _pool.AveragePoolGrad3d
        return cls(ws_, stride_, pad_, True, self.mode)(inp, out_grad)


def _is_pool_grad(op: Any) -> bool:
    return isinstance(op, (GpuMaxPoolGrad, GpuAveragePoolGrad)) and op.ignore_border


def _is_dnn_pool_op(op: Any) -> bool:
    return (isinstance(op, GpuPool) and op.ignore_border) or _is_pool_grad(op)


def _pool_base(*args: Any, **kwargs: Any) -> Any:
    raise TypeError("GpuDnnPoolBase is the base class of GpuDnnPool and GpuDnnPoolGrad: "
                    "build one of those")


GpuDnnPoolGrad = op_alias(
    "GpuDnnPoolGrad", _DNN, _DnnPoolGradBuilder, _is_pool_grad,
    "Theano's cuDNN pooling gradient GpuDnnPoolGrad(mode)(inp, out, out_grad, ws, stride, "
    "pad) with constant ws/stride/pad (2 or 3 entries): our MaxPoolGrad / AveragePoolGrad "
    "(ignore_border=True; 'average' counts the padding, as cuDNN's), lifted to GpuMaxPoolGrad "
    "/ GpuAveragePoolGrad (and their 3-d twins), which isinstance accepts.")
GpuDnnPoolBase = op_alias(
    "GpuDnnPoolBase", _DNN, _pool_base, _is_dnn_pool_op,
    "The base class of Theano's cuDNN pooling ops: isinstance accepts our GPU pooling and "
    "pooling-gradient ops with ignore_border=True (cuDNN's only kind).")
__all__ += ["GpuDnnSoftmax", "GpuDnnSoftmaxBase", "GpuDnnPoolGrad", "GpuDnnPoolBase"]
