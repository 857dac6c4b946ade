"""x[s1][s2] -> x[s] (symgpu/tensor/rewriting/subtensor_merge.py, Theano's
local_subtensor_merge, applied here to a graph by hand as the rewrites that use it do):
the merged graph holds one Subtensor and gives NumPy's values, its errors for indices out
of range, and its gradient."""
from __future__ import annotations

import numpy as np
import pytest

import symgpu
import symgpu.tensor as T
from symgpu.gradient import verify_grad
from symgpu.graph.fg import FunctionGraph
from symgpu.tensor.rewriting.subtensor_merge import local_subtensor_merge, merge_reads
from symgpu.tensor.subtensor import Subtensor

CHAINS = {
    "last of a tail": lambda x, n: x[1:][-1],
    "loop buffer": lambda x, n: x[:n + 1][1:][-1],
    "strided then reversed": lambda x, n: x[2:9:2][::-1],
    "reversed then sliced": lambda x, n: x[::-1][1:5],
    "two axes": lambda x, n: x[:, 1:][0, ::2],
    "index then slices": lambda x, n: x[3][1:][:, -2],
    "negative steps": lambda x, n: x[::-2][::-3],
    "bounds past the ends": lambda x, n: x[-20:30][n:][:-1],
    "symbolic step": lambda x, n: x[::n][1::2],
    "three deep": lambda x, n: x[1:][1:][n:],
}


def _merge_all(fg: FunctionGraph) -> int:
    """Merge every Subtensor chain of `fg` (to a fixed point); returns the Subtensors left."""
    changed = True
    while changed:
        changed = False
        for node in fg.toposort():
            if type(node.op) is Subtensor:
                out = local_subtensor_merge.transform(fg, node)
                if out:
                    fg.replace(node.outputs[0], out[0], reason="test")
                    changed = True
                    break
    return sum(1 for nd in fg.apply_nodes if type(nd.op) is Subtensor)


def _merged(inputs: list, output) -> tuple:
    """(the function of `output` with its Subtensor chains merged, Subtensors left)."""
    fg = FunctionGraph(inputs, [output])
    left = _merge_all(fg)
    return symgpu.function(fg.inputs, fg.outputs[0], on_unused_input="ignore"), left


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_a_chain_is_one_subtensor_with_numpys_values(name):
    chain = CHAINS[name]
    x, n = T.tensor3("x"), T.iscalar("n")
    fn, left = _merged([x, n], chain(x, n))
    assert left == 1
    xv = np.random.RandomState(0).rand(10, 5, 6).astype(symgpu.config.floatX)
    for nv in (1, 2, 3, 4, 7):
        np.testing.assert_array_equal(fn(xv, nv), chain(xv, nv))


def test_an_index_out_of_the_intermediate_raises_as_numpy_does():
    x, n = T.vector("x"), T.iscalar("n")
    fn, left = _merged([x, n], x[2:][n])
    assert left == 1
    xv = np.arange(6, dtype=symgpu.config.floatX)
    assert fn(xv, 3) == xv[2:][3] and fn(xv, -4) == xv[2:][-4]
    for bad in (4, 9, -5):
        with pytest.raises(IndexError):
            fn(xv, bad)
    empty, _ = _merged([x, n], x[:n][0])
    with pytest.raises(IndexError):
        empty(xv, 0)


def test_a_newaxis_is_left_as_written():
    x = T.matrix("x")
    fn, left = _merged([x], x[1:][None, 0])
    assert left == 2
    xv = np.ones((3, 2), dtype=symgpu.config.floatX)
    np.testing.assert_array_equal(fn(xv), xv[1:][None, 0])


def test_merge_reads_follows_the_readers_of_a_new_slice():
    """As scan_to_dnn_rnn uses it: the reads of a variable sliced after the canonical
    passes (buffer[:n + 1], read as [1:] then [-1]) merge into one index of the buffer."""
    x, n = T.tensor3("x"), T.iscalar("n")
    buf = x[:n + 1]
    fg = FunctionGraph([x, n], [buf[1:][-1], buf[1:]], clone=False)
    assert merge_reads(fg, buf) == 3     # each buf[1:], then the [-1] of the first
    subs = [nd for nd in fg.apply_nodes if type(nd.op) is Subtensor]
    assert subs and all(nd.inputs[0] is x for nd in subs)
    fn = symgpu.function([x, n], fg.outputs)
    xv = np.random.RandomState(2).rand(6, 2, 3).astype(symgpu.config.floatX)
    for nv in (1, 3, 5):
        last, tail = fn(xv, nv)
        np.testing.assert_array_equal(last, xv[:nv + 1][1:][-1])
        np.testing.assert_array_equal(tail, xv[:nv + 1][1:])


def test_the_merged_index_has_the_chains_gradient():
    left = []

    def cost(x):
        fg = FunctionGraph([x], [x[1:][::-2][1:].sum() * 3.0 + (x[:-1][-1] ** 2).sum()],
                           clone=False)
        left.append(_merge_all(fg))
        return fg.outputs[0]
    verify_grad(cost, [np.random.RandomState(1).rand(7, 3)], rng=0)
    assert left and left[0] == 2     # [1:][::-2][1:] and [:-1][-1], one Subtensor each
