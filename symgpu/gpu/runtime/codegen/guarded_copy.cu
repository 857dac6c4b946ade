// Copies back into shared variables that do not land once a check has reported
// (symgpu/gpu/runtime/device_checks.py: GuardedCopies).
__device__ int sg_guard_reported;

/* whether one of four report words (a null pointer: none) is set */
__device__ __forceinline__ int sg_any_reported(const volatile unsigned long long *w0,
    const volatile unsigned long long *w1, const volatile unsigned long long *w2,
    const volatile unsigned long long *w3)
{
    return (w0 && *w0) || (w1 && *w1) || (w2 && *w2) || (w3 && *w3);
}

extern "C" __global__ void guarded_copy_check(const volatile unsigned long long *w0,
    const volatile unsigned long long *w1, const volatile unsigned long long *w2,
    const volatile unsigned long long *w3)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        sg_guard_reported = sg_any_reported(w0, w1, w2, w3);
}

/* The same verdict into an int of the graph (GpuCheckVerdict, symgpu/gpu/ops/guarded_updates.py):
   1 once a page word is set, else 0; the updates of the function select their old values
   with it, so a kernel may write an update straight into its variable's buffer. Four words
   a launch: the first launch sets *out (`first`), later ones (a context with more report
   pages) only raise it (device_checks.queue_verdict). */
extern "C" __global__ void guard_verdict(const volatile unsigned long long *w0,
    const volatile unsigned long long *w1, const volatile unsigned long long *w2,
    const volatile unsigned long long *w3, int *out, const int first)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const int reported = sg_any_reported(w0, w1, w2, w3);
        if (first || reported)
            *out = reported;
    }
}

/* Several copies in one launch: copy e owns thread blocks first[e] .. first[e + 1] - 1, one
   chunk of SG_COPY_CHUNK bytes each (256 threads x 4 x 16 bytes: four loads in flight per
   thread before the stores). The table is the kernel's parameter, so a captured graph keeps
   it; device_checks.py packs it (copy_table) and fixes these sizes. */
#define SG_COPY_TABLE ${table}
#define SG_COPY_CHUNK ${chunk}
struct sg_copy_table {
    long long count;
    long long first[SG_COPY_TABLE + 1];
    unsigned long long dst[SG_COPY_TABLE];
    unsigned long long src[SG_COPY_TABLE];
    long long nbytes[SG_COPY_TABLE];
};

extern "C" __global__ void __launch_bounds__(256) guarded_copies(const sg_copy_table t)
{
    if (*(volatile int *)&sg_guard_reported) return;
    const long long blk = blockIdx.x;
    int e = 0;
    while (e + 1 < t.count && t.first[e + 1] <= blk) ++e;
    const long long begin = (blk - t.first[e]) * SG_COPY_CHUNK;
    const long long end = min(begin + (long long)SG_COPY_CHUNK, t.nbytes[e]);
    unsigned char *dst = (unsigned char *)t.dst[e];
    const unsigned char *src = (const unsigned char *)t.src[e];
    long long i = begin;
    if (((t.dst[e] | t.src[e]) & 15) == 0) {
        const uint4 *s = (const uint4 *)(src + begin);
        uint4 *d = (uint4 *)(dst + begin);
        const long long n16 = end > begin ? (end - begin) >> 4 : 0;
        if (n16 == SG_COPY_CHUNK / 16) {
            uint4 r[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) r[k] = s[k * 256 + threadIdx.x];
#pragma unroll
            for (int k = 0; k < 4; ++k) d[k * 256 + threadIdx.x] = r[k];
        } else {
            for (long long k = threadIdx.x; k < n16; k += 256) d[k] = s[k];
        }
        i += n16 << 4;
    }
    for (i += threadIdx.x; i < end; i += 256) dst[i] = src[i];
}
