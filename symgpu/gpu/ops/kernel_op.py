"""ElemwiseKernelOp: a custom elementwise GPU op from a few lines of CUDA, with a gradient.

    double_plus = ElemwiseKernelOp("o0 = i0 * 2 + i1", inputs=["float32", "float32"],
                                   outputs=["float32"],
                                   grad=lambda inp, gz: [gz[0] * 2, gz[0]])
    y = double_plus(x, b)          # broadcasts like any elementwise op

The body is CUDA C statements over the inputs ``i0, i1, ...`` and assigning the outputs
``o0, o1, ...``; a single-output op may give just an expression (``"i0 * 2 + i1"``).  Operands
have the *value type* of their dtype (``float`` for float16 and bfloat16, which are stored as
``__half`` and ``__nv_bfloat16``), outputs start at zero, and local declarations are allowed.

Why it is built this way: the body becomes a scalar op that the elementwise renderer of
``symgpu/gpu/runtime/codegen`` (the ``elemwise.cu`` template) accepts, and the node runs through
``GpuElemwise``'s thunk — so a custom kernel gets broadcasting, dimension collapsing,
contiguous / vectorised / strided kernels, the memory pool and the compile cache (keyed on
the op's signature in memory and on the source on disk) without a second implementation.
The body is placed in an immediately-invoked lambda, one per output, so statement bodies
work inside the renderer's expression slots; nvcc folds the repeats.

Gradient: ``grad(inputs, output_grads) -> [one symbolic gradient or None per input]``, built
from symgpu ops (checked with ``verify_grad``).  Gradients of broadcast inputs are summed over
the broadcast dimensions for you; disconnected output gradients arrive as zeros.

Without a GPU: building the graph works; compiling it raises ``GpuUnavailableError`` saying a
GPU is needed — unless ``cpu_impl`` (a NumPy function ``(*arrays) -> array or tuple``) is
given and no GPU context is in use, in which case the node is built on the host and runs
``cpu_impl`` (and a GPU context, when one appears, lifts it back to the kernel).
"""
from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import numpy as np

from symgpu.gpu.ops.elemwise import GpuElemwise
from symgpu.gpu.placement.basic_ops import GpuDimShuffle, as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, default_context_active, is_gpu_var
from symgpu.gpu.runtime import context as gpu_context
from symgpu.gpu.runtime.codegen.types import SUPPORTED, value_ctype
from symgpu.gpu.runtime.context import GpuUnavailableError
from symgpu.gradient import DisconnectedType
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
import symgpu.tensor as T
from symgpu.tensor.elemwise import Elemwise as _Elemwise
from symgpu.tensor.type import TensorType, as_tensor_variable

__all__ = ["ElemwiseKernelOp", "KernelScalarOp"]

GradFn = Callable[[list, list], Sequence[Any]]
_NAME = re.compile(r"\b([io])(\d+)\b")


def _check_dtypes(dtypes: Any, what: str) -> tuple[str, ...]:
    if isinstance(dtypes, str):
        dtypes = [dtypes]
    out = tuple(str(np.dtype(d)) for d in dtypes)
    for d in out:
        if d not in SUPPORTED:
            raise TypeError(f"ElemwiseKernelOp: {what} dtype {d} is not supported by GPU "
                            f"kernels; use one of {', '.join(SUPPORTED)}")
    return out


def _normalise_body(body: str, nin: int, nout: int) -> str:
    """Statements assigning every output; a bare expression becomes ``o0 = (expr);``."""
    if not isinstance(body, str) or not body.strip():
        raise TypeError("ElemwiseKernelOp needs the kernel body as a non-empty string of CUDA "
                        "C, e.g. 'o0 = i0 * 2 + i1'")
    text = body.strip()
    used = {(k, int(n)) for k, n in _NAME.findall(text)}
    if not any(k == "o" for k, _ in used):
        if nout != 1:
            raise ValueError(f"ElemwiseKernelOp: the body {body!r} assigns no output; with "
                             f"{nout} outputs write statements such as 'o0 = ...; o1 = ...'")
        text = f"o0 = ({text.rstrip(';')});"
        used.add(("o", 0))
    for k, n in sorted(used):
        limit = nin if k == "i" else nout
        if n >= limit:
            raise ValueError(f"ElemwiseKernelOp: the body uses {k}{n} but the op has {limit} "
                             f"{'input' if k == 'i' else 'output'}(s) ({k}0..{k}{limit - 1})")
    missing = [f"o{j}" for j in range(nout) if ("o", j) not in used]
    if missing:
        raise ValueError(f"ElemwiseKernelOp: the body never assigns {', '.join(missing)}")
    if not text.endswith((";", "}")):
        text += ";"
    return text


class KernelScalarOp:
    """A user's CUDA body as the scalar op the elementwise renderer understands.

    One output renders through ``cuda(out_dtype, operands)``; several outputs expose a tiny
    inner graph (``fgraph``: one node per output), the same shape a fused Composite has."""

    def __init__(self, body: str, in_dtypes: tuple[str, ...], out_dtypes: tuple[str, ...],
                 name: str) -> None:
        self.body, self.in_dtypes, self.out_dtypes, self.name = body, in_dtypes, out_dtypes, name
        self.nin, self.nout = len(in_dtypes), len(out_dtypes)
        self._key = (KernelScalarOp, body, in_dtypes, out_dtypes)
        if self.nout > 1:
            self.fgraph = _InnerGraph(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KernelScalarOp) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__

    def output_dtypes(self, *in_dtypes: str) -> list[str]:
        return list(self.out_dtypes)

    def lambda_for(self, j: int, operands: Sequence[str]) -> str:
        """A C expression computing output ``j`` from value-typed ``operands``."""
        decl = [f"const {value_ctype(d)} i{k} = {e};"
                for k, (d, e) in enumerate(zip(self.in_dtypes, operands))]
        decl += [f"{value_ctype(d)} o{k} = 0;"
                 for k, d in enumerate(self.out_dtypes)]
        ret = value_ctype(self.out_dtypes[j])
        return f"([&]() -> {ret} {{ {' '.join(decl)} {self.body} return o{j}; }}())"

    def cuda(self, out_dtype: str, operands: Sequence[str]) -> str:
        return self.lambda_for(0, operands)


class _InnerVar:
    """A scalar variable of the inner graph (what the renderer reads: type.dtype, owner)."""

    def __init__(self, dtype: str, owner: Any = None) -> None:
        self.type, self.owner = self, owner
        self.dtype = dtype


class _OutputOf:
    """Inner op computing one output of a multi-output body."""

    def __init__(self, op: KernelScalarOp, j: int) -> None:
        self.op, self.j = op, j

    def output_dtypes(self, *in_dtypes: str) -> list[str]:
        return [self.op.out_dtypes[self.j]]

    def cuda(self, out_dtype: str, operands: Sequence[str]) -> str:
        return self.op.lambda_for(self.j, operands)

    def __str__(self) -> str:
        return f"{self.op}[{self.j}]"


class _InnerNode:
    def __init__(self, op: _OutputOf, inputs: list, dtype: str) -> None:
        self.op, self.inputs = op, inputs
        self.outputs = [_InnerVar(dtype, self)]


class _InnerGraph:
    def __init__(self, op: KernelScalarOp) -> None:
        self.inputs = [_InnerVar(d) for d in op.in_dtypes]
        self.nodes = [_InnerNode(_OutputOf(op, j), self.inputs, d)
                      for j, d in enumerate(op.out_dtypes)]
        self.outputs = [n.outputs[0] for n in self.nodes]

    def toposort(self) -> list:
        return list(self.nodes)


class ElemwiseKernelOp(Op):
    """An elementwise op whose GPU kernel body is user CUDA (see the module doc).

    ``ElemwiseKernelOp(cuda_expression, inputs, outputs=None, grad=None, name=None,
    cpu_impl=None)``: ``inputs``/``outputs`` are dtype lists (``outputs`` defaults to the
    first input's dtype, one output); ``grad(inputs, output_grads)`` returns one symbolic
    gradient (or None) per input; ``cpu_impl`` is an optional NumPy fallback."""

    __props__ = ("body", "in_dtypes", "out_dtypes", "grad_fn", "cpu_impl")

    def __init__(self, cuda_expression: str, inputs: Sequence[str],
                 outputs: Sequence[str] | str | None = None, grad: GradFn | None = None,
                 name: str | None = None, cpu_impl: Callable[..., Any] | None = None) -> None:
        self.in_dtypes = _check_dtypes(inputs, "input")
        if not self.in_dtypes:
            raise ValueError("ElemwiseKernelOp needs at least one input")
        self.out_dtypes = _check_dtypes(self.in_dtypes[0] if outputs is None else outputs,
                                        "output")
        if not self.out_dtypes:
            raise ValueError("ElemwiseKernelOp needs at least one output")
        self.body = _normalise_body(cuda_expression, len(self.in_dtypes), len(self.out_dtypes))
        if grad is not None and not callable(grad):
            raise TypeError("grad must be a callable (inputs, output_grads) -> list of "
                            "symbolic gradients")
        if cpu_impl is not None and not callable(cpu_impl):
            raise TypeError("cpu_impl must be a NumPy callable (*arrays) -> array or tuple")
        self.grad_fn, self.cpu_impl = grad, cpu_impl
        self.name = name or f"ElemwiseKernelOp{{{' '.join(cuda_expression.split())}}}"
        self.scalar_op = KernelScalarOp(self.body, self.in_dtypes, self.out_dtypes, self.name)
        self.nout = len(self.out_dtypes)
        self._gpu_elemwise: Any = None

    def __str__(self) -> str:
        return self.name

    # -- building
    infer_shape = _Elemwise.infer_shape  # elementwise over broadcast inputs

    def make_node(self, *inputs: Any) -> Apply:
        if len(inputs) != len(self.in_dtypes):
            raise TypeError(f"{self} takes {len(self.in_dtypes)} input(s), got {len(inputs)}")
        vs = []
        for k, (x, dt) in enumerate(zip(inputs, self.in_dtypes)):
            v = x if isinstance(x, Variable) else as_tensor_variable(np.asarray(x, dtype=dt))
            if getattr(v.type, "dtype", None) != dt:
                raise TypeError(f"{self}: input {k} ({v}) has type {v.type}, the kernel "
                                f"declares {dt}; cast it first (e.g. T.cast(x, '{dt}'))")
            vs.append(v)
        if self._on_host(vs):
            return self._host_node(vs)
        return self._gpu_node(vs)

    def _on_host(self, vs: list[Variable]) -> bool:
        """Host node only with a CPU fallback, no GPU input and no GPU context in use."""
        return (self.cpu_impl is not None and not any(is_gpu_var(v) for v in vs)
                and not default_context_active())

    def _gpu_node(self, vs: list[Variable]) -> Apply:
        ctx = next((v.type.context_name for v in vs if is_gpu_var(v)), None)
        gins = [as_gpuarray_variable(v, ctx) for v in vs]
        nd = max(g.ndim for g in gins)
        padded = [g if g.ndim == nd else GpuDimShuffle(
            g.broadcastable, ["x"] * (nd - g.ndim) + list(range(g.ndim)))(g) for g in gins]
        bcast = tuple(all(p.broadcastable[d] for p in padded) for d in range(nd))
        return Apply(self, padded, [GpuArrayType(d, bcast, ctx)() for d in self.out_dtypes])

    def _host_node(self, vs: list[Variable]) -> Apply:
        tins = [as_tensor_variable(v) for v in vs]
        nd = max(t.ndim for t in tins)
        padded = [t if t.ndim == nd else t.dimshuffle(*(["x"] * (nd - t.ndim)
                                                        + list(range(t.ndim)))) for t in tins]
        bcast = tuple(all(p.broadcastable[d] for p in padded) for d in range(nd))
        return Apply(self, padded, [TensorType(d, bcast)() for d in self.out_dtypes])

    # -- running
    def gpu_elemwise(self) -> Any:
        """The GpuElemwise whose thunk and kernel sources serve this op's GPU nodes."""
        if self._gpu_elemwise is None:
            self._gpu_elemwise = GpuElemwise(self.scalar_op, name=self.name)
        return self._gpu_elemwise

    def kernel_sources(self, node: Apply) -> list[tuple[Any, str]]:
        """(key, CUDA source) of the module this node launches (CI compiles them)."""
        return self.gpu_elemwise().kernel_sources(node)

    def make_thunk(self, node: Apply, storage_map: dict, compute_map: dict,
                   no_recycling: Sequence[Variable], impl: str | None = None) -> Callable[[], None]:
        if not is_gpu_var(node.outputs[0]):
            return super().make_thunk(node, storage_map, compute_map, no_recycling, impl)
        try:
            gpu_context.get_context(node.outputs[0].type.context_name)
        except LookupError as exc:
            raise GpuUnavailableError(
                f"{self} runs a CUDA kernel and needs a GPU, but none can be used here: {exc}. "
                f"Compile it with device=cuda on a machine with an NVIDIA GPU and PyCUDA, or "
                f"give ElemwiseKernelOp a NumPy cpu_impl= to run it on the CPU") from None
        return self.gpu_elemwise().make_thunk(node, storage_map, compute_map, no_recycling)

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        """The host node's NumPy fallback (``cpu_impl``), broadcast and cast like the kernel."""
        res = self.cpu_impl(*inputs)
        res = list(res) if isinstance(res, (list, tuple)) else [res]
        if len(res) != self.nout:
            raise ValueError(f"{self}: cpu_impl returned {len(res)} value(s), the op has "
                             f"{self.nout} output(s)")
        shape = np.broadcast_shapes(*[np.shape(x) for x in inputs])
        for cell, r, d in zip(output_storage, res, self.out_dtypes):
            cell[0] = np.array(np.broadcast_to(np.asarray(r, dtype=d), shape), dtype=d)

    # -- gradient
    def L_op(self, inputs: Sequence[Variable], outputs: Sequence[Variable],
             output_grads: Sequence[Variable]) -> list[Variable | None]:
        if self.grad_fn is None:
            raise NotImplementedError(f"{self} has no gradient: give ElemwiseKernelOp a "
                                      f"grad=(inputs, output_grads) -> [gradient per input]")
        gz = [T.zeros_like(T.as_tensor_variable(o)) if g is None or
              isinstance(g.type, DisconnectedType) else g
              for g, o in zip(output_grads, outputs)]
        grads = list(self.grad_fn(list(inputs), gz))
        if len(grads) != len(inputs):
            raise ValueError(f"the grad of {self} returned {len(grads)} gradient(s) for "
                             f"{len(inputs)} input(s)")
        return [None if g is None else _fit_broadcast(g, x) for g, x in zip(grads, inputs)]

    def grad(self, inputs: Sequence[Variable], output_grads: Sequence[Variable]) -> list:
        return self.L_op(inputs, self.make_node(*inputs).outputs, output_grads)


def _fit_broadcast(g: Any, x: Variable) -> Variable:
    """Gradient term ``g`` summed over the dims where input ``x`` was broadcast, in x's dtype
    (the gradient machinery then moves it to x's place and type)."""
    g = T.as_tensor_variable(g)
    if g.ndim < x.ndim:
        g = g.dimshuffle(*(["x"] * (x.ndim - g.ndim) + list(range(g.ndim))))
    if g.ndim != x.ndim:
        raise ValueError(f"a gradient of {g.ndim} dimension(s) was returned for an input of "
                         f"{x.ndim}")
    axes = [d for d in range(x.ndim) if x.broadcastable[d] and not g.broadcastable[d]]
    if axes:
        g = T.sum(g, axis=axes, keepdims=True)
    if any(gb and not xb for gb, xb in zip(g.broadcastable, x.broadcastable)):
        g = T.second(T.as_tensor_variable(x), g)  # a length-1 term where x has a full dim
    if g.dtype != x.dtype:
        g = T.cast(g, x.dtype)
    return g


@register_lifter(ElemwiseKernelOp)
def _lift_kernel_op(op: ElemwiseKernelOp, node: Apply, context_name: Any, inputs: Any) -> Any:
    """A host node (built with cpu_impl before a GPU was in use) goes back to its kernel."""
    return op._gpu_node(list(inputs)).outputs
