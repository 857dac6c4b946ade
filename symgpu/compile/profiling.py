"""The profiler: where a compiled function spends its time (and, optionally, memory).

Switched on per function (``function(..., profile=True)``, or a shared :class:`ProfileStats`
passed as ``profile``) or for every function (the ``profile`` / ``profile_memory`` flags).
Each profiled Function gets a :class:`ProfileStats` on ``f.profile``; ``f.profile.summary()``
prints Theano's report, and at process exit every profile that ran (plus their sum) is
printed to stderr.

How it hooks in, without touching the fast path of unprofiled functions:

* ``symgpu.compile.function`` runs :func:`attach_profile` on each new Function;
* the VM's ``profiler`` attribute is set to a runner that times each thunk, keeps the VM's
  garbage collection and error reporting (``vm.raise_with_node_info``);
* the Function's class is swapped for a subclass whose ``__call__`` adds the outer timing.

Thunk timers come from :data:`TIMERS`. The default is ``time.perf_counter`` around the call;
the GPU backend registers, with :func:`register_node_timer`, a factory of CUDA-event timers
for its nodes so that asynchronous kernels are timed truly. A timer may return the elapsed
seconds or a zero-argument callable that gives them later: those are resolved at the end of
the call (after the last thunk), so a GPU timer needs one synchronisation per call, not one
per node.
"""
from __future__ import annotations

import atexit
import sys
import time
from collections import defaultdict
from typing import Any, Callable, Iterable, TextIO, Union

import numpy as np

from symgpu.compile.devices import transfer_kind
from symgpu.config import config
from symgpu.graph.basic import Apply, user_stack
from symgpu.printing import op_kind

__all__ = ["ProfileStats", "register_node_timer", "TIMERS", "perf_counter_timer", "timer_for",
           "attach_profile", "print_profiles_at_exit", "value_nbytes", "value_location",
           "register_memory_location"]

#: what a timer returns: seconds, or a callable giving them once the call is over
Elapsed = Union[float, Callable[[], float]]
#: a node timer runs the thunk it is given and says how long it took
NodeTimer = Callable[[Callable[[], None]], Elapsed]

# ============================================================================ timers

_perf = time.perf_counter


def perf_counter_timer(thunk: Callable[[], None]) -> float:
    """The default timer: wall-clock time of the (synchronous, host) thunk."""
    t0 = _perf()
    thunk()
    return _perf() - t0


#: (predicate(node) -> bool, factory(node) -> NodeTimer), newest first; the first match wins
TIMERS: list[tuple[Callable[[Apply], bool], Callable[[Apply], NodeTimer]]] = []


def register_node_timer(predicate: Callable[[Apply], bool],
                        factory: Callable[[Apply], NodeTimer]) -> None:
    """Let a backend time its own nodes (e.g. GPU kernels with CUDA events).

    ``factory(node)`` is called once per node when a function is compiled with profiling,
    and returns a ``timer(thunk) -> seconds | () -> seconds``. Newer registrations win."""
    TIMERS.insert(0, (predicate, factory))


def timer_for(node: Apply) -> NodeTimer:
    """The timer the profiler uses for ``node``: the first registered match, else perf_counter."""
    for predicate, factory in TIMERS:
        if predicate(node):
            return factory(node)
    return perf_counter_timer


# ============================================================================ memory

#: (predicate(value) -> bool, 'cpu' | 'gpu'), newest first, for values that are not NumPy
MEMORY_LOCATIONS: list[tuple[Callable[[Any], bool], str]] = []


def register_memory_location(predicate: Callable[[Any], bool], location: str) -> None:
    """Say where values of a kind live ('cpu' or 'gpu') for the memory profile."""
    if location not in ("cpu", "gpu"):
        raise ValueError(f"location must be 'cpu' or 'gpu', got {location!r}")
    MEMORY_LOCATIONS.insert(0, (predicate, location))


def value_nbytes(value: Any) -> int:
    """Bytes held by a value: anything with ``.nbytes`` counts, the rest is 0."""
    n = getattr(value, "nbytes", None)
    return int(n) if hasattr(n, "__index__") else 0


def value_location(value: Any) -> str:
    """'cpu' for NumPy (and anything registered so), 'gpu' for device arrays."""
    cls = type(value)
    if cls is np.ndarray:
        return "cpu"
    for predicate, location in MEMORY_LOCATIONS:
        if predicate(value):
            return location
    # looked up on the class: a property such as __cuda_array_interface__ is not evaluated
    if hasattr(cls, "__cuda_array_interface__") or hasattr(cls, "gpudata"):
        return "gpu"
    return "cpu"


# ============================================================================ stats

def _fmt_bytes(n: float) -> str:
    return f"{int(round(n / 1024.0))}KB" if n >= 1024 else f"{int(n)}B"


class ProfileStats:
    """Times (and memory) of one or several compiled functions, with Theano's report.

    Counters: ``fct_callcount``/``fct_call_time`` (``Function.__call__``), ``vm_call_time``
    (``Function.fn.__call__``, the VM), ``apply_time``/``apply_callcount`` per Apply node
    (their sum is "Time in thunks"), ``compile_time``, ``optimizer_time`` (rewriting),
    ``linker_time`` (thunks and kernels), ``nb_nodes``. With memory profiling:
    ``peak_memory`` {'cpu', 'gpu', 'total'} in bytes and ``node_output_bytes`` per node.
    """

    def __init__(self, atexit_print: bool = True, message: str = "", memory: bool | None = None,
                 line_width: int | None = None) -> None:
        self.message = message
        self.memory = config.profile_memory if memory is None else bool(memory)
        self.line_width = line_width
        self.fct_callcount = 0
        self.fct_call_time = 0.0
        self.vm_call_time = 0.0
        self.compile_time = 0.0
        self.optimizer_time = 0.0
        self.linker_time = 0.0
        self.nb_nodes = 0
        self.n_functions = 0
        self.apply_time: dict[Apply, float] = {}
        self.apply_callcount: dict[Apply, int] = {}
        self.apply_index: dict[Apply, int] = {}
        self.variable_shape: dict[Any, Any] = {}
        self.variable_strides: dict[Any, Any] = {}
        self.variable_dtype: dict[Any, str] = {}
        self.peak_memory = {"cpu": 0, "gpu": 0, "total": 0}
        self.node_output_bytes: dict[Apply, int] = {}
        self.node_output_kind: dict[Apply, str] = {}
        if atexit_print:
            _atexit_print_list.append(self)

    # -- aggregation ------------------------------------------------------------------------
    def _impl(self, node: Apply) -> str:
        return "Py" if op_kind(node) == "cpu" else "GPU"

    def _group(self, key: Callable[[Apply], Any]) -> list[tuple[Any, float, int, int, set[str]]]:
        """(key, time, calls, #apply, impls) rows, slowest first."""
        time_: dict[Any, float] = defaultdict(float)
        calls: dict[Any, int] = defaultdict(int)
        napply: dict[Any, int] = defaultdict(int)
        impl: dict[Any, set[str]] = defaultdict(set)
        for node, n in self.apply_callcount.items():
            k = key(node)
            time_[k] += self.apply_time.get(node, 0.0)
            calls[k] += n
            napply[k] += 1
            impl[k].add(self._impl(node))
        rows = [(k, time_[k], calls[k], napply[k], impl[k]) for k in time_]
        rows.sort(key=lambda r: (-r[1], str(r[0])))
        return rows

    def class_time(self) -> dict[type, float]:
        """Seconds per Op class."""
        return {k: t for k, t, *_ in self._group(lambda n: type(n.op))}

    def op_time(self) -> dict[Any, float]:
        """Seconds per Op (equal ops merged)."""
        return {k: t for k, t, *_ in self._group(lambda n: n.op)}

    def kind_time(self) -> dict[str, float]:
        """Seconds in 'cpu', 'gpu' and 'transfer' ops."""
        out = {"cpu": 0.0, "gpu": 0.0, "transfer": 0.0}
        for node, t in self.apply_time.items():
            out[op_kind(node)] += t
        return out

    @property
    def thunk_time(self) -> float:
        """Time in thunks: the sum of every Apply node's time."""
        return sum(self.apply_time.values())

    def merge(self, other: "ProfileStats") -> None:
        """Add ``other``'s counts into this one (the "Sum of all" profile)."""
        for attr in ("fct_callcount", "fct_call_time", "vm_call_time", "compile_time",
                     "optimizer_time", "linker_time", "nb_nodes", "n_functions"):
            setattr(self, attr, getattr(self, attr) + getattr(other, attr))
        for attr in ("apply_time", "apply_callcount"):
            mine = getattr(self, attr)
            for node, v in getattr(other, attr).items():
                mine[node] = mine.get(node, 0) + v
        for attr in ("apply_index", "variable_shape", "variable_strides", "variable_dtype",
                     "node_output_bytes", "node_output_kind"):
            getattr(self, attr).update(getattr(other, attr))
        if other.memory:
            self.memory = True
            for k in self.peak_memory:  # functions run one after another: the max is the peak
                self.peak_memory[k] = max(self.peak_memory[k], other.peak_memory[k])

    # -- report -----------------------------------------------------------------------------
    def summary(self, file: TextIO | None = None, n_ops_to_print: int = 20,
                n_apply_to_print: int = 20) -> None:
        """Print Theano's profile: function summary, Class/Ops/Apply tables, the cpu/gpu/
        transfer split, and the memory profile when collected."""
        out = file or sys.stderr
        self.summary_function(out)
        if self.thunk_time > 0:
            self.summary_class(out, n_ops_to_print)
            self.summary_kinds(out)
            self.summary_ops(out, n_ops_to_print)
            self.summary_nodes(out, n_apply_to_print)
        elif self.fct_callcount > 0:
            print("  No execution time accumulated (every thunk took no measurable time)",
                  file=out)
        if self.memory:
            self.summary_memory(out, n_apply_to_print)
        print("", file=out)

    def summary_function(self, file: TextIO) -> None:
        """Calls, time in Function.__call__ / the VM / thunks, compile time and its split."""
        total = self.fct_call_time

        def pct(x: float) -> str:
            return f"{100.0 * x / total:.3f}%" if total > 0 else "0.000%"

        print("Function profiling", file=file)
        print("==================", file=file)
        print(f"  Message: {self.message}", file=file)
        print(f"  Time in {self.fct_callcount} calls to Function.__call__: {total:e}s", file=file)
        if self.fct_callcount:
            print(f"  Time in Function.fn.__call__: {self.vm_call_time:e}s ({pct(self.vm_call_time)})",
                  file=file)
            print(f"  Time in thunks: {self.thunk_time:e}s ({pct(self.thunk_time)})", file=file)
        print(f"  Total compile time: {self.compile_time:e}s", file=file)
        print(f"    Number of Apply nodes: {self.nb_nodes}", file=file)
        print(f"    Optimizer time: {self.optimizer_time:e}s", file=file)
        print(f"    Linker time (includes CUDA code generation/compiling): {self.linker_time:e}s",
              file=file)
        print("", file=file)

    def _name(self, text: str, width: int) -> str:
        if self.line_width is None:
            return text
        return text[: max(self.line_width - width, 10)]

    def _table(self, file: TextIO, title: str, what: str, rows: list, n: int,
               label: Callable[[Any], str]) -> None:
        tot = self.thunk_time
        plural = {"Class": "Classes", "Op": "Ops"}.get(what, what)
        print(title, file=file)
        print("---", file=file)
        print(f"  <% time> <sum %> <apply time> <time per call> <type> <#call> <#apply> "
              f"<{what} name>", file=file)
        cum = 0.0
        for k, t, calls, napply, impls in rows[:n]:
            cum += t
            impl = "/".join(sorted(impls))
            per = t / calls if calls else 0.0
            print(f"  {100 * t / tot:5.1f}%  {100 * cum / tot:6.1f}%  {t:9.3f}s  {per:12.2e}s  "
                  f"{impl:>4}  {calls:6d}  {napply:4d}   {self._name(label(k), 70)}", file=file)
        rest = rows[n:]
        rest_t = sum(r[1] for r in rest)
        print(f"   ... (remaining {len(rest)} {plural} account "
              f"for {100 * rest_t / tot:6.2f}%({rest_t:.2f}s) of the runtime)", file=file)
        print("", file=file)

    def summary_class(self, file: TextIO, n: int = 20) -> None:
        """Time per Op class (module-qualified names), slowest first."""
        self._table(file, "Class", "Class", self._group(lambda nd: type(nd.op)), n,
                    lambda c: f"{c.__module__}.{c.__qualname__}")

    def summary_ops(self, file: TextIO, n: int = 20) -> None:
        """Time per Op (equal ops merged), slowest first."""
        self._table(file, "Ops", "Op", self._group(lambda nd: nd.op), n, str)

    def summary_kinds(self, file: TextIO) -> None:
        """Theano's line: how the thunk time splits between CPU, GPU and transfer ops."""
        k = self.kind_time()
        tot = self.thunk_time or 1.0
        print(f"Spent {k['cpu']:.3f}s({100 * k['cpu'] / tot:.2f}%) in cpu Op, "
              f"{k['gpu']:.3f}s({100 * k['gpu'] / tot:.2f}%) in gpu Op and "
              f"{k['transfer']:.3f}s({100 * k['transfer'] / tot:.2f}%) in transfer Op", file=file)
        waits = self.host_waits()
        if waits > 1:
            print(f"Each call waits for the GPU at up to {waits} points (copies to the host, "
                  "ops that read a flag back): symgpu.explain(f) says which and why.", file=file)
        print("", file=file)

    def host_waits(self) -> int:
        """At most how many points of a call make the host wait for the GPU: copies to the
        host and ops that read a flag back (adjacent copies at the end share one wait)."""
        downloads = sum(transfer_kind(n.op) == "download" for n in self.apply_callcount)
        flags = sum(bool(getattr(n.op, "host_sync", None)) for n in self.apply_callcount)
        return downloads + flags

    def summary_nodes(self, file: TextIO, n: int = 20) -> None:
        """Time per Apply node, slowest first, with the inputs' shapes/dtypes of each row."""
        tot = self.thunk_time
        rows = sorted(self.apply_callcount, key=lambda nd: (-self.apply_time.get(nd, 0.0),
                                                            self.apply_index.get(nd, 0)))
        print("Apply", file=file)
        print("------", file=file)
        print("  <% time> <sum %> <apply time> <time per call> <#call> <id> <Apply name>",
              file=file)
        cum = 0.0
        for node in rows[:n]:
            t = self.apply_time.get(node, 0.0)
            calls = self.apply_callcount[node]
            cum += t
            per = t / calls if calls else 0.0
            print(f"  {100 * t / tot:5.1f}%  {100 * cum / tot:6.1f}%  {t:9.3f}s  {per:12.2e}s  "
                  f"{calls:6d}  {self.apply_index.get(node, -1):3d}   {self._name(str(node), 60)}",
                  file=file)
            for kind, vars_ in (("input", node.inputs), ("output", node.outputs)):
                for i, var in enumerate(vars_):
                    dtype = self.variable_dtype.get(var, getattr(var.type, "dtype", "?"))
                    shape = self.variable_shape.get(var, "no shape")
                    strides = self.variable_strides.get(var, "no strides")
                    print(f"    {kind} {i}: dtype={dtype}, shape={shape}, strides={strides}",
                          file=file)
        rest = rows[n:]
        rest_t = sum(self.apply_time.get(nd, 0.0) for nd in rest)
        print(f"   ... (remaining {len(rest)} Apply instances account for "
              f"{100 * rest_t / tot:.2f}%({rest_t:.2f}s) of the runtime)", file=file)
        print("", file=file)

    def summary_memory(self, file: TextIO, n: int = 20) -> None:
        """Peak memory of outputs and intermediates, and the biggest node outputs."""
        peak = self.peak_memory
        print("Memory Profile", file=file)
        print("(outputs and intermediates; inputs and shared variables are not counted)",
              file=file)
        print("---", file=file)
        print("    Max peak memory with current setting", file=file)
        print(f"        CPU: {_fmt_bytes(peak['cpu'])}", file=file)
        print(f"        GPU: {_fmt_bytes(peak['gpu'])}", file=file)
        print(f"        CPU + GPU: {_fmt_bytes(peak['total'])}", file=file)
        print("", file=file)
        rows = sorted(self.node_output_bytes.items(),
                      key=lambda kv: (-kv[1], self.apply_index.get(kv[0], 0)))
        print("    <Sum apply outputs (bytes)> <Apply outputs shape> <created/inplace/view> "
              "<Apply node>", file=file)
        for node, nbytes in rows[:n]:
            shapes = [self.variable_shape.get(v, "?") for v in node.outputs]
            how = _created_how(node)
            print(f"     {nbytes:>10d}B  {shapes} {how} {self._name(str(node), 60)}", file=file)
        rest = rows[n:]
        print(f"   ... (remaining {len(rest)} Apply account for "
              f"{sum(b for _, b in rest)}B/{sum(b for _, b in rows)}B of the outputs' bytes)",
              file=file)
        print("", file=file)


def _created_how(node: Apply) -> str:
    op = node.op
    if getattr(op, "destroy_map", None):
        return "i"
    if getattr(op, "view_map", None):
        return "v"
    return "c"


def _fresh_outputs(node: Apply) -> list[bool]:
    """Which outputs own new memory (not views of, nor written into, an input)."""
    reused: set[int] = set()
    for mapping in (getattr(node.op, "destroy_map", None) or {},
                    getattr(node.op, "view_map", None) or {}):
        reused.update(mapping)
    return [i not in reused for i in range(len(node.outputs))]


# ============================================================================ the VM runner

def _record_values(shapes: dict, strides: dict, dtypes: dict, pairs: tuple) -> None:
    """Keep the last seen shape, strides and dtype of each (variable, cell) pair.

    Raw attribute objects are stored (no str/tuple conversions): this runs for every node
    on every call, and the report formats them only once."""
    for var, cell in pairs:
        value = cell[0]
        if value is None:
            continue
        try:
            shapes[var] = value.shape
            strides[var] = value.strides
            dtypes[var] = value.dtype
        except AttributeError:  # Python scalars, lists, random states...
            shapes[var] = getattr(value, "shape", ())
            strides[var] = getattr(value, "strides", ())
            dtypes[var] = getattr(value, "dtype", type(value).__name__)


class _Runner:
    """``vm.profiler``: runs the thunks like ``VM.__call__`` does, timing each one."""

    def __init__(self, stats: ProfileStats, vm: Any) -> None:
        self.stats = stats
        self.nodes: list[Apply] = list(vm.nodes)
        self.timers: list[NodeTimer] = [timer_for(node) for node in self.nodes]
        sm = vm.storage_map
        self.out_cells = [[sm[v] for v in node.outputs] for node in self.nodes]
        self.pairs = [tuple((v, sm[v]) for v in node.inputs + node.outputs) for node in self.nodes]
        self.gc_after = vm.gc_after
        self.memory = stats.memory
        if self.memory:
            self.fresh = [_fresh_outputs(node) for node in self.nodes]
            # every cell of a computed variable that owns its memory: live values count
            counted = {}
            for node, cells, fresh in zip(self.nodes, self.out_cells, self.fresh):
                for cell, f in zip(cells, fresh):
                    if f:
                        counted[id(cell)] = cell
            self.counted = counted

    def __call__(self, vm: Any) -> None:
        stats = self.stats
        nodes, timers, gc_after = self.nodes, self.timers, self.gc_after
        thunks = vm.thunks
        n = len(thunks)
        elapsed: list[Elapsed] = [0.0] * n
        ran = 0
        record, pairs = _record_values, self.pairs
        shapes, strides, dtypes = stats.variable_shape, stats.variable_strides, stats.variable_dtype
        memory = self.memory
        if memory:
            counted = self.counted
            live = {"cpu": 0, "gpu": 0}
            sizes: dict[int, tuple[str, int]] = {}
            for key, cell in counted.items():
                v = cell[0]
                if v is not None:
                    sizes[key] = (value_location(v), value_nbytes(v))
                    live[sizes[key][0]] += sizes[key][1]
            peak = dict(live, total=live["cpu"] + live["gpu"])
        t_start = _perf()
        i = 0
        try:
            for i in range(n):
                timer = timers[i]
                t0 = _perf()
                try:
                    if timer is perf_counter_timer:  # inlined: one call less per node
                        thunks[i]()
                        elapsed[i] = _perf() - t0
                    else:
                        elapsed[i] = timer(thunks[i])
                except Exception:  # timed and recorded, then re-raised by the handler below
                    elapsed[i] = _perf() - t0  # the failing thunk's time counts too
                    ran = i + 1
                    record(shapes, strides, dtypes, pairs[i])  # the inputs that made it fail
                    raise
                ran = i + 1
                record(shapes, strides, dtypes, pairs[i])
                if memory:
                    node_bytes = 0
                    kind = "cpu"
                    for cell, f in zip(self.out_cells[i], self.fresh[i]):
                        if not f:
                            continue
                        key = id(cell)
                        old = sizes.pop(key, None)
                        if old is not None:
                            live[old[0]] -= old[1]
                        v = cell[0]
                        if v is not None:
                            kind = value_location(v)
                            nb = value_nbytes(v)
                            sizes[key] = (kind, nb)
                            live[kind] += nb
                            node_bytes += nb
                    stats.node_output_bytes[nodes[i]] = node_bytes
                    stats.node_output_kind[nodes[i]] = kind
                    total = live["cpu"] + live["gpu"]
                    peak["cpu"] = max(peak["cpu"], live["cpu"])
                    peak["gpu"] = max(peak["gpu"], live["gpu"])
                    peak["total"] = max(peak["total"], total)
                if gc_after is not None:
                    for cell in gc_after[i]:
                        if memory:
                            old = sizes.pop(id(cell), None)
                            if old is not None:
                                live[old[0]] -= old[1]
                        cell[0] = None
        except Exception as exc:  # the partial call is accounted, then the error re-raised
            self._account(elapsed, ran, t_start, strict=False)
            if memory:
                self._account_memory(peak)
            vm.raise_with_node_info(i, exc)
        self._account(elapsed, ran, t_start)
        if memory:
            self._account_memory(peak)

    def _account(self, elapsed: list[Elapsed], ran: int, t_start: float,
                 strict: bool = True) -> None:
        stats = self.stats
        apply_time, apply_callcount = stats.apply_time, stats.apply_callcount
        for node, e in zip(self.nodes[:ran], elapsed[:ran]):
            if callable(e):  # deferred (e.g. CUDA event) timers resolve here
                try:
                    t = e()
                except Exception:  # a timer of a failed call: the node's own error is reported
                    if strict:
                        raise
                    t = 0.0  # after a failed call: the node's own error is the one to report
            else:
                t = e
            apply_time[node] = apply_time.get(node, 0.0) + t
            apply_callcount[node] = apply_callcount.get(node, 0) + 1
        stats.vm_call_time += _perf() - t_start

    def _account_memory(self, peak: dict[str, int]) -> None:
        mine = self.stats.peak_memory
        for k, v in peak.items():
            mine[k] = max(mine[k], v)


# ============================================================================ attaching

_profiled_classes: dict[type, type] = {}


def _profiled_class(cls: type) -> type:
    """A subclass of the Function class whose ``__call__`` also times the whole call."""
    sub = _profiled_classes.get(cls)
    if sub is None:
        base_call = cls.__call__

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = _perf()
            try:
                return base_call(self, *args, **kwargs)
            finally:
                prof = self.profile
                prof.fct_call_time += _perf() - t0
                prof.fct_callcount += 1

        sub = type(f"Profiled{cls.__name__}", (cls,), {"__call__": __call__,
                                                       "__module__": cls.__module__,
                                                       "__doc__": cls.__doc__})
        _profiled_classes[cls] = sub
    return sub


def _creation_message(fn: Any) -> str:
    if getattr(fn, "name", None):
        return str(fn.name)
    frames = user_stack()
    if frames:
        return f"{frames[-1].filename}:{frames[-1].lineno}"
    return "(unnamed function)"


def attach_profile(fn: Any, profile: Any) -> None:
    """The hook run on each new Function: profile it if asked to.

    ``profile``: None (follow the ``profile``/``profile_memory`` flags), False, True, or a
    :class:`ProfileStats` to accumulate into (shared by several functions). Unprofiled
    functions are left exactly as compiled (``fn.profile`` is None)."""
    if isinstance(profile, ProfileStats):
        stats = profile
    else:
        enabled = bool(profile) if profile is not None else (config.profile or config.profile_memory)
        if not enabled:
            return
        stats = ProfileStats(message=_creation_message(fn))
    maker = fn.maker
    stats.compile_time += getattr(maker, "compile_time", 0.0)
    stats.optimizer_time += getattr(maker, "rewrite_time", 0.0)
    stats.linker_time += getattr(maker, "link_time", 0.0)
    vm = fn.vm
    stats.nb_nodes += len(vm.nodes)
    stats.n_functions += 1
    for i, node in enumerate(vm.nodes):
        stats.apply_index[node] = i
    fn.profile = stats
    vm.profiler = _Runner(stats, vm)
    fn.__class__ = _profiled_class(type(fn))


# ============================================================================ at exit

_atexit_print_list: list[ProfileStats] = []


def print_profiles_at_exit(file: TextIO | None = None,
                           profiles: Iterable[ProfileStats] | None = None) -> None:
    """Print each profile that ran (or took over a second to compile), then their sum when
    there are several (Theano's rule, so idle helper functions do not flood the output)."""
    out = file or sys.stderr
    todo = [p for p in (_atexit_print_list if profiles is None else profiles)
            if p.fct_callcount > 0 or p.compile_time > 1.0]
    for p in todo:
        p.summary(file=out)
    if len(todo) > 1:
        total = ProfileStats(atexit_print=False, memory=False,
                             message=f"Sum of all({len(todo)}) printed profiles at exit.")
        for p in todo:
            total.merge(p)
        total.summary(file=out)
    try:
        out.flush()
    except Exception:  # pragma: no cover - closed stream at interpreter exit
        pass


atexit.register(print_profiles_at_exit)

