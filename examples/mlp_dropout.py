"""A multilayer perceptron 784-1024-1024-10 trained with dropout (p=0.5 after each hidden
layer), the masks drawn in the graph by RandomStreams.

    SYMGPU_FLAGS=device=cpu,floatX=float32 python3 examples/mlp_dropout.py 20
    SYMGPU_FLAGS=device=cuda,floatX=float32 python3 examples/mlp_dropout.py

The data are synthetic (10 Gaussian clusters in 784 dimensions), so it runs anywhere. It
prints the device used, the training loss every few steps (it falls), and the accuracy of the
dropout-free network on the training batch. The number of SGD steps (200 by default) is the
first argument or TRAINING_STEPS. `build(batch, seed)` is reused by benchmarks/random.py.
"""
import os
import sys

import numpy as np

import symgpu
import symgpu.tensor as T
from symgpu.tensor.shared_randomstreams import RandomStreams

SIZES = (784, 1024, 1024, 10)
P_DROP = 0.5


def dropout(srng, h, p):
    """Zero each unit with probability p and scale the rest by 1 / (1 - p) (inverted dropout)."""
    keep = srng.binomial(h.shape, p=1.0 - p, dtype=h.dtype)
    return h * keep * np.asarray(1.0 / (1.0 - p), dtype=h.dtype)


def build(batch=512, seed=1234, lr=0.02, on_device=False, p_drop=P_DROP, profile=None):
    """(train, predict, data): one SGD step with dropout, and the dropout-free prediction.

    `on_device=True` (benchmarks): the batch lives in shared variables, `train()` takes no
    arguments and leaves its loss on the GPU; no `predict` is compiled (None). `p_drop=0`
    leaves dropout out (the same network without random numbers, to compare with);
    `profile` is passed to the training function."""
    floatX = symgpu.config.floatX
    rng = np.random.default_rng(seed)
    params = []
    for n_in, n_out in zip(SIZES[:-1], SIZES[1:]):
        w = rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)
        params.append(symgpu.shared(w.astype(floatX), name=f"W{len(params) // 2}"))
        params.append(symgpu.shared(np.zeros(n_out, dtype=floatX), name=f"b{len(params) // 2}"))
    centers = rng.standard_normal((10, SIZES[0]))
    labels = rng.integers(0, 10, size=batch)
    data = ((centers[labels] + 2.0 * rng.standard_normal((batch, SIZES[0]))).astype(floatX),
            labels.astype("int64"))

    if on_device:
        x, y = symgpu.shared(data[0], name="x"), symgpu.shared(data[1], name="y")
    else:
        x, y = T.matrix("x"), T.lvector("y")
    srng = RandomStreams(seed=seed)

    def forward(drop):
        h = x
        for k in range(0, len(params) - 2, 2):
            h = T.nnet.relu(T.dot(h, params[k]) + params[k + 1])
            if drop and p_drop:
                h = dropout(srng, h, p_drop)
        return T.nnet.softmax(T.dot(h, params[-2]) + params[-1])

    loss = T.mean(T.nnet.categorical_crossentropy(forward(True), y))
    grads = T.grad(loss, params)
    lr = np.asarray(lr, dtype=floatX)
    updates = [(p, p - lr * g) for p, g in zip(params, grads)]
    if on_device:
        from symgpu.gpu.placement.basic_ops import gpu_from_host
        train = symgpu.function([], symgpu.Out(gpu_from_host(loss), borrow=True),
                                updates=updates, name="train", profile=profile)
        return train, None, data
    train = symgpu.function([x, y], loss, name="train", updates=updates, profile=profile)
    predict = symgpu.function([x], T.argmax(forward(False), axis=1), name="predict")
    return train, predict, data


def main():
    steps = int(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TRAINING_STEPS", 200))
    train, predict, (xv, yv) = build()
    names = {type(n.op).__name__ for n in train.maker.fgraph.toposort()}
    print("Used the gpu" if any(n.startswith("GpuPhilox") for n in names) else "Used the cpu")
    for step in range(steps):
        loss = train(xv, yv)
        if step % max(1, steps // 5) == 0 or step == steps - 1:
            print(f"step {step}: loss {float(loss):.4f}")
    print(f"training accuracy without dropout: {np.mean(predict(xv) == yv):.3f}")


if __name__ == "__main__":
    main()
