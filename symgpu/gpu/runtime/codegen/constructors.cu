// eye and tri made on the device (symgpu/gpu/ops/constructors.py): element (r, c) of an
// n x m C-contiguous matrix is 1 where c - r == k (EYE) or c - r <= k (tri), else 0.
template <typename T, bool EYE>
__device__ __forceinline__ void band_body(T *out, long long n, long long m, long long k)
{
    const long long total = n * m;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const long long d = i % m - i / m;
        sg_store(out[i], (EYE ? d == k : d <= k) ? 1 : 0);
    }
}
//@ band

extern "C" __global__ void ${name}(${t} *out, long long n, long long m, long long k)
{ band_body<${t}, ${eye}>(out, n, m, k); }
