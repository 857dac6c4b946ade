"""Tensor rewrites, one module per topic; importing this package registers them all.

basic       constant folding, useless ops, fill sinking, dimshuffles, shape lifting
shape_ops   Shape()[i] -> Shape_i, useless reshape/alloc/subtensor, known shapes
subtensor_merge  x[s1][s2] -> x[s] (Theano's local_subtensor_merge; applied by rewrites
            that slice after the canonical passes, not a pass of its own)
math        add/mul canonical forms, powers, sums, log1p/expm1
stabilize   softplus, sigmoid, log_softmax, stable crossentropies
sigm        sigmoid/exp algebra on products, greedy distribution (finite gradients)
mixed_precision  products in half under a mixed-precision policy (passes `mixed_bfloat16`,
            `mixed_float16`, 15; selected by the `mixed_precision` flag)
partial_sums  a flat add reads a partial sum computed anyway; elementwise work read through
            disjoint slices computed per slice (pass `partial_sums`, 19)
inc_serialize  add(inc(a, y0, s0), inc(b, y1, s1)) -> inc(inc(a + b, y0, s0), y1, s1),
            after scan_to_dnn_rnn, between the joins of slices that meet (3.45-3.47)
blas        dot -> Gemv/Gemm/Dot22 with scalings and updates folded in (pass `blas`, 20)
elemwise    elementwise fusion into Composite (pass `fusion`, 49)
inplace     in-place variants under the DestroyHandler (pass `inplace`, 75)
attention   hand-written attention (and its gradient) -> Attention (pass `fuse_attention`, 0.5)
theano_opt  Theano's tensor.opt helpers and rewriter classes; the Rebroadcast and Assert rewrites
"""
from symgpu.tensor.rewriting import basic, math, shape_ops, sigm, stabilize  # noqa: F401
from symgpu.tensor.rewriting import blas, elemwise, inplace, mixed_precision  # noqa: F401
from symgpu.tensor.rewriting import leading_dims, partial_sums  # noqa: F401
from symgpu.tensor.rewriting import attention, inc_serialize, theano_opt  # noqa: F401
