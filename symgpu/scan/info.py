"""`ScanInfo`: a loop's layout (how many inputs and outputs of each kind, the taps, the flags).

Read by everything that builds or takes apart a loop: `scan()` (basic.py), the Scan op
(op.py), its backward loop (grad.py), the loop rewrites and the GPU's loop
(symgpu/gpu/ops/scan_op.py). The layout of the op's inputs and outputs is described in op.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ScanInfo", "ScanGradOf"]


@dataclass(frozen=True)
class ScanInfo:
    """The loop's layout: how many of each kind of input/output, the taps, and flags."""
    n_seqs: int
    state_taps: tuple[tuple[int, ...], ...]
    keep: tuple[bool, ...]
    n_nitsot: int
    n_nonseqs: int
    as_while: bool = False
    truncate_gradient: int = -1
    name: str = "scan"
    state_names: tuple[str, ...] = field(default=())
    nitsot_names: tuple[str, ...] = field(default=())
    #: a fallback copy (scan_to_dnn_rnn's loop for masks cuDNN cannot take): no rewrite
    #: replaces it by a library layer again, else compiling its branch would repeat the
    #: rewrite inside it without end
    keep_as_loop: bool = False

    @property
    def n_states(self) -> int:
        return len(self.state_taps)

    @property
    def n_taps(self) -> int:
        return sum(len(t) for t in self.state_taps)

    def n_init(self, j: int) -> int:
        return -min(self.state_taps[j])

    def state_label(self, j: int) -> str:
        nm = self.state_names[j] if j < len(self.state_names) and self.state_names[j] else None
        return f"output {j}" + (f" ({nm})" if nm else "")

    def nitsot_label(self, i: int) -> str:
        nm = self.nitsot_names[i] if i < len(self.nitsot_names) and self.nitsot_names[i] else None
        return f"output {self.n_states + i}" + (f" ({nm})" if nm else "")


@dataclass(frozen=True)
class ScanGradOf:
    """What a backward loop built by scan_grad (grad.py) computes, read by rewrites that
    replace a forward loop together with its gradient (dnn_rnn_match.py) instead of matching
    the backward body: the forward op it differentiates; for each forward state j,
    (j, position among the backward loop's sequences of j's output adjoint, reversed, or -1
    when the body does not read it, and what that adjoint is known to be: "zero", "last"
    (zero but at the last step) or "any"); and which forward state, non-sequence and
    sequence each of the backward loop's outputs (windows, running sums, per-step
    gradients, in that order) belongs to."""
    forward: object
    adjoints: tuple[tuple[int, int, str], ...]
    windows: tuple[int, ...]
    sums: tuple[int, ...]
    seq_grads: tuple[int, ...]
