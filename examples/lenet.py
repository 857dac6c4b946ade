"""LeNet (Theano's convolutional-network tutorial) on a generated digit-like data set.

No download: each image is a 28x28 seven-segment-style glyph of a digit 0-9, drawn with a
random stroke width, position, slant and brightness and with noise added, so the classes are
easy for people and still need the convolutions' translation invariance. The network is the
tutorial's: conv 20 5x5, tanh, max-pool 2; conv 50 5x5, tanh, max-pool 2; dense 500, tanh;
dense 10, softmax; trained by SGD on the mean cross-entropy.

    SYMGPU_FLAGS=device=cpu,floatX=float32 python3 examples/lenet.py
    SYMGPU_FLAGS=device=cuda,floatX=float32 python3 examples/lenet.py

The number of epochs is the first argument (default 5) or LENET_EPOCHS. It prints ``Used the
cpu`` or ``Used the gpu`` (whether the graph's convolutions are GpuConv2d), the cost and the
test accuracy after each epoch: 52.5%, 77.1%, 90.1%, 95.5%, 96.8% after epochs 1 to 5 (5000
training images in batches of 50, SGD at 0.1); the CPU took 35 s for the 5 epochs on a loaded
2-core machine with OPENBLAS_NUM_THREADS=1 (with OpenBLAS's threads fighting other load it was
several times slower). On an H100 (cuDNN 9.14) the first 2 epochs gave 52.7% and 76.6%
in 2.0 s, compilation included.
"""
import os
import sys
import time

import numpy as np

import symgpu
import symgpu.tensor as T
from symgpu.tensor.nnet import conv2d
from symgpu.tensor.signal.pool import pool_2d

#: which of the seven segments (top, top-left, top-right, middle, bottom-left, bottom-right,
#: bottom) each digit lights
SEGMENTS = ["1110111", "0010010", "1011101", "1011011", "0111010",
            "1101011", "1101111", "1010010", "1111111", "1111011"]


def draw_digit(d, rng):
    """One 28x28 float32 image of digit `d`."""
    img = np.zeros((28, 28), dtype="float32")
    h, w = rng.integers(14, 19), rng.integers(8, 12)         # glyph size
    top, left = rng.integers(2, 28 - h - 1), rng.integers(3, 28 - w - 3)
    t = rng.integers(2, 4)                                   # stroke width
    mid = top + h // 2
    segs = SEGMENTS[d]
    boxes = [(top, top + t, left, left + w), (top, mid, left, left + t),
             (top, mid, left + w - t, left + w), (mid - t // 2, mid - t // 2 + t, left, left + w),
             (mid, top + h, left, left + t), (mid, top + h, left + w - t, left + w),
             (top + h - t, top + h, left, left + w)]
    for on, (r0, r1, c0, c1) in zip(segs, boxes):
        if on == "1":
            img[r0:r1, c0:c1] = 1.0
    slant = rng.uniform(-0.25, 0.25)                          # shear rows sideways
    for r in range(28):
        img[r] = np.roll(img[r], int(round(slant * (r - 14))))
    img *= rng.uniform(0.6, 1.0)
    img += rng.normal(0, 0.15, img.shape).astype("float32")
    return img


def make_digits(n, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    images = np.stack([draw_digit(d, rng) for d in labels])[:, None]
    return images.astype(symgpu.config.floatX), labels.astype("int64")


def init_params(rng):
    """Theano tutorial's initialisation: uniform in +-sqrt(6 / (fan_in + fan_out))."""
    def uniform(shape, fan_in, fan_out):
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        return symgpu.shared(rng.uniform(-bound, bound, shape).astype(symgpu.config.floatX))

    def zeros(n):
        return symgpu.shared(np.zeros(n, dtype=symgpu.config.floatX))
    return [uniform((20, 1, 5, 5), 25, 20 * 25 / 4), zeros(20),
            uniform((50, 20, 5, 5), 20 * 25, 50 * 25 / 4), zeros(50),
            uniform((800, 500), 800, 500), zeros(500),
            uniform((500, 10), 500, 10), zeros(10)]


def lenet(x, params):
    w1, b1, w2, b2, w3, b3, w4, b4 = params
    h = pool_2d(T.tanh(conv2d(x, w1) + b1.dimshuffle("x", 0, "x", "x")), (2, 2))
    h = pool_2d(T.tanh(conv2d(h, w2) + b2.dimshuffle("x", 0, "x", "x")), (2, 2))
    h = T.tanh(T.dot(h.flatten(2), w3) + b3)
    return T.nnet.softmax(T.dot(h, w4) + b4)


def main():
    epochs = int(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("LENET_EPOCHS", 5))
    batch, lr = 50, 0.1
    train_x, train_y = make_digits(5000, seed=1)
    test_x, test_y = make_digits(1000, seed=2)
    onehot = np.eye(10, dtype=symgpu.config.floatX)
    params = init_params(np.random.default_rng(3))
    x, y = T.tensor4("x"), T.matrix("y")
    p = lenet(x, params)
    cost = T.mean(T.nnet.categorical_crossentropy(p, y))
    grads = T.grad(cost, params)
    train = symgpu.function([x, y], cost, name="train",
                            updates=[(q, q - lr * g) for q, g in zip(params, grads)])
    predict = symgpu.function([x], T.argmax(p, axis=1), name="predict")
    gpu = any(type(n.op).__name__ == "GpuConv2d" for n in train.maker.fgraph.toposort())
    print("Used the gpu" if gpu else "Used the cpu")
    t0 = time.perf_counter()
    for epoch in range(epochs):
        costs = [float(train(train_x[i:i + batch], onehot[train_y[i:i + batch]]))
                 for i in range(0, len(train_x) - batch + 1, batch)]
        pred = np.concatenate([predict(test_x[i:i + 500]) for i in range(0, len(test_x), 500)])
        acc = float(np.mean(pred == test_y))
        print(f"epoch {epoch + 1}: mean cost {np.mean(costs):.4f}, test accuracy "
              f"{100 * acc:.1f}% ({time.perf_counter() - t0:.1f} s)")
    return acc


if __name__ == "__main__":
    main()
