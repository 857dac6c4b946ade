"""MonitorMode and NanGuardMode: call user functions around every node of a compiled function
(Theano's "How do I step through a compiled function?"), e.g. to find the first node that
makes a NaN.

``pre_func(i, node, fn)`` runs before node ``i`` (its toposort position) and
``post_func(i, node, fn)`` after it; ``fn.inputs`` / ``fn.outputs`` are the node's storage
cells (one-element lists), so ``[c[0] for c in fn.inputs]`` are the input values. The mode
gives the VM a ``runner`` (link/vm.py) that runs node by node; functions of other modes keep
the VM's generated straight-line code untouched. ``post_func`` runs before ``allow_gc``
empties the cells read for the last time, so inputs are still there.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from symgpu.compile.mode import FAST_COMPILE, FAST_RUN, Mode
from symgpu.config import config
from symgpu.scalar.dtypes import dtype_kind
from symgpu.link.vm import link
from symgpu.printing import debugprint
from symgpu.tensor.c_elemwise import allow_c_kernels
from symgpu.graph.basic import Apply

__all__ = ["MonitorMode", "NanGuardMode", "NodeFn", "detect_nan"]

Hook = Callable[[int, Apply, "NodeFn"], None]

#: Theano's optimizer names -> (mode name, extra excluded tags)
_OPTIMIZERS = {"default": (None, ()), "fast_run": (FAST_RUN, ()), "o4": (FAST_RUN, ()),
               "fast_compile": (FAST_COMPILE, ()), "o1": (FAST_COMPILE, ()),
               "None": (FAST_COMPILE, ("fast_compile",))}
_LINKERS = ("default", "vm", "cvm", "c|py", "cvm_nogc", "vm_nogc", "c", "py", "c|py_nogc")


class NodeFn:
    """What ``pre_func``/``post_func`` get as ``fn``: the node's thunk with its ``inputs`` and
    ``outputs`` cells (calling it runs the node once more); other attributes are the thunk's."""

    __slots__ = ("thunk", "inputs", "outputs")

    def __init__(self, thunk: Callable[[], None], inputs: list[list], outputs: list[list]):
        self.thunk, self.inputs, self.outputs = thunk, inputs, outputs

    def __call__(self) -> None:
        self.thunk()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.thunk, name)


class _MonitorRunner:
    """``vm.runner``: each thunk between the hooks, then the cells read for the last time
    emptied; an error (of a thunk or a hook) is reported with the node, as the VM does."""

    def __init__(self, vm: Any, pre_func: Hook | None, post_func: Hook | None):
        sm = vm.storage_map
        gc_after = vm.gc_after or [()] * len(vm.nodes)
        self.vm = vm
        self.pre, self.post = pre_func, post_func
        self.steps = [(i, node, NodeFn(thunk, [sm[v] for v in node.inputs],
                                       [sm[v] for v in node.outputs]), tuple(dead))
                      for i, (node, thunk, dead) in enumerate(zip(vm.nodes, vm.thunks, gc_after))]

    def __call__(self) -> None:
        pre, post = self.pre, self.post
        i = 0
        try:
            for i, node, fn, dead in self.steps:
                if pre is not None:
                    pre(i, node, fn)
                fn.thunk()
                if post is not None:
                    post(i, node, fn)
                for cell in dead:
                    cell[0] = None
        except Exception as exc:  # re-raised with the node's information
            self.vm.raise_with_node_info(i, exc)


class MonitorMode(Mode):
    """A mode whose functions call ``pre_func(i, node, fn)`` before and ``post_func(i, node,
    fn)`` after each node (see the module doc).

    ``optimizer``: 'default' (the ``mode`` flag's rewrites), 'fast_run', 'fast_compile' or
    None (no rewrites). ``linker``: Theano's names are accepted; 'py' runs NumPy thunks
    only (no compiled CPU kernels). ``mode.excluding('local_elemwise_fusion', 'inplace')``
    keeps the graph close to what was written, so post_func sees each step.
    """

    def __init__(self, pre_func: Hook | None = None, post_func: Hook | None = None,
                 optimizer: str | None = "default", linker: str | None = None):
        for what, fn in (("pre_func", pre_func), ("post_func", post_func)):
            if fn is not None and not callable(fn):
                raise TypeError(f"MonitorMode: {what} must be callable(i, node, fn), got {fn!r}")
        key = "None" if optimizer is None else str(optimizer).lower()
        key = "None" if key == "none" else key
        if key not in _OPTIMIZERS:
            raise ValueError(f"MonitorMode: unknown optimizer {optimizer!r}; use 'default', "
                             "'fast_run', 'fast_compile' or None")
        if linker is not None and linker not in _LINKERS:
            raise ValueError(f"MonitorMode: unknown linker {linker!r}; use one of "
                             f"{', '.join(_LINKERS)}")
        name, excluded = _OPTIMIZERS[key]
        if name is None:
            name = FAST_COMPILE if config.mode == FAST_COMPILE else FAST_RUN
        super().__init__(name, (), excluded)
        self.pre_func, self.post_func = pre_func, post_func
        self.optimizer, self.linker = optimizer, linker

    def _clone(self, including: tuple[str, ...], excluding: tuple[str, ...]) -> "MonitorMode":
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new._with(including, excluding)

    def link(self, fgraph: Any, storage_map: dict) -> Any:
        if self.linker == "py":
            with allow_c_kernels(False):
                vm = link(fgraph, storage_map)
        else:
            vm = super().link(fgraph, storage_map)
        # replaces any backend runner (a CUDA graph would run the nodes out of sight)
        vm.runner = _MonitorRunner(vm, self.pre_func, self.post_func)
        return vm

    def __repr__(self) -> str:
        return (f"MonitorMode(pre_func={self.pre_func!r}, post_func={self.post_func!r}, "
                f"optimizer={self.optimizer!r})")


def _host(value: Any) -> Any:
    if hasattr(value, "__cuda_array_interface__") and not isinstance(value, np.ndarray):
        return np.asarray(value)
    return value


def _float_array(value: Any) -> np.ndarray | None:
    value = _host(value)
    if isinstance(value, (np.ndarray, np.generic, float)):
        arr = np.asarray(value)
        if dtype_kind(arr.dtype) in "fc":
            return arr
    return None


def detect_nan(i: int, node: Apply, fn: NodeFn) -> None:
    """The debugging FAQ's post_func: print the node, its inputs and outputs when an output
    holds a NaN."""
    for output in fn.outputs:
        arr = _float_array(output[0])
        if arr is not None and np.isnan(arr).any():
            print("*** NaN detected ***")
            debugprint(node)
            print("Inputs : %s" % [inp[0] for inp in fn.inputs])
            print("Outputs: %s" % [out[0] for out in fn.outputs])
            break


class NanGuardMode(MonitorMode):
    """Raise AssertionError at the first node whose input or output holds a NaN
    (``nan_is_error``), an infinity (``inf_is_error``) or a magnitude above 1e10
    (``big_is_error``), naming the node, the input/output and the user's line (Theano's
    NanGuardMode). Inputs are checked before a node runs, outputs after."""

    BIG = 1e10

    def __init__(self, nan_is_error: bool = True, inf_is_error: bool = True,
                 big_is_error: bool = True, optimizer: str | None = "default",
                 linker: str | None = None):
        self.nan_is_error, self.inf_is_error = nan_is_error, inf_is_error
        self.big_is_error = big_is_error
        super().__init__(self._check_inputs, self._check_outputs, optimizer, linker)

    def _problem(self, value: Any) -> str | None:
        arr = _float_array(value)
        if arr is None or arr.size == 0:
            return None
        if self.nan_is_error and np.isnan(arr).any():
            return "NaN"
        if self.inf_is_error and np.isinf(arr).any():
            return "Inf"
        if self.big_is_error:
            finite = arr[np.isfinite(arr)]
            if finite.size and np.abs(finite).max() > self.BIG:
                return f"big value (|x| > {self.BIG:g})"
        return None

    def _check(self, node: Apply, cells: Sequence[list], variables: Sequence[Any],
               what: str) -> None:
        for k, (cell, var) in enumerate(zip(cells, variables)):
            problem = self._problem(cell[0])
            if problem is not None:
                raise AssertionError(f"NanGuardMode: {problem} detected in {what} {k} ({var}, "
                                     f"{var.type}) of {node}")

    def _check_inputs(self, i: int, node: Apply, fn: NodeFn) -> None:
        self._check(node, fn.inputs, node.inputs, "input")

    def _check_outputs(self, i: int, node: Apply, fn: NodeFn) -> None:
        self._check(node, fn.outputs, node.outputs, "output")

    def __repr__(self) -> str:
        return (f"NanGuardMode(nan_is_error={self.nan_is_error}, inf_is_error="
                f"{self.inf_is_error}, big_is_error={self.big_is_error})")
