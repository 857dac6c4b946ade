"""GPU real FFTs: GpuRFFT and GpuIRFFT through cuFFT (symgpu/gpu/ops/cufft_lib.py), lifted
from symgpu.tensor.fft's RFFTOp and IRFFTOp (1-, 2- and 3-d transforms over every axis but
the batch axis; float32 through R2C/C2R, float64 through D2Z/Z2D).

Why the layout costs nothing: cuFFT's interleaved complex output is exactly Theano's (..., 2)
real/imaginary layout, so rfft writes the op's output directly (one plan, one call, no copy
for a C-contiguous input). Both ops are unnormalised, as the CPU ops: `rfft`/`irfft` express
the 1/n or 1/sqrt(n) scaling as graph arithmetic, which the GPU elementwise lifting (and its
fusion with what follows) takes over. C2R overwrites its input, so irfft first packs its input
into a pool buffer (one kernel, fft.cu, that also makes the k = 0 and n/2 planes Hermitian
as NumPy's irfftn implicitly does). Gradients are the CPU ops': each is the other op, so a
gradient graph lifts too. Plans and work areas come from the binding and the context's pool,
on the context's stream: the thunks are CUDA-graph capturable.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from symgpu.gpu.ops.cufft_lib import cufft
from symgpu.gpu.ops.elemwise import _context, _virtual_thunk, new_array
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType
from symgpu.gpu.runtime.codegen import launch, template
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.tensor.fft import IRFFTOp, RFFTOp, irfft, rfft
from symgpu.tensor.type import as_tensor_variable

__all__ = ["GpuRFFT", "GpuIRFFT", "curfft", "cuirfft", "FFT_DTYPES", "MAX_RANK", "fft_source"]

FFT_DTYPES = ("float32", "float64")
#: cuFFT's plans have rank 1, 2 or 3: transforms of more axes stay on the CPU
MAX_RANK = 3
_MAX_DIMS = MAX_RANK + 1          # the batch axis and the transform axes
_MODULE_KEY = ("symgpu.fft",)
_META = "q" * (2 * _MAX_DIMS)
_FORMATS = {**{f"fft_pack_{d}": "PPqq" + _META for d in FFT_DTYPES},
            **{f"fft_hermitian_{d}": "PPqqqq" + _META for d in FFT_DTYPES}}
_BLOCK, _MAX_BLOCKS = 256, 4096


def fft_source() -> str:
    """The module of the ops' two kernels (codegen/fft.cu)."""
    return template("fft.cu").substitute(max_dims=_MAX_DIMS)


def _grid(n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    return (max(1, min(_MAX_BLOCKS, -(-n // _BLOCK))), 1, 1), (_BLOCK, 1, 1)


def _meta(shape, strides) -> list[int]:
    pad = _MAX_DIMS - len(shape)
    return [*shape, *[1] * pad, *strides, *[0] * pad]


def _transform_shape(op: Op, s: Any, want: tuple, x: Any, what: str) -> tuple[int, ...]:
    got = tuple(int(v) for v in np.asarray(s).reshape(-1))
    if got != want:
        raise ValueError(f"{op}: the transform shape s={got} must be {what} {want} (input "
                         f"shape {x.shape}, dtype {x.dtype})")
    return got


class _GpuFFTBase(Op):
    """A GPU array and the host transform shape `s`; a new C-contiguous output."""

    __props__ = ()
    min_ndim = 2                 # the batch axis, the transformed ones (, real/imaginary)
    ndim_change = 1              # the output's ndim minus the input's

    def make_node(self, a: Any, s: Any) -> Apply:
        ctx = getattr(a.type, "context_name", None)
        a = as_gpuarray_variable(a, ctx)
        if a.dtype not in FFT_DTYPES:
            raise TypeError(f"{self}: the input must be float32 or float64, got {a.type}")
        rank = a.ndim - self.min_ndim + 1
        if not 1 <= rank <= MAX_RANK:
            raise TypeError(f"{self}: cuFFT transforms 1 to {MAX_RANK} axes after the batch "
                            f"axis; the input {a.type} asks for {rank}")
        s = as_tensor_variable(s)
        if s.ndim != 1 or not s.dtype.startswith(("int", "uint")):
            raise TypeError(f"{self}: the transform shape s must be an integer vector, got "
                            f"{s.type}")
        out = GpuArrayType(a.dtype, (False,) * (a.ndim + self.ndim_change),
                           a.type.context_name)
        return Apply(self, [a, s], [out()])

    def connection_pattern(self, node):
        return [[True], [False]]

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        cells = [storage_map[v] for v in node.inputs]
        out_cell = storage_map[node.outputs[0]]
        dtype = np.dtype(node.outputs[0].dtype)
        kernels: dict[str, Callable[..., None]] = {}

        def kernel(name: str) -> Callable[..., None]:
            go = kernels.get(name)
            if go is None:
                ks = launch.load_kernels(ctx, _MODULE_KEY, fft_source, _FORMATS)
                go = kernels[name] = ks[name].fast_launcher()
            return go

        lib = cufft()

        def thunk() -> None:
            ctx.activate()
            out_cell[0] = self._run(ctx, lib, kernel, dtype, cells[0][0], cells[1][0])

        thunk.capturable = True   # type: ignore[attr-defined]
        thunk.launches = True     # type: ignore[attr-defined]
        return thunk

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        return [(_MODULE_KEY, fft_source, ())]

    @staticmethod
    def _execute(ctx: Any, plan: Any, src_ptr: int, dst_ptr: int) -> None:
        ws = ctx.pool.allocate(plan.workspace) if plan.workspace else None
        plan.execute(src_ptr, dst_ptr, ws.ptr if ws is not None else 0)


class GpuRFFT(_GpuFFTBase):
    """RFFTOp on the GPU: (m, ..., n) float -> (m, ..., n//2 + 1, 2), unnormalised."""

    min_ndim, ndim_change = 2, 1
    infer_shape = RFFTOp.infer_shape

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        return []      # the pack kernel is for views only: compiled at their first call

    def _run(self, ctx, lib, kernel, dtype, x, s):
        n = _transform_shape(self, s, tuple(x.shape[1:]), x, "the input's shape after the "
                             "batch axis,")
        if min(n) < 1:
            raise ValueError(f"{self}: every transformed axis needs a length of at least 1, "
                             f"got input shape {x.shape} (dtype {x.dtype})")
        out = new_array(ctx, x.shape[:-1] + (x.shape[-1] // 2 + 1, 2), dtype)
        if x.shape[0] == 0:
            return out
        if not x.is_c_contiguous or x.ptr % (2 * dtype.itemsize):
            packed = new_array(ctx, x.shape, dtype)
            grid, block = _grid(x.size)
            kernel(f"fft_pack_{dtype.name}")(grid, block, x.ptr, packed.ptr, x.size, x.ndim,
                                             *_meta(x.shape, x.strides))
            x = packed
        self._execute(ctx, lib.plan(ctx, "r2c", dtype.name, x.shape[0], n), x.ptr, out.ptr)
        return out


class GpuIRFFT(_GpuFFTBase):
    """IRFFTOp on the GPU: (m, ..., k, 2) half spectra -> (m, ...s) real signals,
    unnormalised (s[-1] is 2(k-1) or 2(k-1) + 1)."""

    min_ndim, ndim_change = 3, -1
    infer_shape = IRFFTOp.infer_shape

    def _run(self, ctx, lib, kernel, dtype, a, s):
        s = tuple(int(v) for v in np.asarray(s).reshape(-1))
        if a.shape[-1] != 2:
            raise ValueError(f"{self}: the input's last axis must hold the real and imaginary "
                             f"parts (length 2), got shape {a.shape} (dtype {a.dtype})")
        if len(s) != a.ndim - 2 or s[:-1] != tuple(a.shape[1:-2]) \
                or s[-1] // 2 + 1 != a.shape[-2] or s[-1] < 1 or min(s) < 1:
            raise ValueError(f"{self}: the output shape s={s} does not fit the input of shape "
                             f"{a.shape} (dtype {a.dtype}): s must be {tuple(a.shape[1:-2])} "
                             f"followed by {2 * (a.shape[-2] - 1)} or "
                             f"{2 * (a.shape[-2] - 1) + 1}")
        m = a.shape[0]
        out = new_array(ctx, (m,) + s, dtype)
        if m == 0:
            return out
        # C2R destroys its input: pack it (Hermitian planes fixed) into a buffer of our own
        cshape = tuple(a.shape[:-1])
        buf = new_array(ctx, a.shape, dtype)
        count = buf.size // 2
        grid, block = _grid(count)
        kernel(f"fft_hermitian_{dtype.name}")(grid, block, a.ptr, buf.ptr, count, len(cshape),
                                              a.strides[-1], int(s[-1] % 2 == 0),
                                              *_meta(cshape, a.strides[:-1]))
        self._execute(ctx, lib.plan(ctx, "c2r", dtype.name, m, s), buf.ptr, out.ptr)
        return out


# ----------------------------------------------------------------------------- lifters

def _liftable(node: Apply, min_ndim: int) -> bool:
    a = node.inputs[0]
    return a.dtype in FFT_DTYPES and 1 <= a.ndim - min_ndim + 1 <= MAX_RANK


@register_lifter(RFFTOp)
def lift_rfft(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Any] | None:
    """RFFTOp -> GpuRFFT (float32/float64, 1 to 3 transformed axes)."""
    if not _liftable(node, GpuRFFT.min_ndim):
        return None
    return [GpuRFFT()(inputs[0], inputs.host(1))]


@register_lifter(IRFFTOp)
def lift_irfft(op: Any, node: Apply, context_name: Any, inputs: Any) -> list[Any] | None:
    """IRFFTOp -> GpuIRFFT (float32/float64, 1 to 3 transformed axes)."""
    if not _liftable(node, GpuIRFFT.min_ndim):
        return None
    return [GpuIRFFT()(inputs[0], inputs.host(1))]


def curfft(inp: Any, norm: str | None = None) -> Any:
    """Theano's `gpuarray.fft.curfft`: `tensor.fft.rfft` of `inp` on the GPU (the input moved
    to the default context), the result a GPU variable."""
    return as_gpuarray_variable(rfft(as_gpuarray_variable(inp, None), norm=norm), None)


def cuirfft(inp: Any, norm: str | None = None, is_odd: bool = False) -> Any:
    """Theano's `gpuarray.fft.cuirfft`: `tensor.fft.irfft` on the GPU, the result a GPU
    variable."""
    return as_gpuarray_variable(
        irfft(as_gpuarray_variable(inp, None), norm=norm, is_odd=is_odd), None)
