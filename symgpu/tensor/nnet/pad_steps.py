"""PadSteps: a sequence (steps, ...) padded with zero steps to a bucket (a multiple of `q`,
or of an eighth of its length's power of two where more: ``bucket_length``) once its
length has been seen to vary between calls (scan_to_dnn_rnn's length buckets, issue 32).

Why: a training step whose sequence length changes every call (variable-length minibatches)
gives every node after the sequence a new shape per call, so no CUDA graph of the step is
ever replayed: each call launches its kernels one by one. A recurrent layer whose outputs
are read only up to the true length (its states do not depend on later steps) can run over
a padded sequence instead, and then every node after the pad sees one of a few lengths
(the buckets). A program whose length never changes pays nothing: until a second length
arrives the op passes the sequence itself through, no copy (``view_map``).  On the GPU the
pad of a sequence passed whole is not captured (GpuPadSteps), so the graphs after it are
keyed by the bucket alone; the pad of a slice of a longer array (``x[:L]``) is captured
with its length as a graph parameter (GpuPadPrefix, keyed by StepBucket's bucket): both in
symgpu/gpu/ops/pad_steps.py.

The output's length is known when the op runs, not from its input's shape (it depends on
the lengths seen before): ``infer_shape`` says so (ShapeError), and shapes after it are read
from the padded value.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op, ShapeError
from symgpu.scalar.dtypes import is_int
from symgpu.tensor.type import TensorType, as_tensor_variable

__all__ = ["PadSteps", "StepBuckets", "StepBucket", "bucket_length"]


def _bucket_size(op: Any, q: int) -> int:
    if int(q) < 1:
        raise ValueError(f"{type(op).__name__}: the bucket size must be >= 1, got {q}")
    return int(q)


def bucket_length(n: int, q: int) -> int:
    """`n` rounded up to a bucket: a multiple of `q`, or of an eighth of the largest power
    of two up to `n` where that is more (eight buckets an octave: at most 12.5% of padding,
    and a range of lengths twice as long costs eight graphs more, not twice as many:
    lengths 10..90 make 11 buckets, 7% of padding on average; four an octave, 9 and 10%)."""
    step = max(q, 1 << max(n.bit_length() - 4, 0))
    return -(-n // step) * step


class StepBuckets:
    """One node's memory of the lengths it has run: the padded length for the next call
    (``steps(n)``): `n` itself while every call had that length, else its bucket
    (:func:`bucket_length`)."""

    def __init__(self, q: int) -> None:
        self.q, self.first, self.varied = q, None, False

    @staticmethod
    def of(node: Apply, q: int) -> "StepBuckets":
        """The memory of ``node`` (a host op's, kept on its tag across calls)."""
        buckets = getattr(node.tag, "buckets", None)
        if buckets is None:
            buckets = node.tag.buckets = StepBuckets(q)
        return buckets

    def steps(self, n: int) -> int:
        if self.first is None:
            self.first = n
        elif n != self.first:
            self.varied = True
        return bucket_length(n, self.q) if self.varied else n


class PadSteps(Op):
    """x (steps, ...) -> (padded (steps', ...): x, then zero steps; steps', an int64 scalar):
    StepBuckets' length. Why the length as an output of its own: what reads it (the states'
    indices) then needs no read of the padded array's shape, so on the GPU it is known, on
    the host, where the pad ends its graph, not after the work that follows."""

    __props__ = ("q",)
    #: a length that needs no padding (one that has not varied, or one equal to its bucket)
    #: goes out as the sequence itself: no copy
    view_map = {0: [0]}

    def __init__(self, q: int) -> None:
        self.q = _bucket_size(self, q)

    def make_node(self, x: Any) -> Apply:
        x = as_tensor_variable(x)
        if x.ndim < 1:
            raise TypeError(f"{self}: needs a sequence (steps, ...), got {x.type}")
        out = TensorType(x.dtype, (False,) + x.type.broadcastable[1:])(name="padded")
        return Apply(self, [x], [out, TensorType("int64", ())(name="padded_steps")])

    def perform(self, node: Apply, inputs: list, outputs: list) -> None:
        x = np.asarray(inputs[0])
        buckets = StepBuckets.of(node, self.q)
        n = buckets.steps(x.shape[0])
        if n == x.shape[0]:
            out = x
        else:
            out = np.zeros((n,) + x.shape[1:], dtype=x.dtype)
            out[:x.shape[0]] = x
        outputs[0][0] = out
        outputs[1][0] = np.int64(n)

    def infer_shape(self, fgraph: Any, node: Apply, shapes: list) -> list:
        raise ShapeError(f"{self}: the padded length depends on the lengths earlier calls "
                         "had (StepBuckets), not on the input's shape alone")

    def connection_pattern(self, node: Apply) -> list[list[bool]]:
        return [[True, False]]

    def L_op(self, inputs: list, outputs: list, output_grads: list) -> list:
        return [output_grads[0][:inputs[0].shape[0]]]

    def __str__(self) -> str:
        return f"PadSteps{{{self.q}}}"


class StepBucket(Op):
    """n (an int scalar) -> (steps int64: StepBuckets' length for n, varied int8: whether
    lengths have varied, so that the pad copies): PadSteps' length rule apart from its copy,
    for a pad whose copy runs inside a CUDA graph with n as a graph parameter
    (symgpu/gpu/ops/pad_steps.py, GpuPadPrefix): the graph is keyed by (steps, varied),
    which a host op computes before it."""

    __props__ = ("q",)

    def __init__(self, q: int) -> None:
        self.q = _bucket_size(self, q)

    def make_node(self, n: Any) -> Apply:
        n = as_tensor_variable(n)
        if n.ndim != 0 or not is_int(n.dtype):
            raise TypeError(f"{self}: needs an integer scalar length, got {n.type}")
        return Apply(self, [n], [TensorType("int64", ())(name="padded_steps"),
                                 TensorType("int8", ())(name="steps_varied")])

    def perform(self, node: Apply, inputs: list, outputs: list) -> None:
        buckets = StepBuckets.of(node, self.q)
        n = int(inputs[0])
        if n < 0:
            raise ValueError(f"{self}: a negative length, {n}")
        outputs[0][0] = np.int64(buckets.steps(n))
        outputs[1][0] = np.int8(buckets.varied)

    def infer_shape(self, fgraph: Any, node: Apply, shapes: list) -> list:
        return [(), ()]

    def connection_pattern(self, node: Apply) -> list[list[bool]]:
        return [[False, False]]

    def grad(self, inputs: list, output_grads: list) -> list:
        return [None]       # an integer length: no gradient (as ARange's integer bounds)

    def __str__(self) -> str:
        return f"StepBucket{{{self.q}}}"
