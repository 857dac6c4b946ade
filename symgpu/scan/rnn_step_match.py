"""Which recurrent layer a loop's step is: the structural matcher of `scan_to_dnn_rnn`
(symgpu/scan/dnn_rnn_match.py), kept apart from the rewrite that uses it.

The match is structural (no names): the step's inner graph must be one of three forms
(`_match_elman`, `_match_lstm`, `_match_gru`), with the pre-activations built from
``dot(x_t, W)``, ``dot(h_prev, U)`` and optional biases, each state optionally a masked
update; anything else (peepholes, extra outputs, other taps, a while loop,
truncate_gradient, float64, an output cuDNN cannot give) is no match.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from symgpu.graph.basic import Variable, graph_inputs
from symgpu.scan.op import Scan
from symgpu.tensor.elemwise import DimShuffle, Elemwise
from symgpu.tensor.grids import NotScalarConstantError, get_scalar_constant_value
from symgpu.tensor.math import Dot
from symgpu.tensor.subtensor import Slice, Subtensor

__all__ = ["RNNMatch", "match_rnn_step"]


class RNNMatch(NamedTuple):
    """A recognised step: cuDNN's mode, the hidden size, which state is h (and c), the
    user's W and U (outer variables), the input-side and recurrent-side biases (outer 1-d
    expressions), and the first column of each gate's block in W and in U, in cuDNN's gate
    order (lstm i, f, g, o; gru r, z, n)."""
    mode: str
    hidden: int
    h_state: int
    c_state: int | None
    W: Variable
    U: Variable
    x_biases: list
    h_biases: list
    x_cols: tuple
    h_cols: tuple
    masked: bool = False


# ----------------------------------------------------------------------------- graph helpers

def _ew(v: Any, name: str, arity: int | None = None) -> list | None:
    """The inputs of `v` if it is the output of the elementwise op `name`."""
    node = getattr(v, "owner", None)
    if node is None or not isinstance(node.op, Elemwise) or \
            getattr(node.op.scalar_op, "name", "") != name:
        return None
    if arity is not None and len(node.inputs) != arity:
        return None
    return list(node.inputs)


def _add_terms(v: Variable) -> list:
    """The terms of a (nested, any arity) sum; [v] when `v` is no sum."""
    ins = _ew(v, "add")
    if ins is None:
        return [v]
    return [t for i in ins for t in _add_terms(i)]


def _pair(ins: list | None, test_a, test_b) -> tuple | None:
    """(a, b) of a two-input commutative op's inputs, in either order, with test_a(a) and
    test_b(b) true; None otherwise."""
    if ins is None or len(ins) != 2:
        return None
    for a, b in (ins, ins[::-1]):
        if test_a(a) and test_b(b):
            return a, b
    return None


def _col_slice(v: Any) -> tuple | None:
    """(base, start, stop) of ``base[:, start:stop]`` with constant bounds."""
    node = getattr(v, "owner", None)
    if node is None or type(node.op) is not Subtensor or len(node.inputs) != 1:
        return None
    idx = node.op.idx_list
    if len(idx) != 2 or idx[0] != Slice(None, None, None) or not isinstance(idx[1], Slice):
        return None
    start, stop, step = idx[1]
    start = 0 if start is None else start
    if step not in (None, 1) or not isinstance(start, int) or not isinstance(stop, int) \
            or start < 0 or stop <= start:
        return None
    return node.inputs[0], start, stop


def _column(v: Any) -> Variable | None:
    """u of ``u[:, None]`` (a newaxis index or ``dimshuffle(0, 'x')``) of a vector u."""
    node = getattr(v, "owner", None)
    if node is None or len(node.inputs) != 1 or node.inputs[0].ndim != 1:
        return None
    if isinstance(node.op, DimShuffle) and node.op.new_order == (0, "x"):
        return node.inputs[0]
    if type(node.op) is Subtensor and node.op.idx_list == (Slice(None, None, None), None):
        return node.inputs[0]
    return None


def _row_mask(v: Any, mk: Variable) -> bool:
    """v is ``mk[:, None]``: the step's mask broadcast along the hidden units."""
    return _column(v) is mk


def _one_minus_mask(v: Any, mk: Variable, step: "_Step") -> bool:
    """v is ``(1 - mk)[:, None]`` or ``1 - mk[:, None]``."""
    col = _column(v)
    if col is not None:
        ins = _ew(col, "sub", 2)
        return ins is not None and _is_const(ins[0], 1, step) and ins[1] is mk
    ins = _ew(v, "sub", 2)
    return ins is not None and _is_const(ins[0], 1, step) and _row_mask(ins[1], mk)


def _unmask(v: Variable, old: Variable, mk: Variable, step: "_Step") -> Variable | None:
    """`new` of a masked state update ``m * new + (1 - m) * old``, ``switch(m, new, old)``
    or ``old + m * (new - old)`` (m the step's mask as ``m[:, None]``, sums and products in
    either order); None for anything else."""
    sw = _ew(v, "switch", 3)
    if sw is not None:
        return sw[1] if _row_mask(sw[0], mk) and sw[2] is old else None
    terms = _ew(v, "add", 2)
    if terms is None:
        return None
    for a, b in (terms, terms[::-1]):
        kept = _pair(_ew(b, "mul", 2), lambda u: _one_minus_mask(u, mk, step),
                     lambda u: u is old)
        new = _pair(_ew(a, "mul", 2), lambda u: _row_mask(u, mk), lambda u: True)
        if kept is not None and new is not None:
            return new[1]
        if a is old:   # old + m * (new - old)
            md = _pair(_ew(b, "mul", 2), lambda u: _row_mask(u, mk),
                       lambda u: (_ew(u, "sub", 2) or [None, None])[1] is old)
            if md is not None:
                return _ew(md[1], "sub", 2)[0]
    return None


class _Step:
    """The loop's inner inputs and how they map to the outer graph."""

    def __init__(self, node: Any) -> None:
        op, info = node.op, node.op.info
        S, NT = info.n_seqs, info.n_taps
        self.node, self.info = node, info
        self.ins = op.inner_inputs
        self.x_t = self.ins[0]
        self.taps = self.ins[S:S + NT]
        self.nonseq = dict(zip(self.ins[S + NT:], node.inputs[1 + S + info.n_states:]))

    def bias(self, t: Any) -> Variable | None:
        """The outer 1-d value of a bias term: a non-sequence (B broadcast by the add), as a
        vector or a row."""
        node = getattr(t, "owner", None)
        if node is not None and isinstance(node.op, DimShuffle) and \
                node.op.new_order == ("x", 0):
            t = node.inputs[0]
        outer = self.nonseq.get(t)
        if outer is None:
            return None
        if t.ndim == 1:
            return outer
        if t.ndim == 2 and t.broadcastable == (True, False):
            return outer.dimshuffle(1)
        return None

    def dot(self, t: Any, left: Variable) -> Variable | None:
        """The outer matrix of ``dot(left, M)`` with M a non-sequence."""
        node = getattr(t, "owner", None)
        if node is None or not isinstance(node.op, Dot) or node.inputs[0] is not left:
            return None
        m = node.inputs[1]
        return self.nonseq.get(m) if m.ndim == 2 else None

    def affine(self, v: Variable, lefts: tuple) -> tuple | None:
        """(matrices per left operand, biases) when `v` is a sum of one ``dot(l, M)`` per
        operand in `lefts` and up to two bias terms, in any order; None otherwise."""
        mats: dict = {}
        biases = []
        for t in _add_terms(v):
            for left in lefts:
                m = self.dot(t, left)
                if m is not None and left not in mats:
                    mats[left] = m
                    break
            else:
                b = self.bias(t)
                if b is None:
                    return None
                biases.append(b)
        if len(mats) != len(lefts) or len(biases) > 2:
            return None
        return [mats[l] for l in lefts], biases


def _is_const(v: Any, value: float, step: _Step | None) -> bool:
    v = step.nonseq.get(v, v) if step is not None else v
    try:
        return float(get_scalar_constant_value(v)) == value
    except NotScalarConstantError:
        return False


def _blocks(slices: list, base: Variable) -> tuple | None:
    """(hidden, first columns) when `slices` (col_slice results) all cut `base` into
    blocks of one width that tile [0, n * width)."""
    if any(s is None or s[0] is not base for s in slices):
        return None
    width = slices[0][2] - slices[0][1]
    starts = [s[1] for s in slices]
    if any(s[2] - s[1] != width for s in slices) or \
            sorted(starts) != [k * width for k in range(len(slices))]:
        return None
    return width, tuple(starts)


# ----------------------------------------------------------------------------- the three forms

def _match_elman(step: _Step, outs: list) -> RNNMatch | None:
    """``h = tanh(pre)`` (rnn_tanh) or ``h = relu(pre)`` (rnn_relu: symgpu's
    ``switch(pre < 0, 0, pre)`` or ``maximum(pre, 0)``), with
    ``pre = dot(x_t, W) + dot(h_prev, U) [+ b [+ b2]]`` and h_prev the state's own tap."""
    if len(outs) != 1:
        return None
    h, h_prev = outs[0], step.taps[0]
    pre, mode = None, None
    ins = _ew(h, "tanh", 1)
    if ins is not None:
        pre, mode = ins[0], "rnn_tanh"
    sw = _ew(h, "switch", 3)
    if sw is not None:
        lt = _ew(sw[0], "lt", 2)
        if lt is not None and lt[0] is sw[2] and _is_const(lt[1], 0, step) and \
                _is_const(sw[1], 0, step):
            pre, mode = sw[2], "rnn_relu"
    mx = _pair(_ew(h, "maximum", 2), lambda a: True, lambda b: _is_const(b, 0, step))
    if mx is not None:
        pre, mode = mx[0], "rnn_relu"
    if pre is None:
        return None
    aff = step.affine(pre, (step.x_t, h_prev))
    if aff is None:
        return None
    (W, U), biases = aff
    return RNNMatch(mode, None, 0, None, W, U, biases, [], (0,), (0,))


def _match_lstm(step: _Step, outs: list) -> RNNMatch | None:
    """``c = f * c_prev + i * tanh(g)``, ``h = o * tanh(c)`` with i, f, o sigmoids, every
    gate a column block ``pre[:, k*H:(k+1)*H]`` of one
    ``pre = dot(x_t, W) + dot(h_prev, U) [+ b [+ b2]]``, blocks in any order (found from
    the roles they play), the products and sums in any operand order; h and c the two
    states (either order), each reading its own tap."""
    if len(outs) != 2:
        return None
    for hj, cj in ((0, 1), (1, 0)):
        m = _lstm_roles(step, outs[hj], outs[cj], step.taps[hj], step.taps[cj])
        if m is not None:
            return m._replace(h_state=hj, c_state=cj)
    return None


def _gate(v: Any, name: str) -> tuple | None:
    ins = _ew(v, name, 1)
    return _col_slice(ins[0]) if ins is not None else None


def _lstm_roles(step: _Step, h: Variable, c: Variable, h_prev: Variable,
                c_prev: Variable) -> RNNMatch | None:
    ho = _pair(_ew(h, "mul", 2), lambda a: _gate(a, "sigmoid") is not None,
               lambda b: (_ew(b, "tanh", 1) or [None])[0] is c)
    if ho is None:
        return None
    o = _gate(ho[0], "sigmoid")
    terms = _ew(c, "add", 2)
    if terms is None:
        return None
    fc = ig = None
    for a, b in (terms, terms[::-1]):
        fc = _pair(_ew(a, "mul", 2), lambda x: _gate(x, "sigmoid") is not None,
                   lambda y: y is c_prev)
        ig = _pair(_ew(b, "mul", 2), lambda x: _gate(x, "sigmoid") is not None,
                   lambda y: _gate(y, "tanh") is not None)
        if fc is not None and ig is not None:
            break
    if fc is None or ig is None:
        return None
    f, i, g = _gate(fc[0], "sigmoid"), _gate(ig[0], "sigmoid"), _gate(ig[1], "tanh")
    pre = o[0]
    blocks = _blocks([i, f, g, o], pre)
    if blocks is None:
        return None
    aff = step.affine(pre, (step.x_t, h_prev))
    if aff is None:
        return None
    (W, U), biases = aff
    H, cols = blocks
    return RNNMatch("lstm", H, 0, 1, W, U, biases, [], cols, cols)


def _match_gru(step: _Step, outs: list) -> RNNMatch | None:
    """cuDNN's GRU (PyTorch's, Keras' reset_after): ``r = sig(xr + hr)``,
    ``z = sig(xz + hz)``, ``n = tanh(xn + r * hn)``, ``h = (1 - z) * n + z * h_prev`` (sums
    and products in any operand order), where xr, xz, xn are column blocks of
    ``dot(x_t, W) [+ b [+ b2]]`` and hr, hz, hn of ``dot(h_prev, U) [+ bU]``, each in any
    order. Theano's classic GRU (``dot(r * h_prev, U_n)``) has no ``r * hn`` and does not
    match."""
    if len(outs) != 1:
        return None
    h, h_prev = outs[0], step.taps[0]
    z_of = {}

    def one_minus_z(v: Any) -> bool:
        ins = _ew(v, "sub", 2)
        if ins is None or not _is_const(ins[0], 1, step) or _ew(ins[1], "sigmoid", 1) is None:
            return False
        z_of["a"] = ins[1]
        return True

    terms = _ew(h, "add", 2)
    if terms is None:
        return None
    found = None
    for a, b in (terms, terms[::-1]):
        zn = _pair(_ew(a, "mul", 2), one_minus_z, lambda v: _ew(v, "tanh", 1) is not None)
        zh = _pair(_ew(b, "mul", 2), lambda v: v is z_of.get("a"), lambda v: v is h_prev)
        if zn is not None and zh is not None:
            found = zn
            break
    if found is None:
        return None
    z, n_pre = z_of["a"], _ew(found[1], "tanh", 1)[0]
    # n = tanh(xn + r * hn)
    nr = _pair(_ew(n_pre, "add", 2), lambda v: _col_slice(v) is not None,
               lambda v: _ew(v, "mul", 2) is not None)
    if nr is None:
        return None
    xn = _col_slice(nr[0])
    rh = _pair(_ew(nr[1], "mul", 2), lambda v: _ew(v, "sigmoid", 1) is not None,
               lambda v: _col_slice(v) is not None)
    if rh is None:
        return None
    r, hn = rh[0], _col_slice(rh[1])
    pairs = []
    for gate in (r, z):
        ins = _ew(_ew(gate, "sigmoid", 1)[0], "add", 2)
        if ins is None:
            return None
        s = [_col_slice(v) for v in ins]
        if None in s:
            return None
        pairs.append(s)
    xw = xn[0]
    xs, hs = [], []
    for s in pairs:
        a, b = s if s[0][0] is xw else s[::-1]
        xs.append(a)
        hs.append(b)
    xb, hb = _blocks(xs + [xn], xw), _blocks(hs + [hn], hn[0])
    if xb is None or hb is None or xb[0] != hb[0] or xw is hn[0]:
        return None
    ax = step.affine(xw, (step.x_t,))
    ah = step.affine(hn[0], (h_prev,))
    if ax is None or ah is None:
        return None
    return RNNMatch("gru", xb[0], 0, None, ax[0][0], ah[0][0], ax[1], ah[1], xb[1], hb[1])


def _inputs_of(v: Variable) -> set:
    return set(graph_inputs([v]))


def match_rnn_step(node: Any) -> RNNMatch | None:
    """The recurrent layer a Scan node runs, or None: a for loop over one sequence with one
    (Elman, GRU) or two (LSTM) states read at tap -1, no per-step outputs, no truncated
    gradient, float32 throughout, and a step of one of the three forms above."""
    op = node.op
    if not isinstance(op, Scan):
        return None
    info = op.info
    if info.keep_as_loop or info.as_while or info.truncate_gradient != -1 or info.n_seqs not in (1, 2) or \
            info.n_nitsot != 0 or info.n_states not in (1, 2) or \
            any(t != (-1,) for t in info.state_taps):
        return None
    step = _Step(node)
    if step.x_t.ndim != 2 or any(t.ndim != 2 for t in step.taps):
        return None
    outs = list(op.inner_outputs)
    if info.n_seqs == 2:   # a per-step mask (batch,): every state a masked update
        mk = step.ins[1]
        if mk.ndim != 1:
            return None
        outs = [_unmask(o, t, mk, step) for o, t in zip(outs, step.taps)]
        if None in outs or any(mk in _inputs_of(o) for o in outs):
            return None
    m = _match_lstm(step, outs) if info.n_states == 2 else \
        (_match_elman(step, outs) or _match_gru(step, outs))
    if m is None:
        return None
    if info.n_seqs == 2:
        m = m._replace(masked=True)
    outer = [node.inputs[1]] + list(node.inputs[2:2 + info.n_states]) + [m.W, m.U] + \
        m.x_biases + m.h_biases
    if any(v.dtype != "float32" for v in outer) or node.inputs[1].ndim != 3:
        return None
    return m
