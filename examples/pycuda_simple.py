"""PyCUDA kernels on symgpu data (GPU only).

Two programs of the tutorial, ported:

1. PyCUDA's own example (``multiply_them`` with ``drv.In``/``drv.Out`` host arguments),
   with ``import symgpu.misc.pycuda_init`` in place of ``import pycuda.autoinit``;
2. the test ``test_pycuda_theano``: the same kernel called directly on symgpu ``GpuArray``s.
   A ``GpuArray`` passes to a PyCUDA kernel like a PyCUDA ``GPUArray`` does (PyCUDA reads its
   ``gpudata``, the device pointer), so no conversion or copy is needed.

    SYMGPU_FLAGS=device=cuda,floatX=float32 python3 examples/pycuda_simple.py

prints the 400 products, then ``multiply_them on symgpu GpuArrays: OK``.  On a machine
without a GPU or PyCUDA it says why and exits with status 77.
"""
import numpy

import symgpu.gpu
from _gpu_only import require_gpu

ctx = require_gpu("pycuda_simple.py")  # exits (77) with the reason where no GPU can be used

import symgpu.misc.pycuda_init  # noqa: E402,F401  PyCUDA in symgpu's context (not autoinit)
import pycuda.driver as drv  # noqa: E402
from pycuda.compiler import SourceModule  # noqa: E402

mod = SourceModule("""
__global__ void multiply_them(float *dest, float *a, float *b)
{
  const int i = threadIdx.x;
  dest[i] = a[i] * b[i];
}
""")

multiply_them = mod.get_function("multiply_them")

# 1. (from PyCUDA's documentation) host arrays, copied in and out by PyCUDA
a = numpy.random.randn(400).astype(numpy.float32)
b = numpy.random.randn(400).astype(numpy.float32)

dest = numpy.zeros_like(a)
multiply_them(
    drv.Out(dest), drv.In(a), drv.In(b),
    block=(400, 1, 1), grid=(1, 1))

assert numpy.allclose(dest, a * b)
print(dest)

# 2. (test_pycuda_theano, ported) symgpu GpuArrays passed to the PyCUDA kernel
a = numpy.random.randn(100).astype(numpy.float32)
b = numpy.random.randn(100).astype(numpy.float32)

ga = symgpu.gpu.to_gpu(a)
gb = symgpu.gpu.to_gpu(b)
dest = symgpu.gpu.zeros(a.shape, dtype="float32")
# One thread per element (the original launched 400 threads on 100 floats, writing past the
# end).  Launching on symgpu's stream orders the kernel after the uploads above and before the
# copy back below, with no synchronisation.
multiply_them(dest, ga, gb, block=(a.size, 1, 1), grid=(1, 1), stream=ctx.stream)
assert (numpy.asarray(dest) == a * b).all()
print("multiply_them on symgpu GpuArrays: OK")
