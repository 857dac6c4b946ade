"""Train an Elman RNN (tanh) with `scan` on a generated sequence task: at every step, predict
the running sum of the last three inputs of a noisy sine wave. The loss is the mean squared
error over all steps; its gradient is back-propagation through time, built by `T.grad` as a
second, backward scan. Runs on the CPU by default (SYMGPU_FLAGS=device=... to change it).

    python examples/rnn_sequence.py [--epochs 150]
"""
from __future__ import annotations

import argparse

import numpy as np

import symgpu
import symgpu.tensor as T


def make_data(rng, steps: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs (steps, batch, 1): sine waves with random phase and noise; targets: the sum of
    the current and the two previous inputs (a task that needs memory)."""
    t = np.arange(steps)[:, None]
    phase = rng.uniform(0, 2 * np.pi, size=(1, batch))
    x = np.sin(0.3 * t + phase) + 0.1 * rng.normal(size=(steps, batch))
    y = x.copy()
    y[1:] += x[:-1]
    y[2:] += x[:-2]
    return x[:, :, None].astype(symgpu.config.floatX), y[:, :, None].astype(symgpu.config.floatX)


def build(n_hidden: int, lr: float, rng):
    fx = symgpu.config.floatX
    W_x = symgpu.shared((rng.normal(size=(1, n_hidden)) * 0.5).astype(fx), name="W_x")
    W_h = symgpu.shared((rng.normal(size=(n_hidden, n_hidden)) / np.sqrt(n_hidden)).astype(fx),
                        name="W_h")
    b = symgpu.shared(np.zeros(n_hidden, dtype=fx), name="b")
    W_o = symgpu.shared((rng.normal(size=(n_hidden, 1)) / np.sqrt(n_hidden)).astype(fx),
                        name="W_o")
    x, y = T.tensor3("x"), T.tensor3("y")
    h0 = T.zeros((x.shape[1], n_hidden), dtype=fx)

    def step(x_t, h_prev):
        return T.tanh(T.dot(x_t, W_x) + T.dot(h_prev, W_h) + b)

    h, _ = symgpu.scan(step, sequences=x, outputs_info=h0)
    pred = T.dot(h, W_o)
    loss = T.mean((pred - y) ** 2)
    params = [W_x, W_h, b, W_o]
    grads = T.grad(loss, params)
    train = symgpu.function([x, y], loss,
                            updates=[(p, p - T.cast(lr, fx) * g) for p, g in zip(params, grads)])
    evaluate = symgpu.function([x, y], loss)
    return train, evaluate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=150)
    ap.add_argument("--hidden", type=int, default=16)
    args = ap.parse_args()
    rng = np.random.default_rng(1234)
    train, evaluate = build(args.hidden, lr=0.1, rng=rng)
    x_test, y_test = make_data(rng, 30, 64)
    first = float(evaluate(x_test, y_test))
    print(f"initial test loss {first:.4f}")
    for epoch in range(1, args.epochs + 1):
        x, y = make_data(rng, 30, 32)
        loss = float(train(x, y))
        if epoch % 50 == 0:
            print(f"epoch {epoch:4d}  train loss {loss:.4f}")
    last = float(evaluate(x_test, y_test))
    print(f"final test loss {last:.4f} ({first / last:.1f}x lower)")


if __name__ == "__main__":
    main()
