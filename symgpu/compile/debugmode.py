"""DebugMode: run the rewritten graph with checks, and the unrewritten one to compare with.

Each call
1. snapshots the function's inputs (explicit and shared);
2. runs the rewritten graph node by node: before each thunk it copies the inputs the op did
   not declare destroyed, and after it raises `BadDestroyMap` if one of them changed, and
   `BadViewMap` if an output shares memory with an input it did not declare as viewed or
   destroyed, and `BadOutputType` if an output is not a valid value of its type;
3. runs the unrewritten graph (cloned before the rewrites) on the snapshot and raises
   `BadOptimization`, naming the output, where a result differs beyond the type's tolerance.
   Stabilisation rewrites make results *more* accurate than the unrewritten float32 graph
   (log(1 - sigmoid(15.6)) is off by 0.3 in float32 through cancellation), so a mismatch is
   judged again against the unrewritten graph run in float64: the rewritten value is
   accepted if it matches that. Where the unrewritten graph gives inf or nan and the
   rewritten one a finite number, the rewritten value is accepted too.

Theano's settings (constructor arguments and attributes of the same names):
- `check_isfinite` (True): a NaN or Inf in a float output of any node of the rewritten graph
  raises `InvalidValueError`.
- `check_c_code` (True): nodes may run the compiled CPU C kernels (the `cxx` flag); False
  links every node on its NumPy thunk.
- `check_py_code` (True): with `check_c_code`, each elementwise / reduction node (the ops
  with C kernels) is run again on its NumPy thunk and the two results compared: a difference
  beyond the type's tolerance raises `BadThunkOutput`.
- `require_matching_strides` (0): in that comparison, differing strides are ignored (0),
  warned about (1) or raise `BadThunkOutput` (2).
- `stability_patience` (1 here; Theano's default is 10): the rewrites run on that many fresh
  copies of the unrewritten graph; any result that differs from the first (ops, wiring or
  constants, in order) raises `StochasticOrder`.
"""
from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np

from symgpu.compile.mode import NAMED_MODES, Mode
from symgpu.config import config
from symgpu.graph.basic import Apply, Constant
from symgpu.graph.fg import FunctionGraph
from symgpu.link.vm import VM, link
from symgpu.scalar.basic import Cast
from symgpu.scalar.dtypes import approx_tolerance, dtype_kind
from symgpu.tensor.c_elemwise import allow_c_kernels, c_kernels_allowed
from symgpu.tensor.elemwise import CAReduce, Elemwise
from symgpu.tensor.type import TensorType
from symgpu.tensor.rewriting.mixed_precision import POLICIES

__all__ = ["DebugMode", "DebugModeError", "BadOptimization", "BadDestroyMap", "BadViewMap",
           "BadOutputType", "BadThunkOutput", "StochasticOrder", "InvalidValueError",
           "DebugVM"]


class DebugModeError(AssertionError):
    """A check of DebugMode failed."""


class BadOptimization(DebugModeError):
    """The rewritten graph computes a different value than the original one."""


class BadDestroyMap(DebugModeError):
    """An op overwrote an input it did not declare in its destroy_map."""


class BadViewMap(DebugModeError):
    """An op returned memory shared with an input it did not declare in view_map/destroy_map."""


class BadOutputType(DebugModeError):
    """An op produced a value that is not valid for its output's type."""


class BadThunkOutput(DebugModeError):
    """Two implementations of one node (compiled C kernel and NumPy) disagree."""


class StochasticOrder(DebugModeError):
    """Rewriting copies of the same graph gave different graphs (`stability_patience`)."""


class InvalidValueError(DebugModeError):
    """A node produced NaN or Inf (`check_isfinite`)."""


def graph_signature(fgraph: FunctionGraph) -> list:
    """The rewritten graph as comparable data: per node in order, its op and where each input
    comes from (graph input index, earlier node's output, or a constant's type and value)."""
    where: dict = {v: ("in", i) for i, v in enumerate(fgraph.inputs)}
    sig = []
    for n, node in enumerate(fgraph.toposort()):
        ins = []
        for v in node.inputs:
            if v in where:
                ins.append(where[v])
            elif isinstance(v, Constant):
                data = np.asarray(v.data) if isinstance(v.data, (np.ndarray, np.generic, int,
                                                                 float, bool)) else v.data
                ins.append(("const", v.type, repr(data.tolist()) if isinstance(data, np.ndarray)
                            else repr(data)))
            else:
                ins.append(("free", v.type))
        for k, o in enumerate(node.outputs):
            where[o] = ("node", n, k)
        sig.append((node.op, tuple(ins)))
    sig.append(tuple(where.get(o, ("?",)) for o in fgraph.outputs))
    return sig


#: the float dtypes DebugMode's reference re-runs in float64
_NARROW_FLOATS = ("float16", "bfloat16", "float32")


def _float64_clone(fgraph: FunctionGraph) -> FunctionGraph | None:
    """The graph rebuilt with its narrow float inputs and casts in float64 (None if an op
    refuses): the more accurate reference DebugMode judges disagreements with."""
    memo: dict = {}
    try:
        with config.change_flags(warn_float64="ignore"):
            ins = []
            for v in fgraph.inputs:
                t = v.type
                if isinstance(t, TensorType) and t.dtype in _NARROW_FLOATS:
                    nv = TensorType("float64", t.broadcastable)(v.name)
                else:
                    nv = t()
                memo[v] = nv
                ins.append(nv)
            for node in fgraph.toposort():
                op = node.op
                if type(op) is Elemwise and isinstance(op.scalar_op, Cast) \
                        and op.scalar_op.dtype in _NARROW_FLOATS:
                    op = Elemwise(Cast("float64"))
                new = op.make_node(*[memo.get(i, i) for i in node.inputs])
                memo.update(zip(node.outputs, new.outputs))
            return FunctionGraph(ins, [memo.get(o, o) for o in fgraph.outputs], clone=False)
    except Exception:  # an op that refuses float64 inputs: no float64 reference (documented)
        return None


def _snapshot(value: Any) -> Any:
    if value is None:
        return None
    if hasattr(value, "copy"):
        return value.copy()
    return copy.deepcopy(value)


def _host(value: Any) -> np.ndarray:
    return np.asarray(value)


def _same(a: Any, b: Any) -> bool:
    a, b = _host(a), _host(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if dtype_kind(a.dtype) in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def _may_share(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.size > 0 and b.size > 0 and np.may_share_memory(a, b)
    pa, pb = getattr(a, "gpudata", None), getattr(b, "gpudata", None)
    return pa is not None and pa == pb


def _close(var_type: Any, ref: Any, got: Any) -> tuple[bool, str]:
    """Whether `got` matches the reference `ref`, and a short description of the difference."""
    r, g = _host(ref), _host(got)
    if r.shape != g.shape:
        return False, f"shape {g.shape} instead of {r.shape}"
    if r.dtype != g.dtype:
        return False, f"dtype {g.dtype} instead of {r.dtype}"
    if dtype_kind(r.dtype) in "fc":
        bad_ref = ~np.isfinite(r)
        if bad_ref.any():  # accept finite values where the unrewritten graph overflowed
            keep = ~(bad_ref & np.isfinite(g))
            r, g = r[keep], g[keep]
        ok = var_type.values_eq_approx(r, g) if hasattr(var_type, "values_eq_approx") else \
            np.allclose(r, g, equal_nan=True)
        if not ok:
            with np.errstate(all="ignore"):
                diff = np.abs(r.astype("float64") - g.astype("float64"))
            where = int(np.nanargmax(diff)) if diff.size and not np.all(np.isnan(diff)) else 0
            return False, (f"max abs difference {np.nanmax(diff) if diff.size else 0:.6g} at flat "
                           f"index {where} (expected {r.flat[where] if r.size else '-'}, "
                           f"got {g.flat[where] if g.size else '-'})")
        return True, ""
    if not np.array_equal(r, g):
        n = int(np.sum(r != g))
        return False, f"{n} element(s) differ"
    return True, ""


class DebugVM(VM):
    """A VM that checks each thunk and compares the outputs with the unrewritten graph."""

    def __init__(self, fgraph: FunctionGraph, storage_map: dict, reference: FunctionGraph | None,
                 check_views: bool = True, check_isfinite: bool = True,
                 check_c_code: bool = True, check_py_code: bool = True,
                 require_matching_strides: int = 0):
        with allow_c_kernels(check_c_code):
            base = link(fgraph, storage_map, allow_gc=False)
        super().__init__(fgraph, base.nodes, base.thunks, base.storage_map, None)
        self.reference = reference
        self.check_views = check_views
        self.check_isfinite = check_isfinite
        self.require_matching_strides = int(require_matching_strides)
        self.py_twin = None   # NumPy thunks of the nodes that may have run C kernels
        if check_c_code and check_py_code and c_kernels_allowed() and any(
                isinstance(n.op, (Elemwise, CAReduce)) for n in base.nodes):
            py_storage: dict = {}
            with allow_c_kernels(False):
                self.py_twin = link(fgraph, py_storage, allow_gc=False)
        self.ref_vm = None
        self.ref64 = None
        self.ref_cells: list[list] = []
        if reference is not None:
            ref_storage = {}
            for v in reference.inputs:
                cell = [None]
                ref_storage[v] = cell
                self.ref_cells.append(cell)
            self.ref_vm = link(reference, ref_storage, allow_gc=False)

    def _matches_float64(self, k: int, inputs: list, got: Any, ref32: Any) -> bool:
        """Whether output k agrees with the unrewritten graph run in float64, at every
        element where that graph is well-conditioned (its float32 and float64 runs agree)."""
        if self.ref64 is None:
            ref64 = _float64_clone(self.reference)
            if ref64 is None:
                return False
            cells = {v: [None] for v in ref64.inputs}
            self.ref64 = (ref64, [cells[v] for v in ref64.inputs], link(ref64, cells, allow_gc=False))
        ref64, cells, vm = self.ref64
        for cell, var, value in zip(cells, ref64.inputs, inputs):
            cell[0] = np.asarray(value, dtype=var.type.dtype) if hasattr(var.type, "dtype") else value
        with np.errstate(all="ignore"):
            vm()
        r64, r32, g = (_host(v) for v in (vm.storage_map[ref64.outputs[k]][0], ref32, got))
        if r64.shape != g.shape or r32.shape != g.shape:
            return False
        with np.errstate(all="ignore"):
            r64 = r64.astype(g.dtype)
            if dtype_kind(g.dtype) in "fc":
                tol = approx_tolerance(g.dtype)
                trusted = np.isclose(r32, r64, rtol=tol, atol=tol) & np.isfinite(r64)
                ok = np.isclose(g, r64, rtol=tol, atol=tol, equal_nan=True)
            else:
                trusted = r32 == r64
                ok = g == r64
        return bool(np.all(ok | ~trusted))

    def _describe_output(self, k: int) -> str:
        fg = self.fgraph
        if k in fg.update_mapping:
            return f"the update of shared variable {fg.inputs[fg.update_mapping[k]]} (output #{k})"
        ref = self.reference.outputs[k] if self.reference is not None else fg.outputs[k]
        name = ref.name or str(ref)
        return f"output #{k} ({name})"

    def _check_node(self, index: int, node: Apply, before: dict[int, Any]) -> None:
        sm = self.storage_map
        for j, old in before.items():
            now = sm[node.inputs[j]][0]
            if not _same(old, now):
                raise BadDestroyMap(
                    f"{node.op} (node #{index}: {node}) changed its input {j} "
                    f"({node.inputs[j]}), which its destroy_map does not declare")
        op = node.op
        dm, vm = getattr(op, "destroy_map", {}) or {}, getattr(op, "view_map", {}) or {}
        for o, out in enumerate(node.outputs):
            value = sm[out][0]
            if value is None:
                continue
            if not out.type.is_valid_value(value):
                raise BadOutputType(
                    f"{op} (node #{index}) produced {type(value).__name__} "
                    f"{getattr(value, 'dtype', '')}{getattr(value, 'shape', '')} for output {o} of "
                    f"type {out.type}")
            if not self.check_views:
                continue
            allowed = set(dm.get(o, ())) | set(vm.get(o, ()))
            for j, inp in enumerate(node.inputs):
                if j in allowed:
                    continue
                if _may_share(value, sm[inp][0]):
                    raise BadViewMap(
                        f"{op} (node #{index}: {node}) returned output {o} sharing memory with "
                        f"input {j} ({inp}) without declaring it in view_map or destroy_map")

    def _check_finite(self, index: int, node: Apply) -> None:
        for o, out in enumerate(node.outputs):
            value = self.storage_map[out][0]
            if not isinstance(value, (np.ndarray, np.generic)) or dtype_kind(value.dtype) not in "fc":
                continue  # host values only: device arrays are checked by NanGuardMode
            bad = ~np.isfinite(value)
            if bad.any():
                kinds = [k for k, m in (("NaN", np.isnan(value)), ("Inf", np.isinf(value)))
                         if np.any(m)]
                raise InvalidValueError(
                    f"{node.op} (node #{index}: {node}) produced {' and '.join(kinds)} in output "
                    f"{o} ({out}) at {int(bad.sum())} of {bad.size} element(s) "
                    "(check_isfinite=True)")

    def _check_py_twin(self, index: int, node: Apply, inputs: list) -> None:
        twin = self.py_twin
        tsm = twin.storage_map
        for v, value in zip(node.inputs, inputs):
            tsm[v][0] = _snapshot(value)
        for o in node.outputs:
            tsm[o][0] = None
        twin.thunks[index]()
        for o, out in enumerate(node.outputs):
            got, ref = self.storage_map[out][0], tsm[out][0]
            if got is None or ref is None:
                continue
            ok, why = _close(out.type, ref, got)
            if not ok:
                raise BadThunkOutput(
                    f"{node.op} (node #{index}: {node}): the compiled C kernel and the NumPy "
                    f"implementation disagree on output {o}: {why}")
            if self.require_matching_strides and isinstance(got, np.ndarray) and \
                    isinstance(ref, np.ndarray) and got.size > 1 and got.strides != ref.strides:
                msg = (f"{node.op} (node #{index}): output {o} has strides {got.strides} from the "
                       f"C kernel and {ref.strides} from NumPy")
                if self.require_matching_strides >= 2:
                    raise BadThunkOutput(msg)
                warnings.warn(msg, stacklevel=3)

    def __call__(self) -> None:
        fg, sm = self.fgraph, self.storage_map
        inputs = [_snapshot(sm[v][0]) for v in fg.inputs]
        for i, (node, thunk) in enumerate(zip(self.nodes, self.thunks)):
            destroyed = {j for js in (getattr(node.op, "destroy_map", {}) or {}).values() for j in js}
            before = {j: _snapshot(sm[v][0]) for j, v in enumerate(node.inputs)
                      if j not in destroyed}
            twin = self.py_twin is not None and isinstance(node.op, (Elemwise, CAReduce))
            twin_inputs = [_snapshot(sm[v][0]) for v in node.inputs] if twin else None
            try:
                thunk()
            except Exception as exc:  # re-raised with the node's information
                self.raise_with_node_info(i, exc)
            self._check_node(i, node, before)
            if twin:
                self._check_py_twin(i, node, twin_inputs)
            if self.check_isfinite:
                self._check_finite(i, node)
        for v, old in zip(fg.inputs, inputs):
            if not _same(old, sm[v][0]):
                raise BadDestroyMap(f"the function overwrote its input {v}")
        if self.ref_vm is None:
            return
        for cell, value in zip(self.ref_cells, inputs):
            cell[0] = _snapshot(value)
        with np.errstate(all="ignore"):  # the unrewritten graph may overflow: that is expected
            self.ref_vm()
        for k, (ref_var, var) in enumerate(zip(self.reference.outputs, fg.outputs)):
            ref_val = self.ref_vm.storage_map[ref_var][0]
            got = sm[var][0]
            ok, why = _close(var.type, ref_val, got)
            if not ok:
                ok = self._matches_float64(k, inputs, got, ref_val)
            if not ok:
                raise BadOptimization(
                    f"the rewritten graph computes a different value for {self._describe_output(k)}: "
                    f"{why}.\nRewritten: {var.owner.op if var.owner else var}; original: "
                    f"{ref_var.owner.op if ref_var.owner else ref_var}")


class DebugMode(Mode):
    """FAST_RUN's rewrites, with every call checked (see the module docstring for the
    checks and Theano's settings `stability_patience`, `check_c_code`, `check_py_code`,
    `check_isfinite` and `require_matching_strides`)."""

    _SETTINGS = ("check_views", "stability_patience", "check_c_code", "check_py_code",
                 "check_isfinite", "require_matching_strides")

    def __init__(self, including: tuple[str, ...] = (), excluding: tuple[str, ...] = (),
                 check_views: bool = True, *, stability_patience: int | None = None,
                 check_c_code: bool | None = None, check_py_code: bool | None = None,
                 check_isfinite: bool | None = None,
                 require_matching_strides: int | None = None):
        super().__init__("DebugMode", including, excluding)
        self.check_views = check_views
        self.stability_patience = 1 if stability_patience is None else int(stability_patience)
        if self.stability_patience < 1:
            raise ValueError(f"stability_patience must be at least 1, got {stability_patience}")
        self.check_c_code = True if check_c_code is None else bool(check_c_code)
        self.check_py_code = True if check_py_code is None else bool(check_py_code)
        self.check_isfinite = True if check_isfinite is None else bool(check_isfinite)
        self.require_matching_strides = 0 if require_matching_strides is None else \
            int(require_matching_strides)

    def _clone(self, including: tuple[str, ...], excluding: tuple[str, ...]) -> "DebugMode":
        return DebugMode(including, excluding, self.check_views,
                         **{k: getattr(self, k) for k in self._SETTINGS[1:]})

    def rewrite(self, fgraph: FunctionGraph) -> dict[str, float]:
        reference = fgraph.clone()
        # a mixed-precision policy changes what the program computes (by the user's choice):
        # the reference gets it too, so the other rewrites are judged against it
        for name, rewrite in self.passes():
            if name in POLICIES.values():
                rewrite(reference)
        fgraph.debugmode_reference = reference
        copies = [fgraph.clone() for _ in range(self.stability_patience - 1)]
        times = super().rewrite(fgraph)
        if copies:
            first = graph_signature(fgraph)
            for k, other in enumerate(copies, 1):
                super().rewrite(other)
                if graph_signature(other) != first:
                    raise StochasticOrder(
                        f"rewriting copy #{k} of the graph gave a different graph than the first "
                        f"rewrite ({len(other.apply_nodes)} nodes against "
                        f"{len(fgraph.apply_nodes)}): a rewrite depends on something other "
                        "than the graph (set iteration order, ids, ...)")
        return times

    def link(self, fgraph: FunctionGraph, storage_map: dict) -> DebugVM:
        return DebugVM(fgraph, storage_map, getattr(fgraph, "debugmode_reference", None),
                       self.check_views, self.check_isfinite, self.check_c_code,
                       self.check_py_code, self.require_matching_strides)

    def __repr__(self) -> str:
        return "DebugMode()"


NAMED_MODES["DebugMode"] = DebugMode  # get_mode("DebugMode") and mode=DebugMode
