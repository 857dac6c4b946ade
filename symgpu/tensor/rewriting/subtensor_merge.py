"""``x[s1][s2] -> x[s]``: two basic indexings composed into one (Theano's
`local_subtensor_merge`).

Why: a chain of slices reads one region of `x`; as one Subtensor it is one view (one
parameterised copy on the GPU), its bounds host arithmetic on `x`'s shape, and its result's
shape no longer passes through the intermediate's.  That matters where the intermediate's
shape changes from call to call and the result's does not: the last state of a loop,
``buffer[:n + 1][1:][-1]`` over a buffer padded to a bucket of lengths, is
``buffer[n]``, one shape for every length, so the CUDA graph reading it serves every call
of the bucket.  Only chains of integers and slices merge (a newaxis or an Ellipsis in either
index leaves them as written); the bounds come from `slices.merge_two_slices`, which turns an
index out of range of the intermediate into one out of range of `x` (the same IndexError
kind when the function runs).

Not a pass of its own: merged early, a loop's ``out[-1]`` (``buffer[1:][-1]``) would no
longer be the read that scan_save_mem and scan_to_dnn_rnn recognise as "only the last
state" (its index becomes symbolic).  A rewrite that builds a sliced variable after those
(scan_to_dnn_rnn's padded buffer) merges the reads of it with :func:`merge_reads`.
"""
from __future__ import annotations

from typing import Any, Sequence

from symgpu.graph.rewriting import node_rewriter
from symgpu.tensor.rewriting.slices import get_canonical_form_slice, merge_two_slices
from symgpu.tensor.subtensor import SYM, Slice, Subtensor, getitem

__all__ = ["local_subtensor_merge", "merged_index", "merge_reads"]


def _entries(idx_list: Sequence, inputs: Sequence) -> list | None:
    """The index as Python values: ints, slices of ints/None/variables, scalar variables;
    None when it holds a newaxis or an Ellipsis."""
    it = iter(inputs)
    out: list = []
    for e in idx_list:
        if e is None or e is Ellipsis:
            return None
        if isinstance(e, Slice):
            out.append(slice(*(next(it) if p == SYM else p for p in e)))
        elif e == SYM:
            out.append(next(it))
        else:
            out.append(e)
    return out


def _full(s: Any) -> bool:
    return isinstance(s, slice) and s.start is None and s.stop is None and s.step is None


def _sliced_length(s: slice, length: Any) -> Any:
    """How many elements slice `s` takes of an axis of `length` (from its canonical form,
    not from the sliced variable's shape: that would keep the intermediate computed)."""
    sl, _ = get_canonical_form_slice(s, length)
    return (sl.stop - sl.start + sl.step - 1) // sl.step


def merged_index(x: Any, first: list, second: list, shape: Sequence | None = None) -> tuple:
    """The index `s` with ``x[s] == x[first][second]``: each axis of `x` kept by a slice of
    `first` takes the next entry of `second` composed with it; axes `first` drops keep
    their index.  `shape`: `x`'s shape where the caller knows it in other terms than
    ``x.shape`` (so that the bounds need not wait for `x` to be computed)."""
    out: list = []
    k = 0                          # the axis of x[first] the next entry of `second` indexes
    for axis in range(x.ndim):
        s1 = first[axis] if axis < len(first) else slice(None)
        if not isinstance(s1, slice):
            out.append(s1)
            continue
        if k < len(second) and not _full(second[k]):
            n = x.shape[axis] if shape is None else shape[axis]
            out.append(merge_two_slices(s1, n, second[k], _sliced_length(s1, n)))
        else:
            out.append(s1)
        k += 1
    while out and _full(out[-1]):
        out.pop()
    return tuple(out)


def _merged(node: Any, shape: Sequence | None = None) -> Any:
    """``node``'s output as one Subtensor of what its input slices, or None."""
    mid = node.inputs[0]
    inner = mid.owner
    if inner is None or type(inner.op) is not Subtensor:
        return None
    first = _entries(inner.op.idx_list, inner.inputs[1:])
    second = _entries(node.op.idx_list, node.inputs[1:])
    if first is None or second is None:
        return None
    x = inner.inputs[0]
    out = getitem(x, merged_index(x, first, second, shape))
    return out if out.type == node.outputs[0].type else None


@node_rewriter([Subtensor])
def local_subtensor_merge(fgraph, node):
    """x[s1][s2] -> x[s] (integers and slices; see the module's docstring)."""
    out = _merged(node)
    return None if out is None else [out]


def merge_reads(fgraph, var, reason: str = "local_subtensor_merge",
                shape: Sequence | None = None) -> int:
    """Merge the Subtensors reading `var` (and those reading them) into `var`'s own, in
    place in `fgraph`: for a rewrite that builds a sliced variable after the canonical
    passes ran.  `shape`: the shape of what `var` slices, in terms known before it is
    computed (a padded buffer's length from the bucket).  Returns how many it merged."""
    merged = 0
    todo = [n for n, _ in fgraph.clients.get(var, []) if not isinstance(n, str)]
    while todo:
        node = todo.pop()
        if node not in fgraph.apply_nodes or type(node.op) is not Subtensor:
            continue
        out = _merged(node, shape)
        if out is None:
            continue
        fgraph.replace(node.outputs[0], out, reason=reason)
        merged += 1
        todo.extend(n for n, _ in fgraph.clients.get(out, []) if not isinstance(n, str))
    return merged
