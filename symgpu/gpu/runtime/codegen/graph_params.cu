// Kernels that read host scalars from a graph's parameter block
// (symgpu/gpu/runtime/graph_params.py).
//@ dyn_slice

extern "C" __global__ void dyn_slice_copy_${n}(const char *base, const long long *offset,
                                              char *dst, long long n, long long ndim,
                                              CopyMeta m)
{ strided_body<${t}, SgAssign>(base + *offset, dst, n, (int)ndim, m); }
//@ arange_dev

extern "C" __global__ void arange_dev_${d}(${t} *out, const long long *p, long long n)
{
    const long long start = p[0], step = p[1];
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = (${t})(start + i * step);
}
