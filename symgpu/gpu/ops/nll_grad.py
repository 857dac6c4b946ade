"""GpuNLLGrad: the gradient reaching a softmax's logits from the tutorials' negative
log-likelihood, ``-mean(log(softmax(z))[arange(n), y])``, in one elementwise launch.

Why: differentiated, that loss scatters ``-1/n`` into a matrix of zeros at ``(i, y_i)`` (a
fill and a scatter kernel), sums each row of the scatter (a reduction) and subtracts the
softmax times that sum (an elementwise kernel): four launches over the logits' shape, where
the value is ``g - m * s`` with g zero but for one element per row. ``gpu_nll_grad_fusion``
(position 49.4, before gpu_fusion) finds ``scatter - m * rowsum(scatter)`` where the scatter
writes rows ``arange(0, r, 1)`` of a zero matrix, and replaces it by this op: the same
values (the row sum of a one-hot row is its one value, exactly), any m of the scatter's
shape. Labels are checked as the scatter checks them (negative ones count from the end; one
out of range raises IndexError at the next synchronisation, naming the shapes).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from symgpu.gpu.ops.advanced import ERROR_REPORT_SOURCE, INDEX_DTYPES
from symgpu.gpu.ops.advanced_pairs import GpuAdvancedIncSubtensor2, GpuARange
from symgpu.gpu.ops.careduce import GpuCAReduce
from symgpu.gpu.ops.elemwise import GpuElemwise, cast_target
from symgpu.gpu.ops.softmax_rows import GpuSoftmaxRows
from symgpu.gpu.placement.basic_ops import GpuDimShuffle, GpuFromHost
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime.array import GpuArray
from symgpu.gpu.runtime.codegen import common_source, sections
from symgpu.gpu.runtime.codegen.scalar import output_dtypes
from symgpu.gpu.runtime.codegen.types import value_ctype
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.gpu.runtime.device_checks import DeviceChecked, launch_checked
from symgpu.graph.basic import Apply, Constant, Variable, constant_behind
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.op import Op
from symgpu.graph.rewriting import InconsistencyError, replace_validate, sweep
from symgpu.graph.rewriting.db import optdb
from symgpu.tensor.type import as_tensor_variable, constant

__all__ = ["GpuNLLGrad", "NLL_GRAD_DTYPES", "COPY_DTYPES", "nll_grad_source",
           "gpu_nll_grad_fusion", "gpu_nll_grad_log_softmax", "gpu_nll_grad_half_copy",
           "gpu_nll_grad_count"]

#: value dtype -> CUDA storage type (the half types computed in float32)
NLL_GRAD_DTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float",
                   "float64": "double"}
_BLOCK = 256
_MAX_BLOCKS = 4096
_MODULE_KEY = ("symgpu.nll_grad",)
_CU = sections("nll_grad.cu")


#: the half types a float32 gradient may also be written in (``copy_dtype``)
COPY_DTYPES = ("float16", "bfloat16")


def _kernel_name(dtype: str, idx_dtype: str, exp_m: bool = False,
                 copy_dtype: str | None = None) -> str:
    name = f"nll_grad_{'exp_' if exp_m else ''}{dtype}_{idx_dtype}"
    return f"{name}_copy_{copy_dtype}" if copy_dtype else name


def nll_grad_source() -> str:
    """The CUDA module with every ``nll_grad_[exp_]<dtype>_<label dtype>`` kernel, and the
    float32 ones that also write a half copy (``..._copy_<half>``)."""
    parts = [common_source(), ERROR_REPORT_SOURCE, _CU[""].substitute()]
    kinds = [(d, None) for d in NLL_GRAD_DTYPES] + [("float32", h) for h in COPY_DTYPES]
    for dtype, copy in kinds:
        t = NLL_GRAD_DTYPES[dtype]
        for idt, it in INDEX_DTYPES.items():
            for exp_m in (False, True):
                parts.append(_CU["copy" if copy else "grad"].substitute(
                    name=_kernel_name(dtype, idt, exp_m, copy), t=t, vt=value_ctype(dtype),
                    it=it, exp_m=str(exp_m).lower(), h=NLL_GRAD_DTYPES[copy or dtype]))
    return "".join(parts)


def _elems(a: Any) -> tuple[Any, tuple[int, ...]]:
    """(a, its strides in elements, 0 on length-1 axes), or a contiguous copy's."""
    isz = a.dtype.itemsize
    if any(s % isz for s, n in zip(a.strides, a.shape) if n > 1):
        a = a.copy()
    return a, tuple(0 if n <= 1 else s // isz for s, n in zip(a.strides, a.shape))


class GpuNLLGrad(DeviceChecked, Op):
    """``g - m * rowsum(g)`` where g is a zero matrix of m's shape but for ``g[i, y_i] = v_i``
    in its first ``labelled`` rows: a new C-contiguous matrix. Inputs: v (a vector of length
    ``labelled``, or of length 1: broadcast), m (a float matrix), labelled (a host integer),
    y (int32/int64 labels, of length ``labelled`` or 1). With ``exp_m`` the input is log(m)
    (``gpu_nll_grad_log_softmax``: the loss's log-softmax, so no softmax of its own). With
    ``copy_dtype`` (a half type; m float32) a second output holds the values rounded to it
    (``gpu_nll_grad_half_copy``: the cast a mixed-precision step makes for its products).
    With ``count_op`` (a scalar op of one integer), v is a host integer c instead and every
    value is ``count_op(c)``, computed on the host when the node runs (``gpu_nll_grad_count``:
    a loss's ``-1 / n`` of the labels' count, no one-element kernel of its own; under a CUDA
    graph the host inputs key the graph, so the value captured is the one replayed)."""

    __props__ = ("exp_m", "copy_dtype", "count_op")

    def __init__(self, exp_m: bool = False, copy_dtype: str | None = None,
                 count_op: Any = None):
        if copy_dtype is not None and copy_dtype not in COPY_DTYPES:
            raise ValueError(f"GpuNLLGrad: copy_dtype must be one of {COPY_DTYPES} or None, "
                             f"got {copy_dtype!r}")
        if count_op is not None and getattr(count_op, "nin", 1) != 1:
            raise ValueError(f"GpuNLLGrad: count_op must take one input, got {count_op}")
        self.exp_m, self.copy_dtype, self.count_op = bool(exp_m), copy_dtype, count_op

    def __str__(self) -> str:
        parts = (["exp"] if self.exp_m else []) + ([f"+{self.copy_dtype}"] if self.copy_dtype
                                                   else [])
        if self.count_op is not None:
            parts.append(f"v={self.count_op}")
        return f"GpuNLLGrad{{{','.join(parts)}}}" if parts else "GpuNLLGrad"

    def make_node(self, v: Any, m: Any, labelled: Any, y: Any) -> Apply:
        labelled = as_tensor_variable(labelled)
        if self.count_op is not None:
            v = as_tensor_variable(v)
        if not ((self.count_op is not None or is_gpu_var(v)) and is_gpu_var(m)
                and is_gpu_var(y)):
            raise TypeError(f"{self}: v, m and y must be GPU variables, got {v}, {m}, {y}")
        if m.ndim != 2 or m.dtype not in NLL_GRAD_DTYPES:
            raise TypeError(f"{self}: m must be a float matrix ({', '.join(NLL_GRAD_DTYPES)}), "
                            f"got {m.type}")
        if self.count_op is not None:
            if v.ndim != 0 or not v.dtype.startswith(("int", "uint")) or \
                    list(output_dtypes(self.count_op, [v.dtype])) != [m.dtype]:
                raise TypeError(f"{self}: v must be a host integer scalar the count op maps "
                                f"to {m.dtype}, got {v.type}")
        elif v.ndim != 1 or v.dtype != m.dtype:
            raise TypeError(f"{self}: m must be a float matrix and v a vector of its dtype, "
                            f"got {m.type} and {v.type}")
        if y.ndim != 1 or y.dtype not in INDEX_DTYPES:
            raise TypeError(f"{self}: labels must be an int32/int64 vector, got {y.type}")
        if labelled.ndim != 0 or not labelled.dtype.startswith(("int", "uint")):
            raise TypeError(f"{self}: the labelled row count must be an integer scalar, got "
                            f"{labelled.type}")
        outs = [GpuArrayType(m.dtype, (False, False), m.type.context_name)()]
        if self.copy_dtype is not None:
            if m.dtype != "float32":
                raise TypeError(f"{self}: a half copy is of a float32 gradient, got {m.type}")
            outs.append(GpuArrayType(self.copy_dtype, (False, False), m.type.context_name)())
        return Apply(self, [v, m, labelled, y], outs)

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[1]] * len(node.outputs)

    def prefetch_sources(self, node: Apply) -> list[tuple[Any, Callable[[], str], tuple]]:
        """The module (else compiled on the first call), for the link-time prefetch."""
        return [(_MODULE_KEY, nll_grad_source, ())]

    def perform_args(self, node: Apply) -> tuple[str]:
        """``perform``'s kernel, from the node's dtypes (its run-time arrays'): resolved
        once per node, by Op.make_thunk."""
        return (_kernel_name(node.inputs[1].dtype, node.inputs[3].dtype, self.exp_m,
                             self.copy_dtype),)

    def perform(self, node, inputs, out, kernel=None):
        v, m, labelled, y = inputs
        rows, cols = m.shape
        labelled = int(labelled)
        shape = (rows, cols)
        if labelled > rows:   # the scatter's row index arange(labelled) would be out of range
            raise IndexError(f"{self}: index {rows} is out of bounds for an array of shape "
                             f"{shape} (axis 0 has length {rows}, axis 1 has length {cols})")
        vconst = 0.0
        if self.count_op is not None:   # one value, computed here from the host count
            vconst = float(np.asarray(self.count_op.impl(np.asarray(v, node.inputs[0].dtype)),
                                      m.dtype))
            v = None
        for name, a in (("values", v), ("labels", y)) if v is not None else (("labels", y),):
            if a.shape[0] not in (1, labelled):
                raise ValueError(f"{self}: {name} of shape {a.shape} do not broadcast to the "
                                 f"{labelled} labelled rows of an array of shape {shape}")
        res = GpuArray(shape, m.dtype, m.context)
        copy = () if self.copy_dtype is None else (GpuArray(shape, self.copy_dtype, m.context),)
        if labelled and not cols:
            raise IndexError(f"{self}: no label can index an array of shape {shape} (axis 1 "
                             f"has length 0)")
        if rows and cols:
            vptr, vs = 0, 0
            if v is not None:
                v, (vs,) = _elems(v)
                vptr = v.ptr
            y, (ys,) = _elems(y)
            m, (ms0, ms1) = _elems(m)
            ctx = m.context
            ctx.activate()
            fn = get_prepared_kernel(_MODULE_KEY, nll_grad_source,
                                     self.perform_args(node)[0] if kernel is None else kernel,
                                     "PqdPqqPqP" + "P" * len(copy) + "qqqP", context=ctx)
            blocks = max(1, min(_MAX_BLOCKS, -(-(rows * cols) // _BLOCK)))

            def describe(bad: int) -> Exception:
                return IndexError(f"{self}: index {bad} is out of bounds for an array of shape "
                                  f"{shape} (axis 0 has length {rows}, axis 1 has length "
                                  f"{cols})")
            launch_checked(node, ctx, fn, (blocks, 1), (_BLOCK, 1, 1),
                           (vptr, vs, vconst, m.ptr, ms0, ms1, y.ptr, ys, res.ptr,
                            *(c.ptr for c in copy), rows, cols, labelled), describe)
        out[0][0] = res
        if copy:
            out[1][0] = copy[0]


# ----------------------------------------------------------------------------- the pass

def _constant_value(var: Variable) -> Any:
    c = constant_behind(var)
    if c is None:
        return None
    try:
        return c.data.item() if getattr(c.data, "size", 0) == 1 else None
    except (AttributeError, ValueError):
        return None


def _is_zero_fill(var: Variable) -> bool:
    """``second(x, 0)``: zeros of x's shape (what zeros_like lifts to)."""
    node = var.owner
    return (node is not None and type(node.op) is GpuElemwise and not node.op.inplace_pattern
            and getattr(node.op.scalar_op, "name", None) == "second" and len(node.inputs) == 2
            and _constant_value(node.inputs[1]) == 0)


def _first_rows(var: Variable) -> Variable | None:
    """The row count r of ``arange(0, r, 1)`` (GpuARange, or a constant folded from one),
    else None."""
    node = var.owner
    if node is None or type(node.op) is not GpuARange:
        const = constant_behind(var)
        data = getattr(const, "data", None)
        if isinstance(data, np.ndarray) and data.ndim == 1 and data.dtype.kind in "iu" and \
                np.array_equal(data, np.arange(data.shape[0])):
            return constant(np.int64(data.shape[0]))
        return None
    start, stop, step = node.inputs
    if _constant_value(start) != 0 or _constant_value(step) != 1:
        return None
    return stop


def _one_hot_scatter(var: Variable) -> tuple[Variable, Variable, Variable] | None:
    """(v, r, y) when ``var`` is zeros with ``v`` scattered (set or added) at rows
    ``arange(0, r, 1)``, columns y; else None."""
    node = var.owner
    if node is None or type(node.op) is not GpuAdvancedIncSubtensor2:
        return None
    zeros, v, rows, y = node.inputs
    r = _first_rows(rows)
    if r is None or not _is_zero_fill(zeros) or v.ndim != 1 or v.dtype != var.dtype:
        return None
    return v, r, y


def _row_sum_of(var: Variable, g: Variable) -> bool:
    """Whether ``var`` is ``g.sum(axis=1, keepdims=True)`` (a GpuCAReduce then a
    GpuDimShuffle putting the kept axis back)."""
    node = var.owner
    if node is None or type(node.op) is not GpuDimShuffle or node.op.new_order != (0, "x"):
        return False
    red = node.inputs[0].owner
    return (red is not None and type(red.op) is GpuCAReduce and red.inputs == [g]
            and getattr(red.op.scalar_op, "name", None) == "add" and red.op.pre_scalar_op is None
            and red.op.axis == (1,) and red.outputs[0].dtype == g.dtype)


def _match(fgraph: FunctionGraph, node: Apply) -> list[Variable] | None:
    """The replacement of ``sub(g, mul(m, rowsum(g)))`` (either factor order) with g a
    one-hot scatter, else None."""
    if type(node.op) is not GpuElemwise or node.op.inplace_pattern or \
            getattr(node.op.scalar_op, "name", None) != "sub" or len(node.inputs) != 2:
        return None
    g, prod = node.inputs
    out = node.outputs[0]
    if g.ndim != 2 or g.dtype not in NLL_GRAD_DTYPES or out.dtype != g.dtype or \
            out.broadcastable != (False, False) or prod.owner is None:
        return None
    pnode = prod.owner
    if type(pnode.op) is not GpuElemwise or pnode.op.inplace_pattern or \
            getattr(pnode.op.scalar_op, "name", None) != "mul" or len(pnode.inputs) != 2:
        return None
    scatter = _one_hot_scatter(g)
    if scatter is None:
        return None
    a, b = pnode.inputs
    m = b if _row_sum_of(a, g) else (a if _row_sum_of(b, g) else None)
    if m is None or m.dtype != g.dtype or m.broadcastable != (False, False):
        return None
    v, r, y = scatter
    return [GpuNLLGrad()(v, m, r, y)]


def gpu_nll_grad_fusion(fgraph: FunctionGraph) -> int:
    """Replace each ``scatter - m * rowsum(scatter)`` of a one-hot scatter by GpuNLLGrad;
    returns how many were replaced."""
    return sweep(fgraph, _match, "gpu_nll_grad_fusion")


optdb.register("gpu_nll_grad_fusion", gpu_nll_grad_fusion, 49.4, "fast_run", "fusion", "gpu")


def _softmax_rows(var: Variable, log: bool) -> list[Variable] | None:
    """The inputs of ``GpuSoftmaxRows{log or softmax}`` when ``var`` is one: ``[x]``, or
    ``[x, b]`` with a bias; else None."""
    node = var.owner
    if node is None or type(node.op) is not GpuSoftmaxRows or node.op.log != log:
        return None
    return node.inputs


def _same(a: list[Variable] | None, b: list[Variable]) -> bool:
    return a is not None and len(a) == len(b) and all(u is w for u, w in zip(a, b))


def _exp_of_log_softmax(m: Variable) -> Variable | None:
    """L where ``m`` is ``GpuElemwise{exp}(L)`` of a log-softmax L (GpuSoftmaxRows{log}): the
    softmax as the gradient of ``T.nnet.logsoftmax`` writes it; else None."""
    node = m.owner
    if node is None or type(node.op) is not GpuElemwise or node.op.inplace_pattern or \
            getattr(node.op.scalar_op, "name", None) != "exp" or len(node.inputs) != 1:
        return None
    (log,) = node.inputs
    return log if _softmax_rows(log, log=True) is not None and log.type == m.type else None


def _from_log_softmax(fgraph: FunctionGraph, node: Apply) -> list[Variable] | None:
    """GpuNLLGrad(v, softmax(z), r, y) -> GpuNLLGrad{exp}(v, log_softmax(z), r, y) where the
    graph computes log_softmax(z) anyway, else None. With a bias (GpuSoftmaxRows{bias}:
    softmax(z + b)), only a log-softmax of the same z and the same b will do. The softmax
    written ``exp(log_softmax(z))`` (the gradient of a loss spelled with
    ``T.nnet.logsoftmax``) is read the same way: the exp taken in the gradient's kernel, its
    own launch gone."""
    if type(node.op) is not GpuNLLGrad or node.op.exp_m:
        return None
    v, m, r, y = node.inputs
    log = _exp_of_log_softmax(m)
    if log is not None:
        return [GpuNLLGrad(exp_m=True)(v, log, r, y)]
    args = _softmax_rows(m, log=False)
    if args is None:
        return None
    logs = [c.outputs[0] for c, _ in fgraph.clients.get(args[0], [])
            if isinstance(c, Apply) and _same(_softmax_rows(c.outputs[0], log=True), args)]
    if not logs or logs[0].type != m.type:
        return None
    return [GpuNLLGrad(exp_m=True)(v, logs[0], r, y)]


def gpu_nll_grad_log_softmax(fgraph: FunctionGraph) -> int:
    """Make each GpuNLLGrad read the loss's log-softmax where the graph has one
    (`_from_log_softmax`): the gradient takes exp of the loss's log-probabilities (within a
    few ulp of the softmax) and the softmax kernel (or the exp of the log-softmax), read by
    nothing else, is gone. Returns
    how many were replaced. In the default passes (fast_run);
    ``optimizer_excluding=gpu_nll_grad_log_softmax`` turns it off."""
    return sweep(fgraph, _from_log_softmax, "gpu_nll_grad_log_softmax")


optdb.register("gpu_nll_grad_log_softmax", gpu_nll_grad_log_softmax, 49.42, "fast_run", "fusion",
               "gpu")


def _half_casts(fgraph: FunctionGraph, var: Variable) -> list[Apply]:
    """The readers of ``var`` that are ``GpuElemwise{Cast{<half>}}`` of it alone."""
    return [c for c, _ in fgraph.clients.get(var, []) if cast_target(c) in COPY_DTYPES]


def gpu_nll_grad_half_copy(fgraph: FunctionGraph) -> int:
    """A float32 GpuNLLGrad read by a cast to a half type also writes that half copy
    (``copy_dtype``): the mixed-precision step's cast of the gradient for its products is no
    launch of its own (the float32 values stay for the bias gradient's float32 sum). Returns
    how many were given a copy. In the default passes (fast_run);
    ``optimizer_excluding=gpu_nll_grad_half_copy`` turns it off."""
    done = 0
    for node in list(fgraph.toposort()):
        if type(node.op) is not GpuNLLGrad or node.op.copy_dtype is not None or \
                node.outputs[0].dtype != "float32" or node not in fgraph.apply_nodes:
            continue
        casts = _half_casts(fgraph, node.outputs[0])
        if not casts:
            continue
        half = casts[0].outputs[0].dtype
        new = GpuNLLGrad(node.op.exp_m, half).make_node(*node.inputs).outputs
        pairs = [(node.outputs[0], new[0])] + [(c.outputs[0], new[1]) for c in casts
                                               if c.outputs[0].dtype == half]
        try:
            replace_validate(fgraph, pairs, reason="gpu_nll_grad_half_copy")
        except InconsistencyError:
            continue
        done += 1
    return done


# after gpu_nll_grad_log_softmax (which makes new GpuNLLGrad nodes), before gpu_fusion
optdb.register("gpu_nll_grad_half_copy", gpu_nll_grad_half_copy, 49.425, "fast_run", "fusion",
               "gpu")


def _one_value_of_a_count(v: Variable) -> tuple[Any, Variable] | None:
    """(f, c) where ``v`` is a one-element GpuElemwise ``f`` of the upload of a host integer
    scalar c computed from lengths (broadcast by dimshuffles): a loss's ``-1 / n``; else
    None."""
    node = v.owner
    if node is None or type(node.op) is not GpuElemwise or node.op.inplace_pattern or \
            len(node.inputs) != 1 or len(node.outputs) != 1 or not all(v.broadcastable):
        return None
    src = node.inputs[0]
    while src.owner is not None and type(src.owner.op) is GpuDimShuffle:
        src = src.owner.inputs[0]
    up = src.owner
    if up is None or type(up.op) is not GpuFromHost:
        return None
    (c,) = up.inputs
    if is_gpu_var(c) or c.ndim != 0 or not c.dtype.startswith(("int", "uint")) or \
            not _from_lengths(c):
        return None
    return node.op.scalar_op, c


def _from_lengths(var: Variable, depth: int = 6) -> bool:
    """Whether host value ``var`` is computed from arrays' lengths and constants only: such a
    value keys a CUDA graph through the lengths anyway, where an integer the caller passes
    (uploaded as a graph parameter) would key a new capture for each value it takes."""
    if isinstance(var, Constant):
        return True
    node = var.owner
    if node is None or depth == 0 or is_gpu_var(var):
        return False
    if getattr(node.op, "shape_read", None):
        return True
    return all(_from_lengths(v, depth - 1) for v in node.inputs)


def _with_count(fgraph: FunctionGraph, node: Apply) -> list[Variable] | None:
    if type(node.op) is not GpuNLLGrad or node.op.count_op is not None:
        return None
    v, m, r, y = node.inputs
    found = _one_value_of_a_count(v)
    if found is None:
        return None
    op, c = found
    try:
        new = GpuNLLGrad(node.op.exp_m, node.op.copy_dtype, op).make_node(c, m, r, y).outputs
    except TypeError:
        return None
    return new


def gpu_nll_grad_count(fgraph: FunctionGraph) -> int:
    """GpuNLLGrad(f(upload(c)), ...) -> GpuNLLGrad{v=f}(c, ...) for a one-element kernel f of
    a host integer c (the loss's ``-1 / n``): the value is computed on the host when the node
    runs, and its kernel is no launch of its own (the float32 classifier's step had it as one
    more launch of two microseconds). Returns how many were replaced. In the default passes
    (fast_run); ``optimizer_excluding=gpu_nll_grad_count`` turns it off."""
    return sweep(fgraph, _with_count, "gpu_nll_grad_count")


# after gpu_fusion (49.5), which makes the -1 / n one kernel of the count
optdb.register("gpu_nll_grad_count", gpu_nll_grad_count, 49.51, "fast_run", "fusion", "gpu")
