"""GPU sparse matrices: GpuSparseType (csr/csc on a context), its values (GpuSparseMatrix:
three GpuArrays and a shape), variables, shared variables and the two transfers.

Why a type of its own and not three GpuArray inputs: a sparse matrix is one value to the
user (`shared(scipy_csr)`, `get_value()` gives SciPy back) and to the host sparse ops, which
read it through `HostFromGpuSparse` like a GPU array through `HostFromGpu`; the graph-to-GPU
sweep (rewriting.py) moves and cancels these transfers through `register_device_kind`.

SciPy and symgpu.sparse load on first use (`_host()`), never when this module is imported:
under device=cuda `import symgpu` imports it, and must not get slower.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from symgpu.gpu.placement.basic_ops import TRANSFER_COUNTS
from symgpu.gpu.placement.rewriting import register_device_kind
from symgpu.gpu.placement.type import _call_lock, default_context_active, gpu_supports_dtype
from symgpu.gpu.runtime import context as gpu_context
from symgpu.gpu.runtime.array import GpuArray, get_many, to_gpu
from symgpu.gpu.runtime.pool import lend
from symgpu.graph.basic import Apply, Type, Variable
from symgpu.graph.op import Op
from symgpu.graph.sharedvalue import Container, SharedVariable, register_shared_constructor

__all__ = ["GpuSparseMatrix", "GpuSparseType", "GpuSparseVariable", "GpuSparseSharedVariable",
           "GpuSparseFromHost", "HostFromGpuSparse", "gpu_sparse_shared_constructor",
           "is_gpu_sparse_var"]

_FORMATS = ("csr", "csc")
_MODULES: list = []


def _host() -> Any:
    """symgpu.sparse.type (SparseType, scipy.sparse as `ssp`), imported on first use."""
    if not _MODULES:
        # deferred: scipy.sparse loads on first use (import symgpu under device=cuda loads us)
        import symgpu.sparse.type as sparse_type
        _MODULES.append(sparse_type)
    return _MODULES[0]


def _is_scipy_sparse(value: Any) -> bool:
    """Whether `value` is a scipy.sparse matrix (none exists before scipy.sparse is loaded:
    sys.modules tells without importing it)."""
    ssp = sys.modules.get("scipy.sparse")
    return ssp is not None and ssp.issparse(value)


def _count(kind: str, nbytes: int) -> None:
    TRANSFER_COUNTS[kind] += 1
    TRANSFER_COUNTS[kind + "_bytes"] += int(nbytes)


# ----------------------------------------------------------------------------- the value

class GpuSparseMatrix:
    """A csr or csc matrix on a GPU: `data` (nnz values), `indices` (int32: column numbers
    for csr, row numbers for csc), `indptr` (int32, one more than the rows for csr, the
    columns for csc) and `shape`, SciPy's layout."""

    __slots__ = ("format", "shape", "data", "indices", "indptr")

    def __init__(self, format: str, shape: tuple, data: GpuArray, indices: GpuArray,
                 indptr: GpuArray):
        if format not in _FORMATS:
            raise ValueError(f"GpuSparseMatrix: format must be 'csr' or 'csc', got {format!r}")
        self.format, self.shape = format, (int(shape[0]), int(shape[1]))
        self.data, self.indices, self.indptr = data, indices, indptr

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def nnz(self) -> int:
        return int(self.data.shape[0])

    @property
    def context(self) -> Any:
        return self.data.context

    @property
    def T(self) -> "GpuSparseMatrix":
        """The transpose: the same arrays read in the other format (no copy)."""
        return GpuSparseMatrix("csc" if self.format == "csr" else "csr", self.shape[::-1],
                               self.data, self.indices, self.indptr)

    @classmethod
    def upload(cls, value: Any, ctx: Any) -> "GpuSparseMatrix":
        """scipy.sparse csr/csc `value` on `ctx` (int32 indices; values in SciPy's order)."""
        if value.nnz >= 2 ** 31 or max(value.shape) >= 2 ** 31:
            raise ValueError(f"a GPU sparse matrix holds int32 indices: {value.shape} with "
                             f"{value.nnz} stored entries is too large")
        arrays = [np.ascontiguousarray(value.data),
                  np.ascontiguousarray(value.indices, dtype=np.int32),
                  np.ascontiguousarray(value.indptr, dtype=np.int32)]
        data, indices, indptr = (to_gpu(a, ctx) for a in arrays)
        _count("host_to_gpu", sum(a.nbytes for a in arrays))
        return cls(value.format, value.shape, data, indices, indptr)

    def get(self) -> Any:
        """The scipy.sparse matrix (a download)."""
        data, indices, indptr = get_many([self.data, self.indices, self.indptr])
        _count("gpu_to_host", data.nbytes + indices.nbytes + indptr.nbytes)
        cls = _host().SparseType.format_cls[self.format]
        return cls((data, indices, indptr), shape=self.shape)

    def copy(self) -> "GpuSparseMatrix":
        return GpuSparseMatrix(self.format, self.shape, self.data.copy(), self.indices.copy(),
                               self.indptr.copy())

    def lend(self) -> "GpuSparseMatrix":
        """Mark the three buffers lent to the user (graphs never write into them)."""
        for a in (self.data, self.indices, self.indptr):
            lend(a)
        return self

    def __repr__(self) -> str:
        return (f"GpuSparseMatrix({self.format}, shape={self.shape}, dtype={self.dtype}, "
                f"nnz={self.nnz})")


# ----------------------------------------------------------------------------- the type

class GpuSparseType(Type):
    """A csr or csc matrix of `dtype` on the GPU context `context_name` (None = default)."""

    ndim = 2
    broadcastable = (False, False)

    def __init__(self, format: str, dtype: str, context_name: str | None = None):
        if format not in _FORMATS:
            raise ValueError(f"GpuSparseType: format must be 'csr' or 'csc', got {format!r}")
        dtype = str(np.dtype(dtype))
        if not gpu_supports_dtype(dtype) or dtype == "bool":
            raise TypeError(f"GpuSparseType: dtype {dtype} cannot live on the GPU")
        self.format, self.dtype, self.context_name = format, dtype, context_name

    def __eq__(self, other: object) -> bool:
        return (type(self) is type(other) and self.format == other.format
                and self.dtype == other.dtype and self.context_name == other.context_name)

    def __hash__(self) -> int:
        return hash((GpuSparseType.__name__, self.format, self.dtype, self.context_name))

    def __str__(self) -> str:
        return f"GpuSparse<{self.context_name}>[{self.dtype}, {self.format}]"

    __repr__ = __str__

    def clone(self, format: str | None = None, dtype: str | None = None,
              context_name: Any = "same") -> "GpuSparseType":
        return GpuSparseType(format or self.format, dtype or self.dtype,
                             self.context_name if context_name == "same" else context_name)

    @property
    def shape(self) -> tuple:
        return (None, None)

    @property
    def context(self) -> Any:
        return gpu_context.get_context(self.context_name)

    def sparse_type(self) -> Any:
        """The host twin (what `HostFromGpuSparse` produces)."""
        return _host().SparseType(self.format, self.dtype)

    # -- values
    def filter(self, value: Any, strict: bool = False, allow_downcast: bool | None = None) -> Any:
        """`value` as a GpuSparseMatrix of this type: such matrices pass; scipy.sparse ones
        are checked like SparseType (format conversion, safe casts) and uploaded."""
        if isinstance(value, GpuSparseMatrix):
            if value.format == self.format and str(value.dtype) == self.dtype and \
                    value.context is self.context:
                return value
            if strict:
                raise TypeError(f"expected a GPU sparse matrix of type {self}, got {value}")
            value = value.get()
        elif strict and not (_is_scipy_sparse(value) and value.format == self.format
                             and value.dtype.name == self.dtype):
            raise TypeError(f"expected a {self.format} sparse matrix of dtype {self.dtype} "
                            f"({self}), got {type(value).__name__}")
        host = self.sparse_type().filter(value, strict=False, allow_downcast=allow_downcast)
        return GpuSparseMatrix.upload(host, self.context)

    def is_valid_value(self, value: Any) -> bool:
        return (isinstance(value, GpuSparseMatrix) and value.format == self.format
                and str(value.dtype) == self.dtype)

    def make_fast_filter(self):
        fmt, dtype = self.format, np.dtype(self.dtype)
        return lambda v: v.__class__ is GpuSparseMatrix and v.format == fmt and v.dtype == dtype

    def values_eq(self, a: Any, b: Any) -> bool:
        return self.sparse_type().values_eq(_to_host(a), _to_host(b))

    def values_eq_approx(self, a: Any, b: Any, eps: float = 1e-6) -> bool:
        return self.sparse_type().values_eq_approx(_to_host(a), _to_host(b), eps)

    # -- pickling of shared values
    def value_to_pickle(self, value: Any) -> Any:
        return _to_host(value)

    def value_from_pickle(self, value: Any) -> tuple[Type, Any]:
        """Back on the GPU where this context is in use, else a host sparse matrix."""
        name = self.context_name
        usable = default_context_active() if name is None else \
            name in gpu_context.context_names()
        if not usable or gpu_context.get_context(name).virtual:
            return self.sparse_type(), self.sparse_type().filter(value)
        return self, self.filter(value)

    # -- variables
    def make_variable(self, name: str | None = None) -> "GpuSparseVariable":
        _install_operators()
        return GpuSparseVariable(self, None, None, name)

    def as_sparse(self, var: Variable) -> Variable:
        """The host form (symgpu.sparse functions take GPU sparse variables through it)."""
        return HostFromGpuSparse()(var)

    def as_tensor(self, var: Variable) -> Variable:
        """The dense host form (how symgpu.grad sums gradient terms of a sparse variable)."""
        return self.sparse_type().as_tensor(self.as_sparse(var))

    def convert_variable(self, var: Variable) -> Variable | None:
        """`var` as this type: a host sparse matrix (or a dense gradient, converted as
        SparseType does) is uploaded; a GPU one of another dtype or format goes through
        the host."""
        vt = var.type
        if vt == self:
            return var
        if isinstance(vt, GpuSparseType):
            var = vt.as_sparse(var)
        host = self.sparse_type().convert_variable(var)
        return None if host is None else GpuSparseFromHost(self.context_name)(host)


def _to_host(value: Any) -> Any:
    return value.get() if isinstance(value, GpuSparseMatrix) else value


class GpuSparseVariable(Variable):
    """A symbolic sparse matrix on the GPU; symgpu.sparse's operators read it through its
    host form, which the placement sweep moves back to the device where a GPU op takes it."""

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def format(self) -> str:
        return self.type.format

    ndim = 2
    broadcastable = (False, False)


_INSTALLED: list = []


def _install_operators() -> None:
    """symgpu.sparse's operators (`S.T`, `S * x`, `S.toarray()`...) on GPU sparse
    variables, copied on the first one made (symgpu.sparse is loaded by then)."""
    if _INSTALLED:
        return
    # deferred: symgpu.sparse (and SciPy) load on first use
    from symgpu.sparse.variable import SparseOperators
    for name, value in vars(SparseOperators).items():
        if name not in ("__module__", "__qualname__", "__doc__", "__dict__", "__weakref__"):
            setattr(GpuSparseVariable, name, value)
    _INSTALLED.append(True)


def is_gpu_sparse_var(var: Any) -> bool:
    """Whether `var` is a symbolic GPU sparse matrix."""
    return isinstance(var, Variable) and isinstance(var.type, GpuSparseType)


# ----------------------------------------------------------------------------- transfers

class GpuSparseFromHost(Op):
    """Upload a host sparse matrix to the context `context_name`."""

    __props__ = ("context_name",)
    transfer = "upload"

    def __init__(self, context_name: str | None = None):
        self.context_name = context_name

    def __str__(self) -> str:
        return f"GpuSparseFromHost<{self.context_name}>"

    def make_node(self, x: Any) -> Apply:
        if is_gpu_sparse_var(x):
            raise TypeError(f"{self}: {x} is already on the GPU ({x.type})")
        x = _host().as_sparse_variable(x)
        return Apply(self, [x], [GpuSparseType(x.type.format, x.type.dtype,
                                               self.context_name)()])

    def perform(self, node, inputs, out):
        ctx = gpu_context.get_context(self.context_name)
        out[0][0] = GpuSparseMatrix.upload(inputs[0], ctx)

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        gz = output_grads[0]
        return [gz.type.as_sparse(gz) if is_gpu_sparse_var(gz) else gz]


class HostFromGpuSparse(Op):
    """Download a GPU sparse matrix as a scipy.sparse matrix (for host sparse ops)."""

    __props__ = ()
    transfer = "download"

    def make_node(self, x: Any) -> Apply:
        if not is_gpu_sparse_var(x):
            raise TypeError(f"HostFromGpuSparse: {x} ({getattr(x, 'type', type(x))}) is not "
                            "a GPU sparse matrix")
        return Apply(self, [x], [x.type.sparse_type()()])

    def perform(self, node, inputs, out):
        out[0][0] = inputs[0].get()

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]

    def grad(self, inputs, output_grads):
        gz, t = output_grads[0], inputs[0].type
        if isinstance(gz.type, _host().SparseType) and gz.type.format == t.format:
            return [GpuSparseFromHost(t.context_name)(_host_cast(gz, t.dtype))]
        return [gz]


def _host_cast(v: Variable, dtype: str) -> Variable:
    return v if v.type.dtype == dtype else v.type.clone(dtype=dtype).convert_variable(v)


def _is_host_sparse_var(var: Any) -> bool:
    """A host sparse variable the GPU can hold (one exists only once symgpu.sparse.type is
    loaded: sys.modules tells without importing it)."""
    return ("symgpu.sparse.type" in sys.modules and isinstance(var, Variable)
            and isinstance(var.type, _host().SparseType) and gpu_supports_dtype(var.type.dtype)
            and var.type.dtype != "bool")


register_device_kind(GpuSparseType, is_host=_is_host_sparse_var,
                     upload=lambda v, ctx: GpuSparseFromHost(ctx)(v),
                     download=lambda v: HostFromGpuSparse()(v),
                     transfers=(GpuSparseFromHost, HostFromGpuSparse))


# ----------------------------------------------------------------------------- shared

class GpuSparseSharedVariable(SharedVariable, GpuSparseVariable):
    """A shared sparse matrix that lives on the GPU: functions read its arrays in place;
    get_value gives SciPy, set_value uploads."""

    def get_value(self, borrow: bool = False, return_internal_type: bool = False) -> Any:
        """A scipy.sparse copy; the GpuSparseMatrix itself with `return_internal_type=True`
        (copied unless `borrow=True`, then lent: graphs never write into it)."""
        with self.container.locked():
            value = self.container.storage[0]
            with _call_lock(value.data):
                if return_internal_type:
                    return value.lend() if borrow else value.copy()
                return value.get()

    def set_value(self, value: Any, borrow: bool = False) -> None:
        """Upload a scipy.sparse matrix (checked first: on error nothing changes); a
        GpuSparseMatrix is copied unless `borrow=True`."""
        with _call_lock(self.container.storage[0].data):
            new = self.type.filter(value, strict=False, allow_downcast=None)
            if new is value and not borrow:
                new = new.copy()
            elif new is value:
                new.lend()
        with self.container.locked():
            self.container.storage[0] = new

    def _copy_out(self, value: Any) -> Any:
        return value.get()

    def _copy_in(self, value: Any) -> Any:
        return value.copy()

    def __reduce__(self):
        return (_unpickle_gpu_sparse_shared, (self.container, self.name))


def _unpickle_gpu_sparse_shared(container: Container, name: str | None) -> SharedVariable:
    """A GPU sparse shared variable where its context is in use, else a host one."""
    if isinstance(container.type, GpuSparseType):
        return GpuSparseSharedVariable(container.type, None, name=name, container=container)
    # deferred: only a pickle of a GPU sparse variable loaded without a GPU comes here
    from symgpu.sparse.sharedvar import SparseTensorSharedVariable
    return SparseTensorSharedVariable(container.type, None, name=name, container=container)


@register_shared_constructor
def gpu_sparse_shared_constructor(value: Any, name: str | None = None, borrow: bool = False,
                                  strict: bool = False, allow_downcast: bool | None = None,
                                  target: Any = "default", format: str | None = None
                                  ) -> GpuSparseSharedVariable:
    """`shared(scipy_matrix)` on the GPU: with a default context in use (device=cuda) or a
    context named by `target`. Raises TypeError (the host constructor is tried next) when
    the value or the place does not qualify. `format` converts ('csr' or 'csc')."""
    if not (isinstance(value, GpuSparseMatrix) or _is_scipy_sparse(value)):
        raise TypeError(f"only sparse matrices go to GPU sparse variables, not "
                        f"{type(value).__name__}")
    if target == "cpu":
        raise TypeError("target='cpu' asks for the host")
    if target == "default":
        if not default_context_active():
            raise TypeError("no default GPU context is in use (device=cpu)")
        context_name = None
    elif target is None or isinstance(target, str):
        context_name = target
    else:
        raise TypeError(f"target must be 'cpu', None or a context name, not {target!r}")
    try:
        ctx = gpu_context.get_context(context_name)
    except LookupError as exc:
        raise TypeError(str(exc)) from None
    if ctx.virtual:
        raise TypeError(f"context {context_name!r} is virtual and cannot hold values")
    dtype = str(value.dtype)
    if not gpu_supports_dtype(dtype) or dtype == "bool":
        raise TypeError(f"a {dtype} sparse matrix stays on the host")
    fmt = format or (value.format if value.format in _FORMATS else "csr")
    gtype = GpuSparseType(fmt, dtype, context_name)
    if isinstance(value, GpuSparseMatrix):
        data = gtype.filter(value, strict=strict, allow_downcast=allow_downcast)
        data = data.copy() if (data is value and not borrow) else data
        if data is value:
            data.lend()
    else:
        host = gtype.sparse_type().filter(value, strict=strict, allow_downcast=allow_downcast)
        data = GpuSparseMatrix.upload(host, ctx)
    _install_operators()   # `S.T`, `S * x`... on a shared variable made before any other
    return GpuSparseSharedVariable(gtype, None, name=name, strict=strict,
                                   allow_downcast=allow_downcast,
                                   container=Container(gtype, data, name))
