"""The seeds' exercise: logistic regression, to run on the CPU and on the GPU.

Ported from Theano's GPU tutorial ("Exercise"; `theano` -> `symgpu`).  Run it on both devices
and time it::

    time SYMGPU_FLAGS=device=cpu,floatX=float32 python3 examples/logistic_regression.py
    time SYMGPU_FLAGS=device=cuda,floatX=float32 python3 examples/logistic_regression.py

It prints ``Used the cpu`` (the graph has a `Gemv`) or ``Used the gpu`` (a `GpuGemv`), then
``target values for D``, the labels, ``prediction on D`` and the predictions.

The number of training steps (10000 in the tutorial) can be given as the first argument or in
the environment variable ``TRAINING_STEPS``, e.g. ``python3 examples/logistic_regression.py 20``.
The solution, with the data in shared variables and profiling, is
``logistic_regression_solution.py``.
"""
import os
import sys

import numpy

import symgpu
import symgpu.tensor as T

rng = numpy.random

N = 400
feats = 784
D = (rng.randn(N, feats).astype(symgpu.config.floatX),
     rng.randint(size=N, low=0, high=2).astype(symgpu.config.floatX))
training_steps = int(sys.argv[1] if len(sys.argv) > 1
                     else os.environ.get("TRAINING_STEPS", 10000))

# Declare symgpu symbolic variables
x = T.matrix("x")
y = T.vector("y")
w = symgpu.shared(rng.randn(feats).astype(symgpu.config.floatX), name="w")
b = symgpu.shared(numpy.asarray(0., dtype=symgpu.config.floatX), name="b")
x.tag.test_value = D[0]
y.tag.test_value = D[1]
# print("Initial model:")
# print(w.get_value(), b.get_value())

# Construct symgpu expression graph
p_1 = 1 / (1 + T.exp(-T.dot(x, w) - b))  # Probability of having a one
prediction = p_1 > 0.5  # The prediction that is done: 0 or 1
xent = -y * T.log(p_1) - (1 - y) * T.log(1 - p_1)  # Cross-entropy
cost = xent.mean() + 0.01 * (w ** 2).sum()  # The cost to optimize
gw, gb = T.grad(cost, [w, b])

# Compile expressions to functions
train = symgpu.function(
    inputs=[x, y],
    outputs=[prediction, xent],
    updates={w: w - 0.01 * gw, b: b - 0.01 * gb},
    name="train")
predict = symgpu.function(inputs=[x], outputs=prediction,
                          name="predict")

if any([x.op.__class__.__name__ in ['Gemv', 'CGemv', 'Gemm', 'CGemm'] for x in
        train.maker.fgraph.toposort()]):
    print('Used the cpu')
elif any([x.op.__class__.__name__ in ['GpuGemm', 'GpuGemv'] for x in
          train.maker.fgraph.toposort()]):
    print('Used the gpu')
else:
    print('ERROR, not able to tell if symgpu used the cpu or the gpu')
    print(train.maker.fgraph.toposort())

for i in range(training_steps):
    pred, err = train(D[0], D[1])

# print("Final model:")
# print(w.get_value(), b.get_value())
print("target values for D")
print(D[1])
print("prediction on D")
print(predict(D[0]))
