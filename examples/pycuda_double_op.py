"""A symgpu Op whose thunk runs a PyCUDA kernel (GPU only): the tutorial's PyCUDADoubleOp.

Ported from "Theano + PyCUDA": `theano.misc.pycuda_init` -> `symgpu.misc.pycuda_init`,
`theano.Op` -> `symgpu.Op`, `cuda.basic_ops` ->
`symgpu.gpu.placement.basic_ops` (`as_cuda_ndarray_variable` -> `as_gpuarray_variable`), and
`CudaNdarray.zeros` -> `symgpu.gpu.zeros`.  Instead of `perform`, the Op implements
`make_thunk(node, storage_map, compute_map, no_recycling)`: it compiles the kernel once, with
PyCUDA's `SourceModule`, and returns a zero-argument thunk that reads its input cell and fills
its output cell with a GpuArray.

    SYMGPU_FLAGS=device=cuda,floatX=float32 python3 examples/pycuda_double_op.py

prints the doubled 4x5 matrix of ones (all 2.0).  On a machine without a GPU or PyCUDA it says
why and exits with status 77.
"""
import numpy

import symgpu
import symgpu.gpu
import symgpu.gpu.placement.basic_ops
from _gpu_only import require_gpu

require_gpu("pycuda_double_op.py")  # exits (77) with the reason where no GPU can be used

import symgpu.misc.pycuda_init  # noqa: E402,F401  PyCUDA in symgpu's context
from pycuda.compiler import SourceModule  # noqa: E402


class PyCUDADoubleOp(symgpu.Op):

    def __eq__(self, other):
        return type(self) == type(other)

    def __hash__(self):
        return hash(type(self))

    def __str__(self):
        return self.__class__.__name__

    def make_node(self, inp):
        inp = symgpu.gpu.placement.basic_ops.gpu_contiguous(
            symgpu.gpu.placement.basic_ops.as_gpuarray_variable(inp))
        assert inp.dtype == "float32"
        return symgpu.Apply(self, [inp], [inp.type()])

    def make_thunk(self, node, storage_map, _, _2):
        mod = SourceModule("""
    __global__ void my_fct(float * i0, float * o0, int size) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if(i<size){
        o0[i] = i0[i] * 2;
    }
  }""")
        pycuda_fct = mod.get_function("my_fct")
        inputs = [storage_map[v] for v in node.inputs]
        outputs = [storage_map[v] for v in node.outputs]

        def thunk():
            z = outputs[0]
            if z[0] is None or z[0].shape != inputs[0][0].shape:
                z[0] = symgpu.gpu.zeros(inputs[0][0].shape)
            grid = (int(numpy.ceil(inputs[0][0].size / 512.)), 1)
            pycuda_fct(inputs[0][0], z[0], numpy.intc(inputs[0][0].size),
                       block=(512, 1, 1), grid=grid)
        thunk.lazy = False
        return thunk


x = symgpu.tensor.fmatrix()
f = symgpu.function([x], PyCUDADoubleOp()(x))
xv = numpy.ones((4, 5), dtype="float32")
assert numpy.allclose(f(xv), xv * 2)
print(numpy.asarray(f(xv)))
