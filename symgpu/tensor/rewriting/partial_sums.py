"""Two rewrites that keep a recurrent step's pre-activation one product and one fused kernel
(the `partial_sums` pass, position 19: after canonicalisation, before BLAS at 20).

* `local_reuse_partial_sum`: canonicalisation flattens ``(a + b) + c`` into ``add(a, b, c)``
  even where ``a + b`` is read elsewhere too (an LSTM step's ``dot(x_t, W) + dot(h, U)``,
  which the backward loop saves): the sum is then computed twice, and each product has two
  readers, so neither folds into a Gemm.  Where another add of a strict sub-multiset of the
  inputs exists, the flat add reads it: ``add(add(a, b), c)``.
* `local_elemwise_into_slices`: an elementwise result read only through disjoint slices of
  one axis, each slice read only by elementwise work (the gates ``(pre + b)[:, k*H:(k+1)*H]``),
  is computed per slice, ``pre[:, s] + b[s]``: each piece then fuses into the kernel that
  reads it instead of being a launch (and an array) of its own.  No element is computed
  twice (the slices are disjoint), and where a slice feeds anything but elementwise work
  (a product) the whole result stays one kernel.
"""
from __future__ import annotations

from symgpu.graph.basic import Apply, Variable
from symgpu.graph.rewriting import RewriteGroup, node_rewriter, optdb
from symgpu.tensor.elemwise import Elemwise
from symgpu.tensor.rewriting.utils import ew, is_ew
from symgpu.tensor.subtensor import Slice, Subtensor

__all__ = ["partial_sums", "local_reuse_partial_sum", "local_elemwise_into_slices"]

partial_sums = RewriteGroup("partial_sums")
optdb.register("partial_sums", partial_sums, 19, "fast_run")


def _without(items: list[Variable], part: list[Variable]) -> list[Variable] | None:
    """`items` less one occurrence of each of `part` (by identity), or None if one is
    missing."""
    rest = list(items)
    for v in part:
        for k, r in enumerate(rest):
            if r is v:
                del rest[k]
                break
        else:
            return None
    return rest


@node_rewriter([Elemwise])
def local_reuse_partial_sum(fgraph, node: Apply) -> list[Variable] | None:
    """add(a, b, c) -> add(s, c) where s = add(a, b) is computed anyway (the largest such
    s)."""
    if not is_ew(node, "add") or len(node.inputs) < 3:
        return None
    out = node.outputs[0]
    best: tuple[Apply, list[Variable]] | None = None
    for v in node.inputs:
        for client, _ in fgraph.clients.get(v, ()):
            if client == "output" or client is node or not is_ew(client, "add") or \
                    not 2 <= len(client.inputs) < len(node.inputs) or \
                    client.outputs[0].dtype != out.dtype:
                continue
            rest = _without(list(node.inputs), list(client.inputs))
            if rest is not None and (best is None or len(client.inputs) > len(best[0].inputs)):
                best = (client, rest)
    if best is None:
        return None
    new = ew("add", best[0].outputs[0], *best[1])
    return [new] if new.type == out.type else None


def _slice_axis(op: Subtensor, ndim: int) -> tuple[int, int, int | None] | None:
    """(axis, start, stop) of a constant, step-1 slice of one axis (the others whole), stop
    None for 'to the end'; None for any other index."""
    if op._const is None or len(op.idx_list) > ndim:
        return None
    cut = None
    for axis, e in enumerate(op.idx_list):
        if not isinstance(e, Slice) or e.step not in (None, 1):
            return None
        if e.start in (None, 0) and e.stop is None:
            continue
        start = 0 if e.start is None else e.start
        if cut is not None or start < 0 or (e.stop is not None and not 0 <= start <= e.stop):
            return None
        cut = (axis, start, e.stop)
    return cut


def _disjoint(cuts: list[tuple[int, int, int | None]]) -> bool:
    if len({axis for axis, _, _ in cuts}) != 1:
        return False
    spans = sorted((start, float("inf") if stop is None else stop) for _, start, stop in cuts)
    return all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def _elemwise_readers(fgraph, var: Variable) -> bool:
    """Whether only elementwise nodes read `var` (they fuse with the piece: in a recurrent
    step's gradient several read each gate, all in one kernel)."""
    clients = fgraph.clients.get(var, ())
    return bool(clients) and all(c != "output" and isinstance(c.op, Elemwise) for c, _ in clients)


@node_rewriter([Elemwise, Subtensor])
def local_elemwise_into_slices(fgraph, node: Apply) -> dict | None:
    """(elemwise(x, y))[s_k] -> elemwise(x[s_k], y[s_k]) for each of the disjoint slices that
    are the result's only readers (see the module docstring).  Also tried from a slice (a
    new slice of a cast the bias add was distributed over: the cast goes next)."""
    if type(node.op) is Subtensor:
        node = node.inputs[0].owner
        if node is None or not isinstance(node.op, Elemwise):
            return None
    if len(node.outputs) != 1 or node.outputs[0].ndim == 0 or \
            any(v.ndim != node.outputs[0].ndim for v in node.inputs):
        return None
    out = node.outputs[0]
    clients = fgraph.clients.get(out, ())
    if not clients or any(c == "output" or type(c.op) is not Subtensor for c, _ in clients):
        return None
    cuts = [_slice_axis(c.op, out.ndim) for c, _ in clients]
    if any(cut is None for cut in cuts) or not _disjoint(cuts):   # type: ignore[arg-type]
        return None
    axis = cuts[0][0]                                              # type: ignore[index]
    if out.broadcastable[axis] or \
            not all(_elemwise_readers(fgraph, c.outputs[0]) for c, _ in clients):
        return None
    replaced = {}
    for (client, _), (_, start, stop) in zip(clients, cuts):     # type: ignore[misc]
        index = tuple(slice(start, stop) if d == axis else slice(None) for d in range(axis + 1))
        pieces = [v if v.broadcastable[axis] else v[index] for v in node.inputs]
        new = node.op(*pieces)
        if new.type != client.outputs[0].type:
            return None
        replaced[client.outputs[0]] = new
    return replaced


partial_sums.register(local_reuse_partial_sum)
partial_sums.register(local_elemwise_into_slices)
