/* symgpu thin matrix products (symgpu/gpu/ops/thin_gemm.py), rendered for T = ${t}:
 *
 *     out (m x n) = alpha * X (m x k) @ Y (k x n) + beta * out
 *
 * every operand read or written through element strides (views, transposes, broadcasts),
 * in one launch, for the shapes where cuBLAS picks split-K kernels plus a reduction launch:
 *
 *   tg_lanes_k    n <= TG_NB, X's k stride small (X = h @ W3, h row-major): a warp per row of
 *                 X, lanes along k, TG_WARPS rows a block; Y is staged through shared memory a
 *                 tile of TG_KT rows at a time (row pitch TG_NB + 1: the lanes' different rows
 *                 fall in different banks); the lanes' n sums are combined with shuffles and
 *                 lane j stores column j.
 *   tg_lanes_m    n <= TG_NB, X's m stride small (X = h.T): 32 rows a block, lanes along m
 *                 (coalesced), blockDim.y lanes down k; Y's tile in shared memory (pitch
 *                 TG_NB, zero past n) is read as 16-byte vectors that a whole warp shares; the
 *                 blockDim.y partial sums of each output are combined by one warp.
 *   tg_small_k    k <= TG_KB (d @ W3.T): a thread per output column, its Y column in
 *                 registers, walking a chunk of rows whose X values the block stages in
 *                 shared memory; stores coalesced along n.
 *
 * Why shared memory: a warp's global load of 32 different rows of a thin Y touches as many
 * cache lines, and one of a row that all lanes share is still a request per value; measured,
 * kernels reading Y from global memory took 3 to 7 times cuBLAS's time.  Staging loads are
 * issued 8 or 16 at a time (a load-then-store loop otherwise waits on each load in turn).
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
#define TG_KB 16                       /* the most k of tg_small_k */
#define TG_KT (2048 / (int)sizeof(T))  /* rows of Y per shared tile */
#define TG_WARPS 8                     /* warps (rows) per block of tg_lanes_k */
#define TG_MAX_Y (sizeof(T) == 8 ? 16 : 32)   /* most blockDim.y of tg_lanes_m (registers) */
#define TG_BATCH 8                     /* X loads in flight per thread of tg_lanes_m */

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
        T acc[TG_NB];
#pragma unroll
        for (int j = 0; j < TG_NB; ++j) acc[j] = T(0);
        for (long long k0 = 0; k0 < k; k0 += TG_KT) {
            const int kt = (int)min((long long)TG_KT, k - k0);
            T xr[TG_KT / 32];                   /* issued before the tile is staged */
#pragma unroll
            for (int u = 0; u < per; ++u) {
                const int kk = u * 32 + lane;
                xr[u] = row && kk < kt ? __ldg(xrow + (k0 + kk) * xs1) : T(0);
            }
            __syncthreads();                    /* the previous tile is no longer read */
            tg_stage_y<16>(ys, TG_NB + 1, Y, ys0, ys1, k0, kt, (int)n, threadIdx.x, blockDim.x);
            __syncthreads();
#pragma unroll
            for (int u = 0; u < per; ++u) {
                if (u * 32 + lane < kt) {       /* rows past kt are not this tile's */
                    const T *yr = ys + (u * 32 + lane) * (TG_NB + 1);
#pragma unroll
                    for (int j = 0; j < TG_NB; ++j) acc[j] = fma(xr[u], yr[j], acc[j]);
                }
            }
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
    __shared__ __align__(16) T ys[TG_KT * TG_NB];
    __shared__ T sm[TG_MAX_Y][33];
    const T alpha = alpha_p ? *alpha_p : alpha_v, beta = beta_p ? *beta_p : beta_v;
    const int lane = threadIdx.x, tid = threadIdx.y * 32 + threadIdx.x;
    const int nthr = 32 * blockDim.y, step = blockDim.y;
    for (long long ib = (long long)blockIdx.x * 32; ib < m; ib += (long long)gridDim.x * 32) {
        const long long i = ib + lane;
        const T *xcol = X + (i < m ? i : 0) * xs0;
        T acc[TG_NB];
#pragma unroll
        for (int j = 0; j < TG_NB; ++j) acc[j] = T(0);
        for (long long k0 = 0; k0 < k; k0 += TG_KT) {
            const int kt = (int)min((long long)TG_KT, k - k0);
            __syncthreads();
            tg_stage_y<8>(ys, TG_NB, Y, ys0, ys1, k0, kt, (int)n, tid, nthr);
            __syncthreads();
            for (int r0 = threadIdx.y; r0 < kt; r0 += TG_BATCH * step) {
                T xv[TG_BATCH];
#pragma unroll
                for (int u = 0; u < TG_BATCH; ++u) {
                    const int r = r0 + u * step;
                    xv[u] = (i < m && r < kt) ? __ldg(xcol + (k0 + r) * xs1) : T(0);
                }
#pragma unroll
                for (int u = 0; u < TG_BATCH; ++u) {
                    const int r = r0 + u * step;
                    if (r < kt) {
                        const TV *yv = reinterpret_cast<const TV *>(ys + r * TG_NB);
#pragma unroll
                        for (int v = 0; v < TG_NB / TG_VW; ++v)
                            tg_vfma(acc + v * TG_VW, xv[u], yv[v]);
                    }
                }
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

/* blockIdx.y takes rows [blockIdx.y * chunk, + chunk) of the block's columns; the block stages
 * those rows of X (chunk <= TG_SK_ROWS) and threadIdx.x's column of Y */
#define TG_SK_ROWS 64
extern "C" __global__ void __launch_bounds__(256) tg_small_k(TG_PARAMS, const long long chunk)
{
    __shared__ T xs[TG_SK_ROWS * TG_KB];
    __shared__ T yt[TG_KB][257];
    const T alpha = alpha_p ? *alpha_p : alpha_v, beta = beta_p ? *beta_p : beta_v;
    const long long r0 = (long long)blockIdx.y * chunk;
    const int rows = (int)max(0LL, min(m, r0 + chunk) - r0), kq = (int)k;
    const int nthr = blockDim.x, t = threadIdx.x;
    for (int e = t; e < rows * kq; e += nthr) {
        const int r = e / kq, q = e - r * kq;
        xs[r * TG_KB + q] = __ldg(X + (r0 + r) * xs0 + q * xs1);
    }
    for (long long jb = (long long)blockIdx.x * nthr; jb < n; jb += (long long)gridDim.x * nthr) {
        const int cols = (int)min((long long)nthr, n - jb);
        /* Y[:, jb .. jb + cols): consecutive threads take consecutive addresses */
        const bool qfast = ys0 == 1 || (ys1 != 1 && (ys0 < 0 ? -ys0 : ys0) < (ys1 < 0 ? -ys1 : ys1));
        __syncthreads();
        for (int e = t; e < kq * cols; e += nthr) {
            const int q = qfast ? e % kq : e / cols, c = qfast ? e / kq : e % cols;
            yt[q][c] = __ldg(Y + q * ys0 + (jb + c) * ys1);
        }
        __syncthreads();
        const long long j = jb + t;
        if (j < n) {
            T yc[TG_KB];
#pragma unroll
            for (int q = 0; q < TG_KB; ++q) yc[q] = q < kq ? yt[q][t] : T(0);
            for (int r = 0; r < rows; ++r) {
                const T *xr = xs + r * TG_KB;
                T s = T(0);
#pragma unroll
                for (int q = 0; q < TG_KB; ++q)
                    if (q < kq) s = fma(xr[q], yc[q], s);
                tg_store(out + (r0 + r) * os0 + j * os1, s, alpha, beta);
            }
        }
    }
}
