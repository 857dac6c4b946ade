// Helpers of Philox draws fused into elementwise kernels (symgpu/gpu/ops/random_fusion.py).
template <typename T, int K> struct alignas(K * sizeof(T)) sg_rpack { T v[K]; };
template <int K, typename T> __device__ __forceinline__ bool sg_rp_aligned(const T *p)
{ return ((unsigned long long)p % (K * sizeof(T))) == 0; }
/* a / d for a >= 0, d > 0: in 32 bits when both fit (a fraction of the 64-bit division's
   instructions); the strided kernel divides once per dimension and Philox block */
__device__ __forceinline__ long long sg_rdiv(const long long a, const long long d)
{
    return ((unsigned long long)(a | d) >> 32) ? a / d
        : (long long)((unsigned int)a / (unsigned int)d);
}
//@ entry
extern "C" __global__ void sg_philox_ew_${kind}(${signature})
