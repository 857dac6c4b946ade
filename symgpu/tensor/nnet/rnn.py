"""cuDNN-style fused recurrent layers on the host: the weight layout, a NumPy forward and
backward pass, and the ops DnnRNN / DnnRNNGrad that RNNBlock.apply builds
(symgpu/gpu/ops/cudnn_rnn.py lifts them to cuDNN's RNN API on the GPU).

Why host ops with NumPy loops rather than a scan: the GPU lifter needs one node per layer
stack to hand to cuDNN (cudnnRNNForward runs the whole sequence), and the host op is the
reference the GPU op is tested against; its gradient is a second host op (DnnRNNGrad, the
same loop run backwards) so that, on the GPU, the whole backward pass is one cuDNN call pair.

Equations (cuDNN's, gate order as cuDNN's linLayerID): for each layer, direction and step,
with x the layer's input and h the previous hidden state, ``W_k`` (hidden, in) and ``R_k``
(hidden, hidden) the input and recurrent matrices of gate k, ``bW_k``/``bR_k`` their biases:
- rnn_relu / rnn_tanh: h' = act(W x + bW + R h + bR)
- lstm (gates i, f, g, o): i, f, o = sigmoid(.), g = tanh(.), c' = f c + i g, h' = o tanh(c')
- gru (gates r, z, n): r, z = sigmoid(W x + bW + R h + bR),
  n = tanh(W_n x + bW_n + r * (R_n h + bR_n)), h' = (1 - z) n + z h

Per-row lengths (optional, ``with_lengths=True``: an int32/int64 vector ``lengths`` of the
batch, each in [1, seq], as cuDNN's ``seqLengthArray`` with the SEQ_MAJOR_UNPACKED layout):
row b runs steps 0..lengths[b]-1 only. Then y[t, b] = 0 for t >= lengths[b] (cuDNN's padding
fill 0), hy/cy are the state after the row's last step, the reverse direction of a
bidirectional layer starts at the row's own last step (t = lengths[b]-1) from hx, and no
gradient flows through the padding (dy there is ignored, dx there is 0). Why [1, seq]: cuDNN
rejects a zero length (CUDNN_STATUS_BAD_PARAM in cudnnSetRNNDataDescriptor).

Weight layout (cuDNN 9's linear-input, double-bias layout, checked against
cudnnGetRNNWeightParams by the GPU op on every plan): first the matrices of every
pseudo-layer (layer * directions + direction), each W_0..W_{n-1}, R_0..R_{n-1} row-major
(hidden, in); then the biases of every pseudo-layer, each bW_0..bW_{n-1}, bR_0..bR_{n-1}.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from symgpu.graph.basic import Apply
from symgpu.graph.op import Op, ShapeError
from symgpu.tensor.type import TensorType, as_tensor_variable

__all__ = ["RNN_MODES", "DIRECTION_MODES", "LENGTH_DTYPES", "check_lengths", "RNNLayout", "rnn_layout", "rnn_forward_numpy",
           "rnn_backward_numpy", "DnnRNN", "DnnRNNGrad", "SMALL_H_LIMIT"]

#: the largest hidden size cuDNN's persistent small-hidden algorithm runs forward and backward,
#: per cell (H200, cuDNN 9.14 and 9.19: an LSTM or GRU of hidden 129 or 192 passes the forward
#: and the backward refuses it, NOT_SUPPORTED; 256 refuses both; Elman cells run up to 256).
#: Read by the GPU plans (symgpu.gpu.ops.cudnn_rnn) and by where scan_to_dnn_rnn is on by
#: default (symgpu.scan.dnn_rnn_match)
SMALL_H_LIMIT = {"lstm": 128, "gru": 128, "rnn_tanh": 256, "rnn_relu": 256}

#: rnn_mode -> gates per layer (cuDNN's cudnnRNNMode_t order: relu, tanh, lstm, gru)
RNN_MODES = {"rnn_relu": 1, "rnn_tanh": 1, "lstm": 4, "gru": 3}
DIRECTION_MODES = {"unidirectional": 1, "bidirectional": 2}
LENGTH_DTYPES = ("int32", "int64")


class RNNLayout(NamedTuple):
    """Where each matrix and bias of each pseudo-layer lies in the flat weight vector:
    ``mats[p][k]`` / ``biases[p][k]`` = (offset, shape) for linLayerID k (0..2n-1) of
    pseudo-layer p; ``size`` elements in all."""

    mats: list[list[tuple[int, tuple[int, int]]]]
    biases: list[list[tuple[int, tuple[int]]]]
    size: int


def rnn_layout(rnn_mode: str, hidden_size: int, num_layers: int, input_size: int,
               directions: int = 1) -> RNNLayout:
    """The flat weight vector's layout (see the module docstring)."""
    n = RNN_MODES[rnn_mode]
    mats, biases, off = [], [], 0
    for layer in range(num_layers):
        width = input_size if layer == 0 else hidden_size * directions
        for _ in range(directions):
            m = []
            for k in range(2 * n):
                cols = width if k < n else hidden_size
                m.append((off, (hidden_size, cols)))
                off += hidden_size * cols
            mats.append(m)
    for _ in mats:
        biases.append([(off + k * hidden_size, (hidden_size,)) for k in range(2 * n)])
        off += 2 * n * hidden_size
    return RNNLayout(mats, biases, off)


def _params(w: np.ndarray, lay: RNNLayout, p: int, n: int) -> tuple:
    """(W (n*H, in), R (n*H, H), bW (n*H,), bR (n*H,)) of pseudo-layer p, gates stacked."""
    def mat(k: int) -> np.ndarray:
        off, shape = lay.mats[p][k]
        return w[off:off + shape[0] * shape[1]].reshape(shape)

    def bias(k: int) -> np.ndarray:
        off, (h,) = lay.biases[p][k]
        return w[off:off + h]
    return (np.concatenate([mat(k) for k in range(n)]),
            np.concatenate([mat(k) for k in range(n, 2 * n)]),
            np.concatenate([bias(k) for k in range(n)]),
            np.concatenate([bias(k) for k in range(n, 2 * n)]))


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


def _cell(mode: str, px: np.ndarray, ph: np.ndarray, h: np.ndarray, c: np.ndarray | None,
          hs: int) -> tuple:
    """One step: (h', c', cache for the backward step)."""
    if mode in ("rnn_relu", "rnn_tanh"):
        a = px + ph
        hn = np.maximum(a, 0) if mode == "rnn_relu" else np.tanh(a)
        return hn, None, (hn,)
    if mode == "lstm":
        a = px + ph
        i, f = _sigmoid(a[:, :hs]), _sigmoid(a[:, hs:2 * hs])
        g, o = np.tanh(a[:, 2 * hs:3 * hs]), _sigmoid(a[:, 3 * hs:])
        cn = f * c + i * g
        tc = np.tanh(cn)
        return o * tc, cn, (i, f, g, o, tc)
    r = _sigmoid(px[:, :hs] + ph[:, :hs])
    z = _sigmoid(px[:, hs:2 * hs] + ph[:, hs:2 * hs])
    phn = ph[:, 2 * hs:]
    nn = np.tanh(px[:, 2 * hs:] + r * phn)
    return (1 - z) * nn + z * h, None, (r, z, nn, phn)


def _valid(lengths: np.ndarray | None, t: int) -> np.ndarray | None:
    """(batch, 1) booleans: the rows whose sequence still runs at step t (None: all)."""
    return None if lengths is None else (t < lengths)[:, None]


def _run(mode: str, hidden: int, num_layers: int, dirs: int, w: np.ndarray, x: np.ndarray,
         hx: np.ndarray, cx: np.ndarray | None, keep: bool,
         lengths: np.ndarray | None = None) -> tuple:
    n = RNN_MODES[mode]
    lay = rnn_layout(mode, hidden, num_layers, x.shape[2], dirs)
    t_len, batch = x.shape[:2]
    hy, cy = np.empty_like(hx), (np.empty_like(cx) if cx is not None else None)
    inp, caches = x, []
    for layer in range(num_layers):
        out = np.empty((t_len, batch, hidden * dirs), dtype=x.dtype)
        for d in range(dirs):
            p = layer * dirs + d
            W, R, bW, bR = _params(w, lay, p, n)
            px_all = inp @ W.T + bW
            h = hx[p]
            c = cx[p] if cx is not None else None
            steps, hs_prev, cs_prev = [], [], []
            order = range(t_len) if d == 0 else range(t_len - 1, -1, -1)
            for t in order:
                hs_prev.append(h)
                cs_prev.append(c)
                hn, cn, cache = _cell(mode, px_all[t], h @ R.T + bR, h, c, hidden)
                steps.append(cache)
                v = _valid(lengths, t)
                if v is None:
                    h, c = hn, cn
                    out[t, :, d * hidden:(d + 1) * hidden] = h
                else:   # finished (or, reversed, not yet started) rows keep their state
                    h = np.where(v, hn, h)
                    c = np.where(v, cn, c) if c is not None else None
                    out[t, :, d * hidden:(d + 1) * hidden] = np.where(v, hn, 0)
            hy[p] = h
            if cy is not None:
                cy[p] = c
            if keep:
                caches.append((p, inp, list(order), steps, hs_prev, cs_prev, W, R))
        inp = out
    return inp, hy, cy, caches, lay


def rnn_forward_numpy(rnn_mode: str, hidden_size: int, num_layers: int, directions: int,
                      w: np.ndarray, x: np.ndarray, hx: np.ndarray,
                      cx: np.ndarray | None = None, lengths: np.ndarray | None = None) -> tuple:
    """(y, hy, cy) of the stacked recurrence (cy None unless lstm); x (seq, batch, in),
    hx/cx (num_layers * directions, batch, hidden); `lengths` (batch,) per-row lengths in
    [1, seq] or None (every row full length; see the module docstring)."""
    y, hy, cy, _, _ = _run(rnn_mode, hidden_size, num_layers, directions, w, x, hx, cx, False,
                           lengths)
    return y, hy, cy


def _cell_grad(mode: str, cache: tuple, dh: np.ndarray, dc: np.ndarray | None,
               h_prev: np.ndarray, c_prev: np.ndarray | None) -> tuple:
    """(d pre-activation of the input part, of the recurrent part, dh_prev not through R,
    dc_prev) of one step."""
    if mode in ("rnn_relu", "rnn_tanh"):
        (hn,) = cache
        da = dh * (hn > 0) if mode == "rnn_relu" else dh * (1 - hn * hn)
        return da, da, 0.0, None
    if mode == "lstm":
        i, f, g, o, tc = cache
        do = dh * tc
        dct = dc + dh * o * (1 - tc * tc)
        da = np.concatenate([dct * g * i * (1 - i), dct * c_prev * f * (1 - f),
                             dct * i * (1 - g * g), do * o * (1 - o)], axis=1)
        return da, da, 0.0, dct * f
    r, z, nn, phn = cache
    dn = dh * (1 - z) * (1 - nn * nn)
    dz = dh * (h_prev - nn) * z * (1 - z)
    dr = dn * phn * r * (1 - r)
    return (np.concatenate([dr, dz, dn], axis=1), np.concatenate([dr, dz, dn * r], axis=1),
            dh * z, None)


def rnn_backward_numpy(rnn_mode: str, hidden_size: int, num_layers: int, directions: int,
                       w: np.ndarray, x: np.ndarray, hx: np.ndarray, cx: np.ndarray | None,
                       dy: np.ndarray, dhy: np.ndarray, dcy: np.ndarray | None,
                       lengths: np.ndarray | None = None) -> tuple:
    """(dx, dhx, dcx, dw) of rnn_forward_numpy's outputs given their gradients (dcx None
    unless lstm); `lengths` as rnn_forward_numpy's."""
    mode, hs, dirs = rnn_mode, hidden_size, directions
    _, _, _, caches, lay = _run(mode, hs, num_layers, dirs, w, x, hx, cx, True, lengths)
    n = RNN_MODES[mode]
    dw = np.zeros_like(w)
    dhx = np.zeros_like(hx)
    dcx = np.zeros_like(cx) if cx is not None else None
    d_out = dy
    for layer in range(num_layers - 1, -1, -1):
        d_in = None
        for d in range(dirs):
            p, inp, order, steps, hs_prev, cs_prev, W, R = caches[layer * dirs + d]
            t_len = inp.shape[0]
            dpx = np.zeros((t_len, inp.shape[1], n * hs), dtype=x.dtype)
            dR = np.zeros_like(R)
            dbR = np.zeros(n * hs, dtype=x.dtype)
            dh, dc = dhy[p].copy(), (dcy[p].copy() if dcy is not None else None)
            for j in range(len(order) - 1, -1, -1):
                t = order[j]
                v = _valid(lengths, t)
                g_out = d_out[t, :, d * hs:(d + 1) * hs]
                if v is None:
                    dh = dh + g_out
                    dh_in, dc_in = dh, dc
                else:   # only running rows step; the others pass their adjoint through
                    dh = dh + np.where(v, g_out, 0)
                    dh_in = np.where(v, dh, 0)
                    dc_in = np.where(v, dc, 0) if dc is not None else None
                dpx_t, dph, dh_direct, dc_new = _cell_grad(mode, steps[j], dh_in, dc_in,
                                                           hs_prev[j], cs_prev[j])
                if v is not None:   # the padding's cached values never reach the weights
                    dpx_t, dph = np.where(v, dpx_t, 0), np.where(v, dph, 0)
                dpx[t] = dpx_t
                dR += dph.T @ hs_prev[j]
                dbR += dph.sum(axis=0)
                dh_new = dph @ R + dh_direct
                if v is None:
                    dh, dc = dh_new, dc_new
                else:
                    dh = np.where(v, dh_new, dh)
                    dc = np.where(v, dc_new, dc) if dc is not None else None
            dhx[p] = dh
            if dcx is not None:
                dcx[p] = dc
            flat = dpx.reshape(-1, n * hs)
            dW = flat.T @ inp.reshape(-1, inp.shape[2])
            dbW = flat.sum(axis=0)
            part = dpx @ W
            d_in = part if d_in is None else d_in + part
            for k in range(n):
                rows = slice(k * hs, (k + 1) * hs)
                for kk, grad in ((k, dW[rows]), (n + k, dR[rows])):
                    off, shape = lay.mats[p][kk]
                    dw[off:off + shape[0] * shape[1]] = grad.reshape(-1)
                for kk, grad in ((k, dbW[rows]), (n + k, dbR[rows])):
                    off, _ = lay.biases[p][kk]
                    dw[off:off + hs] = grad
        d_out = d_in
    return d_out, dhx, dcx, dw


def _check_inputs(op: Op, w: Any, x: Any, hx: Any, cx: Any, lengths: Any = None) -> None:
    if w.ndim != 1 or x.ndim != 3 or hx.ndim != 3 or (cx is not None and cx.ndim != 3):
        raise TypeError(f"{op}: needs w 1-d, x 3-d (seq, batch, input), hx"
                        f"{' and cx' if cx is not None else ''} 3-d (layers * directions, "
                        f"batch, hidden), got w {w.type}, x {x.type}, hx {hx.type}"
                        + (f", cx {cx.type}" if cx is not None else ""))
    dtypes = {v.dtype for v in (w, x, hx, cx) if v is not None}
    if len(dtypes) != 1 or not dtypes <= {"float16", "float32", "float64"}:
        raise TypeError(f"{op}: w, x, hx{', cx' if cx is not None else ''} need one float "
                        f"dtype, got {sorted(dtypes)}")
    if lengths is not None and (lengths.ndim != 1 or lengths.dtype not in LENGTH_DTYPES):
        raise TypeError(f"{op}: lengths must be an int32 or int64 vector (one length per "
                        f"row of the batch), got {lengths.type}")


def check_lengths(op: Any, lengths: Any, seq: int, batch: int) -> np.ndarray:
    """`lengths` as an int32 array after checking it against x's (seq, batch): one per row,
    each in [1, seq] (cuDNN's rule for seqLengthArray)."""
    arr = np.asarray(lengths)
    if arr.shape != (batch,):
        raise ValueError(f"{op}: lengths of shape {arr.shape}, expected ({batch},) for x of "
                         f"{seq} steps and batch {batch}")
    if batch and (arr.min() < 1 or arr.max() > seq):
        raise ValueError(f"{op}: every length must be in [1, {seq}] (x's steps; cuDNN takes no "
                         f"zero length), got {arr.tolist()}")
    return arr.astype(np.int32)


class _RNNBase(Op):
    __props__ = ("rnn_mode", "direction_mode", "num_layers", "hidden_size", "with_lengths")
    with_lengths = False     # ops pickled before the prop existed

    def __init__(self, rnn_mode: str, direction_mode: str, num_layers: int,
                 hidden_size: int, with_lengths: bool = False) -> None:
        if rnn_mode not in RNN_MODES:
            raise ValueError(f"rnn_mode must be one of {sorted(RNN_MODES)}, got {rnn_mode!r}")
        if direction_mode not in DIRECTION_MODES:
            raise ValueError(f"direction_mode must be one of {sorted(DIRECTION_MODES)}, got "
                             f"{direction_mode!r}")
        self.rnn_mode, self.direction_mode = rnn_mode, direction_mode
        self.num_layers, self.hidden_size = int(num_layers), int(hidden_size)
        self.with_lengths = bool(with_lengths)

    @property
    def n_fwd(self) -> int:
        """How many inputs the forward op takes: w, x, hx[, cx][, lengths]."""
        return 3 + int(self.lstm) + int(self.with_lengths)

    def _split(self, args: list) -> tuple:
        """(w, x, hx, cx or None, lengths or None) of the forward inputs `args`."""
        w, x, hx = args[:3]
        cx = args[3] if self.lstm else None
        lengths = args[3 + int(self.lstm)] if self.with_lengths else None
        return w, x, hx, cx, lengths

    def _forward_args(self, w: Any, x: Any, hx: Any, more: tuple) -> list:
        """[w, x, hx[, cx][, lengths]] from a make_node call: `more` is (cx, lengths) in
        that order, either left out or None where the op takes none (RNNBlock.apply passes
        cx=None for the plain cells)."""
        more = [m for m in more if m is not None]
        if self.lstm and not more:
            raise TypeError(f"{self}: lstm needs the initial cell state cx")
        want = int(self.lstm) + int(self.with_lengths)
        if len(more) != want:
            raise TypeError(f"{self}: takes w, x, hx{', cx' if self.lstm else ''}"
                            f"{', lengths' if self.with_lengths else ''}; got {3 + len(more)} "
                            "inputs")
        return [w, x, hx] + list(more)

    @property
    def dirs(self) -> int:
        return DIRECTION_MODES[self.direction_mode]

    @property
    def lstm(self) -> bool:
        return self.rnn_mode == "lstm"

    def layer_props(self) -> tuple:
        """The layer's props (what every RNN op, host or GPU, is built from)."""
        return (self.rnn_mode, self.direction_mode, self.num_layers, self.hidden_size,
                self.with_lengths)


class _WithReserve:
    """The ``reserve`` prop of DnnRNN and DnnRNNGrad: the forward also returns cuDNN's
    reserve space (a uint8 vector, empty on the host), and its gradient takes y and that
    reserve after the forward inputs, so that a backward computed apart from its forward
    (scan_to_dnn_rnn's two branches) need not run the forward again on the GPU."""

    __props__ = _RNNBase.__props__ + ("reserve",)
    reserve = False

    def __init__(self, *args: Any, reserve: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self.reserve = bool(reserve)


class DnnRNN(_WithReserve, _RNNBase):
    """(w, x, hx[, cx][, lengths]) -> (y, hy[, cy][, reserve]): the stacked recurrence of
    RNNBlock on the host (NumPy loop; cx/cy for lstm only, lengths with
    ``with_lengths=True``: per-row lengths, see the module docstring; the reserve space with
    ``reserve=True``). y is (seq, batch, hidden * directions)."""

    def make_node(self, w: Any, x: Any, hx: Any, *more: Any) -> Apply:
        args = [as_tensor_variable(v) for v in self._forward_args(w, x, hx, more)]
        w, x, hx, cx, lengths = self._split(args)
        _check_inputs(self, w, x, hx, cx, lengths)
        t3 = TensorType(x.dtype, (False, False, False))
        outs = [t3(name="rnn_y"), t3(name="rnn_hy")] + ([t3(name="rnn_cy")] if self.lstm else [])
        if self.reserve:
            outs.append(TensorType("uint8", (False,))(name="rnn_reserve"))
        return Apply(self, args, outs)

    def perform(self, node: Apply, inputs: list, outputs: list) -> None:
        w, x, hx, cx, lengths = self._split(inputs)
        lengths = self._check_values(w, x, hx, cx, lengths)
        y, hy, cy = rnn_forward_numpy(self.rnn_mode, self.hidden_size, self.num_layers,
                                      self.dirs, w, x, hx, cx, lengths)
        outputs[0][0], outputs[1][0] = y, hy
        if self.lstm:
            outputs[2][0] = cy
        if self.reserve:
            outputs[-1][0] = np.zeros(0, np.uint8)

    def _check_values(self, w: np.ndarray, x: np.ndarray, hx: np.ndarray,
                      cx: np.ndarray | None, lengths: Any = None) -> np.ndarray | None:
        size = rnn_layout(self.rnn_mode, self.hidden_size, self.num_layers, x.shape[2],
                          self.dirs).size
        hshape = (self.num_layers * self.dirs, x.shape[1], self.hidden_size)
        bad = [f"w of shape {w.shape} (expected ({size},))" if w.shape != (size,) else "",
               f"hx of shape {hx.shape} (expected {hshape})" if hx.shape != hshape else "",
               f"cx of shape {cx.shape} (expected {hshape})"
               if cx is not None and cx.shape != hshape else ""]
        bad = [b for b in bad if b]
        if bad:
            raise ValueError(f"{self}: for x of shape {x.shape}: " + ", ".join(bad))
        return None if lengths is None else check_lengths(self, lengths, x.shape[0],
                                                          x.shape[1])

    def infer_shape(self, fgraph: Any, node: Apply, shapes: list) -> list:
        if self.reserve:
            raise ShapeError(f"{self}: the reserve space's size is cuDNN's (known when its "
                             "plan is made on the GPU), not the inputs'")
        xs, hs = shapes[1], shapes[2]
        y = (xs[0], xs[1], self.hidden_size * self.dirs)
        return [y, hs] + ([shapes[3]] if self.lstm else [])

    def connection_pattern(self, node: Apply) -> list[list[bool]]:
        n = len(node.outputs)
        pattern = [[True] * (n - int(self.reserve)) + [False] * int(self.reserve)]
        return pattern * (3 + int(self.lstm)) + ([[False] * n] if self.with_lengths else [])

    def L_op(self, inputs: list, outputs: list, output_grads: list) -> list:
        """DnnRNNGrad of the inputs and every output's gradient (the gradient machinery
        gives zeros for an output that received none); none flows to the integer lengths."""
        grads = output_grads[:len(output_grads) - int(self.reserve)]
        if self.reserve:
            op = DnnRNNGrad(*self.layer_props(), reserve=True)
            outs = list(op.make_node(*inputs, outputs[0], outputs[-1], *grads).outputs)
        else:
            outs = list(DnnRNNGrad(*self.layer_props()).make_node(*inputs, *grads).outputs)
        return [outs[-1]] + outs[:-1] + ([None] if self.with_lengths else [])


class DnnRNNGrad(_WithReserve, _RNNBase):
    """(w, x, hx[, cx][, lengths][, y, reserve], dy, dhy[, dcy]) -> (dx, dhx[, dcx], dw):
    DnnRNN's gradient on the host (the forward loop rerun, then backpropagation through
    time; y and the reserve space, taken with ``reserve=True``, are for the GPU's op)."""

    def make_node(self, *args: Any) -> Apply:
        k = self.n_fwd
        n = k + 2 + int(self.lstm) + 2 * int(self.reserve)
        if len(args) != n:
            raise TypeError(f"{self}: takes {n} inputs, got {len(args)}")
        args = [as_tensor_variable(a) for a in args]
        w, x, hx, cx, lengths = self._split(args)
        _check_inputs(self, w, x, hx, cx, lengths)
        outs = [a.type() for a in args[1:3 + int(self.lstm)]] + [args[0].type()]
        return Apply(self, args, outs)

    def perform(self, node: Apply, inputs: list, outputs: list) -> None:
        k = self.n_fwd + 2 * int(self.reserve)
        w, x, hx, cx, lengths = self._split(inputs)
        dy, dhy = inputs[k], inputs[k + 1]
        dcy = inputs[k + 2] if self.lstm else None
        lengths = DnnRNN._check_values(self, w, x, hx, cx, lengths)  # type: ignore[arg-type]
        dx, dhx, dcx, dw = rnn_backward_numpy(self.rnn_mode, self.hidden_size,
                                              self.num_layers, self.dirs, w, x, hx, cx,
                                              dy, dhy, dcy, lengths)
        res = [dx, dhx] + ([dcx] if self.lstm else []) + [dw]
        for cell, v in zip(outputs, res):
            cell[0] = v

    def infer_shape(self, fgraph: Any, node: Apply, shapes: list) -> list:
        return list(shapes[1:3 + int(self.lstm)]) + [shapes[0]]
