#!/usr/bin/env python3
"""Solution to the exercise of the tutorial's section "Using the GPU" (ported to symgpu).

What makes it faster on the GPU than ``logistic_regression.py``:

* ``floatX`` is float32 (set below, as in the tutorial);
* the data set lives in shared variables ``x`` and ``y``: on the GPU they are uploaded once and
  the training function takes no inputs, so no data crosses the bus at each step;
* the mean of the cross-entropy is cast to float32 (the division by the length, an int64,
  would otherwise make it float64, which keeps work off the GPU).

1. Raw results::

       SYMGPU_FLAGS=device=cpu python3 examples/logistic_regression_solution.py
       SYMGPU_FLAGS=device=cuda python3 examples/logistic_regression_solution.py

   print ``Used the cpu`` / ``Used the gpu``, ``target values for D``, the labels,
   ``prediction on D`` and the predictions.

2. Profiling: with ``profile=True`` every function's profile, and their sum, is printed on
   stderr at exit (see docs/profiling.md for how to read it)::

       SYMGPU_FLAGS=profile=True,device=cpu python3 examples/logistic_regression_solution.py
       SYMGPU_FLAGS=profile=True,device=cuda python3 examples/logistic_regression_solution.py

   Compare the "Ops" tables and the line ``Spent Xs(X%) in cpu Op, Xs(X%) in gpu Op and
   Xs(X%) in transfer Op``.  The GPU timings are synchronised, so no CUDA_LAUNCH_BLOCKING is
   needed for true per-op times.

3. Conclusions (the tutorial's): `GpuFromHost` and `HostFromGpu` by themselves can take a
   large share of the time; keep transfers few.  Each GPU op may take more time than its CPU
   counterpart here because the inputs are small: with N = 4000 the GPU gains.

Options: the first argument (or ``TRAINING_STEPS``) sets the number of steps (10000);
``--keep-on-gpu`` compiles the tutorial's commented-out variant whose outputs stay on the GPU
(``Out(gpu_from_host(...), borrow=True)``), which needs a GPU.
"""
import os
import sys

import numpy

import symgpu
import symgpu.tensor as tt
from symgpu import Out

symgpu.config.floatX = 'float32'

args = [a for a in sys.argv[1:] if not a.startswith("--")]
keep_on_gpu = "--keep-on-gpu" in sys.argv[1:]

rng = numpy.random

N = 400
feats = 784
D = (rng.randn(N, feats).astype(symgpu.config.floatX),
     rng.randint(size=N, low=0, high=2).astype(symgpu.config.floatX))
training_steps = int(args[0] if args else os.environ.get("TRAINING_STEPS", 10000))

# Declare symgpu symbolic variables
x = symgpu.shared(D[0], name="x")
y = symgpu.shared(D[1], name="y")
w = symgpu.shared(rng.randn(feats).astype(symgpu.config.floatX), name="w")
b = symgpu.shared(numpy.asarray(0., dtype=symgpu.config.floatX), name="b")
x.tag.test_value = D[0]
y.tag.test_value = D[1]
# print("Initial model:")
# print(w.get_value(), b.get_value())

# Construct symgpu expression graph
p_1 = 1 / (1 + tt.exp(-tt.dot(x, w) - b))  # Probability of having a one
prediction = p_1 > 0.5  # The prediction that is done: 0 or 1
xent = -y * tt.log(p_1) - (1 - y) * tt.log(1 - p_1)  # Cross-entropy
cost = tt.cast(xent.mean(), 'float32') + \
    0.01 * (w ** 2).sum()  # The cost to optimize
gw, gb = tt.grad(cost, [w, b])

if keep_on_gpu:
    import symgpu.gpu
    from symgpu.gpu.placement.basic_ops import gpu_from_host
    if symgpu.gpu.init_default_context() is None:
        sys.exit("--keep-on-gpu needs a GPU: run with SYMGPU_FLAGS=device=cuda "
                 "(device is %r here)" % symgpu.config.device)
    # Compile expressions to functions whose outputs stay on the GPU
    train = symgpu.function(
        inputs=[],
        outputs=[Out(gpu_from_host(tt.cast(prediction, 'float32')), borrow=True),
                 Out(gpu_from_host(tt.cast(xent, 'float32')), borrow=True)],
        updates={w: w - 0.01 * gw, b: b - 0.01 * gb},
        name="train")
    predict = symgpu.function(
        inputs=[], outputs=Out(gpu_from_host(tt.cast(prediction, 'float32')), borrow=True),
        name="predict")
else:
    # Compile expressions to functions
    train = symgpu.function(
        inputs=[],
        outputs=[prediction, xent],
        updates={w: w - 0.01 * gw, b: b - 0.01 * gb},
        name="train")
    predict = symgpu.function(inputs=[], outputs=prediction,
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
    pred, err = train()

# print("Final model:")
# print(w.get_value(), b.get_value())
print("target values for D")
print(D[1])
print("prediction on D")
print(numpy.asarray(predict()))
