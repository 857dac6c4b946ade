"""GpuArray: a strided NumPy-like array in device memory.

Why it looks like this: the VM passes GpuArrays between thunks millions of times, so an array is
a slotted record (context, device address, shape, byte strides, dtype, owner) and views cost no
device work.  Memory comes from the context's pool; the owner (a pool Block, or a foreign
object such as a torch tensor) lives as long as any view of it.  Strides are in bytes like
NumPy's and never negative: a reversed slice (``a[::-1]``) returns a contiguous *copy*.

Every copy runs on the context's stream.  Copies to the host land directly in a page-locked
buffer leased from the context's :class:`~symgpu.gpu.runtime.pool.PinnedPool` (``memcpy_dtoh_async`` +
one stream sync); the returned ndarray *is* that buffer and gives it back to the pool when it is
garbage-collected, so a loop ``r = f()`` allocates nothing and copies each byte once.  Past the
pool's limits a copy goes through pageable memory.

Arithmetic, comparisons, in-place operators, reductions, ``astype`` and NumPy's ufuncs are
installed on the class by :mod:`symgpu.gpu.ops.array_math` (the GPU package loads it with
its ops): they run the kernels the compiler generates for graphs, which live above this layer.

A GpuArray copies (``copy.copy``/``copy.deepcopy``) on the device and pickles as its host value
and the name of its context; loading looks that context up again and uploads the value there,
or, where this process does not use it (no GPU, device=cpu), gives the NumPy array (Theano's
``experimental.unpickle_gpu_on_cpu``, always on).

PyCUDA is imported only inside functions, so ``import symgpu.gpu.runtime.array`` works without it.
"""
from __future__ import annotations

import operator
import sys
from typing import Any, Sequence

import numpy as np

from symgpu.gpu.runtime import context as gpu_context, dlpack
from symgpu.gpu.runtime.check_slots import raise_device_errors
from symgpu.gpu.runtime.codegen.layout import c_contiguous
from symgpu.gpu.runtime.context import (context_for_ordinal, context_in_use,
                                        device_of_pointer, foreign_stream_waits,
                                        registered_name, wait_for_foreign_stream)
from symgpu.gpu.runtime.copykernel import strided_copy
from symgpu.gpu.runtime.dtypes import SUPPORTED_DTYPES, check_dtype, dtype_name
from symgpu.gpu.runtime.host_register import upload
from symgpu.gpu.runtime.pool import size_class

__all__ = ["GpuArray", "DevicePointer", "new_array", "empty", "zeros", "to_gpu", "asarray",
           "get_many", "from_cuda_array_interface", "from_dlpack", "check_dtype", "c_strides",
           "dtype_name", "SUPPORTED_DTYPES"]

_STAGING_LIMIT = 64 << 20      # larger copies go straight into the result (no double copy)
_STAGING_KEEP = 8              # cached pinned buffers per context

def nocopy_strides(shape: Sequence[int], strides: Sequence[int],
                   new_shape: Sequence[int]) -> tuple[int, ...] | None:
    """Byte strides that read an array of ``shape``/``strides`` as ``new_shape`` (same size)
    without copying, or None where no view can (NumPy's ``_attempt_nocopy_reshape``, C
    order): splitting or merging axes needs only the merged axes to be contiguous with each
    other, so a column slice ``x[:, a:b]`` splits its last axis as a view."""
    old = [(n, st) for n, st in zip(shape, strides) if n != 1]
    new_strides = [0] * len(new_shape)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(new_shape) and oi < len(old):
        np_, op_ = new_shape[ni], old[oi][0]
        while np_ != op_:
            if np_ < op_:
                np_ *= new_shape[nj]
                nj += 1
            else:
                op_ *= old[oj][0]
                oj += 1
        for k in range(oi, oj - 1):
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                return None
        new_strides[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            new_strides[k - 1] = new_strides[k] * new_shape[k]
        ni, oi = nj, oj
        nj, oj = nj + 1, oj + 1
    last = new_strides[ni - 1] if ni >= 1 else 0
    for k in range(ni, len(new_shape)):
        new_strides[k] = last
    return tuple(new_strides)


def byte_extent(a: "GpuArray") -> tuple[int, int]:
    """The device byte range ``[lo, hi)`` a non-empty array spans (negative strides too):
    what overlap tests between two views compare."""
    lo = hi = a.ptr
    for n, st in zip(a.shape, a.strides):
        if st < 0:
            lo += (n - 1) * st
        else:
            hi += (n - 1) * st
    return lo, hi + a.itemsize


def c_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    """Byte strides of a C-contiguous array of ``shape``."""
    nd = len(shape)
    if nd == 1:                 # the common ranks without the loop (a thunk's outputs)
        return (itemsize,)
    if nd == 2:
        n = shape[1]
        return (itemsize * n if n > 1 else itemsize, itemsize)
    strides = []
    acc = itemsize
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


#: check_dtype's answers by the dtype asked for (a string, a type or a np.dtype): ops make
#: their outputs with GpuArray(shape, dtype, ctx) on every call
_CHECKED: dict[Any, np.dtype] = {}


def _checked_dtype(dtype: Any) -> np.dtype:
    try:
        dt = _CHECKED.get(dtype)
    except TypeError:    # unhashable: check_dtype says what it is
        return check_dtype(dtype)
    if dt is None:
        dt = check_dtype(dtype)
        if len(_CHECKED) < 256:
            _CHECKED[dtype] = dt
    return dt


def _normalize_shape(shape: Any) -> tuple[int, ...]:
    if type(shape) is tuple:     # the common case: a tuple of non-negative ints, kept as is
        for n in shape:
            if type(n) is not int or n < 0:
                break
        else:
            return shape
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    out = tuple(operator.index(n) for n in shape)
    if any(n < 0 for n in out):
        raise ValueError(f"negative dimensions are not allowed: {out}")
    return out


class DevicePointer:
    """A device address that keeps its memory alive: ``int(p)`` is the address.

    It works as a PyCUDA kernel argument (``prepared_call`` "P" formats take ``__index__``;
    a plain ``fn(...)`` call reads its ``gpudata``), like PyCUDA's ``DeviceAllocation``."""

    __slots__ = ("ptr", "owner")

    def __init__(self, ptr: int, owner: Any) -> None:
        self.ptr, self.owner = ptr, owner

    def __int__(self) -> int:
        return self.ptr

    __index__ = __int__

    @property
    def gpudata(self) -> int:
        return self.ptr

    def __eq__(self, other: Any) -> bool:
        try:
            return self.ptr == int(other)
        except (TypeError, ValueError):
            return NotImplemented

    def __hash__(self) -> int:
        return hash(self.ptr)

    def __repr__(self) -> str:
        return f"<DevicePointer {self.ptr:#x}>"


class _Flags:
    """``a.flags.c_contiguous`` or ``a.flags['C_CONTIGUOUS']``, as NumPy spells them."""

    __slots__ = ("c_contiguous", "f_contiguous")

    def __init__(self, c: bool, f: bool) -> None:
        self.c_contiguous, self.f_contiguous = c, f

    def __getitem__(self, key: str) -> bool:
        key = key.upper()
        if key in ("C", "C_CONTIGUOUS", "CONTIGUOUS"):
            return self.c_contiguous
        if key in ("F", "F_CONTIGUOUS", "FORTRAN"):
            return self.f_contiguous
        raise KeyError(key)

    def __repr__(self) -> str:
        return f"  C_CONTIGUOUS : {self.c_contiguous}\n  F_CONTIGUOUS : {self.f_contiguous}"


def _default_context(context: Any) -> Any:
    if context is not None and not isinstance(context, str):
        return context
    return gpu_context.get_context(context)


class GpuArray:
    """A strided device array.  Make one with :func:`empty`, :func:`zeros`, :func:`to_gpu`,
    :func:`asarray` or ``GpuArray(shape, dtype)``; see the module doc for the model."""

    __slots__ = ("context", "ptr", "shape", "strides", "dtype", "base", "_gpudata",
                 "__weakref__")

    def __init__(self, shape: Any, dtype: Any = "float32", context: Any = None) -> None:
        ctx = _default_context(context)
        dt = _checked_dtype(dtype)
        shape = _normalize_shape(shape)
        size = 1
        for n in shape:
            size *= n
        if ctx.pool is None:
            ctx._require_device()  # a virtual context: says why it cannot allocate
        block = ctx.pool.allocate(size * dt.itemsize) if size else None
        self._set(ctx, block.ptr if block is not None else 0, shape,
                  c_strides(shape, dt.itemsize), dt, block)

    def _set(self, ctx: Any, ptr: int, shape: tuple, strides: tuple, dtype: np.dtype,
             base: Any) -> None:
        self.context, self.ptr, self.shape, self.strides = ctx, ptr, shape, strides
        self.dtype, self.base, self._gpudata = dtype, base, None

    @classmethod
    def _from_pointer(cls, ctx: Any, ptr: int, shape: tuple, dtype: np.dtype,
                      strides: tuple | None, base: Any) -> "GpuArray":
        """Wrap existing device memory (no copy).  Negative strides yield a contiguous copy."""
        dtype = check_dtype(dtype)
        shape = tuple(int(n) for n in shape)
        strides = c_strides(shape, dtype.itemsize) if strides is None else tuple(
            int(s) for s in strides)
        arr = cls.__new__(cls)
        arr._set(ctx, int(ptr), shape, strides, dtype, base)
        if any(s < 0 for s, n in zip(strides, shape) if n > 1):
            return arr.copy()
        return arr

    def _view(self, ptr: int, shape: tuple, strides: tuple) -> "GpuArray":
        arr = _new_gpuarray(GpuArray)     # the slots set here, not through _set: one call less
        arr.context, arr.ptr, arr.shape, arr.strides = self.context, ptr, shape, strides
        arr.dtype, arr.base, arr._gpudata = self.dtype, self.base, None
        return arr

    # -- NumPy-like attributes
    @property
    def size(self) -> int:
        size = 1
        for n in self.shape:
            size *= n
        return size

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def gpudata(self) -> DevicePointer:
        """The device pointer (keeps the memory alive); a PyCUDA kernel argument."""
        if self._gpudata is None:
            self._gpudata = DevicePointer(self.ptr, self.base)
        return self._gpudata

    @property
    def is_c_contiguous(self) -> bool:
        return c_contiguous(self.shape, self.strides, self.dtype.itemsize)

    @property
    def is_f_contiguous(self) -> bool:
        return c_contiguous(self.shape[::-1], self.strides[::-1], self.dtype.itemsize)

    @property
    def flags(self) -> _Flags:
        return _Flags(self.is_c_contiguous, self.is_f_contiguous)

    @property
    def T(self) -> "GpuArray":
        return self.transpose()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d GpuArray")
        return self.shape[0]

    # -- views
    def transpose(self, *axes: Any) -> "GpuArray":
        """A view with axes permuted (reversed when none are given)."""
        if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
            axes = tuple(axes[0]) if axes[0] is not None else ()
        nd = self.ndim
        if not axes:
            perm = tuple(reversed(range(nd)))
        else:
            perm = tuple(operator.index(a) + (nd if operator.index(a) < 0 else 0) for a in axes)
        if sorted(perm) != list(range(nd)):
            raise ValueError(f"axes {tuple(axes)} are not a permutation of {nd} axes")
        return self._view(self.ptr, tuple(self.shape[a] for a in perm),
                          tuple(self.strides[a] for a in perm))

    def reshape(self, *shape: Any, order: str = "C") -> "GpuArray":
        """A view when the strides allow one (NumPy's rule: always for C-contiguous data), else
        a reshaped contiguous copy."""
        if order != "C":
            raise ValueError("GpuArray.reshape supports order='C' only")
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        shape = tuple(operator.index(n) for n in shape)
        size = self.size
        if shape.count(-1) > 1:
            raise ValueError("can only specify one unknown dimension")
        if -1 in shape:
            known = 1
            for n in shape:
                if n != -1:
                    known *= n
            if known == 0 or size % known:
                raise ValueError(f"cannot reshape array of size {size} into shape {shape}")
            shape = tuple(size // known if n == -1 else n for n in shape)
        total = 1
        for n in shape:
            total *= n
        if total != size or any(n < 0 for n in shape):
            raise ValueError(f"cannot reshape array of size {size} into shape {shape}")
        if self.is_c_contiguous:
            return self._view(self.ptr, shape, c_strides(shape, self.itemsize))
        view = nocopy_strides(self.shape, self.strides, shape) if size else None
        if view is not None:
            return self._view(self.ptr, shape, view)
        src = self.copy()
        return src._view(src.ptr, shape, c_strides(shape, self.itemsize))

    def __getitem__(self, key: Any) -> "GpuArray":
        """Basic indexing: ints, slices (a negative step copies), None and Ellipsis."""
        view, reversed_ = self._basic_view(key)
        return view.copy() if reversed_ else view

    def _broadcast_to(self, target: tuple, who: str = "") -> "GpuArray":
        """A view read as shape ``target`` (NumPy's broadcasting: length-1 and new leading
        dims repeat through stride 0); ``who`` names the caller in the error."""
        if self.ndim > len(target):
            raise ValueError(f"{who}: cannot broadcast a value of shape {self.shape} to "
                             f"{tuple(target)}")
        lead = len(target) - self.ndim
        strides = [0] * lead
        for n, t, st in zip(self.shape, target[lead:], self.strides):
            if n != t and n != 1:
                raise ValueError(f"{who}: cannot broadcast a value of shape {self.shape} to "
                                 f"{tuple(target)}")
            strides.append(st if n == t and n != 1 else 0)
        return self._view(self.ptr, tuple(target), tuple(strides))

    def _basic_view(self, key: Any) -> tuple["GpuArray", bool]:
        """``(self[key] as a true view, whether some axis runs backwards)``: a negative step
        gives negative strides here (GpuIncSubtensor writes through them), where
        ``__getitem__`` returns a copy."""
        if not isinstance(key, tuple):
            key = (key,)
        n_ell = sum(1 for k in key if k is Ellipsis)
        if n_ell > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
        if n_real > self.ndim:
            raise IndexError(f"too many indices: array is {self.ndim}-dimensional, but "
                             f"{n_real} were indexed")
        fill = (slice(None),) * (self.ndim - n_real)
        if n_ell:
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            key = key[:i] + fill + key[i + 1:]
        else:
            key = key + fill
        ptr, shape, strides, axis, reversed_ = self.ptr, [], [], 0, False
        for k in key:
            if k is None:
                shape.append(1)
                strides.append(0)
                continue
            n, s = self.shape[axis], self.strides[axis]
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                length = len(range(start, stop, step))
                if length:
                    ptr += start * s
                shape.append(length)
                strides.append(step * s)
                reversed_ |= step < 0 and length > 1
            else:
                try:
                    i = operator.index(k)
                except TypeError:
                    raise IndexError(f"GpuArray takes ints, slices, None and ... as indices, not "
                                     f"{type(k).__name__}; index on the host or in a graph for "
                                     f"advanced indexing") from None
                if not -n <= i < n:
                    raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
                ptr += (i % n) * s
            axis += 1
        return self._view(ptr, tuple(shape), tuple(strides)), reversed_

    # -- device work
    def _activate(self) -> Any:
        ctx = self.context
        ctx.activate()
        return ctx

    def sync(self) -> "GpuArray":
        """Block until all queued work on this array's context is done."""
        self.context.synchronize()
        return self

    def copy(self) -> "GpuArray":
        """A new C-contiguous array with the same values."""
        out = GpuArray(self.shape, self.dtype, self.context)
        out._copy_from_device(self)
        return out

    def _copy_from_device(self, src: "GpuArray") -> None:
        """``self[...] = src`` for equal shapes and dtypes, on the stream."""
        if src.size == 0:
            return
        ctx = self._activate()
        if self.is_c_contiguous and src.is_c_contiguous:
            import pycuda.driver as drv
            drv.memcpy_dtod_async(self.ptr, src.ptr, self.nbytes, ctx.stream)
        else:
            strided_copy(ctx, src.ptr, self.ptr, self.shape, src.strides, self.strides,
                         self.itemsize)

    def set(self, ary: Any) -> "GpuArray":
        """Upload ``ary`` (same shape; cast to this dtype) into this array.  A GpuArray of the
        same dtype is copied on the device."""
        if isinstance(ary, GpuArray) and ary.dtype == self.dtype and ary.context is self.context:
            if ary.shape != self.shape:
                raise ValueError(f"cannot set a GpuArray of shape {self.shape} from one of "
                                 f"shape {ary.shape}")
            self._copy_from_device(ary)
            return self
        host = np.asarray(ary)
        if host.shape != self.shape:
            raise ValueError(f"cannot set a GpuArray of shape {self.shape} from an array of "
                             f"shape {host.shape}")
        if self.size == 0:
            return self
        host = np.ascontiguousarray(host, dtype=self.dtype)
        if not self.is_c_contiguous:
            self._copy_from_device(to_gpu(host, self.context))
            return self
        upload(self._activate(), self.ptr, host)   # user arrays seen again: plain DMA
        return self

    def fill(self, value: Any) -> "GpuArray":
        """Set every element to ``value`` with driver memsets (a host upload for several
        8-byte values whose halves differ)."""
        shape, itemsize = self.shape, self.dtype.itemsize
        size = 1
        for n in shape:
            size *= n
        if size == 0:
            return self
        if not c_contiguous(shape, self.strides, itemsize):
            tmp = GpuArray(shape, self.dtype, self.context).fill(value)
            self._copy_from_device(tmp)
            return self
        self._memset(np.array(value, dtype=self.dtype).reshape(1).tobytes(), size)
        return self

    def _memset(self, pattern: bytes, size: int) -> None:
        """Set the first ``size`` elements of this C-contiguous array to the element whose
        bytes are ``pattern``: ``fill``'s device work, for callers that have those bytes."""
        ctx = self._activate()
        import pycuda.driver as drv
        stream, itemsize = ctx.stream, len(pattern)
        if itemsize == 1:
            drv.memset_d8_async(self.ptr, pattern[0], size, stream)
        elif itemsize == 2:
            drv.memset_d16_async(self.ptr, _word(pattern), size, stream)
        elif itemsize == 4:
            drv.memset_d32_async(self.ptr, _word(pattern), size, stream)
        else:
            low, high = _word(pattern[:4]), _word(pattern[4:])
            if low == high:
                drv.memset_d32_async(self.ptr, low, 2 * size, stream)
            elif size == 1:   # two word memsets: no host buffer (a CUDA graph may record it)
                drv.memset_d32_async(self.ptr, low, 1, stream)
                drv.memset_d32_async(self.ptr + 4, high, 1, stream)
            else:
                value = np.frombuffer(pattern, self.dtype)[0]
                self.set(np.full(self.shape, value, dtype=self.dtype))

    def get(self, out: np.ndarray | None = None) -> np.ndarray:
        """A host copy (C-contiguous ndarray), or the data written into ``out``.

        Without ``out`` the copy lands directly in a pinned buffer leased from the context's
        pool (see the module doc): one async copy, one stream sync, no second host copy."""
        if out is None:
            return get_many([self])[0]
        if out.shape != self.shape or out.dtype != self.dtype:
            raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}; expected "
                             f"{self.shape} and {self.dtype}")
        if not out.flags.c_contiguous:
            out[...] = self.get()
            return out
        result = out
        if self.size == 0:
            return result
        src = self if self.is_c_contiguous else self.copy()
        ctx = src._activate()
        import pycuda.driver as drv
        nbytes = src.nbytes
        flat = result.reshape(-1).view(np.uint8)
        if nbytes > _STAGING_LIMIT:
            ctx.stream.synchronize()
            raise_device_errors(ctx)
            drv.memcpy_dtoh(flat, src.ptr)
            return result
        with ctx.lock:
            buf = _staging(ctx, nbytes)
            drv.memcpy_dtoh_async(buf, src.ptr, ctx.stream)
            ctx.stream.synchronize()
            np.copyto(flat, buf)
        raise_device_errors(ctx)
        return result

    # -- interop
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:
            raise ValueError("a GpuArray cannot be viewed as a NumPy array without a copy")
        host = self.get()
        return host if dtype is None else host.astype(dtype, copy=False)

    @property
    def __cuda_array_interface__(self) -> dict:
        ctx = self.context
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "strides": None if self.is_c_contiguous else self.strides, "version": 3,
                "stream": ctx.stream_handle or None}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (dlpack.KDL_CUDA, self.context.ordinal)

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple | None = None,
                   dl_device: tuple | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule sharing this memory; ``stream`` (the consumer's) is made to wait
        for the work already queued on ours (-1: no synchronisation)."""
        if dl_device is not None and tuple(int(x) for x in dl_device) != \
                self.__dlpack_device__():
            raise BufferError(f"GpuArray lives on CUDA device {self.context.ordinal}; it cannot "
                              f"be exported to DLPack device {tuple(dl_device)}")
        src = self.copy() if copy else self
        if src.ptr:
            foreign_stream_waits(self.context, stream)
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        return dlpack.export_capsule(src, versioned)

    # -- Python's protocols that read values (NumPy's rules; each downloads)
    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError(f"the truth value of a GpuArray of shape {self.shape} is "
                             "ambiguous: use a.any() or a.all() on the host (np.asarray(a))")
        return bool(self.get().reshape(()))

    def __float__(self) -> float:
        return float(self._one_value("float"))

    def __int__(self) -> int:
        return int(self._one_value("int"))

    def _one_value(self, what: str) -> np.ndarray:
        if self.size != 1:
            raise TypeError(f"only a GpuArray of one element converts to {what}; this one "
                            f"has shape {self.shape}")
        return self.get().reshape(())

    # -- copying and pickling (see the module doc)
    def __copy__(self) -> "GpuArray":
        return self.copy()

    def __deepcopy__(self, memo: dict) -> "GpuArray":
        return self.copy()

    def __reduce__(self):
        # the value and the context's name, never the context (PyCUDA objects do not pickle)
        return (_gpuarray_from_pickle, (np.array(self.get()), registered_name(self.context)))

    # -- printing
    def __repr__(self) -> str:
        text = np.array_repr(self.get())
        pad = " " * len("gpuarray.")
        return "gpuarray." + text.replace("\n", "\n" + pad)

    def __str__(self) -> str:
        return str(self.get())


_new_gpuarray = GpuArray.__new__


def _gpuarray_from_pickle(host: np.ndarray, context_name: str | None) -> Any:
    """Unpickling a GpuArray: uploaded to the context of that name where this process uses
    it, else the host array itself (Theano's ``unpickle_gpu_on_cpu``)."""
    ctx = context_in_use(context_name)
    return host if ctx is None else to_gpu(host, ctx)


def _word(data: bytes) -> int:
    """The unsigned integer that ``data`` (1, 2 or 4 bytes of an element) holds in memory,
    as ``np.frombuffer(data, uint<n>)[0]`` reads it: the value a memset writes back."""
    return int.from_bytes(data, sys.byteorder)


def get_many(arrays: Sequence[GpuArray]) -> list[np.ndarray]:
    """Host copies of ``arrays``: every copy is queued on its context's stream into a pinned
    buffer of the context's pool, then one sync per stream.  Copies the pool refuses (too
    large, or past its cap) go through pageable memory after that sync."""
    results: list[Any] = []
    late: list[tuple[int, GpuArray]] = []
    contexts: list[Any] = []
    import pycuda.driver as drv
    for k, a in enumerate(arrays):
        if a.size == 0:
            results.append(np.empty(a.shape, a.dtype))
            continue
        src = a if a.is_c_contiguous else a.copy()
        ctx = src._activate()
        if ctx not in contexts:
            contexts.append(ctx)
        pinned = getattr(ctx, "pinned", None)
        res = pinned.empty(a.shape, a.dtype) if pinned is not None else None
        if res is None:
            results.append(None)
            late.append((k, src))
            continue
        drv.memcpy_dtoh_async(res.reshape(-1).view(np.uint8), src.ptr, ctx.stream)
        results.append(res)
    for ctx in contexts:
        ctx.activate()
        ctx.stream.synchronize()
    for ctx in contexts:
        raise_device_errors(ctx)
    for k, src in late:
        src._activate()
        res = np.empty(src.shape, src.dtype)
        drv.memcpy_dtoh(res.reshape(-1).view(np.uint8), src.ptr)
        results[k] = res
    return results


def _staging(ctx: Any, nbytes: int) -> np.ndarray:
    """A pinned host buffer of ``nbytes`` (a view of a cached, size-classed allocation)."""
    size = size_class(nbytes)
    buf = ctx.staging.pop(size, None)
    if buf is None:
        import pycuda.driver as drv
        buf = drv.pagelocked_empty(size, np.uint8)
        while len(ctx.staging) >= _STAGING_KEEP:
            ctx.staging.pop(next(iter(ctx.staging)))
    ctx.staging[size] = buf  # re-inserted last: the dict order is least recently used first
    return buf[:nbytes]


# --------------------------------------------------------------------------- constructors
def new_array(ctx: Any, shape: tuple, dtype: np.dtype, strides: tuple | None = None,
              nbytes: int | None = None) -> Any:
    """A C-contiguous GpuArray from ``ctx``'s pool without the public constructor's checks
    (shape and dtype are already known to be valid on this path)."""
    if nbytes is None:
        nbytes = dtype.itemsize
        for n in shape:
            nbytes *= n
    block = ctx.pool.allocate(nbytes) if nbytes else None
    arr = _new_gpuarray(GpuArray)
    arr._set(ctx, block.ptr if block is not None else 0, shape,
             strides if strides is not None else c_strides(shape, dtype.itemsize), dtype, block)
    return arr


def empty(shape: Any, dtype: Any = "float32", context: Any = None) -> GpuArray:
    """An uninitialised C-contiguous array from the pool of ``context`` (default context if
    None; a context name works too)."""
    return GpuArray(shape, dtype, context)


def zeros(shape: Any, dtype: Any = "float32", context: Any = None) -> GpuArray:
    """A C-contiguous array of zeros (a memset on the stream)."""
    return GpuArray(shape, dtype, context).fill(0)


def to_gpu(ary: Any, context: Any = None) -> GpuArray:
    """Upload a host array (anything ``numpy.asarray`` takes); a GpuArray is copied."""
    if isinstance(ary, GpuArray):
        return ary.copy()
    host = np.asarray(ary)
    out = GpuArray(host.shape, host.dtype, context)
    return out.set(host)


def from_cuda_array_interface(obj: Any, context: Any = None) -> GpuArray:
    """A GpuArray sharing the memory of ``obj`` (torch/CuPy/PyCUDA arrays...), keeping ``obj``
    alive.  Our stream waits for the producer's stream named in the interface."""
    cai = obj.__cuda_array_interface__
    if "stream" not in cai and hasattr(obj, "__dlpack__"):
        # a version-2 producer (PyTorch) names no stream to wait for; through DLPack it
        # makes our stream wait for its current stream itself
        return from_dlpack(obj, None if context is None else _default_context(context))
    if cai.get("mask") is not None:
        raise ValueError("masked __cuda_array_interface__ arrays are not supported")
    ptr = int(cai["data"][0] or 0)
    if context is not None:
        ctx = _default_context(context)
    else:
        ctx = context_for_ordinal(device_of_pointer(ptr)) if ptr else _default_context(None)
    wait_for_foreign_stream(ctx, cai.get("stream"))
    return GpuArray._from_pointer(ctx, ptr, tuple(cai["shape"]), np.dtype(cai["typestr"]),
                                  cai.get("strides"), obj)


def asarray(obj: Any, context: Any = None) -> GpuArray:
    """``obj`` as a GpuArray: itself, a shared view of a CUDA array (no copy), or an upload."""
    if isinstance(obj, GpuArray):
        return obj
    if hasattr(obj, "__cuda_array_interface__"):
        return from_cuda_array_interface(obj, context)
    if hasattr(obj, "__dlpack_device__") and obj.__dlpack_device__()[0] != 1:
        return from_dlpack(obj, context)
    return to_gpu(obj, context)


def from_dlpack(obj: Any, context: Any = None) -> GpuArray:
    """A GpuArray sharing the memory of ``obj`` (anything with ``__dlpack__`` on a CUDA device,
    or a raw ``dltensor`` capsule; no copy).  The producer's memory lives as long as the
    GpuArray.  ``context``: a GpuContext or None (the producer's device)."""
    if isinstance(obj, GpuArray):
        return obj
    ctx = context
    if hasattr(obj, "__dlpack__"):
        ordinal = dlpack.producer_ordinal(obj)
        if ordinal is not None:
            ctx = ctx or context_for_ordinal(ordinal)
        capsule = dlpack.capsule_of(obj, ctx.stream_handle if ctx is not None else None)
    else:
        capsule = obj
    data, shape, dtype, strides, ordinal, owner = dlpack.consume(capsule, obj)
    ctx = ctx or context_for_ordinal(ordinal)
    return GpuArray._from_pointer(ctx, data, shape, dtype, strides, owner)
