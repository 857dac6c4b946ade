"""The seeds' check2 program: keep the result on the GPU with `gpu_from_host`.

Ported from Theano's GPU tutorial ("Returning a handle to device-allocated data"):
`sandbox.cuda.basic_ops.gpu_from_host` becomes `symgpu.gpu.placement.basic_ops.gpu_from_host`.

    SYMGPU_FLAGS=device=cuda,floatX=float32 python3 examples/check2.py

prints (the times depend on the machine; this is an H200)::

    Mapped name None to device cuda0: NVIDIA H200 (0000:00:06.0)
    [GpuElemwise{exp,no_inplace}(<GpuArrayType<None>(float32, (False,))>)]
    Looping 1000 times took 0.010777 seconds
    Result is [1.2317803 1.6187935 1.5227807 ... 2.2077181 2.2996776 1.623233 ]
    Numpy result is [1.2317803 1.6187935 1.5227807 ... 2.2077181 2.2996776 1.623233 ]
    Used the gpu

The function's output stays on the device (no `HostFromGpu` at the end of the graph), so each
call only launches the kernel (the loop mostly measures launches: GPU work is asynchronous);
`r` is a `symgpu.gpu.GpuArray` and `numpy.asarray(r)` copies it to the host.  The first
argument sets the number of calls (1000).

With device=cpu (or when the GPU cannot be used) there is no GPU to keep the result on: the
program says so, returns the result on the host and prints ``Used the cpu``.
"""
import sys
import time

import numpy

from symgpu import function, config, shared
import symgpu.gpu
import symgpu.gpu.placement.basic_ops
import symgpu.tensor as T

vlen = 10 * 30 * 768  # 10 x #cores x # threads per core
iters = int(sys.argv[1]) if len(sys.argv) > 1 else 1000

rng = numpy.random.RandomState(22)
x = shared(numpy.asarray(rng.rand(vlen), config.floatX))
if symgpu.gpu.init_default_context() is not None:
    f = function([], symgpu.gpu.placement.basic_ops.gpu_from_host(T.exp(x)))
else:
    print("No GPU in use (device=%s): the result is returned on the host" % config.device)
    f = function([], T.exp(x))
print(f.maker.fgraph.toposort())
t0 = time.time()
for i in range(iters):
    r = f()
t1 = time.time()
print("Looping %d times took %f seconds" % (iters, t1 - t0))
print("Result is %s" % (r,))
print("Numpy result is %s" % (numpy.asarray(r),))
if numpy.any([isinstance(x.op, T.Elemwise) for x in f.maker.fgraph.toposort()]):
    print('Used the cpu')
else:
    print('Used the gpu')
