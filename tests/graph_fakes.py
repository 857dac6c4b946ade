"""Fakes for the CUDA-graph runner tests (tests/test_gpu_graph_runner.py and
tests/test_gpu_speed_paths.py): a fake context, device pool and graph driver whose "kernels"
are Python closures over a fake device memory (``MEM``: a capture records them, a replay runs
them), so keys, ownership, ping-pong, fallbacks and results are checked without a GPU.

Each test module's autouse fixture runs :func:`use_fake_gpu`, which makes a new fake context
and driver per test: read them as ``graph_fakes.CTX_OBJ`` and ``graph_fakes.DRV`` (module
attributes, replaced per test), not through ``from graph_fakes import CTX_OBJ``.
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.gpu.exec import graphs
from symgpu.gpu.runtime.libcuda import DriverError
from symgpu.gpu.runtime.pool import DevicePool
from symgpu.graph.token_lock import TokenLock

CTX = "fake-graphs"


class FakeDriver:
    """Capture records launches; a graph launch runs them in order."""

    def __init__(self) -> None:
        self.capturing = False
        self.recorded: list = []
        self.launches = 0
        self.uploads = 0
        self.destroyed = 0
        self.fail_next_capture = False

    def launch_kernel(self, fn) -> None:
        if self.capturing:
            self.recorded.append(fn)
        else:
            fn()

    # the interface of graph_driver.CudaGraphDriver
    def begin(self, stream):
        assert not self.capturing
        self.capturing, self.recorded = True, []

    def end(self, stream):
        self.capturing = False
        if self.fail_next_capture:
            self.fail_next_capture = False
            return None, "cuStreamEndCapture failed: operation not permitted when capturing"
        return list(self.recorded), None

    def instantiate(self, graph):
        return ("exe", graph)

    def launcher(self, exe, stream):
        def go():
            self.launches += 1
            for fn in exe[1]:
                fn()
            return 0
        return go

    def destroy(self, exe, graph):
        self.destroyed += 1

    def node_count(self, graph):
        return len(graph)

    def check(self, status, what):
        if status:
            raise DriverError(f"{what} failed: CUresult {status}", status)

    def relaxed(self):
        return nullcontext()

    def copy(self, dst, src):
        assert dst.size == src.size and dst.is_c_contiguous and src.is_c_contiguous
        d, s_, n = dst.ptr, src.ptr, src.size

        def k():
            MEM[d][:n] = MEM[s_][:n]
        self.launch_kernel(k)

    def upload(self, ptr, data, stream):
        """A parameter block's bytes (graph_params.py): never while capturing."""
        assert not self.capturing
        self.uploads += 1
        MEM[ptr].view(np.uint8)[: len(data)] = np.frombuffer(data, np.uint8)

    def to_host(self, arrays):
        return [read(a) if a.size else np.empty(a.shape, a.dtype) for a in arrays]


MEM: dict[int, np.ndarray] = {}


class _FakeAlloc:
    def __init__(self, ptr):
        self.ptr = ptr

    def __int__(self):
        return self.ptr

    def free(self):
        MEM.pop(self.ptr, None)


class FakePool(DevicePool):
    next_ptr = 0x10000

    def _device_alloc(self, nbytes):
        ptr = FakePool.next_ptr
        FakePool.next_ptr += max(nbytes, 512) + 512
        MEM[ptr] = np.full(max(nbytes, 4) // 4, np.nan, dtype="float32")
        self.n_device_allocs += 1
        return _FakeAlloc(ptr)


class FakeCtx:
    virtual = False
    name = CTX
    device = "cuda0"
    ordinal = 0
    arch = "sm_90"
    stream_handle = 7
    stream = None
    pinned = None
    total_memory = 1 << 30

    def __init__(self):
        self.pool = FakePool(self, 0.0)
        self.call_lock = TokenLock()

    def activate(self):
        return self

    def synchronize(self):
        pass


def read(a) -> np.ndarray:
    return MEM[a.ptr][: a.size].reshape(a.shape).copy()


def upload(ctx, values) -> object:
    from symgpu.gpu.ops.elemwise import new_array
    values = np.asarray(values, dtype="float32")
    a = new_array(ctx, values.shape, values.dtype)
    if a.size:
        MEM[a.ptr][: a.size] = values.reshape(-1)
    return a


class FakeKernelOp(Op):
    """out = f(inputs) elementwise, through the fake driver; optionally in place on input 0
    and with a scratch buffer (as GpuCAReduce's partial sums)."""

    __props__ = ("name", "inplace", "scratch", "fail_when_capturing", "lie_when_captured")

    def __init__(self, name, fn, inplace=False, scratch=False, fail_when_capturing=False,
                 lie_when_captured=False):
        self.name, self.fn, self.inplace, self.scratch = name, fn, inplace, scratch
        self.fail_when_capturing = fail_when_capturing
        self.lie_when_captured = lie_when_captured
        if inplace:
            self.destroy_map = {0: [0]}

    def __str__(self):
        return f"Fake{self.name}"

    def make_node(self, *xs):
        return Apply(self, list(xs), [xs[0].type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        from symgpu.gpu.ops.elemwise import new_array
        ins = [storage_map[v] for v in node.inputs]
        out = storage_map[node.outputs[0]]
        ctx, drv, fn = CTX_OBJ, DRV, self.fn

        def thunk():
            if self.fail_when_capturing and drv.capturing:
                raise DriverError("cuMemAlloc failed: operation not permitted when stream "
                                  "is capturing", 900)
            xs = [c[0] for c in ins]
            if xs[0].shape != xs[-1].shape:
                raise ValueError(f"shapes differ: {xs[0].shape} {xs[-1].shape}")
            o = xs[0] if self.inplace else new_array(ctx, xs[0].shape, np.dtype("float32"))
            ptrs, n, optr = [x.ptr for x in xs], xs[0].size, o.ptr
            if n == 0:
                out[0] = o
                return
            if self.scratch:
                tmp = new_array(ctx, xs[0].shape, np.dtype("float32"))
                tptr = tmp.ptr

                def k1():
                    MEM[tptr][:n] = fn(*[MEM[p][:n] for p in ptrs])

                def k2():
                    MEM[optr][:n] = MEM[tptr][:n]
                drv.launch_kernel(k1)
                drv.launch_kernel(k2)
            else:
                lie = 1.0 if self.lie_when_captured and drv.capturing else 0.0

                def k():
                    MEM[optr][:n] = fn(*[MEM[p][:n] for p in ptrs]) + lie
                drv.launch_kernel(k)
            out[0] = o
        thunk.capturable = True
        thunk.launches = True
        return thunk


def host_view(ptr, shape, strides) -> np.ndarray:
    """A writable NumPy view of fake device memory: any layout (offsets, negative strides)
    inside one allocation of ``MEM``."""
    for base, mem in MEM.items():
        if base <= ptr < base + mem.nbytes:
            return np.lib.stride_tricks.as_strided(mem[(ptr - base) // 4:], shape, strides)
    raise KeyError(hex(ptr))


class FakeElemwise(Op):
    """A GpuElemwise-like fake: ``out = fn(*inputs)`` with NumPy broadcasting over the
    inputs' real layouts (views, negative strides), into a fresh C-contiguous buffer, or
    into the array its thunk's ``write_into[0]`` names when that has the output's shape
    (the protocol of GpuElemwise's thunk: graph_segment's direct updates).
    ``device_checked`` marks the op as one whose checks report at the next sync."""

    __props__ = ("name", "device_checked")

    def __init__(self, name, fn, device_checked=False):
        self.name, self.fn, self.device_checked = name, fn, device_checked

    def __str__(self):
        return f"FakeElemwise{{{self.name}}}"

    def make_node(self, *xs):
        return Apply(self, list(xs), [xs[0].type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        from symgpu.gpu.ops.elemwise import new_array
        ins = [storage_map[v] for v in node.inputs]
        out = storage_map[node.outputs[0]]
        ctx, drv, fn = CTX_OBJ, DRV, self.fn
        into = [None]

        def thunk():
            xs = [c[0] for c in ins]
            shape = np.broadcast_shapes(*[x.shape for x in xs])
            t = into[0]
            if t is not None and t.shape == shape and t.is_c_contiguous:
                o = t
            else:
                o = new_array(ctx, shape, np.dtype("float32"))
            if o.size:
                lays = [(x.ptr, x.shape, x.strides) for x in xs]
                lay_o = (o.ptr, o.shape, o.strides)

                def k():
                    host_view(*lay_o)[...] = fn(*[host_view(*lay) for lay in lays])
                drv.launch_kernel(k)
            out[0] = o
        thunk.capturable = True
        thunk.launches = True
        thunk.write_into = into
        return thunk


class FakeReverse(Op):
    """A view op: ``x[::-1]`` of a vector (a negative stride over the same memory)."""

    __props__ = ()
    view_map = {0: [0]}

    def make_node(self, x):
        return Apply(self, [x], [x.type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        inp, out = storage_map[node.inputs[0]], storage_map[node.outputs[0]]

        def thunk():
            x = inp[0]
            (n,), (st,) = x.shape, x.strides
            out[0] = x._view(x.ptr + (n - 1) * st, x.shape, (-st,))
        thunk.capturable = True
        thunk.launches = False
        return thunk


class FakeToHost(Op):
    """Not capturable: reads device memory on the host."""

    __props__ = ()

    def make_node(self, x):
        from symgpu.tensor.type import TensorType
        return Apply(self, [x], [TensorType("float32", x.type.broadcastable)()])

    def perform(self, node, inputs, out):
        out[0][0] = read(inputs[0])


CTX_OBJ: FakeCtx = None  # type: ignore[assignment]
DRV: FakeDriver = None   # type: ignore[assignment]


def use_fake_gpu(monkeypatch):
    """The body of the test modules' autouse fixture: a fresh fake context registered as
    ``CTX`` and a fresh fake driver installed as ``graphs._driver``, for one test."""
    global CTX_OBJ, DRV
    from symgpu.gpu.runtime import context as gctx
    CTX_OBJ, DRV = FakeCtx(), FakeDriver()
    gctx.register_context(CTX, CTX_OBJ)
    monkeypatch.setattr(graphs, "_driver", DRV)
    yield CTX_OBJ
    gctx.unregister_context(CTX)
    MEM.clear()


def gvec():
    from symgpu.gpu.placement.type import GpuArrayType
    return GpuArrayType("float32", (False,), CTX)()


def add1():
    return FakeKernelOp("add1", lambda a: a + 1)


def mul2(**kw):
    return FakeKernelOp("mul2", lambda a: a * 2, **kw)


def call(vm, out_vars):
    """What Function.__call__ does around the VM: run, take the outputs, empty their cells."""
    vm()
    res = [vm.storage_map[v][0] for v in out_vars]
    for v in out_vars:
        vm.storage_map[v][0] = None
    return res


# ============================================================================ parameters

def _slot_bytes(slot, n):
    block, off = slot
    return MEM[block.ptr].view(np.uint8)[off:off + n]


class FakeDynSlice(Op):
    """x[start:stop] of a fake device vector, copied (fake memory has no views), speaking the
    parameter protocol of symgpu/gpu/runtime/graph_params.py: under a capture with a slot, the
    recorded kernel reads start from the parameter block at replay."""

    __props__ = ()

    def make_node(self, x, start, stop):
        from symgpu.tensor.type import as_tensor_variable
        return Apply(self, [x, as_tensor_variable(start), as_tensor_variable(stop)],
                     [x.type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        from symgpu.gpu.ops.elemwise import new_array
        xc, sc, ec = (storage_map[v] for v in node.inputs)
        out = storage_map[node.outputs[0]]
        ctx, drv = CTX_OBJ, DRV

        class Thunk:
            capturable = True
            launches = True
            param_nbytes = 8
            param_slot = None
            param_layout_input = 0     # x's layout alone: it may be computed in the segment
            keep_layout = False
            seen_layout = None

            def bounds(self, x=None):
                x = xc[0] if x is None else x
                start, stop, _ = slice(int(sc[0]), int(ec[0])).indices(x.size)
                return x, start, max(stop - start, 0)

            def param_values(self, x=None):
                _, start, n = self.bounds(x)
                return n, np.int64(start).tobytes()

            def __call__(self):
                x, start, n = self.bounds()
                if self.keep_layout:
                    self.seen_layout = (x.context, x.shape, x.strides, x.dtype, n)
                o = new_array(ctx, (n,), np.dtype("float32"))
                xp, op_, slot = x.ptr, o.ptr, self.param_slot
                if n:
                    if slot is None:
                        def k():
                            MEM[op_][:n] = MEM[xp][start:start + n]
                    else:
                        def k():
                            s0 = int(_slot_bytes(slot, 8).view(np.int64)[0])
                            MEM[op_][:n] = MEM[xp][s0:s0 + n]
                    drv.launch_kernel(k)
                out[0] = o
        return Thunk()


class FakeScalarUp(Op):
    """A host float scalar filled into a fake device vector of length ``n`` (GpuFromHost of a
    scalar, broadcast), speaking the parameter protocol: captured, it reads the value from the
    parameter block."""

    __props__ = ("n",)

    def __init__(self, n):
        self.n = n

    def make_node(self, s):
        from symgpu.gpu.placement.type import GpuArrayType
        from symgpu.tensor.type import as_tensor_variable
        return Apply(self, [as_tensor_variable(s)], [GpuArrayType("float32", (False,), CTX)()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        from symgpu.gpu.ops.elemwise import new_array
        from symgpu.gpu.runtime.graph_params import pack_scalar
        sc = storage_map[node.inputs[0]]
        out = storage_map[node.outputs[0]]
        ctx, drv, n = CTX_OBJ, DRV, self.n

        class Thunk:
            capturable = True
            launches = True
            param_nbytes = 8
            param_slot = None

            def param_values(self):
                return (), pack_scalar(sc[0], "float32")

            def __call__(self):
                o = new_array(ctx, (n,), np.dtype("float32"))
                optr, slot, value = o.ptr, self.param_slot, float(sc[0])
                if slot is None:
                    def k():
                        MEM[optr][:n] = value
                else:
                    def k():
                        MEM[optr][:n] = _slot_bytes(slot, 4).view(np.float32)[0]
                drv.launch_kernel(k)
                out[0] = o
        return Thunk()


class FakeHostScale(Op):
    """x * s for a host scalar s passed as a kernel argument: no parameter protocol, so s
    stays in the graph's key by value."""

    __props__ = ()

    def make_node(self, x, s):
        from symgpu.tensor.type import as_tensor_variable
        return Apply(self, [x, as_tensor_variable(s)], [x.type()])

    def make_thunk(self, node, storage_map, compute_map, no_recycling, impl=None):
        from symgpu.gpu.ops.elemwise import new_array
        xc, sc = storage_map[node.inputs[0]], storage_map[node.inputs[1]]
        out = storage_map[node.outputs[0]]
        ctx, drv = CTX_OBJ, DRV

        def thunk():
            x, s = xc[0], float(sc[0])
            o = new_array(ctx, x.shape, np.dtype("float32"))
            xp, op_, n = x.ptr, o.ptr, x.size

            def k():
                MEM[op_][:n] = MEM[xp][:n] * s
            drv.launch_kernel(k)
            out[0] = o
        thunk.capturable = True
        thunk.launches = True
        return thunk


class FakeGuardedCopies:
    """device_checks' guarded-copy kernels (check, then the batched copy) over ``MEM``,
    launched through the fake driver (recorded under capture, run on replay).  Setting
    ``reported[0]`` plays a device check's report: the check kernel reads it into the verdict
    the copy kernel reads, as on the GPU.  ``launches`` lists (kernel, capturing, copies)."""

    def __init__(self):
        self.reported, self.verdict, self.launches = [False], [False], []

    def install(self, monkeypatch, ctx):
        from symgpu.gpu.runtime import device_checks as dc
        fake = self

        class Check:
            def prepared_async_call(self, grid, block, stream, *words):
                fake.launches.append(("check", DRV.capturing, None))

                def k():
                    fake.verdict[0] = fake.reported[0]
                DRV.launch_kernel(k)

        class Copy:
            def prepared_async_call(self, grid, block, stream, *table):
                size = dc._COPY_TABLE
                count = table[0]
                first = table[1:size + 2]
                dsts = table[size + 2:2 * size + 2][:count]
                srcs = table[2 * size + 2:3 * size + 2][:count]
                sizes = table[3 * size + 2:][:count]
                assert grid == (first[count], 1) and first[0] == 0
                copies = list(zip(dsts, srcs, sizes))
                fake.launches.append(("copy", DRV.capturing, copies))

                def k():
                    if fake.verdict[0]:
                        return
                    for d, s, n in copies:
                        host_view(d, (n // 4,), (4,))[...] = host_view(s, (n // 4,), (4,))
                DRV.launch_kernel(k)
        kernels = (Check(), Copy())

        def guard_kernels(c):
            assert c is ctx, "guarded copies on another context than the faked one"
            return kernels
        monkeypatch.setattr(dc, "_guard_kernels", guard_kernels)
        return self


def linked(inputs, outputs, values, updates=None):
    """The VM of a graph over `inputs` (holding `values`) with CUDA graphs on, and the graph
    (its updates as given)."""
    from symgpu.config import config
    from symgpu.graph.fg import FunctionGraph
    from symgpu.link.vm import link
    fg = FunctionGraph(inputs, outputs, clone=False)
    fg.update_mapping = dict(updates or {})
    storage = {v: [x] for v, x in zip(inputs, values)}
    with config.change_flags(**{"gpuarray.cuda_graphs": True}):
        vm = link(fg, storage)
    return vm, fg
