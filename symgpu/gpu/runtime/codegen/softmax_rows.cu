// softmax / log_softmax along the last axis, a warp or a block per row
// (symgpu/gpu/ops/softmax_rows.py); entry points instantiated per dtype and row width.
// (common.cuh, with sg_load/sg_store, is pasted before this.)
__device__ __forceinline__ float sr_exp(float v) { return expf(v); }
__device__ __forceinline__ double sr_exp(double v) { return exp(v); }
__device__ __forceinline__ float sr_log(float v) { return logf(v); }
__device__ __forceinline__ double sr_log(double v) { return log(v); }

/* The larger of a and b, NaN winning (NumPy's max propagates NaN: so does the row's result). */
template <typename T>
__device__ __forceinline__ T sr_max(T a, T b) { return (a != a || a > b) ? a : b; }

/* The max (SUM false) or sum of v over the threads that share a row: a warp's lanes (WIDE
   false), or the whole block (WIDE true, through `shared`, 32 slots); every thread gets it. */
template <typename T, bool SUM, bool WIDE>
__device__ __forceinline__ T sr_reduce(T v, T *shared)
{
    for (int o = 16; o > 0; o >>= 1) {
        const T w = __shfl_xor_sync(0xffffffffu, v, o);
        v = SUM ? v + w : sr_max(v, w);
    }
    if (!WIDE) return v;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    __syncthreads();                     // the slots' last readers are done
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < nwarps ? shared[lane] : (SUM ? T(0) : T(-INFINITY));
    for (int o = 16; o > 0; o >>= 1) {
        const T w = __shfl_xor_sync(0xffffffffu, v, o);
        v = SUM ? v + w : sr_max(v, w);
    }
    return v;
}

/* out[r, :] = softmax (LOG: log_softmax) of x's row r, for `rows` rows of n elements: x read
   through element strides (xs0 between rows, xs1 along a row), out C-contiguous; with BIAS,
   of x's row plus the vector b (element stride bs): a classifier's logits, whose bias add is
   then no launch of its own (the sum rounded as the elementwise add rounds it). A warp takes
   a row (WIDE false: short rows, 8 per 256-thread block) or the whole block does (WIDE true:
   long rows), blocks striding over the rows: the row's max, then the sum of exp(x - max),
   then the row written in one more pass, as the CPU op computes it: exp(x - max) / sum, or
   (x - max) - log(sum).  T is the storage type, V the type computed in: float for the half
   types (loaded, computed and summed in float32, rounded once on the store). TX is x's
   storage type: T, or a half type read as float32 (the cast of a mixed-precision
   classifier's half logits, absorbed). */
template <typename T, typename TX, typename V, bool LOG, bool WIDE, bool BIAS>
__device__ __forceinline__ void softmax_rows_body(const TX *x, long long xs0, long long xs1,
                                                  const T *b, long long bs, T *out,
                                                  long long rows, long long n)
{
#define SR_X(j) (BIAS ? sg_round<T, V>((V)sg_load(xr[(j) * xs1]) + (V)sg_load(b[(j) * bs])) \
                      : (V)sg_load(xr[(j) * xs1]))
    __shared__ V shared[32];
    const int per_block = WIDE ? 1 : (blockDim.x >> 5);
    const int first = WIDE ? threadIdx.x : (threadIdx.x & 31);
    const int stride = WIDE ? blockDim.x : 32;
    const long long step = (long long)gridDim.x * per_block;
    for (long long r = (long long)blockIdx.x * per_block + (WIDE ? 0 : (threadIdx.x >> 5));
         r < rows; r += step) {
        const TX *xr = x + r * xs0;
        T *orow = out + r * n;
        V m = -INFINITY;
        for (long long j = first; j < n; j += stride) m = sr_max(m, SR_X(j));
        m = sr_reduce<V, false, WIDE>(m, shared);
        V s = V(0);
        for (long long j = first; j < n; j += stride) s += sr_exp(SR_X(j) - m);
        s = sr_reduce<V, true, WIDE>(s, shared);
        if (LOG) {
            const V ls = sr_log(s);
            for (long long j = first; j < n; j += stride) sg_store(orow[j], (SR_X(j) - m) - ls);
        } else {
            for (long long j = first; j < n; j += stride) sg_store(orow[j], sr_exp(SR_X(j) - m) / s);
        }
    }
#undef SR_X
}
//@ rows

extern "C" __global__ void ${name}(const ${xtype} *x, long long xs0, long long xs1,
                                   ${ctype} *out, long long rows, long long n)
{ softmax_rows_body<${ctype}, ${xtype}, ${vtype}, ${log}, ${wide}, false>(x, xs0, xs1, 0, 0, out,
                                                                          rows, n); }

extern "C" __global__ void ${name}_bias(const ${xtype} *x, long long xs0, long long xs1,
                                        const ${ctype} *b, long long bs, ${ctype} *out,
                                        long long rows, long long n)
{ softmax_rows_body<${ctype}, ${xtype}, ${vtype}, ${log}, ${wide}, true>(x, xs0, xs1, b, bs, out,
                                                                         rows, n); }
