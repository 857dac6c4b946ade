"""cuDNN through ctypes: the library, one handle per context (on the context's stream), the
descriptors and the legacy convolution calls GpuConv2d* and GpuConv3d* need.

Why ctypes: as for cuBLAS (blas.py), the C API is a handful of calls and binding it costs
nothing to build. cuDNN 9 is found in the system (``libcudnn.so.9``) or in the
``nvidia-cudnn-cu13`` wheel (``nvidia/cudnn/lib``, whose sub-libraries are preloaded so the
shim finds them). Algorithms come from cuDNN's heuristics (``*_v7``: no device work, so safe
under CUDA-graph capture) and are cached per shape by the caller (symgpu/gpu/ops/conv.py),
which may then time the candidates once per geometry (``ConvDescs.time_algorithms``,
each candidate warmed, then run between CUDA events) at a call that is not being captured.

Descriptors: 2 spatial axes keep the 4-d calls (``cudnnSetTensor4dDescriptorEx``, ...), 3 use
the N-d ones (``cudnnSetTensorNdDescriptor``, ``cudnnSetFilterNdDescriptor``,
``cudnnSetConvolutionNdDescriptor``), chosen by the shapes' length in one ConvDescs; the N-d
forward geometry is checked with ``cudnnGetConvolutionNdForwardOutputDim``.

Half convolutions: tensor and filter descriptors of CUDNN_DATA_HALF / CUDNN_DATA_BFLOAT16,
the convolution descriptor's compute type given apart (``compute``: float32 for bfloat16 and,
under ``dnn.conv.precision``'s default, for float16 too) with tensor-op math; alpha and beta
are floats, as for float32.
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import sys
import threading
from typing import Any, Callable, NamedTuple, Sequence

__all__ = ["CudnnError", "cudnn", "cudnn_available", "cudnn_version", "DATA_TYPES", "ConvDescs", "DEFAULT_MATH",
           "TENSOR_OP_MATH", "FMA_MATH", "OwnAlgorithm"]

#: cudnnDataType_t: CUDNN_DATA_FLOAT, _DOUBLE, _HALF, _BFLOAT16
DATA_TYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 9}
_NCHW = 0                                      # cudnnTensorFormat_t
CONVOLUTION, CROSS_CORRELATION = 0, 1          # cudnnConvolutionMode_t
DEFAULT_MATH, TENSOR_OP_MATH, FMA_MATH = 0, 1, 3   # cudnnMathType_t
_STATUS_SUCCESS = 0


class CudnnError(RuntimeError):
    """A cuDNN call failed, or the library could not be loaded."""


class _Perf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (one layout for the three)."""
    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int),
                ("mathType", ctypes.c_int), ("reserved", ctypes.c_int * 3)]


def _candidates() -> list[str]:
    """Where libcudnn.so.9 may be: the system's loader path, then the pip wheel's directory."""
    names = ["libcudnn.so.9"]
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        lib = os.path.join(root, "cudnn", "lib", "libcudnn.so.9")
        if os.path.exists(lib):
            names.append(lib)
    return names


def _load() -> tuple[Any, str]:
    errors = []
    for name in _candidates():
        try:
            if os.path.isabs(name):
                # the shim dlopens its sub-libraries by name: load them first, globally
                for sub in sorted(glob.glob(os.path.join(os.path.dirname(name),
                                                         "libcudnn_*.so.9"))):
                    try:
                        ctypes.CDLL(sub, mode=ctypes.RTLD_GLOBAL)
                    except OSError:
                        pass
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL), name
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise CudnnError("cuDNN 9 could not be loaded (" + "; ".join(errors) + "); install it "
                     "system-wide or `pip install nvidia-cudnn-cu13` (the `cuda` extra)")


class _Cudnn:
    """The loaded library and one handle per context, bound to the context's stream."""

    def __init__(self) -> None:
        self.lib, self.path = _load()
        self.lib.cudnnGetVersion.restype = ctypes.c_size_t
        self.lib.cudnnGetErrorString.restype = ctypes.c_char_p
        self.version = int(self.lib.cudnnGetVersion())
        if self.version < 90000:
            raise CudnnError(f"cuDNN {self.version} at {self.path} is older than 9")
        self.handles: dict[int, ctypes.c_void_p] = {}
        self.lock = threading.Lock()

    @property
    def version_string(self) -> str:
        v = self.version
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"

    def check(self, status: int, what: str) -> None:
        if status != _STATUS_SUCCESS:
            msg = self.lib.cudnnGetErrorString(status)
            raise CudnnError(f"{what} failed: {msg.decode() if msg else status}")

    def call(self, name: str, *args: Any) -> None:
        self.check(getattr(self.lib, name)(*args), name)

    def handle(self, ctx: Any) -> ctypes.c_void_p:
        h = self.handles.get(id(ctx))
        if h is None:
            with self.lock:
                ctx.activate()
                h = ctypes.c_void_p()
                self.call("cudnnCreate", ctypes.byref(h))
                self.call("cudnnSetStream", h, ctypes.c_void_p(ctx.stream_handle))
                self.handles[id(ctx)] = h
        return h

    # ---------------------------------------------------------------- descriptors
    def tensor(self, dtype: str, shape: Sequence[int]) -> "_Desc":
        """A packed NCHW / NCDHW tensor descriptor (4-d call for 4 dims, N-d call beyond)."""
        d = _Desc(self, "Tensor")
        dims = [int(s) for s in shape]
        if len(dims) == 4:
            n, c, h, w = dims
            self.call("cudnnSetTensor4dDescriptorEx", d.ptr, DATA_TYPES[dtype], n, c, h, w,
                      c * h * w, h * w, w, 1)
            return d
        strides = [1] * len(dims)
        for a in range(len(dims) - 2, -1, -1):
            strides[a] = strides[a + 1] * dims[a + 1]
        self.call("cudnnSetTensorNdDescriptor", d.ptr, DATA_TYPES[dtype], len(dims),
                  _ints(dims), _ints(strides))
        return d

    def filter(self, dtype: str, shape: Sequence[int]) -> "_Desc":
        """A filter descriptor (O, C/g, *kernel), NCHW-packed."""
        d = _Desc(self, "Filter")
        dims = [int(s) for s in shape]
        if len(dims) == 4:
            self.call("cudnnSetFilter4dDescriptor", d.ptr, DATA_TYPES[dtype], _NCHW, *dims)
            return d
        self.call("cudnnSetFilterNdDescriptor", d.ptr, DATA_TYPES[dtype], _NCHW, len(dims),
                  _ints(dims))
        return d

    def convolution(self, dtype: str, pads: Sequence[int], strides: Sequence[int],
                    dilation: Sequence[int], flip: bool, groups: int, math: int) -> "_Desc":
        """The convolution descriptor over len(pads) spatial axes (2: the 2-d call)."""
        d = _Desc(self, "Convolution")
        mode = CONVOLUTION if flip else CROSS_CORRELATION
        if len(pads) == 2:
            self.call("cudnnSetConvolution2dDescriptor", d.ptr, int(pads[0]), int(pads[1]),
                      int(strides[0]), int(strides[1]), int(dilation[0]), int(dilation[1]),
                      mode, DATA_TYPES[dtype])
        else:
            self.call("cudnnSetConvolutionNdDescriptor", d.ptr, len(pads), _ints(pads),
                      _ints(strides), _ints(dilation), mode, DATA_TYPES[dtype])
        self.call("cudnnSetConvolutionGroupCount", d.ptr, int(groups))
        self.call("cudnnSetConvolutionMathType", d.ptr, int(math))
        return d

    def forward_output_dims(self, conv: "_Desc", x: "_Desc", w: "_Desc",
                            nbdims: int) -> tuple[int, ...]:
        """cuDNN's own output shape for (x, w, conv): N-d geometry's cross-check."""
        out = (ctypes.c_int * nbdims)()
        self.call("cudnnGetConvolutionNdForwardOutputDim", conv.ptr, x.ptr, w.ptr, nbdims, out)
        return tuple(int(v) for v in out)


def _ints(values: Sequence[int]) -> Any:
    """A C int array of `values` (the N-d calls' const int[] arguments)."""
    return (ctypes.c_int * len(values))(*(int(v) for v in values))


class _Desc:
    """A cuDNN descriptor, destroyed with the Python object."""

    def __init__(self, lib: _Cudnn, kind: str) -> None:
        self.lib, self.kind = lib, kind
        self.ptr = ctypes.c_void_p()
        lib.call(f"cudnnCreate{kind}Descriptor", ctypes.byref(self.ptr))

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        if not _finalizing():  # at interpreter exit libcudnn may be unloaded already
            getattr(self.lib.lib, f"cudnnDestroy{self.kind}Descriptor")(self.ptr)


# the three directions: (algorithm query, workspace query, compute call)
_KINDS = {
    "fwd": ("cudnnGetConvolutionForwardAlgorithm_v7",
            "cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward"),
    "bwd_data": ("cudnnGetConvolutionBackwardDataAlgorithm_v7",
                 "cudnnGetConvolutionBackwardDataWorkspaceSize",
                 "cudnnConvolutionBackwardData"),
    "bwd_filter": ("cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                   "cudnnGetConvolutionBackwardFilterWorkspaceSize",
                   "cudnnConvolutionBackwardFilter"),
}
MAX_WORKSPACE = 512 << 20
#: the workspace a timed search may give the algorithms it tries
SEARCH_WORKSPACE = 64 << 20
#: timed runs of each candidate in a search (after its one untimed run)
SEARCH_RUNS = 3
_TENSOR_OP_MATHS = (1, 2)     # CUDNN_TENSOR_OP_MATH, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
#: timed choices, per context and geometry, shared by every op and function of the process:
#: key -> (algo, math type, workspace bytes); algo is an OwnAlgorithm's name where one won
_TIMED: dict[tuple, tuple[int | str, int, int]] = {}


class OwnAlgorithm(NamedTuple):
    """An algorithm of symgpu's own that a timed search runs beside cuDNN's (e.g.
    conv_wgrad.py's direct filter gradient): ``run(a_ptr, b_ptr, out_ptr, ws_ptr)`` queues it
    on the handle's stream, with the operands of ConvDescs.run and ``workspace`` bytes at
    ws_ptr.  Why in the search rather than chosen by a rule: where it is slower than cuDNN's
    best the search keeps cuDNN's, so a wrong guess costs one timed run per geometry."""

    name: str
    workspace: int
    run: Callable[[int, int, int, int], None]


class ConvDescs:
    """Everything one conv call of one shape needs, chosen once and cached by the op:
    descriptors for x (N, C, *spatial), w (O, C/g, *kernel), y (N, O, *out), the conv, and
    for `kind` the heuristically best algorithm whose workspace fits MAX_WORKSPACE.  2 or 3
    spatial axes (the shapes' length); with 3, cuDNN's forward output shape is checked
    against y's."""

    def __init__(self, lib: _Cudnn, ctx: Any, kind: str, dtype: str, xshape, wshape, yshape,
                 pads, strides, dilation, flip: bool, groups: int, math: int,
                 compute: str | None = None) -> None:
        compute = compute or dtype
        self.lib, self.kind = lib, kind
        self.math = int(math)
        self.handle = lib.handle(ctx)
        #: what a timed choice is shared under (_TIMED): the context's handle and the call
        self.geometry = (self.handle.value, kind, dtype, compute, tuple(xshape), tuple(wshape),
                         tuple(yshape), tuple(pads), tuple(strides), tuple(dilation), bool(flip),
                         int(groups), int(math))
        self.timed = False
        self.x = lib.tensor(dtype, xshape)
        self.w = lib.filter(dtype, wshape)
        self.y = lib.tensor(dtype, yshape)
        self.conv = lib.convolution(compute, pads, strides, dilation, flip, groups, math)
        if len(xshape) > 4:
            got = lib.forward_output_dims(self.conv, self.x, self.w, len(xshape))
            if got != tuple(int(s) for s in yshape):
                raise CudnnError(f"cuDNN's output shape {got} for x {tuple(xshape)}, w "
                                 f"{tuple(wshape)} (pads {tuple(pads)}, strides "
                                 f"{tuple(strides)}, dilation {tuple(dilation)}) is not "
                                 f"{tuple(yshape)}")
        ctype = ctypes.c_double if dtype == "float64" else ctypes.c_float
        self.one, self.zero = ctype(1.0), ctype(0.0)
        query, self.wsq, self.fn_name = _KINDS[kind]
        wsq = self.wsq
        descs = self._order()
        perf = (_Perf * 16)()
        count = ctypes.c_int(0)
        lib.call(query, self.handle, *descs, 16, ctypes.byref(count), perf)
        self.algo, self.workspace = None, 0
        sizes = [0]
        #: what a timed search tries: (algo, math type, workspace bytes) of every algorithm
        #: the heuristics call usable, in their order
        self.candidates: list[tuple[int, int, int]] = []
        for p in perf[:count.value]:
            if p.status != _STATUS_SUCCESS:
                continue
            size = ctypes.c_size_t(0)
            if getattr(lib.lib, wsq)(self.handle, *descs, p.algo, ctypes.byref(size)) != 0:
                continue
            sizes.append(int(size.value))
            self.candidates.append((int(p.algo), int(p.mathType), int(size.value)))
            if size.value <= MAX_WORKSPACE and self.algo is None:
                self.algo, self.workspace = p.algo, int(size.value)
        if self.algo is None:
            raise CudnnError(f"cuDNN has no {kind} algorithm for x {tuple(xshape)}, w "
                             f"{tuple(wshape)}, y {tuple(yshape)} ({dtype} computed in "
                             f"{compute}, pads {pads}, "
                             f"strides {strides}, dilation {dilation}, groups {groups})")
        #: the largest workspace among the heuristics' candidates (a timed search's budget)
        self.search_workspace = max(self.workspace,
                                    max(n for n in sizes if n <= SEARCH_WORKSPACE))
        self.fn = getattr(lib.lib, self.fn_name)
        self.stream = getattr(ctx, "stream", None)
        #: symgpu's own algorithms for this call (add_own), and the one a search chose
        self.own: list[OwnAlgorithm] = []
        self.own_choice: OwnAlgorithm | None = None

    def add_own(self, algorithm: OwnAlgorithm) -> None:
        """Offer ``algorithm`` to the timed search (its workspace joins the search's)."""
        self.own.append(algorithm)
        self.search_workspace = max(self.search_workspace, int(algorithm.workspace))

    def _adopt(self, algo: int | str, math: int, workspace: int) -> None:
        self.timed = True
        if isinstance(algo, str):
            # another op's search chose an own algorithm this plan was not offered: cuDNN's
            # heuristic choice stays
            self.own_choice = next((a for a in self.own if a.name == algo), None)
            if self.own_choice is not None:
                self.workspace = int(self.own_choice.workspace)
            return
        self._set_math(math)
        self.algo, self.math, self.workspace = algo, math, workspace

    def _set_math(self, math: int) -> None:
        self.lib.call("cudnnSetConvolutionMathType", self.conv.ptr, int(math))

    def time_algorithms(self, a_ptr: int, b_ptr: int, out_ptr: int, ws_ptr: int,
                        ws_size: int, timer: Callable[[Callable[[], int], int], float]
                        | None = None) -> None:
        """Choose the algorithm by running the heuristics' candidates on these buffers, once
        per geometry per process (``out`` is overwritten, the inputs are not): each candidate
        whose workspace fits ``ws_size`` runs once untimed (CUDA loads a kernel's module at
        its first launch), then SEARCH_RUNS times between CUDA events (``timer(run, n)``:
        seconds per run; a sync). The fastest is kept; where none runs, the heuristic's
        choice stays. Why not cuDNN's ``Find*AlgorithmEx`` (used before): on the H200 it
        kept, for the 3-D CNN's first filter gradient (1 input channel, library_gpu.py), the
        heuristic's kernel of 2.57 ms a call where PyTorch's timed choice takes 0.5 ms, and
        for its first forward convolution a kernel slower than the heuristic's (56 against
        32 us): one run of each algorithm, the first (module loading included), decides.
        Candidates using tensor-op math are skipped unless the descriptor allows them
        (float32 with TF32 allowed). symgpu's own algorithms (add_own) whose workspace fits
        are run and timed the same way, after cuDNN's. Never call it while a CUDA graph is
        being captured."""
        if self.timed:
            return
        done = _TIMED.get(self.geometry)
        if done is None:
            timer = timer or _event_timer(self.stream)
            best: tuple[float, int, int, int] | None = None
            for algo, math, size in self.candidates:
                if size > ws_size or (self.math == FMA_MATH and math in _TENSOR_OP_MATHS):
                    continue
                math = FMA_MATH if self.math == FMA_MATH else math
                self._set_math(math)

                def run(algo: int = algo, size: int = size) -> int:
                    return self._call(algo, a_ptr, b_ptr, out_ptr, ws_ptr, size)
                if run() != _STATUS_SUCCESS:
                    continue
                seconds = timer(run, SEARCH_RUNS)
                if best is None or seconds < best[0]:
                    best = (seconds, algo, math, size)
            for own in self.own:
                if own.workspace > ws_size:
                    continue

                def run_own(own: OwnAlgorithm = own) -> int:
                    own.run(a_ptr, b_ptr, out_ptr, ws_ptr)
                    return _STATUS_SUCCESS
                run_own()
                seconds = timer(run_own, SEARCH_RUNS)
                if best is None or seconds < best[0]:
                    best = (seconds, own.name, self.math, int(own.workspace))
            done = (self.algo, self.math, self.workspace) if best is None else best[1:]
            _TIMED[self.geometry] = done
        self._adopt(*done)

    def _order(self) -> list[Any]:
        x, w, y, c = self.x.ptr, self.w.ptr, self.y.ptr, self.conv.ptr
        return {"fwd": [x, w, c, y], "bwd_data": [w, y, c, x], "bwd_filter": [x, y, c, w]}[self.kind]

    def run(self, a_ptr: int, b_ptr: int, out_ptr: int, ws_ptr: int) -> None:
        """fwd: (x, w) -> y; bwd_data: (w, dy) -> dx; bwd_filter: (x, dy) -> dw (by the own
        algorithm a search chose, if one did)."""
        if self.own_choice is not None:
            self.own_choice.run(a_ptr, b_ptr, out_ptr, ws_ptr)
            return
        self.lib.check(self._call(self.algo, a_ptr, b_ptr, out_ptr, ws_ptr, self.workspace),
                       self.fn_name)

    def _call(self, algo: int, a_ptr: int, b_ptr: int, out_ptr: int, ws_ptr: int,
              workspace: int) -> int:
        """One call with `algo` and `workspace` bytes at ws_ptr; cuDNN's status."""
        h, one, zero = self.handle, ctypes.byref(self.one), ctypes.byref(self.zero)
        a, b, out = ctypes.c_void_p(a_ptr), ctypes.c_void_p(b_ptr), ctypes.c_void_p(out_ptr)
        ws = ctypes.c_void_p(ws_ptr if workspace else 0)
        size = ctypes.c_size_t(workspace)
        x, w, y, c = self.x.ptr, self.w.ptr, self.y.ptr, self.conv.ptr
        if self.kind == "fwd":
            return self.fn(h, one, x, a, w, b, c, algo, ws, size, zero, y, out)
        if self.kind == "bwd_data":
            return self.fn(h, one, w, a, y, b, c, algo, ws, size, zero, x, out)
        return self.fn(h, one, x, a, y, b, c, algo, ws, size, zero, w, out)


def _event_timer(stream: Any) -> Callable[[Callable[[], int], int], float]:
    """timer(run, n): seconds per call of `run` over n calls on `stream`, between two CUDA
    events (waits for the second)."""
    import pycuda.driver as drv   # the GPU path only

    def timer(run: Callable[[], int], n: int) -> float:
        start, end = drv.Event(), drv.Event()
        start.record(stream)
        for _ in range(n):
            run()
        end.record(stream)
        end.synchronize()
        return end.time_since(start) / 1e3 / n
    return timer


_lib: _Cudnn | None = None
_error: CudnnError | None = None


def cudnn() -> _Cudnn:
    """The process's cuDNN binding (loaded on first use; raises CudnnError if unavailable)."""
    global _lib, _error
    if _lib is None:
        if _error is not None:
            raise _error
        try:
            _lib = _Cudnn()
        except (CudnnError, AttributeError) as exc:
            _error = exc if isinstance(exc, CudnnError) else CudnnError(str(exc))
            raise _error
    return _lib


def cudnn_available() -> bool:
    try:
        cudnn()
        return True
    except CudnnError:
        return False


def cudnn_version(raises: bool = True) -> int:
    """The version of the cuDNN library this process loads (e.g. 90100 for 9.1.0; Theano's
    dnn.version): where none loads, RuntimeError naming why, or -1 when not `raises`."""
    try:
        return int(cudnn().version)
    except CudnnError as exc:
        if raises:
            raise RuntimeError(f"cannot determine the cuDNN version: cuDNN is not available "
                               f"({exc})") from exc
        return -1
