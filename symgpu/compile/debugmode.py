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
"""
from __future__ import annotations

import copy
from typing import Any

import numpy as np

from symgpu.compile.mode import NAMED_MODES, Mode
from symgpu.config import config
from symgpu.graph.basic import Apply
from symgpu.graph.fg import FunctionGraph
from symgpu.link.vm import VM, link
from symgpu.scalar.basic import Cast
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.type import TensorType

__all__ = ["DebugMode", "DebugModeError", "BadOptimization", "BadDestroyMap", "BadViewMap",
           "BadOutputType", "DebugVM"]


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


def _float64_clone(fgraph: FunctionGraph) -> FunctionGraph | None:
    """The graph rebuilt with its float16/32 inputs and casts in float64 (None if an op
    refuses): the more accurate reference DebugMode judges disagreements with."""
    memo: dict = {}
    try:
        with config.change_flags(warn_float64="ignore"):
            ins = []
            for v in fgraph.inputs:
                t = v.type
                if isinstance(t, TensorType) and t.dtype in ("float16", "float32"):
                    nv = TensorType("float64", t.broadcastable)(v.name)
                else:
                    nv = t()
                memo[v] = nv
                ins.append(nv)
            for node in fgraph.toposort():
                op = node.op
                if type(op) is Elemwise and isinstance(op.scalar_op, Cast) \
                        and op.scalar_op.dtype in ("float16", "float32"):
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
    if a.dtype.kind in "fc":
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
    if r.dtype.kind in "fc":
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
                 check_views: bool = True):
        base = link(fgraph, storage_map, allow_gc=False)
        super().__init__(fgraph, base.nodes, base.thunks, base.storage_map, None)
        self.reference = reference
        self.check_views = check_views
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
            if g.dtype.kind in "fc":
                tol = 1e-4 if g.dtype.itemsize <= 4 else 1e-8
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

    def __call__(self) -> None:
        fg, sm = self.fgraph, self.storage_map
        inputs = [_snapshot(sm[v][0]) for v in fg.inputs]
        for i, (node, thunk) in enumerate(zip(self.nodes, self.thunks)):
            destroyed = {j for js in (getattr(node.op, "destroy_map", {}) or {}).values() for j in js}
            before = {j: _snapshot(sm[v][0]) for j, v in enumerate(node.inputs)
                      if j not in destroyed}
            try:
                thunk()
            except Exception as exc:  # re-raised with the node's information
                self.raise_with_node_info(i, exc)
            self._check_node(i, node, before)
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
    """FAST_RUN's rewrites, with every call checked (see the module docstring)."""

    def __init__(self, including: tuple[str, ...] = (), excluding: tuple[str, ...] = (),
                 check_views: bool = True):
        super().__init__("DebugMode", including, excluding)
        self.check_views = check_views

    def rewrite(self, fgraph: FunctionGraph) -> dict[str, float]:
        fgraph.debugmode_reference = fgraph.clone()
        return super().rewrite(fgraph)

    def link(self, fgraph: FunctionGraph, storage_map: dict) -> DebugVM:
        return DebugVM(fgraph, storage_map, getattr(fgraph, "debugmode_reference", None),
                       self.check_views)

    def __repr__(self) -> str:
        return "DebugMode()"


NAMED_MODES["DebugMode"] = DebugMode  # get_mode("DebugMode") and mode=DebugMode
