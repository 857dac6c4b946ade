"""Random sparse matrices (Theano's `theano.sparse.sandbox.sp2`): Poisson counts at a sparse
matrix's stored values, binomial counts of a given shape, multinomial counts per row.

As Theano's, these ops draw from NumPy's global generator (`numpy.random.seed` makes them
repeat), so two calls with the same inputs give different results: they sit outside the
deterministic random streams of symgpu.tensor.random (Philox); they are never
constant-folded (equal draws of equal inputs merge, as in Theano). No gradient flows through a draw (symgpu's convention for random
ops: None)."""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as ssp

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.scalar.dtypes import is_float
from symgpu.tensor.type import as_tensor_variable
from symgpu.sparse.type import SparseType, all_dtypes, as_sparse_variable, describe, sparse_formats

__all__ = ["Poisson", "poisson", "Binomial", "csr_fbinomial", "csc_fbinomial", "csr_dbinomial",
           "csc_dbinomial", "Multinomial", "multinomial"]


def _is_integer(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


class _Draw(Op):
    """A draw from NumPy's global generator: never constant-folded."""

    _no_constant_folding = True

    def grad(self, inputs, output_grads):
        return [None] * len(inputs)


class Poisson(_Draw):
    """x -> a sparse matrix with x's pattern holding Poisson(x's value) counts (in x's
    dtype), stored zeros then removed."""

    __props__ = ()

    def make_node(self, x: Any) -> Apply:
        try:
            x = as_sparse_variable(x)
        except TypeError as exc:
            raise TypeError(f"Poisson: x: {exc}") from None
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, out):
        (x,) = inputs
        if (x.data < 0).any():
            raise ValueError(f"Poisson: the means must be >= 0 ({describe(x)})")
        z = x.copy()
        z.data = np.asarray(np.random.poisson(z.data), dtype=x.dtype)
        z.eliminate_zeros()
        out[0][0] = z

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[0]]


poisson = Poisson()


class Binomial(_Draw):
    """(n, p, shape) -> a sparse matrix of `format` and `dtype` of the given shape holding
    binomial(n, p) counts (n an integer, p a float, shape an integer 2-vector)."""

    __props__ = ("format", "dtype")

    def __init__(self, format: str, dtype: str):
        if format not in sparse_formats or str(dtype) not in all_dtypes:
            raise ValueError(f"Binomial: format must be one of {sparse_formats} and dtype one "
                             f"of {all_dtypes}, got {format!r}, {dtype!r}")
        self.format, self.dtype = format, str(dtype)

    def make_node(self, n: Any, p: Any, shape: Any) -> Apply:
        n, p, shape = (as_tensor_variable(v) for v in (n, p, shape))
        if not _is_integer(n.dtype) or not is_float(p.dtype) or not _is_integer(shape.dtype) \
                or shape.ndim != 1:
            raise TypeError(f"Binomial: n must be integer, p float and shape an integer vector, "
                            f"got n {n.type}, p {p.type}, shape {shape.type}")
        return Apply(self, [n, p, shape], [SparseType(self.format, self.dtype)()])

    def perform(self, node, inputs, out):
        n, p, shape = inputs
        if len(shape) != 2:
            raise ValueError(f"Binomial: shape must have 2 values, got {tuple(shape)}")
        draws = np.random.binomial(n, p, size=tuple(int(s) for s in shape))
        out[0][0] = SparseType.format_cls[self.format](draws, dtype=self.dtype)

    def connection_pattern(self, node):
        return [[True], [True], [False]]

    def infer_shape(self, fgraph, node, input_shapes):
        shape = node.inputs[2]
        return [(shape[0], shape[1])]


csr_fbinomial = Binomial("csr", "float32")
csc_fbinomial = Binomial("csc", "float32")
csr_dbinomial = Binomial("csr", "float64")
csc_dbinomial = Binomial("csc", "float64")


class Multinomial(_Draw):
    """(n, p) -> a sparse matrix with p's pattern: row i holds multinomial(n_i, row i's stored
    probabilities) counts (n a scalar for every row or a vector, one per row; each row of p
    sums to one)."""

    __props__ = ()

    def make_node(self, n: Any, p: Any) -> Apply:
        n = as_tensor_variable(n)
        try:
            p = as_sparse_variable(p)
        except TypeError as exc:
            raise TypeError(f"Multinomial: p: {exc}") from None
        if n.ndim > 1 or not _is_integer(n.dtype):
            raise TypeError(f"Multinomial: n must be an integer scalar or vector, got {n.type}")
        return Apply(self, [n, p], [p.type()])

    def perform(self, node, inputs, out):
        n, p = inputs
        rows = p.tocsr(copy=True) if p.format != "csr" else p.copy()
        if n.ndim == 1 and n.shape[0] != rows.shape[0]:
            raise ValueError(f"Multinomial: n has {n.shape[0]} values for the {rows.shape[0]} "
                             f"rows of p ({describe(p)})")
        counts = np.broadcast_to(n, (rows.shape[0],))
        for i in range(rows.shape[0]):
            k, l = rows.indptr[i], rows.indptr[i + 1]
            rows.data[k:l] = np.random.multinomial(int(counts[i]), rows.data[k:l])
        out[0][0] = rows if p.format == "csr" else rows.asformat(p.format)

    def infer_shape(self, fgraph, node, input_shapes):
        return [input_shapes[1]]


multinomial = Multinomial()
