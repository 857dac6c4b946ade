"""cuBLASLt matrix products with an algorithm chosen per problem by timing.

Why: classic ``cublasSgemm`` takes cuBLAS's heuristic's first guess, which for the small
products of a training step (a batch of 512 through 1024-wide layers, or 10 classes) is
often not the fastest kernel; XLA times candidate GEMMs once per shape at compile time and
keeps the fastest.  We do the same on a product's first plain run (never during a CUDA-graph
capture, which then uses the heuristic's first choice without remembering it; products under
``MIN_TIMED_FLOP`` are not timed).  The candidates: cuBLASLt's heuristic's first 12,
split-K variants of its first 3 (K cut into 2-16 parts computed side by side: a product with
few output tiles otherwise leaves most multiprocessors idle) and classic cuBLAS itself.  Each
is captured into a CUDA graph of several launches and timed by replaying it, so the figure is
the device's time in a graph, as the step will run it, not the host's time to launch it (a
Python launch costs about as much as a small product).  The choice is remembered for the
process, per (dtype, math mode, transposes, sizes, leading dimensions, alignments, pointer
mode).

D is always C (in place: ``blas.py`` copies a GpuGemm's z into its output first, as for
classic cuBLAS).  cuBLASLt can write D apart from C, which with a GPU-side fold of
``W - lr * dot(h.T, d)`` into one GpuGemm (gpu/ops/gemm_fold.py, in this branch's history)
measured 236.4 us against classic cuBLAS's 245.6 us for the MLP step on an H100, but no gain
in the dropout step; it was taken back on the strength of candidate timings that, as it
turned out, measured Python's launch time, not the device's.  Worth measuring again with
the graph-replay timing below.

Half products (float16, bfloat16: A, B, C and D of CUDA_R_16F / CUDA_R_16BF) accumulate in
float32 (CUBLAS_COMPUTE_32F) with float32 alpha and beta, so a result is rounded once; their
classic candidate is ``cublasGemmEx`` / ``cublasGemmStridedBatchedEx`` with the same types.
A problem may be a strided batch (``batch`` products whose operands lie ``stride_*`` elements
apart: the layouts' BATCH_COUNT and STRIDED_BATCH_OFFSET) and may carry an epilogue
(``EPILOGUE_BIAS``, ``EPILOGUE_RELU_BIAS``, ``EPILOGUE_GELU_AUX_BIAS``: a bias vector, one
value per row of the column-major D, added before the activation; ``EPILOGUE_GELU_AUX_BIAS``
also writes the pre-activation to an aux matrix of D's layout, and ``EPILOGUE_DGELU``
multiplies the product by gelu' of such an aux matrix, which it reads; the bias's and aux's
addresses are set on the descriptor at each call, aux's leading dimension, D's, when the
problem is planned), which classic cuBLAS cannot run, so such problems have no classic
candidate.  GELU is the tanh form.  ``EPILOGUE_DGELU_BGRAD`` (208) is not used: it took
223 us for the GPT block's bf16 MLP product on an H200, against 76 for DGELU.

Capture-safe: the call names its stream and a workspace from the context's pool (kept as long
as the context's handle), and allocates nothing.  Where libcublasLt cannot be loaded, or its
heuristic offers nothing for a problem, ``blas.py`` runs the product through classic cuBLAS
(``gpuarray.cublaslt`` turns this module off).
"""
from __future__ import annotations

import ctypes
import threading
import warnings
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from symgpu.config import config
from symgpu.gpu.ops.cublas_lib import (CUDA_DATA_TYPES, Cublas, CublasError, DEFAULT_MATH,
                                       STATUS, TF32_MATH, compute_type, load_library,
                                       with_pointer_mode)
from symgpu.gpu.runtime import libcuda
from symgpu.gpu.runtime.gc_pause import gc_paused
from symgpu.gpu.runtime.array import new_array

__all__ = ["LtProblem", "AlgoChoice", "CHOICES", "TIMED_SIZES", "size_families", "cublaslt",
           "lt_available", "lt_matmul",
           "alignment", "LtUnsupported", "use_classic", "LT_DTYPES", "EPILOGUE_DEFAULT",
           "EPILOGUE_BIAS", "EPILOGUE_RELU_BIAS", "EPILOGUE_AUX", "EPILOGUE_GELU_AUX_BIAS",
           "EPILOGUE_DGELU", "EPILOGUE_GELU_BIAS", "AUX_LD_MULTIPLE", "problem_elements", "classic"]

#: the dtypes cuBLASLt products run in (half ones with float32 accumulation)
LT_DTYPES = ("float16", "bfloat16", "float32", "float64")
#: cublasLtEpilogue_t values used here
EPILOGUE_DEFAULT, EPILOGUE_BIAS, EPILOGUE_RELU_BIAS = 1, 4, 6
#: the bit of an epilogue that has an aux matrix (CUBLASLT_EPILOGUE_AUX), and the two GELU
#: epilogues (tanh form): GELU_AUX_BIAS writes aux (bias bit 4 set), DGELU reads it (no bias)
EPILOGUE_AUX, EPILOGUE_GELU_AUX_BIAS, EPILOGUE_DGELU = 128, 164, 192
#: GELU after the bias, no aux (inference: nothing reads the pre-activation)
EPILOGUE_GELU_BIAS = 36
#: a GELU aux matrix's leading dimension must be a multiple of this many elements
AUX_LD_MULTIPLE = 8
_R_32F, _R_64F = 0, 1                                             # cudaDataType
_DESC_POINTER_MODE, _DESC_TRANSA, _DESC_TRANSB = 2, 3, 4          # cublasLtMatmulDescAttributes_t
_DESC_EPILOGUE, _DESC_BIAS_POINTER = 7, 8
_DESC_AUX_POINTER, _DESC_AUX_LD = 11, 12    # EPILOGUE_AUX_POINTER (void *), _LD (int64)
_LAYOUT_BATCH_COUNT, _LAYOUT_BATCH_STRIDE = 5, 6                  # ...MatrixLayoutAttribute_t
_PREF_MAX_WORKSPACE = 1                                           # ...PreferenceAttributes_t
_PREF_MIN_ALIGN = (5, 6, 7, 8)                                    # A, B, C, D (bytes)
_WORKSPACE_BYTES = 32 << 20
#: how many of the heuristic's candidates are timed (it orders them by its own estimate)
CANDIDATES = 12
#: products of fewer floating-point operations run the heuristic's first choice, untimed
#: (a microsecond either way; the timing would cost milliseconds)
MIN_TIMED_FLOP = 1 << 22
_REPS = 8          # launches per timed graph
_ROUNDS = 3        # replays per candidate, in rounds over the candidates (the best counts)
#: split-K variants tried of the heuristic's first few candidates: K cut in this many
#: parts computed side by side (a product with few output tiles, e.g. 512 x 10, otherwise
#: keeps most multiprocessors idle), partial results reduced in place or in the workspace
SPLITK_OF = 3
SPLITK = (2, 4, 8, 16)
#: a problem whose m, n or k has been timed at this many sizes, the rest of it unchanged (a
#: product over a sequence length times the batch, new every call), is not timed at a new
#: size: it runs the candidate chosen for the nearest timed size (the same algorithm and
#: configuration when the new problem's candidates hold it, else the heuristic's first).  A
#: timing costs about 20 ms, a hundred times the product: paid per new length it was most
#: of a variable-length training step (issue 32)
TIMED_SIZES = 3
_SPLITK_MIN_K = 16   # at least this much K per part
_REDUCTION_SCHEMES = (1, 2)   # CUBLASLT_REDUCTION_SCHEME_INPLACE, _COMPUTE_TYPE
_ALGO_CONFIG_SPLITK_NUM, _ALGO_CONFIG_REDUCTION_SCHEME = 2, 3


class LtUnsupported(RuntimeError):
    """cuBLASLt has no algorithm for this problem (the caller uses classic cuBLAS)."""


class LtProblem(NamedTuple):
    """One column-major product D (m x n, ldd) = alpha op(A) op(B) + beta D, as cuBLASLt
    sees it; A is m x k after its transpose, B k x n."""
    dtype: str
    tf32: bool
    transa: int
    transb: int
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldd: int
    device_scalars: bool     # alpha and beta are read from device memory
    batch: int               # products in the strided batch (1: a plain product)
    stride_a: int            # elements between consecutive products' A (B, D)
    stride_b: int
    stride_d: int
    epilogue: int            # cublasLtEpilogue_t (EPILOGUE_DEFAULT: none)
    align: tuple             # (A, B, D) pointer alignments in bytes, at most 256


def problem_elements(p: LtProblem) -> int:
    """How many elements of D the problem spans (the timing's scratch D)."""
    return (p.batch - 1) * p.stride_d + p.n * p.ldd


def alignment(ptr: int) -> int:
    """The largest power of two (at most 256) that divides device address ``ptr``."""
    return min(ptr & -ptr, 256) if ptr else 256


# ----------------------------------------------------------------------------- the choice

class AlgoChoice:
    """Which of a problem's candidates runs it: the fastest by a one-time timing, remembered
    per key.  Pure bookkeeping (the timing is the caller's ``time_all``), so the logic is
    tested without a GPU."""

    def __init__(self) -> None:
        self.chosen: dict[Any, int] = {}
        self.timings: dict[Any, list[float | None]] = {}   # for benchmarks and reports
        #: family (a problem with one size left out) -> {timed size: the chosen candidate's
        #: identity} (``note``, ``borrowed``)
        self.sizes: dict[Any, dict[int, Any]] = {}
        self.lock = threading.Lock()

    def pick(self, key: Any, n_candidates: int,
             time_all: Callable[[], Sequence[float | None]], can_time: bool) -> int:
        """The index of the candidate to run.  Timed once per key, when ``can_time`` (not
        during a capture): ``time_all()`` gives each candidate's seconds per launch, None
        for one that failed to run, which is passed over; without timing the first
        candidate (the heuristic's own first choice) runs and nothing is remembered."""
        got = self.chosen.get(key)
        if got is not None:
            return got
        if n_candidates < 1:
            raise LtUnsupported("no candidate algorithm")
        if not can_time:
            return 0
        if n_candidates == 1:
            with self.lock:
                self.chosen[key] = 0
            return 0
        times = list(time_all())
        ok = [(t, i) for i, t in enumerate(times) if t is not None]
        if not ok:
            raise LtUnsupported("every candidate algorithm failed to run")
        best = min(ok)[1]
        with self.lock:
            self.chosen[key] = best
            self.timings[key] = times
        return best

    def borrowed(self, families: Sequence[tuple[Any, int]],
                 identities: Sequence[Any]) -> int | None:
        """For a problem that is one of ``families`` (``(family, size)``: the problem with
        one of its sizes left out, and that size) whose family was timed at ``TIMED_SIZES``
        sizes already: the index, among the problem's candidates (``identities``), of the
        candidate chosen for the nearest timed size, 0 (the heuristic's first) when it is
        not among them.  None when every family still has sizes to time."""
        for family, size in families:
            timed = self.sizes.get(family)
            if timed is not None and len(timed) >= TIMED_SIZES:
                near = min(timed, key=lambda s: (abs(s - size), s))
                ident = timed[near]
                return next((i for i, x in enumerate(identities) if x == ident), 0)
        return None

    def note(self, families: Sequence[tuple[Any, int]], identity: Any) -> None:
        """Record that the problem of ``families`` was timed and ``identity`` won."""
        with self.lock:
            for family, size in families:
                self.sizes.setdefault(family, {})[size] = identity

    def remember(self, key: Any, which: int) -> int:
        """Keep candidate ``which`` for ``key`` without timing (timing failed)."""
        with self.lock:
            self.chosen[key] = which
        return which

    def clear(self) -> None:
        with self.lock:
            self.chosen.clear()
            self.timings.clear()
            self.sizes.clear()


#: the process's choices (keyed by device name and LtProblem)
CHOICES = AlgoChoice()


# ----------------------------------------------------------------------------- the library

class _HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspaceSize", ctypes.c_size_t),
                ("state", ctypes.c_int), ("wavesCount", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]


class _Plan:
    """The descriptors of one problem on one handle and the heuristic's candidates."""

    def __init__(self, problem: LtProblem, desc: ctypes.c_void_p, layouts: tuple,
                 algos: list) -> None:
        self.problem = problem
        self.desc = desc
        self.a, self.b, self.c, self.d = layouts
        #: [(cublasLtMatmulAlgo_t, workspace bytes, label)]: the heuristic's, in its order,
        #: then split-K variants, then (algo None) classic cuBLAS
        self.algos = algos


class _CublasLt:
    """libcublasLt, its entry points, one handle and workspace per context, plans per
    problem."""

    def __init__(self) -> None:
        lib = load_library("cuBLASLt",
                           ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"))
        vp, P, st = ctypes.c_void_p, ctypes.POINTER, ctypes.c_size_t
        sigs = {
            "cublasLtCreate": [P(vp)],
            "cublasLtMatmulDescCreate": [P(vp), ctypes.c_int, ctypes.c_int],
            "cublasLtMatmulDescSetAttribute": [vp, ctypes.c_int, vp, st],
            "cublasLtMatrixLayoutCreate": [P(vp), ctypes.c_int, ctypes.c_uint64,
                                           ctypes.c_uint64, ctypes.c_int64],
            "cublasLtMatrixLayoutSetAttribute": [vp, ctypes.c_int, vp, st],
            "cublasLtMatmulPreferenceCreate": [P(vp)],
            "cublasLtMatmulPreferenceSetAttribute": [vp, ctypes.c_int, vp, st],
            "cublasLtMatmulPreferenceDestroy": [vp],
            "cublasLtMatmulAlgoGetHeuristic": [vp, vp, vp, vp, vp, vp, vp, ctypes.c_int,
                                               P(_HeuristicResult), P(ctypes.c_int)],
            "cublasLtMatmul": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, st, vp],
            "cublasLtMatmulAlgoConfigSetAttribute": [vp, ctypes.c_int, vp, st],
            "cublasLtMatmulAlgoCheck": [vp, vp, vp, vp, vp, vp, vp, P(_HeuristicResult)],
        }
        for name, args in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = ctypes.c_int
        self.lib = lib
        self.error = CublasError
        self.handles: dict[int, ctypes.c_void_p] = {}
        self.workspaces: dict[int, Any] = {}
        self.plans: dict[tuple, _Plan] = {}
        self.lock = threading.Lock()

    def check(self, status: int, what: str) -> None:
        if status:
            raise self.error(f"{what} failed: CUBLAS_STATUS_{STATUS.get(status, status)}")

    def handle(self, ctx: Any) -> tuple[ctypes.c_void_p, int, int]:
        """(handle, workspace address, workspace bytes) of ``ctx``, made on first use."""
        h = self.handles.get(id(ctx))
        if h is None:
            with self.lock:
                ctx.activate()
                h = ctypes.c_void_p()
                self.check(self.lib.cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
                try:
                    self.workspaces[id(ctx)] = ctx.pool.allocate(_WORKSPACE_BYTES)
                except MemoryError:     # a full device: algorithms without a workspace only
                    self.workspaces[id(ctx)] = None
                self.handles[id(ctx)] = h
        ws = self.workspaces.get(id(ctx))
        return h, (ws.ptr if ws is not None else 0), (_WORKSPACE_BYTES if ws is not None else 0)

    def plan(self, ctx: Any, p: LtProblem) -> _Plan:
        """The descriptors and candidates of ``p`` on ``ctx`` (made once); raises
        LtUnsupported when the heuristic has nothing, or when an epilogue's aux matrix (of
        D's layout) has a leading dimension cuBLASLt does not take."""
        key = (id(ctx), p)
        got = self.plans.get(key)
        if got is not None:
            return got
        if p.epilogue & EPILOGUE_AUX and p.ldd % AUX_LD_MULTIPLE:
            raise LtUnsupported(f"an aux leading dimension of {p.ldd} elements, not a "
                                f"multiple of {AUX_LD_MULTIPLE} ({p})")
        h, _, ws_bytes = self.handle(ctx)
        lib, check = self.lib, self.check
        dtype = CUDA_DATA_TYPES[p.dtype]
        scale = _R_64F if p.dtype == "float64" else _R_32F   # the half dtypes' too
        desc = ctypes.c_void_p()
        check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), compute_type(p.dtype, p.tf32),
                                           scale), "cublasLtMatmulDescCreate")
        attrs = [(_DESC_TRANSA, p.transa), (_DESC_TRANSB, p.transb),
                 (_DESC_POINTER_MODE, 1 if p.device_scalars else 0)]
        if p.epilogue != EPILOGUE_DEFAULT:
            attrs.append((_DESC_EPILOGUE, p.epilogue))
        for attr, val in attrs:
            v = ctypes.c_int32(val)
            check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v),
                                                     ctypes.sizeof(v)),
                  "cublasLtMatmulDescSetAttribute")
        if p.epilogue & EPILOGUE_AUX:    # read by the heuristic: set before it
            ld = ctypes.c_int64(p.ldd)
            check(lib.cublasLtMatmulDescSetAttribute(desc, _DESC_AUX_LD, ctypes.byref(ld),
                                                     ctypes.sizeof(ld)),
                  "cublasLtMatmulDescSetAttribute (aux leading dimension)")
        a_rows, a_cols = (p.m, p.k) if p.transa == 0 else (p.k, p.m)
        b_rows, b_cols = (p.k, p.n) if p.transb == 0 else (p.n, p.k)
        layouts = []
        for rows, cols, ld, stride in ((a_rows, a_cols, p.lda, p.stride_a),
                                       (b_rows, b_cols, p.ldb, p.stride_b),
                                       (p.m, p.n, p.ldd, p.stride_d),
                                       (p.m, p.n, p.ldd, p.stride_d)):
            lay = ctypes.c_void_p()
            check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype, rows, cols, ld),
                  "cublasLtMatrixLayoutCreate")
            layouts.append(lay)
            if p.batch > 1:
                for attr, v in ((_LAYOUT_BATCH_COUNT, ctypes.c_int32(p.batch)),
                                (_LAYOUT_BATCH_STRIDE, ctypes.c_int64(stride))):
                    check(lib.cublasLtMatrixLayoutSetAttribute(lay, attr, ctypes.byref(v),
                                                               ctypes.sizeof(v)),
                          "cublasLtMatrixLayoutSetAttribute")
        pref = ctypes.c_void_p()
        check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)),
              "cublasLtMatmulPreferenceCreate")
        try:
            ws = ctypes.c_uint64(ws_bytes)
            check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE,
                                                           ctypes.byref(ws), 8),
                  "cublasLtMatmulPreferenceSetAttribute")
            for attr, al in zip(_PREF_MIN_ALIGN, p.align + p.align[2:]):
                v = ctypes.c_uint32(al)
                check(lib.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(v), 4),
                      "cublasLtMatmulPreferenceSetAttribute")
            results = (_HeuristicResult * CANDIDATES)()
            count = ctypes.c_int(0)
            status = lib.cublasLtMatmulAlgoGetHeuristic(h, desc, *layouts, pref, CANDIDATES,
                                                        results, ctypes.byref(count))
        finally:
            lib.cublasLtMatmulPreferenceDestroy(pref)
        if status:
            raise LtUnsupported(f"cublasLtMatmulAlgoGetHeuristic: status {status}")
        algos = [(r.algo, r.workspaceSize, f"heuristic #{i}")
                 for i, r in enumerate(results[:count.value])
                 if r.state == 0 and r.workspaceSize <= ws_bytes]
        if not algos:
            raise LtUnsupported(f"no cuBLASLt algorithm for {p}")
        algos += self._split_k(h, desc, layouts, algos[:SPLITK_OF], p.k, ws_bytes)
        if p.epilogue == EPILOGUE_DEFAULT:    # classic cuBLAS has no epilogues
            algos.append((None, 0, "classic cuBLAS"))   # its own choice, timed beside them
        plan = _Plan(p, desc, tuple(layouts), algos)
        with self.lock:
            self.plans[key] = plan
        return plan

    def _split_k(self, h: Any, desc: Any, layouts: list, algos: list, k: int,
                 ws_bytes: int) -> list:
        """Split-K variants of ``algos`` that cuBLASLt accepts (cublasLtMatmulAlgoCheck)
        within the workspace."""
        lib, out = self.lib, []
        for algo, _, label in algos:
            for parts in SPLITK:
                if k // parts < _SPLITK_MIN_K:
                    continue
                for scheme in _REDUCTION_SCHEMES:
                    v = (ctypes.c_uint64 * 8)(*algo)
                    ok = True
                    for attr, val in ((_ALGO_CONFIG_SPLITK_NUM, parts),
                                      (_ALGO_CONFIG_REDUCTION_SCHEME, scheme)):
                        u = ctypes.c_uint32(val)
                        ok = ok and lib.cublasLtMatmulAlgoConfigSetAttribute(
                            v, attr, ctypes.byref(u), 4) == 0
                    res = _HeuristicResult()
                    if ok and lib.cublasLtMatmulAlgoCheck(h, desc, *layouts, v,
                                                          ctypes.byref(res)) == 0 \
                            and res.workspaceSize <= ws_bytes:
                        where = "in place" if scheme == 1 else "workspace"
                        out.append((v, res.workspaceSize, f"{label} split-K {parts} ({where})"))
        return out

    def set_bias(self, plan: _Plan, bias: int) -> None:
        """Point ``plan``'s epilogue at the bias vector at device address ``bias`` (a host
        setting read by the launches that follow, captured ones included)."""
        v = ctypes.c_void_p(bias)
        self.check(self.lib.cublasLtMatmulDescSetAttribute(plan.desc, _DESC_BIAS_POINTER,
                                                           ctypes.byref(v), ctypes.sizeof(v)),
                   "cublasLtMatmulDescSetAttribute (bias pointer)")

    def set_aux(self, plan: _Plan, aux: int) -> None:
        """Point ``plan``'s epilogue at the aux matrix at device address ``aux`` (written by
        GELU_AUX_BIAS, read by DGELU; a host setting like the bias pointer)."""
        v = ctypes.c_void_p(aux)
        self.check(self.lib.cublasLtMatmulDescSetAttribute(plan.desc, _DESC_AUX_POINTER,
                                                           ctypes.byref(v), ctypes.sizeof(v)),
                   "cublasLtMatmulDescSetAttribute (aux pointer)")

    def matmul(self, ctx: Any, plan: _Plan, which: int, alpha: Any, a: int, b: int,
               beta: Any, d: int) -> int:
        """Launch candidate ``which`` of ``plan`` (D = alpha op(A) op(B) + beta D, then the
        epilogue) on ``ctx``'s stream; the cuBLAS status."""
        h, ws, ws_bytes = self.handle(ctx)
        algo = plan.algos[which][0]
        if algo is None:
            return _classic(ctx, plan.problem, alpha, a, b, beta, d)
        return self.lib.cublasLtMatmul(h, plan.desc, alpha, a, plan.a, b, plan.b, beta, d,
                                       plan.c, d, plan.d, ctypes.byref(algo), ws or None,
                                       ws_bytes, ctx.stream_handle or None)


def _no_classic() -> Cublas:
    raise RuntimeError("classic cuBLAS is not bound: symgpu.gpu.ops.blas is not loaded")


#: the process's classic cuBLAS binding (``blas.cublas``): the candidate "classic cuBLAS" of
#: every problem runs on it.  blas.py, which calls this module, hands it over as it loads
#: (:func:`use_classic`), so the binding tests replace there serves here too
_classic_binding: Callable[[], Cublas] = _no_classic


def use_classic(binding: Callable[[], Cublas]) -> None:
    """Run the classic candidate on ``binding()`` (blas.py passes its ``cublas``)."""
    global _classic_binding
    _classic_binding = binding


def _classic(ctx: Any, p: LtProblem, alpha: Any, a: int, b: int, beta: Any, d: int) -> int:
    """``p`` through classic cuBLAS's gemm and its own algorithm choice (a strided batch
    through ``cublasGemmStridedBatchedEx``)."""
    cb = _classic_binding()
    h = cb.handle(ctx)
    cb.math_mode(h, TF32_MATH if p.tf32 else DEFAULT_MATH)
    if p.batch > 1:
        return with_pointer_mode(
            cb, h, p.device_scalars,
            lambda: cb.gemm_strided_batched_ex(
                h, p.dtype, compute_type(p.dtype, p.tf32), p.transa, p.transb, p.m, p.n, p.k,
                alpha, ctypes.c_void_p(a), p.lda, p.stride_a, ctypes.c_void_p(b), p.ldb,
                p.stride_b, beta, ctypes.c_void_p(d), p.ldd, p.stride_d, p.batch))
    gemm = cb.gemm[p.dtype]
    return with_pointer_mode(
        cb, h, p.device_scalars,
        lambda: gemm(h, p.transa, p.transb, p.m, p.n, p.k, alpha, ctypes.c_void_p(a), p.lda,
                     ctypes.c_void_p(b), p.ldb, beta, ctypes.c_void_p(d), p.ldd))


def classic(ctx: Any, p: LtProblem, alpha: Any, a: int, b: int, beta: Any, d: int) -> int:
    """Run ``p`` (no epilogue) through classic cuBLAS on ``ctx``'s stream, as cuBLASLt's
    "classic cuBLAS" candidate does: where cuBLASLt is off, missing or declines; the
    status."""
    if p.epilogue != EPILOGUE_DEFAULT:
        raise ValueError(f"classic cuBLAS has no epilogue ({p})")
    return _classic(ctx, p, alpha, a, b, beta, d)


_lt: _CublasLt | None = None
_lt_error: str | None = None


def cublaslt() -> _CublasLt:
    """The process's cuBLASLt binding (loaded on first use; raises CublasError without it)."""
    global _lt, _lt_error
    if _lt is None:
        if _lt_error is not None:
            raise CublasError(_lt_error)
        try:
            _lt = _CublasLt()
        except (OSError, AttributeError, RuntimeError) as exc:
            _lt_error = f"{type(exc).__name__}: {exc}"
            raise
    return _lt


def lt_available(dtype: str) -> bool:
    """Whether products of ``dtype`` compiled now go through cuBLASLt: the
    ``gpuarray.cublaslt`` flag is on and the library loads."""
    if not config.gpuarray.cublaslt or dtype not in LT_DTYPES:
        return False
    try:
        cublaslt()
    except RuntimeError:
        return False
    return True


# ----------------------------------------------------------------------------- the call

def _capturing(ctx: Any) -> bool:
    """Whether ``ctx``'s stream is being captured into a CUDA graph now (then nothing may
    synchronise: no timing)."""
    fn = _is_capturing[0]
    if fn is None:
        fn = libcuda.declare(libcuda.cdll(), "cuStreamIsCapturing",
                             [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)])
        _is_capturing[0] = fn
    status = ctypes.c_int(0)
    libcuda.check(fn(ctypes.c_void_p(ctx.stream_handle), ctypes.byref(status)),
                  "cuStreamIsCapturing")
    return status.value != 0


_is_capturing: list = [None]


def _timer(ctx: Any, lt: _CublasLt, plan: _Plan, args: Sequence[Any],
           scratch: int) -> Callable[[], list[float | None]]:
    """time_all(): seconds per launch of each candidate (None: it failed), writing D to
    scratch memory so the call's output is untouched.  Each candidate is launched once
    (warm, and weeded out if it fails), captured as ``_REPS`` launches in a CUDA graph, and
    the graphs replayed in rounds, the best replay counting: the device's time back to back,
    whatever the host's launch cost, and a clock change hits every candidate alike."""
    import pycuda.driver as drv
    alpha, a, b, beta = args
    stream = ctx.stream_handle
    drv_ = _graph_calls()

    def launch(i: int) -> None:
        lt.check(lt.matmul(ctx, plan, i, alpha, a, b, beta, scratch),
                 "cublasLtMatmul (timing)")

    def capture(i: int) -> Any:
        """The instantiated graph of _REPS launches of candidate i, or None."""
        graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
        with gc_paused():   # no collection inside the capture (runtime/gc_pause.py)
            if drv_["begin"](ctypes.c_void_p(stream), _CAPTURE_THREAD_LOCAL):
                return None
            failed = False
            try:
                for _ in range(_REPS):
                    launch(i)
            except (LtUnsupported, RuntimeError):
                failed = True
            finally:
                status = drv_["end"](ctypes.c_void_p(stream), ctypes.byref(graph))
        if failed or status or not graph.value:
            if graph.value:
                drv_["graph_destroy"](graph)
            return None
        status = drv_["instantiate"](ctypes.byref(exe), graph, 0)
        drv_["graph_destroy"](graph)
        return exe if status == 0 else None

    def time_all() -> list[float | None]:
        n = len(plan.algos)
        ok = [True] * n
        for i in range(n):
            try:
                launch(i)
            except (LtUnsupported, RuntimeError):
                ok[i] = False
        ctx.stream.synchronize()
        graphs = [capture(i) if ok[i] else None for i in range(n)]
        best: list[float | None] = [None if g is None else float("inf") for g in graphs]
        start, end = drv.Event(), drv.Event()
        try:
            for g in graphs:               # first replays: uploads, lazy loading
                if g is not None:
                    libcuda.check(drv_["launch"](g, ctypes.c_void_p(stream)), "cuGraphLaunch")
            ctx.stream.synchronize()
            for _ in range(_ROUNDS):
                for i, g in enumerate(graphs):
                    if g is None:
                        continue
                    start.record(ctx.stream)
                    libcuda.check(drv_["launch"](g, ctypes.c_void_p(stream)), "cuGraphLaunch")
                    end.record(ctx.stream)
                    end.synchronize()
                    best[i] = min(best[i], end.time_since(start) / 1e3 / _REPS)
        finally:
            for g in graphs:
                if g is not None:
                    drv_["exec_destroy"](g)
        return best
    return time_all


_CAPTURE_THREAD_LOCAL = 1       # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
_graph_fns: dict[str, Any] = {}


def _graph_calls() -> dict[str, Any]:
    """The driver's stream-capture and graph entry points (declared once)."""
    if not _graph_fns:
        lib, vp, P = libcuda.cdll(), ctypes.c_void_p, ctypes.POINTER
        for key, name, args in (
                ("begin", "cuStreamBeginCapture_v2", [vp, ctypes.c_int]),
                ("end", "cuStreamEndCapture", [vp, P(vp)]),
                ("instantiate", "cuGraphInstantiateWithFlags", [P(vp), vp, ctypes.c_ulonglong]),
                ("launch", "cuGraphLaunch", [vp, vp]),
                ("exec_destroy", "cuGraphExecDestroy", [vp]),
                ("graph_destroy", "cuGraphDestroy", [vp])):
            _graph_fns[key] = libcuda.declare(lib, name, args)
    return _graph_fns


def lt_matmul(ctx: Any, p: LtProblem, alpha: Any, a: int, b: int, beta: Any, d: int,
              bias: int = 0, aux: int = 0) -> None:
    """D = alpha op(A) op(B) + beta D, then the problem's epilogue (reading the bias vector
    at ``bias``; writing or reading the aux matrix at ``aux``, of D's layout), through
    cuBLASLt on ``ctx``'s stream, with the problem's chosen algorithm (timed now, on scratch
    memory, if it has none and the stream is not capturing: GELU_AUX_BIAS's candidates then
    write the real aux, which the call itself overwrites).  Raises LtUnsupported when
    cuBLASLt cannot run it, CublasError when the launch fails."""
    lt = cublaslt()
    plan = lt.plan(ctx, p)
    if p.epilogue & EPILOGUE_BIAS:
        lt.set_bias(plan, bias)
    if p.epilogue & EPILOGUE_AUX:
        if not aux:
            raise ValueError(f"epilogue {p.epilogue} needs its aux matrix's address")
        lt.set_aux(plan, aux)
    key = (getattr(ctx, "devname", ""), p)
    which = CHOICES.chosen.get(key)
    if which is None:
        which = _choose(ctx, lt, plan, p, key, (alpha, a, b, beta))
    status = lt.matmul(ctx, plan, which, alpha, a, b, beta, d)
    if status:   # (the message is made only then: a call costs no formatting)
        lt.check(status, f"cublasLtMatmul ({p.dtype}, {p.batch} x {p.m}x{p.k} @ {p.k}x{p.n}, "
                         f"epilogue {p.epilogue})")


def _choose(ctx: Any, lt: _CublasLt, plan: _Plan, p: LtProblem, key: tuple,
            args: tuple) -> int:
    n = len(plan.algos)
    if n == 1 or 2 * p.batch * p.m * p.n * p.k < MIN_TIMED_FLOP:   # too small to be worth timing
        return CHOICES.remember(key, 0)
    if _capturing(ctx):
        return CHOICES.pick(key, n, _never, can_time=False)
    families = size_families(key[0], p)
    identities = [_identity(a) for a, _, _ in plan.algos]
    which = CHOICES.borrowed(families, identities)
    if which is not None:      # a size that changes from call to call: not timed again
        return CHOICES.remember(key, which)
    import pycuda.driver as drv
    scratch = new_array(ctx, (problem_elements(p),), np.dtype(p.dtype))
    scratch.fill(0)      # D is read (beta): defined values, whatever the pool held
    try:
        best = CHOICES.pick(key, n, _timer(ctx, lt, plan, args, scratch.ptr), can_time=True)
        CHOICES.note(families, identities[best])
        return best
    except LtUnsupported:
        raise
    except (RuntimeError, drv.Error) as exc:   # a capture, replay or event refused: no timing
        warnings.warn(f"symgpu: timing cuBLASLt's candidates for {p} failed ({exc}); "
                      f"its heuristic's first choice runs it", RuntimeWarning)
        return CHOICES.remember(key, 0)


def size_families(device: str, p: LtProblem) -> list[tuple[Any, int]]:
    """``(family, size)`` for each of m, n and k: the problem with that size left out, as
    are the leading dimensions equal to it (a transposed operand's: they change with it),
    with the device; and the size (AlgoChoice.borrowed)."""
    out = []
    for name in ("m", "n", "k"):
        size = getattr(p, name)
        free = {name: -1}
        for ld in ("lda", "ldb", "ldd"):
            if getattr(p, ld) == size:
                free[ld] = -1
        out.append(((device, name, p._replace(**free)), size))
    return out


def _identity(algo: Any) -> Any:
    """A candidate's algorithm and configuration as a value (None: classic cuBLAS)."""
    return None if algo is None else tuple(algo)


def _never() -> list:
    raise AssertionError("not timed")
