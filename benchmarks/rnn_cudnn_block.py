"""Forward + backward of one LSTM training step (seq 50, batch 16, input 128, hidden 128)
through RNNBlock (cuDNN's RNN API) and through torch.nn.LSTM in the same process, eager,
CUDA-synchronized per call; prints the median ms of each. Run on a GPU machine."""
from __future__ import annotations

import time

import numpy as np


def main() -> None:
    import torch
    import symgpu
    import symgpu.tensor as T
    from symgpu import config, function
    from symgpu.gpu.ops.cudnn_rnn import GpuDnnRNNBackward, RNNBlock
    from symgpu.gpu.runtime import context as gctx
    ctx = gctx.start_device("cuda0")
    gctx.register_context(None, ctx)
    with config.change_flags(device="cuda", floatX="float32"):
        _run(ctx, torch, symgpu, T, function, GpuDnnRNNBackward, RNNBlock)


def _run(ctx, torch, symgpu, T, function, GpuDnnRNNBackward, RNNBlock) -> None:
    seq, batch, isz, hid = 50, 16, 128, 128
    rng = np.random.default_rng(0)
    block = RNNBlock("float32", hid, 1, "lstm")
    w = symgpu.shared((rng.standard_normal(block.get_param_size([batch, isz])) * 0.1)
                      .astype("float32"))
    x, h0, c0 = T.ftensor3(), T.ftensor3(), T.ftensor3()
    y, hy, cy = block.apply(w, x, h0, c0)
    cost = (y ** 2).mean()
    gw = T.grad(cost, w)
    f = function([x, h0, c0], cost, updates=[(w, w - 0.01 * gw)])
    assert any(isinstance(n.op, GpuDnnRNNBackward) for n in f.maker.fgraph.toposort())
    xv = rng.standard_normal((seq, batch, isz)).astype("float32")
    hv = np.zeros((1, batch, hid), "float32")
    import pycuda.driver as drv

    def timed(fn, n=50):
        for _ in range(5):
            fn()
        out = []
        for _ in range(n):
            drv.Context.synchronize()
            t = time.perf_counter()
            fn()
            drv.Context.synchronize()
            out.append(time.perf_counter() - t)
        return 1e3 * float(np.median(out))
    ms = timed(lambda: f(xv, hv, hv))
    print(f"symgpu RNNBlock LSTM training step: {ms:.3f} ms", flush=True)
    lstm = torch.nn.LSTM(isz, hid).cuda()
    opt = torch.optim.SGD(lstm.parameters(), lr=0.01)
    tx = torch.from_numpy(xv).cuda()
    th = torch.zeros(1, batch, hid, device="cuda")

    def step():
        opt.zero_grad()
        out, _ = lstm(tx, (th, th))
        (out ** 2).mean().backward()
        opt.step()
        torch.cuda.synchronize()
    tms = timed(step)
    print(f"LSTM training step seq {seq} batch {batch} in {isz} hidden {hid}: symgpu RNNBlock "
          f"{ms:.3f} ms, torch.nn.LSTM eager {tms:.3f} ms")


if __name__ == "__main__":
    main()
