"""Pickling: graphs, shared variables and compiled functions round-trip (every kind of op and
type), copy.deepcopy, and symgpu.misc.pkl_utils' zip format."""
import copy
import io
import os
import pickle
import zipfile

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu import function, shared
from symgpu.compile.io import In, Out
from symgpu.scalar.basic import SCALAR_OPS

from gpu_helpers import real_default_gpu, requires_gpu


def rng(seed=0):
    return np.random.default_rng(seed)


def roundtrip(obj, protocol=pickle.HIGHEST_PROTOCOL):
    return pickle.loads(pickle.dumps(obj, protocol=protocol))


# ---------------------------------------------------------------- one case per kind of op

_INT_ONLY = {"and_", "or_", "xor", "invert"}


def _scalar_case(name):
    op = SCALAR_OPS[name]
    n = 2 if op.nin < 0 else op.nin
    dtype = "int64" if name in _INT_ONLY else "float64"
    ins = [T.vector(f"x{i}", dtype=dtype) for i in range(n)]
    vals = [rng(i).integers(1, 5, 6) if dtype == "int64" else rng(i).uniform(0.5, 1.5, 6)
            for i in range(n)]
    from symgpu.tensor.elemwise import Elemwise
    return ins, Elemwise(op)(*ins), vals


SCALAR_CASES = sorted(SCALAR_OPS)


def _m(name="m", shape=(3, 4), seed=0):
    return T.dmatrix(name), rng(seed).standard_normal(shape)


class _LoopbackComm:
    """An mpi4py-like communicator for the MPI ops' pickling case: sends go nowhere,
    receives get ones."""

    class _Req:
        def __init__(self, buf=None):
            self.buf = buf

        def wait(self):
            if self.buf is not None:
                self.buf[...] = 1

    def Isend(self, buf, dest, tag):
        return self._Req()

    def Irecv(self, buf, source, tag):
        return self._Req(buf)


def _cases():
    """name -> () -> (inputs, outputs, values): every op family of symgpu.tensor."""
    cases = {}

    def add(name):
        def deco(fn):
            cases[name] = fn
            return fn
        return deco

    @add("blocksparse")
    def _():
        from symgpu.tensor.nnet.blocksparse import sparse_block_dot
        W, h, b = T.dtensor4("W"), T.dtensor3("h"), T.dmatrix("b")
        iIdx, oIdx = T.imatrix("iIdx"), T.imatrix("oIdx")
        r = rng(12)
        vals = [r.standard_normal((4, 3, 2, 5)), r.standard_normal((2, 2, 2)),
                np.array([[0, 3], [1, 1]], dtype="int32"), r.standard_normal((3, 5)),
                np.array([[2, 0, 1], [1, 2, 2]], dtype="int32")]
        out = sparse_block_dot(W, h, iIdx, b, oIdx)
        return [W, h, iIdx, b, oIdx], [out, *T.grad((out ** 2).sum(), [W, h, b])], vals

    @add("typed_list")
    def _():
        # deferred: as the other families' cases, the ops load with the case that uses them
        import symgpu.typed_list as tl
        x, e = tl.TypedListType(T.dvector)("x"), T.dvector("e")
        m = tl.make_list([e, e * 2])
        return [x, e], [x.append(e)[-1], x.extend(x)[1:][0], x.insert(0, e).reverse()[0],
                        x.remove(e)[0], x.ind(e), x.count(e), tl.length(x),
                        m.append(e).reverse()[0]], \
            [[rng(1).standard_normal(3), np.ones(3), rng(2).standard_normal(3)], np.ones(3)]

    @add("fft_sort_neighbours")
    def _():
        from symgpu.tensor.fft import irfft, rfft
        from symgpu.tensor.nnet.neighbours import images2neibs, neibs2images
        from symgpu.tensor.sort import topk_and_argtopk
        x, v = _m()
        im = T.dtensor4("im")
        vi = rng(11).standard_normal((1, 2, 4, 6))
        sp = rfft(x, norm="ortho")
        vals, idx = topk_and_argtopk(x, -2, axis=0)
        nb = images2neibs(im, (2, 3), (1, 1), mode="half")
        return [x, im], [sp, irfft(sp, norm="ortho"), T.grad((sp ** 2).sum(), x), vals, idx,
                         T.grad((vals ** 2).sum(), x), nb, T.grad((nb ** 2).sum(), im),
                         neibs2images(images2neibs(im, (2, 3)), (2, 3), im.shape)], [v, vi]

    @add("sparse")
    def _():
        from test_sparse import sparse_pickle_case
        return sparse_pickle_case()

    @add("conv3d")
    def _():
        # deferred: as the other families' cases, the ops load with the case that uses them
        from symgpu.tensor.nnet import conv3d
        from symgpu.tensor.signal.pool import pool_3d
        x, w = T.dtensor5("x"), T.dtensor5("w")
        vx, vw = rng(21).standard_normal((2, 2, 5, 4, 5)), rng(22).standard_normal((3, 2, 2, 3, 2))
        y = conv3d(x, w, border_mode="half", subsample=(1, 2, 1), filter_dilation=(2, 1, 1))
        mx = pool_3d(x, (2, 2, 3), ignore_border=False)
        av = pool_3d(x, (3, 2, 2), pad=(1, 1, 0), mode="average_exc_pad")
        gx, gw = T.grad((y ** 2).sum(), [x, w])
        gmax = T.grad((mx ** 2).sum(), x)
        return [x, w], [y, gx, gw, T.grad((av ** 2).sum(), x), gmax,
                        T.grad((gmax ** 2).sum(), x)], [vx, vw]

    @add("linalg")
    def _():
        from test_slinalg import linalg_pickle_case
        return linalg_pickle_case()

    @add("cast_and_fusion")
    def _():
        x, v = _m()
        return [x], [T.cast(T.exp(x) * 2 + T.sin(x), "float32"), T.cast(x > 0, "int8")], [v]

    @add("reductions")
    def _():
        x, v = _m()
        return [x], [x.sum(axis=0), x.prod(axis=1), x.max(axis=1), x.min(), T.argmax(x, axis=1),
                     T.mean(x), T.var(x, axis=0), T.std(x), T.any(x > 1), T.all(x > -5)], [v]

    @add("dot_family")
    def _():
        a, va = _m("a", (3, 4), 0)
        b, vb = _m("b", (4, 5), 1)
        y = T.dvector("y")
        vy = rng(2).standard_normal(4)
        c, vc = _m("c", (3, 5), 3)
        return [a, b, y, c], [T.dot(a, b), T.dot(a, y), T.dot(a, b) * 0.5 + c,
                              T.matmul(a, b), T.outer(y, y) + T.dot(b, b.T),
                              T.tensordot(a, b, axes=1)], [va, vb, vy, vc]

    @add("shape_ops")
    def _():
        x, v = _m()
        return [x], [x.reshape((4, 3)), T.flatten(x), x.T, x.dimshuffle(1, "x", 0), x.shape,
                     T.shape_i(x, 1), T.squeeze(x.dimshuffle("x", 0, 1)),
                     T.make_vector(x.shape[0], 7)], [v]

    @add("join_alloc_arange")
    def _():
        x, v = _m()
        n = T.lscalar("n")
        return [x, n], [T.concatenate([x, x], axis=1), T.stack([x, x]), T.alloc(1.5, n, 2),
                        T.zeros((n, 3)), T.ones(n), T.arange(n), T.zeros_like(x),
                        T.fill(x, 2.0)], [v, 3]

    @add("indexing")
    def _():
        x, v = _m()
        i = T.lvector("i")
        s = T.lscalar("s")
        return [x, i, s], [x[1:, ::2], x[s], x[i], x[i, 1:], T.set_subtensor(x[0], 9.0),
                           T.inc_subtensor(x[i], 1.0), T.inc_subtensor(x[:, s], 2.0)], \
            [v, np.array([2, 0, 2]), 1]

    @add("selection")
    def _():
        x, v = _m()
        return [x], [T.switch(x > 0, x, -x), T.where(x > 0, 1.0, x), T.clip(x, -0.5, 0.5),
                     T.maximum(x, 0), T.minimum(x, 0.1)], [v]

    @add("nnet")
    def _():
        x, v = _m()
        y = T.lvector("y")
        nn = T.nnet
        p = nn.softmax(x)
        return [x, y], [p, nn.log_softmax(x), nn.relu(x, 0.1), nn.sigmoid(x),
                        nn.categorical_crossentropy(p, y).mean(),
                        nn.binary_crossentropy(nn.sigmoid(x), (x > 0) * 1.0)], \
            [v, np.array([0, 3, 1])]

    @add("gradients")
    def _():
        x, v = _m()
        w = T.dvector("w")
        vw = rng(4).standard_normal(4)
        cost = (T.tanh(T.dot(x, w)) ** 2).sum() + T.nnet.softmax(x)[:, 0].sum()
        return [x, w], T.grad(cost, [x, w]) + [T.hessian((w ** 3).sum(), w)], [v, vw]

    @add("float32_and_ints")
    def _():
        f = T.fmatrix("f")
        i = T.imatrix("i")
        b = T.bvector("b")
        vf = rng(5).standard_normal((2, 3)).astype("float32")
        vi = rng(6).integers(-4, 4, (2, 3)).astype("int32")
        vb = np.array([1, -2, 3], dtype="int8")
        return [f, i, b], [f * i, i // 3, i % 3, T.invert(b), b & 6, f.sum(dtype="float64"),
                           T.isnan(f), T.cast(f, "bool")], [vf, vi, vb]

    @add("blas_matmul_broadcast_gradstops")
    def _():
        from symgpu.gradient import disconnected_grad, zero_grad
        from symgpu.tensor.type import TensorType
        a, va = _m("a", (3, 4), 0)
        b, vb = _m("b", (4, 5), 1)
        c, vc = _m("c", (3, 5), 3)
        t = T.dtensor3("t")
        vt = rng(7).standard_normal((2, 3, 3))
        r = T.dmatrix("r")
        vr = rng(8).standard_normal((1, 5))
        y = T.lvector("y")
        x = a.dimshuffle(0, 1)
        cost = T.nnet.categorical_crossentropy(T.nnet.softmax(x), y).sum()
        return [a, b, c, t, r, y], [
            (c * 2) + T.dot(a, b) * 0.5,                      # Gemm into an intermediate
            T.matmul(t, t),                                   # batched MatMul
            T.specify_broadcastable_as(r, TensorType("float64", (True, False))) + c,
            T.specify_broadcastable_as(T.specify_broadcastable_as(
                r, TensorType("float64", (True, False))), TensorType("float64", (False, False))),
            T.grad(cost, a),                                  # crossentropy's gradient op
            zero_grad(a) * 2 + disconnected_grad(a),
        ], [va, vb, vc, vt, vr, np.array([0, 3, 1])]

    @add("extra_ops")
    def _():
        x, v = _m()
        n = T.lscalar("n")
        cost = (T.sort(x, 0) * T.cumprod(x, 1)).sum() + T.repeat(x, 2, 0).sum() \
            + (T.diagonal(x) ** 2).sum() + T.diag(T.diag(x)).sum()
        return [x, n], [T.grad(cost, x), T.argsort(x), T.eye(n, 4, 1), T.nonzero(x > 0, True),
                        T.cumsum(x), T.bincount(T.argmax(x, axis=1)),
                        T.searchsorted(T.sort(x[0]), x)], [v, np.int64(3)]

    @add("random")
    def _():
        from symgpu.tensor.random.ops import (ArgsortKeys, CategoricalFromUniform,
                                              MultinomialFromUniform, PhiloxAdvance,
                                              PhiloxSample, PoissonFromUniform)
        state = T.vector("state", dtype="uint32")   # an input: every call draws the same
        p = T.dvector("p")
        u = PhiloxSample("uniform", "float64")(state, 3, 4)
        return [state, p], [
            u, PhiloxSample("normal", "float32")(state, 5), PhiloxAdvance("float64")(state, 3, 4),
            CategoricalFromUniform()(p, u), MultinomialFromUniform()(p.dimshuffle("x", 0), u[:, :1]),
            ArgsortKeys(2)(u), PoissonFromUniform("int32")(p.dimshuffle("x", 0) * 4, u[:, :3]),
        ], [np.array([1, 2, 3, 4], dtype="uint32"), np.array([0.2, 0.3, 0.5])]

    @add("conv_and_pool")
    def _():
        from symgpu.tensor.nnet import conv2d
        from symgpu.tensor.signal.pool import pool_2d
        x, w = T.dtensor4("x"), T.dtensor4("w")
        vx, vw = rng(9).standard_normal((2, 2, 6, 6)), rng(10).standard_normal((3, 2, 3, 3))
        y = conv2d(x, w, border_mode="half", subsample=(1, 2))
        mx = pool_2d(x, (2, 2), ignore_border=False)
        av = pool_2d(x, (3, 3), pad=(1, 1), mode="average_exc_pad")
        gx, gw = T.grad((y ** 2).sum(), [x, w])
        gmax = T.grad((mx ** 2).sum(), x)
        return [x, w], [y, gx, gw, T.grad((av ** 2).sum(), x), gmax,
                        T.grad((gmax ** 2).sum(), x)], [vx, vw]

    @add("ctc")
    def _():
        # deferred: as the other families' cases, the ops load with the case that uses them
        from symgpu.tensor.nnet.ctc import ctc
        a, lab, ln = T.dtensor3("acts"), T.imatrix("labels"), T.ivector("lengths")
        cost = ctc(a, lab, ln)
        va = rng(31).standard_normal((5, 2, 4))
        vl, vn = np.array([[1, 2, -1], [3, -1, 3]], "int32"), np.array([5, 4], "int32")
        return [a, lab, ln], [cost, T.grad(cost.sum(), a)], [va, vl, vn]

    @add("specify_shape")
    def _():
        x, v = _m()
        n = T.lscalar("n")
        y = T.specify_shape(x, (3, n))
        return [x, n], [y * 2, T.specify_shape(T.exp(x), (None, 4))], [v, 4]

    @add("io_load")
    def _():
        # deferred: as the other families' cases, the ops load with the case that uses them
        import tempfile
        from symgpu.tensor import io as tio
        path = os.path.join(tempfile.mkdtemp(prefix="symgpu-pickle-"), "a.npy")
        np.save(path, rng(32).standard_normal((3, 1)))
        p = tio.PathType()("path")
        x = tio.load(p, "float64", (False, True))
        return [p], [x * 2, tio.load(path, "float64", (False, True), mmap_mode="c").sum()], \
            [path]

    @add("pdb_breakpoint")
    def _():
        # deferred: as the other families' cases, the ops load with the case that uses them
        from symgpu.misc.breakpoint import PdbBreakpoint
        x, v = _m()
        y, z = PdbBreakpoint("big")(T.gt(x.sum(), 1e9), x, x * 3)
        return [x], [y + z], [v]

    @add("theano_corpus_ops")
    def _():
        # deferred: as the other families' cases, the ops load with the case that uses them
        from symgpu.gradient.stops import grad_clip, grad_scale, undefined_grad
        from symgpu.tensor.extra_ops import ArgSortOp, SortOp
        x, v = _m()
        a = T.lscalar("a")
        s = SortOp("quicksort")(grad_scale(grad_clip(x, -5.0, 5.0), 2.0), a)
        g = T.grad(s.sum(), x)
        return [x, a], [s, ArgSortOp("quicksort")(x, a), g, undefined_grad(x) * 2], [v, 1]

    @add("theano_tensor_basic_ops")
    def _():
        # deferred: as the other families' cases, the ops load with the case that uses them
        from symgpu.tensor import theano_basic as tb
        x, v = _m()
        p = T.lmatrix("p")
        a, b = tb.split(x, [1, 2], 2, axis=0)
        s = T.dscalar("s")
        outs = [tb.permute_row_elements(x, p), a * 2, b.sum(), tb.Default()(x, x * 2),
                tb.Rebroadcast((0, False))(x), tb.tensor_from_scalar(s) * 2,
                tb.scalar_from_tensor(s) + 1, tb.AllocEmpty("float64")(2, 3).shape]
        perm = np.array([np.random.default_rng(k).permutation(4) for k in range(3)])
        return [x, p, s], outs, [v, perm, 1.5]

    @add("theano_names_tensor_ops")
    def _():
        # deferred: as the other families' cases, the ops load with the case that uses them
        from symgpu.tensor.checks import Assert
        from symgpu.tensor.random.mrg_math import DotModulo
        x, v = _m()
        A, s = T.lmatrix("A"), T.ivector("s")
        m = T.constant(np.int32(7))
        from symgpu.tensor import index_ops as io
        outs = [Assert("positive")(x, T.gt(x.size, 0)) * 2, DotModulo()(A, s, m, A, s, m)]
        i = T.lvector("i")
        outs += [io.cpu_contiguous(x.T), io.Unique(True, True, True)(x)[2],
                 io.unravel_index(i, (2, 3))[1], io.ravel_multi_index((i, i), (3, 3)),
                 io.bartlett(i.size), io.fill_diagonal_offset(x, 2.0, 1)]
        from symgpu.tensor import mpi
        mpi.set_comm(_LoopbackComm())   # MPI ops: a receive gets ones, a send goes nowhere
        outs += [mpi.send(x, 0, 4), mpi.recv((3, 4), "float64", 0, 4) + x]
        return [x, A, s, i], outs, [v, np.array([[1, 2], [3, 4]]),
                                    np.array([5, 6], dtype="int32"), np.array([0, 2, 1])]

    @add("attention")
    def _():
        # deferred: as the other families' cases, the ops load with the case that uses them
        from symgpu.tensor.nnet.attention import scaled_dot_product_attention
        q, k, v = (T.tensor3(n) for n in "qkv")
        o = scaled_dot_product_attention(q, k, v, is_causal=True)
        vals = [rng(40 + i).standard_normal((2, 5, 4)) for i in range(3)]
        return [q, k, v], [o, T.grad(o.sum(), q)], vals

    @add("numpy_random_state")
    def _():
        # Theano's raw_random RandomFunction: a NumPy RandomState input, NumPy's draw out
        from symgpu.tensor.random.numpy_state import RandomFunction, random_state_type
        r, mu = random_state_type("r"), T.dvector("mu")
        x = RandomFunction("normal", T.dvector().type)(r, [3], mu, 1.0)[1]
        return [r, mu], [x + mu], [np.random.RandomState(5), np.array([0.0, 1.0, 2.0])]

    @add("cholesky_grad")
    def _():
        # deferred: as the other families' cases, the ops load with the case that uses them
        from symgpu.tensor.slinalg import Cholesky, CholeskyGrad
        x, d = T.dmatrix("x"), T.dmatrix("d")
        a = rng(7).standard_normal((3, 3))
        return [x, d], [CholeskyGrad()(x, Cholesky()(x), d)], [a @ a.T + 3 * np.eye(3),
                                                                rng(8).standard_normal((3, 3))]

    @add("dynamic_pool")
    def _():
        # pooling with graph-valued sizes (DynamicPool, DynamicPoolGrad)
        from symgpu.tensor.signal.pool import pool_2d
        x, w = T.dtensor4("x"), T.lvector("w")
        y = pool_2d(x, ws=w, stride=(1, 2), mode="max")
        a = pool_2d(x, ws=w, mode="average_exc_pad", ignore_border=False)
        outs = [y, T.grad(y.sum(), x), T.grad(a.sum(), x)]
        return [x, w], outs, [rng(9).permutation(60).reshape(1, 2, 5, 6) * 0.5,
                              np.array([2, 3])]

    @add("xent_softmax_1hot")
    def _():
        # advidx (issue 31): Theano's fused classifier op and its gradient op
        x, b, y = T.dmatrix("x"), T.dvector("b"), T.lvector("y")
        nll, sm, am = T.nnet.crossentropy_softmax_argmax_1hot_with_bias(x, b, y)
        outs = [nll, sm, am, T.nnet.crossentropy_softmax_1hot_with_bias_dx(nll, sm, y)]
        return [x, b, y], outs, [rng(9).standard_normal((3, 4)), rng(10).standard_normal(4),
                                 np.array([0, 3, 1])]

    @add("dnn_rnn")
    def _():
        # RNNBlock's host ops (issue 32): an LSTM layer and its gradient
        from symgpu.tensor.nnet.rnn import DnnRNN, rnn_layout
        w, x, h0 = T.dvector("w"), T.dtensor3("x"), T.dtensor3("h0")
        y, hy, cy = DnnRNN("lstm", "unidirectional", 1, 2)(w, x, h0, h0)
        size = rnn_layout("lstm", 2, 1, 3).size
        outs = [y, hy, cy, T.grad((y ** 2).sum() + hy.sum(), w)]
        return [w, x, h0], outs, [rng(11).standard_normal(size) * 0.3,
                                  rng(12).standard_normal((4, 2, 3)), np.zeros((1, 2, 2))]

    @add("pad_steps")
    def _():
        # scan_to_dnn_rnn's length buckets (issue 32): a sequence padded once lengths vary
        from symgpu.tensor.nnet.pad_steps import PadSteps
        x = T.dtensor3("x")
        y, steps = PadSteps(4)(x)
        return [x], [y, steps, T.grad((y ** 2).sum(), x)], [rng(13).standard_normal((5, 2, 3))]

    @add("step_bucket")
    def _():
        # the length rule of a pad captured with its readers (GpuPadPrefix's bucket)
        from symgpu.tensor.nnet.pad_steps import StepBucket
        n = T.lscalar("n")
        return [n], list(StepBucket(4)(n)), [np.int64(6)]

    return cases


CASES = _cases()


def _check_same(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert np.asarray(g).dtype == np.asarray(e).dtype
        np.testing.assert_array_equal(g, e)


def test_the_cases_cover_every_host_op_class():
    """Every concrete Op class of the host packages appears in a case above (a new op needs
    a case in `_cases`, so that its pickling is tested)."""
    import importlib
    from symgpu.graph.basic import ancestors
    from symgpu.graph.op import Op
    for m in ("math", "nnet", "shape", "basic", "blas", "subtensor", "elemwise"):
        importlib.import_module(f"symgpu.tensor.{m}")
    importlib.import_module("symgpu.gradient")

    def subclasses(c):
        for s in c.__subclasses__():
            yield s
            yield from subclasses(s)

    host = {c for c in subclasses(Op) if c.__module__.startswith(("symgpu.tensor", "symgpu.gradient"))}
    concrete = {c for c in host if not any(issubclass(o, c) and o is not c for o in host)}
    seen = set()
    for make in CASES.values():
        for mode in ("FAST_RUN", "FAST_COMPILE"):
            ins, outs, _ = make()
            seen |= {type(n.op) for n in function(ins, outs, mode=mode).maker.fgraph.toposort()}
            seen |= {type(v.owner.op) for v in ancestors(outs) if v.owner is not None}
    missing = sorted(f"{c.__module__}.{c.__name__}" for c in concrete - seen)
    assert not missing, f"add pickling cases for: {missing}"


@pytest.mark.parametrize("name", SCALAR_CASES)
def test_every_scalar_op_pickles_in_graphs_and_functions(name):
    ins, out, vals = _scalar_case(name)
    f = function(ins, out)
    expected = f(*vals)
    np.testing.assert_array_equal(roundtrip(f)(*vals), expected)
    ins2, out2 = roundtrip((ins, out))
    np.testing.assert_array_equal(function(ins2, out2)(*vals), expected)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("mode", ["FAST_RUN", "FAST_COMPILE"])
def test_functions_of_every_op_family_round_trip(name, mode):
    ins, outs, vals = CASES[name]()
    f = function(ins, outs, mode=mode)
    expected = f(*vals)
    g = roundtrip(f)
    _check_same(g(*vals), expected)
    assert g.maker.mode.name == mode
    # the loaded function is re-linked from the rewritten graph, not rewritten again
    assert sorted(map(str, g.maker.fgraph.toposort())) == sorted(map(str, f.maker.fgraph.toposort()))


@pytest.mark.parametrize("name", sorted(CASES))
def test_graphs_of_every_op_family_round_trip(name):
    ins, outs, vals = CASES[name]()
    expected = function(ins, outs)(*vals)
    ins2, outs2 = roundtrip((ins, outs))
    assert [str(v.type) for v in outs2] == [str(v.type) for v in outs]
    _check_same(function(ins2, outs2)(*vals), expected)
    # a rewritten FunctionGraph (with its destroy handler) pickles as well
    fg = function(ins, outs).maker.fgraph
    fg2 = roundtrip(fg)
    assert sorted(map(str, fg2.toposort())) == sorted(map(str, fg.toposort()))
    fg2.check_integrity()


@pytest.mark.parametrize("value", [np.arange(6.0).reshape(2, 3), np.float32(1.5), np.int64(3),
                                   np.array([True, False]), 2.5, 7])
def test_shared_variables_round_trip(value):
    s = shared(value, name="s")
    t = roundtrip(s)
    assert t.name == "s" and t.type == s.type and type(t) is type(s)
    np.testing.assert_array_equal(t.get_value(), s.get_value())
    assert np.asarray(t.get_value()).dtype == np.asarray(s.get_value()).dtype
    t.set_value(np.zeros_like(t.get_value()))  # the copy is independent
    np.testing.assert_array_equal(s.get_value(), np.asarray(value))


def test_function_with_updates_keeps_its_shared_variables_linked():
    w = shared(np.zeros(3), name="w")
    n = shared(0, name="n")
    x = T.dvector("x")
    lr = T.dscalar("lr")
    f = function([x, In(lr, value=0.5)], (w * x).sum(),
                 updates=[(w, w + lr * x), (n, n + 1)], name="step")
    f(np.ones(3), lr=1.0)
    g, w2, n2 = roundtrip((f, w, n))
    assert g.name == "step"
    g(np.ones(3) * 2)
    np.testing.assert_array_equal(w2.get_value(), 2 * np.ones(3))
    assert n2.get_value() == 2
    np.testing.assert_array_equal(w.get_value(), np.ones(3))  # the original is untouched
    assert n.get_value() == 1
    assert set(map(id, g.get_shared())) == {id(w2), id(n2)}


def test_function_options_survive():
    x = T.dvector("x")
    f = function([In(x, name="xx", value=np.ones(2))], Out(x * 2, borrow=True), name="named")
    f.trust_input = False
    g = roundtrip(f)
    np.testing.assert_array_equal(g(), [2.0, 2.0])
    np.testing.assert_array_equal(g(xx=np.ones(2) * 3), [6.0, 6.0])
    with pytest.raises(TypeError, match="xx"):
        g(yy=1)
    with pytest.raises(TypeError, match="bad argument"):
        g(np.ones((2, 2)))


def test_profiled_function_pickles_into_a_profiled_one():
    from symgpu.compile.profiling import ProfileStats
    x = T.dvector("x")
    f = function([x], x + 1, profile=ProfileStats(atexit_print=False))
    f(np.ones(2))
    g = roundtrip(f)
    assert g.profile is not None and g.profile is not f.profile
    g(np.ones(2))
    assert g.profile.fct_callcount == 1


def test_deepcopy_of_a_function_is_independent():
    w = shared(np.ones(2), name="w")
    x = T.dvector("x")
    f = function([x], w * x, updates=[(w, w + 1)])
    g = copy.deepcopy(f)
    np.testing.assert_array_equal(g(np.ones(2)), np.ones(2))
    np.testing.assert_array_equal(g(np.ones(2)), 2 * np.ones(2))
    np.testing.assert_array_equal(w.get_value(), np.ones(2))  # its own copy of w
    np.testing.assert_array_equal(f(np.ones(2)), np.ones(2))
    assert copy.deepcopy(w).get_value().tolist() == [2.0, 2.0]


def test_every_protocol():
    x = T.dvector("x")
    f = function([x], T.exp(x))
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        np.testing.assert_array_equal(roundtrip(f, protocol)(np.ones(2)), np.exp(np.ones(2)))


# ---------------------------------------------------------------- pkl_utils: zip + .npy

def test_pkl_utils_stores_arrays_as_npy_members(tmp_path):
    from symgpu.misc.pkl_utils import dump, load
    big = rng(0).standard_normal((100, 40))   # (the pickle also holds each pass's time)
    w = shared(big, name="w")
    b = shared(np.zeros(40), name="b")
    x = T.dmatrix("x")
    f = function([x], T.dot(x, w) + b, updates=[(b, b + 1)])
    path = tmp_path / "model.zip"
    with open(path, "wb") as fh:
        dump((f, w, b, {"epoch": 3, "extra": big[:2]}), fh)
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        assert "pkl" in names
        npys = [n for n in names if n.endswith(".npy")]
        assert len(npys) >= 3  # w, b and the plain array: not inside the pickle
        assert zf.getinfo("pkl").file_size < big.nbytes / 4
    with open(path, "rb") as fh:
        f2, w2, b2, meta = load(fh)
    assert meta["epoch"] == 3
    np.testing.assert_array_equal(meta["extra"], big[:2])
    np.testing.assert_array_equal(w2.get_value(), big)
    v = rng(1).standard_normal((2, 100))
    np.testing.assert_array_equal(f2(v), np.dot(v, big))
    np.testing.assert_array_equal(b2.get_value(), np.ones(40))


def test_pkl_utils_persistent_names_and_file_like_objects():
    from symgpu.misc.pkl_utils import dump, load
    w = shared(np.arange(3.0), name="weights")
    w_too = shared(np.ones(2), name="weights")
    buf = io.BytesIO()
    dump([w, w_too, w], buf)
    buf.seek(0)
    with zipfile.ZipFile(buf) as zf:
        assert sorted(zf.namelist()) == ["pkl", "weights.npy", "weights_2.npy"]
        np.testing.assert_array_equal(np.load(zf.open("weights.npy")), np.arange(3.0))
    buf.seek(0)
    a, b, a_again = load(buf)
    assert a is a_again
    np.testing.assert_array_equal(a.get_value(), np.arange(3.0))
    np.testing.assert_array_equal(b.get_value(), np.ones(2))
    with pytest.raises(ValueError, match="reserved"):
        dump(shared(np.ones(2), name="pkl"), io.BytesIO())


def test_strip_pickler_drops_traces_and_leaves_the_graph_alone():
    from symgpu.misc.pkl_utils import dump, load
    x = T.dvector("x")
    y = T.exp(x) + 1
    assert getattr(y.owner.tag, "trace", None)  # where the user built it
    buf = io.BytesIO()
    dump(y, buf)
    buf.seek(0)
    y2 = load(buf)
    assert not hasattr(y2.owner.tag, "trace")
    assert y.owner.tag.trace  # the saved graph keeps its traces
    np.testing.assert_array_equal(function([y2.owner.inputs[0].owner.inputs[0]], y2)(np.zeros(2)),
                                  [2.0, 2.0])


# ---------------------------------------------------------------- GPU shared variables

class FakeDeviceValue:
    """Stands for a GpuArray: a device value whose `get()` downloads it."""

    def __init__(self, host):
        self.host = np.array(host)
        self.shape, self.dtype = self.host.shape, self.host.dtype

    def get(self):
        return self.host.copy()


def _gpu_shared(context_name, host, name="gw"):
    from symgpu.compile.sharedvalue import Container
    from symgpu.gpu.placement.type import GpuArraySharedVariable, GpuArrayType
    gtype = GpuArrayType(str(host.dtype), (False,) * host.ndim, context_name)
    return GpuArraySharedVariable(gtype, None, name=name,
                                  container=Container(gtype, FakeDeviceValue(host), name))


@pytest.mark.parametrize("virtual", [True, False])
def test_gpu_shared_value_unpickles_on_the_host_without_that_gpu(virtual):
    from symgpu.gpu.runtime.context import register_context, unregister_context
    from symgpu.tensor.sharedvar import TensorSharedVariable
    from symgpu.tensor.type import TensorType
    host = np.arange(6, dtype="float32").reshape(2, 3)
    name = "pickle_virtual" if virtual else "pickle_absent"
    if virtual:
        register_context(name, device="cuda0", arch="sm_90")
    try:
        sv = _gpu_shared(name, host)
        t, t_again = roundtrip((sv, sv))
    finally:
        if virtual:
            unregister_context(name)
    assert type(t) is TensorSharedVariable and t is t_again
    assert t.type == TensorType("float32", (False, False)) and t.name == "gw"
    np.testing.assert_array_equal(t.get_value(), host)
    # and it works in host functions
    np.testing.assert_array_equal(function([], t * 2)(), host * 2)


def test_gpu_shared_value_goes_back_to_the_gpu_where_one_is_in_use(monkeypatch):
    import symgpu.gpu.placement.type as gtype_mod
    from gpu_helpers import FakeCtx
    monkeypatch.setattr(gtype_mod, "_unpickle_context", lambda name: FakeCtx())
    monkeypatch.setattr(gtype_mod.GpuArrayType, "filter",
                        lambda self, value, strict=False, allow_downcast=None:
                        FakeDeviceValue(value))
    host = np.arange(4, dtype="float32")
    sv = _gpu_shared("somegpu", host)
    t = roundtrip(sv)
    assert type(t) is gtype_mod.GpuArraySharedVariable and t.type == sv.type
    assert isinstance(t.container.storage[0], FakeDeviceValue)
    np.testing.assert_array_equal(t.get_value(), host)
    assert t.container is not sv.container


def test_gpu_shared_values_in_the_zip_format_are_npy_members():
    from symgpu.misc.pkl_utils import dump, load
    host = np.arange(5, dtype="float32")
    buf = io.BytesIO()
    dump(_gpu_shared("pickle_absent", host, name="gpu_w"), buf)
    buf.seek(0)
    with zipfile.ZipFile(buf) as zf:
        assert "gpu_w.npy" in zf.namelist()
    buf.seek(0)
    np.testing.assert_array_equal(load(buf).get_value(), host)


@requires_gpu
def test_gpu_function_and_shared_round_trip_on_a_real_gpu():
    from symgpu.gpu.placement.type import GpuArraySharedVariable
    with real_default_gpu():
        w = shared(np.arange(4, dtype="float32"), name="w")
        assert isinstance(w, GpuArraySharedVariable)
        x = T.fvector("x")
        f = function([x], T.exp(w) * x, updates=[(w, w + 1)])
        expected = f(np.ones(4, dtype="float32"))
        w.set_value(np.arange(4, dtype="float32"))
        g, w2 = roundtrip((f, w))
        assert isinstance(w2, GpuArraySharedVariable)
        np.testing.assert_allclose(g(np.ones(4, dtype="float32")), expected, rtol=1e-6)
        np.testing.assert_array_equal(w2.get_value(), np.arange(4) + 1)
        np.testing.assert_array_equal(w.get_value(), np.arange(4))


def test_gpu_function_loads_only_where_its_context_is_in_use():
    from symgpu.config import config
    from symgpu.gpu.placement.rewriting import virtual_context
    with config.change_flags(floatX="float32"):
        x = T.fvector("x")
        with virtual_context("pickle_dev"):
            from symgpu.gpu.placement.type import GpuArrayType
            g = GpuArrayType("float32", (False,), "pickle_dev")("g")
            f = function([g, x], T.exp(g) + x, name="on_gpu")
            assert any("Gpu" in type(n.op).__name__ for n in f.maker.fgraph.toposort())
            blob = pickle.dumps(f)
            again = pickle.loads(blob)  # re-linked where the context is in use
            assert [type(n.op).__name__ for n in again.maker.fgraph.toposort()] == \
                [type(n.op).__name__ for n in f.maker.fgraph.toposort()]
        # where that GPU is not in use, the function is compiled again for the host from
        # the graph it was given (Theano's unpickle_gpu_on_cpu)
        host = pickle.loads(blob)
        assert not any("Gpu" in type(n.op).__name__ for n in host.maker.fgraph.toposort())
        v = np.arange(3, dtype="float32")
        np.testing.assert_allclose(host(v, v), np.exp(v) + v, rtol=1e-6)
        # a maker that did not keep its source cannot fall back: the error says what to do
        f.maker.source = None
        with pytest.raises(RuntimeError, match="'on_gpu'.*GPU context 'pickle_dev'.*not in use"):
            pickle.loads(pickle.dumps(f))


def test_a_gpu_model_with_updates_loads_and_trains_on_the_host():
    """A training step compiled for a GPU, with a GPU shared weight, an update and a result
    kept on the device, pickled and loaded where no GPU is in use: a host function over a
    host shared variable, with the same results."""
    from symgpu import Out
    from symgpu.config import config
    from symgpu.gpu.placement.basic_ops import gpu_from_host
    from symgpu.gpu.placement.rewriting import virtual_context
    from symgpu.tensor.sharedvar import TensorSharedVariable
    host_w = np.arange(4, dtype="float32")
    with config.change_flags(floatX="float32"), virtual_context("pickle_train"):
        w = _gpu_shared("pickle_train", host_w, name="w")
        x = T.fvector("x")
        cost = ((w * x) ** 2).sum()
        f = function([x], [cost, Out(gpu_from_host(w * 2), borrow=True)],
                     updates=[(w, w - 0.1 * T.grad(cost, w))], name="train")
        assert any("Gpu" in type(n.op).__name__ for n in f.maker.fgraph.toposort())
        blob = pickle.dumps((f, w))
    g, w2 = pickle.loads(blob)
    assert isinstance(w2, TensorSharedVariable) and g.get_shared() == [w2]
    assert not any("Gpu" in type(n.op).__name__ for n in g.maker.fgraph.toposort())
    xv = np.ones(4, dtype="float32")
    c, doubled = g(xv)
    np.testing.assert_allclose(c, (host_w ** 2).sum())
    np.testing.assert_allclose(doubled, host_w * 2)
    np.testing.assert_allclose(w2.get_value(), host_w - 0.1 * 2 * host_w, rtol=1e-6)


def test_gpu_graphs_pickle_and_relink_under_a_virtual_context():
    from symgpu.config import config
    from symgpu.gpu.placement.rewriting import virtual_context
    with config.change_flags(floatX="float32"), virtual_context(None):
        a, b = T.fmatrix("a"), T.fmatrix("b")
        y, i = T.lvector("y"), T.lvector("i")
        p = T.nnet.softmax(T.dot(a, b))
        cost = T.nnet.categorical_crossentropy(p, y).mean()
        outs = [p, cost, a.sum(axis=0), a[i], T.inc_subtensor(a[i], 1.0),
                a.T.reshape((-1,)), T.concatenate([a, a]), T.grad(cost, b),
                T.argmax(a, axis=1), T.outer(a[0], a[1]) + a[:2, :2]]
        f = function([a, b, y, i], outs)
        names = sorted(type(n.op).__name__ for n in f.maker.fgraph.toposort())
        assert sum(n.startswith("Gpu") for n in names) >= 10
        g = pickle.loads(pickle.dumps(f))
        assert sorted(type(n.op).__name__ for n in g.maker.fgraph.toposort()) == names


def test_types_unpickled_in_another_process_hash_as_fresh_ones(tmp_path):
    """TensorType and GpuArrayType cache a hash of strings, which Python salts per process:
    an unpickled type must hash as a fresh one, or dict and set lookups miss it."""
    import os
    import subprocess
    import sys
    from symgpu.gpu.placement.type import GpuArrayType
    from symgpu.tensor.type import TensorType
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = tmp_path / "types.pkl"
    code = ("import pickle; import symgpu.tensor as T; from symgpu.gpu.placement.type import GpuArrayType; "
            "pickle.dump([T.TensorType('float32', (False, True)), "
            f"GpuArrayType('float32', (False,), 'dev0')], open({str(path)!r}, 'wb'))")
    env = dict(os.environ, PYTHONHASHSEED="4321",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=root, timeout=120)
    with open(path, "rb") as fh:
        tt, gt = pickle.load(fh)
    fresh = [TensorType("float32", (False, True)), GpuArrayType("float32", (False,), "dev0")]
    assert [tt, gt] == fresh
    assert [hash(tt), hash(gt)] == [hash(t) for t in fresh]



def test_gpu_images2neibs_graphs_and_functions_pickle_under_a_virtual_context():
    """GpuImages2Neibs and its gradient (issue 33): the ops, a lifted function and its graph
    round-trip; the loaded function is the same GPU graph, re-linked."""
    from symgpu.config import config
    from symgpu.gpu.ops.neighbours import GpuImages2Neibs, GpuImages2NeibsGrad
    from symgpu.gpu.placement.rewriting import virtual_context
    from symgpu.tensor.nnet.neighbours import images2neibs, neibs2images
    for op in (GpuImages2Neibs("wrap_centered"), GpuImages2NeibsGrad("full")):
        assert roundtrip(op) == op and hash(roundtrip(op)) == hash(op)
    with config.change_flags(floatX="float32"), virtual_context(None):
        x = T.ftensor4("x")
        nb = images2neibs(x, (3, 3), (1, 2), mode="half")
        outs = [nb, T.grad((nb ** 2).sum(), x),
                neibs2images(images2neibs(x, (2, 3)), (2, 3), x.shape)]
        f = function([x], outs)
        names = sorted(type(n.op).__name__ for n in f.maker.fgraph.toposort())
        assert {"GpuImages2Neibs", "GpuImages2NeibsGrad"} <= set(names), names
        g = roundtrip(f)
        assert sorted(type(n.op).__name__ for n in g.maker.fgraph.toposort()) == names
        modes = sorted(n.op.mode for n in g.maker.fgraph.toposort()
                       if isinstance(n.op, (GpuImages2Neibs, GpuImages2NeibsGrad)))
        assert modes == ["half", "half", "valid"], modes
        x2, outs2 = roundtrip((x, outs))
        assert [str(v.type) for v in outs2] == [str(v.type) for v in outs]
