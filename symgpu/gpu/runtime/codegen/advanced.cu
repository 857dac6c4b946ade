// Gather / set / inc on axis 0 with checked indices (symgpu/gpu/ops/advanced.py); the
// entry points are instantiated per value and index dtype.
template <typename I>
__device__ __forceinline__ bool fix_index(I raw, long long len, long long &j)
{
    j = (long long)raw;
    if (j < 0) j += len;
    return j >= 0 && j < len;
}

__device__ __forceinline__ void atomic_inc(float *p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_inc(double *p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_inc(int *p, int v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_inc(long long *p, long long v)
{
    atomicAdd(reinterpret_cast<unsigned long long *>(p), (unsigned long long)v);
}
/* the half types: atomicAdd of cuda_fp16.h / cuda_bf16.h (a native add on sm_90, a 16-bit
   compare-and-swap loop on older devices); the sum is rounded once, as the elementwise add */
__device__ __forceinline__ void atomic_inc(__half *p, __half v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_inc(__nv_bfloat16 *p, __nv_bfloat16 v) { atomicAdd(p, v); }

/* One walk over n indices and rows of `row` elements (arrays C-contiguous), each index
   checked (also with row == 0); MODE 0 gathers dst[r, c] = src[idx[r], c], MODE 1 sets
   dst[idx[r], c] = src[r, c], MODE 2 adds it atomically (repeated indices accumulate). */
template <typename T, typename I, int MODE>
__device__ __forceinline__ void indexed_body(T *dst, const T *src, const I *idx, long long n,
                                             long long row, long long len,
                                             unsigned long long *err)
{
    const long long rr = row ? row : 1;
    const long long total = n * rr;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const long long r = i / rr, c = i - r * rr;
        long long j;
        if (!fix_index<I>(idx[r], len, j)) {
            if (c == 0) report(err, (long long)idx[r]);
            continue;
        }
        if (!row) continue;
        const long long at = j * row + c;
        if (MODE == 0) dst[i] = src[at];
        else if (MODE == 1) dst[at] = src[i];
        else atomic_inc(dst + at, src[i]);
    }
}
//@ gather

extern "C" __global__ void ${name}(const ${t} *x, ${t} *out,
    const ${it} *idx, long long n, long long row, long long len, unsigned long long *err)
{ indexed_body<${t}, ${it}, 0>(out, x, idx, n, row, len, err); }
//@ scatter

extern "C" __global__ void ${name}(${t} *out, const ${t} *y,
    const ${it} *idx, long long n, long long row, long long len, unsigned long long *err)
{ indexed_body<${t}, ${it}, ${mode}>(out, y, idx, n, row, len, err); }
