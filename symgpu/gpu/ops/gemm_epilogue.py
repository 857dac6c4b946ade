"""Matrix products with their bias and activation fused in: GpuGemmEpilogue and the pass
``gpu_gemm_epilogue`` (49.46) that makes it.

Why: a layer's ``relu(dot(x, W) + b)`` is a product and an elementwise kernel that reads the
product back and writes it again; cuBLASLt applies the bias (one value per output column)
and the ReLU inside the product's own epilogue (``CUBLASLT_EPILOGUE_BIAS``,
``CUBLASLT_EPILOGUE_RELU_BIAS``), so the layer is one launch and the product is written
once.  In float16/bfloat16 the sum is also rounded once (the epilogue adds in float32),
where the unfused graph rounds the product, then the sum.

The pass, before ``gpu_fusion`` (49.5) would merge the add into other elementwise kernels
and after ``gpu_softmax_rows_bias`` (49.43), which takes a classifier's bias first:

* ``GpuElemwise{add}(GpuDot22(x, W), GpuDimShuffle{x,0}(b))`` -> ``GpuGemmEpilogue{bias}(x,
  W, b)`` when the product has no other reader;
* ``switch(lt(a, 0), 0, a)`` (``symgpu.tensor.nnet.relu``) or ``maximum(a, 0)`` of such an
  ``a`` that nothing else reads -> ``GpuGemmEpilogue{relu_bias}(x, W, b)``.  A training
  graph's ReLU gradient reads ``lt(a, 0)`` too: there only the bias is folded.

``gpuarray.gemm_epilogue`` says for which dtypes: ``half`` (the default: float16 and
bfloat16, where the gain is largest and the rounding better), ``all`` (float32 and float64
too) or ``off``.  Where cuBLASLt is off, missing or has no algorithm for a problem, the
product runs on classic cuBLAS and ``ge_bias_act_<dtype>`` (``codegen/gemm_epilogue.cu``)
applies the epilogue: the same values, one launch more.  GELU is not folded: symgpu has no
``gelu`` whose form (cuBLASLt's is the tanh approximation) a rewrite could recognise.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from symgpu.config import config
from symgpu.gpu.ops import blaslt
from symgpu.gpu.ops.blas import GEMM_DTYPES, GpuDot22, _CublasOp, _blas_matrix, _ctx_name, \
    _gemm_thunk
from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.placement.basic_ops import GpuDimShuffle
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime.codegen import common_source, launch, sections
from symgpu.gpu.runtime.codegen.types import storage_ctype, value_ctype
from symgpu.graph.basic import Apply, Variable, constant_behind
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import sweep
from symgpu.graph.rewriting.db import optdb
from symgpu.scalar.dtypes import HALF_DTYPES
from symgpu.tensor import blas as _host_blas

__all__ = ["GpuGemmEpilogue", "EPILOGUES", "gpu_gemm_epilogue", "epilogue_source",
           "local_gemm_bias_epilogue", "local_gemm_relu_epilogue", "epilogue_dtypes"]

#: epilogue name -> (cublasLtEpilogue_t, whether our kernel applies a ReLU)
EPILOGUES = {"bias": (blaslt.EPILOGUE_BIAS, False),
             "relu_bias": (blaslt.EPILOGUE_RELU_BIAS, True)}
_CU = sections("gemm_epilogue.cu")
_BLOCK = 256
_MAX_BLOCKS = 4096
_BIAS_ALIGN = 16     # bytes: cuBLASLt's vectorised epilogues read the bias so aligned


def epilogue_source(dtype: str) -> str:
    """The CUDA module of ``ge_bias_act_<dtype>`` (the fallback epilogue kernel)."""
    return common_source() + _CU[""].substitute() + _CU["entry"].substitute(
        dt=dtype, t=storage_ctype(dtype), v=value_ctype(dtype))


def _module_key(dtype: str) -> tuple:
    return ("symgpu.gemm_epilogue", dtype)


class _Epilogue:
    """What ``blas._gemm_thunk`` needs of an epilogue: its cuBLASLt code, which input is the
    bias, the bias checked and made readable, and the fallback kernel's launch."""

    bias_index = 2

    def __init__(self, ctx: Any, dtype: str, name: str) -> None:
        self.code, self.relu = EPILOGUES[name]
        self.dtype = np.dtype(dtype)
        kernel = f"ge_bias_act_{dtype}"
        ks = launch.load_kernels(ctx, _module_key(dtype), lambda: epilogue_source(dtype),
                                 {kernel: "PPqqi"})
        self.go = ks[kernel].fast_launcher()

    def operand(self, bias: Any, n: int, label: str) -> Any:
        """``bias`` as cuBLASLt reads it: n packed elements at an aligned address (else a
        copy from the pool)."""
        if bias.shape != (n,):
            raise ValueError(f"{label}: the bias of shape {bias.shape} does not match the "
                             f"{n} columns of the product")
        if n > 1 and bias.strides[0] != bias.dtype.itemsize or bias.ptr % _BIAS_ALIGN:
            bias = bias.copy()
        return bias

    def apply(self, ctx: Any, out: Any, bias: Any) -> None:
        """out = act(out + bias) on ``ctx``'s stream (out C-contiguous, rows x n)."""
        rows, cols = out.shape
        total = rows * cols
        if total:
            blocks = max(1, min(_MAX_BLOCKS, -(-total // _BLOCK)))
            self.go((blocks, 1, 1), (_BLOCK, 1, 1), out.ptr, bias.ptr, rows, cols,
                    int(self.relu))


class GpuGemmEpilogue(_CublasOp):
    """``act(dot(x, y) + b)`` of matrices x, y and a vector b (one value per column of the
    product) in one cuBLASLt call: ``epilogue`` is ``"bias"`` (act = identity) or
    ``"relu_bias"``.  float16, bfloat16 (accumulated in float32), float32, float64."""

    __props__ = ("epilogue",)

    def __init__(self, epilogue: str = "bias"):
        if epilogue not in EPILOGUES:
            raise ValueError(f"GpuGemmEpilogue: epilogue must be one of {sorted(EPILOGUES)}, "
                             f"got {epilogue!r}")
        self.epilogue = epilogue

    def __str__(self) -> str:
        return f"GpuGemmEpilogue{{{self.epilogue}}}"

    infer_shape = _host_blas.Dot22.infer_shape    # x's rows by y's columns

    def make_node(self, x: Any, y: Any, b: Any) -> Apply:
        ctx = _ctx_name(x, y, b)
        x = _blas_matrix(x, ctx, 2, f"{self}'s x", GEMM_DTYPES)
        y = _blas_matrix(y, ctx, 2, f"{self}'s y", GEMM_DTYPES)
        b = _blas_matrix(b, ctx, 1, f"{self}'s bias", GEMM_DTYPES)
        if not x.dtype == y.dtype == b.dtype:
            raise TypeError(f"{self} needs one dtype, got x {x.dtype}, y {y.dtype}, "
                            f"b {b.dtype}")
        out = GpuArrayType(x.dtype, (x.broadcastable[0], y.broadcastable[1]), ctx)
        return Apply(self, [x, y, b], [out()])

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        dtype = node.outputs[0].dtype
        return [(_module_key(dtype), lambda: epilogue_source(dtype), ())]

    def _thunk(self, node: Apply, storage_map: dict, ctx: Any) -> Callable[[], None]:
        epi = _Epilogue(ctx, node.outputs[0].dtype, self.epilogue)
        return _gemm_thunk(self, node, storage_map, ctx, None, 0, 1, (), epi)


# ----------------------------------------------------------------------------- the pass

def epilogue_dtypes() -> tuple[str, ...]:
    """The dtypes whose products take epilogues under ``gpuarray.gemm_epilogue`` now."""
    mode = config.gpuarray.gemm_epilogue
    return {"half": HALF_DTYPES, "all": GEMM_DTYPES}.get(mode, ())


def _only_reader(fgraph: FunctionGraph, var: Variable, readers: set) -> bool:
    """Whether every client of ``var`` is one of the nodes ``readers`` (never an output)."""
    clients = fgraph.clients.get(var, [])
    return bool(clients) and var not in fgraph.outputs and \
        all(c != "output" and c in readers for c, _ in clients)


def _is_zero(var: Variable) -> bool:
    const = constant_behind(var)
    return const is not None and np.all(np.asarray(const.data) == 0)


def _elemwise(node: Any, name: str, nin: int) -> bool:
    return node is not None and type(node.op) is GpuElemwise and not node.op.inplace_pattern \
        and getattr(node.op.scalar_op, "name", None) == name and len(node.inputs) == nin


def local_gemm_bias_epilogue(fgraph: FunctionGraph, node: Apply) -> list[Variable] | None:
    """GpuElemwise{add}(GpuDot22(x, W), GpuDimShuffle{x,0}(b)) (either order) ->
    GpuGemmEpilogue{bias}(x, W, b), when nothing else reads the product."""
    if not _elemwise(node, "add", 2):
        return None
    for p, d in (node.inputs, node.inputs[::-1]):
        pn, dn = p.owner, d.owner
        if pn is None or type(pn.op) is not GpuDot22 or dn is None or \
                type(dn.op) is not GpuDimShuffle or dn.op.new_order != ("x", 0) or \
                dn.inputs[0].dtype != p.dtype or p.dtype not in epilogue_dtypes() or \
                not _only_reader(fgraph, p, {node}):
            continue
        new = GpuGemmEpilogue("bias")(pn.inputs[0], pn.inputs[1], dn.inputs[0])
        if new.type == node.outputs[0].type:
            return [new]
    return None


def local_gemm_relu_epilogue(fgraph: FunctionGraph, node: Apply) -> list[Variable] | None:
    """relu of a GpuGemmEpilogue{bias} that nothing else reads -> GpuGemmEpilogue{relu_bias}:
    ``switch(lt(a, 0), 0, a)`` (symgpu's relu) or ``maximum(a, 0)`` (either order)."""
    a = None
    if _elemwise(node, "switch", 3):
        cond, zero, a = node.inputs
        cn = cond.owner
        if not (_is_zero(zero) and _elemwise(cn, "lt", 2) and cn.inputs[0] is a and
                _is_zero(cn.inputs[1]) and _only_reader(fgraph, cond, {node}) and
                _only_reader(fgraph, a, {node, cn})):
            return None
    elif _elemwise(node, "maximum", 2):
        for v, other in (node.inputs, node.inputs[::-1]):
            if _is_zero(other) and _only_reader(fgraph, v, {node}):
                a = v
                break
    if a is None or a.owner is None or type(a.owner.op) is not GpuGemmEpilogue or \
            a.owner.op.epilogue != "bias":
        return None
    new = GpuGemmEpilogue("relu_bias")(*a.owner.inputs)
    return [new] if new.type == node.outputs[0].type else None


def gpu_gemm_epilogue(fgraph: FunctionGraph) -> int:
    """Fold biases, then ReLUs, into the products that feed them; how many were folded."""
    if not epilogue_dtypes():
        return 0
    return sweep(fgraph, local_gemm_bias_epilogue, "gpu_gemm_epilogue") + \
        sweep(fgraph, local_gemm_relu_epilogue, "gpu_gemm_epilogue")


# after gpu_softmax_rows_bias (49.43), before gpu_fusion (49.5)
optdb.register("gpu_gemm_epilogue", gpu_gemm_epilogue, 49.46, "fast_run", "fusion", "gpu")
