"""GpuArrayType: the device type of the graph, its variables, constants and shared variables.

Why it looks like this (placement is one small subsystem): one device type
carries a context name, so placement is a property of types and the graph-to-GPU pass can be
tested on the CPU with a virtual context. GPU variables carry the tensor operators: an
expression on one builds an ordinary tensor graph through `HostFromGpu` (`as_tensor`), and
the placement pass later moves it back to the device and cancels the transfer pair.

Nothing here imports PyCUDA; device work goes through the runtime (symgpu.gpu.runtime.array).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, Sequence

import numpy as np

from symgpu.compile.sharedvalue import Container, SharedVariable, register_shared_constructor
from symgpu.config import config
from symgpu.gpu.runtime import context as gpu_context
from symgpu.gpu.runtime.array import GpuArray, dtype_name, from_cuda_array_interface, to_gpu
from symgpu.gpu.runtime.pool import lend
from symgpu.graph.basic import Constant, Type, Variable
from symgpu.scalar.dtypes import check_dtype, is_float
from symgpu.tensor.sharedvar import TensorSharedVariable, host_value
from symgpu.tensor.type import ArrayVariableMixin, TensorType, TensorVariable
from symgpu.tensor.variable import TensorOperators

__all__ = ["GpuArrayType", "GpuArrayVariable", "GpuArrayConstant", "GpuArraySharedVariable",
           "gpuarray_shared_constructor", "gpu_supports_dtype", "gpu_supported", "move_to_gpu",
           "default_context_active", "is_gpu_var", "gpu_type_like", "register_conversions"]

_GPU_DTYPES = frozenset(("bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                         "uint32", "uint64", "float16", "bfloat16", "float32", "float64"))


def gpu_supports_dtype(dtype: str) -> bool:
    """Whether a GpuArray can hold `dtype` (no complex, no objects)."""
    return str(dtype) in _GPU_DTYPES


def gpu_supported(data: Any) -> bool:
    """Theano's question "can this array or variable (anything with a dtype) live on the
    GPU?": its dtype is one GPU arrays hold (complex, object and string dtypes are not)."""
    return gpu_supports_dtype(str(data.dtype))


def move_to_gpu(value: Any) -> bool:
    """Theano's rule for `shared()` under device=cuda: everything the GPU can hold except
    discrete scalars (loop counters and flags stay on the host, as the seeds say)."""
    dtype = str(value.dtype)
    if not gpu_supports_dtype(dtype):
        return False
    return not (len(value.shape) == 0 and not is_float(dtype))


def default_context_active() -> bool:
    """True if a default GPU context (name None) is in use, starting it from the flags on
    first call: device=cuda warns and falls back to the CPU (force_device=True raises)."""
    if None in gpu_context.context_names():
        return True
    if config.device == "cpu":
        return False
    return gpu_context.init_default_context() is not None


def _ctx(name: str | None) -> Any:
    return gpu_context.get_context(name)


def _unpickle_context(name: str | None) -> Any:
    """The context an unpickled GPU value goes to, or None (no GPU there, or a virtual one)."""
    return gpu_context.context_in_use(name)


class _Conversions:
    """The transfer ops GpuArrayType's conversions build (``as_tensor``, ``convert_variable``).

    The ops are defined on top of this type (symgpu/gpu/placement/basic_ops.py), so that module
    fills these in when it loads (:func:`register_conversions`); ``symgpu.gpu`` imports it right
    after this one, before any graph is built.  Graph construction only: no call path."""

    @staticmethod
    def host_from_gpu(var: Variable) -> TensorVariable:
        raise RuntimeError("symgpu.gpu.placement.basic_ops is not loaded: import symgpu.gpu")

    @staticmethod
    def to_type(var: Variable, gtype: "GpuArrayType") -> Variable:
        raise RuntimeError("symgpu.gpu.placement.basic_ops is not loaded: import symgpu.gpu")


_conversions = _Conversions()


def register_conversions(host_from_gpu: Callable[[Variable], TensorVariable],
                         to_type: Callable[[Variable, "GpuArrayType"], Variable]) -> None:
    """Install the transfers (basic_ops does, on import): ``host_from_gpu(var)``, the host form
    of a GPU variable, and ``to_type(var, gtype)``, ``var`` moved to ``gtype`` (uploaded or
    copied to its context, with its broadcast pattern)."""
    _conversions.host_from_gpu = host_from_gpu
    _conversions.to_type = to_type


class GpuArrayType(Type):
    """An n-d array on the GPU context named `context_name` (None = the default context)."""

    def __init__(self, dtype: str, broadcastable: Sequence[bool] = (),
                 context_name: str | None = None, shape: Sequence | None = None):
        self.dtype = check_dtype(dtype)
        if not gpu_supports_dtype(self.dtype):
            raise TypeError(f"dtype {self.dtype} cannot live on the GPU; use bool, ints, "
                            "float16/bfloat16 or float32/64")
        if shape is not None:
            broadcastable = tuple(s == 1 for s in shape)
        self.broadcastable = tuple(bool(b) for b in broadcastable)
        self.ndim = len(self.broadcastable)
        self.context_name = context_name
        self._hash = hash((GpuArrayType, self.dtype, self.broadcastable, context_name))

    # -- identity ---------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return (type(self) is type(other) and self.dtype == other.dtype
                and self.broadcastable == other.broadcastable
                and self.context_name == other.context_name)

    def __hash__(self) -> int:
        return self._hash

    def __getstate__(self) -> dict:
        # the hash mixes in string and class hashes, which differ between processes
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._hash = hash((GpuArrayType, self.dtype, self.broadcastable, self.context_name))

    def __str__(self) -> str:
        # Theano's spelling, which the seeds print: GpuArrayType<dev1>(float32, (False, False))
        return f"GpuArrayType<{self.context_name}>({self.dtype}, {self.broadcastable})"

    __repr__ = __str__

    def clone(self, dtype: str | None = None, broadcastable: Sequence[bool] | None = None,
              context_name: Any = "same") -> "GpuArrayType":
        return GpuArrayType(dtype or self.dtype,
                            self.broadcastable if broadcastable is None else broadcastable,
                            self.context_name if context_name == "same" else context_name)

    @property
    def shape(self) -> tuple:
        return tuple(1 if b else None for b in self.broadcastable)

    @property
    def context(self) -> Any:
        """The runtime GpuContext (raises ContextNotFound naming the known contexts)."""
        return _ctx(self.context_name)

    def tensor_type(self) -> TensorType:
        """The host twin of this type (what `HostFromGpu` produces)."""
        return TensorType(self.dtype, self.broadcastable)

    # -- pickling of shared values (symgpu.compile.sharedvalue.Container) -------------------
    def value_to_pickle(self, value: Any) -> Any:
        """A shared value is pickled as a host ndarray, so that it loads anywhere."""
        return value.get() if hasattr(value, "get") else np.asarray(value)

    def value_from_pickle(self, value: np.ndarray) -> tuple[Type, Any]:
        """On load: uploaded to this type's context where it is in use; a host value of the
        host twin type where there is none (Theano's unpickle_gpu_on_cpu)."""
        ctx = _unpickle_context(self.context_name)
        if ctx is None:
            return self.tensor_type(), self.tensor_type().filter(value)
        return self, self.filter(value)

    # -- values -----------------------------------------------------------------------------
    def filter(self, value: Any, strict: bool = False, allow_downcast: bool | None = None) -> Any:
        """`value` as a GpuArray of this type: GpuArrays pass, foreign CUDA arrays are wrapped
        without a copy, host values are checked like TensorType and uploaded."""
        if isinstance(value, GpuArray):
            arr = value
        elif hasattr(value, "__cuda_array_interface__"):
            arr = from_cuda_array_interface(value, self.context)
        else:
            if strict and not (isinstance(value, np.ndarray)
                               and dtype_name(value.dtype) == self.dtype):
                raise TypeError(f"expected a GpuArray (or an ndarray) of dtype {self.dtype}, got "
                                f"{type(value).__name__} of dtype {getattr(value, 'dtype', '?')}")
            host = self.tensor_type().filter(value, strict=False, allow_downcast=allow_downcast)
            return to_gpu(host, self.context)
        if dtype_name(arr.dtype) != self.dtype:
            if strict:
                raise TypeError(f"expected a GpuArray of dtype {self.dtype}, got {arr.dtype}")
            host = self.tensor_type().filter(arr.get(), allow_downcast=allow_downcast)
            return to_gpu(host, self.context)
        self._check_shape(arr)
        ctx = self.context
        if arr.context is not ctx:
            if strict:
                raise TypeError(f"the GpuArray lives on {arr.context}, not on context "
                                f"{self.context_name!r}")
            return to_gpu(arr.get(), ctx)
        return arr

    def _check_shape(self, arr: Any) -> None:
        if arr.ndim != self.ndim:
            raise TypeError(f"expected {self.ndim} dimension(s) ({self}), got {arr.ndim} "
                            f"(shape {arr.shape})")
        for i, (b, s) in enumerate(zip(self.broadcastable, arr.shape)):
            if b and s != 1:
                raise TypeError(f"dimension {i} is broadcastable in {self} and must have length "
                                f"1, got shape {arr.shape}")

    def make_fast_filter(self):
        """A predicate true for GpuArrays that need no conversion (the hot path of a call)."""
        try:
            ctx = self.context
        except LookupError:
            return lambda v: False
        dtype, ndim = np.dtype(self.dtype), self.ndim
        ones = [d for d, b in enumerate(self.broadcastable) if b]
        return lambda v: (v.__class__ is GpuArray and v.context is ctx and v.dtype == dtype
                          and v.ndim == ndim and all(v.shape[d] == 1 for d in ones))

    def values_eq(self, a: Any, b: Any) -> bool:
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and bool(np.all(a == b))

    def values_eq_approx(self, a: Any, b: Any, rtol: float | None = None,
                         atol: float | None = None) -> bool:
        return self.tensor_type().values_eq_approx(np.asarray(a), np.asarray(b), rtol, atol)

    # -- variables --------------------------------------------------------------------------
    def make_variable(self, name: str | None = None) -> "GpuArrayVariable":
        return GpuArrayVariable(self, None, None, name)

    def as_tensor(self, var: Variable) -> TensorVariable:
        """The host form of a GPU variable, so tensor functions accept GPU variables."""
        return _conversions.host_from_gpu(var)

    def convert_variable(self, var: Variable) -> Variable | None:
        """`var` as a variable of this type: a host tensor is uploaded (`GpuFromHost`), a GPU
        variable of another context copied (`GpuToGpu`); broadcastable dims as TensorType."""
        vt = var.type
        if vt == self:
            return var
        if not isinstance(vt, (TensorType, GpuArrayType)) or vt.dtype != self.dtype \
                or vt.ndim != self.ndim:
            return None
        return _conversions.to_type(var, self)


class GpuArrayVariable(ArrayVariableMixin, Variable):
    """A symbolic GPU array; it has the tensor operators (computed through the host form,
    which the placement pass moves back to the device)."""


def _install_operators() -> None:
    for name, value in vars(TensorOperators).items():
        if not name.startswith("__") or name in TensorOperators.dunders:
            setattr(GpuArrayVariable, name, value)


_install_operators()


class GpuArrayConstant(Constant, GpuArrayVariable):
    """A constant GpuArray; `host_data` keeps the host value it came from, when known
    (kernels may inline small constants instead of reading device memory)."""

    def __init__(self, type: GpuArrayType, data: Any, name: str | None = None,
                 host_data: np.ndarray | None = None):
        Constant.__init__(self, type, type.filter(data), name)
        self.host_data = host_data

    def signature(self) -> tuple:
        d = self.host_data
        if d is not None and d.size <= 1024:
            return (self.type, d.shape, d.tobytes())
        return (self.type, id(self.data))

    def auto_name(self) -> str:
        if self.name is not None:
            return self.name
        d = self.host_data
        if d is not None and d.size == 1:
            return f"GpuArrayConstant{{{d.reshape(()).item()!r}}}"
        return f"GpuArrayConstant{{{self.type.dtype} {tuple(self.data.shape)}}}"


GpuArrayType.variable_type = GpuArrayVariable
GpuArrayType.constant_type = GpuArrayConstant


def is_gpu_var(var: Any) -> bool:
    """Whether `var` is a symbolic GPU array."""
    return isinstance(var, Variable) and isinstance(var.type, GpuArrayType)


def gpu_type_like(x: Any, context_name: str | None = None,
                  dtype: str | None = None) -> GpuArrayType:
    """The GpuArrayType with the dtype and broadcast pattern of a variable or type `x`."""
    t = x.type if isinstance(x, Variable) else x
    return GpuArrayType(dtype or t.dtype, t.broadcastable, context_name)


# ----------------------------------------------------------------------------- shared

def _call_lock(value: Any) -> Any:
    """The call lock of the context ``value`` lives on (context.GpuContext.call_lock), or a
    no-op: a shared variable's transfers wait for a GPU function call in another thread."""
    lock = getattr(getattr(value, "context", None), "call_lock", None)
    return lock if lock is not None else nullcontext()


class GpuArraySharedVariable(SharedVariable, GpuArrayVariable):
    """A shared array that lives on the GPU across calls; compiled functions read and update
    the GpuArray in place of a host copy."""

    def get_value(self, borrow: bool = False, return_internal_type: bool = False) -> Any:
        """A host ndarray copy of the value; the GpuArray itself with
        `return_internal_type=True` (copied unless `borrow=True`), as in Theano."""
        with self.container.locked():  # not while a call is between reading and updating it
            value = self.container.storage[0]
            with _call_lock(value):  # not while another thread's call captures a graph
                if return_internal_type:
                    # a borrowed buffer is the user's to keep: graphs stop updating it in place
                    return lend(value) if borrow else value.copy()
                value = value.get()
        return value if self.value_view is None else self.value_view.present(value)

    def set_value(self, value: Any, borrow: bool = False) -> None:
        """Upload `value` (checked against the type first: on error nothing changes). A
        device value is copied unless `borrow=True`."""
        if self.value_view is not None:
            value = self.value_view.accept(value)
        with _call_lock(self.container.storage[0]):  # not during another thread's capture
            new = self.type.filter(value, strict=False, allow_downcast=None)
            on_device = not isinstance(value, (np.ndarray, np.generic, int, float, bool, list,
                                               tuple))
            if on_device and not borrow:
                new = new.copy().sync()  # the owner may overwrite its array on its own stream
            elif on_device:
                lend(new)                # the caller keeps it: graphs never write into it
        with self.container.locked():  # after (not inside) any call updating it
            self.container.storage[0] = new

    def _copy_out(self, value: Any) -> Any:
        return value.get()

    def _copy_in(self, value: Any) -> Any:
        return value.copy()

    def __reduce__(self):
        # the container pickles the value as a host array (GpuArrayType.value_to_pickle)
        # and decides on load whether it goes back to a GPU or stays on the host
        return (_unpickle_gpu_shared, (self.container, self.name, self.value_view))


def _unpickle_gpu_shared(container: Container, name: str | None,
                         value_view: Any = None) -> SharedVariable:
    """A GPU shared variable where its context is in use, else a host one (same value)."""
    if isinstance(container.type, GpuArrayType):
        var = GpuArraySharedVariable(container.type, None, name=name, container=container)
    else:
        var = TensorSharedVariable(container.type, None, name=name, container=container)
    if value_view is not None:
        var.value_view = value_view
    return var


@register_shared_constructor
def gpuarray_shared_constructor(value: Any, name: str | None = None, borrow: bool = False,
                                strict: bool = False, allow_downcast: bool | None = None,
                                target: Any = "default",
                                broadcastable: Sequence[bool] | None = None
                                ) -> GpuArraySharedVariable:
    """`shared()` on the GPU: `target='default'` uses the default context when one is in use
    (not for discrete scalars), None or a context name force a context. Raises TypeError
    (so the host constructor is tried next) when the value or the place does not qualify."""
    if target == "cpu":
        raise TypeError("target='cpu' asks for the host")
    foreign = not isinstance(value, GpuArray) and hasattr(value, "__cuda_array_interface__")
    if isinstance(value, (float, np.floating)) or (
            isinstance(value, np.generic) and is_float(value.dtype.name)):   # bfloat16's scalar
        # a float scalar (a bias written `shared(0.)`) lives on the device like an array:
        # on the host it would be uploaded and downloaded on every call, two syncs a step
        value = host_value(value)
    if not (isinstance(value, (np.ndarray, GpuArray)) or foreign):
        raise TypeError(f"only arrays go to the GPU, not {type(value).__name__}")
    if target == "default":
        if not default_context_active():
            raise TypeError("no default GPU context is in use (device=cpu)")
        context_name = None
    elif target is None or isinstance(target, str):
        context_name = target
    else:
        raise TypeError(f"target must be 'cpu', None or a context name, not {target!r}")
    try:
        ctx = _ctx(context_name)
    except LookupError as exc:
        raise TypeError(str(exc)) from None
    if ctx.virtual:
        raise TypeError(f"context {context_name!r} is virtual and cannot hold values")
    if foreign:
        value = from_cuda_array_interface(value, ctx)  # a view: copied below unless borrowed
    if target == "default" and not move_to_gpu(value):
        raise TypeError(f"a {value.dtype} {len(value.shape)}-d value stays on the host")
    if not gpu_supports_dtype(str(value.dtype)):
        raise TypeError(f"dtype {value.dtype} cannot live on the GPU")
    ndim = len(value.shape)
    bcast = tuple(broadcastable) if broadcastable is not None else (False,) * ndim
    gtype = GpuArrayType(str(value.dtype), bcast, context_name)
    data = gtype.filter(value, strict=strict, allow_downcast=allow_downcast)
    if isinstance(value, GpuArray) and data is value and not borrow:
        data = data.copy()
        if foreign:
            data.sync()  # the owner may overwrite its array on its own stream
    elif isinstance(value, GpuArray) and data is value:
        lend(data)       # borrowed: the caller keeps it, graphs never write into it
    return GpuArraySharedVariable(gtype, None, name=name, strict=strict,
                                  allow_downcast=allow_downcast,
                                  container=Container(gtype, data, name))
