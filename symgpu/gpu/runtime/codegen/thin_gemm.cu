/* symgpu thin matrix products (symgpu/gpu/ops/thin_gemm.py), rendered for T = ${t}:
 *
 *     out (m x n) = alpha * X (m x k) @ Y (k x n) + beta * out
 *
 * every operand read or written through element strides (views, transposes, broadcasts),
 * in one launch, for the shapes where cuBLAS picks split-K kernels plus a reduction launch
 * (measured on an H100, float32: 512x1024 @ 1024x10 4.16 us against cuBLAS's 7.60 + 2.03 us;
 * 1024x512 (a transposed view) @ 512x10 5.59 us against 4.12 + 1.70 us):
 *
 *   tg_rows       n <= TG_NB, X read along k (X = h @ W3, h row-major), k <= TG_RT * TG_RK:
 *                 each thread holds TG_RK rows of Y in registers; a block walks TG_RROWS rows
 *                 of X at a time (coalesced loads), each warp's partial dot products summed
 *                 by a transposed shuffle reduction (16 shuffles for 16 columns), the warps'
 *                 sums added through shared memory.
 *   tg_cols       n <= TG_NB, X read along m (X = h.T): TG_CW rows of X a block (lanes along
 *                 m, coalesced) x TG_CL lanes down k, like a column reduction; Y's tile in
 *                 shared memory read as 16-byte vectors that the lanes of a row share.
 *
 * (A product with a small k, d @ W3.T, stays with cuBLAS: one kernel already, 3.09 us on an
 * H100 against 12.7 us for a kernel of ours holding Y's columns in registers.)
 *
 * Why Y sits in registers or shared memory: a warp's global load of 32 different rows of a
 * thin Y touches as many cache lines, and one of a row that all lanes share is still a request
 * per value; measured on an H100, kernels reading Y from global memory at each use took 3 to 7
 * times cuBLAS's time.  Loads that fill registers or shared memory are issued in batches (a
 * load-then-store loop otherwise waits on each load in turn: 10 us for 40 KB of Y).
 *
 * A thin m is the thin n of the transposed product (the caller swaps X and Y and transposes
 * the strides).  Accumulation is in T with FMA, in a fixed order (the same bits every call);
 * where beta is 0 the output is not read (it may be uninitialised).  alpha and beta come by
 * value or, where the pointer is not null, from device memory (read by the kernel, so a
 * captured CUDA graph reads the current value).
 */
typedef ${t} T;
typedef ${vec} TV;                     /* 16 bytes of T */
#define TG_VW ${vw}                    /* T per TV */
#define TG_NB 16                       /* the most output columns a thread accumulates */
#define TG_KT (2048 / (int)sizeof(T))  /* rows of Y per shared tile of tg_cols */

#define TG_PARAMS const long long m, const long long n, const long long k, \
    const T *__restrict__ X, const long long xs0, const long long xs1, \
    const T *__restrict__ Y, const long long ys0, const long long ys1, \
    T *out, const long long os0, const long long os1, \
    const T alpha_v, const T *alpha_p, const T beta_v, const T *beta_p

__device__ __forceinline__ void tg_store(T *dst, const T acc, const T alpha, const T beta)
{
    *dst = beta == T(0) ? alpha * acc : alpha * acc + beta * *dst;
}

__device__ __forceinline__ T tg_warp_sum(T v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ void tg_vfma(T *acc, const T x, const TV &y)
{
    acc[0] = fma(x, y.x, acc[0]); acc[1] = fma(x, y.y, acc[1]);
#if TG_VW == 4
    acc[2] = fma(x, y.z, acc[2]); acc[3] = fma(x, y.w, acc[3]);
#endif
}

/* Y rows [k0, k0 + kt) into ys (row pitch `pitch`, TG_NB columns: zero past n), by the
 * block's `nthr` threads (thread `tid`), B loads in flight each */
template <int B>
__device__ __forceinline__ void tg_stage_y(T *ys, const int pitch, const T *Y, const long long ys0,
                                           const long long ys1, const long long k0, const int kt,
                                           const int n, const int tid, const int nthr)
{
    const int ne = kt * TG_NB;
    for (int e0 = tid; e0 < ne; e0 += B * nthr) {
        T v[B];
#pragma unroll
        for (int u = 0; u < B; ++u) {
            const int e = e0 + u * nthr, r = e / TG_NB, j = e % TG_NB;
            v[u] = (e < ne && j < n) ? __ldg(Y + (k0 + r) * ys0 + j * ys1) : T(0);
        }
#pragma unroll
        for (int u = 0; u < B; ++u) {
            const int e = e0 + u * nthr;
            if (e < ne) ys[(e / TG_NB) * pitch + e % TG_NB] = v[u];
        }
    }
}

/* the sum over the warp of each of p's TG_NB values, transposed: lane l ends with the sum of
 * value (l >> 1) & 15 (lanes 2j and 2j + 1 both hold value j's).  Each step sends half of
 * what a lane holds to its partner and keeps the half the partner sends back: 16 shuffles
 * for 16 sums, not 80; the order of additions is fixed (the same bits every call). */
template <int H>
__device__ __forceinline__ void tg_half_sum(T (&p)[TG_NB], const int lane, const int o)
{
    const bool up = lane & o;
#pragma unroll
    for (int q = 0; q < H; ++q) {
        const T send = up ? p[q] : p[q + H], keep = up ? p[q + H] : p[q];
        p[q] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
}

__device__ __forceinline__ T tg_transpose_sum(T (&p)[TG_NB], const int lane)
{
    tg_half_sum<8>(p, lane, 16);
    tg_half_sum<4>(p, lane, 8);
    tg_half_sum<2>(p, lane, 4);
    tg_half_sum<1>(p, lane, 2);
    return p[0] + __shfl_xor_sync(0xffffffffu, p[0], 1);
}

/* tg_rows: X read along k.  A block of TG_RT threads holds Y (k <= TG_RT * TG_RK rows, TG_NB
 * columns, zero past n) in registers, thread t rows t + u * TG_RT, and walks TG_RROWS rows of
 * X at a time: coalesced loads, a partial dot product per column, a transposed warp sum,
 * then the TG_RT / 32 warps' sums added in a fixed order. */
#define TG_RT 256
#define TG_RK 4
#define TG_RROWS 4
extern "C" __global__ void __launch_bounds__(TG_RT) tg_rows(TG_PARAMS)
{
    __shared__ T red[TG_RT / 32][TG_RROWS][TG_NB];
    const T alpha = alpha_p ? *alpha_p : alpha_v, beta = beta_p ? *beta_p : beta_v;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    T w[TG_RK][TG_NB];
#pragma unroll
    for (int u = 0; u < TG_RK; ++u) {
        const long long kk = t + u * TG_RT;
#pragma unroll
        for (int j = 0; j < TG_NB; ++j)
            w[u][j] = (kk < k && j < n) ? __ldg(Y + kk * ys0 + j * ys1) : T(0);
    }
    for (long long i0 = (long long)blockIdx.x * TG_RROWS; i0 < m;
         i0 += (long long)gridDim.x * TG_RROWS) {
        T x[TG_RROWS][TG_RK];
#pragma unroll
        for (int r = 0; r < TG_RROWS; ++r) {
#pragma unroll
            for (int u = 0; u < TG_RK; ++u) {
                const long long i = i0 + r, kk = t + u * TG_RT;
                x[r][u] = (i < m && kk < k) ? __ldg(X + i * xs0 + kk * xs1) : T(0);
            }
        }
#pragma unroll
        for (int r = 0; r < TG_RROWS; ++r) {
            T p[TG_NB];
#pragma unroll
            for (int j = 0; j < TG_NB; ++j) p[j] = T(0);
#pragma unroll
            for (int u = 0; u < TG_RK; ++u)
#pragma unroll
                for (int j = 0; j < TG_NB; ++j) p[j] = fma(x[r][u], w[u][j], p[j]);
            const T s = tg_transpose_sum(p, lane);
            if (!(lane & 1)) red[warp][r][lane >> 1] = s;
        }
        __syncthreads();
        if (t < TG_RROWS * TG_NB) {
            const int r = t / TG_NB, j = t % TG_NB;
            const long long i = i0 + r;
            if (i < m && j < n) {
                T s = red[0][r][j];
#pragma unroll
                for (int v = 1; v < TG_RT / 32; ++v) s += red[v][r][j];
                tg_store(out + i * os0 + j * os1, s, alpha, beta);
            }
        }
        __syncthreads();
    }
}

/* tg_cols: X read along m.  Blocks of TG_CW columns (rows of the output) x TG_CL lanes down k;
 * Y's tile in shared memory (pitch TG_CP: the four rows a warp reads at once fall in
 * different banks) read as 16-byte vectors; a warp's four k lanes are summed with shuffles,
 * the warps' sums (through the tile's memory) in a fixed order. */
#define TG_CW 8
#define TG_CL (sizeof(T) == 8 ? 64 : 128)
#define TG_CP (TG_NB + 16 / (int)sizeof(T))
extern "C" __global__ void __launch_bounds__(TG_CW * TG_CL) tg_cols(TG_PARAMS)
{
    __shared__ __align__(16) T ys[TG_KT * TG_CP];
    const T alpha = alpha_p ? *alpha_p : alpha_v, beta = beta_p ? *beta_p : beta_v;
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * TG_CW + tx;
    const int lane = tid & 31, warp = tid >> 5, nthr = TG_CW * TG_CL, nwarps = nthr / 32;
    T *red = ys;                                 /* [nwarps][TG_CW][TG_NB] after the tiles */
    for (long long ib = (long long)blockIdx.x * TG_CW; ib < m; ib += (long long)gridDim.x * TG_CW) {
        const long long i = ib + tx;
        const T *xcol = X + (i < m ? i : 0) * xs0;
        T acc[TG_NB];
#pragma unroll
        for (int j = 0; j < TG_NB; ++j) acc[j] = T(0);
        for (long long k0 = 0; k0 < k; k0 += TG_KT) {
            const int kt = (int)min((long long)TG_KT, k - k0);
            __syncthreads();
            tg_stage_y<8>(ys, TG_CP, Y, ys0, ys1, k0, kt, (int)n, tid, nthr);
            __syncthreads();
            for (int r0 = ty; r0 < kt; r0 += 4 * TG_CL) {
                T xv[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int r = r0 + u * TG_CL;
                    xv[u] = (i < m && r < kt) ? __ldg(xcol + (k0 + r) * xs1) : T(0);
                }
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int r = r0 + u * TG_CL;
                    if (r < kt) {
                        const TV *yv = reinterpret_cast<const TV *>(ys + r * TG_CP);
#pragma unroll
                        for (int v = 0; v < TG_NB / TG_VW; ++v)
                            tg_vfma(acc + v * TG_VW, xv[u], yv[v]);
                    }
                }
            }
        }
        /* lanes l, l ^ 8, l ^ 16, l ^ 24 share a column: sum them, keeping a quarter each */
        tg_half_sum<8>(acc, lane, 16);
        tg_half_sum<4>(acc, lane, 8);
        __syncthreads();                         /* the last tile is no longer read */
        if (lane < TG_CW * 4) {                  /* lane's values: j = 8 * b4 + 4 * b3 + q */
            const int jb = ((lane >> 4) & 1) * 8 + ((lane >> 3) & 1) * 4;
#pragma unroll
            for (int q = 0; q < TG_NB / 4; ++q) red[(warp * TG_CW + tx) * TG_NB + jb + q] = acc[q];
        }
        __syncthreads();
        if (tid < TG_CW * TG_NB) {
            const int c = tid / TG_NB, j = tid % TG_NB;
            if (ib + c < m && j < n) {
                T s = red[c * TG_NB + j];
                for (int v = 1; v < nwarps; ++v) s += red[(v * TG_CW + c) * TG_NB + j];
                tg_store(out + (ib + c) * os0 + j * os1, s, alpha, beta);
            }
        }
    }
}
