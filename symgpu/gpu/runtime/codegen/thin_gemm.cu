/* symgpu thin matrix products (symgpu/gpu/ops/thin_gemm.py), rendered for T = ${t}:
 *
 *     out (m x n) = alpha * X (m x k) @ Y (k x n) + beta * out
 *
 * every operand read or written through element strides (views, transposes, broadcasts),
 * in one launch, for the shapes where cuBLAS picks split-K kernels plus a reduction launch:
 *
 *   tg_lanes_k    n <= TG_NB, X's k stride small (X = h @ W3, h row-major): a warp per row of
 *                 X, lanes along k; Y is staged through shared memory a tile of TG_KT rows at a
 *                 time (row pitch TG_NB + 1: the lanes' different rows fall in different banks),
 *                 X's next tile loaded into registers while the current one is used; the
 *                 lanes' n sums are combined with shuffles and lane j stores column j.
 *   tg_lanes_m    n <= TG_NB, X's m stride small (X = h.T): 32 rows per block, lanes along m
 *                 (coalesced), blockDim.y lanes down k; Y[kk, :] is the same for a whole warp
 *                 (a broadcast load); the blockDim.y partial sums of each output are combined
 *                 by one warp from shared memory.
 *   tg_small_k    k <= TG_KB (d @ W3.T): a thread per output column keeps Y[:, j] in registers
 *                 and walks a chunk of rows, X[i, :] a broadcast load; stores coalesced along n.
 *
 * A thin m is the thin n of the transposed product (the caller swaps X and Y and transposes
 * the strides).  Accumulation is in T with FMA, in a fixed order (the same bits every call);
 * where beta is 0 the output is not read (it may be uninitialised).  alpha and beta come by
 * value or, where the pointer is not null, from device memory (read by the kernel, so a
 * captured CUDA graph reads the current value).
 */
typedef ${t} T;
#define TG_NB 16                       /* the most output columns a thread accumulates */
#define TG_KB 16                       /* the most k of tg_small_k */
#define TG_KT (2048 / (int)sizeof(T))  /* rows of Y per shared tile of tg_lanes_k */
#define TG_WARPS 8                     /* warps (rows) per block of tg_lanes_k */
#define TG_MAX_Y (sizeof(T) == 8 ? 16 : 32)   /* most blockDim.y of tg_lanes_m (registers) */

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

extern "C" __global__ void __launch_bounds__(TG_WARPS * 32) tg_lanes_k(TG_PARAMS)
{
    __shared__ T ys[TG_KT * (TG_NB + 1)];
    const T alpha = alpha_p ? *alpha_p : alpha_v, beta = beta_p ? *beta_p : beta_v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int per = TG_KT / 32;                 /* X values per lane and tile */
    for (long long i0 = (long long)blockIdx.x * TG_WARPS; i0 < m;
         i0 += (long long)gridDim.x * TG_WARPS) {
        const long long i = i0 + warp;
        const bool row = i < m;
        const T *xrow = X + (row ? i : 0) * xs0;
        T acc[TG_NB], xr[TG_KT / 32];
#pragma unroll
        for (int j = 0; j < TG_NB; ++j) acc[j] = T(0);
#pragma unroll
        for (int u = 0; u < per; ++u) {
            const long long kk = (long long)u * 32 + lane;
            xr[u] = row && kk < k ? __ldg(xrow + kk * xs1) : T(0);
        }
        for (long long k0 = 0; k0 < k; k0 += TG_KT) {
            const long long kt = min((long long)TG_KT, k - k0);
            __syncthreads();                    /* the previous tile is no longer read */
            const int ni = (int)n, ne = (int)kt * ni;   /* at most TG_KT * TG_NB */
            for (int e = threadIdx.x; e < ne; e += blockDim.x) {
                const int r = e / ni, j = e - r * ni;
                ys[r * (TG_NB + 1) + j] = __ldg(Y + (k0 + r) * ys0 + j * ys1);
            }
            __syncthreads();
            T xn[TG_KT / 32];                   /* the next tile's X, in flight meanwhile */
#pragma unroll
            for (int u = 0; u < per; ++u) {
                const long long kk = k0 + TG_KT + (long long)u * 32 + lane;
                xn[u] = row && kk < k ? __ldg(xrow + kk * xs1) : T(0);
            }
#pragma unroll
            for (int u = 0; u < per; ++u) {
                if (u * 32 + lane < kt) {       /* rows past the tile's end are not staged */
                    const T *yr = ys + (u * 32 + lane) * (TG_NB + 1);
#pragma unroll
                    for (int j = 0; j < TG_NB; ++j)
                        if (j < n) acc[j] = fma(xr[u], yr[j], acc[j]);
                }
            }
#pragma unroll
            for (int u = 0; u < per; ++u) xr[u] = xn[u];
        }
#pragma unroll
        for (int j = 0; j < TG_NB; ++j) {
            if (j < n) {
                const T s = tg_warp_sum(acc[j]);
                if (row && lane == j) tg_store(out + i * os0 + j * os1, s, alpha, beta);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(32 * TG_MAX_Y) tg_lanes_m(TG_PARAMS)
{
    __shared__ T sm[32][33];
    const T alpha = alpha_p ? *alpha_p : alpha_v, beta = beta_p ? *beta_p : beta_v;
    const int lane = threadIdx.x;
    for (long long ib = (long long)blockIdx.x * 32; ib < m; ib += (long long)gridDim.x * 32) {
        const long long i = ib + lane;
        T acc[TG_NB];
#pragma unroll
        for (int j = 0; j < TG_NB; ++j) acc[j] = T(0);
        if (i < m) {
            const T *xcol = X + i * xs0;
            long long kk = threadIdx.y;
            const long long step = blockDim.y;
            for (; kk + 3 * step < k; kk += 4 * step) {
                T xv[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) xv[u] = __ldg(xcol + (kk + u * step) * xs1);
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const T *yr = Y + (kk + u * step) * ys0;
#pragma unroll
                    for (int j = 0; j < TG_NB; ++j)
                        if (j < n) acc[j] = fma(xv[u], __ldg(yr + j * ys1), acc[j]);
                }
            }
            for (; kk < k; kk += step) {
                const T xv = __ldg(xcol + kk * xs1);
                const T *yr = Y + kk * ys0;
#pragma unroll
                for (int j = 0; j < TG_NB; ++j)
                    if (j < n) acc[j] = fma(xv, __ldg(yr + j * ys1), acc[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < TG_NB; ++j) {
            if (j < n) {
                sm[threadIdx.y][lane] = acc[j];
                __syncthreads();
                for (int c = threadIdx.y; c < 32; c += blockDim.y) {
                    T v = lane < (int)blockDim.y ? sm[lane][c] : T(0);
                    v = tg_warp_sum(v);
                    if (lane == 0 && ib + c < m)
                        tg_store(out + (ib + c) * os0 + j * os1, v, alpha, beta);
                }
                __syncthreads();
            }
        }
    }
}

/* blockIdx.y takes rows [blockIdx.y * chunk, + chunk) of every column it covers */
extern "C" __global__ void __launch_bounds__(256) tg_small_k(TG_PARAMS, const long long chunk)
{
    const T alpha = alpha_p ? *alpha_p : alpha_v, beta = beta_p ? *beta_p : beta_v;
    const long long r0 = (long long)blockIdx.y * chunk, r1 = min(m, r0 + chunk);
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (long long)gridDim.x * blockDim.x) {
        T yc[TG_KB];
#pragma unroll
        for (int q = 0; q < TG_KB; ++q) yc[q] = q < k ? __ldg(Y + q * ys0 + j * ys1) : T(0);
        long long i = r0;
        for (; i + 1 < r1; i += 2) {
            const T *x0 = X + i * xs0, *x1 = x0 + xs0;
            T s0 = T(0), s1 = T(0);
#pragma unroll
            for (int q = 0; q < TG_KB; ++q) {
                if (q < k) {
                    s0 = fma(__ldg(x0 + q * xs1), yc[q], s0);
                    s1 = fma(__ldg(x1 + q * xs1), yc[q], s1);
                }
            }
            tg_store(out + i * os0 + j * os1, s0, alpha, beta);
            tg_store(out + (i + 1) * os0 + j * os1, s1, alpha, beta);
        }
        if (i < r1) {
            const T *x0 = X + i * xs0;
            T s0 = T(0);
#pragma unroll
            for (int q = 0; q < TG_KB; ++q)
                if (q < k) s0 = fma(__ldg(x0 + q * xs1), yc[q], s0);
            tg_store(out + i * os0 + j * os1, s0, alpha, beta);
        }
    }
}
