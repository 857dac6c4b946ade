"""The Scan op: a loop over an inner graph, with preallocated output buffers.

Outer inputs:  [n_steps, sequences (S), initial state buffers (M), non-sequences (N)]
Outer outputs: [state buffers (M), per-step outputs (K)]
Inner inputs:  [one slice per sequence (S), one value per state tap, non-sequences (N)]
Inner outputs: [new value per state (M), per-step outputs (K), (the `until` condition)]

A state j with taps (e.g. (-2, -1)) reads buffer[t + n_init + tap] at step t, where
n_init = -min(taps) initial values lead the buffer. A state with `keep[j]` False keeps only its
last n_init values (memory O(taps)): its output is those values, oldest first.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

import symgpu.tensor as T
from symgpu.graph.basic import Apply, Variable
from symgpu.graph.op import Op
from symgpu.scan.body_lengths import per_step_dims
from symgpu.scan.grad import scan_grad
from symgpu.scan.info import ScanInfo
from symgpu.scan.inner import InnerFunction
from symgpu.tensor.type import TensorType

__all__ = ["Scan", "ScanInfo"]


class ScanError(ValueError):
    """A loop failed at run time; the message names the scan, the step and the output."""


class Scan(Op):
    """Runs `inner` n_steps times (or until its condition holds), threading the states."""

    #: set on the backward loops scan_grad builds: what they differentiate (ScanGradOf)
    grad_of: Any = None

    def __init__(self, inner_inputs: Sequence[Variable], inner_outputs: Sequence[Variable],
                 info: ScanInfo, mode: Any = None):
        self.info = info
        self.mode = mode
        self.inner = InnerFunction(inner_inputs, inner_outputs, mode, name=f"{info.name} body")

    # the inner graph, as Theano names it
    @property
    def fgraph(self):
        return self.inner.fgraph

    @property
    def inner_inputs(self) -> list[Variable]:
        return self.inner.inputs

    @property
    def inner_outputs(self) -> list[Variable]:
        return self.inner.outputs

    def __str__(self) -> str:
        kind = "while" if self.info.as_while else "for"
        return f"Scan{{{self.info.name}, {kind}}}"

    # -- building ---------------------------------------------------------------------------
    def make_node(self, n_steps: Any, *outer: Variable) -> Apply:
        info = self.info
        n_steps = T.as_tensor_variable(n_steps)
        if n_steps.ndim != 0 or not n_steps.dtype.startswith(("int", "uint")):
            raise TypeError(f"{info.name}: n_steps must be an integer scalar, got {n_steps.type}")
        expected = info.n_seqs + info.n_states + info.n_nonseqs
        if len(outer) != expected:
            raise ValueError(f"{self}: expected {expected} outer inputs, got {len(outer)}")
        outs = []
        inner_outs = self.inner_outputs
        for j in range(info.n_states):
            init = outer[info.n_seqs + j]
            o = inner_outs[j]
            outs.append(TensorType(init.type.dtype, (False,) + tuple(o.type.broadcastable))())
        for i in range(info.n_nitsot):
            o = inner_outs[info.n_states + i]
            outs.append(TensorType(o.type.dtype, (False,) + tuple(o.type.broadcastable))())
        return Apply(self, [T.cast(n_steps, "int64") if n_steps.dtype != "int64" else n_steps,
                            *outer], outs)

    # -- running ----------------------------------------------------------------------------
    def prepare_node(self, node: Apply, storage_map: dict, compute_map: dict, impl: Any) -> None:
        """Compile the loop body when the outer function is linked (once per op)."""
        self.inner.compile()

    def free(self) -> None:
        """Release the loop body's intermediate storage (Theano's op.free; Function.free)."""
        self.inner.free()

    def perform(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        self.inner.compile()
        inner = self.inner
        with inner.lock:  # the body's cells are shared by every call of this op
            try:
                self._loop(node, inputs, output_storage)
            finally:  # also after an error: the cells must not keep this call's arrays
                for cell in inner.input_cells:
                    cell[0] = None
                for cell in inner.clear_cells:
                    cell[0] = None

    def _begin_loop(self, node: Apply, inputs: Sequence[Any]) -> tuple[int, list, list]:
        """Check the loop's inputs (steps, sequence lengths, initial values), put the
        non-sequences in the body's cells; (n_steps, sequences, initial values). Shared by
        the host loop and the GPU one (symgpu/gpu/ops/scan_op.py)."""
        info = self.info
        n = int(inputs[0])
        S, M = info.n_seqs, info.n_states
        seqs = list(inputs[1:1 + S])
        inits = list(inputs[1 + S:1 + S + M])
        if n < 0:
            raise ScanError(f"{info.name}: n_steps is {n}; it must be >= 0 (a negative constant "
                            "n_steps given to scan() means go_backwards)")
        for k, s in enumerate(seqs):
            if s.shape[0] < n:
                raise ScanError(f"{info.name}: sequence {k} ({node.inputs[1 + k]}) has "
                                f"{s.shape[0]} entries but the loop runs {n} steps")
        for j, init in enumerate(inits):
            n_init = info.n_init(j)
            if init.shape[0] < n_init:
                raise ScanError(f"{info.name}: the initial value of {info.state_label(j)} has "
                                f"{init.shape[0]} entries along its first axis; taps "
                                f"{list(info.state_taps[j])} need {n_init}")
        cells = self.inner.input_cells
        for cell, v in zip(cells[S + info.n_taps:], inputs[1 + S + M:]):
            cell[0] = v
        return n, seqs, inits

    def _loop(self, node: Apply, inputs: Sequence[Any], output_storage: list[list]) -> None:
        info = self.info
        inner = self.inner
        n, seqs, inits = self._begin_loop(node, inputs)
        S, M, K = info.n_seqs, info.n_states, info.n_nitsot
        cells = inner.input_cells
        seq_cells = cells[:S]
        tap_cells = cells[S:S + info.n_taps]
        out_cells = inner.output_cells
        clear = inner.clear_cells
        # state storage: full buffers (keep) or python windows of the last n_init values
        bufs: list[Any] = []
        for j in range(M):
            n_init = info.n_init(j)
            init = inits[j]
            if info.keep[j]:
                buf = np.empty((n_init + n,) + init.shape[1:], dtype=node.outputs[j].dtype)
                buf[:n_init] = init[:n_init]
                bufs.append(buf)
            else:
                bufs.append([init[i, ...] for i in range(n_init)])
        nitsot: list[Any] = [None] * K
        n_inits = [info.n_init(j) for j in range(M)]
        keep = info.keep
        # (cell, state, offset into the buffer or window index, kept?) per tap
        tap_plan = []
        for cell, (j, tap) in zip(tap_cells, [(j, tap) for j in range(M)
                                              for tap in info.state_taps[j]]):
            tap_plan.append((cell, bufs[j], n_inits[j] + tap if keep[j] else tap, keep[j]))
        state_plan = [(out_cells[j], bufs[j], n_inits[j], keep[j], j) for j in range(M)]
        seq_plan = list(zip(seq_cells, seqs))
        cond_cell = out_cells[M + K] if info.as_while else None
        run = inner._run
        steps_done = n
        for t in range(n):
            for cell, s in seq_plan:
                cell[0] = s[t, ...]
            for cell, buf, off, kept in tap_plan:
                cell[0] = buf[t + off, ...] if kept else buf[off]
            try:
                run()
            # any error of the body (its ops raise what they like): nothing is swallowed, it
            # is re-raised at once, as the same class with the loop and the step added to its
            # message (chained to the original), or unchanged when that class cannot be
            # rebuilt from a message
            except Exception as exc:
                if not _simple(exc):
                    raise
                raise type(exc)(f"{exc}\n(in {info.name}, step {t} of {n})") from exc
            for cell, buf, n_init, kept, j in state_plan:
                val = cell[0]
                if kept:
                    if val.shape != buf.shape[1:]:
                        raise ScanError(self._shape_msg(info.state_label(j), t, np.shape(val),
                                                        buf.shape[1:]))
                    buf[t + n_init] = val
                else:
                    if np.shape(val) != np.shape(buf[-1]):
                        raise ScanError(self._shape_msg(info.state_label(j), t, np.shape(val),
                                                        np.shape(buf[-1])))
                    buf.append(val)
                    del buf[0]
            for i in range(K):
                val = out_cells[M + i][0]
                arr = nitsot[i]
                if arr is None:
                    arr = nitsot[i] = np.empty((n,) + np.shape(val), dtype=node.outputs[M + i].dtype)
                elif val.shape != arr.shape[1:]:
                    raise ScanError(self._shape_msg(info.nitsot_label(i), t, np.shape(val),
                                                    arr.shape[1:]))
                arr[t] = val
            stop = bool(cond_cell[0]) if cond_cell is not None else False
            for c in clear:
                c[0] = None
            if stop:
                steps_done = t + 1
                break
        for cell in cells:
            cell[0] = None
        for j in range(M):
            if info.keep[j]:
                out = bufs[j][:info.n_init(j) + steps_done]
            else:
                win = bufs[j]
                out = np.empty((len(win),) + np.shape(win[0]), dtype=node.outputs[j].dtype)
                for i, w in enumerate(win):
                    out[i] = w
            output_storage[j][0] = out
        for i in range(K):
            arr = nitsot[i]
            if arr is None:  # no step ran: the per-step shape is unknown until one does
                arr = self._empty_nitsot(node, i, inputs)
            output_storage[M + i][0] = arr[:steps_done]

    def _empty_nitsot(self, node: Apply, i: int, inputs: Sequence[Any]) -> np.ndarray:
        out = node.outputs[self.info.n_states + i]
        return np.empty((0,) + (0,) * (out.ndim - 1), dtype=out.dtype)

    def _shape_msg(self, label: str, t: int, got: tuple, want: tuple) -> str:
        return (f"{self.info.name}: {label} has shape {got} at step {t}, but its initial value "
                f"or earlier steps have shape {want}; every step must return the same shape")

    # -- shapes and gradients ---------------------------------------------------------------
    def infer_shape(self, fgraph, node: Apply, input_shapes: list) -> list[tuple]:
        info = self.info
        n = node.inputs[0]
        out = []
        for j in range(info.n_states):
            init_shape = input_shapes[1 + info.n_seqs + j]
            n_init = T.constant(info.n_init(j), dtype="int64")
            if info.as_while:
                lead = node.outputs[j].shape[0]
            elif info.keep[j]:
                lead = n_init + n
            else:
                lead = n_init
            out.append((lead,) + tuple(init_shape[1:]))
        for i in range(info.n_nitsot):
            o = node.outputs[info.n_states + i]
            lead = o.shape[0] if info.as_while else n
            rest = per_step_dims(node, info.n_states + i)
            out.append((lead,) + (rest if rest is not None else
                                  tuple(o.shape[d] for d in range(1, o.ndim))))
        return out

    def L_op(self, inputs, outputs, output_grads):
        """Back-propagation through time: a second loop, run backwards (grad.py)."""
        return scan_grad(self, inputs, outputs, output_grads)

    def host_loop(self, inner_inputs: Sequence[Variable], inner_outputs: Sequence[Variable],
                  info: ScanInfo) -> "Scan":
        """A host loop over another body, with this op's mode: what the gradient builds (the
        backward loop, the full-history copy of the forward one), for a subclass's node too
        (the GPU's loop is placed later, like any loop)."""
        return Scan(inner_inputs, inner_outputs, info, self.mode)

    def connection_pattern(self, node: Apply) -> list[list[bool]]:
        pattern = [[True] * len(node.outputs) for _ in node.inputs]
        pattern[0] = [False] * len(node.outputs)
        return pattern


def _simple(exc: BaseException) -> bool:
    """Whether `exc`'s class can be rebuilt from a message alone."""
    try:
        type(exc)("probe")
        return True
    # a constructor that rejects a lone message may raise anything (TypeError for a missing
    # argument, whatever a custom __init__ raises): then the body's error is re-raised as it
    # is, so this answer must never raise in its place
    except Exception:
        return False
