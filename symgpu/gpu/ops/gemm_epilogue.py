"""Matrix products with their bias and activation fused in: GpuGemmEpilogue and the pass
``gpu_gemm_epilogue`` (49.46) that makes its ``bias`` and ``relu_bias`` forms.

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
* the same through a GpuReshape of the product that keeps its columns as the last axis (a
  3-d activation's ``dot(a, W) + b``: ``GpuDimShuffle{x,x,0}(b)``; proven from the graph's
  shapes, else left alone), the reshape then applied to the fused result;
* mixed precision's ``Cast{half}(Cast{float32}(p) + b)`` (either order) of such a half
  product ``p`` and a float32 bias (a float32 master weight's) -> ``GpuGemmEpilogue{bias}``
  of ``Cast{half}(b)``: the bias rounded to half, as PyTorch's autocast rounds a linear
  layer's, then added to the float32 accumulator, the sum rounded once; the unfused graph
  rounds the product instead, so results may differ by about one half-precision ulp of the
  larger of the product and the bias.  (cuBLASLt takes a float32 bias for a half D only in
  some configurations: on the H200 it declined BIAS_DATA_TYPE CUDA_R_32F for the GPT
  block's bf16 qkv product.)  The GPT block's qkv projection no longer reads and writes its
  activation a second time, and the bias's cast joins the weights' cast group;
* ``switch(lt(a, 0), 0, a)`` (``symgpu.tensor.nnet.relu``) or ``maximum(a, 0)`` of such an
  ``a`` that nothing else reads -> ``GpuGemmEpilogue{relu_bias}(x, W, b)``.  A training
  graph's ReLU gradient reads ``lt(a, 0)`` too: there only the bias is folded.

A reader that needs only the product's shape (a shape read, or the fill ``second(p, 0)`` of
a gradient's zero tail, possibly through a slice or reshape) does not count: it is moved
onto the fused result, which has that shape.

``gpuarray.gemm_epilogue`` says for which dtypes: ``half`` (the default: float16 and
bfloat16, where the gain is largest and the rounding better), ``all`` (float32 and float64
too) or ``off``.  Where cuBLASLt is off, missing or has no algorithm for a problem, the
product runs on classic cuBLAS and ``ge_bias_act_<dtype>`` (``codegen/gemm_epilogue.cu``)
applies the epilogue: the same values, one launch more.

GELU (always the tanh form cuBLASLt computes: ``0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715
z^3)))``) has two epilogues, for a GPT block's MLP: ``gelu_aux_bias`` (``x, W, b`` -> ``out =
gelu(x @ W + b)`` and ``aux = x @ W + b``, the pre-activation the backward pass needs,
rounded to the dtype: CUBLASLT_EPILOGUE_GELU_AUX_BIAS) and ``dgelu`` (``x, W, aux`` -> ``(x @
W) * gelu'(aux)``, the gradient through the GELU: CUBLASLT_EPILOGUE_DGELU; aux of the
product's size, read in C order as its shape), so neither the activation nor its gradient
is a kernel of its own; ``gelu_bias`` (GELU_BIAS) is the forward without aux, for
inference.  The pass here does not make them: the
rewrite in ``symgpu/gpu/ops/gelu_epilogue_rewrite.py`` recognises the GELU and its gradient.
Their fallback is ``ge_gelu_<dtype>`` after classic cuBLAS.  (DGELU_BGRAD, which also sums
the bias gradient, took 223 us for the GPT's bf16 product on an H200 against DGELU's 76: not
used.)
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from symgpu.config import config
from symgpu.gpu.ops import blaslt
from symgpu.gpu.ops.blas import GEMM_DTYPES, GpuDot22, _CublasOp, _blas_matrix, _ctx_name, \
    _gemm_thunk
from symgpu.gpu.ops.elemwise import GpuElemwise, cast_target
from symgpu.gpu.ops.subtensor import GpuSubtensor
from symgpu.gpu.placement.basic_ops import GpuDimShuffle, GpuReshape
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime.codegen import common_source, launch, sections
from symgpu.gpu.runtime.codegen.types import storage_ctype, value_ctype
from symgpu.graph.basic import Apply, Variable, constant_behind
from symgpu.graph.fg import FunctionGraph
from symgpu.graph.rewriting import sweep
from symgpu.graph.rewriting.db import optdb
from symgpu.scalar.basic import Cast
from symgpu.scalar.dtypes import HALF_DTYPES
from symgpu.tensor import blas as _host_blas
from symgpu.tensor.rewriting.shape_feature import inferred_shape
from symgpu.tensor.rewriting.shape_ops import same_length

__all__ = ["GpuGemmEpilogue", "EPILOGUES", "EpilogueFacts", "gpu_gemm_epilogue",
           "epilogue_source", "local_gemm_bias_epilogue", "local_gemm_relu_epilogue",
           "epilogue_dtypes", "bias_vector", "keeps_columns", "shape_readers", "moved_pairs"]


class EpilogueFacts(NamedTuple):
    """What the op, the thunk and the fallback need of one epilogue (a row of EPILOGUES)."""
    code: int              # its cublasLtEpilogue_t
    bias: int | None       # the input that is the bias vector (one value per column), if any
    aux_in: int | None     # the input that is aux, a matrix of the product's shape, if any
    aux_out: bool          # whether aux (the pre-activation) is a second output
    kernel: str            # the fallback kernel (codegen/gemm_epilogue.cu), without dtype
    act: int               # its last argument: ge_bias_act's relu, ge_gelu's grad


#: epilogue name -> its facts; inputs are (x, y, third), the third a bias or an aux matrix
EPILOGUES = {
    "bias": EpilogueFacts(blaslt.EPILOGUE_BIAS, 2, None, False, "ge_bias_act", 0),
    "relu_bias": EpilogueFacts(blaslt.EPILOGUE_RELU_BIAS, 2, None, False, "ge_bias_act", 1),
    "gelu_aux_bias": EpilogueFacts(blaslt.EPILOGUE_GELU_AUX_BIAS, 2, None, True, "ge_gelu",
                                   0),
    "dgelu": EpilogueFacts(blaslt.EPILOGUE_DGELU, None, 2, False, "ge_gelu", 1),
    "gelu_bias": EpilogueFacts(blaslt.EPILOGUE_GELU_BIAS, 2, None, False, "ge_gelu", 2),
}
#: fallback kernel -> (its argument format, whether it takes the aux matrix)
_KERNELS = {"ge_bias_act": ("PPqqi", False), "ge_gelu": ("PPPqqi", True)}
_CU = sections("gemm_epilogue.cu")
_BLOCK = 256
_MAX_BLOCKS = 4096
_BIAS_ALIGN = 16     # bytes: cuBLASLt's vectorised epilogues read the bias (and aux) so aligned


def epilogue_source(dtype: str) -> str:
    """The CUDA module of ``ge_bias_act_<dtype>`` and ``ge_gelu_<dtype>`` (the fallback
    epilogue kernels)."""
    return common_source() + _CU[""].substitute() + _CU["entry"].substitute(
        dt=dtype, t=storage_ctype(dtype), v=value_ctype(dtype))


def _module_key(dtype: str) -> tuple:
    return ("symgpu.gemm_epilogue", dtype)


class _Epilogue:
    """What ``blas._gemm_thunk`` needs of an epilogue: its cuBLASLt code, which inputs are the
    bias and aux, whether aux is an output, those inputs checked and made readable, and the
    fallback kernel's launch."""

    def __init__(self, ctx: Any, dtype: str, name: str) -> None:
        facts = EPILOGUES[name]
        self.code, self.act = facts.code, facts.act
        self.bias_index, self.aux_index, self.aux_out = facts.bias, facts.aux_in, facts.aux_out
        self.dtype = np.dtype(dtype)
        # both kernels, whichever runs: the module's kernels are loaded once per context
        ks = launch.load_kernels(ctx, _module_key(dtype), lambda: epilogue_source(dtype),
                                 {f"{k}_{dtype}": fmt for k, (fmt, _) in _KERNELS.items()})
        self.go = ks[f"{facts.kernel}_{dtype}"].fast_launcher()
        self.takes_aux = _KERNELS[facts.kernel][1]

    def operand(self, bias: Any, n: int, label: str) -> Any:
        """``bias`` as cuBLASLt reads it: n packed elements at an aligned address (else a
        copy from the pool)."""
        if bias.shape != (n,):
            raise ValueError(f"{label}: the bias of shape {bias.shape} does not match the "
                             f"{n} columns of the product")
        if n > 1 and bias.strides[0] != bias.dtype.itemsize or bias.ptr % _BIAS_ALIGN:
            bias = bias.copy()
        return bias

    def aux_operand(self, aux: Any, x: Any, y: Any, label: str) -> Any:
        """``aux`` (an input) as cuBLASLt reads it: the product's number of elements, read in
        C order as the product's shape (D's layout; the rewrite pairs aux and the product
        position by position, whatever shapes reshapes gave them), of the dtype, at an
        aligned address (else a copy from the pool)."""
        shape = (x.shape[0], y.shape[1])
        if aux.size != shape[0] * shape[1] or aux.dtype != self.dtype:
            raise ValueError(f"{label}: aux of shape {aux.shape} and dtype {aux.dtype} does "
                             f"not match the product of x {x.shape} and y {y.shape}, of shape "
                             f"{shape} and dtype {self.dtype}")
        if not aux.is_c_contiguous or aux.ptr % _BIAS_ALIGN:
            aux = aux.copy()
        return aux if aux.shape == shape else aux.reshape(shape)

    def apply(self, ctx: Any, out: Any, bias: Any, aux: Any = None) -> None:
        """The epilogue on ``out``, the product (C-contiguous, rows x n), on ``ctx``'s stream:
        out = act(out + bias), or the GELU's (aux and out of one layout)."""
        rows, cols = out.shape
        total = rows * cols
        if total:
            grid, block = (max(1, min(_MAX_BLOCKS, -(-total // _BLOCK))), 1, 1), (_BLOCK, 1, 1)
            if self.takes_aux:
                self.go(grid, block, out.ptr, 0 if aux is None else aux.ptr,
                        0 if bias is None else bias.ptr, rows, cols, self.act)
            else:
                self.go(grid, block, out.ptr, bias.ptr, rows, cols, self.act)


class GpuGemmEpilogue(_CublasOp):
    """A matrix product and its epilogue in one cuBLASLt call, of matrices x, y and a third
    input, all of one dtype: float16, bfloat16 (accumulated in float32), float32, float64.

    * ``"bias"``, ``"relu_bias"``: ``act(dot(x, y) + b)``, b a vector (one value per column
      of the product), act the identity or relu;
    * ``"gelu_aux_bias"``: two outputs, ``gelu(a)`` and ``a = dot(x, y) + b`` (rounded to the
      dtype), GELU in its tanh form;
    * ``"dgelu"``: ``dot(x, y) * gelu'(aux)``, aux a matrix of the product's shape."""

    __props__ = ("epilogue",)

    def __init__(self, epilogue: str = "bias"):
        if epilogue not in EPILOGUES:
            raise ValueError(f"GpuGemmEpilogue: epilogue must be one of {sorted(EPILOGUES)}, "
                             f"got {epilogue!r}")
        self.epilogue = epilogue

    def __str__(self) -> str:
        return f"GpuGemmEpilogue{{{self.epilogue}}}"

    def infer_shape(self, fgraph: Any, node: Apply, input_shapes: list) -> list:
        """x's rows by y's columns, for each output."""
        shape = _host_blas.Dot22.infer_shape(self, fgraph, node, input_shapes)[0]
        return [shape] * len(node.outputs)

    def make_node(self, x: Any, y: Any, b: Any) -> Apply:
        """``b`` is the bias vector, or (``dgelu``) the aux matrix."""
        facts = EPILOGUES[self.epilogue]
        third, ndim = ("aux", 2) if facts.aux_in is not None else ("bias", 1)
        ctx = _ctx_name(x, y, b)
        x = _blas_matrix(x, ctx, 2, f"{self}'s x", GEMM_DTYPES)
        y = _blas_matrix(y, ctx, 2, f"{self}'s y", GEMM_DTYPES)
        b = _blas_matrix(b, ctx, ndim, f"{self}'s {third}", GEMM_DTYPES)
        if not x.dtype == y.dtype == b.dtype:
            raise TypeError(f"{self} needs one dtype, got x {x.dtype}, y {y.dtype}, "
                            f"{third} {b.dtype}")
        out = GpuArrayType(x.dtype, (x.broadcastable[0], y.broadcastable[1]), ctx)
        return Apply(self, [x, y, b], [out() for _ in range(1 + facts.aux_out)])

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


# --- readers of the product that need only its shape

#: views whose own readers may need only the shape (a gradient's zero tail slices the product)
_VIEWS = (GpuSubtensor, GpuDimShuffle, GpuReshape)


def _reads_shape(fgraph: FunctionGraph, client: Apply, i: int, var: Variable,
                 depth: int = 3) -> bool:
    """Whether ``client``, reading ``var`` as input ``i``, needs only its shape: a shape read,
    the fill ``second(var, v)``, or a view of it read only so."""
    op = client.op
    if getattr(op, "shape_read", None) is not None:
        return True
    if _elemwise(client, "second", 2):
        return i == 0 and client.inputs[1] is not var
    if not depth or i or type(op) not in _VIEWS or var in client.inputs[1:]:
        return False
    out = client.outputs[0]
    return out not in fgraph.outputs and all(
        c != "output" and _reads_shape(fgraph, c, j, out, depth - 1)
        for c, j in fgraph.clients.get(out, []))


def shape_readers(fgraph: FunctionGraph, var: Variable, readers: set) -> list[Apply] | None:
    """The clients of ``var`` besides ``readers`` when each needs only its shape (they move
    onto the fused result); None when ``var`` is an output or something else reads it."""
    if var in fgraph.outputs:
        return None
    moved = []
    for client, i in fgraph.clients.get(var, []):
        if client == "output":
            return None
        if client not in readers:
            if not _reads_shape(fgraph, client, i, var):
                return None
            moved.append(client)
    return moved


# --- a reshape that keeps the product's columns last

def keeps_columns(fgraph: FunctionGraph, reshape: Apply, product: Variable) -> bool:
    """Whether GpuReshape node ``reshape`` of matrix ``product`` provably keeps its columns
    as the last axis (then ``reshape(p) + b`` is ``reshape(p + b)`` for b along it)."""
    out_shape, p_shape = inferred_shape(fgraph, reshape.outputs[0]), \
        inferred_shape(fgraph, product)
    return out_shape is not None and p_shape is not None and reshape.outputs[0].ndim >= 1 \
        and same_length(fgraph, out_shape[-1], p_shape[1])


# --- the bias fold

def bias_vector(d: Variable, ndim: int) -> Variable | None:
    """``b`` of ``GpuDimShuffle{x,..,x,0}(b)``, a vector along the last of ``ndim`` axes (a
    half ``b`` behind a Cast{float32}, on either side of the broadcast, taken as is)."""
    if cast_target(d.owner) == "float32" and d.owner.inputs[0].dtype in HALF_DTYPES:
        d = d.owner.inputs[0]
    dn = d.owner
    if dn is None or type(dn.op) is not GpuDimShuffle or \
            dn.op.new_order != ("x",) * (ndim - 1) + (0,):
        return None
    b = dn.inputs[0]
    if cast_target(b.owner) == "float32" and b.owner.inputs[0].dtype in HALF_DTYPES:
        b = b.owner.inputs[0]
    return None if b.broadcastable[0] else b


def _bias_adds(fgraph: FunctionGraph, node: Apply) -> list[tuple[Variable, Variable, set]]:
    """``(a, d, readers)`` for each way ``node`` adds ``d`` to ``a``: the add itself (either
    order; ``readers`` = {node}), or mixed precision's ``Cast{half}(Cast{float32}(a) + d)``
    (either order) whose float32 cast and sum nothing else reads (``readers``: that cast)."""
    if _elemwise(node, "add", 2):
        return [(a, d, {node}) for a, d in (node.inputs, node.inputs[::-1])]
    if cast_target(node) not in HALF_DTYPES:
        return []
    s = node.inputs[0]
    sn = s.owner
    if not (_elemwise(sn, "add", 2) and s.dtype == "float32" and
            _only_reader(fgraph, s, {node})):
        return []
    out = []
    for c, d in (sn.inputs, sn.inputs[::-1]):
        cn = c.owner
        if cast_target(cn) == "float32" and cn.inputs[0].dtype == node.outputs[0].dtype and \
                _only_reader(fgraph, c, {sn}):
            out.append((cn.inputs[0], d, {cn}))
    return out


def _fold(fgraph: FunctionGraph, node: Apply, a: Variable, d: Variable,
          readers: set) -> list | None:
    """The replacement of ``node`` (which computes ``a + d``) by GpuGemmEpilogue{bias} (then
    the reshape), with the shape-only readers moved; None where it does not apply."""
    b = bias_vector(d, a.ndim)
    an = a.owner
    if b is None or an is None or a.dtype not in epilogue_dtypes():
        return None
    reshape = an if type(an.op) is GpuReshape else None
    pn = an.inputs[0].owner if reshape is not None else an
    if pn is None or type(pn.op) is not GpuDot22:
        return None
    if b.dtype != a.dtype:
        if a.dtype not in HALF_DTYPES or b.dtype != "float32":
            return None
        b = GpuElemwise(Cast(a.dtype))(b)     # autocast's half bias (the module docstring)
    p = pn.outputs[0]
    if reshape is not None:
        moved_r = shape_readers(fgraph, a, readers)
        moved_p = shape_readers(fgraph, p, {reshape})
        if moved_r is None or moved_p is None or not keeps_columns(fgraph, reshape, p):
            return None
    else:
        moved_r, moved_p = [], shape_readers(fgraph, p, readers)
        if moved_p is None:
            return None
    fused = GpuGemmEpilogue("bias")(pn.inputs[0], pn.inputs[1], b)
    if fused.type != p.type:
        return None
    new = fused if reshape is None else \
        reshape.clone_with_new_inputs([fused] + reshape.inputs[1:]).outputs[0]
    if new.type != node.outputs[0].type:
        return None
    for v in (fused, new):      # the new nodes keep the old one's creation trace
        v.owner.tag.trace = getattr(node.tag, "trace", [])
    return [(node.outputs[0], new)] + moved_pairs(((moved_p, p, fused), (moved_r, a, new)))


def moved_pairs(moves: Any) -> list[tuple[Variable, Variable]]:
    """Replacement pairs that move readers onto a fused result: for each ``(clients, old,
    new)``, each client (a reader of ``old``'s shape alone) cloned to read ``new``."""
    pairs = []
    for clients, old, new in moves:
        for c in clients:
            c2 = c.clone_with_new_inputs([new if v is old else v for v in c.inputs])
            pairs += list(zip(c.outputs, c2.outputs))
    return pairs


def local_gemm_bias_epilogue(fgraph: FunctionGraph, node: Apply) -> list | None:
    """GpuElemwise{add}(GpuDot22(x, W), GpuDimShuffle{x,0}(b)) (either order), or through a
    reshape of the product keeping its columns last, or mixed precision's
    ``Cast{half}(Cast{float32}(dot) + b)`` with a float32 b -> GpuGemmEpilogue{bias}(x, W, b)
    (b cast to the half dtype; then the reshape), when nothing else reads the product's
    values."""
    for a, d, readers in _bias_adds(fgraph, node):
        pairs = _fold(fgraph, node, a, d, readers)
        if pairs is not None:
            return pairs
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
