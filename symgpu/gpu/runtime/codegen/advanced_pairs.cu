// x[a, b] gather / set / inc with checked pairs, and arange on the device
// (symgpu/gpu/ops/advanced_pairs.py); entry points instantiated per dtype.
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

/* Pair i of n: a read with stride as (0: broadcast), b with bs; both checked against
   (rows, cols). MODE 0: dst[i] = src[ja*s0 + jb*s1]; MODE 1: dst[ja*s0 + jb*s1] = src[i*vs];
   MODE 2: the same added atomically. IOTA: a is not read, a[i * as] is i * as (the rows
   arange(0, r) of x[arange(r), b], as 0 where r is 1). */
template <typename T, typename I, typename J, int MODE, bool IOTA = false>
__device__ __forceinline__ void pairs_body(T *dst, const T *src, long long vs, const I *a,
    long long as, const J *b, long long bs, long long n, long long rows, long long cols,
    long long s0, long long s1, unsigned long long *slot)
{
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        long long ja = IOTA ? i * as : (long long)a[i * as], jb = (long long)b[i * bs];
        if (ja < 0) ja += rows;
        if (jb < 0) jb += cols;
        if (ja < 0 || ja >= rows) { report(slot, IOTA ? ja : (long long)a[i * as]); continue; }
        if (jb < 0 || jb >= cols) { report(slot, (long long)b[i * bs]); continue; }
        const long long at = ja * s0 + jb * s1;
        if (MODE == 0) dst[i] = src[at];
        else if (MODE == 1) dst[at] = src[i * vs];
        else atomic_inc(dst + at, src[i * vs]);
    }
}

template <typename T>
__device__ __forceinline__ void arange_body(T *out, long long start, long long step, long long n)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = (T)(start + i * step);
}
//@ pairs

extern "C" __global__ void ${name}(${t} *dst, const ${t} *src,
    long long vs, const ${at} *a, long long as, const ${bt} *b, long long bs, long long n,
    long long rows, long long cols, long long s0, long long s1, unsigned long long *slot)
{ pairs_body<${t}, ${at}, ${bt}, ${mode}>(dst, src, vs, a, as, b, bs, n, rows, cols, s0, s1, slot); }
//@ take_rows

extern "C" __global__ void ${name}(${t} *dst, const ${t} *src,
    long long vs, const long long *a, long long as, const ${bt} *b, long long bs, long long n,
    long long rows, long long cols, long long s0, long long s1, unsigned long long *slot)
{
    pairs_body<${t}, long long, ${bt}, 0, true>(dst, src, vs, a, as, b, bs, n, rows, cols, s0,
                                                  s1, slot);
}
//@ arange

extern "C" __global__ void arange_${idt}(${it} *out, long long start, long long step, long long n)
{ arange_body<${it}>(out, start, step, n); }
