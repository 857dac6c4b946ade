/* symgpu: helpers shared by every generated module (pasted in, not #included, so that a
 * module's source text alone determines its cubin and its cache key). */
#include <cuda_fp16.h>
#include <cuda_bf16.h>

/* loads and stores convert between storage and value types: only the half dtypes differ */
template <typename T> __device__ __forceinline__ T sg_load(const T x) { return x; }
__device__ __forceinline__ float sg_load(const __half x) { return __half2float(x); }
__device__ __forceinline__ float sg_load(const __nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T, typename V> __device__ __forceinline__ void sg_store(T &dst, const V v)
{ dst = (T)v; }
template <typename V> __device__ __forceinline__ void sg_store(__half &dst, const V v)
{ dst = __float2half_rn((float)v); }
template <typename V> __device__ __forceinline__ void sg_store(__nv_bfloat16 &dst, const V v)
{ dst = __float2bfloat16_rn((float)v); }
template <typename V> __device__ __forceinline__ void sg_store(bool &dst, const V v)
{ dst = (v != 0); }
/* v rounded to the storage type T and read back: the value a stored T holds (v itself where T
   is its own value type) */
template <typename T, typename V> __device__ __forceinline__ V sg_round(const V v)
{ T t; sg_store(t, v); return (V)sg_load(t); }

/* four elements moved as one aligned access (16 bytes for 4-byte types; the compiler splits
 * 32-byte ones into two 16-byte accesses) */
template <typename T> struct alignas(4 * sizeof(T)) sg_vec4 { T v[4]; };

/* The element offsets of kept position k (row-major over m.kshape[KND]) in each of NIN
 * operands (m.kstride[NIN][KND], in elements): the reductions' and the row groups' rows. */
template <int NIN, int KND, typename Meta>
__device__ __forceinline__ void sg_kept_offsets(const Meta &m, long long k, long long *off)
{
#pragma unroll
    for (int i = 0; i < NIN; ++i) off[i] = 0;
#pragma unroll
    for (int d = KND - 1; d >= 0; --d) {
        const long long c = (d == 0) ? k : k % m.kshape[d];
        if (d > 0) k /= m.kshape[d];
#pragma unroll
        for (int i = 0; i < NIN; ++i) off[i] += c * m.kstride[i][d];
    }
}

/* one-pass launches (reduce.cu, col_group.cu): whether this block is the last of its column
 * (blockIdx.x) to have written its partials.  Every thread fences its own partial stores
 * before the barrier; one thread counts (atomicInc wraps the counter back to 0: zero between
 * launches); the last block fences again before reading the others' partials (through L2). */
__device__ __forceinline__ bool sg_last_block(unsigned int *counters)
{
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0)
        last = atomicInc(counters + blockIdx.x, gridDim.y - 1) == gridDim.y - 1;
    __syncthreads();
    if (last) __threadfence();
    return last;
}
