// Helpers of Philox draws fused into elementwise kernels (symgpu/gpu/ops/random_fusion.py).
template <typename T, int K> struct alignas(K * sizeof(T)) sg_rpack { T v[K]; };
template <int K, typename T> __device__ __forceinline__ bool sg_rp_aligned(const T *p)
{ return ((unsigned long long)p % (K * sizeof(T))) == 0; }
//@ entry
extern "C" __global__ void sg_philox_ew_${kind}(${signature})
