"""The seeds' check1 program: is the CPU or the GPU used?

Run with SYMGPU_FLAGS=device=cpu,floatX=float32 (or device=cuda on a GPU machine).  It computes
exp() of a shared vector of random numbers 1000 times (with device=cuda the vector is stored on
the GPU once) and prints, e.g. on an H200 (the times depend on the machine)::

    Mapped name None to device cuda0: NVIDIA H200 (0000:00:06.0)
    [GpuElemwise{exp,no_inplace}(<GpuArrayType<None>(float32, (False,))>), HostFromGpu(gpuarray)(GpuElemwise{exp,no_inplace}.0)]
    Looping 1000 times took 0.118046 seconds
    Result is [1.2317803 1.6187935 1.5227807 ... 2.2077181 2.2996776 1.623233 ]
    Used the gpu

and with device=cpu ``[Elemwise{exp,no_inplace}(<TensorType(float32, vector)>)]`` ...
``Used the cpu``.  See docs/using_the_gpu.md.
"""
import time

import numpy

from symgpu import config, function, shared
import symgpu.tensor as T

vlen = 10 * 30 * 768  # 10 x #cores x # threads per core
iters = 1000

rng = numpy.random.RandomState(22)
x = shared(numpy.asarray(rng.rand(vlen), config.floatX))
f = function([], T.exp(x))
print(f.maker.fgraph.toposort())
t0 = time.time()
for i in range(iters):
    r = f()
t1 = time.time()
print("Looping %d times took %f seconds" % (iters, t1 - t0))
print("Result is %s" % (r,))
if numpy.any([isinstance(x.op, T.Elemwise) for x in f.maker.fgraph.toposort()]):
    print('Used the cpu')
else:
    print('Used the gpu')
