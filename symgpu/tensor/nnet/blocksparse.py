"""Theano's `theano.tensor.nnet.blocksparse`: products of selected blocks of a block matrix.

A block weight tensor W has shape (iBlocks, oBlocks, iSize, oSize): W[i, j] is the
(iSize, oSize) block linking input block i to output block j. For a minibatch of `batch`
examples, each example uses `iWin` of the input blocks (their indices in `inputIdx`,
(batch, iWin); their values in h, (batch, iWin, iSize)) and computes `oWin` of the output
blocks (their indices in `outputIdx`, (batch, oWin)).

- `SparseBlockGemv` (`sparse_block_gemv`), inputs (o, W, h, inputIdx, outputIdx)::

      out[b, j] = o[b, j] + sum_i dot(h[b, i], W[inputIdx[b, i], outputIdx[b, j]])

  o is (batch, oWin, oSize) and the result has o's type.
- `SparseBlockOuter` (`sparse_block_outer`), inputs (o, x, y, xIdx, yIdx, alpha=1)::

      out = o;  out[xIdx[b, i], yIdx[b, j]] += alpha * outer(x[b, i], y[b, j])

  for every b, i, j (a block selected several times receives every term); o is
  (xBlocks, yBlocks, xSize, ySize). It is the gradient of SparseBlockGemv wrt W.
- `sparse_block_dot(W, h, inputIdx, b, outputIdx)`: SparseBlockGemv with the biases
  b[outputIdx] (b: (oBlocks, oSize)) as o; h may also be one example (iWin, iSize) with
  vector indices (the result then is (1, oWin, oSize), as Theano's).

`inplace=True` variants (`sparse_block_gemv_inplace`, `sparse_block_outer_inplace`) overwrite
o (destroy_map {0: [0]}); a pass after the in-place pass switches the plain ops to them
where o may be overwritten. Indices must lie in [0, blocks); shapes that do not agree and
indices out of range raise ValueError / IndexError at run time.

Gradients as Theano's: SparseBlockGemv's wrt o is the output gradient g, wrt W
`SparseBlockOuter(zeros_like(W), h, g, inputIdx, outputIdx)`, wrt h
`SparseBlockGemv(zeros_like(h), W.dimshuffle(1, 0, 3, 2), g, outputIdx, inputIdx)`; no
gradient flows to the integer indices (Theano: undefined; `T.grad` wrt them gives zeros, as
for any integer input). SparseBlockOuter has no gradient (Theano defines none).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op
from symgpu.graph.rewriting.inplace import register_first_input_inplace
from symgpu.scalar.dtypes import is_int
from symgpu.tensor.extra_funcs import take
from symgpu.tensor.math import zeros_like
from symgpu.tensor.type import TensorVariable, as_tensor_variable, constant

__all__ = ["SparseBlockGemv", "SparseBlockOuter", "sparse_block_gemv",
           "sparse_block_gemv_inplace", "sparse_block_outer", "sparse_block_outer_inplace",
           "sparse_block_dot"]


def _tensor(v: Any, ndim: int, what: str, name: str) -> TensorVariable:
    v = as_tensor_variable(v)
    if v.ndim != ndim:
        raise TypeError(f"{what}: {name} must be a {ndim}-d tensor, got {v} with {v.ndim} "
                        f"dimensions ({v.type})")
    return v


def _index(v: Any, what: str, name: str) -> TensorVariable:
    v = _tensor(v, 2, what, name)
    if not is_int(v.dtype):
        raise TypeError(f"{what}: {name} must hold integers (block indices), got {v} "
                        f"({v.type})")
    return v


def _check_shapes(what: str, checks: list) -> None:
    for ok, message in checks:
        if not ok:
            raise ValueError(f"{what}: {message}")


def _check_range(what: str, name: str, idx: np.ndarray, n: int) -> None:
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"{what}: {name} holds block indices outside [0, {n}): "
                         f"min {idx.min()}, max {idx.max()}")


class SparseBlockGemv(Op):
    """o + the products of the selected blocks of W with the pieces of h (module docstring);
    inputs (o, W, h, inputIdx, outputIdx) of shapes (batch, oWin, oSize),
    (iBlocks, oBlocks, iSize, oSize), (batch, iWin, iSize), (batch, iWin), (batch, oWin)."""

    __props__ = ("inplace",)

    def __init__(self, inplace: bool = False):
        self.inplace = bool(inplace)
        self.destroy_map = {0: [0]} if self.inplace else {}

    def __str__(self) -> str:
        return f"SparseBlockGemv{{{'inplace' if self.inplace else 'no_inplace'}}}"

    def make_node(self, o: Any, W: Any, h: Any, inputIdx: Any, outputIdx: Any) -> Apply:
        what = "SparseBlockGemv"
        o = _tensor(o, 3, what, "the output o (batch, oWin, oSize)")
        W = _tensor(W, 4, what, "the weights W (iBlocks, oBlocks, iSize, oSize)")
        h = _tensor(h, 3, what, "the input h (batch, iWin, iSize)")
        inputIdx = _index(inputIdx, what, "inputIdx (batch, iWin)")
        outputIdx = _index(outputIdx, what, "outputIdx (batch, oWin)")
        return Apply(self, [o, W, h, inputIdx, outputIdx], [o.type()])

    def perform(self, node, inputs, output_storage):
        o, W, h, iIdx, oIdx = inputs
        what = str(self)
        _check_shapes(what, [
            (h.shape[0] == o.shape[0] == iIdx.shape[0] == oIdx.shape[0],
             f"the batch sizes differ: o {o.shape}, h {h.shape}, inputIdx {iIdx.shape}, "
             f"outputIdx {oIdx.shape}"),
            (iIdx.shape[1] == h.shape[1],
             f"inputIdx {iIdx.shape} must be (batch, iWin) for h {h.shape}"),
            (oIdx.shape[1] == o.shape[1],
             f"outputIdx {oIdx.shape} must be (batch, oWin) for o {o.shape}"),
            (W.shape[2] == h.shape[2],
             f"W's blocks {W.shape[2:]} must have h's block size {h.shape[2]} rows"),
            (W.shape[3] == o.shape[2],
             f"W's blocks {W.shape[2:]} must have o's block size {o.shape[2]} columns"),
        ])
        _check_range(what, "inputIdx", iIdx, W.shape[0])
        _check_range(what, "outputIdx", oIdx, W.shape[1])
        out = o if self.inplace else o.copy()
        for b in range(o.shape[0]):
            # (iWin, oWin, iSize, oSize): the blocks example b uses
            w = W[iIdx[b][:, None], oIdx[b][None, :]]
            out[b] += np.einsum("ik,ijkl->jl", h[b], w).astype(out.dtype, copy=False)
        output_storage[0][0] = out

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]

    def grad(self, inputs, output_grads):
        o, W, h, inputIdx, outputIdx = inputs
        (go,) = output_grads
        outer = SparseBlockOuter(self.inplace)
        gemv = SparseBlockGemv(self.inplace)
        Wgrad = outer(zeros_like(W), h, go, inputIdx, outputIdx)
        hgrad = gemv(zeros_like(h), W.dimshuffle(1, 0, 3, 2), go, outputIdx, inputIdx)
        # the indices are integers: no gradient flows to them (Theano: grad_undefined; here
        # the package's convention for integer-valued inputs, as symgpu.tensor cannot import
        # symgpu.gradient)
        return [go, Wgrad, hgrad, None, None]


class SparseBlockOuter(Op):
    """o plus alpha times the outer products of the pieces of x and y, added at the selected
    blocks (module docstring); inputs (o, x, y, xIdx, yIdx, alpha) of shapes
    (xBlocks, yBlocks, xSize, ySize), (batch, xWin, xSize), (batch, yWin, ySize),
    (batch, xWin), (batch, yWin) and a scalar (default 1)."""

    __props__ = ("inplace",)

    def __init__(self, inplace: bool = False):
        self.inplace = bool(inplace)
        self.destroy_map = {0: [0]} if self.inplace else {}

    def __str__(self) -> str:
        return f"SparseBlockOuter{{{'inplace' if self.inplace else 'no_inplace'}}}"

    def make_node(self, o: Any, x: Any, y: Any, xIdx: Any, yIdx: Any,
                  alpha: Any = None) -> Apply:
        what = "SparseBlockOuter"
        o = _tensor(o, 4, what, "o (xBlocks, yBlocks, xSize, ySize)")
        x = _tensor(x, 3, what, "x (batch, xWin, xSize)")
        y = _tensor(y, 3, what, "y (batch, yWin, ySize)")
        xIdx = _index(xIdx, what, "xIdx (batch, xWin)")
        yIdx = _index(yIdx, what, "yIdx (batch, yWin)")
        alpha = (constant(np.asarray(1.0, dtype="float32")) if alpha is None
                 else _tensor(alpha, 0, what, "alpha"))
        return Apply(self, [o, x, y, xIdx, yIdx, alpha], [o.type()])

    def perform(self, node, inputs, output_storage):
        o, x, y, xIdx, yIdx, alpha = inputs
        what = str(self)
        _check_shapes(what, [
            (x.shape[0] == y.shape[0] == xIdx.shape[0] == yIdx.shape[0],
             f"the batch sizes differ: x {x.shape}, y {y.shape}, xIdx {xIdx.shape}, "
             f"yIdx {yIdx.shape}"),
            (xIdx.shape[1] == x.shape[1], f"xIdx {xIdx.shape} must be (batch, xWin) for x "
                                          f"{x.shape}"),
            (yIdx.shape[1] == y.shape[1], f"yIdx {yIdx.shape} must be (batch, yWin) for y "
                                          f"{y.shape}"),
            (o.shape[2:] == (x.shape[2], y.shape[2]),
             f"o's blocks {o.shape[2:]} must be (xSize, ySize) = {(x.shape[2], y.shape[2])}"),
        ])
        _check_range(what, "xIdx", xIdx, o.shape[0])
        _check_range(what, "yIdx", yIdx, o.shape[1])
        out = o if self.inplace else o.copy()
        # (batch, xWin, yWin, xSize, ySize) outer products, added block by block (np.add.at:
        # a block selected several times receives every term)
        terms = alpha * (x[:, :, None, :, None] * y[:, None, :, None, :])
        np.add.at(out, (xIdx[:, :, None], yIdx[:, None, :]), terms.astype(out.dtype, copy=False))
        output_storage[0][0] = out

    def infer_shape(self, fgraph, node, input_shapes):
        return [tuple(input_shapes[0])]


sparse_block_gemv = SparseBlockGemv(False)
sparse_block_gemv_inplace = SparseBlockGemv(True)
sparse_block_outer = SparseBlockOuter(False)
sparse_block_outer_inplace = SparseBlockOuter(True)


def sparse_block_dot(W: Any, h: Any, inputIdx: Any, b: Any, outputIdx: Any) -> TensorVariable:
    """b[outputIdx] + the products of the selected blocks of W (iBlocks, oBlocks, iSize,
    oSize) with the pieces of h (batch, iWin, iSize): SparseBlockGemv with the biases of the
    selected output blocks (b: (oBlocks, oSize)) as o; (batch, oWin, oSize). One example
    (h (iWin, iSize), vector indices) gives a (1, oWin, oSize) result."""
    W, h, b = as_tensor_variable(W), as_tensor_variable(h), as_tensor_variable(b)
    inputIdx, outputIdx = as_tensor_variable(inputIdx), as_tensor_variable(outputIdx)
    if inputIdx.ndim != h.ndim - 1 or outputIdx.ndim != inputIdx.ndim:
        raise TypeError(f"sparse_block_dot: inputIdx and outputIdx must have one dimension "
                        f"fewer than h ({h.ndim}-d), got {inputIdx.ndim}-d and "
                        f"{outputIdx.ndim}-d")
    if h.ndim == 2:
        h = h.dimshuffle("x", 0, 1)
        inputIdx = inputIdx.dimshuffle("x", 0)
        outputIdx = outputIdx.dimshuffle("x", 0)
    return sparse_block_gemv(take(b, outputIdx, axis=0), W, h, inputIdx, outputIdx)


# ------------------------------------------------------------------------ in-place pass

#: switches SparseBlockGemv/SparseBlockOuter nodes whose o may be overwritten (an
#: intermediate read by nobody else) to their in-place variants
BLOCKSPARSE_INPLACE = register_first_input_inplace("blocksparse_inplace", 75.2,
                                                   (SparseBlockGemv, SparseBlockOuter))
make_blocksparse_inplace = BLOCKSPARSE_INPLACE.apply
