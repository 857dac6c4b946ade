"""cuDNN's fused recurrent layers: RNNBlock (Theano's theano.gpuarray.dnn.RNNBlock), the GPU
ops GpuDnnRNNForward / GpuDnnRNNBackward on cuDNN 9's v8 RNN API, and the lifters from the
host ops of symgpu/tensor/nnet/rnn.py.

Why: a scan loop launches a GEMM and a gate kernel per step; cuDNN runs the whole sequence
of every layer in a few persistent kernels (issue 32).

The calls (cudnn_adv): cudnnSetRNNDescriptor_v8 (double bias, linear input, no dropout; the
algorithm from ``rnn_algorithm``: see there), cudnnSetRNNDataDescriptor (SEQ_MAJOR_UNPACKED,
every row full length, padded IO enabled), cudnnRNNForward in training mode (the reserve
space is the forward op's last output, a uint8 vector the backward op reads),
cudnnRNNBackwardData_v8 then
cudnnRNNBackwardWeights_v8 (which adds into dw: zeroed first) in one backward op, on a copy
of the reserve (backward data writes into it). Without lengths, devSeqLengths is a device
int32 vector set by a memset; workspaces come from the context's pool; nothing waits for the
device or copies from the host, so both thunks are CUDA-graph capturable. float32 only
(float64/float16 stay on the host ops); TF32 only under ``gpuarray.allow_tf32`` (as the
convolutions).

Per-row lengths (ops built with ``with_lengths=True``, rnn.py's semantics): cuDNN needs them
twice, as a host int array in cudnnSetRNNDataDescriptor (seqLengthArray: the descriptors, and
so the plan, depend on the values) and as a device int32 vector (devSeqLengths) in every call.
So the lengths are a host input of the GPU ops (a lengths vector computed on the GPU comes
back through one transfer), each distinct vector gets its own plan (descriptors and a device
copy of the lengths uploaded when the plan is made; the last PLAN_CACHE plans kept), and such
a thunk is not capturable: its plan depends on values read on the host per call (the
function runs it between captured segments).

The weight layout is rnn.py's (cuDNN's); each plan checks it against
cudnnGetRNNWeightParams and raises CudnnError naming the first difference.
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from symgpu.gpu.ops.conv import _math_mode
from symgpu.gpu.ops.cudnn import DATA_TYPES, CudnnError, _Desc, cudnn, cudnn_available
from symgpu.gpu.ops.kernel_ops import _capturable, _context, _virtual_thunk
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable, host_from_gpu
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime.array import new_array
from symgpu.graph.basic import Apply
from symgpu.graph.op import ShapeError
from symgpu.tensor.nnet.rnn import (DIRECTION_MODES, LENGTH_DTYPES, SMALL_H_LIMIT, DnnRNN,
                                    DnnRNNGrad, _RNNBase, check_lengths, rnn_layout)
from symgpu.tensor.type import as_tensor_variable

__all__ = ["RNNBlock", "GpuDnnRNNForward", "GpuDnnRNNBackward", "RNNPlan", "ENABLED",
           "PLAN_CACHE", "PERSISTENT", "SMALL_H_LIMIT", "SMALL_H_MAX_BATCH", "rnn_algorithm"]

#: False: the lifters leave DnnRNN / DnnRNNGrad on the host (read when a function compiles)
ENABLED = True
#: plans kept per node (one per shape and, with lengths, per distinct lengths vector)
PLAN_CACHE = 64
#: False: cuDNN's standard algorithm always (read when a plan is made); where it applies:
#: SMALL_H_LIMIT (symgpu/tensor/nnet/rnn.py, re-exported here) and SMALL_H_MAX_BATCH
PERSISTENT = True
#: the largest batch it is asked for: a training step of length 50 took 0.21-0.70x the
#: standard algorithm's time up to batch 256 and 0.45-1.14x at 512 (H200, one layer)
SMALL_H_MAX_BATCH = 256

# cuDNN 9 enums (cudnn_adv.h)
_CELL = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}     # cudnnRNNMode_t
_ALGO_STANDARD, _ALGO_PERSIST_SMALL_H = 0, 3                     # cudnnRNNAlgo_t
_DOUBLE_BIAS, _LINEAR_INPUT = 2, 0
_NOT_SUPPORTED = "CUDNN_STATUS_NOT_SUPPORTED"
_PADDED_IO_ENABLED = 1
_SEQ_MAJOR_UNPACKED = 0
_FWD_TRAINING = 1
_WGRAD_ADD = 0


def rnn_algorithm(op: _RNNBase, batch: int) -> int:
    """cuDNN's persistent algorithm for small hidden sizes where it applies, else the standard
    one. Why: the standard algorithm launches a GEMM and a gate kernel per step and direction;
    at batch 16 that is latency (an LSTM training step of length 50, hidden 128: 0.90 ms of
    device time on an H200), where the persistent kernels run the sequence in one launch
    each way (0.39 ms; PyTorch picks them too). Not with per-row lengths (cuDNN's persistent
    kernels take no varying lengths); a plan falls back to the standard algorithm where cuDNN
    refuses the descriptors (RNNPlan)."""
    small = (op.hidden_size <= SMALL_H_LIMIT.get(op.rnn_mode, 0)
             and batch <= SMALL_H_MAX_BATCH)
    return (_ALGO_PERSIST_SMALL_H if PERSISTENT and small and not op.with_lengths
            else _ALGO_STANDARD)


class RNNPlan:
    """cuDNN's descriptors and space sizes for one (seq, batch, input) problem of an op (no
    device work: safe while a graph is captured). `layer`, an earlier plan of the same
    batch, input size, weights and math (``layer_key``), lends its layer descriptors and
    weight check: only the sequence's data descriptors and space sizes are new, which is
    what a new length costs (a loop whose length changes every call)."""

    def __init__(self, op: _RNNBase, ctx: Any, t: int, b: int, isize: int, w_ptr: int,
                 w_size: int, seq_lengths: np.ndarray | None = None,
                 layer: "RNNPlan | None" = None) -> None:
        lib = self.lib = cudnn()
        self.handle = lib.handle(ctx)
        if layer is not None:
            self.dropout, self.rnn, self.h = layer.dropout, layer.rnn, layer.h
            self.weight_bytes, self.algo = layer.weight_bytes, layer.algo
        else:
            self._layer(op, ctx, b, isize, w_ptr, w_size, rnn_algorithm(op, b))
        per_row = [t] * b if seq_lengths is None else [int(v) for v in seq_lengths]
        lengths = (ctypes.c_int * b)(*per_row)
        # devSeqLengths of a plan with lengths: uploaded once here (not capturable: see the
        # module docstring); None: a memset of the full length per call
        self.dev_lengths = None if seq_lengths is None else new_array(
            ctx, (b,), np.dtype("int32")).set(np.asarray(per_row, dtype=np.int32))
        self.fill = ctypes.c_float(0.0)
        self.x = self._data(t, b, isize, lengths)
        self.y = self._data(t, b, op.hidden_size * op.dirs, lengths)
        ws, rs = ctypes.c_size_t(0), ctypes.c_size_t(0)
        while True:
            try:
                lib.call("cudnnGetRNNTempSpaceSizes", self.handle, self.rnn.ptr,
                         _FWD_TRAINING, self.x.ptr, ctypes.byref(ws), ctypes.byref(rs))
                break
            except CudnnError as exc:
                if self.algo == _ALGO_STANDARD or _NOT_SUPPORTED not in str(exc):
                    raise
            # cuDNN refuses its persistent kernel here: the standard algorithm (the forward
            # and the backward node fall back alike: their plans are made the same way)
            self._layer(op, ctx, b, isize, w_ptr, w_size, _ALGO_STANDARD)
        self.workspace, self.reserve = int(ws.value), max(int(rs.value), 1)
        self.batch, self.seq = b, t

    @staticmethod
    def layer_key(b: int, isize: int, w_size: int) -> tuple:
        """What the layer descriptors depend on (the math mode: the TF32 flag now; whether
        the persistent algorithm may be tried)."""
        return b, isize, w_size, _math_mode("float32"), PERSISTENT

    def _layer(self, op: _RNNBase, ctx: Any, b: int, isize: int, w_ptr: int,
               w_size: int, algo: int) -> None:
        """The RNN, dropout and state descriptors, and the weight layout's check."""
        lib = self.lib
        dt = DATA_TYPES["float32"]
        hs, dirs, layers = op.hidden_size, op.dirs, op.num_layers
        self.dropout = _Desc(lib, "Dropout")
        lib.call("cudnnSetDropoutDescriptor", self.dropout.ptr, self.handle, ctypes.c_float(0.0),
                 None, ctypes.c_size_t(0), ctypes.c_ulonglong(0))
        self.rnn, self.algo = _Desc(lib, "RNN"), algo
        lib.call("cudnnSetRNNDescriptor_v8", self.rnn.ptr, algo, _CELL[op.rnn_mode],
                 _DOUBLE_BIAS, DIRECTION_MODES[op.direction_mode] - 1, _LINEAR_INPUT, dt, dt,
                 _math_mode("float32"), isize, hs, hs, layers, self.dropout.ptr,
                 ctypes.c_uint32(_PADDED_IO_ENABLED))
        self.h = _Desc(lib, "Tensor")
        n = layers * dirs
        lib.call("cudnnSetTensorNdDescriptor", self.h.ptr, dt, 3, (ctypes.c_int * 3)(n, b, hs),
                 (ctypes.c_int * 3)(b * hs, hs, 1))
        size = ctypes.c_size_t(0)
        lib.call("cudnnGetRNNWeightSpaceSize", self.handle, self.rnn.ptr, ctypes.byref(size))
        self.weight_bytes = int(size.value)
        lay = rnn_layout(op.rnn_mode, hs, layers, isize, dirs)
        if self.weight_bytes != 4 * lay.size or w_size != lay.size:
            raise CudnnError(f"{op}: cuDNN's weight space is {self.weight_bytes} bytes for "
                             f"input size {isize}; symgpu's layout has {lay.size} float32 "
                             f"weights and w has {w_size}")
        self._check_layout(op, lay, w_ptr)

    def _data(self, t: int, b: int, width: int, lengths: Any) -> _Desc:
        d = _Desc(self.lib, "RNNData")
        self.lib.call("cudnnSetRNNDataDescriptor", d.ptr, DATA_TYPES["float32"],
                      _SEQ_MAJOR_UNPACKED, t, b, width, lengths, ctypes.byref(self.fill))
        return d

    def _check_layout(self, op: _RNNBase, lay: Any, w_ptr: int) -> None:
        """cuDNN's offsets of every matrix and bias against rnn_layout's."""
        m, bd = _Desc(self.lib, "Tensor"), _Desc(self.lib, "Tensor")
        maddr, baddr = ctypes.c_void_p(), ctypes.c_void_p()
        for p, (mats, biases) in enumerate(zip(lay.mats, lay.biases)):
            for k, ((moff, _), (boff, _)) in enumerate(zip(mats, biases)):
                self.lib.call("cudnnGetRNNWeightParams", self.handle, self.rnn.ptr, p,
                              ctypes.c_size_t(self.weight_bytes), ctypes.c_void_p(w_ptr), k,
                              m.ptr, ctypes.byref(maddr), bd.ptr, ctypes.byref(baddr))
                got = ((maddr.value or 0) - w_ptr) // 4, ((baddr.value or 0) - w_ptr) // 4
                if got != (moff, boff):
                    raise CudnnError(f"{op}: cuDNN places pseudo-layer {p} linLayerID {k}'s "
                                     f"matrix and bias at elements {got}, symgpu's layout at "
                                     f"{(moff, boff)}")


def _ptr(a: Any) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ptr if a is not None else None)


class _GpuRNNBase(_RNNBase):
    """What both GPU ops share: their context, inputs on it and the cached plans."""

    def _gpu(self, args: list) -> tuple[list, Any]:
        ctx = next((a.type.context_name for a in args if is_gpu_var(a)), None)
        out = [as_gpuarray_variable(a, ctx) for a in args]
        for a in out:
            if a.dtype != "float32":
                raise TypeError(f"{self}: cuDNN's RNN takes float32, got {a.type}")
        return out, ctx

    def _host_lengths(self, lengths: Any) -> Any:
        """The lengths as a host int vector (cuDNN's seqLengthArray is read on the host)."""
        v = host_from_gpu(lengths) if is_gpu_var(lengths) else as_tensor_variable(lengths)
        if v.ndim != 1 or v.dtype not in LENGTH_DTYPES:
            raise TypeError(f"{self}: lengths must be an int32 or int64 vector, got {v.type}")
        return v

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        cells = [storage_map[v] for v in node.inputs]
        outs = [storage_map[v] for v in node.outputs]
        plans: dict[tuple, RNNPlan] = {}
        layer_plans: dict[tuple, RNNPlan] = {}   # the newest plan of each layer_key
        li = 3 + int(self.lstm) if self.with_lengths else None

        def thunk() -> None:
            ctx.activate()
            vals = [c[0] for c in cells]
            lengths = None
            if li is not None:
                lengths = check_lengths(self, vals[li], vals[1].shape[0], vals[1].shape[1])
            vals = [v if i == li or v.is_c_contiguous else v.copy()
                    for i, v in enumerate(vals)]
            t, b, isize = vals[1].shape
            layer_key = RNNPlan.layer_key(b, isize, vals[0].shape[0])
            key = (t,) + layer_key + (tuple(lengths.tolist()) if lengths is not None else ())
            plan = plans.pop(key, None)
            if plan is None:
                self._check(vals)
                plan = RNNPlan(self, ctx, t, b, isize, vals[0].ptr, vals[0].shape[0], lengths,
                               layer=layer_plans.get(layer_key))
                layer_plans.pop(layer_key, None)
                layer_plans[layer_key] = plan      # most recently made last
                while len(layer_plans) > PLAN_CACHE:   # a batch size per call: bounded too
                    layer_plans.pop(next(iter(layer_plans)))
                while len(plans) >= PLAN_CACHE:
                    plans.pop(next(iter(plans)))
            plans[key] = plan            # most recently used last
            for cell, v in zip(outs, self._run(ctx, plan, vals)):
                cell[0] = v
        # with lengths the plan depends on values read on the host: never captured
        return thunk if self.with_lengths else _capturable(thunk)

    def _check(self, vals: list) -> None:
        w, x, hx = vals[:3]
        hshape = (self.num_layers * self.dirs, x.shape[1], self.hidden_size)
        others = vals[3:4] if self.lstm else []
        if tuple(hx.shape) != hshape or any(tuple(c.shape) != hshape for c in others):
            raise ValueError(f"{self}: for x of shape {x.shape} hx (and cx) need shape "
                             f"{hshape}, got {[tuple(v.shape) for v in [hx] + others]}")

    def _lengths(self, ctx: Any, plan: RNNPlan) -> Any:
        if plan.dev_lengths is not None:
            return plan.dev_lengths
        return new_array(ctx, (plan.batch,), np.dtype("int32")).fill(plan.seq)


class GpuDnnRNNForward(_GpuRNNBase):
    """(w, x, hx[, cx][, lengths]) -> (y, hy[, cy], reserve) through cudnnRNNForward
    (training mode); lengths (with_lengths) a host int vector."""

    def make_node(self, w: Any, x: Any, hx: Any, *more: Any) -> Apply:
        fwd = self._forward_args(w, x, hx, more)
        args, ctx = self._gpu(fwd[:3 + int(self.lstm)])
        if self.with_lengths:
            args.append(self._host_lengths(fwd[-1]))
        t3 = GpuArrayType("float32", (False, False, False), ctx)
        outs = [t3(name="rnn_y"), t3(name="rnn_hy")] + ([t3(name="rnn_cy")] if self.lstm else [])
        outs.append(GpuArrayType("uint8", (False,), ctx)(name="rnn_reserve"))
        return Apply(self, args, outs)

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        raise ShapeError(f"{self}: the reserve space's size is cuDNN's, known when the plan "
                         "is made (cudnnGetRNNTempSpaceSizes), not from the inputs' shapes")

    def _run(self, ctx: Any, plan: RNNPlan, vals: list) -> list:
        w, x, hx = vals[:3]
        cx = vals[3] if self.lstm else None
        f32 = np.dtype("float32")
        t, b, _ = x.shape
        y = new_array(ctx, (t, b, self.hidden_size * self.dirs), f32)
        hy = new_array(ctx, tuple(hx.shape), f32)
        cy = new_array(ctx, tuple(hx.shape), f32) if self.lstm else None
        reserve = new_array(ctx, (plan.reserve,), np.dtype("uint8"))
        lengths = self._lengths(ctx, plan)
        ws = ctx.pool.allocate(plan.workspace) if plan.workspace else None
        plan.lib.call("cudnnRNNForward", plan.handle, plan.rnn.ptr, _FWD_TRAINING,
                      _ptr(lengths), plan.x.ptr, _ptr(x), plan.y.ptr, _ptr(y), plan.h.ptr,
                      _ptr(hx), _ptr(hy), plan.h.ptr, _ptr(cx), _ptr(cy),
                      ctypes.c_size_t(plan.weight_bytes), _ptr(w),
                      ctypes.c_size_t(plan.workspace), _ptr(ws),
                      ctypes.c_size_t(plan.reserve), _ptr(reserve))
        return [y, hy] + ([cy] if self.lstm else []) + [reserve]


class GpuDnnRNNBackward(_GpuRNNBase):
    """(w, x, hx[, cx][, lengths], y, reserve, dy, dhy[, dcy]) -> (dx, dhx[, dcx], dw):
    cudnnRNNBackwardData_v8 then cudnnRNNBackwardWeights_v8 on a copy of the reserve."""

    def make_node(self, *args: Any) -> Apply:
        k, s = self.n_fwd, 3 + int(self.lstm)
        n = k + 4 + int(self.lstm)
        if len(args) != n:
            raise TypeError(f"{self}: takes {n} inputs, got {len(args)}")
        ctx = next((a.type.context_name for a in args if is_gpu_var(a)), None)
        reserve = as_gpuarray_variable(args[k + 1], ctx)
        rest, ctx = self._gpu(list(args[:s]) + [args[k]] + list(args[k + 2:]))
        lengths = [self._host_lengths(args[s])] if self.with_lengths else []
        ins = rest[:s] + lengths + [rest[s], reserve] + rest[s + 1:]
        outs = [v.type() for v in ins[1:s]] + [ins[0].type()]
        return Apply(self, ins, outs)

    def infer_shape(self, fgraph: Any, node: Apply, shapes: list) -> list:
        return list(shapes[1:3 + int(self.lstm)]) + [shapes[0]]

    def _run(self, ctx: Any, plan: RNNPlan, vals: list) -> list:
        k = self.n_fwd
        w, x, hx = vals[:3]
        cx = vals[3] if self.lstm else None
        y, reserve, dy, dhy = vals[k:k + 4]
        dcy = vals[k + 4] if self.lstm else None
        f32 = np.dtype("float32")
        dx = new_array(ctx, tuple(x.shape), f32)
        dhx = new_array(ctx, tuple(hx.shape), f32)
        dcx = new_array(ctx, tuple(hx.shape), f32) if self.lstm else None
        dw = new_array(ctx, tuple(w.shape), f32).fill(0)
        reserve = reserve.copy()      # backward data writes into it
        lengths = self._lengths(ctx, plan)
        ws = ctx.pool.allocate(plan.workspace) if plan.workspace else None
        wsz, rsz = ctypes.c_size_t(plan.workspace), ctypes.c_size_t(plan.reserve)
        wbytes = ctypes.c_size_t(plan.weight_bytes)
        plan.lib.call("cudnnRNNBackwardData_v8", plan.handle, plan.rnn.ptr, _ptr(lengths),
                      plan.y.ptr, _ptr(y), _ptr(dy), plan.x.ptr, _ptr(dx), plan.h.ptr,
                      _ptr(hx), _ptr(dhy), _ptr(dhx), plan.h.ptr, _ptr(cx), _ptr(dcy),
                      _ptr(dcx), wbytes, _ptr(w), wsz, _ptr(ws), rsz, _ptr(reserve))
        plan.lib.call("cudnnRNNBackwardWeights_v8", plan.handle, plan.rnn.ptr, _WGRAD_ADD,
                      _ptr(lengths), plan.x.ptr, _ptr(x), plan.h.ptr, _ptr(hx), plan.y.ptr,
                      _ptr(y), wbytes, _ptr(dw), wsz, _ptr(ws), rsz, _ptr(reserve))
        return [dx, dhx] + ([dcx] if self.lstm else []) + [dw]


def _liftable(node: Apply, context_name: Any) -> bool:
    # not the lengths, nor the reserve space (DnnRNNGrad with reserve=True)
    floats = [v for v in node.inputs if v.dtype not in LENGTH_DTYPES + ("uint8",)]
    return (ENABLED and all(v.dtype == "float32" for v in floats)
            and (_context(context_name).virtual or cudnn_available()))


def _lifted_inputs(op: _RNNBase, inputs: Any, context_name: Any) -> list:
    """The lifter's inputs on the GPU, except the lengths: on the host (inputs.host)."""
    li = 3 + int(op.lstm) if op.with_lengths else None
    return [inputs.host(i) if i == li else as_gpuarray_variable(v, context_name)
            for i, v in enumerate(inputs)]


@register_lifter(DnnRNN)
def lift_dnn_rnn(op: Any, node: Apply, context_name: Any, inputs: Any) -> list | None:
    """DnnRNN -> GpuDnnRNNForward (float32, cuDNN loadable), its reserve unused here."""
    if not _liftable(node, context_name):
        return None
    gin = _lifted_inputs(op, inputs, context_name)
    outs = GpuDnnRNNForward(*op.layer_props()).make_node(*gin).outputs
    return list(outs if op.reserve else outs[:-1])


@register_lifter(DnnRNNGrad)
def lift_dnn_rnn_grad(op: Any, node: Apply, context_name: Any, inputs: Any) -> list | None:
    """DnnRNNGrad -> GpuDnnRNNBackward fed by a GpuDnnRNNForward of the same inputs (the
    merge rewrite makes it the lifted forward node, so the reserve comes from there), or,
    with ``reserve=True``, by the y and reserve space it is given."""
    if not _liftable(node, context_name):
        return None
    gin = _lifted_inputs(op, inputs, context_name)
    k = op.n_fwd
    if op.reserve:
        y, reserve, rest = gin[k], gin[k + 1], gin[k + 2:]
    else:
        fwd = GpuDnnRNNForward(*op.layer_props()).make_node(*gin[:k]).outputs
        y, reserve, rest = fwd[0], fwd[-1], gin[k:]
    return list(GpuDnnRNNBackward(*op.layer_props()).make_node(*gin[:k], y, reserve,
                                                               *rest).outputs)


class RNNBlock:
    """Theano's cuDNN RNN layer stack (theano.gpuarray.dnn.RNNBlock): ``apply`` builds the
    host op DnnRNN, run by cuDNN when the graph is placed on a GPU (float32) and by a NumPy
    loop otherwise. The flat weight vector's layout is cuDNN's (symgpu.tensor.nnet.rnn)."""

    def __init__(self, dtype: str, hidden_size: int, num_layers: int, rnn_mode: str,
                 input_mode: str = "linear", direction_mode: str = "unidirectional",
                 context_name: Any = None) -> None:
        if input_mode != "linear":
            raise ValueError(f"RNNBlock: input_mode {input_mode!r}: symgpu's RNNBlock takes "
                             f"input_mode='linear' (an input matrix on the first layer)")
        self.op = DnnRNN(rnn_mode, direction_mode, num_layers, hidden_size)
        self.dtype, self.hidden_size, self.num_layers = str(dtype), int(hidden_size), int(num_layers)
        self.rnn_mode, self.input_mode, self.direction_mode = rnn_mode, input_mode, direction_mode
        self.context_name = context_name

    def _layout(self, input_size: Any) -> Any:
        isize = int(input_size[-1]) if np.ndim(input_size) else int(input_size)
        return rnn_layout(self.rnn_mode, self.hidden_size, self.num_layers, isize,
                          DIRECTION_MODES[self.direction_mode])

    def get_param_size(self, input_size: Any) -> int:
        """Elements of the flat weight vector for inputs of ``input_size`` ((batch, input)
        as Theano's, or the input width)."""
        return self._layout(input_size).size

    def split_params(self, w: Any, layer: int, input_size: Any) -> list:
        """[W_0, bW_0, ..., W_{n-1}, bW_{n-1}, R_0, bR_0, ...] of pseudo-layer ``layer``, as
        Theano's: matrices of shape (in, hidden) (the transposes of cuDNN's row-major
        (hidden, in) blocks) and biases (hidden,). Views of ``w`` when it is a NumPy array
        or a host shared variable (writing them sets the weights), symbolic otherwise."""
        lay = self._layout(input_size)
        if not 0 <= layer < len(lay.mats):
            raise ValueError(f"RNNBlock.split_params: layer {layer} is not in [0, "
                             f"{len(lay.mats)}) (pseudo-layers: layers * directions)")
        if hasattr(w, "get_value") and isinstance(w.get_value(borrow=True), np.ndarray):
            w = w.get_value(borrow=True)
        out = []
        for (moff, (h, c)), (boff, _) in zip(lay.mats[layer], lay.biases[layer]):
            out.append(w[moff:moff + h * c].reshape((h, c)).T)
            out.append(w[boff:boff + h])
        return out

    def apply(self, w: Any, x: Any, hx: Any, cx: Any = None, lengths: Any = None) -> list:
        """[y, hy] ([y, hy, cy] for lstm) of x (seq, batch, input) from hx (and cx)
        (layers * directions, batch, hidden); y is (seq, batch, hidden * directions).
        `lengths` (symgpu's addition): an int vector of per-row lengths in [1, seq]; rows
        stop at their own length (y is 0 past it, hy/cy the state at the row's end)."""
        if lengths is None:
            return list(self.op.make_node(w, x, hx, cx).outputs)
        op = DnnRNN(*self.op._props()[:4], with_lengths=True)
        return list(op.make_node(w, x, hx, cx, lengths).outputs)
