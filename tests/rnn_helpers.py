"""What the RNNBlock tests share: a random layer stack and its inputs."""
from __future__ import annotations

from symgpu.gpu.ops import cudnn_rnn as crnn


def rnn_case(mode, dtype, rng, t=4, b=3, i=5, h=4, layers=2, dirs=1, scale=0.4):
    """(block, w, x, hx, cx) for an RNNBlock of `mode`: weights uniform-normal times
    `scale`, x (t, b, i), hx (layers * dirs, b, h), cx for lstm only (else None)."""
    block = crnn.RNNBlock(dtype, h, layers, mode,
                          direction_mode="bidirectional" if dirs == 2 else "unidirectional")
    w = (rng.standard_normal(block.get_param_size([b, i])) * scale).astype(dtype)
    x = rng.standard_normal((t, b, i)).astype(dtype)
    hx = rng.standard_normal((layers * dirs, b, h)).astype(dtype)
    cx = rng.standard_normal(hx.shape).astype(dtype) if mode == "lstm" else None
    return block, w, x, hx, cx
