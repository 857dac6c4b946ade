// Philox4x32-10 and the sampling kernels (symgpu/gpu/ops/random.py); the same generator
// as symgpu/tensor/random/philox.py, bit for bit.
/* Philox4x32-10 (Random123 / cuRAND constants): c <- philox(c, (k0, k1)). */
__device__ __forceinline__ void sg_philox4x32_10(unsigned int c[4], unsigned int k0,
                                                 unsigned int k1)
{
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        const unsigned int hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
        const unsigned int hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
        const unsigned int n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    }
}

/* The words of block b of the draw whose state is st = {key0, key1, ctr_lo, ctr_hi}. */
__device__ __forceinline__ void sg_philox_block(const unsigned int *st, unsigned long long b,
                                                unsigned int w[4])
{
    const unsigned long long c = ((((unsigned long long)st[3]) << 32) | st[2]) + b;
    w[0] = (unsigned int)c; w[1] = (unsigned int)(c >> 32); w[2] = 0u; w[3] = 0u;
    sg_philox4x32_10(w, st[0], st[1]);
}

/* The largest uniform of a half draw: float32 uniforms above it round to 1.0 in the half
   type and are kept at it (philox.py's _BELOW_ONE, as_draw_dtype) */
#define SG_BELOW_ONE_F16 (1.0f - 0x1p-11f)
#define SG_BELOW_ONE_BF16 (1.0f - 0x1p-8f)

/* uniform (0, 1), exact: ((w >> 9) + 0.5) * 2^-23 and ((w0 << 20 | w1 >> 12) + 0.5) * 2^-52 */
__device__ __forceinline__ float sg_u01_f32(unsigned int w)
{ return __fmul_rn(__fadd_rn((float)(w >> 9), 0.5f), 1.1920928955078125e-07f); }
__device__ __forceinline__ double sg_u01_f64(unsigned int w0, unsigned int w1)
{
    const unsigned long long m = (((unsigned long long)w0) << 20) | (w1 >> 12);
    return __dmul_rn(__dadd_rn((double)m, 0.5), 2.220446049250313e-16);
}

/* Box-Muller: (u1, u2) -> r cos(2 pi u2), r sin(2 pi u2), r = sqrt(-2 log u1).
   float: logf is the precise one (near u1 = 1 the fast __logf's absolute error would be of
   the order of log(u1) itself, and r's error its square root); the angle goes through the
   hardware __sincosf on theta - pi, in (-pi, pi) where its absolute error is at most
   2^-21.4, and cos(t + pi) = -cos(t), sin(t + pi) = -sin(t). The numbers stay within a few
   ulp of the exact Box-Muller value, as close as the CPU's float32 NumPy ones, and the
   kernel runs a quarter faster than with the precise sincosf. */
__device__ __forceinline__ void sg_box_muller(float u1, float u2, float *z0, float *z1)
{
    const float r = sqrtf(__fmul_rn(-2.0f, logf(u1)));
    float s, c;
    __sincosf(__fmaf_rn(6.2831854820251465f, u2, -3.1415927410125732f), &s, &c);
    *z0 = -__fmul_rn(r, c); *z1 = -__fmul_rn(r, s);
}
__device__ __forceinline__ void sg_box_muller(double u1, double u2, double *z0, double *z1)
{
    const double r = sqrt(__dmul_rn(-2.0, log(u1)));
    double s, c;
    sincos(__dmul_rn(6.283185307179586, u2), &s, &c);
    *z0 = __dmul_rn(r, c); *z1 = __dmul_rn(r, s);
}

/* The 4 (float32) or 2 (float64) values of block b of a uniform or normal draw. */
__device__ __forceinline__ void sg_philox_values(const unsigned int *st, unsigned long long b,
                                                 bool normal, float v[4])
{
    unsigned int w[4];
    sg_philox_block(st, b, w);
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = sg_u01_f32(w[u]);
    if (normal) { sg_box_muller(v[0], v[1], &v[0], &v[1]); sg_box_muller(v[2], v[3], &v[2], &v[3]); }
}
__device__ __forceinline__ void sg_philox_values(const unsigned int *st, unsigned long long b,
                                                 bool normal, double v[2])
{
    unsigned int w[4];
    sg_philox_block(st, b, w);
    v[0] = sg_u01_f64(w[0], w[1]); v[1] = sg_u01_f64(w[2], w[3]);
    if (normal) sg_box_muller(v[0], v[1], &v[0], &v[1]);
}
//@ kernels
/* K storage elements of one Philox block, stored as one aligned access */
template <typename T, int K> struct sg_vec;
template <> struct sg_vec<float, 4> { typedef float4 type; };
template <> struct sg_vec<double, 2> { typedef double2 type; };
template <> struct sg_vec<__half, 4> { typedef sg_vec4<__half> type; };
template <> struct sg_vec<__nv_bfloat16, 4> { typedef sg_vec4<__nv_bfloat16> type; };

/* out[0:n] = the draw from state st; one thread per Philox block, one vector store. T is the
   storage type, V the type drawn in (float for the half types: the float32 numbers, rounded
   to nearest even on the store, as the CPU's draw casts them). top > 0: a half type's
   uniform is kept at or below top, its largest value below 1 (float32 uniforms just under 1
   round to 1.0; philox.py's as_draw_dtype does the same on the CPU). */
template <typename T, typename V, int K>
__device__ __forceinline__ void sg_philox_fill(const unsigned int *st, T *out, long long n,
                                               bool normal, float top = 0.0f)
{
    const long long nb = (n + K - 1) / K;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += step) {
        V v[K];
        sg_philox_values(st, (unsigned long long)b, normal, v);
        if (top > 0.0f) {
#pragma unroll
            for (int u = 0; u < K; ++u) v[u] = v[u] > top ? (V)top : v[u];
        }
        const long long i = b * K;
        if (i + K <= n) {
            typedef typename sg_vec<T, K>::type P;
            P x;
            T *xs = reinterpret_cast<T *>(&x);
#pragma unroll
            for (int u = 0; u < K; ++u) sg_store(xs[u], v[u]);
            reinterpret_cast<P *>(out)[b] = x;
        } else {
#pragma unroll
            for (int u = 0; u < K; ++u)
                if (i + u < n) sg_store(out[i + u], v[u]);
        }
    }
}

extern "C" __global__ void sg_philox_uniform_float32(const unsigned int *st, float *out, long long n)
{ sg_philox_fill<float, float, 4>(st, out, n, false); }
extern "C" __global__ void sg_philox_normal_float32(const unsigned int *st, float *out, long long n)
{ sg_philox_fill<float, float, 4>(st, out, n, true); }
extern "C" __global__ void sg_philox_uniform_float64(const unsigned int *st, double *out, long long n)
{ sg_philox_fill<double, double, 2>(st, out, n, false); }
extern "C" __global__ void sg_philox_normal_float64(const unsigned int *st, double *out, long long n)
{ sg_philox_fill<double, double, 2>(st, out, n, true); }
extern "C" __global__ void sg_philox_uniform_float16(const unsigned int *st, __half *out, long long n)
{ sg_philox_fill<__half, float, 4>(st, out, n, false, SG_BELOW_ONE_F16); }
extern "C" __global__ void sg_philox_normal_float16(const unsigned int *st, __half *out, long long n)
{ sg_philox_fill<__half, float, 4>(st, out, n, true); }
extern "C" __global__ void sg_philox_uniform_bfloat16(const unsigned int *st, __nv_bfloat16 *out,
                                                      long long n)
{ sg_philox_fill<__nv_bfloat16, float, 4>(st, out, n, false, SG_BELOW_ONE_BF16); }
extern "C" __global__ void sg_philox_normal_bfloat16(const unsigned int *st, __nv_bfloat16 *out,
                                                     long long n)
{ sg_philox_fill<__nv_bfloat16, float, 4>(st, out, n, true); }

/* out = st with the 64-bit counter moved on by nblocks (one thread). */
extern "C" __global__ void sg_philox_advance(const unsigned int *st, unsigned int *out,
                                             unsigned long long nblocks)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const unsigned long long c = ((((unsigned long long)st[3]) << 32) | st[2]) + nblocks;
        out[0] = st[0]; out[1] = st[1];
        out[2] = (unsigned int)c; out[3] = (unsigned int)(c >> 32);
    }
}
