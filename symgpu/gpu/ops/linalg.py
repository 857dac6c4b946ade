"""GPU linear algebra through cuSOLVER and cuBLAS: GpuCholesky, GpuSolve (every structure of
slinalg.Solve), GpuSolveTriangular, GpuCholeskySolve, GpuEigh, GpuEigvalsh, GpuEighGrad,
GpuMatrixInverse, GpuDet, GpuQR and GpuSVD, with their lifters from the host ops of
symgpu/tensor/slinalg.py and nlinalg.py (float32/float64, stacks of matrices batched over
the leading dimensions). nlinalg.Eig stays on the host: its results are complex (NumPy's
eig of a real matrix), and GPU arrays have no complex dtype.

Each thunk packs its inputs (non-contiguous views are copied), takes its outputs from the
context's pool and hands addresses to linalg_calls.py, which says which library calls run
(batched cuBLAS/cuSOLVER entry points for many small matrices, a loop of cuSOLVER calls on the
stream for large ones). Pointer arrays are computed on the device, workspaces come from the pool
(kept per shape), and LAPACK's info (not positive definite, singular, no convergence) is
checked by a kernel that reports through the node's device-check slot (device_checks.py), so
nothing syncs and the thunks are CUDA-graph capturable: the error is raised at the next
synchronisation, naming the node. Cholesky with on_error='nan' fills the failed matrices
with NaN instead. The kernels are in codegen/linalg.cu.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from symgpu.gpu.ops import blas as _blas
from symgpu.gpu.ops import cusolver_lib
from symgpu.gpu.ops import linalg_calls as calls
from symgpu.gpu.ops.cusolver_lib import OP_N, OP_T
from symgpu.gpu.ops.elemwise import _context, _virtual_thunk
from symgpu.gpu.placement.basic_ops import as_gpuarray_variable
from symgpu.gpu.placement.rewriting import register_lifter
from symgpu.gpu.placement.type import GpuArrayType, is_gpu_var
from symgpu.gpu.runtime.array import new_array
from symgpu.gpu.runtime.codegen import sections
from symgpu.gpu.runtime.compiler import get_prepared_kernel
from symgpu.gpu.runtime.device_checks import (REPORT_SOURCE, DeviceChecked, checks_are_deferred,
                                              launch_checked)
from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.tensor.nlinalg import SVD, Det, Eigh, EighGrad, MatrixInverse, QRFull, QRIncomplete
from symgpu.tensor.slinalg import Cholesky, CholeskySolve, Eigvalsh, Solve, SolveTriangular

__all__ = ["GpuCholesky", "GpuSolve", "GpuSolveTriangular", "GpuCholeskySolve", "GpuEigh",
           "GpuEigvalsh", "GpuEighGrad", "GpuMatrixInverse", "GpuDet", "GpuQR", "GpuSVD",
           "LinalgKernels",
           "LINALG_DTYPES", "linalg_source"]

#: dtype -> CUDA type
LINALG_DTYPES = {"float32": "float", "float64": "double"}
_CU = sections("linalg.cu")
_MODULE_KEY = ("symgpu.linalg",)
_BLOCK = 256
_MAX_BLOCKS = 4096


def linalg_source() -> str:
    """The CUDA module of every small linear-algebra kernel, both dtypes."""
    return "".join([REPORT_SOURCE, _CU[""].substitute()]
                   + [_CU["entries"].substitute(name=d, t=t) for d, t in LINALG_DTYPES.items()])


def _grid(total: int) -> tuple[int, int]:
    return (max(1, min(_MAX_BLOCKS, -(-int(total) // _BLOCK))), 1)


class LinalgKernels:
    """The small kernels of linalg.cu launched on `ctx`'s stream; the checks report through
    `node`'s device-check slot (tests give linalg_calls a NumPy stand-in with these
    methods)."""

    def __init__(self, ctx: Any, node: Any) -> None:
        self.ctx, self.node = ctx, node

    def _fn(self, name: str, fmt: str) -> Any:
        return get_prepared_kernel(_MODULE_KEY, linalg_source, name, fmt, context=self.ctx)

    def _go(self, name: str, fmt: str, total: int, *args: Any) -> None:
        if total > 0:
            self._fn(name, fmt).prepared_async_call(_grid(total), (_BLOCK, 1, 1),
                                                    self.ctx.stream, *args)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            import pycuda.driver as drv   # the GPU path only
            drv.memcpy_dtod_async(dst, src, nbytes, self.ctx.stream)

    def ptrs(self, out: int, base: int, stride: int, count: int) -> None:
        self._go("linalg_ptrs", "PQqq", count, out, base, stride, count)

    def check_info(self, info: int, count: int, describe: Callable[[int], Exception]) -> None:
        if count > 0:
            launch_checked(self.node, self.ctx, self._fn("linalg_check_info", "PqP"),
                           _grid(count), (_BLOCK, 1, 1), (info, count), describe)

    def check_diag(self, dtype: str, a: int, n: int, batch: int,
                   describe: Callable[[int], Exception]) -> None:
        if n * batch > 0:
            launch_checked(self.node, self.ctx, self._fn(f"linalg_check_diag_{dtype}", "PqqP"),
                           _grid(n * batch), (_BLOCK, 1, 1), (a, n, batch), describe)

    def transpose(self, dtype: str, dst: int, src: int, rows: int, cols: int, batch: int,
                  dst_stride: int | None = None, src_stride: int | None = None) -> None:
        """dst (cols x rows) = src (rows x cols)^T per matrix, matrices every rows * cols
        elements unless strides say otherwise."""
        if rows * cols * batch > 0:
            grid = (-(-cols // 32), -(-rows // 32), min(batch, 65535))
            self._fn(f"linalg_transpose_{dtype}", "PPqqqqq").prepared_async_call(
                grid, (32, 8, 1), self.ctx.stream, dst, src, rows, cols, batch,
                rows * cols if dst_stride is None else dst_stride,
                rows * cols if src_stride is None else src_stride)

    def transpose_lower(self, dtype: str, dst: int, src: int, n: int, batch: int) -> None:
        """dst = src^T per n x n matrix where src's lower triangle lands (the tiles wholly
        above src's diagonal are not copied)."""
        if n * batch > 0:
            grid = (-(-n // 32), -(-n // 32), min(batch, 65535))
            self._fn(f"linalg_transpose_lower_{dtype}", "PPqq").prepared_async_call(
                grid, (32, 8, 1), self.ctx.stream, dst, src, n, batch)

    def factor_out(self, dtype: str, dst: int, w: int, n: int, batch: int, info: int,
                   nan_fill: bool) -> None:
        """dst (row-major L, zero above the diagonal; NaN for failed matrices with
        `nan_fill`) from the column-major lower factor in w."""
        if n * batch > 0:
            grid = (-(-n // 32), -(-n // 32), min(batch, 65535))
            self._fn(f"linalg_factor_out_{dtype}", "PPqqPi").prepared_async_call(
                grid, (32, 8, 1), self.ctx.stream, dst, w, n, batch, info, int(nan_fill))

    def take(self, dtype: str, dst: int, src: int, per: int, src_stride: int,
             batch: int) -> None:
        self._go(f"linalg_take_{dtype}", "PPqqq", per * batch, dst, src, per, src_stride, batch)

    def qr_r(self, dtype: str, r: int, a: int, m: int, n: int, rows_out: int, stride: int,
             batch: int) -> None:
        self._go(f"linalg_qr_r_{dtype}", "PPqqqqq", rows_out * n * batch, r, a, m, n,
                 rows_out, stride, batch)

    def potrf_small(self, dtype: str, dst: int, src: int, n: int, batch: int, lower: bool,
                    info: int, nan_fill: bool) -> None:
        """Cholesky of matrices up to 64 x 64 (linalg.cu's potrf_small_body), one block of
        32 or 64 threads per matrix."""
        if n * batch > 0:
            width = 32 if n <= 32 else 64
            self._fn(f"linalg_potrf{width}_{dtype}", "PPqqiPi").prepared_async_call(
                (min(batch, 1 << 20), 1), (width, 1, 1), self.ctx.stream, dst, src, n, batch,
                int(lower), info, int(nan_fill))

    def tri(self, dtype: str, a: int, n: int, batch: int, keep_lower: bool, info: int,
            nan_fill: bool) -> None:
        self._go(f"linalg_tri_{dtype}", "PqqiPi", n * n * batch, a, n, batch, int(keep_lower),
                 info, int(nan_fill))

    def symm(self, dtype: str, dst: int, src: int, n: int, batch: int, from_lower: bool) -> None:
        self._go(f"linalg_symm_{dtype}", "PPqqi", n * n * batch, dst, src, n, batch,
                 int(from_lower))

    def eye(self, dtype: str, a: int, n: int, batch: int) -> None:
        self._go(f"linalg_eye_{dtype}", "Pqq", n * n * batch, a, n, batch)

    def det(self, dtype: str, out: int, lu: int, ipiv: int, n: int, batch: int) -> None:
        if batch > 0:
            self._fn(f"linalg_det_{dtype}", "PPPqq").prepared_async_call(
                (min(batch, 65535), 1), (_BLOCK, 1, 1), self.ctx.stream, out, lu, ipiv, n,
                batch)

    def eighgrad_mid(self, dtype: str, m: int, p: int, w: int, gw: int, n: int,
                     batch: int) -> None:
        self._go(f"linalg_eighgrad_mid_{dtype}", "PPPPqq", n * n * batch, m, p, w, gw, n, batch)

    def fold(self, dtype: str, out: int, g: int, n: int, batch: int, lower: bool) -> None:
        self._go(f"linalg_fold_{dtype}", "PPqqi", n * n * batch, out, g, n, batch, int(lower))


def _linalg_error(msg: str) -> Exception:
    return np.linalg.LinAlgError(msg)   # scipy.linalg.LinAlgError is this class


def _bad(raw: int) -> tuple[int, int]:
    """(matrix index, LAPACK info) of a check's report."""
    return raw >> 32, int(np.int32(np.uint32(raw & 0xFFFFFFFF)))


def _bn(shape: tuple) -> tuple[int, int]:
    """(batch size, n) of a stack of n x n matrices."""
    return int(np.prod(shape[:-2], dtype=np.int64)), int(shape[-1])


def _square(op: Any, shape: tuple, dtype: str, name: str = "x") -> None:
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ValueError(f"{op}: {name} must be square (in its last two dimensions); got "
                         f"shape {shape} ({dtype})")


def _packed(a: Any) -> Any:
    return a if a.is_c_contiguous else a.copy()


# ----------------------------------------------------------------------------- the ops

class _GpuLinalg(DeviceChecked, Op):
    #: whether the library calls may be captured into a CUDA graph (syevd's may not: on the
    #: H200 a capture of it failed with CUSOLVER_STATUS_INTERNAL_ERROR)
    capturable_calls = True
    """Shared make_thunk: pack inputs, check shapes (`out_shapes`), allocate outputs from
    the pool, queue `compute(env, dtype, ins, outs)` (addresses and shapes)."""

    def _node(self, *xs: Any, outs: list) -> Apply:
        ctx = next((x.type.context_name for x in xs if is_gpu_var(x)), None)
        xs = [as_gpuarray_variable(x, ctx) for x in xs]
        dtypes = {x.dtype for x in xs}
        if len(dtypes) != 1 or xs[0].dtype not in LINALG_DTYPES:
            raise TypeError(f"{self}: inputs must be float32/float64 GPU arrays of one dtype, "
                            f"got {[str(x.type) for x in xs]}")
        return Apply(self, xs, [GpuArrayType(xs[0].dtype, bc, ctx)() for bc in outs])

    def prefetch_sources(self, node: Apply) -> list[tuple]:
        return [(_MODULE_KEY, linalg_source, ())]

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        ctx = _context(node.outputs[0].type.context_name)
        if ctx.virtual:
            return _virtual_thunk(self, ctx)
        cells = [storage_map[v] for v in node.inputs]
        out_cells = [storage_map[v] for v in node.outputs]
        name = node.outputs[0].dtype
        dtype = np.dtype(name)
        kernels = LinalgKernels(ctx, node)
        plans: dict = {}

        def thunk() -> None:
            ctx.activate()
            ins = [_packed(c[0]) for c in cells]
            shapes = [tuple(a.shape) for a in ins]
            outs = [new_array(ctx, s, dtype) for s in self.out_shapes(shapes, name)]
            env = calls.Env(ctx, cusolver_lib.cusolver(), _blas.cublas(), kernels,
                            ctx.pool.allocate, plans)
            self.compute(env, name, [(int(a.ptr), s) for a, s in zip(ins, shapes)],
                         [int(o.ptr) for o in outs])
            for cell, o in zip(out_cells, outs):
                cell[0] = o

        capturable = self.calls_capturable(node) and checks_are_deferred()
        thunk.capturable = capturable              # type: ignore[attr-defined]
        thunk.launches = True                      # type: ignore[attr-defined]
        return thunk

    def calls_capturable(self, node: Apply) -> bool:
        """Whether `node`'s library calls may be captured (decided from its types, so that
        one compiled function keeps one answer whatever the shapes)."""
        return self.capturable_calls

    def out_shapes(self, shapes: list[tuple], dtype: str) -> list[tuple]:
        _square(self, shapes[0], dtype)
        return [shapes[0]]


def _describer(op: Any, what: str, shape: tuple, dtype: str) -> Callable[[int], Exception]:
    def describe(raw: int) -> Exception:
        i, info = _bad(raw)
        return _linalg_error(f"{op}: matrix {i} of the input of shape {shape} ({dtype}) "
                             f"{what} (LAPACK info {info})")
    return describe


class GpuCholesky(_GpuLinalg):
    """slinalg.Cholesky on the GPU: our kernel for matrices up to 64 x 64, cuSOLVER's
    Xpotrf (one matrix) or potrfBatched otherwise, then a kernel zeroing the other triangle
    (and filling failed matrices with NaN for on_error='nan')."""

    __props__ = ("lower", "on_error")
    infer_shape = Cholesky.infer_shape

    def __init__(self, lower: bool = True, on_error: str = "raise", *, inplace: bool = False):
        """`inplace` (Theano's theano.gpuarray.linalg.GpuCholesky keyword) is accepted and
        ignored: the factor always goes to a fresh buffer, which is what an in-place
        factorisation computes without overwriting the input."""
        if on_error not in ("raise", "nan"):
            raise ValueError(f"GpuCholesky: on_error must be 'raise' or 'nan', got {on_error!r}")
        self.lower, self.on_error = bool(lower), on_error

    def make_node(self, x: Any) -> Apply:
        return self._node(x, outs=[x.broadcastable])

    def compute(self, env: calls.Env, dtype: str, ins: list, outs: list) -> None:
        (x, shape), (o,) = ins[0], outs
        batch, n = _bn(shape)
        if n * batch == 0:
            return
        info = env.alloc(4 * batch)
        calls.potrf(env, dtype, x, o, n, batch, self.lower, info, self.on_error == "nan")
        if self.on_error == "raise":
            env.k.check_info(info, batch, _describer(self, "is not positive definite", shape,
                                                     dtype))


def _solve_shapes(op: Any, shapes: list[tuple], dtype: str) -> list[tuple]:
    a, b = shapes
    _square(op, a, dtype, "A")
    if len(b) not in (len(a) - 1, len(a)) or tuple(b[:len(a) - 2]) != tuple(a[:-2]) or \
            b[len(a) - 2] != a[-1]:
        raise ValueError(f"{op}: A of shape {a} and b of shape {b} ({dtype}) do not fit (b "
                         "needs A's batch dimensions and as many rows as A)")
    return [tuple(b)]


def _rhs(ins: list) -> tuple[int, int, int, bool]:
    """(batch, n, columns of b, b holds vectors)."""
    (_, a), (_, b) = ins
    batch, n = _bn(a)
    vector = len(b) == len(a) - 1
    return batch, n, 1 if vector else int(b[-1]), vector


class _GpuSolveBase(_GpuLinalg):
    infer_shape = Solve.infer_shape

    def make_node(self, A: Any, b: Any) -> Apply:
        return self._node(A, b, outs=[(False,) * b.ndim])

    def out_shapes(self, shapes, dtype):
        return _solve_shapes(self, shapes, dtype)

    def _triangular(self, env: calls.Env, dtype: str, ins: list, o: int, lower: bool,
                    trans: int, unit: bool) -> None:
        batch, n, k, _ = _rhs(ins)
        (a, ashape), (b, _) = ins
        if n * k * batch == 0:
            return
        env.k.copy(o, b, n * k * batch * np.dtype(dtype).itemsize)
        if not unit:
            def describe(raw: int, shape=ashape) -> Exception:
                i, row = _bad(raw)
                return _linalg_error(f"{self}: matrix {i} of A (shape {shape}, {dtype}) is "
                                     f"singular: a zero on its diagonal at row {row - 1}")
            env.k.check_diag(dtype, a, n, batch, describe)
        calls.trsm(env, dtype, a, o, n, k, batch, lower, trans, unit)


class GpuSolve(_GpuSolveBase):
    """slinalg.Solve on the GPU. 'general' (and banded/diagonal/toeplitz): LU (cuBLAS
    batched for small matrices, cuSOLVER otherwise) and getrs; 'symmetric'/'hermitian': the
    same on the matrix symmetrised from its `lower` (or upper) triangle, as SciPy reads only
    that one; 'positive_definite': Cholesky and two triangular solves; the triangular
    structures: trsm. Singular or not positive-definite matrices raise LinAlgError."""

    __props__ = ("A_structure", "lower")

    def __init__(self, A_structure: str = "general", lower: bool = False):
        self.A_structure, self.lower = A_structure, bool(lower)

    def __str__(self) -> str:
        return f"GpuSolve{{{self.A_structure}}}"

    #: whether the op solves A^T x = b (Theano's GpuCusolverSolve(trans='T'))
    transposed = False

    def compute(self, env: calls.Env, dtype: str, ins: list, outs: list) -> None:
        s, o = self.A_structure, outs[0]
        if s in ("lower_triangular", "upper_triangular"):
            self._triangular(env, dtype, ins, o, s == "lower_triangular",
                             OP_T if self.transposed else OP_N, False)
            return
        batch, n, k, vector = _rhs(ins)
        (a, ashape), (b, _) = ins
        if n * k * batch == 0:
            return
        isz = np.dtype(dtype).itemsize
        w = env.alloc(n * n * batch * isz)
        info = env.alloc(4 * batch)
        if s == "positive_definite":
            calls.potrf(env, dtype, a, w, n, batch, self.lower, info)
            env.k.check_info(info, batch, _describer(self, "is not positive definite", ashape,
                                                     dtype))
            env.k.copy(o, b, n * k * batch * isz)
            calls.cho_solve(env, dtype, w, o, n, k, batch, self.lower)
            return
        if s in ("symmetric", "hermitian"):
            env.k.symm(dtype, w, a, n, batch, self.lower)
        else:
            env.k.copy(w, a, n * n * batch * isz)
        ipiv = env.alloc(4 * n * batch)
        ptrs = calls.lu(env, dtype, w, n, batch, ipiv, info)
        env.k.check_info(info, batch, _describer(self, "is singular", ashape, dtype))
        op = OP_N if self.transposed else OP_T   # the LU is of A^T (column-major A)
        if vector:      # a vector per matrix is its own column-major n x 1 block
            env.k.copy(o, b, n * batch * isz)
            calls.lu_solve(env, dtype, w, ptrs, n, batch, ipiv, o, 1, op)
            return
        bt = env.alloc(n * k * batch * isz)
        env.k.transpose(dtype, bt, b, n, k, batch)
        calls.lu_solve(env, dtype, w, ptrs, n, batch, ipiv, bt, k, op)
        env.k.transpose(dtype, o, bt, k, n, batch)


class GpuSolveTriangular(_GpuSolveBase):
    """slinalg.SolveTriangular on the GPU: cuBLAS trsm (trsmBatched for stacks) from the
    right on b's own layout; a zero on the diagonal raises LinAlgError, as SciPy's."""

    __props__ = ("trans", "lower", "unit_diagonal")

    def __init__(self, trans: int = 0, lower: bool = False, unit_diagonal: bool = False):
        self.trans, self.lower, self.unit_diagonal = int(trans), bool(lower), bool(unit_diagonal)

    def compute(self, env: calls.Env, dtype: str, ins: list, outs: list) -> None:
        self._triangular(env, dtype, ins, outs[0], self.lower, OP_T if self.trans else OP_N,
                         self.unit_diagonal)


class GpuCholeskySolve(_GpuSolveBase):
    """slinalg.CholeskySolve on the GPU: two triangular solves with the factor."""

    __props__ = ("lower",)

    def __init__(self, lower: bool = True):
        self.lower = bool(lower)

    def compute(self, env: calls.Env, dtype: str, ins: list, outs: list) -> None:
        batch, n, k, _ = _rhs(ins)
        (c, _), (b, _) = ins
        if n * k * batch == 0:
            return
        env.k.copy(outs[0], b, n * k * batch * np.dtype(dtype).itemsize)
        calls.cho_solve(env, dtype, c, outs[0], n, k, batch, self.lower)


class GpuEigh(_GpuLinalg):
    """nlinalg.Eigh on the GPU: for a stack (batch dimensions), syevjBatched up to 32 x 32
    and XsyevBatched above, both captured into CUDA graphs; for one matrix syevd (which
    syncs inside: never captured). The eigenvectors (columns of cuSOLVER's column-major
    result) are transposed into row-major columns. No convergence raises LinAlgError."""

    __props__ = ("UPLO",)
    infer_shape = Eigh.infer_shape

    def __init__(self, UPLO: str = "L"):
        if UPLO not in ("L", "U"):
            raise ValueError(f"GpuEigh: UPLO must be 'L' or 'U', got {UPLO!r}")
        self.UPLO = UPLO

    def make_node(self, x: Any) -> Apply:
        bc = x.broadcastable[:-2]
        return self._node(x, outs=[bc + (False,), bc + (False, False)])

    def calls_capturable(self, node: Apply) -> bool:
        return node.inputs[0].ndim > 2 and calls.syev_batched_capturable(cusolver_lib.cusolver())

    def out_shapes(self, shapes, dtype):
        _square(self, shapes[0], dtype)
        return [tuple(shapes[0][:-1]), tuple(shapes[0])]

    def compute(self, env: calls.Env, dtype: str, ins: list, outs: list) -> None:
        (x, shape), (w, v) = ins[0], outs
        batch, n = _bn(shape)
        if n * batch == 0:
            return
        a = env.alloc(n * n * batch * np.dtype(dtype).itemsize)
        env.k.copy(a, x, n * n * batch * np.dtype(dtype).itemsize)
        info = env.alloc(4 * batch)
        calls.syev(env, dtype, a, w, n, batch, self.UPLO == "L", True, info,
                   stacked=len(shape) > 2)
        env.k.check_info(info, batch, _describer(self, "did not converge", shape, dtype))
        env.k.transpose(dtype, v, a, n, n, batch)


class GpuEigvalsh(_GpuLinalg):
    """slinalg.Eigvalsh of one symmetric matrix on the GPU (syevd without vectors)."""
    capturable_calls = False   # syevd (n > 32 or one matrix) syncs inside

    __props__ = ("lower",)
    infer_shape = Eigvalsh.infer_shape

    def __init__(self, lower: bool = True):
        self.lower = bool(lower)

    def make_node(self, a: Any) -> Apply:
        if a.ndim != 2:
            raise TypeError(f"{self}: a must be a matrix, got {a.type}")
        return self._node(a, outs=[(False,)])

    def out_shapes(self, shapes, dtype):
        _square(self, shapes[0], dtype, "a")
        return [(shapes[0][0],)]

    def compute(self, env: calls.Env, dtype: str, ins: list, outs: list) -> None:
        (x, shape), (w,) = ins[0], outs
        n = int(shape[0])
        if n == 0:
            return
        a = env.alloc(n * n * np.dtype(dtype).itemsize)
        env.k.copy(a, x, n * n * np.dtype(dtype).itemsize)
        info = env.alloc(4)
        calls.syev(env, dtype, a, w, n, 1, self.lower, False, info)
        env.k.check_info(info, 1, _describer(self, "did not converge", shape, dtype))


class GpuEighGrad(_GpuLinalg):
    """nlinalg.EighGrad on the GPU: V (diag(gw) + M) V^T with strided-batched GEMMs and two
    small kernels (the middle matrix, the fold onto eigh's triangle)."""

    __props__ = ("UPLO",)
    infer_shape = EighGrad.infer_shape

    def __init__(self, UPLO: str = "L"):
        self.UPLO = UPLO

    def make_node(self, x: Any, w: Any, v: Any, gw: Any, gv: Any) -> Apply:
        return self._node(x, w, v, gw, gv, outs=[x.broadcastable])

    def out_shapes(self, shapes, dtype):
        x, w, v, gw, gv = shapes
        _square(self, x, dtype)
        if not (v == gv == x and w == gw == x[:-1]):
            raise ValueError(f"{self}: shapes {shapes} ({dtype}) of (x, w, v, gw, gv) do not "
                             "fit an eigh of x")
        return [x]

    def compute(self, env: calls.Env, dtype: str, ins: list, outs: list) -> None:
        (_, shape), (w, _), (v, _), (gw, _), (gv, _) = ins
        batch, n = _bn(shape)
        calls.eigh_grad(env, dtype, v, w, gw, gv, outs[0], n, batch, self.UPLO == "L")


class GpuMatrixInverse(_GpuLinalg):
    """nlinalg.MatrixInverse on the GPU: LU, then getriBatched (small stacks) or getrs on
    the identity. A singular matrix raises LinAlgError."""

    __props__ = ()
    infer_shape = MatrixInverse.infer_shape

    def make_node(self, x: Any) -> Apply:
        return self._node(x, outs=[x.broadcastable])

    def compute(self, env: calls.Env, dtype: str, ins: list, outs: list) -> None:
        (x, shape), (o,) = ins[0], outs
        batch, n = _bn(shape)
        if n * batch == 0:
            return
        isz = np.dtype(dtype).itemsize
        w = env.alloc(n * n * batch * isz)
        env.k.copy(w, x, n * n * batch * isz)
        ipiv, info = env.alloc(4 * n * batch), env.alloc(4 * batch)
        ptrs = calls.lu(env, dtype, w, n, batch, ipiv, info)
        env.k.check_info(info, batch, _describer(self, "is singular", shape, dtype))
        calls.lu_inverse(env, dtype, w, ptrs, n, batch, ipiv, o)


class GpuDet(_GpuLinalg):
    """nlinalg.Det on the GPU: LU, then one block per matrix multiplies the diagonal and
    the pivots' sign. Singular matrices give 0, as NumPy's."""

    __props__ = ()
    infer_shape = Det.infer_shape

    def make_node(self, x: Any) -> Apply:
        return self._node(x, outs=[x.broadcastable[:-2]])

    def out_shapes(self, shapes, dtype):
        _square(self, shapes[0], dtype)
        return [tuple(shapes[0][:-2])]

    def compute(self, env: calls.Env, dtype: str, ins: list, outs: list) -> None:
        (x, shape), (o,) = ins[0], outs
        batch, n = _bn(shape)
        if batch == 0:
            return
        isz = np.dtype(dtype).itemsize
        w = env.alloc(max(n * n * batch * isz, 8))
        ipiv = env.alloc(4 * max(n, 1) * batch)
        if n:
            env.k.copy(w, x, n * n * batch * isz)
            calls.lu(env, dtype, w, n, batch, ipiv, env.alloc(4 * batch))
        env.k.det(dtype, o, w, ipiv, n, batch)


class GpuQR(_GpuLinalg):
    """nlinalg.qr on the GPU, every NumPy mode: 'reduced' / 'complete' ([q, r]), 'raw'
    ([h, tau]) and 'r' (r alone): geqrf and orgqr per matrix (cuSOLVER has no batched QR),
    the layout kernels once for the stack. Not captured: cuSOLVER does not say these calls
    are capturable, and a failed capture turns graphs off for the whole function."""
    capturable_calls = False

    __props__ = ("mode",)

    def __init__(self, mode: str = "reduced"):
        if mode not in ("reduced", "complete", "raw", "r"):
            raise ValueError(f"GpuQR: mode must be 'reduced', 'complete', 'raw' or 'r', got "
                             f"{mode!r}")
        self.mode = mode

    def make_node(self, x: Any) -> Apply:
        if x.ndim < 2:
            raise TypeError(f"{self}: x must be a matrix or a stack of them, got {x.type}")
        bc = x.broadcastable[:-2]
        if self.mode == "r":
            return self._node(x, outs=[bc + (False, False)])
        return self._node(x, outs=[bc + (False, False),
                                   bc + ((False,) if self.mode == "raw" else (False, False))])

    def infer_shape(self, fgraph, node, input_shapes):
        host = QRIncomplete("r") if self.mode == "r" else QRFull(self.mode)
        return host.infer_shape(fgraph, node, input_shapes)

    def out_shapes(self, shapes, dtype):
        b, (m, n) = tuple(shapes[0][:-2]), shapes[0][-2:]
        k = min(m, n)
        return {"reduced": [b + (m, k), b + (k, n)], "complete": [b + (m, m), b + (m, n)],
                "raw": [b + (n, m), b + (k,)], "r": [b + (k, n)]}[self.mode]

    def compute(self, env: calls.Env, dtype: str, ins: list, outs: list) -> None:
        (x, shape), = ins
        batch, (m, n) = int(np.prod(shape[:-2], dtype=np.int64)), shape[-2:]
        q, r = (0, outs[0]) if self.mode == "r" else outs
        calls.qr(env, dtype, x, int(m), int(n), batch, self.mode, q, r)


class GpuSVD(_GpuLinalg):
    """nlinalg.svd on the GPU with NumPy's full_matrices and compute_uv: gesvdjBatched for
    stacks of matrices up to 32 x 32, gesvdj (Jacobi) per matrix otherwise; singular values
    descending. No convergence raises LinAlgError. Not captured (gesvdj's convergence loop
    is not documented as capturable)."""
    capturable_calls = False

    __props__ = ("full_matrices", "compute_uv")
    infer_shape = SVD.infer_shape

    def __init__(self, full_matrices: bool = True, compute_uv: bool = True):
        self.full_matrices, self.compute_uv = bool(full_matrices), bool(compute_uv)

    def make_node(self, x: Any) -> Apply:
        if x.ndim < 2:
            raise TypeError(f"{self}: x must be a matrix or a stack of them, got {x.type}")
        bc = x.broadcastable[:-2]
        if not self.compute_uv:
            return self._node(x, outs=[bc + (False,)])
        return self._node(x, outs=[bc + (False, False), bc + (False,), bc + (False, False)])

    def out_shapes(self, shapes, dtype):
        b, (m, n) = tuple(shapes[0][:-2]), shapes[0][-2:]
        k = min(m, n)
        if not self.compute_uv:
            return [b + (k,)]
        if self.full_matrices:
            return [b + (m, m), b + (k,), b + (n, n)]
        return [b + (m, k), b + (k,), b + (k, n)]

    def compute(self, env: calls.Env, dtype: str, ins: list, outs: list) -> None:
        (x, shape), = ins
        batch, (m, n) = int(np.prod(shape[:-2], dtype=np.int64)), shape[-2:]
        u, s, vt = outs if self.compute_uv else (0, outs[0], 0)
        info = env.alloc(4 * max(batch, 1))
        calls.svd(env, dtype, x, int(m), int(n), batch, self.full_matrices, self.compute_uv,
                  u, s, vt, info, stacked=len(shape) > 2)
        if min(m, n) and batch:
            env.k.check_info(info, batch, _describer(self, "did not converge", shape, dtype))


# ----------------------------------------------------------------------------- lifters

def _floats(node: Apply) -> bool:
    """Every input and output of one float32/float64 dtype."""
    return len({v.dtype for v in node.inputs + node.outputs}) == 1 and \
        node.outputs[0].dtype in LINALG_DTYPES


@register_lifter(Cholesky)
def lift_cholesky(op: Any, node: Apply, context_name: Any, inputs: Any) -> list | None:
    return [GpuCholesky(op.lower, op.on_error)(inputs[0])] if _floats(node) else None


@register_lifter(Solve)
def lift_solve(op: Any, node: Apply, context_name: Any, inputs: Any) -> list | None:
    return [GpuSolve(op.A_structure, op.lower)(*inputs)] if _floats(node) else None


@register_lifter(SolveTriangular)
def lift_solve_triangular(op: Any, node: Apply, context_name: Any, inputs: Any) -> list | None:
    if not _floats(node):
        return None
    return [GpuSolveTriangular(op.trans, op.lower, op.unit_diagonal)(*inputs)]


@register_lifter(CholeskySolve)
def lift_cho_solve(op: Any, node: Apply, context_name: Any, inputs: Any) -> list | None:
    return [GpuCholeskySolve(op.lower)(*inputs)] if _floats(node) else None


@register_lifter(Eigh)
def lift_eigh(op: Any, node: Apply, context_name: Any, inputs: Any) -> list | None:
    return GpuEigh(op.UPLO)(inputs[0]) if _floats(node) else None


@register_lifter(Eigvalsh)
def lift_eigvalsh(op: Any, node: Apply, context_name: Any, inputs: Any) -> list | None:
    """The standard problem only (the generalized one, with b, stays on the host)."""
    if len(node.inputs) != 1 or not _floats(node):
        return None
    return [GpuEigvalsh(op.lower)(inputs[0])]


@register_lifter(EighGrad)
def lift_eigh_grad(op: Any, node: Apply, context_name: Any, inputs: Any) -> list | None:
    return [GpuEighGrad(op.UPLO)(*inputs)] if _floats(node) else None


@register_lifter(MatrixInverse)
def lift_matrix_inverse(op: Any, node: Apply, context_name: Any, inputs: Any) -> list | None:
    return [GpuMatrixInverse()(inputs[0])] if _floats(node) else None


@register_lifter(Det)
def lift_det(op: Any, node: Apply, context_name: Any, inputs: Any) -> list | None:
    return [GpuDet()(inputs[0])] if _floats(node) else None


@register_lifter(QRFull)
def lift_qr(op: Any, node: Apply, context_name: Any, inputs: Any) -> list | None:
    return GpuQR(op.mode)(inputs[0]) if _floats(node) else None


@register_lifter(QRIncomplete)
def lift_qr_r(op: Any, node: Apply, context_name: Any, inputs: Any) -> list | None:
    return [GpuQR("r")(inputs[0])] if _floats(node) else None


@register_lifter(SVD)
def lift_svd(op: Any, node: Apply, context_name: Any, inputs: Any) -> list | None:
    if not _floats(node):
        return None
    out = GpuSVD(op.full_matrices, op.compute_uv)(inputs[0])
    return out if op.compute_uv else [out]
